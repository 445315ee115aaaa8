//! Link prediction's edges: the split, the held-out edges, the batch's
//! excluded edges in the sampler, and the negatives.

mod common;

use graphs::link::{
    copy_ranks, eval_negatives, train_negative, Batching, EdgeList, LinkEdges, NoExclusion,
    SplitSpec,
};
use graphs::{HetGraph, Sampler};

const WRITES: &str = "author__writes__paper";

fn graph() -> HetGraph {
    common::random(300, 200, 3000, 5)
}

#[test]
fn the_split_is_a_partition_of_the_edges_in_the_asked_shares() {
    let g = graph();
    let spec = SplitSpec {
        valid: 0.1,
        test: 0.2,
        seed: 7,
    };
    let e = LinkEdges::split(&g, &[WRITES.into()], &spec).unwrap();
    let n = g.relation(g.relation_id(WRITES).unwrap()).num_edges();
    assert_eq!(e.train.len() + e.valid.len() + e.test.len(), n);
    let share = |l: &EdgeList| l.len() as f64 / n as f64;
    assert!(
        (share(&e.valid) - 0.1).abs() < 0.03,
        "valid share {}",
        share(&e.valid)
    );
    assert!(
        (share(&e.test) - 0.2).abs() < 0.03,
        "test share {}",
        share(&e.test)
    );
    // Deterministic, and another split seed splits differently.
    assert_eq!(e, LinkEdges::split(&g, &[WRITES.into()], &spec).unwrap());
    assert_ne!(
        e,
        LinkEdges::split(&g, &[WRITES.into()], &SplitSpec { seed: 8, ..spec }).unwrap()
    );
}

#[test]
fn held_out_edges_leave_the_graph_and_its_reverse() {
    let mut g = graph();
    let rid = g.relation_id(WRITES).unwrap();
    let spec = SplitSpec {
        valid: 0.2,
        test: 0.2,
        seed: 1,
    };
    let e = LinkEdges::split(&g, &[WRITES.into()], &spec).unwrap();
    e.hold_out(&mut g, &spec).unwrap();
    g.add_reverse_relations().unwrap();
    let r = g.relation(rid);
    assert_eq!(r.num_edges(), e.train.len());
    let rev = g
        .relations()
        .iter()
        .find(|x| x.reverse_of == Some(rid))
        .unwrap();
    for held in [&e.valid, &e.test] {
        for i in 0..held.len() {
            let (u, v) = (held.src[i], held.dst[i]);
            assert!(!r.in_csr().neighbors(v).contains(&u));
            assert!(!r.out_csr().neighbors(u).contains(&v));
            assert!(!rev.in_csr().neighbors(u).contains(&v));
        }
    }
    for i in 0..e.train.len() {
        assert!(r
            .in_csr()
            .neighbors(e.train.dst[i])
            .contains(&e.train.src[i]));
    }
    // Too late once reverses exist: they would keep the pairs.
    assert!(e.hold_out(&mut g, &spec).is_err());
}

#[test]
fn bad_relations_and_shares_are_refused() {
    let g = graph();
    let spec = SplitSpec {
        valid: 0.1,
        test: 0.1,
        seed: 0,
    };
    let err = LinkEdges::split(&g, &["no__such__rel".into()], &spec)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no__such__rel") && err.contains(WRITES),
        "{err}"
    );
    assert!(LinkEdges::split(&g, &[], &spec).is_err());
    assert!(LinkEdges::split(&g, &[WRITES.into(), WRITES.into()], &spec).is_err());
    for (valid, test) in [(0.5, 0.5), (-0.1, 0.1), (f64::NAN, 0.0)] {
        assert!(LinkEdges::split(
            &g,
            &[WRITES.into()],
            &SplitSpec {
                valid,
                test,
                seed: 0
            }
        )
        .is_err());
    }
    let mut r = graph();
    r.add_reverse_relations().unwrap();
    let err = LinkEdges::split(&r, &["paper__rev_writes__author".into()], &spec)
        .unwrap_err()
        .to_string();
    assert!(err.contains("reverse"), "{err}");
}

