//! A trained model loaded for inference: the checkpoint found (single-process
//! `epoch-*` or distributed `step-*`, or the newest valid one under a root),
//! its model assembled on the graph it was trained on, and the graph's node
//! names. `predict`, `embed` and `serve` all load through here.

use std::path::Path;

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
    /// The graph, loaded as the model was trained (reverse relations or not).
    pub graph: HetGraph,
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
        let record = tables::import::ImportRecord::read(data).map_err(|e| load(&e))?;
        let (edge_classes, transforms) = match record {
            Some(r) => (
                r.edge_classes.into_iter().collect(),
                r.types.into_iter().map(|t| (t.ntype, t.features)).collect(),
            ),
            None => Default::default(),
        };
        Ok((
            Trained {
                model,
                graph: g,
                source: src,
                names,
                edge_classes,
                transforms,
            },
            skipped,
        ))
    }
}
