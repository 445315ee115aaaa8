//! Mailboxes that training threads wait on: a trainer's (gradient shares from
//! its peers, abort, finish, the coordinator's word to begin) and what a mode
//! gathers at the coordinator (final states). The actors only file what
//! arrives; the threads wait with deadlines. (The coordinator's own messages
//! go to its protocol: `distributed::coordinator`.)
//!
//! Every attempt of a run is a generation: messages of the current one are
//! filed, those of another are dropped, except gradient shares, which may
//! arrive from a peer that started the next generation first: they wait
//! (bounded) until this inbox starts it too.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler, MessageResult};
use runtime::Deliver;

use super::decode_f32;
use super::messages::{Abort, Begin, Finish, GradShare};
use crate::error::{Result, TrainError};

/// Most gradient shares of other generations kept for later.
const MAX_EARLY: usize = 4096;

type Key = (u64, u32, u32);

#[derive(Default)]
struct State {
    gen: u64,
    grads: HashMap<Key, Vec<u8>>,
    early: std::collections::VecDeque<(u64, Key, Vec<u8>)>,
    abort: Option<String>,
    finished: Option<bool>,
    begin: Option<Begin>,
    /// The newest `Begin` taken (its order).
    begun: (u64, u64),
}

impl State {
    fn file(&mut self, gen: u64, key: Key, data: Vec<u8>) {
        if gen == self.gen {
            self.grads.entry(key).or_insert(data);
        } else {
            if self.early.len() >= MAX_EARLY {
                self.early.pop_front();
            }
            self.early.push_back((gen, key, data));
        }
    }
}

/// What a node waiting between attempts hears from the coordinator.
#[derive(Debug, PartialEq, Eq)]
pub enum Control {
    /// Start (or restart) the run.
    Begin(Begin),
    /// The run is over (well, or the coordinator gave up).
    Finish(bool),
}

