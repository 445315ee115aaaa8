//! Graph aggregation kernels as candle custom ops (forward and backward).
//!
//! They aggregate straight from CSR and never materialise per-edge rows: the
//! per-edge `index_select` + `index_add` formulation spends most of its time
//! gathering and scattering `[edges × hidden]` tensors.

/// Runs `$body` with `$t` bound to the element type of CPU storage `$s` (f32
/// or f64) and wraps the resulting vector back into storage of that type.
macro_rules! cpu_by_dtype {
    ($s:expr, $op:expr, |$t:ident| $body:expr) => {
        match $s {
            CpuStorage::F32(_) => {
                type $t = f32;
                CpuStorage::F32($body)
            }
            CpuStorage::F64(_) => {
                type $t = f64;
                CpuStorage::F64($body)
            }
            _ => {
                return Err(candle_core::Error::Msg(format!(
                    "{} supports f32 and f64",
                    $op
                )))
            }
        }
    };
}

mod adam;
mod attention;
mod axpy;
mod bias;
#[cfg(feature = "cuda")]
mod cuda;
mod dropout;
mod lse_attention;
mod matmul;
#[cfg(feature = "cuda")]
mod sampling;
mod segment;
pub mod sparse;
mod take;

pub use adam::{adam_rows_in_place, dense_adam_in_place};
pub use attention::{attention_aggregate, NEGATIVE_SLOPE};
pub use bias::add_bias;
pub use dropout::dropout;
pub use lse_attention::{finish_partial, lse_attention, merge_partials, EMPTY_MAX};
pub use matmul::{matmul, matmul_prefix};
#[cfg(feature = "cuda")]
pub use sampling::{DeviceSampler, MAX_DEVICE_FANOUT};
pub use segment::{no_backward, segment_mean, segment_mean_in_place, NoBackward, SegmentCsr};
pub use take::{copy_rows, take_rows};

use candle_core::{CpuStorage, DType, Layout, Storage, Tensor};

/// On a CUDA device, keeps freed memory in the device's pool across
/// synchronisations (see `cuda::keep_pool_memory`); nothing elsewhere.
pub fn keep_device_memory(device: &candle_core::Device) -> candle_core::Result<()> {
    match device {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(d) => cuda::keep_pool_memory(d),
        _ => Ok(()),
    }
}

/// `f` of `x`'s values as f32, row-major: read in place where `x` is a
/// contiguous f32 tensor on the CPU (no copy), else copied out as f32.
pub fn with_f32<R>(x: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    {
        let (storage, layout) = x.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(f(&v[a..b]));
        }
    }
    Ok(f(&x
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?))
}

/// A contiguous f32 or f64 input as f64 values (the attention kernels compute in f64).
pub(crate) fn to_f64(s: &CpuStorage, l: &Layout, op: &str) -> candle_core::Result<Vec<f64>> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op} needs contiguous inputs")))?;
    Ok(match s {
        CpuStorage::F32(v) => v[a..b].iter().map(|&x| f64::from(x)).collect(),
        CpuStorage::F64(v) => v[a..b].to_vec(),
        _ => {
            return Err(candle_core::Error::Msg(format!(
                "{op} supports f32 and f64"
            )))
        }
    })
}
