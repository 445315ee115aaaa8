//! Deterministic neighbor sampling into message-flow blocks.
//!
//! For each layer (outermost first in the output, sampled from the seeds
//! outward) and each destination node, for each relation into its type, up to
//! `fanout` in-neighbors are drawn uniformly without replacement (all of them
//! when there are fewer). The draw for a node is a pure function of
//! `(seed, epoch, step, layer, relation key, node)` ([`neighbor_key`]), so any
//! process, thread or partition holding the node's in-neighbors picks the same
//! ones; a sampler restricted to a subset of relations ([`RelationFilter`])
//! therefore yields exactly the edges the full sample has for those relations
//! and destinations.
//!
//! Fanouts are listed from the seeds outward, as PyG does: `fanouts[0]` is hop 1,
//! which feeds the last layer.

use std::collections::HashSet;

use rayon::prelude::*;

use crate::error::{GraphError, Result};
use crate::graph::HetGraph;
use crate::ids::{NodeTypeId, RelationId};
use crate::link::{ExcludeEdges, NoExclusion};
use crate::prefetch::{prefetch, AHEAD};
use crate::rng::{key, CounterRng};

const UNSEEN: u32 = u32::MAX;
#[allow(clippy::unusual_byte_groupings)]
const BATCH_STREAM: u64 = 0xBA7C_4E5;

/// The sampled inputs of one model layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Index of the model layer this block feeds (0 = the input layer).
    pub layer: usize,
    /// Destination nodes per node type (global ids).
    pub dst: Vec<Vec<u32>>,
    /// Source nodes per node type (global ids); `src[t]` starts with `dst[t]`,
    /// so a self-loop reads the first `dst[t].len()` source rows.
    pub src: Vec<Vec<u32>>,
    /// Sampled edges per relation, for every relation sampled into a type with destinations.
    pub relations: Vec<BlockRelation>,
}

/// Sampled edges of one relation in a block, as CSR over destinations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRelation {
    /// The relation.
    pub relation: RelationId,
    /// Destination `i`'s sources are `sources[offsets[i]..offsets[i+1]]`.
    pub offsets: Vec<u32>,
    /// Local ids into the block's `src[relation.src]`.
    pub sources: Vec<u32>,
}

impl BlockRelation {
    /// Number of sampled edges.
    pub fn num_edges(&self) -> usize {
        self.sources.len()
    }
    /// `(dst_local, src_local)` pairs.
    pub fn edges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.offsets.windows(2).enumerate().flat_map(move |(d, w)| {
            self.sources[w[0] as usize..w[1] as usize]
                .iter()
                .map(move |&s| (d as u32, s))
        })
    }
}

impl Block {
    /// Total sampled edges.
    pub fn num_edges(&self) -> usize {
        self.relations.iter().map(BlockRelation::num_edges).sum()
    }
    /// Total source nodes over all types.
    pub fn num_src(&self) -> usize {
        self.src.iter().map(Vec::len).sum()
    }
    /// Total destination nodes over all types.
    pub fn num_dst(&self) -> usize {
        self.dst.iter().map(Vec::len).sum()
    }
    /// The sampled edges of `relation`, if sampled.
    pub fn relation(&self, relation: RelationId) -> Option<&BlockRelation> {
        self.relations.iter().find(|r| r.relation == relation)
    }
}

/// A sampled mini-batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MiniBatch {
    /// Epoch the sample was drawn for.
    pub epoch: u64,
    /// Step within the epoch.
    pub step: u64,
    /// Seed nodes of the target type (the last block's destinations hold the
    /// seeds of every type).
    pub seeds: Vec<u32>,
    /// One block per layer; `blocks[0]` feeds the input layer and the last one
    /// has the seeds as destinations.
    pub blocks: Vec<Block>,
}

impl MiniBatch {
    /// Total sampled edges over all blocks.
    pub fn num_edges(&self) -> usize {
        self.blocks.iter().map(Block::num_edges).sum()
    }
    /// Distinct input nodes (sources of the first block).
    pub fn num_input_nodes(&self) -> usize {
        self.blocks.first().map_or(0, Block::num_src)
    }
}

/// One relation's picks for a list of destinations, as CSR over that list
/// (the answer of a partition's owner to a remote sampling request).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RelationPicks {
    /// The relation.
    pub relation: RelationId,
    /// Destination `i`'s picks are `picks[offsets[i]..offsets[i+1]]`.
    pub offsets: Vec<u32>,
    /// Picked source ids (global).
    pub picks: Vec<u32>,
}