/// What a trainer (or a coordinator's gathering) is waiting for.
pub struct Inbox {
    state: Mutex<State>,
    cv: Condvar,
    /// The abort reason, for async waiters.
    aborted: tokio::sync::watch::Sender<Option<String>>,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            state: Mutex::default(),
            cv: Condvar::new(),
            aborted: tokio::sync::watch::Sender::new(None),
        }
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

    /// Marks the current generation as failed (wakes every waiter).
    pub fn abort(&self, reason: String) {
        let mut s = self.lock();
        self.abort_locked(&mut s, reason);
    }

    /// [`Inbox::abort`] if generation `gen` is the current one.
    pub fn abort_gen(&self, gen: u64, reason: String) {
        let mut s = self.lock();
        if s.gen == gen {
            self.abort_locked(&mut s, reason);
        }
    }

    /// Under the state lock, so a reset cannot slip between the flag and the signal.
    fn abort_locked(&self, s: &mut State, reason: String) {
        s.abort.get_or_insert(reason.clone());
        self.aborted
            .send_if_modified(|r| r.is_none() && r.replace(reason).is_none());
        self.cv.notify_all();
    }

    /// Why the current generation was aborted, if it was.
    pub fn abort_reason(&self) -> Option<String> {
        self.lock().abort.clone()
    }

    /// The current generation.
    pub fn gen(&self) -> u64 {
        self.lock().gen
    }

    /// Starts generation `gen`: forgets everything of the last one (its abort
    /// included) and takes the gradient shares of `gen` that came early.
    pub fn reset(&self, gen: u64) {
        let mut s = self.lock();
        self.reset_locked(&mut s, gen);
        self.cv.notify_all();
    }

    fn reset_locked(&self, s: &mut State, gen: u64) {
        self.aborted.send_replace(None);
        s.gen = gen;
        s.abort = None;
        s.grads.clear();
        for (g, key, data) in std::mem::take(&mut s.early) {
            if g == gen {
                s.grads.entry(key).or_insert(data);
            }
        }
    }

    /// Waits up to `timeout` for the coordinator's next word. A `Begin` is
    /// taken once, and this inbox starts its generation at once (under the
    /// same lock, so a newer `Begin` arriving next aborts it as it should).
    pub fn control(&self, timeout: Duration) -> Option<Control> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if let Some(ok) = s.finished {
                return Some(Control::Finish(ok));
            }
            if let Some(b) = s.begin.take() {
                self.reset_locked(&mut s, b.gen);
                return Some(Control::Begin(b));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            s = self
                .cv
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// A coordinator's start: a new generation stops the current one at once
    /// (its trainers may be waiting on a peer that is gone) and is kept for
    /// the node's loop; a start older than one already taken is ignored.
    fn take_begin(&self, b: Begin) {
        let mut s = self.lock();
        if b.order <= s.begun {
            tracing::warn!("ignored a late start of generation {:x}", b.gen);
            return;
        }
        s.begun = b.order;
        if s.gen != b.gen {
            self.abort_locked(
                &mut s,
                format!("the coordinator restarts the run (generation {:x})", b.gen),
            );
        }
        s.begin = Some(b);
        self.cv.notify_all();
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

    /// Runs `f` on `handle` from a training thread; gives up as soon as the
    /// run is aborted (a peer failed or went down), not at `f`'s own deadline.
    pub fn block_on<F: std::future::Future>(
        &self,
        handle: &tokio::runtime::Handle,
        f: F,
    ) -> Result<F::Output> {
        handle.block_on(async {
            tokio::select! {
                r = f => Ok(r),
                reason = self.aborted() => Err(TrainError::PeerLost(reason)),
            }
        })
    }

    /// Waits until `ready` returns a value, an abort arrives or `timeout` passes.
    fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut(&mut State) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if let Some(reason) = &s.abort {
                return Err(TrainError::PeerLost(format!(
                    "stopped while waiting for {what}: {reason}"
                )));
            }
            if let Some(v) = ready(&mut s) {
                return Ok(v);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TrainError::PeerLost(format!(
                    "no {what} within {timeout:?}"
                )));
            }
            s = self
                .cv
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The gradient shares of step `seq`, round `round` from `peers`, each `len` values, in peer order.
    pub fn gradients(
        &self,
        seq: u64,
        round: u32,
        peers: &[u32],
        len: usize,
        timeout: Duration,
    ) -> Result<Vec<Vec<f32>>> {
        let raw = self.wait(
            &format!("the gradients of step {seq} (round {round}) from trainers {peers:?}"),
            timeout,
            |s| {
                if !peers
                    .iter()
                    .all(|p| s.grads.contains_key(&(seq, round, *p)))
                {
                    return None;
                }
                Some(
                    peers
                        .iter()
                        .filter_map(|p| s.grads.remove(&(seq, round, *p)))
                        .collect::<Vec<_>>(),
                )
            },
        )?;
        raw.iter().map(|b| decode_f32(b, len)).collect()
    }

    /// Files a message's payload under `(seq, round, from)` (the first copy wins:
    /// a duplicated message changes nothing).
    pub fn file(&self, seq: u64, round: u32, from: u32, data: Vec<u8>) {
        self.update(|s| {
            let gen = s.gen;
            s.file(gen, (seq, round, from), data);
        });
    }

    /// [`Inbox::file`] for a message of generation `gen` (kept for later if
    /// it is not the current one).
    pub fn file_gen(&self, gen: u64, seq: u64, round: u32, from: u32, data: Vec<u8>) {
        self.update(|s| s.file(gen, (seq, round, from), data));
    }

    /// Drops what is filed under steps before `seq`: late duplicates of
    /// messages already taken (the first copy wins), which would otherwise
    /// stay. Step numbers with the top bit set (evaluation) and without
    /// (training) are separate sequences: a peer may already be a step into
    /// the other one, and its messages must stay.
    pub fn forget_before(&self, seq: u64) {
        const TOP: u64 = 1 << 63;
        self.lock()
            .grads
            .retain(|(q, _, _), _| (*q & TOP) != (seq & TOP) || *q >= seq);
    }

    /// The payloads filed under `(seq, round, p)` for every `p` in `peers`, in peer order.
    pub fn raw(
        &self,
        what: &str,
        seq: u64,
        round: u32,
        peers: &[u32],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        self.wait(
            &format!("{what} of step {seq} from {peers:?}"),
            timeout,
            |s| {
                if !peers
                    .iter()
                    .all(|p| s.grads.contains_key(&(seq, round, *p)))
                {
                    return None;
                }
                Some(
                    peers
                        .iter()
                        .filter_map(|p| s.grads.remove(&(seq, round, *p)))
                        .collect::<Vec<_>>(),
                )
            },
        )
    }

    /// The run is over, well or not (wakes a node waiting for the coordinator's word).
    pub fn finish(&self, ok: bool) {
        self.update(|s| {
            s.finished.get_or_insert(ok);
        });
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
            s.file(
                m.msg.gen,
                (m.msg.seq, m.msg.round, m.msg.from),
                m.msg.data.0,
            )
        });
        MessageResult(())
    }
}

