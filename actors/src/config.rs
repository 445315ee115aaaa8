//! The run configuration: one TOML schema (docs/guide/configuration.md and
//! docs/guide/cluster.md), any key overridable with `--set section.key=value`. Unknown keys are errors.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
pub use crate::modes::kind::Mode;
use models::ModelKind;

/// Most negatives per edge accepted (training and evaluation).
pub const MAX_NEGATIVES: usize = 100_000;

/// Largest hidden or embedding width accepted.
pub const MAX_WIDTH: usize = 1 << 16;

/// The whole configuration file: `[training]` for every command, plus the
/// runtime's `[cluster]`, `[placement]`, `[links]` and `[chaos]` sections
/// for `node`, `launch` and `doctor` (see [`runtime::config`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[training]`
    #[serde(default)]
    pub training: TrainingConfig,
    /// `[cluster]`: nodes and certificates; absent, everything runs embedded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<runtime::ClusterConfig>,
    /// `[placement]`: actor name (or `prefix/*`) to node id.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub placement: runtime::Placement,
    /// `[links]`: bandwidth and latency shaping.
    #[serde(default)]
    pub links: runtime::LinksConfig,
    /// `[chaos]`: seeded fault injection.
    #[serde(default)]
    pub chaos: runtime::ChaosConfig,
    /// What parsing noticed and let pass (deprecated keys), for the caller to show.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// What the model is trained to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// Predict the target type's labels (the default).
    #[default]
    NodeClassification,
    /// Predict the edges of `target_relations`, scored by `decoder`.
    LinkPrediction,
    /// Predict the target type's values (`values.npy`), by `regression_loss`.
    NodeRegression,
    /// Predict the labels of the edges of `target_relations` (`edges/<relation>/labels.npy`).
    EdgeClassification,
    /// Predict the values of the edges of `target_relations` (`edges/<relation>/values.npy`).
    EdgeRegression,
    /// Predict the target type's label sets (`label_sets.npy`): a yes/no per label.
    MultiLabel,
}

impl Task {
    /// The task's name, as configs and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Task::NodeClassification => "node-classification",
            Task::LinkPrediction => "link-prediction",
            Task::NodeRegression => "node-regression",
            Task::EdgeClassification => "edge-classification",
            Task::EdgeRegression => "edge-regression",
            Task::MultiLabel => "multi-label",
        }
    }

    /// Whether it learns targets of edges (labels or values).
    pub fn on_edges(self) -> bool {
        matches!(self, Task::EdgeClassification | Task::EdgeRegression)
    }

    /// Whether it learns targets of the target type's nodes.
    pub fn on_nodes(self) -> bool {
        matches!(
            self,
            Task::NodeClassification | Task::NodeRegression | Task::MultiLabel
        )
    }

    /// Whether class weights and focal loss apply to it.
    pub fn weighs_classes(self) -> bool {
        matches!(self, Task::NodeClassification | Task::MultiLabel)
    }
}

/// One task of a multi-task run (`[[training.tasks]]`) and its weight in the loss.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskWeight {
    /// The task.
    pub task: Task,
    /// Its loss's weight in the sum the model is trained on (default 1).
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// Where a link-prediction batch's negative destinations come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NegativeSampler {
    /// `negatives` destinations per positive edge, uniform over the
    /// relation's destination type, keyed by the edge (the default).
    #[default]
    Uniform,
    /// The destinations of the next `negatives` positive edges of the same
    /// relation in the batch (no extra nodes to embed).
    InBatch,
}

/// How held-out edges are embedded for scoring (link prediction, edge tasks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkEval {
    /// Exact in a single process, sampled in the distributed modes.
    #[default]
    Auto,
    /// Exact layer-wise inference over full neighbourhoods (single process).
    Exact,
    /// Neighbourhoods sampled with the training fanouts, keyed by node alone.
    Sampled,
}

/// How the device cache divides its budget between node types.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CachePolicy {
    /// Visits × miss penalty per type (Heta).
    #[default]
    MissPenalty,
    /// Visits alone (the hotness-only ablation).
    Hotness,
    /// No cache.
    None,
}

impl CachePolicy {
    /// The name used in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::MissPenalty => "miss-penalty",
            CachePolicy::Hotness => "hotness",
            CachePolicy::None => "none",
        }
    }
}

/// How data-parallel trainers sum their dense gradients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllReduce {
    /// Everyone sends everything to everyone: one round, (K-1)·n values sent per trainer.
    #[default]
    AllGather,
    /// Ring: 2(K-1) rounds, 2(K-1)/K·n values sent per trainer.
    Ring,
}

