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
        let (b1, b2) = (cfg.beta1 as f32, cfg.beta2 as f32);
        for (k, &i) in ids.iter().enumerate() {
            let i = i as usize;
            self.steps[i] += 1;
            let t = self.steps[i] as i32;
            let bc1 = 1.0 - cfg.beta1.powi(t);
            let bc2 = 1.0 - cfg.beta2.powi(t);
            let (lr, eps) = (cfg.lr, cfg.eps);
            for j in 0..self.dim {
                let at = i * self.dim + j;
                let gj = g[k * self.dim + j];
                self.m[at] = b1 * self.m[at] + (1.0 - b1) * gj;
                self.v[at] = b2 * self.v[at] + (1.0 - b2) * gj * gj;
                let mhat = f64::from(self.m[at]) / bc1;
                let vhat = f64::from(self.v[at]) / bc2;
                self.data[at] -= (lr * mhat / (vhat.sqrt() + eps)) as f32;
            }
        }
        Ok(())
    }
}