impl Handler<Deliver<Abort>> for InboxActor {
    type Result = MessageResult<Deliver<Abort>>;
    fn handle(&mut self, m: Deliver<Abort>, _: &mut Context<Self>) -> Self::Result {
        let from = if m.msg.from == u32::MAX {
            "the coordinator".to_string()
        } else {
            format!("trainer {}", m.msg.from)
        };
        let reason = format!("{from}: {}", m.msg.reason);
        if m.msg.all_but {
            let inbox = &self.0;
            let mut s = inbox.lock();
            if s.gen != m.msg.gen {
                inbox.abort_locked(&mut s, reason);
            }
        } else {
            self.0.abort_gen(m.msg.gen, reason);
        }
        MessageResult(())
    }
}

impl Handler<Deliver<Finish>> for InboxActor {
    type Result = MessageResult<Deliver<Finish>>;
    /// From the coordinator's node: whatever this node still runs is not
    /// needed (a last acknowledgement lost as the coordinator left): it stops.
    fn handle(&mut self, m: Deliver<Finish>, _: &mut Context<Self>) -> Self::Result {
        self.0.finish(m.msg.ok);
        self.0.abort("the run is over".into());
        MessageResult(())
    }
}

impl Handler<Deliver<Begin>> for InboxActor {
    type Result = MessageResult<Deliver<Begin>>;
    fn handle(&mut self, m: Deliver<Begin>, _: &mut Context<Self>) -> Self::Result {
        self.0.take_begin(m.msg);
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
        let err = inbox
            .gradients(7, 0, &[1, 2], 4, Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        assert!(err.contains("step 7") && err.contains("[1, 2]"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(2));
        inbox.update(|s| {
            s.grads.insert((7, 0, 1), vec![0; 16]);
        });
        inbox.abort("trainer 2 failed: disk full".into());
        let err = inbox
            .gradients(7, 0, &[1], 4, Duration::from_secs(30))
            .unwrap_err()
            .to_string();
        assert!(err.contains("disk full"), "{err}");
    }

    #[test]
    fn late_duplicates_of_taken_steps_are_forgotten() {
        let inbox = Inbox::default();
        inbox.file(3, 0x100, 1, vec![1]);
        assert_eq!(
            inbox
                .raw("partials", 3, 0x100, &[1], Duration::from_secs(1))
                .unwrap(),
            vec![vec![1]]
        );
        inbox.file(3, 0x100, 1, vec![9]);
        inbox.file(4, 0x100, 1, vec![2]);
        inbox.file(1 << 63, 0x100, 1, vec![7]);
        inbox.forget_before(4);
        assert!(
            inbox
                .raw("partials", 3, 0x100, &[1], Duration::from_millis(20))
                .is_err(),
            "the duplicate is gone"
        );
        assert_eq!(
            inbox
                .raw("partials", 4, 0x100, &[1], Duration::from_secs(1))
                .unwrap(),
            vec![vec![2]],
            "the next step's message stays"
        );
        inbox.file(5, 0x100, 1, vec![5]);
        inbox.forget_before((1 << 63) | 9);
        assert_eq!(
            inbox
                .raw("partials", 5, 0x100, &[1], Duration::from_secs(1))
                .unwrap(),
            vec![vec![5]],
            "an evaluation step keeps training messages"
        );
        assert!(
            inbox
                .raw("partials", 1 << 63, 0x100, &[1], Duration::from_millis(20))
                .is_err(),
            "earlier evaluation steps' are gone"
        );
    }

    #[test]
    fn gradient_shares_arrive_in_peer_order_and_are_checked() {
        let inbox = Arc::new(Inbox::default());
        let sender = inbox.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            sender.update(|s| {
                s.grads
                    .insert((3, 0, 2), bytemuck::cast_slice(&[2.0f32, 2.0]).to_vec());
                s.grads
                    .insert((3, 0, 0), bytemuck::cast_slice(&[0.5f32, 0.5]).to_vec());
            });
        });
        let got = inbox
            .gradients(3, 0, &[0, 2], 2, Duration::from_secs(10))
            .unwrap();
        h.join().unwrap();
        assert_eq!(got, vec![vec![0.5, 0.5], vec![2.0, 2.0]]);
        inbox.update(|s| {
            s.grads.insert((4, 0, 0), vec![1, 2, 3]);
        });
        assert!(
            inbox
                .gradients(4, 0, &[0], 2, Duration::from_secs(1))
                .is_err(),
            "a share of the wrong size is refused"
        );
    }

