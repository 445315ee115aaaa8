//! Graph aggregation kernels as candle custom ops (forward and backward).
//!
//! They aggregate straight from CSR and never materialise per-edge rows: the
//! per-edge `index_select` + `index_add` formulation spends most of its time
//! gathering and scattering `[edges × hidden]` tensors.

/// The `cuda_fwd` of a custom op whose CPU kernel also serves CUDA inputs,
/// through [`via_host`], for ops of three inputs: the log-sum-exp attention
/// partials (the other ops launch native kernels, see `cuda.rs`).
macro_rules! cuda_via_host {
    (3) => {
        #[cfg(feature = "cuda")]
        fn cuda_fwd(
            &self,
            s1: &candle_core::CudaStorage,
            l1: &candle_core::Layout,
            s2: &candle_core::CudaStorage,
            l2: &candle_core::Layout,
            s3: &candle_core::CudaStorage,
            l3: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
            super::via_host([s1, s2, s3], |[a, b, c]| self.cpu_fwd(a, l1, b, l2, c, l3))
        }
    };
}

mod attention;
mod bias;
#[cfg(feature = "cuda")]
mod cuda;
mod dropout;
mod lse_attention;
mod matmul;
mod segment;

pub use attention::{attention_aggregate, NEGATIVE_SLOPE};
pub use bias::add_bias;
pub use dropout::dropout;
pub use lse_attention::{finish_partial, lse_attention, merge_partials, EMPTY_MAX};
pub use matmul::matmul;
pub use segment::{segment_mean, SegmentCsr};

use candle_core::{CpuStorage, Layout};

/// A contiguous f32 or f64 input as f64 values (the attention kernels compute in f64).
pub(crate) fn to_f64(s: &CpuStorage, l: &Layout, op: &str) -> candle_core::Result<Vec<f64>> {
    let (a, b) = l.contiguous_offsets().ok_or_else(|| candle_core::Error::Msg(format!("{op} needs contiguous inputs")))?;
    Ok(match s {
        CpuStorage::F32(v) => v[a..b].iter().map(|&x| f64::from(x)).collect(),
        CpuStorage::F64(v) => v[a..b].to_vec(),
        _ => return Err(candle_core::Error::Msg(format!("{op} supports f32 and f64"))),
    })
}

/// Runs a CPU kernel on CUDA inputs by way of host memory: copies the inputs
/// down, runs the same kernel as the CPU device (so results are identical),
/// copies the result up. Correct on any GPU, not fast; native kernels replace
/// it op by op.
#[cfg(feature = "cuda")]
pub(crate) fn via_host<const N: usize>(
    inputs: [&candle_core::CudaStorage; N],
    kernel: impl FnOnce([&CpuStorage; N]) -> candle_core::Result<(CpuStorage, candle_core::Shape)>,
) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
    use candle_core::backend::{BackendDevice, BackendStorage};
    let device = inputs[0].device().clone();
    let host = inputs.iter().map(|s| s.to_cpu_storage()).collect::<candle_core::Result<Vec<_>>>()?;
    let refs: [&CpuStorage; N] = std::array::from_fn(|i| &host[i]);
    let (out, shape) = kernel(refs)?;
    Ok((device.storage_from_cpu_storage_owned(out)?, shape))
}
