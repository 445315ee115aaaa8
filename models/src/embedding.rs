//! Learnable embedding tables for featureless node types, trained with a
//! sparse Adam: only the rows in a batch are read and updated, each with its
//! own step count, so a touched row gets exactly the update dense Adam would
//! give it if it were the only row.

use candle_core::{DType, Device, Tensor, Var};

use rayon::prelude::*;

use crate::error::{ModelError, Result};
use crate::init;
use crate::optim::AdamConfig;
use crate::prefetch::{prefetch, AHEAD};

/// One node type's table with its Adam state.
pub struct EmbeddingTable {
    /// Parameter name (`embed.<type>`).
    pub name: String,
    /// Number of rows.
    pub rows: usize,
    /// Row width.
    pub dim: usize,
    /// Row-major values.
    pub data: Vec<f32>,
    /// First moments.
    pub m: Vec<f32>,
    /// Second moments.
    pub v: Vec<f32>,
    /// Updates applied to each row.
    pub steps: Vec<u32>,
}

impl EmbeddingTable {
    /// A table initialised N(0, 1) as a pure function of (seed, name).
    pub fn new(seed: u64, name: &str, rows: usize, dim: usize) -> EmbeddingTable {
        EmbeddingTable {
            name: name.to_string(),
            rows,
            dim,
            data: init::normal(seed, name, rows * dim),
            m: vec![0.0; rows * dim],
            v: vec![0.0; rows * dim],
            steps: vec![0; rows],
        }
    }

    /// A table of the rows `ids` of the one [`EmbeddingTable::new`] makes for
    /// (seed, name), in `ids` order: row `k` here is row `ids[k]` there.
    pub fn rows_of(seed: u64, name: &str, dim: usize, ids: &[u32]) -> EmbeddingTable {
        let n = ids.len();
        EmbeddingTable {
            name: name.to_string(),
            rows: n,
            dim,
            data: init::normal_rows(seed, name, dim, ids),
            m: vec![0.0; n * dim],
            v: vec![0.0; n * dim],
            steps: vec![0; n],
        }
    }

