//! Node hotness by pre-sampling (GNNLab, as Heta uses it): sample a few
//! epochs with the real sampler before training and count how often each
//! node is an input row of a batch.

use graphs::sampler::epoch_batches;

use crate::error::Result;

/// Visit counts per node type and node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Visits {
    counts: Vec<Vec<u32>>,
}

impl Visits {
    /// No visits yet, for types of `sizes[t]` nodes.
    pub fn new(sizes: &[usize]) -> Visits {
        Visits {
            counts: sizes.iter().map(|&n| vec![0; n]).collect(),
        }
    }

    /// Counts one batch's input rows (`src[t]`: ids of type `t`; out-of-range ids are ignored).
    pub fn add(&mut self, src: &[Vec<u32>]) {
        for (c, ids) in self.counts.iter_mut().zip(src) {
            for &v in ids {
                if let Some(x) = c.get_mut(v as usize) {
                    *x = x.saturating_add(1);
                }
            }
        }
    }

    /// Visits of type `ty`'s nodes.
    pub fn of(&self, ty: usize) -> &[u32] {
        self.counts.get(ty).map_or(&[], Vec::as_slice)
    }

    /// Total visits of type `ty`.
    pub fn total(&self, ty: usize) -> u64 {
        self.of(ty).iter().map(|&c| u64::from(c)).sum()
    }

    /// Type `ty`'s visited nodes, most visited first (ties: lower id first).
    pub fn ranked(&self, ty: usize) -> Vec<u32> {
        let c = self.of(ty);
        let mut ids: Vec<u32> = (0..c.len() as u32).filter(|&v| c[v as usize] > 0).collect();
        ids.sort_by(|&a, &b| c[b as usize].cmp(&c[a as usize]).then(a.cmp(&b)));
        ids
    }
}

/// Counts the input rows of `epochs` pre-sampled epochs over `train` (the
/// run's batch size); `inputs(epoch, step, batch)` samples one batch the way
/// training will (its own seeds of it, its relations) and returns its input
/// rows per type.
pub fn presample(
    sizes: &[usize],
    train: &[u32],
    batch: usize,
    plan: &crate::epoch::plan::SamplingPlan,
    epochs: u64,
    mut inputs: impl FnMut(u64, u64, &[u32]) -> Result<Vec<Vec<u32>>>,
) -> Result<Visits> {
    let mut visits = Visits::new(sizes);
    for epoch in 0..epochs {
        for (step, b) in epoch_batches(train, batch, plan.presample_seed(), epoch)
            .iter()
            .enumerate()
        {
            visits.add(&inputs(epoch, step as u64, b)?);
        }
    }
    Ok(visits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ranks_visits() {
        let mut v = Visits::new(&[5, 3]);
        v.add(&[vec![1, 3, 3], vec![2]]);
        v.add(&[vec![3, 4, 99], vec![]]);
        assert_eq!(v.of(0), &[0, 1, 0, 3, 1]);
        assert_eq!((v.total(0), v.total(1)), (5, 1));
        assert_eq!(
            v.ranked(0),
            vec![3, 1, 4],
            "most visited first, ties by id, unvisited left out"
        );
        assert_eq!(v.ranked(1), vec![2]);
        assert!(v.ranked(7).is_empty());
    }

    #[test]
    fn presampling_walks_every_batch_of_every_epoch_once() {
        let train: Vec<u32> = (0..10).collect();
        let mut calls = Vec::new();
        let plan = crate::epoch::plan::SamplingPlan::new(&[2], 1);
        let v = presample(&[10], &train, 4, &plan, 2, |e, s, b| {
            calls.push((e, s, b.len()));
            Ok(vec![b.to_vec()])
        })
        .unwrap();
        assert_eq!(
            calls,
            vec![
                (0, 0, 4),
                (0, 1, 4),
                (0, 2, 2),
                (1, 0, 4),
                (1, 1, 4),
                (1, 2, 2)
            ]
        );
        assert_eq!(
            v.of(0),
            &[2; 10],
            "every training node seeds once per epoch"
        );
    }
}
