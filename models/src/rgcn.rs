//! R-GCN: per relation a mean over sampled in-neighbors followed by a
//! bias-free linear map, summed over relations, plus a per-type self-loop
//! linear map with bias.
//!
//! A layer is split at the seam RAF needs: [`RgcnLayer::relation_partials`]
//! computes the summed relation messages for any subset of relations, and
//! [`RgcnLayer::cross_relation`] adds the self-loop to the (summed) partials.

use std::sync::Arc;

use candle_core::Tensor;
use graphs::{Block, HetGraph, RelationId};

use crate::error::Result;
use crate::layer::{LayerArgs, RelationMeans, RelationalLayer};
use crate::ops::{matmul, segment_mean, SegmentCsr};
pub use crate::self_loop::PerType;
use crate::self_loop::{accumulate, SelfLoops};

/// One R-GCN layer.
pub struct RgcnLayer {
    /// Per relation (indexed by [`RelationId`]): `[in_src, out]`.
    rel_weight: Vec<Tensor>,
    self_loop: SelfLoops,
}

impl RgcnLayer {
    /// Creates layer `index`'s parameters in `store`; `in_dims[t]` is type `t`'s input width.
    pub fn new(a: LayerArgs) -> Result<RgcnLayer> {
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
        let seed = spec.seed;
        let mut rel_weight = Vec::new();
        for r in g.relations() {
            let name = format!("layer{index}.rel.{}.weight", r.canonical());
            rel_weight.push(store.matrix(
                seed,
                &name,
                in_dims[r.src.index()],
                out_dim,
                dtype,
                device,
            )?);
        }
        let self_loop = SelfLoops::new(store, g, index, in_dims, out_dim, seed, dtype, device)?;
        Ok(RgcnLayer {
            rel_weight,
            self_loop,
        })
    }
}

impl RelationalLayer for RgcnLayer {
    /// Sum over `relations` (those present in `block`) of each relation's
    /// mean-aggregated, transformed messages, per destination type.
    /// `h_src[t]` holds the rows of `block.src[t]`.
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
            let Some(x) = &h_src[s] else { continue };
            let csr = SegmentCsr::new(block.src[s].len(), br.offsets.clone(), br.sources.clone());
            let msg = aggregate_then_transform(x, &self.rel_weight[br.relation.index()], &csr)?;
            accumulate(&mut out[d], msg)?;
        }
        Ok(out)
    }

    /// Self-loop on the destinations' own rows plus the summed partials.
    fn cross_relation(&self, block: &Block, h_src: &PerType, partials: PerType) -> Result<PerType> {
        self.self_loop.cross_relation(block, h_src, partials)
    }

    /// The relations' means read from the rows in place, then transformed;
    /// a relation whose sources are fewer than its destinations (transformed
    /// first, as `relation_partials` does) has its sources' rows copied out.
    fn partials_in_place(
        &self,
        g: &HetGraph,
        block: &Block,
        relations: &[RelationId],
        rows: &[Option<crate::layer::PlacedRows<'_>>],
    ) -> Result<Option<PerType>> {
        let mut out: PerType = vec![None; block.dst.len()];
        for br in crate::layer::relations_in(block, relations) {
            let rel = g.relation(br.relation);
            let (s, d) = (rel.src.index(), rel.dst.index());
            // `ids`: where each of the block's sources of type `s` lies in `x`.
            let Some(Some((x, width, ids))) = rows.get(s).copied() else {
                continue;
            };
            if ids.is_empty() {
                continue;
            }
            let w = &self.rel_weight[br.relation.index()];
            let (i, o) = w.dims2()?;
            if width != i {
                return Err(crate::ModelError::Config(format!(
                    "rows of {width} floats for relation {}, whose weight reads {i}",
                    rel.name
                )));
            }
            let (n_src, n_dst, e) = (
                ids.len(),
                br.offsets.len().saturating_sub(1),
                br.sources.len(),
            );
            let msg = if transforms_first(n_src * i, n_dst, e, i, o) {
                // Fewer sources than destinations: transform the sources' rows, copied out.
                let rows = crate::ops::copy_rows(x, i, ids)
                    .map_err(|v| crate::ModelError::Config(format!("node {v} has no input row")))?;
                let x = Tensor::from_vec(rows, (n_src, i), w.device())?;
                let csr = SegmentCsr::new(n_src, br.offsets.clone(), br.sources.clone());
                aggregate_then_transform(&x, w, &csr)?
            } else {
                let global: Vec<u32> = br.sources.iter().map(|&k| ids[k as usize]).collect();
                let mean =
                    crate::ops::segment_mean_in_place(x, i, &br.offsets, &global, w.device())?;
                matmul(&mean, w)?
            };
            accumulate(&mut out[d], msg)?;
        }
        Ok(Some(out))
    }

    fn partial_dims(&self) -> Result<Vec<usize>> {
        Ok(vec![RelationMeans::out_width(self)?])
    }

    fn means(&self) -> Option<&dyn RelationMeans> {
        Some(self)
    }
}

