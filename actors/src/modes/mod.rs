//! The registry of training modes: the one place that names every mode. A
//! new mode is a folder implementing [`crate::distributed::Distributed`] (or
//! [`TrainingMode`] directly) and its settings ([`ModeConfig`], the
//! sub-table `[training.<mode>]`), plus its variant of [`Mode`], its entry in
//! `REGISTRY` and its arm in [`open`].

use std::sync::Arc;

use models::Model;

pub mod kind;
pub mod seam;

pub use kind::Mode;
pub use seam::{ModeConfig, Rules, TrainingMode, PLAIN};

use crate::config::{Config, Task, TrainingConfig};
use crate::data_parallel::DataParallel;
use crate::distributed::Distributed;
use crate::error::{Result, TrainError};
use crate::full_graph::FullGraph;
use crate::hopgnn::HopGnn;
use crate::model_averaging::ModelAveraging;
use crate::observer::TrainObserver;
use crate::raf::Raf;
use crate::report::Report;

/// What the registry knows of a mode.
struct Entry {
    mode: Mode,
    former_keys: &'static [(&'static str, &'static str)],
    check: fn(&TrainingConfig) -> Result<()>,
    tasks: &'static [Task],
    /// Whether the mode's steps take their loss from `task::node::NodeTask`
    /// (class weights and the focal loss).
    weighted: bool,
    /// Whether it can start from another run's checkpoint (`training.init_from`).
    init_from: bool,
    /// Which task lists it trains at once (`training.tasks`).
    multi_task: Lists,
    rules: &'static Rules,
    defaults: fn() -> serde_json::Value,
}

/// Which `training.tasks` lists a mode trains.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Lists {
    /// None: one task at a time.
    No,
    /// Node tasks of the target type.
    Nodes,
    /// Node tasks with one edge-level task (link prediction or an edge task) among them.
    WithEdgeTask,
}

/// The registry's entry of `mode`.
fn entry_of(mode: Mode) -> &'static Entry {
    registry()
        .find(|e| e.mode == mode)
        .expect("every mode is registered")
}

/// The rules of the mode named `name` (a checkpoint's, say), if it is one.
pub fn rules_of(name: &str) -> Option<&'static Rules> {
    Mode::from_name(name).map(|m| entry_of(m).rules)
}

fn defaults_of<C: ModeConfig>() -> serde_json::Value {
    serde_json::to_value(C::default()).expect("settings serialise")
}

/// Every mode's name and its settings' defaults, as `[training.<mode>]`
/// holds them (for the configuration reference and its test).
pub fn settings_defaults() -> Vec<(&'static str, serde_json::Value)> {
    REGISTRY
        .iter()
        .map(|e| (e.mode.name(), (e.defaults)()))
        .collect()
}

fn check_with<C: ModeConfig>(t: &TrainingConfig) -> Result<()> {
    C::of(t)?.check(t)
}

const fn entry<C: ModeConfig>(
    mode: Mode,
    tasks: &'static [Task],
    (weighted, init_from, multi_task): (bool, bool, Lists),
    rules: &'static Rules,
) -> Entry {
    Entry {
        mode,
        former_keys: C::FORMER_KEYS,
        check: check_with::<C>,
        tasks,
        weighted,
        init_from,
        multi_task,
        rules,
        defaults: defaults_of::<C>,
    }
}

/// The tests-only mode's.
#[cfg(test)]
const NODES: &[Task] = &[Task::NodeClassification];
const EVERY_TASK: &[Task] = &[
    Task::NodeClassification,
    Task::LinkPrediction,
    Task::NodeRegression,
    Task::EdgeClassification,
    Task::EdgeRegression,
    Task::MultiLabel,
];
/// Every task of the target nodes (the modes whose steps are over target
/// nodes, not edges).
const NODE_TASKS: &[Task] = &[
    Task::NodeClassification,
    Task::NodeRegression,
    Task::MultiLabel,
];
/// Data-parallel's.
const DATA_PARALLEL_TASKS: &[Task] = &[
    Task::NodeClassification,
    Task::LinkPrediction,
    Task::NodeRegression,
    Task::EdgeClassification,
    Task::EdgeRegression,
    Task::MultiLabel,
];

