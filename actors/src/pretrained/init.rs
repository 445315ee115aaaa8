//! Starting a run from another run's parameters (`training.init_from`): train
//! one task (link prediction, say), then another from its relational layers
//! and learnable embeddings, loaded as `training.init_parts` says and left
//! untrained where `training.freeze` says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use models::{Model, ModelSpec};

use super::part::{parts, Part};
use super::Pretrained;
use crate::error::{Result, TrainError};

/// What a model's last layer writes: the task's outputs, or embeddings a decoder reads.
fn output_of(spec: &ModelSpec) -> &'static str {
    match (&spec.link, &spec.edge, spec.head) {
        (Some(_), _, _) | (_, Some(_), _) => "embeddings",
        (_, _, models::model::Head::Value) => "a value",
        (_, _, models::model::Head::Labels) => "label logits",
        _ => "class logits",
    }
}

/// Which of a model's values come from the checkpoint, and which stay as trained.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    /// Dense parameters taken from the checkpoint, and whether each is frozen.
    pub params: BTreeMap<String, bool>,
    /// Learnable tables (by node type index) taken from it, and whether each is frozen.
    pub tables: BTreeMap<usize, bool>,
    /// Parameters of the selected parts that start afresh: the output layer of another task.
    pub fresh: Vec<String>,
}

impl Selection {
    /// Names of the frozen dense parameters.
    pub fn frozen_params(&self) -> BTreeSet<String> {
        self.params
            .iter()
            .filter(|(_, f)| **f)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Whether the table of node type `ty` is frozen.
    pub fn frozen_table(&self, ty: usize) -> bool {
        self.tables.get(&ty).copied().unwrap_or(false)
    }

    /// One line for the run's log: what was taken, frozen and started afresh.
    pub fn summary(&self, dir: &Path) -> String {
        let frozen = self.params.values().filter(|f| **f).count()
            + self.tables.values().filter(|f| **f).count();
        let mut s = format!(
            "initialised from {}: {} parameter(s) and {} embedding table(s) loaded, {frozen} of them frozen",
            dir.display(),
            self.params.len(),
            self.tables.len()
        );
        if !self.fresh.is_empty() {
            s.push_str(&format!(
                "; this task's output layer starts afresh ({})",
                self.fresh.join(", ")
            ));
        }
        s
    }
}

/// Decides what `dest` (this run's model, with or without tables) takes from
/// `src` (the checkpoint's model on the same graph, with its tables; `learnable`:
/// which node types have tables, [`Model::learnable_types`]): the
/// `load` parts, `freeze` of them frozen. The architectures must agree; a
/// part this run's model has and the checkpoint's lacks is refused, naming it.
pub fn select(
    src: &Model,
    dest: &Model,
    learnable: &[bool],
    load: &BTreeSet<Part>,
    freeze: &BTreeSet<Part>,
) -> Result<Selection> {
    let (s, d) = (src.spec(), dest.spec());
    let keep = "fine-tuning keeps the architecture of the model it starts from";
    for (key, theirs, ours) in [
        ("training.model", s.kind.to_string(), d.kind.to_string()),
        (
            "training.layers",
            s.layers.to_string(),
            d.layers.to_string(),
        ),
        (
            "training.hidden",
            s.hidden.to_string(),
            d.hidden.to_string(),
        ),
        ("training.heads", s.heads.to_string(), d.heads.to_string()),
        (
            "training.embed_dim",
            s.embed_dim.to_string(),
            d.embed_dim.to_string(),
        ),
    ] {
        if theirs != ours {
            return Err(TrainError::Config(format!(
                "training.init_from: the checkpoint's model has {key} = {theirs}, this run {ours}: {keep}"
            )));
        }
    }
    let same_output = output_of(s) == output_of(d);
    let last = |n: &str| {
        let l = d.layers.saturating_sub(1);
        n.starts_with(&format!("layer{l}.")) || n.starts_with(&format!("mlp.layer{l}."))
    };
    let mut sel = Selection::default();
    for (name, var) in dest.params.iter() {
        let part = Part::of_param(name);
        if !load.contains(&part) {
            continue;
        }
        // The layer that writes this task's outputs starts afresh after another task's.
        if part == Part::Gnn && dest.last_layer_is_output() && last(name) && !same_output {
            sel.fresh.push(name.to_string());
            continue;
        }
        let Some(theirs) = src.params.get(name) else {
            return Err(TrainError::Config(format!(
                "training.init_from: the checkpoint's model (trained for {}) has no parameter {name} of part '{}'; leave '{}' out of training.init_parts",
                output_of(s),
                part.name(),
                part.name()
            )));
        };
        if theirs.as_tensor().dims() != var.as_tensor().dims() {
            return Err(TrainError::Config(format!(
                "training.init_from: parameter {name} is {:?} in the checkpoint, {:?} in this run's model",
                theirs.as_tensor().dims(),
                var.as_tensor().dims()
            )));
        }
        sel.params.insert(name.to_string(), freeze.contains(&part));
    }
    if load.contains(&Part::Decoder)
        && !sel
            .params
            .keys()
            .any(|n| Part::of_param(n) == Part::Decoder)
    {
        return Err(TrainError::Config(format!(
            "training.init_parts names 'decoder', but this run's model has none (its last layer writes {}): leave it out",
            output_of(d)
        )));
    }
    if load.contains(&Part::Embed) {
        for (ty, wanted) in learnable.iter().enumerate() {
            if !*wanted {
                continue;
            }
            let has = src.embeddings.get(ty).is_some_and(Option::is_some);
            if !has {
                return Err(TrainError::Config(format!(
                    "training.init_from: the checkpoint's model has no learnable table of node type {ty}; leave 'embed' out of training.init_parts"
                )));
            }
            sel.tables.insert(ty, freeze.contains(&Part::Embed));
        }
    }
    Ok(sel)
}

/// A distributed run's [`Start`], read once per process on the first
/// partition graph asked for (every partition has every id) and shared by its
/// threads.
#[derive(Default)]
pub struct SharedStart {
    slot: std::sync::Mutex<Option<Option<std::sync::Arc<Start>>>>,
}

impl SharedStart {
    /// The start of `t` (`None` without `training.init_from`), read with
    /// partition graph `g` of the graph whose files' fingerprint is `content`.
    pub fn get(
        &self,
        t: &crate::config::TrainingConfig,
        g: &graphs::HetGraph,
        content: Option<&str>,
    ) -> Result<Option<std::sync::Arc<Start>>> {
        let mut slot = self
            .slot
            .lock()
            .map_err(|_| TrainError::internal("a thread reading training.init_from panicked"))?;
        if let Some(s) = &*slot {
            return Ok(s.clone());
        }
        let dest = Model::without_tables(
            &t.model_spec(),
            g,
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        )?;
        let s = Start::open(t, g, content, &dest)?.map(std::sync::Arc::new);
        *slot = Some(s.clone());
        Ok(s)
    }
}

/// What a run takes from the checkpoint it starts from, read once per
/// process: the selected values (on the CPU) and what is frozen.
pub struct Start {
    /// The checkpoint directory read.
    pub dir: PathBuf,
    /// What was selected.
    pub sel: Selection,
    /// The selected dense parameters' values.
    params: BTreeMap<String, Tensor>,
    /// The selected tables' rows, by node type.
    tables: BTreeMap<usize, Vec<f32>>,
    /// Row width of the tables.
    dim: usize,
}

impl Start {
    /// The checkpoint `t.init_from` names (`None` without one), its model
    /// loaded on `g` (the graph it was trained on, or a partition of it with
    /// every id: `content`, when known, is the graph's files' fingerprint),
    /// and what this run's `dest` (with or without tables) takes from it.
    pub fn open(
        t: &crate::config::TrainingConfig,
        g: &graphs::HetGraph,
        content: Option<&str>,
        dest: &Model,
    ) -> Result<Option<Start>> {
        let Some(path) = &t.init_from else {
            return Ok(None);
        };
        let (found, _) = Pretrained::find(path).map_err(|e| {
            TrainError::Config(format!("training.init_from = {}: {e}", path.display()))
        })?;
        if found.reverse_edges != t.reverse_edges {
            return Err(TrainError::Config(format!(
                "training.init_from: the checkpoint was trained with reverse_edges = {}, this run has {}: its relations are other ones",
                found.reverse_edges, t.reverse_edges
            )));
        }
        let src = found.model(g, content)?;
        let sel = select(
            &src,
            dest,
            &Model::learnable_types(t.model, g),
            &parts("training.init_parts", &t.init_parts)?,
            &parts("training.freeze", &t.freeze)?,
        )?;
        let mut params = BTreeMap::new();
        for name in sel.params.keys() {
            let v = src
                .params
                .get(name)
                .ok_or_else(|| TrainError::Internal(format!("parameter {name} vanished")))?;
            params.insert(name.clone(), v.as_tensor().clone());
        }
        let mut src = src;
        let mut tables = BTreeMap::new();
        for &ty in sel.tables.keys() {
            if let Some(Some(e)) = src.embeddings.get_mut(ty) {
                tables.insert(ty, std::mem::take(&mut e.data));
            }
        }
        Ok(Some(Start {
            dir: found.dir,
            sel,
            params,
            tables,
            dim: src.spec().embed_dim,
        }))
    }

