//! ByteGNN's sampling (§4.2): `training.sampling = "dag"` runs each
//! data-parallel mini-batch as a DAG of small tasks ([`dag`]) on its
//! partition's sampling worker, a thread pool with one ready queue ordered
//! by batch, then cost ([`executor`]: the fine-grained scheduling). Many
//! batches are in flight at once; a launcher decides when to start the next
//! from measured rates ([`launch`]: the coarse-grained scheduling), and the
//! trainer takes the batches in step order ([`pipeline`]). Samples are pure
//! functions of their keys, so the batches, and the model, are those of the
//! default pipeline; only timing changes.

pub mod dag;
pub mod executor;
pub mod launch;
pub mod ops;
pub mod pipeline;

use std::sync::Arc;

use crate::error::Result;
use executor::Executor;

/// Per partition loaded in this process, its sampling worker (made by the
/// first trainer that needs it, shared by its trainers and generations).
pub type Workers = Arc<dashmap::DashMap<u32, Arc<Executor>>>;

/// Partition `part`'s sampling worker, started with `threads` threads (0: one per core) if it is not yet.
pub fn worker(workers: &Workers, part: u32, threads: u32) -> Result<Arc<Executor>> {
    if let Some(w) = workers.get(&part) {
        return Ok(w.clone());
    }
    let n = match threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n as usize,
    };
    let made = Executor::new(&format!("sampling-{part}"), n)?;
    Ok(workers.entry(part).or_insert(made).clone())
}
