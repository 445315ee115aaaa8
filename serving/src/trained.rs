//! A trained model loaded for inference: the checkpoint found (single-process
//! `epoch-*` or distributed `step-*`, or the newest valid one under a root),
//! its model assembled on the graph it was trained on, and the graph's node
//! names. `predict`, `embed` and `serve` all load through here.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actors::inference::online::{Online, OnlineSetup};
use graphs::{HetGraph, LoadOptions};
use models::Model;
use tables::results::NodeNames;

use crate::error::{Result, ServeError};

/// What inference needs of a checkpoint, single-process or distributed.
pub type Source = actors::pretrained::Pretrained;

/// A checkpoint's model on its graph, ready for inference.
pub struct Trained {
    /// The model with the checkpoint's parameters.
    pub model: Model,
    /// The graph, loaded as the model was trained (reverse relations or not);
    /// served from partitions, this node's partition (every id, its own rows).
    pub graph: Arc<HetGraph>,
    /// Where the parameters came from.
    pub source: Source,
    /// Each node type's names (original ids of a graph imported from tables).
    pub names: Vec<NodeNames>,
    /// Per relation whose edge classes were imported as names, the names in class order.
    pub edge_classes: std::collections::BTreeMap<String, Vec<String>>,
    /// Per node type imported from tables, its feature transforms with their
    /// fitted statistics (a request's new nodes' raw columns go through them).
    pub transforms: std::collections::BTreeMap<String, Vec<tables::transform::FittedBlock>>,
}

/// Warnings a load printed nothing of: skipped checkpoints, for the caller to report.
pub type Skipped = Vec<String>;

impl Trained {
    /// Loads the checkpoint `checkpoint` names (a checkpoint directory, or a
    /// root whose newest valid checkpoint is used) on the graph at `data`.
    pub fn open(checkpoint: &Path, data: &Path) -> Result<(Trained, Skipped)> {
        let load = |e: &dyn std::fmt::Display| ServeError::Load(e.to_string());
        let (src, skipped) = Source::find(checkpoint).map_err(|e| load(&e))?;
        let g = graphs::load(
            data,
            &LoadOptions {
                mmap_features: true,
                reverse_edges: src.reverse_edges,
            },
        )
        .map_err(|e| ServeError::Load(format!("loading {}: {e}", data.display())))?;
        // The checkpoint knows its graph by content: a same-named copy with other files is refused.
        let content = graphs::fingerprint::content(data).map_err(|e| load(&e))?;
        let model = src.model(&g, Some(&content)).map_err(|e| load(&e))?;
        let names = g
            .node_types()
            .iter()
            .map(|t| NodeNames::load(data, &t.name, t.count))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| load(&e))?;
        let (edge_classes, transforms) = imported(data)?;
        Ok((
            Trained {
                model,
                graph: Arc::new(g),
                source: src,
                names,
                edge_classes,
                transforms,
            },
            skipped,
        ))
    }

    /// Loads the checkpoint `p.checkpoint` names on this node's partition of
    /// `p.partitions` and starts serving the partition to the other nodes
    /// ([`Online`]): the model, and what its sampled inference reads through.
    pub fn open_partitioned(p: Partitioned) -> Result<(Trained, Online, Skipped)> {
        let load = |e: &dyn std::fmt::Display| ServeError::Load(e.to_string());
        let (src, skipped) = Source::find(p.checkpoint).map_err(|e| load(&e))?;
        let set = graphs::partition::PartitionSet::open_for(p.partitions, p.data)
            .map_err(|e| ServeError::Load(format!("{}: {e}", p.partitions.display())))?;
        let k = match &p.node {
            Some((topology, id)) => {
                actors::inference::partition_of(topology, id, set.manifest.parts as u32)
                    .map_err(|e| load(&e))?
            }
            None => 0,
        };
        let g = Arc::new(
            set.load_part(
                k as usize,
                &LoadOptions {
                    mmap_features: true,
                    reverse_edges: src.reverse_edges,
                },
            )
            .map_err(|e| ServeError::Load(format!("partition {k}: {e}")))?,
        );
        let inference = src
            .for_inference(&g, set.manifest.graph_sha256.as_deref())
            .map_err(|e| load(&e))?;
        let online = Online::start(
            OnlineSetup {
                source: &src,
                model: &inference,
                set: &set,
                node: p.node,
                ask: p.ask,
                take_over: p.take_over.then_some(p.partitions),
            },
            g.clone(),
        )
        .map_err(|e| ServeError::Load(format!("serving partition {k}: {e}")))?;
        // Original ids and saved transforms are the whole graph's, when given.
        let named = p.data.unwrap_or(p.partitions);
        let names = g
            .node_types()
            .iter()
            .map(|t| NodeNames::load(named, &t.name, t.count))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| load(&e))?;
        let (edge_classes, transforms) = match p.data {
            Some(d) => imported(d)?,
            None => Default::default(),
        };
        Ok((
            Trained {
                model: inference.model,
                graph: g,
                source: src,
                names,
                edge_classes,
                transforms,
            },
            online,
            skipped,
        ))
    }
}

/// What `hetgnn serve --partitions` serves from.
pub struct Partitioned<'a> {
    /// A checkpoint directory or root.
    pub checkpoint: &'a Path,
    /// The partition directory.
    pub partitions: &'a Path,
    /// The whole graph (checked to be the partitions' source; its original
    /// ids and saved transforms are used), when given.
    pub data: Option<&'a Path>,
    /// One node of a topology and its id, or `None`: every partition in this process.
    pub node: Option<(runtime::Topology, &'a str)>,
    /// Longest wait for one answer of another partition.
    pub ask: Duration,
    /// Serve a down node's partition here (loaded from `partitions`) instead
    /// of answering 503 until it is back.
    pub take_over: bool,
}

/// Edge class names and fitted feature transforms of a graph imported from tables.
type Imported = (
    std::collections::BTreeMap<String, Vec<String>>,
    std::collections::BTreeMap<String, Vec<tables::transform::FittedBlock>>,
);

/// What the import of the graph at `data` recorded (nothing for a graph not imported).
fn imported(data: &Path) -> Result<Imported> {
    let record =
        tables::import::ImportRecord::read(data).map_err(|e| ServeError::Load(e.to_string()))?;
    Ok(match record {
        Some(r) => (
            r.edge_classes.into_iter().collect(),
            r.types.into_iter().map(|t| (t.ntype, t.features)).collect(),
        ),
        None => Default::default(),
    })
}
