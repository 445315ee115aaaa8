//! What every distributed training mode shares, and no algorithm: the actor
//! system a node runs in, the generations of a run and the coordinator that
//! drives them, checkpoints, the control messages, the steps of an attempt,
//! and the two drivers that run any mode behind the [`Distributed`] trait —
//! every partition in this process, or one node of a cluster.
//!
//! A run is a sequence of generations (see `coordinator`): each node's
//! partition waits for the coordinator's `Begin`, restores the checkpoint it
//! names and trains; when a node fails, the survivors stop and wait for the
//! next `Begin`, which comes once the failed node is back.

pub mod checkpoint;
pub(crate) mod coordinator;
pub mod generations;
pub mod inbox;
pub mod messages;
mod mode;
pub(crate) mod peers;
pub mod rows;
pub mod system;

use std::time::Duration;

pub use mode::{run_node, train_embedded, Distributed, Part};
pub use system::System;

/// Actor names every distributed mode shares.
pub mod names {
    /// The coordinator.
    pub const COORDINATOR: &str = "coordinator";

    /// A node type's name made a valid actor (and file) name.
    pub fn plain(ty: &str) -> String {
        ty.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect()
    }
}

/// Deadlines of the protocol: nothing waits forever.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// One request (sampling, pull, push, gradient share).
    pub ask: Duration,
    /// Waiting for the other trainers' gradients of a step.
    pub step: Duration,
    /// Waiting for every peer to be up at start.
    pub start: Duration,
    /// A non-coordinator node waiting for the end of the run after its last epoch.
    pub finish: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            ask: Duration::from_secs(60),
            step: Duration::from_secs(300),
            start: Duration::from_secs(30),
            finish: Duration::from_secs(600),
        }
    }
}

/// How every mode loads a partition's graph: features memory-mapped.
pub(crate) fn load_options(t: &crate::config::TrainingConfig) -> graphs::LoadOptions {
    graphs::LoadOptions {
        mmap_features: true,
        reverse_edges: t.reverse_edges,
    }
}

/// Little-endian f32 values from `bytes`, which must hold exactly `n` of them.
pub fn decode_f32(bytes: &[u8], n: usize) -> crate::error::Result<Vec<f32>> {
    if bytes.len() != n * 4 {
        return Err(crate::error::TrainError::Protocol(format!(
            "{} bytes where {n} f32 values ({} bytes) were expected",
            bytes.len(),
            n * 4
        )));
    }
    // Copied into uninitialised capacity: zero-filling first was a second pass over every block.
    let mut out: Vec<f32> = Vec::with_capacity(n);
    // SAFETY: `out` has room for `n` f32 values, `bytes` holds exactly `4n` bytes (checked
    // above), every bit pattern is a valid f32, and the two buffers do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), n * 4);
        out.set_len(n);
    }
    Ok(out)
}
