//! Named dense parameters in a fixed (sorted) order, so optimisers,
//! checkpoints and model hashes see the same sequence in every process.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Shape, Tensor, Var};

use crate::error::Result;
use crate::init;

/// The dense parameters of a model, by name.
#[derive(Default)]
pub struct ParamStore {
    params: BTreeMap<String, Var>,
}

impl ParamStore {
    /// An empty store.
    pub fn new() -> ParamStore {
        ParamStore::default()
    }

    /// Adds a Glorot-initialised `[rows, cols]` matrix and returns it.
    pub fn matrix(
        &mut self,
        seed: u64,
        name: &str,
        rows: usize,
        cols: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        self.uniform(
            seed,
            name,
            (rows, cols),
            init::glorot_bound(rows, cols),
            dtype,
            device,
        )
    }

    /// Adds a tensor of `shape` uniform in `[-bound, bound)` and returns it.
    pub fn uniform(
        &mut self,
        seed: u64,
        name: &str,
        shape: impl Into<Shape>,
        bound: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let t = Tensor::from_vec(
            init::uniform(seed, name, shape.elem_count(), bound),
            shape,
            device,
        )?
        .to_dtype(dtype)?;
        self.insert(name, t)
    }

    /// Adds a zero vector of length `n` and returns it.
    pub fn zeros(&mut self, name: &str, n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        self.insert(name, Tensor::zeros(n, dtype, device)?)
    }

    /// Adds a vector of length `n` filled with `value` and returns it.
    pub fn filled(
        &mut self,
        name: &str,
        n: usize,
        value: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        self.insert(name, (Tensor::ones(n, dtype, device)? * value)?)
    }

    fn insert(&mut self, name: &str, t: Tensor) -> Result<Tensor> {
        let var = Var::from_tensor(&t)?;
        let out = var.as_tensor().clone();
        assert!(
            self.params.insert(name.to_string(), var).is_none(),
            "parameter {name} defined twice"
        );
        Ok(out)
    }

    /// The parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&Var> {
        self.params.get(name)
    }

    /// All parameters in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.params.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of parameters (tensors).
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Total number of scalar values.
    pub fn numel(&self) -> usize {
        self.params.values().map(|v| v.elem_count()).sum()
    }
}
