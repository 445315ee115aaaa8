//! Products of a constant, mostly-zero input with a weight: bag-of-words
//! features (heco-acm's 1902 columns are 4-7% non-zero, Cora's 1.3%) make a
//! dense first layer spend nearly all its multiply-adds on zeros.
//!
//! An input qualifies when it needs no gradient, lives on the CPU, is f32,
//! has at least [`MIN_WIDTH`] columns and at most [`MAX_DENSITY`] of its
//! entries are non-zero. Its non-zeros are then kept row by row, and the
//! product and the weight's gradient cost `nnz · out` instead of
//! `rows · in · out`. Each output row
//! and each gradient row is summed in a fixed order whatever the threads,
//! so results are reproducible; they differ from the dense product only by
//! rounding (zeros are skipped, the order of the sum is the row's).
//!
//! The layers read the same input several times a step (every relation
//! from its type and the self-loop), so the last inputs scanned are
//! remembered by tensor id (ids are never reused), process-wide. Feature
//! rows need no scan: `FeatureGather` picks their non-zeros from the feature
//! table's ([`graphs::Features::nonzeros`]) on the prefetch threads and
//! [`remember`]s them; other inputs are scanned at their first product.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Storage, Tensor, TensorId};
pub use graphs::nonzeros::{RowNonzeros, MAX_DENSITY, MIN_WIDTH};
use rayon::prelude::*;

use super::axpy::axpy;

/// Inputs remembered: a few steps' worth, prefetched batches included.
const REMEMBERED: usize = 32;

/// The non-zeros of a `[rows, cols]` matrix, by row (columns ascending).
#[derive(Debug)]
pub struct SparseRows {
    nz: RowNonzeros,
}

impl SparseRows {
    /// The non-zeros of row-major `x` (`cols` wide), or `None` when more
    /// than `max_density` of its entries are non-zero.
    pub fn scan(x: &[f32], cols: usize, max_density: f64) -> Option<SparseRows> {
        RowNonzeros::scan(x, cols, max_density).map(SparseRows::from_rows)
    }

    /// Wraps non-zeros found elsewhere (a feature table's rows picked for a batch).
    pub fn from_rows(nz: RowNonzeros) -> SparseRows {
        SparseRows { nz }
    }

    /// Non-zero entries.
    pub fn nnz(&self) -> usize {
        self.nz.nnz()
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.nz.rows()
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.nz.cols()
    }

    /// `self[..rows] · w` for row-major `w` (`[cols, n]`).
    fn product(&self, rows: usize, w: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; rows * n];
        if n == 0 {
            return out;
        }
        out.par_chunks_mut(n)
            .enumerate()
            .with_min_len(32)
            .for_each(|(r, o)| {
                let (cs, vs) = self.nz.row(r);
                for (&c, &v) in cs.iter().zip(vs) {
                    axpy(o, v, &w[c as usize * n..(c as usize + 1) * n]);
                }
            });
        out
    }

    /// `self[..rows]ᵀ · g` for row-major `g` (`[rows, n]`): `[cols, n]`.
    ///
    /// Each task owns a range of columns (output rows) and walks the input
    /// rows in order, so every output row sums its terms rows ascending,
    /// whatever the threads, with no column index to build.
    fn transposed_product(&self, rows: usize, g: &[f32], n: usize) -> Vec<f32> {
        let cols = self.cols();
        let mut out = vec![0f32; cols * n];
        if n == 0 || cols == 0 {
            return out;
        }
        // A few ranges per thread, for balance when some columns are busier.
        let width = cols.div_ceil((4 * rayon::current_num_threads()).clamp(1, cols));
        out.par_chunks_mut(width * n)
            .enumerate()
            .for_each(|(k, o)| {
                let (lo, hi) = ((k * width) as u32, ((k + 1) * width).min(cols) as u32);
                for r in 0..rows {
                    let (cs, vs) = self.nz.row(r);
                    let a = cs.partition_point(|&c| c < lo);
                    let b = a + cs[a..].partition_point(|&c| c < hi);
                    let gr = &g[r * n..(r + 1) * n];
                    for (&c, &v) in cs[a..b].iter().zip(&vs[a..b]) {
                        let at = (c - lo) as usize * n;
                        axpy(&mut o[at..at + n], v, gr);
                    }
                }
            });
        out
    }
}

