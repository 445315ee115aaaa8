//! A trained model loaded for inference: the checkpoint found (single-process
//! `epoch-*` or distributed `step-*`, or the newest valid one under a root),
//! its model assembled on the graph it was trained on, and the graph's node
//! names. `predict`, `embed` and `serve` all load through here.

use std::path::{Path, PathBuf};

use actors::distributed::checkpoint as dist;
use candle_core::{DType, Device};
use graphs::{HetGraph, LoadOptions};
use models::checkpoint;
use models::optim::{Adam, AdamConfig};
use models::{Model, ModelSpec};
use tables::results::NodeNames;

use crate::error::{Result, ServeError};

/// What inference needs of a checkpoint, single-process or distributed.
#[derive(Clone, Debug)]
pub struct Source {
    /// The checkpoint directory used.
    pub dir: PathBuf,
    /// The model's specification.
    pub spec: ModelSpec,
    /// Whether the model was trained with reverse relations.
    pub reverse_edges: bool,
    /// The training fanouts (inference samples with them).
    pub fanouts: Vec<usize>,
    /// Epochs trained (the sampling key of inference).
    pub epochs_done: u64,
    distributed: Option<dist::Manifest>,
}

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
}

/// Warnings a load printed nothing of: skipped checkpoints, for the caller to report.
pub type Skipped = Vec<String>;

impl Trained {
    /// Loads the checkpoint `checkpoint` names (a checkpoint directory, or a
    /// root whose newest valid checkpoint is used) on the graph at `data`.
    pub fn open(checkpoint: &Path, data: &Path) -> Result<(Trained, Skipped)> {
        let load = |e: &dyn std::fmt::Display| ServeError::Load(e.to_string());
        let (src, skipped) = source(checkpoint)?;
        let g = graphs::load(
            data,
            &LoadOptions {
                mmap_features: true,
                reverse_edges: src.reverse_edges,
            },
        )
        .map_err(|e| ServeError::Load(format!("loading {}: {e}", data.display())))?;
        let mut model =
            Model::new(&src.spec, &g, DType::F32, &Device::Cpu).map_err(|e| load(&e))?;
        match &src.distributed {
            Some(m) => {
                let partial = actors::modes::rules_of(&m.mode)
                    .map(|r| r.partial_params)
                    .ok_or_else(|| {
                        ServeError::Load(format!(
                            "{}: written by an unknown training mode '{}'",
                            src.dir.display(),
                            m.mode
                        ))
                    })?;
                let content = match &m.graph_sha256 {
                    Some(_) => Some(graphs::fingerprint::content(data).map_err(|e| load(&e))?),
                    None => None,
                };
                checkpoint::check_graph_content(
                    &src.dir,
                    m.graph_sha256.as_deref(),
                    content.as_deref(),
                    "given",
                )
                .map_err(|e| load(&e))?;
                dist::assemble(&src.dir, m, &mut model, partial).map_err(|e| {
                    ServeError::Load(format!(
                        "assembling the model of {}: {e}",
                        src.dir.display()
                    ))
                })?
            }
            None => {
                // The checkpoint knows its graph by content: a same-named copy with other files is refused.
                let content = graphs::fingerprint::content(data).map_err(|e| load(&e))?;
                checkpoint::load(
                    &src.dir,
                    &mut model,
                    &mut Adam::new(AdamConfig::with_lr(1e-3)),
                    g.name(),
                    Some(&content),
                    src.reverse_edges,
                    None,
                )
                .map_err(|e| load(&e))?;
            }
        }
        let names = g
            .node_types()
            .iter()
            .map(|t| NodeNames::load(data, &t.name, t.count))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| load(&e))?;
        Ok((
            Trained {
                model,
                graph: g,
                source: src,
                names,
            },
            skipped,
        ))
    }
}

/// Finds the checkpoint `path` names: a checkpoint directory of either kind,
/// or a root of `epoch-*` (single-process) or `step-*` (distributed) ones.
fn source(path: &Path) -> Result<(Source, Skipped)> {
    let load = |e: &dyn std::fmt::Display| ServeError::Load(e.to_string());
    let is_dist = |d: &Path| {
        d.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
    };
    let mut skipped = Vec::new();
    graphs::input::dir(path, "a checkpoint directory").map_err(|e| load(&e))?;
    let dir = if path.join("manifest.json").exists() {
        path.to_path_buf()
    } else if !dist::list(path).map_err(|e| load(&e))?.is_empty() {
        let (m, s) = dist::latest_any(path)
            .map_err(|e| load(&e))?
            .ok_or_else(|| ServeError::Load(format!("{}: no usable checkpoint", path.display())))?;
        skipped = s;
        dist::dir(path, m.seq)
    } else {
        checkpoint::resolve(path).map_err(|e| load(&e))?
    };
    if is_dist(&dir) {
        let m = dist::manifest(&dir).map_err(|e| load(&e))?;
        return Ok((
            Source {
                spec: m.spec.clone(),
                reverse_edges: m.reverse_edges,
                fanouts: m.fanouts.clone(),
                epochs_done: m.epochs.len() as u64,
                dir,
                distributed: Some(m),
            },
            skipped,
        ));
    }
    let (m, _) = checkpoint::verify(&dir).map_err(|e| load(&e))?;
    Ok((
        Source {
            spec: m.spec,
            reverse_edges: m.reverse_edges,
            fanouts: m.fanouts,
            epochs_done: m.epochs_done,
            dir,
            distributed: None,
        },
        skipped,
    ))
}
