//! A simulated cluster around the coordinator's protocol, in the manner of
//! raft-rs's test harness: the real [`Coordinator`] on node `n0`, and on
//! every node a partition that follows the node side of the protocol
//! (`generations::serve_generations` and the trainer's inbox: `Ready` until
//! a `Begin`, newer `Begin`s only, aborts of its generation, a peer down
//! stops the attempt) around a toy data-parallel model whose every step
//! needs every partition's share. Messages cross a seeded network that
//! delays, duplicates and loses them (a lost copy is sent again, as the
//! transport does, unless the link is cut or an end is down); nodes are
//! killed, frozen and restarted, links cut, checkpoints corrupted. Time is
//! virtual: a run of minutes takes milliseconds, and a seed replays a
//! failure exactly.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::core::{Coordinator, Deadlines, Event, Host, Output, RunId, Shape};
use graphs::rng::{mix64 as mix, CounterRng};

use crate::config::TrainingConfig;
use crate::distributed::checkpoint::Manifest;
use crate::distributed::messages::{
    Abort, Begin, EpochStats, LastAttempt, Progress, Ready, Saved, StepDone,
};
use crate::error::{Result, TrainError};
use crate::modes::seam::PLAIN;
use crate::modes::Mode;
use crate::observer::TrainObserver;
use crate::report::{EpochReport, Report};

/// Heartbeats missed for this long make a peer down.
const FAILURE: Duration = Duration::from_secs(2);
/// A waiting partition says it is ready this often.
const READY_EVERY: Duration = Duration::from_millis(200);
/// A step's compute.
const STEP: Duration = Duration::from_millis(50);
/// A partition's deadline for its peers' shares of a step.
const SHARE_TIMEOUT: Duration = Duration::from_secs(300);

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The seeded RNG of faults (the project's counter-based stream).
struct Rng(CounterRng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(CounterRng::new(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.0.next_f64() < p
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n.max(1))
    }
}

/// A partition's share of step `seq` given the model before it.
fn share(part: u32, seq: u64, model: u64) -> u64 {
    mix(model ^ mix(u64::from(part) << 40 | seq))
}

/// The model after a step whose shares sum to `sum`.
fn stepped(model: u64, sum: u64) -> u64 {
    mix(model.rotate_left(7) ^ sum)
}

/// The model a failure-free run of `parts` partitions ends with after `steps` steps.
fn reference(parts: u32, steps: u64) -> u64 {
    (0..steps).fold(1, |m, seq| {
        let sum = (0..parts).fold(0u64, |s, p| s.wrapping_add(share(p, seq, m)));
        stepped(m, sum)
    })
}

/// What the network carries.
#[derive(Clone, Debug)]
enum Msg {
    /// To the coordinator.
    Ready(Ready),
    Step(StepDone),
    Stats(Box<EpochStats>),
    Saved(Box<Saved>),
    AbortCoordinator(Abort),
    BeginAck {
        part: u32,
        gen: u64,
    },
    /// To a partition.
    Begin(Begin),
    Share {
        gen: u64,
        seq: u64,
        from: u32,
        value: u64,
    },
    Abort(Abort),
    Finish(bool),
}

/// Faults a test schedules.
#[derive(Clone, Debug)]
pub(super) enum Fault {
    /// The node's process dies.
    Kill(u32),
    /// The node's process starts again (a new incarnation).
    Restart(u32),
    /// The node stops running (no heartbeat, no work) for this long.
    Freeze(u32, Duration),
    /// The link between two nodes carries nothing for this long.
    Cut(u32, u32, Duration),
    /// The newest complete checkpoint's files are damaged.
    CorruptNewest,
    /// The partition's attempts fail whenever they reach this step, with an
    /// error that reads as a lost peer (a deadline too short for the step):
    /// only the coordinator's count of failures in a row stops it.
    Refuse(u32, u64),
    /// The partition's attempts fail whenever they reach this step, with an
    /// error it knows a restart repeats (bad input, a bug, a diverged loss).
    Fatal(u32, u64),
}

enum What {
    Deliver {
        to: u32,
        life: u64,
        msg: Msg,
    },
    /// A partition's own timer (its life, what for).
    Timer {
        node: u32,
        life: u64,
        kind: Timer,
    },
    /// The coordinator's deadline (its life).
    CoordinatorTick {
        life: u64,
    },
    /// A peer is reported down to `to` (if it still is).
    Down {
        to: u32,
        peer: u32,
        since: u64,
    },
    Fault(Fault),
}

#[derive(Clone, Copy, Debug)]
enum Timer {
    /// Send `Ready` again while waiting.
    Ready,
    /// The step's compute is done: send the shares of the next one (of this generation).
    Step(u64),
    /// The deadline of the step's shares.
    ShareDeadline(u64),
}

struct Queued {
    at: Duration,
    order: u64,
    what: What,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.order).cmp(&(self.at, self.order))
    }
}

/// The checkpoint directory all nodes share.
#[derive(Default)]
struct Disk {
    /// Each partition's model at a step (its files).
    files: BTreeMap<(u64, u32), u64>,
    /// Complete checkpoints.
    complete: BTreeMap<u64, Manifest>,
    corrupt: BTreeSet<u64>,
}

/// What the coordinator told its user.
#[derive(Default)]
struct Log {
    notes: Vec<String>,
    steps: u64,
    epochs: Vec<u64>,
}

/// Shared with the harness; a `Mutex`, as observers are `Send`.
struct Recorder(Arc<Mutex<Log>>);

impl Recorder {
    fn log(&self) -> MutexGuard<'_, Log> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl TrainObserver for Recorder {
    fn step(&mut self, _loss: f64) {
        self.log().steps += 1;
    }
    fn epoch_end(&mut self, r: &EpochReport) {
        self.log().epochs.push(r.epoch);
    }
    fn note(&mut self, m: &str) {
        self.log().notes.push(m.to_string());
    }
}

