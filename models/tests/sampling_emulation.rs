//! The device sampler's kernels (`models/src/ops/sampling.cu`) run on the CPU
//! against graphs' sampler: every destination's picks must be
//! `Sampler::pick`'s, value for value, with the launch shape a device run
//! uses and with a tiny grid that makes the grid-stride loops go round.
//!
//! The kernels use no shared memory, atomics or barriers, so the emulator
//! (`emu`) runs them as the GPU does. Needs a C++ compiler (`$CXX`, else
//! `c++`); without one the tests say so and check nothing.

use std::path::PathBuf;
use std::sync::OnceLock;

use graphs::link::NoExclusion;
use graphs::rng::CounterRng;
use graphs::sampler::{layer_key, RelationFilter, RelationPicks, Sampler};
use graphs::{GraphBuilder, HetGraph, Splits};

mod emu;

use emu::Emu;

/// `sampling.cu` compiled for the host, once per test binary; `None` without a C++ compiler.
fn emu() -> Option<&'static Emu> {
    static EMU: OnceLock<Option<Emu>> = OnceLock::new();
    EMU.get_or_init(|| {
        Emu::build(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/ops/sampling.cu"))
    })
    .as_ref()
}

/// The kernels' fanout limit (`PICK_MAX_FANOUT` in sampling.cu).
const MAX_FANOUT: u32 = 64;

type Counts = unsafe extern "C" fn(*const u64, *const u32, *mut u32, u32, u32);
type Picks =
    unsafe extern "C" fn(*const u64, *const u32, *const u32, *const u32, u64, u32, u32, *mut u32);

/// 300 papers citing papers, destination `i` with about `(7 i) mod 230`
/// citations (none up to three times the largest fanout, parallel edges
/// among them), and 40 authors writing papers; reverse relations added.
fn graph() -> HetGraph {
    let mut r = CounterRng::new(11);
    let (np, na) = (300u32, 40u32);
    let (mut cs, mut cd) = (Vec::new(), Vec::new());
    for d in 0..np {
        for _ in 0..(7 * d) % 230 {
            cs.push(r.below(np.into()) as u32);
            cd.push(d);
        }
    }
    let (ws, wd): (Vec<u32>, Vec<u32>) = (0..900)
        .map(|_| (r.below(na.into()) as u32, r.below(np.into()) as u32))
        .unzip();
    let mut g = GraphBuilder::new("s", "paper", 2)
        .node_type("paper", np, None)
        .node_type("author", na, None)
        .labels(
            (0..np).map(|i| i64::from(i % 2)).collect(),
            Splits {
                train: (0..200).collect(),
                valid: (200..250).collect(),
                test: (250..300).collect(),
            },
        )
        .relation("paper", "cites", "paper", cs, cd)
        .relation("author", "writes", "paper", ws, wd)
        .build()
        .unwrap();
    g.add_reverse_relations().unwrap();
    g
}

/// The kernels' picks of relation `rid` for `nodes` on a `grid` × `block` launch.
fn device_picks(
    e: &Emu,
    g: &HetGraph,
    rid: graphs::ids::RelationId,
    base: u64,
    nodes: &[u32],
    fanout: u32,
    (grid, block): (u32, u32),
) -> RelationPicks {
    let csr = g.relation(rid).in_csr();
    let n = nodes.len() as u32;
    let mut counts = vec![u32::MAX; nodes.len()];
    let count: Counts = e.kernel("pick_counts");
    let c = counts.as_mut_ptr();
    e.launch(grid, block, || unsafe {
        count(csr.offsets().as_ptr(), nodes.as_ptr(), c, n, fanout)
    });
    let mut offsets = vec![0u32];
    for c in &counts {
        offsets.push(offsets.last().unwrap() + c);
    }
    // Filled with a value no pick has, so an unwritten slot shows.
    let mut picks = vec![u32::MAX; *offsets.last().unwrap() as usize];
    let pick: Picks = e.kernel("pick_neighbors");
    let p = picks.as_mut_ptr();
    e.launch(grid, block, || unsafe {
        pick(
            csr.offsets().as_ptr(),
            csr.indices().as_ptr(),
            nodes.as_ptr(),
            offsets.as_ptr(),
            base,
            n,
            fanout,
            p,
        )
    });
    RelationPicks {
        relation: rid,
        offsets,
        picks,
    }
}

/// A device run's launch for `n` destinations (a thread each, 256 a block),
/// and a tiny grid that makes the grid-stride loop go round.
fn shapes(n: usize) -> [(u32, u32); 2] {
    [((n as u32).div_ceil(256).clamp(1, 16_384), 256), (2, 32)]
}

