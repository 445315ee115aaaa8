//! Small graphs shared by the integration tests.
#![allow(dead_code)]

use graphs::{Features, GraphBuilder, HetGraph, Splits};

/// paper(6, 3-d features, target, 2 classes), author(4, featureless), venue(2, featureless).
pub fn tiny() -> HetGraph {
    let feats: Vec<f32> = (0..18).map(|i| i as f32 * 0.5 - 2.0).collect();
    GraphBuilder::new("tiny", "paper", 2)
        .node_type("paper", 6, Some(Features::from_vec(6, 3, feats)))
        .node_type("author", 4, None)
        .node_type("venue", 2, None)
        .labels(
            vec![0, 1, 0, 1, -1, 1],
            Splits {
                train: vec![0, 1, 2],
                valid: vec![3],
                test: vec![5],
            },
        )
        .relation(
            "author",
            "writes",
            "paper",
            vec![0, 0, 1, 2, 3, 3, 3, 1],
            vec![0, 1, 1, 2, 3, 4, 5, 5],
        )
        .relation(
            "paper",
            "cites",
            "paper",
            vec![1, 2, 3, 4, 5, 0, 0],
            vec![0, 0, 0, 0, 0, 5, 1],
        )
        .relation(
            "paper",
            "published_in",
            "venue",
            vec![0, 1, 2, 3, 4, 5],
            vec![0, 0, 1, 1, 0, 1],
        )
        .build()
        .expect("tiny graph is valid")
}

/// A random graph with `n` papers and `m` authors, for sampler tests.
pub fn random(n: u32, m: u32, edges: usize, seed: u64) -> HetGraph {
    let mut r = graphs::rng::CounterRng::new(seed);
    let mut src = Vec::new();
    let mut dst = Vec::new();
    let mut csrc = Vec::new();
    let mut cdst = Vec::new();
    for _ in 0..edges {
        src.push(r.below(m.into()) as u32);
        dst.push(r.below(n.into()) as u32);
        csrc.push(r.below(n.into()) as u32);
        cdst.push(r.below(n.into()) as u32);
    }
    GraphBuilder::new("random", "paper", 3)
        .node_type(
            "paper",
            n,
            Some(Features::from_vec(n as usize, 1, vec![0.0; n as usize])),
        )
        .node_type("author", m, None)
        .labels(
            (0..n).map(|i| i64::from(i % 3)).collect(),
            Splits {
                train: (0..n).collect(),
                valid: vec![],
                test: vec![],
            },
        )
        .relation("author", "writes", "paper", src, dst)
        .relation("paper", "cites", "paper", csrc, cdst)
        .build()
        .expect("random graph is valid")
}

/// Every file under `dir`: its path relative to `dir` and its bytes, sorted by path.
pub fn read_all(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).unwrap().display().to_string(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// A generated mag-like graph directory at `scale` (kept while the `TempDir` lives).
pub fn mag_like(scale: f64, seed: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("g");
    graphs::generate::generate(
        graphs::generate::Like::Mag,
        scale,
        seed,
        &dir,
        false,
        &mut graphs::NoProgress,
    )
    .unwrap();
    (tmp, dir)
}
