//! Dropout (optionally fused with the ReLU before it) as one pass forward and
//! one pass backward.
//!
//! Written as ops rather than `relu` then `* mask` because on the CPU the
//! unfused form allocates and walks the activations four times forward and
//! six times backward, and building the mask tensor cost as much again. The
//! mask is a pure function of (key, node id, column): row `r` of the input
//! belongs to node `ids[r]`, whose mask comes from the counter RNG keyed by
//! `(key, ids[r])`, so a node's mask does not depend on where it sits in the
//! batch. The arithmetic is exactly that of `x.relu()? * mask`, and its
//! gradient exactly candle's, so results do not change with the fusion.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use graphs::rng::{key, CounterRng};
use rayon::prelude::*;

/// Which node each row is, and how its mask is drawn.
#[derive(Debug)]
struct Mask {
    key: u64,
    p: f32,
    relu: bool,
    ids: Vec<u32>,
}

impl Mask {
    /// Calls `f(column, mask value)` for every column of row `r`: 0 with
    /// probability `p`, else `1 / (1 - p)`.
    #[inline]
    fn row(&self, r: usize, cols: usize, mut f: impl FnMut(usize, f32)) {
        let mut rng = CounterRng::new(key(&[self.key, u64::from(self.ids[r])]));
        let scale = 1.0 / (1.0 - self.p);
        for j in 0..cols {
            f(j, if (rng.next_f64() as f32) < self.p { 0.0 } else { scale });
        }
    }

    /// Each row's counter-stream key, for the CUDA kernels (which draw as [`Mask::row`] does).
    #[cfg(feature = "cuda")]
    fn row_keys(&self) -> Vec<u64> {
        self.ids.iter().map(|&id| key(&[self.key, u64::from(id)])).collect()
    }

    fn dims(&self, l: &Layout, what: &str) -> candle_core::Result<(usize, usize)> {
        match l.dims() {
            [r, c] if *r == self.ids.len() => Ok((*r, *c)),
            dims => Err(candle_core::Error::Msg(format!("{what}: input shape {dims:?} for {} node ids", self.ids.len()))),
        }
    }
}

/// `relu(x) * mask` (or `x * mask` when `relu` is false) for a `[ids.len(), h]`
/// input, the mask drawn per (key, node id) with drop probability `p`; differentiable.
pub fn dropout(x: &Tensor, relu: bool, mask_key: u64, p: f32, ids: &[u32]) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1(Dropout(Arc::new(Mask { key: mask_key, p, relu, ids: ids.to_vec() })))
}

struct Dropout(Arc<Mask>);
struct DropoutGrad(Arc<Mask>);

fn slice<'a, T: candle_core::WithDType>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [T]> {
    let (a, b) = l.contiguous_offsets().ok_or_else(|| candle_core::Error::Msg("dropout needs a contiguous input".into()))?;
    Ok(&s.as_slice::<T>()?[a..b])
}

/// Rows of the output in parallel, `f(row index, output row)`.
fn per_row<T: Copy + Default + Send + Sync>(rows: usize, cols: usize, f: impl Fn(usize, &mut [T]) + Sync) -> Vec<T> {
    let mut out = vec![T::default(); rows * cols];
    if cols > 0 {
        out.par_chunks_mut(cols).enumerate().with_min_len(64).for_each(|(r, o)| f(r, o));
    }
    out
}

impl CustomOp1 for Dropout {
    fn name(&self) -> &'static str {
        "dropout"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let m = &self.0;
        let (rows, cols) = m.dims(l, self.name())?;
        let st = cpu_by_dtype!(s, self.name(), |T| {
            let x = slice::<T>(s, l)?;
            per_row::<T>(rows, cols, |r, o| {
                let xr = &x[r * cols..(r + 1) * cols];
                m.row(r, cols, |j, k| {
                    // Same values as candle's relu (`max(0)`) followed by a multiply.
                    let v = if m.relu { xr[j].max(0.0) } else { xr[j] };
                    o[j] = v * k as T;
                })
            })
        });
        Ok((st, Shape::from((rows, cols))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let m = &self.0;
        let (rows, cols) = m.dims(l, self.name())?;
        let out = super::cuda::dropout(s, l, None, &m.row_keys(), m.p, m.relu, rows, cols)?;
        Ok((out, Shape::from((rows, cols))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op2(&arg.contiguous()?, DropoutGrad(Arc::clone(&self.0)))?))
    }
}

impl CustomOp2 for DropoutGrad {
    fn name(&self) -> &'static str {
        "dropout-backward"
    }

