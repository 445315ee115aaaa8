//! Synthetic graph generators, written straight to the graph directory format.

mod mag;

use std::path::Path;

use crate::error::{GraphError, Result};
use crate::progress::Progress;
use crate::schema::Schema;

pub use mag::MagLike;

/// Version of the generators' output: bumped whenever the same arguments
/// would give different bytes, so caches keyed by it never serve stale graphs.
pub const VERSION: u32 = 3;

/// Which real graph the synthetic one imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Like {
    /// OGB ogbn-mag: papers, authors, institutions, fields of study.
    Mag,
}

impl std::str::FromStr for Like {
    type Err = GraphError;
    fn from_str(s: &str) -> Result<Like> {
        match s {
            "mag" => Ok(Like::Mag),
            other => Err(GraphError::InvalidArgument(format!(
                "unknown graph kind '{other}' (known: mag)"
            ))),
        }
    }
}

/// Generates a graph like `like` at `scale` (1.0 = the real graph's size) with
/// `seed`, writing it to `out` atomically. The output is byte-identical for the
/// same arguments whatever the number of threads.
pub fn generate(
    like: Like,
    scale: f64,
    seed: u64,
    out: &Path,
    overwrite: bool,
    progress: &mut dyn Progress,
) -> Result<Schema> {
    match like {
        Like::Mag => MagLike::new(scale, seed)?.write(out, overwrite, progress),
    }
}