/// Every mode, with its settings, the tasks it trains and its rules.
static REGISTRY: [Entry; 6] = [
    entry::<crate::single::SingleConfig>(
        Mode::Single,
        EVERY_TASK,
        (true, true, Lists::WithEdgeTask),
        &PLAIN,
    ),
    entry::<crate::data_parallel::DataParallelConfig>(
        Mode::DataParallel,
        DATA_PARALLEL_TASKS,
        (true, true, Lists::WithEdgeTask),
        &crate::data_parallel::RULES,
    ),
    entry::<crate::raf::RafConfig>(
        Mode::Raf,
        NODE_TASKS,
        (false, false, Lists::Nodes),
        &crate::raf::RULES,
    ),
    entry::<crate::model_averaging::AveragingConfig>(
        Mode::ModelAveraging,
        NODE_TASKS,
        (false, true, Lists::Nodes),
        &crate::model_averaging::RULES,
    ),
    entry::<crate::hopgnn::HopConfig>(
        Mode::Hopgnn,
        NODE_TASKS,
        (true, true, Lists::Nodes),
        &crate::hopgnn::RULES,
    ),
    entry::<crate::full_graph::FullGraphConfig>(
        Mode::FullGraph,
        NODE_TASKS,
        (true, true, Lists::Nodes),
        &crate::full_graph::RULES,
    ),
];

/// A mode of the tests only, registered as any other.
#[cfg(test)]
static TESTS_ONLY: [Entry; 1] = [entry::<crate::toy::ToyConfig>(
    Mode::Toy,
    NODES,
    (false, false, Lists::No),
    &crate::toy::RULES,
)];
#[cfg(not(test))]
static TESTS_ONLY: [Entry; 0] = [];

/// Every registered mode.
fn registry() -> impl Iterator<Item = &'static Entry> {
    REGISTRY.iter().chain(TESTS_ONLY.iter())
}

