//! The sampling worker's thread pool: one ready queue ordered by DAG, then
//! cost (ByteGNN's fine-grained scheduling). A mini-batch's DAG is numbered
//! by its step, so the oldest batch's tasks run first and the trainer gets
//! its next batch as early as possible; within a DAG the costliest task runs
//! first (longest-processing-time order, so a big chunk does not start last
//! and hold up its hop). Tasks must not block: remote requests are futures on
//! the node's runtime, and their continuations come back through the queue.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex};

use crate::error::{Result, TrainError};

/// A unit of work.
type Job = Box<dyn FnOnce() + Send>;

/// A queued task.
struct Task {
    dag: u64,
    cost: u64,
    /// Arrival order: equal tasks run first come, first served.
    order: u64,
    job: Job,
}

impl PartialEq for Task {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Task {}
impl PartialOrd for Task {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Task {
    /// The heap pops the greatest: lowest DAG, then highest cost, then earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .dag
            .cmp(&self.dag)
            .then(self.cost.cmp(&other.cost))
            .then(other.order.cmp(&self.order))
    }
}

#[derive(Default)]
struct Queue {
    ready: BinaryHeap<Task>,
    next: u64,
    stop: bool,
}

/// The pool's shared state.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// A fixed pool of threads taking tasks from one priority queue.
pub struct Executor {
    shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    size: usize,
}

impl Executor {
    /// A pool of `threads` threads named `name-<i>`.
    pub fn new(name: &str, threads: usize) -> Result<Arc<Executor>> {
        let shared = Arc::new(Shared::default());
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&s))
                .map_err(|e| {
                    TrainError::Internal(format!("cannot start a sampling thread: {e}"))
                })?;
            handles.push(h);
        }
        Ok(Arc::new(Executor {
            shared,
            threads: Mutex::new(handles),
            size: threads.max(1),
        }))
    }

    /// Threads in the pool.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Queues `job` for DAG `dag` with cost `cost`.
    pub fn spawn(&self, dag: u64, cost: u64, job: impl FnOnce() + Send + 'static) {
        let Ok(mut q) = self.shared.queue.lock() else {
            return;
        };
        if q.stop {
            return;
        }
        let order = q.next;
        q.next += 1;
        q.ready.push(Task {
            dag,
            cost,
            order,
            job: Box::new(job),
        });
        drop(q);
        self.shared.wake.notify_one();
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Ok(mut q) = self.shared.queue.lock() {
            q.stop = true;
            q.ready.clear();
        }
        self.shared.wake.notify_all();
        let handles = self
            .threads
            .lock()
            .map(|mut h| std::mem::take(&mut *h))
            .unwrap_or_default();
        for h in handles {
            // A pool thread is dropped from a task's own continuation only
            // through an Arc it holds; never join oneself.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// A pool thread: runs the best ready task until the pool stops. A task that
/// panics is caught, so the thread (and the DAGs of other batches) survive;
/// its DAG learns of it through its own guard.
fn work(s: &Shared) {
    loop {
        let task = {
            let Ok(mut q) = s.queue.lock() else { return };
            loop {
                if q.stop {
                    return;
                }
                if let Some(t) = q.ready.pop() {
                    break t;
                }
                q = match s.wake.wait(q) {
                    Ok(q) => q,
                    Err(_) => return,
                };
            }
        };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task.job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn tasks_run_oldest_dag_first_then_costliest() {
        // One thread, held busy while the others queue, so the order is the queue's.
        let ex = Executor::new("t", 1).unwrap();
        let (gate_tx, gate_rx) = channel::<()>();
        let (tx, rx) = channel();
        ex.spawn(0, 0, move || {
            let _ = gate_rx.recv();
        });
        for (dag, cost, name) in [
            (3, 1, "3a"),
            (1, 1, "1a"),
            (1, 9, "1b"),
            (2, 5, "2a"),
            (1, 1, "1c"),
        ] {
            let tx = tx.clone();
            ex.spawn(dag, cost, move || tx.send(name).unwrap());
        }
        gate_tx.send(()).unwrap();
        let got: Vec<&str> = (0..5).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(got, ["1b", "1a", "1c", "2a", "3a"]);
    }

    #[test]
    fn a_panicking_task_does_not_stop_the_pool() {
        let ex = Executor::new("t", 2).unwrap();
        ex.spawn(0, 0, || panic!("boom"));
        let (tx, rx) = channel();
        for i in 0..10 {
            let tx = tx.clone();
            ex.spawn(i, 0, move || tx.send(i).unwrap());
        }
        let mut got: Vec<u64> = (0..10).map(|_| rx.recv().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert_eq!(ex.size(), 2);
        drop(ex); // joins its threads
    }
}