impl RelationMeans for RgcnLayer {
    /// Input width of relation `r`'s weight.
    fn in_width(&self, r: RelationId) -> Result<usize> {
        Ok(self.rel_weight[r.index()].dim(0)?)
    }

    /// Output width.
    fn out_width(&self) -> Result<usize> {
        Ok(self
            .rel_weight
            .first()
            .map(|w| w.dim(1))
            .transpose()?
            .unwrap_or(0))
    }

    /// Per relation in `relations` (those present in `block` with source
    /// rows), the mean of the sampled sources' rows, untransformed: what a
    /// RAF worker ships when that is narrower than the transformed partial.
    fn relation_means(
        &self,
        g: &HetGraph,
        block: &Block,
        relations: &[RelationId],
        h_src: &PerType,
    ) -> Result<Vec<(RelationId, Tensor)>> {
        let mut out = Vec::new();
        for br in crate::layer::relations_in(block, relations) {
            let s = g.relation(br.relation).src.index();
            let Some(x) = &h_src[s] else { continue };
            let csr = SegmentCsr::new(block.src[s].len(), br.offsets.clone(), br.sources.clone());
            out.push((br.relation, crate::ops::segment_mean(x, &csr)?));
        }
        Ok(out)
    }

    /// The partial of relation means ([`RgcnLayer::relation_means`]): each times its relation's weight, summed.
    fn transform_means(&self, means: &[(RelationId, Tensor)]) -> Result<Option<Tensor>> {
        let mut acc = None;
        for (r, m) in means {
            accumulate(&mut acc, matmul(m, &self.rel_weight[r.index()])?)?;
        }
        Ok(acc)
    }
}

/// `mean(x) · w`, in whichever order costs fewer multiply-adds: transforming
/// first pays `n_src·in·out + E·out` (`nnz·out + E·out` for a constant,
/// mostly-zero `x`: see `ops::sparse`), aggregating first `E·in + n_dst·in·out`.
/// (Sampled blocks have many more sources than destinations, so aggregating
/// first usually wins for dense inputs even when `in > out`.)
fn aggregate_then_transform(x: &Tensor, w: &Tensor, csr: &Arc<SegmentCsr>) -> Result<Tensor> {
    let (i, o) = w.dims2()?;
    let (n_src, n_dst, e) = (csr.n_src(), csr.n_dst(), csr.n_edges());
    let sparse = crate::ops::sparse::rows_for(x, w)?;
    let transform_first = transforms_first(sparse.map_or(n_src * i, |sp| sp.nnz()), n_dst, e, i, o);
    if x.track_op() {
        // The backward pass will spread the gradient over the sources.
        csr.transpose_ahead();
    }
    Ok(if transform_first {
        segment_mean(&matmul(x, w)?, csr)?
    } else {
        matmul(&segment_mean(x, csr)?, w)?
    })
}

/// Whether transforming the sources first (`values` input values: `n_src·i`,
/// or a mostly-zero input's non-zeros), then aggregating `e` edges into
/// `n_dst` rows, costs fewer multiply-adds than aggregating first, for an
/// `i`-to-`o` weight.
fn transforms_first(values: usize, n_dst: usize, e: usize, i: usize, o: usize) -> bool {
    values * o + e * o < e * i + n_dst * i * o
}
