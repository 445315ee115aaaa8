//! A whole model: input embeddings for featureless types, the layers, and the
//! forward pass over a sampled mini-batch.

use std::borrow::Cow;

use candle_core::{DType, Device, Tensor};
use graphs::{HetGraph, MiniBatch, NodeTypeId, RelationId};
use rayon::prelude::*;

use crate::embedding::EmbeddingTable;
use crate::error::{ModelError, Result};
use crate::layer::{Activation, LayerArgs, RelationalLayer};
use crate::params::ParamStore;
use crate::rgcn::PerType;

/// Which architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Relational GCN (mean aggregation per relation, self-loop, sum).
    Rgcn,
    /// Relational GAT (multi-head attention per relation, self-loop, sum).
    Rgat,
    /// Heterogeneous graph transformer (attention across relations), then a linear classifier.
    Hgt,
    /// Features-only multi-layer perceptron on the target type (a baseline).
    Mlp,
}

impl std::str::FromStr for ModelKind {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<ModelKind> {
        match s {
            "rgcn" => Ok(ModelKind::Rgcn),
            "rgat" => Ok(ModelKind::Rgat),
            "hgt" => Ok(ModelKind::Hgt),
            "mlp" => Ok(ModelKind::Mlp),
            other => Err(ModelError::Config(format!(
                "unknown model '{other}' (known: rgcn, rgat, hgt, mlp)"
            ))),
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelKind::Rgcn => "rgcn",
            ModelKind::Rgat => "rgat",
            ModelKind::Hgt => "hgt",
            ModelKind::Mlp => "mlp",
        })
    }
}

/// What the last layer (or HGT's linear head) writes for each target node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Head {
    /// One logit per class (node classification).
    #[default]
    Classes,
    /// One value (node regression).
    Value,
    /// One logit per label of the target's label sets (multi-label).
    Labels,
}

impl Head {
    /// Its outputs per node on `g`.
    pub fn width(self, g: &HetGraph) -> usize {
        match self {
            Head::Value => 1,
            Head::Classes => g.num_classes() as usize,
            // A graph without label sets is refused before a model is built.
            Head::Labels => g.target_label_sets().map_or(1, |s| s.width()),
        }
    }
}

/// Everything that shapes a model's parameters.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelSpec {
    /// Architecture.
    pub kind: ModelKind,
    /// Number of layers.
    pub layers: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Width of learnable embeddings of featureless types.
    pub embed_dim: usize,
    /// Dropout probability after every layer but the last.
    pub dropout: f32,
    /// Seed of parameter initialisation and dropout.
    pub seed: u64,
    /// Attention heads (R-GAT); hidden must be a multiple of it.
    #[serde(default = "default_heads")]
    pub heads: usize,
    /// Link prediction: the last layer's rows are embeddings (hidden wide, no
    /// classifier) scored by this decoder; `None`: node classification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<crate::link::LinkSpec>,
    /// What a target node's output is (ignored with `link` and `edge`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub head: Head,
    /// Multi-task: each node task's head, in order, their outputs side by
    /// side in a target node's row (empty: `head` alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub task_heads: Vec<Head>,
    /// Edge classification or regression: the last layer's rows are
    /// embeddings (hidden wide) read by this decoder; `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<crate::edge::EdgeSpec>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn default_heads() -> usize {
    4
}

impl ModelSpec {
    /// Width of the last layer's output on `g`: embeddings (hidden wide) for
    /// link prediction, one value for regression, one logit per label for
    /// multi-label, else one logit per class.
    pub fn outputs(&self, g: &HetGraph) -> usize {
        let edges = self.link.is_some() || self.edge.is_some();
        match (edges, self.task_heads.is_empty()) {
            (true, true) => self.hidden,
            (false, true) => self.head.width(g),
            (edges, false) => {
                let nodes: usize = self.task_heads.iter().map(|h| h.width(g)).sum();
                nodes + if edges { self.hidden } else { 0 }
            }
        }
    }

    /// Whether a target node's row holds node-task outputs (not only the
    /// embeddings a link or edge decoder reads).
    pub fn predicts_nodes(&self) -> bool {
        (self.link.is_none() && self.edge.is_none()) || !self.task_heads.is_empty()
    }

    /// Whether node tasks and a link or edge task share the last layer: its
    /// rows are the node tasks' columns, then the decoder's `hidden` columns.
    pub fn is_mixed(&self) -> bool {
        (self.link.is_some() || self.edge.is_some()) && !self.task_heads.is_empty()
    }

    /// Each node task's head and its columns of a target node's output row
    /// (one head over every column for a single task).
    pub fn head_columns(&self, g: &HetGraph) -> Vec<(Head, std::ops::Range<usize>)> {
        if self.task_heads.is_empty() {
            return vec![(self.head, 0..self.outputs(g))];
        }
        let mut at = 0;
        self.task_heads
            .iter()
            .map(|h| {
                let w = h.width(g);
                at += w;
                (*h, at - w..at)
            })
            .collect()
    }

    /// The bytes a model of this spec holds on `g` while training: its dense
    /// weights ([`ModelSpec::dense_bytes`]) and, with `tables`, the
    /// learnable rows ([`ModelSpec::table_bytes`]). Checked before anything
    /// is allocated, so that a width no machine can hold is an error.
    pub fn min_bytes(&self, g: &HetGraph, tables: bool) -> u128 {
        let dense = self.dense_bytes(g);
        match tables {
            true => dense.saturating_add(self.table_bytes(g)),
            false => dense,
        }
    }

