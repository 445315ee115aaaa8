//! `[training.model-averaging]`: model averaging's own settings.

use serde::{Deserialize, Serialize};

use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;

/// How a model-averaging partition sizes its steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalBatch {
    /// Its share of `batch`, in proportion to the training nodes it owns: as
    /// in data-parallel training, `batch` seeds per step over all workers and
    /// as many steps per epoch.
    #[default]
    Share,
    /// `batch` seeds per step in every partition (k partitions take about
    /// 1/k of the steps each).
    Whole,
}

/// `[training.model-averaging]`
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AveragingConfig {
    /// Epochs between averagings (default 1).
    pub sync_every: u64,
    /// Workers (default 0: one per partition; in a cluster, one per node).
    pub workers: u32,
    /// "share" (default: each partition its share of `batch`) or "whole".
    pub local_batch: LocalBatch,
}

impl Default for AveragingConfig {
    fn default() -> Self {
        AveragingConfig {
            sync_every: 1,
            workers: 0,
            local_batch: LocalBatch::Share,
        }
    }
}

impl ModeConfig for AveragingConfig {
    const FORMER_KEYS: &'static [(&'static str, &'static str)] = &[
        ("sync_every", "sync_every"),
        ("workers", "workers"),
        ("local_batch", "local_batch"),
    ];

    fn check(&self, t: &TrainingConfig) -> Result<()> {
        if self.sync_every == 0 {
            return Err(TrainError::Config(
                "training.model-averaging.sync_every: must be at least 1 (epochs between averagings)".into(),
            ));
        }
        if t.eval_every > 1 {
            return Err(TrainError::Config("training.eval_every: model-averaging evaluates every epoch (each worker's model before averaging is part of its report)".into()));
        }
        Ok(())
    }
}