/// Checks remote picks are well-formed for the requested nodes (they come
/// from the network).
fn check_picks(away: &[Vec<u32>], fetched: &[Vec<RelationPicks>], fanout: usize) -> Result<()> {
    if fetched.len() != away.len() {
        return Err(GraphError::InvalidArgument(format!(
            "remote picks for {} node types, {} expected",
            fetched.len(),
            away.len()
        )));
    }
    for (nodes, rels) in away.iter().zip(fetched) {
        for p in rels {
            let ok = p.offsets.len() == nodes.len() + 1
                && p.offsets.first() == Some(&0)
                && p.offsets.last().map(|&e| e as usize) == Some(p.picks.len())
                && p.offsets
                    .windows(2)
                    .all(|w| w[0] <= w[1] && (w[1] - w[0]) as usize <= fanout);
            if !ok {
                return Err(GraphError::InvalidArgument(format!(
                    "malformed remote picks for relation {}",
                    p.relation.0
                )));
            }
        }
    }
    Ok(())
}

/// Which relations to sample, per layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelationFilter {
    /// Every relation at every layer.
    All,
    /// These relations at every layer.
    Only(Vec<RelationId>),
    /// `per_layer[l]` at model layer `l` (a metatree's shape).
    PerLayer(Vec<Vec<RelationId>>),
}

impl RelationFilter {
    /// Whether `relation` is sampled at `layer`.
    pub fn allows(&self, layer: usize, relation: RelationId) -> bool {
        match self {
            RelationFilter::All => true,
            RelationFilter::Only(rs) => rs.contains(&relation),
            RelationFilter::PerLayer(ls) => ls.get(layer).is_some_and(|rs| rs.contains(&relation)),
        }
    }
}

/// The RNG key for one destination node's draw: a pure function of its arguments.
#[inline]
pub fn neighbor_key(
    seed: u64,
    epoch: u64,
    step: u64,
    layer: usize,
    relation_key: u64,
    node: u32,
) -> u64 {
    key(&[
        layer_key(seed, epoch, step, layer, relation_key),
        u64::from(node),
    ])
}

/// The RNG key shared by one relation's draws at one layer of one step: a
/// destination's key is `key(&[layer_key, node])` ([`neighbor_key`]), which
/// a device sampler computes from this one value.
#[inline]
pub fn layer_key(seed: u64, epoch: u64, step: u64, layer: usize, relation_key: u64) -> u64 {
    key(&[seed, epoch, step, layer as u64, relation_key])
}

/// Appends to `out` up to `fanout` of `neighbors`, drawn uniformly without
/// replacement with the stream of `key` (Floyd's algorithm), in neighbor order.
/// `scratch` is reused working memory.
pub fn sample_neighbors(
    key: u64,
    neighbors: &[u32],
    fanout: usize,
    scratch: &mut Vec<u32>,
    out: &mut Vec<u32>,
) {
    let d = neighbors.len();
    if fanout >= d {
        out.extend_from_slice(neighbors);
        return;
    }
    let mut rng = CounterRng::new(key);
    scratch.clear();
    if fanout <= 64 {
        for j in (d - fanout)..d {
            let t = rng.below(j as u64 + 1) as u32;
            let pick = if scratch.contains(&t) { j as u32 } else { t };
            scratch.push(pick);
        }
    } else {
        let mut set = HashSet::with_capacity(fanout);
        for j in (d - fanout)..d {
            let t = rng.below(j as u64 + 1) as u32;
            let pick = if set.contains(&t) { j as u32 } else { t };
            set.insert(pick);
            scratch.push(pick);
        }
    }
    scratch.sort_unstable();
    out.extend(scratch.iter().map(|&i| neighbors[i as usize]));
}

/// `dst`'s in-neighbours `all` in `relation` without the excluded ones
/// (copied into `kept` only when the relation has exclusions). A CSR row is
/// sorted, so a pair's parallel edges are one run, tested together.
fn kept_neighbors<'a>(
    kept: &'a mut Vec<u32>,
    all: &'a [u32],
    excluded: &dyn ExcludeEdges,
    relation: RelationId,
    dst: u32,
) -> &'a [u32] {
    if !excluded.touches(relation) {
        return all;
    }
    kept.clear();
    for run in all.chunk_by(|a, b| a == b) {
        if !excluded.excludes(relation, dst, run[0], run.len() as u32) {
            kept.extend_from_slice(run);
        }
    }
    kept
}

