use super::blocks::{degree, State};
use super::*;
use crate::partition::{self, metis::Metis, random::Random, Method, PartitionReport};
use crate::rng::key;
use crate::{Features, GraphBuilder, NoProgress, Splits};

/// Papers in two communities of 100 (4 citations each inside, one across
/// for every 10th paper), 60 authors writing 3 papers of their community,
/// and the splits interleaved so each community holds half of each.
fn communities() -> HetGraph {
    let (papers, authors) = (200u32, 60u32);
    let (mut cs, mut cd) = (Vec::new(), Vec::new());
    for v in 0..papers {
        let c = v / 100;
        for i in 0..4u64 {
            cs.push(v);
            cd.push(c * 100 + (key(&[1, u64::from(v), i]) % 100) as u32);
        }
        if v % 10 == 0 {
            cs.push(v);
            cd.push((1 - c) * 100 + (key(&[2, u64::from(v)]) % 100) as u32);
        }
    }
    let (mut ws, mut wd) = (Vec::new(), Vec::new());
    for a in 0..authors {
        for i in 0..3u64 {
            ws.push(a);
            wd.push((a / 30) * 100 + (key(&[3, u64::from(a), i]) % 100) as u32);
        }
    }
    let pick = |r: u32| (0..papers).filter(|v| v % 4 == r).collect::<Vec<_>>();
    let mut train = pick(0);
    train.extend(pick(1));
    train.sort_unstable();
    GraphBuilder::new("communities", "paper", 2)
        .node_type(
            "paper",
            papers,
            Some(Features::from_vec(
                papers as usize,
                1,
                vec![0.0; papers as usize],
            )),
        )
        .node_type("author", authors, None)
        .labels(
            (0..papers).map(|v| i64::from(v / 100)).collect(),
            Splits {
                train,
                valid: pick(2),
                test: pick(3),
            },
        )
        .relation("paper", "cites", "paper", cs, cd)
        .relation("author", "writes", "paper", ws, wd)
        .build()
        .unwrap()
}

/// A small mag-like graph (all four types, power-law degrees, every paper labelled).
fn mag(dir: &std::path::Path) -> HetGraph {
    crate::generate::generate(
        crate::generate::Like::Mag,
        0.002,
        3,
        dir,
        false,
        &mut NoProgress,
    )
    .unwrap();
    crate::load(
        dir,
        &crate::LoadOptions {
            mmap_features: false,
            reverse_edges: false,
        },
    )
    .unwrap()
}

fn max_over_mean(v: &[u64]) -> f64 {
    let total: u64 = v.iter().sum();
    if total == 0 {
        return 1.0;
    }
    *v.iter().max().unwrap() as f64 * v.len() as f64 / total as f64
}

/// The worst train/valid/test balance of `owners`.
fn split_balance(g: &HetGraph, owners: &[Vec<u16>], parts: usize) -> f64 {
    let (_, splits) = g.target_labels();
    let t = g.target().index();
    splits
        .named()
        .iter()
        .map(|(_, ids)| {
            let mut c = vec![0u64; parts];
            ids.iter()
                .for_each(|&v| c[owners[t][v as usize] as usize] += 1);
            max_over_mean(&c)
        })
        .fold(0.0, f64::max)
}

fn edge_cut(g: &HetGraph, owners: &[Vec<u16>]) -> u64 {
    let mut cut = 0;
    for r in g.relations() {
        let csr = r.in_csr();
        for d in 0..csr.num_rows() as u32 {
            cut += csr
                .neighbors(d)
                .iter()
                .filter(|&&s| {
                    owners[r.src.index()][s as usize] != owners[r.dst.index()][d as usize]
                })
                .count() as u64;
        }
    }
    cut
}

fn in_range(g: &HetGraph, owners: &[Vec<u16>], parts: usize) -> bool {
    owners.len() == g.node_types().len()
        && owners
            .iter()
            .zip(g.node_types())
            .all(|(o, t)| o.len() == t.count as usize && o.iter().all(|&p| (p as usize) < parts))
}