    /// Each layer's weights (one per relation, input width by output width)
    /// with their gradients and two Adam moments.
    pub fn dense_bytes(&self, g: &HetGraph) -> u128 {
        let classes = self.outputs(g) as u128;
        let hidden = self.hidden as u128;
        let input = self
            .input_widths(g)
            .into_iter()
            .max()
            .unwrap_or(self.embed_dim) as u128;
        let per_layer = if self.kind == ModelKind::Mlp {
            1
        } else {
            g.relations().len().max(1) as u128
        };
        let mut weights: u128 = 0;
        for l in 0..self.layers {
            let fan_in = if l == 0 { input } else { hidden };
            let fan_out = if l + 1 == self.layers {
                classes.max(hidden)
            } else {
                hidden
            };
            weights =
                weights.saturating_add(per_layer.saturating_mul(fan_in).saturating_mul(fan_out));
        }
        weights.saturating_mul(4 * 4)
    }

    /// The learnable rows of `g` (every featureless type the model gives
    /// an embedding), with their two Adam moments and step counts: what the
    /// embedding tables hold, whichever process holds them.
    pub fn table_bytes(&self, g: &HetGraph) -> u128 {
        self.table_bytes_of(g, None)
    }

    /// [`ModelSpec::table_bytes`] for `rows[t]` rows of each type `t`
    /// (`None`: all of them).
    pub fn table_bytes_of(&self, g: &HetGraph, rows: Option<&[u64]>) -> u128 {
        let rows: u128 = g
            .node_types()
            .iter()
            .zip(Model::learnable_types(self.kind, g))
            .enumerate()
            .filter(|(_, (_, l))| *l)
            .map(|(i, (t, _))| {
                let all = u64::from(t.count);
                u128::from(rows.and_then(|r| r.get(i).copied()).unwrap_or(all).min(all))
            })
            .sum();
        rows.saturating_mul(
            (self.embed_dim as u128)
                .saturating_mul(4 * 3)
                .saturating_add(4),
        )
    }

    /// Each node type's width at the first layer's input: its features', or
    /// the learnable rows' (`embed_dim`).
    pub fn input_widths(&self, g: &HetGraph) -> Vec<usize> {
        g.node_types()
            .iter()
            .map(|t| t.features.as_ref().map_or(self.embed_dim, |f| f.dim()))
            .collect()
    }

    /// An upper bound on what one training step of `batch` seeds with
    /// `fanouts` (seeds outward) holds on `g` at its peak, the backward pass
    /// included; see [`StepMemory`].
    pub fn step_memory(&self, g: &HetGraph, fanouts: &[usize], batch: usize) -> StepMemory {
        let types = g.node_types();
        let count = |t: NodeTypeId| types[t.index()].count as f64;
        let widths = self.input_widths(g);
        let outputs = self.outputs(g) as f64;
        let hidden = self.hidden as f64;
        // Rows of each type the hops reach so far, capped by the type's count.
        let mut rows = vec![0f64; types.len()];
        rows[g.target().index()] = (batch as f64).min(count(g.target()));
        if self.kind == ModelKind::Mlp {
            // The seeds' own rows through every layer, with gradients.
            let t = g.target().index();
            let inputs = rows[t] * widths[t] as f64 * 4.0;
            let layers = rows[t] * (hidden * self.layers as f64 + outputs) * 4.0;
            let bytes = |x: f64| x.min(u128::MAX as f64) as u128;
            return StepMemory {
                activations: bytes(inputs * 4.0 + layers * 2.0),
                inputs: bytes(inputs),
                features: bytes(if types[t].features.is_some() {
                    inputs
                } else {
                    0.0
                }),
            };
        }
        let mut activations = 0f64;
        let mut inputs = 0f64;
        let mut features = 0f64;
        let hops = fanouts.len().min(self.layers);
        for (hop, &fanout) in fanouts.iter().enumerate().take(self.layers) {
            let layer = self.layers - 1 - hop;
            let w_in = |t: usize| if layer == 0 { widths[t] as f64 } else { hidden };
            let w_out = if layer + 1 == self.layers {
                outputs.max(hidden)
            } else {
                hidden
            };
            let mut next = rows.clone();
            for r in g.relations() {
                let dst_rows = rows[r.dst.index()];
                if dst_rows == 0.0 || count(r.dst) == 0.0 {
                    continue;
                }
                let edges = dst_rows * (fanout as f64).min(r.num_edges() as f64 / count(r.dst));
                next[r.src.index()] += edges;
                // Messages (or attention terms) per sampled edge and their
                // gradients; the relation's sum at its destinations, at the
                // wider width (a layer may aggregate before transforming),
                // and its gradient.
                let wide = w_in(r.src.index()).max(w_out);
                activations += edges * w_out * 4.0 * 2.0 + dst_rows * wide * 4.0 * 2.0;
            }
            for (t, n) in next.iter_mut().enumerate() {
                *n = n.min(types[t].count as f64);
                // The layer's input rows, their gradient, and the two terms a
                // gradient sum holds while it adds another relation's share.
                activations += *n * w_in(t) * 4.0 * 4.0;
                if hop + 1 == hops {
                    inputs += *n * w_in(t) * 4.0;
                    if types[t].features.is_some() {
                        features += *n * w_in(t) * 4.0;
                    }
                }
            }
            rows = next;
        }
        let bytes = |x: f64| x.min(u128::MAX as f64) as u128;
        StepMemory {
            activations: bytes(activations),
            inputs: bytes(inputs),
            features: bytes(features),
        }
    }

