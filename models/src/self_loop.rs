//! The cross-relation step shared by the relational layers: each destination
//! type's own rows through a linear map with bias, plus the summed relation
//! partials.

use candle_core::{DType, Device, Tensor};
use graphs::{Block, HetGraph};

use crate::error::Result;
use crate::ops::{add_bias, matmul_prefix};
use crate::params::ParamStore;

/// Per node type, an optional tensor (absent where the block has no rows of that type).
pub type PerType = Vec<Option<Tensor>>;

/// One layer's self-loop weights, per node type.
pub struct SelfLoops {
    per_type: Vec<(Tensor, Tensor)>,
}

impl SelfLoops {
    /// Creates `layer{index}.self.<type>.{weight,bias}` in `store`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: &mut ParamStore,
        g: &HetGraph,
        index: usize,
        in_dims: &[usize],
        out_dim: usize,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<SelfLoops> {
        let mut per_type = Vec::new();
        for (t, nt) in g.node_types().iter().enumerate() {
            // A linear layer's usual initialisation (PyTorch's nn.Linear: weight and
            // bias uniform in ±1/sqrt(fan_in)). Smaller than Glorot for wide inputs,
            // it lets the relation messages count from the first step: with Glorot
            // weights and zero biases, mag-like S=0.01 reached 0.61 test accuracy
            // after 3 epochs instead of 0.70.
            let bound = 1.0 / (in_dims[t].max(1) as f64).sqrt();
            let w = store.uniform(
                seed,
                &format!("layer{index}.self.{}.weight", nt.name),
                (in_dims[t], out_dim),
                bound,
                dtype,
                device,
            )?;
            let b = store.uniform(
                seed,
                &format!("layer{index}.self.{}.bias", nt.name),
                out_dim,
                bound,
                dtype,
                device,
            )?;
            per_type.push((w, b));
        }
        Ok(SelfLoops { per_type })
    }

    /// Self-loop on the destinations' own rows plus the summed partials.
    pub fn cross_relation(
        &self,
        block: &Block,
        h_src: &PerType,
        partials: PerType,
    ) -> Result<PerType> {
        per_dst_type(block, h_src, partials, |t, x, n_dst, p| {
            let (w, b) = &self.per_type[t];
            let own = add_bias(&matmul_prefix(x, n_dst, w)?, b)?;
            Ok(match p {
                Some(p) => (own + p)?,
                None => own,
            })
        })
    }
}

/// Applies `f(type, inputs, n_dst, partial)` to every destination type of
/// `block` that has destinations and inputs; `None` elsewhere. The own rows
/// are the first `n_dst = dst[t].len()` rows of the inputs `h_src[t]`.
pub(crate) fn per_dst_type(
    block: &Block,
    h_src: &PerType,
    partials: PerType,
    mut f: impl FnMut(usize, &Tensor, usize, Option<Tensor>) -> Result<Tensor>,
) -> Result<PerType> {
    let mut out = Vec::with_capacity(block.dst.len());
    for (t, p) in partials.into_iter().enumerate() {
        let n_dst = block.dst[t].len();
        out.push(match (&h_src[t], n_dst > 0) {
            (Some(x), true) => Some(f(t, x, n_dst, p)?),
            _ => None,
        });
    }
    Ok(out)
}

/// Adds `msg` into `acc` (the sum over relations).
pub(crate) fn accumulate(acc: &mut Option<Tensor>, msg: Tensor) -> Result<()> {
    *acc = Some(match acc.take() {
        Some(a) => (a + msg)?,
        None => msg,
    });
    Ok(())
}