#[test]
fn same_inputs_and_seed_give_the_same_owners_whatever_the_threads() {
    let g = communities();
    for b in [
        ByteGnn::DEFAULT,
        ByteGnn::paper(2, true),
        ByteGnn {
            type_weight: 0.5,
            ..ByteGnn::DEFAULT
        },
    ] {
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| b.assign(&g, 3, 5, None).unwrap());
        let many = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap()
            .install(|| b.assign(&g, 3, 5, None).unwrap());
        assert_eq!(one, many);
        assert_eq!(one, b.assign(&g, 3, 5, None).unwrap());
        assert!(in_range(&g, &one, 3));
    }
    // The seed breaks ties only: every seed's partitioning is as good.
    let other = ByteGnn::DEFAULT.assign(&g, 2, 6, None).unwrap();
    assert!(split_balance(&g, &other, 2) <= 1.05);
}

#[test]
fn every_node_gets_an_owner_in_range() {
    let g = communities();
    let tmp = tempfile::tempdir().unwrap();
    let m = mag(&tmp.path().join("g"));
    for parts in [1usize, 2, 3, 4, 7] {
        for b in [
            ByteGnn::DEFAULT,
            ByteGnn::paper(2, true),
            ByteGnn::paper(0, false),
            ByteGnn {
                hops: 1,
                reverse: false,
                ..ByteGnn::DEFAULT
            },
        ] {
            assert!(
                in_range(&g, &b.assign(&g, parts, 1, None).unwrap(), parts),
                "{b:?}, {parts} parts"
            );
            assert!(
                in_range(&m, &b.assign(&m, parts, 1, None).unwrap(), parts),
                "{b:?}, {parts} parts"
            );
        }
    }
}

#[test]
fn splits_balance_within_five_percent_with_a_cut_near_metis_and_far_below_random() {
    let g = communities();
    let tmp = tempfile::tempdir().unwrap();
    let m = mag(&tmp.path().join("g"));
    for parts in [2usize, 3, 4] {
        let b = ByteGnn::DEFAULT.assign(&g, parts, 0, None).unwrap();
        let (metis, random) = (
            Metis.assign(&g, parts, 0, None).unwrap(),
            Random.assign(&g, parts, 0, None).unwrap(),
        );
        assert!(
            split_balance(&g, &b, parts) <= 1.05,
            "{parts} parts: split balance {}",
            split_balance(&g, &b, parts)
        );
        let (cut, mcut, rcut) = (
            edge_cut(&g, &b),
            edge_cut(&g, &metis),
            edge_cut(&g, &random),
        );
        assert!(
            cut * 5 < rcut * 3,
            "{parts} parts: cut {cut}, random's {rcut}"
        );
        if parts == 2 {
            // Two planted communities: both find them (about 20 citations and a few authors across).
            assert!(cut <= mcut + 20, "cut {cut}, METIS's {mcut}");
        }
        let paper = ByteGnn::paper(2, true).assign(&g, parts, 0, None).unwrap();
        assert!(split_balance(&g, &paper, parts) <= 1.05);
        let mb = ByteGnn::DEFAULT.assign(&m, parts, 0, None).unwrap();
        assert!(
            split_balance(&m, &mb, parts) <= 1.05,
            "mag, {parts} parts: split balance {}",
            split_balance(&m, &mb, parts)
        );
        let mr = Random.assign(&m, parts, 0, None).unwrap();
        assert!(edge_cut(&m, &mb) < edge_cut(&m, &mr), "mag, {parts} parts");
        // With the type terms every type is capped too (up to the odd block past a cap).
        let typed = ByteGnn {
            type_weight: 0.5,
            ..ByteGnn::DEFAULT
        }
        .assign(&m, parts, 0, None)
        .unwrap();
        assert!(split_balance(&m, &typed, parts) <= 1.05);
        for (t, o) in typed.iter().enumerate() {
            let mut c = vec![0u64; parts];
            o.iter().for_each(|&p| c[p as usize] += 1);
            assert!(
                max_over_mean(&c) <= 1.25,
                "mag, {parts} parts, type {t}: {c:?}"
            );
        }
    }
}

