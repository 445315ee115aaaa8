//! Step 7: nodes move to where the mini-batches read them (see the module
//! above).
//!
//! Steps 1 to 6 lower the edge cut, but what a trainer pulls is narrower:
//! the input rows its own seeds' sampled neighbourhoods reach. The
//! sampler, started from a seed `s` (a labelled node, weighted by its
//! split), picks node `u` from node `v` over relation `r` with probability
//! `min(1, fanout / deg_r(v))` (a uniform draw without replacement), so the
//! expected number of times it reads node `x` within `hops` hops, `P_s(x)`,
//! is a sum over paths. What the partitions pull is then
//! `Σ_s w_s Σ_x P_s(x) [x not on s's partition]` (duplicate reads within a
//! batch counted each time), and two moves each lower it while the other
//! side stays put:
//!
//! - **Nodes follow the seeds.** A node's *mass* on partition `q` is
//!   `Σ_{s on q} w_s P_s(x)`; every node that is not a seed moves to the
//!   partition where its mass beats its mass at home by most.
//! - **Seeds follow their neighbourhoods.** A seed's *score* on partition
//!   `q` is `P_s` summed over the nodes `q` holds; every seed moves to the
//!   partition where its weighted score beats home by most.
//!
//! Both go largest gain first, within the caps of the node's type and
//! splits (and of the sampler's in-edges with `type_weight > 0`); a node
//! held back by a cap swaps with one of its type and splits that wants the
//! opposite move. Rounds alternate the two until nothing moves or `passes`
//! rounds are done.
//!
//! Memory: per node its value at home and at its two best other partitions
//! (20 bytes), plus two `f32` per node and the frontier (at most 24 bytes
//! per node) while one partition's values are computed. Time per round:
//! per partition, `hops` sweeps over the edges.

use std::collections::BTreeMap;

use super::blocks::{degree, typed, State, NO_PART};

/// A node's value (mass or score) at home and at its two best other partitions.
#[derive(Clone, Copy)]
struct Value {
    home: f32,
    best: [(u16, f32); 2],
}

impl Value {
    const NONE: Value = Value {
        home: 0.0,
        best: [(NO_PART, 0.0); 2],
    };

    fn offer(&mut self, p: u16, m: f32) {
        if m > self.best[0].1 {
            self.best[1] = self.best[0];
            self.best[0] = (p, m);
        } else if m > self.best[1].1 {
            self.best[1] = (p, m);
        }
    }
}

