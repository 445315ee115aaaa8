//! Checks a run's settings against its graph before anything is trained:
//! a run that cannot learn (no training nodes) or cannot fit (widths,
//! batch and fanouts whose step needs more memory than the machine has) is
//! refused with the keys at fault, instead of "training" zero steps or being
//! killed by the kernel midway.

use graphs::HetGraph;

use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};

/// Refuses a run of `t` on `g` that cannot train or cannot fit; `tables`:
/// whether this process holds the learnable rows of the whole graph.
pub fn check(t: &TrainingConfig, g: &HetGraph, tables: bool) -> Result<()> {
    // Link prediction trains on edges (LinkEdges::split refuses none).
    if t.task == crate::config::Task::NodeClassification {
        check_trainable(g)?;
    }
    check_fits(t, g, tables)
}

/// Refuses a graph with no target nodes or no training nodes.
pub fn check_trainable(g: &HetGraph) -> Result<()> {
    let target = g.node_type(g.target());
    if target.count == 0 {
        return Err(TrainError::Config(format!("the target type '{}' has no nodes: nothing to train", target.name)));
    }
    let (_, splits) = g.target_labels();
    if splits.train.is_empty() {
        return Err(TrainError::Config(format!("the training split of '{}' is empty (nodes/{}/train.npy): nothing to train", target.name, target.name)));
    }
    Ok(())
}

/// Refuses settings whose model and training step need more memory than the machine has.
pub fn check_fits(t: &TrainingConfig, g: &HetGraph, tables: bool) -> Result<()> {
    let spec = t.model_spec();
    // A link-prediction batch embeds both endpoints of each edge and its negatives.
    let seeds = match t.task {
        crate::config::Task::NodeClassification => t.batch,
        crate::config::Task::LinkPrediction => t.batch.saturating_mul(2 + t.negatives),
    };
    let need = spec.min_bytes(g, tables).saturating_add(spec.step_bytes(g, &t.fanouts, seeds));
    let what = format!(
        "a training step (training.batch {}, training.fanouts {:?}, training.hidden {}, training.embed_dim {}, training.layers {}; {} classes)",
        t.batch,
        t.fanouts,
        t.hidden,
        t.embed_dim,
        t.layers,
        g.num_classes()
    );
    graphs::memory::check_fits(&what, need).map_err(TrainError::Config)
}
