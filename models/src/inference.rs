//! Exact offline inference: a relational model applied layer by layer to
//! every node of every type with its full in-neighbourhood (no sampling), as
//! DGL's offline inference does. One layer's rows of all nodes are kept in
//! memory (nodes x width floats per type), the next layer's are computed in
//! chunks of destinations, so memory is two layers' rows plus one chunk's
//! block, whatever the graph's degrees.

use candle_core::{DType, Tensor};
use graphs::{Block, BlockRelation, HetGraph, NodeTypeId};

use crate::error::{ModelError, Result};
use crate::model::{Layers, Model, RowsInPlace};
use crate::self_loop::PerType;

/// Rows of every node of one type: `width` floats per node, in id order.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeRows {
    /// Floats per node.
    pub width: usize,
    /// `count * width` floats.
    pub data: Vec<f32>,
}

/// The columns of every node's rows (as [`embed_all`] returns them) that a
/// link or edge decoder reads: all of them, or a mixed model's last
/// `hidden` ([`crate::ModelSpec::is_mixed`]).
pub fn decoder_type_rows(model: &Model, rows: Vec<Option<TypeRows>>) -> Vec<Option<TypeRows>> {
    let (spec, full) = (model.spec(), model.num_classes());
    if !spec.is_mixed() {
        return rows;
    }
    let h = spec.hidden;
    rows.into_iter()
        .map(|r| {
            r.map(|r| match r.width == full && full > h {
                true => TypeRows {
                    width: h,
                    data: r
                        .data
                        .chunks_exact(full)
                        .flat_map(|row| &row[full - h..])
                        .copied()
                        .collect(),
                },
                false => r,
            })
        })
        .collect()
}

/// How many relational layers [`embed_all`] runs: the rows it returns are
/// what the classifier reads, as `predict --embeddings` writes them (the
/// last layer's input for R-GCN and R-GAT, whose last layer classifies; every
/// layer's for HGT, which has a classifier of its own).
pub fn embedding_layers(model: &Model) -> Result<usize> {
    match &model.layers {
        // A link predictor's last layer writes the embeddings the decoder scores.
        Layers::Relational(ls, head) => Ok(
            if head.is_some() || model.spec().link.is_some() || model.spec().edge.is_some() {
                ls.len()
            } else {
                ls.len() - 1
            },
        ),
        Layers::Mlp(_) => Err(ModelError::Config(
            "embed needs a relational model (rgcn, rgat or hgt): the MLP reads no neighbourhood"
                .into(),
        )),
    }
}

/// How many relational layers compute the target nodes' logits of a node
/// model: every layer (the last one classifies, or its rows feed the
/// classifier of [`head_rows`]). Refuses a link or edge predictor, which has
/// no node outputs, and an MLP, which reads no neighbourhood.
pub fn classifier_layers(model: &Model) -> Result<usize> {
    if !model.spec().predicts_nodes() {
        return Err(ModelError::Config(
            "a link or edge predictor has no node outputs to predict (embed writes its embeddings)"
                .into(),
        ));
    }
    embedding_layers(model)?;
    let (ls, _) = model.relational()?;
    Ok(ls.len())
}

/// The logits of `rows` (the last relational layer's rows of target nodes,
/// `width` floats each) through the model's classifier, for a model that
/// has one (HGT); `None` for one whose last layer classifies.
pub fn head_rows(model: &Model, rows: &TypeRows) -> Result<Option<TypeRows>> {
    let (_, head) = model.relational()?;
    let Some((w, b)) = head else {
        return Ok(None);
    };
    let n = rows.data.len().checked_div(rows.width).unwrap_or(0);
    let x = Tensor::from_vec(rows.data.clone(), (n, rows.width), model.device())?
        .to_dtype(model.dtype())?;
    let y = crate::ops::add_bias(&crate::ops::matmul(&x, w)?, b)?;
    let (width, data) = host_rows(&y)?;
    Ok(Some(TypeRows { width, data }))
}

