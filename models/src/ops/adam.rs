//! Adam in place in device memory. Sparse: rows a cache that owns learnable
//! rows on a GPU updates, one kernel for every row of a step, where tensor
//! arithmetic took a dozen launches and candle's `scatter_set`, which walks
//! the rows of a dim-0 scatter one after another in a few threads, three more
//! (hundreds of milliseconds a step at mag-like S=1). Dense: a parameter in
//! one kernel, where `optim::Adam`'s tensor arithmetic takes a dozen.

use candle_core::Tensor;

use crate::optim::AdamConfig;

/// One Adam step, in place, for rows `slots` (distinct) of `data`, `m` and
/// `v` (`[rows, dim]` f32 tensors on one CUDA device) with gradient rows `g`
/// (`[slots.len(), dim]`, on that device): what
/// [`adam_row`](crate::embedding::adam_row) does to each, bit for bit. Each
/// row's step count is in `steps` (`[rows]` u32, there too), bumped here, and
/// its bias corrections `1 - β1^t, 1 - β2^t` for its count `t` after the
/// update are row `t` of `bc` (`[len, 2]` f64, there too), which the caller
/// makes longer than any count (past its end the last row is used): the host
/// does nothing per row.
/// Arguments are checked wherever the tensors are; `Ok(false)`, touching
/// nothing, when they are not on a CUDA device.
#[allow(clippy::too_many_arguments)]
pub fn adam_rows_in_place(
    data: &Tensor,
    m: &Tensor,
    v: &Tensor,
    steps: &Tensor,
    slots: &[u32],
    g: &Tensor,
    bc: &Tensor,
    cfg: &AdamConfig,
) -> candle_core::Result<bool> {
    let (rows, dim) = data.dims2()?;
    for (what, t, want) in [
        ("moments", m, (rows, dim)),
        ("moments", v, (rows, dim)),
        ("gradient", g, (slots.len(), dim)),
    ] {
        if t.dims2()? != want
            || !t.is_contiguous()
            || t.dtype() != candle_core::DType::F32
            || !t.device().same_device(data.device())
        {
            return Err(candle_core::Error::Msg(format!(
                "sparse-adam: {what} of shape {:?} ({:?}) for rows of {dim} f32",
                t.dims(),
                t.dtype()
            )));
        }
    }
    if !data.is_contiguous() || data.dtype() != candle_core::DType::F32 {
        return Err(candle_core::Error::Msg(
            "sparse-adam: the values must be contiguous f32".into(),
        ));
    }
    let on = |t: &Tensor| t.is_contiguous() && t.device().same_device(data.device());
    if steps.dims() != [rows] || steps.dtype() != candle_core::DType::U32 || !on(steps) {
        return Err(candle_core::Error::Msg(format!(
            "sparse-adam: step counts of shape {:?} ({:?}) for {rows} rows",
            steps.dims(),
            steps.dtype()
        )));
    }
    if bc.dims().len() != 2
        || bc.dims()[1] != 2
        || bc.dims()[0] < 2
        || bc.dtype() != candle_core::DType::F64
        || !on(bc)
    {
        return Err(candle_core::Error::Msg(format!(
            "sparse-adam: bias corrections of shape {:?} ({:?}), not [at least 2, 2] f64",
            bc.dims(),
            bc.dtype()
        )));
    }
    if let Some(&s) = slots.iter().find(|&&s| s as usize >= rows) {
        return Err(candle_core::Error::Msg(format!(
            "sparse-adam: row {s} of {rows}"
        )));
    }
    // Two blocks updating one row would race: refuse, as the host table does.
    let mut seen = vec![0u64; rows.div_ceil(64)];
    for &s in slots {
        let (word, bit) = (s as usize / 64, 1u64 << (s % 64));
        if seen[word] & bit != 0 {
            return Err(candle_core::Error::Msg(format!(
                "sparse-adam: row {s} updated twice in one step"
            )));
        }
        seen[word] |= bit;
    }
    if !data.device().is_cuda() {
        return Ok(false);
    }
    device(data, m, v, steps, g, slots, bc, cfg, dim)?;
    Ok(true)
}

#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
fn device(
    data: &Tensor,
    m: &Tensor,
    v: &Tensor,
    steps: &Tensor,
    g: &Tensor,
    slots: &[u32],
    bc: &Tensor,
    cfg: &AdamConfig,
    dim: usize,
) -> candle_core::Result<()> {
    use candle_core::Storage;
    let (sd, ld) = data.storage_and_layout();
    let (sm, lm) = m.storage_and_layout();
    let (sv, lv) = v.storage_and_layout();
    let (ss, ls) = steps.storage_and_layout();
    let (sg, lg) = g.storage_and_layout();
    let (sb, lb) = bc.storage_and_layout();
    let (
        Storage::Cuda(sd),
        Storage::Cuda(sm),
        Storage::Cuda(sv),
        Storage::Cuda(ss),
        Storage::Cuda(sg),
        Storage::Cuda(sb),
    ) = (&*sd, &*sm, &*sv, &*ss, &*sg, &*sb)
    else {
        return Err(candle_core::Error::Msg(
            "sparse-adam: tensors on different devices".into(),
        ));
    };
    let c = super::cuda::AdamConsts {
        b1: cfg.beta1 as f32,
        b2: cfg.beta2 as f32,
        lr: cfg.lr,
        eps: cfg.eps,
    };
    super::cuda::sparse_adam(
        (sd, ld),
        (sm, lm),
        (sv, lv),
        (ss, ls),
        (sg, lg),
        slots,
        (sb, lb),
        &c,
        dim,
    )
}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::too_many_arguments)]
fn device(
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: &[u32],
    _: &Tensor,
    _: &AdamConfig,
    _: usize,
) -> candle_core::Result<()> {
    Err(candle_core::Error::Msg(
        "sparse-adam: a CUDA tensor in a build without CUDA".into(),
    ))
}