    /// Checks the values are usable.
    pub fn validate(&self) -> Result<()> {
        if self.layers == 0 {
            return Err(ModelError::Config("layers must be at least 1".into()));
        }
        if self.hidden == 0 || self.embed_dim == 0 {
            return Err(ModelError::Config(
                "hidden and embed_dim must be at least 1".into(),
            ));
        }
        if crate::layer::registered(self.kind).is_some_and(|r| r.uses_heads)
            && (self.heads == 0 || !self.hidden.is_multiple_of(self.heads))
        {
            return Err(ModelError::Config(format!(
                "hidden ({}) must be a positive multiple of heads ({})",
                self.hidden, self.heads
            )));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError::Config(format!(
                "dropout {} must be in [0, 1)",
                self.dropout
            )));
        }
        if let Some(edge) = &self.edge {
            if self.kind == ModelKind::Mlp {
                return Err(ModelError::Config("edge tasks need a relational model (rgcn, rgat or hgt): the MLP reads only the target type's features".into()));
            }
            if self.link.is_some() {
                return Err(ModelError::Config(
                    "a model is an edge predictor or a link predictor, not both".into(),
                ));
            }
            edge.validate()?;
        }
        if let Some(link) = &self.link {
            if self.kind == ModelKind::Mlp {
                return Err(ModelError::Config("link prediction needs a relational model (rgcn, rgat or hgt): the MLP reads only the target type's features".into()));
            }
            if link.relations.is_empty() {
                return Err(ModelError::Config(
                    "link prediction needs at least one target relation".into(),
                ));
            }
        }
        Ok(())
    }
}

/// What one training step holds, in bytes (see [`ModelSpec::step_memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepMemory {
    /// Activations and their gradients at the step's peak, inputs included.
    pub activations: u128,
    /// The first layer's input rows of every type (features and learnable
    /// rows): what a batch gathers, or pulls from other machines.
    pub inputs: u128,
    /// Of [`StepMemory::inputs`], the rows of types with features: what a
    /// prefetched batch carries before its step.
    pub features: u128,
}

/// A linear map's `(weight, bias)`.
pub(crate) type Linear = (Tensor, Tensor);

/// A model's relational layers, in order.
pub(crate) type RelationalLayers = [Box<dyn RelationalLayer>];

pub(crate) enum Layers {
    /// Relational layers, and (HGT) a linear classifier after them.
    Relational(Vec<Box<dyn RelationalLayer>>, Option<Linear>),
    /// `(weight, bias)` per layer, on the target type only.
    Mlp(Vec<(Tensor, Tensor)>),
}

/// Dropout is keyed by (seed, epoch, step): the same masks in every run.
#[derive(Clone, Copy, Debug)]
pub struct DropoutKey {
    /// Epoch.
    pub epoch: u64,
    /// Step within the epoch.
    pub step: u64,
}

/// One type's rows as [`Model::layer_in_place`] reads them.
#[derive(Clone, Copy, Debug)]
pub struct RowsInPlace<'a> {
    /// The rows held, `width` floats each.
    pub values: &'a [f32],
    /// Width of a row.
    pub width: usize,
    /// Node `v`'s row's place in `values` where rows are held for some nodes
    /// only (`slot[v]`; [`graphs::Features::ABSENT`]: none); `None`: at `v`.
    pub slot: Option<&'a [u32]>,
}

impl<'a> RowsInPlace<'a> {
    /// Rows held at their nodes' ids.
    pub fn by_id(values: &'a [f32], width: usize) -> RowsInPlace<'a> {
        RowsInPlace {
            values,
            width,
            slot: None,
        }
    }

    /// The places of nodes `ids`' rows in `values`, or the first node
    /// without a row held there.
    pub fn places<'b>(&self, ids: &'b [u32]) -> std::result::Result<Cow<'b, [u32]>, u32> {
        let held = self.values.len() / self.width.max(1);
        let Some(slot) = self.slot else {
            return match ids.iter().find(|&&v| v as usize >= held) {
                Some(&v) => Err(v),
                None => Ok(Cow::Borrowed(ids)),
            };
        };
        ids.iter()
            .map(|&v| match slot.get(v as usize) {
                Some(&p) if (p as usize) < held => Ok(p),
                _ => Err(v),
            })
            .collect::<std::result::Result<Vec<u32>, u32>>()
            .map(Cow::Owned)
    }
}

/// A model bound to one graph's types and relations.
pub struct Model {
    spec: ModelSpec,
    pub(crate) target: NodeTypeId,
    num_classes: usize,
    /// Dense parameters.
    pub params: ParamStore,
    /// Learnable embeddings, per node type (`None` for types with features).
    pub embeddings: Vec<Option<EmbeddingTable>>,
    pub(crate) layers: Layers,
    pub(crate) all_relations: Vec<RelationId>,
    dtype: DType,
    device: Device,
}

impl Model {
    /// Builds and initialises a model for `g`.
    pub fn new(spec: &ModelSpec, g: &HetGraph, dtype: DType, device: &Device) -> Result<Model> {
        Model::build(spec, g, dtype, device, true)
    }

    /// [`Model::new`] without its embedding tables (every entry `None`): for
    /// a replica whose learnable rows live elsewhere, so that it never
    /// allocates whole tables.
    pub fn without_tables(
        spec: &ModelSpec,
        g: &HetGraph,
        dtype: DType,
        device: &Device,
    ) -> Result<Model> {
        Model::build(spec, g, dtype, device, false)
    }

