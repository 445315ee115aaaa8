//! The run report (docs/guide/report.md): the same fields in every mode,
//! so runs can be compared by scripts.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::DType;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use models::Model;

use crate::config::{Config, SelectMetric};
use crate::error::{Result, TrainError};

/// One epoch's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochReport {
    /// Epoch index (0-based).
    pub epoch: u64,
    /// Mean training loss over the epoch's steps.
    pub loss: f64,
    /// Accuracy on the training seeds as they were trained (with dropout).
    pub train_acc: f64,
    /// Validation accuracy after the epoch (`null`: not evaluated, see `training.eval_every`).
    pub valid_acc: Option<f64>,
    /// Test accuracy after the epoch (`null`: not evaluated).
    pub test_acc: Option<f64>,
    /// Where the epoch's time went.
    #[serde(flatten)]
    pub time: Timings,
    /// Link prediction: MRR and Hits@K after the epoch (the accuracies above are then 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<crate::task::link::LinkEpoch>,
    /// Node regression: RMSE, MAE and R² after the epoch (`null`: not
    /// evaluated; the accuracies above are then 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression: Option<crate::task::node::RegressionEpoch>,
    /// Node classification: validation and test macro F1 (the mean of the
    /// per-class F1 over classes true or predicted; multi-label: per label;
    /// absent with more than
    /// 4096 classes, in modes that do not count per class, or when not evaluated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macro_f1: Option<[f64; 2]>,
    /// Binary edge classification and multi-label: validation and test
    /// ROC-AUC (multi-label: of every (node, label) pair pooled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roc_auc: Option<[f64; 2]>,
    /// Binary edge classification and multi-label: validation and test
    /// average precision (the area under the precision-recall curve, pairs pooled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_precision: Option<[f64; 2]>,
    /// Multi-label: validation and test micro F1 (every label's counts pooled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_f1: Option<[f64; 2]>,
    /// The share of the machines' cores busy during the training steps (0 to 1; the mean over trainers; 0: unknown).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub cpu_util: f64,
    /// Input rows pulled from other partitions per training step, over every
    /// trainer (data-parallel and HopGNN; 0: none, or a mode that does not pull rows).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub remote_rows_per_step: f64,
    /// Multi-task: each task's figures after the epoch, in `training.tasks`
    /// order (the top-level figures are the first task's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskEpoch>,
    /// The mode's own figures, each under its key (HopGNN's `hop`,
    /// full-graph's `full`, model averaging's `workers` and
    /// `averaging_bytes`, DAG sampling's `sampling`): see the mode's page.
    #[serde(flatten)]
    pub figures: BTreeMap<String, serde_json::Value>,
}

/// One task's figures of a multi-task epoch: its own loss and the metrics
/// it measures (the others absent).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskEpoch {
    /// The task, as configs spell it.
    pub task: String,
    /// Its loss's weight in the sum trained on.
    pub weight: f64,
    /// Its mean unweighted loss over the epoch's steps.
    pub loss: f64,
    /// Classification: validation accuracy (`null`: not evaluated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_acc: Option<f64>,
    /// Classification: test accuracy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_acc: Option<f64>,
    /// Regression: RMSE, MAE and R².
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression: Option<crate::task::node::RegressionEpoch>,
    /// Validation and test macro F1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macro_f1: Option<[f64; 2]>,
    /// Multi-label: validation and test micro F1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_f1: Option<[f64; 2]>,
    /// Multi-label: validation and test ROC-AUC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roc_auc: Option<[f64; 2]>,
    /// Multi-label: validation and test average precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_precision: Option<[f64; 2]>,
    /// Link prediction: validation and test ranking figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<crate::task::link::LinkEpoch>,
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

impl EpochReport {
    /// The mode's figures under `key`, read as `T` (`None`: absent or of another shape).
    pub fn figures<T: serde::de::DeserializeOwned>(&self, key: &str) -> Option<T> {
        T::deserialize(self.figures.get(key)?).ok()
    }

    /// Sets the mode's figures under `key`.
    pub fn set_figures<T: Serialize>(&mut self, key: &str, value: &T) -> Result<()> {
        let v = serde_json::to_value(value)
            .map_err(|e| TrainError::Internal(format!("figures '{key}': {e}")))?;
        self.figures.insert(key.to_string(), v);
        Ok(())
    }
}

