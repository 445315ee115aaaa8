//! Heterogeneous graphs for hetgnn: storage, the graph directory format, the
//! mag-like generator, the OGB importer and the deterministic neighbor sampler.
//!
//! This crate is synchronous and knows nothing of tensors or networks.
//!
//! Determinism guarantees, relied on by every training mode:
//! - loading the same directory gives the same type and relation ids and the
//!   same CSR (neighbors sorted by id), whatever the edge order in the file;
//! - the generator's output is byte-identical for a seed, whatever the number
//!   of threads;
//! - the neighbors sampled for (seed, epoch, step, layer, relation, node) are a
//!   pure function of those values ([`sampler`]), in any process or thread.
#![warn(missing_docs)]

#[cfg(not(target_endian = "little"))]
compile_error!(
    "hetgnn maps little-endian .npy data directly and supports little-endian hosts only"
);

pub mod atomic;
pub mod csr;
pub mod edge_targets;
pub mod error;
pub mod features;
pub mod fingerprint;
pub mod format;
pub mod generate;
pub mod graph;
pub mod ids;
pub mod input;
pub mod label_sets;
pub mod link;
pub mod mapped;
pub mod memory;
pub mod metagraph;
pub mod nonzeros;
pub mod npy;
pub mod ogb;
pub mod overlay;
pub mod partition;
pub mod prefetch;
pub mod progress;
pub mod rng;
pub mod sampler;
pub mod schema;
pub mod seal;
pub mod stats;

pub use csr::Csr;
pub use error::{GraphError, Result};
pub use features::Features;
pub use format::{load, save, LoadOptions};
pub use graph::{GraphBuilder, HetGraph, NodeType, Relation, Splits};
pub use ids::{NodeTypeId, RelationId};
pub use metagraph::Metagraph;
pub use progress::{NoProgress, Progress};
pub use sampler::{Block, BlockRelation, MiniBatch, RelationFilter, RelationPicks, Sampler};
pub use schema::Schema;
