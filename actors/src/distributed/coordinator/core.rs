//! The coordinator's protocol without IO: the generations of a run, each
//! attempt's progress, completed checkpoints and the decision to recover or
//! give up, as a state machine fed `(now, event)`. It holds no clock, socket
//! or thread: time is the offset since the coordinator started, messages come
//! in as [`Event`]s, and what must be sent goes out as [`Output`]s. Reading
//! and writing checkpoints and telling the user go through [`Host`] (as
//! raft-rs reads its log through `Storage`). The actor shell drives it in
//! production and a seeded simulated network in tests, so recovery is tested
//! in milliseconds, without processes or sleeps.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use super::figures::Figures;
use super::recovery::{Next, Recovery};
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::{self, Manifest};
use crate::distributed::messages::{Abort, Begin, EpochStats, LastAttempt, Ready, Saved, StepDone};
use crate::error::{Result, TrainError};
use crate::modes::seam::Rules;
use crate::observer::TrainObserver;
use crate::report::Report;

/// How long a partition may take to answer a `Begin`.
pub(crate) const BEGIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the coordinator lets a partition be silent before it stops
/// whatever that partition runs (a coordinator restarted within the failure
/// timeout leaves the others waiting on its predecessor).
pub(crate) const NUDGE_AFTER: Duration = Duration::from_secs(1);

/// What reaches the coordinator.
#[derive(Debug)]
pub(crate) enum Event {
    /// Time passed (a deadline may have come).
    Tick,
    /// A partition is ready for the next generation.
    Ready(Ready),
    /// A training step finished.
    Step(StepDone),
    /// A trainer's figures of an epoch.
    Stats(Box<EpochStats>),
    /// A partition wrote its files of a checkpoint.
    Saved(Box<Saved>),
    /// A trainer (or the coordinator's own node) stops a generation.
    Abort(Abort),
    /// A node stopped answering heartbeats.
    PeerDown(String),
    /// Partition `part`'s answer to the `Begin` of generation `gen`.
    Begun {
        /// The partition.
        part: u32,
        /// The generation it was asked to start.
        gen: u64,
        /// Its answer (an error: it did not take it).
        result: std::result::Result<(), String>,
    },
}

/// What the coordinator asks its shell to send.
#[derive(Debug)]
pub(crate) enum Output {
    /// Tell the actors of `parts` to stop any generation but `keep`.
    Nudge {
        /// The generation about to start.
        keep: u64,
        /// The silent partitions.
        parts: Vec<u32>,
    },
    /// Tell every partition's leader to start this generation; each answer
    /// comes back as [`Event::Begun`].
    Begin(Begin),
    /// Stop every trainer of generation `gen`.
    Abort {
        /// The generation.
        gen: u64,
        /// Why.
        reason: String,
    },
    /// The run is over: well, or with this error.
    Done(Result<()>),
}

/// What the coordinator reads and writes beyond messages.
pub(crate) trait Host {
    /// Where progress and notes go.
    fn observer(&mut self) -> &mut dyn TrainObserver;
    /// The newest valid checkpoint of the run, and why newer ones were skipped.
    fn latest(&mut self) -> Result<Option<(Manifest, Vec<String>)>>;
    /// Completes the checkpoint of `m`, whose files are all written.
    fn finalize(&mut self, m: &Manifest) -> Result<PathBuf>;
}

/// The run's shape, as the coordinator follows it.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    /// Partitions.
    pub(crate) parts: u32,
    /// Trainers (or workers) in all: each sends its figures every epoch.
    pub(crate) trainers: u32,
    /// Steps per epoch.
    pub(crate) per_epoch: u64,
    /// The node of each partition (for messages).
    pub(crate) nodes: Vec<String>,
    /// Nodes of the validation and test splits (for accuracies).
    pub(crate) valid: usize,
    /// See `valid`.
    pub(crate) test: usize,
}

