//! The Coordinator: gathers each epoch's figures into the report, completes a
//! checkpoint once every partition has written its files, and in
//! data-parallel runs drives the generations of the run: it starts one when
//! every partition is ready, from the newest valid checkpoint, and when a node
//! fails it stops every trainer, waits for the node to come back (restarted
//! by hand or by `hetgnn launch`) and starts the next generation from the
//! last complete checkpoint. Determinism makes the redone steps exact.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use graphs::HetGraph;

use super::checkpoint::{self, Manifest};
use super::generations::{abort_peers, new_generation, stop_all_but};
use super::inbox::{EpochProgress, Inbox};
use super::messages::{Begin, EpochStats, Saved};
use super::recovery::{Next, Recovery};
use super::{names, System, Timeouts};
use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};
use crate::modes::seam::Rules;
use crate::observer::TrainObserver;
use crate::report::{EpochReport, Report};

/// How long a `Begin` may take to reach a node.
const BEGIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The run's shape, as the coordinator follows it.
pub(crate) struct Shape {
    /// Partitions.
    pub(crate) parts: u32,
    /// Trainers (or workers) in all: each sends its figures every epoch.
    pub(crate) trainers: u32,
    /// Steps per epoch.
    pub(crate) per_epoch: u64,
}

/// Gathers a run's figures; one per run, across its generations.
pub(crate) struct Coordinator<'a> {
    t: &'a TrainingConfig,
    /// What the mode says of its steps and figures.
    rules: &'static Rules,
    parts: u32,
    trainers: u32,
    inbox: &'a Inbox,
    timeouts: Timeouts,
    /// The run's fingerprint, recorded in its checkpoints.
    run: String,
    /// The graph's content, recorded in its checkpoints.
    graph_sha256: Option<String>,
    /// The report so far.
    pub(crate) report: Report,
    step_bytes: BTreeMap<String, u64>,
    steps_run: u64,
    /// The next step's number.
    seq: u64,
    /// Checkpoints whose files are written, waiting for the reports of the epochs before them.
    pending: Vec<Vec<Saved>>,
    /// When the current attempt finished its first step.
    first_step_at: Option<Instant>,
    /// The last checkpoint completed (its step).
    completed: Option<u64>,
    /// Steps per epoch.
    per_epoch: u64,
}

