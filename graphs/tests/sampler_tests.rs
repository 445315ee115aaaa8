//! The neighbor sampler: determinism, uniformity, fanout caps, block shape,
//! and relation subsets that agree with the full sample.

mod common;

use std::collections::{BTreeSet, HashMap};

use graphs::sampler::{epoch_batches, neighbor_key, sample_neighbors};
use graphs::{HetGraph, MiniBatch, RelationFilter, RelationId, Sampler};

/// Global-id edge sets per (layer, relation): `(dst, src)` multiset as a sorted vec.
fn global_edges(g: &HetGraph, mb: &MiniBatch) -> HashMap<(usize, RelationId), Vec<(u32, u32)>> {
    let mut out = HashMap::new();
    for b in &mb.blocks {
        for r in &b.relations {
            let rel = g.relation(r.relation);
            let mut e: Vec<(u32, u32)> = r
                .edges()
                .map(|(d, s)| {
                    (
                        b.dst[rel.dst.index()][d as usize],
                        b.src[rel.src.index()][s as usize],
                    )
                })
                .collect();
            e.sort_unstable();
            out.insert((b.layer, r.relation), e);
        }
    }
    out
}

fn check_block_invariants(g: &HetGraph, mb: &MiniBatch, fanouts: &[usize]) {
    let layers = mb.blocks.len();
    assert_eq!(layers, fanouts.len());
    let last = &mb.blocks[layers - 1];
    assert_eq!(last.dst[g.target().index()], mb.seeds);
    for (i, b) in mb.blocks.iter().enumerate() {
        assert_eq!(b.layer, i);
        let fanout = fanouts[layers - 1 - i];
        for (t, dst) in b.dst.iter().enumerate() {
            assert_eq!(&b.src[t][..dst.len()], &dst[..], "src starts with dst");
            let uniq: BTreeSet<_> = b.src[t].iter().collect();
            assert_eq!(uniq.len(), b.src[t].len(), "src nodes are distinct");
        }
        if i + 1 < layers {
            assert_eq!(
                b.dst,
                mb.blocks[i + 1].src,
                "a block's destinations are the next block's sources"
            );
        }
        for r in &b.relations {
            let rel = g.relation(r.relation);
            let dst = &b.dst[rel.dst.index()];
            assert_eq!(r.offsets.len(), dst.len() + 1);
            for (d, w) in r.offsets.windows(2).enumerate() {
                let v = dst[d];
                let picked: Vec<u32> = r.sources[w[0] as usize..w[1] as usize]
                    .iter()
                    .map(|&s| b.src[rel.src.index()][s as usize])
                    .collect();
                let all = rel.in_csr().neighbors(v);
                assert_eq!(picked.len(), all.len().min(fanout), "fanout cap");
                // Every pick is a real in-neighbor, and no edge slot is used twice.
                let mut pool: Vec<u32> = all.to_vec();
                for p in &picked {
                    let at = pool
                        .iter()
                        .position(|x| x == p)
                        .expect("picked node is an in-neighbor");
                    pool.swap_remove(at);
                }
            }
        }
    }
}

#[test]
fn blocks_have_the_documented_shape() {
    let g = common::random(300, 200, 3000, 1);
    for fanouts in [vec![2], vec![5, 3], vec![4, 2, 1], vec![1000, 1000]] {
        let mut s = Sampler::new(&g, &fanouts, 7).unwrap();
        let mb = s.sample(0, 0, &[5, 17, 3, 250]).unwrap();
        check_block_invariants(&g, &mb, &fanouts);
    }
    let mut g = common::random(300, 200, 3000, 1);
    g.add_reverse_relations().unwrap();
    let mut s = Sampler::new(&g, &[6, 4], 7).unwrap();
    let mb = s.sample(1, 2, &[9, 8, 7]).unwrap();
    check_block_invariants(&g, &mb, &[6, 4]);
    // With reverse relations, authors reached at hop 1 get paper neighbors at hop 2.
    let author = g.type_id("author").unwrap();
    assert!(!mb.blocks[0].dst[author.index()].is_empty());
    assert!(mb.blocks[0]
        .relations
        .iter()
        .any(|r| g.relation(r.relation).dst == author && r.num_edges() > 0));
}

