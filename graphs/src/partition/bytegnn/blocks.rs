//! The partitioner's working state, and steps 1 and 2: growing the blocks
//! and grouping them into clusters (see the module above).

use std::cmp::Reverse;

use super::ByteGnn;
use crate::csr::Csr;
use crate::error::{GraphError, Result};
use crate::graph::HetGraph;
use crate::rng::key;

/// Slack of every cap: 1.05 × the mean per partition.
pub(super) const SLACK: f64 = 1.05;
/// No block (not reached by any BFS).
pub(super) const NO_BLOCK: u32 = u32::MAX;
/// Not placed yet.
pub(super) const NO_PART: u16 = u16::MAX;
/// Most sweeps of the clustering (it stops sooner once a sweep moves fewer
/// than 1% of the blocks).
const CLUSTER_SWEEPS: usize = 8;

/// What a block, a group or a partition holds: labelled nodes per split,
/// nodes per type, and the sampler's in-edges at those nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Figures {
    pub splits: [u64; 3],
    pub types: Vec<u64>,
    pub edges: u64,
}

impl Figures {
    pub fn zero(types: usize) -> Figures {
        Figures {
            types: vec![0; types],
            ..Figures::default()
        }
    }

    pub fn clear(&mut self) {
        self.splits = [0; 3];
        self.types.iter_mut().for_each(|c| *c = 0);
        self.edges = 0;
    }

    pub fn add(&mut self, o: &Figures) {
        (0..3).for_each(|s| self.splits[s] += o.splits[s]);
        self.types
            .iter_mut()
            .zip(&o.types)
            .for_each(|(a, b)| *a += b);
        self.edges += o.edges;
    }

    pub fn sub(&mut self, o: &Figures) {
        (0..3).for_each(|s| self.splits[s] -= o.splits[s]);
        self.types
            .iter_mut()
            .zip(&o.types)
            .for_each(|(a, b)| *a -= b);
        self.edges -= o.edges;
    }
}

