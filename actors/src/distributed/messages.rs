//! The control messages every distributed mode shares: generations (Ready,
//! Begin, Abort, Finish), progress and figures for the coordinator (StepDone,
//! EpochStats), checkpoints (Saved), and the dense-gradient share of an
//! all-reduce (GradShare). Kinds name what they carry, so the report's bytes
//! per kind read as what the run spent them on.

use runtime::{ByteVec, Msg};

use crate::error::{Result, TrainError};
use crate::report::{EpochReport, TaskEpoch, Timings};
use crate::task::node::MAX_RANKED;
use serde::{Deserialize, Serialize};

/// A trainer's flattened dense gradients for one step, or a chunk of them
/// (all-reduce).
#[derive(Debug, Serialize, Deserialize)]
pub struct GradShare {
    /// Generation (attempt) of the run the message belongs to: a recovery
    /// starts a new one, and messages of others are not mixed in.
    pub gen: u64,
    /// Global step number.
    pub seq: u64,
    /// Round of the all-reduce within the step (0 for all-gather; the ring's
    /// rounds are numbered 0 to 2(K-1)-1).
    pub round: u32,
    /// Sending trainer.
    pub from: u32,
    /// Little-endian f32 values.
    pub data: ByteVec,
}

impl Msg for GradShare {
    type Reply = ();
    const KIND: &'static str = "grad";
}

/// A trainer gave up: the others stop instead of waiting out their deadlines.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Abort {
    /// Generation (attempt) of the run the message belongs to: a recovery
    /// starts a new one, and messages of others are not mixed in.
    pub gen: u64,
    /// Stop whatever generation runs, unless it is `gen` (the coordinator
    /// clearing the way for the generation it is about to start).
    pub all_but: bool,
    /// Failing trainer.
    pub from: u32,
    /// Why.
    pub reason: String,
    /// The sender's failure would happen again after a restart (a bug, a
    /// protocol violation, bad input, a diverged loss): the coordinator
    /// stops the run instead of rolling it back.
    pub fatal: bool,
}

impl Msg for Abort {
    type Reply = ();
    const KIND: &'static str = "abort";
}

/// The run is over: trainers' nodes may stop serving.
#[derive(Debug, Serialize, Deserialize)]
pub struct Finish {
    /// Whether it ended well (false: the coordinator gave up; see its log).
    pub ok: bool,
}

impl Msg for Finish {
    type Reply = ();
    const KIND: &'static str = "finish";
}

impl EpochStats {
    /// Records an edge task's validation and test figures: its node-task
    /// counts, the edges scored and, for binary classes, their ranking pairs.
    pub fn set_edge_scores(
        &mut self,
        valid: crate::task::edge::EdgeScores,
        test: crate::task::edge::EdgeScores,
    ) {
        self.scored = Some([valid.edges, test.edges]);
        if !valid.ranked.is_empty() || !test.ranked.is_empty() {
            self.ranked = Some([valid.ranked, test.ranked]);
        }
        self.set_scores(valid.scores, test.scores);
    }

    /// Drops the ranking pairs past [`MAX_RANKED`] a split (before they
    /// travel: the epoch then has no ROC-AUC).
    pub fn limit_ranked(&mut self) {
        if self
            .ranked
            .as_ref()
            .is_some_and(|r| r.iter().any(|p| p.len() > MAX_RANKED))
        {
            self.ranked = None;
        }
    }

    /// Records a node task's validation and test figures: correct counts,
    /// per-class counts and regression sums, each where the task filled them.
    pub fn set_scores(
        &mut self,
        valid: crate::task::node::Scores,
        test: crate::task::node::Scores,
    ) {
        (self.valid_correct, self.test_correct) = (valid.correct, test.correct);
        if !valid.classes.0.is_empty() || !test.classes.0.is_empty() {
            self.classes = Some([valid.classes, test.classes]);
        }
        if valid.values.n + test.values.n > 0 {
            self.values = Some([valid.values, test.values]);
        }
        if !valid.labels.0.is_empty() || !test.labels.0.is_empty() {
            self.labels = Some([valid.labels, test.labels]);
        }
        // Pairs given up for their size on either split: the epoch has no
        // ranking figures (partial pairs would give biased ones).
        let dropped = valid.ranked_dropped || test.ranked_dropped;
        if !dropped && (!valid.ranked.is_empty() || !test.ranked.is_empty()) {
            self.ranked = Some([valid.ranked, test.ranked]);
        }
        self.limit_ranked();
    }
}

