//! Node tasks: a class or a value per target node. Each has its loss on a
//! batch of the model's outputs, its training figure and the sums an
//! evaluation adds up (summed over trainers, then turned into metrics).

use candle_core::{DType, Tensor};
use graphs::HetGraph;
use serde::{Deserialize, Serialize};

use crate::config::{ClassWeights, RegressionLoss, Task, TrainingConfig};
use crate::error::{Result, TrainError};
use graphs::label_sets::LabelSets;

/// Most (probability, label) pairs an evaluation keeps per split for
/// average precision and ROC-AUC, the bound the pairs travel under (5 bytes
/// each on the wire): beyond it, they are not measured.
pub const MAX_RANKED: usize = 1 << 20;

/// Correct predictions (the arg-max of `logits`) among `seeds`.
pub fn count_correct(logits: &candle_core::Tensor, labels: &[i64], seeds: &[u32]) -> Result<u64> {
    let pred: Vec<u32> = logits.argmax(1)?.to_vec1()?;
    Ok(pred
        .iter()
        .zip(seeds)
        .filter(|(p, s)| i64::from(**p) == labels[**s as usize])
        .count() as u64)
}

impl ClassWeights {
    /// Checks the setting against nothing but itself (the class count is the graph's).
    pub fn check(&self) -> Result<()> {
        match self {
            ClassWeights::Named(n) if n == "none" || n == "balanced" => Ok(()),
            ClassWeights::Named(n) => Err(TrainError::Config(format!(
                "training.class_weights: '{n}' is neither \"none\", \"balanced\" nor a list of weights"
            ))),
            ClassWeights::List(w) if w.iter().all(|x| x.is_finite() && *x >= 0.0) && w.iter().any(|x| *x > 0.0) => Ok(()),
            ClassWeights::List(_) => Err(TrainError::Config(
                "training.class_weights: weights must be finite, non-negative and not all 0".into(),
            )),
        }
    }

    /// Each label's weight on its positive term (`None`: all 1): "balanced"
    /// gives a label `negatives / positives` among the training nodes.
    fn resolve_labels(&self, g: &HetGraph, sets: &LabelSets) -> Result<Option<Vec<f32>>> {
        let k = sets.width();
        match self {
            ClassWeights::Named(n) if n == "balanced" => {
                let (_, splits) = g.target_labels();
                let mut pos = vec![0u64; k];
                let mut known = 0u64;
                for &n in &splits.train {
                    if sets.known(n as usize) {
                        known += 1;
                        for (c, &b) in pos.iter_mut().zip(sets.row(n as usize)) {
                            *c += u64::from(b == 1);
                        }
                    }
                }
                Ok(Some(
                    pos.iter()
                        .map(|&p| ((known - p) as f64 / p.max(1) as f64) as f32)
                        .collect(),
                ))
            }
            ClassWeights::Named(_) => Ok(None),
            ClassWeights::List(w) => {
                listed(w, k, "the graph's label sets have", "labels").map(Some)
            }
        }
    }

    /// The weight of each of `g`'s classes (`None`: all 1).
    fn resolve(&self, g: &HetGraph) -> Result<Option<Vec<f32>>> {
        let k = g.num_classes() as usize;
        match self {
            ClassWeights::Named(n) if n == "balanced" => {
                let (labels, splits) = g.target_labels();
                let mut count = vec![0u64; k];
                for &n in &splits.train {
                    if let Some(c) = count.get_mut(labels[n as usize].max(0) as usize) {
                        *c += 1;
                    }
                }
                let n = splits.train.len() as f64;
                Ok(Some(
                    count
                        .iter()
                        .map(|&c| (n / (k as f64 * c.max(1) as f64)) as f32)
                        .collect(),
                ))
            }
            ClassWeights::Named(_) => Ok(None),
            ClassWeights::List(w) => listed(w, k, "the graph has", "classes").map(Some),
        }
    }
}

/// A listed weight per class (or label), as f32; refused unless there are `k`.
fn listed(w: &[f64], k: usize, has: &str, what: &str) -> Result<Vec<f32>> {
    match w.len() == k {
        true => Ok(w.iter().map(|&x| x as f32).collect()),
        false => Err(TrainError::Config(format!(
            "training.class_weights lists {} weights but {has} {k} {what}",
            w.len()
        ))),
    }
}

