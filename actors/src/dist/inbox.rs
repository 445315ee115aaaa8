//! Mailboxes that training threads wait on: a trainer's (gradient shares from
//! its peers, abort, finish) and the coordinator's (epoch statistics). The
//! actors only file what arrives; the threads wait with deadlines.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler, MessageResult};
use runtime::Deliver;

use super::messages::{Abort, EpochStats, Finish, GradShare, StepDone};
use super::store::decode_f32;
use crate::error::{Result, TrainError};

#[derive(Default)]
struct State {
    grads: HashMap<(u64, u32, u32), Vec<u8>>,
    stats: BTreeMap<(u64, u32), EpochStats>,
    steps: std::collections::VecDeque<(u64, f64)>,
    abort: Option<String>,
    finished: bool,
}

/// What [`Inbox::epoch_progress`] returns.
#[derive(Debug)]
pub enum EpochProgress {
    /// A step finished with this global loss.
    Step(f64),
    /// Every trainer's statistics of the epoch.
    Done(Vec<EpochStats>),
}

/// What a trainer (or the coordinator) is waiting for.
pub struct Inbox {
    state: Mutex<State>,
    cv: Condvar,
    /// The abort reason, for async waiters.
    aborted: tokio::sync::watch::Sender<Option<String>>,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox { state: Mutex::default(), cv: Condvar::new(), aborted: tokio::sync::watch::Sender::new(None) }
    }
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.cv.notify_all();
    }

    /// Marks the run as failed (wakes every waiter).
    pub fn abort(&self, reason: String) {
        self.update(|s| {
            s.abort.get_or_insert(reason.clone());
        });
        self.aborted.send_if_modified(|r| r.is_none() && r.replace(reason).is_none());
    }

    /// Resolves with the reason once the run is aborted.
    pub async fn aborted(&self) -> String {
        let mut rx = self.aborted.subscribe();
        let reason = match rx.wait_for(Option::is_some).await {
            Ok(r) => r.clone(),
            // The sender lives as long as the inbox: never closed while waited on.
            Err(_) => None,
        };
        match reason {
            Some(r) => r,
            None => std::future::pending().await,
        }
    }

    /// Waits until `ready` returns a value, an abort arrives or `timeout` passes.
    fn wait<T>(&self, what: &str, timeout: Duration, mut ready: impl FnMut(&mut State) -> Option<T>) -> Result<T> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if let Some(reason) = &s.abort {
                return Err(TrainError::Distributed(format!("stopped while waiting for {what}: {reason}")));
            }
            if let Some(v) = ready(&mut s) {
                return Ok(v);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TrainError::Distributed(format!("no {what} within {timeout:?}")));
            }
            s = self.cv.wait_timeout(s, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The gradient shares of step `seq`, round `round` from `peers`, each `len` values, in peer order.
    pub fn gradients(&self, seq: u64, round: u32, peers: &[u32], len: usize, timeout: Duration) -> Result<Vec<Vec<f32>>> {
        let raw = self.wait(&format!("the gradients of step {seq} (round {round}) from trainers {peers:?}"), timeout, |s| {
            if !peers.iter().all(|p| s.grads.contains_key(&(seq, round, *p))) {
                return None;
            }
            Some(peers.iter().filter_map(|p| s.grads.remove(&(seq, round, *p))).collect::<Vec<_>>())
        })?;
        raw.iter().map(|b| decode_f32(b, len).map_err(TrainError::Distributed)).collect()
    }

    /// The next news of `epoch`: a step's loss, or once every trainer
    /// (`0..trainers`) has reported it, the epoch's statistics. Each wait
    /// (for a step, or for the statistics) lasts at most `timeout`.
    pub fn epoch_progress(&self, epoch: u64, trainers: u32, timeout: Duration) -> Result<EpochProgress> {
        self.wait(&format!("progress of epoch {epoch}"), timeout, |s| {
            // Steps of later epochs wait their turn; earlier ones are stale.
            while let Some(&(e, loss)) = s.steps.front().filter(|(e, _)| *e <= epoch) {
                s.steps.pop_front();
                if e == epoch {
                    return Some(EpochProgress::Step(loss));
                }
            }
            if !(0..trainers).all(|t| s.stats.contains_key(&(epoch, t))) {
                return None;
            }
            Some(EpochProgress::Done((0..trainers).filter_map(|t| s.stats.remove(&(epoch, t))).collect()))
        })
    }

    /// Files a message's payload under `(seq, round, from)` (the first copy wins:
    /// a duplicated message changes nothing).
    pub fn file(&self, seq: u64, round: u32, from: u32, data: Vec<u8>) {
        self.update(|s| {
            s.grads.entry((seq, round, from)).or_insert(data);
        });
    }

    /// Drops what is filed under steps before `seq`: late duplicates of
    /// messages already taken (the first copy wins), which would otherwise stay.
    pub fn forget_before(&self, seq: u64) {
        self.lock().grads.retain(|(q, _, _), _| *q >= seq);
    }

    /// The payloads filed under `(seq, round, p)` for every `p` in `peers`, in peer order.
    pub fn raw(&self, what: &str, seq: u64, round: u32, peers: &[u32], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.wait(&format!("{what} of step {seq} from {peers:?}"), timeout, |s| {
            if !peers.iter().all(|p| s.grads.contains_key(&(seq, round, *p))) {
                return None;
            }
            Some(peers.iter().filter_map(|p| s.grads.remove(&(seq, round, *p))).collect::<Vec<_>>())
        })
    }

    /// Waits for the coordinator's word that the run is over.
    pub fn finished(&self, timeout: Duration) -> Result<()> {
        self.wait("the coordinator's end-of-run message", timeout, |s| s.finished.then_some(()))
    }
}