/// Every node's embedding (see [`embedding_layers`]), per type (`None`: a
/// type the model reads no rows of), computing `chunk` destinations at a
/// time; `progress(layer, done, total)` after each chunk.
pub fn embed_all(
    model: &Model,
    g: &HetGraph,
    chunk: usize,
    progress: impl FnMut(usize, u64, u64),
) -> Result<Vec<Option<TypeRows>>> {
    let layers = embedding_layers(model)?;
    let mut blocks = FullBlocks::new(g);
    let full =
        |l: usize, t: NodeTypeId, dst: &[u32]| Ok::<_, ModelError>(blocks.block(g, l, t, dst));
    if let Some(rows) = layerwise(model, g, layers, chunk, full, progress)? {
        return Ok(rows);
    }
    // No layer runs (a one-layer R-GCN): the inputs themselves.
    let all: Vec<Vec<u32>> = g
        .node_types()
        .iter()
        .map(|t| (0..t.count).collect())
        .collect();
    let h = model.gather_inputs(g, &all)?;
    h.into_iter()
        .map(|x| {
            x.map(|x| -> Result<TypeRows> {
                let (width, data) = host_rows(&x)?;
                Ok(TypeRows { width, data })
            })
            .transpose()
        })
        .collect()
}

/// The rows relational layers `0..layers` compute for every node of every
/// type, layer by layer, each layer's block of `chunk` destinations of one
/// type from `block_of(layer, type, destinations)`: every in-neighbour
/// ([`embed_all`]), or draws keyed by node, which makes a node's rows
/// those any mini-batch holding it computes. `None` for no layers.
/// An error of `block_of` is returned as it is.
pub fn layerwise<E: From<ModelError>>(
    model: &Model,
    g: &HetGraph,
    layers: usize,
    chunk: usize,
    mut block_of: impl FnMut(usize, NodeTypeId, &[u32]) -> std::result::Result<Block, E>,
    mut progress: impl FnMut(usize, u64, u64),
) -> std::result::Result<Option<Vec<Option<TypeRows>>>, E> {
    let (ls, _) = model.relational()?;
    let types = g.node_types().len();
    let chunk = chunk.max(1);
    let total: u64 = g.node_types().iter().map(|t| u64::from(t.count)).sum();
    // Layer 0's input rows are gathered per block (features or learnable rows).
    let mut current: Option<Vec<Option<TypeRows>>> = None;
    for l in 0..layers.min(ls.len()) {
        let mut next: Vec<Option<TypeRows>> = vec![None; types];
        let mut done = 0u64;
        for (t, out) in next.iter_mut().enumerate() {
            let count = g.node_types()[t].count;
            let ids: Vec<u32> = (0..count).collect();
            for dst in ids.chunks(chunk) {
                let block = block_of(l, NodeTypeId(t as u32), dst)?;
                // Read where the rows lie (the stored inputs, then the
                // previous layer's rows of every node), else gathered.
                let stored = match &current {
                    None => model.stored_rows(g, &block),
                    Some(rows) => Some(
                        rows.iter()
                            .map(|r| r.as_ref().map(|r| RowsInPlace::by_id(&r.data, r.width)))
                            .collect(),
                    ),
                };
                let in_place = match stored {
                    Some(stored) => model.layer_in_place(g, l, &block, &stored)?,
                    None => None,
                };
                let x = match in_place {
                    Some((_, mut h)) => h[t].take(),
                    None => {
                        let h = match &current {
                            None => model.gather_inputs(g, &block.src)?,
                            Some(rows) => rows_of(rows, &block.src, model)?,
                        };
                        layer_chunk(model, g, l, &block, &h, NodeTypeId(t as u32))?
                    }
                };
                if let Some(x) = x {
                    let (width, values) = host_rows(&x)?;
                    let slot = out.get_or_insert_with(|| TypeRows {
                        width,
                        data: Vec::with_capacity(count as usize * width),
                    });
                    slot.data.extend_from_slice(&values);
                }
                done += dst.len() as u64;
                progress(l, done, total);
            }
        }
        current = Some(next);
    }
    Ok(current)
}

/// Relational layer `l`'s rows for `block`'s destinations of type `t` (a
/// block of [`full_block`]), from `h`, the rows of the block's sources:
/// `None` where the layer writes no rows of `t`. One chunk of
/// [`embed_all`], for callers that hold a layer's rows elsewhere (across a
/// cluster).
pub fn layer_chunk(
    model: &Model,
    g: &HetGraph,
    l: usize,
    block: &Block,
    h: &PerType,
    t: NodeTypeId,
) -> Result<Option<Tensor>> {
    let (ls, _) = model.relational()?;
    let layer = ls
        .get(l)
        .ok_or_else(|| ModelError::Config(format!("layer {l} of a {}-layer model", ls.len())))?;
    let partials = layer.relation_partials(g, block, &model.all_relations, h)?;
    let out = layer.cross_relation(block, h, partials)?;
    let mut out = model.activate(l, block, out, None)?;
    Ok(out[t.index()].take())
}

