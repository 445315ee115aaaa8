//! Adding a bias row to every row of a matrix, with a fast backward.
//!
//! candle's `broadcast_add` computes the bias gradient with its generic
//! reduction, which pays an integer division per element when summing over
//! rows; it took ~3% of an R-GCN epoch. This op sums the gradient's columns
//! by blocks of [`SUM_BLOCK`] rows: each block's rows in order from zero,
//! then the blocks' sums in order from zero. Up to `SUM_BLOCK` rows that is
//! candle's order (the same bits); past it, the blocks let a GPU sum in
//! parallel and still give the CPU's bits, where one thread per column
//! walking every row (a self-loop's bias has tens of thousands) was serial.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

/// `x + b` for `x: [n, c]` and `b: [c]`, differentiable.
pub fn add_bias(x: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op2(&b.contiguous()?, AddBias)
}

struct AddBias;
struct ColumnSums;

/// Rows a column sum adds in order before adding the block's sum to the
/// total (see the module's note); `cuda.rs` and `kernels.cu` use the same.
pub(crate) const SUM_BLOCK: usize = 256;

fn slice<'a, T: candle_core::WithDType>(
    s: &'a CpuStorage,
    l: &Layout,
    op: &str,
) -> candle_core::Result<&'a [T]> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op} needs contiguous inputs")))?;
    Ok(&s.as_slice::<T>()?[a..b])
}

fn matrix(l: &Layout, op: &str) -> candle_core::Result<(usize, usize)> {
    match l.dims() {
        [n, c] => Ok((*n, *c)),
        dims => Err(candle_core::Error::Msg(format!(
            "{op}: expected a matrix, got shape {dims:?}"
        ))),
    }
}

impl CustomOp2 for AddBias {
    fn name(&self) -> &'static str {
        "add-bias"
    }

    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, c) = matrix(lx, self.name())?;
        if lb.dims() != [c] {
            return Err(candle_core::Error::Msg(format!(
                "add-bias: bias of shape {:?} for {c} columns",
                lb.dims()
            )));
        }
        let st = cpu_by_dtype!(sx, self.name(), |T| {
            let (x, b) = (
                slice::<T>(sx, lx, self.name())?,
                slice::<T>(sb, lb, self.name())?,
            );
            let mut out: Vec<T> = Vec::with_capacity(n * c);
            if c > 0 {
                // Rows in parallel, each written once (no copy then add).
                out.spare_capacity_mut()
                    .par_chunks_mut(c)
                    .zip(x.par_chunks(c))
                    .with_min_len(256)
                    .for_each(|(o, xr)| {
                        for ((o, &xj), &bj) in o.iter_mut().zip(xr).zip(b) {
                            let mut v = xj;
                            v += bj;
                            o.write(v);
                        }
                    });
            }
            // SAFETY: every row of the n·c elements was written above (none when c = 0).
            unsafe { out.set_len(n * c) };
            out
        });
        Ok((st, Shape::from((n, c))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sx: &candle_core::CudaStorage,
        lx: &Layout,
        sb: &candle_core::CudaStorage,
        lb: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (n, c) = matrix(lx, self.name())?;
        if lb.dims() != [c] {
            return Err(candle_core::Error::Msg(format!(
                "add-bias: bias of shape {:?} for {c} columns",
                lb.dims()
            )));
        }
        Ok((
            super::cuda::add_bias(sx, lx, sb, lb, n, c)?,
            Shape::from((n, c)),
        ))
    }

    fn bwd(
        &self,
        x: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let gx = x.track_op().then(|| grad.clone());
        let gb = if b.track_op() {
            Some(grad.contiguous()?.apply_op1(ColumnSums)?)
        } else {
            None
        };
        Ok((gx, gb))
    }
}

impl CustomOp1 for ColumnSums {
    fn name(&self) -> &'static str {
        "column-sums"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, c) = matrix(l, self.name())?;
        let st = cpu_by_dtype!(s, self.name(), |T| {
            let g = slice::<T>(s, l, self.name())?;
            let mut out = vec![0.0 as T; c];
            if c > 0 {
                let mut part = vec![0.0 as T; c];
                for block in g.chunks(SUM_BLOCK * c) {
                    part.fill(0.0);
                    for row in block.chunks(c) {
                        part.iter_mut().zip(row).for_each(|(p, &v)| *p += v);
                    }
                    out.iter_mut().zip(&part).for_each(|(o, &p)| *o += p);
                }
            }
            out
        });
        Ok((st, Shape::from(c)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (n, c) = matrix(l, self.name())?;
        Ok((super::cuda::column_sums(s, l, n, c)?, Shape::from(c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn equals_broadcast_add_up_to_a_block_and_sums_blocks_in_order_past_it() {
        let dev = Device::Cpu;
        for rows in [SUM_BLOCK - 3, 3 * SUM_BLOCK + 5] {
            let xs: Vec<f32> = (0..rows * 19)
                .map(|i| ((i * 7919 % 1013) as f32 - 500.0) / 37.0)
                .collect();
            let bs: Vec<f32> = (0..19).map(|i| i as f32 / 3.0 - 2.0).collect();
            let ws: Vec<f32> = (0..rows * 19)
                .map(|i| ((i * 31 % 97) as f32) / 11.0 - 4.0)
                .collect();
            let w = Tensor::from_vec(ws.clone(), (rows, 19), &dev).unwrap();
            let run = |fused: bool| {
                let (x, b) = (
                    Var::from_vec(xs.clone(), (rows, 19), &dev).unwrap(),
                    Var::from_vec(bs.clone(), 19, &dev).unwrap(),
                );
                let y = if fused {
                    add_bias(x.as_tensor(), b.as_tensor()).unwrap()
                } else {
                    x.as_tensor().broadcast_add(b.as_tensor()).unwrap()
                };
                let g = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
                let bits = |t: &Tensor| {
                    t.flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>()
                };
                (bits(&y), bits(g.get(&x).unwrap()), bits(g.get(&b).unwrap()))
            };
            let (fused, candle) = (run(true), run(false));
            assert_eq!(
                (&fused.0, &fused.1),
                (&candle.0, &candle.1),
                "{rows} rows: forward and input gradient"
            );
            if rows <= SUM_BLOCK {
                assert_eq!(fused.2, candle.2, "{rows} rows: candle's order");
                continue;
            }
            // The bias gradient is the column sums of w: blocks of SUM_BLOCK rows in order, then the blocks.
            let want: Vec<u32> = (0..19)
                .map(|j| {
                    let mut total = 0.0f32;
                    for block in (0..rows).collect::<Vec<_>>().chunks(SUM_BLOCK) {
                        let mut part = 0.0f32;
                        for &r in block {
                            part += ws[r * 19 + j];
                        }
                        total += part;
                    }
                    total.to_bits()
                })
                .collect();
            assert_eq!(fused.2, want, "{rows} rows: blocked order");
        }
    }

    #[test]
    fn refuses_a_bias_of_the_wrong_width() {
        let x = Tensor::ones((3, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let b = Tensor::ones(5, candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(add_bias(&x, &b)
            .unwrap_err()
            .to_string()
            .contains("4 columns"));
    }
}
