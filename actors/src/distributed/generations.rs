//! A run as a sequence of generations (see `distributed::coordinator`): each
//! partition tells the coordinator it is ready, runs an attempt on each
//! `Begin`, and on failure tells its peers so they stop instead of waiting.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use runtime::Node;

use super::checkpoint;
use super::inbox::Control;
use super::messages::{Abort, Begin, LastAttempt, Ready};
use super::names;
use super::Part;
use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};

/// Waits for training threads (trainers or RAF workers); the first error wins.
pub(crate) fn join_threads<T>(handles: Vec<std::thread::JoinHandle<Result<T>>>) -> Result<Vec<T>> {
    let mut out = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(TrainError::Internal("a training thread panicked".into()));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// How long a failing thread tries to tell the others (best effort: a peer
/// that is down will not answer).
const ABORT_NOTICE: Duration = Duration::from_secs(1);

/// Tells the actors `targets` that `me` (numbered `from`) failed with
/// `error`, best effort (a peer that is down will not answer), so they stop
/// instead of waiting; whether a restart would help goes with it.
pub(crate) fn abort_peers(
    node: &Node,
    handle: &tokio::runtime::Handle,
    me: &str,
    from: u32,
    gen: u64,
    targets: &[String],
    error: &TrainError,
) {
    send_abort(
        node,
        handle,
        me,
        Abort {
            gen,
            all_but: false,
            from,
            reason: error.to_string(),
            fatal: !error.is_recoverable(),
        },
        targets,
    );
}

/// The coordinator tells `targets` to stop generation `gen` for `reason`.
pub(crate) fn stop_gen(
    node: &Node,
    handle: &tokio::runtime::Handle,
    me: &str,
    gen: u64,
    targets: &[String],
    reason: &str,
) {
    let abort = Abort {
        gen,
        all_but: false,
        from: u32::MAX,
        reason: reason.to_string(),
        fatal: false,
    };
    send_abort(node, handle, me, abort, targets);
}

/// Tells `targets` to stop whatever generation they run unless it is `keep`.
pub(crate) fn stop_all_but(
    node: &Node,
    handle: &tokio::runtime::Handle,
    me: &str,
    keep: u64,
    targets: &[String],
    reason: &str,
) {
    send_abort(
        node,
        handle,
        me,
        Abort {
            gen: keep,
            all_but: true,
            from: u32::MAX,
            reason: reason.to_string(),
            fatal: false,
        },
        targets,
    );
}

fn send_abort(
    node: &Node,
    handle: &tokio::runtime::Handle,
    me: &str,
    abort: Abort,
    targets: &[String],
) {
    let Ok(me) = runtime::ActorName::new(me) else {
        return;
    };
    let asks = targets.iter().filter_map(|n| node.actor(n).ok()).map(|r| {
        let (r, abort) = (
            r.with_sender(me.clone()),
            Abort {
                reason: abort.reason.clone(),
                ..abort
            },
        );
        async move { r.ask(abort, ABORT_NOTICE).await }
    });
    let _ = handle.block_on(join_all(asks));
}

/// A node's partition over the run's generations: it tells the coordinator
/// it is ready (again and again, so a restarted coordinator hears it too),
/// and on each `Begin` starts its inboxes' new generation and runs `attempt`.
/// Once the coordinator says the run is over (well), returns the last
/// attempt's result, or `None` if that attempt did not finish (the
/// coordinator had all it needed: a last acknowledgement was lost as it
/// left). `leader` (named `me`) takes the coordinator's words.
pub(crate) fn serve_generations<T>(
    p: &Part,
    me: &str,
    rejoin: Duration,
    resumable: bool,
    mut attempt: impl FnMut(Begin) -> Result<T>,
) -> Result<Option<T>> {
    let (node, handle, part, inboxes) = (p.node, p.handle, p.part, p.inboxes);
    let leader = inboxes
        .first()
        .ok_or_else(|| TrainError::Internal("a partition without trainers".into()))?;
    let me = runtime::ActorName::new(me).map_err(|e| TrainError::Internal(e.to_string()))?;
    let coordinator = node
        .actor(names::COORDINATOR)
        .map_err(|e| TrainError::Internal(e.to_string()))?
        .with_sender(me);
    let incarnation = new_generation();
    let mut last = LastAttempt::None;
    let mut result = None;
    loop {
        let waiting = Instant::now();
        let mut watch = CoordinatorWatch::new(node, rejoin);
        let control = loop {
            let ready = Ready {
                part,
                incarnation,
                last,
            };
            let _ = handle.block_on(coordinator.ask(ready, Duration::from_secs(1)));
            if let Some(c) = leader.control(Duration::from_millis(200)) {
                break c;
            }
            if waiting.elapsed() > rejoin {
                return Err(TrainError::PeerLost(format!(
                    "no word from the coordinator within {rejoin:?}: is its node up?"
                )));
            }
            watch.check(node, resumable)?;
        };
        let b = match control {
            Control::Finish(true) => return Ok(result),
            Control::Finish(false) => {
                return Err(TrainError::PeerLost(
                    "the coordinator gave up the run (its log says why)".into(),
                ))
            }
            Control::Begin(b) => b,
        };
        // The leader started the generation as it took the word.
        for i in &inboxes[1..] {
            i.reset(b.gen);
        }
        match attempt(b) {
            Ok(r) => {
                result = Some(r);
                last = LastAttempt::Done(b.gen);
            }
            Err(e) => {
                result = None;
                tracing::warn!("partition {part}: generation {:x} stopped: {e}", b.gen);
                last = LastAttempt::Failed(b.gen);
            }
        }
    }
}

/// How long a node waits for a coordinator whose node is down: the rejoin
/// timeout when a restarted coordinator could resume the run from its
/// checkpoints, and only a few failure timeouts when the run keeps none (a
/// restart would begin it again from nothing, so waiting only holds ports
/// and memory). Says what it waits for, every half minute.
struct CoordinatorWatch {
    /// The coordinator's node, when it is another node of a topology.
    node: Option<String>,
    /// When the coordinator's node was first seen down in this wait.
    down_since: Option<Instant>,
    last_said: Instant,
    rejoin: Duration,
}

impl CoordinatorWatch {
    fn new(node: &Node, rejoin: Duration) -> CoordinatorWatch {
        let coord = node
            .topology()
            .and_then(|t| t.placed(names::COORDINATOR))
            .filter(|&c| c != node.id())
            .map(str::to_string);
        CoordinatorWatch {
            node: coord,
            down_since: None,
            last_said: Instant::now(),
            rejoin,
        }
    }

    /// Fails when the coordinator's node has been down too long to wait on.
    fn check(&mut self, node: &Node, resumable: bool) -> Result<()> {
        let Some(coord) = &self.node else {
            return Ok(());
        };
        let down = node
            .members()
            .iter()
            .any(|m| &m.id == coord && m.state == runtime::PeerState::Down);
        if !down {
            self.down_since = None;
            return Ok(());
        }
        let since = *self.down_since.get_or_insert_with(Instant::now);
        let failure = node.topology().map_or(Duration::from_secs(2), |t| {
            Duration::from_millis(t.cluster.failure_timeout_ms)
        });
        if !resumable && since.elapsed() > 3 * failure {
            return Err(TrainError::PeerLost(format!(
                "the coordinator's node {coord} is down and this run keeps no checkpoints (training.checkpoint_dir), so no restart of it could resume the run: stopping"
            )));
        }
        if self.last_said.elapsed() > Duration::from_secs(30) {
            self.last_said = Instant::now();
            let left = self.rejoin.saturating_sub(since.elapsed());
            tracing::warn!(
                "the coordinator's node {coord} has been down for {:.0}s; waiting for it to restart and resume from its checkpoints (giving up in {:.0}s)",
                since.elapsed().as_secs_f64(),
                left.as_secs_f64()
            );
        }
        Ok(())
    }
}

/// The checkpoint a `Begin` names: its directory and manifest, which must
/// be of this node's run (`run`: its fingerprint).
pub(crate) fn begin_from(
    t: &TrainingConfig,
    run: &str,
    b: Begin,
) -> Result<Option<(std::path::PathBuf, checkpoint::Manifest)>> {
    match (b.from, &t.checkpoint_dir) {
        (None, _) => Ok(None),
        (Some(seq), Some(root)) => {
            let dir = checkpoint::dir(root, seq);
            let m = checkpoint::manifest(&dir)?;
            if m.run != run {
                return Err(TrainError::Checkpoint(format!(
                    "{}: written by another run than this node's (is training.checkpoint_dir one directory all nodes share, with the same settings?)",
                    dir.display()
                )));
            }
            Ok(Some((dir, m)))
        }
        (Some(seq), None) => Err(TrainError::Config(format!("the coordinator resumes from the checkpoint at step {seq}, but this node has no training.checkpoint_dir"))),
    }
}

/// A number no earlier generation of this run had (with overwhelming odds):
/// a restarted coordinator cannot count on its predecessor's counter.
pub(crate) fn new_generation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    // 0: inboxes that never started one.
    h.finish() | 1
}
