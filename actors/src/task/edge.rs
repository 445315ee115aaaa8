//! Edge classification and edge regression as training tasks: the split
//! edges of the target relations (with their labels or values, from the
//! graph directory), steps of training edges ([`Batching`]: an edge's step
//! is a hash of the edge, and the step's edges and their reverses are left
//! out of its own neighbourhoods, so a target never reaches its edge's ends
//! through that edge), the loss of a batch through the model's edge decoder,
//! and evaluation by exact inference.
//!
//! Evaluation embeds every node by exact layer-wise inference over the whole
//! graph (full neighbourhoods, no sampling, every edge present) and decodes
//! each validation and test edge from its ends' rows: the metrics are a pure
//! function of the model.

use std::collections::HashMap;

use candle_core::Tensor;
use graphs::edge_targets::EdgeSet;
use graphs::link::{copy_ranks, Batching, StepEdges};
use graphs::{HetGraph, RelationId};
use models::inference::{embed_all, TypeRows};
use models::rgcn::PerType;
use models::Model;
use serde::{Deserialize, Serialize};

use crate::config::RegressionLoss;
use crate::config::{Task, TrainingConfig};
use crate::error::{Result, TrainError};
use crate::task::node::{regression_loss, Scores, MAX_F1_CLASSES};

/// Evaluation edges decoded per chunk.
const EVAL_CHUNK: usize = 8192;

/// Destinations per chunk in evaluation's exact inference.
const INFERENCE_CHUNK: usize = 4096;

/// What the task learns of an edge.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Learns {
    /// A class among this many.
    Classes(u32),
    /// A value, by this loss.
    Values(RegressionLoss, f64),
}

/// The split edges of every target relation, as one list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Edges {
    /// Each edge's target relation (index into [`EdgeTask::relations`]).
    pub rel: Vec<u16>,
    /// The edges and their targets.
    pub set: EdgeSet,
}

impl Edges {
    /// Number of edges.
    pub fn len(&self) -> usize {
        self.rel.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rel.is_empty()
    }

    fn append(&mut self, r: u16, s: &EdgeSet) {
        self.rel.extend(std::iter::repeat_n(r, s.len()));
        self.set.src.extend_from_slice(&s.src);
        self.set.dst.extend_from_slice(&s.dst);
        self.set.labels.extend_from_slice(&s.labels);
        self.set.values.extend_from_slice(&s.values);
    }

    fn select(&self, ids: &[u32]) -> Edges {
        Edges {
            rel: ids.iter().map(|&i| self.rel[i as usize]).collect(),
            set: self.set.select(ids),
        }
    }
}

/// The task's settings and edges, for one graph.
pub struct EdgeTask {
    /// The target relations, in the model's order.
    pub relations: Vec<RelationId>,
    /// Per target relation: its key, source type and destination type.
    rels: Vec<(u64, usize, usize)>,
    /// Training edges.
    pub train: Edges,
    /// Validation edges.
    pub valid: Edges,
    /// Test edges.
    pub test: Edges,
    learns: Learns,
    batching: Batching,
    /// Each training edge's [`copy_ranks`] rank.
    copies: Vec<u32>,
}

/// A batch of training edges: the seeds whose rows it needs, and where
/// each edge's ends sit among them.
#[derive(Clone, Debug)]
pub struct EdgeBatch {
    /// The edges and their targets.
    pub edges: Edges,
    /// Seeds per node type (each end once).
    pub seeds: Vec<Vec<u32>>,
    src_at: Vec<u32>,
    dst_at: Vec<u32>,
}

/// The run's edge-task setting, written down in the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EdgeReport {
    /// The target relations.
    pub relations: Vec<String>,
    /// Training edges.
    pub train_edges: u64,
    /// Validation edges.
    pub valid_edges: u64,
    /// Test edges.
    pub test_edges: u64,
    /// How the metrics are computed.
    pub metric: String,
}

