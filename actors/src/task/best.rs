//! The run's best epoch: the evaluated epoch whose validation figure of a
//! chosen metric is best (`training.select_metric`), with its test figure,
//! which is what a run reports when its last epoch is not its best.

use serde::{Deserialize, Serialize};

use crate::config::Task;
use crate::report::EpochReport;

/// The validation metric that picks the best epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectMetric {
    /// The task's own: accuracy for classification, micro F1 for multi-label,
    /// RMSE for regression, MRR for links.
    #[default]
    Auto,
    /// Share of correct classes (higher is better).
    Accuracy,
    /// Mean per-class F1 (higher is better).
    MacroF1,
    /// Area under the ROC curve, binary edge classification and multi-label (higher is better).
    RocAuc,
    /// F1 of every label's counts pooled, multi-label (higher is better).
    MicroF1,
    /// Average precision, binary edge classification and multi-label (higher is better).
    AveragePrecision,
    /// Root mean squared error (lower is better).
    Rmse,
    /// Mean absolute error (lower is better).
    Mae,
    /// Coefficient of determination (higher is better).
    R2,
    /// Mean reciprocal rank, link prediction (higher is better).
    Mrr,
}

impl SelectMetric {
    /// The metric's name, as configs spell it.
    pub fn name(self) -> &'static str {
        match self {
            SelectMetric::Auto => "auto",
            SelectMetric::Accuracy => "accuracy",
            SelectMetric::MacroF1 => "macro-f1",
            SelectMetric::RocAuc => "roc-auc",
            SelectMetric::MicroF1 => "micro-f1",
            SelectMetric::AveragePrecision => "average-precision",
            SelectMetric::Rmse => "rmse",
            SelectMetric::Mae => "mae",
            SelectMetric::R2 => "r2",
            SelectMetric::Mrr => "mrr",
        }
    }

    /// `Auto` made concrete for `task`.
    pub fn resolve(self, task: Task) -> SelectMetric {
        match (self, task) {
            (SelectMetric::Auto, Task::NodeClassification | Task::EdgeClassification) => {
                SelectMetric::Accuracy
            }
            (SelectMetric::Auto, Task::NodeRegression | Task::EdgeRegression) => SelectMetric::Rmse,
            (SelectMetric::Auto, Task::LinkPrediction) => SelectMetric::Mrr,
            (SelectMetric::Auto, Task::MultiLabel) => SelectMetric::MicroF1,
            (m, _) => m,
        }
    }

    /// Refuses a metric `task` does not measure.
    pub fn check(self, task: Task) -> crate::error::Result<()> {
        let ok = match self.resolve(task) {
            SelectMetric::Auto => true,
            SelectMetric::Accuracy | SelectMetric::MacroF1 => matches!(
                task,
                Task::NodeClassification | Task::EdgeClassification | Task::MultiLabel
            ),
            SelectMetric::RocAuc | SelectMetric::AveragePrecision => {
                matches!(task, Task::EdgeClassification | Task::MultiLabel)
            }
            SelectMetric::MicroF1 => task == Task::MultiLabel,
            SelectMetric::Rmse | SelectMetric::Mae | SelectMetric::R2 => {
                matches!(task, Task::NodeRegression | Task::EdgeRegression)
            }
            SelectMetric::Mrr => task == Task::LinkPrediction,
        };
        match ok {
            true => Ok(()),
            false => Err(crate::error::TrainError::Config(format!(
                "training.select_metric = \"{}\" is not measured by training.task = \"{}\"",
                self.name(),
                task.name()
            ))),
        }
    }

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
