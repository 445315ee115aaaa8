//! An overlay of new nodes and edges samples exactly what the sampler draws
//! on the graph rebuilt with the additions, with sampled and full fanouts,
//! and refuses additions that name no node.

mod common;

use graphs::overlay::Overlay;
use graphs::{HetGraph, LoadOptions, RelationId, Sampler};

fn mag() -> (tempfile::TempDir, HetGraph) {
    let (tmp, dir) = common::mag_like(0.002, 0);
    let g = graphs::load(
        &dir,
        &LoadOptions {
            mmap_features: true,
            reverse_edges: true,
        },
    )
    .unwrap();
    (tmp, g)
}

fn rel(g: &HetGraph, canonical: &str) -> RelationId {
    g.relation_id(canonical)
        .unwrap_or_else(|| panic!("no relation {canonical}"))
}

#[test]
fn an_overlay_samples_what_the_rebuilt_graph_samples() {
    let (_tmp, g) = mag();
    let paper = g.target();
    let author = g.type_id("author").unwrap();
    let papers = g.node_type(paper).count;
    let authors = g.node_type(author).count;
    let dim = g.node_type(paper).features.as_ref().unwrap().dim();
    let mut added = vec![0; g.node_types().len()];
    added[paper.index()] = 3;
    added[author.index()] = 1;
    let (cites, writes) = (
        rel(&g, "paper__cites__paper"),
        rel(&g, "author__writes__paper"),
    );
    let (p0, p1, p2) = (papers, papers + 1, papers + 2);
    let edges = vec![
        (cites, p0, 0),
        (cites, p0, 17),
        (cites, 5, p0),
        (cites, p1, p0),
        (cites, p2, 17),
        (writes, 3, p0),
        (writes, authors, p1),
        (writes, authors, 9),
        (writes, 3, p0), // a repeated edge stays a multi-edge
    ];
    let features: Vec<Option<Vec<f32>>> = g
        .node_types()
        .iter()
        .enumerate()
        .map(|(t, nt)| {
            nt.features.as_ref().map(|f| {
                (0..added[t] as usize * f.dim())
                    .map(|i| (i % 7) as f32 * 0.25 - 0.5)
                    .collect()
            })
        })
        .collect();
    assert_eq!(features[paper.index()].as_ref().unwrap().len(), 3 * dim);
    let overlay = Overlay::new(&g, added.clone(), &edges).unwrap();
    let rebuilt = overlay.rebuilt(&features).unwrap();
    assert_eq!(rebuilt.node_type(paper).count, papers + 3);
    assert_eq!(rebuilt.relations().len(), g.relations().len());
    // The reverse of an added edge is there too.
    let rev = rel(&g, "paper__rev_writes__author");
    assert!(overlay.in_neighbors(rev, authors).contains(&p1));
    assert_eq!(
        overlay.in_neighbors(rev, authors),
        rebuilt.relation(rev).in_csr().neighbors(authors)
    );
    let seeds_list: [Vec<u32>; 3] = [vec![p0, p1, p2], vec![0, p2, 17, 9, 5], vec![3, 4]];
    for fanouts in [vec![4, 3], vec![usize::MAX, usize::MAX], vec![2, 2, 2]] {
        for (step, seeds) in seeds_list.iter().enumerate() {
            let mut typed = vec![Vec::new(); g.node_types().len()];
            typed[paper.index()] = seeds.clone();
            let want = Sampler::new(&rebuilt, &fanouts, 11)
                .unwrap()
                .sample(2, step as u64, seeds)
                .unwrap();
            let mut sampler = Sampler::new(&g, &fanouts, 11)
                .unwrap()
                .with_new_nodes(&added)
                .unwrap();
            let got = overlay
                .sample(&mut sampler, 2, step as u64, &typed)
                .unwrap();
            assert_eq!(got, want, "fanouts {fanouts:?}, seeds {seeds:?}");
            // The same sampler, reused, gives the same again.
            let again = overlay
                .sample(&mut sampler, 2, step as u64, &typed)
                .unwrap();
            assert_eq!(again, want);
        }
    }
    // Nothing added: the plain sampler's batch.
    let none = Overlay::new(&g, vec![0; added.len()], &[]).unwrap();
    let mut typed = vec![Vec::new(); g.node_types().len()];
    typed[paper.index()] = vec![1, 2, 40];
    let want = Sampler::new(&g, &[5, 5], 1)
        .unwrap()
        .sample(0, 0, &[1, 2, 40])
        .unwrap();
    let mut sampler = Sampler::new(&g, &[5, 5], 1).unwrap();
    assert_eq!(none.sample(&mut sampler, 0, 0, &typed).unwrap(), want);
}

#[test]
fn additions_that_name_no_node_are_refused() {
    let (_tmp, g) = mag();
    let paper = g.target();
    let papers = g.node_type(paper).count;
    let cites = rel(&g, "paper__cites__paper");
    let mut added = vec![0; g.node_types().len()];
    added[paper.index()] = 1;
    let err = |edges: &[(RelationId, u32, u32)]| {
        Overlay::new(&g, added.clone(), edges)
            .err()
            .expect("refused")
            .to_string()
    };
    // One past the new node.
    let e = err(&[(cites, papers + 1, 0)]);
    assert!(e.contains("source") && e.contains("'paper'"), "{e}");
    let e = err(&[(rel(&g, "paper__rev_cites__paper"), papers, 0)]);
    assert!(e.contains("reverse relation"), "{e}");
    let e = err(&[(RelationId(999), 0, 0)]);
    assert!(e.contains("no relation"), "{e}");
    assert!(
        Overlay::new(&g, vec![1], &[]).is_err(),
        "one count per type"
    );
    // A seed beyond the new nodes is refused by the sampler.
    let overlay = Overlay::new(&g, added.clone(), &[]).unwrap();
    let mut sampler = Sampler::new(&g, &[2], 0)
        .unwrap()
        .with_new_nodes(&added)
        .unwrap();
    let mut typed = vec![Vec::new(); g.node_types().len()];
    typed[paper.index()] = vec![papers + 1];
    assert!(overlay.sample(&mut sampler, 0, 0, &typed).is_err());
}
