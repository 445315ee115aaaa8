//! Steps 3 to 5: placing the groups (Algorithm 2, fixed), refining block
//! by block, and placing the nodes no block holds (see the module above).

use std::cmp::Reverse;
use std::collections::VecDeque;

use super::blocks::{degree, typed, Figures, State, NO_BLOCK, NO_PART, SLACK};

/// Marks a node no block holds once it is queued for step 5.
const QUEUED: u32 = NO_BLOCK - 1;

/// How a partition compares for a group: within the split caps, within
/// the type caps, the score (or, past the type caps, minus the excess),
/// whether it is where the group was (refinement), the room `BS`.
type Rank = (bool, bool, f64, bool, f64);

impl State<'_> {
    /// Empties `fig` and the cross-edge counts.
    pub(super) fn clear_measure(&mut self, fig: &mut Figures) {
        fig.clear();
        for &p in &self.touched {
            self.ce[p as usize] = 0;
        }
        self.touched.clear();
    }

    /// Adds block `b` to `fig`, and its edges to each partition's placed
    /// nodes (its own members left out) to `ce` / `touched`.
    pub(super) fn accumulate(&mut self, b: u32, fig: &mut Figures) {
        let (base, walk, incident, owners, block, split_of) = (
            &self.base,
            &self.walk,
            &self.incident,
            &self.owners,
            &self.block,
            &self.split_of,
        );
        let (ce, touched) = (&mut self.ce, &mut self.touched);
        for &x in &self.members[self.offsets[b as usize]..self.offsets[b as usize + 1]] {
            let (t, v) = typed(base, x);
            fig.types[t] += 1;
            fig.edges += degree(&walk[t], v);
            if t == self.target {
                (0..3).for_each(|s| fig.splits[s] += u64::from(split_of[v as usize] >> s & 1));
            }
            for &(s, csr) in &incident[t] {
                for &u in csr.neighbors(v) {
                    let p = owners[s][u as usize];
                    if p != NO_PART && block[base[s] + u as usize] != b {
                        if ce[p as usize] == 0 {
                            touched.push(p);
                        }
                        ce[p as usize] += 1;
                    }
                }
            }
        }
    }

    /// The partition for a measured group, and whether it is within the
    /// caps: among partitions within them, the highest `CE × BS` (with
    /// `stay`, the refinement's: the most cross edges, ties to `stay`),
    /// then the most room, then the lowest index; past the type caps, the
    /// one exceeding them least.
    fn choose(&self, fig: &Figures, stay: Option<u16>) -> (u16, bool) {
        let k = self.parts as f64;
        let (total, cap) = (&self.total, &self.cap);
        let labelled: u64 = total.splits.iter().sum();
        let w = if labelled == 0 {
            1.0
        } else {
            self.opts.type_weight
        };
        let mut best: Option<(Rank, u16)> = None;
        for (j, load) in self.loads.iter().enumerate() {
            let splits_fit = (0..3).all(|s| load.splits[s] + fig.splits[s] <= cap.splits[s]);
            let mut fill = 0.0;
            if w < 1.0 {
                let held: u64 = (0..3).map(|s| load.splits[s] + fig.splits[s]).sum();
                fill += (1.0 - w) * k * held as f64 / labelled as f64;
            }
            // Past the type caps by this factor (types weighed only with w > 0).
            let mut over = 0.0f64;
            if w > 0.0 {
                let terms = (0..total.types.len())
                    .map(|t| (total.types[t], cap.types[t], load.types[t] + fig.types[t]));
                let (mut sum, mut n) = (0.0, 0usize);
                for (all, c, held) in terms
                    .chain([(total.edges, cap.edges, load.edges + fig.edges)])
                    .filter(|&(all, ..)| all > 0)
                {
                    sum += k * held as f64 / all as f64;
                    n += 1;
                    over = over.max(held as f64 / c.max(1) as f64);
                }
                if n > 0 {
                    fill += w * sum / n as f64;
                }
            }
            let types_fit = over <= 1.0;
            let room = (1.0 - self.opts.balance_weight * fill / SLACK).max(0.0);
            let score = match stay {
                Some(_) => self.ce[j] as f64,
                None => self.ce[j] as f64 * room,
            };
            let rank = (
                splits_fit,
                types_fit,
                if types_fit { score } else { -over },
                stay == Some(j as u16),
                room,
            );
            if best.is_none_or(|(b, _)| rank > b) {
                best = Some((rank, j as u16));
            }
        }
        best.map_or((0, false), |((splits_fit, types_fit, ..), j)| {
            (j, splits_fit && types_fit)
        })
    }

    /// Sets the owner of block `b`'s members.
    pub(super) fn own(&mut self, b: u32, j: u16) {
        for i in self.offsets[b as usize]..self.offsets[b as usize + 1] {
            let (t, v) = typed(&self.base, self.members[i]);
            self.owners[t][v as usize] = j;
        }
    }

    /// Step 3: every group placed, in order; one no partition has room for
    /// is placed block by block.
    pub fn place(&mut self, groups: &[Vec<u32>]) {
        let mut fig = self.zero_figures();
        for group in groups {
            self.clear_measure(&mut fig);
            group.iter().for_each(|&b| self.accumulate(b, &mut fig));
            let (j, fits) = self.choose(&fig, None);
            if fits || group.len() == 1 {
                group.iter().for_each(|&b| self.own(b, j));
                self.loads[j as usize].add(&fig);
                continue;
            }
            for &b in group {
                self.clear_measure(&mut fig);
                self.accumulate(b, &mut fig);
                let (j, _) = self.choose(&fig, None);
                self.own(b, j);
                self.loads[j as usize].add(&fig);
            }
        }
    }

    /// Step 4: one refinement sweep in `order`; returns how many blocks moved.
    pub fn refine(&mut self, order: &[u32]) -> usize {
        let mut fig = self.zero_figures();
        let mut moved = 0;
        for &b in order {
            let was = self.owners[self.target][self.centres[b as usize] as usize];
            self.clear_measure(&mut fig);
            self.accumulate(b, &mut fig);
            self.loads[was as usize].sub(&fig);
            let (j, _) = self.choose(&fig, Some(was));
            self.loads[j as usize].add(&fig);
            if j != was {
                self.own(b, j);
                moved += 1;
            }
        }
        moved
    }

    /// Step 5: the nodes no block holds, outward from the placed ones.
    pub fn place_rest(&mut self) {
        let n = self.block.len();
        let mut queue = VecDeque::new();
        for x in 0..n {
            let (t, v) = typed(&self.base, x);
            if self.block[x] == NO_BLOCK
                && self.kept(t, v)
                && self.incident[t].iter().any(|&(s, csr)| {
                    csr.neighbors(v)
                        .iter()
                        .any(|&u| self.owners[s][u as usize] != NO_PART)
                })
            {
                self.block[x] = QUEUED;
                queue.push_back(x);
            }
        }
        let mut scan = 0usize;
        loop {
            let x = match queue.pop_front() {
                Some(x) => x,
                None => {
                    // A component with nothing placed: its first node starts it.
                    while scan < n && (self.block[scan] != NO_BLOCK || !self.kept_dense(scan)) {
                        scan += 1;
                    }
                    if scan == n {
                        break;
                    }
                    self.block[scan] = QUEUED;
                    scan
                }
            };
            let (t, v) = typed(&self.base, x);
            self.tally(t, v);
            let held = |p: u16| self.loads[p as usize].types[t];
            let cap = self.cap.types[t];
            let j = self
                .touched
                .iter()
                .copied()
                .filter(|&p| held(p) < cap)
                .max_by_key(|&p| (self.ce[p as usize], Reverse(held(p)), Reverse(p)))
                .unwrap_or_else(|| {
                    (0..self.parts as u16)
                        .min_by_key(|&p| (held(p), p))
                        .unwrap_or(0)
                });
            self.owners[t][v as usize] = j;
            self.loads[j as usize].types[t] += 1;
            self.loads[j as usize].edges += degree(&self.walk[t], v);
            for &(s, csr) in &self.incident[t] {
                for &u in csr.neighbors(v) {
                    let y = self.base[s] + u as usize;
                    if self.block[y] == NO_BLOCK
                        && self.owners[s][u as usize] == NO_PART
                        && self.kept(s, u)
                    {
                        self.block[y] = QUEUED;
                        queue.push_back(y);
                    }
                }
            }
        }
    }

    fn kept_dense(&self, x: usize) -> bool {
        let (t, v) = typed(&self.base, x);
        self.kept(t, v)
    }
}
