//! The registry of training modes: the one place that names every mode. A
//! new mode is a folder implementing [`crate::distributed::Distributed`] (or
//! [`TrainingMode`] directly) and its settings ([`ModeConfig`], the
//! sub-table `[training.<mode>]`), plus its variant of [`Mode`], its entry in
//! [`REGISTRY`] and its arm in [`open`].

use std::sync::Arc;

use models::Model;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::config::{Config, Task, TrainingConfig};
use crate::data_parallel::DataParallel;
use crate::distributed::messages::EpochStats;
use crate::distributed::Distributed;
use crate::error::{Result, TrainError};
use crate::full_graph::FullGraph;
use crate::hopgnn::HopGnn;
use crate::model_averaging::ModelAveraging;
use crate::observer::TrainObserver;
use crate::raf::Raf;
use crate::report::{EpochReport, Report};

/// How training is distributed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Everything in one process (the default).
    #[default]
    Single,
    /// DistDGL: one partition per node, owner-compute sampling, feature
    /// pulls, sparse embedding updates at the stores, all-reduced gradients.
    DataParallel,
    /// Heta: relation-aggregation-first training on meta-partitions, one
    /// RelationAggWorker per partition and a designated reducer.
    Raf,
    /// CATGNN: local training on each partition (halo included), the
    /// models averaged every `sync_every` epochs.
    ModelAveraging,
    /// HopGNN: feature-centric training, one worker per partition; each
    /// step's models visit the partitions holding their roots' features.
    Hopgnn,
    /// SANCUS: full-graph training, one worker per block-row partition;
    /// each layer's blocks broadcast to every worker, or skipped while the
    /// receivers' cached copies are fresh enough (`staleness`).
    FullGraph,
}

impl Mode {
    /// The mode's name, as configs and reports spell it (and its sub-table's key).
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    fn entry(self) -> &'static Entry {
        REGISTRY
            .iter()
            .find(|e| e.mode == self)
            .expect("every mode is registered")
    }

    /// Whether the mode holds the whole graph in one process (exact inference is possible).
    pub fn one_process(self) -> bool {
        self.entry().one_process
    }

    /// What the shared coordinator, report and checkpoints ask of the mode.
    pub fn rules(self) -> &'static Rules {
        self.entry().rules
    }

    /// The mode named `name` (as configs, reports and checkpoints spell it).
    pub fn from_name(name: &str) -> Option<Mode> {
        REGISTRY.iter().find(|e| e.name == name).map(|e| e.mode)
    }
}

/// What shared code asks a mode rather than testing its name.
pub struct Rules {
    /// Each trainer takes steps of its own, on its own data (the run's steps
    /// are their sum, its loss and training accuracy their weighted mean),
    /// rather than a share of every global step.
    pub own_steps: bool,
    /// A distributed checkpoint may lack a parameter no partition uses (it
    /// keeps its initial value) rather than every one being written.
    pub partial_params: bool,
    /// Merges the mode's figures of an epoch, as its trainers sent them
    /// ([`crate::distributed::messages::EpochStats::figures`]), into the epoch's report.
    pub figures: fn(&mut EpochReport, &[EpochStats]) -> Result<()>,
}

/// The rules of a mode with no figures of its own, sharing global steps.
pub const PLAIN: Rules = Rules {
    own_steps: false,
    partial_params: false,
    figures: no_figures,
};

fn no_figures(_: &mut EpochReport, _: &[EpochStats]) -> Result<()> {
    Ok(())
}

/// A mode's own settings: the sub-table `[training.<mode>]`, defined and
/// checked in the mode's folder. Unknown keys are refused.
pub trait ModeConfig: Default + Serialize + DeserializeOwned {
    /// Keys the mode once read from `[training]` itself, and their names in
    /// its sub-table: still read, with a warning.
    const FORMER_KEYS: &'static [(&'static str, &'static str)] = &[];

    /// Checks the settings and their combinations with the shared ones.
    fn check(&self, _t: &TrainingConfig) -> Result<()> {
        Ok(())
    }

    /// The settings of `t`'s mode (the defaults where its sub-table is absent).
    fn of(t: &TrainingConfig) -> Result<Self> {
        let name = t.mode.name();
        match t.modes.get(name) {
            None => Ok(Self::default()),
            Some(v) => serde_path_to_error::deserialize(v).map_err(|e| {
                // The key at fault, where serde knows it (an unknown key is named in the message).
                let at = e.path().to_string();
                let key = if at == "." {
                    String::new()
                } else {
                    format!(".{at}")
                };
                TrainError::Config(format!("training.{name}{key}: {}", e.inner()))
            }),
        }
    }
}