/// `[training]`: what to train and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainingConfig {
    /// Distribution mode (default "single").
    pub mode: Mode,
    /// Graph directory; absent: a mag-like graph at scale 0.01 generated once into the cache directory.
    pub data: Option<PathBuf>,
    /// Partition directory (`hetgnn partition --out`): edge-cut partitions for
    /// data-parallel training, meta-partitions for raf.
    pub partitions: Option<PathBuf>,
    /// Gradient all-reduce of data-parallel, hopgnn and full-graph training:
    /// "all-gather" (default) or "ring".
    pub allreduce: AllReduce,
    /// "node-classification" (default), "link-prediction", "node-regression",
    /// "edge-classification" or "edge-regression".
    pub task: Task,
    /// Multi-task: node tasks trained together on the target type, each
    /// with its weight in the loss (`[[training.tasks]]`); the first is the
    /// primary task (`task` is it: the report's top-level figures and the
    /// best epoch's metric). Empty (default): `task` alone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskWeight>,
    /// The validation metric that picks the report's best epoch: "auto"
    /// (default: the task's own) or a metric the task measures.
    pub select_metric: SelectMetric,
    /// Node classification: "none" (default), "balanced" or a weight per class.
    pub class_weights: ClassWeights,
    /// Node classification: the focal loss's γ (default 0: cross-entropy).
    pub focal_gamma: f64,
    /// Node and edge regression: "mse" (default) or "huber".
    pub regression_loss: RegressionLoss,
    /// Node and edge regression with the Huber loss: where it turns from squared to linear (default 1.0).
    pub huber_delta: f64,
    /// Link prediction and edge tasks: the relations whose edges are predicted, canonical
    /// `src__name__dst` names of stored relations (a list, or one string with commas).
    #[serde(deserialize_with = "names")]
    pub target_relations: Vec<String>,
    /// Link prediction: negative edges per positive edge (default 5).
    pub negatives: usize,
    /// Link prediction: "uniform" (default) or "in-batch".
    pub negative_sampler: NegativeSampler,
    /// Link prediction: "dot" (default) or "distmult".
    pub decoder: models::link::Decoder,
    /// Edge tasks: "mlp" (default: concatenated ends through an MLP) or "distmult".
    pub edge_decoder: models::edge::EdgeDecoder,
    /// Edge tasks: embeddings for evaluation by "exact" inference or
    /// "sampled" neighbourhoods (default "auto": exact in one process, sampled otherwise).
    pub edge_eval: LinkEval,
    /// Link prediction: "cross-entropy" (default) or "contrastive".
    pub link_loss: models::link::LinkLoss,
    /// Link prediction: fixed negatives each validation and test edge is ranked against (default 1000).
    pub eval_negatives: usize,
    /// Link prediction: embeddings for evaluation by "exact" inference or
    /// "sampled" neighbourhoods (default "auto": exact in one process, sampled otherwise).
    pub link_eval: LinkEval,
    /// Link prediction: shares of the target relations' edges held out for
    /// validation and test, `[valid, test]` (default [0.05, 0.05]).
    pub edge_split: [f64; 2],
    /// Link prediction: seed of the edge split (default 0; independent of `seed`,
    /// so runs of different seeds are measured on the same edges).
    #[serde(deserialize_with = "u64_or_string")]
    pub edge_split_seed: u64,
    /// "rgcn" (default), "rgat", "hgt" or "mlp".
    pub model: ModelKind,
    /// Number of layers (default 2); must equal the number of fanouts.
    pub layers: usize,
    /// Passes over the training nodes (default 10).
    pub epochs: u64,
    /// Seed nodes per step (default 1024).
    pub batch: usize,
    /// Neighbors sampled per relation and hop, seeds outward (default [25, 20]).
    #[serde(deserialize_with = "fanouts")]
    pub fanouts: Vec<usize>,
    /// Hidden width (default 64).
    pub hidden: usize,
    /// Attention heads of R-GAT and HGT (default 4; hidden must be a multiple).
    pub heads: usize,
    /// Width of learnable embeddings of featureless types (default 64).
    pub embed_dim: usize,
    /// Adam learning rate (default 0.01).
    pub lr: f64,
    /// Dropout after every layer but the last (default 0.5).
    pub dropout: f32,
    /// Seed of initialisation, batch order, sampling and dropout (default 0;
    /// any u64: TOML integers stop at 2^63 - 1, so larger ones are written as strings).
    #[serde(deserialize_with = "u64_or_string")]
    pub seed: u64,
    /// Add `rev_<name>` relations at load (default true).
    pub reverse_edges: bool,
    /// "cpu" (default) or "cuda:N".
    pub device: String,
    /// Where to write the JSON report (default: none).
    pub report: Option<PathBuf>,
    /// Evaluate (validation and test) after every `eval_every`-th epoch and
    /// after the last (default 1: every epoch). Full-graph evaluation is a
    /// forward pass that broadcasts every block, so it can cost as much as a
    /// training epoch's forward pass.
    pub eval_every: u64,
    /// Directory for checkpoints (default: none). Single-process runs write
    /// one after every epoch; distributed runs every `checkpoint_every` steps
    /// and at the end, and resume from it by themselves.
    pub checkpoint_dir: Option<PathBuf>,
    /// Distributed runs: steps between checkpoints (default 0: every epoch).
    pub checkpoint_every: u64,
    /// How many checkpoints to keep (default 3).
    pub checkpoint_keep: usize,
    /// Resume from the newest valid checkpoint in `checkpoint_dir` (default false).
    pub resume: bool,
    /// Start from another run's checkpoint (pre-train, then fine-tune): a
    /// checkpoint directory or root of either kind, trained on the same graph
    /// with the same architecture (default: none, a fresh model).
    pub init_from: Option<PathBuf>,
    /// The parts `init_from` loads: "embed" (learnable tables), "gnn" (the
    /// relational layers; the output layer of another task starts afresh),
    /// "decoder" (the task's head) (default ["embed", "gnn"]).
    #[serde(deserialize_with = "names")]
    pub init_parts: Vec<String>,
    /// The loaded parts left as loaded, not trained (default none).
    #[serde(deserialize_with = "names")]
    pub freeze: Vec<String>,
    /// How the device cache divides its bytes between node types:
    /// "miss-penalty" (default, Heta), "hotness" or "none".
    pub cache_policy: CachePolicy,
    /// Device cache size per trainer or raf worker, e.g. "4GiB" (default 0: no cache).
    pub cache_bytes: runtime::ByteSize,
    /// Epochs pre-sampled to count node visits before the cache is filled (default 2).
    pub cache_presample_epochs: u64,
    /// The mode's own settings, the sub-table `[training.<mode>]` (defined
    /// and checked in the mode's folder: [`crate::modes::seam::ModeConfig`]). Any
    /// other key lands here too and is refused by [`Config::validate`].
    #[serde(flatten)]
    pub modes: BTreeMap<String, serde_json::Value>,
}

