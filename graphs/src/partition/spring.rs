//! SPRING (CATGNN, Algorithm 1): streaming partitioning in O(nodes) memory.
//!
//! Three passes over [`EdgeStream`] order (relations in `schema.json` order,
//! edges in file order), every edge taken as undirected:
//!
//! 0. degrees (the paper assumes them known; here one counting pass);
//! 1. clustering: each node starts in a cluster of its own when first seen;
//!    for an edge whose two clusters both have volume (sum of degrees) at most
//!    `tau_vol`, the endpoint of the smaller-volume cluster (`u` on a tie)
//!    moves into the other's cluster; each node keeps its richest neighbour
//!    (highest degree, the first seen on a tie);
//! 2. merging, with no stream: each cluster's representative is the member
//!    whose richest neighbour has the highest degree; clusters are scanned
//!    smallest (in nodes) first, and a cluster merges into the cluster of its
//!    representative's richest neighbour when their sizes together stay within
//!    `beta · |V| / p`; a cluster that grew is ranked again by its new size
//!    (and scanned again). Cluster ids merge by union-find, never member lists;
//! 3. clusters, largest first, go to the least-loaded partition (LPT).
//!
//! Choices where the paper is silent: `tau_vol` is [`Spring::tau_fraction`]
//! (default 0.1) of one partition's share of the total volume, `2|E| / p`: at
//! a whole share, clusters of many low-degree nodes outgrow a partition's
//! node count before merging starts and LPT cannot balance them (mag-like
//! S=0.01, 4 parts: node balance 1.39 at 1.0, 1.04 at 0.1); nodes with no edge are
//! clusters of one node (dealt by LPT like the others, not to partition 0);
//! ties go to the lower cluster id and the lower partition. With
//! [`Balance::Multi`], several counts are balanced at once (nodes of each
//! type, training nodes, edges by volume): merging also keeps each count of
//! a cluster within `beta` of its share, and LPT puts a cluster where the
//! largest of its partition's loads, each relative to its total, ends smallest.

use super::stream::EdgeStream;
use crate::error::{GraphError, Result};

const NONE: u32 = u32::MAX;

/// What LPT balances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Balance {
    /// The node count alone (the paper's variant, the default).
    #[default]
    Nodes,
    /// Nodes of every type, training nodes and edges (by volume), together:
    /// each merge keeps every count within `beta` of its share, and LPT deals
    /// by the largest relative load (about 4(types + 2) more bytes per node
    /// while merging).
    Multi,
}

/// SPRING's settings.
#[derive(Clone, Copy, Debug)]
pub struct Spring {
    /// `tau_vol` as a fraction of one partition's share of the volume, `2|E| / p`.
    pub tau_fraction: f64,
    /// The merge bound's slack over `|V| / p` (the paper's 1.05).
    pub beta: f64,
    /// What LPT balances.
    pub balance: Balance,
    /// Restreaming passes after LPT (0: the paper's SPRING): see `refine`.
    pub refine: usize,
}

impl Default for Spring {
    fn default() -> Self {
        Spring {
            tau_fraction: 0.1,
            beta: 1.05,
            balance: Balance::Nodes,
            refine: 0,
        }
    }
}

