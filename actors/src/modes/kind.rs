//! The names of the training modes: the value of `training.mode`, the key
//! of a mode's sub-table and the name in reports and checkpoints. A leaf:
//! what each mode is and does is in its folder and the registry
//! ([`crate::modes`]).

use serde::{Deserialize, Serialize};

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
    /// A mode of the tests only (`crate::toy`): what a mode is.
    #[cfg(test)]
    Toy,
}

impl Mode {
    /// Every mode, in the registry's order.
    pub const ALL: [Mode; 6] = [
        Mode::Single,
        Mode::DataParallel,
        Mode::Raf,
        Mode::ModelAveraging,
        Mode::Hopgnn,
        Mode::FullGraph,
    ];

    /// The mode's name, as configs and reports spell it (and its sub-table's key).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::DataParallel => "data-parallel",
            Mode::Raf => "raf",
            Mode::ModelAveraging => "model-averaging",
            Mode::Hopgnn => "hopgnn",
            Mode::FullGraph => "full-graph",
            #[cfg(test)]
            Mode::Toy => "toy",
        }
    }

    /// The mode named `name` (as configs, reports and checkpoints spell it).
    pub fn from_name(name: &str) -> Option<Mode> {
        #[cfg(test)]
        if name == "toy" {
            return Some(Mode::Toy);
        }
        Mode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether the mode holds the whole graph in one process (exact inference is possible).
    pub fn one_process(self) -> bool {
        self == Mode::Single
    }
}