impl EdgeTask {
    /// The edge task `t` asks for on `g` (loaded with its reverse relations if `t` wants them).
    pub fn prepare(t: &TrainingConfig, g: &HetGraph) -> Result<EdgeTask> {
        EdgeTask::prepare_part(t, g, None, |_, _| true)
    }

    /// [`EdgeTask::prepare`] for a partition of the graph: `train_total` is
    /// the number of training edges with the task's target in the whole
    /// graph (`None`: `g` is the whole graph), and the task keeps the edges
    /// whose source `mine` accepts (its owned nodes), so that each edge
    /// belongs to one partition.
    pub fn prepare_part(
        t: &TrainingConfig,
        g: &HetGraph,
        train_total: Option<u64>,
        mine: impl Fn(usize, u32) -> bool,
    ) -> Result<EdgeTask> {
        let mut relations = Vec::new();
        for name in &t.target_relations {
            let known = || {
                g.relations()
                    .iter()
                    .filter(|r| r.targets().is_some())
                    .map(|r| r.canonical().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let r = g.relation_id(name).ok_or_else(|| {
                TrainError::Config(format!(
                    "training.target_relations: '{name}' is not a relation of graph '{}' (relations with edge targets: {})",
                    g.name(),
                    known()
                ))
            })?;
            if let Some(stored) = g.relation(r).reverse_of {
                return Err(TrainError::Config(format!(
                    "training.target_relations: '{name}' is the reverse relation added at load: name the stored one ({})",
                    g.relation(stored).canonical()
                )));
            }
            if relations.contains(&r) {
                return Err(TrainError::Config(format!(
                    "training.target_relations: '{name}' is listed twice"
                )));
            }
            relations.push(r);
        }
        if relations.len() > usize::from(u16::MAX) {
            return Err(TrainError::Config(format!(
                "training.target_relations: {} relations, at most {}",
                relations.len(),
                u16::MAX
            )));
        }
        // The run's task, or the edge task of its task list.
        let task = t.edge_level().unwrap_or(t.task);
        let learns = match task {
            Task::EdgeRegression => Learns::Values(t.regression_loss, t.huber_delta),
            _ => Learns::Classes(0),
        };
        let (mut train, mut valid, mut test) =
            (Edges::default(), Edges::default(), Edges::default());
        let mut classes = None;
        for (i, &r) in relations.iter().enumerate() {
            let rel = g.relation(r);
            let name = rel.canonical();
            let targets = rel.targets().filter(|x| match learns {
                Learns::Classes(_) => x.num_classes.is_some(),
                Learns::Values(..) => x.has_values,
            });
            let Some(x) = targets else {
                let (what, file) = match learns {
                    Learns::Classes(_) => ("labels", "labels.npy and \"num_classes\""),
                    Learns::Values(..) => ("values", "values.npy and \"values\": true"),
                };
                return Err(TrainError::Config(format!(
                    "training.task = \"{}\": relation '{name}' of graph '{}' has no edge {what} (edges/{name}/{file} in schema.json; see docs/guide/format.md)",
                    task.name(),
                    g.name()
                )));
            };
            if let (Learns::Classes(_), Some(c)) = (learns, x.num_classes) {
                if classes.is_some_and(|k| k != c) {
                    return Err(TrainError::Config(format!("training.target_relations: the relations' labels have different numbers of classes ({} and {c} for '{name}'): one decoder predicts one set of classes", classes.unwrap_or(c))));
                }
                classes = Some(c);
            }
            // Keep only the edges with the target this task reads.
            for (list, set) in [
                (&mut train, &x.train),
                (&mut valid, &x.valid),
                (&mut test, &x.test),
            ] {
                let keep: Vec<u32> = (0..set.len() as u32)
                    .filter(|&e| match learns {
                        Learns::Classes(_) => set.labels[e as usize] >= 0,
                        Learns::Values(..) => !set.values[e as usize].is_nan(),
                    })
                    .collect();
                let mut s = set.select(&keep);
                match learns {
                    Learns::Classes(_) => s.values.clear(),
                    Learns::Values(..) => s.labels.clear(),
                }
                list.append(i as u16, &s);
            }
        }
        let total = train_total.unwrap_or(train.len() as u64);
        if total == 0 {
            return Err(TrainError::Config(format!(
                "training.task = \"{}\": the target relations ({}) have no training edges with a target (edges/<relation>/train.npy): nothing to train",
                task.name(),
                t.target_relations.join(", ")
            )));
        }
        let learns = match learns {
            Learns::Classes(_) => Learns::Classes(classes.unwrap_or(0)),
            other => other,
        };
        let rels: Vec<(u64, usize, usize)> = relations
            .iter()
            .map(|&r| {
                let rel = g.relation(r);
                (rel.key(), rel.src.index(), rel.dst.index())
            })
            .collect();
        let batching = Batching::for_edges(g, &relations, t.seed, t.batch, total);
        for list in [&mut train, &mut valid, &mut test] {
            let keep: Vec<u32> = (0..list.len() as u32)
                .filter(|&i| {
                    let at = i as usize;
                    mine(rels[list.rel[at] as usize].1, list.set.src[at])
                })
                .collect();
            if keep.len() < list.len() {
                *list = list.select(&keep);
            }
        }
        let copies = copy_ranks(&train.rel, &train.set.src, &train.set.dst);
        Ok(EdgeTask {
            relations,
            rels,
            train,
            valid,
            test,
            learns,
            batching,
            copies,
        })
    }

    /// Steps per epoch.
    pub fn steps(&self) -> u64 {
        self.batching.steps()
    }

    /// The steps of `epoch`: training edges (indices into [`EdgeTask::train`]) per step.
    pub fn batches(&self, epoch: u64) -> Vec<Vec<u32>> {
        let mut out = vec![Vec::new(); self.batching.steps() as usize];
        for i in 0..self.train.len() {
            let (key, _, _) = self.rels[self.train.rel[i] as usize];
            let (u, v) = (self.train.set.src[i], self.train.set.dst[i]);
            let s = self.batching.step_of(epoch, key, u, v, self.copies[i]);
            out[s as usize].push(i as u32);
        }
        out
    }

    /// The edges step `step` of `epoch` leaves out of its neighbourhoods:
    /// the target relations' edges (and reverses) hashed into it.
    pub fn exclusion(&self, epoch: u64, step: u64) -> StepEdges<'_> {
        self.batching.exclusion(epoch, step)
    }

    /// The batch of training edges `ids`.
    pub fn batch(&self, g: &HetGraph, ids: &[u32]) -> EdgeBatch {
        let edges = self.train.select(ids);
        let types = g.node_types().len();
        let mut seeds: Vec<Vec<u32>> = vec![Vec::new(); types];
        let mut at: Vec<HashMap<u32, u32>> = vec![HashMap::new(); types];
        let mut slot = |t: usize, v: u32| -> u32 {
            *at[t].entry(v).or_insert_with(|| {
                seeds[t].push(v);
                seeds[t].len() as u32 - 1
            })
        };
        let (mut src_at, mut dst_at) =
            (Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()));
        for i in 0..edges.len() {
            let (_, st, dt) = self.rels[edges.rel[i] as usize];
            src_at.push(slot(st, edges.set.src[i]));
            dst_at.push(slot(dt, edges.set.dst[i]));
        }
        EdgeBatch {
            edges,
            seeds,
            src_at,
            dst_at,
        }
    }

