//! Batching of concurrent requests: requests queue for one inference thread,
//! which takes every request that arrives within `max_wait` of the first (up
//! to `max_nodes` nodes) and answers requests of the same kind with one
//! forward pass over the union of their nodes. Answers do not depend on the
//! batch (see [`crate::engine`]), so batching changes latency, not results.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use graphs::NodeTypeId;
use tokio::sync::oneshot;

use crate::engine::{positions, Classified, Engine, Rows, Want};
use crate::error::{Result, ServeError};
use crate::metrics::Metrics;

/// What a request asks of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Classes (and optionally probabilities and embeddings) of target nodes.
    Classify(Want),
    /// Embeddings of nodes of one type.
    Embed(NodeTypeId),
}

/// An answer to one request, in its node order.
#[derive(Debug)]
pub enum Answer {
    /// The classes of a [`Op::Classify`].
    Classified(Classified),
    /// The rows of an [`Op::Embed`].
    Rows(Rows),
}

/// One queued request.
struct Job {
    engine: Arc<Engine>,
    op: Op,
    nodes: Vec<u32>,
    reply: oneshot::Sender<Result<Answer>>,
    queued: Instant,
}

/// Bounds of batching.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    /// The longest a request waits for others to share its batch.
    pub max_wait: Duration,
    /// Nodes after which a batch closes without waiting.
    pub max_nodes: usize,
    /// Requests that may wait; more are refused (the server is overloaded).
    pub queue: usize,
}

/// The queue in front of the inference thread.
pub struct Batcher {
    tx: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Batcher {
    /// Starts the inference thread.
    pub fn start(limits: BatchLimits, metrics: Arc<Metrics>) -> std::io::Result<Batcher> {
        let (tx, rx) = mpsc::sync_channel(limits.queue.max(1));
        let thread = std::thread::Builder::new()
            .name("serve-inference".into())
            .spawn(move || run(rx, limits, &metrics))?;
        Ok(Batcher {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues `nodes` for `op` on `engine`; the answer arrives on the receiver.
    /// A full queue is refused at once (retry later).
    pub fn submit(
        &self,
        engine: Arc<Engine>,
        op: Op,
        nodes: Vec<u32>,
    ) -> Result<oneshot::Receiver<Result<Answer>>> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            engine,
            op,
            nodes,
            reply,
            queued: Instant::now(),
        };
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| ServeError::Unavailable("the server is shutting down".into()))?;
        match tx.try_send(job) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => Err(ServeError::Unavailable(
                "too many requests are waiting for inference; retry shortly".into(),
            )),
            Err(TrySendError::Disconnected(_)) => Err(ServeError::Unavailable(
                "the inference thread has stopped".into(),
            )),
        }
    }
}

