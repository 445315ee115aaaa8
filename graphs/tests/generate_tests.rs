//! The mag-like generator: determinism and the planted statistics.

use graphs::generate::{generate, Like};
use graphs::stats::DegreeStats;
use graphs::{load, LoadOptions, NoProgress};

mod common;
use common::read_all;

#[test]
fn output_is_byte_identical_for_a_seed_whatever_the_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    let c = tmp.path().join("c");
    generate(Like::Mag, 0.003, 5, &a, false, &mut NoProgress).unwrap();
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    one_thread
        .install(|| generate(Like::Mag, 0.003, 5, &b, false, &mut NoProgress))
        .unwrap();
    generate(Like::Mag, 0.003, 6, &c, false, &mut NoProgress).unwrap();
    let (fa, fb, fc) = (read_all(&a), read_all(&b), read_all(&c));
    assert_eq!(
        fa.len(),
        17,
        "schema, 7 paper files, 4 edge files, 5 edge-target files"
    );
    assert!(fa == fb, "same seed must give identical bytes");
    assert!(
        fa.iter().zip(&fc).any(|(x, y)| x.1 != y.1),
        "another seed gives another graph"
    );
}

#[test]
fn counts_follow_ogbn_mag_and_signal_is_planted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("g");
    let schema = generate(Like::Mag, 0.01, 0, &dir, false, &mut NoProgress).unwrap();
    let counts: Vec<u64> = schema.node_types.iter().map(|(_, t)| t.count).collect();
    assert_eq!(counts, vec![7364, 11346, 87, 600]);
    let edges: Vec<u64> = schema.relations.iter().map(|r| r.count).collect();
    assert_eq!(edges, vec![10440, 71457, 54163, 75051]);

    let g = load(&dir, &LoadOptions::default()).unwrap();
    let paper = g.type_id("paper").unwrap();
    assert_eq!(g.node_type(paper).features.as_ref().unwrap().dim(), 128);
    for t in ["author", "institution", "field_of_study"] {
        assert!(
            g.node_type(g.type_id(t).unwrap()).features.is_none(),
            "{t} is featureless"
        );
    }
    let (labels, splits) = g.target_labels();
    let n = labels.len() as f64;
    assert!((splits.train.len() as f64 / n - 0.855).abs() < 0.02);
    assert!((splits.valid.len() as f64 / n - 0.088).abs() < 0.02);
    assert!(labels.iter().all(|&l| (0..349).contains(&l)));

    // Citation homophily: well above chance (1/349), "mostly within a class".
    let cites = g.relation(g.relation_id("paper__cites__paper").unwrap());
    let csr = cites.in_csr();
    let same = (0..csr.num_rows() as u32)
        .flat_map(|d| csr.neighbors(d).iter().map(move |&s| (s, d)))
        .filter(|&(s, d)| labels[s as usize] == labels[d as usize])
        .count();
    let homophily = same as f64 / csr.num_edges() as f64;
    assert!(
        homophily > 0.5 && homophily < 0.65,
        "cites homophily {homophily}"
    );

    // Features: class centroids explain part of the variance, noise dominates.
    let f = g.node_type(paper).features.as_ref().unwrap();
    let (mut within, mut total) = (0.0f64, 0.0f64);
    let mut sums = vec![vec![0.0f64; 128]; 349];
    let mut cnt = vec![0f64; 349];
    for (i, &label) in labels.iter().enumerate().take(f.rows()) {
        let c = label as usize;
        cnt[c] += 1.0;
        for (s, &x) in sums[c].iter_mut().zip(f.row(i)) {
            *s += f64::from(x);
        }
    }
    for (i, &label) in labels.iter().enumerate().take(f.rows()) {
        let c = label as usize;
        for (j, &x) in f.row(i).iter().enumerate() {
            within += (f64::from(x) - sums[c][j] / cnt[c]).powi(2);
            total += f64::from(x).powi(2);
        }
    }
    let explained = 1.0 - within / total;
    assert!(
        explained > 0.03 && explained < 0.25,
        "share of feature variance explained by class: {explained}"
    );

    // Values: the class explains most of their variance, the first feature
    // part of the rest, and the noise is small.
    let values = g.target_values().expect("the generator plants values");
    let mut by_class = vec![(0.0f64, 0.0f64); 349];
    for (&l, &v) in labels.iter().zip(values) {
        by_class[l as usize].0 += f64::from(v);
        by_class[l as usize].1 += 1.0;
    }
    let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let (mut within, mut total) = (0.0f64, 0.0f64);
    for (&l, &v) in labels.iter().zip(values) {
        let (s, c) = by_class[l as usize];
        let residual = f64::from(v) - s / c;
        within += residual * residual;
        total += (f64::from(v) - mean).powi(2);
    }
    let explained = 1.0 - within / total;
    assert!(
        explained > 0.5 && explained < 0.95,
        "share of value variance explained by class: {explained}"
    );
    assert!(values.iter().all(|v| v.is_finite()));

    // Label sets: 16 labels per paper, each paper's mostly its class's set
    // (the majority row of its class), a few entries flipped.
    let sets = g
        .target_label_sets()
        .expect("the generator plants label sets");
    assert_eq!((sets.width(), sets.count()), (16, labels.len()));
    let mut ones = vec![[0u32; 16]; 349];
    let mut count = vec![0u32; 349];
    for (p, &l) in labels.iter().enumerate() {
        count[l as usize] += 1;
        for (j, &b) in sets.row(p).iter().enumerate() {
            ones[l as usize][j] += u32::from(b == 1);
        }
    }
    let (mut agree, mut all, mut set) = (0u64, 0u64, 0u64);
    for (p, &l) in labels.iter().enumerate() {
        for (j, &b) in sets.row(p).iter().enumerate() {
            let majority = 2 * ones[l as usize][j] > count[l as usize];
            agree += u64::from((b == 1) == majority);
            set += u64::from(b == 1);
            all += 1;
        }
    }
    let (agree, set) = (agree as f64 / all as f64, set as f64 / all as f64);
    assert!(
        agree > 0.95 && agree < 0.995,
        "entries agreeing with the class's set: {agree}"
    );
    assert!(set > 0.1 && set < 0.35, "share of entries set: {set}");

    // Authors link mostly to papers of one dominant class.
    let writes = g.relation(g.relation_id("author__writes__paper").unwrap());
    let out = writes.out_csr();
    let (mut dominant, mut total_w) = (0usize, 0usize);
    for a in 0..out.num_rows() as u32 {
        let ps = out.neighbors(a);
        if ps.len() < 5 {
            continue;
        }
        let mut hist = std::collections::HashMap::new();
        for &p in ps {
            *hist.entry(labels[p as usize]).or_insert(0usize) += 1;
        }
        dominant += hist.values().max().unwrap();
        total_w += ps.len();
    }
    let share = dominant as f64 / total_w as f64;
    assert!(share > 0.35, "authors' dominant-class share {share}");

    // Heavy-tailed degrees: the top 1% of authors write far more than 1% of papers.
    let s = DegreeStats::of(out);
    assert!(s.top1_share > 0.08, "{s:?}");
    assert!(s.max as f64 > 30.0 * s.mean, "{s:?}");
    let s = DegreeStats::of(cites.in_csr());
    assert!(s.max as f64 > 30.0 * s.mean, "{s:?}");
}

#[test]
fn bad_arguments_are_refused_and_nothing_is_left_behind() {
    let tmp = tempfile::tempdir().unwrap();
    for scale in [0.0, -1.0, f64::NAN, 1e6] {
        assert!(
            generate(
                Like::Mag,
                scale,
                0,
                &tmp.path().join("x"),
                false,
                &mut NoProgress
            )
            .is_err(),
            "scale {scale}"
        );
    }
    assert!("papers".parse::<Like>().is_err());
    let dir = tmp.path().join("g");
    generate(Like::Mag, 0.001, 0, &dir, false, &mut NoProgress).unwrap();
    let err = generate(Like::Mag, 0.001, 0, &dir, false, &mut NoProgress).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}
