//! HGT (heterogeneous graph transformer): type-specific key, query and value
//! maps; per relation an attention matrix, a message matrix and a prior per
//! head; attention normalised over all incoming edges of a node across
//! relations; a type-specific output map with a gated skip connection.
//!
//! The softmax across relations is what makes HGT hard to split by relation.
//! Each relation's part is computed as a log-sum-exp partial
//! ([`crate::ops::lse_attention`]); partials of any subsets of relations merge
//! exactly ([`HgtLayer::combine_partials`]), so the seam is the same as for
//! R-GCN: [`HgtLayer::relation_partials`] then [`HgtLayer::cross_relation`].

use candle_core::{DType, Device, Tensor};
use graphs::{Block, HetGraph, RelationId};

use crate::error::{ModelError, Result};
use crate::layer::{Activation, LayerArgs, RelationalLayer};
use crate::ops::{add_bias, finish_partial, lse_attention, matmul, merge_partials, SegmentCsr};
use crate::self_loop::{per_dst_type, PerType};

struct TypeMaps {
    key: Tensor,
    query: Tensor,
    value: Tensor,
    out_w: Tensor,
    out_b: Tensor,
    /// Skip gate logit (only used when input and output widths agree).
    skip: Tensor,
    in_dim: usize,
}

struct RelationMaps {
    /// `[H, d, d]`
    att: Tensor,
    /// `[H, d, d]`
    msg: Tensor,
    /// `[H]`
    prior: Tensor,
}

/// One HGT layer.
pub struct HgtLayer {
    types: Vec<TypeMaps>,
    rels: Vec<RelationMaps>,
    heads: usize,
    head_dim: usize,
    out_dim: usize,
}

impl HgtLayer {
    /// Creates layer `index`'s parameters; `out_dim` must be a multiple of `heads`.
    pub fn new(a: LayerArgs) -> Result<HgtLayer> {
        let LayerArgs {
            store,
            g,
            index,
            in_dims,
            out_dim,
            spec,
            dtype,
            device,
            ..
        } = a;
        let (heads, seed) = (spec.heads, spec.seed);
        if heads == 0 || !out_dim.is_multiple_of(heads) {
            return Err(ModelError::Config(format!(
                "HGT: width {out_dim} must be a multiple of heads ({heads})"
            )));
        }
        let d = out_dim / heads;
        let mut types = Vec::new();
        for (t, nt) in g.node_types().iter().enumerate() {
            let p = format!("layer{index}.type.{}", nt.name);
            let i = in_dims[t];
            types.push(TypeMaps {
                key: store.matrix(seed, &format!("{p}.key"), i, out_dim, dtype, device)?,
                query: store.matrix(seed, &format!("{p}.query"), i, out_dim, dtype, device)?,
                value: store.matrix(seed, &format!("{p}.value"), i, out_dim, dtype, device)?,
                out_w: store.matrix(
                    seed,
                    &format!("{p}.out.weight"),
                    out_dim,
                    out_dim,
                    dtype,
                    device,
                )?,
                out_b: store.zeros(&format!("{p}.out.bias"), out_dim, dtype, device)?,
                skip: store.filled(&format!("{p}.skip"), 1, 1.0, dtype, device)?,
                in_dim: i,
            });
        }
        let mut rels = Vec::new();
        for r in g.relations() {
            let p = format!("layer{index}.rel.{}", r.canonical());
            rels.push(RelationMaps {
                att: store
                    .matrix(seed, &format!("{p}.att"), heads * d, d, dtype, device)?
                    .reshape((heads, d, d))?,
                msg: store
                    .matrix(seed, &format!("{p}.msg"), heads * d, d, dtype, device)?
                    .reshape((heads, d, d))?,
                prior: store.filled(&format!("{p}.prior"), heads, 1.0, dtype, device)?,
            });
        }
        Ok(HgtLayer {
            types,
            rels,
            heads,
            head_dim: d,
            out_dim,
        })
    }