/// Restreaming refinement, our addition to SPRING (the paper stops at LPT):
/// each pass streams the edges once, counting per node its neighbours in
/// each partition (`parts` saturating u16 counters per node: 2·p more bytes
/// per node), then moves each node, in id order, to the partition holding
/// most of its neighbours when that beats its own and keeps the partition
/// within `bound` nodes. Ties keep the node where it is. Stops early when a
/// pass moves nothing.
fn refine(
    s: &EdgeStream,
    owner: &mut [u16],
    parts: usize,
    passes: usize,
    bound: u64,
) -> Result<usize> {
    let n = owner.len();
    let mut load = vec![0u64; parts];
    for &o in owner.iter() {
        load[o as usize] += 1;
    }
    let mut moved_total = 0;
    for _ in 0..passes {
        let mut counts = vec![0u16; n * parts];
        s.for_each(|c| {
            for (&u, &v) in c.src.iter().zip(c.dst) {
                let (u, v) = (u as usize, v as usize);
                let (cu, cv) = (u * parts + owner[v] as usize, v * parts + owner[u] as usize);
                counts[cu] = counts[cu].saturating_add(1);
                counts[cv] = counts[cv].saturating_add(1);
            }
            Ok(())
        })?;
        let mut moved = 0;
        for v in 0..n {
            let cur = owner[v] as usize;
            let row = &counts[v * parts..(v + 1) * parts];
            let best = (0..parts).fold(cur, |b, p| if row[p] > row[b] { p } else { b });
            if best != cur && load[best] < bound {
                load[cur] -= 1;
                load[best] += 1;
                owner[v] = best as u16;
                moved += 1;
            }
        }
        moved_total += moved;
        if moved == 0 {
            break;
        }
    }
    Ok(moved_total)
}

/// Union-find root of cluster `c`, halving paths as it goes.
fn find(parent: &mut [u32], mut c: u32) -> u32 {
    while parent[c as usize] != c {
        let p = parent[c as usize];
        parent[c as usize] = parent[p as usize];
        c = parent[c as usize];
    }
    c
}