/// A `[n, width]` tensor's rows as float32 on the host: `(width, values)`.
pub fn host_rows(x: &Tensor) -> Result<(usize, Vec<f32>)> {
    let (_, width) = x.dims2()?;
    Ok((
        width,
        x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
    ))
}

/// Logits `[dst, classes]` of target nodes `dst` by exact inference, from
/// the rows [`embed_all`] returned: the last layer over every in-neighbour
/// (R-GCN, R-GAT), the classifier on the rows (HGT), or the rows themselves
/// (a mixed model's, [`crate::ModelSpec::is_mixed`]: its whole last layer).
pub fn classify_exact(
    model: &Model,
    g: &HetGraph,
    rows: &[Option<TypeRows>],
    dst: &[u32],
) -> Result<Tensor> {
    if !model.spec().predicts_nodes() {
        return Err(ModelError::Config(match model.spec().link.is_some() {
            true => "a link predictor has no classes to predict".into(),
            false => "an edge predictor has no node classes to predict".into(),
        }));
    }
    let (ls, head) = model.relational()?;
    let t = g.target();
    let take = |mut h: PerType| {
        h[t.index()]
            .take()
            .ok_or_else(|| ModelError::Config("no rows of the target type".into()))
    };
    let mut nodes = vec![Vec::new(); g.node_types().len()];
    nodes[t.index()] = dst.to_vec();
    // Node tasks beside a decoder: the rows are the last layer's (the
    // decoder reads them too), whose first columns are the node outputs.
    if model.spec().is_mixed() {
        return take(rows_of(rows, &nodes, model)?);
    }
    match head {
        Some((w, b)) => {
            let x = take(rows_of(rows, &nodes, model)?)?;
            Ok(crate::ops::add_bias(&crate::ops::matmul(&x, w)?, b)?)
        }
        None => {
            let l = ls.len() - 1;
            let block = full_block(g, l, t, dst);
            let h = rows_of(rows, &block.src, model)?;
            let partials = ls[l].relation_partials(g, &block, &model.all_relations, &h)?;
            let out = ls[l].cross_relation(&block, &h, partials)?;
            take(model.activate(l, &block, out, None)?)
        }
    }
}

/// The rows the first `blocks.len()` relational layers compute for the last
/// block's destinations, from `inputs` (rows of `blocks[0]`'s sources), in
/// evaluation mode: with blocks of every in-neighbour, what [`embed_all`]
/// computes for those nodes when `blocks.len()` is [`embedding_layers`].
pub fn forward_layers(
    model: &Model,
    g: &HetGraph,
    blocks: &[Block],
    inputs: PerType,
) -> Result<PerType> {
    let (ls, _) = model.relational()?;
    if blocks.len() > ls.len() {
        return Err(ModelError::Config(format!(
            "{} blocks for a {}-layer model",
            blocks.len(),
            ls.len()
        )));
    }
    let mut h = inputs;
    for (l, (layer, block)) in ls.iter().zip(blocks).enumerate() {
        let partials = layer.relation_partials(g, block, &model.all_relations, &h)?;
        let out = layer.cross_relation(block, &h, partials)?;
        h = model.activate(l, block, out, None)?;
    }
    Ok(h)
}

/// The block of layer `layer` for destinations `dst` of type `t` with every
/// in-neighbour of every relation into `t`, sources in first-seen order after
/// the destinations themselves (as the sampler orders them).
pub fn full_block(g: &HetGraph, layer: usize, t: NodeTypeId, dst: &[u32]) -> Block {
    let mut slots: Vec<std::collections::HashMap<u32, u32>> =
        vec![std::collections::HashMap::new(); g.node_types().len()];
    build_full_block(g, layer, t, dst, &mut slots)
}

/// Builds [`full_block`]s one after another (every chunk of a layer), with
/// one node-to-slot table per type sized to its nodes and reused: a hashed
/// map per block cost a seventh of a single-process `embed`.
pub struct FullBlocks {
    slots: Vec<Vec<u32>>,
}