struct SimHost {
    disk: Rc<RefCell<Disk>>,
    observer: Recorder,
}

impl Host for SimHost {
    fn observer(&mut self) -> &mut dyn TrainObserver {
        &mut self.observer
    }
    fn latest(&mut self) -> Result<Option<(Manifest, Vec<String>)>> {
        let d = self.disk.borrow();
        let mut skipped = Vec::new();
        for (seq, m) in d.complete.iter().rev() {
            if d.corrupt.contains(seq) {
                skipped.push(format!("step-{seq}: checksum mismatch"));
                continue;
            }
            return Ok(Some((m.clone(), skipped)));
        }
        Ok(None)
    }
    fn finalize(&mut self, m: &Manifest) -> Result<PathBuf> {
        self.disk.borrow_mut().complete.insert(m.seq, m.clone());
        Ok(PathBuf::from(format!("step-{}", m.seq)))
    }
}

/// A partition's attempt of a generation.
struct Attempt {
    gen: u64,
    /// The next step.
    seq: u64,
    model: u64,
    /// Shares of the current step computed and sent (compute done).
    sent: bool,
}

/// The node side of a partition.
struct Partition {
    part: u32,
    incarnation: u64,
    last: LastAttempt,
    /// The newest `Begin` taken (its order), and one waiting to be started.
    begun: (u64, u64),
    begin: Option<Begin>,
    attempt: Option<Attempt>,
    /// Shares by (generation, step, sender): the first copy wins.
    shares: BTreeMap<(u64, u64, u32), u64>,
    /// The model of its last finished attempt.
    outcome: Option<u64>,
    /// The coordinator's last word.
    finished: Option<bool>,
}

struct Node {
    /// 0 while dead; a new number each start (messages to an older life are lost).
    life: u64,
    frozen_until: Option<Duration>,
    part: Option<Partition>,
    coordinator: Option<(Coordinator<'static>, Duration)>,
    /// The coordinator's result, once over.
    result: Option<std::result::Result<(), String>>,
}

/// The settings of a simulated run.
#[derive(Clone, Debug)]
pub(super) struct Setup {
    pub(super) parts: u32,
    pub(super) per_epoch: u64,
    pub(super) epochs: u64,
    pub(super) checkpoint_every: u64,
    /// Each copy of a message is lost with this chance (and sent again).
    pub(super) drop: f64,
    /// Each message is delivered twice with this chance.
    pub(super) duplicate: f64,
    /// Each message takes 1 ms plus up to this much more.
    pub(super) delay: Duration,
    pub(super) rejoin: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            parts: 3,
            per_epoch: 5,
            epochs: 3,
            checkpoint_every: 4,
            drop: 0.0,
            duplicate: 0.0,
            delay: ms(4),
            rejoin: secs(60),
        }
    }
}

/// How a simulated run ended.
pub(super) struct Outcome {
    /// The coordinator's result.
    pub(super) result: std::result::Result<(), String>,
    /// Its report (the last coordinator's, when its node restarted).
    pub(super) report: Report,
    /// Each partition's final model, where its node finished the run.
    pub(super) models: Vec<Option<u64>>,
    /// What the coordinator told its user.
    pub(super) notes: Vec<String>,
    /// Virtual time the run took.
    pub(super) took: Duration,
    /// Messages delivered.
    pub(super) delivered: u64,
    /// Steps computed by all partitions over every attempt (a run without
    /// failures: partitions x steps; each rollback adds what it redoes).
    pub(super) computed: u64,
}

/// A simulated cluster.
pub(super) struct Sim {
    setup: Setup,
    t: &'static TrainingConfig,
    rng: Rng,
    now: Duration,
    queue: BinaryHeap<Queued>,
    order: u64,
    nodes: Vec<Node>,
    lives: u64,
    disk: Rc<RefCell<Disk>>,
    log: Recorder,
    /// Cut links (low node, high node) until this time.
    cuts: BTreeMap<(u32, u32), Duration>,
    /// When each node last became unreachable (for its peers' failure detectors).
    down_since: Vec<u64>,
    last_report: Option<Report>,
    delivered: u64,
    computed: u64,
    /// Partitions that fail at a step, every time.
    refuse: BTreeMap<u32, (u64, bool)>,
}

impl Sim {
    /// A cluster of `setup`, faults seeded with `seed`.
    pub(super) fn new(setup: Setup, seed: u64) -> Sim {
        let t = TrainingConfig {
            mode: Mode::DataParallel,
            epochs: setup.epochs,
            checkpoint_dir: Some(PathBuf::from("sim")),
            checkpoint_every: setup.checkpoint_every,
            ..TrainingConfig::default()
        };
        let mut sim = Sim {
            t: Box::leak(Box::new(t)),
            rng: Rng::new(seed),
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            order: 0,
            nodes: (0..setup.parts)
                .map(|_| Node {
                    life: 0,
                    frozen_until: None,
                    part: None,
                    coordinator: None,
                    result: None,
                })
                .collect(),
            lives: 0,
            disk: Rc::default(),
            log: Recorder(Arc::default()),
            cuts: BTreeMap::new(),
            down_since: vec![0; setup.parts as usize],
            last_report: None,
            delivered: 0,
            computed: 0,
            refuse: BTreeMap::new(),
            setup,
        };
        for n in 0..sim.setup.parts {
            sim.start(n);
        }
        sim
    }

    /// Schedules `fault` at `at`.
    pub(super) fn at(&mut self, at: Duration, fault: Fault) -> &mut Sim {
        self.push(at, What::Fault(fault));
        self
    }