impl TrainingConfig {
    /// The tasks trained and their weights: `tasks`, or `task` alone with weight 1.
    pub fn task_list(&self) -> Vec<TaskWeight> {
        match self.tasks.is_empty() {
            true => vec![TaskWeight {
                task: self.task,
                weight: 1.0,
            }],
            false => self.tasks.clone(),
        }
    }

    /// The task trained on edges (link prediction, an edge task), if any:
    /// `task` itself, or the one such task of a `tasks` list.
    pub fn edge_level(&self) -> Option<Task> {
        match self.task.on_nodes() {
            false => Some(self.task),
            true => self.tasks.iter().map(|w| w.task).find(|t| !t.on_nodes()),
        }
    }

    /// A `tasks` list of node tasks with an edge-level task among them (its
    /// position in the list).
    pub fn mixed_tasks(&self) -> Option<usize> {
        match self.task.on_nodes() {
            true => self.tasks.iter().position(|w| !w.task.on_nodes()),
            false => None,
        }
    }

    /// The model these settings describe.
    pub fn model_spec(&self) -> models::ModelSpec {
        let edge_level = self.edge_level();
        let link = (edge_level == Some(Task::LinkPrediction)).then(|| models::link::LinkSpec {
            relations: self.target_relations.clone(),
            decoder: self.decoder,
        });
        let edge = edge_level
            .filter(|t| t.on_edges())
            .map(|t| models::edge::EdgeSpec {
                relations: self.target_relations.clone(),
                decoder: self.edge_decoder,
                values: t == Task::EdgeRegression,
            });
        models::ModelSpec {
            kind: self.model,
            layers: self.layers,
            hidden: self.hidden,
            embed_dim: self.embed_dim,
            dropout: self.dropout,
            seed: self.seed,
            heads: self.heads,
            link,
            head: head_of(self.task),
            task_heads: match self.tasks.len() {
                0 => Vec::new(),
                _ => self
                    .tasks
                    .iter()
                    .filter(|w| w.task.on_nodes())
                    .map(|w| head_of(w.task))
                    .collect(),
            },
            edge,
        }
    }

    /// The task's settings a run's checkpoints must share, and what it started
    /// from (empty for plain node classification).
    pub fn link_fingerprint(&self) -> String {
        let task = self.task_fingerprint();
        match &self.init_from {
            None => task,
            Some(p) => format!(
                "{task}|init {}|{:?}|{:?}",
                p.display(),
                self.init_parts,
                self.freeze
            ),
        }
    }

    fn task_fingerprint(&self) -> String {
        if !self.tasks.is_empty() {
            let each: Vec<String> = self
                .tasks
                .iter()
                .map(|w| format!("{:?}*{}", w.task, w.weight))
                .collect();
            let tasks = format!(
                "tasks {}|{:?}|{}|{:?}|{}",
                each.join(","),
                self.class_weights,
                self.focal_gamma,
                self.regression_loss,
                self.huber_delta
            );
            return match self.mixed_tasks() {
                Some(_) => format!("{tasks}|{}", self.edge_fingerprint()),
                None => tasks,
            };
        }
        self.one_task_fingerprint()
    }

    /// The settings of the edge-level task that shape a run ([`TrainingConfig::edge_level`]).
    fn edge_fingerprint(&self) -> String {
        match self.edge_level() {
            Some(Task::EdgeClassification) => format!("{:?}", Task::EdgeClassification),
            Some(Task::EdgeRegression) => format!(
                "{:?}|{:?}|{}",
                Task::EdgeRegression,
                self.regression_loss,
                self.huber_delta
            ),
            Some(Task::LinkPrediction) => format!(
                "{:?}|{:?}|{:?}|{}|{:?}|{}",
                Task::LinkPrediction,
                self.negative_sampler,
                self.link_loss,
                self.negatives,
                self.edge_split,
                self.edge_split_seed
            ),
            _ => String::new(),
        }
    }

    /// A one-task run's settings that shape it.
    fn one_task_fingerprint(&self) -> String {
        match self.task {
            Task::NodeClassification
                if self.focal_gamma == 0.0 && self.class_weights == Default::default() =>
            {
                String::new()
            }
            Task::NodeClassification => {
                format!("{:?}|{}", self.class_weights, self.focal_gamma)
            }
            Task::MultiLabel => format!(
                "{:?}|{:?}|{}",
                self.task, self.class_weights, self.focal_gamma
            ),
            Task::NodeRegression | Task::EdgeRegression => format!(
                "{:?}|{:?}|{}",
                self.task, self.regression_loss, self.huber_delta
            ),
            Task::EdgeClassification | Task::LinkPrediction => self.edge_fingerprint(),
        }
    }

    /// Whether link prediction evaluates by exact inference.
    pub fn exact_link_eval(&self) -> bool {
        match self.link_eval {
            LinkEval::Auto => self.mode.one_process(),
            LinkEval::Exact => true,
            LinkEval::Sampled => false,
        }
    }

