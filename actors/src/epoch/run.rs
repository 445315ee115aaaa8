//! The epoch loop, as every mode's training thread runs it: the attempt's
//! epochs and steps from its [`Schedule`] (a resumed attempt enters its first
//! epoch where its checkpoint cut it, with the figures the checkpoint kept),
//! checkpoints when due, the bounded prefetch of [`super::run_steps`], the
//! epoch's figures and traffic, evaluation, and the epoch's account (sent to
//! the coordinator, or in one process turned into the report's epoch). A
//! mode supplies the steps through `Steps`.

use std::collections::BTreeMap;
use std::time::Instant;

use graphs::sampler::epoch_batches;
use runtime::Node;

use super::cpu::CpuSpan;
use super::schedule::Schedule;
use super::{run_steps, PREFETCH};
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::Progress;
use crate::distributed::messages::EpochStats;
use crate::error::Result;
use crate::task::link::LinkTask;

/// What the loop knows of the attempt.
pub(crate) struct Attempt<'a> {
    /// The node the training thread's actors live on (for its traffic
    /// figures); `None` in a single process.
    pub node: Option<&'a Node>,
    /// The attempt's generation.
    pub gen: u64,
    /// The trainer (or worker) number in its figures.
    pub trainer: u32,
    /// Training settings.
    pub cfg: &'a TrainingConfig,
    /// What batches are cut from.
    pub items: Items<'a>,
    /// The running figures of the epoch its checkpoint cut, if it resumes one.
    pub resumed: Progress,
}