    fn push(&mut self, at: Duration, what: What) {
        self.order += 1;
        self.queue.push(Queued {
            at,
            order: self.order,
            what,
        });
    }

    /// Starts node `n`'s process: its partition, and on `n0` the coordinator.
    fn start(&mut self, n: u32) {
        self.lives += 1;
        let life = self.lives;
        let incarnation = mix(life ^ 0xC0FFEE);
        let node = &mut self.nodes[n as usize];
        node.life = life;
        node.frozen_until = None;
        node.result = None;
        node.part = Some(Partition {
            part: n,
            incarnation,
            last: LastAttempt::None,
            begun: (0, 0),
            begin: None,
            attempt: None,
            shares: BTreeMap::new(),
            outcome: None,
            finished: None,
        });
        if n == 0 {
            let shape = Shape {
                parts: self.setup.parts,
                trainers: self.setup.parts,
                per_epoch: self.setup.per_epoch,
                nodes: (0..self.setup.parts).map(|k| format!("n{k}")).collect(),
                valid: 0,
                test: 0,
            };
            let deadlines = Deadlines {
                start: secs(30),
                rejoin: self.setup.rejoin,
                step: secs(300),
            };
            let id = RunId {
                run: "sim".into(),
                graph_sha256: None,
                started_unix_ms: 1_000_000 + self.now.as_millis() as u64,
                salt: self.rng.next(),
            };
            let c = Coordinator::new(self.t, &PLAIN, shape, deadlines, id);
            self.nodes[0].coordinator = Some((c, self.now));
            self.coordinator(Event::Tick);
        }
        self.timer_at(n, self.now, Timer::Ready);
    }

    fn host(&self) -> SimHost {
        SimHost {
            disk: self.disk.clone(),
            observer: Recorder(Arc::clone(&self.log.0)),
        }
    }

    /// Sets node `n`'s timer `kind` (of its current life) for `at`.
    fn timer_at(&mut self, n: u32, at: Duration, kind: Timer) {
        let life = self.nodes[n as usize].life;
        self.push(
            at,
            What::Timer {
                node: n,
                life,
                kind,
            },
        );
    }

    /// `what` if its node runs now in the life it was meant for; work for an
    /// older life is dropped, and a frozen node's is put off until it wakes.
    fn gate(&mut self, what: What) -> Option<What> {
        let (n, life) = match &what {
            What::Deliver { to, life, .. } => (*to, *life),
            What::Timer { node, life, .. } => (*node, *life),
            What::CoordinatorTick { life } => (0, *life),
            What::Down { .. } | What::Fault(_) => return Some(what),
        };
        let node = &self.nodes[n as usize];
        if node.life != life {
            return None;
        }
        if let Some(until) = node.frozen_until.filter(|&t| self.now < t) {
            self.push(until, what);
            return None;
        }
        Some(what)
    }

    /// Whether a message from `a` to `b` can pass now.
    fn linked(&self, a: u32, b: u32) -> bool {
        let key = (a.min(b), a.max(b));
        self.cuts.get(&key).is_none_or(|&until| self.now >= until)
    }

    fn up(&self, n: u32) -> bool {
        let node = &self.nodes[n as usize];
        node.life != 0 && node.frozen_until.is_none_or(|t| self.now >= t)
    }

    /// Sends `msg` from node `from` to node `to`.
    fn send(&mut self, from: u32, to: u32, msg: Msg) {
        let life = self.nodes[to as usize].life;
        if life == 0 || !self.linked(from, to) {
            return;
        }
        let copies = if self.rng.chance(self.setup.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at =
                self.now + ms(1) + ms(self.rng.below(self.setup.delay.as_millis() as u64 + 1));
            // A lost copy is sent again by the transport, after a while.
            let mut retry = ms(200);
            while self.rng.chance(self.setup.drop) {
                at += retry;
                retry = (retry * 2).min(secs(5));
            }
            self.push(
                at,
                What::Deliver {
                    to,
                    life,
                    msg: msg.clone(),
                },
            );
        }
    }

    /// Runs until every node is done or `limit` of virtual time passed.
    pub(super) fn run(&mut self, limit: Duration) -> Outcome {
        while let Some(q) = self.queue.pop() {
            if q.at > limit {
                break;
            }
            self.now = self.now.max(q.at);
            self.step(q.what);
            if self.over() {
                break;
            }
        }
        let report = self.nodes[0]
            .coordinator
            .as_ref()
            .map(|(c, _)| c.report().clone())
            .or_else(|| self.last_report.clone())
            .unwrap_or_default();
        let result = self.nodes[0]
            .result
            .clone()
            .unwrap_or_else(|| Err(format!("not over within {limit:?}")));
        Outcome {
            result,
            report,
            models: self
                .nodes
                .iter()
                .map(|n| n.part.as_ref().and_then(|p| p.outcome))
                .collect(),
            notes: self.log.log().notes.clone(),
            took: self.now,
            delivered: self.delivered,
            computed: self.computed,
        }
    }

    /// The run is over once the coordinator is and every live partition heard it.
    fn over(&self) -> bool {
        self.nodes[0].result.is_some()
            && self
                .nodes
                .iter()
                .all(|n| n.life == 0 || n.part.as_ref().is_some_and(|p| p.finished.is_some()))
    }

    fn step(&mut self, what: What) {
        let Some(what) = self.gate(what) else {
            return;
        };
        match what {
            What::Fault(f) => self.fault(f),
            What::Down { to, peer, since } => {
                // Still unreachable since then, and `to` runs: its detector reports it.
                let unreachable = !self.up(peer) || !self.linked(to, peer);
                if unreachable && self.down_since[peer as usize] == since && self.up(to) {
                    self.peer_down(to, peer);
                }
            }
            What::Deliver { to, msg, .. } => {
                self.delivered += 1;
                self.deliver(to, msg);
            }
            What::Timer { node, kind, .. } => self.timer(node, kind),
            What::CoordinatorTick { .. } => {
                if self.nodes[0]
                    .coordinator
                    .as_ref()
                    .and_then(|(c, at)| c.poll_timeout().map(|d| *at + d))
                    .is_some_and(|due| due <= self.now)
                {
                    self.coordinator(Event::Tick);
                }
            }
        }
    }