#[test]
fn steps_partition_the_training_edges_by_a_hash_of_each_edge() {
    let mut g = graph();
    let spec = SplitSpec {
        valid: 0.1,
        test: 0.1,
        seed: 0,
    };
    let e = LinkEdges::split(&g, &[WRITES.into()], &spec).unwrap();
    let total = g.relation(e.relations[0]).num_edges() as u64;
    e.hold_out(&mut g, &spec).unwrap();
    g.add_reverse_relations().unwrap();
    let b = Batching::new(&g, &e, spec, 9, 100, total);
    assert_eq!(
        b.steps(),
        ((total as f64 * 0.8).round() as u64).div_ceil(100)
    );
    let key = g.relation(e.relations[0]).key();
    let copies = copy_ranks(&e.train.rel, &e.train.src, &e.train.dst);
    let steps = b.batches(3, &e.train, &copies, &[key]);
    let mut all: Vec<u32> = steps.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..e.train.len() as u32).collect::<Vec<_>>(),
        "every edge in exactly one step"
    );
    for (s, ids) in steps.iter().enumerate() {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a step keeps the list's order"
        );
        assert!(ids.iter().map(|&i| i as usize).all(|i| b.step_of(
            3,
            key,
            e.train.src[i],
            e.train.dst[i],
            copies[i]
        ) == s as u64));
    }
    assert!((b.nominal() - (total as f64 * 0.8).round() / b.steps() as f64).abs() < 1e-9);
    assert_ne!(
        steps,
        b.batches(4, &e.train, &copies, &[key]),
        "another epoch, other steps"
    );
}

/// No sampled block of a step holds one of the step's training edges, in
/// either direction, at any layer; every other neighbour is kept.
#[test]
fn a_step_never_samples_its_own_training_edges() {
    let mut g = graph();
    let spec = SplitSpec {
        valid: 0.0,
        test: 0.0,
        seed: 0,
    };
    let e = LinkEdges::split(&g, &[WRITES.into()], &spec).unwrap();
    g.add_reverse_relations().unwrap();
    let rid = g.relation_id(WRITES).unwrap();
    let rev = g.relation_id("paper__rev_writes__author").unwrap();
    let b = Batching::new(&g, &e, spec, 4, 300, e.train.len() as u64);
    let key = g.relation(rid).key();
    let copies = copy_ranks(&e.train.rel, &e.train.src, &e.train.dst);
    assert!(
        copies.iter().any(|&k| k > 0),
        "the graph has parallel edges"
    );
    let (epoch, step) = (2, 1);
    let batch = e
        .train
        .select(&b.batches(epoch, &e.train, &copies, &[key])[step as usize]);
    assert!(batch.len() > 100);
    let mut seeds = vec![Vec::new(); g.node_types().len()];
    let (author, paper) = (
        g.type_id("author").unwrap().index(),
        g.type_id("paper").unwrap().index(),
    );
    for i in 0..batch.len() {
        for (t, v) in [(author, batch.src[i]), (paper, batch.dst[i])] {
            if !seeds[t].contains(&v) {
                seeds[t].push(v);
            }
        }
    }
    let ex = b.exclusion(epoch, step);
    // Fanouts above every degree: the full neighbourhoods, minus the positives.
    let mut s = Sampler::new(&g, &[1000, 1000], 3).unwrap();
    let mb = s.sample_typed(epoch, step, &seeds, &ex).unwrap();
    let pairs: std::collections::HashSet<(u32, u32)> = (0..batch.len())
        .map(|i| (batch.src[i], batch.dst[i]))
        .collect();
    let mut kept = 0;
    for block in &mb.blocks {
        for br in &block.relations {
            let rel = g.relation(br.relation);
            for (d, sl) in br.edges() {
                let (dst, src) = (
                    block.dst[rel.dst.index()][d as usize],
                    block.src[rel.src.index()][sl as usize],
                );
                if br.relation == rid {
                    assert!(
                        !pairs.contains(&(src, dst)),
                        "positive {src} -> {dst} sampled"
                    );
                    kept += 1;
                }
                if br.relation == rev {
                    assert!(
                        !pairs.contains(&(dst, src)),
                        "reverse of positive {dst} -> {src} sampled"
                    );
                }
            }
            // Every other in-neighbour is there: only this step's edges are left out.
            for (i, &v) in block.dst[rel.dst.index()].iter().enumerate() {
                let all = rel.in_csr().neighbors(v);
                let expect = match br.relation {
                    r if r == rid => all.iter().filter(|&&u| !pairs.contains(&(u, v))).count(),
                    r if r == rev => all.iter().filter(|&&u| !pairs.contains(&(v, u))).count(),
                    _ => all.len(),
                };
                assert_eq!((br.offsets[i + 1] - br.offsets[i]) as usize, expect);
            }
        }
    }
    assert!(kept > 0);
    // Without exclusions the same sampler keeps the positives.
    let full = s.sample_typed(epoch, step, &seeds, &NoExclusion).unwrap();
    assert!(full.num_edges() > mb.num_edges());
}