/// Where an epoch's time went, in seconds: the same figures in a trainer's
/// account of its epoch and in the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Wall time of the training steps (evaluation excluded).
    pub seconds: f64,
    /// Neighbor sampling.
    pub sample_s: f64,
    /// Gathering input features and embedding rows.
    pub gather_s: f64,
    /// Forward and backward.
    pub compute_s: f64,
    /// Network communication (0 in a single process).
    pub comm_s: f64,
    /// Optimiser updates (dense Adam and sparse embedding Adam).
    pub update_s: f64,
    /// Evaluation on the validation and test splits.
    pub eval_s: f64,
    /// Writing checkpoints during the epoch's steps.
    #[serde(default)]
    pub checkpoint_s: f64,
    /// The training thread waiting for its next batch (from the end of one step to the start of the next).
    #[serde(default)]
    pub wait_s: f64,
}

impl Timings {
    /// The run's figures from each trainer's: the slowest trainer's wall,
    /// evaluation and checkpoint times, the mean of each phase.
    pub fn across(all: &[Timings]) -> Timings {
        let n = all.len().max(1) as f64;
        let mean = |f: fn(&Timings) -> f64| all.iter().map(f).sum::<f64>() / n;
        let max = |f: fn(&Timings) -> f64| all.iter().map(f).fold(0.0, f64::max);
        Timings {
            seconds: max(|t| t.seconds),
            sample_s: mean(|t| t.sample_s),
            gather_s: mean(|t| t.gather_s),
            compute_s: mean(|t| t.compute_s),
            comm_s: mean(|t| t.comm_s),
            update_s: mean(|t| t.update_s),
            eval_s: max(|t| t.eval_s),
            checkpoint_s: max(|t| t.checkpoint_s),
            wait_s: mean(|t| t.wait_s),
        }
    }
}

/// One failure of a distributed run and its recovery. Times are seconds since
/// the coordinator started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FailureReport {
    /// What failed, as detected.
    pub what: String,
    /// When the coordinator noticed.
    pub detected_at_s: f64,
    /// When every node was back and ready (the failed one restarted).
    pub rejoined_at_s: f64,
    /// When the first step after the rollback finished.
    pub resumed_at_s: f64,
    /// The step in progress when it failed.
    pub failed_at_step: u64,
    /// The checkpoint step rolled back to (0: the start).
    pub resumed_from_step: u64,
    /// Steps computed again.
    pub steps_redone: u64,
}

/// A whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Everything that shaped the run.
    pub config: Config,
    /// "single", "data-parallel", "raf", ...
    pub mode: String,
    /// Processes that took part.
    pub nodes: usize,
    /// Training steps taken.
    pub steps: u64,
    /// Per-epoch figures.
    pub epochs: Vec<EpochReport>,
    /// Network bytes by message kind over the whole run.
    pub bytes_by_kind: BTreeMap<String, u64>,
    /// Network messages by kind.
    pub messages_by_kind: BTreeMap<String, u64>,
    /// Requests sent again (zero in a run without faults) and probes for late replies.
    #[serde(default)]
    pub resends: runtime::Resends,
    /// Network bytes per training step by message kind (evaluation excluded).
    #[serde(default)]
    pub bytes_per_step: BTreeMap<String, f64>,
    /// Device cache figures per node type (empty without a cache).
    #[serde(default)]
    pub cache: BTreeMap<String, crate::cache::CacheTypeReport>,
    /// Failures and their recovery.
    pub failures: Vec<FailureReport>,
    /// When the coordinator started (milliseconds since the Unix epoch; the
    /// failures' times count from it). 0 when unknown.
    #[serde(default)]
    pub started_at_unix_ms: u64,
    /// The checkpoint step the run started from, when it resumed one.
    #[serde(default)]
    pub resumed_from_step: Option<u64>,
    /// Peak resident memory of the process, in bytes (the high-water mark:
    /// memory-mapped feature pages read count too).
    pub peak_memory_bytes: Option<u64>,
    /// The memory the run planned for before it started, in bytes: the
    /// estimate checked against the machine's budget, an upper bound of
    /// `peak_memory_bytes` (None: a run of an earlier version).
    #[serde(default)]
    pub memory_estimate_bytes: Option<u64>,
    /// Peak anonymous resident memory (heap and stacks, no file pages), sampled.
    #[serde(default)]
    pub peak_anon_bytes: Option<u64>,
    /// Link prediction: the target relations, the split and how it is measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<crate::task::link::LinkReport>,
    /// The edge task's relations, edges and metrics (edge tasks only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<crate::task::edge::EdgeReport>,
    /// The evaluated epoch with the best validation figure of
    /// `training.select_metric`, and its test figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<BestEpoch>,
    /// Number of dense parameters and learnable embedding values.
    pub parameters: u64,
    /// SHA-256 over every parameter and embedding value (names included).
    pub final_model_sha256: String,
}

