//! Node tasks: a class or a value per target node. Each has its loss on a
//! batch of the model's outputs, its training figure and the sums an
//! evaluation adds up (summed over trainers, then turned into metrics).

use candle_core::{DType, Tensor};
use graphs::HetGraph;
use serde::{Deserialize, Serialize};

use crate::config::{Task, TrainingConfig};
use crate::error::{Result, TrainError};

/// Node regression's loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RegressionLoss {
    /// Mean squared error (the default).
    #[default]
    Mse,
    /// Huber: squared below `huber_delta`, linear above (robust to outliers).
    Huber,
}

/// What a node-level run trains on, read from its graph.
#[derive(Clone, Copy, Debug)]
pub enum NodeTask<'g> {
    /// A class per node, from the target type's labels.
    Classes {
        /// The labels (-1: none).
        labels: &'g [i64],
    },
    /// A value per node, from the target type's `values.npy`.
    Values {
        /// The values (NaN: none).
        values: &'g [f32],
        /// The loss.
        loss: RegressionLoss,
        /// Huber's threshold.
        delta: f64,
    },
}

impl<'g> NodeTask<'g> {
    /// The node task `t` trains on `g` (regression when `t.task` says so,
    /// else classification).
    pub fn of(t: &TrainingConfig, g: &'g HetGraph) -> Result<NodeTask<'g>> {
        if t.task != Task::NodeRegression {
            return Ok(NodeTask::Classes {
                labels: g.target_labels().0,
            });
        }
        let values = g.target_values().ok_or_else(|| no_values(g))?;
        Ok(NodeTask::Values {
            values,
            loss: t.regression_loss,
            delta: t.huber_delta,
        })
    }

    /// The mean loss of the model's outputs `out` (`[seeds, outputs]`) on `seeds`.
    pub fn loss(&self, out: &Tensor, seeds: &[u32]) -> Result<Tensor> {
        let device = out.device();
        Ok(match *self {
            NodeTask::Classes { labels } => {
                let y: Vec<u32> = seeds.iter().map(|&s| labels[s as usize] as u32).collect();
                candle_nn::loss::cross_entropy(out, &Tensor::from_vec(y, seeds.len(), device)?)?
            }
            NodeTask::Values {
                values,
                loss,
                delta,
            } => {
                let y: Vec<f32> = seeds.iter().map(|&s| values[s as usize]).collect();
                let y = Tensor::from_vec(y, seeds.len(), device)?.to_dtype(out.dtype())?;
                let d = (out.squeeze(1)? - y)?;
                match loss {
                    RegressionLoss::Mse => d.sqr()?.mean_all()?,
                    RegressionLoss::Huber => {
                        // 0.5·q² + δ·(|d| − q) with q = min(|d|, δ).
                        let a = d.abs()?;
                        let q = a.le(delta)?.where_cond(&a, &a.ones_like()?.affine(delta, 0.0)?)?;
                        ((q.sqr()? * 0.5)? + ((a - &q)? * delta)?)?.mean_all()?
                    }
                }
            }
        })
    }

    /// Correct predictions among `seeds` (0 for regression).
    pub fn correct(&self, out: &Tensor, seeds: &[u32]) -> Result<u64> {
        match *self {
            NodeTask::Classes { labels } => crate::epoch::count_correct(out, labels, seeds),
            NodeTask::Values { .. } => Ok(0),
        }
    }

    /// Adds the evaluation figures of `out` on `seeds` to `s`.
    pub fn score(&self, out: &Tensor, seeds: &[u32], s: &mut Scores) -> Result<()> {
        match *self {
            NodeTask::Classes { labels } => {
                s.correct += crate::epoch::count_correct(out, labels, seeds)?
            }
            NodeTask::Values { values, .. } => {
                let pred: Vec<f32> = out.squeeze(1)?.to_dtype(DType::F32)?.to_vec1()?;
                for (p, &n) in pred.iter().zip(seeds) {
                    s.values.add(f64::from(*p), f64::from(values[n as usize]));
                }
            }
        }
        Ok(())
    }
}

fn no_values(g: &HetGraph) -> TrainError {
    let t = &g.node_type(g.target()).name;
    TrainError::Config(format!(
        "training.task = \"node-regression\" needs regression targets: this graph has no nodes/{t}/values.npy (\"values\": true in schema.json); see docs/guide/format.md"
    ))
}

/// What an evaluation adds up over nodes, whatever the task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// Correct classes.
    pub correct: u64,
    /// Regression sums.
    pub values: ValueSums,
}

/// Sums over evaluated nodes from which regression metrics follow; they add
/// across batches and trainers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ValueSums {
    /// Nodes.
    pub n: u64,
    /// Σ (prediction − value)².
    pub sse: f64,
    /// Σ |prediction − value|.
    pub sae: f64,
    /// Σ value.
    pub sy: f64,
    /// Σ value².
    pub syy: f64,
}