impl<'a> Coordinator<'a> {
    /// A coordinator of a run of `shape`, its mode's `rules`.
    pub(crate) fn new(
        t: &'a TrainingConfig,
        rules: &'static Rules,
        shape: Shape,
        inbox: &'a Inbox,
        timeouts: Timeouts,
        run: String,
        graph_sha256: Option<String>,
    ) -> Coordinator<'a> {
        let Shape {
            parts,
            trainers,
            per_epoch,
        } = shape;
        let report = Report {
            mode: t.mode.name().into(),
            nodes: parts as usize,
            ..Report::default()
        };
        Coordinator {
            t,
            rules,
            parts,
            trainers,
            inbox,
            timeouts,
            run,
            graph_sha256,
            report,
            step_bytes: BTreeMap::new(),
            steps_run: 0,
            seq: 0,
            pending: Vec::new(),
            first_step_at: None,
            completed: None,
            per_epoch,
        }
    }

    /// Follows one attempt from the checkpoint `from` (or the start) to the end of the run.
    pub(crate) fn attempt(
        &mut self,
        g: &HetGraph,
        observer: &mut dyn TrainObserver,
        from: Option<&Manifest>,
    ) -> Result<()> {
        let (_, splits) = g.target_labels();
        let t = self.t;
        let per_epoch = self.per_epoch;
        let total = per_epoch * t.epochs;
        let first = from.map_or(0, |m| m.seq);
        self.seq = first;
        self.first_step_at = None;
        self.pending.clear();
        self.report.epochs = from.map(|m| m.epochs.clone()).unwrap_or_default();
        for epoch in first / per_epoch.max(1)..t.epochs {
            observer.epoch_start(epoch, per_epoch);
            let stats = loop {
                match self.inbox.epoch_progress(
                    epoch,
                    self.trainers,
                    self.parts,
                    self.timeouts.step,
                )? {
                    EpochProgress::Step(seq, loss) => {
                        if !loss.is_finite() {
                            return Err(TrainError::Diverged {
                                epoch,
                                step: seq,
                                loss,
                            });
                        }
                        self.seq = seq + 1;
                        self.first_step_at.get_or_insert_with(Instant::now);
                        observer.step(loss);
                    }
                    EpochProgress::Saved(files) => {
                        self.pending.push(files);
                        self.complete_checkpoints(per_epoch, observer)?;
                    }
                    EpochProgress::Done(stats) => break stats,
                }
            };
            let er = self.epoch_report(epoch, &stats, splits.valid.len(), splits.test.len())?;
            observer.epoch_end(&er);
            self.report.epochs.push(er);
            self.complete_checkpoints(per_epoch, observer)?;
        }
        // The last checkpoint may have come with the last epoch's figures already.
        if t.checkpoint_dir.is_some() && first < total && self.completed != Some(total) {
            let files = self.inbox.saved(total, self.parts, self.timeouts.step)?;
            self.pending.push(files);
            self.complete_checkpoints(per_epoch, observer)?;
        }
        self.seq = total;
        // Global steps are numbered: the model took `total` of them, however
        // many attempts (and resumed runs) it took; an epoch's statistics
        // count only the steps since the attempt began.
        self.report.steps = if self.rules.own_steps {
            self.steps_run
        } else {
            total
        };
        self.report.bytes_per_step = self
            .step_bytes
            .iter()
            .map(|(k, v)| (k.clone(), *v as f64 / self.steps_run.max(1) as f64))
            .collect();
        Ok(())
    }

    fn epoch_report(
        &mut self,
        epoch: u64,
        stats: &[EpochStats],
        valid: usize,
        test: usize,
    ) -> Result<EpochReport> {
        let s0 = &stats[0];
        let rules = self.rules;
        let mut er = EpochReport::from_stats(epoch, stats, valid, test, rules.own_steps);
        if !self.t.tasks.is_empty() {
            er.tasks = crate::report::TaskEpoch::all(epoch, stats, &self.t.tasks, valid, test);
        }
        (rules.figures)(&mut er, stats)?;
        // Trainers with steps of their own take them apart; the others share the global ones.
        self.steps_run += if rules.own_steps {
            stats.iter().map(|s| s.steps).sum()
        } else {
            s0.steps
        };
        let caches: Vec<_> = stats
            .iter()
            .map(|s| s.cache.clone())
            .filter(|c| !c.is_empty())
            .collect();
        if !caches.is_empty() {
            self.report.cache = crate::cache::merge_reports(&caches, self.t.cache_bytes.0);
        }
        // Each trainer reports its node's cumulative traffic; in one process they share a node.
        self.report.bytes_by_kind.clear();
        self.report.messages_by_kind.clear();
        self.report.resends = runtime::Resends::default();
        let distinct = if stats
            .windows(2)
            .all(|w| w[0].bytes_by_kind == w[1].bytes_by_kind)
        {
            &stats[..1]
        } else {
            stats
        };
        for s in distinct {
            for (k, v) in &s.bytes_by_kind {
                *self.report.bytes_by_kind.entry(k.clone()).or_default() += v;
            }
            self.report.resends += s.resends;
            for (k, v) in &s.messages_by_kind {
                *self.report.messages_by_kind.entry(k.clone()).or_default() += v;
            }
            for (k, v) in &s.step_bytes_by_kind {
                *self.step_bytes.entry(k.clone()).or_default() += v;
            }
        }
        Ok(er)
    }

    /// Writes the manifest of every checkpoint whose files are all written
    /// and whose earlier epochs are reported.
    fn complete_checkpoints(
        &mut self,
        per_epoch: u64,
        observer: &mut dyn TrainObserver,
    ) -> Result<()> {
        let Some(root) = self.t.checkpoint_dir.as_ref() else {
            return Ok(());
        };
        self.pending.sort_by_key(|v| v.first().map_or(0, |s| s.seq));
        while let Some(saved) = self.pending.first() {
            let seq = saved.first().map_or(0, |s| s.seq);
            let before = (seq / per_epoch.max(1)) as usize;
            if self.report.epochs.len() < before {
                break;
            }
            let saved = self.pending.remove(0);
            let bad = |m: String| TrainError::Checkpoint(format!("checkpoint at step {seq}: {m}"));
            let progress = saved
                .iter()
                .find(|s| s.part == 0)
                .and_then(|s| s.progress.clone())
                .ok_or_else(|| bad("partition 0's running figures are missing".into()))?;
            let mut files: BTreeMap<String, String> = BTreeMap::new();
            for s in saved {
                if s.files.is_empty() {
                    return Err(bad(format!("partition {} wrote no files", s.part)));
                }
                for (name, sum) in s.files {
                    if !checkpoint::valid_file_name(&name)
                        || sum.len() != 64
                        || !sum.bytes().all(|b| b.is_ascii_hexdigit())
                    {
                        return Err(bad(format!(
                            "partition {} reported a bad file entry {name:?}",
                            s.part
                        )));
                    }
                    if files.insert(name.clone(), sum).is_some() {
                        return Err(bad(format!("{name} reported twice")));
                    }
                }
            }
            let mut m = Manifest::new(
                self.run.clone(),
                &self.report.mode,
                self.t,
                seq,
                self.report.epochs[..before].to_vec(),
                progress,
                files,
            );
            m.graph_sha256 = self.graph_sha256.clone();
            let dir = checkpoint::finalize(root, &m, self.t.checkpoint_keep)?;
            self.completed = Some(seq);
            observer.note(&format!(
                "checkpoint at step {seq} written to {}",
                dir.display()
            ));
        }
        Ok(())
    }
}

