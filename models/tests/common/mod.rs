//! A small heterogeneous graph shared by the model tests.

use graphs::{Features, GraphBuilder, HetGraph, Splits};

/// Papers (featured, labelled) and featureless authors, with reverse relations.
pub fn graph() -> HetGraph {
    let mut r = graphs::rng::CounterRng::new(3);
    let (np, na) = (12u32, 7u32);
    let feats: Vec<f32> = (0..np * 5).map(|_| r.normal() as f32).collect();
    let mut e = |n_src: u32, n_dst: u32, m: usize| -> (Vec<u32>, Vec<u32>) {
        (0..m)
            .map(|_| (r.below(n_src.into()) as u32, r.below(n_dst.into()) as u32))
            .unzip()
    };
    let (ws, wd) = e(na, np, 30);
    let (cs, cd) = e(np, np, 25);
    let mut g = GraphBuilder::new("t", "paper", 3)
        .node_type("paper", np, Some(Features::from_vec(np as usize, 5, feats)))
        .node_type("author", na, None)
        .labels(
            (0..np).map(|i| i64::from(i % 3)).collect(),
            Splits {
                train: (0..8).collect(),
                valid: vec![8, 9],
                test: vec![10, 11],
            },
        )
        .relation("author", "writes", "paper", ws, wd)
        .relation("paper", "cites", "paper", cs, cd)
        .build()
        .unwrap();
    g.add_reverse_relations().unwrap();
    g
}