    fn build(
        spec: &ModelSpec,
        g: &HetGraph,
        dtype: DType,
        device: &Device,
        tables: bool,
    ) -> Result<Model> {
        spec.validate()?;
        let what = format!(
            "the model (training.hidden {}, training.embed_dim {}, training.layers {}, {} classes, {} relations)",
            spec.hidden,
            spec.embed_dim,
            spec.layers,
            g.num_classes(),
            g.relations().len()
        );
        graphs::memory::check_fits(&what, spec.min_bytes(g, tables))
            .map_err(|e| ModelError::Config(e.0))?;
        let seed = spec.seed;
        let num_classes = spec.outputs(g);
        let target = g.target();
        let mut params = ParamStore::new();
        let mut embeddings = Vec::new();
        let mut in_dims = Vec::new();
        for (nt, learnable) in g
            .node_types()
            .iter()
            .zip(Model::learnable_types(spec.kind, g))
        {
            in_dims.push(nt.features.as_ref().map_or(spec.embed_dim, |f| f.dim()));
            embeddings.push((tables && learnable).then(|| {
                EmbeddingTable::new(
                    seed,
                    &format!("embed.{}", nt.name),
                    nt.count as usize,
                    spec.embed_dim,
                )
            }));
        }
        let registered = crate::layer::registered(spec.kind);
        let has_head = registered.as_ref().is_some_and(|r| r.head)
            && spec.link.is_none()
            && spec.edge.is_none();
        let width = |l: usize| {
            if l + 1 == spec.layers && !has_head {
                num_classes
            } else {
                spec.hidden
            }
        };
        let layers = match registered {
            Some(r) => {
                let mut ls = Vec::new();
                for l in 0..spec.layers {
                    let dims: Vec<usize> = if l == 0 {
                        in_dims.clone()
                    } else {
                        vec![spec.hidden; in_dims.len()]
                    };
                    ls.push((r.build)(LayerArgs {
                        store: &mut params,
                        g,
                        index: l,
                        in_dims: &dims,
                        out_dim: width(l),
                        last: l + 1 == spec.layers,
                        spec,
                        dtype,
                        device,
                    })?);
                }
                let head = if has_head {
                    let w = params.matrix(
                        seed,
                        "head.weight",
                        spec.hidden,
                        num_classes,
                        dtype,
                        device,
                    )?;
                    Some((w, params.zeros("head.bias", num_classes, dtype, device)?))
                } else {
                    None
                };
                if let Some(link) = &spec.link {
                    for name in &link.relations {
                        if g.relation_id(name).is_none() {
                            return Err(ModelError::Config(format!(
                                "target relation '{name}' is not in graph '{}'",
                                g.name()
                            )));
                        }
                        if link.decoder == crate::link::Decoder::Distmult {
                            params.filled(
                                &crate::link::diagonal_name(name),
                                spec.hidden,
                                1.0,
                                dtype,
                                device,
                            )?;
                        }
                    }
                }
                if let Some(edge) = &spec.edge {
                    for name in &edge.relations {
                        if g.relation_id(name).is_none() {
                            return Err(ModelError::Config(format!(
                                "target relation '{name}' is not in graph '{}'",
                                g.name()
                            )));
                        }
                    }
                    edge.build(&mut params, seed, spec.hidden, g, dtype, device)?;
                }
                Layers::Relational(ls, head)
            }
            None => {
                let mut ls = Vec::new();
                let mut d = in_dims[target.index()];
                for l in 0..spec.layers {
                    let w = params.matrix(
                        seed,
                        &format!("mlp.layer{l}.weight"),
                        d,
                        width(l),
                        dtype,
                        device,
                    )?;
                    let b = params.zeros(&format!("mlp.layer{l}.bias"), width(l), dtype, device)?;
                    ls.push((w, b));
                    d = width(l);
                }
                Layers::Mlp(ls)
            }
        };
        Ok(Model {
            spec: spec.clone(),
            target,
            num_classes,
            params,
            embeddings,
            layers,
            all_relations: (0..g.relations().len() as u32).map(RelationId).collect(),
            dtype,
            device: device.clone(),
        })
    }

    /// Which node types get a learnable embedding table: the featureless ones
    /// the model reads (the MLP reads only the target type).
    pub fn learnable_types(kind: ModelKind, g: &HetGraph) -> Vec<bool> {
        let target = g.target().index();
        g.node_types()
            .iter()
            .enumerate()
            .map(|(t, nt)| nt.features.is_none() && (kind != ModelKind::Mlp || t == target))
            .collect()
    }

    /// The spec the model was built from.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Whether its last layer writes the outputs (logits, a value or the
    /// embeddings a decoder reads) rather than a classifier after it (HGT's head).
    pub fn last_layer_is_output(&self) -> bool {
        !matches!(&self.layers, Layers::Relational(_, Some(_)))
    }

    /// Whether the model reads neighborhoods (the MLP does not).
    pub fn uses_neighbors(&self) -> bool {
        matches!(self.layers, Layers::Relational(..))
    }

    /// Number of classes predicted.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// Computation dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Device of the dense parameters.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Logits `[seeds, classes]` for a mini-batch. `inputs[t]` holds the input
    /// rows of `mb.blocks[0].src[t]`; `dropout` is `Some` in training.
    pub fn forward(
        &self,
        g: &HetGraph,
        mb: &MiniBatch,
        inputs: PerType,
        dropout: Option<DropoutKey>,
    ) -> Result<Tensor> {
        Ok(self.forward_with_embeddings(g, mb, inputs, dropout)?.0)
    }

    /// Like [`Model::forward`], also returning the seeds' final-layer input
    /// embeddings (`[seeds, width]`: what the last layer reads for each seed).
    pub fn forward_with_embeddings(
        &self,
        g: &HetGraph,
        mb: &MiniBatch,
        inputs: PerType,
        dropout: Option<DropoutKey>,
    ) -> Result<(Tensor, Tensor)> {
        let n_seeds = mb.seeds.len();
        let t = self.target.index();
        match &self.layers {
            Layers::Mlp(ls) => {
                let mut h = inputs[t]
                    .as_ref()
                    .ok_or_else(|| ModelError::Config("no input rows for the target type".into()))?
                    .narrow(0, 0, n_seeds)?;
                let mut last_in = h.clone();
                for (l, (w, b)) in ls.iter().enumerate() {
                    last_in = h.clone();
                    h = crate::ops::add_bias(&crate::ops::matmul(&h, w)?, b)?;
                    if l + 1 < ls.len() {
                        h = self.dropout(h, true, dropout, l, t, &mb.seeds)?;
                    }
                }
                Ok((h, last_in))
            }
            Layers::Relational(ls, _) => {
                if mb.blocks.len() != ls.len() {
                    return Err(ModelError::Config(format!(
                        "{} sampled blocks for a {}-layer model: give one fanout per layer",
                        mb.blocks.len(),
                        ls.len()
                    )));
                }
                self.relational_from(g, mb, 0, inputs, None, dropout)
            }
        }
    }

