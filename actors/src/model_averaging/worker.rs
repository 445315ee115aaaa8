//! A model-averaging worker: trains each of its partitions on its own data
//! for a round of `sync_every` epochs, then averages every partition's model
//! with the other workers ([`super::average`]), reports the epoch and, at a
//! round's end, writes its part of the checkpoint.
//!
//! It does not use `crate::epoch::run`, whose steps are the global batches
//! every trainer shares: here each partition has batches of its own
//! training nodes, and a worker trains its partitions in turn (CATGNN §3.2).
//! It shares the bounded prefetch ([`crate::epoch::run_steps`]) and the
//! sampling and gathering of a batch.

use std::sync::Arc;
use std::time::Instant;

use graphs::sampler::epoch_batches;
use graphs::HetGraph;
use runtime::{ActorRef, Node};

use super::average::{Averager, Holders};
use super::figures::LocalFigures;
use super::local::Local;
use super::names;
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::{Manifest, Progress};
use crate::distributed::generations::abort_peers;
use crate::distributed::inbox::Inbox;
use crate::distributed::messages::{EpochStats, Saved, StepDone};
use crate::distributed::Timeouts;
use crate::epoch::{prepare, run_steps, sample, PREFETCH};
use crate::error::{Result, TrainError};
use crate::task::multi::NodeTasks;
use crate::task::node::Scores;

/// Everything a worker thread needs.
pub(crate) struct WorkerSetup {
    /// This worker.
    pub worker: u32,
    /// Workers in all.
    pub workers: u32,
    /// Its partitions and their graphs (partition `p` is worker `p % workers`'s).
    pub parts: Vec<(u32, Arc<HetGraph>)>,
    /// Owners of every node, by type.
    pub owners: Arc<Vec<Vec<u16>>>,
    /// Training settings.
    pub cfg: TrainingConfig,
    /// `[training.model-averaging]`
    pub avg: super::AveragingConfig,
    /// The node its actors live on.
    pub node: Node,
    /// The node's runtime.
    pub handle: tokio::runtime::Handle,
    /// Its inbox.
    pub inbox: Arc<Inbox>,
    /// Deadlines.
    pub timeouts: Timeouts,
    /// The checkpoint the attempt resumes from.
    pub from: Option<(std::path::PathBuf, Manifest)>,
    /// The attempt's generation.
    pub gen: u64,
    /// What a fine-tuned run starts from (`training.init_from`).
    pub start: Option<Arc<crate::pretrained::init::Start>>,
}

/// Runs every epoch; returns the partitions' final state. On failure, tells
/// the other workers and the coordinator so they stop instead of waiting.
pub(crate) fn run(s: WorkerSetup) -> Result<Vec<Local>> {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| train(&s)))
        .unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(TrainError::Internal(format!(
                "worker {} panicked: {what}",
                s.worker
            )))
        });
    if let Err(e) = &result {
        let targets: Vec<String> = (0..s.workers)
            .filter(|&q| q != s.worker)
            .map(names::worker)
            .chain([names::COORDINATOR.to_string()])
            .collect();
        abort_peers(
            &s.node,
            &s.handle,
            &names::worker(s.worker),
            s.worker,
            s.gen,
            &targets,
            e,
        );
    }
    result
}