#[test]
fn negatives_are_keyed_and_in_range() {
    let a: Vec<u32> = (0..50)
        .map(|j| train_negative(1, 2, 3, 4, 5, j, 17))
        .collect();
    let b: Vec<u32> = (0..50)
        .map(|j| train_negative(1, 2, 3, 4, 5, j, 17))
        .collect();
    assert_eq!(a, b);
    assert!(a.iter().all(|&x| x < 17));
    assert_ne!(
        a,
        (0..50)
            .map(|j| train_negative(1, 3, 3, 4, 5, j, 17))
            .collect::<Vec<_>>()
    );
    let e: Vec<u32> = eval_negatives(3, 4, 5, 100, 9).collect();
    assert_eq!(e, eval_negatives(3, 4, 5, 100, 9).collect::<Vec<_>>());
    assert!(e.iter().all(|&x| x < 9));
    assert_eq!(e.len(), 100);
}

/// A pair's parallel training edges are steps' edges like any other: they
/// fall into steps independently (a step holding every copy would give
/// their rows one Adam step where separate copies give several), ranked in
/// list order, and the first copy keeps the step it had before copies were
/// told apart.
#[test]
fn parallel_copies_fall_into_steps_of_their_own() {
    let ranks = copy_ranks(
        &[0, 0, 1, 0, 0, 0],
        &[1, 2, 1, 1, 1, 2],
        &[5, 5, 5, 5, 5, 6],
    );
    assert_eq!(
        ranks,
        [0, 0, 0, 1, 2, 0],
        "per (relation, source, destination)"
    );
    // A sorted list (link prediction's) ranks its runs the same way.
    let sorted = copy_ranks(&[0, 0, 0, 0, 1], &[1, 1, 1, 2, 1], &[5, 5, 6, 5, 5]);
    assert_eq!(sorted, [0, 1, 0, 0, 0]);

    let mut g = graph();
    let spec = SplitSpec {
        valid: 0.0,
        test: 0.0,
        seed: 0,
    };
    // Every pair once, then twice: each pair has two copies.
    let rid = g.relation_id(WRITES).unwrap();
    let e = LinkEdges::split(&g, &[WRITES.into()], &spec).unwrap();
    let firsts: Vec<u32> = copy_ranks(&e.train.rel, &e.train.src, &e.train.dst)
        .iter()
        .enumerate()
        .filter(|(_, &k)| k == 0)
        .map(|(i, _)| i as u32)
        .collect();
    let once = e.train.select(&firsts);
    let mut twice = EdgeList::default();
    for i in 0..once.len() {
        for _ in 0..2 {
            twice.rel.push(once.rel[i]);
            twice.src.push(once.src[i]);
            twice.dst.push(once.dst[i]);
        }
    }
    g.add_reverse_relations().unwrap();
    let b = Batching::new(&g, &e, spec, 4, 100, twice.len() as u64);
    let key = g.relation(rid).key();
    let copies = copy_ranks(&twice.rel, &twice.src, &twice.dst);
    let steps = b.batches(0, &twice, &copies, &[key]);
    let mut step_of = vec![0usize; twice.len()];
    for (s, ids) in steps.iter().enumerate() {
        for &i in ids {
            step_of[i as usize] = s;
        }
    }
    let pairs = twice.len() / 2;
    let together = (0..pairs)
        .filter(|&p| step_of[2 * p] == step_of[2 * p + 1])
        .count();
    // Independent copies share a step with probability 1 / steps.
    let expect = pairs as f64 / b.steps() as f64;
    assert!(
        (together as f64) < 3.0 * expect + 10.0,
        "{together} of {pairs} pairs have both copies in one step (about {expect:.0} expected)"
    );
    // The first copies batch as the list without copies does.
    let single = b.batches(0, &once, &vec![0; once.len()], &[key]);
    for (s, ids) in single.iter().enumerate() {
        assert!(ids.iter().all(|&i| step_of[2 * i as usize] == s));
    }
    // A step leaves a pair out when either of its copies is in the step.
    let ex = b.exclusion(0, 3);
    use graphs::link::ExcludeEdges;
    for p in 0..pairs {
        let (u, v) = (twice.src[2 * p], twice.dst[2 * p]);
        let in_step = step_of[2 * p] == 3 || step_of[2 * p + 1] == 3;
        assert_eq!(ex.excludes(rid, v, u, 2), in_step, "pair {u} -> {v}");
        assert_eq!(ex.excludes(rid, v, u, 1), step_of[2 * p] == 3);
    }
}