/// What the registry knows of a mode.
struct Entry {
    mode: Mode,
    name: &'static str,
    former_keys: &'static [(&'static str, &'static str)],
    check: fn(&TrainingConfig) -> Result<()>,
    tasks: &'static [Task],
    one_process: bool,
    rules: &'static Rules,
    defaults: fn() -> serde_json::Value,
}

fn defaults_of<C: ModeConfig>() -> serde_json::Value {
    serde_json::to_value(C::default()).expect("settings serialise")
}

/// Every mode's name and its settings' defaults, as `[training.<mode>]`
/// holds them (for the configuration reference and its test).
pub fn settings_defaults() -> Vec<(&'static str, serde_json::Value)> {
    REGISTRY.iter().map(|e| (e.name, (e.defaults)())).collect()
}

fn check_with<C: ModeConfig>(t: &TrainingConfig) -> Result<()> {
    C::of(t)?.check(t)
}

const fn entry<C: ModeConfig>(
    mode: Mode,
    name: &'static str,
    tasks: &'static [Task],
    one_process: bool,
    rules: &'static Rules,
) -> Entry {
    Entry {
        mode,
        name,
        former_keys: C::FORMER_KEYS,
        check: check_with::<C>,
        tasks,
        one_process,
        rules,
        defaults: defaults_of::<C>,
    }
}

const NODES: &[Task] = &[Task::NodeClassification];
const NODES_AND_LINKS: &[Task] = &[Task::NodeClassification, Task::LinkPrediction];

/// Every mode, with its settings, the tasks it trains and whether it runs in one process.
static REGISTRY: [Entry; 6] = [
    entry::<crate::single::SingleConfig>(Mode::Single, "single", NODES_AND_LINKS, true, &PLAIN),
    entry::<crate::data_parallel::DataParallelConfig>(
        Mode::DataParallel,
        "data-parallel",
        NODES_AND_LINKS,
        false,
        &crate::data_parallel::RULES,
    ),
    entry::<crate::raf::RafConfig>(Mode::Raf, "raf", NODES, false, &crate::raf::RULES),
    entry::<crate::model_averaging::AveragingConfig>(
        Mode::ModelAveraging,
        "model-averaging",
        NODES,
        false,
        &crate::model_averaging::RULES,
    ),
    entry::<crate::hopgnn::HopConfig>(Mode::Hopgnn, "hopgnn", NODES, false, &crate::hopgnn::RULES),
    entry::<crate::full_graph::FullGraphConfig>(
        Mode::FullGraph,
        "full-graph",
        NODES,
        false,
        &crate::full_graph::RULES,
    ),
];

/// Moves the keys modes once read from `[training]` into their sub-tables;
/// returns a warning for each. A former key of another mode is refused.
pub(crate) fn move_former_keys(t: &mut TrainingConfig) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for e in &REGISTRY {
        for (old, new) in e.former_keys {
            let Some(v) = t.modes.remove(*old) else {
                continue;
            };
            if e.mode != t.mode {
                return Err(TrainError::Config(format!(
                    "training.{old} applies to training.mode = \"{}\", not \"{}\" (and is now `{new}` under [training.{}])",
                    e.name,
                    t.mode.name(),
                    e.name
                )));
            }
            let section = t
                .modes
                .entry(e.name.to_string())
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            let serde_json::Value::Object(section) = section else {
                return Err(TrainError::Config(format!(
                    "training.{}: expected a table of settings",
                    e.name
                )));
            };
            if section.contains_key(*new) {
                return Err(TrainError::Config(format!(
                    "training.{old} and training.{}.{new} are the same setting: give it once, under [training.{}]",
                    e.name, e.name
                )));
            }
            section.insert(new.to_string(), v);
            warnings.push(format!(
                "training.{old} is deprecated: write `{new}` under [training.{}] (--set training.{}.{new}=...)",
                e.name, e.name
            ));
        }
    }
    Ok(warnings)
}

