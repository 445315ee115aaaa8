//! The registry of training modes: the one place that matches on
//! `training.mode`. A new mode is a folder implementing
//! [`crate::distributed::Distributed`] (or [`TrainingMode`] directly) plus
//! one arm in [`open`].

use std::sync::Arc;

use models::Model;

use crate::config::{Config, Mode};
use crate::data_parallel::DataParallel;
use crate::distributed::Distributed;
use crate::error::{Result, TrainError};
use crate::full_graph::FullGraph;
use crate::hopgnn::HopGnn;
use crate::model_averaging::ModelAveraging;
use crate::observer::TrainObserver;
use crate::raf::Raf;
use crate::report::Report;

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