/// One Adam step, in place, of the dense parameter `p` with moments `m`, `v`
/// and gradient `g` (f32 tensors of one shape on one CUDA device, contiguous),
/// its `t`-th update: what [`Adam`](crate::optim::Adam)'s tensor arithmetic
/// computes, bit for bit, in one launch. `Ok(false)`, touching nothing, where
/// that does not apply (not on a CUDA device, not f32, not contiguous): the
/// caller then takes the tensor ops' way.
pub fn dense_adam_in_place(
    p: &Tensor,
    m: &Tensor,
    v: &Tensor,
    g: &Tensor,
    cfg: &AdamConfig,
    t: u32,
) -> candle_core::Result<bool> {
    let fits = |x: &Tensor| {
        x.device().is_cuda()
            && x.device().same_device(p.device())
            && x.dtype() == candle_core::DType::F32
            && x.is_contiguous()
            && x.dims() == p.dims()
    };
    if ![p, m, v, g].into_iter().all(fits) {
        return Ok(false);
    }
    dense_device(p, m, v, g, cfg, t)?;
    Ok(true)
}

#[cfg(feature = "cuda")]
fn dense_device(
    p: &Tensor,
    m: &Tensor,
    v: &Tensor,
    g: &Tensor,
    cfg: &AdamConfig,
    t: u32,
) -> candle_core::Result<()> {
    use candle_core::Storage;
    let (sp, lp) = p.storage_and_layout();
    let (sm, lm) = m.storage_and_layout();
    let (sv, lv) = v.storage_and_layout();
    let (sg, lg) = g.storage_and_layout();
    let (Storage::Cuda(sp), Storage::Cuda(sm), Storage::Cuda(sv), Storage::Cuda(sg)) =
        (&*sp, &*sm, &*sv, &*sg)
    else {
        return Err(candle_core::Error::Msg(
            "dense-adam: tensors on different devices".into(),
        ));
    };
    let (bc1, bc2) = cfg.bias_corrections(t);
    // The scalars as candle's affine maps round them (`T::from_f64`).
    let c = super::cuda::DenseAdamConsts {
        b1: cfg.beta1 as f32,
        ob1: (1.0 - cfg.beta1) as f32,
        b2: cfg.beta2 as f32,
        ob2: (1.0 - cfg.beta2) as f32,
        ibc1: (1.0 / bc1) as f32,
        ibc2: (1.0 / bc2) as f32,
        eps: cfg.eps as f32,
        lr: cfg.lr as f32,
    };
    super::cuda::dense_adam((sp, lp), (sm, lm), (sv, lv), (sg, lg), &c, p.elem_count())
}

#[cfg(not(feature = "cuda"))]
fn dense_device(
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: &AdamConfig,
    _: u32,
) -> candle_core::Result<()> {
    Err(candle_core::Error::Msg(
        "dense-adam: a CUDA tensor in a build without CUDA".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn bad_rows_and_shapes_are_refused_before_any_launch() {
        let cfg = AdamConfig::with_lr(0.01);
        let t = |r: usize| Tensor::zeros((r, 4), DType::F32, &Device::Cpu).unwrap();
        let (d, m, v) = (t(10), t(10), t(10));
        let steps = Tensor::zeros(10, DType::U32, &Device::Cpu).unwrap();
        let bc = |n: usize| Tensor::ones((n, 2), DType::F64, &Device::Cpu).unwrap();
        assert!(
            !adam_rows_in_place(&d, &m, &v, &steps, &[3, 1], &t(2), &bc(4), &cfg).unwrap(),
            "not a CUDA device: nothing done"
        );
        let err = |slots: &[u32], g: &Tensor, bc: &Tensor| {
            adam_rows_in_place(&d, &m, &v, &steps, slots, g, bc, &cfg)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[3, 3], &t(2), &bc(4)).contains("row 3 updated twice"));
        assert!(err(&[10], &t(1), &bc(4)).contains("row 10 of 10"));
        assert!(err(&[1], &t(2), &bc(4)).contains("gradient"));
        assert!(
            err(&[1], &t(1), &bc(1)).contains("bias corrections"),
            "a table shorter than two"
        );
        assert!(err(
            &[1],
            &t(1),
            &Tensor::ones((4, 3), DType::F64, &Device::Cpu).unwrap()
        )
        .contains("bias corrections"));
        assert!(err(
            &[1],
            &t(1),
            &Tensor::ones((4, 2), DType::F32, &Device::Cpu).unwrap()
        )
        .contains("bias corrections"));
        let short = Tensor::zeros(9, DType::U32, &Device::Cpu).unwrap();
        assert!(
            adam_rows_in_place(&d, &m, &v, &short, &[1], &t(1), &bc(4), &cfg)
                .unwrap_err()
                .to_string()
                .contains("step counts")
        );
        assert!(
            adam_rows_in_place(&d, &t(9), &v, &steps, &[1], &t(1), &bc(4), &cfg)
                .unwrap_err()
                .to_string()
                .contains("moments")
        );
    }
}
