//! Full-graph training's own figures: what a worker sends with its epoch's
//! account, and their merge into the report (`full` in each epoch).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::distributed::messages::EpochStats;
use crate::error::Result;
use crate::report::EpochReport;

/// A full-graph worker's figures of an epoch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FullFigures {
    /// Per block (`l<layer>.<type>`): what this worker did with its own.
    pub blocks: BTreeMap<String, BlockCounts>,
    /// Payload bytes of the blocks it broadcast in training (every receiver counted).
    pub forward_bytes: u64,
    /// Payload bytes of the gradient blocks it sent.
    pub backward_bytes: u64,
    /// Payload bytes of the blocks it broadcast for evaluation.
    pub eval_bytes: u64,
    /// Bytes its cache of blocks holds at the epoch's end.
    pub cache_bytes: u64,
}

/// What a full-graph worker did with one of its blocks over an epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockCounts {
    /// Training broadcasts made.
    pub sent: u64,
    /// Training broadcasts skipped (the receivers used their copy).
    pub skipped: u64,
    /// Gradient blocks sent back to their owners.
    pub grad_sent: u64,
    /// Gradient blocks skipped (`skip_gradients`).
    pub grad_skipped: u64,
}

impl BlockCounts {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &BlockCounts) {
        self.sent += other.sent;
        self.skipped += other.skipped;
        self.grad_sent += other.grad_sent;
        self.grad_skipped += other.grad_skipped;
    }
}

/// Full-graph training's figures of an epoch, over every worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FullEpoch {
    /// Payload bytes of the training forward pass's broadcasts (every receiver counted).
    pub forward_bytes: u64,
    /// Payload bytes of the gradient blocks sent back to their owners.
    pub backward_bytes: u64,
    /// Payload bytes of evaluation's broadcasts.
    pub eval_bytes: u64,
    /// Bytes of cached blocks, summed over workers.
    pub cache_bytes: u64,
    /// Per block (`l<layer>.<type>`): broadcasts made and skipped, gradient blocks sent and skipped, over all workers.
    pub blocks: BTreeMap<String, BlockCounts>,
}

/// Full-graph training's figures of an epoch: every worker's summed.
pub(crate) fn merge(report: &mut EpochReport, stats: &[EpochStats]) -> Result<()> {
    let mut out: Option<FullEpoch> = None;
    for s in stats {
        let Some(f) = s.figures::<FullFigures>()? else {
            continue;
        };
        let o = out.get_or_insert_with(FullEpoch::default);
        o.forward_bytes += f.forward_bytes;
        o.backward_bytes += f.backward_bytes;
        o.eval_bytes += f.eval_bytes;
        o.cache_bytes += f.cache_bytes;
        for (k, c) in &f.blocks {
            o.blocks.entry(k.clone()).or_default().add(c);
        }
    }
    match out {
        Some(o) => report.set_figures("full", &o),
        None => Ok(()),
    }
}