    /// A table of trained rows without optimizer state, for inference: an
    /// optimizer step on it is refused.
    pub fn frozen(name: &str, rows: usize, dim: usize, data: Vec<f32>) -> EmbeddingTable {
        EmbeddingTable {
            name: name.to_string(),
            rows,
            dim,
            data,
            m: Vec::new(),
            v: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// The rows `ids` as a `[ids.len(), dim]` tensor.
    pub fn gather(&self, ids: &[u32], dtype: DType, device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_vec(self.rows_at(ids), (ids.len(), self.dim), device)?.to_dtype(dtype)?)
    }

    /// [`EmbeddingTable::gather`] as a variable (a leaf the backward pass
    /// gives a gradient), without the copy `Var::from_tensor` makes.
    pub fn gather_var(&self, ids: &[u32], dtype: DType, device: &Device) -> Result<Tensor> {
        Ok(if dtype == DType::F32 {
            Var::from_vec(self.rows_at(ids), (ids.len(), self.dim), device)?.into_inner()
        } else {
            Var::from_tensor(&self.gather(ids, dtype, device)?)?.into_inner()
        })
    }

    /// Rows `ids`, row-major, copied in parallel.
    fn rows_at(&self, ids: &[u32]) -> Vec<f32> {
        let d = self.dim;
        let mut out = Vec::with_capacity(ids.len() * d);
        if d > 0 {
            let row = |i: u32| &self.data[i as usize * d..(i as usize + 1) * d];
            out.spare_capacity_mut()
                .par_chunks_mut(d)
                .enumerate()
                .with_min_len(512)
                .for_each(|(k, o)| {
                    if let Some(&a) = ids.get(k + AHEAD) {
                        if (a as usize) < self.rows {
                            prefetch(row(a));
                        }
                    }
                    for (o, &x) in o.iter_mut().zip(row(ids[k])) {
                        o.write(x);
                    }
                });
        }
        // SAFETY: every one of the ids.len() rows was written above (none when d = 0).
        unsafe { out.set_len(ids.len() * d) };
        out
    }

    /// Applies Adam to rows `ids` with gradient `grad` (`[ids.len(), dim]`, ids distinct).
    pub fn sparse_adam(&mut self, ids: &[u32], grad: &Tensor, cfg: &AdamConfig) -> Result<()> {
        // On the CPU the gradient is read in place (no copy of every row).
        crate::ops::with_f32(grad, |g| self.adam_rows(ids, g, cfg))?
    }

    /// One Adam step of rows that several batches of a step read (each part:
    /// its distinct ids and their gradient `[ids.len(), dim]`): a row in more
    /// than one part takes the sum of its gradients, once.
    pub fn sparse_adam_parts(
        &mut self,
        parts: &[(&[u32], &Tensor)],
        cfg: &AdamConfig,
    ) -> Result<()> {
        match parts {
            [] => Ok(()),
            [(ids, grad)] => self.sparse_adam(ids, grad, cfg),
            _ => {
                let d = self.dim;
                let mut at: std::collections::HashMap<u32, usize> = Default::default();
                let (mut ids, mut sum) = (Vec::new(), Vec::new());
                for (part_ids, grad) in parts {
                    crate::ops::with_f32(grad, |g| {
                        if g.len() != part_ids.len() * d {
                            return Err(ModelError::Config(format!(
                                "{}: {} gradient values for {} rows of {d}",
                                self.name,
                                g.len(),
                                part_ids.len()
                            )));
                        }
                        for (k, &id) in part_ids.iter().enumerate() {
                            let row = &g[k * d..(k + 1) * d];
                            let i = *at.entry(id).or_insert_with(|| {
                                ids.push(id);
                                sum.resize(sum.len() + d, 0.0);
                                ids.len() - 1
                            });
                            for (s, x) in sum[i * d..(i + 1) * d].iter_mut().zip(row) {
                                *s += x;
                            }
                        }
                        Ok(())
                    })??;
                }
                self.adam_rows(&ids, &sum, cfg)
            }
        }
    }

    /// Applies Adam to rows `ids` (distinct) with gradient rows `g` (row-major,
    /// in `ids` order), rows in parallel: see [`adam_rows`].
    pub fn adam_rows(&mut self, ids: &[u32], g: &[f32], cfg: &AdamConfig) -> Result<()> {
        adam_rows(
            RowsMut {
                data: &mut self.data,
                m: &mut self.m,
                v: &mut self.v,
                steps: &mut self.steps,
                dim: self.dim,
            },
            ids,
            g,
            cfg,
        )
        .map_err(|e| ModelError::Config(format!("{}: {e}", self.name)))
    }

    /// [`EmbeddingTable::adam_rows`] with row `ids[k]`'s gradient at row `at[k]` of `g`.
    pub fn adam_rows_picked(
        &mut self,
        ids: &[u32],
        g: &[f32],
        at: &[u32],
        cfg: &AdamConfig,
    ) -> Result<()> {
        adam_rows_picked(
            RowsMut {
                data: &mut self.data,
                m: &mut self.m,
                v: &mut self.v,
                steps: &mut self.steps,
                dim: self.dim,
            },
            ids,
            g,
            at,
            cfg,
        )
        .map_err(|e| ModelError::Config(format!("{}: {e}", self.name)))
    }

    /// Applies Adam to row `id` with gradient row `g`.
    pub fn adam_row_at(&mut self, id: u32, g: &[f32], cfg: &AdamConfig) {
        let i = id as usize;
        let r = i * self.dim..(i + 1) * self.dim;
        adam_row(
            &mut self.data[r.clone()],
            &mut self.m[r.clone()],
            &mut self.v[r],
            &mut self.steps[i],
            g,
            cfg,
        );
    }
}

/// One row's Adam update with its own step count: the arithmetic every holder
/// of learnable rows (table or sharded store) shares, so they agree exactly.
pub fn adam_row(
    data: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    steps: &mut u32,
    g: &[f32],
    cfg: &AdamConfig,
) {
    *steps += 1;
    let (bc1, bc2) = cfg.bias_corrections(*steps);
    let c = RowConsts {
        b1: cfg.beta1 as f32,
        b2: cfg.beta2 as f32,
        bc1,
        bc2,
        lr: cfg.lr,
        eps: cfg.eps,
    };
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { adam_elems_avx2(data, m, v, g, &c) };
        return;
    }
    adam_elems(data, m, v, g, &c);
}