/// The batches of one epoch: `train` shuffled by a pure function of
/// `(seed, epoch)` and cut into batches of `batch` (the last may be short).
pub fn epoch_batches(train: &[u32], batch: usize, seed: u64, epoch: u64) -> Vec<Vec<u32>> {
    let mut ids = train.to_vec();
    let mut rng = CounterRng::from_parts(&[seed, epoch, BATCH_STREAM]);
    for i in (1..ids.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        ids.swap(i, j);
    }
    ids.chunks(batch.max(1)).map(<[u32]>::to_vec).collect()
}

/// Samples mini-batches from one graph. Holds per-type scratch maps, so use
/// one sampler per thread.
pub struct Sampler<'g> {
    graph: &'g HetGraph,
    fanouts: Vec<usize>,
    seed: u64,
    local: Vec<Vec<u32>>,
    scratch: Vec<u32>,
    /// A neighbour list with excluded edges removed.
    kept: Vec<u32>,
    /// Nodes per type beyond the graph's, with ids from its count on (an
    /// [`crate::overlay::Overlay`]'s new nodes, sampled through `remote`).
    extra: Vec<u32>,
    /// Draw a large hop's picks on rayon's pool ([`Sampler::in_parallel`]).
    parallel: bool,
    /// Hops drawn from the seeds outward ([`Sampler::top_hops`]).
    hops: usize,
}

impl<'g> Sampler<'g> {
    /// A sampler for `graph` with per-hop `fanouts` (seeds outward; one per layer).
    pub fn new(graph: &'g HetGraph, fanouts: &[usize], seed: u64) -> Result<Sampler<'g>> {
        if fanouts.is_empty() {
            return Err(GraphError::InvalidArgument(
                "fanouts must list one value per layer (at least one)".into(),
            ));
        }
        Ok(Sampler {
            graph,
            fanouts: fanouts.to_vec(),
            seed,
            local: graph.node_types().iter().map(|_| Vec::new()).collect(),
            scratch: Vec::new(),
            kept: Vec::new(),
            extra: vec![0; graph.node_types().len()],
            parallel: false,
            hops: fanouts.len(),
        })
    }

    /// Draws only the `hops` hops nearest the seeds: the mini-batch's blocks
    /// are those of the last `hops` layers, keyed and numbered as in a whole
    /// sample, for a caller that holds the earlier layers' rows of every
    /// node (a node's draws depend on the node alone, not on the batch).
    pub fn top_hops(mut self, hops: usize) -> Result<Sampler<'g>> {
        if hops == 0 || hops > self.fanouts.len() {
            return Err(GraphError::InvalidArgument(format!(
                "{hops} hops of a {}-layer sampler",
                self.fanouts.len()
            )));
        }
        self.hops = hops;
        Ok(self)
    }