/// Papers 0..7 citing `1→0, 2→1, 3→2, 0→4`, author 0 writing paper 0 and
/// affiliated with institution 0; only paper 0 is labelled.
fn chain() -> HetGraph {
    GraphBuilder::new("chain", "paper", 2)
        .node_type("paper", 7, None)
        .node_type("author", 1, None)
        .node_type("institution", 1, None)
        .labels(
            vec![0, -1, -1, -1, -1, -1, -1],
            Splits {
                train: vec![0],
                valid: vec![],
                test: vec![],
            },
        )
        .relation(
            "paper",
            "cites",
            "paper",
            vec![1, 2, 3, 0],
            vec![0, 1, 2, 4],
        )
        .relation("author", "writes", "paper", vec![0], vec![0])
        .relation("author", "affiliated_with", "institution", vec![0], vec![0])
        .build()
        .unwrap()
}

/// Who is in block 0 (papers, then the author and the institution).
fn reached(g: &HetGraph, hops: usize, reverse: bool) -> Vec<bool> {
    let opts = ByteGnn {
        hops,
        reverse,
        ..ByteGnn::DEFAULT
    };
    let mut s = State::new(&opts, g, 2, None).unwrap();
    s.grow_blocks(0);
    s.block.iter().map(|&b| b == 0).collect()
}

#[test]
fn the_bfs_walks_the_samplers_direction_up_to_the_hop_limit() {
    let mut g = chain();
    //                              papers 0..7                                  author institution
    assert_eq!(
        reached(&g, 0, false),
        [true, false, false, false, false, false, false, false, false]
    );
    assert_eq!(
        reached(&g, 1, false),
        [true, true, false, false, false, false, false, true, false]
    );
    // In-neighbours only: not paper 4 (cited by 0), nor the institution (the author's out-neighbour).
    assert_eq!(
        reached(&g, 2, false),
        [true, true, true, false, false, false, false, true, false]
    );
    assert_eq!(
        reached(&g, 3, false),
        [true, true, true, true, false, false, false, true, false]
    );
    // With reverse relations the sampler draws out-neighbours too.
    assert_eq!(
        reached(&g, 1, true),
        [true, true, false, false, true, false, false, true, false]
    );
    assert_eq!(
        reached(&g, 2, true),
        [true, true, true, false, true, false, false, true, true]
    );
    // The same once the graph has its rev_ relations: walked only with `reverse`.
    g.add_reverse_relations().unwrap();
    assert_eq!(
        reached(&g, 2, true),
        [true, true, true, false, true, false, false, true, true]
    );
    assert_eq!(
        reached(&g, 2, false),
        [true, true, true, false, false, false, false, true, false]
    );
}

#[test]
fn nodes_beyond_every_block_follow_their_neighbours() {
    // Two chains of 20 papers, each citing the previous one; papers 0 and
    // 20 (the chains' ends) are labelled.
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    for start in [0u32, 20] {
        for i in start..start + 19 {
            src.push(i + 1);
            dst.push(i);
        }
    }
    let mut labels = vec![-1i64; 40];
    labels[0] = 0;
    labels[20] = 1;
    let g = GraphBuilder::new("chains", "paper", 2)
        .node_type("paper", 40, None)
        .labels(
            labels,
            Splits {
                train: vec![0, 20],
                valid: vec![],
                test: vec![],
            },
        )
        .relation("paper", "cites", "paper", src, dst)
        .build()
        .unwrap();
    for b in [ByteGnn::DEFAULT, ByteGnn::paper(2, false)] {
        let o = &b.assign(&g, 2, 0, None).unwrap()[0];
        assert_ne!(o[0], o[20], "one training node each");
        assert!(
            o[..20].iter().all(|&p| p == o[0]) && o[20..].iter().all(|&p| p == o[20]),
            "{o:?}"
        );
    }
}

/// Per partition, the nodes per type, the sampler's in-edges and the labelled nodes per split, counted afresh.
fn counted(s: &State, g: &HetGraph) -> Vec<(Vec<u64>, u64, [u64; 3])> {
    let mut c = vec![(vec![0u64; g.node_types().len()], 0u64, [0u64; 3]); s.parts];
    for (t, owners) in s.owners.iter().enumerate() {
        for (v, &p) in owners.iter().enumerate() {
            let e = &mut c[p as usize];
            e.0[t] += 1;
            e.1 += degree(&s.walk[t], v as u32);
            if t == s.target {
                (0..3).for_each(|b| e.2[b] += u64::from(s.split_of[v] >> b & 1));
            }
        }
    }
    c
}