/// A step is done (sent by trainer 0, for the progress bar).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepDone {
    /// Generation (attempt) of the run the message belongs to: a recovery
    /// starts a new one, and messages of others are not mixed in.
    pub gen: u64,
    /// Epoch.
    pub epoch: u64,
    /// Global step number of the step done.
    pub seq: u64,
    /// The step's global loss.
    pub loss: f64,
}

impl Msg for StepDone {
    type Reply = ();
    const KIND: &'static str = "step";
}

/// One trainer's account of an epoch, sent to the coordinator.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EpochStats {
    /// Generation (attempt) of the run the message belongs to: a recovery
    /// starts a new one, and messages of others are not mixed in.
    pub gen: u64,
    /// Trainer.
    pub trainer: u32,
    /// Epoch.
    pub epoch: u64,
    /// Steps in the epoch.
    pub steps: u64,
    /// Mean global loss over the epoch's steps (the same on every trainer).
    pub loss: f64,
    /// Correct training predictions over all trainers.
    pub train_correct: u64,
    /// Training seeds over all trainers.
    pub train_seen: u64,
    /// Whether the epoch was evaluated (`training.eval_every`).
    pub evaluated: bool,
    /// This trainer's correct validation and test predictions.
    pub valid_correct: u64,
    /// See `valid_correct`.
    pub test_correct: u64,
    /// Where the epoch's time went on this trainer.
    pub time: Timings,
    /// Wire bytes this trainer's node sent during the epoch's training steps
    /// (evaluation excluded), per message kind.
    pub step_bytes_by_kind: std::collections::BTreeMap<String, u64>,
    /// Wire bytes this trainer's node sent so far, per message kind.
    pub bytes_by_kind: std::collections::BTreeMap<String, u64>,
    /// Messages this trainer's node sent so far, per message kind.
    pub messages_by_kind: std::collections::BTreeMap<String, u64>,
    /// What this trainer's node sent again so far.
    #[serde(default)]
    pub resends: runtime::Resends,
    /// This trainer's (worker's) device cache so far in the attempt, per node type.
    pub cache: std::collections::BTreeMap<String, crate::cache::CacheTypeReport>,
    /// Link prediction: this trainer's validation and test ranking sums.
    #[serde(default)]
    pub link: Option<[models::link::RankSums; 2]>,
    /// Node regression: this trainer's validation and test sums.
    #[serde(default)]
    pub values: Option<[crate::task::node::ValueSums; 2]>,
    /// Node classification: this trainer's validation and test counts per class.
    #[serde(default)]
    pub classes: Option<[crate::task::node::ClassCounts; 2]>,
    /// Multi-label: this trainer's validation and test counts per label.
    #[serde(default)]
    pub labels: Option<[crate::task::node::ClassCounts; 2]>,
    /// Edge tasks: the validation and test edges this trainer scored (node
    /// tasks' counts are the graph's splits).
    #[serde(default)]
    pub scored: Option<[u64; 2]>,
    /// Binary edge classification: this trainer's validation and test
    /// edges as (class-1 probability, whether class 1), for ROC-AUC and
    /// average precision; multi-label: its (node, label) pairs as
    /// (probability, whether the node has the label).
    #[serde(default)]
    pub ranked: Option<[Vec<(f32, bool)>; 2]>,
    /// The share of the machine's cores busy during the epoch's steps (0 to 1).
    #[serde(default)]
    pub cpu_util: f64,
    /// The mode's own figures of the epoch, encoded by the mode and merged
    /// into the report by its [`crate::modes::seam::Rules::figures`] (empty: none).
    #[serde(default)]
    pub figures: ByteVec,
    /// Input rows (features and learnable rows) this trainer pulled from
    /// other partitions during the epoch's training steps.
    #[serde(default)]
    pub remote_rows: u64,
    /// Multi-task: each task's account (its own loss and evaluation sums),
    /// in `training.tasks` order (empty: a single task).
    #[serde(default)]
    pub tasks: Vec<EpochStats>,
}