    /// Draws the picks of a hop with at least [`PARALLEL_DESTINATIONS`]
    /// local destinations on rayon's pool, in chunks, before numbering them
    /// in order: the same mini-batch, sooner, for a caller whose thread would
    /// otherwise wait (a served request, inference), not for samplers that
    /// run beside training's arithmetic.
    pub fn in_parallel(mut self) -> Sampler<'g> {
        self.parallel = true;
        self
    }

    /// Takes `maps` (a sampler's [`Sampler::into_maps`], of this graph or an
    /// overlay of it) as its working memory: a new sampler sizes and fills
    /// one position map per node type on first use, which on a large graph
    /// costs more than sampling a small request (7.6 MB at mag-like S=1).
    /// Maps of another number of types are dropped.
    pub fn with_maps(mut self, maps: Vec<Vec<u32>>) -> Sampler<'g> {
        if maps.len() == self.local.len() {
            self.local = maps;
        }
        self
    }

    /// The per-type position maps, every entry unset (as between any two
    /// calls), for the next sampler of this graph ([`Sampler::with_maps`]).
    pub fn into_maps(self) -> Vec<Vec<u32>> {
        self.local
    }

    /// Also accepts `added[t]` nodes of each type `t` beyond the graph's
    /// (ids `count..count + added[t]`), as seeds and picks: their
    /// neighbourhoods come from [`Sampler::sample_seeds`]'s `remote`.
    pub fn with_new_nodes(mut self, added: &[u32]) -> Result<Sampler<'g>> {
        if added.len() != self.extra.len() {
            return Err(GraphError::InvalidArgument(format!(
                "new nodes for {} node types in a graph of {}",
                added.len(),
                self.extra.len()
            )));
        }
        self.extra = added.to_vec();
        Ok(self)
    }

    /// The seed every draw is keyed with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Number of layers sampled.
    pub fn num_layers(&self) -> usize {
        self.fanouts.len()
    }

    /// Samples every relation for `seeds` (distinct target-type nodes).
    pub fn sample(&mut self, epoch: u64, step: u64, seeds: &[u32]) -> Result<MiniBatch> {
        self.sample_relations(epoch, step, seeds, &RelationFilter::All)
    }

    /// Samples like [`Sampler::sample`], with every relation's picks drawn by
    /// `pick(relation, key, nodes, fanout)`: the picks of `nodes` (destinations
    /// of the relation's type) under the relation's [`layer_key`] `key`, as
    /// [`Sampler::pick`] answers (a device sampler draws them, say). The
    /// blocks are built here from the picks, so the batch is
    /// [`Sampler::sample`]'s whenever `pick` draws as the CPU does. An error
    /// of `pick` is returned as it is.
    pub fn sample_by<P, E>(
        &mut self,
        epoch: u64,
        step: u64,
        seeds: &[u32],
        mut pick: P,
    ) -> std::result::Result<MiniBatch, E>
    where
        P: FnMut(RelationId, u64, &[u32], usize) -> std::result::Result<RelationPicks, E>,
        E: From<GraphError>,
    {
        let (g, seed) = (self.graph, self.seed);
        let remote = |layer: usize, fanout: usize, away: &[Vec<u32>]| {
            away.iter()
                .enumerate()
                .map(|(t, nodes)| match nodes.is_empty() {
                    true => Ok(Vec::new()),
                    false => g
                        .in_relations(NodeTypeId(t as u32))
                        .iter()
                        .map(|&rid| {
                            let base = layer_key(seed, epoch, step, layer, g.relation(rid).key());
                            pick(rid, base, nodes, fanout)
                        })
                        .collect(),
                })
                .collect()
        };
        self.sample_with(
            epoch,
            step,
            seeds,
            &RelationFilter::All,
            |_, _| false,
            remote,
        )
    }

    /// Samples only the relations `filter` allows; every edge it yields is one
    /// the full sample has, with the same destination.
    pub fn sample_relations(
        &mut self,
        epoch: u64,
        step: u64,
        seeds: &[u32],
        filter: &RelationFilter,
    ) -> Result<MiniBatch> {
        self.sample_with(
            epoch,
            step,
            seeds,
            filter,
            |_, _| true,
            |_, _, _| unreachable!("every node is local"),
        )
    }

    /// The picks of every relation into `ntype` allowed at `layer` for
    /// `nodes` (whose in-neighborhoods this sampler's graph must hold): what a
    /// partition's owner answers to a remote sampling request.
    #[allow(clippy::too_many_arguments)] // the sampling key's parts, flat
    pub fn pick(
        &mut self,
        epoch: u64,
        step: u64,
        layer: usize,
        fanout: usize,
        ntype: NodeTypeId,
        nodes: &[u32],
        filter: &RelationFilter,
        excluded: &dyn ExcludeEdges,
    ) -> Result<Vec<RelationPicks>> {
        let g = self.graph;
        let count = g.node_type(ntype).count;
        if let Some(&bad) = nodes.iter().find(|&&v| v >= count) {
            return Err(GraphError::InvalidArgument(format!(
                "node {bad} is out of range 0..{count}"
            )));
        }
        let mut out = Vec::new();
        for &rid in g.in_relations(ntype) {
            if !filter.allows(layer, rid) {
                continue;
            }
            let base = layer_key(self.seed, epoch, step, layer, g.relation(rid).key());
            let (scratch, kept) = (&mut self.scratch, &mut self.kept);
            out.push(pick_relation(
                g, base, rid, nodes, fanout, excluded, scratch, kept,
            ));
        }
        Ok(out)
    }

    /// Samples like [`Sampler::sample_relations`], but only destinations for
    /// which `local(type, node)` holds are sampled here; for the others, per
    /// hop, `remote(layer, fanout, nodes_per_type)` must return, per type,
    /// [`Sampler::pick`]'s answer for that type's listed nodes (from their
    /// owners). The result is the mini-batch a sampler holding the whole graph
    /// would produce. An error of `remote` is returned as it is, so that the
    /// caller can tell a lost owner (retry) from a bad answer (stop).
    pub fn sample_with<L, R, E>(
        &mut self,
        epoch: u64,
        step: u64,
        seeds: &[u32],
        filter: &RelationFilter,
        local: L,
        remote: R,
    ) -> std::result::Result<MiniBatch, E>
    where
        L: Fn(usize, u32) -> bool,
        R: FnMut(usize, usize, &[Vec<u32>]) -> std::result::Result<Vec<Vec<RelationPicks>>, E>,
        E: From<GraphError>,
    {
        let mut typed = vec![Vec::new(); self.graph.node_types().len()];
        typed[self.graph.target().index()] = seeds.to_vec();
        self.sample_seeds(epoch, step, &typed, &NoExclusion, filter, local, remote)
    }

    /// Samples every relation for seeds of any types (`seeds[t]`: distinct
    /// nodes of type `t`), leaving the `excluded` edges out of every
    /// in-neighbourhood before drawing (link prediction's positive edges):
    /// a node's draw is then from its remaining neighbours, keyed as usual.
    pub fn sample_typed(
        &mut self,
        epoch: u64,
        step: u64,
        seeds: &[Vec<u32>],
        excluded: &dyn ExcludeEdges,
    ) -> Result<MiniBatch> {
        self.sample_seeds(
            epoch,
            step,
            seeds,
            excluded,
            &RelationFilter::All,
            |_, _| true,
            |_, _, _| unreachable!("every node is local"),
        )
    }

    /// [`Sampler::sample_typed`] with remote destinations, as
    /// [`Sampler::sample_with`]: `remote` must answer with the owners' picks
    /// made under the same exclusions ([`Sampler::pick`]'s `excluded`).
    #[allow(clippy::too_many_arguments)] // sample_with's, with typed seeds and exclusions
    pub fn sample_seeds<L, R, E>(
        &mut self,
        epoch: u64,
        step: u64,
        seeds: &[Vec<u32>],
        excluded: &dyn ExcludeEdges,
        filter: &RelationFilter,
        local: L,
        mut remote: R,
    ) -> std::result::Result<MiniBatch, E>
    where
        L: Fn(usize, u32) -> bool,
        R: FnMut(usize, usize, &[Vec<u32>]) -> std::result::Result<Vec<Vec<RelationPicks>>, E>,
        E: From<GraphError>,
    {
        let g = self.graph;
        let target = g.target();
        let nt = g.node_types().len();
        if seeds.len() != nt {
            return Err(GraphError::InvalidArgument(format!(
                "seeds for {} node types in a graph of {nt}",
                seeds.len()
            ))
            .into());
        }
        self.ensure_maps();
        for (t, typed) in seeds.iter().enumerate() {
            let map = &mut self.local[t];
            let count = map.len();
            let mut bad = None;
            for (i, &s) in typed.iter().enumerate() {
                match map.get(s as usize) {
                    None => bad = Some(format!("seed {s} is out of range 0..{count}")),
                    Some(&UNSEEN) => map[s as usize] = i as u32,
                    Some(_) => bad = Some(format!("seed {s} is listed twice")),
                }
                if bad.is_some() {
                    break;
                }
            }
            for &s in typed {
                if let Some(slot) = map.get_mut(s as usize) {
                    *slot = UNSEEN;
                }
            }
            if let Some(problem) = bad {
                return Err(GraphError::InvalidArgument(problem).into());
            }
        }
        let mut frontier: Vec<Vec<u32>> = seeds.to_vec();

        let layers = self.fanouts.len();
        let mut blocks = Vec::with_capacity(self.hops);
        for hop in 0..self.hops {
            let layer = layers - 1 - hop;
            let fanout = self.fanouts[hop];
            let dst = frontier;
            // Destinations sampled elsewhere: their picks, and each one's row in them.
            let away: Vec<Vec<u32>> = dst
                .iter()
                .enumerate()
                .map(|(t, nodes)| nodes.iter().copied().filter(|&v| !local(t, v)).collect())
                .collect();
            let (fetched, rows) = if away.iter().any(|a| !a.is_empty()) {
                let fetched = remote(layer, fanout, &away)?;
                check_picks(&away, &fetched, fanout)?;
                let rows: Vec<std::collections::HashMap<u32, usize>> = away
                    .iter()
                    .map(|a| a.iter().enumerate().map(|(i, &v)| (v, i)).collect())
                    .collect();
                (fetched, rows)
            } else {
                (Vec::new(), Vec::new())
            };
            let (seed, scratch, kept) = (self.seed, &mut self.scratch, &mut self.kept);
            // Drawn ahead on rayon's pool: every relation's picks, by relation id.
            let ahead = match self.parallel
                && rows.is_empty()
                && dst.iter().map(Vec::len).sum::<usize>() >= PARALLEL_DESTINATIONS
            {
                true => {
                    let keys = |rid: RelationId| {
                        layer_key(seed, epoch, step, layer, g.relation(rid).key())
                    };
                    pick_in_parallel(g, &dst, layer, fanout, filter, excluded, keys)
                }
                false => Vec::new(),
            };
            let mut base = (RelationId(u32::MAX), 0u64);
            let fill = |rid: RelationId, dt: usize, i: usize, v: u32, out: &mut Vec<u32>| {
                let rel = g.relation(rid);
                if let Some(Some(p)) = ahead.get(rid.index()) {
                    out.extend_from_slice(
                        &p.picks[p.offsets[i] as usize..p.offsets[i + 1] as usize],
                    );
                } else if local(dt, v) {
                    if base.0 != rid {
                        base = (rid, layer_key(seed, epoch, step, layer, rel.key()));
                    }
                    let neighbors =
                        kept_neighbors(kept, rel.in_csr().neighbors(v), excluded, rid, v);
                    sample_neighbors(
                        key(&[base.1, u64::from(v)]),
                        neighbors,
                        fanout,
                        scratch,
                        out,
                    );
                } else {
                    let p = fetched
                        .get(dt)
                        .and_then(|f| f.iter().find(|p| p.relation == rid))
                        .ok_or_else(|| {
                            GraphError::InvalidArgument(format!(
                                "remote picks lack relation {}",
                                rel.canonical()
                            ))
                        })?;
                    let i = rows[dt][&v];
                    out.extend_from_slice(
                        &p.picks[p.offsets[i] as usize..p.offsets[i + 1] as usize],
                    );
                }
                Ok(())
            };
            // With the picks drawn ahead, `fill` copies them and reads no CSR row.
            let reads_csr = ahead.is_empty();
            let block = build_block(g, &mut self.local, layer, dst, filter, reads_csr, fill)?;
            frontier = block.src.clone();
            blocks.push(block);
        }
        blocks.reverse();
        Ok(MiniBatch {
            epoch,
            step,
            seeds: seeds[target.index()].clone(),
            blocks,
        })
    }

    /// One hop's block from picks made elsewhere ([`assemble`] with this
    /// sampler's position maps).
    pub fn assemble(
        &mut self,
        layer: usize,
        fanout: usize,
        dst: Vec<Vec<u32>>,
        picks: &[Vec<RelationPicks>],
        filter: &RelationFilter,
    ) -> Result<Block> {
        assemble(
            self.graph,
            &mut self.local,
            layer,
            fanout,
            dst,
            picks,
            filter,
        )
    }

    /// Sizes the per-type position maps on first use (every entry is
    /// `UNSEEN` between calls, so a resize keeps that).
    fn ensure_maps(&mut self) {
        for (t, map) in self.local.iter_mut().enumerate() {
            let size = self.graph.node_types()[t].count as usize + self.extra[t] as usize;
            if map.len() != size {
                map.resize(size, UNSEEN);
            }
        }
    }

    /// The graph sampled from.
    pub fn graph(&self) -> &'g HetGraph {
        self.graph
    }

    /// Type of the seeds.
    pub fn target(&self) -> NodeTypeId {
        self.graph.target()
    }
}

