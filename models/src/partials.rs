//! The relation-partials seam of a whole model: what relation-aggregation-
//! first training (Heta) computes where. A worker runs the layers below the
//! top on its relations ([`RelationPartials::hidden_below_top`]) and sends the
//! seeds' partial over its top-layer relations ([`RelationPartials::top_partial`],
//! or for R-GCN the narrower relation means); the reducer merges every
//! worker's partial and finishes the top layer and head
//! ([`RelationPartials::reduce_top`]). Everything goes through the layers'
//! [`crate::layer::RelationalLayer`] seam, so any registered model splits.

use std::collections::BTreeSet;

use candle_core::Tensor;
use graphs::{HetGraph, MiniBatch, RelationId};

use crate::error::{ModelError, Result};
use crate::model::{DropoutKey, Layers, Model};
use crate::rgcn::PerType;

/// Name prefix of layer `l`'s parameters of relation `r`.
pub fn relation_prefix(g: &HetGraph, l: usize, r: RelationId) -> String {
    format!("layer{l}.rel.{}.", g.relation(r).canonical())
}

/// RAF: per layer, the node types that are destinations (`.0`) and
/// sources (`.1`) of a partition sampling `per_layer` relations.
pub fn types_per_layer(g: &HetGraph, per_layer: &[Vec<RelationId>]) -> Vec<(Vec<bool>, Vec<bool>)> {
    let n = g.node_types().len();
    let mut out = vec![(vec![false; n], vec![false; n]); per_layer.len()];
    let mut dst = vec![false; n];
    dst[g.target().index()] = true;
    for l in (0..per_layer.len()).rev() {
        let mut src = dst.clone();
        for &r in &per_layer[l] {
            src[g.relation(r).src.index()] = true;
        }
        out[l] = (dst, src.clone());
        dst = src;
    }
    out
}

/// A model split by relation.
pub trait RelationPartials {
    /// On a worker: the rows of the top block's sources after the first
    /// `layers - 1` layers, over the relations sampled into `mb` (a
    /// partition's). Rows whose neighborhoods the partition holds whole are
    /// exactly the single-process rows.
    fn hidden_below_top(
        &self,
        g: &HetGraph,
        mb: &MiniBatch,
        inputs: PerType,
        dropout: Option<DropoutKey>,
    ) -> Result<PerType>;
    /// On a worker: the seeds' partial over the top-layer relations sampled
    /// into `mb`, from `h`; `None` when the partition has none.
    fn top_partial(&self, g: &HetGraph, mb: &MiniBatch, h: &PerType) -> Result<Option<Tensor>>;
    /// On the reducer: the logits of `seeds` from their own rows and every
    /// worker's partial (merged in the order given).
    fn reduce_top(
        &self,
        seeds: &[u32],
        own: &Tensor,
        partials: &[Tensor],
        dropout: Option<DropoutKey>,
    ) -> Result<Tensor>;
    /// Whether a worker whose top-layer relations are `top` ships their means instead.
    fn ships_means(&self, top: &[RelationId]) -> Result<bool>;
    /// The width of relation `r`'s shipped means.
    fn mean_width(&self, r: RelationId) -> Result<usize>;
    /// On a worker that ships means: the seeds' mean rows per top-layer relation.
    fn top_means(
        &self,
        g: &HetGraph,
        mb: &MiniBatch,
        h: &PerType,
    ) -> Result<Vec<(RelationId, Tensor)>>;
    /// On the reducer: the partial of a worker's shipped means.
    fn transform_means(&self, means: &[(RelationId, Tensor)]) -> Result<Option<Tensor>>;
    /// The shape of one seed's partial (after the seed dimension).
    fn partial_dims(&self) -> Result<Vec<usize>>;
    /// The partial of `rows` seeds without any sampled edge.
    fn neutral_partial(&self, rows: usize) -> Result<Tensor>;
    /// Whether the top layer's partials read the seeds' own rows.
    fn partial_reads_seeds(&self) -> bool;
    /// Names of the dense parameters a partition sampling `per_layer`
    /// relations may use (a superset); with `reducer`, also those of the top
    /// layer's cross-relation step and the head.
    fn params_for(
        &self,
        g: &HetGraph,
        per_layer: &[Vec<RelationId>],
        reducer: bool,
    ) -> Result<BTreeSet<String>>;
}