    /// [`Model::forward_with_embeddings`] in evaluation mode of a mini-batch
    /// holding only the blocks of the last `mb.blocks.len()` layers
    /// ([`graphs::Sampler::top_hops`]), from `h`, the rows the layers before
    /// them computed for its first block's sources (kept from a layer-wise
    /// pass over every node, say).
    pub fn forward_top(
        &self,
        g: &HetGraph,
        mb: &MiniBatch,
        h: PerType,
    ) -> Result<(Tensor, Tensor)> {
        let (ls, _) = self.relational()?;
        if mb.blocks.is_empty() {
            return Err(ModelError::Config("a mini-batch without blocks".into()));
        }
        let first = ls.len().checked_sub(mb.blocks.len()).ok_or_else(|| {
            ModelError::Config(format!(
                "{} blocks for a {}-layer model",
                mb.blocks.len(),
                ls.len()
            ))
        })?;
        self.relational_from(g, mb, first, h, None, None)
    }

    /// Relational layers `first..` from `h`, the rows of the sources of
    /// `mb`'s block of layer `first` (`mb` holds the blocks of layers
    /// `first..` or of every layer), then the head: the logits and the
    /// seeds' last-layer inputs (`last_in`, when the layer before `first`
    /// was the last).
    fn relational_from(
        &self,
        g: &HetGraph,
        mb: &MiniBatch,
        first: usize,
        mut h: PerType,
        mut last_in: Option<Tensor>,
        dropout: Option<DropoutKey>,
    ) -> Result<(Tensor, Tensor)> {
        let Layers::Relational(ls, head) = &self.layers else {
            return Err(ModelError::Config("not a relational model".into()));
        };
        let (n_seeds, t) = (mb.seeds.len(), self.target.index());
        // The blocks of layers `first..`, wherever `mb`'s start.
        let skip = (first + mb.blocks.len())
            .checked_sub(ls.len())
            .ok_or_else(|| ModelError::Config("fewer blocks than layers to run".into()))?;
        let blocks = mb.blocks.iter().skip(skip);
        for ((l, layer), block) in ls.iter().enumerate().skip(first).zip(blocks) {
            if l + 1 == ls.len() {
                last_in = h[t].as_ref().map(|x| x.narrow(0, 0, n_seeds)).transpose()?;
            }
            let partials = layer.relation_partials(g, block, &self.all_relations, &h)?;
            let out = layer.cross_relation(block, &h, partials)?;
            h = self.activate(l, block, out, dropout)?;
        }
        let out = h[t]
            .take()
            .ok_or_else(|| ModelError::Config("the last block has no target rows".into()))?;
        match head {
            Some((w, b)) => Ok((crate::ops::add_bias(&crate::ops::matmul(&out, w)?, b)?, out)),
            None => {
                let emb = last_in.ok_or_else(|| {
                    ModelError::Config("the last block has no target inputs".into())
                })?;
                Ok((out, emb))
            }
        }
    }

    /// [`Model::forward_with_embeddings`] for inference over the graph's
    /// stored rows, without gathering them first where the first layer can
    /// read them in place (R-GCN, f32 on the CPU, dense features or learnt
    /// rows): only the first block's destinations' own rows are copied, and
    /// the relations' means are taken from the feature matrices and tables
    /// where they lie. A 100-node request at fanouts 10,10 reads ~55,000
    /// source rows; copying them out cost as much as the two layers. The
    /// same bits as gathering every input row.
    pub fn forward_stored(&self, g: &HetGraph, mb: &MiniBatch) -> Result<(Tensor, Tensor)> {
        if let Some(out) = self.forward_in_place(g, mb)? {
            return Ok(out);
        }
        let first = mb
            .blocks
            .first()
            .ok_or_else(|| ModelError::Config("a mini-batch without blocks".into()))?;
        let inputs = self.gather_inputs(g, &first.src)?;
        self.forward_with_embeddings(g, mb, inputs, None)
    }

    /// [`Model::forward_stored`]'s first layer in place, then the others;
    /// `None` where it cannot be.
    fn forward_in_place(&self, g: &HetGraph, mb: &MiniBatch) -> Result<Option<(Tensor, Tensor)>> {
        let Layers::Relational(ls, _) = &self.layers else {
            return Ok(None);
        };
        let Some(block) = mb.blocks.first() else {
            return Ok(None);
        };
        if mb.blocks.len() != ls.len() {
            return Ok(None);
        }
        let Some(rows) = self.stored_rows(g, block) else {
            return Ok(None);
        };
        let Some((own, h)) = self.layer_in_place(g, 0, block, &rows)? else {
            return Ok(None);
        };
        let t = self.target.index();
        let last_in = match ls.len() {
            1 => own[t]
                .as_ref()
                .map(|x| x.narrow(0, 0, mb.seeds.len()))
                .transpose()?,
            _ => None,
        };
        self.relational_from(g, mb, 1, h, last_in, None).map(Some)
    }

