//! What a mode gives the shared code: its settings ([`ModeConfig`]), the
//! rules shared code asks of it ([`Rules`]) and the way the CLI drives it
//! ([`TrainingMode`]). Shared code and the modes import this; only the
//! registry ([`crate::modes`]) imports the modes.

use models::Model;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{Config, TrainingConfig};
use crate::distributed::messages::EpochStats;
use crate::error::{Result, TrainError};
use crate::observer::TrainObserver;
use crate::report::{EpochReport, Report};

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