impl Config {
    /// Parses `text` (TOML), applies `overrides` (`section.key=value`), moves
    /// the modes' former keys into their sub-tables (with a warning each, in
    /// [`Config::warnings`]), validates.
    pub fn parse(text: &str, overrides: &[String]) -> Result<Config> {
        let mut cfg = Config::from_toml(text, overrides)?;
        cfg.warnings = move_former_keys(&mut cfg.training)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads the file `path` and parses it as [`Config::parse`] does.
    pub fn load(path: &std::path::Path, overrides: &[String]) -> Result<Config> {
        let text = graphs::input::read_text(path)?;
        Config::parse(&text, overrides).map_err(|e| match e {
            TrainError::Config(m) => TrainError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Checks values and their combinations, naming the key at fault: the
    /// topology, the run's mode's settings, then the shared keys.
    pub fn validate(&self) -> Result<()> {
        self.validate_topology()?;
        check(&self.training)?;
        self.validate_shared()
    }
}

/// Moves the keys modes once read from `[training]` into their sub-tables;
/// returns a warning for each. A former key of another mode is refused.
pub(crate) fn move_former_keys(t: &mut TrainingConfig) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for e in registry() {
        for (old, new) in e.former_keys {
            let Some(v) = t.modes.remove(*old) else {
                continue;
            };
            if e.mode != t.mode {
                return Err(TrainError::Config(format!(
                    "training.{old} applies to training.mode = \"{}\", not \"{}\" (and is now `{new}` under [training.{}])",
                    e.mode.name(),
                    t.mode.name(),
                    e.mode.name()
                )));
            }
            let section = t
                .modes
                .entry(e.mode.name().to_string())
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            let serde_json::Value::Object(section) = section else {
                return Err(TrainError::Config(format!(
                    "training.{}: expected a table of settings",
                    e.mode.name()
                )));
            };
            if section.contains_key(*new) {
                return Err(TrainError::Config(format!(
                    "training.{old} and training.{}.{new} are the same setting: give it once, under [training.{}]",
                    e.mode.name(), e.mode.name()
                )));
            }
            section.insert(new.to_string(), v);
            warnings.push(format!(
                "training.{old} is deprecated: write `{new}` under [training.{}] (--set training.{}.{new}=...)",
                e.mode.name(), e.mode.name()
            ));
        }
    }
    Ok(warnings)
}

/// The names of the modes `keep` accepts, joined by "and" (for refusals).
fn modes_where(keep: impl Fn(&Entry) -> bool) -> String {
    let names: Vec<&str> = REGISTRY
        .iter()
        .filter(|e| keep(e))
        .map(|e| e.mode.name())
        .collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

/// Checks the modes' sub-tables (only the run's own mode may have one, and
/// no other key may stand among them) and the run's mode settings.
pub(crate) fn check(t: &TrainingConfig) -> Result<()> {
    for (key, value) in &t.modes {
        let Some(e) = registry().find(|e| e.mode.name() == key) else {
            let former = registry().find_map(|e| {
                e.former_keys
                    .iter()
                    .find(|(old, _)| old == key)
                    .map(|(_, new)| (e.mode.name(), new))
            });
            return Err(TrainError::Config(match former {
                Some((name, new)) => format!("training.{key} is now `{new}` under [training.{name}]"),
                None => format!(
                    "unknown field `{key}` in [training] (a mode's own settings go under [training.<mode>], one of: {})",
                    REGISTRY.iter().map(|e| e.mode.name()).collect::<Vec<_>>().join(", ")
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
    let e = entry_of(t.mode);
    if !e.tasks.contains(&t.task) {
        return Err(TrainError::Config(format!(
            "training.task = \"{}\" runs in {}; mode {} does not support it yet",
            t.task.name(),
            modes_where(|e| e.tasks.contains(&t.task)),
            e.mode.name()
        )));
    }
    if e.multi_task == Lists::No && !t.tasks.is_empty() {
        return Err(TrainError::Config(format!(
            "training.tasks (several tasks at once) runs in {}; mode {} does not support it yet",
            modes_where(|e| e.multi_task > Lists::No),
            e.mode.name()
        )));
    }
    if let (Some(k), true) = (t.mixed_tasks(), e.multi_task < Lists::WithEdgeTask) {
        return Err(TrainError::Config(format!(
            "training.tasks lists \"{}\" beside node tasks, which runs in {}; mode {} trains node tasks together, not with a task on edges, yet",
            t.tasks[k].task.name(),
            modes_where(|e| e.multi_task == Lists::WithEdgeTask),
            e.mode.name()
        )));
    }
    if let Some(w) = t.tasks.iter().find(|w| !e.tasks.contains(&w.task)) {
        return Err(TrainError::Config(format!(
            "training.tasks lists \"{}\", which runs in {}; mode {} does not support it yet",
            w.task.name(),
            modes_where(|e| e.tasks.contains(&w.task)),
            e.mode.name()
        )));
    }
    if !e.weighted && (t.focal_gamma > 0.0 || t.class_weights != Default::default()) {
        return Err(TrainError::Config(format!(
            "training.class_weights and training.focal_gamma apply in {}; mode {} does not support them yet",
            modes_where(|e| e.weighted),
            e.mode.name()
        )));
    }
    if !e.init_from && t.init_from.is_some() {
        return Err(TrainError::Config(format!(
            "training.init_from (fine-tuning) applies in {}; mode {} does not support it yet",
            modes_where(|e| e.init_from),
            e.mode.name()
        )));
    }
    (e.check)(t)
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
        #[cfg(test)]
        Mode::Toy => Box::new(Cluster(Arc::new(crate::toy::Toy::open(t)?))),
    })
}

/// Trains as `cfg` says, every actor of the run in this process, holding
/// its checkpoint directory (if any) against other runs.
pub fn train(cfg: &Config, observer: &mut dyn TrainObserver) -> Result<(Report, Model)> {
    let _held = models::run_lock::hold(cfg.training.checkpoint_dir.as_deref())?;
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