/// What an epoch's batches are made of.
#[derive(Clone, Copy)]
pub(crate) enum Items<'a> {
    /// Training nodes, shuffled per epoch and cut into `batch`-sized steps.
    Nodes(&'a [u32]),
    /// Link prediction's training edges, each in the step its hash picks.
    Link(&'a LinkTask),
    /// An edge task's training edges, each in the step its hash picks.
    Edges(&'a crate::task::edge::EdgeTask),
    /// Node tasks beside a task on edges taking this many steps per epoch:
    /// an epoch is the longer of the two, the training nodes' batches
    /// starting over (each restart a new cut) when the edges' are more.
    Mixed(&'a [u32], u64),
}

impl Items<'_> {
    /// Steps per epoch.
    pub fn steps(&self, t: &TrainingConfig) -> u64 {
        match self {
            Items::Nodes(n) => n.len().div_ceil(t.batch.max(1)) as u64,
            Items::Link(l) => l.steps(),
            Items::Edges(e) => e.steps(),
            Items::Mixed(n, edge_steps) => Items::Nodes(n).steps(t).max(*edge_steps),
        }
    }

    /// The steps of `epoch`.
    fn batches(&self, t: &TrainingConfig, epoch: u64) -> Vec<Vec<u32>> {
        match self {
            Items::Nodes(n) => epoch_batches(n, t.batch, t.seed, epoch),
            Items::Link(l) => l.batches(epoch),
            Items::Edges(e) => e.batches(epoch),
            Items::Mixed(n, _) => {
                let steps = self.steps(t) as usize;
                let per_pass = Items::Nodes(n).steps(t).max(1) as usize;
                // Pass p over the nodes is cut as epoch `epoch * passes + p` would be.
                let passes = steps.div_ceil(per_pass) as u64;
                (0..passes)
                    .flat_map(|p| epoch_batches(n, t.batch, t.seed, epoch * passes + p))
                    .take(steps)
                    .collect()
            }
        }
    }
}

/// One step's contribution to the epoch's figures.
#[derive(Clone, Debug, Default)]
pub(crate) struct StepFigures {
    /// The step's global loss.
    pub loss: f64,
    /// Correct training predictions counted here.
    pub correct: f64,
    /// Training seeds counted here.
    pub seen: u64,
    /// Multi-task: each task's own global loss of the step (empty: one task).
    pub tasks: Vec<f64>,
}

/// A mode's own supply of an epoch's batches in step order, instead of the
/// prefetch thread (ByteGNN's DAG sampling).
pub(crate) trait BatchSource<B> {
    /// The next step's batch.
    fn next(&mut self) -> Result<B>;
    /// The trainer spent `seconds` on the batch it took last.
    fn trained(&self, seconds: f64);
    /// Adds the epoch's figures to its account.
    fn figures(&self, st: &mut EpochStats) -> Result<()>;
}

/// A distributed mode's training thread, as the loop drives it. `Feed` is
/// what its prefetch thread reads while the steps run (shared, immutable).
pub(crate) trait Steps {
    /// What the prefetch thread reads.
    type Feed: Sync;
    /// A batch prepared ahead of its step.
    type Batch: Send;
    /// The prefetch thread's own state for an epoch (a sampler, say).
    type State<'f>
    where
        Self: 'f;
    /// The next step's global number.
    fn seq(&self) -> u64;
    /// Whether its checkpoints can cut an epoch (else they come at epoch ends only).
    fn checkpoints_mid_epoch(&self) -> bool {
        true
    }
    /// Epoch `epoch` of `steps` steps begins (progress bars).
    fn epoch_start(&mut self, _epoch: u64, _steps: u64) {}
    /// Builds the prefetch thread's state for an epoch, on that thread.
    fn feed_state(feed: &Self::Feed) -> Result<Self::State<'_>>;
    /// The mode's own supply of the batches of `epoch` from step `skip` on
    /// (`None`: the prefetch thread and [`Steps::prepare`]).
    fn batch_source<'f>(
        _feed: &'f Self::Feed,
        _epoch: u64,
        _batches: &[Vec<u32>],
        _skip: usize,
    ) -> Result<Option<Box<dyn BatchSource<Self::Batch> + 'f>>> {
        Ok(None)
    }
    /// Prepares step `step` of `epoch` (its `seeds`) on the prefetch thread.
    fn prepare<'f>(
        feed: &'f Self::Feed,
        state: &mut Self::State<'f>,
        epoch: u64,
        step: u64,
        seeds: &[u32],
    ) -> Result<Self::Batch>;
    /// Writes this thread's part of the checkpoint before step [`Steps::seq`].
    fn checkpoint(&mut self, feed: &Self::Feed, progress: Progress) -> Result<()>;
    /// Trains on one batch (telling the coordinator of it if this thread does).
    fn step(
        &mut self,
        feed: &Self::Feed,
        epoch: u64,
        step: u64,
        seeds: &[u32],
        batch: Self::Batch,
        st: &mut EpochStats,
    ) -> Result<StepFigures>;
    /// Counts correct validation and test predictions into `st`, after the
    /// epochs that evaluate ([`evaluates`]); clears `st.evaluated` where it has nothing to count.
    fn evaluate(&mut self, feed: &Self::Feed, epoch: u64, st: &mut EpochStats) -> Result<()>;
    /// This thread's device cache figures so far (published to its cache
    /// manager too).
    fn cache_figures(&self) -> BTreeMap<String, crate::cache::CacheTypeReport>;
    /// Sends the epoch's account to the coordinator.
    fn send_stats(&mut self, feed: &Self::Feed, st: EpochStats) -> Result<()>;
    /// Threads preparing batches ahead (each every n-th step): more than one
    /// only where [`Steps::prepare`] is a pure function of the step and its seeds.
    fn prefetch_workers(&self) -> usize {
        1
    }
    /// Input rows pulled from other partitions so far (modes that pull rows count them).
    fn remote_rows(_feed: &Self::Feed) -> u64 {
        0
    }
}

/// Whether epoch `epoch` ends with an evaluation: every `eval_every`-th and the last.
pub(crate) fn evaluates(t: &TrainingConfig, epoch: u64) -> bool {
    (epoch + 1).is_multiple_of(t.eval_every.max(1)) || epoch + 1 >= t.epochs
}