    fn fault(&mut self, f: Fault) {
        match f {
            Fault::Kill(n) => {
                let node = &mut self.nodes[n as usize];
                if n == 0 {
                    if let Some((c, _)) = node.coordinator.take() {
                        self.last_report = Some(c.into_report());
                    }
                }
                let node = &mut self.nodes[n as usize];
                node.life = 0;
                node.part = None;
                self.unreachable(n);
            }
            Fault::Restart(n) => {
                if self.nodes[n as usize].life == 0 {
                    self.start(n);
                }
            }
            Fault::Freeze(n, d) => {
                self.nodes[n as usize].frozen_until = Some(self.now + d);
                self.unreachable(n);
            }
            Fault::Cut(a, b, d) => {
                self.cuts.insert((a.min(b), a.max(b)), self.now + d);
                let since = self.lives + self.order;
                for (to, peer) in [(a, b), (b, a)] {
                    self.down_since[peer as usize] = since;
                    self.push(self.now + FAILURE, What::Down { to, peer, since });
                }
            }
            Fault::Refuse(n, step) => {
                self.refuse.insert(n, (step, false));
            }
            Fault::Fatal(n, step) => {
                self.refuse.insert(n, (step, true));
            }
            Fault::CorruptNewest => {
                let mut d = self.disk.borrow_mut();
                if let Some(&seq) = d.complete.keys().next_back() {
                    d.corrupt.insert(seq);
                }
            }
        }
    }

    /// Node `n` stopped answering: every other node's detector reports it
    /// after the failure timeout, if it has not come back by then.
    fn unreachable(&mut self, n: u32) {
        let since = self.lives + self.order;
        self.down_since[n as usize] = since;
        for to in 0..self.setup.parts {
            if to != n {
                self.push(self.now + FAILURE, What::Down { to, peer: n, since });
            }
        }
    }

    fn peer_down(&mut self, to: u32, peer: u32) {
        if to == 0 && self.nodes[0].coordinator.is_some() {
            self.coordinator(Event::PeerDown(format!("n{peer}")));
        }
        // The node's watch aborts whatever its partition runs.
        self.fail(to, &format!("node n{peer} stopped answering"), false);
    }

    /// Feeds the coordinator (on `n0`) and sends what it says.
    fn coordinator(&mut self, ev: Event) {
        let mut host = self.host();
        let Some((c, started)) = self.nodes[0].coordinator.as_mut() else {
            return;
        };
        let outputs = c.handle(self.now - *started, ev, &mut host);
        let due = c.poll_timeout().map(|d| *started + d);
        let life = self.nodes[0].life;
        if let Some(due) = due {
            self.push(due.max(self.now), What::CoordinatorTick { life });
        }
        for o in outputs {
            match o {
                Output::Done(r) => {
                    self.nodes[0].result = Some(r.map_err(|e| e.to_string()));
                    for p in 0..self.setup.parts {
                        self.send(
                            0,
                            p,
                            Msg::Finish(self.nodes[0].result.as_ref().is_some_and(|r| r.is_ok())),
                        );
                    }
                }
                Output::Nudge { keep, parts } => {
                    for p in parts {
                        self.send(
                            0,
                            p,
                            Msg::Abort(Abort {
                                gen: keep,
                                all_but: true,
                                from: u32::MAX,
                                reason: "the coordinator is starting the run again".into(),
                                fatal: false,
                            }),
                        );
                    }
                }
                Output::Abort { gen, reason } => {
                    for p in 0..self.setup.parts {
                        self.send(
                            0,
                            p,
                            Msg::Abort(Abort {
                                gen,
                                all_but: false,
                                from: u32::MAX,
                                reason: reason.clone(),
                                fatal: false,
                            }),
                        );
                    }
                }
                Output::Begin(b) => {
                    for p in 0..self.setup.parts {
                        self.send(0, p, Msg::Begin(b));
                    }
                }
            }
        }
    }

    fn deliver(&mut self, to: u32, msg: Msg) {
        let ev = match msg {
            Msg::Ready(r) => Event::Ready(r),
            Msg::Step(s) => Event::Step(s),
            Msg::Stats(s) => Event::Stats(s),
            Msg::Saved(s) => Event::Saved(s),
            Msg::AbortCoordinator(a) => Event::Abort(a),
            Msg::BeginAck { part, gen } => Event::Begun {
                part,
                gen,
                result: Ok(()),
            },
            Msg::Begin(b) => {
                self.take_begin(to, b);
                self.send(
                    to,
                    0,
                    Msg::BeginAck {
                        part: to,
                        gen: b.gen,
                    },
                );
                return;
            }
            Msg::Share {
                gen,
                seq,
                from,
                value,
            } => {
                if let Some(p) = self.nodes[to as usize].part.as_mut() {
                    p.shares.entry((gen, seq, from)).or_insert(value);
                }
                self.try_step(to);
                return;
            }
            Msg::Abort(a) => {
                let Some(p) = self.nodes[to as usize].part.as_ref() else {
                    return;
                };
                if let Some(at) = &p.attempt {
                    if (at.gen == a.gen) != a.all_but {
                        self.fail(to, &a.reason, false);
                    }
                }
                return;
            }
            Msg::Finish(ok) => {
                if let Some(p) = self.nodes[to as usize].part.as_mut() {
                    p.finished.get_or_insert(ok);
                }
                self.fail(to, "the run is over", false);
                return;
            }
        };
        if to == 0 {
            self.coordinator(ev);
        }
    }