impl Drop for Batcher {
    /// Answers what is queued, then stops the inference thread.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Nodes of a batch from which its inference runs on rayon's pool (about
/// where a hop's destinations reach the sampler's parallel threshold).
const ON_POOL_NODES: usize = 16;

/// The inference thread: batches until every sender is gone.
fn run(rx: Receiver<Job>, limits: BatchLimits, metrics: &Metrics) {
    while let Ok(first) = rx.recv() {
        let deadline = first.queued + limits.max_wait;
        let mut nodes = first.nodes.len();
        let mut jobs = vec![first];
        while nodes < limits.max_nodes {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(j) => {
                    nodes += j.nodes.len();
                    jobs.push(j);
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        answer(jobs, metrics);
    }
}

/// Answers `jobs`: one inference per (engine, kind of question).
fn answer(mut jobs: Vec<Job>, metrics: &Metrics) {
    // A caller that gave up (timed out, disconnected) costs no inference.
    jobs.retain(|j| !j.reply.is_closed());
    while !jobs.is_empty() {
        let head = (Arc::as_ptr(&jobs[0].engine), key(jobs[0].op));
        let (group, rest): (Vec<Job>, Vec<Job>) = jobs
            .into_iter()
            .partition(|j| (Arc::as_ptr(&j.engine), key(j.op)) == head);
        jobs = rest;
        let start = Instant::now();
        for j in &group {
            metrics
                .queue_seconds
                .observe(start.duration_since(j.queued).as_secs_f64());
        }
        let mut union: Vec<u32> = group.iter().flat_map(|j| j.nodes.iter().copied()).collect();
        union.sort_unstable();
        union.dedup();
        let engine = Arc::clone(&group[0].engine);
        let op = merged(group.iter().map(|j| j.op));
        // A panic in inference is a defect: answer 500 and keep serving.
        let infer = || {
            // Answers take no gradient: no work for a backward pass is started.
            let _inference = models::ops::no_backward();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match op {
                Op::Classify(want) => engine.classify(&union, want).map(Answer::Classified),
                Op::Embed(t) => engine.embed(t, &union).map(Answer::Rows),
            }))
        };
        // A large batch runs on one of rayon's threads: its parallel parts
        // (draws, gathers, candle's products) are then handed to the pool from
        // inside it, not each woken from this thread and waited for. A small
        // one has few such parts and would pay the hand-off for nothing.
        let result = if union.len() >= ON_POOL_NODES {
            rayon::scope(|_| infer())
        } else {
            infer()
        }
        .unwrap_or_else(|_| Err(ServeError::Inference("inference panicked".into())));
        metrics.batch_seconds.observe(start.elapsed().as_secs_f64());
        metrics.batch_nodes.observe(union.len() as f64);
        metrics.batch_requests.observe(group.len() as f64);
        for j in group {
            let reply = match &result {
                Ok(a) => Ok(pick(a, &union, &j.nodes, j.op)),
                Err(e) => Err(clone_error(e)),
            };
            let _ = j.reply.send(reply);
        }
    }
}

/// Requests that can share a batch: classifications (whatever they also
/// want) together, embeddings per type.
fn key(op: Op) -> Op {
    match op {
        Op::Classify(_) => Op::Classify(Want::default()),
        e => e,
    }
}

/// The one question that answers every op of a group.
fn merged(ops: impl Iterator<Item = Op>) -> Op {
    let mut out: Option<Op> = None;
    for op in ops {
        out = Some(match (out, op) {
            (Some(Op::Classify(a)), Op::Classify(b)) => Op::Classify(Want {
                probabilities: a.probabilities || b.probabilities,
                embeddings: a.embeddings || b.embeddings,
            }),
            (_, op) => op,
        });
    }
    out.unwrap_or(Op::Classify(Want::default()))
}

/// The rows of `nodes` from an answer over the sorted `union`.
fn pick(answer: &Answer, union: &[u32], nodes: &[u32], op: Op) -> Answer {
    let at = positions(union, nodes);
    match (answer, op) {
        (Answer::Classified(c), Op::Classify(want)) => Answer::Classified(c.pick(&at, want)),
        (Answer::Rows(r), _) => Answer::Rows(r.pick(&at)),
        (Answer::Classified(c), Op::Embed(_)) => Answer::Classified(c.clone()),
    }
}

/// The same error for each request of a failed batch.
fn clone_error(e: &ServeError) -> ServeError {
    match e {
        ServeError::Load(m) => ServeError::Load(m.clone()),
        ServeError::BadRequest(m) => ServeError::BadRequest(m.clone()),
        ServeError::UnknownNodes(m) => ServeError::UnknownNodes(m.clone()),
        ServeError::TooLarge(m) => ServeError::TooLarge(m.clone()),
        ServeError::Unavailable(m) => ServeError::Unavailable(m.clone()),
        ServeError::Inference(m) => ServeError::Inference(m.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_answers_each_request_in_its_own_order() {
        let union = vec![2, 5, 9];
        let answer = Answer::Classified(Classified {
            classes: vec![20, 50, 90],
            values: None,
            labels: Some(vec![vec![2], vec![], vec![0, 9]]),
            probabilities: Some(Rows {
                width: 1,
                data: vec![0.2, 0.5, 0.9],
            }),
            embeddings: None,
        });
        let want = Want {
            probabilities: false,
            embeddings: false,
        };
        let Answer::Classified(c) = pick(&answer, &union, &[9, 2, 9], Op::Classify(want)) else {
            panic!("a classification")
        };
        assert_eq!(c.classes, vec![90, 20, 90]);
        assert_eq!(c.labels, Some(vec![vec![0, 9], vec![2], vec![0, 9]]));
        assert!(c.probabilities.is_none(), "not asked for");
    }

    #[test]
    fn classifications_share_a_batch_and_its_outputs() {
        let a = Op::Classify(Want {
            probabilities: true,
            embeddings: false,
        });
        let b = Op::Classify(Want {
            probabilities: false,
            embeddings: true,
        });
        assert_eq!(key(a), key(b));
        assert_ne!(key(a), key(Op::Embed(NodeTypeId(0))));
        assert_eq!(
            merged([a, b].into_iter()),
            Op::Classify(Want {
                probabilities: true,
                embeddings: true
            })
        );
    }
}