/// Local destinations a hop needs before [`Sampler::in_parallel`] draws its
/// picks on rayon's pool (fewer are not worth the hand-off).
pub const PARALLEL_DESTINATIONS: usize = 1024;

/// Destinations per task of [`pick_in_parallel`].
const PICK_CHUNK: usize = 256;

/// Relation `rid`'s picks for `nodes` (destinations it holds whole
/// in-neighbourhoods of); `base` is the relation's [`layer_key`];
/// `scratch` and `kept` are working memory (a draw's positions, a
/// neighbour list with exclusions removed).
#[allow(clippy::too_many_arguments)] // the draw's parts, flat
fn pick_relation(
    g: &HetGraph,
    base: u64,
    rid: RelationId,
    nodes: &[u32],
    fanout: usize,
    excluded: &dyn ExcludeEdges,
    scratch: &mut Vec<u32>,
    kept: &mut Vec<u32>,
) -> RelationPicks {
    let csr = g.relation(rid).in_csr();
    let mut offsets = Vec::with_capacity(nodes.len() + 1);
    offsets.push(0u32);
    let mut picks = Vec::with_capacity(nodes.len() * fanout.min(32));
    for (i, &v) in nodes.iter().enumerate() {
        prefetch_rows(csr, nodes, i);
        let neighbors = kept_neighbors(kept, csr.neighbors(v), excluded, rid, v);
        sample_neighbors(
            key(&[base, u64::from(v)]),
            neighbors,
            fanout,
            scratch,
            &mut picks,
        );
        offsets.push(picks.len() as u32);
    }
    RelationPicks {
        relation: rid,
        offsets,
        picks,
    }
}