/// Runs every epoch of the attempt.
pub(crate) fn run<S: Steps>(a: &Attempt, feed: &S::Feed, steps: &mut S) -> Result<()> {
    let t = a.cfg;
    let plan = Schedule::new(t, a.items.steps(t), steps.seq());
    let plan = if steps.checkpoints_mid_epoch() {
        plan
    } else {
        plan.at_epoch_ends()
    };
    let bytes = || {
        a.node
            .map(|n| n.metrics().bytes_by_kind())
            .unwrap_or_default()
    };
    for epoch in plan.epochs() {
        let batches = a.items.batches(t, epoch);
        let skip = plan.skip(epoch, batches.len());
        let mut st = EpochStats {
            gen: a.gen,
            trainer: a.trainer,
            epoch,
            steps: (batches.len() - skip) as u64,
            ..EpochStats::default()
        };
        let start = Instant::now();
        let before = bytes();
        let rows_before = S::remote_rows(feed);
        steps.epoch_start(epoch, batches.len() as u64);
        let mut progress = if skip > 0 {
            a.resumed.clone()
        } else {
            Progress::default()
        };
        let workers = steps.prefetch_workers();
        let cpu = CpuSpan::start();
        // The trainer waits from the end of one step to the start of the next.
        let mut last = Instant::now();
        let mut consume =
            |step: u64, seeds: &[u32], batch: S::Batch, st: &mut EpochStats| -> Result<()> {
                st.time.wait_s += last.elapsed().as_secs_f64();
                if plan.due(steps.seq()) {
                    let clock = Instant::now();
                    steps.checkpoint(feed, progress.clone())?;
                    st.time.checkpoint_s += clock.elapsed().as_secs_f64();
                }
                let f = steps.step(feed, epoch, step, seeds, batch, st)?;
                progress.loss_sum += f.loss;
                progress.correct += f.correct;
                progress.seen += f.seen;
                if progress.task_loss_sums.len() < f.tasks.len() {
                    progress.task_loss_sums.resize(f.tasks.len(), 0.0);
                }
                for (sum, l) in progress.task_loss_sums.iter_mut().zip(&f.tasks) {
                    *sum += l;
                }
                last = Instant::now();
                Ok(())
            };
        match S::batch_source(feed, epoch, &batches, skip)? {
            Some(mut source) => {
                for (step, seeds) in batches.iter().enumerate().skip(skip) {
                    let batch = source.next()?;
                    let clock = Instant::now();
                    consume(step as u64, seeds, batch, &mut st)?;
                    source.trained(clock.elapsed().as_secs_f64());
                }
                source.figures(&mut st)?;
            }
            None => {
                // The next batches are prepared on a thread of their own while this
                // one computes and waits for its peers (DistDGLv2's pipeline).
                let make = || {
                    let mut state = S::feed_state(feed)?;
                    Ok(move |step: u64, seeds: &[u32]| {
                        S::prepare(feed, &mut state, epoch, step, seeds)
                    })
                };
                run_steps(
                    PREFETCH,
                    workers,
                    &batches,
                    skip,
                    make,
                    |step, seeds, batch| consume(step, seeds, batch, &mut st),
                )?;
            }
        }
        st.cpu_util = cpu.util();
        st.time.seconds = start.elapsed().as_secs_f64();
        st.remote_rows = S::remote_rows(feed) - rows_before;
        st.step_bytes_by_kind = bytes()
            .into_iter()
            .map(|(k, v)| (k.clone(), v - before.get(&k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect();
        st.loss = progress.loss_sum / batches.len().max(1) as f64;
        st.train_correct = progress.correct.round() as u64;
        st.train_seen = progress.seen;
        // Multi-task: each task's own account, its evaluation filled in below.
        st.tasks = progress
            .task_loss_sums
            .iter()
            .map(|sum| EpochStats {
                epoch,
                steps: st.steps,
                loss: sum / batches.len().max(1) as f64,
                ..EpochStats::default()
            })
            .collect();
        if evaluates(t, epoch) {
            let eval = Instant::now();
            // An implementation that has nothing to evaluate (a sampling sink) says so.
            st.evaluated = true;
            steps.evaluate(feed, epoch, &mut st)?;
            st.time.eval_s = eval.elapsed().as_secs_f64();
        }
        for own in &mut st.tasks {
            own.evaluated = st.evaluated;
        }
        if let Some(n) = a.node {
            let m = n.metrics();
            st.bytes_by_kind = m.bytes_by_kind();
            st.messages_by_kind = m.messages_by_kind();
            st.resends = m.resent();
        }
        st.cache = steps.cache_figures();
        steps.send_stats(feed, st)?;
    }
    if plan.due(steps.seq()) {
        steps.checkpoint(feed, Progress::default())?;
    }
    Ok(())
}
