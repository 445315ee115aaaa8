//! Sparse Adam in place on rows held in device memory (a cache that owns
//! learnable rows on a GPU): one kernel for every row of a step, where tensor
//! arithmetic took a dozen launches and candle's `scatter_set`, which walks
//! the rows of a dim-0 scatter one after another in a few threads, three more
//! (hundreds of milliseconds a step at mag-like S=1).

use candle_core::Tensor;

use crate::optim::AdamConfig;

/// One Adam step, in place, for rows `slots` (distinct) of `data`, `m` and
/// `v` (`[rows, dim]` f32 tensors on one CUDA device) with gradient rows `g`
/// (`[slots.len(), dim]`, on that device) and per-row bias corrections `bc`
/// (`1 - β1^t, 1 - β2^t` for each row's own step count `t`): what
/// [`adam_row`](crate::embedding::adam_row) does to each, bit for bit.
/// `Ok(false)`, touching nothing, when the tensors are not on a CUDA device.
pub fn adam_rows_in_place(data: &Tensor, m: &Tensor, v: &Tensor, slots: &[u32], g: &Tensor, bc: &[f64], cfg: &AdamConfig) -> candle_core::Result<bool> {
    if !data.device().is_cuda() {
        return Ok(false);
    }
    let (rows, dim) = data.dims2()?;
    for (what, t, want) in [("moments", m, (rows, dim)), ("moments", v, (rows, dim)), ("gradient", g, (slots.len(), dim))] {
        if t.dims2()? != want || !t.is_contiguous() || t.dtype() != candle_core::DType::F32 || !t.device().same_device(data.device()) {
            return Err(candle_core::Error::Msg(format!("sparse-adam: {what} of shape {:?} ({:?}) for rows of {dim} f32", t.dims(), t.dtype())));
        }
    }
    if !data.is_contiguous() || data.dtype() != candle_core::DType::F32 {
        return Err(candle_core::Error::Msg("sparse-adam: the values must be contiguous f32".into()));
    }
    if bc.len() != 2 * slots.len() {
        return Err(candle_core::Error::Msg(format!("sparse-adam: {} bias corrections for {} rows", bc.len(), slots.len())));
    }
    if let Some(&s) = slots.iter().find(|&&s| s as usize >= rows) {
        return Err(candle_core::Error::Msg(format!("sparse-adam: row {s} of {rows}")));
    }
    device(data, m, v, g, slots, bc, cfg, dim)?;
    Ok(true)
}

#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
fn device(data: &Tensor, m: &Tensor, v: &Tensor, g: &Tensor, slots: &[u32], bc: &[f64], cfg: &AdamConfig, dim: usize) -> candle_core::Result<()> {
    use candle_core::Storage;
    let (sd, ld) = data.storage_and_layout();
    let (sm, lm) = m.storage_and_layout();
    let (sv, lv) = v.storage_and_layout();
    let (sg, lg) = g.storage_and_layout();
    let (Storage::Cuda(sd), Storage::Cuda(sm), Storage::Cuda(sv), Storage::Cuda(sg)) = (&*sd, &*sm, &*sv, &*sg) else {
        return Err(candle_core::Error::Msg("sparse-adam: tensors on different devices".into()));
    };
    let c = super::cuda::AdamConsts { b1: cfg.beta1 as f32, b2: cfg.beta2 as f32, lr: cfg.lr, eps: cfg.eps };
    super::cuda::sparse_adam((sd, ld), (sm, lm), (sv, lv), (sg, lg), slots, bc, &c, dim)
}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::too_many_arguments)]
fn device(_: &Tensor, _: &Tensor, _: &Tensor, _: &Tensor, _: &[u32], _: &[f64], _: &AdamConfig, _: usize) -> candle_core::Result<()> {
    Err(candle_core::Error::Msg("sparse-adam: a CUDA tensor in a build without CUDA".into()))
}
