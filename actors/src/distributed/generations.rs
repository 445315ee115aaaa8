//! A run as a sequence of generations (see [`super::coordinator`]): each
//! partition tells the coordinator it is ready, runs an attempt on each
//! `Begin`, and on failure tells its peers so they stop instead of waiting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use futures_util::future::join_all;
use runtime::Node;

use super::checkpoint;
use super::coordinator;
use super::inbox::{Control, Inbox, InboxActor};
use super::messages::{Abort, Begin, EpochStats, LastAttempt, Ready, Saved, StepDone};
use super::names;
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
                first_err.get_or_insert(TrainError::Distributed("a training thread panicked".into()));
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

/// Tells the actors `targets` that `me` (numbered `from`) failed, best effort
/// (a peer that is down will not answer), so they stop instead of waiting.
pub(crate) fn abort_peers(node: &Node, handle: &tokio::runtime::Handle, me: &str, from: u32, gen: u64, targets: &[String], reason: &str) {
    send_abort(node, handle, me, Abort { gen, all_but: false, from, reason: reason.to_string() }, targets);
}

/// Tells `targets` to stop whatever generation they run unless it is `keep`.
pub(crate) fn stop_all_but(node: &Node, handle: &tokio::runtime::Handle, me: &str, keep: u64, targets: &[String], reason: &str) {
    send_abort(node, handle, me, Abort { gen: keep, all_but: true, from: u32::MAX, reason: reason.to_string() }, targets);
}

fn send_abort(node: &Node, handle: &tokio::runtime::Handle, me: &str, abort: Abort, targets: &[String]) {
    let Ok(me) = runtime::ActorName::new(me) else { return };
    let asks = targets.iter().filter_map(|n| node.actor(n).ok()).map(|r| {
        let (r, abort) = (r.with_sender(me.clone()), Abort { reason: abort.reason.clone(), ..abort });
        async move { r.ask(abort, ABORT_NOTICE).await }
    });
    let _ = handle.block_on(join_all(asks));
}

/// Registers the coordinator's inbox on `node`.
pub(crate) fn serve_coordinator(node: &Node) -> Result<Arc<Inbox>> {
    let inbox = Arc::new(Inbox::default());
    let addr = InboxActor(inbox.clone()).start();
    node.register(names::COORDINATOR, &addr).map_err(|e| TrainError::Distributed(e.to_string()))?.handle::<EpochStats>().handle::<StepDone>().handle::<Abort>().handle::<Saved>().handle::<Ready>();
    Ok(inbox)
}

/// A node's partition over the run's generations: it tells the coordinator
/// it is ready (again and again, so a restarted coordinator hears it too),
/// and on each `Begin` starts its inboxes' new generation and runs `attempt`.
/// Once the coordinator says the run is over (well), returns the last
/// attempt's result, or `None` if that attempt did not finish (the
/// coordinator had all it needed: a last acknowledgement was lost as it
/// left). `leader` (named `me`) takes the coordinator's words.
#[allow(clippy::too_many_arguments)] // one partition's whole context
pub(crate) fn serve_generations<T>(
    node: &Node,
    handle: &tokio::runtime::Handle,
    me: &str,
    part: u32,
    inboxes: &[Arc<Inbox>],
    rejoin: Duration,
    mut attempt: impl FnMut(Begin) -> Result<T>,
) -> Result<Option<T>> {
    let leader = inboxes.first().ok_or_else(|| TrainError::Distributed("a partition without trainers".into()))?;
    let me = runtime::ActorName::new(me).map_err(|e| TrainError::Distributed(e.to_string()))?;
    let coordinator = node.actor(names::COORDINATOR).map_err(|e| TrainError::Distributed(e.to_string()))?.with_sender(me);
    let incarnation = coordinator::new_generation();
    let mut last = LastAttempt::None;
    let mut result = None;
    loop {
        let waiting = Instant::now();
        let control = loop {
            let ready = Ready { part, incarnation, last };
            let _ = handle.block_on(coordinator.ask(ready, Duration::from_secs(1)));
            if let Some(c) = leader.control(Duration::from_millis(200)) {
                break c;
            }
            if waiting.elapsed() > rejoin {
                return Err(TrainError::Distributed(format!("no word from the coordinator within {rejoin:?}: is its node up?")));
            }
        };
        let b = match control {
            Control::Finish(true) => return Ok(result),
            Control::Finish(false) => return Err(TrainError::Distributed("the coordinator gave up the run (its log says why)".into())),
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

/// The checkpoint a `Begin` names: its directory and manifest, which must
/// be of this node's run (`run`: its fingerprint).
pub(crate) fn begin_from(t: &TrainingConfig, run: &str, b: Begin) -> Result<Option<(std::path::PathBuf, checkpoint::Manifest)>> {
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