    fn cpu_fwd(&self, sg: &CpuStorage, lg: &Layout, sx: &CpuStorage, lx: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let m = &self.0;
        let (rows, cols) = m.dims(lg, self.name())?;
        if lx.dims() != lg.dims() {
            return Err(candle_core::Error::Msg(format!("{}: gradient {:?} and input {:?} differ", self.name(), lg.dims(), lx.dims())));
        }
        let st = cpu_by_dtype!(sg, self.name(), |T| {
            let (g, x) = (slice::<T>(sg, lg)?, slice::<T>(sx, lx)?);
            per_row::<T>(rows, cols, |r, o| {
                let (gr, xr) = (&g[r * cols..(r + 1) * cols], &x[r * cols..(r + 1) * cols]);
                m.row(r, cols, |j, k| {
                    // candle's order: the product's gradient, then relu's `(x >= 0)` factor.
                    let v = gr[j] * k as T;
                    o[j] = if m.relu { v * if xr[j] >= 0.0 { 1.0 } else { 0.0 } } else { v };
                })
            })
        });
        Ok((st, Shape::from((rows, cols))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, sg: &candle_core::CudaStorage, lg: &Layout, sx: &candle_core::CudaStorage, lx: &Layout) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let m = &self.0;
        let (rows, cols) = m.dims(lg, self.name())?;
        if lx.dims() != lg.dims() {
            return Err(candle_core::Error::Msg(format!("{}: gradient {:?} and input {:?} differ", self.name(), lg.dims(), lx.dims())));
        }
        let out = super::cuda::dropout(sx, lx, Some((sg, lg)), &m.row_keys(), m.p, m.relu, rows, cols)?;
        Ok((out, Shape::from((rows, cols))))
    }

    fn bwd(&self, _g: &Tensor, _x: &Tensor, _res: &Tensor, _grad: &Tensor) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        Err(candle_core::Error::Msg("dropout: second derivatives are not supported".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The unfused reference: `relu(x) * mask` with the mask built row by row.
    fn reference(x: &Tensor, relu: bool, k: u64, p: f32, ids: &[u32]) -> Tensor {
        let cols = x.dim(1).unwrap();
        let m = Mask { key: k, p, relu, ids: ids.to_vec() };
        let mut mask = vec![0f32; ids.len() * cols];
        for r in 0..ids.len() {
            m.row(r, cols, |j, v| mask[r * cols + j] = v);
        }
        let mask = Tensor::from_vec(mask, (ids.len(), cols), x.device()).unwrap().to_dtype(x.dtype()).unwrap();
        let x = if relu { x.relu().unwrap() } else { x.clone() };
        (x * mask).unwrap()
    }

    /// How many values differ in their bits, zeros' signs aside (`-0 + 0 == +0`).
    fn differing(a: &[f32], b: &[f32]) -> usize {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).filter(|(x, y)| (**x + 0.0).to_bits() != (**y + 0.0).to_bits()).count()
    }

    #[test]
    fn equals_relu_then_mask_forward_and_backward_bit_for_bit() {
        let dev = Device::Cpu;
        let ids: Vec<u32> = (0..300).map(|i| i * 7 + 3).collect();
        let data: Vec<f32> = (0..300 * 33).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let up: Vec<f32> = (0..300 * 33).map(|i| ((i * 13 % 29) as f32 - 14.0) / 3.0).collect();
        for relu in [true, false] {
            let x = Var::from_vec(data.clone(), (300, 33), &dev).unwrap();
            let w = Tensor::from_vec(up.clone(), (300, 33), &dev).unwrap();
            let fused = dropout(x.as_tensor(), relu, 99, 0.5, &ids).unwrap();
            let unfused = reference(x.as_tensor(), relu, 99, 0.5, &ids);
            let (a, b): (Vec<f32>, Vec<f32>) = (fused.flatten_all().unwrap().to_vec1().unwrap(), unfused.flatten_all().unwrap().to_vec1().unwrap());
            assert_eq!(differing(&a, &b), 0, "forward, relu {relu}");
            let zeros = a.iter().filter(|v| **v == 0.0).count() as f64 / a.len() as f64;
            assert!(if relu { zeros > 0.6 } else { (0.4..0.6).contains(&zeros) }, "dropped share {zeros}");
            let ga = (fused * &w).unwrap().sum_all().unwrap().backward().unwrap().get(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let gb = (unfused * &w).unwrap().sum_all().unwrap().backward().unwrap().get(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(differing(&ga, &gb), 0, "backward, relu {relu}");
        }
    }

    #[test]
    fn a_nodes_mask_does_not_depend_on_its_row() {
        let dev = Device::Cpu;
        let x = Tensor::ones((2, 16), candle_core::DType::F64, &dev).unwrap();
        let a = dropout(&x, false, 5, 0.5, &[10, 20]).unwrap().to_vec2::<f64>().unwrap();
        let b = dropout(&x, false, 5, 0.5, &[20, 10]).unwrap().to_vec2::<f64>().unwrap();
        assert_eq!((&a[0], &a[1]), (&b[1], &b[0]));
        assert_ne!(a[0], a[1]);
        let c = dropout(&x, false, 6, 0.5, &[10, 20]).unwrap().to_vec2::<f64>().unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn refuses_a_row_count_other_than_the_ids() {
        let x = Tensor::ones((3, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let err = dropout(&x, true, 1, 0.5, &[1, 2]).unwrap_err().to_string();
        assert!(err.contains("3, 4"), "{err}");
    }
}