impl ValueSums {
    /// Adds one node's prediction and true value.
    pub fn add(&mut self, pred: f64, value: f64) {
        let e = pred - value;
        self.n += 1;
        self.sse += e * e;
        self.sae += e.abs();
        self.sy += value;
        self.syy += value * value;
    }

    /// Adds another set of sums.
    pub fn merge(&mut self, o: &ValueSums) {
        self.n += o.n;
        self.sse += o.sse;
        self.sae += o.sae;
        self.sy += o.sy;
        self.syy += o.syy;
    }

    /// RMSE, MAE and R² (0 for no nodes; R² 0 when every value is the same).
    pub fn metrics(&self) -> ValueMetrics {
        if self.n == 0 {
            return ValueMetrics::default();
        }
        let n = self.n as f64;
        let sst = self.syy - self.sy * self.sy / n;
        ValueMetrics {
            rmse: (self.sse / n).sqrt(),
            mae: self.sae / n,
            r2: if sst > 0.0 { 1.0 - self.sse / sst } else { 0.0 },
        }
    }
}

/// Regression metrics on one split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ValueMetrics {
    /// Root mean squared error.
    pub rmse: f64,
    /// Mean absolute error.
    pub mae: f64,
    /// Coefficient of determination (1: perfect; 0: no better than the mean).
    pub r2: f64,
}

/// An epoch's regression figures, in the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RegressionEpoch {
    /// On the validation nodes.
    pub valid: ValueMetrics,
    /// On the test nodes.
    pub test: ValueMetrics,
}

impl RegressionEpoch {
    /// The figures of summed validation and test sums.
    pub fn of(sums: &[ValueSums; 2]) -> RegressionEpoch {
        RegressionEpoch {
            valid: sums[0].metrics(),
            test: sums[1].metrics(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * (1.0 + b.abs())
    }

    #[test]
    fn metrics_match_their_definitions_and_sums_merge() {
        let (pred, y) = ([1.0, 2.0, 4.0, -1.0], [1.5, 2.0, 3.0, 0.0]);
        let mut all = ValueSums::default();
        let (mut a, mut b) = (ValueSums::default(), ValueSums::default());
        for (i, (&p, &v)) in pred.iter().zip(&y).enumerate() {
            all.add(p, v);
            if i < 2 { &mut a } else { &mut b }.add(p, v);
        }
        a.merge(&b);
        assert_eq!(a.n, all.n);
        let m = all.metrics();
        let mean = y.iter().sum::<f64>() / 4.0;
        let sse: f64 = pred.iter().zip(&y).map(|(p, v)| (p - v) * (p - v)).sum();
        let sst: f64 = y.iter().map(|v| (v - mean) * (v - mean)).sum();
        assert!(close(m.rmse, (sse / 4.0).sqrt()), "{m:?}");
        assert!(close(m.mae, (0.5 + 0.0 + 1.0 + 1.0) / 4.0), "{m:?}");
        assert!(close(m.r2, 1.0 - sse / sst), "{m:?}");
        assert!(close(a.metrics().r2, m.r2));
        assert_eq!(ValueSums::default().metrics(), ValueMetrics::default());
        // Every value the same: R² is 0, not a division by zero.
        let mut flat = ValueSums::default();
        flat.add(1.0, 2.0);
        flat.add(3.0, 2.0);
        assert_eq!(flat.metrics().r2, 0.0);
    }

    #[test]
    fn losses_are_mse_and_huber() {
        let values = [0.0f32, 1.0, 10.0];
        let out = Tensor::new(&[[0.5f32], [1.0], [0.0]], &Device::Cpu).unwrap();
        let seeds = [0u32, 1, 2];
        let loss = |loss, delta| {
            NodeTask::Values {
                values: &values,
                loss,
                delta,
            }
            .loss(&out, &seeds)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64
        };
        assert!(close(loss(RegressionLoss::Mse, 1.0), (0.25 + 0.0 + 100.0) / 3.0));
        // |d| = 0.5 (quadratic), 0, 10 (linear: 2·(10 − 1) + 0.5·2²).
        let want = (0.5 * 0.25 + 0.0 + (0.5 * 4.0 + 2.0 * 8.0)) / 3.0;
        assert!((loss(RegressionLoss::Huber, 2.0) - want).abs() < 1e-5);
        let mut s = Scores::default();
        NodeTask::Values {
            values: &values,
            loss: RegressionLoss::Mse,
            delta: 1.0,
        }
        .score(&out, &seeds, &mut s)
        .unwrap();
        assert_eq!(s.values.n, 3);
        assert!(close(s.values.sse, 100.25));
    }
}
