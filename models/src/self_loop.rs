//! The cross-relation step shared by the relational layers: each destination
//! type's own rows through a linear map with bias, plus the summed relation
//! partials.

use candle_core::{DType, Device, Tensor};
use graphs::{Block, HetGraph};

use crate::error::Result;
use crate::ops::{add_bias, matmul};
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
    pub fn new(store: &mut ParamStore, g: &HetGraph, index: usize, in_dims: &[usize], out_dim: usize, seed: u64, dtype: DType, device: &Device) -> Result<SelfLoops> {
        let mut per_type = Vec::new();
        for (t, nt) in g.node_types().iter().enumerate() {
            let w = store.matrix(seed, &format!("layer{index}.self.{}.weight", nt.name), in_dims[t], out_dim, dtype, device)?;
            let b = store.zeros(&format!("layer{index}.self.{}.bias", nt.name), out_dim, dtype, device)?;
            per_type.push((w, b));
        }
        Ok(SelfLoops { per_type })
    }

    /// Self-loop on the destinations' own rows plus the summed partials.
    pub fn cross_relation(&self, block: &Block, h_src: &PerType, partials: PerType) -> Result<PerType> {
        per_dst_type(block, h_src, partials, |t, own, p| {
            let (w, b) = &self.per_type[t];
            let own = add_bias(&matmul(&own, w)?, b)?;
            Ok(match p {
                Some(p) => (own + p)?,
                None => own,
            })
        })
    }
}

/// Applies `f(type, own rows, partial)` to every destination type of `block`
/// that has destinations and inputs; `None` elsewhere. The own rows are the
/// first `dst[t].len()` rows of `h_src[t]`.
pub(crate) fn per_dst_type(
    block: &Block,
    h_src: &PerType,
    partials: PerType,
    mut f: impl FnMut(usize, Tensor, Option<Tensor>) -> Result<Tensor>,
) -> Result<PerType> {
    let mut out = Vec::with_capacity(block.dst.len());
    for (t, p) in partials.into_iter().enumerate() {
        let n_dst = block.dst[t].len();
        out.push(match (&h_src[t], n_dst > 0) {
            (Some(x), true) => Some(f(t, x.narrow(0, 0, n_dst)?, p)?),
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
