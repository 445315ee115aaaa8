//! R-GAT: per relation, multi-head attention over sampled in-neighbors
//! (GAT scores `leaky_relu(a_src·x_u + a_dst·x_v)`, softmax within the
//! relation), summed over relations, plus the per-type self-loop. Hidden
//! layers concatenate the heads; the last layer averages them.
//!
//! Attention is normalised per relation, so a relation's partial needs
//! nothing from other relations: the same seam as R-GCN.

use candle_core::Tensor;
use graphs::{Block, HetGraph, RelationId};

use crate::error::{ModelError, Result};
use crate::layer::{LayerArgs, RelationalLayer};
use crate::ops::{attention_aggregate, matmul, matmul_prefix, SegmentCsr};
use crate::self_loop::{accumulate, PerType, SelfLoops};

struct RelationAttention {
    /// `[in_src, heads·head_dim]`
    weight: Tensor,
    /// `[in_src, heads]`: per-head source scores.
    attn_src: Tensor,
    /// `[in_dst, heads]`: per-head destination scores.
    attn_dst: Tensor,
}

/// One R-GAT layer.
pub struct RgatLayer {
    rels: Vec<RelationAttention>,
    heads: usize,
    head_dim: usize,
    mean_heads: bool,
    self_loop: SelfLoops,
}

impl RgatLayer {
    /// Creates layer `index`'s parameters; `last` layers average `heads` heads of
    /// width `out_dim`, others concatenate heads of width `out_dim / heads`.
    pub fn new(a: LayerArgs) -> Result<RgatLayer> {
        let LayerArgs {
            store,
            g,
            index,
            in_dims,
            out_dim,
            last,
            spec,
            dtype,
            device,
        } = a;
        let (heads, seed) = (spec.heads, spec.seed);
        if heads == 0 || (!last && !out_dim.is_multiple_of(heads)) {
            return Err(ModelError::Config(format!(
                "R-GAT: hidden width {out_dim} must be a multiple of heads ({heads})"
            )));
        }
        let head_dim = if last { out_dim } else { out_dim / heads };
        let mut rels = Vec::new();
        for r in g.relations() {
            let p = format!("layer{index}.rel.{}", r.canonical());
            let (i_s, i_d) = (in_dims[r.src.index()], in_dims[r.dst.index()]);
            rels.push(RelationAttention {
                weight: store.matrix(
                    seed,
                    &format!("{p}.weight"),
                    i_s,
                    heads * head_dim,
                    dtype,
                    device,
                )?,
                attn_src: store.matrix(
                    seed,
                    &format!("{p}.attn_src"),
                    i_s,
                    heads,
                    dtype,
                    device,
                )?,
                attn_dst: store.matrix(
                    seed,
                    &format!("{p}.attn_dst"),
                    i_d,
                    heads,
                    dtype,
                    device,
                )?,
            });
        }
        let self_loop = SelfLoops::new(store, g, index, in_dims, out_dim, seed, dtype, device)?;
        Ok(RgatLayer {
            rels,
            heads,
            head_dim,
            mean_heads: last,
            self_loop,
        })
    }

    /// Width of a destination's partial: the mean of the heads in the last layer, their concatenation before.
    pub fn out_width(&self) -> usize {
        if self.mean_heads {
            self.head_dim
        } else {
            self.heads * self.head_dim
        }
    }
}

impl RelationalLayer for RgatLayer {
    /// Sum over `relations` of each relation's attention-weighted messages, per destination type.
    fn relation_partials(
        &self,
        g: &HetGraph,
        block: &Block,
        relations: &[RelationId],
        h_src: &PerType,
    ) -> Result<PerType> {
        let mut out: PerType = vec![None; block.dst.len()];
        for br in crate::layer::relations_in(block, relations) {
            let rel = g.relation(br.relation);
            let (s, d) = (rel.src.index(), rel.dst.index());
            let (Some(x), Some(xd)) = (&h_src[s], &h_src[d]) else {
                continue;
            };
            let (n_src, n_dst) = (block.src[s].len(), block.dst[d].len());
            let p = &self.rels[br.relation.index()];
            let csr = SegmentCsr::new(n_src, br.offsets.clone(), br.sources.clone());
            let values = matmul(x, &p.weight)?.reshape((n_src, self.heads, self.head_dim))?;
            let el = matmul(x, &p.attn_src)?;
            let er = matmul_prefix(xd, n_dst, &p.attn_dst)?;
            let agg = attention_aggregate(&values, &el, &er, &csr)?;
            let msg = if self.mean_heads {
                agg.mean(1)?
            } else {
                agg.reshape((n_dst, self.heads * self.head_dim))?
            };
            accumulate(&mut out[d], msg)?;
        }
        Ok(out)
    }

    /// Self-loop on the destinations' own rows plus the summed partials.
    fn cross_relation(&self, block: &Block, h_src: &PerType, partials: PerType) -> Result<PerType> {
        self.self_loop.cross_relation(block, h_src, partials)
    }

    fn partial_dims(&self) -> Result<Vec<usize>> {
        Ok(vec![self.out_width()])
    }

    /// Attention scores read the destinations' rows.
    fn partials_read_destinations(&self) -> bool {
        true
    }
}