impl State<'_> {
    /// A labelled node's weight as a seed: the sum of its splits' weights
    /// (0 for every other node).
    fn seed_weight(&self, t: usize, v: u32) -> f32 {
        if t != self.target {
            return 0.0;
        }
        let bits = self.split_of[v as usize];
        (0..3)
            .filter(|s| bits >> s & 1 == 1)
            .map(|s| self.opts.seed_weights[s] as f32)
            .sum()
    }

    /// The probability that the sampler at node `v` picks a given one of
    /// `neighbours` at hop `hop`.
    fn pick(&self, hop: usize, neighbours: usize) -> f32 {
        (self.opts.fanouts.at(hop) as f32 / neighbours as f32).min(1.0)
    }

    /// Partition `q`'s mass at every node (dense ids) into `out`, with
    /// `cur` / `next` as scratch.
    pub(super) fn masses(
        &self,
        q: u16,
        out: &mut [f32],
        cur: &mut Vec<(usize, f32)>,
        next: &mut [f32],
    ) {
        out.iter_mut().for_each(|m| *m = 0.0);
        cur.clear();
        let t0 = self.target;
        for &c in &self.centres {
            let w = self.seed_weight(t0, c);
            if self.owners[t0][c as usize] == q && w > 0.0 {
                let x = self.base[t0] + c as usize;
                out[x] += w;
                cur.push((x, w));
            }
        }
        let mut reached: Vec<usize> = Vec::new();
        for hop in 0..self.opts.hops {
            for &(x, m) in cur.iter() {
                let (t, v) = typed(&self.base, x);
                for &(s, csr) in &self.walk[t] {
                    let nb = csr.neighbors(v);
                    let p = m * self.pick(hop, nb.len().max(1));
                    for &u in nb {
                        let y = self.base[s] + u as usize;
                        if next[y] == 0.0 {
                            reached.push(y);
                        }
                        next[y] += p;
                    }
                }
            }
            cur.clear();
            reached.sort_unstable();
            for &y in &reached {
                let (s, u) = typed(&self.base, y);
                if self.kept(s, u) {
                    out[y] += next[y];
                    cur.push((y, next[y]));
                }
                next[y] = 0.0;
            }
            reached.clear();
        }
    }

    /// Every node's score on partition `q` (what of its sampled
    /// neighbourhood `q` holds) into `out`, with `next` as scratch.
    pub(super) fn scores(&self, q: u16, out: &mut [f32], next: &mut [f32]) {
        let held = |t: usize, v: u32| {
            if self.owners[t][v as usize] == q && self.kept(t, v) {
                1.0
            } else {
                0.0
            }
        };
        // Innermost first: h_K(x) = held(x), h_k(x) = held(x) + Σ p · h_{k+1}(u)
        // (h_0 without its own term). Type by type: dense ids run in type order.
        for t in 0..self.walk.len() {
            for v in 0..(self.base[t + 1] - self.base[t]) as u32 {
                out[self.base[t] + v as usize] = held(t, v);
            }
        }
        for hop in (0..self.opts.hops).rev() {
            for (t, walk) in self.walk.iter().enumerate() {
                for v in 0..(self.base[t + 1] - self.base[t]) as u32 {
                    let mut sum = 0.0;
                    for &(s, csr) in walk {
                        let nb = csr.neighbors(v);
                        if !nb.is_empty() {
                            let inner: f32 =
                                nb.iter().map(|&u| out[self.base[s] + u as usize]).sum();
                            sum += self.pick(hop, nb.len()) * inner;
                        }
                    }
                    // A seed's own row is at home wherever it goes.
                    next[self.base[t] + v as usize] = if hop == 0 { sum } else { held(t, v) + sum };
                }
            }
            out.copy_from_slice(next);
        }
    }

    /// One round of step 7: nodes follow the seeds, then seeds follow
    /// their neighbourhoods; returns how many nodes moved.
    pub fn follow_samples(&mut self) -> usize {
        self.follow(false) + self.follow(true)
    }

    /// Moves the seeds (`seeds`) or every other node by the gains above.
    fn follow(&mut self, seeds: bool) -> usize {
        let n = self.block.len();
        let movable = |s: &Self, x: usize| {
            let (t, v) = typed(&s.base, x);
            s.kept(t, v)
                && s.owners[t][v as usize] != NO_PART
                && (s.seed_weight(t, v) > 0.0) == seeds
        };
        let mut values = vec![Value::NONE; n];
        let (mut val, mut next, mut cur) = (vec![0.0f32; n], vec![0.0f32; n], Vec::new());
        for q in 0..self.parts as u16 {
            if seeds {
                self.scores(q, &mut val, &mut next);
            } else {
                self.masses(q, &mut val, &mut cur, &mut next);
            }
            for (x, &m) in val.iter().enumerate().filter(|(_, &m)| m > 0.0) {
                let (t, v) = typed(&self.base, x);
                if self.owners[t][v as usize] == q {
                    values[x].home = m;
                } else {
                    values[x].offer(q, m);
                }
            }
        }
        drop((val, next, cur));
        // Largest weighted gain first (ties: dense id).
        let mut wants: Vec<(f32, usize)> = (0..n)
            .filter(|&x| values[x].best[0].1 > values[x].home && movable(self, x))
            .map(|x| {
                let (t, v) = typed(&self.base, x);
                let w = if seeds { self.seed_weight(t, v) } else { 1.0 };
                (w * (values[x].best[0].1 - values[x].home), x)
            })
            .collect();
        wants.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let edges_capped = self.opts.type_weight > 0.0;
        let mut moved = 0;
        // (from, to, type, splits) -> nodes held back by a cap.
        let mut waiting: BTreeMap<(u16, u16, usize, u8), Vec<u32>> = BTreeMap::new();
        for (_, x) in wants {
            let (t, v) = typed(&self.base, x);
            let was = self.owners[t][v as usize];
            let value = values[x];
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
            let better = || {
                value
                    .best
                    .into_iter()
                    .filter(|&(p, m)| p != NO_PART && m > value.home)
            };
            if let Some((p, _)) = better().find(|&(p, _)| fits(p)) {
                self.shift(t, v, was, p);
                moved += 1;
                continue;
            }
            let Some((p, _)) = better().next() else {
                continue;
            };
            match self.partner(
                t,
                v,
                was,
                p,
                waiting.get_mut(&(p, was, t, splits)),
                edges_capped,
            ) {
                Some(u) => {
                    self.shift(t, v, was, p);
                    self.shift(t, u, p, was);
                    moved += 2;
                }
                None => waiting.entry((was, p, t, splits)).or_default().push(v),
            }
        }
        moved
    }

    /// A node of `waiting` (type `t`, still on `p`, wanting `was`) that can
    /// swap with `v` (on `was`, wanting `p`) within the in-edge cap.
    fn partner(
        &self,
        t: usize,
        v: u32,
        was: u16,
        p: u16,
        waiting: Option<&mut Vec<u32>>,
        edges_capped: bool,
    ) -> Option<u32> {
        let list = waiting?;
        while let Some(u) = list.pop() {
            if self.owners[t][u as usize] != p {
                continue;
            }
            if edges_capped && !self.swap_keeps_edges(t, v, u, was, p) {
                continue;
            }
            return Some(u);
        }
        None
    }
}