#[test]
fn device_picks_are_the_cpu_samplers_bit_for_bit() {
    let Some(e) = emu() else { return };
    let g = graph();
    let seed = 5;
    let mut sampler = Sampler::new(&g, &[10, 25], seed).unwrap();
    // Destinations in no particular order, a few of them twice over steps.
    let mut r = CounterRng::new(2);
    for (epoch, step, layer, fanout) in [(0, 0, 1, 10), (0, 7, 0, 25), (3, 1, 1, 1), (1, 2, 0, 64)]
    {
        for (ntype, count) in [("paper", 300u32), ("author", 40)] {
            let t = g.type_id(ntype).unwrap();
            let nodes: Vec<u32> = (0..count)
                .map(|_| r.below(count.into()) as u32)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .rev()
                .collect();
            let want = sampler
                .pick(
                    epoch,
                    step,
                    layer,
                    fanout,
                    t,
                    &nodes,
                    &RelationFilter::All,
                    &NoExclusion,
                )
                .unwrap();
            assert!(!want.is_empty(), "{ntype} has in-relations");
            for w in &want {
                let rel = g.relation(w.relation);
                let base = layer_key(seed, epoch, step, layer, rel.key());
                for shape in shapes(nodes.len()) {
                    let got = device_picks(e, &g, w.relation, base, &nodes, fanout as u32, shape);
                    assert_eq!(
                        &got,
                        w,
                        "{} at epoch {epoch} step {step} layer {layer} fanout {fanout}, launch {shape:?}",
                        rel.canonical()
                    );
                }
            }
        }
    }
}

#[test]
fn destinations_with_more_neighbours_than_the_fanout_are_drawn_not_copied() {
    // The check above would pass with a kernel that copied every row: it must
    // also see rows cut to the fanout, with picks that differ by key.
    let Some(e) = emu() else { return };
    let g = graph();
    let cites = g
        .relations()
        .iter()
        .position(|r| r.name == "cites")
        .map(|i| graphs::ids::RelationId(i as u32))
        .unwrap();
    let nodes: Vec<u32> = (0..300).collect();
    let fanout = MAX_FANOUT;
    let [a, b] = [1u64, 2].map(|base| device_picks(e, &g, cites, base, &nodes, fanout, (2, 32)));
    let csr = g.relation(cites).in_csr();
    let cut: Vec<u32> = nodes
        .iter()
        .copied()
        .filter(|&v| csr.neighbors(v).len() > fanout as usize)
        .collect();
    assert!(cut.len() > 100, "{} rows longer than the fanout", cut.len());
    for (i, &v) in nodes.iter().enumerate() {
        let row =
            |p: &RelationPicks| p.picks[p.offsets[i] as usize..p.offsets[i + 1] as usize].to_vec();
        let want = csr.neighbors(v).len().min(fanout as usize);
        assert_eq!(row(&a).len(), want, "node {v}");
        // Picks keep CSR order: a sub-multiset of the row, ascending.
        assert!(
            row(&a).windows(2).all(|w| w[0] <= w[1]),
            "node {v}: {:?}",
            row(&a)
        );
    }
    let differ = cut
        .iter()
        .filter(|&&v| {
            let i = v as usize;
            a.picks[a.offsets[i] as usize..a.offsets[i + 1] as usize]
                != b.picks[b.offsets[i] as usize..b.offsets[i + 1] as usize]
        })
        .count();
    assert!(
        differ * 10 > cut.len() * 9,
        "{differ} of {} cut rows differ by key",
        cut.len()
    );
}

#[test]
fn a_batch_sampled_with_the_kernels_is_the_cpu_samplers() {
    // Picks on the device, blocks on the host (`Sampler::sample_by`): the
    // whole two-hop batch must be the CPU sampler's.
    let Some(e) = emu() else { return };
    let g = graph();
    let fanouts = [25, 10];
    let seeds: Vec<u32> = (0..120).map(|i| i * 7 % 300).collect();
    for (epoch, step) in [(0, 0), (2, 5)] {
        let want = Sampler::new(&g, &fanouts, 9)
            .unwrap()
            .sample(epoch, step, &seeds)
            .unwrap();
        let got = Sampler::new(&g, &fanouts, 9)
            .unwrap()
            .sample_by(epoch, step, &seeds, |rid, base, nodes, fanout| {
                let shape = shapes(nodes.len())[0];
                Ok::<_, graphs::GraphError>(device_picks(
                    e,
                    &g,
                    rid,
                    base,
                    nodes,
                    fanout as u32,
                    shape,
                ))
            })
            .unwrap();
        assert_eq!(got, want, "epoch {epoch} step {step}");
        assert!(want.num_edges() > 1000, "{} edges", want.num_edges());
    }
}
