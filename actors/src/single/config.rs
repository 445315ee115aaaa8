//! `[training.single]`: the single-process mode's own settings.

use serde::{Deserialize, Serialize};

use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;

/// Most prefetch threads of a single-process run.
const MAX_PREFETCH_THREADS: u32 = 64;

/// `[training.single]`
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SingleConfig {
    /// Threads sampling and gathering batches ahead of the trainer, each
    /// every n-th step (default 0: one per four cores, at most four; on a
    /// GPU one per two cores, at most eight). The model does not depend on it.
    pub prefetch_threads: u32,
}

impl ModeConfig for SingleConfig {
    const FORMER_KEYS: &'static [(&'static str, &'static str)] =
        &[("prefetch_threads", "prefetch_threads")];

    fn check(&self, _t: &TrainingConfig) -> Result<()> {
        if self.prefetch_threads > MAX_PREFETCH_THREADS {
            return Err(TrainError::Config(format!("training.single.prefetch_threads must be in 0..={MAX_PREFETCH_THREADS} (0: one per four cores)")));
        }
        Ok(())
    }
}
