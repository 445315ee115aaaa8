//! Partitioners, in two kinds. Node-assigning ones ([`NodePartitioner`]: one
//! file each, [`random`], [`metis`], [`bytegnn`]'s neighbourhood blocks)
//! give every node an owner partition, for data-parallel training (and
//! [`block_row`]'s equal blocks, for full-graph training); the
//! relation-assigning one ([`meta`], Heta's meta-partitioning) gives every
//! relation to partitions, for raf training. Both report the same figures
//! ([`report::PartitionReport`]: edge cut, replication, balance per type,
//! time, peak memory), written as `report.json` beside the manifest.
//!
//! Node-assigning partitions (DistDGL): every node has one owner partition; a partition stores its core nodes' features and the
//! edges into and out of its core nodes, so the full in-neighborhood of a core
//! node (in either direction, reverse relations included) is local. The other
//! end of such an edge is a halo node: its id is known, its features and
//! neighborhood live with its owner.
//!
//! On disk (`PDIR`):
//! ```text
//! manifest.json            method, parts, per-partition report
//! owners/<ntype>.npy       int64 [count]: owner partition of every node
//! part<k>/                 a graph directory (FORMAT.md) with global ids and
//!                          counts, holding only partition k's edges; its
//!                          feature files are sparse: only core rows hold data
//! ```
//! Each `part<k>` loads with [`crate::load`] (features memory-mapped).

pub mod block_row;
pub mod bytegnn;
mod graph_dir;
pub mod meta;
pub mod metis;
pub mod random;
pub mod report;
mod set;
pub mod spring;
pub mod stream;
mod stream_write;
pub mod vertex_cut;
mod write;

use serde::{Deserialize, Serialize};

use crate::error::{GraphError, Result};
use crate::graph::HetGraph;

pub use report::PartitionReport;
pub use set::{Manifest, PartInfo, PartitionSet, TrainEdges};
pub use stream_write::write_streaming;
pub use write::{write, write_with, WriteOptions};

/// A partitioner that gives every node an owner partition.
pub trait NodePartitioner: Sync {
    /// Its `--method` name.
    fn name(&self) -> &'static str;
    /// An owner in `0..parts` for every node, per type; with `within =
    /// (owners, k)`, only partition `k`'s nodes matter (the second level
    /// splits a machine's nodes between its trainers).
    fn assign(
        &self,
        g: &HetGraph,
        parts: usize,
        seed: u64,
        within: Option<(&[Vec<u16>], u16)>,
    ) -> Result<Vec<Vec<u16>>>;
}

/// The node-assigning partitioner of `method` (`None` for meta, which assigns relations).
pub fn node_partitioner(method: Method) -> Option<&'static dyn NodePartitioner> {
    match method {
        Method::Random => Some(&random::Random),
        Method::Metis => Some(&metis::Metis),
        Method::BlockRow => Some(&block_row::BlockRow(block_row::Order::Metis)),
        Method::BlockRowRandom => Some(&block_row::BlockRow(block_row::Order::Random)),
        Method::Bytegnn => Some(&bytegnn::ByteGnn::DEFAULT),
        Method::Meta | Method::Spring | Method::Hdrf | Method::Dbh => None,
    }
}

/// How owners are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// A seeded hash of (type, node).
    Random,
    /// METIS k-way, multi-constraint.
    Metis,
    /// Heta's meta-partitioning by relations ([`meta`]).
    Meta,
    /// CATGNN's streaming SPRING ([`spring`]), in O(nodes) memory.
    Spring,
    /// Streaming vertex-cut HDRF ([`vertex_cut`]), a baseline for SPRING.
    Hdrf,
    /// Streaming vertex-cut DBH ([`vertex_cut`]), a baseline for SPRING.
    Dbh,
    /// Equal contiguous blocks of METIS order per type ([`block_row`]), for full-graph training.
    #[serde(rename = "block-row")]
    BlockRow,
    /// Equal contiguous blocks of a seeded shuffle per type ([`block_row`]).
    #[serde(rename = "block-row-random")]
    BlockRowRandom,
    /// ByteGNN's blocks: K-hop neighbourhoods of the labelled nodes, placed
    /// for cross edges and train/valid/test balance ([`bytegnn`]).
    Bytegnn,
}

impl Method {
    /// Whether the method streams the graph directory's edges instead of loading the graph.
    pub fn streams(self) -> bool {
        matches!(self, Method::Spring | Method::Hdrf | Method::Dbh)
    }
}

