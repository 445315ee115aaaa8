//! How a run samples: its fanouts and the one seed rule for each use
//! (training, evaluation, pre-sampling for the cache), built from the
//! configuration, so every mode and `predict` draw the same neighbourhoods
//! for the same purpose.

use graphs::{HetGraph, Sampler};

use crate::config::TrainingConfig;
use crate::error::Result;

/// Evaluation samples with a seed of its own so it never shares draws with training.
pub const EVAL_SEED: u64 = 0xE7A1_5EED;

/// Pre-sampling (the cache's visit counts) draws with a seed of its own:
/// independent of training's, so the counts predict the training epochs
/// instead of replaying them.
pub const PRESAMPLE_SEED: u64 = 0x9E3A_11CA_C4E5;

/// The step key of inference's draws (`predict`, `serve`): every batch is
/// drawn with the same key, so a node's neighbourhood, and its answer, do not
/// depend on the batch it is computed in or on the other nodes asked with it.
pub const INFERENCE_STEP: u64 = u64::MAX;

/// A run's sampling: fanouts per layer (seeds outward) and the run's seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplingPlan {
    /// Neighbours sampled per relation and hop, seeds outward.
    pub fanouts: Vec<usize>,
    seed: u64,
}

impl SamplingPlan {
    /// The plan of a run configured by `t`.
    pub fn of(t: &TrainingConfig) -> SamplingPlan {
        SamplingPlan::new(&t.fanouts, t.seed)
    }

    /// The plan of a run of `fanouts` and `seed` (a checkpoint's, say).
    pub fn new(fanouts: &[usize], seed: u64) -> SamplingPlan {
        SamplingPlan {
            fanouts: fanouts.to_vec(),
            seed,
        }
    }

    /// Seed of training's draws.
    pub fn train_seed(&self) -> u64 {
        self.seed
    }

    /// Seed of evaluation's draws.
    pub fn eval_seed(&self) -> u64 {
        self.seed ^ EVAL_SEED
    }

    /// Seed of pre-sampling's draws and batch order.
    pub fn presample_seed(&self) -> u64 {
        self.seed ^ PRESAMPLE_SEED
    }

    /// A sampler of training's draws on `g`.
    pub fn train<'g>(&self, g: &'g HetGraph) -> Result<Sampler<'g>> {
        Ok(Sampler::new(g, &self.fanouts, self.train_seed())?)
    }

    /// A sampler of evaluation's draws on `g`.
    pub fn eval<'g>(&self, g: &'g HetGraph) -> Result<Sampler<'g>> {
        Ok(Sampler::new(g, &self.fanouts, self.eval_seed())?)
    }

    /// A sampler of pre-sampling's draws on `g`.
    pub fn presample<'g>(&self, g: &'g HetGraph) -> Result<Sampler<'g>> {
        Ok(Sampler::new(g, &self.fanouts, self.presample_seed())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_use_has_its_own_seed_and_the_rules_do_not_move() {
        let p = SamplingPlan::new(&[5, 3], 7);
        // The values every checkpoint and reference hash was made with.
        assert_eq!(p.train_seed(), 7);
        assert_eq!(p.eval_seed(), 7 ^ 0xE7A1_5EED);
        assert_eq!(p.presample_seed(), 7 ^ 0x9E3A_11CA_C4E5);
        let t = TrainingConfig {
            fanouts: vec![5, 3],
            seed: 7,
            ..TrainingConfig::default()
        };
        assert_eq!(SamplingPlan::of(&t), p);
    }
}