/// What a node-level run trains on, read from its graph.
#[derive(Clone, Debug)]
pub enum NodeTask<'g> {
    /// A class per node, from the target type's labels.
    Classes {
        /// The labels (-1: none).
        labels: &'g [i64],
        /// Each class's weight in the loss (`None`: all 1).
        weights: Option<Vec<f32>>,
        /// The focal loss's γ (0: cross-entropy).
        gamma: f64,
    },
    /// A set of labels per node, from the target type's `label_sets.npy`.
    Labels {
        /// The label sets.
        sets: &'g LabelSets,
        /// Each label's weight on its positive term (`None`: all 1).
        weights: Option<Vec<f32>>,
        /// The focal loss's γ (0: binary cross-entropy).
        gamma: f64,
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
        NodeTask::for_task(t.task, t, g)
    }

    /// Node task `task` on `g`, with the settings of `t` (classification
    /// for a task not on nodes).
    pub fn for_task(task: Task, t: &TrainingConfig, g: &'g HetGraph) -> Result<NodeTask<'g>> {
        if task == Task::MultiLabel {
            let sets = g.target_label_sets().ok_or_else(|| no_label_sets(g))?;
            return Ok(NodeTask::Labels {
                sets,
                weights: t.class_weights.resolve_labels(g, sets)?,
                gamma: t.focal_gamma,
            });
        }
        if task != Task::NodeRegression {
            return Ok(NodeTask::Classes {
                labels: g.target_labels().0,
                weights: t.class_weights.resolve(g)?,
                gamma: t.focal_gamma,
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
        Ok(match self {
            NodeTask::Classes {
                labels,
                weights: None,
                gamma,
            } if *gamma == 0.0 => {
                let y: Vec<u32> = seeds.iter().map(|&s| labels[s as usize] as u32).collect();
                candle_nn::loss::cross_entropy(out, &Tensor::from_vec(y, seeds.len(), device)?)?
            }
            NodeTask::Classes {
                labels,
                weights,
                gamma,
            } => {
                // −w_y · (1 − p_y)^γ · log p_y per node, summed and divided by
                // the node count (not the weights' sum), so that trainers'
                // shares add up to the single process's loss.
                let y: Vec<u32> = seeds.iter().map(|&s| labels[s as usize] as u32).collect();
                let w: Vec<f32> = y
                    .iter()
                    .map(|&c| weights.as_ref().map_or(1.0, |w| w[c as usize]))
                    .collect();
                let y = Tensor::from_vec(y, (seeds.len(), 1), device)?;
                let logp = candle_nn::ops::log_softmax(out, 1)?
                    .gather(&y, 1)?
                    .squeeze(1)?;
                let mut per = logp.neg()?;
                if *gamma > 0.0 {
                    let rest = (logp.exp()?.neg()? + 1.0)?.relu()?;
                    per = (per * rest.powf(*gamma)?)?;
                }
                let w = Tensor::from_vec(w, seeds.len(), device)?.to_dtype(out.dtype())?;
                ((per * w)?.sum_all()? / seeds.len().max(1) as f64)?
            }
            NodeTask::Labels {
                sets,
                weights,
                gamma,
            } => label_loss(out, &label_rows(sets, seeds), weights.as_deref(), *gamma)?,
            NodeTask::Values {
                values,
                loss,
                delta,
            } => {
                let y: Vec<f32> = seeds.iter().map(|&s| values[s as usize]).collect();
                let y = Tensor::from_vec(y, seeds.len(), device)?.to_dtype(out.dtype())?;
                regression_loss(&out.squeeze(1)?, &y, *loss, *delta)?
            }
        })
    }

    /// Whether node `n` has what the task learns (a label, or a value).
    pub fn knows(&self, n: u32) -> bool {
        match self {
            NodeTask::Classes { labels, .. } => labels[n as usize] >= 0,
            NodeTask::Labels { sets, .. } => sets.known(n as usize),
            NodeTask::Values { values, .. } => !values[n as usize].is_nan(),
        }
    }

    /// What the task learns and its file, for messages: `("label (-1", "labels")`.
    pub fn target_file(&self) -> (&'static str, &'static str) {
        match self {
            NodeTask::Classes { .. } => ("label (-1", "labels"),
            NodeTask::Labels { .. } => ("label set (a row of -1", "label_sets"),
            NodeTask::Values { .. } => ("value (NaN", "values"),
        }
    }

    /// Correct predictions among `seeds` (multi-label: nodes whose every
    /// label is right; 0 for regression).
    pub fn correct(&self, out: &Tensor, seeds: &[u32]) -> Result<u64> {
        match self {
            NodeTask::Classes { labels, .. } => count_correct(out, labels, seeds),
            NodeTask::Labels { sets, .. } => {
                let pred = predicted_sets(out)?;
                Ok(seeds
                    .iter()
                    .enumerate()
                    .filter(|&(i, &n)| row_matches(&pred, i, sets.row(n as usize)))
                    .count() as u64)
            }
            NodeTask::Values { .. } => Ok(0),
        }
    }

    /// Adds the evaluation figures of `out` on `seeds` to `s`.
    pub fn score(&self, out: &Tensor, seeds: &[u32], s: &mut Scores) -> Result<()> {
        match self {
            NodeTask::Classes { labels, .. } => {
                let pred: Vec<u32> = out.argmax(1)?.to_vec1()?;
                let k = out.dim(1)?;
                for (&p, &n) in pred.iter().zip(seeds) {
                    let y = labels[n as usize];
                    s.correct += u64::from(i64::from(p) == y);
                    if k <= MAX_F1_CLASSES {
                        s.classes.add(k, p as usize, y as usize);
                    }
                }
            }
            NodeTask::Labels { sets, .. } => {
                let (w, pred) = (sets.width(), predicted_sets(out)?);
                let prob: Vec<f32> = candle_nn::ops::sigmoid(out)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1()?;
                // Past the bound the pairs are given up for the whole split.
                s.ranked_dropped |= s.ranked.len() + seeds.len() * w > MAX_RANKED;
                if s.ranked_dropped {
                    s.ranked = Vec::new();
                }
                for (i, &n) in seeds.iter().enumerate() {
                    let y = sets.row(n as usize);
                    s.correct += u64::from(row_matches(&pred, i, y));
                    for (j, &b) in y.iter().enumerate() {
                        s.labels
                            .add_label(w, j, pred.get(i * w + j) == Some(&1), b == 1);
                        if !s.ranked_dropped {
                            s.ranked.push((prob[i * w + j], b == 1));
                        }
                    }
                }
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

/// The 0/1 label rows of `seeds`, as a `[seeds × width]` f32 vector.
fn label_rows(sets: &LabelSets, seeds: &[u32]) -> Vec<f32> {
    seeds
        .iter()
        .flat_map(|&n| sets.row(n as usize).iter().map(|&b| f32::from(b.max(0))))
        .collect()
}

/// Each output's yes (logit above 0) or no, row after row.
fn predicted_sets(out: &Tensor) -> Result<Vec<u8>> {
    Ok(out.gt(0.0)?.flatten_all()?.to_vec1()?)
}

/// Whether row `i` of the predictions `pred` equals the label row `y`.
fn row_matches(pred: &[u8], i: usize, y: &[i8]) -> bool {
    let w = y.len();
    pred.get(i * w..(i + 1) * w)
        .is_some_and(|p| p.iter().zip(y).all(|(&p, &b)| i8::from(p == 1) == b))
}

/// The binary cross-entropy of logits `out` (`[n, L]`) against the 0/1
/// targets `y` (n·L, row after row), summed over a node's labels and
/// averaged over nodes: each label's positive term weighed by `weights`, and
/// with `gamma` > 0 each entry by `(1 − p_t)^γ` (focal loss), where `p_t` is
/// the probability of its target. Summed rather than averaged over labels,
/// so that gradients keep their size whatever the label count (averaged,
/// they are L times smaller and Adam turns the summation order's last bits
/// into visible steps: data-parallel training would drift from single-process).
pub(crate) fn label_loss(
    out: &Tensor,
    y: &[f32],
    weights: Option<&[f32]>,
    gamma: f64,
) -> Result<Tensor> {
    let (n, w) = out.dims2()?;
    let dev = out.device();
    let y = Tensor::from_slice(y, (n, w), dev)?.to_dtype(out.dtype())?;
    // log σ(x) = −softplus(−x), log(1 − σ(x)) = −softplus(x), with
    // softplus(x) = max(x, 0) + log(1 + e^−|x|), which never overflows.
    let soft = (out.abs()?.neg()?.exp()? + 1.0)?.log()?;
    let sp_pos = (out.relu()? + &soft)?; // softplus(x) = −log(1 − σ(x))
    let sp_neg = (out.neg()?.relu()? + &soft)?; // softplus(−x) = −log σ(x)
    let mut pos = (&y * &sp_neg)?;
    if let Some(wts) = weights {
        let wts = Tensor::from_slice(wts, (1, w), dev)?.to_dtype(out.dtype())?;
        pos = pos.broadcast_mul(&wts)?;
    }
    let neg = ((y.ones_like()? - &y)? * &sp_pos)?;
    let mut per = (pos + neg)?;
    if gamma > 0.0 {
        // p_t = σ(x) for a positive, 1 − σ(x) for a negative: e^(−its softplus).
        let p_t = ((&y * &sp_neg)? + ((y.ones_like()? - &y)? * &sp_pos)?)?
            .neg()?
            .exp()?;
        per = (per * (p_t.neg()? + 1.0)?.relu()?.powf(gamma)?)?;
    }
    Ok((per.sum_all()? / n.max(1) as f64)?)
}

/// The mean `loss` of predictions `pred` against targets `y` (both `[n]`).
pub(crate) fn regression_loss(
    pred: &Tensor,
    y: &Tensor,
    loss: RegressionLoss,
    delta: f64,
) -> Result<Tensor> {
    let d = (pred - y)?;
    Ok(match loss {
        RegressionLoss::Mse => d.sqr()?.mean_all()?,
        RegressionLoss::Huber => {
            // 0.5·q² + δ·(|d| − q) with q = min(|d|, δ).
            let a = d.abs()?;
            let q = a
                .le(delta)?
                .where_cond(&a, &a.ones_like()?.affine(delta, 0.0)?)?;
            ((q.sqr()? * 0.5)? + ((a - &q)? * delta)?)?.mean_all()?
        }
    })
}

fn no_label_sets(g: &HetGraph) -> TrainError {
    let t = &g.node_type(g.target()).name;
    TrainError::Config(format!(
        "training.task = \"multi-label\" needs label sets: this graph has no nodes/{t}/label_sets.npy (\"label_sets\": L in schema.json); see docs/guide/format.md"
    ))
}

fn no_values(g: &HetGraph) -> TrainError {
    let t = &g.node_type(g.target()).name;
    TrainError::Config(format!(
        "training.task = \"node-regression\" needs regression targets: this graph has no nodes/{t}/values.npy (\"values\": true in schema.json); see docs/guide/format.md"
    ))
}

/// Most classes for which per-class counts (macro F1) are kept: beyond it,
/// they would outweigh the rest of a trainer's epoch account.
pub const MAX_F1_CLASSES: usize = 4096;

/// What an evaluation adds up over nodes, whatever the task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// Correct classes.
    pub correct: u64,
    /// Per-class counts (classification with at most [`MAX_F1_CLASSES`] classes).
    pub classes: ClassCounts,
    /// Regression sums.
    pub values: ValueSums,
    /// Multi-label: true positives, false positives and false negatives per label.
    pub labels: ClassCounts,
    /// Multi-label: every (probability, has the label) pair, for average
    /// precision and ROC-AUC (empty once there would be more than [`MAX_RANKED`]).
    pub ranked: Vec<(f32, bool)>,
    /// Whether `ranked` was given up for its size.
    pub ranked_dropped: bool,
    /// Nodes scored (multi-task: those that have the task's target).
    #[serde(default)]
    pub scored: u64,
}

/// True positives, false positives and false negatives per class: they add
/// across batches and trainers, and give the macro F1.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassCounts(pub Vec<[u64; 3]>);

impl ClassCounts {
    /// Counts one node of true class `y` predicted as `p`, out of `k` classes.
    pub fn add(&mut self, k: usize, p: usize, y: usize) {
        if self.0.len() < k {
            self.0.resize(k, [0; 3]);
        }
        if p == y {
            self.0[y][0] += 1;
        } else {
            self.0[p][1] += 1;
            if let Some(c) = self.0.get_mut(y) {
                c[2] += 1;
            }
        }
    }

    /// Counts label `j` of one node (of `k` labels), predicted `p`, true `y`.
    pub fn add_label(&mut self, k: usize, j: usize, p: bool, y: bool) {
        if self.0.len() < k {
            self.0.resize(k, [0; 3]);
        }
        let c = &mut self.0[j];
        match (p, y) {
            (true, true) => c[0] += 1,
            (true, false) => c[1] += 1,
            (false, true) => c[2] += 1,
            (false, false) => {}
        }
    }

    /// The F1 of every count pooled (micro F1); `None` when nothing was counted.
    pub fn micro_f1(&self) -> Option<f64> {
        let [tp, fp, fn_] = self
            .0
            .iter()
            .fold([0u64; 3], |a, c| [a[0] + c[0], a[1] + c[1], a[2] + c[2]]);
        (tp + fp + fn_ > 0).then(|| 2.0 * tp as f64 / (2 * tp + fp + fn_) as f64)
    }

    /// Adds another set of counts.
    pub fn merge(&mut self, o: &ClassCounts) {
        if self.0.len() < o.0.len() {
            self.0.resize(o.0.len(), [0; 3]);
        }
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            for i in 0..3 {
                a[i] += b[i];
            }
        }
    }

    /// The mean F1 over the classes that are true or predicted at least once
    /// (as scikit-learn's default); `None` when nothing was counted.
    pub fn macro_f1(&self) -> Option<f64> {
        let f1: Vec<f64> = self
            .0
            .iter()
            .filter(|[tp, fp, fn_]| tp + fp + fn_ > 0)
            .map(|[tp, fp, fn_]| 2.0 * *tp as f64 / (2 * tp + fp + fn_) as f64)
            .collect();
        (!f1.is_empty()).then(|| f1.iter().sum::<f64>() / f1.len() as f64)
    }
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
    fn macro_f1_is_the_mean_of_per_class_f1() {
        // (pred, true): class 0 has tp 2, fp 1, fn 0; class 1 tp 1, fp 0, fn 1; class 2 fp 0, fn 0... absent.
        let mut a = ClassCounts::default();
        let mut b = ClassCounts::default();
        for (i, (p, y)) in [(0, 0), (0, 0), (0, 1), (1, 1)].into_iter().enumerate() {
            if i < 2 { &mut a } else { &mut b }.add(3, p, y);
        }
        a.merge(&b);
        let f1_0 = 2.0 * 2.0 / (4.0 + 1.0);
        let f1_1 = 2.0 * 1.0 / (2.0 + 1.0);
        assert!((a.macro_f1().unwrap() - (f1_0 + f1_1) / 2.0).abs() < 1e-12);
        assert_eq!(ClassCounts::default().macro_f1(), None);
        // Scored from logits: the arg-max is the prediction.
        let out = Tensor::new(&[[2.0f32, 0.0], [0.0, 1.0], [3.0, 0.0]], &Device::Cpu).unwrap();
        let labels = [0i64, 1, 1];
        let mut s = Scores::default();
        NodeTask::Classes {
            labels: &labels,
            weights: None,
            gamma: 0.0,
        }
        .score(&out, &[0, 1, 2], &mut s)
        .unwrap();
        assert_eq!(s.correct, 2);
        assert_eq!(s.classes.0, vec![[1, 1, 0], [1, 0, 1]]);
    }

    #[test]
    fn weighted_focal_loss_is_its_formula() {
        let logits = [[2.0f32, 0.0, -1.0], [0.5, 0.5, 0.0]];
        let out = Tensor::new(&logits, &Device::Cpu).unwrap();
        let labels = [0i64, 2];
        let (weights, gamma) = (vec![0.5f32, 1.0, 3.0], 2.0);
        let task = NodeTask::Classes {
            labels: &labels,
            weights: Some(weights.clone()),
            gamma,
        };
        let got = task
            .loss(&out, &[0, 1])
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64;
        let want: f64 = logits
            .iter()
            .zip(labels)
            .map(|(row, y)| {
                let z: f64 = row.iter().map(|&x| f64::from(x).exp()).sum();
                let p = f64::from(row[y as usize]).exp() / z;
                -f64::from(weights[y as usize]) * (1.0 - p).powf(gamma) * p.ln()
            })
            .sum::<f64>()
            / 2.0;
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        // No weights and γ = 0: plain cross-entropy.
        let plain = NodeTask::Classes {
            labels: &labels,
            weights: None,
            gamma: 0.0,
        };
        let ce = plain
            .loss(&out, &[0, 1])
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let ones = NodeTask::Classes {
            labels: &labels,
            weights: Some(vec![1.0; 3]),
            gamma: 0.0,
        };
        let w1 = ones
            .loss(&out, &[0, 1])
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!((ce - w1).abs() < 1e-6, "{ce} vs {w1}");
    }

    #[test]
    fn balanced_weights_follow_the_training_split() {
        let g = graphs::GraphBuilder::new("g", "p", 3)
            .node_type("p", 6, None)
            .labels(
                vec![0, 0, 0, 1, 2, 2],
                graphs::Splits {
                    train: vec![0, 1, 2, 3],
                    valid: vec![4],
                    test: vec![5],
                },
            )
            .build()
            .unwrap();
        let w = ClassWeights::Named("balanced".into())
            .resolve(&g)
            .unwrap()
            .unwrap();
        // 4 training nodes, 3 classes: class 0 has 3, class 1 one, class 2 none.
        let want = [4.0 / 9.0, 4.0 / 3.0, 4.0 / 3.0];
        for (a, b) in w.iter().zip(want) {
            assert!((f64::from(*a) - b).abs() < 1e-6, "{w:?}");
        }
        assert!(ClassWeights::default().resolve(&g).unwrap().is_none());
        assert!(ClassWeights::List(vec![1.0; 2]).resolve(&g).is_err());
    }

    #[test]
    fn the_label_loss_is_weighted_focal_binary_cross_entropy() {
        let logits = [[2.0f32, -1.0, 0.0], [-30.0, 40.0, 0.5]];
        let y = [1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0];
        let out = Tensor::new(&logits, &Device::Cpu).unwrap();
        let (w, gamma) = ([2.0f32, 0.5, 1.0], 1.5);
        let got = |wts: Option<&[f32]>, g: f64| -> f64 {
            label_loss(&out, &y, wts, g)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap() as f64
        };
        let want = |wts: Option<&[f32]>, g: f64| -> f64 {
            let mut sum = 0.0;
            for (i, row) in logits.iter().enumerate() {
                for (j, &x) in row.iter().enumerate() {
                    let p = 1.0 / (1.0 + (-f64::from(x)).exp());
                    let t = f64::from(y[i * 3 + j]);
                    let pt = if t == 1.0 { p } else { 1.0 - p };
                    let wj = if t == 1.0 {
                        wts.map_or(1.0, |w| f64::from(w[j]))
                    } else {
                        1.0
                    };
                    sum += -wj * (1.0 - pt).powf(g) * pt.max(1e-300).ln();
                }
            }
            sum / 2.0
        };
        for (wts, g) in [(None, 0.0), (Some(&w[..]), 0.0), (Some(&w[..]), gamma)] {
            let (a, b) = (got(wts, g), want(wts, g));
            // Large logits stay finite (the softplus form never overflows).
            assert!(
                a.is_finite() && (a - b).abs() < 1e-4 * (1.0 + b),
                "{a} vs {b}"
            );
        }
    }

    #[test]
    fn label_sets_are_scored_per_label_and_per_node() {
        let sets = LabelSets::new(2, 3, vec![1, 0, 1, 1, 0, 0]).unwrap();
        let task = NodeTask::Labels {
            sets: &sets,
            weights: None,
            gamma: 0.0,
        };
        // Predicted sets: {0}, {0}, {1}.
        let out = Tensor::new(&[[1.0f32, -1.0], [3.0, -2.0], [-1.0, 0.5]], &Device::Cpu).unwrap();
        let mut s = Scores::default();
        task.score(&out, &[0, 1, 2], &mut s).unwrap();
        assert_eq!(task.correct(&out, &[0, 1, 2]).unwrap(), 1);
        assert_eq!(s.correct, 1);
        // Label 0: tp 2; label 1: fp 1 (node 2), fn 1 (node 1).
        assert_eq!(s.labels.0, vec![[2, 0, 0], [0, 1, 1]]);
        assert!((s.labels.micro_f1().unwrap() - 4.0 / 6.0).abs() < 1e-12);
        assert!((s.labels.macro_f1().unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(s.ranked.len(), 6);
        assert!(!s.ranked[1].1);
        assert!(s.ranked[0].0 > 0.7 && s.ranked[0].1);
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
        assert!((loss(RegressionLoss::Mse, 1.0) - (0.25 + 0.0 + 100.0) / 3.0).abs() < 1e-4);
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