    /// A newer `Begin` stops the running generation and is kept for the node's loop.
    fn take_begin(&mut self, n: u32, b: Begin) {
        let Some(p) = self.nodes[n as usize].part.as_mut() else {
            return;
        };
        if b.order <= p.begun {
            return;
        }
        p.begun = b.order;
        p.begin = Some(b);
        let stale = p.attempt.as_ref().is_some_and(|a| a.gen != b.gen);
        if stale {
            self.fail(n, "the coordinator restarts the run", false);
        }
        self.start_attempt(n);
    }

    /// Starts the `Begin` waiting, if the partition is idle.
    fn start_attempt(&mut self, n: u32) {
        let disk = self.disk.clone();
        let Some(p) = self.nodes[n as usize].part.as_mut() else {
            return;
        };
        if p.attempt.is_some() || p.finished.is_some() {
            return;
        }
        let Some(b) = p.begin.take() else {
            return;
        };
        let (seq, model) = match b.from {
            None => (0, 1),
            Some(seq) => {
                let d = disk.borrow();
                match d.files.get(&(seq, p.part)) {
                    Some(&m) if d.complete.contains_key(&seq) && !d.corrupt.contains(&seq) => {
                        (seq, m)
                    }
                    _ => {
                        p.last = LastAttempt::Failed(b.gen);
                        self.timer_at(n, self.now, Timer::Ready);
                        return;
                    }
                }
            }
        };
        p.shares.retain(|(g, _, _), _| *g == b.gen);
        p.outcome = None;
        if seq >= self.setup.per_epoch * self.setup.epochs {
            // Resumed at the very end: nothing left to do.
            p.outcome = Some(model);
            p.last = LastAttempt::Done(b.gen);
            self.timer_at(n, self.now, Timer::Ready);
            return;
        }
        p.attempt = Some(Attempt {
            gen: b.gen,
            seq,
            model,
            sent: false,
        });
        self.timer_at(n, self.now + STEP, Timer::Step(b.gen));
    }

    /// The partition's attempt stops (if it runs): it tells its peers and
    /// the coordinator (whether a restart would repeat it: `fatal`), and
    /// waits for the next word.
    fn fail(&mut self, n: u32, reason: &str, fatal: bool) {
        let parts = self.setup.parts;
        let Some(p) = self.nodes[n as usize].part.as_mut() else {
            return;
        };
        let Some(a) = p.attempt.take() else {
            return;
        };
        p.last = LastAttempt::Failed(a.gen);
        let abort = Abort {
            gen: a.gen,
            all_but: false,
            from: p.part,
            reason: reason.to_string(),
            fatal,
        };
        for k in 0..parts {
            if k != n {
                self.send(n, k, Msg::Abort(abort.clone()));
            }
        }
        self.send(n, 0, Msg::AbortCoordinator(abort));
        self.timer_at(n, self.now, Timer::Ready);
    }

    fn timer(&mut self, n: u32, kind: Timer) {
        let parts = self.setup.parts;
        match kind {
            Timer::Ready => {
                let Some(p) = self.nodes[n as usize].part.as_ref() else {
                    return;
                };
                if p.attempt.is_some() || p.finished.is_some() {
                    return;
                }
                let r = Ready {
                    part: p.part,
                    incarnation: p.incarnation,
                    last: p.last,
                };
                self.send(n, 0, Msg::Ready(r));
                self.timer_at(n, self.now + READY_EVERY, Timer::Ready);
            }
            Timer::Step(gen) => {
                let Some(p) = self.nodes[n as usize].part.as_mut() else {
                    return;
                };
                let Some(a) = p.attempt.as_mut().filter(|a| !a.sent && a.gen == gen) else {
                    return;
                };
                if let Some(&(_, fatal)) = self.refuse.get(&n).filter(|(at, _)| *at == a.seq) {
                    let seq = a.seq;
                    let why = format!("partition {n} cannot read its rows of step {seq}");
                    self.fail(n, &why, fatal);
                    return;
                }
                a.sent = true;
                let (gen, seq) = (a.gen, a.seq);
                let value = share(p.part, seq, a.model);
                p.shares.entry((gen, seq, p.part)).or_insert(value);
                for k in 0..parts {
                    if k != n {
                        self.send(
                            n,
                            k,
                            Msg::Share {
                                gen,
                                seq,
                                from: n,
                                value,
                            },
                        );
                    }
                }
                self.timer_at(n, self.now + SHARE_TIMEOUT, Timer::ShareDeadline(seq));
                self.try_step(n);
            }
            Timer::ShareDeadline(seq) => {
                let late = self.nodes[n as usize]
                    .part
                    .as_ref()
                    .and_then(|p| p.attempt.as_ref())
                    .is_some_and(|a| a.seq == seq);
                if late {
                    self.fail(
                        n,
                        &format!("no gradients of step {seq} within {SHARE_TIMEOUT:?}"),
                        false,
                    );
                }
            }
        }
    }