impl RelationPartials for Model {
    /// On a worker: the rows of the top block's sources after the first
    /// `layers - 1` layers, over the relations sampled into `mb` (a
    /// partition's). Rows whose neighborhoods the partition holds whole are
    /// exactly the single-process rows.
    fn hidden_below_top(
        &self,
        g: &HetGraph,
        mb: &MiniBatch,
        inputs: PerType,
        dropout: Option<DropoutKey>,
    ) -> Result<PerType> {
        let (ls, _) = self.relational()?;
        if mb.blocks.len() != ls.len() {
            return Err(ModelError::Config(format!(
                "{} sampled blocks for a {}-layer model: give one fanout per layer",
                mb.blocks.len(),
                ls.len()
            )));
        }
        let mut h = inputs;
        for (l, (layer, block)) in ls.iter().zip(&mb.blocks).enumerate().take(ls.len() - 1) {
            let partials = layer.relation_partials(g, block, &self.all_relations, &h)?;
            let out = layer.cross_relation(block, &h, partials)?;
            h = self.activate(l, block, out, dropout)?;
        }
        Ok(h)
    }

    /// On a worker: the seeds' partial aggregation over the top-layer
    /// relations sampled into `mb`, from `h` (the lower layers' output); `None`
    /// when the partition has no top-layer relation.
    fn top_partial(&self, g: &HetGraph, mb: &MiniBatch, h: &PerType) -> Result<Option<Tensor>> {
        let (ls, _) = self.relational()?;
        let (layer, block) = (
            ls.last().expect("validated: layers >= 1"),
            mb.blocks
                .last()
                .ok_or_else(|| ModelError::Config("no sampled blocks".into()))?,
        );
        if !block
            .relations
            .iter()
            .any(|r| g.relation(r.relation).dst == self.target)
        {
            return Ok(None);
        }
        Ok(layer
            .relation_partials(g, block, &self.all_relations, h)?
            .swap_remove(self.target.index()))
    }

    /// On the reducer: the logits of `seeds` from their own rows after
    /// `layers - 1` layers and every worker's partial (merged in the order given).
    fn reduce_top(
        &self,
        seeds: &[u32],
        own: &Tensor,
        partials: &[Tensor],
        dropout: Option<DropoutKey>,
    ) -> Result<Tensor> {
        let (ls, head) = self.relational()?;
        let layer = ls.last().expect("validated: layers >= 1");
        let mut merged: Option<Tensor> = None;
        for p in partials {
            merged = Some(match merged {
                Some(m) => layer.combine_partials(&m, p)?,
                None => p.clone(),
            });
        }
        let n = self.embeddings.len();
        let t = self.target.index();
        let mut ids = vec![Vec::new(); n];
        ids[t] = seeds.to_vec();
        let block = graphs::Block {
            layer: ls.len() - 1,
            dst: ids.clone(),
            src: ids,
            relations: Vec::new(),
        };
        let mut h: PerType = vec![None; n];
        h[t] = Some(own.clone());
        let mut p: PerType = vec![None; n];
        p[t] = merged;
        let out = layer.cross_relation(&block, &h, p)?;
        let mut out = self.activate(ls.len() - 1, &block, out, dropout)?;
        let out = out[t]
            .take()
            .ok_or_else(|| ModelError::Config("no target rows after the top layer".into()))?;
        Ok(match head {
            Some((w, b)) => crate::ops::add_bias(&crate::ops::matmul(&out, w)?, b)?,
            None => out,
        })
    }

    /// whether a worker whose top-layer relations are `top` ships their
    /// untransformed means (R-GCN, when `top.len()` means are narrower than
    /// one transformed partial); the reducer then applies their weights.
    fn ships_means(&self, top: &[RelationId]) -> Result<bool> {
        let (ls, _) = self.relational()?;
        let Some(l) = ls.last().and_then(|l| l.means()) else {
            return Ok(false);
        };
        let width: usize = top.iter().map(|&r| l.in_width(r)).sum::<Result<usize>>()?;
        Ok(!top.is_empty() && width < l.out_width()?)
    }

