//! Matrix product whose backward skips inputs that need no gradient.
//!
//! candle's own matmul backward always computes both input gradients; when
//! the left side is a constant (input features, or their neighbor means)
//! that is a whole `[rows × in]` product thrown away every step.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};

/// `x · w` for `x: [m, k]`, `w: [k, n]`, differentiable; a constant,
/// mostly-zero `x` multiplies by its non-zeros only (`super::sparse`).
pub fn matmul(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    if let Some(sp) = super::sparse::rows_for(x, w)? {
        return super::sparse::matmul(&sp, x.dim(0)?, w);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, MatMul)
}

/// `x[..rows] · w`: [`matmul`] of a prefix of `x`'s rows (a block's
/// destinations), sharing `x`'s scan for non-zeros.
pub fn matmul_prefix(x: &Tensor, rows: usize, w: &Tensor) -> candle_core::Result<Tensor> {
    if let Some(sp) = super::sparse::rows_for(x, w)? {
        return super::sparse::matmul(&sp, rows, w);
    }
    matmul(&x.narrow(0, 0, rows)?, w)
}

struct MatMul;

fn dims(l1: &Layout, l2: &Layout) -> candle_core::Result<(usize, usize, usize)> {
    match (l1.dims(), l2.dims()) {
        ([m, k], [k2, n]) if k == k2 => Ok((*m, *k, *n)),
        (a, b) => Err(candle_core::Error::Msg(format!(
            "matmul: shapes {a:?} and {b:?} do not compose"
        ))),
    }
}

impl CustomOp2 for MatMul {
    fn name(&self) -> &'static str {
        "matmul-skip-const"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, k, n) = dims(l1, l2)?;
        Ok((s1.matmul(s2, (1, m, n, k), l1, l2)?, Shape::from((m, n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (m, k, n) = dims(l1, l2)?;
        Ok((s1.matmul(s2, (1, m, n, k), l1, l2)?, Shape::from((m, n))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let gx = if x.track_op() {
            Some(grad.matmul(&w.t()?)?)
        } else {
            None
        };
        let gw = if w.track_op() {
            Some(x.t()?.matmul(grad)?)
        } else {
            None
        };
        Ok((gx, gw))
    }
}