    /// Takes the step whose shares are all there: the model moves on, and
    /// the partition reports the step, its epoch's figures and its checkpoint files.
    fn try_step(&mut self, n: u32) {
        let (parts, per_epoch, every) = (
            self.setup.parts,
            self.setup.per_epoch,
            self.setup.checkpoint_every,
        );
        let total = per_epoch * self.setup.epochs;
        let Some(p) = self.nodes[n as usize].part.as_mut() else {
            return;
        };
        let Some(a) = p.attempt.as_mut().filter(|a| a.sent) else {
            return;
        };
        let (gen, seq) = (a.gen, a.seq);
        if !(0..parts).all(|k| p.shares.contains_key(&(gen, seq, k))) {
            return;
        }
        let sum = (0..parts).fold(0u64, |s, k| {
            s.wrapping_add(p.shares.remove(&(gen, seq, k)).unwrap_or_default())
        });
        a.model = stepped(a.model, sum);
        a.seq += 1;
        self.computed += 1;
        a.sent = false;
        let (done, model, part) = (a.seq, a.model, p.part);
        let mut out = Vec::new();
        if part == 0 {
            out.push(Msg::Step(StepDone {
                gen,
                epoch: seq / per_epoch,
                seq,
                loss: (model % 1000) as f64 / 1000.0,
            }));
        }
        if done.is_multiple_of(per_epoch) {
            out.push(Msg::Stats(Box::new(EpochStats {
                gen,
                trainer: part,
                epoch: seq / per_epoch,
                steps: per_epoch,
                ..EpochStats::default()
            })));
        }
        if done.is_multiple_of(every) || done == total {
            self.disk.borrow_mut().files.insert((done, part), model);
            out.push(Msg::Saved(Box::new(Saved {
                gen,
                seq: done,
                part,
                files: vec![(format!("part{part}.safetensors"), format!("{model:064x}"))],
                progress: (part == 0).then(Progress::default),
            })));
        }
        for m in out {
            self.send(n, 0, m);
        }
        let p = self.nodes[n as usize].part.as_mut().expect("checked above");
        if done == total {
            // The attempt is over: the node waits for the coordinator's word.
            p.attempt = None;
            p.outcome = Some(model);
            p.last = LastAttempt::Done(gen);
            self.timer_at(n, self.now, Timer::Ready);
        } else {
            self.timer_at(n, self.now + STEP, Timer::Step(gen));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> Setup {
        Setup::default()
    }

    fn total(s: &Setup) -> u64 {
        s.per_epoch * s.epochs
    }

    /// The run ended well with the failure-free model on every node, every
    /// epoch reported once and in order.
    fn assert_exact(s: &Setup, o: &Outcome) {
        assert_eq!(o.result, Ok(()), "notes: {:#?}", o.notes);
        let want = reference(s.parts, total(s));
        for (k, m) in o.models.iter().enumerate() {
            assert_eq!(
                *m,
                Some(want),
                "partition {k}'s model; notes: {:#?}",
                o.notes
            );
        }
        let epochs: Vec<u64> = o.report.epochs.iter().map(|e| e.epoch).collect();
        assert_eq!(epochs, (0..s.epochs).collect::<Vec<_>>());
        assert_eq!(o.report.steps, total(s));
    }

    #[test]
    fn a_failure_free_run_takes_every_step_once() {
        let s = setup();
        let o = Sim::new(s.clone(), 1).run(secs(600));
        assert_exact(&s, &o);
        assert!(o.report.failures.is_empty());
        assert!(o.took < secs(5), "{:?}", o.took);
    }

    #[test]
    fn lossy_duplicating_delaying_links_change_nothing() {
        let s = Setup {
            drop: 0.2,
            duplicate: 0.2,
            delay: ms(40),
            ..setup()
        };
        for seed in 0..20 {
            let o = Sim::new(s.clone(), seed).run(secs(600));
            assert_exact(&s, &o);
            assert!(
                o.report.failures.is_empty(),
                "seed {seed}: {:?}",
                o.report.failures
            );
        }
    }

    #[test]
    fn a_killed_node_restarted_rejoins_and_the_run_ends_with_the_same_model() {
        let s = setup();
        let mut sim = Sim::new(s.clone(), 7);
        sim.at(ms(500), Fault::Kill(2))
            .at(secs(5), Fault::Restart(2));
        let o = sim.run(secs(600));
        assert_exact(&s, &o);
        let f = &o.report.failures;
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].what.contains("n2"), "{}", f[0].what);
        assert!(f[0].resumed_from_step <= f[0].failed_at_step);
        assert_eq!(f[0].resumed_from_step % s.checkpoint_every, 0);
        assert!(f[0].rejoined_at_s >= 5.0 && f[0].resumed_at_s >= f[0].rejoined_at_s);
        assert!(
            o.notes.iter().any(|n| n.contains("rolling back to step")),
            "{:#?}",
            o.notes
        );
        assert_rolled_back(&s, &o);
    }

    /// Only the steps since the last checkpoint were computed again (not the run from its start).
    fn assert_rolled_back(s: &Setup, o: &Outcome) {
        let bound = u64::from(s.parts) * (total(s) + s.checkpoint_every + 1);
        assert!(
            o.computed <= bound,
            "{} steps computed, at most {bound}",
            o.computed
        );
        assert!(o.computed >= u64::from(s.parts) * total(s));
    }

    #[test]
    fn a_node_restarted_before_it_is_missed_is_caught_by_its_new_incarnation() {
        let s = setup();
        let mut sim = Sim::new(s.clone(), 3);
        sim.at(ms(400), Fault::Kill(1))
            .at(ms(600), Fault::Restart(1));
        let o = sim.run(secs(600));
        assert_exact(&s, &o);
        assert!(
            o.took < secs(5),
            "not waiting out a step deadline: {:?}",
            o.took
        );
        assert_eq!(o.report.failures.len(), 1);
        assert!(
            o.report.failures[0].what.contains("restarted")
                || o.report.failures[0].what.contains("n1"),
            "{:?}",
            o.report.failures
        );
    }

