//! Step 6: node-level refinement (see the module above).
//!
//! Blocks are coarse: a block that straddles a community boundary moves
//! whole or not at all, and step 5 places the nodes no block holds one by
//! one as it meets them. Small graphs with few labelled nodes (planetoid-cora:
//! 140 training nodes, blocks of hundreds of nodes) were left with 2.7x
//! METIS's edge cut. Here every node may move on its own, greedily: to the
//! partition holding most of its neighbours, if that is strictly more than
//! its own partition holds (each move lowers the cut, so sweeps end) and the
//! destination stays within the caps, or in a swap with a node of the same
//! type and splits that wants the opposite move, so that a partition at
//! its cap can still trade nodes.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::blocks::{degree, typed, State, NO_PART};

impl State<'_> {
    /// Counts `v`'s neighbours (type `t`) per partition into `ce` / `touched`.
    pub(super) fn tally(&mut self, t: usize, v: u32) {
        for &p in &self.touched {
            self.ce[p as usize] = 0;
        }
        self.touched.clear();
        for &(s, csr) in &self.incident[t] {
            for &u in csr.neighbors(v) {
                let p = self.owners[s][u as usize];
                if p != NO_PART {
                    if self.ce[p as usize] == 0 {
                        self.touched.push(p);
                    }
                    self.ce[p as usize] += 1;
                }
            }
        }
    }

    /// Moves node `v` of type `t` from `from` to `to`, with its counts.
    pub(super) fn shift(&mut self, t: usize, v: u32, from: u16, to: u16) {
        let splits = if t == self.target {
            self.split_of[v as usize]
        } else {
            0
        };
        let deg = degree(&self.walk[t], v);
        for (j, add) in [(from, false), (to, true)] {
            let load = &mut self.loads[j as usize];
            let step = |c: &mut u64, by: u64| if add { *c += by } else { *c -= by };
            step(&mut load.types[t], 1);
            step(&mut load.edges, deg);
            (0..3)
                .filter(|s| splits >> s & 1 == 1)
                .for_each(|s| step(&mut load.splits[s], 1));
        }
        self.owners[t][v as usize] = to;
    }

    /// One sweep over every kept node in dense order; returns how many moved.
    ///
    /// A node goes to the partition holding most of its neighbours (over
    /// every stored relation, either direction) when that beats its own
    /// partition's count and the partition stays within the cap of the
    /// node's type, of each split the node is in, and (with `type_weight >
    /// 0`) of the sampler's in-edges. Ties: the partition holding fewest of
    /// the node's type, then the lowest index. A node held back by a cap
    /// waits; one of the same type and splits met later that wants the
    /// opposite move swaps with it when the pair lowers the cut (the counts
    /// the caps bound stay as they were, but for the in-edges, which must
    /// then stay within their cap or not grow).
    pub fn refine_nodes(&mut self) -> usize {
        let mut moved = 0;
        // (from, to, type, splits) -> nodes held back.
        let mut waiting: BTreeMap<(u16, u16, usize, u8), Vec<u32>> = BTreeMap::new();
        let edges_capped = self.opts.type_weight > 0.0;
        for x in 0..self.block.len() {
            let (t, v) = typed(&self.base, x);
            let was = self.owners[t][v as usize];
            if was == NO_PART || !self.kept(t, v) {
                continue;
            }
            self.tally(t, v);
            let here = self.ce[was as usize];
            let splits = if t == self.target {
                self.split_of[v as usize]
            } else {
                0
            };
            let deg = degree(&self.walk[t], v);
            let fits = |p: u16| {
                let load = &self.loads[p as usize];
                load.types[t] < self.cap.types[t]
                    && (0..3).all(|s| splits >> s & 1 == 0 || load.splits[s] < self.cap.splits[s])
                    && (!edges_capped || load.edges + deg <= self.cap.edges)
            };
            let rank = |p: &u16| {
                (
                    self.ce[*p as usize],
                    Reverse(self.loads[*p as usize].types[t]),
                    Reverse(*p),
                )
            };
            let better: Vec<u16> = self
                .touched
                .iter()
                .copied()
                .filter(|&p| p != was && self.ce[p as usize] > here)
                .collect();
            if let Some(p) = better.iter().copied().filter(|&p| fits(p)).max_by_key(rank) {
                self.shift(t, v, was, p);
                moved += 1;
                continue;
            }
            let Some(p) = better.iter().copied().max_by_key(rank) else {
                continue;
            };
            let gain = self.ce[p as usize] - here;
            if self.swap(t, v, was, p, gain, &mut waiting, edges_capped) {
                moved += 2;
            } else {
                waiting.entry((was, p, t, splits)).or_default().push(v);
            }
        }
        moved
    }

    /// Whether swapping `v` (type `t`, on `was`) with `y` (on `p`) keeps both
    /// partitions' in-edges within their cap, or no higher than they are.
    pub(super) fn swap_keeps_edges(&self, t: usize, v: u32, y: u32, was: u16, p: u16) -> bool {
        let (dv, dy) = (degree(&self.walk[t], v), degree(&self.walk[t], y));
        let within = |j: u16, out: u64, inn: u64| {
            let e = self.loads[j as usize].edges;
            e - out + inn <= self.cap.edges.max(e)
        };
        within(was, dv, dy) && within(p, dy, dv)
    }

    /// Swaps `v` (type `t`, wanting `was` -> `p` for `gain`) with a waiting
    /// node wanting `p` -> `was`, if the pair lowers the cut.
    #[allow(clippy::too_many_arguments)]
    fn swap(
        &mut self,
        t: usize,
        v: u32,
        was: u16,
        p: u16,
        gain: u64,
        waiting: &mut BTreeMap<(u16, u16, usize, u8), Vec<u32>>,
        edges_capped: bool,
    ) -> bool {
        let splits = if t == self.target {
            self.split_of[v as usize]
        } else {
            0
        };
        let Some(list) = waiting.get_mut(&(p, was, t, splits)) else {
            return false;
        };
        self.owners[t][v as usize] = p;
        while let Some(y) = list.pop() {
            if self.owners[t][y as usize] != p {
                continue;
            }
            // The other's gain with `v` already moved (they may be neighbours).
            self.tally(t, y);
            let other = self.ce[was as usize] as i64 - self.ce[p as usize] as i64;
            if gain as i64 + other <= 0 {
                continue;
            }
            if edges_capped && !self.swap_keeps_edges(t, v, y, was, p) {
                continue;
            }
            self.owners[t][v as usize] = was;
            self.shift(t, v, was, p);
            self.shift(t, y, p, was);
            return true;
        }
        self.owners[t][v as usize] = was;
        false
    }
}
