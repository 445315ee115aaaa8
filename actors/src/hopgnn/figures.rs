//! HopGNN's own figures: what a worker sends with its epoch's account, and
//! their merge into the report (`hop` in each epoch).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::distributed::messages::EpochStats;
use crate::error::Result;
use crate::report::EpochReport;

/// A HopGNN worker's figures of an epoch's training steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HopFigures {
    /// Time steps per step (the last step's).
    pub time_steps: u32,
    /// Remote input rows pulled (once per step and owner with pre-gathering).
    pub rows_pulled: u64,
    /// Remote input rows one pull per time step would have fetched.
    pub rows_pulled_per_time_step: u64,
    /// Per node type: its name, the input rows the worker's micrographs read
    /// (per time step, distinct within it), and those of them its partition holds.
    pub rows: Vec<(String, u64, u64)>,
    /// `hop_time_steps = "auto"`: the epoch's step seconds the examination
    /// period measured, per worker (none in the warm-up epoch and once settled).
    #[serde(default)]
    pub examined_s: Option<f64>,
}

/// HopGNN's figures of an epoch, over every worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HopEpoch {
    /// Time steps per step (after merging).
    pub time_steps: u32,
    /// Remote input rows pulled per step.
    pub rows_pulled_per_step: f64,
    /// Remote input rows per step had each time step pulled its own (no pre-gathering).
    pub rows_pulled_per_step_without_pregathering: f64,
    /// Share of the micrographs' input rows held by another partition.
    pub remote_row_rate: f64,
    /// Per node type, the share of a micrograph's input rows held by the
    /// partition that trains it (HopGNN's Table 1; 1/N for a random assignment).
    pub locality: BTreeMap<String, f64>,
    /// `hop_time_steps = "auto"`: the step seconds per worker the
    /// examination period measured in this epoch and compared (none in the
    /// warm-up epoch, and once the time steps are settled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examined_s: Option<f64>,
}

/// HopGNN's figures of an epoch: every worker's merged.
pub(crate) fn merge(report: &mut EpochReport, stats: &[EpochStats]) -> Result<()> {
    let mine: Vec<HopFigures> = stats
        .iter()
        .filter_map(|s| s.figures().transpose())
        .collect::<Result<_>>()?;
    let Some(first) = mine.first() else {
        return Ok(());
    };
    let steps = stats.first().map_or(1, |s| s.steps.max(1)) as f64;
    let mut rows: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for h in &mine {
        for (name, all, home) in &h.rows {
            let r = rows.entry(name.clone()).or_default();
            r.0 += all;
            r.1 += home;
        }
    }
    let (all, home) = rows.values().fold((0, 0), |a, r| (a.0 + r.0, a.1 + r.1));
    let epoch = HopEpoch {
        time_steps: first.time_steps,
        rows_pulled_per_step: mine.iter().map(|h| h.rows_pulled).sum::<u64>() as f64 / steps,
        rows_pulled_per_step_without_pregathering: mine
            .iter()
            .map(|h| h.rows_pulled_per_time_step)
            .sum::<u64>() as f64
            / steps,
        remote_row_rate: (all - home) as f64 / all.max(1) as f64,
        locality: rows
            .into_iter()
            .filter(|(_, r)| r.0 > 0)
            .map(|(k, r)| (k, r.1 as f64 / r.0 as f64))
            .collect(),
        examined_s: first.examined_s,
    };
    report.set_figures("hop", &epoch)
}