/// Checks the modes' sub-tables (only the run's own mode may have one, and
/// no other key may stand among them) and the run's mode settings.
pub(crate) fn check(t: &TrainingConfig) -> Result<()> {
    for (key, value) in &t.modes {
        let Some(e) = REGISTRY.iter().find(|e| e.name == key) else {
            let former = REGISTRY.iter().find_map(|e| {
                e.former_keys
                    .iter()
                    .find(|(old, _)| old == key)
                    .map(|(_, new)| (e.name, new))
            });
            return Err(TrainError::Config(match former {
                Some((name, new)) => format!("training.{key} is now `{new}` under [training.{name}]"),
                None => format!(
                    "unknown field `{key}` in [training] (a mode's own settings go under [training.<mode>], one of: {})",
                    REGISTRY.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
                ),
            }));
        };
        if e.mode != t.mode {
            return Err(TrainError::Config(format!(
                "[training.{key}] applies to training.mode = \"{key}\", not \"{}\"",
                t.mode.name()
            )));
        }
        if !value.is_object() {
            return Err(TrainError::Config(format!(
                "training.{key}: expected a table of settings ([training.{key}])"
            )));
        }
    }
    let e = t.mode.entry();
    if !e.tasks.contains(&t.task) {
        return Err(TrainError::Config(format!(
            "training.task = \"{}\" runs in {}; mode {} does not support it yet",
            t.task.name(),
            REGISTRY
                .iter()
                .filter(|e| e.tasks.contains(&t.task))
                .map(|e| e.name)
                .collect::<Vec<_>>()
                .join(" and "),
            e.name
        )));
    }
    (e.check)(t)
}

/// A way of training, as the CLI drives it.
pub trait TrainingMode {
    /// Trains with every actor of the run in this process.
    fn train_embedded(
        &self,
        cfg: &Config,
        observer: &mut dyn TrainObserver,
    ) -> Result<(Report, Model)>;
    /// Runs node `id` of the cluster in `cfg`; returns the report on the node that writes it.
    fn run_node(
        &self,
        cfg: &Config,
        id: &str,
        observer: &mut dyn TrainObserver,
    ) -> Result<Option<Report>>;
}

/// Any distributed mode, driven by `crate::distributed`'s drivers.
struct Cluster<M>(Arc<M>);

impl<M: Distributed> TrainingMode for Cluster<M> {
    fn train_embedded(
        &self,
        cfg: &Config,
        observer: &mut dyn TrainObserver,
    ) -> Result<(Report, Model)> {
        if cfg.cluster.is_some() {
            return Err(TrainError::Config(format!("training.mode = \"{}\" with a [cluster] section runs with `hetgnn launch` or `hetgnn node`", self.0.name())));
        }
        crate::distributed::train_embedded(self.0.clone(), cfg, observer)
    }

    fn run_node(
        &self,
        cfg: &Config,
        id: &str,
        observer: &mut dyn TrainObserver,
    ) -> Result<Option<Report>> {
        crate::distributed::run_node(self.0.clone(), cfg, id, observer)
    }
}

/// The mode `cfg.training.mode` names, opened on its data or partitions.
pub fn open(cfg: &Config) -> Result<Box<dyn TrainingMode>> {
    let t = &cfg.training;
    Ok(match t.mode {
        Mode::Single => Box::new(crate::single::Single),
        Mode::DataParallel => Box::new(Cluster(Arc::new(DataParallel::open(t)?))),
        Mode::Raf => Box::new(Cluster(Arc::new(Raf::open(t)?))),
        Mode::ModelAveraging => Box::new(Cluster(Arc::new(ModelAveraging::open(
            t,
            cfg.cluster.as_ref().map(|c| c.nodes.len()),
        )?))),
        Mode::Hopgnn => Box::new(Cluster(Arc::new(HopGnn::open(t)?))),
        Mode::FullGraph => Box::new(Cluster(Arc::new(FullGraph::open(t)?))),
    })
}

/// Trains as `cfg` says, every actor of the run in this process.
pub fn train(cfg: &Config, observer: &mut dyn TrainObserver) -> Result<(Report, Model)> {
    open(cfg)?.train_embedded(cfg, observer)
}

/// Runs node `id` of the cluster `cfg` describes (`hetgnn node`); returns the
/// report on the node that writes it.
pub fn run_node(
    cfg: &Config,
    id: &str,
    observer: &mut dyn TrainObserver,
) -> Result<Option<Report>> {
    open(cfg)?.run_node(cfg, id, observer)
}