#[test]
fn tiny_graph_sample_is_exact_when_fanout_covers_degrees() {
    let g = common::tiny();
    let mut s = Sampler::new(&g, &[10], 0).unwrap();
    let mb = s.sample(0, 0, &[0, 5]).unwrap();
    let b = &mb.blocks[0];
    let cites = g.relation_id("paper__cites__paper").unwrap();
    let r = b.relation(cites).unwrap();
    let got: Vec<(u32, u32)> = r
        .edges()
        .map(|(d, s)| (b.dst[0][d as usize], b.src[0][s as usize]))
        .collect();
    assert_eq!(got, vec![(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (5, 0)]);
    // Paper sources: the seeds first, then newly reached papers in discovery order.
    assert_eq!(b.src[0], vec![0, 5, 1, 2, 3, 4]);
    assert_eq!(b.src[1], vec![0, 1, 3]); // authors of paper 0, then of paper 5 (sorted)
    assert!(
        b.relation(g.relation_id("paper__published_in__venue").unwrap())
            .is_none(),
        "no venue destinations"
    );
}

#[test]
fn same_inputs_same_sample_across_calls_samplers_and_threads() {
    let g = common::random(500, 300, 8000, 2);
    let seeds: Vec<u32> = (0..64).map(|i| i * 7 % 500).collect();
    let reference = Sampler::new(&g, &[5, 3], 11)
        .unwrap()
        .sample(3, 4, &seeds)
        .unwrap();
    let mut s = Sampler::new(&g, &[5, 3], 11).unwrap();
    s.sample(0, 0, &[1, 2, 3]).unwrap(); // unrelated work in between must not matter
    assert_eq!(s.sample(3, 4, &seeds).unwrap(), reference);
    let from_threads: Vec<MiniBatch> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                sc.spawn(|| {
                    Sampler::new(&g, &[5, 3], 11)
                        .unwrap()
                        .sample(3, 4, &seeds)
                        .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(from_threads.iter().all(|m| *m == reference));
    // Any change of seed, epoch or step changes the sample.
    for (seed, epoch, step) in [(12, 3, 4), (11, 4, 4), (11, 3, 5)] {
        let other = Sampler::new(&g, &[5, 3], seed)
            .unwrap()
            .sample(epoch, step, &seeds)
            .unwrap();
        assert_ne!(global_edges(&g, &other), global_edges(&g, &reference));
    }
}

/// Leaves out `cites` edges whose ends sum to a multiple of 3.
struct EveryThirdCite(RelationId);

impl graphs::link::ExcludeEdges for EveryThirdCite {
    fn touches(&self, r: RelationId) -> bool {
        r == self.0
    }
    fn excludes(&self, r: RelationId, dst: u32, src: u32, _: u32) -> bool {
        r == self.0 && (dst + src).is_multiple_of(3)
    }
}

#[test]
fn drawing_on_rayon_s_pool_gives_the_one_thread_batch() {
    let g = common::random(6000, 4000, 60_000, 5);
    let seeds: Vec<u32> = (0..400).map(|i| i * 13 % 6000).collect();
    let fanouts = [10, 5, 3];
    let one = Sampler::new(&g, &fanouts, 7)
        .unwrap()
        .sample(2, 9, &seeds)
        .unwrap();
    let mut pooled = Sampler::new(&g, &fanouts, 7).unwrap().in_parallel();
    let many = pooled.sample(2, 9, &seeds).unwrap();
    // The outer hops have enough destinations to be drawn in several chunks.
    let widest = one.blocks[1].dst.iter().map(Vec::len).sum::<usize>();
    assert!(
        widest >= 4 * graphs::sampler::PARALLEL_DESTINATIONS,
        "{widest}"
    );
    assert_eq!(many, one);
    // Again, to check the pooled sampler's maps were left clean.
    assert_eq!(pooled.sample(2, 9, &seeds).unwrap(), one);
    // With exclusions, and typed seeds of both types.
    let cites = RelationId(
        g.relations()
            .iter()
            .position(|r| r.name == "cites")
            .unwrap() as u32,
    );
    let typed = vec![seeds.clone(), (0..1500).collect()];
    let ex = EveryThirdCite(cites);
    let one = Sampler::new(&g, &fanouts, 7)
        .unwrap()
        .sample_typed(2, 9, &typed, &ex)
        .unwrap();
    let many = pooled.sample_typed(2, 9, &typed, &ex).unwrap();
    assert_eq!(many, one);
    assert_ne!(
        one,
        Sampler::new(&g, &fanouts, 7)
            .unwrap()
            .sample_typed(2, 9, &typed, &graphs::link::NoExclusion)
            .unwrap(),
        "the exclusion changes the draws"
    );
}

#[test]
fn a_sampler_on_another_s_maps_draws_what_a_new_one_draws() {
    let g = common::random(3000, 2000, 30_000, 4);
    let fanouts = [6, 4];
    let first: Vec<u32> = (0..200).map(|i| i * 7 % 3000).collect();
    let second: Vec<u32> = (0..150).map(|i| i * 11 % 3000).collect();
    let mut used = Sampler::new(&g, &fanouts, 3).unwrap();
    used.sample(0, 1, &first).unwrap();
    // A failed call (a seed listed twice) must leave them clean too.
    assert!(used.sample(0, 2, &[5, 9, 5]).is_err());
    let maps = used.into_maps();
    assert_eq!(maps.len(), g.node_types().len());
    for (t, map) in maps.iter().enumerate() {
        assert_eq!(map.len(), g.node_types()[t].count as usize);
        assert!(
            map.iter().all(|&e| e == u32::MAX),
            "type {t} holds a position"
        );
    }
    let fresh = Sampler::new(&g, &fanouts, 3)
        .unwrap()
        .sample(4, 5, &second)
        .unwrap();
    let mut reused = Sampler::new(&g, &fanouts, 3).unwrap().with_maps(maps);
    assert_eq!(reused.sample(4, 5, &second).unwrap(), fresh);
    // Maps of another number of types are not taken.
    let other = Sampler::new(&g, &fanouts, 3)
        .unwrap()
        .with_maps(vec![vec![0; 10]]);
    assert_eq!(
        other.into_maps(),
        vec![Vec::<u32>::new(); g.node_types().len()]
    );
}

#[test]
fn the_top_hops_are_the_whole_sample_s_last_blocks() {
    let g = common::random(3000, 2000, 30_000, 4);
    let fanouts = [6, 4, 3];
    let seeds: Vec<u32> = (0..200).map(|i| i * 7 % 3000).collect();
    let whole = Sampler::new(&g, &fanouts, 3)
        .unwrap()
        .sample(2, 9, &seeds)
        .unwrap();
    for hops in 1..=3 {
        let top = Sampler::new(&g, &fanouts, 3)
            .unwrap()
            .top_hops(hops)
            .unwrap()
            .sample(2, 9, &seeds)
            .unwrap();
        assert_eq!(top.seeds, whole.seeds);
        assert_eq!(top.blocks[..], whole.blocks[3 - hops..], "{hops} hops");
    }
    for bad in [0, 4] {
        let err = Sampler::new(&g, &fanouts, 3).unwrap().top_hops(bad).err();
        assert!(err
            .unwrap()
            .to_string()
            .contains("hops of a 3-layer sampler"));
    }
}

#[test]
fn hops_assembled_from_chunked_picks_equal_the_sampler_s_blocks() {
    // ByteGNN's DAG: each hop's picks made in chunks of destinations (by any
    // thread, in any order), merged, then assembled.
    let g = common::random(500, 300, 8000, 2);
    let seeds: Vec<u32> = (0..64).map(|i| i * 7 % 500).collect();
    let fanouts = [5, 3];
    let want = Sampler::new(&g, &fanouts, 11)
        .unwrap()
        .sample(3, 4, &seeds)
        .unwrap();
    let mut frontier = vec![Vec::new(); g.node_types().len()];
    frontier[g.target().index()] = seeds.clone();
    let mut s = Sampler::new(&g, &fanouts, 11).unwrap();
    let mut blocks = Vec::new();
    for (hop, &fanout) in fanouts.iter().enumerate() {
        let layer = fanouts.len() - 1 - hop;
        let mut picks = Vec::new();
        for (t, nodes) in frontier.iter().enumerate() {
            // Chunks of 7 destinations, picked last chunk first, concatenated in order.
            let chunks: Vec<Vec<graphs::RelationPicks>> = nodes
                .chunks(7)
                .rev()
                .map(|c| {
                    Sampler::new(&g, &fanouts, 11)
                        .unwrap()
                        .pick(
                            3,
                            4,
                            layer,
                            fanout,
                            graphs::NodeTypeId(t as u32),
                            c,
                            &RelationFilter::All,
                            &graphs::link::NoExclusion,
                        )
                        .unwrap()
                })
                .collect();
            let mut merged: Vec<graphs::RelationPicks> = Vec::new();
            for chunk in chunks.into_iter().rev() {
                for p in chunk {
                    match merged.iter_mut().find(|m| m.relation == p.relation) {
                        Some(m) => {
                            let base = *m.offsets.last().unwrap();
                            m.offsets.extend(p.offsets[1..].iter().map(|o| o + base));
                            m.picks.extend(p.picks);
                        }
                        None => merged.push(p),
                    }
                }
            }
            picks.push(merged);
        }
        let block = s
            .assemble(
                layer,
                fanout,
                frontier.clone(),
                &picks,
                &RelationFilter::All,
            )
            .unwrap();
        frontier = block.src.clone();
        blocks.push(block);
    }
    blocks.reverse();
    assert_eq!(blocks, want.blocks);
    // Malformed picks (one destination short) are refused, and the sampler stays usable.
    let mut dst = vec![Vec::new(); g.node_types().len()];
    dst[g.target().index()] = vec![1, 2];
    let short = s
        .pick(
            0,
            0,
            0,
            3,
            g.target(),
            &[1],
            &RelationFilter::All,
            &graphs::link::NoExclusion,
        )
        .unwrap();
    let mut picks = vec![Vec::new(); g.node_types().len()];
    picks[g.target().index()] = short;
    assert!(s.assemble(0, 3, dst, &picks, &RelationFilter::All).is_err());
    assert_eq!(s.sample(3, 4, &seeds).unwrap(), want);
}

#[test]
fn a_batch_from_picks_drawn_elsewhere_is_the_sampler_s() {
    // A device sampler draws each relation's picks from the key it is given:
    // with the CPU's draw, `sample_by` must give `sample`'s batch exactly.
    let g = common::random(500, 300, 8000, 2);
    let seeds: Vec<u32> = (0..64).map(|i| i * 7 % 500).collect();
    let fanouts = [5, 3];
    let want = Sampler::new(&g, &fanouts, 11)
        .unwrap()
        .sample(3, 4, &seeds)
        .unwrap();
    let mut asked = 0;
    let got = Sampler::new(&g, &fanouts, 11)
        .unwrap()
        .sample_by(3, 4, &seeds, |rid, base, nodes, fanout| {
            asked += 1;
            let (mut offsets, mut picks, mut scratch) = (vec![0u32], Vec::new(), Vec::new());
            for &v in nodes {
                let row = g.relation(rid).in_csr().neighbors(v);
                let key = graphs::rng::key(&[base, u64::from(v)]);
                sample_neighbors(key, row, fanout, &mut scratch, &mut picks);
                offsets.push(picks.len() as u32);
            }
            Ok::<_, graphs::GraphError>(graphs::RelationPicks {
                relation: rid,
                offsets,
                picks,
            })
        })
        .unwrap();
    assert_eq!(got, want);
    assert!(asked >= 2, "{asked} relations picked");
    // A picker's error comes back as it is, and a malformed answer is refused.
    let err = Sampler::new(&g, &fanouts, 11)
        .unwrap()
        .sample_by(3, 4, &seeds, |_, _, _, _| {
            Err(graphs::GraphError::InvalidArgument("device lost".into()))
        })
        .unwrap_err();
    assert!(err.to_string().contains("device lost"), "{err}");
    let err = Sampler::new(&g, &fanouts, 11)
        .unwrap()
        .sample_by(3, 4, &seeds, |rid, _, nodes, fanout| {
            Ok::<_, graphs::GraphError>(graphs::RelationPicks {
                relation: rid,
                offsets: (0..=nodes.len() as u32)
                    .map(|i| i * (fanout as u32 + 1))
                    .collect(),
                picks: vec![0; nodes.len() * (fanout + 1)],
            })
        })
        .unwrap_err();
    assert!(err.to_string().contains("malformed"), "{err}");
}

#[test]
fn a_node_draws_the_same_neighbors_whatever_batch_it_is_in() {
    let g = common::random(400, 100, 6000, 3);
    let cites = g.relation_id("paper__cites__paper").unwrap();
    let a = Sampler::new(&g, &[4], 5)
        .unwrap()
        .sample(0, 9, &[10, 20, 30])
        .unwrap();
    let b = Sampler::new(&g, &[4], 5)
        .unwrap()
        .sample(0, 9, &[30, 99])
        .unwrap();
    let pick = |mb: &MiniBatch, v: u32| -> Vec<u32> {
        global_edges(&g, mb)[&(0, cites)]
            .iter()
            .filter(|e| e.0 == v)
            .map(|e| e.1)
            .collect()
    };
    assert_eq!(pick(&a, 30), pick(&b, 30));
    // ... and it is the documented pure function of the key.
    let mut scratch = Vec::new();
    let mut out = Vec::new();
    sample_neighbors(
        neighbor_key(5, 0, 9, 0, g.relation(cites).key(), 30),
        g.relation(cites).in_csr().neighbors(30),
        4,
        &mut scratch,
        &mut out,
    );
    out.sort_unstable();
    assert_eq!(pick(&a, 30), out);
}

#[test]
fn sampling_without_replacement_is_uniform() {
    // One destination with 8 neighbors, fanout 3: each of the 56 subsets is equally likely.
    let neighbors: Vec<u32> = (100..108).collect();
    let trials = 28_000u64;
    let mut counts: HashMap<Vec<u32>, u64> = HashMap::new();
    let mut per_node = [0u64; 8];
    let (mut scratch, mut out) = (Vec::new(), Vec::new());
    for step in 0..trials {
        out.clear();
        sample_neighbors(
            neighbor_key(0, 0, step, 0, 42, 1),
            &neighbors,
            3,
            &mut scratch,
            &mut out,
        );
        assert_eq!(out.len(), 3);
        assert!(
            out.windows(2).all(|w| w[0] < w[1]),
            "distinct and in neighbor order"
        );
        for &v in &out {
            per_node[(v - 100) as usize] += 1;
        }
        *counts.entry(out.clone()).or_default() += 1;
    }
    assert_eq!(counts.len(), 56);
    let expected = trials as f64 / 56.0;
    let chi2: f64 = counts
        .values()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    // 55 degrees of freedom: the 0.001 critical value is 93.2.
    assert!(chi2 < 93.2, "subset chi-square {chi2}");
    let expected = trials as f64 * 3.0 / 8.0;
    let chi2: f64 = per_node
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    assert!(chi2 < 24.3, "per-node chi-square {chi2} {per_node:?}"); // 7 dof, p = 0.001

    // Large fanouts take the hash-set path; still distinct and capped.
    let many: Vec<u32> = (0..500).collect();
    out.clear();
    sample_neighbors(7, &many, 200, &mut scratch, &mut out);
    assert_eq!(out.len(), 200);
    assert!(out.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn relation_subsets_yield_exactly_the_full_samples_edges() {
    let mut g = common::random(400, 300, 6000, 4);
    g.add_reverse_relations().unwrap();
    let fanouts = [5, 4];
    let seeds: Vec<u32> = (0..50).map(|i| i * 3).collect();
    let full = Sampler::new(&g, &fanouts, 9)
        .unwrap()
        .sample(1, 2, &seeds)
        .unwrap();
    let full_edges = global_edges(&g, &full);
    let writes = g.relation_id("author__writes__paper").unwrap();
    let rev_writes = g.relation_id("paper__rev_writes__author").unwrap();
    let cites = g.relation_id("paper__cites__paper").unwrap();
    let filters = [
        RelationFilter::Only(vec![writes]),
        RelationFilter::Only(vec![cites]),
        RelationFilter::Only(vec![writes, rev_writes]),
        // A metatree branch: paper <-writes- author <-rev_writes- paper.
        RelationFilter::PerLayer(vec![vec![rev_writes], vec![writes]]),
    ];
    for filter in &filters {
        let part = Sampler::new(&g, &fanouts, 9)
            .unwrap()
            .sample_relations(1, 2, &seeds, filter)
            .unwrap();
        for b in &part.blocks {
            for r in &b.relations {
                assert!(filter.allows(b.layer, r.relation));
            }
        }
        for ((layer, rel), edges) in global_edges(&g, &part) {
            let want = &full_edges[&(layer, rel)];
            let dsts: BTreeSet<u32> = part.blocks[layer].dst[g.relation(rel).dst.index()]
                .iter()
                .copied()
                .collect();
            let restricted: Vec<(u32, u32)> = want
                .iter()
                .filter(|e| dsts.contains(&e.0))
                .copied()
                .collect();
            assert_eq!(
                edges,
                restricted,
                "layer {layer} {}",
                g.relation(rel).canonical()
            );
        }
        // At the last layer (the seeds) the subset's edges are the full sample's, whole.
        let last = fanouts.len() - 1;
        for r in &part.blocks[last].relations {
            assert_eq!(
                global_edges(&g, &part)[&(last, r.relation)],
                full_edges[&(last, r.relation)]
            );
        }
    }
}

#[test]
fn bad_arguments_are_refused() {
    let g = common::tiny();
    assert!(Sampler::new(&g, &[], 0).is_err());
    let mut s = Sampler::new(&g, &[2], 0).unwrap();
    let e = s.sample(0, 0, &[0, 6]).unwrap_err();
    assert!(e.to_string().contains("seed 6 is out of range"), "{e}");
    let e = s.sample(0, 0, &[1, 2, 1]).unwrap_err();
    assert!(e.to_string().contains("listed twice"), "{e}");
    // The sampler stays usable after a refused call.
    assert_eq!(
        s.sample(0, 0, &[1, 2]).unwrap(),
        Sampler::new(&g, &[2], 0)
            .unwrap()
            .sample(0, 0, &[1, 2])
            .unwrap()
    );
}

#[test]
fn epoch_batches_are_a_shuffled_partition_fixed_by_seed_and_epoch() {
    let train: Vec<u32> = (0..1000).collect();
    let a = epoch_batches(&train, 64, 1, 0);
    assert_eq!(a, epoch_batches(&train, 64, 1, 0));
    assert_ne!(a, epoch_batches(&train, 64, 1, 1));
    assert_ne!(a, epoch_batches(&train, 64, 2, 0));
    assert_eq!(a.len(), 16);
    assert_eq!(a.last().unwrap().len(), 1000 - 15 * 64);
    let mut all: Vec<u32> = a.concat();
    assert_ne!(all, train, "shuffled");
    all.sort_unstable();
    assert_eq!(all, train);
}

/// What a distributed caller's `remote` may fail with: its own error type.
#[derive(Debug, PartialEq)]
enum Remote {
    /// The owner did not answer in time (the caller retries).
    Lost(u32),
    /// The sampler's own refusal.
    Graph(String),
}

impl From<graphs::GraphError> for Remote {
    fn from(e: graphs::GraphError) -> Remote {
        Remote::Graph(e.to_string())
    }
}

#[test]
fn an_error_of_the_remote_callback_comes_back_as_it_is() {
    let g = common::tiny();
    let mut s = Sampler::new(&g, &[2, 2], 0).unwrap();
    // Paper 5 is remote: its owner is lost, and the caller is told so.
    let e = s
        .sample_with(
            0,
            0,
            &[0, 5],
            &RelationFilter::All,
            |_, v| v != 5,
            |_, _, _| Err(Remote::Lost(5)),
        )
        .unwrap_err();
    assert_eq!(e, Remote::Lost(5));
    // The sampler's own refusals still reach it, converted.
    let e = s
        .sample_with(
            0,
            0,
            &[0, 0],
            &RelationFilter::All,
            |_, _| true,
            |_, _, _| Err(Remote::Lost(0)),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Remote::Graph(m) if m.contains("listed twice")),
        "{e:?}"
    );
}
