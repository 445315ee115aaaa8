//! A trained model read back from any checkpoint, single-process (`epoch-*`)
//! or distributed (`step-*`): what inference loads, and what a run told to
//! start from another run's parameters (`training.init_from`, [`init`]) takes
//! its parts from.

use std::path::{Path, PathBuf};

use candle_core::Device;
use models::checkpoint;
use models::optim::{Adam, AdamConfig};
use models::{Model, ModelSpec};

use crate::distributed::checkpoint as dist;
use crate::error::{Result, TrainError};

pub mod init;

/// Problems of newer checkpoints skipped on the way to the one used.
pub type Skipped = Vec<String>;

/// A checkpoint found on disk, with what reading its model needs.
#[derive(Clone, Debug)]
pub struct Pretrained {
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
    /// The content of the graph it was trained on, when recorded.
    pub graph_sha256: Option<String>,
    /// The manifest of a distributed checkpoint (`None`: single-process).
    distributed: Option<dist::Manifest>,
}

impl Pretrained {
    /// Finds the checkpoint `path` names: a checkpoint directory of either
    /// kind, or a root of `epoch-*` or `step-*` ones (the newest valid one).
    pub fn find(path: &Path) -> Result<(Pretrained, Skipped)> {
        let is_dist = |d: &Path| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
        };
        let mut skipped = Vec::new();
        graphs::input::dir(path, "a checkpoint directory")?;
        let dir = if path.join("manifest.json").exists() {
            path.to_path_buf()
        } else if !dist::list(path)?.is_empty() {
            let (m, s) = dist::latest_any(path)?.ok_or_else(|| {
                TrainError::Checkpoint(format!("{}: no usable checkpoint", path.display()))
            })?;
            skipped = s;
            dist::dir(path, m.seq)
        } else {
            checkpoint::resolve(path)?
        };
        if is_dist(&dir) {
            let m = dist::manifest(&dir)?;
            return Ok((
                Pretrained {
                    spec: m.spec.clone(),
                    reverse_edges: m.reverse_edges,
                    fanouts: m.fanouts.clone(),
                    epochs_done: m.epochs.len() as u64,
                    graph_sha256: m.graph_sha256.clone(),
                    dir,
                    distributed: Some(m),
                },
                skipped,
            ));
        }
        // The files' checksums are verified as they are loaded (read once).
        let m = checkpoint::read_manifest(&dir)?;
        Ok((
            Pretrained {
                spec: m.spec,
                reverse_edges: m.reverse_edges,
                fanouts: m.fanouts,
                epochs_done: m.epochs_done,
                graph_sha256: m.graph_sha256,
                dir,
                distributed: None,
            },
            skipped,
        ))
    }

    /// Its values in `model`, a model of [`Pretrained::spec`] on the graph it
    /// was trained on (`graph` by name, `content` its files' fingerprint when
    /// known: a graph of other content is refused), with or without learnable tables.
    pub fn load_into(&self, model: &mut Model, graph: &str, content: Option<&str>) -> Result<()> {
        match &self.distributed {
            Some(m) => {
                let partial = crate::modes::rules_of(&m.mode)
                    .map(|r| r.partial_params)
                    .ok_or_else(|| {
                        TrainError::Checkpoint(format!(
                            "{}: written by an unknown training mode '{}'",
                            self.dir.display(),
                            m.mode
                        ))
                    })?;
                checkpoint::check_graph_content(
                    &self.dir,
                    m.graph_sha256.as_deref(),
                    content,
                    "given",
                )?;
                dist::assemble(&self.dir, m, model, partial).map_err(|e| {
                    TrainError::Checkpoint(format!(
                        "assembling the model of {}: {e}",
                        self.dir.display()
                    ))
                })
            }
            None => {
                checkpoint::load(
                    &self.dir,
                    model,
                    &mut Adam::new(AdamConfig::with_lr(1e-3)),
                    graph,
                    content,
                    self.reverse_edges,
                    None,
                )?;
                Ok(())
            }
        }
    }

    /// Its model on `g` (loaded with [`Pretrained::reverse_edges`] as trained;
    /// `content` its files' fingerprint when known), on the CPU, with its learnable tables.
    pub fn model(&self, g: &graphs::HetGraph, content: Option<&str>) -> Result<Model> {
        let mut model = Model::new(&self.spec, g, candle_core::DType::F32, &Device::Cpu)?;
        self.load_into(&mut model, g.name(), content)?;
        Ok(model)
    }
}
