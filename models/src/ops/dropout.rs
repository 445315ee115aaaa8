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
use graphs::rng::{draw, key};
use rayon::prelude::*;

/// Which node each row is, and how its mask is drawn.
#[derive(Debug)]
struct Mask {
    key: u64,
    p: f32,
    relu: bool,
    ids: Vec<u32>,
    /// Column `j` is dropped when the top 53 bits of its draw are below this
    /// (see [`drop_threshold`]).
    threshold: u64,
}

/// Columns a row's mask is drawn in at a time (a stack buffer).
const CHUNK: usize = 64;

impl Mask {
    fn new(key: u64, p: f32, relu: bool, ids: Vec<u32>) -> Mask {
        Mask {
            key,
            p,
            relu,
            ids,
            threshold: drop_threshold(p),
        }
    }

    /// Calls `f(column, mask value)` for every column of row `r`: 0 with
    /// probability `p`, else `1 / (1 - p)`.
    #[inline]
    fn row(&self, r: usize, cols: usize, mut f: impl FnMut(usize, f32)) {
        let k = key(&[self.key, u64::from(self.ids[r])]);
        let scale = 1.0 / (1.0 - self.p);
        let mut buf = [0f32; CHUNK];
        for j0 in (0..cols).step_by(CHUNK) {
            let n = (cols - j0).min(CHUNK);
            fill_mask(k, j0, self.threshold, scale, &mut buf[..n]);
            for (i, &v) in buf[..n].iter().enumerate() {
                f(j0 + i, v);
            }
        }
    }

    /// Each row's counter-stream key, for the CUDA kernels (which draw as [`Mask::row`] does).
    #[cfg(feature = "cuda")]
    fn row_keys(&self) -> Vec<u64> {
        self.ids
            .iter()
            .map(|&id| key(&[self.key, u64::from(id)]))
            .collect()
    }

    fn dims(&self, l: &Layout, what: &str) -> candle_core::Result<(usize, usize)> {
        match l.dims() {
            [r, c] if *r == self.ids.len() => Ok((*r, *c)),
            dims => Err(candle_core::Error::Msg(format!(
                "{what}: input shape {dims:?} for {} node ids",
                self.ids.len()
            ))),
        }
    }
}

/// `relu(x) * mask` (or `x * mask` when `relu` is false) for a `[ids.len(), h]`
/// input, the mask drawn per (key, node id) with drop probability `p`; differentiable.
pub fn dropout(
    x: &Tensor,
    relu: bool,
    mask_key: u64,
    p: f32,
    ids: &[u32],
) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1(Dropout(Arc::new(Mask::new(
        mask_key,
        p,
        relu,
        ids.to_vec(),
    ))))
}

/// The drop test as an integer compare: column `j` of a row keyed `k` is
/// dropped when draw `j + 1` of `k`'s counter stream, as a uniform double
/// `(bits >> 11)·2⁻⁵³` rounded to float, is below `p` (the definition the CUDA
/// kernels follow). Rounding is monotone, so that holds exactly when
/// `bits >> 11` is below the smallest integer whose uniform rounds to at
/// least `p`, found once per op by bisection; the per-element test then needs
/// no conversions. NaN drops nothing, as the float compare would.
fn drop_threshold(p: f32) -> u64 {
    let rounds_to = |t: u64| (t as f64 * (1.0 / (1u64 << 53) as f64)) as f32;
    if p.is_nan() {
        return 0;
    }
    // Smallest t in [0, 2^53] with rounds_to(t) >= p (2^53: none below it).
    let (mut lo, mut hi) = (0u64, 1u64 << 53);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if rounds_to(mid) >= p {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Mask values of columns `j0..j0 + out.len()` of the row keyed `k`.
#[inline]
fn fill_mask(k: u64, j0: usize, threshold: u64, scale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512dq") {
        // SAFETY: the CPU has AVX-512 F and DQ (DQ implies F).
        return unsafe { fill_mask_avx512(k, j0, threshold, scale, out) };
    }
    fill_mask_body(k, j0, threshold, scale, out)
}

/// [`fill_mask_body`] compiled for AVX-512, whose 64-bit multiplies let the
/// eight-lane mixer vectorise (a third of a dropout pass's time otherwise).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn fill_mask_avx512(k: u64, j0: usize, threshold: u64, scale: f32, out: &mut [f32]) {
    fill_mask_body(k, j0, threshold, scale, out)
}

#[inline(always)]
fn fill_mask_body(k: u64, j0: usize, threshold: u64, scale: f32, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        let bits = draw(k, (j0 + i) as u64 + 1);
        *o = if (bits >> 11) < threshold { 0.0 } else { scale };
    }
}