    /// The decoder's outputs for the batch's edges, grouped by relation, and
    /// the order of the edges they are in.
    fn outputs(&self, model: &Model, out: &PerType, b: &EdgeBatch) -> Result<(Tensor, Vec<usize>)> {
        let mut parts = Vec::new();
        let mut order = Vec::with_capacity(b.edges.len());
        for (r, &(_, st, dt)) in self.rels.iter().enumerate() {
            let idx: Vec<usize> = (0..b.edges.len())
                .filter(|&i| b.edges.rel[i] as usize == r)
                .collect();
            if idx.is_empty() {
                continue;
            }
            let rows = |t: usize| {
                out[t]
                    .as_ref()
                    .ok_or_else(|| TrainError::Config(format!("no output rows for node type {t}")))
            };
            let (hs, hd) = (rows(st)?, rows(dt)?);
            let pick = |x: &Tensor, at: Vec<u32>| -> Result<Tensor> {
                let n = at.len();
                Ok(x.index_select(&Tensor::from_vec(at, n, x.device())?, 0)?)
            };
            let s = pick(hs, idx.iter().map(|&i| b.src_at[i]).collect())?;
            let d = pick(hd, idx.iter().map(|&i| b.dst_at[i]).collect())?;
            parts.push(model.decode_edges(&s, &d)?);
            order.extend(idx);
        }
        Ok((Tensor::cat(&parts, 0)?, order))
    }