impl EpochStats {
    /// Carries the mode's own figures of the epoch (`f`, encoded).
    pub fn set_figures<T: Serialize>(&mut self, f: &T) -> Result<()> {
        self.figures = ByteVec(encode(f)?);
        Ok(())
    }

    /// The mode's own figures this account carries, if any; figures that do
    /// not decode as `T` are a protocol violation.
    pub fn figures<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>> {
        if self.figures.0.is_empty() {
            return Ok(None);
        }
        decode(&self.figures.0).map(Some).map_err(|e| {
            e.context(format!(
                "epoch {} figures of trainer {}",
                self.epoch, self.trainer
            ))
        })
    }
}

impl Msg for EpochStats {
    type Reply = ();
    const KIND: &'static str = "stats";
}

/// A node's partition is idle and ready to (re)start: sent to the coordinator
/// by every node waiting for a [`Begin`], repeatedly, so a restarted
/// coordinator learns of it too.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ready {
    /// The node's partition.
    pub part: u32,
    /// Random per process: a new one means the node restarted.
    pub incarnation: u64,
    /// What its last attempt came to.
    pub last: LastAttempt,
}

/// How a partition's last attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LastAttempt {
    /// It never started one (the process is new).
    None,
    /// Generation `0` finished every step.
    Done(u64),
    /// Generation `0` failed.
    Failed(u64),
}

impl Msg for Ready {
    type Reply = ();
    const KIND: &'static str = "ready";
}

/// The coordinator starts generation `gen` of the run: every partition
/// restores the checkpoint at step `from` (or starts afresh) and trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Begin {
    /// New generation number.
    pub gen: u64,
    /// The checkpoint (its step) to restore, if any.
    pub from: Option<u64>,
    /// Orders the coordinator's starts (its start time in milliseconds, then
    /// a count): a node takes no `Begin` older than one it already took, so a
    /// late copy cannot send it back to a generation that is over.
    pub order: (u64, u64),
}

impl Msg for Begin {
    type Reply = ();
    const KIND: &'static str = "begin";
}

/// A partition wrote its files of the checkpoint at step `seq`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Saved {
    /// Generation.
    pub gen: u64,
    /// Checkpoint step.
    pub seq: u64,
    /// Partition.
    pub part: u32,
    /// Files written and their SHA-256.
    pub files: Vec<(String, String)>,
    /// Trainer 0's figures of the unfinished epoch (partition 0 only).
    pub progress: Option<Progress>,
}

impl Msg for Saved {
    type Reply = ();
    const KIND: &'static str = "saved";
}

/// Most bytes an encoded payload may have.
pub const MAX_PAYLOAD: usize = 1 << 31;

/// Encodes `v` for a payload message (a failure is this process's: [`TrainError::Internal`]).
pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(v, bincode::config::standard()).map_err(TrainError::internal)
}

/// Decodes a payload (its size checked before decoding, its contents by the
/// caller); a payload that does not decode is the sender's
/// [`TrainError::Protocol`] violation.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    if bytes.len() > MAX_PAYLOAD {
        return Err(TrainError::Protocol(format!(
            "payload of {} bytes is over the {MAX_PAYLOAD}-byte limit",
            bytes.len()
        )));
    }
    let cfg = bincode::config::standard().with_limit::<MAX_PAYLOAD>();
    let (v, used) = bincode::serde::decode_from_slice(bytes, cfg).map_err(TrainError::protocol)?;
    if used != bytes.len() {
        return Err(TrainError::Protocol(format!(
            "{} trailing bytes after the payload",
            bytes.len() - used
        )));
    }
    Ok(v)
}

/// Trainer 0's running figures of the epoch a checkpoint falls in (the loss
/// and correct counts are global: every trainer sums the same values).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Sum of the epoch's step losses so far.
    pub loss_sum: f64,
    /// Correct training predictions so far.
    pub correct: f64,
    /// Training seeds seen so far.
    pub seen: u64,
    /// Multi-task: each task's own loss summed over the epoch's steps so far.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub task_loss_sums: Vec<f64>,
}