/// Which run this is, as its checkpoints record it.
#[derive(Clone, Debug)]
pub(crate) struct RunId {
    /// The run's fingerprint.
    pub(crate) run: String,
    /// The content of the graph the partitions were cut from, when known.
    pub(crate) graph_sha256: Option<String>,
    /// When this coordinator started (milliseconds since the Unix epoch):
    /// orders its `Begin`s after any earlier coordinator's.
    pub(crate) started_unix_ms: u64,
    /// Makes this coordinator's generation numbers differ from any earlier one's.
    pub(crate) salt: u64,
}

/// The deadlines the coordinator keeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadlines {
    /// Waiting for every partition at the start.
    pub(crate) start: Duration,
    /// Waiting for every partition after a failure.
    pub(crate) rejoin: Duration,
    /// Waiting for the next progress of an attempt (a step, an epoch's figures).
    pub(crate) step: Duration,
}

/// Where the run is.
enum Phase {
    /// Waiting until every partition is ready for generation `gen`.
    Gathering {
        gen: u64,
        deadline: Duration,
        wait: Duration,
        nudged: Duration,
    },
    /// `Begin` sent; waiting for every partition to take it.
    Beginning {
        attempt: Attempt,
        waiting: BTreeSet<u32>,
        deadline: Duration,
        /// Why a partition did not take it, once one did not.
        refused: Option<String>,
    },
    /// Following the attempt's steps.
    Running(Attempt),
    /// Over.
    Over,
}

/// What an attempt waits for next.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Awaiting {
    /// Progress of this epoch.
    Epoch(u64),
    /// The files of the run's last checkpoint.
    LastCheckpoint,
}

impl Awaiting {
    fn what(self, total: u64) -> String {
        match self {
            Awaiting::Epoch(e) => format!("progress of epoch {e}"),
            Awaiting::LastCheckpoint => format!("the files of the checkpoint at step {total}"),
        }
    }
}

/// One generation of the run, from its checkpoint to its end.
struct Attempt {
    gen: u64,
    /// Each partition's incarnation when it began.
    members: BTreeMap<u32, u64>,
    /// The checkpoint it resumes.
    from: Option<Manifest>,
    awaiting: Awaiting,
    /// When the current wait gives up.
    deadline: Duration,
    /// Why it must stop, once it must.
    abort: Option<Stop>,
    steps: VecDeque<(u64, u64, f64)>,
    stats: BTreeMap<(u64, u32), EpochStats>,
    saved: BTreeMap<(u64, u32), Saved>,
}

impl Attempt {
    fn start_seq(&self) -> u64 {
        self.from.as_ref().map_or(0, |m| m.seq)
    }

    /// The attempt must stop for `reason`: the first reason is kept, unless
    /// a later one says a restart would repeat the failure (a peer's abort
    /// that it provoked may arrive first).
    fn stop(&mut self, reason: String, fatal: bool) {
        if self.abort.as_ref().is_none_or(|s| fatal && !s.fatal) {
            self.abort = Some(Stop { reason, fatal });
        }
    }
}

/// Why an attempt stops.
#[derive(Debug)]
struct Stop {
    reason: String,
    /// A node failed in a way a restart would repeat (a bug, a protocol
    /// violation, bad input, a diverged loss): the run stops, no rollback.
    fatal: bool,
}

impl Stop {
    /// The attempt's error, said while it waited for `what`.
    fn into_error(self, what: &str) -> TrainError {
        if self.fatal {
            TrainError::Failed(format!(
                "{} (a restart from the last checkpoint would repeat it)",
                self.reason
            ))
        } else {
            TrainError::PeerLost(format!("stopped while waiting for {what}: {}", self.reason))
        }
    }
}

/// The coordinator of a run, across its generations.
pub(crate) struct Coordinator<'a> {
    t: &'a TrainingConfig,
    /// What the mode says of its steps and figures.
    rules: &'static Rules,
    shape: Shape,
    deadlines: Deadlines,
    /// The run, as its checkpoints record it.
    id: RunId,
    /// The report so far.
    pub(crate) figures: Figures,
    recovery: Recovery,
    /// Generations started.
    attempts: u32,
    /// The partitions that said they are ready.
    ready: BTreeMap<u32, Ready>,
    /// The next step's number.
    seq: u64,
    /// Checkpoints whose files are written, waiting for the reports of the epochs before them.
    pending: Vec<Vec<Saved>>,
    /// When the current attempt finished its first step.
    first_step_at: Option<Duration>,
    /// The last checkpoint completed (its step).
    completed: Option<u64>,
    phase: Phase,
}

