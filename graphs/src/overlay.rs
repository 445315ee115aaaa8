//! A graph with nodes and edges added in memory, for answering questions
//! about a hypothetical graph (a serving request's new nodes) without
//! copying or changing the stored one.
//!
//! New nodes of type `t` take ids from the type's count on, as an import of
//! the same rows appended would give them. An added edge of a stored
//! relation also adds its reverse where the graph has reverse relations. A
//! node's in-neighbours are its stored ones and its added ones, sorted as
//! [`crate::Csr`] keeps them, so sampling the overlay draws exactly what
//! sampling the graph rebuilt with the additions would
//! ([`Overlay::sample`]).

use std::collections::HashMap;

use crate::error::{GraphError, Result};
use crate::graph::HetGraph;
use crate::ids::{NodeTypeId, RelationId};
use crate::link::NoExclusion;
use crate::sampler::{
    neighbor_key, sample_neighbors, MiniBatch, RelationFilter, RelationPicks, Sampler,
};

/// A graph and what is added to it.
pub struct Overlay<'g> {
    graph: &'g HetGraph,
    added: Vec<u32>,
    /// Per relation (stored and reverse): added in-neighbours by destination.
    extra_in: Vec<HashMap<u32, Vec<u32>>>,
}

impl<'g> Overlay<'g> {
    /// `graph` with `added[t]` new nodes of each type `t` and the edges
    /// `(relation, src, dst)` of stored relations (ids up to each end type's
    /// count plus its added nodes).
    pub fn new(
        graph: &'g HetGraph,
        added: Vec<u32>,
        edges: &[(RelationId, u32, u32)],
    ) -> Result<Overlay<'g>> {
        let types = graph.node_types();
        if added.len() != types.len() {
            return Err(GraphError::InvalidArgument(format!(
                "new nodes for {} node types in a graph of {}",
                added.len(),
                types.len()
            )));
        }
        let mut size = Vec::with_capacity(types.len());
        for (t, n) in types.iter().zip(&added) {
            size.push(t.count.checked_add(*n).ok_or_else(|| {
                GraphError::InvalidArgument(format!(
                    "{n} new nodes of type '{}' overflow its 32-bit ids",
                    t.name
                ))
            })?);
        }
        // The reverse relation of each stored relation, where there is one.
        let mut reverse = vec![None; graph.relations().len()];
        for (i, r) in graph.relations().iter().enumerate() {
            if let Some(of) = r.reverse_of {
                reverse[of.index()] = Some(i);
            }
        }
        let mut extra_in: Vec<HashMap<u32, Vec<u32>>> =
            vec![HashMap::new(); graph.relations().len()];
        for &(r, u, v) in edges {
            let rel = graph.relations().get(r.index()).ok_or_else(|| {
                GraphError::InvalidArgument(format!("no relation {} in the graph", r.0))
            })?;
            if rel.reverse_of.is_some() {
                return Err(GraphError::InvalidArgument(format!(
                    "'{}' is a reverse relation: add the edge to the relation it reverses",
                    rel.canonical()
                )));
            }
            for (end, id, t) in [("source", u, rel.src), ("destination", v, rel.dst)] {
                if id >= size[t.index()] {
                    return Err(GraphError::InvalidArgument(format!(
                        "the {end} {id} of an added '{}' edge is not a node of type '{}'",
                        rel.canonical(),
                        types[t.index()].name
                    )));
                }
            }
            extra_in[r.index()].entry(v).or_default().push(u);
            if let Some(rev) = reverse[r.index()] {
                extra_in[rev].entry(u).or_default().push(v);
            }
        }
        Ok(Overlay {
            graph,
            added,
            extra_in,
        })
    }

    /// The graph added to.
    pub fn graph(&self) -> &'g HetGraph {
        self.graph
    }

    /// New nodes per type.
    pub fn added(&self) -> &[u32] {
        &self.added
    }

    /// Whether node `v` of type `t` is new.
    pub fn is_new(&self, t: NodeTypeId, v: u32) -> bool {
        v >= self.graph.node_type(t).count
    }

    /// Whether node `v` of type `t` has in-neighbours the graph lacks
    /// (a new node, or one with added in-edges).
    fn touched(&self, t: usize, v: u32) -> bool {
        self.is_new(NodeTypeId(t as u32), v)
            || self
                .graph
                .in_relations(NodeTypeId(t as u32))
                .iter()
                .any(|r| self.extra_in[r.index()].contains_key(&v))
    }

    /// In-neighbours of `v` in relation `r`: stored and added, sorted.
    pub fn in_neighbors(&self, r: RelationId, v: u32) -> Vec<u32> {
        let rel = self.graph.relation(r);
        let mut out = if self.is_new(rel.dst, v) {
            Vec::new()
        } else {
            rel.in_csr().neighbors(v).to_vec()
        };
        if let Some(more) = self.extra_in[r.index()].get(&v) {
            out.extend_from_slice(more);
            out.sort_unstable();
        }
        out
    }

    /// A mini-batch for `seeds` (per type, distinct, ids up to each type's
    /// count plus its added nodes) drawn by `sampler` (made for this graph
    /// with [`Sampler::with_new_nodes`] of [`Overlay::added`]): the one a
    /// sampler over the graph rebuilt with the additions draws.
    pub fn sample(
        &self,
        sampler: &mut Sampler,
        epoch: u64,
        step: u64,
        seeds: &[Vec<u32>],
    ) -> Result<MiniBatch> {
        let seed = sampler.seed();
        let g = self.graph;
        let mut scratch = Vec::new();
        sampler.sample_seeds(
            epoch,
            step,
            seeds,
            &NoExclusion,
            &RelationFilter::All,
            |t, v| !self.touched(t, v),
            |layer, fanout, away| {
                Ok(away
                    .iter()
                    .enumerate()
                    .map(|(t, nodes)| {
                        if nodes.is_empty() {
                            return Vec::new();
                        }
                        g.in_relations(NodeTypeId(t as u32))
                            .iter()
                            .map(|&r| {
                                let key = g.relation(r).key();
                                let mut offsets = Vec::with_capacity(nodes.len() + 1);
                                offsets.push(0u32);
                                let mut picks = Vec::new();
                                for &v in nodes {
                                    let all = self.in_neighbors(r, v);
                                    sample_neighbors(
                                        neighbor_key(seed, epoch, step, layer, key, v),
                                        &all,
                                        fanout,
                                        &mut scratch,
                                        &mut picks,
                                    );
                                    offsets.push(picks.len() as u32);
                                }
                                RelationPicks {
                                    relation: r,
                                    offsets,
                                    picks,
                                }
                            })
                            .collect()
                    })
                    .collect())
            },
        )
    }
}