/// Each task's figures from the trainers' accounts of them.
impl TaskEpoch {
    /// Each task's figures of epoch `epoch` from the trainers' accounts
    /// (`stats`, each with its tasks' accounts in `tasks` order; `valid`
    /// and `test` nodes in all; `own_steps`: trainers whose steps are their
    /// own, whose losses are merged, as [`EpochReport::from_stats`] says).
    pub fn all(
        epoch: u64,
        stats: &[EpochStats],
        tasks: &[crate::config::TaskWeight],
        (valid, test): (usize, usize),
        own_steps: bool,
    ) -> Vec<TaskEpoch> {
        tasks
            .iter()
            .enumerate()
            .map(|(k, w)| {
                let own: Vec<_> = stats
                    .iter()
                    .filter_map(|s| s.tasks.get(k).cloned())
                    .collect();
                let r = EpochReport::from_stats(epoch, &own, valid, test, own_steps);
                // Regression and link prediction have no accuracy; multi-label's is exact matches.
                use crate::config::Task;
                let classifies = !matches!(
                    w.task,
                    Task::NodeRegression | Task::EdgeRegression | Task::LinkPrediction
                );
                TaskEpoch {
                    task: w.task.name().to_string(),
                    weight: w.weight,
                    loss: r.loss,
                    valid_acc: r.valid_acc.filter(|_| classifies),
                    test_acc: r.test_acc.filter(|_| classifies),
                    regression: r.regression,
                    macro_f1: r.macro_f1,
                    micro_f1: r.micro_f1,
                    roc_auc: r.roc_auc,
                    average_precision: r.average_precision,
                    link: r.link,
                }
            })
            .collect()
    }
}

/// The report's epoch from the trainers' accounts of it.
impl EpochReport {
    /// The epoch's figures from every trainer's account of it: the loss and
    /// training accuracy the first trainer saw (global; with `own_steps`, each
    /// trainer's own, merged), the validation and test predictions summed over
    /// trainers (`valid` and `test` nodes in all), the times across trainers
    /// ([`Timings::across`]). The mode's own figures are merged by its rules.
    pub fn from_stats(
        epoch: u64,
        stats: &[EpochStats],
        valid: usize,
        test: usize,
        own_steps: bool,
    ) -> EpochReport {
        let Some(s0) = stats.first() else {
            return EpochReport {
                epoch,
                ..EpochReport::default()
            };
        };
        let times: Vec<Timings> = stats.iter().map(|s| s.time).collect();
        // Edge tasks: the edges the trainers scored, else the graph's split sizes.
        let scored = |i: usize, nodes: usize| -> u64 {
            match stats.iter().any(|s| s.scored.is_some()) {
                true => stats.iter().filter_map(|s| s.scored).map(|c| c[i]).sum(),
                false => nodes as u64,
            }
        };
        let (valid, test) = (scored(0, valid), scored(1, test));
        let ratio = |a: u64, b: u64| a as f64 / b.max(1) as f64;
        let (loss, train_acc) = if own_steps {
            let steps: u64 = stats.iter().map(|s| s.steps).sum();
            let loss =
                stats.iter().map(|s| s.loss * s.steps as f64).sum::<f64>() / steps.max(1) as f64;
            (
                loss,
                ratio(
                    stats.iter().map(|s| s.train_correct).sum(),
                    stats.iter().map(|s| s.train_seen).sum(),
                ),
            )
        } else {
            (s0.loss, ratio(s0.train_correct, s0.train_seen))
        };
        EpochReport {
            epoch,
            loss,
            train_acc,
            // An empty split has no accuracy (null, not 0).
            valid_acc: (s0.evaluated && valid > 0)
                .then(|| ratio(stats.iter().map(|s| s.valid_correct).sum(), valid)),
            test_acc: (s0.evaluated && test > 0)
                .then(|| ratio(stats.iter().map(|s| s.test_correct).sum(), test)),
            time: Timings::across(&times),
            link: link_figures(stats),
            regression: regression_figures(stats),
            macro_f1: macro_f1(stats),
            micro_f1: label_f1(stats).map(|(micro, _)| micro),
            roc_auc: ranked_metric(stats, crate::task::edge::roc_auc),
            average_precision: ranked_metric(stats, crate::task::edge::average_precision),
            cpu_util: stats.iter().map(|s| s.cpu_util).sum::<f64>() / stats.len().max(1) as f64,
            remote_rows_per_step: stats.iter().map(|s| s.remote_rows).sum::<u64>() as f64
                / stats.first().map_or(1, |s| s.steps.max(1)) as f64,
            tasks: Vec::new(),
            figures: std::collections::BTreeMap::new(),
        }
    }
}