/// The working state of one partitioning. Nodes are numbered densely, type
/// after type (`base[t] + v`).
pub(super) struct State<'g> {
    pub opts: ByteGnn,
    pub parts: usize,
    pub target: usize,
    within: Option<(&'g [Vec<u16>], u16)>,
    /// First dense id of each type, and the node count at the end.
    pub base: Vec<usize>,
    /// Per type, what the sampler draws from at its nodes: `(neighbour type, csr)`.
    pub walk: Vec<Vec<(usize, &'g Csr)>>,
    /// Per type, the stored relations' edges at its nodes, either direction.
    pub incident: Vec<Vec<(usize, &'g Csr)>>,
    /// Per target node, the splits holding it (bit `s` for split `s`).
    pub split_of: Vec<u8>,
    /// Block of every node, `NO_BLOCK` if none (step 5 also marks queued nodes).
    pub block: Vec<u32>,
    /// Centre of each block (a target node).
    pub centres: Vec<u32>,
    /// Block `b`'s members (dense ids) are `members[offsets[b]..offsets[b + 1]]`.
    pub offsets: Vec<usize>,
    pub members: Vec<usize>,
    /// Owner per type, per node (`NO_PART`: not placed yet).
    pub owners: Vec<Vec<u16>>,
    /// Per partition, what it holds so far.
    pub loads: Vec<Figures>,
    /// What all (kept) nodes come to.
    pub total: Figures,
    /// The caps: `max(⌈mean⌉, ⌊1.05 · mean⌋)` of each figure.
    pub cap: Figures,
    /// Cross edges per partition of what is being measured, and the partitions with some.
    pub ce: Vec<u64>,
    pub touched: Vec<u16>,
}

impl<'g> State<'g> {
    pub fn new(
        opts: &ByteGnn,
        g: &'g HetGraph,
        parts: usize,
        within: Option<(&'g [Vec<u16>], u16)>,
    ) -> Result<State<'g>> {
        let types = g.node_types();
        let mut base = Vec::with_capacity(types.len() + 1);
        let mut n = 0usize;
        for t in types {
            base.push(n);
            n += t.count as usize;
        }
        base.push(n);
        let mut walk = vec![Vec::new(); types.len()];
        let mut incident = vec![Vec::new(); types.len()];
        let added = g.has_reverse_relations();
        for r in g.relations() {
            let (s, d) = (r.src.index(), r.dst.index());
            if r.reverse_of.is_none() || opts.reverse {
                walk[d].push((s, r.in_csr()));
            }
            if r.reverse_of.is_none() {
                if opts.reverse && !added {
                    walk[s].push((d, r.out_csr()));
                }
                incident[d].push((s, r.in_csr()));
                incident[s].push((d, r.out_csr()));
            }
        }
        let target = g.target().index();
        let count = types[target].count;
        let mut split_of = vec![0u8; count as usize];
        if let Some(splits) = &types[target].splits {
            for (s, (name, ids)) in splits.named().into_iter().enumerate() {
                for &v in ids {
                    let slot = split_of.get_mut(v as usize).ok_or_else(|| {
                        GraphError::InvalidArgument(format!(
                            "bytegnn: {name} node {v} is out of range 0..{count}"
                        ))
                    })?;
                    *slot |= 1 << s;
                }
            }
        }
        let mut state = State {
            opts: *opts,
            parts,
            target,
            within,
            base,
            walk,
            incident,
            split_of,
            block: vec![NO_BLOCK; n],
            centres: Vec::new(),
            offsets: vec![0],
            members: Vec::new(),
            owners: types
                .iter()
                .map(|t| vec![NO_PART; t.count as usize])
                .collect(),
            loads: vec![Figures::zero(types.len()); parts],
            total: Figures::zero(types.len()),
            cap: Figures::zero(types.len()),
            ce: vec![0; parts],
            touched: Vec::new(),
        };
        state.centres = (0..count)
            .filter(|&v| state.split_of[v as usize] != 0 && state.kept(target, v))
            .collect();
        let mut total = Figures::zero(types.len());
        for &c in &state.centres {
            (0..3).for_each(|s| total.splits[s] += u64::from(state.split_of[c as usize] >> s & 1));
        }
        for (t, nt) in types.iter().enumerate() {
            for v in (0..nt.count).filter(|&v| state.kept(t, v)) {
                total.types[t] += 1;
                total.edges += degree(&state.walk[t], v);
            }
        }
        let k = parts as f64;
        let cap_of = |all: u64| {
            ((all as f64 / k).ceil() as u64).max((SLACK * all as f64 / k).floor() as u64)
        };
        state.cap = Figures {
            splits: total.splits.map(cap_of),
            types: total.types.iter().map(|&c| cap_of(c)).collect(),
            edges: cap_of(total.edges),
        };
        state.total = total;
        Ok(state)
    }

    /// Whether node `v` of type `t` is being partitioned (all are, without `within`).
    pub fn kept(&self, t: usize, v: u32) -> bool {
        self.within.is_none_or(|(o, k)| o[t][v as usize] == k)
    }

    pub fn zero_figures(&self) -> Figures {
        Figures::zero(self.base.len() - 1)
    }

    /// Block `b`'s members (dense ids).
    pub fn members_of(&self, b: u32) -> &[usize] {
        &self.members[self.offsets[b as usize]..self.offsets[b as usize + 1]]
    }

    /// The owners, with 0 for nodes left out (outside `within`).
    pub fn into_owners(self) -> Vec<Vec<u16>> {
        self.owners
            .into_iter()
            .map(|o| {
                o.into_iter()
                    .map(|p| if p == NO_PART { 0 } else { p })
                    .collect()
            })
            .collect()
    }

    /// Step 1: the multi-source BFS, then the blocks' member lists (each in
    /// ascending dense id).
    pub fn grow_blocks(&mut self, seed: u64) {
        let t0 = self.target;
        // The level at which each node was reached, to tell a tie (a second
        // block reaching a node at the level it was first reached) from a latecomer.
        let mut level = vec![0u8; self.block.len()];
        let mut frontier: Vec<(usize, u32)> = Vec::with_capacity(self.centres.len());
        for (b, &c) in self.centres.iter().enumerate() {
            self.block[self.base[t0] + c as usize] = b as u32;
            frontier.push((t0, c));
        }
        let claim = |b: u32, y: usize| key(&[seed, 0xB10C_C1A1, u64::from(b), y as u64]);
        for hop in 1..=self.opts.hops {
            let hop = hop as u8;
            let mut next = Vec::new();
            for &(t, v) in &frontier {
                let b = self.block[self.base[t] + v as usize];
                for &(s, csr) in &self.walk[t] {
                    for &u in csr.neighbors(v) {
                        let y = self.base[s] + u as usize;
                        let held = self.block[y];
                        if held == NO_BLOCK {
                            if self.kept(s, u) {
                                self.block[y] = b;
                                level[y] = hop;
                                next.push((s, u));
                            }
                        } else if level[y] == hop && held != b && claim(b, y) < claim(held, y) {
                            self.block[y] = b;
                        }
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            frontier = next;
        }
        drop(level);
        let blocks = self.centres.len();
        let mut offsets = vec![0usize; blocks + 1];
        for &b in self.block.iter().filter(|&&b| b != NO_BLOCK) {
            offsets[b as usize + 1] += 1;
        }
        for b in 0..blocks {
            offsets[b + 1] += offsets[b];
        }
        let mut fill = offsets[..blocks].to_vec();
        let mut members = vec![0usize; offsets[blocks]];
        for (x, &b) in self
            .block
            .iter()
            .enumerate()
            .filter(|(_, &b)| b != NO_BLOCK)
        {
            members[fill[b as usize]] = x;
            fill[b as usize] += 1;
        }
        self.offsets = offsets;
        self.members = members;
    }

    /// The block order: largest first (nodes plus the sampler's in-edges at
    /// them), ties by a seeded hash of the centre, then its id.
    pub fn block_order(&self, seed: u64) -> Vec<u32> {
        let mut keyed: Vec<(Reverse<u64>, u64, u32)> = (0..self.centres.len() as u32)
            .map(|b| {
                let size: u64 = self
                    .members_of(b)
                    .iter()
                    .map(|&x| {
                        let (t, v) = typed(&self.base, x);
                        1 + degree(&self.walk[t], v)
                    })
                    .sum();
                (
                    Reverse(size),
                    key(&[seed, 0x0DE5_B10C, u64::from(self.centres[b as usize])]),
                    b,
                )
            })
            .collect();
        keyed.sort_unstable();
        keyed.into_iter().map(|(_, _, b)| b).collect()
    }

    /// Step 2: the clusters, in placement order (the paper's key: most
    /// labelled nodes of one split first, then most nodes, then the place
    /// of their first block in `order`), each as its blocks in `order`.
    pub fn clusters(&self, order: &[u32]) -> Vec<Vec<u32>> {
        let nb = self.centres.len();
        let per = self.opts.clusters.max(1) * self.parts;
        let (bound_blocks, bound_nodes) = (
            (nb / per).max(1) as u64,
            (self.members.len() / per).max(1) as u64,
        );
        let nodes_of = |b: u32| (self.offsets[b as usize + 1] - self.offsets[b as usize]) as u64;
        let mut cluster: Vec<u32> = (0..nb as u32).collect();
        let mut blocks_in = vec![1u64; nb];
        let mut nodes_in: Vec<u64> = (0..nb as u32).map(nodes_of).collect();
        // Edges from the block at hand to each cluster, and the clusters with some.
        let mut count = vec![0u64; nb];
        let mut touched: Vec<u32> = Vec::new();
        for _ in 0..CLUSTER_SWEEPS {
            let mut moved = 0usize;
            for &b in order {
                for &x in self.members_of(b) {
                    let (t, v) = typed(&self.base, x);
                    for &(s, csr) in &self.incident[t] {
                        for &u in csr.neighbors(v) {
                            let c = self.block[self.base[s] + u as usize];
                            if c != NO_BLOCK && c != b {
                                let k = cluster[c as usize];
                                if count[k as usize] == 0 {
                                    touched.push(k);
                                }
                                count[k as usize] += 1;
                            }
                        }
                    }
                }
                let (cur, size) = (cluster[b as usize], nodes_of(b));
                // Strictly more edges than staying, ties to the lowest cluster id.
                let mut best = (count[cur as usize], cur);
                for &k in &touched {
                    let room = blocks_in[k as usize] < bound_blocks
                        && nodes_in[k as usize] + size <= bound_nodes;
                    if k != cur
                        && room
                        && (count[k as usize] > best.0
                            || (count[k as usize] == best.0 && best.1 != cur && k < best.1))
                    {
                        best = (count[k as usize], k);
                    }
                }
                for &k in &touched {
                    count[k as usize] = 0;
                }
                touched.clear();
                if best.1 != cur {
                    blocks_in[cur as usize] -= 1;
                    nodes_in[cur as usize] -= size;
                    cluster[b as usize] = best.1;
                    blocks_in[best.1 as usize] += 1;
                    nodes_in[best.1 as usize] += size;
                    moved += 1;
                }
            }
            // Settled: the last sweeps move a few blocks back and forth.
            if moved * 100 < nb {
                break;
            }
        }
        let mut groups: Vec<Vec<u32>> = vec![Vec::new(); nb];
        for &b in order {
            groups[cluster[b as usize] as usize].push(b);
        }
        let mut keyed: Vec<(Reverse<u64>, Reverse<u64>, usize, u32)> = Vec::new();
        let mut first = vec![usize::MAX; nb];
        for (i, &b) in order.iter().enumerate() {
            let c = cluster[b as usize] as usize;
            first[c] = first[c].min(i);
        }
        for (c, g) in groups.iter().enumerate().filter(|(_, g)| !g.is_empty()) {
            let mut splits = [0u64; 3];
            for &b in g {
                let v = self.centres[b as usize] as usize;
                (0..3).for_each(|s| splits[s] += u64::from(self.split_of[v] >> s & 1));
            }
            let nodes: u64 = g.iter().map(|&b| nodes_of(b)).sum();
            keyed.push((
                Reverse(splits.into_iter().max().unwrap_or(0)),
                Reverse(nodes),
                first[c],
                c as u32,
            ));
        }
        keyed.sort_unstable();
        keyed
            .into_iter()
            .map(|(.., c)| std::mem::take(&mut groups[c as usize]))
            .collect()
    }
}

/// The type and id of dense id `x`.
pub(super) fn typed(base: &[usize], x: usize) -> (usize, u32) {
    // The last type starting at or before `x` (empty types share their start with the next).
    let t = base[..base.len() - 1].partition_point(|&b| b <= x) - 1;
    (t, (x - base[t]) as u32)
}

/// The sampler's in-edges at node `v` of a type walked by `walk`.
pub(super) fn degree(walk: &[(usize, &Csr)], v: u32) -> u64 {
    walk.iter().map(|(_, csr)| csr.degree(v) as u64).sum()
}