    /// Whether an edge task evaluates by exact inference.
    pub fn exact_edge_eval(&self) -> bool {
        match self.edge_eval {
            LinkEval::Auto => self.mode.one_process(),
            LinkEval::Exact => true,
            LinkEval::Sampled => false,
        }
    }

    /// Link prediction's edge split.
    pub fn split_spec(&self) -> graphs::link::SplitSpec {
        graphs::link::SplitSpec {
            valid: self.edge_split[0],
            test: self.edge_split[1],
            seed: self.edge_split_seed,
        }
    }
}

/// What a target node's output is under node task `task` (classes for the others).
fn head_of(task: Task) -> models::model::Head {
    match task {
        Task::NodeRegression => models::model::Head::Value,
        Task::MultiLabel => models::model::Head::Labels,
        _ => models::model::Head::Classes,
    }
}

impl Default for TrainingConfig {
    fn default() -> Self {
        TrainingConfig {
            mode: Mode::default(),
            data: None,
            partitions: None,
            allreduce: AllReduce::AllGather,
            task: Task::NodeClassification,
            tasks: Vec::new(),
            class_weights: ClassWeights::default(),
            focal_gamma: 0.0,
            regression_loss: RegressionLoss::Mse,
            select_metric: SelectMetric::Auto,
            huber_delta: 1.0,
            target_relations: Vec::new(),
            negatives: 5,
            negative_sampler: NegativeSampler::Uniform,
            decoder: models::link::Decoder::Dot,
            edge_decoder: models::edge::EdgeDecoder::Mlp,
            edge_eval: LinkEval::Auto,
            link_loss: models::link::LinkLoss::CrossEntropy,
            eval_negatives: 1000,
            link_eval: LinkEval::Auto,
            edge_split: [0.05, 0.05],
            edge_split_seed: 0,
            model: ModelKind::Rgcn,
            layers: 2,
            epochs: 10,
            batch: 1024,
            fanouts: vec![25, 20],
            hidden: 64,
            heads: 4,
            embed_dim: 64,
            lr: 0.01,
            dropout: 0.5,
            seed: 0,
            reverse_edges: true,
            device: "cpu".into(),
            report: None,
            eval_every: 1,
            checkpoint_dir: None,
            checkpoint_every: 0,
            checkpoint_keep: 3,
            resume: false,
            init_from: None,
            init_parts: vec!["embed".into(), "gnn".into()],
            freeze: Vec::new(),
            cache_policy: CachePolicy::MissPenalty,
            cache_bytes: runtime::ByteSize(0),
            cache_presample_epochs: 2,
            modes: BTreeMap::new(),
        }
    }
}

/// Accepts `["a__r__b", "c__s__d"]` or `"a__r__b,c__s__d"` (convenient on the command line).
fn names<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        List(Vec<String>),
        Text(String),
    }
    Ok(match N::deserialize(d)? {
        N::List(v) => v,
        N::Text(s) => s
            .split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect(),
    })
}

/// Accepts `[25, 20]`, `"25,20"` (convenient on the command line) or a single `25`.
fn fanouts<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<usize>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum F {
        List(Vec<usize>),
        One(usize),
        Text(String),
    }
    match F::deserialize(d)? {
        F::List(v) => Ok(v),
        F::One(v) => Ok(vec![v]),
        F::Text(s) => s
            .split(',')
            .map(|p| {
                p.trim().parse::<usize>().map_err(|_| {
                    serde::de::Error::custom(format!(
                        "fanouts: '{p}' is not a non-negative integer"
                    ))
                })
            })
            .collect(),
    }
}

