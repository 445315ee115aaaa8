//! The metagraph: node types as vertices, relations as links weighted by their
//! edge counts. Meta-partitioning walks it from the target type.

use std::fmt;

use crate::graph::HetGraph;
use crate::ids::{NodeTypeId, RelationId};

/// One relation seen as a link between types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaLink {
    /// The relation.
    pub relation: RelationId,
    /// Relation name.
    pub name: String,
    /// Source type.
    pub src: NodeTypeId,
    /// Destination type.
    pub dst: NodeTypeId,
    /// Number of edges.
    pub weight: u64,
}

/// Types and the relations between them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metagraph {
    /// Type names, indexed by [`NodeTypeId`].
    pub types: Vec<String>,
    /// Node count per type.
    pub type_weights: Vec<u64>,
    /// One link per relation, in relation id order.
    pub links: Vec<MetaLink>,
}

impl Metagraph {
    pub(crate) fn new(g: &HetGraph) -> Metagraph {
        Metagraph {
            types: g.node_types().iter().map(|t| t.name.clone()).collect(),
            type_weights: g.node_types().iter().map(|t| u64::from(t.count)).collect(),
            links: g
                .relations()
                .iter()
                .enumerate()
                .map(|(i, r)| MetaLink {
                    relation: RelationId(i as u32),
                    name: r.name.clone(),
                    src: r.src,
                    dst: r.dst,
                    weight: r.num_edges() as u64,
                })
                .collect(),
        }
    }

    /// Links whose destination is `t` (what a layer aggregates into `t`).
    pub fn incoming(&self, t: NodeTypeId) -> impl Iterator<Item = &MetaLink> {
        self.links.iter().filter(move |l| l.dst == t)
    }

    /// Links whose source is `t`.
    pub fn outgoing(&self, t: NodeTypeId) -> impl Iterator<Item = &MetaLink> {
        self.links.iter().filter(move |l| l.src == t)
    }
}

impl fmt::Display for Metagraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in &self.links {
            writeln!(
                f,
                "{} --{}--> {}  ({} edges)",
                self.types[l.src.index()],
                l.name,
                self.types[l.dst.index()],
                l.weight
            )?;
        }
        Ok(())
    }
}