#[test]
fn node_refinement_lowers_the_cut_within_the_caps_and_keeps_the_loads_true() {
    let tmp = tempfile::tempdir().unwrap();
    let m = mag(&tmp.path().join("g"));
    for (g, parts) in [(&communities(), 2), (&m, 2), (&m, 3)] {
        let opts = ByteGnn::DEFAULT;
        let mut s = State::new(&opts, g, parts, None).unwrap();
        s.grow_blocks(1);
        let order = s.block_order(1);
        let groups = s.clusters(&order);
        s.place(&groups);
        for _ in 0..opts.passes {
            if s.refine(&order) == 0 {
                break;
            }
        }
        s.place_rest();
        let before = edge_cut(g, &s.owners);
        let loads_before: Vec<_> = s.loads.clone();
        let mut moved = 0;
        for _ in 0..20 {
            match s.refine_nodes() {
                0 => break,
                n => moved += n,
            }
        }
        let after = edge_cut(g, &s.owners);
        assert!(after <= before, "{parts} parts: cut {before} -> {after}");
        if g.node_types().len() > 2 {
            assert!(
                moved > 0 && after < before,
                "mag, {parts} parts: {moved} moved, cut {before} -> {after}"
            );
        }
        assert_eq!(s.refine_nodes(), 0, "a sweep after the last moves nothing");
        // The running loads are the owners' counts, and no partition passed a cap it was within.
        let fresh = counted(&s, g);
        for (p, (load, was)) in s.loads.iter().zip(&loads_before).enumerate() {
            assert_eq!(
                (&load.types, load.edges, load.splits),
                (&fresh[p].0, fresh[p].1, fresh[p].2),
                "partition {p}"
            );
            for t in 0..load.types.len() {
                assert!(
                    load.types[t] <= s.cap.types[t].max(was.types[t]),
                    "partition {p}, type {t}"
                );
            }
            for b in 0..3 {
                assert!(
                    load.splits[b] <= s.cap.splits[b].max(was.splits[b]),
                    "partition {p}, split {b}"
                );
            }
        }
    }
}

#[test]
fn metis_placement_keeps_blocks_whole_and_splits_balanced_with_a_cut_near_metis() {
    let tmp = tempfile::tempdir().unwrap();
    let m = mag(&tmp.path().join("g"));
    let b = ByteGnn {
        place: Placement::Metis,
        ..ByteGnn::DEFAULT
    };
    for (g, parts) in [(&communities(), 2), (&m, 2), (&m, 3)] {
        let owners = b.assign(g, parts, 4, None).unwrap();
        assert!(in_range(g, &owners, parts));
        assert_eq!(
            owners,
            b.assign(g, parts, 4, None).unwrap(),
            "same seed, same owners"
        );
        assert!(
            split_balance(g, &owners, parts) <= 1.05,
            "{parts} parts: split balance {}",
            split_balance(g, &owners, parts)
        );
        let (cut, mcut) = (
            edge_cut(g, &owners),
            edge_cut(g, &Metis.assign(g, parts, 4, None).unwrap()),
        );
        let greedy = edge_cut(g, &ByteGnn::DEFAULT.assign(g, parts, 4, None).unwrap());
        eprintln!("{parts} parts: cut {cut}, greedy {greedy}, METIS {mcut}");
        assert!(
            cut as f64 <= 1.1 * mcut as f64 + 20.0,
            "{parts} parts: cut {cut}, METIS's {mcut}"
        );
    }
    // Fewer blocks than partitions: the greedy placement takes over.
    let few = b.assign(&communities(), 200, 0, None);
    assert!(few.is_ok());
    assert!(
        "metis".parse::<Placement>().unwrap() == Placement::Metis
            && "greedy".parse::<Placement>().unwrap() == Placement::Greedy
    );
    assert!("best".parse::<Placement>().is_err());
}