/// Every relation's picks for a hop's destinations `dst` (all local), drawn
/// in chunks of destinations on rayon's pool, indexed by relation id (`None`
/// for relations without destinations or not allowed at `layer`); `keys`
/// gives a relation's [`layer_key`]. The same draws as one thread's.
fn pick_in_parallel(
    g: &HetGraph,
    dst: &[Vec<u32>],
    layer: usize,
    fanout: usize,
    filter: &RelationFilter,
    excluded: &dyn ExcludeEdges,
    keys: impl Fn(RelationId) -> u64 + Sync,
) -> Vec<Option<RelationPicks>> {
    let tasks: Vec<(RelationId, usize)> = g
        .relations()
        .iter()
        .enumerate()
        .map(|(r, rel)| (RelationId(r as u32), &dst[rel.dst.index()]))
        .filter(|(rid, nodes)| !nodes.is_empty() && filter.allows(layer, *rid))
        .flat_map(|(rid, nodes)| {
            (0..nodes.len())
                .step_by(PICK_CHUNK)
                .map(move |at| (rid, at))
        })
        .collect();
    let chunks: Vec<RelationPicks> = tasks
        .par_iter()
        .map_init(
            || (Vec::new(), Vec::new()),
            |(scratch, kept), &(rid, at)| {
                let nodes = &dst[g.relation(rid).dst.index()];
                let nodes = &nodes[at..(at + PICK_CHUNK).min(nodes.len())];
                pick_relation(g, keys(rid), rid, nodes, fanout, excluded, scratch, kept)
            },
        )
        .collect();
    // Chunks are in relation order, each relation's in destination order.
    let mut out: Vec<Option<RelationPicks>> = (0..g.relations().len()).map(|_| None).collect();
    for c in chunks {
        match &mut out[c.relation.index()] {
            Some(p) => {
                let start = *p.offsets.last().unwrap_or(&0);
                p.offsets.extend(c.offsets[1..].iter().map(|&o| o + start));
                p.picks.extend_from_slice(&c.picks);
            }
            slot => *slot = Some(c),
        }
    }
    out
}

