//! One trainer's epoch of DAG-sampled batches: a launcher thread runs the
//! coarse scheduler ([`super::launch`]) over the epoch's jobs, the DAGs run
//! on the partition's sampling worker, and the trainer takes the batches in
//! step order (a DAG that finishes early waits in the output queue).

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::dag::{self, Job, Sampled, Source};
use super::executor::Executor;
use super::launch::{decide, Measures};
use super::ops::OpTimes;
use crate::epoch::cpu::CpuMeter;
use crate::error::{Result, TrainError};

/// Weight of the newest sample in the running means.
const EMA: f64 = 0.2;
/// How long the trainer waits for a batch before asking whether the run is still on.
const POLL: Duration = Duration::from_millis(50);
/// Longest the launcher sleeps between looks (Algorithm 1's sleep).
const LOOK: Duration = Duration::from_millis(2);

/// A trainer's DAG figures of an epoch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DagFigures {
    /// The sampling worker's threads.
    pub threads: usize,
    /// DAGs launched.
    pub launches: u64,
    /// Mean DAGs in flight over the epoch (time-weighted).
    pub in_flight_mean: f64,
    /// Most DAGs in flight at once.
    pub in_flight_max: u64,
    /// Mean finished batches waiting for the trainer (time-weighted).
    pub queued_mean: f64,
    /// Seconds per operator, summed over the epoch's DAGs (remote ones: request wall time).
    pub op_seconds: BTreeMap<String, f64>,
}

#[derive(Default)]
struct State {
    results: BTreeMap<usize, Result<Option<Sampled>>>,
    launched: usize,
    completed: usize,
    taken: usize,
    stop: bool,
    sample_s: f64,
    train_s: f64,
    last_launch: Option<Instant>,
    /// Integrals of in-flight and queued counts over time, and when they last changed.
    in_flight_area: f64,
    queued_area: f64,
    changed: Option<Instant>,
    in_flight_max: usize,
}

impl State {
    fn in_flight(&self) -> usize {
        self.launched - self.completed
    }

    fn queued(&self) -> usize {
        self.completed - self.taken.min(self.completed)
    }

    /// Adds the time since the last change to the integrals.
    fn tick(&mut self) {
        let now = Instant::now();
        if let Some(t) = self.changed {
            let dt = (now - t).as_secs_f64();
            self.in_flight_area += dt * self.in_flight() as f64;
            self.queued_area += dt * self.queued() as f64;
        }
        self.changed = Some(now);
        self.in_flight_max = self.in_flight_max.max(self.in_flight());
    }
}

#[derive(Default)]
struct Shared {
    st: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An epoch's batches, sampled by DAGs.
pub struct DagBatches {
    shared: Arc<Shared>,
    launcher: Option<std::thread::JoinHandle<()>>,
    ops: Arc<OpTimes>,
    threads: usize,
    start: Instant,
    /// Longest wait for one batch.
    timeout: Duration,
}

impl DagBatches {
    /// Starts sampling `jobs` (one per step; `None`: the trainer has no seeds
    /// in that step) on `ex`, at most `max` DAGs at once.
    pub fn start(
        src: Arc<Source>,
        ex: Arc<Executor>,
        jobs: Vec<Option<Job>>,
        max: usize,
        timeout: Duration,
    ) -> Result<DagBatches> {
        let shared = Arc::new(Shared::default());
        let ops = Arc::new(OpTimes::default());
        let threads = ex.size();
        let (s, o) = (shared.clone(), ops.clone());
        let launcher = std::thread::Builder::new()
            .name("dag-launcher".into())
            .spawn(move || launch_all(&s, &src, &ex, &o, jobs, max.max(1)))
            .map_err(|e| TrainError::Internal(format!("cannot start the DAG launcher: {e}")))?;
        Ok(DagBatches {
            shared,
            launcher: Some(launcher),
            ops,
            threads,
            start: Instant::now(),
            timeout,
        })
    }

    /// The next step's batch, in step order (`None`: no seeds of this
    /// trainer in it). `aborted` says whether the run has stopped.
    pub fn next(&mut self, aborted: impl Fn() -> Option<String>) -> Result<Option<Sampled>> {
        let deadline = Instant::now() + self.timeout;
        let mut st = self.shared.lock();
        loop {
            let i = st.taken;
            if let Some(r) = st.results.remove(&i) {
                st.tick();
                st.taken += 1;
                drop(st);
                self.shared.cv.notify_all();
                return r;
            }
            if let Some(reason) = aborted() {
                return Err(TrainError::PeerLost(format!(
                    "stopped while waiting for a sampled batch: {reason}"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TrainError::PeerLost(format!(
                    "batch {i} not sampled within {:?}",
                    self.timeout
                )));
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, POLL.min(deadline - now))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Tells the launcher how long the trainer spent on the batch it took last.
    pub fn trained(&self, seconds: f64) {
        let mut st = self.shared.lock();
        st.train_s = if st.train_s == 0.0 {
            seconds
        } else {
            (1.0 - EMA) * st.train_s + EMA * seconds
        };
    }

    /// The epoch's figures so far.
    pub fn figures(&self) -> DagFigures {
        let mut st = self.shared.lock();
        st.tick();
        let span = self.start.elapsed().as_secs_f64().max(1e-9);
        DagFigures {
            threads: self.threads,
            launches: st.launched as u64,
            in_flight_mean: st.in_flight_area / span,
            in_flight_max: st.in_flight_max as u64,
            queued_mean: st.queued_area / span,
            op_seconds: self.ops.seconds(),
        }
    }
}

impl Drop for DagBatches {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        if let Some(h) = self.launcher.take() {
            let _ = h.join();
        }
    }
}

/// The launcher thread: Algorithm 1 over `jobs`, in step order.
fn launch_all(
    s: &Arc<Shared>,
    src: &Arc<Source>,
    ex: &Arc<Executor>,
    ops: &Arc<OpTimes>,
    jobs: Vec<Option<Job>>,
    max: usize,
) {
    let mut meter = CpuMeter::default();
    for (i, job) in jobs.into_iter().enumerate() {
        let Some(job) = job else {
            let mut st = s.lock();
            st.tick();
            st.launched += 1;
            st.completed += 1;
            st.results.insert(i, Ok(None));
            drop(st);
            s.cv.notify_all();
            continue;
        };
        let mut st = s.lock();
        loop {
            if st.stop {
                return;
            }
            let m = Measures {
                in_flight: st.in_flight(),
                queued: st.queued(),
                sample_s: st.sample_s,
                train_s: st.train_s,
                gap_s: st
                    .last_launch
                    .map_or(f64::INFINITY, |t| t.elapsed().as_secs_f64()),
                util: meter.read(),
            };
            if decide(&m, max) {
                break;
            }
            st =
                s.cv.wait_timeout(st, LOOK)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
        }
        st.tick();
        st.launched += 1;
        st.last_launch = Some(Instant::now());
        drop(st);
        let (shared, started) = (s.clone(), Instant::now());
        let done: dag::Done = Box::new(move |r| {
            let mut st = shared.lock();
            st.tick();
            let secs = started.elapsed().as_secs_f64();
            st.sample_s = if st.sample_s == 0.0 {
                secs
            } else {
                (1.0 - EMA) * st.sample_s + EMA * secs
            };
            st.completed += 1;
            st.results.insert(i, r.map(Some));
            drop(st);
            shared.cv.notify_all();
        });
        dag::launch(src.clone(), ex.clone(), ops.clone(), job, done);
    }
}