/// A row's Adam constants.
struct RowConsts {
    b1: f32,
    b2: f32,
    bc1: f64,
    bc2: f64,
    lr: f64,
    eps: f64,
}

/// The element-wise part of [`adam_row`]. IEEE arithmetic is correctly rounded
/// on every instruction set, so the AVX2 build gives the same bits (Rust never
/// fuses a multiply and an add on its own).
#[inline(always)]
fn adam_elems(data: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], c: &RowConsts) {
    for j in 0..data.len() {
        let gj = g[j];
        m[j] = c.b1 * m[j] + (1.0 - c.b1) * gj;
        v[j] = c.b2 * v[j] + (1.0 - c.b2) * gj * gj;
        let mhat = f64::from(m[j]) / c.bc1;
        let vhat = f64::from(v[j]) / c.bc2;
        data[j] -= (c.lr * mhat / (vhat.sqrt() + c.eps)) as f32;
    }
}

/// [`adam_elems`] compiled for AVX2: four f64 divisions and square roots at a
/// time instead of two (the sparse update was mostly these).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn adam_elems_avx2(
    data: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    c: &RowConsts,
) {
    adam_elems(data, m, v, g, c)
}

/// A row-major table of learnable rows with their Adam state, borrowed.
pub struct RowsMut<'a> {
    /// Values.
    pub data: &'a mut [f32],
    /// First moments.
    pub m: &'a mut [f32],
    /// Second moments.
    pub v: &'a mut [f32],
    /// Updates applied to each row.
    pub steps: &'a mut [u32],
    /// Row width.
    pub dim: usize,
}

/// Gradients that do not match the rows they update (a count, a position,
/// a row out of range or twice): a bug of the caller, which stops.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GradientMismatch(pub String);

/// Applies Adam to rows `ids` (distinct, in range) of `t` with gradient rows
/// `g` (row-major, in `ids` order). Rows are updated in parallel; each row's
/// update is independent and computed exactly as [`adam_row`] does alone, so
/// the result does not depend on the thread count.
pub fn adam_rows(
    t: RowsMut<'_>,
    ids: &[u32],
    g: &[f32],
    cfg: &AdamConfig,
) -> std::result::Result<(), GradientMismatch> {
    if g.len() != ids.len() * t.dim {
        return Err(GradientMismatch(format!(
            "{} gradient values for {} rows of width {}",
            g.len(),
            ids.len(),
            t.dim
        )));
    }
    update_rows(t, ids, g, |k| k, cfg)
}

/// [`adam_rows`] with the gradient of row `ids[k]` at row `at[k]` of `g`, so
/// that a caller updating part of a batch's rows (a cache's hits, the table's
/// misses) need not copy their gradients apart first.
pub fn adam_rows_picked(
    t: RowsMut<'_>,
    ids: &[u32],
    g: &[f32],
    at: &[u32],
    cfg: &AdamConfig,
) -> std::result::Result<(), GradientMismatch> {
    if at.len() != ids.len() {
        return Err(GradientMismatch(format!(
            "{} gradient positions for {} rows",
            at.len(),
            ids.len()
        )));
    }
    if let Some(&p) = at.iter().find(|&&p| (p as usize + 1) * t.dim > g.len()) {
        return Err(GradientMismatch(format!(
            "gradient row {p} of {}",
            g.len() / t.dim.max(1)
        )));
    }
    update_rows(t, ids, g, |k| at[k] as usize, cfg)
}