/// Asks for the CSR rows of destinations to come while `nodes[i]` is
/// sampled: the offsets of the one `2 * AHEAD` on, then (its offsets asked
/// for earlier) the neighbour list of the one `AHEAD` on.
#[inline(always)]
fn prefetch_rows(csr: &crate::csr::Csr, nodes: &[u32], i: usize) {
    let starts = csr.offsets();
    if let Some(&far) = nodes.get(i + 2 * AHEAD) {
        if let Some(row) = starts.get(far as usize..far as usize + 2) {
            prefetch(row);
        }
    }
    if let Some(&near) = nodes.get(i + AHEAD) {
        if let Some(&at) = starts.get(near as usize) {
            if let Some(first) = csr.indices().get(at as usize..at as usize + 1) {
                prefetch(first);
            }
        }
    }
}

/// One hop's block, from its destinations and the picks of every relation
/// into their types made elsewhere: `picks[t]` is [`Sampler::pick`]'s
/// answer for all of `dst[t]`, in order (ByteGNN's one-hop tasks, merged).
/// The block is the one [`Sampler::sample_seeds`] builds at that hop from
/// the same picks. `maps` is reusable working memory: one position map per
/// node type, sized on first use and left as found.
pub fn assemble(
    g: &HetGraph,
    maps: &mut Vec<Vec<u32>>,
    layer: usize,
    fanout: usize,
    dst: Vec<Vec<u32>>,
    picks: &[Vec<RelationPicks>],
    filter: &RelationFilter,
) -> Result<Block> {
    let nt = g.node_types().len();
    if dst.len() != nt {
        return Err(GraphError::InvalidArgument(format!(
            "destinations for {} node types in a graph of {nt}",
            dst.len()
        )));
    }
    check_picks(&dst, picks, fanout)?;
    maps.resize(nt, Vec::new());
    for (t, map) in maps.iter_mut().enumerate() {
        if map.is_empty() {
            map.resize(g.node_types()[t].count as usize, UNSEEN);
        }
    }
    for (t, nodes) in dst.iter().enumerate() {
        if let Some(&bad) = nodes.iter().find(|&&v| v as usize >= maps[t].len()) {
            return Err(GraphError::InvalidArgument(format!(
                "destination {bad} of type {t} is out of range"
            )));
        }
    }
    let fill = |rid: RelationId, dt: usize, i: usize, _: u32, out: &mut Vec<u32>| {
        let p = picks[dt]
            .iter()
            .find(|p| p.relation == rid)
            .ok_or_else(|| {
                GraphError::InvalidArgument(format!(
                    "picks lack relation {}",
                    g.relation(rid).canonical()
                ))
            })?;
        out.extend_from_slice(&p.picks[p.offsets[i] as usize..p.offsets[i + 1] as usize]);
        Ok(())
    };
    build_block(g, maps, layer, dst, filter, false, fill)
}