impl<'a> Coordinator<'a> {
    /// The coordinator of run `id` of `shape` (its mode's `rules`), gathering
    /// its partitions for the first generation.
    pub(crate) fn new(
        t: &'a TrainingConfig,
        rules: &'static Rules,
        shape: Shape,
        deadlines: Deadlines,
        id: RunId,
    ) -> Coordinator<'a> {
        let mut figures = Figures::new(t.mode.name(), shape.parts, shape.valid, shape.test);
        figures.report.started_at_unix_ms = id.started_unix_ms;
        Coordinator {
            t,
            rules,
            shape,
            deadlines,
            id,
            figures,
            recovery: Recovery::default(),
            attempts: 0,
            ready: BTreeMap::new(),
            seq: 0,
            pending: Vec::new(),
            first_step_at: None,
            completed: None,
            phase: Phase::Over,
        }
        .gathering(Duration::ZERO, deadlines.start)
    }

    /// The report so far.
    #[cfg(test)]
    pub(crate) fn report(&self) -> &Report {
        &self.figures.report
    }

    /// Takes the report.
    pub(crate) fn into_report(self) -> Report {
        self.figures.report
    }

    /// When the coordinator next needs a [`Event::Tick`] (None: it is over).
    pub(crate) fn poll_timeout(&self) -> Option<Duration> {
        match &self.phase {
            Phase::Gathering {
                deadline, nudged, ..
            } => Some((*deadline).min(*nudged + NUDGE_AFTER)),
            Phase::Beginning { deadline, .. } => Some(*deadline),
            Phase::Running(a) => Some(a.deadline),
            Phase::Over => None,
        }
    }

    /// Takes `event` at `now`; returns what to send, in order.
    pub(crate) fn handle(
        &mut self,
        now: Duration,
        event: Event,
        host: &mut dyn Host,
    ) -> Vec<Output> {
        let mut out = Vec::new();
        match event {
            Event::Tick => {}
            Event::Ready(r) => self.take_ready(r),
            Event::Step(s) => {
                if let Some(a) = self.current(s.gen) {
                    a.steps.push_back((s.epoch, s.seq, s.loss));
                }
            }
            Event::Stats(s) => {
                if let Some(a) = self.current(s.gen) {
                    a.stats.entry((s.epoch, s.trainer)).or_insert(*s);
                }
            }
            Event::Saved(s) => {
                if let Some(a) = self.current(s.gen) {
                    a.saved.entry((s.seq, s.part)).or_insert(*s);
                }
            }
            Event::Abort(m) => {
                let from = if m.from == u32::MAX {
                    "the coordinator".to_string()
                } else {
                    format!("trainer {}", m.from)
                };
                if let Some(a) = self.attempt_mut() {
                    // `all_but`: stop anything but generation `m.gen`.
                    if (a.gen == m.gen) != m.all_but {
                        a.stop(format!("{from}: {}", m.reason), m.fatal);
                    }
                }
            }
            Event::PeerDown(node) => {
                if let Some(a) = self.attempt_mut() {
                    a.stop(
                        format!(
                            "node {node} stopped answering (no heartbeat within cluster.failure_timeout_ms)"
                        ),
                        false,
                    );
                }
            }
            Event::Begun { part, gen, result } => {
                if let Phase::Beginning {
                    attempt,
                    waiting,
                    refused,
                    ..
                } = &mut self.phase
                {
                    if attempt.gen == gen {
                        match result {
                            Ok(()) => {
                                waiting.remove(&part);
                            }
                            Err(e) => {
                                refused.get_or_insert(format!(
                                    "partition {part} did not take the start: {e}"
                                ));
                            }
                        }
                    }
                }
            }
        }
        self.advance(now, host, &mut out);
        out
    }

    /// The attempt of generation `gen`, if it is the one begun or running.
    fn current(&mut self, gen: u64) -> Option<&mut Attempt> {
        self.attempt_mut().filter(|a| a.gen == gen)
    }

    fn attempt_mut(&mut self) -> Option<&mut Attempt> {
        match &mut self.phase {
            Phase::Beginning { attempt, .. } | Phase::Running(attempt) => Some(attempt),
            _ => None,
        }
    }

    /// A ready partition of the running generation means its node failed or
    /// restarted: the generation stops (late copies from before it began change nothing).
    fn take_ready(&mut self, r: Ready) {
        if let Some(a) = self.attempt_mut() {
            let was = a.members.get(&r.part).copied();
            if was.is_some_and(|inc| inc != r.incarnation) {
                a.stop(format!("the node of partition {} restarted", r.part), false);
            } else if r.last == LastAttempt::Failed(a.gen) && was == Some(r.incarnation) {
                a.stop(format!("partition {} failed its attempt", r.part), false);
            }
        }
        self.ready.insert(r.part, r);
    }

    /// A new generation, gathering its partitions for up to `wait`.
    fn gathering(mut self, now: Duration, wait: Duration) -> Self {
        self.phase = self.gather(now, wait);
        self
    }

    fn gather(&mut self, now: Duration, wait: Duration) -> Phase {
        let gen = generation(self.id.salt, self.attempts);
        Phase::Gathering {
            gen,
            deadline: now + wait,
            wait,
            nudged: now,
        }
    }

    /// Does whatever the state allows now.
    fn advance(&mut self, now: Duration, host: &mut dyn Host, out: &mut Vec<Output>) {
        loop {
            let progressed = match std::mem::replace(&mut self.phase, Phase::Over) {
                Phase::Over => false,
                Phase::Gathering {
                    gen,
                    deadline,
                    wait,
                    nudged,
                } => self.advance_gathering(now, host, out, (gen, deadline, wait, nudged)),
                Phase::Beginning {
                    attempt,
                    waiting,
                    deadline,
                    refused,
                } => self.advance_beginning(now, host, out, attempt, (waiting, deadline, refused)),
                Phase::Running(attempt) => self.advance_running(now, host, out, attempt),
            };
            if !progressed {
                return;
            }
        }
    }

    fn advance_gathering(
        &mut self,
        now: Duration,
        host: &mut dyn Host,
        out: &mut Vec<Output>,
        (gen, deadline, wait, mut nudged): (u64, Duration, Duration, Duration),
    ) -> bool {
        let parts = self.shape.parts;
        if (0..parts).all(|p| self.ready.contains_key(&p)) {
            let members: BTreeMap<u32, u64> = std::mem::take(&mut self.ready)
                .into_iter()
                .map(|(p, r)| (p, r.incarnation))
                .collect();
            let from = match host.latest() {
                Ok(Some((m, skipped))) => {
                    for s in skipped {
                        host.observer().note(&format!("skipped checkpoint: {s}"));
                    }
                    Some(m)
                }
                Ok(None) => None,
                Err(e) => {
                    out.push(Output::Done(Err(e)));
                    return false;
                }
            };
            let from_seq = from.as_ref().map_or(0, |m| m.seq);
            match self.recovery.ready(now.as_secs_f64(), from_seq) {
                Some(note) => host.observer().note(&note),
                None if from.is_some() => {
                    self.figures.report.resumed_from_step = Some(from_seq);
                    host.observer()
                        .note(&format!("resuming from the checkpoint at step {from_seq}"));
                }
                None => {}
            }
            let order = (
                self.figures.report.started_at_unix_ms,
                u64::from(self.attempts),
            );
            self.attempts += 1;
            // Until it steps, the attempt stands at its checkpoint.
            self.seq = from_seq;
            self.first_step_at = None;
            out.push(Output::Begin(Begin {
                gen,
                from: from.as_ref().map(|m| m.seq),
                order,
            }));
            self.phase = Phase::Beginning {
                attempt: Attempt {
                    gen,
                    members,
                    from,
                    awaiting: Awaiting::Epoch(0),
                    deadline: now + BEGIN_TIMEOUT,
                    abort: None,
                    steps: VecDeque::new(),
                    stats: BTreeMap::new(),
                    saved: BTreeMap::new(),
                },
                waiting: (0..parts).collect(),
                deadline: now + BEGIN_TIMEOUT,
                refused: None,
            };
            return true;
        }
        if now >= nudged + NUDGE_AFTER {
            nudged = now;
            // Whatever they run is stale, but not the generation about to start (a late copy of this must not stop it).
            let silent: Vec<u32> = (0..parts).filter(|p| !self.ready.contains_key(p)).collect();
            out.push(Output::Nudge {
                keep: gen,
                parts: silent,
            });
        }
        if now >= deadline {
            let missing: Vec<String> = (0..parts)
                .filter(|p| !self.ready.contains_key(p))
                .map(|p| {
                    format!(
                        "{p} (node {})",
                        self.shape.nodes.get(p as usize).map_or("?", String::as_str)
                    )
                })
                .collect();
            out.push(Output::Done(Err(TrainError::PeerLost(format!(
                "partition(s) {} not ready within {wait:?}: restart their nodes (hetgnn node), or raise cluster.rejoin_timeout_ms",
                missing.join(", ")
            )))));
            return false;
        }
        self.phase = Phase::Gathering {
            gen,
            deadline,
            wait,
            nudged,
        };
        false
    }

    fn advance_beginning(
        &mut self,
        now: Duration,
        host: &mut dyn Host,
        out: &mut Vec<Output>,
        mut attempt: Attempt,
        (waiting, deadline, mut refused): (BTreeSet<u32>, Duration, Option<String>),
    ) -> bool {
        if refused.is_none() && !waiting.is_empty() && now >= deadline {
            let late: Vec<u32> = waiting.iter().copied().collect();
            refused = Some(format!(
                "partition(s) {late:?} did not take the start within {BEGIN_TIMEOUT:?}"
            ));
        }
        let what = self.first_awaiting(&attempt).what(self.total());
        let stop = match (refused, attempt.abort.take()) {
            (_, Some(stop)) if stop.fatal => Some(stop.into_error(&what)),
            (Some(refused), _) => Some(TrainError::PeerLost(refused)),
            (None, Some(stop)) => Some(stop.into_error(&what)),
            (None, None) => None,
        };
        if let Some(err) = stop {
            self.end_attempt(now, host, out, attempt.gen, attempt.start_seq(), Err(err));
            return true;
        }
        if !waiting.is_empty() {
            self.phase = Phase::Beginning {
                attempt,
                waiting,
                deadline,
                refused: None,
            };
            return false;
        }
        // Every partition took the start: follow the attempt.
        let first = attempt.start_seq();
        self.pending.clear();
        self.figures.report.epochs = attempt
            .from
            .as_ref()
            .map(|m| m.epochs.clone())
            .unwrap_or_default();
        attempt.awaiting = self.first_awaiting(&attempt);
        attempt.deadline = now + self.deadlines.step;
        match attempt.awaiting {
            Awaiting::Epoch(e) => host.observer().epoch_start(e, self.shape.per_epoch),
            Awaiting::LastCheckpoint if !self.needs_last_checkpoint(first) => {
                self.succeed(now, host, out, attempt.gen, first);
                return true;
            }
            Awaiting::LastCheckpoint => {}
        }
        self.phase = Phase::Running(attempt);
        true
    }

    /// What an attempt from its checkpoint waits for first.
    fn first_awaiting(&self, a: &Attempt) -> Awaiting {
        let epoch = a.start_seq() / self.shape.per_epoch.max(1);
        if epoch < self.t.epochs {
            Awaiting::Epoch(epoch)
        } else {
            Awaiting::LastCheckpoint
        }
    }

    fn total(&self) -> u64 {
        self.shape.per_epoch * self.t.epochs
    }

    /// Whether an attempt from step `first` still waits for the files of the run's last checkpoint.
    fn needs_last_checkpoint(&self, first: u64) -> bool {
        let total = self.total();
        self.t.checkpoint_dir.is_some() && first < total && self.completed != Some(total)
    }

    fn advance_running(
        &mut self,
        now: Duration,
        host: &mut dyn Host,
        out: &mut Vec<Output>,
        mut a: Attempt,
    ) -> bool {
        let total = self.total();
        let what = a.awaiting.what(total);
        if let Some(stop) = a.abort.take() {
            let err = stop.into_error(&what);
            self.end_attempt(now, host, out, a.gen, a.start_seq(), Err(err));
            return true;
        }
        match self.progress(now, host, &mut a) {
            Err(e) => {
                self.end_attempt(now, host, out, a.gen, a.start_seq(), Err(e));
                true
            }
            Ok(true)
                if a.awaiting == Awaiting::LastCheckpoint
                    && !self.needs_last_checkpoint(a.start_seq()) =>
            {
                self.succeed(now, host, out, a.gen, a.start_seq());
                true
            }
            Ok(true) => {
                a.deadline = now + self.deadlines.step;
                self.phase = Phase::Running(a);
                true
            }
            Ok(false) if now >= a.deadline => {
                let err =
                    TrainError::PeerLost(format!("no {what} within {:?}", self.deadlines.step));
                self.end_attempt(now, host, out, a.gen, a.start_seq(), Err(err));
                true
            }
            Ok(false) => {
                self.phase = Phase::Running(a);
                false
            }
        }
    }

    /// Takes the attempt's next news, if it has any: a checkpoint every
    /// partition wrote, a step of the epoch, or every trainer's figures of it.
    fn progress(&mut self, now: Duration, host: &mut dyn Host, a: &mut Attempt) -> Result<bool> {
        let epoch = match a.awaiting {
            Awaiting::LastCheckpoint => {
                let total = self.total();
                return self.take_checkpoint(host, a, |q| q == total);
            }
            Awaiting::Epoch(e) => e,
        };
        if self.take_checkpoint(host, a, |_| true)? {
            return Ok(true);
        }
        // Steps of later epochs wait their turn; earlier ones are stale.
        while let Some(&(e, seq, loss)) = a.steps.front().filter(|(e, _, _)| *e <= epoch) {
            a.steps.pop_front();
            if e == epoch {
                if !loss.is_finite() {
                    return Err(TrainError::Diverged {
                        epoch,
                        step: seq,
                        loss,
                    });
                }
                self.seq = seq + 1;
                self.first_step_at.get_or_insert(now);
                host.observer().step(loss);
                return Ok(true);
            }
        }
        let trainers = self.shape.trainers;
        if !(0..trainers).all(|t| a.stats.contains_key(&(epoch, t))) {
            return Ok(false);
        }
        let stats: Vec<EpochStats> = (0..trainers)
            .filter_map(|t| a.stats.remove(&(epoch, t)))
            .collect();
        let er = self.figures.epoch(self.t, self.rules, epoch, &stats)?;
        host.observer().epoch_end(&er);
        self.figures.report.epochs.push(er);
        self.complete_checkpoints(host)?;
        if epoch + 1 < self.t.epochs {
            a.awaiting = Awaiting::Epoch(epoch + 1);
            host.observer().epoch_start(epoch + 1, self.shape.per_epoch);
        } else {
            a.awaiting = Awaiting::LastCheckpoint;
        }
        Ok(true)
    }

    /// Takes the files of a checkpoint at a step `which` accepts, once every
    /// partition has written them, and completes what it can; whether it took one.
    fn take_checkpoint(
        &mut self,
        host: &mut dyn Host,
        a: &mut Attempt,
        which: impl Fn(u64) -> bool,
    ) -> Result<bool> {
        let parts = self.shape.parts;
        let Some(seq) = a
            .saved
            .keys()
            .map(|k| k.0)
            .find(|&q| which(q) && (0..parts).all(|p| a.saved.contains_key(&(q, p))))
        else {
            return Ok(false);
        };
        let files = (0..parts)
            .filter_map(|p| a.saved.remove(&(seq, p)))
            .collect();
        self.pending.push(files);
        self.complete_checkpoints(host)?;
        Ok(true)
    }

    /// The attempt of `gen` from step `from` reached the end of the run.
    fn succeed(
        &mut self,
        now: Duration,
        host: &mut dyn Host,
        out: &mut Vec<Output>,
        gen: u64,
        from: u64,
    ) {
        let total = self.total();
        self.seq = total;
        self.figures.finish(self.rules, total);
        self.end_attempt(now, host, out, gen, from, Ok(()));
    }

    /// Ends the attempt of `gen` (from step `from`) with `result`: the run is
    /// over, gives up, or gathers its partitions for the next generation.
    fn end_attempt(
        &mut self,
        now: Duration,
        host: &mut dyn Host,
        out: &mut Vec<Output>,
        gen: u64,
        from: u64,
        result: Result<()>,
    ) {
        if let Err(err) = &result {
            // Every trainer of this generation stops (those waiting on the lost node included).
            out.push(Output::Abort {
                gen,
                reason: format!("the coordinator stops generation {gen:x}: {err}"),
            });
        }
        let seq = self.seq;
        let failure = result.as_ref().err().map(ToString::to_string);
        let stepped = self.first_step_at.map(|d| d.as_secs_f64());
        let next = self
            .recovery
            .ended(now.as_secs_f64(), stepped, from, seq, result);
        self.figures.report.failures = self.recovery.failures.clone();
        match next {
            Next::Done => {
                out.push(Output::Done(Ok(())));
                self.phase = Phase::Over;
            }
            Next::GiveUp(err) => {
                out.push(Output::Done(Err(err)));
                self.phase = Phase::Over;
            }
            Next::Retry => {
                let err = failure.unwrap_or_default();
                tracing::warn!("step {seq}: {err}; waiting for every node to be ready again");
                host.observer().note(&format!(
                    "failure at step {seq}: {err}; waiting for every node to be ready"
                ));
                self.phase = self.gather(now, self.deadlines.rejoin);
            }
        }
    }

    /// Writes the manifest of every checkpoint whose files are all written
    /// and whose earlier epochs are reported.
    fn complete_checkpoints(&mut self, host: &mut dyn Host) -> Result<()> {
        if self.t.checkpoint_dir.is_none() {
            return Ok(());
        }
        let per_epoch = self.shape.per_epoch.max(1);
        self.pending.sort_by_key(|v| v.first().map_or(0, |s| s.seq));
        while let Some(saved) = self.pending.first() {
            let seq = saved.first().map_or(0, |s| s.seq);
            let before = (seq / per_epoch) as usize;
            if self.figures.report.epochs.len() < before {
                break;
            }
            let saved = self.pending.remove(0);
            let m = self.manifest(seq, before, saved)?;
            let dir = host.finalize(&m)?;
            self.completed = Some(seq);
            host.observer().note(&format!(
                "checkpoint at step {seq} written to {}",
                dir.display()
            ));
        }
        Ok(())
    }

    /// The manifest of the checkpoint at `seq` (after `before` epochs) from
    /// every partition's report of its files.
    fn manifest(&self, seq: u64, before: usize, saved: Vec<Saved>) -> Result<Manifest> {
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
            self.id.run.clone(),
            &self.figures.report.mode,
            self.t,
            seq,
            self.figures.report.epochs[..before].to_vec(),
            progress,
            files,
        );
        m.graph_sha256 = self.id.graph_sha256.clone();
        Ok(m)
    }
}

/// Generation `attempt` of a coordinator whose numbers are salted with
/// `salt`: distinct across attempts (draws of one counter-based stream are a
/// bijection of the counter before the low bit is set), never 0 (inboxes
/// that never started one).
fn generation(salt: u64, attempt: u32) -> u64 {
    graphs::rng::draw(salt, u64::from(attempt) + 1) | 1
}