impl std::str::FromStr for Method {
    type Err = GraphError;
    fn from_str(s: &str) -> Result<Method> {
        match s {
            "random" => Ok(Method::Random),
            "metis" => Ok(Method::Metis),
            "meta" => Ok(Method::Meta),
            "spring" => Ok(Method::Spring),
            "hdrf" => Ok(Method::Hdrf),
            "dbh" => Ok(Method::Dbh),
            "block-row" => Ok(Method::BlockRow),
            "block-row-random" => Ok(Method::BlockRowRandom),
            "bytegnn" => Ok(Method::Bytegnn),
            other => Err(GraphError::InvalidArgument(format!("unknown partition method '{other}' (known: metis, random, meta, spring, hdrf, dbh, block-row, block-row-random, bytegnn)"))),
        }
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Random => "random",
            Method::Metis => "metis",
            Method::Meta => "meta",
            Method::Spring => "spring",
            Method::Hdrf => "hdrf",
            Method::Dbh => "dbh",
            Method::BlockRow => "block-row",
            Method::BlockRowRandom => "block-row-random",
            Method::Bytegnn => "bytegnn",
        })
    }
}

/// Largest number of partitions (owners are stored as u16).
pub const MAX_PARTS: usize = 4096;

/// Who owns what: a partition (machine) per node, and for the target type a
/// trainer within its machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// How owners were chosen.
    pub method: Method,
    /// Partitioner seed.
    pub seed: u64,
    /// Number of partitions.
    pub parts: usize,
    /// Trainers per partition.
    pub trainers: usize,
    /// Owner partition per type, per node.
    pub owners: Vec<Vec<u16>>,
    /// Per target node, its trainer within its partition (`0..trainers`).
    pub trainer_of: Vec<u16>,
}

/// Owner partition of every node (one trainer per partition).
pub fn assign(g: &HetGraph, parts: usize, method: Method, seed: u64) -> Result<Assignment> {
    assign_two_level(g, parts, 1, method, seed)
}

/// Owners, then (DistDGLv2's second level) each partition's nodes split again
/// into `trainers` sub-partitions with the same method; a trainer takes the
/// seeds of its sub-partition.
pub fn assign_two_level(
    g: &HetGraph,
    parts: usize,
    trainers: usize,
    method: Method,
    seed: u64,
) -> Result<Assignment> {
    let p = node_partitioner(method).ok_or_else(|| match method {
        Method::Meta => GraphError::InvalidArgument(
            "meta-partitioning assigns relations, not nodes: use partition::meta::write".into(),
        ),
        _ => GraphError::InvalidArgument(format!(
            "{method} streams the graph directory's edges: use partition::assign_streaming"
        )),
    })?;
    assign_two_level_with(g, parts, trainers, method, p, seed)
}

/// [`assign_two_level`] with partitioner `p` (of `method`, recorded in the
/// manifest) as given, options included: e.g. a [`bytegnn::ByteGnn`] other
/// than the default.
pub fn assign_two_level_with(
    g: &HetGraph,
    parts: usize,
    trainers: usize,
    method: Method,
    p: &dyn NodePartitioner,
    seed: u64,
) -> Result<Assignment> {
    if parts == 0 || parts > MAX_PARTS {
        return Err(GraphError::InvalidArgument(format!(
            "--parts must be in 1..={MAX_PARTS}, got {parts}"
        )));
    }
    if trainers == 0 || parts * trainers > MAX_PARTS {
        return Err(GraphError::InvalidArgument(format!(
            "--trainers must be in 1..={} for {parts} parts, got {trainers}",
            MAX_PARTS / parts
        )));
    }
    let owners = p.assign(g, parts, seed, None)?;
    let target = g.target().index();
    let mut trainer_of = vec![0u16; g.node_types()[target].count as usize];
    if trainers > 1 {
        let sub_seed = seed ^ 0x05EC_011D;
        for k in 0..parts as u16 {
            let sub = p.assign(g, trainers, sub_seed, Some((&owners, k)))?;
            for (v, t) in trainer_of.iter_mut().enumerate() {
                if owners[target][v] == k {
                    *t = sub[target][v];
                }
            }
        }
    }
    Ok(Assignment {
        method,
        seed,
        parts,
        trainers,
        owners,
        trainer_of,
    })
}

/// Owners from a streaming partitioner over the edges of graph directory
/// `dir` (one trainer per partition), in O(nodes) memory.
pub fn assign_streaming(
    dir: &std::path::Path,
    parts: usize,
    method: Method,
    seed: u64,
    spring: spring::Spring,
) -> Result<Assignment> {
    let s = stream::EdgeStream::open(dir)?;
    let owners = match method {
        Method::Spring => spring.assign(&s, parts)?,
        Method::Hdrf => vertex_cut::assign(vertex_cut::VertexCut::Hdrf, &s, parts, seed)?,
        Method::Dbh => vertex_cut::assign(vertex_cut::VertexCut::Dbh, &s, parts, seed)?,
        other => {
            return Err(GraphError::InvalidArgument(format!(
                "{other} does not stream: use partition::assign_two_level"
            )))
        }
    };
    let target = s.target()?;
    let trainer_of = vec![0u16; owners[target].len()];
    Ok(Assignment {
        method,
        seed,
        parts,
        trainers: 1,
        owners,
        trainer_of,
    })
}