    /// Where the first layer reads each type's input rows of `block` in
    /// place, as `gather_inputs` would copy them: its features or its learnt
    /// table (`None` for a type without sources in the block or whose rows
    /// the model does not read); `None` where some type's cannot be read in
    /// place (features scanned for nonzeros, or without a flat matrix).
    pub fn stored_rows<'a>(
        &'a self,
        g: &'a HetGraph,
        block: &graphs::Block,
    ) -> Option<Vec<Option<RowsInPlace<'a>>>> {
        self.stored_rows_with(g, block, |t| {
            self.embeddings[t].as_ref().map(|e| &e.data[..])
        })
    }

    /// [`Model::stored_rows`] with type `t`'s learnt rows from `learnt(t)`
    /// (every node's, in id order): a model whose tables are read from a
    /// checkpoint's mapped file rather than held.
    pub fn stored_rows_with<'a>(
        &'a self,
        g: &'a HetGraph,
        block: &graphs::Block,
        learnt: impl Fn(usize) -> Option<&'a [f32]>,
    ) -> Option<Vec<Option<RowsInPlace<'a>>>> {
        let fg = self.feature_gather();
        let mut rows = Vec::with_capacity(block.src.len());
        for (t, ids) in block.src.iter().enumerate() {
            if ids.is_empty() || !fg.wants(t) {
                rows.push(None);
                continue;
            }
            let count = g.node_types()[t].count as usize;
            let r = match &g.node_types()[t].features {
                Some(f) if fg.scan && f.nonzeros().is_some() => return None,
                Some(f) => {
                    let (values, slot) = f.held();
                    let fits = match slot {
                        None => values.len() == count * f.dim(),
                        Some(s) => s.len() == count && values.len().is_multiple_of(f.dim().max(1)),
                    };
                    if !fits || f.dim() == 0 {
                        return None;
                    }
                    RowsInPlace {
                        values,
                        width: f.dim(),
                        slot,
                    }
                }
                None => {
                    let dim = self.spec.embed_dim;
                    let values = learnt(t)?;
                    if values.len() != count * dim {
                        return None;
                    }
                    RowsInPlace::by_id(values, dim)
                }
            };
            rows.push(Some(r));
        }
        Some(rows)
    }

    /// Relational layer `l` on `block` in evaluation mode, its sources' rows
    /// read where they lie (`rows[t]`: type `t`'s rows, node `v`'s at `v` or
    /// at its [`RowsInPlace::slot`] place; see [`Model::stored_rows`]): the
    /// destinations' own input rows (copied, for the self-loop) and the
    /// layer's activated outputs, the same bits as gathering every source row
    /// first. `None` where the layer cannot (not R-GCN, not f32 on the CPU,
    /// a source without a row held): the caller gathers.
    pub fn layer_in_place(
        &self,
        g: &HetGraph,
        l: usize,
        block: &graphs::Block,
        rows: &[Option<RowsInPlace<'_>>],
    ) -> Result<Option<(PerType, PerType)>> {
        let (ls, _) = self.relational()?;
        let layer = ls.get(l).ok_or_else(|| {
            ModelError::Config(format!("no layer {l} in a {}-layer model", ls.len()))
        })?;
        // Rows this wide may be read as mostly-zero by the gathering path
        // (ops::sparse), which then orders its sums otherwise: gather those.
        let wide = rows
            .iter()
            .flatten()
            .any(|r| r.width >= crate::ops::sparse::MIN_WIDTH);
        if self.dtype != DType::F32 || !self.device.is_cpu() || wide {
            return Ok(None);
        }
        // Each type's rows and the places of the block's sources among them.
        let mut places = Vec::with_capacity(block.src.len());
        for (t, ids) in block.src.iter().enumerate() {
            places.push(match rows.get(t).copied().flatten() {
                // A node without a row held reads as zeros when gathered: the caller gathers.
                Some(r) => match r.places(ids) {
                    Ok(at) => Some((r, at)),
                    Err(_) => return Ok(None),
                },
                None => None,
            });
        }
        let values: Vec<Option<crate::layer::PlacedRows<'_>>> = places
            .iter()
            .map(|p| p.as_ref().map(|(r, at)| (r.values, r.width, &at[..])))
            .collect();
        let Some(partials) = layer.partials_in_place(g, block, &self.all_relations, &values)?
        else {
            return Ok(None);
        };
        // The destinations' own rows (the first of each type's sources), for the self-loop.
        let mut own: PerType = Vec::with_capacity(block.src.len());
        for (p, dst) in places.iter().zip(&block.dst) {
            let (x, width, at) = match p {
                Some((r, at)) if !dst.is_empty() && !at.is_empty() => {
                    (r.values, r.width, &at[..dst.len().min(at.len())])
                }
                _ => {
                    own.push(None);
                    continue;
                }
            };
            let buf = crate::ops::copy_rows(x, width, at)
                .map_err(|v| ModelError::Config(format!("node {v} has no stored row")))?;
            own.push(Some(Tensor::from_vec(
                buf,
                (at.len(), width),
                &self.device,
            )?));
        }
        let out = layer.cross_relation(block, &own, partials)?;
        let out = self.activate(l, block, out, None)?;
        Ok(Some((own, out)))
    }

    /// The last layer's rows of every seed of every type (`mb`'s last block's
    /// destinations, in their order): a link predictor's embeddings.
    pub fn forward_nodes(
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
        for (l, (layer, block)) in ls.iter().zip(&mb.blocks).enumerate() {
            let partials = layer.relation_partials(g, block, &self.all_relations, &h)?;
            let out = layer.cross_relation(block, &h, partials)?;
            h = self.activate(l, block, out, dropout)?;
        }
        Ok(h)
    }

    /// Scores of edges of target relation `r` (index into the link spec's
    /// relations) whose endpoints' rows are `src` and `dst`.
    pub fn score_edges(&self, r: usize, src: &Tensor, dst: &Tensor) -> Result<Tensor> {
        let (src, dst) = (self.decoder_rows(src)?, self.decoder_rows(dst)?);
        crate::link::score(&src, &dst, self.decoder_diagonal(r)?.as_ref())
    }

    /// Edge outputs `[n, classes or 1]` from the endpoints' last-layer rows
    /// `src` and `dst` (`[n, hidden]` each, or whole rows of a mixed model).
    pub fn decode_edges(&self, src: &Tensor, dst: &Tensor) -> Result<Tensor> {
        let (src, dst) = (self.decoder_rows(src)?, self.decoder_rows(dst)?);
        self.spec
            .edge
            .as_ref()
            .ok_or_else(|| ModelError::Config("the model was not built for an edge task".into()))?
            .decode(&self.params, &src, &dst)
    }

    /// What relation `r`'s decoder dots a destination row with, for sources
    /// whose rows are `src`: the score of an edge is `query · dst`.
    pub fn link_query(&self, r: usize, src: &Tensor) -> Result<Tensor> {
        crate::link::query(&self.decoder_rows(src)?, self.decoder_diagonal(r)?.as_ref())
    }

    /// The columns of last-layer rows `x` a link or edge decoder reads: all
    /// of them, or a mixed model's last `hidden` ([`ModelSpec::is_mixed`]).
    pub fn decoder_rows(&self, x: &Tensor) -> Result<Tensor> {
        let width = x.dim(candle_core::D::Minus1)?;
        match (self.spec.is_mixed(), width == self.num_classes) {
            (true, true) => Ok(x.narrow(
                candle_core::D::Minus1,
                width - self.spec.hidden,
                self.spec.hidden,
            )?),
            _ => Ok(x.clone()),
        }
    }

    /// Relation `r`'s DistMult diagonal (`None` for the dot decoder).
    fn decoder_diagonal(&self, r: usize) -> Result<Option<Tensor>> {
        let link = self.spec.link.as_ref().ok_or_else(|| {
            ModelError::Config("the model was not built for link prediction".into())
        })?;
        let name = link
            .relations
            .get(r)
            .ok_or_else(|| ModelError::Config(format!("no target relation {r}")))?;
        Ok(match link.decoder {
            crate::link::Decoder::Dot => None,
            crate::link::Decoder::Distmult => Some(
                self.params
                    .get(&crate::link::diagonal_name(name))
                    .ok_or_else(|| ModelError::Config(format!("no decoder diagonal for {name}")))?
                    .as_tensor()
                    .clone(),
            ),
        })
    }

    /// After layer `l`'s cross-relation step: R-GCN and R-GAT apply ReLU and
    /// dropout between layers; HGT has its own nonlinearity and feeds the
    /// classifier, so it gets dropout after every layer.
    pub(crate) fn activate(
        &self,
        l: usize,
        block: &graphs::Block,
        mut out: PerType,
        dropout: Option<DropoutKey>,
    ) -> Result<PerType> {
        let Layers::Relational(ls, _) = &self.layers else {
            return Ok(out);
        };
        let relu = ls[l].activation() == Activation::ReluDropoutBetween;
        if l + 1 < ls.len() || !relu {
            for (ty, o) in out.iter_mut().enumerate() {
                if let Some(x) = o.take() {
                    *o = Some(self.dropout(x, relu, dropout, l, ty, &block.dst[ty])?);
                }
            }
        }
        Ok(out)
    }

    /// Relational layer `l` on `block` from its sources' rows `h_src`: the
    /// destinations' rows before any activation (full-graph training
    /// activates them itself, applying dropout on the receiving side).
    pub fn layer_forward(
        &self,
        g: &HetGraph,
        l: usize,
        block: &graphs::Block,
        h_src: &PerType,
    ) -> Result<PerType> {
        let (ls, _) = self.relational()?;
        let layer = ls.get(l).ok_or_else(|| {
            ModelError::Config(format!("no layer {l} in a {}-layer model", ls.len()))
        })?;
        let partials = layer.relation_partials(g, block, &self.all_relations, h_src)?;
        layer.cross_relation(block, h_src, partials)
    }

    /// Whether every layer but the last is followed by ReLU and dropout and
    /// the last feeds the loss directly (R-GCN, R-GAT; not HGT, which has a
    /// classifier of its own, nor the MLP).
    pub fn relu_between_layers(&self) -> bool {
        match &self.layers {
            Layers::Relational(ls, head) => {
                head.is_none()
                    && ls
                        .iter()
                        .all(|l| l.activation() == Activation::ReluDropoutBetween)
            }
            Layers::Mlp(_) => false,
        }
    }

    /// Dropout of training step `key` on rows `x` of nodes `ids` of type
    /// `ntype` feeding layer `layer + 1`: the masks [`Model::forward`] applies
    /// after layer `layer` (without its ReLU); `x` itself without `key`.
    pub fn dropout_rows(
        &self,
        x: Tensor,
        key: Option<DropoutKey>,
        layer: usize,
        ntype: usize,
        ids: &[u32],
    ) -> Result<Tensor> {
        self.dropout(x, false, key, layer, ntype, ids)
    }

    /// The relational layers and head (an error for the MLP).
    pub(crate) fn relational(&self) -> Result<(&RelationalLayers, &Option<Linear>)> {
        match &self.layers {
            Layers::Relational(ls, head) => Ok((ls, head)),
            Layers::Mlp(_) => Err(ModelError::Config("the MLP reads no relations: relation-aggregation-first training needs rgcn, rgat or hgt".into())),
        }
    }

    /// Dropout on rows that belong to nodes `ids`: each row's mask is keyed by
    /// its node id, so a node gets the same mask whichever batch, trainer or
    /// partition computes it (data-parallel and RAF equal single-process).
    /// `relu(x)` (when `relu`) then dropout keyed by (seed, epoch, step,
    /// layer, type) and each row's node id; in evaluation only the ReLU.
    #[allow(clippy::too_many_arguments)]
    fn dropout(
        &self,
        x: Tensor,
        relu: bool,
        key: Option<DropoutKey>,
        layer: usize,
        ntype: usize,
        ids: &[u32],
    ) -> Result<Tensor> {
        let (Some(k), true) = (key, self.spec.dropout > 0.0) else {
            return Ok(if relu { x.relu()? } else { x });
        };
        let k = graphs::rng::key(&[
            self.spec.seed,
            0xD809,
            k.epoch,
            k.step,
            layer as u64,
            ntype as u64,
        ]);
        let rows = x.dim(0)?;
        if rows != ids.len() {
            return Err(ModelError::Config(format!(
                "dropout over {rows} rows for {} nodes",
                ids.len()
            )));
        }
        Ok(crate::ops::dropout(&x, relu, k, self.spec.dropout, ids)?)
    }

    /// What is needed to gather feature rows without the model (for a
    /// pipeline stage running ahead of training on another thread).
    pub fn feature_gather(&self) -> FeatureGather {
        let n = self.embeddings.len();
        let wanted = (0..n)
            .map(|t| self.uses_neighbors() || t == self.target.index())
            .collect();
        FeatureGather {
            wanted,
            dtype: self.dtype,
            device: self.device.clone(),
            scan: true,
            parallel: false,
        }
    }

    /// The input rows for a mini-batch: features of typed nodes (copied from the
    /// graph) and learnable rows (as fresh tensors whose gradients feed the
    /// sparse Adam). Types the model does not read get `None`.
    pub fn gather_inputs(&self, g: &HetGraph, nodes: &[Vec<u32>]) -> Result<PerType> {
        let mut inputs = self.feature_gather().in_parallel().gather(g, nodes)?;
        self.gather_embeddings(nodes, &mut inputs)?;
        Ok(inputs)
    }

    /// Fills the learnable-embedding rows of `inputs` (read now: they change every step).
    pub fn gather_embeddings(&self, nodes: &[Vec<u32>], inputs: &mut PerType) -> Result<()> {
        let fg = self.feature_gather();
        for (t, ids) in nodes.iter().enumerate() {
            if ids.is_empty() || !fg.wanted[t] || inputs[t].is_some() {
                continue;
            }
            let Some(e) = &self.embeddings[t] else {
                return Err(ModelError::Config(format!(
                    "node type {t} has neither features nor an embedding table"
                )));
            };
            inputs[t] = Some(e.gather_var(ids, self.dtype, &self.device)?);
        }
        Ok(())
    }
}

