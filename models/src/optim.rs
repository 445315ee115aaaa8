//! Adam for dense parameters, with its state exposed for checkpoints.

use std::collections::{BTreeMap, BTreeSet};

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
        (
            1.0 - self.beta1.powi(t as i32),
            1.0 - self.beta2.powi(t as i32),
        )
    }

    /// PyTorch's defaults with learning rate `lr`.
    pub fn with_lr(lr: f64) -> AdamConfig {
        AdamConfig {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// [`AdamConfig::bias_corrections`] for every step count up to the largest
/// asked for, computed once: a sparse step asks for one per row (hundreds of
/// thousands), and `powi` per row was most of a GPU step's host time.
#[derive(Debug, Default, Clone)]
pub struct BiasTable {
    /// The betas (bits) the table was made for.
    betas: (u64, u64),
    /// Entry `t`: the corrections after `t` updates.
    by_step: Vec<(f64, f64)>,
}

impl BiasTable {
    /// `cfg.bias_corrections(t)`, the same bits.
    pub fn get(&mut self, cfg: &AdamConfig, t: u32) -> (f64, f64) {
        let betas = (cfg.beta1.to_bits(), cfg.beta2.to_bits());
        if betas != self.betas {
            self.by_step.clear();
            self.betas = betas;
        }
        let t = t as usize;
        while self.by_step.len() <= t {
            let k = self.by_step.len() as u32;
            self.by_step.push(cfg.bias_corrections(k));
        }
        self.by_step[t]
    }

    /// The corrections after `t` updates, from a table made by [`BiasTable::get`] for `t` or more.
    ///
    /// # Panics
    /// Past the table's end (a caller's bug: `get` the largest first).
    pub fn at(&self, t: u32) -> (f64, f64) {
        self.by_step[t as usize]
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
    /// Parameters it leaves as they are (the frozen parts of a fine-tuned model).
    pub frozen: BTreeSet<String>,
}

impl Adam {
    /// A fresh optimiser.
    pub fn new(cfg: AdamConfig) -> Adam {
        Adam {
            cfg,
            step: 0,
            moments: BTreeMap::new(),
            frozen: BTreeSet::new(),
        }
    }

    /// Applies one update from `grads`.
    pub fn step(&mut self, params: &ParamStore, grads: &GradStore) -> Result<()> {
        self.step_with(params, |var| grads.get(var.as_tensor()).cloned())
    }

    /// Applies one update from gradients given by parameter name (all-reduced
    /// gradients of data-parallel training).
    pub fn step_named(
        &mut self,
        params: &ParamStore,
        grads: &BTreeMap<String, Tensor>,
    ) -> Result<()> {
        let by_ptr: Vec<(candle_core::TensorId, &Tensor)> = params
            .iter()
            .filter_map(|(n, v)| grads.get(n).map(|g| (v.as_tensor().id(), g)))
            .collect();
        self.step_with(params, |var| {
            by_ptr
                .iter()
                .find(|(id, _)| *id == var.as_tensor().id())
                .map(|(_, g)| (*g).clone())
        })
    }

    fn step_with(
        &mut self,
        params: &ParamStore,
        grad_of: impl Fn(&candle_core::Var) -> Option<Tensor>,
    ) -> Result<()> {
        self.step += 1;
        let c = self.cfg;
        let (bc1, bc2) = c.bias_corrections(self.step as u32);
        for (name, var) in params.iter().filter(|(n, _)| !self.frozen.contains(*n)) {
            // Detach: a leaf's gradient can still reference the step's forward
            // graph, and moments derived from it would chain every step's graph
            // to the next (an unbounded leak).
            let Some(g) = grad_of(var).map(|g| g.detach()) else {
                continue;
            };
            let (m, v) = match self.moments.get(name) {
                Some((m, v)) => (m.clone(), v.clone()),
                None => (g.zeros_like()?, g.zeros_like()?),
            };
            // On a GPU, one kernel with these ops' bits (the moments are the
            // optimiser's own: no one else holds them to see them change).
            if crate::ops::dense_adam_in_place(var.as_tensor(), &m, &v, &g, &c, self.step as u32)? {
                self.moments.insert(name.to_string(), (m, v));
                continue;
            }
            let m = ((m * c.beta1)? + (&g * (1.0 - c.beta1))?)?.detach();
            let v = ((v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?.detach();
            let update = ((&m / bc1)? / ((&v / bc2)?.sqrt()? + c.eps)?)?;
            var.set(&(var.as_tensor() - (update * c.lr)?)?)?;
            self.moments.insert(name.to_string(), (m, v));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bias_table_gives_the_corrections_bits_and_follows_the_betas() {
        let (a, mut b) = (AdamConfig::with_lr(0.01), AdamConfig::with_lr(0.01));
        b.beta2 = 0.99;
        let mut table = BiasTable::default();
        for t in [3u32, 1, 700, 0, 699, 2000] {
            for cfg in [&a, &b] {
                let (x, y) = table.get(cfg, t);
                let (wx, wy) = cfg.bias_corrections(t);
                assert_eq!(
                    (x.to_bits(), y.to_bits()),
                    (wx.to_bits(), wy.to_bits()),
                    "t {t}, beta2 {}",
                    cfg.beta2
                );
            }
        }
    }
}