    /// The batch's loss: its edges' mean loss scaled by their number over a
    /// step's mean size (a fixed divisor: a step's size is binomial).
    pub fn loss(&self, model: &Model, out: &PerType, b: &EdgeBatch) -> Result<Tensor> {
        let (y, order) = self.outputs(model, out, b)?;
        let device = y.device();
        let n = order.len();
        let mean = match self.learns {
            Learns::Classes(_) => {
                let labels: Vec<u32> = order
                    .iter()
                    .map(|&i| b.edges.set.labels[i] as u32)
                    .collect();
                candle_nn::loss::cross_entropy(&y, &Tensor::from_vec(labels, n, device)?)?
            }
            Learns::Values(loss, delta) => {
                let v: Vec<f32> = order.iter().map(|&i| b.edges.set.values[i]).collect();
                let v = Tensor::from_vec(v, n, device)?.to_dtype(y.dtype())?;
                regression_loss(&y.squeeze(1)?, &v, loss, delta)?
            }
        };
        Ok((mean * (n as f64 / self.batching.nominal()))?)
    }

    /// Correct classes among the batch's edges (0 for regression), from the model's rows.
    pub fn correct(&self, model: &Model, out: &PerType, b: &EdgeBatch) -> Result<u64> {
        let Learns::Classes(_) = self.learns else {
            return Ok(0);
        };
        let (y, order) = self.outputs(model, out, b)?;
        let pred: Vec<u32> = y.argmax(1)?.to_vec1()?;
        Ok(pred
            .iter()
            .zip(&order)
            .filter(|(&p, &i)| i64::from(p) == b.edges.set.labels[i])
            .count() as u64)
    }

    /// Validation and test figures of `model`, every node embedded by exact inference on `g`.
    pub fn evaluate_exact(&self, model: &Model, g: &HetGraph) -> Result<[EdgeScores; 2]> {
        let rows = embed_all(model, g, INFERENCE_CHUNK, |_, _, _| {})?;
        Ok([
            self.score(model, &rows, &self.valid)?,
            self.score(model, &rows, &self.test)?,
        ])
    }

    /// Validation and test figures of `model`, the nodes they need embedded
    /// by `embed` (per type, nodes of one type at a time: the last layer's
    /// rows of those seeds, sampled with a key that does not depend on which
    /// nodes are embedded together, so every mode gets the same rows).
    pub fn evaluate_sampled(
        &self,
        model: &Model,
        g: &HetGraph,
        embed: impl FnMut(&[Vec<u32>]) -> Result<PerType>,
    ) -> Result<[EdgeScores; 2]> {
        let rows = crate::task::link::embed_nodes(g, self.eval_nodes(g), INFERENCE_CHUNK, embed)?;
        Ok([
            self.score(model, &rows, &self.valid)?,
            self.score(model, &rows, &self.test)?,
        ])
    }