    /// the width of relation `r`'s shipped means (its top-layer input width).
    fn mean_width(&self, r: RelationId) -> Result<usize> {
        let (ls, _) = self.relational()?;
        match ls.last() {
            Some(l) if r.index() < self.all_relations.len() && l.means().is_some() => {
                l.means().map_or(Ok(0), |m| m.in_width(r))
            }
            _ => Err(ModelError::Config(format!(
                "relation {} ships no means",
                r.0
            ))),
        }
    }

    /// On a worker that ships means: the seeds' mean rows per top-layer relation.
    fn top_means(
        &self,
        g: &HetGraph,
        mb: &MiniBatch,
        h: &PerType,
    ) -> Result<Vec<(RelationId, Tensor)>> {
        let (ls, _) = self.relational()?;
        let (Some(l), Some(block)) = (ls.last().and_then(|l| l.means()), mb.blocks.last()) else {
            return Err(ModelError::Config("only R-GCN ships relation means".into()));
        };
        l.relation_means(g, block, &self.all_relations, h)
    }

    /// On the reducer: the partial of a worker's shipped means.
    fn transform_means(&self, means: &[(RelationId, Tensor)]) -> Result<Option<Tensor>> {
        let (ls, _) = self.relational()?;
        let Some(l) = ls.last().and_then(|l| l.means()) else {
            return Err(ModelError::Config("only R-GCN ships relation means".into()));
        };
        l.transform_means(means)
    }

    /// the shape of one seed's partial (after the seed dimension).
    fn partial_dims(&self) -> Result<Vec<usize>> {
        let (ls, _) = self.relational()?;
        ls.last().map_or(Ok(Vec::new()), |l| l.partial_dims())
    }

    /// the partial of `rows` seeds without any sampled edge (what
    /// merging leaves unchanged: zeros, or HGT's empty log-sum-exp rows).
    fn neutral_partial(&self, rows: usize) -> Result<Tensor> {
        let (ls, _) = self.relational()?;
        let layer = ls
            .last()
            .ok_or_else(|| ModelError::Config("no relational layer".into()))?;
        layer.neutral_partial(rows, self.dtype(), self.device())
    }

    /// Whether the top layer reads the destinations' own rows inside the
    /// relation partials (attention queries): then a RAF worker that cannot
    /// compute the seeds' rows itself receives them from the reducer.
    fn partial_reads_seeds(&self) -> bool {
        matches!(self.layers, Layers::Relational(ref ls, _) if ls.len() > 1 && ls.last().is_some_and(|l| l.partials_read_destinations()))
    }

    /// names of the dense parameters a partition sampling `per_layer`
    /// relations may use (a superset); with `reducer`, also those of the
    /// cross-relation step and head of the top layer.
    fn params_for(
        &self,
        g: &HetGraph,
        per_layer: &[Vec<RelationId>],
        reducer: bool,
    ) -> Result<std::collections::BTreeSet<String>> {
        let (ls, _) = self.relational()?;
        if per_layer.len() != ls.len() {
            return Err(ModelError::Config(format!(
                "relations for {} layers, the model has {}",
                per_layer.len(),
                ls.len()
            )));
        }
        let types = types_per_layer(g, per_layer);
        let top = ls.len() - 1;
        let name = |t: usize| g.node_types()[t].name.as_str();
        let mut prefixes = Vec::new();
        for (l, rels) in per_layer.iter().enumerate() {
            for &r in rels {
                prefixes.push(relation_prefix(g, l, r));
            }
            let (dst, src) = &types[l];
            for t in 0..dst.len() {
                if src[t] {
                    prefixes.push(format!("layer{l}.type.{}.", name(t)));
                }
                if dst[t] && l < top {
                    prefixes.push(format!("layer{l}.self.{}.", name(t)));
                }
            }
        }
        if reducer {
            let t = self.target.index();
            prefixes.push(format!("layer{top}.self.{}.", name(t)));
            prefixes.push(format!("layer{top}.type.{}.", name(t)));
            prefixes.push("head.".to_string());
        }
        Ok(self
            .params
            .iter()
            .map(|(n, _)| n)
            .filter(|n| prefixes.iter().any(|p| n.starts_with(p.as_str())))
            .map(str::to_string)
            .collect())
    }
}
