//! The seam every relational model is written against: a layer is
//! relation-specific aggregations, computable for any subset of relations
//! and merged later ([`RelationalLayer::relation_partials`],
//! [`RelationalLayer::combine_partials`]), then a cross-relation step
//! ([`RelationalLayer::cross_relation`]). Whole-model forward passes and
//! relation-aggregation-first training (`crate::partials`) both go through it.
//!
//! A new model is one file implementing [`RelationalLayer`] plus one
//! registration: its `ModelKind` variant (with its name) and its arm in
//! [`registered`].

use candle_core::{DType, Device, Tensor};
use graphs::{Block, HetGraph, RelationId};

use crate::error::Result;
use crate::hgt::HgtLayer;
use crate::model::{ModelKind, ModelSpec};
use crate::params::ParamStore;
use crate::rgat::RgatLayer;
use crate::rgcn::RgcnLayer;
use crate::self_loop::PerType;

/// The relations of `block` among `relations`, in the block's order (the
/// order partials are summed in).
pub(crate) fn relations_in<'a>(
    block: &'a Block,
    relations: &'a [RelationId],
) -> impl Iterator<Item = &'a graphs::BlockRelation> + 'a {
    block
        .relations
        .iter()
        .filter(move |br| relations.contains(&br.relation))
}

/// What follows a layer's cross-relation step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// ReLU and dropout between layers, nothing after the last (R-GCN, R-GAT).
    ReluDropoutBetween,
    /// Dropout after every layer, the last included; the layer brings its own
    /// nonlinearity and a classifier follows (HGT).
    DropoutAfterEach,
}

/// One type's rows read in place by [`RelationalLayer::partials_in_place`]:
/// the row-major values, their width, and the place among them of each of
/// a block's sources of the type.
pub type PlacedRows<'a> = (&'a [f32], usize, &'a [u32]);

/// One relational layer.
pub trait RelationalLayer: Send + Sync {
    /// The summed (or merged) partial aggregations of `relations` (those
    /// present in `block`), per destination type; `h_src[t]` holds the rows of
    /// `block.src[t]`.
    fn relation_partials(
        &self,
        g: &HetGraph,
        block: &Block,
        relations: &[RelationId],
        h_src: &PerType,
    ) -> Result<PerType>;

    /// [`RelationalLayer::relation_partials`] of relations whose sources'
    /// rows are read where they lie: `rows[t]` is a row-major matrix of
    /// type `t`'s rows, their width, and the place of each of the block's
    /// sources of type `t` among them; `None` for a type the model does not read.
    /// The same bits as over gathered rows, or `None` where this layer needs
    /// them gathered (the caller then gathers them).
    fn partials_in_place(
        &self,
        _g: &HetGraph,
        _block: &Block,
        _relations: &[RelationId],
        _rows: &[Option<PlacedRows<'_>>],
    ) -> Result<Option<PerType>> {
        Ok(None)
    }

    /// Merges two partials of the same destinations computed from disjoint
    /// relation subsets: a sum unless the layer normalises across relations.
    fn combine_partials(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        Ok((a + b)?)
    }

    /// The destinations' rows from their own rows and the merged partials.
    fn cross_relation(&self, block: &Block, h_src: &PerType, partials: PerType) -> Result<PerType>;

    /// What follows the cross-relation step.
    fn activation(&self) -> Activation {
        Activation::ReluDropoutBetween
    }

    /// The shape of one destination's partial (after the row dimension).
    fn partial_dims(&self) -> Result<Vec<usize>>;

    /// The partial of `rows` destinations without any sampled edge: what
    /// merging leaves unchanged (zeros unless the layer says otherwise).
    fn neutral_partial(&self, rows: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let mut shape = vec![rows];
        shape.extend(self.partial_dims()?);
        Ok(Tensor::zeros(shape, dtype, device)?)
    }

    /// Whether the partials read the destinations' own rows (attention queries).
    fn partials_read_destinations(&self) -> bool {
        false
    }

    /// The relation means seam, for layers whose partial is a linear map of
    /// per-relation means (R-GCN): a worker may ship the means instead.
    fn means(&self) -> Option<&dyn RelationMeans> {
        None
    }
}

/// A layer whose partial of a relation is its mean of source rows times a
/// per-relation weight (so the means can travel instead of the partial).
pub trait RelationMeans {
    /// Input width of relation `r`'s weight (the width of its mean).
    fn in_width(&self, r: RelationId) -> Result<usize>;
    /// Width of a partial.
    fn out_width(&self) -> Result<usize>;
    /// Per relation in `relations` (those present in `block` with source
    /// rows), the mean of the sampled sources' rows, untransformed.
    fn relation_means(
        &self,
        g: &HetGraph,
        block: &Block,
        relations: &[RelationId],
        h_src: &PerType,
    ) -> Result<Vec<(RelationId, Tensor)>>;
    /// The partial of relation means: each times its relation's weight, summed.
    fn transform_means(&self, means: &[(RelationId, Tensor)]) -> Result<Option<Tensor>>;
}

/// What building one layer needs.
pub struct LayerArgs<'a> {
    /// Where the parameters go.
    pub store: &'a mut ParamStore,
    /// The graph whose types and relations the layer covers.
    pub g: &'a HetGraph,
    /// The layer's index (its parameters are named `layer<index>.…`).
    pub index: usize,
    /// Input width per node type.
    pub in_dims: &'a [usize],
    /// Output width.
    pub out_dim: usize,
    /// Whether it is the model's last relational layer.
    pub last: bool,
    /// The model's spec (heads, seed).
    pub spec: &'a ModelSpec,
    /// Parameter element type.
    pub dtype: DType,
    /// Parameter device.
    pub device: &'a Device,
}

/// How a relational model is built.
pub struct Registration {
    /// Builds one layer.
    pub build: fn(LayerArgs) -> Result<Box<dyn RelationalLayer>>,
    /// Whether a linear classifier follows the layers (`head.weight`, `head.bias`).
    pub head: bool,
    /// Whether `hidden` must be a multiple of `heads`.
    pub uses_heads: bool,
}

/// The registry of relational models (`None` for the MLP, which reads no relations).
pub fn registered(kind: ModelKind) -> Option<Registration> {
    Some(match kind {
        ModelKind::Rgcn => Registration {
            build: |a| Ok(Box::new(RgcnLayer::new(a)?)),
            head: false,
            uses_heads: false,
        },
        ModelKind::Rgat => Registration {
            build: |a| Ok(Box::new(RgatLayer::new(a)?)),
            head: false,
            uses_heads: true,
        },
        ModelKind::Hgt => Registration {
            build: |a| Ok(Box::new(HgtLayer::new(a)?)),
            head: true,
            uses_heads: true,
        },
        ModelKind::Mlp => return None,
    })
}
