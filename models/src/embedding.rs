//! Learnable embedding tables for featureless node types, trained with a
//! sparse Adam: only the rows in a batch are read and updated, each with its
//! own step count, so a touched row gets exactly the update dense Adam would
//! give it if it were the only row.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::init;
use crate::optim::AdamConfig;

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

    /// The rows `ids` as a `[ids.len(), dim]` tensor.
    pub fn gather(&self, ids: &[u32], dtype: DType, device: &Device) -> Result<Tensor> {
        let mut out = Vec::with_capacity(ids.len() * self.dim);
        for &i in ids {
            out.extend_from_slice(&self.data[i as usize * self.dim..(i as usize + 1) * self.dim]);
        }
        Ok(Tensor::from_vec(out, (ids.len(), self.dim), device)?.to_dtype(dtype)?)
    }

    /// Applies Adam to rows `ids` with gradient `grad` (`[ids.len(), dim]`, ids distinct).
    pub fn sparse_adam(&mut self, ids: &[u32], grad: &Tensor, cfg: &AdamConfig) -> Result<()> {
        let g: Vec<f32> = grad.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let dim = self.dim;
        for (k, &i) in ids.iter().enumerate() {
            self.adam_row_at(i, &g[k * dim..(k + 1) * dim], cfg);
        }
        Ok(())
    }

    /// Applies Adam to row `id` with gradient row `g`.
    pub fn adam_row_at(&mut self, id: u32, g: &[f32], cfg: &AdamConfig) {
        let i = id as usize;
        let r = i * self.dim..(i + 1) * self.dim;
        adam_row(&mut self.data[r.clone()], &mut self.m[r.clone()], &mut self.v[r], &mut self.steps[i], g, cfg);
    }
}

/// One row's Adam update with its own step count: the arithmetic every holder
/// of learnable rows (table or sharded store) shares, so they agree exactly.
pub fn adam_row(data: &mut [f32], m: &mut [f32], v: &mut [f32], steps: &mut u32, g: &[f32], cfg: &AdamConfig) {
    *steps += 1;
    let t = *steps as i32;
    let (b1, b2) = (cfg.beta1 as f32, cfg.beta2 as f32);
    let bc1 = 1.0 - cfg.beta1.powi(t);
    let bc2 = 1.0 - cfg.beta2.powi(t);
    for j in 0..data.len() {
        let gj = g[j];
        m[j] = b1 * m[j] + (1.0 - b1) * gj;
        v[j] = b2 * v[j] + (1.0 - b2) * gj * gj;
        let mhat = f64::from(m[j]) / bc1;
        let vhat = f64::from(v[j]) / bc2;
        data[j] -= (cfg.lr * mhat / (vhat.sqrt() + cfg.eps)) as f32;
    }
}