impl FullBlocks {
    /// Tables for the node types of `g`.
    pub fn new(g: &HetGraph) -> FullBlocks {
        FullBlocks {
            slots: g
                .node_types()
                .iter()
                .map(|nt| vec![UNSEEN; nt.count as usize])
                .collect(),
        }
    }

    /// [`full_block`] of `dst`, nodes of `g` (the graph the tables were sized for).
    pub fn block(&mut self, g: &HetGraph, layer: usize, t: NodeTypeId, dst: &[u32]) -> Block {
        let block = build_full_block(g, layer, t, dst, &mut self.slots);
        for (slots, ids) in self.slots.iter_mut().zip(&block.src) {
            for &v in ids {
                slots[v as usize] = UNSEEN;
            }
        }
        block
    }
}

const UNSEEN: u32 = u32::MAX;

/// Each node's slot among a block's sources: a hashed map, or a table over
/// every node of the type.
trait Slots {
    fn get(&self, v: u32) -> Option<u32>;
    fn set(&mut self, v: u32, slot: u32);
}

impl Slots for std::collections::HashMap<u32, u32> {
    fn get(&self, v: u32) -> Option<u32> {
        std::collections::HashMap::get(self, &v).copied()
    }
    fn set(&mut self, v: u32, slot: u32) {
        self.insert(v, slot);
    }
}

impl Slots for Vec<u32> {
    fn get(&self, v: u32) -> Option<u32> {
        self.as_slice()
            .get(v as usize)
            .copied()
            .filter(|&s| s != UNSEEN)
    }
    fn set(&mut self, v: u32, slot: u32) {
        self[v as usize] = slot;
    }
}

fn build_full_block<S: Slots>(
    g: &HetGraph,
    layer: usize,
    t: NodeTypeId,
    dst: &[u32],
    slot: &mut [S],
) -> Block {
    let types = g.node_types().len();
    let mut src: Vec<Vec<u32>> = vec![Vec::new(); types];
    for &v in dst {
        slot[t.index()].set(v, src[t.index()].len() as u32);
        src[t.index()].push(v);
    }
    let mut relations = Vec::new();
    for &r in g.in_relations(t) {
        let rel = g.relation(r);
        let s = rel.src.index();
        let mut offsets = Vec::with_capacity(dst.len() + 1);
        offsets.push(0u32);
        let mut sources = Vec::new();
        for &v in dst {
            for &u in rel.in_csr().neighbors(v) {
                let local = match slot[s].get(u) {
                    Some(local) => local,
                    None => {
                        let next = src[s].len() as u32;
                        slot[s].set(u, next);
                        src[s].push(u);
                        next
                    }
                };
                sources.push(local);
            }
            offsets.push(sources.len() as u32);
        }
        relations.push(BlockRelation {
            relation: r,
            offsets,
            sources,
        });
    }
    let mut dsts = vec![Vec::new(); types];
    dsts[t.index()] = dst.to_vec();
    Block {
        layer,
        dst: dsts,
        src,
        relations,
    }
}

/// The rows of `nodes` (per type) from a layer's stored rows, as tensors.
pub fn rows_of(rows: &[Option<TypeRows>], nodes: &[Vec<u32>], model: &Model) -> Result<PerType> {
    let by_id: Vec<Option<RowsInPlace>> = rows
        .iter()
        .map(|r| r.as_ref().map(|r| RowsInPlace::by_id(&r.data, r.width)))
        .collect();
    gather_held(&by_id, nodes, model)
}

/// The rows of `nodes` (per type) copied out of `rows` where they are held,
/// as the model's inputs (`None` for a type without rows or nodes).
pub fn gather_held(
    rows: &[Option<RowsInPlace>],
    nodes: &[Vec<u32>],
    model: &Model,
) -> Result<PerType> {
    rows.iter()
        .zip(nodes)
        .enumerate()
        .map(|(t, (r, ids))| match r {
            Some(r) if !ids.is_empty() => {
                let missing = |v: u32| {
                    ModelError::Config(format!("node {v} of type {t} has no row held here"))
                };
                let at = r.places(ids).map_err(missing)?;
                let buf = crate::ops::copy_rows(r.values, r.width, &at).map_err(missing)?;
                Ok(Some(
                    Tensor::from_vec(buf, (ids.len(), r.width), model.device())?
                        .to_dtype(model.dtype())?,
                ))
            }
            _ => Ok(None),
        })
        .collect()
}
