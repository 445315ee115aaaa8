//! Synthetic graph generators, written straight to the graph directory format.

mod mag;

use std::path::Path;

use crate::error::{GraphError, Result};
use crate::progress::Progress;
use crate::schema::Schema;

pub use mag::MagLike;

/// Version of the generators' output: bumped whenever the same arguments
/// would give different bytes, so caches keyed by it never serve stale graphs.
pub const VERSION: u32 = 4;

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
        Like::Mag => {
            let g = MagLike::new(scale, seed)?;
            // Refused before anything is allocated or written.
            crate::memory::check_fits(
                &format!("generating a mag-like graph at scale {scale}"),
                g.memory_bytes(),
            )
            .map_err(|e| GraphError::InvalidArgument(e.0))?;
            crate::memory::check_disk(
                &format!("a mag-like graph at scale {scale}"),
                g.disk_bytes(),
                out,
            )
            .map_err(|e| GraphError::InvalidArgument(e.0))?;
            g.write(out, overwrite, progress)
        }
    }
}