impl Overlay<'_> {
    /// The graph with the additions, copied (`features[t]`: the new nodes'
    /// feature rows of each type with features): what the overlay is equal
    /// to, at the cost of the whole graph. New target nodes are unlabelled;
    /// edge labels and splits are not carried.
    pub fn rebuilt(&self, features: &[Option<Vec<f32>>]) -> Result<HetGraph> {
        let g = self.graph;
        let target = g.node_type(g.target()).name.clone();
        let mut b = crate::GraphBuilder::new(g.name(), &target, g.num_classes());
        for (t, nt) in g.node_types().iter().enumerate() {
            let n = self.added[t];
            let f = match &nt.features {
                Some(f) => {
                    let mut data = f.to_vec();
                    let more = features.get(t).and_then(Option::as_ref);
                    let more = more.map(Vec::as_slice).unwrap_or_default();
                    if more.len() != n as usize * f.dim() {
                        return Err(GraphError::InvalidArgument(format!(
                            "{} feature values for {n} new nodes of type '{}' of {} features",
                            more.len(),
                            nt.name,
                            f.dim()
                        )));
                    }
                    data.extend_from_slice(more);
                    Some(crate::Features::from_vec(
                        (nt.count + n) as usize,
                        f.dim(),
                        data,
                    ))
                }
                None => None,
            };
            b = b.node_type(&nt.name, nt.count + n, f);
        }
        let n = self.added[g.target().index()] as usize;
        let (labels, splits) = g.target_labels();
        let mut labels = labels.to_vec();
        labels.extend(std::iter::repeat_n(-1, n));
        b = b.labels(labels, splits.clone());
        if let Some(v) = g.target_values() {
            let mut v = v.to_vec();
            v.extend(std::iter::repeat_n(f32::NAN, n));
            b = b.values(v);
        }
        if let Some(s) = g.target_label_sets() {
            let mut bits = s.as_slice().to_vec();
            bits.extend(std::iter::repeat_n(-1, n * s.width()));
            b = b.label_sets(s.width() as u32, bits);
        }
        for (r, rel) in g.relations().iter().enumerate() {
            if rel.reverse_of.is_some() {
                continue;
            }
            let (mut src, mut dst) = (Vec::new(), Vec::new());
            let out = rel.out_csr();
            for u in 0..out.num_rows() as u32 {
                for &v in out.neighbors(u) {
                    src.push(u);
                    dst.push(v);
                }
            }
            for (&v, us) in &self.extra_in[r] {
                for &u in us {
                    src.push(u);
                    dst.push(v);
                }
            }
            let name = |t: NodeTypeId| g.node_type(t).name.as_str();
            b = b.relation(name(rel.src), &rel.name, name(rel.dst), src, dst);
        }
        let mut out = b.build()?;
        if g.has_reverse_relations() {
            out.add_reverse_relations()?;
        }
        Ok(out)
    }
}