    #[test]
    fn generations_keep_their_messages_apart() {
        let inbox = Inbox::default();
        inbox.reset(1);
        inbox.update(|s| s.file(2, (0, 0, 1), vec![2]));
        inbox.update(|s| s.file(1, (0, 0, 1), vec![1]));
        inbox.abort("peer down".into());
        assert!(
            inbox
                .raw("x", 0, 0, &[1], Duration::from_millis(10))
                .is_err(),
            "aborted"
        );
        // The next generation forgets the abort and its predecessor's shares, and keeps its own early ones.
        inbox.reset(2);
        assert_eq!(
            inbox.raw("x", 0, 0, &[1], Duration::from_secs(1)).unwrap(),
            vec![vec![2]]
        );
        inbox.abort_gen(1, "stale".into());
        inbox.file(1, 0, 1, vec![3]);
        assert_eq!(
            inbox.raw("x", 1, 0, &[1], Duration::from_secs(1)).unwrap(),
            vec![vec![3]],
            "an abort of an old generation is ignored"
        );
    }

    #[test]
    fn a_late_start_is_ignored_and_a_new_one_stops_the_running_generation() {
        let inbox = Inbox::default();
        let begin = |gen, order| Begin {
            gen,
            from: None,
            order,
        };
        inbox.take_begin(begin(7, (100, 0)));
        assert_eq!(
            inbox.control(Duration::from_millis(10)),
            Some(Control::Begin(begin(7, (100, 0))))
        );
        assert_eq!(inbox.gen(), 7, "taking the word starts the generation");
        inbox.take_begin(begin(5, (99, 3)));
        assert!(
            inbox.lock().begin.is_none() && inbox.lock().abort.is_none(),
            "an older start changes nothing"
        );
        inbox.take_begin(begin(9, (100, 1)));
        assert!(
            inbox
                .lock()
                .abort
                .as_deref()
                .is_some_and(|r| r.contains("restarts")),
            "the running generation stops"
        );
        assert_eq!(
            inbox.control(Duration::from_millis(10)),
            Some(Control::Begin(begin(9, (100, 1))))
        );
        assert!(inbox.lock().abort.is_none(), "and the new one starts clean");
    }
}