/// The last inputs scanned, by tensor id.
static SCANNED: Mutex<VecDeque<(TensorId, Option<Arc<SparseRows>>)>> = Mutex::new(VecDeque::new());

/// The remembered inputs (a panic elsewhere while holding the lock leaves a usable list).
fn scanned() -> std::sync::MutexGuard<'static, VecDeque<(TensorId, Option<Arc<SparseRows>>)>> {
    SCANNED.lock().unwrap_or_else(|e| e.into_inner())
}

/// `x`'s non-zeros when `x` qualifies (see the module), remembered by tensor id.
pub fn rows_of(x: &Tensor) -> candle_core::Result<Option<Arc<SparseRows>>> {
    if x.track_op()
        || !x.device().is_cpu()
        || x.dtype() != DType::F32
        || x.rank() != 2
        || x.dim(1)? < MIN_WIDTH
    {
        return Ok(None);
    }
    let id = x.id();
    if let Some(hit) = scanned()
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, r)| r.clone())
    {
        return Ok(hit);
    }
    let cols = x.dim(1)?;
    let found = {
        let (storage, layout) = x.storage_and_layout();
        match (&*storage, layout.contiguous_offsets()) {
            (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => {
                SparseRows::scan(&v[a..b], cols, MAX_DENSITY).map(Arc::new)
            }
            _ => None,
        }
    };
    keep(id, found.clone());
    Ok(found)
}

/// Remembers `found` as tensor `id`'s non-zeros, forgetting the oldest past [`REMEMBERED`].
fn keep(id: TensorId, found: Option<Arc<SparseRows>>) {
    let mut s = scanned();
    if s.len() == REMEMBERED {
        s.pop_front();
    }
    s.push_back((id, found));
}

/// Records `sp` as the non-zeros of `x` (built without scanning `x`, e.g.
/// from a feature table's [`RowNonzeros`]), so products with `x` use them.
pub fn remember(x: &Tensor, sp: Arc<SparseRows>) -> candle_core::Result<()> {
    if x.dims() != [sp.rows(), sp.cols()] {
        return Err(candle_core::Error::Msg(format!(
            "sparse rows of {}x{} for a tensor of {:?}",
            sp.rows(),
            sp.cols(),
            x.dims()
        )));
    }
    keep(x.id(), Some(sp));
    Ok(())
}

/// `x`'s non-zeros when `x` qualifies and `w` is f32: what a product `x · w` can use.
pub fn rows_for(x: &Tensor, w: &Tensor) -> candle_core::Result<Option<Arc<SparseRows>>> {
    if w.dtype() != DType::F32 {
        return Ok(None);
    }
    rows_of(x)
}

/// `x[..rows] · w`, with `x`'s non-zeros `x`; differentiable in `w` (f32, CPU).
pub fn matmul(x: &Arc<SparseRows>, rows: usize, w: &Tensor) -> candle_core::Result<Tensor> {
    if rows > x.rows() || w.dims() != [x.cols(), w.dim(1)?] {
        return Err(candle_core::Error::Msg(format!(
            "sparse matmul: {} of {}x{} rows times {:?}",
            rows,
            x.rows(),
            x.cols(),
            w.dims()
        )));
    }
    w.contiguous()?.apply_op1(Product {
        x: Arc::clone(x),
        rows,
    })
}

/// `x[..rows] · w` as an op on `w`.
struct Product {
    x: Arc<SparseRows>,
    rows: usize,
}

/// `x[..rows]ᵀ · g` as an op on `g`: the weight's gradient.
struct Transposed {
    x: Arc<SparseRows>,
    rows: usize,
}

fn f32_input<'a>(
    s: &'a CpuStorage,
    l: &Layout,
    what: &str,
) -> candle_core::Result<(&'a [f32], usize)> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{what} needs a contiguous input")))?;
    match (s, l.dims()) {
        (CpuStorage::F32(v), [_, n]) => Ok((&v[a..b], *n)),
        _ => Err(candle_core::Error::Msg(format!(
            "{what}: a 2-d f32 input, got {:?} {:?}",
            s.dtype(),
            l.dims()
        ))),
    }
}