impl Report {
    /// Writes the report as pretty JSON.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("report serialises");
        Ok(graphs::atomic::write(path, text + "\n")?)
    }

    /// Reads a report written by [`Report::write`].
    pub fn read(path: &Path) -> Result<Report> {
        let text = graphs::input::read_text(path)?;
        serde_json::from_str(&text).map_err(|e| {
            TrainError::Config(format!("{}: not a hetgnn report: {e}", path.display()))
        })
    }
}

pub use graphs::memory::peak_rss_bytes;

/// SHA-256 over parameter names and values, then embedding names and values.
pub fn model_hash(model: &Model) -> Result<String> {
    let mut h = Sha256::new();
    for (name, var) in model.params.iter() {
        h.update(name.as_bytes());
        let v: Vec<f32> = var
            .as_tensor()
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1()?;
        for x in v {
            h.update(x.to_le_bytes());
        }
    }
    for e in model.embeddings.iter().flatten() {
        h.update(e.name.as_bytes());
        for x in &e.data {
            h.update(x.to_le_bytes());
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Fills the figures that need the whole trained model: its hash, its size,
/// and the process's peak memory.
pub(crate) fn finish(report: &mut Report, model: &Model) -> Result<()> {
    report.final_model_sha256 = model_hash(model)?;
    report.parameters = (model.params.numel()
        + model
            .embeddings
            .iter()
            .flatten()
            .map(|e| e.data.len())
            .sum::<usize>()) as u64;
    report.peak_memory_bytes = peak_rss_bytes();
    report.peak_anon_bytes = graphs::memory::peak_anon_bytes();
    let t = &report.config.training;
    report.best = best(t.select_metric.resolve(t.task), &report.epochs);
    Ok(())
}

/// Choosing a report's best epoch by a validation metric.
impl SelectMetric {
    fn higher_is_better(self) -> bool {
        !matches!(self, SelectMetric::Rmse | SelectMetric::Mae)
    }

    /// The metric's validation and test figures in `e`, where it was measured.
    fn of(self, e: &EpochReport) -> Option<(f64, f64)> {
        let reg = |f: fn(&crate::task::node::ValueMetrics) -> f64| {
            e.regression.map(|r| (f(&r.valid), f(&r.test)))
        };
        match self {
            SelectMetric::Auto => None,
            SelectMetric::Accuracy => e.valid_acc.zip(e.test_acc),
            SelectMetric::MacroF1 => e.macro_f1.map(|[v, t]| (v, t)),
            SelectMetric::RocAuc => e.roc_auc.map(|[v, t]| (v, t)),
            SelectMetric::MicroF1 => e.micro_f1.map(|[v, t]| (v, t)),
            SelectMetric::AveragePrecision => e.average_precision.map(|[v, t]| (v, t)),
            SelectMetric::Rmse => reg(|m| m.rmse),
            SelectMetric::Mae => reg(|m| m.mae),
            SelectMetric::R2 => reg(|m| m.r2),
            SelectMetric::Mrr => e.link.map(|l| (l.valid.mrr, l.test.mrr)),
        }
    }
}

/// The best epoch of a run, in its report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BestEpoch {
    /// The epoch.
    pub epoch: u64,
    /// The metric that chose it.
    pub metric: String,
    /// Its validation figure.
    pub valid: f64,
    /// Its test figure.
    pub test: f64,
}

/// The evaluated epoch of `epochs` whose validation `metric` is best (the
/// earliest among equals); `None` where no epoch measured it.
pub fn best(metric: SelectMetric, epochs: &[EpochReport]) -> Option<BestEpoch> {
    let mut out: Option<BestEpoch> = None;
    for e in epochs {
        let Some((valid, test)) = metric.of(e) else {
            continue;
        };
        if !valid.is_finite() {
            continue;
        }
        let better = out
            .as_ref()
            .is_none_or(|b| match metric.higher_is_better() {
                true => valid > b.valid,
                false => valid < b.valid,
            });
        if better {
            out = Some(BestEpoch {
                epoch: e.epoch,
                metric: metric.name().to_string(),
                valid,
                test,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modes_figures_travel_beside_the_shared_ones() {
        let mut e = EpochReport {
            epoch: 2,
            loss: 0.5,
            time: Timings {
                seconds: 1.5,
                wait_s: 0.25,
                ..Timings::default()
            },
            ..EpochReport::default()
        };
        e.set_figures("hop", &BTreeMap::from([("time_steps", 3u32)]))
            .unwrap();
        let text = serde_json::to_string(&e).unwrap();
        // Flat in the JSON, as the report documents them.
        assert!(text.contains("\"seconds\":1.5") && text.contains("\"hop\":{\"time_steps\":3}"));
        let back: EpochReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.figures.len(), 1, "the timings stay timings");
        let got: BTreeMap<String, u32> = back.figures("hop").unwrap();
        assert_eq!(got["time_steps"], 3);
        assert!(
            back.figures::<u64>("hop").is_none(),
            "another shape is none"
        );
    }
}

#[cfg(test)]
mod best_tests {
    use super::*;
    use crate::config::{SelectMetric, Task};
    use crate::task::node::{RegressionEpoch, ValueMetrics};

    fn acc(epoch: u64, v: f64, t: f64) -> EpochReport {
        EpochReport {
            epoch,
            valid_acc: Some(v),
            test_acc: Some(t),
            ..EpochReport::default()
        }
    }

    #[test]
    fn the_best_validation_figure_wins_and_ties_keep_the_earliest() {
        let e = [
            acc(0, 0.5, 0.4),
            acc(1, 0.7, 0.6),
            acc(2, 0.7, 0.9),
            acc(3, 0.6, 0.8),
        ];
        let b = best(SelectMetric::Accuracy, &e).unwrap();
        assert_eq!((b.epoch, b.valid, b.test), (1, 0.7, 0.6));
        // Unevaluated epochs are skipped; a metric nobody measured gives none.
        let mut skipped = e.to_vec();
        skipped[1].valid_acc = None;
        assert_eq!(best(SelectMetric::Accuracy, &skipped).unwrap().epoch, 2);
        assert!(best(SelectMetric::MacroF1, &e).is_none());
    }

    #[test]
    fn errors_are_minimised() {
        let r = |epoch, rmse| EpochReport {
            epoch,
            regression: Some(RegressionEpoch {
                valid: ValueMetrics {
                    rmse,
                    mae: 0.0,
                    r2: 0.0,
                },
                test: ValueMetrics {
                    rmse: rmse + 1.0,
                    mae: 0.0,
                    r2: 0.0,
                },
            }),
            ..EpochReport::default()
        };
        let b = best(SelectMetric::Rmse, &[r(0, 0.9), r(1, 0.5), r(2, 0.7)]).unwrap();
        assert_eq!((b.epoch, b.test), (1, 1.5));
        assert_eq!(b.metric, "rmse");
    }

    #[test]
    fn auto_follows_the_task_and_foreign_metrics_are_refused() {
        assert_eq!(
            SelectMetric::Auto.resolve(Task::NodeRegression),
            SelectMetric::Rmse
        );
        assert_eq!(
            SelectMetric::Auto.resolve(Task::LinkPrediction),
            SelectMetric::Mrr
        );
        assert!(SelectMetric::Auto.check(Task::EdgeRegression).is_ok());
        let err = SelectMetric::Rmse
            .check(Task::NodeClassification)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("select_metric") && err.contains("node-classification"),
            "{err}"
        );
        assert!(SelectMetric::RocAuc.check(Task::EdgeClassification).is_ok());
        assert!(SelectMetric::RocAuc
            .check(Task::NodeClassification)
            .is_err());
    }
}
