//! Step 3 with `place = metis` (an addition): METIS over the block graph.
//!
//! The greedy placement sees one group at a time; on small graphs with
//! few labelled nodes (planetoid-cora, heco-acm) it ends far above METIS's
//! cut, and no local sweep recovers. Here the blocks are the vertices of a
//! graph whose edge weights are the edges between them, partitioned by
//! METIS (multilevel, k-way) under one constraint per split and one for the
//! nodes, so the blocks stay whole and the splits balanced. Steps 4 to 6
//! follow as with the greedy placement. The block graph has one vertex per
//! labelled node and at most twice the graph's edges: METIS's memory is the
//! price, which the greedy placement does not pay.

use super::blocks::{State, NO_BLOCK};
use crate::error::{GraphError, Result};
use crate::partition::metis::one_at_a_time;

impl State<'_> {
    /// Places every block by METIS over the block graph; `false` when
    /// there are no more blocks than partitions (nothing to partition: the
    /// caller places them greedily).
    pub fn place_metis(&mut self, seed: u64) -> Result<bool> {
        let nb = self.centres.len();
        if nb <= self.parts {
            return Ok(false);
        }
        let too_big = || {
            GraphError::InvalidArgument(format!(
                "bytegnn: {nb} blocks and their edges are too many for METIS's 32-bit ids"
            ))
        };
        if nb > i32::MAX as usize {
            return Err(too_big());
        }
        // Each edge between blocks b and c, seen from both ends: symmetric.
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for b in 0..nb as u32 {
            for &x in self.members_of(b) {
                let (t, v) = super::blocks::typed(&self.base, x);
                for &(s, csr) in &self.incident[t] {
                    for &u in csr.neighbors(v) {
                        let c = self.block[self.base[s] + u as usize];
                        if c != NO_BLOCK && c != b {
                            pairs.push((b, c));
                        }
                    }
                }
            }
        }
        pairs.sort_unstable();
        let mut xadj = vec![0i32; nb + 1];
        let (mut adj, mut wgt) = (Vec::new(), Vec::new());
        for (i, &(b, c)) in pairs.iter().enumerate() {
            if i > 0 && pairs[i - 1] == (b, c) {
                *wgt.last_mut().ok_or_else(too_big)? += 1;
                continue;
            }
            adj.push(c as i32);
            wgt.push(1i32);
            xadj[b as usize + 1] = i32::try_from(adj.len()).map_err(|_| too_big())?;
        }
        drop(pairs);
        for b in 0..nb {
            xadj[b + 1] = xadj[b + 1].max(xadj[b]);
        }
        // Constraints: each non-empty split, then the nodes.
        let splits: Vec<usize> = (0..3).filter(|&s| self.total.splits[s] > 0).collect();
        let ncon = splits.len() + 1;
        let mut vwgt = vec![0i32; nb * ncon];
        for b in 0..nb {
            let bits = self.split_of[self.centres[b] as usize];
            for (i, &s) in splits.iter().enumerate() {
                vwgt[b * ncon + i] = i32::from(bits >> s & 1);
            }
            vwgt[b * ncon + splits.len()] =
                i32::try_from(self.members_of(b as u32).len()).map_err(|_| too_big())?;
        }
        let mut part = vec![0i32; nb];
        {
            let graph = metis::Graph::new(ncon as i32, self.parts as i32, &xadj, &adj)
                .map_err(|e| {
                    GraphError::InvalidArgument(format!("METIS refused the block graph: {e}"))
                })?
                .set_vwgt(&vwgt)
                .set_adjwgt(&wgt)
                .set_option(metis::option::Seed((seed & 0x7fff_ffff) as i32));
            let _one = one_at_a_time();
            graph.part_kway(&mut part).map_err(|e| {
                GraphError::InvalidArgument(format!("METIS failed on the block graph: {e}"))
            })?;
        }
        let mut fig = self.zero_figures();
        for (b, &p) in part.iter().enumerate() {
            let j = u16::try_from(p)
                .ok()
                .filter(|&j| (j as usize) < self.parts)
                .ok_or_else(|| {
                    GraphError::InvalidArgument(format!("METIS returned partition {p}"))
                })?;
            self.clear_measure(&mut fig);
            self.accumulate(b as u32, &mut fig);
            self.own(b as u32, j);
            self.loads[j as usize].add(&fig);
        }
        Ok(true)
    }
}
