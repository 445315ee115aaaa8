//! A trained model read back from any checkpoint, single-process (`epoch-*`)
//! or distributed (`step-*`): what inference loads, and what a run told to
//! start from another run's parameters (`training.init_from`, [`init`]) takes
//! its parts from.

use std::path::{Path, PathBuf};

use candle_core::Device;
use models::checkpoint;
use models::embedding::EmbeddingTable;
use models::optim::{Adam, AdamConfig};
use models::{Model, ModelSpec};

use crate::distributed::checkpoint as dist;
use crate::error::{Result, TrainError};

pub mod init;
pub mod part;

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
    /// Its files' checksums were checked while it was found (the newest of a root).
    verified: bool,
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
        let verified = !path.join("manifest.json").exists();
        let dir = if !verified {
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
                    verified,
                },
                skipped,
            ));
        }
        // A checkpoint named directly has its checksums verified as it is loaded (read once).
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
                verified,
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
    /// `content` its files' fingerprint when known), on the CPU, with its
    /// learnable tables (their rows, without optimizer state: for inference).
    pub fn model(&self, g: &graphs::HetGraph, content: Option<&str>) -> Result<Model> {
        let Inference { mut model, rows } = self.for_inference(g, content)?;
        if let Rows::Mapped(tables) = rows {
            let dim = self.spec.embed_dim;
            for (t, learnable) in Model::learnable_types(self.spec.kind, g)
                .into_iter()
                .enumerate()
            {
                if learnable {
                    let name = table_name(g, t);
                    let count = g.node_types()[t].count as usize;
                    let data = tables.all(&name)?;
                    model.embeddings[t] = Some(EmbeddingTable::frozen(&name, count, dim, data));
                }
            }
        }
        Ok(model)
    }

    /// Its model on `g` for inference over some of the nodes: the dense
    /// parameters, and the learnable rows read from the checkpoint as they
    /// are asked for (a single-process checkpoint's are mapped, not copied;
    /// a distributed one's are assembled into the model).
    pub fn for_inference(&self, g: &graphs::HetGraph, content: Option<&str>) -> Result<Inference> {
        if self.distributed.is_some() {
            let mut model = Model::new(&self.spec, g, candle_core::DType::F32, &Device::Cpu)?;
            self.load_into(&mut model, g.name(), content)?;
            return Ok(Inference::held(model));
        }
        let mut model =
            Model::without_tables(&self.spec, g, candle_core::DType::F32, &Device::Cpu)?;
        let (_, tables) = checkpoint::load_for_inference(
            &self.dir,
            &mut model,
            g.name(),
            content,
            self.reverse_edges,
            self.verified,
        )?;
        let dim = self.spec.embed_dim;
        for (t, learnable) in Model::learnable_types(self.spec.kind, g)
            .into_iter()
            .enumerate()
        {
            let name = table_name(g, t);
            let count = g.node_types()[t].count as usize;
            if learnable && tables.shape(&name) != Some((count, dim)) {
                return Err(TrainError::Checkpoint(format!(
                    "{}: embedding table {name} is {:?}, the model needs [{count}, {dim}]",
                    self.dir.display(),
                    tables.shape(&name)
                )));
            }
        }
        Ok(Inference {
            model,
            rows: Rows::Mapped(tables),
        })
    }
}

/// The name of type `t`'s embedding table.
fn table_name(g: &graphs::HetGraph, t: usize) -> String {
    format!("embed.{}", g.node_types()[t].name)
}

/// A trained model for inference, its learnable rows where they were loaded.
pub struct Inference {
    /// The model (its dense parameters; its tables when [`Inference::held`]).
    pub model: Model,
    rows: Rows,
}

/// Where an [`Inference`]'s learnable rows are.
enum Rows {
    /// In the model's tables.
    Held,
    /// In the checkpoint's mapped file.
    Mapped(checkpoint::Tables),
}

impl Inference {
    /// A model holding its learnable tables.
    pub fn held(model: Model) -> Inference {
        Inference {
            model,
            rows: Rows::Held,
        }
    }

    /// Where [`Model::layer_in_place`] reads the input rows of `block`'s
    /// sources (see [`Model::stored_rows`]): `None` where some cannot be read in place.
    pub fn stored_rows<'a>(
        &'a self,
        g: &'a graphs::HetGraph,
        block: &graphs::Block,
    ) -> Option<Vec<Option<models::model::RowsInPlace<'a>>>> {
        match &self.rows {
            Rows::Held => self.model.stored_rows(g, block),
            Rows::Mapped(tables) => self
                .model
                .stored_rows_with(g, block, |t| tables.in_place(&table_name(g, t))),
        }
    }

    /// The input rows of type `t`'s nodes `ids` on `g`: features, or learnable
    /// rows; `None` where the model reads no rows of `t` (or `ids` is empty).
    pub fn inputs(
        &self,
        g: &graphs::HetGraph,
        t: usize,
        ids: &[u32],
    ) -> Result<Option<candle_core::Tensor>> {
        let fg = self.model.feature_gather();
        if ids.is_empty() || !fg.wants(t) {
            return Ok(None);
        }
        if let Some(x) = fg.gather_type(g, t, ids)? {
            return Ok(Some(x));
        }
        match &self.rows {
            Rows::Held => {
                let mut nodes = vec![Vec::new(); g.node_types().len()];
                nodes[t] = ids.to_vec();
                Ok(self.model.gather_inputs(g, &nodes)?[t].take())
            }
            Rows::Mapped(tables) => {
                let rows = tables.rows(&table_name(g, t), ids)?;
                let dim = self.model.spec().embed_dim;
                Ok(Some(
                    candle_core::Tensor::from_vec(rows, (ids.len(), dim), self.model.device())?
                        .to_dtype(self.model.dtype())?,
                ))
            }
        }
    }
}