/// One hop's block: `dst`, then per relation (in the graph's order) into a
/// type with destinations and allowed at `layer`, each destination's picks
/// from `fill(relation, dst type, index in dst[type], node, out)`, sources
/// numbered in order of first appearance after the destinations. `local` is
/// the per-type position map (all `UNSEEN` before and after). `reads_csr`:
/// whether `fill` draws from the relation's CSR (its rows are then asked for
/// ahead).
fn build_block<F>(
    g: &HetGraph,
    local: &mut [Vec<u32>],
    layer: usize,
    dst: Vec<Vec<u32>>,
    filter: &RelationFilter,
    reads_csr: bool,
    mut fill: F,
) -> Result<Block>
where
    F: FnMut(RelationId, usize, usize, u32, &mut Vec<u32>) -> Result<()>,
{
    let mut src = dst.clone();
    for (t, nodes) in dst.iter().enumerate() {
        for (i, &v) in nodes.iter().enumerate() {
            local[t][v as usize] = i as u32;
        }
    }
    let mut rels = Vec::new();
    let built = (|| {
        for (r, rel) in g.relations().iter().enumerate() {
            let rid = RelationId(r as u32);
            let dt = rel.dst.index();
            let dnodes = &dst[dt];
            if dnodes.is_empty() || !filter.allows(layer, rid) {
                continue;
            }
            // Two passes: every destination's picks (node ids), then each pick
            // numbered in order. Both read tables indexed by node id (the CSR's
            // offsets, the position map), a cache miss per node, and knowing the
            // ids ahead lets those be requested a few iterations early.
            let mut offsets = Vec::with_capacity(dnodes.len() + 1);
            offsets.push(0u32);
            let mut sources = Vec::with_capacity(dnodes.len() * 8);
            let csr = rel.in_csr();
            for (i, &v) in dnodes.iter().enumerate() {
                if reads_csr {
                    prefetch_rows(csr, dnodes, i);
                }
                fill(rid, dt, i, v, &mut sources)?;
                offsets.push(sources.len() as u32);
            }
            let (map, srcs) = (&mut local[rel.src.index()], &mut src[rel.src.index()]);
            for k in 0..sources.len() {
                if let Some(&ahead) = sources.get(k + 4 * AHEAD) {
                    if let Some(slot) = map.get(ahead as usize..ahead as usize + 1) {
                        prefetch(slot);
                    }
                }
                let u = sources[k];
                let slot = map.get_mut(u as usize).ok_or_else(|| {
                    GraphError::InvalidArgument(format!("picked node {u} is out of range"))
                })?;
                if *slot == UNSEEN {
                    *slot = srcs.len() as u32;
                    srcs.push(u);
                }
                sources[k] = *slot;
            }
            rels.push(BlockRelation {
                relation: rid,
                offsets,
                sources,
            });
        }
        Ok(())
    })();
    // The maps are reset whatever happened: the sampler stays usable after an error.
    for (t, nodes) in src.iter().enumerate() {
        for &v in nodes {
            local[t][v as usize] = UNSEEN;
        }
    }
    built?;
    Ok(Block {
        layer,
        dst,
        src,
        relations: rels,
    })
}