/// Every evaluated trainer's validation and test sums that `get` reads, added
/// up by `merge` (`None`: no trainer had any).
fn summed<T: Default>(
    stats: &[EpochStats],
    get: impl Fn(&EpochStats) -> Option<&[T; 2]>,
    merge: fn(&mut T, &T),
) -> Option<[T; 2]> {
    let mut sums: Option<[T; 2]> = None;
    for [v, t] in stats.iter().filter(|s| s.evaluated).filter_map(get) {
        let acc = sums.get_or_insert_with(Default::default);
        merge(&mut acc[0], v);
        merge(&mut acc[1], t);
    }
    sums
}

/// Validation and test figure `metric` of an epoch's ranking pairs, every
/// trainer's merged (`None` unless every evaluated trainer sent its pairs).
fn ranked_metric(
    stats: &[EpochStats],
    metric: fn(&[(f32, bool)]) -> Option<f64>,
) -> Option<[f64; 2]> {
    let mut all: [Vec<(f32, bool)>; 2] = Default::default();
    for s in stats.iter().filter(|s| s.evaluated) {
        let [v, t] = s.ranked.as_ref()?;
        all[0].extend_from_slice(v);
        all[1].extend_from_slice(t);
    }
    let [v, t] = all.map(|pairs| metric(&pairs));
    Some([v?, t?])
}

/// Multi-label: validation and test micro and macro F1 of an epoch, every
/// trainer's per-label counts merged.
fn label_f1(stats: &[EpochStats]) -> Option<([f64; 2], [f64; 2])> {
    let [v, t] = summed(
        stats,
        |s| s.labels.as_ref(),
        crate::task::node::ClassCounts::merge,
    )?;
    Some((
        [v.micro_f1()?, t.micro_f1()?],
        [v.macro_f1()?, t.macro_f1()?],
    ))
}

/// Validation and test macro F1 of an epoch: every trainer's counts merged
/// (per class, or multi-label per label).
fn macro_f1(stats: &[EpochStats]) -> Option<[f64; 2]> {
    if let Some((_, macro_)) = label_f1(stats) {
        return Some(macro_);
    }
    let [v, t] = summed(
        stats,
        |s| s.classes.as_ref(),
        crate::task::node::ClassCounts::merge,
    )?;
    Some([v.macro_f1()?, t.macro_f1()?])
}

/// Node regression's figures of an epoch: every trainer's sums merged.
fn regression_figures(stats: &[EpochStats]) -> Option<crate::task::node::RegressionEpoch> {
    summed(
        stats,
        |s| s.values.as_ref(),
        crate::task::node::ValueSums::merge,
    )
    .map(|s| crate::task::node::RegressionEpoch::of(&s))
}

/// Link prediction's figures of an epoch: every trainer's ranking sums merged.
fn link_figures(stats: &[EpochStats]) -> Option<crate::task::link::LinkEpoch> {
    let mut sums: Option<[models::link::RankSums; 2]> = None;
    for s in stats {
        if let Some([v, t]) = &s.link {
            let acc = sums.get_or_insert_with(Default::default);
            acc[0].merge(v);
            acc[1].merge(t);
        }
    }
    sums.map(|[v, t]| crate::task::link::LinkEpoch {
        valid: (&v).into(),
        test: (&t).into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_split_has_no_accuracy_rather_than_zero() {
        let s = EpochStats {
            evaluated: true,
            valid_correct: 0,
            test_correct: 3,
            ..EpochStats::default()
        };
        let r = EpochReport::from_stats(0, &[s], 0, 4, false);
        assert_eq!((r.valid_acc, r.test_acc), (None, Some(0.75)));
    }
}
