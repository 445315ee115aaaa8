//! The coordinator in production: an actor that passes what arrives to the
//! protocol's thread in order, and the loop on that thread that feeds the
//! [`Coordinator`] events and the clock, and sends what it says to send.
//! Checkpoints are read and written on disk here ([`Host`]).

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler, MessageResult};
use futures_util::future::join_all;
use runtime::{Deliver, Node};

use super::core::{Coordinator, Event, Host, Output, BEGIN_TIMEOUT};
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::{self, Manifest};
use crate::distributed::generations::{stop_all_but, stop_gen};
use crate::distributed::inbox::Inbox;
use crate::distributed::messages::{Abort, EpochStats, Ready, Saved, StepDone};
use crate::distributed::{names, System};
use crate::error::{Result, TrainError};
use crate::observer::TrainObserver;

/// Passes the coordinator's messages to its thread, in the order they came.
pub(crate) struct CoordinatorActor(Sender<Event>);

impl Actor for CoordinatorActor {
    type Context = Context<Self>;
}

macro_rules! forward {
    ($msg:ty, $event:expr) => {
        impl Handler<Deliver<$msg>> for CoordinatorActor {
            type Result = MessageResult<Deliver<$msg>>;
            fn handle(&mut self, m: Deliver<$msg>, _: &mut Context<Self>) -> Self::Result {
                // The thread is gone once the run is over: nothing more to take.
                let _ = self.0.send($event(m.msg));
                MessageResult(())
            }
        }
    };
}

forward!(Ready, Event::Ready);
forward!(StepDone, Event::Step);
forward!(EpochStats, |s| Event::Stats(Box::new(s)));
forward!(Saved, |s| Event::Saved(Box::new(s)));
forward!(Abort, Event::Abort);

/// What reaches the coordinator's thread.
pub(crate) struct Mailbox {
    rx: Receiver<Event>,
    tx: Sender<Event>,
}

impl Mailbox {
    /// Where others (the peer watch) post events.
    pub(crate) fn sender(&self) -> Sender<Event> {
        self.tx.clone()
    }
}

/// Registers the coordinator's actor on `node`; returns its mailbox.
pub(crate) fn serve(node: &Node) -> Result<Mailbox> {
    let (tx, rx) = channel();
    let addr = CoordinatorActor(tx.clone()).start();
    node.register(names::COORDINATOR, &addr)
        .map_err(|e| TrainError::Internal(e.to_string()))?
        .handle::<EpochStats>()
        .handle::<StepDone>()
        .handle::<Abort>()
        .handle::<Saved>()
        .handle::<Ready>();
    Ok(Mailbox { rx, tx })
}

/// Whom the coordinator talks to.
pub(crate) struct Shell<'a> {
    /// The actor system of the coordinator's node.
    pub(crate) system: &'a System,
    /// Per partition, the actor that takes `Begin` (its first trainer or worker).
    pub(crate) leaders: Vec<String>,
    /// Per partition, the actors to stop when a generation fails.
    pub(crate) members: Vec<Vec<String>>,
    /// The inbox of what the mode gathers at the coordinator (final
    /// states): it follows the run's generations.
    pub(crate) gathered: &'a Inbox,
}

/// Checkpoints on disk, and the user's observer.
struct Disk<'a> {
    t: &'a TrainingConfig,
    run: &'a str,
    observer: &'a mut dyn TrainObserver,
}

impl Host for Disk<'_> {
    fn observer(&mut self) -> &mut dyn TrainObserver {
        self.observer
    }

    fn latest(&mut self) -> Result<Option<(Manifest, Vec<String>)>> {
        match &self.t.checkpoint_dir {
            Some(root) => checkpoint::latest(root, self.run),
            None => Ok(None),
        }
    }

    fn finalize(&mut self, m: &Manifest) -> Result<PathBuf> {
        let root = self.t.checkpoint_dir.as_ref().ok_or_else(|| {
            TrainError::Internal("a checkpoint completed in a run that keeps none".into())
        })?;
        checkpoint::finalize(root, m, self.t.checkpoint_keep)
    }
}

/// Runs the coordinator `c` (of run `run`) until the run is over.
pub(crate) fn drive(
    c: &mut Coordinator,
    t: &TrainingConfig,
    run: &str,
    shell: &Shell,
    mailbox: &Mailbox,
    observer: &mut dyn TrainObserver,
) -> Result<()> {
    let clock = Instant::now();
    let mut host = Disk { t, run, observer };
    let mut events = std::collections::VecDeque::from([Event::Tick]);
    loop {
        while let Some(ev) = events.pop_front() {
            for o in c.handle(clock.elapsed(), ev, &mut host) {
                match o {
                    Output::Done(r) => return r,
                    Output::Nudge { keep, parts } => {
                        let silent: Vec<String> = parts
                            .iter()
                            .flat_map(|&p| shell.members[p as usize].iter().cloned())
                            .collect();
                        stop_all_but(
                            &shell.system.node,
                            &shell.system.handle,
                            names::COORDINATOR,
                            keep,
                            &silent,
                            "the coordinator is starting the run again",
                        );
                    }
                    Output::Abort { gen, reason } => {
                        let trainers: Vec<String> =
                            shell.members.iter().flatten().cloned().collect();
                        stop_gen(
                            &shell.system.node,
                            &shell.system.handle,
                            names::COORDINATOR,
                            gen,
                            &trainers,
                            &reason,
                        );
                    }
                    Output::Begin(b) => {
                        shell.gathered.reset(b.gen);
                        events.extend(begin(shell, b));
                    }
                }
            }
        }
        let Some(due) = c.poll_timeout() else {
            return Err(TrainError::Internal(
                "the coordinator stopped without a result".into(),
            ));
        };
        let wait = due.saturating_sub(clock.elapsed());
        match mailbox.rx.recv_timeout(wait.max(Duration::from_millis(1))) {
            Ok(ev) => events.push_back(ev),
            Err(RecvTimeoutError::Timeout) => events.push_back(Event::Tick),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(TrainError::Internal(
                    "the coordinator's actor stopped".into(),
                ))
            }
        }
        // Take everything that is already there before the next tick.
        events.extend(mailbox.rx.try_iter());
    }
}

/// Tells every partition's leader to start `b`; their answers.
fn begin(shell: &Shell, b: crate::distributed::messages::Begin) -> Vec<Event> {
    let refs: Vec<_> = shell
        .leaders
        .iter()
        .map(|n| shell.system.node.actor(n))
        .collect();
    let asks = refs.iter().map(|r| async move {
        match r {
            Ok(r) => r.ask(b, BEGIN_TIMEOUT).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    });
    let answers = shell.system.handle.block_on(join_all(asks));
    answers
        .into_iter()
        .enumerate()
        .map(|(p, result)| Event::Begun {
            part: p as u32,
            gen: b.gen,
            result,
        })
        .collect()
}

/// Sends the coordinator a [`Event::PeerDown`] when a peer of `node` goes down.
pub(crate) fn watch(node: &Node, to: Sender<Event>) {
    let mut events = node.subscribe();
    tokio::spawn(async move {
        while let Ok(ev) = events.recv().await {
            if let runtime::MemberEvent::Down(peer) = ev {
                if to.send(Event::PeerDown(peer)).is_err() {
                    return;
                }
            }
        }
    });
}
