//! Adam for dense parameters, with its state exposed for checkpoints.

use std::collections::BTreeMap;

use candle_core::backprop::GradStore;
use candle_core::Tensor;

use crate::error::Result;
use crate::params::ParamStore;

/// Adam hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
}

impl AdamConfig {
    /// Adam's bias corrections `(1 - β1^t, 1 - β2^t)` after `t` updates: one
    /// expression for every holder of Adam state, so they agree bit for bit.
    pub fn bias_corrections(&self, t: u32) -> (f64, f64) {
        (1.0 - self.beta1.powi(t as i32), 1.0 - self.beta2.powi(t as i32))
    }

    /// PyTorch's defaults with learning rate `lr`.
    pub fn with_lr(lr: f64) -> AdamConfig {
        AdamConfig { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8 }
    }
}

/// Adam over a [`ParamStore`]; a parameter without a gradient in a step is left
/// untouched (its moments too), as PyTorch does.
pub struct Adam {
    /// Hyper-parameters.
    pub cfg: AdamConfig,
    /// Steps taken.
    pub step: u64,
    /// First and second moments by parameter name.
    pub moments: BTreeMap<String, (Tensor, Tensor)>,
}

impl Adam {
    /// A fresh optimiser.
    pub fn new(cfg: AdamConfig) -> Adam {
        Adam { cfg, step: 0, moments: BTreeMap::new() }
    }

    /// Applies one update from `grads`.
    pub fn step(&mut self, params: &ParamStore, grads: &GradStore) -> Result<()> {
        self.step_with(params, |var| grads.get(var.as_tensor()).cloned())
    }

    /// Applies one update from gradients given by parameter name (all-reduced
    /// gradients of data-parallel training).
    pub fn step_named(&mut self, params: &ParamStore, grads: &BTreeMap<String, Tensor>) -> Result<()> {
        let by_ptr: Vec<(candle_core::TensorId, &Tensor)> = params.iter().filter_map(|(n, v)| grads.get(n).map(|g| (v.as_tensor().id(), g))).collect();
        self.step_with(params, |var| by_ptr.iter().find(|(id, _)| *id == var.as_tensor().id()).map(|(_, g)| (*g).clone()))
    }

    fn step_with(&mut self, params: &ParamStore, grad_of: impl Fn(&candle_core::Var) -> Option<Tensor>) -> Result<()> {
        self.step += 1;
        let c = self.cfg;
        let (bc1, bc2) = c.bias_corrections(self.step as u32);
        for (name, var) in params.iter() {
            // Detach: a leaf's gradient can still reference the step's forward
            // graph, and moments derived from it would chain every step's graph
            // to the next (an unbounded leak).
            let Some(g) = grad_of(var).map(|g| g.detach()) else { continue };
            let (m, v) = match self.moments.get(name) {
                Some((m, v)) => (m.clone(), v.clone()),
                None => (g.zeros_like()?, g.zeros_like()?),
            };
            let m = ((m * c.beta1)? + (&g * (1.0 - c.beta1))?)?.detach();
            let v = ((v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?.detach();
            let update = ((&m / bc1)? / ((&v / bc2)?.sqrt()? + c.eps)?)?;
            var.set(&(var.as_tensor() - (update * c.lr)?)?)?;
            self.moments.insert(name.to_string(), (m, v));
        }
        Ok(())
    }
}
