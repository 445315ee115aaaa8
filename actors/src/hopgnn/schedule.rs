//! Which roots each worker trains at each time step of a step: a pure
//! function of the global batch, the owners of its roots and the number of
//! time steps, so every worker computes the same plan and none is sent.
//!
//! Model `d` takes slice `d` of the global batch (the model-centric
//! assignment). At time step `i` it is at worker `(d + offset[i]) mod N` and
//! trains its roots homed there (HopGNN §5.1). With one time step per
//! partition (`offset = 0..N`) every micrograph is trained at its home.
//! Merging (§5.3) removes the time step with the fewest roots, summed over the
//! models (ties: the earliest), and hands each model's roots of it, in batch
//! order, to that model's remaining time step with the fewest roots so far
//! (ties: the earliest), until the wanted number of time steps is left; those
//! roots are then trained away from their home.

/// The plan of one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Workers (= models = partitions).
    pub workers: u32,
    /// Per time step, how far each model is from its first worker.
    pub offsets: Vec<u32>,
    /// `[time step][model]`: the roots the model trains then, in batch order.
    pub roots: Vec<Vec<Vec<u32>>>,
}

impl Plan {
    /// Plans `batch` over `workers` workers in `steps` time steps
    /// (clamped to 1..=workers); `home(v)` is the partition owning root `v`.
    pub fn new(batch: &[u32], workers: u32, steps: u32, home: impl Fn(u32) -> u32) -> Plan {
        let n = workers.max(1) as usize;
        let len = batch.len();
        // units[o][d]: model d's roots homed at worker (d + o) mod n.
        let mut units = vec![vec![Vec::new(); n]; n];
        for d in 0..n {
            for &v in &batch[len * d / n..len * (d + 1) / n] {
                let o = (home(v) as usize % n + n - d) % n;
                units[o][d].push(v);
            }
        }
        let mut offsets: Vec<usize> = (0..n).collect();
        let keep = (steps.max(1) as usize).min(n);
        while offsets.len() > keep {
            let total = |o: usize| units[o].iter().map(Vec::len).sum::<usize>();
            let (at, &gone) = offsets
                .iter()
                .enumerate()
                .min_by_key(|&(i, &o)| (total(o), i))
                .expect("more than one time step left");
            offsets.remove(at);
            let moved = std::mem::replace(&mut units[gone], vec![Vec::new(); n]);
            for (d, roots) in moved.into_iter().enumerate() {
                for v in roots {
                    let &o = offsets
                        .iter()
                        .min_by_key(|&&o| units[o][d].len())
                        .expect("a time step left");
                    units[o][d].push(v);
                }
            }
        }
        let roots = offsets
            .iter()
            .map(|&o| std::mem::take(&mut units[o]))
            .collect();
        Plan {
            workers: n as u32,
            offsets: offsets.into_iter().map(|o| o as u32).collect(),
            roots,
        }
    }

    /// Time steps.
    pub fn steps(&self) -> usize {
        self.offsets.len()
    }

    /// The model worker `w` hosts at time step `i`.
    pub fn model_at(&self, w: u32, i: usize) -> u32 {
        (w + self.workers - self.offsets[i] % self.workers) % self.workers
    }

    /// The roots worker `w` trains at time step `i`.
    pub fn roots_at(&self, w: u32, i: usize) -> &[u32] {
        &self.roots[i][self.model_at(w, i) as usize]
    }

    /// Where the model worker `w` hosts at time step `i` came from (`i > 0`).
    pub fn came_from(&self, w: u32, i: usize) -> u32 {
        let n = self.workers;
        (w + self.offsets[i - 1] + n - self.offsets[i] % n) % n
    }

    /// Where the model worker `w` hosts at time step `i` goes next (`i + 1 < steps`).
    pub fn goes_to(&self, w: u32, i: usize) -> u32 {
        let n = self.workers;
        (w + self.offsets[i + 1] + n - self.offsets[i] % n) % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home(v: u32) -> u32 {
        (v * 7 + v / 3) % 4
    }

    #[test]
    fn every_root_is_trained_once_and_at_home_without_merging() {
        let batch: Vec<u32> = (0..103).map(|i| (i * 37) % 211).collect();
        let plan = Plan::new(&batch, 4, 4, home);
        assert_eq!(plan.offsets, vec![0, 1, 2, 3]);
        let mut seen = Vec::new();
        for i in 0..plan.steps() {
            for w in 0..4 {
                for &v in plan.roots_at(w, i) {
                    assert_eq!(home(v), w, "root {v} trained away from home");
                    seen.push(v);
                }
            }
        }
        seen.sort_unstable();
        let mut want = batch.clone();
        want.sort_unstable();
        assert_eq!(seen, want);
        // A model's roots are its slice of the batch.
        let slice1: Vec<u32> = batch[103 / 4..103 * 2 / 4].to_vec();
        let mut of1: Vec<u32> = (0..4).flat_map(|i| plan.roots[i][1].clone()).collect();
        of1.sort_unstable();
        let mut s1 = slice1;
        s1.sort_unstable();
        assert_eq!(of1, s1);
    }

    #[test]
    fn merging_removes_the_time_step_with_fewest_roots_and_keeps_every_root() {
        // Roots homed mostly on worker 0: the offsets that reach worker 0 least go first.
        let batch: Vec<u32> = (0..60).collect();
        let skewed = |v: u32| if v.is_multiple_of(5) { v % 3 } else { 0 };
        let all = Plan::new(&batch, 3, 3, skewed);
        let totals: Vec<usize> = (0..3)
            .map(|i| all.roots[i].iter().map(Vec::len).sum())
            .collect();
        let fewest = (0..3).min_by_key(|&i| (totals[i], i)).unwrap() as u32;
        let two = Plan::new(&batch, 3, 2, skewed);
        assert_eq!(two.steps(), 2);
        assert!(!two.offsets.contains(&fewest));
        let one = Plan::new(&batch, 3, 1, skewed);
        for plan in [&two, &one] {
            let mut seen: Vec<u32> = plan.roots.iter().flatten().flatten().copied().collect();
            seen.sort_unstable();
            assert_eq!(seen, batch);
            // Each model keeps its own roots.
            for d in 0..3usize {
                let mut mine: Vec<u32> = plan.roots.iter().flat_map(|r| r[d].clone()).collect();
                mine.sort_unstable();
                assert_eq!(mine, batch[60 * d / 3..60 * (d + 1) / 3].to_vec());
            }
        }
        // One time step: each worker trains one model's whole slice (model-centric).
        let d = one.model_at(2, 0) as usize;
        let mut got = one.roots_at(2, 0).to_vec();
        got.sort_unstable();
        assert_eq!(got, &batch[20 * d..20 * (d + 1)]);
    }

    #[test]
    fn migration_follows_the_offsets() {
        let batch: Vec<u32> = (0..40).collect();
        let plan = Plan::new(&batch, 4, 4, |v| v % 4);
        for i in 1..plan.steps() {
            for w in 0..4 {
                let from = plan.came_from(w, i);
                assert_eq!(plan.model_at(from, i - 1), plan.model_at(w, i));
                assert_eq!(plan.goes_to(from, i - 1), w);
            }
        }
        let merged = Plan::new(&batch, 4, 2, |v| v % 4);
        for w in 0..4 {
            let to = merged.goes_to(w, 0);
            assert_eq!(merged.model_at(to, 1), merged.model_at(w, 0));
        }
    }
}