// `Config::parse`, `Config::load` and `Config::validate`, which ask the
// modes for their settings, are defined by the registry (`crate::modes`), so
// that this file knows no mode.
impl Config {
    /// `text` (TOML) with `overrides` (`section.key=value`) applied, read as
    /// it stands: neither the modes' former keys moved nor anything checked.
    pub(crate) fn from_toml(text: &str, overrides: &[String]) -> Result<Config> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| TrainError::Config(e.to_string()))?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        // A multi-task run's `task` is its first task's, unless given.
        if let Some(toml::Value::Table(t)) = table.get_mut("training") {
            let first = match t.get("tasks") {
                Some(toml::Value::Array(a)) => a.first().and_then(|f| f.get("task")).cloned(),
                _ => None,
            };
            if let (Some(first), false) = (first, t.contains_key("task")) {
                t.insert("task".into(), first);
            }
        }
        Config::deserialize(toml::Value::Table(table))
            .map_err(|e| TrainError::Config(e.to_string()))
    }

    /// The runtime's view of the file, if it has a `[cluster]` section.
    pub fn topology(&self) -> Option<runtime::Topology> {
        let cluster = self.cluster.clone()?;
        Some(runtime::Topology {
            cluster,
            placement: self.placement.clone(),
            links: self.links.clone(),
            chaos: self.chaos.clone(),
        })
    }

    /// Checks the topology, naming the key at fault.
    pub(crate) fn validate_topology(&self) -> Result<()> {
        if let Some(t) = self.topology() {
            t.validate()
                .map_err(|e| TrainError::Config(e.to_string()))?;
        } else if !self.placement.is_empty() {
            return Err(TrainError::Config(
                "placement: needs a [cluster] section naming the nodes".into(),
            ));
        }
        Ok(())
    }

    /// Checks the shared `[training]` values and their combinations, naming
    /// the key at fault (each mode checks its own: [`crate::modes::seam::ModeConfig::check`]).
    pub(crate) fn validate_shared(&self) -> Result<()> {
        let t = &self.training;
        let bad = |m: String| Err(TrainError::Config(m));
        if t.layers == 0 {
            return bad("training.layers must be at least 1".into());
        }
        if t.fanouts.len() != t.layers {
            return bad(format!("training.fanouts lists {} values but training.layers is {}: give one fanout per layer", t.fanouts.len(), t.layers));
        }
        if t.batch == 0 {
            return bad("training.batch must be at least 1".into());
        }
        let load = crate::pretrained::part::parts("training.init_parts", &t.init_parts)?;
        let freeze = crate::pretrained::part::parts("training.freeze", &t.freeze)?;
        if let Some(p) = freeze.iter().find(|p| !load.contains(p)) {
            return bad(format!("training.freeze names '{}', which training.init_parts does not load: only loaded parts can be frozen", p.name()));
        }
        let default_load = crate::pretrained::part::parts(
            "training.init_parts",
            &TrainingConfig::default().init_parts,
        )?;
        if t.init_from.is_none() && (!t.freeze.is_empty() || load != default_load) {
            return bad("training.init_parts and training.freeze apply with training.init_from (the checkpoint to start from)".into());
        }
        if t.init_from.is_some() && load.is_empty() {
            return bad("training.init_parts is empty: name what training.init_from loads (embed, gnn, decoder)".into());
        }
        if t.hidden == 0 || t.embed_dim == 0 || t.hidden > MAX_WIDTH || t.embed_dim > MAX_WIDTH {
            return bad(format!(
                "training.hidden and training.embed_dim must be in 1..={MAX_WIDTH}"
            ));
        }
        if !(t.lr.is_finite() && t.lr > 0.0) {
            return bad(format!(
                "training.lr must be a positive number, got {}",
                t.lr
            ));
        }
        if !(0.0..1.0).contains(&t.dropout) {
            return bad(format!(
                "training.dropout must be in [0, 1), got {}",
                t.dropout
            ));
        }
        if t.eval_every == 0 {
            return bad(
                "training.eval_every must be at least 1 (the last epoch is always evaluated)"
                    .into(),
            );
        }
        let edge_level = t.edge_level();
        if edge_level == Some(Task::LinkPrediction) {
            if t.target_relations.is_empty() {
                return bad("training.task = \"link-prediction\" needs training.target_relations (canonical names such as \"author__writes__paper\")".into());
            }
            if t.model == ModelKind::Mlp {
                return bad("training.task = \"link-prediction\" needs a relational model (rgcn, rgat or hgt): the MLP reads only the target type".into());
            }
            if !(1..=MAX_NEGATIVES).contains(&t.negatives)
                || !(1..=MAX_NEGATIVES).contains(&t.eval_negatives)
            {
                return bad(format!(
                    "training.negatives and training.eval_negatives must be in 1..={MAX_NEGATIVES}"
                ));
            }
            if t.cache_bytes.0 > 0 {
                return bad("training.cache_bytes: the device cache is not supported with link prediction yet".into());
            }
            self.training
                .split_spec()
                .validate()
                .map_err(|e| TrainError::Config(format!("training.edge_split: {e}")))?;
        } else if let Some(task) = edge_level.filter(|e| e.on_edges()) {
            if t.target_relations.is_empty() {
                return bad(format!("training.task = \"{}\" needs training.target_relations (canonical names such as \"author__writes__paper\")", task.name()));
            }
            if t.model == ModelKind::Mlp {
                return bad(format!("training.task = \"{}\" needs a relational model (rgcn, rgat or hgt): the MLP reads only the target type", task.name()));
            }
            if t.cache_bytes.0 > 0 {
                return bad(format!("training.cache_bytes: the device cache is not supported with training.task = \"{}\" yet", task.name()));
            }
        } else if !t.target_relations.is_empty() {
            return bad(
                "training.target_relations applies to training.task = \"link-prediction\", \"edge-classification\" and \"edge-regression\"".into(),
            );
        }
        check_tasks(t)?;
        t.select_metric.check(t.task)?;
        t.class_weights.check()?;
        if !(t.focal_gamma.is_finite() && (0.0..=10.0).contains(&t.focal_gamma)) {
            return bad(format!(
                "training.focal_gamma must be in 0..=10, got {}",
                t.focal_gamma
            ));
        }
        let weighted = t.focal_gamma > 0.0 || t.class_weights != Default::default();
        if weighted && !t.task_list().iter().any(|w| w.task.weighs_classes()) {
            return bad(format!(
                "training.class_weights and training.focal_gamma apply to training.task = \"node-classification\" and \"multi-label\", not \"{}\"",
                t.task.name()
            ));
        }
        if !(t.huber_delta.is_finite() && t.huber_delta > 0.0) {
            return bad(format!(
                "training.huber_delta must be a positive number, got {}",
                t.huber_delta
            ));
        }
        if t.resume && t.checkpoint_dir.is_none() {
            return bad("training.resume needs training.checkpoint_dir (--checkpoint DIR)".into());
        }
        if t.checkpoint_keep == 0 {
            return bad("training.checkpoint_keep must be at least 1".into());
        }
        if t.cache_bytes.0 > 0
            && t.cache_policy != CachePolicy::None
            && t.cache_presample_epochs == 0
        {
            return bad("training.cache_presample_epochs must be at least 1 when training.cache_bytes is set: the cache is filled by pre-sampled visits".into());
        }
        Ok(())
    }
}