/// The update of [`adam_rows`], row `ids[k]`'s gradient being row `grad_row(k)` of `g` (checked by the callers).
fn update_rows(
    t: RowsMut<'_>,
    ids: &[u32],
    g: &[f32],
    grad_row: impl Fn(usize) -> usize,
    cfg: &AdamConfig,
) -> std::result::Result<(), GradientMismatch> {
    if t.m.len() != t.data.len() || t.v.len() != t.data.len() {
        return Err(GradientMismatch(
            "the table has no optimizer state (it was loaded for inference)".into(),
        ));
    }
    let (dim, rows) = (t.dim, t.steps.len());
    let mut order: Vec<(u32, usize)> = ids.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    order.par_sort_unstable();
    if let Some(&(i, _)) = order.last().filter(|&&(i, _)| i as usize >= rows) {
        return Err(GradientMismatch(format!("row {i} of {rows}")));
    }
    if let Some(w) = order.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(GradientMismatch(format!(
            "row {} updated twice in one step",
            w[0].0
        )));
    }
    let sorted: Vec<u32> = order.iter().map(|&(i, _)| i).collect();
    let rows = rows_mut(t.data, dim, &sorted)
        .into_iter()
        .zip(rows_mut(t.m, dim, &sorted))
        .zip(rows_mut(t.v, dim, &sorted))
        .zip(rows_mut(t.steps, 1, &sorted))
        .zip(order.iter().map(|&(_, k)| {
            let r = grad_row(k);
            &g[r * dim..(r + 1) * dim]
        }));
    rows.collect::<Vec<_>>()
        .into_par_iter()
        .with_min_len(256)
        .for_each(|((((d, m), v), s), gk)| adam_row(d, m, v, &mut s[0], gk, cfg));
    Ok(())
}

