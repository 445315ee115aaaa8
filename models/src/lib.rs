//! Heterogeneous GNN models on candle: R-GCN, R-GAT, HGT and a features-only MLP, the graph
//! aggregation kernels they need as custom ops, learnable embedding tables with
//! a sparse Adam, a dense Adam, and checkpoints.
//!
//! Determinism: parameters are initialised as a pure function of
//! (seed, parameter name) ([`init`]); dropout masks are a pure function of
//! (seed, epoch, step, layer, node type, node id); every CPU kernel sums in a fixed order
//! whatever the thread count. Two runs with the same seed are bit-identical.
//!
//! Each layer implements [`layer::RelationalLayer`]: relation-specific
//! aggregations for any subset of relations, merged later, then a
//! cross-relation step; [`partials`] splits a whole model along that seam for
//! relation-aggregation-first training. A new model is one file implementing
//! the trait plus its registration in [`layer::registered`].
#![warn(missing_docs)]

pub mod checkpoint;
pub mod edge;
pub mod embedding;
pub mod error;
pub mod hgt;
pub mod inference;
pub mod init;
pub mod layer;
pub mod link;
pub mod model;
pub mod ops;
pub mod optim;
pub mod params;
pub mod partials;
/// Software prefetch for reads by node id (in `graphs`, whose sampler uses it too).
pub use graphs::prefetch;
pub mod rgat;
pub mod rgcn;
pub mod run_lock;
pub mod self_loop;
pub mod threads;

pub use error::{ModelError, Result};
pub use model::{Model, ModelKind, ModelSpec, StepMemory};
