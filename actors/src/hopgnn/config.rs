//! `[training.hopgnn]`: HopGNN's own settings.

use serde::{Deserialize, Serialize};

use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;

/// What a HopGNN model carries from one partition to the next within a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HopMigrate {
    /// Its parameters and the gradient it has accumulated (the paper's migration).
    #[default]
    Model,
    /// The accumulated gradient only: every worker holds the same parameters
    /// within a step, so they need not travel.
    Gradient,
}

/// How many time steps a HopGNN step takes (`hop_time_steps`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HopTimeSteps {
    /// One per partition: every micrograph trained at its home (no merging, the default).
    #[default]
    All,
    /// An examination period merging one more time step per epoch while
    /// the epoch gets faster (HopGNN §5.3; `hopgnn::examine`).
    Auto,
    /// This many (1 to the number of partitions): the time steps with the fewest roots are merged into the others.
    Fixed(u32),
}

impl Serialize for HopTimeSteps {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            HopTimeSteps::All => s.serialize_str("all"),
            HopTimeSteps::Auto => s.serialize_str("auto"),
            HopTimeSteps::Fixed(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for HopTimeSteps {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Int(i64),
            Str(String),
        }
        match Either::deserialize(d)? {
            Either::Int(n) if (1..=i64::from(u16::MAX)).contains(&n) => {
                Ok(HopTimeSteps::Fixed(n as u32))
            }
            Either::Str(s) if s == "all" => Ok(HopTimeSteps::All),
            Either::Str(s) if s == "auto" => Ok(HopTimeSteps::Auto),
            Either::Str(s) => match s.parse::<u32>() {
                Ok(n) if (1..=u32::from(u16::MAX)).contains(&n) => Ok(HopTimeSteps::Fixed(n)),
                _ => Err(serde::de::Error::custom(format!(
                    "\"{s}\": expected \"all\", \"auto\" or a number of time steps"
                ))),
            },
            Either::Int(n) => Err(serde::de::Error::custom(format!(
                "{n}: the number of time steps must be at least 1"
            ))),
        }
    }
}

/// `[training.hopgnn]`
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HopConfig {
    /// What a model carries between partitions, "model" (default) or "gradient".
    pub migrate: HopMigrate,
    /// Time steps per step, "all" (default: one per partition), "auto" or a number.
    pub time_steps: HopTimeSteps,
    /// Pull each step's remote rows once for all its time steps (default true).
    pub pregather: bool,
}

impl Default for HopConfig {
    fn default() -> Self {
        HopConfig {
            migrate: HopMigrate::Model,
            time_steps: HopTimeSteps::All,
            pregather: true,
        }
    }
}

impl ModeConfig for HopConfig {
    const FORMER_KEYS: &'static [(&'static str, &'static str)] = &[
        ("hop_migrate", "migrate"),
        ("hop_time_steps", "time_steps"),
        ("hop_pregather", "pregather"),
    ];

    fn check(&self, t: &TrainingConfig) -> Result<()> {
        if t.cache_bytes.0 > 0 {
            return Err(TrainError::Config("training.cache_bytes: hopgnn trains where the features are; it has no device cache".into()));
        }
        Ok(())
    }
}