    /// A coordinator of 2 partitions (one trainer each), 2 steps per epoch,
    /// 2 epochs, a checkpoint every 2 steps, and its host.
    fn lone() -> (Coordinator<'static>, SimHost) {
        let t = Box::leak(Box::new(TrainingConfig {
            mode: Mode::DataParallel,
            epochs: 2,
            checkpoint_dir: Some(PathBuf::from("sim")),
            checkpoint_every: 2,
            ..TrainingConfig::default()
        }));
        let shape = Shape {
            parts: 2,
            trainers: 2,
            per_epoch: 2,
            nodes: vec!["n0".into(), "n1".into()],
            valid: 0,
            test: 0,
        };
        let deadlines = Deadlines {
            start: secs(30),
            rejoin: secs(60),
            step: secs(300),
        };
        let id = RunId {
            run: "sim".into(),
            graph_sha256: None,
            started_unix_ms: 1,
            salt: 42,
        };
        let host = SimHost {
            disk: Rc::default(),
            observer: Recorder(Arc::default()),
        };
        (Coordinator::new(t, &PLAIN, shape, deadlines, id), host)
    }

    /// Gathers both partitions (incarnations 10 and 11) and has them take
    /// the start; returns the generation.
    fn begun(c: &mut Coordinator, h: &mut SimHost, now: Duration) -> u64 {
        for part in 0..2 {
            let out = c.handle(
                now,
                Event::Ready(Ready {
                    part,
                    incarnation: 10 + u64::from(part),
                    last: LastAttempt::None,
                }),
                h,
            );
            if part == 1 {
                let Some(Output::Begin(b)) = out.into_iter().next() else {
                    panic!("every partition is ready: the coordinator begins");
                };
                for part in 0..2 {
                    assert!(c
                        .handle(
                            now,
                            Event::Begun {
                                part,
                                gen: b.gen,
                                result: Ok(())
                            },
                            h
                        )
                        .is_empty());
                }
                return b.gen;
            }
            assert!(out.is_empty());
        }
        unreachable!()
    }

    fn step(gen: u64, seq: u64, loss: f64) -> Event {
        Event::Step(StepDone {
            gen,
            epoch: seq / 2,
            seq,
            loss,
        })
    }

    #[test]
    fn messages_of_another_generation_and_late_copies_of_ready_change_nothing() {
        let (mut c, mut h) = lone();
        let gen = begun(&mut c, &mut h, ms(500));
        assert!(
            c.handle(secs(2), step(gen ^ 2, 0, f64::NAN), &mut h)
                .is_empty(),
            "another generation's step is dropped"
        );
        let late = Ready {
            part: 1,
            incarnation: 11,
            last: LastAttempt::None,
        };
        assert!(
            c.handle(secs(2), Event::Ready(late), &mut h).is_empty(),
            "a late copy from before the start"
        );
        assert!(c.handle(secs(2), step(gen, 0, 0.5), &mut h).is_empty());
        assert_eq!(h.observer.log().steps, 1);
        // A new incarnation of partition 1 means its node restarted: the generation stops.
        let restarted = Ready {
            part: 1,
            incarnation: 99,
            last: LastAttempt::None,
        };
        let out = c.handle(secs(3), Event::Ready(restarted), &mut h);
        assert!(
            matches!(&out[..], [Output::Abort { gen: g, reason }] if *g == gen && reason.contains("the node of partition 1 restarted")),
            "{out:?}"
        );
        assert_eq!(
            c.poll_timeout(),
            Some(secs(4)),
            "gathering again, nudging silent partitions after a second"
        );
    }