#[test]
fn a_node_reached_by_two_blocks_at_once_joins_one_of_them_by_seed() {
    // Papers 0 and 2 (labelled) are both cited by paper 1.
    let g = GraphBuilder::new("tie", "paper", 2)
        .node_type("paper", 3, None)
        .labels(
            vec![0, -1, 1],
            Splits {
                train: vec![0, 2],
                valid: vec![],
                test: vec![],
            },
        )
        .relation("paper", "cites", "paper", vec![1, 1], vec![0, 2])
        .build()
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..16 {
        let opts = ByteGnn {
            hops: 1,
            reverse: false,
            ..ByteGnn::DEFAULT
        };
        let mut s = State::new(&opts, &g, 2, None).unwrap();
        s.grow_blocks(seed);
        assert!(s.block[1] == 0 || s.block[1] == 1);
        let mut again = State::new(&opts, &g, 2, None).unwrap();
        again.grow_blocks(seed);
        assert_eq!(s.block, again.block);
        seen.insert(s.block[1]);
    }
    assert_eq!(
        seen.len(),
        2,
        "the tie goes either way depending on the seed"
    );
}

#[test]
fn more_partitions_than_blocks_leave_some_empty() {
    let g = GraphBuilder::new("few", "paper", 2)
        .node_type("paper", 6, None)
        .labels(
            vec![0, 1, 0, -1, -1, -1],
            Splits {
                train: vec![0],
                valid: vec![1],
                test: vec![2],
            },
        )
        .relation("paper", "cites", "paper", vec![3, 4, 5], vec![0, 1, 2])
        .build()
        .unwrap();
    for b in [
        ByteGnn::DEFAULT,
        ByteGnn::paper(2, true),
        ByteGnn {
            type_weight: 1.0,
            ..ByteGnn::DEFAULT
        },
    ] {
        let owners = b.assign(&g, 8, 0, None).unwrap();
        assert!(in_range(&g, &owners, 8));
        // One labelled node of each split: never two of a split in one partition.
        let mut per = [[0u32; 3]; 8];
        for (s, v) in [0usize, 1, 2].into_iter().enumerate() {
            per[owners[0][v] as usize][s] += 1;
        }
        assert!(per.iter().all(|p| p.iter().all(|&c| c <= 1)));
    }
    // No labelled node at all (a sub-partition holding none): still every node placed.
    let none = [vec![1u16, 1, 1, 0, 0, 0]];
    let owners = ByteGnn::DEFAULT.assign(&g, 3, 0, Some((&none, 0))).unwrap();
    assert!(in_range(&g, &owners, 3));
    assert_eq!(&owners[0][..3], &[0, 0, 0], "nodes outside `within` get 0");
}