fn train(s: &WorkerSetup) -> Result<Vec<Local>> {
    let t = &s.cfg;
    let mut locals = s
        .parts
        .iter()
        .map(|(p, g)| Local::new(t, *p, g.clone(), &s.owners, s.start.as_deref()))
        .collect::<Result<Vec<_>>>()?;
    let g0 = locals
        .first()
        .map(|l| l.graph.clone())
        .ok_or_else(|| TrainError::Internal(format!("worker {} has no partition", s.worker)))?;
    // Each partition's targets, read from its own graph.
    let graphs: Vec<Arc<HetGraph>> = locals.iter().map(|l| l.graph.clone()).collect();
    let tasks = graphs
        .iter()
        .map(|g| NodeTasks::of(t, g))
        .collect::<Result<Vec<_>>>()?;
    let task = &tasks[0];
    // The coordinator counts steps of the global batches: a round's end is its epoch's end there too.
    let total_train = g0.target_labels().1.train.len();
    let per_epoch = total_train.div_ceil(t.batch.max(1)) as u64;
    let mut first = 0;
    if let Some((dir, m)) = &s.from {
        for l in &mut locals {
            l.restore(dir, m)?;
        }
        first = m.seq / per_epoch.max(1);
    }
    let me = runtime::ActorName::new(&names::worker(s.worker)).map_err(TrainError::internal)?;
    let actor = |n: &str| {
        s.node
            .actor(n)
            .map(|r| r.with_sender(me.clone()))
            .map_err(|e| TrainError::Internal(format!("{n}: {e}")))
    };
    let peers: Vec<ActorRef> = (0..s.workers)
        .map(|q| actor(&names::worker(q)))
        .collect::<Result<_>>()?;
    let coordinator = actor(names::COORDINATOR)?;
    let avg = Averager {
        worker: s.worker,
        workers: s.workers,
        gen: s.gen,
        owners: &s.owners,
        handle: &s.handle,
        inbox: &s.inbox,
        peers,
        timeouts: s.timeouts,
    };
    // One partition in all has nothing to average with: it trains as a single process does.
    let averages = s.workers > 1 || locals.len() > 1;
    let holders = if averages {
        avg.holders(&locals)?
    } else {
        Holders::new()
    };
    let bytes = || s.node.metrics().bytes_by_kind();
    for epoch in first..t.epochs {
        let mut st = EpochStats {
            gen: s.gen,
            trainer: s.worker,
            epoch,
            evaluated: true,
            ..EpochStats::default()
        };
        let clock = Instant::now();
        let before = bytes();
        let (mut loss_sum, mut steps) = (0.0f64, 0u64);
        let mut task_loss_sums = vec![0.0f64; task.parts().len() * usize::from(task.is_multi())];
        for (i, l) in locals.iter_mut().enumerate() {
            let batches = epoch_batches(
                &l.train,
                l.batch(t.batch, s.avg.local_batch, total_train),
                t.seed,
                epoch,
            );
            let feed = l.feed(t);
            let make = || {
                let mut sampler = feed.plan.train(&feed.graph)?;
                let feed = &feed;
                Ok(move |step: u64, seeds: &[u32]| {
                    prepare(&feed.graph, &feed.gather, None, true, || {
                        sample(&mut sampler, feed.uses_neighbors, epoch, step, seeds)
                    })
                })
            };
            run_steps(PREFETCH, 1, &batches, 0, make, |step, seeds, p| {
                let out = l.step(&tasks[i], (epoch, step), p, &mut st)?;
                loss_sum += out.loss;
                for (sum, x) in task_loss_sums.iter_mut().zip(&out.each) {
                    *sum += x;
                }
                steps += 1;
                st.train_correct += out.correct;
                st.train_seen += seeds.len() as u64;
                // Progress for the coordinator: the first partition's steps, numbered within the epoch's global steps.
                if s.worker == 0 && i == 0 {
                    let done = StepDone {
                        gen: s.gen,
                        epoch,
                        seq: epoch * per_epoch + step.min(per_epoch.saturating_sub(1)),
                        loss: out.loss,
                    };
                    s.inbox
                        .block_on(&s.handle, coordinator.ask(done, s.timeouts.ask))??;
                }
                Ok(())
            })?;
        }
        st.time.seconds = clock.elapsed().as_secs_f64();
        st.steps = steps;
        st.loss = loss_sum / steps.max(1) as f64;
        // Multi-task: each task's own account, its evaluation filled in below.
        st.tasks = task_loss_sums
            .iter()
            .map(|sum| EpochStats {
                epoch,
                steps,
                loss: sum / steps.max(1) as f64,
                evaluated: true,
                ..EpochStats::default()
            })
            .collect();
        let eval = Instant::now();
        let count = |locals: &[Local], valid: bool| -> Result<Vec<Scores>> {
            let mut all = task.empty_scores();
            for (l, task) in locals.iter().zip(&tasks) {
                let nodes = if valid { &l.valid } else { &l.test };
                l.score(t, task, epoch, nodes, &mut all)?;
            }
            Ok(all)
        };
        let (valid, test) = (count(&locals, true)?, count(&locals, false)?);
        let correct = |s: &[Scores]| s.first().map_or(0, |s| s.correct);
        let local = LocalFigures {
            valid: locals.iter().map(|l| l.valid.len() as u64).sum(),
            test: locals.iter().map(|l| l.test.len() as u64).sum(),
            valid_correct: correct(&valid),
            test_correct: correct(&test),
            averaging_bytes: 0,
            peak_memory_bytes: None,
            peak_anon_bytes: None,
        };
        let mut averaging_bytes = 0;
        let round_end = (epoch + 1) % s.avg.sync_every.max(1) == 0 || epoch + 1 == t.epochs;
        if round_end && averages {
            let sync = Instant::now();
            averaging_bytes = avg.average(epoch, &mut locals, &holders)?;
            st.time.comm_s += sync.elapsed().as_secs_f64();
            task.record(&mut st, count(&locals, true)?, count(&locals, false)?);
        } else {
            task.record(&mut st, valid, test);
        }
        // The process's peaks so far, the round's averaging included.
        st.set_figures(&LocalFigures {
            averaging_bytes,
            peak_memory_bytes: graphs::memory::peak_rss_bytes(),
            peak_anon_bytes: graphs::memory::peak_anon_bytes(),
            ..local
        })?;
        st.time.eval_s = eval.elapsed().as_secs_f64() - st.time.comm_s;
        let m = s.node.metrics();
        st.bytes_by_kind = m.bytes_by_kind();
        st.messages_by_kind = m.messages_by_kind();
        st.resends = m.resent();
        st.step_bytes_by_kind = st
            .bytes_by_kind
            .iter()
            .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect();
        s.inbox
            .block_on(&s.handle, coordinator.ask(st, s.timeouts.ask))??;
        if let (true, Some(root)) = (round_end, &t.checkpoint_dir) {
            let seq = (epoch + 1) * per_epoch;
            let files = locals
                .iter()
                .map(|l| l.save(root, seq, &s.owners))
                .collect::<Result<Vec<_>>>()?
                .concat();
            let saved = Saved {
                gen: s.gen,
                seq,
                part: s.worker,
                files,
                progress: (s.worker == 0).then(Progress::default),
            };
            s.inbox
                .block_on(&s.handle, coordinator.ask(saved, s.timeouts.ask))??;
        }
    }
    Ok(locals)
}