/// Files messages into an [`Inbox`].
pub struct InboxActor(pub Arc<Inbox>);

impl Actor for InboxActor {
    type Context = Context<Self>;
}

impl Handler<Deliver<GradShare>> for InboxActor {
    type Result = MessageResult<Deliver<GradShare>>;
    fn handle(&mut self, m: Deliver<GradShare>, _: &mut Context<Self>) -> Self::Result {
        self.0.update(|s| {
            s.grads.entry((m.msg.seq, m.msg.round, m.msg.from)).or_insert(m.msg.data.0);
        });
        MessageResult(())
    }
}

impl Handler<Deliver<Abort>> for InboxActor {
    type Result = MessageResult<Deliver<Abort>>;
    fn handle(&mut self, m: Deliver<Abort>, _: &mut Context<Self>) -> Self::Result {
        self.0.abort(format!("trainer {} failed: {}", m.msg.from, m.msg.reason));
        MessageResult(())
    }
}

impl Handler<Deliver<Finish>> for InboxActor {
    type Result = MessageResult<Deliver<Finish>>;
    fn handle(&mut self, _: Deliver<Finish>, _: &mut Context<Self>) -> Self::Result {
        self.0.update(|s| s.finished = true);
        MessageResult(())
    }
}

impl Handler<Deliver<StepDone>> for InboxActor {
    type Result = MessageResult<Deliver<StepDone>>;
    fn handle(&mut self, m: Deliver<StepDone>, _: &mut Context<Self>) -> Self::Result {
        self.0.update(|s| s.steps.push_back((m.msg.epoch, m.msg.loss)));
        MessageResult(())
    }
}

impl Handler<Deliver<EpochStats>> for InboxActor {
    type Result = MessageResult<Deliver<EpochStats>>;
    fn handle(&mut self, m: Deliver<EpochStats>, _: &mut Context<Self>) -> Self::Result {
        self.0.update(|s| {
            s.stats.entry((m.msg.epoch, m.msg.trainer)).or_insert(m.msg);
        });
        MessageResult(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_end_at_their_deadline_or_on_abort_naming_what_was_awaited() {
        let inbox = Inbox::default();
        let t = Instant::now();
        let err = inbox.gradients(7, 0, &[1, 2], 4, Duration::from_millis(50)).unwrap_err().to_string();
        assert!(err.contains("step 7") && err.contains("[1, 2]"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(2));
        inbox.update(|s| {
            s.grads.insert((7, 0, 1), vec![0; 16]);
        });
        inbox.abort("trainer 2 failed: disk full".into());
        let err = inbox.gradients(7, 0, &[1], 4, Duration::from_secs(30)).unwrap_err().to_string();
        assert!(err.contains("disk full"), "{err}");
    }

    #[test]
    fn steps_are_reported_before_their_epoch_ends_and_later_epochs_wait() {
        let inbox = Inbox::default();
        inbox.update(|s| {
            s.steps.push_back((0, 1.5));
            s.steps.push_back((1, 0.5));
            s.stats.insert((0, 0), EpochStats { epoch: 0, ..EpochStats::default() });
        });
        let t = Duration::from_secs(1);
        assert!(matches!(inbox.epoch_progress(0, 1, t).unwrap(), EpochProgress::Step(l) if l == 1.5));
        assert!(matches!(inbox.epoch_progress(0, 1, t).unwrap(), EpochProgress::Done(v) if v.len() == 1));
        assert!(matches!(inbox.epoch_progress(1, 1, t).unwrap(), EpochProgress::Step(l) if l == 0.5));
        let err = inbox.epoch_progress(1, 1, Duration::from_millis(20)).unwrap_err().to_string();
        assert!(err.contains("epoch 1"), "{err}");
    }

    #[test]
    fn late_duplicates_of_taken_steps_are_forgotten() {
        let inbox = Inbox::default();
        inbox.file(3, 0x100, 1, vec![1]);
        assert_eq!(inbox.raw("partials", 3, 0x100, &[1], Duration::from_secs(1)).unwrap(), vec![vec![1]]);
        inbox.file(3, 0x100, 1, vec![9]);
        inbox.file(4, 0x100, 1, vec![2]);
        inbox.forget_before(4);
        assert!(inbox.raw("partials", 3, 0x100, &[1], Duration::from_millis(20)).is_err(), "the duplicate is gone");
        assert_eq!(inbox.raw("partials", 4, 0x100, &[1], Duration::from_secs(1)).unwrap(), vec![vec![2]], "the next step's message stays");
    }

    #[test]
    fn gradient_shares_arrive_in_peer_order_and_are_checked() {
        let inbox = Arc::new(Inbox::default());
        let sender = inbox.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            sender.update(|s| {
                s.grads.insert((3, 0, 2), bytemuck::cast_slice(&[2.0f32, 2.0]).to_vec());
                s.grads.insert((3, 0, 0), bytemuck::cast_slice(&[0.5f32, 0.5]).to_vec());
            });
        });
        let got = inbox.gradients(3, 0, &[0, 2], 2, Duration::from_secs(10)).unwrap();
        h.join().unwrap();
        assert_eq!(got, vec![vec![0.5, 0.5], vec![2.0, 2.0]]);
        inbox.update(|s| {
            s.grads.insert((4, 0, 0), vec![1, 2, 3]);
        });
        assert!(inbox.gradients(4, 0, &[0], 2, Duration::from_secs(1)).is_err(), "a share of the wrong size is refused");
    }
}
