//! Serving from partitions (`serve --partitions`): a node's sampled answers,
//! drawn and read through every partition's sampler and feature stores,
//! equal a single-process server's for every target node; what such a
//! server does not answer is refused with what to do.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{same, trained, ALL};
use graphs::partition::{self, Method};
use serving::trained::Partitioned;
use serving::{Engine, Inference, Trained, Want};

/// `data` cut into `parts` by `method`, as `hetgnn partition` writes them
/// (reverse relations are added when a partition is loaded).
fn partitions(data: &Path, out: &Path, parts: usize, method: Method) -> PathBuf {
    let g = graphs::load(data, &graphs::LoadOptions::default()).unwrap();
    let a = partition::assign_two_level(&g, parts, 1, method, 0).unwrap();
    let opts = partition::WriteOptions {
        graph_sha256: Some(graphs::fingerprint::content(data).unwrap()),
        ..partition::WriteOptions::default()
    };
    partition::write_with(&g, &a, out, &opts, &mut graphs::NoProgress).unwrap();
    out.to_path_buf()
}

fn served(ck: &Path, parts: &Path, data: Option<&Path>) -> Engine {
    let (trained, online, _) = Trained::open_partitioned(Partitioned {
        checkpoint: ck,
        partitions: parts,
        data,
        node: None,
        ask: Duration::from_secs(30),
        take_over: false,
    })
    .unwrap();
    Engine::partitioned(trained, online)
}

fn single(ck: &Path, data: &Path) -> Engine {
    let (trained, _) = Trained::open(ck, data).unwrap();
    Engine::new(trained, Inference::Sampled, 4096, |_, _, _| {}).unwrap()
}

#[test]
fn every_target_node_is_answered_as_a_single_process_server_answers_it() {
    let tmp = tempfile::tempdir().unwrap();
    // R-GCN with learnable rows (featureless types: their rows come from the
    // stores), then an R-GAT regression trained with reverse relations.
    for (name, extra) in [
        ("rgcn", &[][..]),
        (
            "rgat-regression",
            &[
                "training.model=\"rgat\"",
                "training.task=\"node-regression\"",
                "training.reverse_edges=true",
            ][..],
        ),
    ] {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let (data, ck) = trained(&dir, extra);
        let local = single(&ck, &data);
        let papers = local
            .trained()
            .graph
            .node_type(local.trained().graph.target())
            .count;
        // Every node, in an order of its own with repeats, as a request may list them.
        let mut nodes: Vec<u32> = (0..papers).rev().collect();
        nodes.extend([0, 5, 5]);
        let want = local.classify(&nodes, ALL).unwrap();
        for (parts, method) in [(2, Method::Metis), (3, Method::Random)] {
            let what = format!("{name}, {parts} {method:?} partitions");
            let pdir = partitions(&data, &dir.join(format!("p{parts}")), parts, method);
            let engine = served(&ck, &pdir, Some(&data));
            let got = engine.classify(&nodes, ALL).unwrap();
            same(&want, &got, &what);
            let t = engine.trained().graph.target();
            let rows = engine.embed(t, &nodes[..7]).unwrap();
            let w = want
                .embeddings
                .as_ref()
                .unwrap()
                .pick(&[0, 1, 2, 3, 4, 5, 6]);
            assert_eq!(rows.data.len(), w.data.len(), "{what}: embed");
            for (a, b) in rows.data.iter().zip(&w.data) {
                assert!((a - b).abs() <= 1e-5, "{what}: embed {a} vs {b}");
            }
            // Partition 0's node read the others' rows: the answers did not come from one partition.
            assert!(
                engine.online().unwrap().remote_rows() > 0,
                "{what}: nothing pulled"
            );
        }
    }
}

#[test]
fn a_server_of_partitions_refuses_what_it_cannot_answer_and_says_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, ck) = trained(tmp.path(), &[]);
    let pdir = partitions(&data, &tmp.path().join("p"), 2, Method::Metis);
    // Without --data: ids are the graph's own.
    let engine = served(&ck, &pdir, None);
    let g = &engine.trained().graph;
    let papers = g.node_type(g.target()).count;
    let err = engine.classify(&[papers], Want::default()).unwrap_err();
    assert_eq!(err.status(), 404, "{err}");
    // New nodes and edges need the whole graph.
    let add = serving::additions::Additions {
        added: {
            let mut a = vec![0; g.node_types().len()];
            a[g.target().index()] = 1;
            a
        },
        ..Default::default()
    };
    let err = engine
        .classify_with(&add, &[papers], Want::default())
        .unwrap_err();
    assert_eq!(err.status(), 400, "{err}");
    assert!(err.to_string().contains("serve --data"), "{err}");
    // Every type's embeddings need exact inference, which is a single-process server's.
    let author = g.type_id("author").unwrap();
    let err = engine.embed(author, &[0]).unwrap_err();
    assert_eq!(err.status(), 400, "{err}");
    // Partitions of another graph are refused before anything is served.
    let other = tmp.path().join("other");
    graphs::generate::generate(
        graphs::generate::Like::Mag,
        0.002,
        1,
        &other,
        false,
        &mut graphs::NoProgress,
    )
    .unwrap();
    let opdir = partitions(&other, &tmp.path().join("op"), 2, Method::Metis);
    let err = Trained::open_partitioned(Partitioned {
        checkpoint: &ck,
        partitions: &opdir,
        data: None,
        node: None,
        ask: Duration::from_secs(5),
        take_over: false,
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("graph"), "{err}");
}