struct Dropout(Arc<Mask>);
struct DropoutGrad(Arc<Mask>);

fn slice<'a, T: candle_core::WithDType>(
    s: &'a CpuStorage,
    l: &Layout,
) -> candle_core::Result<&'a [T]> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("dropout needs a contiguous input".into()))?;
    Ok(&s.as_slice::<T>()?[a..b])
}

/// Rows of the output in parallel, `f(row index, output row)`.
fn per_row<T: Copy + Default + Send + Sync>(
    rows: usize,
    cols: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); rows * cols];
    if cols > 0 {
        out.par_chunks_mut(cols)
            .enumerate()
            .with_min_len(64)
            .for_each(|(r, o)| f(r, o));
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
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let m = &self.0;
        let (rows, cols) = m.dims(l, self.name())?;
        let out = super::cuda::dropout(s, l, None, &m.row_keys(), m.p, m.relu, rows, cols)?;
        Ok((out, Shape::from((rows, cols))))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op2(
            &arg.contiguous()?,
            DropoutGrad(Arc::clone(&self.0)),
        )?))
    }
}

impl CustomOp2 for DropoutGrad {
    fn name(&self) -> &'static str {
        "dropout-backward"
    }

    fn cpu_fwd(
        &self,
        sg: &CpuStorage,
        lg: &Layout,
        sx: &CpuStorage,
        lx: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let m = &self.0;
        let (rows, cols) = m.dims(lg, self.name())?;
        if lx.dims() != lg.dims() {
            return Err(candle_core::Error::Msg(format!(
                "{}: gradient {:?} and input {:?} differ",
                self.name(),
                lg.dims(),
                lx.dims()
            )));
        }
        let st = cpu_by_dtype!(sg, self.name(), |T| {
            let (g, x) = (slice::<T>(sg, lg)?, slice::<T>(sx, lx)?);
            per_row::<T>(rows, cols, |r, o| {
                let (gr, xr) = (&g[r * cols..(r + 1) * cols], &x[r * cols..(r + 1) * cols]);
                m.row(r, cols, |j, k| {
                    // candle's order: the product's gradient, then relu's `(x >= 0)` factor.
                    let v = gr[j] * k as T;
                    o[j] = if m.relu {
                        v * if xr[j] >= 0.0 { 1.0 } else { 0.0 }
                    } else {
                        v
                    };
                })
            })
        });
        Ok((st, Shape::from((rows, cols))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sg: &candle_core::CudaStorage,
        lg: &Layout,
        sx: &candle_core::CudaStorage,
        lx: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let m = &self.0;
        let (rows, cols) = m.dims(lg, self.name())?;
        if lx.dims() != lg.dims() {
            return Err(candle_core::Error::Msg(format!(
                "{}: gradient {:?} and input {:?} differ",
                self.name(),
                lg.dims(),
                lx.dims()
            )));
        }
        let out = super::cuda::dropout(
            sx,
            lx,
            Some((sg, lg)),
            &m.row_keys(),
            m.p,
            m.relu,
            rows,
            cols,
        )?;
        Ok((out, Shape::from((rows, cols))))
    }

    fn bwd(
        &self,
        _g: &Tensor,
        _x: &Tensor,
        _res: &Tensor,
        _grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        Err(candle_core::Error::Msg(
            "dropout: second derivatives are not supported".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The unfused reference: `relu(x) * mask` with the mask built row by row.
    fn reference(x: &Tensor, relu: bool, k: u64, p: f32, ids: &[u32]) -> Tensor {
        let cols = x.dim(1).unwrap();
        let m = Mask::new(k, p, relu, ids.to_vec());
        let mut mask = vec![0f32; ids.len() * cols];
        for r in 0..ids.len() {
            m.row(r, cols, |j, v| mask[r * cols + j] = v);
        }
        let mask = Tensor::from_vec(mask, (ids.len(), cols), x.device())
            .unwrap()
            .to_dtype(x.dtype())
            .unwrap();
        let x = if relu { x.relu().unwrap() } else { x.clone() };
        (x * mask).unwrap()
    }

    /// How many values differ in their bits, zeros' signs aside (`-0 + 0 == +0`).
    fn differing(a: &[f32], b: &[f32]) -> usize {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .filter(|(x, y)| (**x + 0.0).to_bits() != (**y + 0.0).to_bits())
            .count()
    }

    #[test]
    fn equals_relu_then_mask_forward_and_backward_bit_for_bit() {
        let dev = Device::Cpu;
        let ids: Vec<u32> = (0..300).map(|i| i * 7 + 3).collect();
        let data: Vec<f32> = (0..300 * 33)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let up: Vec<f32> = (0..300 * 33)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 3.0)
            .collect();
        for relu in [true, false] {
            let x = Var::from_vec(data.clone(), (300, 33), &dev).unwrap();
            let w = Tensor::from_vec(up.clone(), (300, 33), &dev).unwrap();
            let fused = dropout(x.as_tensor(), relu, 99, 0.5, &ids).unwrap();
            let unfused = reference(x.as_tensor(), relu, 99, 0.5, &ids);
            let (a, b): (Vec<f32>, Vec<f32>) = (
                fused.flatten_all().unwrap().to_vec1().unwrap(),
                unfused.flatten_all().unwrap().to_vec1().unwrap(),
            );
            assert_eq!(differing(&a, &b), 0, "forward, relu {relu}");
            let zeros = a.iter().filter(|v| **v == 0.0).count() as f64 / a.len() as f64;
            assert!(
                if relu {
                    zeros > 0.6
                } else {
                    (0.4..0.6).contains(&zeros)
                },
                "dropped share {zeros}"
            );
            let ga = (fused * &w)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap()
                .get(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let gb = (unfused * &w)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap()
                .get(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(differing(&ga, &gb), 0, "backward, relu {relu}");
        }
    }

    /// The mask as first defined: draw `j + 1` of the row's counter stream as
    /// a uniform double, rounded to float, against `p`.
    fn float_mask(row_key: u64, p: f32, cols: usize) -> Vec<f32> {
        let mut rng = graphs::rng::CounterRng::new(row_key);
        (0..cols)
            .map(|_| {
                if (rng.next_f64() as f32) < p {
                    0.0
                } else {
                    1.0 / (1.0 - p)
                }
            })
            .collect()
    }

    #[test]
    fn the_integer_drop_test_equals_the_float_one() {
        let unit = |t: u64| (t as f64 * (1.0 / (1u64 << 53) as f64)) as f32;
        for p in [
            0.0f32, 1e-8, 0.1, 0.25, 0.3, 0.5, 0.7, 0.9999, 1.0, 1.5, -0.5,
        ] {
            let t = drop_threshold(p);
            // Around the threshold, where rounding decides, and spread over the range.
            let near = (t.saturating_sub(3)..t.saturating_add(3)).filter(|&b| b < 1 << 53);
            let spread = (0..2000u64).map(|i| graphs::rng::mix64(i) >> 11);
            for b in near.chain(spread) {
                assert_eq!(b < t, unit(b) < p, "p {p}, bits {b}, threshold {t}");
            }
        }
        assert_eq!(drop_threshold(f32::NAN), 0, "NaN drops nothing");
    }

    #[test]
    fn row_masks_equal_the_counter_streams_draws_on_every_path() {
        for (p, cols) in [(0.5f32, 150usize), (0.2, 64), (0.9, 7), (0.5, 0)] {
            let m = Mask::new(42, p, false, vec![3, 77]);
            for r in 0..2 {
                let row_key = key(&[42, u64::from(m.ids[r])]);
                let mut got = vec![f32::NAN; cols];
                m.row(r, cols, |j, v| got[j] = v);
                assert_eq!(
                    got,
                    float_mask(row_key, p, cols),
                    "p {p}, cols {cols}, row {r}"
                );
                // The portable body, whatever this CPU dispatched to.
                let mut portable = vec![f32::NAN; cols];
                fill_mask_body(row_key, 0, m.threshold, 1.0 / (1.0 - p), &mut portable);
                assert_eq!(portable, got);
            }
        }
    }

    #[test]
    fn a_nodes_mask_does_not_depend_on_its_row() {
        let dev = Device::Cpu;
        let x = Tensor::ones((2, 16), candle_core::DType::F64, &dev).unwrap();
        let a = dropout(&x, false, 5, 0.5, &[10, 20])
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        let b = dropout(&x, false, 5, 0.5, &[20, 10])
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        assert_eq!((&a[0], &a[1]), (&b[1], &b[0]));
        assert_ne!(a[0], a[1]);
        let c = dropout(&x, false, 6, 0.5, &[10, 20])
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn refuses_a_row_count_other_than_the_ids() {
        let x = Tensor::ones((3, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let err = dropout(&x, true, 1, 0.5, &[1, 2]).unwrap_err().to_string();
        assert!(err.contains("3, 4"), "{err}");
    }
}