#[test]
fn invalid_inputs_are_errors_not_panics() {
    let g = communities();
    let d = ByteGnn::DEFAULT;
    assert!(d.assign(&g, 0, 0, None).is_err());
    assert!(d.assign(&g, MAX_PARTS + 1, 0, None).is_err());
    for bad in [
        ByteGnn {
            type_weight: 1.5,
            ..d
        },
        ByteGnn {
            type_weight: f64::NAN,
            ..d
        },
        ByteGnn {
            balance_weight: -0.1,
            ..d
        },
        ByteGnn {
            balance_weight: f64::NAN,
            ..d
        },
        ByteGnn {
            hops: MAX_HOPS + 1,
            ..d
        },
        ByteGnn {
            clusters: MAX_PARTS + 1,
            ..d
        },
        ByteGnn {
            seed_weights: [1.0, -0.1, 0.0],
            ..d
        },
        ByteGnn {
            seed_weights: [f64::INFINITY, 0.0, 0.0],
            ..d
        },
        ByteGnn {
            seed_weights: [f64::NAN, 0.0, 0.0],
            ..d
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
        assert!(bad.assign(&g, 2, 0, None).is_err(), "{bad:?}");
    }
    let short = [vec![0u16; 3], vec![0u16; 60]];
    assert!(d.assign(&g, 2, 0, Some((&short, 0))).is_err());
    let missing = [vec![0u16; 200]];
    assert!(d.assign(&g, 2, 0, Some((&missing, 0))).is_err());
    assert!(partition::assign(&g, 0, Method::Bytegnn, 0).is_err());
    for bad in [
        &[][..],
        &[0],
        &[25, 0],
        &[1; Fanouts::MAX + 1],
        &[u32::MAX as usize + 1],
    ] {
        assert!(Fanouts::new(bad).is_err(), "{bad:?}");
    }
    let f = Fanouts::new(&[15, 10, 5]).unwrap();
    assert_eq!(
        [f.at(0), f.at(1), f.at(2), f.at(3), f.at(9)],
        [15, 10, 5, 5, 5],
        "past the list: the last"
    );
    assert_eq!(Fanouts::new(&[25, 20]).unwrap(), Fanouts::TRAINING);
}

/// Paper 0 (the one labelled node, train) cited by papers 1..=50, each of
/// them cited by two papers of its own (51.., a tree), and paper 151 alone.
fn citation_tree() -> HetGraph {
    let (mut s, mut d) = (Vec::new(), Vec::new());
    for i in 1..=50u32 {
        s.push(i);
        d.push(0);
        for j in 0..2 {
            s.push(50 + 2 * (i - 1) + j + 1);
            d.push(i);
        }
    }
    GraphBuilder::new("tree", "paper", 2)
        .node_type("paper", 152, None)
        .labels(
            vec![0; 152],
            Splits {
                train: vec![0],
                valid: Vec::new(),
                test: Vec::new(),
            },
        )
        .relation("paper", "cites", "paper", s, d)
        .build()
        .unwrap()
}

#[test]
fn masses_and_scores_are_the_samplers_expected_reads_along_paths() {
    let g = citation_tree();
    let opts = ByteGnn {
        reverse: false,
        fanouts: Fanouts::new(&[10, 1]).unwrap(),
        ..ByteGnn::DEFAULT
    };
    let mut s = State::new(&opts, &g, 2, None).unwrap();
    s.grow_blocks(0);
    // Paper 0 and its first 25 citers (with theirs) on partition 0, the rest on 1.
    let on_zero = |v: u32| v == 0 || (1..=25).contains(&v) || (51..101).contains(&v);
    s.owners[0] = (0..152).map(|v| if on_zero(v) { 0 } else { 1 }).collect();
    let (mut out, mut next, mut cur) = (vec![0.0f32; 152], vec![0.0f32; 152], Vec::new());
    s.masses(0, &mut out, &mut cur, &mut next);
    // The seed itself, then 10 of 50 citers (0.2 each), then 1 of 2 of theirs (0.1).
    let want = |v: u32| match v {
        0 => 1.0,
        1..=50 => 0.2,
        51..=150 => 0.1,
        _ => 0.0,
    };
    for v in 0..152u32 {
        assert!(
            (out[v as usize] - want(v)).abs() < 1e-6,
            "paper {v}: mass {}",
            out[v as usize]
        );
    }
    // Partition 1's seeds: none.
    s.masses(1, &mut out, &mut cur, &mut next);
    assert!(out.iter().all(|&m| m == 0.0));
    // What the seed reads on each partition: 25 × 0.2 + 50 × 0.1 on both (its own row not counted).
    for q in 0..2u16 {
        s.scores(q, &mut out, &mut next);
        assert!(
            (out[0] - 10.0).abs() < 1e-4,
            "partition {q}: score {}",
            out[0]
        );
    }
    // Moving the seed's far half home: partition 0's score doubles, 1's vanishes.
    s.owners[0] = (0..152).map(|v| if v == 151 { 1 } else { 0 }).collect();
    s.scores(0, &mut out, &mut next);
    assert!((out[0] - 20.0).abs() < 1e-4, "score {}", out[0]);
    s.scores(1, &mut out, &mut next);
    assert_eq!(out[0], 0.0);
}

/// Remote input rows of `epochs` epochs of training batches (fanouts 25, 20,
/// batch 64), each partition sampling the seeds it owns.
fn remote_rows(g: &HetGraph, owners: &[Vec<u16>], parts: usize, epochs: u64) -> u64 {
    let t0 = g.target().index();
    let (_, splits) = g.target_labels();
    let mut sampler = crate::Sampler::new(g, &[25, 20], 0).unwrap();
    let mut remote = 0;
    for e in 0..epochs {
        for (step, batch) in crate::sampler::epoch_batches(&splits.train, 64, 0, e)
            .into_iter()
            .enumerate()
        {
            for k in 0..parts as u16 {
                let share: Vec<u32> = batch
                    .iter()
                    .copied()
                    .filter(|&v| owners[t0][v as usize] == k)
                    .collect();
                if share.is_empty() {
                    continue;
                }
                let mb = sampler.sample(e, step as u64, &share).unwrap();
                for (t, src) in mb.blocks[0].src.iter().enumerate() {
                    remote += src.iter().filter(|&&v| owners[t][v as usize] != k).count() as u64;
                }
            }
        }
    }
    remote
}

#[test]
fn following_the_samples_pulls_fewer_remote_rows_within_the_caps() {
    let tmp = tempfile::tempdir().unwrap();
    let m = mag(&tmp.path().join("g"));
    let sampled = crate::load(
        &tmp.path().join("g"),
        &crate::LoadOptions {
            mmap_features: false,
            reverse_edges: true,
        },
    )
    .unwrap();
    let c = communities();
    // On the planted communities the cut already finds what the samples read: no worse there.
    for (name, g, on, strict) in [("mag", &m, &sampled, true), ("communities", &c, &c, false)] {
        for parts in [2usize, 4] {
            let follow = ByteGnn::DEFAULT.assign(g, parts, 0, None).unwrap();
            let cut_only = ByteGnn {
                seed_weights: [0.0; 3],
                ..ByteGnn::DEFAULT
            }
            .assign(g, parts, 0, None)
            .unwrap();
            let (a, b) = (
                remote_rows(on, &follow, parts, 3),
                remote_rows(on, &cut_only, parts, 3),
            );
            eprintln!("{name}, {parts} parts: {a} remote rows following the samples, {b} without");
            assert!(
                a < b || (!strict && a == b),
                "{name}, {parts} parts: {a} remote rows following the samples, {b} without"
            );
            assert!(
                split_balance(g, &follow, parts) <= 1.05,
                "{name}, {parts} parts"
            );
            // Nodes move only into partitions below their type's cap.
            for (t, nt) in g.node_types().iter().enumerate() {
                let count = |o: &[Vec<u16>]| {
                    let mut c = vec![0u64; parts];
                    o[t].iter().for_each(|&p| c[p as usize] += 1);
                    c.into_iter().max().unwrap_or(0)
                };
                let cap = (u64::from(nt.count).div_ceil(parts as u64))
                    .max((1.05 * f64::from(nt.count) / parts as f64) as u64);
                assert!(
                    count(&follow) <= cap.max(count(&cut_only)),
                    "{name}, {parts} parts, type {t}"
                );
            }
        }
    }
}

#[test]
fn the_second_level_splits_each_partition_on_its_own_nodes() {
    let g = communities();
    let a = partition::assign_two_level(&g, 2, 2, Method::Bytegnn, 3).unwrap();
    assert_eq!(a.method, Method::Bytegnn);
    let (_, splits) = g.target_labels();
    for k in 0..2u16 {
        for (name, ids) in splits.named() {
            let mut per = [0u64; 2];
            ids.iter()
                .filter(|&&v| a.owners[0][v as usize] == k)
                .for_each(|&v| per[a.trainer_of[v as usize] as usize] += 1);
            assert!(
                per[0].abs_diff(per[1]) as f64 <= 0.05 * (per[0] + per[1]) as f64 + 1.0,
                "partition {k}, {name}: {per:?}"
            );
        }
    }
}

#[test]
fn the_method_parses_and_its_report_has_the_split_balance() {
    assert_eq!("bytegnn".parse::<Method>().unwrap(), Method::Bytegnn);
    assert_eq!(Method::Bytegnn.to_string(), "bytegnn");
    assert_eq!(
        serde_json::to_string(&Method::Bytegnn).unwrap(),
        "\"bytegnn\""
    );
    assert!("bytegn"
        .parse::<Method>()
        .unwrap_err()
        .to_string()
        .contains("bytegnn"));
    let g = communities();
    let tmp = tempfile::tempdir().unwrap();
    let a = partition::assign(&g, 4, Method::Bytegnn, 0).unwrap();
    let m = partition::write(&g, &a, &tmp.path().join("p"), false, &mut NoProgress).unwrap();
    let counts: Vec<u64> = g.node_types().iter().map(|t| u64::from(t.count)).collect();
    let r = PartitionReport::of_nodes(&m, &counts);
    assert_eq!(
        r.split_balance
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        ["test", "train", "valid"]
    );
    assert!(
        r.split_balance.values().all(|&b| (1.0..=1.05).contains(&b)),
        "{:?}",
        r.split_balance
    );
}