    /// `[n, H, d]` rows of `x · w`, then per head through `[H, d, d]` matrices.
    fn per_head(&self, x: &Tensor, w: &Tensor, rel: Option<&Tensor>) -> Result<Tensor> {
        let n = x.dim(0)?;
        let h = matmul(x, w)?.reshape((n, self.heads, self.head_dim))?;
        Ok(match rel {
            Some(m) => h
                .transpose(0, 1)?
                .contiguous()?
                .matmul(m)?
                .transpose(0, 1)?
                .contiguous()?,
            None => h,
        })
    }
}

impl RelationalLayer for HgtLayer {
    /// Merged log-sum-exp partials of `relations`, per destination type (`[n_dst, H, 2 + d]`).
    fn relation_partials(
        &self,
        g: &HetGraph,
        block: &Block,
        relations: &[RelationId],
        h_src: &PerType,
    ) -> Result<PerType> {
        let mut out: PerType = vec![None; block.dst.len()];
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        for br in crate::layer::relations_in(block, relations) {
            let rel = g.relation(br.relation);
            let (s, d) = (rel.src.index(), rel.dst.index());
            let (Some(x), Some(xd)) = (&h_src[s], &h_src[d]) else {
                continue;
            };
            let (n_src, n_dst) = (block.src[s].len(), block.dst[d].len());
            let r = &self.rels[br.relation.index()];
            let csr = SegmentCsr::new(n_src, br.offsets.clone(), br.sources.clone());
            let prior = (r.prior.reshape((1, self.heads, 1))? * scale)?;
            let k = self
                .per_head(x, &self.types[s].key, Some(&r.att))?
                .broadcast_mul(&prior)?;
            let v = self.per_head(x, &self.types[s].value, Some(&r.msg))?;
            let q = self.per_head(&xd.narrow(0, 0, n_dst)?, &self.types[d].query, None)?;
            let p = lse_attention(&q, &k, &v, &csr)?;
            out[d] = Some(match out[d].take() {
                Some(acc) => merge_partials(&acc, &p)?,
                None => p,
            });
        }
        Ok(out)
    }

    /// The log-sum-exp merge: exact for partials of disjoint relation subsets.
    fn combine_partials(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        Ok(merge_partials(a, b)?)
    }

    /// Finishes the softmax, applies the output map and the gated skip.
    fn cross_relation(&self, block: &Block, h_src: &PerType, partials: PerType) -> Result<PerType> {
        per_dst_type(block, h_src, partials, |t, x, n_dst, p| {
            let tm = &self.types[t];
            let own = x.narrow(0, 0, n_dst)?;
            let agg = match p {
                Some(p) => finish_partial(&p)?.reshape((n_dst, self.out_dim))?,
                None => Tensor::zeros((n_dst, self.out_dim), own.dtype(), own.device())?,
            };
            let y = add_bias(&matmul(&agg.gelu()?, &tm.out_w)?, &tm.out_b)?;
            Ok(if tm.in_dim == self.out_dim {
                let alpha = candle_nn::ops::sigmoid(&tm.skip)?;
                (y.broadcast_mul(&alpha)? + own.broadcast_mul(&(1.0 - alpha)?)?)?
            } else {
                y
            })
        })
    }

    fn activation(&self) -> Activation {
        Activation::DropoutAfterEach
    }

    /// Per head, the running maximum, the sum of weights and the weighted values.
    fn partial_dims(&self) -> Result<Vec<usize>> {
        Ok(vec![self.heads, 2 + self.head_dim])
    }

    /// Per head an empty maximum and zero sums.
    fn neutral_partial(&self, rows: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let shape = vec![rows, self.heads, 2 + self.head_dim];
        let last = shape.len() - 1;
        let mut m_shape = shape.clone();
        m_shape[last] = 1;
        let m = (Tensor::ones(m_shape, dtype, device)? * crate::ops::EMPTY_MAX)?;
        let zeros = Tensor::zeros(shape.clone(), dtype, device)?;
        Ok(Tensor::cat(
            &[&m, &zeros.narrow(last, 1, shape[last] - 1)?],
            last,
        )?)
    }

    /// Attention queries read the destinations' rows.
    fn partials_read_destinations(&self) -> bool {
        true
    }
}