impl Spring {
    /// The owner partition of every node of the streamed graph, per type.
    pub fn assign(&self, s: &EdgeStream, parts: usize) -> Result<Vec<Vec<u16>>> {
        if parts == 0 || parts > super::MAX_PARTS {
            return Err(GraphError::InvalidArgument(format!(
                "--parts must be in 1..={}, got {parts}",
                super::MAX_PARTS
            )));
        }
        if !(self.tau_fraction > 0.0 && self.beta >= 1.0) {
            return Err(GraphError::InvalidArgument(format!(
                "SPRING: tau fraction {} must be positive and beta {} at least 1",
                self.tau_fraction, self.beta
            )));
        }
        let n = s.nodes() as usize;
        let deg = s.degrees()?;
        let volume: u64 = deg.iter().map(|&d| u64::from(d)).sum();
        let tau = (self.tau_fraction * volume as f64 / parts as f64).max(1.0) as u64;

        // Pass 1: clustering. Cluster ids are node ids (a node's first cluster is its own).
        let mut cluster = vec![NONE; n];
        let mut vol = vec![0u64; n];
        let mut size = vec![0u32; n];
        let mut richest = vec![NONE; n];
        let d = |v: u32| {
            if v == NONE {
                -1i64
            } else {
                i64::from(deg[v as usize])
            }
        };
        s.for_each(|c| {
            for (&u, &v) in c.src.iter().zip(c.dst) {
                for x in [u, v] {
                    if cluster[x as usize] == NONE {
                        cluster[x as usize] = x;
                        vol[x as usize] = u64::from(deg[x as usize]);
                        size[x as usize] = 1;
                    }
                }
                let (cu, cv) = (cluster[u as usize], cluster[v as usize]);
                if cu != cv && vol[cu as usize] <= tau && vol[cv as usize] <= tau {
                    let (mover, from, to) = if vol[cu as usize] <= vol[cv as usize] {
                        (u, cu, cv)
                    } else {
                        (v, cv, cu)
                    };
                    let dm = u64::from(deg[mover as usize]);
                    vol[from as usize] -= dm;
                    vol[to as usize] += dm;
                    size[from as usize] -= 1;
                    size[to as usize] += 1;
                    cluster[mover as usize] = to;
                }
                if d(richest[u as usize]) < d(v) {
                    richest[u as usize] = v;
                }
                if d(richest[v as usize]) < d(u) {
                    richest[v as usize] = u;
                }
            }
            Ok(())
        })?;
        drop(vol);
        // Nodes no edge touched: a cluster each.
        for v in 0..n {
            if cluster[v] == NONE {
                cluster[v] = v as u32;
                size[v] = 1;
            }
        }

        // Merging: representatives, then clusters smallest first.
        let mut rep = vec![NONE; n];
        for v in 0..n as u32 {
            let c = cluster[v as usize] as usize;
            if richest[v as usize] != NONE
                && (rep[c] == NONE || d(richest[rep[c] as usize]) < d(richest[v as usize]))
            {
                rep[c] = v;
            }
        }
        let mut parent: Vec<u32> = (0..n as u32).collect();
        let bound = (self.beta * n as f64 / parts as f64).floor() as u64;
        // With several counts balanced, a merge must keep each of them (nodes
        // of each type, training nodes, volume) within its own bound too.
        let types = s.base.len() - 1;
        let train = if self.balance == Balance::Multi {
            s.train_nodes()?
        } else {
            Vec::new()
        };
        let (mw, mbound, mcounts) = if self.balance == Balance::Multi {
            let k = types + 2;
            let mut mw = vec![0u32; n * k];
            for v in 0..n {
                let c = cluster[v] as usize * k;
                mw[c + s.type_of_node(v as u32)] += 1;
                mw[c + types + 1] = mw[c + types + 1].saturating_add(deg[v]);
            }
            for &v in &train {
                mw[cluster[v as usize] as usize * k + types] += 1;
            }
            let totals: Vec<u64> = (0..k)
                .map(|j| (0..n).map(|c| u64::from(mw[c * k + j])).sum())
                .collect();
            let mbound: Vec<u64> = totals
                .iter()
                .map(|&t| (self.beta * t as f64 / parts as f64).ceil() as u64)
                .collect();
            (mw, mbound, k)
        } else {
            (Vec::new(), Vec::new(), 0)
        };
        let mut mw = mw;
        let mut order: Vec<u32> = (0..n as u32).filter(|&c| size[c as usize] > 0).collect();
        order.sort_unstable_by_key(|&c| (size[c as usize], c));
        // A cluster that grew is ranked again by its new size: a min-heap
        // beside the first order, its entries stamped with the cluster's
        // growth count (older entries, and first-order entries of clusters
        // that grew, are stale).
        let mut grown: std::collections::BinaryHeap<std::cmp::Reverse<(u32, u32, u32)>> =
            std::collections::BinaryHeap::new();
        let mut stamp = vec![0u32; n];
        let mut next = 0usize;
        loop {
            while let Some(&o) = order.get(next) {
                if parent[o as usize] == o && stamp[o as usize] == 0 {
                    break;
                }
                next += 1;
            }
            while let Some(&std::cmp::Reverse((_, c, st))) = grown.peek() {
                if parent[c as usize] == c && stamp[c as usize] == st {
                    break;
                }
                grown.pop();
            }
            let first = order.get(next).map(|&o| (size[o as usize], o));
            let again = grown.peek().map(|&std::cmp::Reverse((sz, c, _))| (sz, c));
            let i = match (first, again) {
                (Some(f), Some(g)) if f <= g => {
                    next += 1;
                    f.1
                }
                (Some(f), None) => {
                    next += 1;
                    f.1
                }
                (_, Some(_)) => grown
                    .pop()
                    .map(|std::cmp::Reverse((_, c, _))| c)
                    .expect("peeked"),
                (None, None) => break,
            };
            let r = rep[i as usize];
            if r == NONE {
                continue;
            }
            let j = find(&mut parent, cluster[richest[r as usize] as usize]);
            if j == i || u64::from(size[i as usize]) + u64::from(size[j as usize]) > bound {
                continue;
            }
            let (ii, jj) = (i as usize * mcounts, j as usize * mcounts);
            if (0..mcounts).any(|q| u64::from(mw[ii + q]) + u64::from(mw[jj + q]) > mbound[q]) {
                continue;
            }
            for q in 0..mcounts {
                mw[jj + q] = mw[jj + q].saturating_add(mw[ii + q]);
            }
            parent[i as usize] = j;
            size[j as usize] += size[i as usize];
            size[i as usize] = 0;
            if rep[j as usize] == NONE
                || d(richest[rep[j as usize] as usize]) < d(richest[r as usize])
            {
                rep[j as usize] = r;
            }
            stamp[j as usize] += 1;
            grown.push(std::cmp::Reverse((size[j as usize], j, stamp[j as usize])));
        }
        drop((rep, richest, order, stamp, grown, mw));

        // LPT over the final clusters.
        let roots: Vec<u32> = (0..n as u32)
            .filter(|&c| parent[c as usize] == c && size[c as usize] > 0)
            .collect();
        // Each node's final cluster, numbered 0.. in root order, written over
        // its pass-1 cluster (roots' `size` is reused for their numbers).
        for (k, &c) in roots.iter().enumerate() {
            size[c as usize] = k as u32;
        }
        for c in cluster.iter_mut() {
            let root = find(&mut parent, *c);
            *c = size[root as usize];
        }
        drop((parent, size));
        let root_of = cluster;
        // Per cluster, its weight in each balanced count.
        let counts = match self.balance {
            Balance::Nodes => 1,
            Balance::Multi => types + 2,
        };
        let mut w = vec![0u64; roots.len() * counts];
        let train = if self.balance == Balance::Multi {
            s.train_nodes()?
        } else {
            Vec::new()
        };
        for v in 0..n {
            let k = root_of[v] as usize * counts;
            match self.balance {
                Balance::Nodes => w[k] += 1,
                Balance::Multi => {
                    w[k + s.type_of_node(v as u32)] += 1;
                    w[k + types + 1] += u64::from(deg[v]);
                }
            }
        }
        for &v in &train {
            w[root_of[v as usize] as usize * counts + types] += 1;
        }
        let totals: Vec<f64> = (0..counts)
            .map(|j| {
                (0..roots.len())
                    .map(|c| w[c * counts + j])
                    .sum::<u64>()
                    .max(1) as f64
            })
            .collect();
        let mut by_size: Vec<u32> = (0..roots.len() as u32).collect();
        by_size.sort_unstable_by_key(|&c| {
            let c = c as usize;
            (
                std::cmp::Reverse(if self.balance == Balance::Nodes {
                    w[c]
                } else {
                    w[c * counts..c * counts + types].iter().sum::<u64>()
                }),
                roots[c],
            )
        });
        let mut load = vec![0u64; parts * counts];
        let mut part_of = vec![0u16; roots.len()];
        for c in by_size {
            let c = c as usize;
            let cw = &w[c * counts..(c + 1) * counts];
            let after = |p: usize| -> f64 {
                (0..counts)
                    .map(|j| (load[p * counts + j] + cw[j]) as f64 / totals[j])
                    .fold(0.0, f64::max)
            };
            let best = (0..parts)
                .min_by(|&a, &b| after(a).total_cmp(&after(b)).then(a.cmp(&b)))
                .expect("parts >= 1");
            for j in 0..counts {
                load[best * counts + j] += cw[j];
            }
            part_of[c] = best as u16;
        }
        if self.refine == 0 {
            return Ok((0..types)
                .map(|t| {
                    (s.base[t]..s.base[t + 1])
                        .map(|v| part_of[root_of[v as usize] as usize])
                        .collect()
                })
                .collect());
        }
        if self.balance != Balance::Nodes {
            return Err(GraphError::InvalidArgument("SPRING's refinement keeps the node balance only: use it with --spring-balance nodes".into()));
        }
        let mut owner: Vec<u16> = root_of.iter().map(|&c| part_of[c as usize]).collect();
        drop((root_of, part_of));
        // Moves never push a partition past beta times its share (or past what LPT already gave it).
        let bound = load
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .max((self.beta * n as f64 / parts as f64).floor() as u64);
        refine(s, &mut owner, parts, self.refine, bound)?;
        Ok((0..types)
            .map(|t| owner[s.base[t] as usize..s.base[t + 1] as usize].to_vec())
            .collect())
    }
}