/// Refuses a multi-task list that is not node tasks (with at most one
/// edge-level task after the first), each once, with finite non-negative
/// weights not all 0, led by `training.task`.
fn check_tasks(t: &TrainingConfig) -> Result<()> {
    let Some(first) = t.tasks.first() else {
        return Ok(());
    };
    let bad = |m: String| Err(TrainError::Config(m));
    if first.task != t.task {
        return bad(format!(
            "training.task = \"{}\" but the first of training.tasks is \"{}\": the first task is the primary one; leave training.task out or make them the same",
            t.task.name(),
            first.task.name()
        ));
    }
    for (i, w) in t.tasks.iter().enumerate() {
        if i == 0 && !w.task.on_nodes() {
            return bad(format!(
                "training.tasks: the first task is the primary one (it picks the best epoch) and must be a node task of the target type (\"node-classification\", \"node-regression\" or \"multi-label\"), not \"{}\": list it after one",
                w.task.name()
            ));
        }
        if let Some(other) = t.tasks[..i]
            .iter()
            .find(|o| !o.task.on_nodes() && !w.task.on_nodes() && o.task != w.task)
        {
            return bad(format!(
                "training.tasks lists \"{}\" and \"{}\": a run trains at most one task on edges (link prediction or an edge task) beside its node tasks",
                other.task.name(),
                w.task.name()
            ));
        }
        if t.tasks[..i].iter().any(|o| o.task == w.task) {
            return bad(format!("training.tasks lists \"{}\" twice", w.task.name()));
        }
        if !(w.weight.is_finite() && w.weight >= 0.0) {
            return bad(format!(
                "training.tasks: the weight of \"{}\" must be a finite number of at least 0, got {}",
                w.task.name(),
                w.weight
            ));
        }
    }
    if t.tasks.iter().all(|w| w.weight == 0.0) {
        return bad("training.tasks: every weight is 0, so nothing would be learned".into());
    }
    Ok(())
}

/// A u64 from a TOML integer (at most 2^63 - 1) or a string of digits (any u64).
fn u64_or_string<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Int(i64),
        Text(String),
    }
    match Either::deserialize(d)? {
        Either::Int(v) => u64::try_from(v).map_err(|_| {
            serde::de::Error::custom(format!(
                "{v} is negative: expected 0..=18446744073709551615"
            ))
        }),
        Either::Text(s) => s.trim().parse().map_err(|_| {
            serde::de::Error::custom(format!(
                "'{s}' is not an integer in 0..=18446744073709551615"
            ))
        }),
    }
}

/// `s` as a TOML string literal (for building `--set` overrides from flags).
pub fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Sets `a.b=value` (or `a.b.c=value`: a key of a sub-table) in `table`;
/// the value is TOML (`2`, `"x"`, `[25, 20]`) or else a bare string.
fn apply_override(table: &mut toml::Table, o: &str) -> Result<()> {
    let (key, raw) = o
        .split_once('=')
        .ok_or_else(|| TrainError::Config(format!("--set {o}: expected section.key=value")))?;
    let path: Vec<&str> = key.trim().split('.').map(str::trim).collect();
    if !(2..=3).contains(&path.len()) || path.iter().any(|p| p.is_empty()) {
        return Err(TrainError::Config(format!(
            "--set {o}: the key must be section.key (or section.table.key)"
        )));
    }
    let value = match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let (last, tables) = path.split_last().expect("two or three parts");
    let mut at = table;
    for (i, name) in tables.iter().enumerate() {
        let entry = at
            .entry(name.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(inner) = entry else {
            return Err(TrainError::Config(format!(
                "--set {o}: '{}' is not a table",
                path[..=i].join(".")
            )));
        };
        at = inner;
    }
    at.insert(last.to_string(), value);
    Ok(())
}

/// Node regression's loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RegressionLoss {
    /// Mean squared error (the default).
    #[default]
    Mse,
    /// Huber: squared below `huber_delta`, linear above (robust to outliers).
    Huber,
}

/// How node classification weighs each class in its loss.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClassWeights {
    /// "none" (every node counts 1, the default) or "balanced" (a class
    /// weighs `training nodes / (classes × its training nodes)`).
    Named(String),
    /// One weight per class, in class order.
    List(Vec<f64>),
}

impl Default for ClassWeights {
    fn default() -> Self {
        ClassWeights::Named("none".into())
    }
}

/// The validation metric that picks the best epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectMetric {
    /// The task's own: accuracy for classification, micro F1 for multi-label,
    /// RMSE for regression, MRR for links.
    #[default]
    Auto,
    /// Share of correct classes (higher is better).
    Accuracy,
    /// Mean per-class F1 (higher is better).
    MacroF1,
    /// Area under the ROC curve, binary edge classification and multi-label (higher is better).
    RocAuc,
    /// F1 of every label's counts pooled, multi-label (higher is better).
    MicroF1,
    /// Average precision, binary edge classification and multi-label (higher is better).
    AveragePrecision,
    /// Root mean squared error (lower is better).
    Rmse,
    /// Mean absolute error (lower is better).
    Mae,
    /// Coefficient of determination (higher is better).
    R2,
    /// Mean reciprocal rank, link prediction (higher is better).
    Mrr,
}