    /// Sets `dest`'s selected dense parameters (on its device and dtype).
    pub fn copy_params(&self, dest: &mut Model) -> Result<()> {
        let (device, dtype) = (dest.device().clone(), dest.dtype());
        for (name, t) in &self.params {
            let ours = dest
                .params
                .get(name)
                .ok_or_else(|| TrainError::Internal(format!("parameter {name} vanished")))?;
            ours.set(&t.to_dtype(dtype)?.to_device(&device)?)?;
        }
        Ok(())
    }

    /// Sets the rows of `dest`'s selected tables (their Adam state stays fresh).
    pub fn copy_tables(&self, dest: &mut Model) -> Result<()> {
        for (&ty, rows) in &self.tables {
            let Some(Some(ours)) = dest.embeddings.get_mut(ty) else {
                continue; // a model without tables (the stores hold them)
            };
            if rows.len() != ours.data.len() {
                return Err(TrainError::Config(format!(
                    "training.init_from: table {} has {} values in the checkpoint, {} in this run",
                    ours.name,
                    rows.len(),
                    ours.data.len()
                )));
            }
            ours.data.copy_from_slice(rows);
        }
        Ok(())
    }

    /// The rows `ids` of node type `ty`'s table as loaded (`None`: not loaded).
    pub fn rows(&self, ty: usize, ids: &[u32]) -> Option<Vec<f32>> {
        let table = self.tables.get(&ty)?;
        let d = self.dim;
        let mut out = Vec::with_capacity(ids.len() * d);
        for &id in ids {
            out.extend_from_slice(table.get(id as usize * d..(id as usize + 1) * d)?);
        }
        Some(out)
    }
}
