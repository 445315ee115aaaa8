//! R-GCN: per relation a mean over sampled in-neighbors followed by a
//! bias-free linear map, summed over relations, plus a per-type self-loop
//! linear map with bias.
//!
//! A layer is split at the seam RAF needs: [`RgcnLayer::relation_partials`]
//! computes the summed relation messages for any subset of relations, and
//! [`RgcnLayer::cross_relation`] adds the self-loop to the (summed) partials.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use graphs::{Block, HetGraph, RelationId};

use crate::error::Result;
use crate::ops::{matmul, segment_mean, SegmentCsr};
use crate::params::ParamStore;

/// One R-GCN layer.
pub struct RgcnLayer {
    /// Per relation (indexed by [`RelationId`]): `[in_src, out]`.
    rel_weight: Vec<Tensor>,
    /// Per node type: `([in_t, out], [out])`.
    self_loop: Vec<(Tensor, Tensor)>,
    out_dim: usize,
}

/// Per node type, an optional tensor (absent where the block has no rows of that type).
pub type PerType = Vec<Option<Tensor>>;

impl RgcnLayer {
    /// Creates layer `index`'s parameters in `store`; `in_dims[t]` is type `t`'s input width.
    pub fn new(store: &mut ParamStore, g: &HetGraph, index: usize, in_dims: &[usize], out_dim: usize, seed: u64, dtype: DType, device: &Device) -> Result<RgcnLayer> {
        let mut rel_weight = Vec::new();
        for r in g.relations() {
            let name = format!("layer{index}.rel.{}.weight", r.canonical());
            rel_weight.push(store.matrix(seed, &name, in_dims[r.src.index()], out_dim, dtype, device)?);
        }
        let mut self_loop = Vec::new();
        for (t, nt) in g.node_types().iter().enumerate() {
            let w = store.matrix(seed, &format!("layer{index}.self.{}.weight", nt.name), in_dims[t], out_dim, dtype, device)?;
            let b = store.zeros(&format!("layer{index}.self.{}.bias", nt.name), out_dim, dtype, device)?;
            self_loop.push((w, b));
        }
        Ok(RgcnLayer { rel_weight, self_loop, out_dim })
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// Sum over `relations` (those present in `block`) of each relation's
    /// mean-aggregated, transformed messages, per destination type.
    /// `h_src[t]` holds the rows of `block.src[t]`.
    pub fn relation_partials(&self, g: &HetGraph, block: &Block, relations: &[RelationId], h_src: &PerType) -> Result<PerType> {
        let mut out: PerType = vec![None; block.dst.len()];
        for br in block.relations.iter().filter(|br| relations.contains(&br.relation)) {
            let rel = g.relation(br.relation);
            let (s, d) = (rel.src.index(), rel.dst.index());
            let Some(x) = &h_src[s] else { continue };
            let csr = SegmentCsr::new(block.src[s].len(), br.offsets.clone(), br.sources.clone());
            let w = &self.rel_weight[br.relation.index()];
            let msg = aggregate_then_transform(x, w, &csr)?;
            out[d] = Some(match out[d].take() {
                Some(acc) => (acc + msg)?,
                None => msg,
            });
        }
        Ok(out)
    }

    /// Self-loop on the destinations' own rows plus the summed partials.
    pub fn cross_relation(&self, block: &Block, h_src: &PerType, partials: PerType) -> Result<PerType> {
        let mut out = Vec::with_capacity(block.dst.len());
        for (t, p) in partials.into_iter().enumerate() {
            let n_dst = block.dst[t].len();
            let (Some(x), true) = (&h_src[t], n_dst > 0) else {
                out.push(None);
                continue;
            };
            let (w, b) = &self.self_loop[t];
            let own = matmul(&x.narrow(0, 0, n_dst)?, w)?.broadcast_add(b)?;
            out.push(Some(match p {
                Some(p) => (own + p)?,
                None => own,
            }));
        }
        Ok(out)
    }
}

/// `mean(x) · w`, in whichever order costs fewer multiply-adds: transforming
/// first pays `n_src·in·out + E·out`, aggregating first `E·in + n_dst·in·out`.
/// (Sampled blocks have many more sources than destinations, so aggregating
/// first usually wins even when `in > out`.)
fn aggregate_then_transform(x: &Tensor, w: &Tensor, csr: &Arc<SegmentCsr>) -> Result<Tensor> {
    let (i, o) = w.dims2()?;
    let (n_src, n_dst, e) = (csr.n_src(), csr.n_dst(), csr.n_edges());
    let transform_first = n_src * i * o + e * o;
    let aggregate_first = e * i + n_dst * i * o;
    Ok(if transform_first < aggregate_first { segment_mean(&matmul(x, w)?, csr)? } else { matmul(&segment_mean(x, csr)?, w)? })
}