    #[test]
    fn a_step_deadline_passed_is_a_lost_peer_and_the_run_gathers_again() {
        let (mut c, mut h) = lone();
        let gen = begun(&mut c, &mut h, ms(500));
        assert_eq!(c.poll_timeout(), Some(ms(300_500)));
        assert!(c.handle(secs(300), Event::Tick, &mut h).is_empty());
        let out = c.handle(ms(300_500), Event::Tick, &mut h);
        assert!(
            matches!(&out[..], [Output::Abort { gen: g, reason }] if *g == gen && reason.contains("no progress of epoch 0 within 300s")),
            "{out:?}"
        );
        // Nobody ready within the rejoin timeout: the run stops naming the partitions.
        let mut last = Vec::new();
        let mut now = ms(300_500);
        while let Some(due) = c.poll_timeout() {
            now = due;
            last = c.handle(now, Event::Tick, &mut h);
        }
        assert_eq!(now, ms(360_500));
        match &last[..] {
            [Output::Nudge { .. }, Output::Done(Err(e))] | [Output::Done(Err(e))] => {
                let e = e.to_string();
                assert!(
                    e.contains("partition(s) 0 (node n0), 1 (node n1) not ready within 60s"),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_diverged_loss_or_a_malformed_checkpoint_report_stops_the_run_at_once() {
        let (mut c, mut h) = lone();
        let gen = begun(&mut c, &mut h, ms(500));
        let out = c.handle(secs(2), step(gen, 0, f64::INFINITY), &mut h);
        assert!(
            matches!(
                &out[..],
                [
                    Output::Abort { .. },
                    Output::Done(Err(TrainError::Diverged { step: 0, .. }))
                ]
            ),
            "{out:?}"
        );
        assert_eq!(c.poll_timeout(), None, "over: no retry");

        let (mut c, mut h) = lone();
        let gen = begun(&mut c, &mut h, ms(500));
        for part in 0..2 {
            let saved = Saved {
                gen,
                seq: 2,
                part,
                files: vec![(format!("../escape{part}.safetensors"), "0".repeat(64))],
                progress: Some(Progress::default()),
            };
            c.handle(secs(2), Event::Saved(Box::new(saved)), &mut h);
        }
        let stats = |trainer| {
            Event::Stats(Box::new(EpochStats {
                gen,
                trainer,
                epoch: 0,
                steps: 2,
                ..EpochStats::default()
            }))
        };
        c.handle(secs(2), stats(0), &mut h);
        let out = c.handle(secs(2), stats(1), &mut h);
        match &out[..] {
            [Output::Abort { .. }, Output::Done(Err(e @ TrainError::Checkpoint(_)))] => {
                assert!(e.to_string().contains("bad file entry"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert!(h.disk.borrow().complete.is_empty(), "no manifest written");
    }

    #[test]
    fn a_node_frozen_past_the_failure_timeout_rejoins_when_it_wakes() {
        let s = setup();
        let mut sim = Sim::new(s.clone(), 11);
        sim.at(ms(450), Fault::Freeze(1, secs(6)));
        let o = sim.run(secs(600));
        assert_exact(&s, &o);
        assert_eq!(o.report.failures.len(), 1, "{:?}", o.report.failures);
        assert!(o.report.failures[0].rejoined_at_s >= 6.0);
    }

    #[test]
    fn a_cut_link_is_a_lost_node_recovered_when_it_heals() {
        let s = setup();
        let mut sim = Sim::new(s.clone(), 5);
        sim.at(ms(300), Fault::Cut(1, 2, secs(4)));
        let o = sim.run(secs(600));
        assert_exact(&s, &o);
        assert!(!o.report.failures.is_empty());
    }

    #[test]
    fn the_coordinators_node_killed_and_restarted_resumes_from_its_checkpoint() {
        let s = setup();
        let mut sim = Sim::new(s.clone(), 13);
        sim.at(ms(700), Fault::Kill(0))
            .at(secs(4), Fault::Restart(0));
        let o = sim.run(secs(600));
        assert_exact(&s, &o);
        let from = o
            .report
            .resumed_from_step
            .expect("the new coordinator resumed");
        assert!(
            from > 0 && from.is_multiple_of(s.checkpoint_every),
            "{from}"
        );
        assert_rolled_back(&s, &o);
    }

    #[test]
    fn a_corrupted_newest_checkpoint_is_skipped_for_the_one_before() {
        let s = setup();
        let mut sim = Sim::new(s.clone(), 17);
        sim.at(ms(700), Fault::Kill(0))
            .at(ms(701), Fault::CorruptNewest)
            .at(secs(4), Fault::Restart(0));
        let o = sim.run(secs(600));
        assert_exact(&s, &o);
        assert!(
            o.notes
                .iter()
                .any(|n| n.starts_with("skipped checkpoint: step-")),
            "{:#?}",
            o.notes
        );
    }

    #[test]
    fn a_node_that_never_returns_stops_the_run_after_the_rejoin_timeout_naming_it() {
        let s = Setup {
            rejoin: secs(20),
            ..setup()
        };
        let mut sim = Sim::new(s, 19);
        sim.at(ms(500), Fault::Kill(2));
        let o = sim.run(secs(600));
        let err = o.result.unwrap_err();
        assert!(
            err.contains("partition(s) 2 (node n2) not ready within 20s"),
            "{err}"
        );
        assert!(o.took < secs(30), "{:?}", o.took);
        assert_eq!(o.models, vec![None; 3], "no partition finished");
    }

    #[test]
    fn a_failure_that_every_restart_repeats_stops_the_run_with_its_message() {
        let s = setup();
        let mut sim = Sim::new(s.clone(), 23);
        sim.at(Duration::ZERO, Fault::Refuse(1, 9));
        let o = sim.run(secs(3600));
        let err = o.result.unwrap_err();
        assert!(
            err.contains("failed 3 times at step 9 after rolling back to step 8")
                && err.contains("partition 1 cannot read its rows of step 9"),
            "{err}"
        );
        assert!(
            o.took < secs(10),
            "nothing waits out a deadline: {:?}",
            o.took
        );
        assert_eq!(o.models, vec![None; 3]);
    }

    #[test]
    fn a_failure_its_node_knows_a_restart_repeats_stops_the_run_without_a_rollback() {
        let mut sim = Sim::new(setup(), 23);
        sim.at(Duration::ZERO, Fault::Fatal(1, 9));
        let o = sim.run(secs(3600));
        let err = o.result.unwrap_err();
        assert!(
            err.contains("trainer 1: partition 1 cannot read its rows of step 9")
                && err.contains("a restart from the last checkpoint would repeat it"),
            "{err}"
        );
        assert!(o.report.failures.is_empty(), "{:?}", o.report.failures);
        assert!(
            !o.notes.iter().any(|n| n.contains("rolling back")),
            "{:?}",
            o.notes
        );
        assert_eq!(o.computed, 9 * 3, "no step computed twice");
        assert_eq!(o.models, vec![None; 3]);
    }

    #[test]
    fn random_faults_end_with_the_failure_free_model_and_a_seed_replays_its_run() {
        let s = Setup {
            drop: 0.05,
            duplicate: 0.05,
            delay: ms(20),
            ..setup()
        };
        for seed in 0..24u64 {
            let plan = |sim: &mut Sim| {
                let mut r = Rng::new(seed ^ 0xFA17);
                for _ in 0..2 {
                    let at = ms(100 + r.below(1500));
                    let n = r.below(3) as u32;
                    match r.below(3) {
                        0 => sim
                            .at(at, Fault::Kill(n))
                            .at(at + ms(500 + r.below(5000)), Fault::Restart(n)),
                        1 => sim.at(at, Fault::Freeze(n, ms(r.below(6000)))),
                        _ => sim.at(at, Fault::Cut(n, (n + 1) % 3, ms(r.below(6000)))),
                    };
                }
            };
            let mut a = Sim::new(s.clone(), seed);
            plan(&mut a);
            let oa = a.run(secs(3600));
            assert_exact(&s, &oa);
            let mut b = Sim::new(s.clone(), seed);
            plan(&mut b);
            let ob = b.run(secs(3600));
            assert_eq!(
                (oa.took, oa.delivered, oa.notes),
                (ob.took, ob.delivered, ob.notes),
                "seed {seed} replays"
            );
        }
    }
}