/// Rows of a gather before [`FeatureGather::in_parallel`] copies them on rayon's pool.
pub const PARALLEL_ROWS: usize = 4096;

/// Gathers the immutable (feature) input rows of a mini-batch.
#[derive(Clone, Debug)]
pub struct FeatureGather {
    wanted: Vec<bool>,
    dtype: DType,
    device: Device,
    /// Find mostly-zero rows' non-zeros as they are gathered, for the sparse products (CPU models).
    scan: bool,
    /// Copy large gathers on rayon's pool ([`FeatureGather::in_parallel`]).
    parallel: bool,
}

impl FeatureGather {
    /// Feature rows of `nodes[t]` for every wanted type with features; `None` elsewhere.
    pub fn gather(&self, g: &HetGraph, nodes: &[Vec<u32>]) -> Result<PerType> {
        nodes
            .iter()
            .enumerate()
            .map(|(t, ids)| self.gather_type(g, t, ids))
            .collect()
    }

    /// Feature rows `ids` of type `t` (`None` if the model does not read the
    /// type, it has no features, or `ids` is empty).
    pub fn gather_type(&self, g: &HetGraph, t: usize, ids: &[u32]) -> Result<Option<Tensor>> {
        let f = match &g.node_types()[t].features {
            Some(f) if !ids.is_empty() && self.wants(t) => f,
            _ => return Ok(None),
        };
        let dim = f.dim();
        if self.scan && self.dtype == DType::F32 && self.device.is_cpu() {
            if let Some(nz) = f.nonzeros() {
                // Mostly zeros: the rows' non-zeros come from the table's, not from a scan of the dense rows.
                let picked = nz.pick(ids);
                let x = Tensor::from_vec(picked.to_dense(), (ids.len(), dim), &self.device)?;
                crate::ops::sparse::remember(
                    &x,
                    std::sync::Arc::new(crate::ops::sparse::SparseRows::from_rows(picked)),
                )?;
                return Ok(Some(x));
            }
        }
        let mut buf = Vec::with_capacity(ids.len() * dim);
        if self.parallel && ids.len() >= PARALLEL_ROWS && dim > 0 {
            let at = |k: usize| ids.get(k).map(|&i| f.row(i as usize));
            buf.spare_capacity_mut()[..ids.len() * dim]
                .par_chunks_mut(dim)
                .enumerate()
                .with_min_len(512)
                .for_each(|(k, out)| {
                    if let Some(a) = at(k + crate::prefetch::AHEAD) {
                        crate::prefetch::prefetch(a);
                    }
                    for (o, &x) in out.iter_mut().zip(f.row(ids[k] as usize)) {
                        o.write(x);
                    }
                });
            // SAFETY: every row of `ids.len() * dim` elements was written above (rows are `dim` long).
            unsafe { buf.set_len(ids.len() * dim) };
        } else {
            for (k, &i) in ids.iter().enumerate() {
                if let Some(&a) = ids.get(k + crate::prefetch::AHEAD) {
                    crate::prefetch::prefetch(f.row(a as usize));
                }
                buf.extend_from_slice(f.row(i as usize));
            }
        }
        let x = Tensor::from_vec(buf, (ids.len(), dim), &self.device)?.to_dtype(self.dtype)?;
        // Mostly-zero rows are scanned for their non-zeros here, on the
        // prefetch thread, rather than at the first product on the training thread.
        if self.scan {
            crate::ops::sparse::rows_of(&x)?;
        }
        Ok(Some(x))
    }

    /// Large gathers copied on rayon's pool: for a caller that waits for
    /// them (inference, a served request), not for prefetch threads that
    /// run beside training's arithmetic.
    pub fn in_parallel(self) -> FeatureGather {
        FeatureGather {
            parallel: true,
            ..self
        }
    }

    /// The same gather into host memory, for threads that must not touch the
    /// model's device (the rows go to the device on the thread that trains).
    pub fn on_host(&self) -> FeatureGather {
        // The rows are bound for the model's device: no sparse product reads them.
        FeatureGather {
            device: Device::Cpu,
            scan: false,
            parallel: false,
            ..self.clone()
        }
    }

    /// Whether the model reads type `t`'s input rows.
    pub fn wants(&self, t: usize) -> bool {
        self.wanted.get(t).copied().unwrap_or(false)
    }

    /// The element type inputs are converted to.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device inputs are put on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("spec", &self.spec)
            .field("parameters", &self.params.numel())
            .finish()
    }
}