impl SelectMetric {
    /// The metric's name, as configs spell it.
    pub fn name(self) -> &'static str {
        match self {
            SelectMetric::Auto => "auto",
            SelectMetric::Accuracy => "accuracy",
            SelectMetric::MacroF1 => "macro-f1",
            SelectMetric::RocAuc => "roc-auc",
            SelectMetric::MicroF1 => "micro-f1",
            SelectMetric::AveragePrecision => "average-precision",
            SelectMetric::Rmse => "rmse",
            SelectMetric::Mae => "mae",
            SelectMetric::R2 => "r2",
            SelectMetric::Mrr => "mrr",
        }
    }

    /// `Auto` made concrete for `task`.
    pub fn resolve(self, task: Task) -> SelectMetric {
        match (self, task) {
            (SelectMetric::Auto, Task::NodeClassification | Task::EdgeClassification) => {
                SelectMetric::Accuracy
            }
            (SelectMetric::Auto, Task::NodeRegression | Task::EdgeRegression) => SelectMetric::Rmse,
            (SelectMetric::Auto, Task::LinkPrediction) => SelectMetric::Mrr,
            (SelectMetric::Auto, Task::MultiLabel) => SelectMetric::MicroF1,
            (m, _) => m,
        }
    }

    /// Refuses a metric `task` does not measure.
    pub fn check(self, task: Task) -> crate::error::Result<()> {
        let ok = match self.resolve(task) {
            SelectMetric::Auto => true,
            SelectMetric::Accuracy | SelectMetric::MacroF1 => matches!(
                task,
                Task::NodeClassification | Task::EdgeClassification | Task::MultiLabel
            ),
            SelectMetric::RocAuc | SelectMetric::AveragePrecision => {
                matches!(task, Task::EdgeClassification | Task::MultiLabel)
            }
            SelectMetric::MicroF1 => task == Task::MultiLabel,
            SelectMetric::Rmse | SelectMetric::Mae | SelectMetric::R2 => {
                matches!(task, Task::NodeRegression | Task::EdgeRegression)
            }
            SelectMetric::Mrr => task == Task::LinkPrediction,
        };
        match ok {
            true => Ok(()),
            false => Err(crate::error::TrainError::Config(format!(
                "training.select_metric = \"{}\" is not measured by training.task = \"{}\"",
                self.name(),
                task.name()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::ByteSize;

    #[test]
    fn defaults_files_and_overrides() {
        let c = Config::parse("", &[]).unwrap();
        assert_eq!(c.training, TrainingConfig::default());
        let c = Config::parse(
            "[training]\nepochs = 3\nfanouts = [5]\nlayers = 1\n",
            &["training.model=mlp".into(), "training.lr=0.5".into()],
        )
        .unwrap();
        assert_eq!(
            (c.training.epochs, c.training.model, c.training.lr),
            (3, ModelKind::Mlp, 0.5)
        );
        let c = Config::parse(
            "",
            &[
                "training.fanouts=10,5".into(),
                "training.data=/tmp/g".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.training.fanouts, vec![10, 5]);
        assert_eq!(c.training.data, Some(PathBuf::from("/tmp/g")));
        let c = Config::parse(
            "[training]\ncache_bytes = \"4GiB\"\ncache_policy = \"hotness\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(
            (c.training.cache_bytes, c.training.cache_policy),
            (ByteSize(4 << 30), crate::cache::CachePolicy::Hotness)
        );
        let c = Config::parse("", &["training.cache_bytes=1.5MB".into()]).unwrap();
        assert_eq!(c.training.cache_bytes, ByteSize(1_500_000));
        assert_eq!(
            Config::parse("", &["training.cache_bytes=300".into()])
                .unwrap()
                .training
                .cache_bytes,
            ByteSize(300)
        );
    }

    #[test]
    fn errors_name_the_key() {
        let err = |text: &str, o: &[&str]| {
            Config::parse(text, &o.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap_err()
                .to_string()
        };
        assert!(err("[training]\nepoch = 3\n", &[]).contains("unknown field `epoch`"));
        assert!(err("[trainning]\n", &[]).contains("unknown field `trainning`"));
        assert!(err("", &["training.fanouts=25"])
            .contains("training.fanouts lists 1 values but training.layers is 2"));
        assert!(err("", &["training.model=gat"]).contains("unknown variant `gat`"));
        assert!(err("", &["training.lr=-1"]).contains("training.lr"));
        assert!(err("", &["training.mode=heta"]).contains("unknown variant `heta`"));
        assert!(err("", &["epochs=3"]).contains("section.key"));
        assert!(err("", &["training.fanouts=a,b"]).contains("fanouts"));
        assert!(err("", &["training.cache_bytes=4 GB/s"]).contains("bad size"));
        assert!(err("", &["training.cache_policy=lru"]).contains("unknown variant `lru`"));
        assert!(err(
            "",
            &[
                "training.cache_bytes=1MiB",
                "training.cache_presample_epochs=0"
            ]
        )
        .contains("training.cache_presample_epochs"));
        assert!(
            err("", &["training.eval_every=0"]).contains("training.eval_every must be at least 1")
        );
        assert!(err(
            "",
            &["training.mode=\"model-averaging\"", "training.eval_every=2"]
        )
        .contains("model-averaging evaluates every epoch"));
        assert_eq!(
            Config::parse("", &["training.eval_every=5".into()])
                .unwrap()
                .training
                .eval_every,
            5
        );
        assert!(
            err("[training\n", &[]).contains("TOML")
                || err("[training\n", &[]).contains("expected")
        );
    }

    #[test]
    fn the_example_topology_files_load() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        for name in ["local-3.toml", "raf-2.toml"] {
            let c = Config::load(&dir.join(name), &[]).unwrap();
            assert!(c.topology().is_some(), "{name} has a cluster");
        }
        let raf = Config::load(&dir.join("raf-2.toml"), &[]).unwrap();
        assert_eq!(
            (
                raf.training.mode,
                raf.placement.get("reducer").map(String::as_str)
            ),
            (Mode::Raf, Some("n0"))
        );
    }
}

#[cfg(test)]
mod mode_settings {
    use super::*;
    use crate::hopgnn::{HopConfig, HopMigrate, HopTimeSteps};
    use crate::modes::seam::ModeConfig;

    fn parse(text: &str, o: &[&str]) -> Result<Config> {
        Config::parse(text, &o.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn err(text: &str, o: &[&str]) -> String {
        parse(text, o).unwrap_err().to_string()
    }

    #[test]
    fn a_mode_reads_its_own_table() {
        let c = parse(
            "[training]\nmode = \"hopgnn\"\n[training.hopgnn]\nmigrate = \"gradient\"\ntime_steps = 2\n",
            &[],
        )
        .unwrap();
        let h = HopConfig::of(&c.training).unwrap();
        assert_eq!(
            (h.migrate, h.time_steps, h.pregather),
            (HopMigrate::Gradient, HopTimeSteps::Fixed(2), true)
        );
        assert!(c.warnings.is_empty());
        // The same from the command line, three levels deep.
        let o = parse(
            "",
            &[
                "training.mode=\"hopgnn\"",
                "training.hopgnn.migrate=\"gradient\"",
                "training.hopgnn.time_steps=2",
            ],
        )
        .unwrap();
        assert_eq!(o.training, c.training);
        // Absent, the defaults.
        let d = parse("[training]\nmode = \"hopgnn\"\n", &[]).unwrap();
        assert_eq!(HopConfig::of(&d.training).unwrap(), HopConfig::default());
    }

    #[test]
    fn another_modes_table_is_refused_even_at_its_defaults() {
        let e = err(
            "[training]\nmode = \"raf\"\n[training.hopgnn]\nmigrate = \"model\"\n",
            &[],
        );
        assert!(
            e.contains("[training.hopgnn] applies to training.mode = \"hopgnn\", not \"raf\""),
            "{e}"
        );
        let e = err("", &["training.data-parallel.sampling_sink=false"]);
        assert!(
            e.contains("applies to training.mode = \"data-parallel\", not \"single\""),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_refused_at_both_levels() {
        let e = err(
            "[training]\nmode = \"hopgnn\"\n[training.hopgnn]\nmigrat = \"model\"\n",
            &[],
        );
        assert!(
            e.contains("training.hopgnn") && e.contains("unknown field `migrat`"),
            "{e}"
        );
        // A bad value names its key.
        let e = err(
            "",
            &[
                "training.mode=\"hopgnn\"",
                "training.hopgnn.migrate=\"all\"",
            ],
        );
        assert!(
            e.contains("training.hopgnn.migrate: unknown variant `all`"),
            "{e}"
        );
        let e = err("[training]\nepoch = 3\n", &[]);
        assert!(e.contains("unknown field `epoch`"), "{e}");
        let e = err("", &["training.hopgnn=3", "training.mode=\"hopgnn\""]);
        assert!(e.contains("expected a table"), "{e}");
        let e = err("", &["training.hopgnn.time_steps.x=3"]);
        assert!(e.contains("section.key"), "{e}");
    }

    #[test]
    fn former_flat_keys_are_read_with_a_warning_in_their_mode_only() {
        let c = parse(
            "[training]\nmode = \"hopgnn\"\nhop_time_steps = 2\nhop_pregather = false\n",
            &[],
        )
        .unwrap();
        let h = HopConfig::of(&c.training).unwrap();
        assert_eq!((h.time_steps, h.pregather), (HopTimeSteps::Fixed(2), false));
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("deprecated") && c.warnings[0].contains("[training.hopgnn]")
        );
        // The same setting twice is refused, not resolved silently.
        let e = err(
            "[training]\nmode = \"hopgnn\"\nhop_time_steps = 2\n[training.hopgnn]\ntime_steps = 3\n",
            &[],
        );
        assert!(e.contains("are the same setting"), "{e}");
        // A former key of another mode is refused, even at its default.
        let e = err("[training]\nmode = \"raf\"\nhop_migrate = \"model\"\n", &[]);
        assert!(
            e.contains("training.hop_migrate applies to training.mode = \"hopgnn\", not \"raf\""),
            "{e}"
        );
        // Values are checked as before.
        let e = err(
            "[training]\nmode = \"full-graph\"\nstaleness = \"fixed\"\nstaleness_epochs = 0\n",
            &[],
        );
        assert!(
            e.contains("training.full-graph.staleness_epochs must be in 1..="),
            "{e}"
        );
    }

    #[test]
    fn settings_survive_the_reports_json() {
        let c = parse(
            "[training]\nmode = \"model-averaging\"\n[training.model-averaging]\nsync_every = 3\n",
            &[],
        )
        .unwrap();
        let text = serde_json::to_string(&c).unwrap();
        assert!(
            text.contains("\"model-averaging\":{\"sync_every\":3}"),
            "{text}"
        );
        let back: Config = serde_json::from_str(&text).unwrap();
        assert_eq!(back, c);
        back.validate().unwrap();
    }
}
