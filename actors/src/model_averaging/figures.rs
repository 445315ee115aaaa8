//! Model averaging's own figures: each worker's models before averaging and
//! what averaging sent, merged into the report as `workers` and
//! `averaging_bytes` in each epoch.

use serde::{Deserialize, Serialize};

use crate::distributed::messages::EpochStats;
use crate::error::Result;
use crate::report::EpochReport;

/// A model-averaging worker's own figures of an epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalFigures {
    /// Payload bytes this worker sent to average the models this epoch.
    pub averaging_bytes: u64,
    /// Validation nodes its partitions own.
    pub valid: u64,
    /// Test nodes its partitions own.
    pub test: u64,
    /// Correct validation predictions of its models before averaging.
    pub valid_correct: u64,
    /// Correct test predictions of its models before averaging.
    pub test_correct: u64,
    /// Peak resident memory of its process so far.
    #[serde(default)]
    pub peak_memory_bytes: Option<u64>,
    /// Peak anonymous resident memory of its process so far (sampled).
    #[serde(default)]
    pub peak_anon_bytes: Option<u64>,
}

/// A model-averaging worker's epoch: its own loss, and its models' accuracy
/// before averaging on the nodes its partitions own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Mean loss of its steps.
    pub loss: f64,
    /// Validation accuracy before averaging.
    pub valid_acc: f64,
    /// Test accuracy before averaging.
    pub test_acc: f64,
    /// Peak resident memory of its process so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// Peak anonymous resident memory of its process so far (sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_anon_bytes: Option<u64>,
}

/// Each worker's figures before averaging, and the bytes averaging sent in all.
pub(crate) fn merge(report: &mut EpochReport, stats: &[EpochStats]) -> Result<()> {
    let ratio = |a: u64, b: u64| a as f64 / b.max(1) as f64;
    let mut workers = Vec::new();
    let mut bytes = 0;
    for s in stats {
        let Some(l) = s.figures::<LocalFigures>()? else {
            continue;
        };
        bytes += l.averaging_bytes;
        workers.push(WorkerReport {
            loss: s.loss,
            valid_acc: ratio(l.valid_correct, l.valid),
            test_acc: ratio(l.test_correct, l.test),
            peak_memory_bytes: l.peak_memory_bytes,
            peak_anon_bytes: l.peak_anon_bytes,
        });
    }
    if !workers.is_empty() {
        report.set_figures("workers", &workers)?;
    }
    if bytes > 0 {
        report.set_figures("averaging_bytes", &bytes)?;
    }
    Ok(())
}
