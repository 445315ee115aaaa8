//! Graph aggregation kernels as candle custom ops (forward and backward).
//!
//! They aggregate straight from CSR and never materialise per-edge rows: the
//! per-edge `index_select` + `index_add` formulation spends most of its time
//! gathering and scattering `[edges × hidden]` tensors.

mod attention;
mod lse_attention;
mod matmul;
mod segment;

pub use attention::{attention_aggregate, NEGATIVE_SLOPE};
pub use lse_attention::{finish_partial, lse_attention, merge_partials};
pub use matmul::matmul;
pub use segment::{segment_mean, SegmentCsr};