impl CustomOp1 for Product {
    fn name(&self) -> &'static str {
        "sparse-matmul"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (w, n) = f32_input(s, l, self.name())?;
        Ok((
            CpuStorage::F32(self.x.product(self.rows, w, n)),
            Shape::from((self.rows, n)),
        ))
    }

    fn bwd(
        &self,
        _w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op1(Transposed {
            x: Arc::clone(&self.x),
            rows: self.rows,
        })?))
    }
}

impl CustomOp1 for Transposed {
    fn name(&self) -> &'static str {
        "sparse-matmul-t"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (g, n) = f32_input(s, l, self.name())?;
        if g.len() != self.rows * n {
            return Err(candle_core::Error::Msg(format!(
                "{}: gradient of {} rows, expected {}",
                self.name(),
                g.len() / n.max(1),
                self.rows
            )));
        }
        Ok((
            CpuStorage::F32(self.x.transposed_product(self.rows, g, n)),
            Shape::from((self.x.cols(), n)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// A `[rows, cols]` matrix with about `density` of its entries non-zero.
    fn sparse_input(rows: usize, cols: usize, density: f64, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        (0..rows * cols)
            .map(|_| {
                if (next() % 10_000) as f64 / 10_000.0 < density {
                    (next() % 7) as f32 + 1.0
                } else {
                    0.0
                }
            })
            .collect()
    }

    fn close(a: &Tensor, b: &Tensor) {
        let (a, b): (Vec<f32>, Vec<f32>) = (
            a.flatten_all().unwrap().to_vec1().unwrap(),
            b.flatten_all().unwrap().to_vec1().unwrap(),
        );
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * x.abs().max(y.abs()).max(1.0),
                "entry {i}: {x} vs {y}"
            );
        }
    }

    #[test]
    fn the_product_and_the_weight_gradient_equal_the_dense_ones() {
        let (rows, cols, n) = (300, 400, 24);
        let data = sparse_input(rows, cols, 0.05, 1);
        let x = Tensor::from_vec(data.clone(), (rows, cols), &Device::Cpu).unwrap();
        let w = Var::from_tensor(
            &Tensor::from_vec(
                sparse_input(cols, n, 1.0, 2)
                    .iter()
                    .map(|v| v / 7.0 - 0.5)
                    .collect::<Vec<f32>>(),
                (cols, n),
                &Device::Cpu,
            )
            .unwrap(),
        )
        .unwrap();
        let sp = rows_of(&x).unwrap().expect("5% non-zero is sparse");
        assert_eq!(sp.nnz(), data.iter().filter(|v| **v != 0.0).count());
        for prefix in [rows, 123, 0] {
            let got = matmul(&sp, prefix, w.as_tensor()).unwrap();
            let want = x
                .narrow(0, 0, prefix)
                .unwrap()
                .matmul(w.as_tensor())
                .unwrap();
            close(&got, &want);
            // Weighted so every output entry's gradient differs.
            let weights = Tensor::arange(0f32, (prefix * n) as f32, &Device::Cpu)
                .unwrap()
                .reshape((prefix, n))
                .unwrap()
                .affine(1e-3, 0.1)
                .unwrap();
            let g_sparse = (got * &weights)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let g_dense = (want * &weights)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            close(
                g_sparse.get(w.as_tensor()).unwrap(),
                g_dense.get(w.as_tensor()).unwrap(),
            );
        }
        // The same input is scanned once.
        assert!(Arc::ptr_eq(&sp, &rows_of(&x).unwrap().unwrap()));
    }

    #[test]
    fn dense_narrow_and_trainable_inputs_stay_dense() {
        let dev = Device::Cpu;
        let dense = Tensor::from_vec(sparse_input(100, 300, 0.5, 3), (100, 300), &dev).unwrap();
        assert!(rows_of(&dense).unwrap().is_none());
        let narrow = Tensor::from_vec(
            sparse_input(100, MIN_WIDTH - 1, 0.01, 4),
            (100, MIN_WIDTH - 1),
            &dev,
        )
        .unwrap();
        assert!(rows_of(&narrow).unwrap().is_none());
        let sparse = Tensor::from_vec(sparse_input(100, 300, 0.01, 5), (100, 300), &dev).unwrap();
        let trainable = Var::from_tensor(&sparse).unwrap();
        assert!(rows_of(trainable.as_tensor()).unwrap().is_none());
        assert!(rows_of(&sparse).unwrap().is_some());
    }
}