    /// Per type, the distinct ends of the validation and test edges, ascending.
    fn eval_nodes(&self, g: &HetGraph) -> Vec<Vec<u32>> {
        let mut seen: Vec<Vec<bool>> = g
            .node_types()
            .iter()
            .map(|t| vec![false; t.count as usize])
            .collect();
        for edges in [&self.valid, &self.test] {
            for i in 0..edges.len() {
                let (_, st, dt) = self.rels[edges.rel[i] as usize];
                seen[st][edges.set.src[i] as usize] = true;
                seen[dt][edges.set.dst[i] as usize] = true;
            }
        }
        seen.iter()
            .map(|s| (0..s.len() as u32).filter(|&v| s[v as usize]).collect())
            .collect()
    }

    /// Which step each training edge falls in (what samplers leave out).
    pub fn batching(&self) -> &Batching {
        &self.batching
    }

    /// The figures of `edges` decoded from every node's rows.
    fn score(&self, model: &Model, rows: &[Option<TypeRows>], edges: &Edges) -> Result<EdgeScores> {
        let mut out = EdgeScores {
            edges: edges.len() as u64,
            ..EdgeScores::default()
        };
        let table = |t: usize| {
            rows[t]
                .as_ref()
                .ok_or_else(|| TrainError::Config(format!("no embeddings for node type {t}")))
        };
        let ids: Vec<usize> = (0..edges.len()).collect();
        for chunk in ids.chunks(EVAL_CHUNK) {
            for (r, &(_, st, dt)) in self.rels.iter().enumerate() {
                let mine: Vec<usize> = chunk
                    .iter()
                    .copied()
                    .filter(|&i| edges.rel[i] as usize == r)
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let src: Vec<u32> = mine.iter().map(|&i| edges.set.src[i]).collect();
                let dst: Vec<u32> = mine.iter().map(|&i| edges.set.dst[i]).collect();
                let y = models::edge::decode_rows(model, table(st)?, table(dt)?, &src, &dst)?;
                match self.learns {
                    Learns::Classes(k) => {
                        let pred: Vec<u32> = y.argmax(1)?.to_vec1()?;
                        // Binary: the positive class's probability, for ROC-AUC.
                        let p1: Option<Vec<f32>> = match k {
                            2 => Some(
                                candle_nn::ops::softmax(&y, 1)?
                                    .narrow(1, 1, 1)?
                                    .squeeze(1)?
                                    .to_vec1()?,
                            ),
                            _ => None,
                        };
                        for (a, &i) in mine.iter().enumerate() {
                            let label = edges.set.labels[i];
                            out.scores.correct += u64::from(i64::from(pred[a]) == label);
                            if (k as usize) <= MAX_F1_CLASSES {
                                out.scores.classes.add(
                                    k as usize,
                                    pred[a] as usize,
                                    label as usize,
                                );
                            }
                            if let Some(p) = &p1 {
                                out.ranked.push((p[a], label == 1));
                            }
                        }
                    }
                    Learns::Values(..) => {
                        let pred: Vec<f32> = y.squeeze(1)?.to_vec1()?;
                        for (a, &i) in mine.iter().enumerate() {
                            out.scores
                                .values
                                .add(f64::from(pred[a]), f64::from(edges.set.values[i]));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// What the report says of the task.
    pub fn report(&self, g: &HetGraph, t: &TrainingConfig) -> EdgeReport {
        EdgeReport {
            relations: self.relations.iter().map(|&r| g.relation(r).canonical().to_string()).collect(),
            train_edges: self.train.len() as u64,
            valid_edges: self.valid.len() as u64,
            test_edges: self.test.len() as u64,
            metric: format!(
                "{}, decoded from its ends' embeddings by {}",
                match self.learns {
                    Learns::Classes(2) => "accuracy, macro F1 and ROC-AUC (of the class-1 probability) of each validation and test edge's class",
                    Learns::Classes(_) => "accuracy and macro F1 of each validation and test edge's class",
                    Learns::Values(..) => "RMSE, MAE and R^2 of each validation and test edge's value",
                },
                match t.exact_edge_eval() {
                    true => "exact full-neighbourhood inference on the whole graph",
                    false => "neighbourhoods sampled with the training fanouts, keyed by node alone",
                }
            ),
        }
    }
}

/// What an evaluation of edges adds up.
#[derive(Clone, Debug, Default)]
pub struct EdgeScores {
    /// Edges scored.
    pub edges: u64,
    /// Correct classes, per-class counts, regression sums.
    pub scores: Scores,
    /// Binary classification: each edge's class-1 probability and whether it is class 1.
    pub ranked: Vec<(f32, bool)>,
}

/// The average precision of `(score, positive)` pairs: the mean, over the
/// positives, of the precision among the pairs scoring at least as high
/// (tied scores taken together, as scikit-learn's); `None` without positives.
pub fn average_precision(pairs: &[(f32, bool)]) -> Option<f64> {
    let positives = pairs.iter().filter(|p| p.1).count();
    if positives == 0 {
        return None;
    }
    let mut sorted = pairs.to_vec();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (mut tp, mut seen, mut ap) = (0usize, 0usize, 0.0f64);
    let mut i = 0;
    while i < sorted.len() {
        // One threshold per distinct score: its ties enter together.
        let mut j = i;
        let mut new_tp = 0;
        while j < sorted.len() && sorted[j].0 == sorted[i].0 {
            new_tp += usize::from(sorted[j].1);
            j += 1;
        }
        tp += new_tp;
        seen += j - i;
        ap += new_tp as f64 / positives as f64 * (tp as f64 / seen as f64);
        i = j;
    }
    Some(ap)
}

/// The area under the ROC curve of `(score, positive)` pairs: the chance that
/// a random positive scores above a random negative, ties counting half.
pub fn roc_auc(pairs: &[(f32, bool)]) -> Option<f64> {
    let pos = pairs.iter().filter(|p| p.1).count();
    let neg = pairs.len() - pos;
    if pos == 0 || neg == 0 {
        return None;
    }
    let mut sorted = pairs.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Sum of the positives' ranks (1-based, ties given their mean rank).
    let mut rank_sum = 0f64;
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1].0 == sorted[i].0 {
            j += 1;
        }
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += mean_rank * sorted[i..=j].iter().filter(|p| p.1).count() as f64;
        i = j + 1;
    }
    let (p, n) = (pos as f64, neg as f64);
    Some((rank_sum - p * (p + 1.0) / 2.0) / (p * n))
}

#[cfg(test)]
mod tests {
    use super::{average_precision, roc_auc};

    #[test]
    fn average_precision_matches_scikit_learn() {
        // sklearn.metrics.average_precision_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) = 0.8333...
        let pairs = [(0.1, false), (0.4, false), (0.35, true), (0.8, true)];
        assert!((average_precision(&pairs).unwrap() - 5.0 / 6.0).abs() < 1e-12);
        // Ties are one threshold: [1, 0] both scored 0.5 gives precision 1/2.
        assert_eq!(average_precision(&[(0.5, true), (0.5, false)]), Some(0.5));
        assert_eq!(average_precision(&[(0.5, false)]), None);
        assert_eq!(average_precision(&[(0.9, true), (0.1, false)]), Some(1.0));
    }

    #[test]
    fn roc_auc_matches_the_pairwise_definition() {
        assert_eq!(roc_auc(&[(0.1, false), (0.9, true)]), Some(1.0));
        assert_eq!(roc_auc(&[(0.9, false), (0.1, true)]), Some(0.0));
        assert_eq!(roc_auc(&[(0.5, false), (0.5, true)]), Some(0.5));
        assert_eq!(roc_auc(&[(0.5, true)]), None);
        // Pairs: (0.8 vs 0.3) win, (0.8 vs 0.8) tie, (0.2 vs 0.3) loss, (0.2 vs 0.8) loss.
        let pairs = [(0.8, true), (0.2, true), (0.3, false), (0.8, false)];
        assert_eq!(roc_auc(&pairs), Some(1.5 / 4.0));
    }
}