/// How long the coordinator lets a partition be silent before it stops
/// whatever that partition runs (a coordinator restarted within the failure
/// timeout leaves the others waiting on its predecessor).
const NUDGE_AFTER: Duration = Duration::from_secs(1);

/// Data-parallel: the run's generations, from the first to the end.
pub(crate) struct Driver<'a> {
    /// The figures.
    pub(crate) c: Coordinator<'a>,
    /// The actor system of the coordinator's node.
    pub(crate) system: &'a System,
    /// Per partition, the actor that takes `Begin` (its first trainer or worker).
    pub(crate) leaders: Vec<String>,
    /// Per partition, the actors to stop when a generation fails.
    pub(crate) members: Vec<Vec<String>>,
    /// The node of each partition (for messages).
    pub(crate) nodes: Vec<String>,
    /// How long to wait for every partition at the start, and after a failure.
    pub(crate) start: Duration,
    /// See `start`.
    pub(crate) rejoin: Duration,
}

impl Driver<'_> {
    /// Runs generations until one finishes the run.
    pub(crate) fn run(&mut self, g: &HetGraph, observer: &mut dyn TrainObserver) -> Result<()> {
        let clock = Instant::now();
        self.c.report.started_at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut recovery = Recovery::default();
        for attempt in 0u32.. {
            let wait = if attempt == 0 {
                self.start
            } else {
                self.rejoin
            };
            let gen = new_generation();
            let members = self.wait_ready(wait, gen)?;
            let from = match &self.c.t.checkpoint_dir {
                Some(root) => match checkpoint::latest(root, &self.c.run)? {
                    Some((m, skipped)) => {
                        for s in skipped {
                            observer.note(&format!("skipped checkpoint: {s}"));
                        }
                        Some(m)
                    }
                    None => None,
                },
                None => None,
            };
            let from_seq = from.as_ref().map_or(0, |m| m.seq);
            match recovery.ready(clock.elapsed().as_secs_f64(), from_seq) {
                Some(note) => observer.note(&note),
                None if from.is_some() => {
                    self.c.report.resumed_from_step = Some(from_seq);
                    observer.note(&format!("resuming from the checkpoint at step {from_seq}"));
                }
                None => {}
            }
            self.c.inbox.running(gen, Some(members));
            let order = (self.c.report.started_at_unix_ms, u64::from(attempt));
            let begun = self.begin(Begin {
                gen,
                from: from.as_ref().map(|m| m.seq),
                order,
            });
            let result = begun.and_then(|()| self.c.attempt(g, observer, from.as_ref()));
            self.c.inbox.running(gen, None);
            let stepped = self
                .c
                .first_step_at
                .map(|at| at.duration_since(clock).as_secs_f64());
            if let Err(err) = &result {
                // Every trainer of this generation stops (those waiting on the lost node included).
                let trainers: Vec<String> = self.members.iter().flatten().cloned().collect();
                abort_peers(
                    &self.system.node,
                    &self.system.handle,
                    names::COORDINATOR,
                    u32::MAX,
                    gen,
                    &trainers,
                    &format!("the coordinator stops generation {gen:x}: {err}"),
                );
            }
            let seq = self.c.seq;
            let failure = result.as_ref().err().map(ToString::to_string);
            let next = recovery.ended(
                clock.elapsed().as_secs_f64(),
                stepped,
                from_seq,
                seq,
                result,
            );
            self.c.report.failures = recovery.failures.clone();
            match next {
                Next::Done => return Ok(()),
                Next::GiveUp(err) => return Err(err),
                Next::Retry => {
                    let err = failure.unwrap_or_default();
                    tracing::warn!("step {seq}: {err}; waiting for every node to be ready again");
                    observer.note(&format!(
                        "failure at step {seq}: {err}; waiting for every node to be ready"
                    ));
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// Waits until every partition said it is ready (nudging silent ones to
    /// stop anything but generation `next`); returns their incarnations.
    fn wait_ready(&self, timeout: Duration, next: u64) -> Result<BTreeMap<u32, u64>> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut nudged = start;
        loop {
            let ready = self.c.inbox.ready();
            if (0..self.c.parts).all(|p| ready.contains_key(&p)) {
                return Ok(ready.into_iter().map(|(p, r)| (p, r.incarnation)).collect());
            }
            if nudged.elapsed() >= NUDGE_AFTER {
                nudged = Instant::now();
                let silent: Vec<String> = (0..self.c.parts)
                    .filter(|p| !ready.contains_key(p))
                    .flat_map(|p| self.members[p as usize].iter().cloned())
                    .collect();
                // Whatever they run is stale, but not the generation about to start (a late copy of this must not stop it).
                stop_all_but(
                    &self.system.node,
                    &self.system.handle,
                    names::COORDINATOR,
                    next,
                    &silent,
                    "the coordinator is starting the run again",
                );
            }
            if Instant::now() >= deadline {
                let missing: Vec<String> = (0..self.c.parts)
                    .filter(|p| !ready.contains_key(p))
                    .map(|p| {
                        format!(
                            "{p} (node {})",
                            self.nodes.get(p as usize).map_or("?", String::as_str)
                        )
                    })
                    .collect();
                return Err(TrainError::PeerLost(format!(
                    "partition(s) {} not ready within {timeout:?}: restart their nodes (hetgnn node), or raise cluster.rejoin_timeout_ms",
                    missing.join(", ")
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Tells every partition's first trainer to start generation `b.gen`.
    fn begin(&self, b: Begin) -> Result<()> {
        let refs = self
            .leaders
            .iter()
            .map(|n| self.system.node.actor(n))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| TrainError::Internal(e.to_string()))?;
        let answers = self
            .system
            .handle
            .block_on(join_all(refs.iter().map(|r| r.ask(b, BEGIN_TIMEOUT))));
        for (p, a) in answers.into_iter().enumerate() {
            a.map_err(|e| {
                TrainError::PeerLost(format!("partition {p} did not take the start: {e}"))
            })?;
        }
        Ok(())
    }
}