/// Disjoint mutable views of rows `sorted` (ascending, distinct, in range) of
/// a row-major buffer of rows `width` wide.
fn rows_mut<'a, T>(mut buf: &'a mut [T], width: usize, sorted: &[u32]) -> Vec<&'a mut [T]> {
    let mut out = Vec::with_capacity(sorted.len());
    let mut at = 0;
    for &i in sorted {
        let rest = std::mem::take(&mut buf);
        let (row, tail) = rest[(i as usize - at) * width..].split_at_mut(width);
        out.push(row);
        buf = tail;
        at = i as usize + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_several_batches_take_one_step_of_their_summed_gradients() {
        let cfg = AdamConfig::with_lr(0.01);
        let dim = 4;
        let mut parts = EmbeddingTable::new(7, "embed.x", 10, dim);
        let mut summed = EmbeddingTable::new(7, "embed.x", 10, dim);
        let grad = |ids: &[u32], at: f32| -> Tensor {
            let v: Vec<f32> = (0..ids.len() * dim).map(|k| at + k as f32 * 0.25).collect();
            Tensor::from_vec(v, (ids.len(), dim), &Device::Cpu).unwrap()
        };
        // Row 3 is in both batches.
        let (a, b): (&[u32], &[u32]) = (&[1, 3, 5], &[3, 8]);
        let (ga, gb) = (grad(a, 1.0), grad(b, -2.0));
        parts
            .sparse_adam_parts(&[(a, &ga), (b, &gb)], &cfg)
            .unwrap();
        let (va, vb) = (
            ga.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            gb.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        let row = |v: &[f32], k: usize| v[k * dim..(k + 1) * dim].to_vec();
        let both: Vec<f32> = row(&va, 1)
            .iter()
            .zip(row(&vb, 0))
            .map(|(x, y)| x + y)
            .collect();
        let mut g = row(&va, 0);
        g.extend(both);
        g.extend(row(&va, 2));
        g.extend(row(&vb, 1));
        summed.adam_rows(&[1, 3, 5, 8], &g, &cfg).unwrap();
        assert_eq!(parts.data, summed.data);
        assert_eq!(parts.steps, summed.steps);
        // One part is that part's step.
        let mut one = EmbeddingTable::new(7, "embed.x", 10, dim);
        let mut alone = EmbeddingTable::new(7, "embed.x", 10, dim);
        one.sparse_adam_parts(&[(a, &ga)], &cfg).unwrap();
        alone.sparse_adam(a, &ga, &cfg).unwrap();
        assert_eq!(one.data, alone.data);
        // A gradient of the wrong size is refused.
        assert!(parts
            .sparse_adam_parts(&[(a, &ga), (b, &ga)], &cfg)
            .is_err());
    }

    #[test]
    fn parallel_rows_equal_one_row_at_a_time_and_bad_ids_are_refused() {
        let cfg = AdamConfig::with_lr(0.01);
        let (rows, dim) = (5000, 8);
        let mut a = EmbeddingTable::new(3, "embed.x", rows, dim);
        let mut b = EmbeddingTable::new(3, "embed.x", rows, dim);
        for step in 0..3u32 {
            // Shuffled, distinct, a different subset each step.
            let ids: Vec<u32> = (0..rows as u32)
                .map(|i| i.wrapping_mul(2654435761u32.wrapping_add(step)) % rows as u32)
                .filter(|i| i % 3 != step % 3)
                .collect();
            let ids: Vec<u32> = ids
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .rev()
                .collect();
            let g: Vec<f32> = (0..ids.len() * dim)
                .map(|k| ((k * 31 + step as usize) % 17) as f32 - 8.0)
                .collect();
            a.adam_rows(&ids, &g, &cfg).unwrap();
            for (k, &i) in ids.iter().enumerate() {
                b.adam_row_at(i, &g[k * dim..(k + 1) * dim], &cfg);
            }
        }
        assert_eq!(
            a.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!((&a.m, &a.v, &a.steps), (&b.m, &b.v, &b.steps));
        let g = vec![0.5; 2 * dim];
        assert!(a
            .adam_rows(&[7, 7], &g, &cfg)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(a
            .adam_rows(&[1, rows as u32], &g, &cfg)
            .unwrap_err()
            .to_string()
            .contains("row 5000"));
        assert!(a
            .adam_rows(&[1], &g, &cfg)
            .unwrap_err()
            .to_string()
            .contains("gradient values"));
    }

    #[test]
    fn picked_gradient_rows_equal_copied_ones() {
        let cfg = AdamConfig::with_lr(0.01);
        let (rows, dim) = (50, 4);
        let mut a = EmbeddingTable::new(1, "embed.y", rows, dim);
        let mut b = EmbeddingTable::new(1, "embed.y", rows, dim);
        let g: Vec<f32> = (0..6 * dim).map(|k| (k % 7) as f32 - 3.0).collect();
        // Rows 9, 2 and 40 take gradient rows 5, 0 and 3 of six.
        let (ids, at) = ([9u32, 2, 40], [5u32, 0, 3]);
        a.adam_rows_picked(&ids, &g, &at, &cfg).unwrap();
        let copied: Vec<f32> = at
            .iter()
            .flat_map(|&p| g[p as usize * dim..(p as usize + 1) * dim].to_vec())
            .collect();
        b.adam_rows(&ids, &copied, &cfg).unwrap();
        assert_eq!(
            (&a.data, &a.m, &a.v, &a.steps),
            (&b.data, &b.m, &b.v, &b.steps)
        );
        assert!(a
            .adam_rows_picked(&ids, &g, &[5, 0], &cfg)
            .unwrap_err()
            .to_string()
            .contains("positions"));
        assert!(a
            .adam_rows_picked(&ids, &g, &[5, 0, 6], &cfg)
            .unwrap_err()
            .to_string()
            .contains("gradient row 6 of 6"));
    }
}
