//! `serve --precompute`: every layer but the last computed for every node at
//! load, with the sampled inference's draws, answers as the server that
//! samples and computes every layer per request.

mod common;

use common::{same, trained, ALL};
use serving::{Engine, Inference, Trained};

fn engine(ck: &std::path::Path, data: &std::path::Path, inference: Inference) -> Engine {
    let (trained, _) = Trained::open(ck, data).unwrap();
    Engine::new(trained, inference, 4096, |_, _, _| {}).unwrap()
}

#[test]
fn precomputed_layers_give_every_node_the_answer_of_a_request_that_samples_them() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, extra, layers) in [
        ("rgcn", &[][..], 2),
        (
            "rgcn-3",
            &["training.layers=3", "training.fanouts=4,3,5"][..],
            3,
        ),
        (
            "rgat-regression",
            &[
                "training.model=\"rgat\"",
                "training.task=\"node-regression\"",
                "training.reverse_edges=true",
            ][..],
            2,
        ),
        ("hgt", &["training.model=\"hgt\""][..], 2),
        (
            "rgcn-1",
            &["training.layers=1", "training.fanouts=5"][..],
            1,
        ),
    ] {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let (data, ck) = trained(&dir, extra);
        let each = engine(&ck, &data, Inference::Sampled);
        let g = &each.trained().graph;
        let papers = g.node_type(g.target()).count;
        // Every node, in requests of different sizes (a node's answer must not
        // depend on the nodes drawn with it), with repeats.
        let mut nodes: Vec<u32> = (0..papers).rev().collect();
        nodes.extend([0, 5, 5]);
        let want = each.classify(&nodes, ALL).unwrap();
        // Small chunks draw on this thread, large ones on rayon's pool.
        for chunk in [64, 4096] {
            let what = format!("{name}, chunks of {chunk}");
            let mut steps = Vec::new();
            let pre = engine(&ck, &data, Inference::Sampled)
                .precompute(chunk, |l, done, total| steps.push((l, done, total)))
                .unwrap();
            // Layers below the last only; a one-layer model has none to keep.
            assert_eq!(pre.precomputed(), layers > 1, "{what}");
            if layers > 1 {
                let (l, done, total) = steps.last().copied().unwrap();
                assert_eq!((l, done), (layers - 2, total), "{what}: progress");
            }
            same(&want, &pre.classify(&nodes, ALL).unwrap(), &what);
            for (i, part) in nodes.chunks(7).enumerate().take(20) {
                let one = pre.classify(part, ALL).unwrap();
                let at: Vec<usize> = (i * 7..i * 7 + part.len()).collect();
                same(&want.pick(&at, ALL), &one, &format!("{what}, request {i}"));
            }
            let (a, b) = (
                each.embed(g.target(), &nodes[..9]).unwrap(),
                pre.embed(g.target(), &nodes[..9]).unwrap(),
            );
            assert_eq!(a.width, b.width, "{what}: embed");
            let worst = a.data.iter().zip(&b.data).map(|(x, y)| (x - y).abs());
            assert!(worst.fold(0f32, f32::max) <= 1e-5, "{what}: embed");
        }
    }
}

#[test]
fn precomputing_is_refused_where_every_layer_is_computed_at_load_already() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, ck) = trained(tmp.path(), &[]);
    let err = engine(&ck, &data, Inference::Exact)
        .precompute(64, |_, _, _| {})
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("exact inference computes every layer"),
        "{err}"
    );
}
