//! hetgnn's training roles and what drives them: the run configuration (TOML
//! with `--set` overrides), the single-process trainer, and the run report.
//!
//! Roles are plain structs (sans-IO cores); the actor wrappers that put them
//! on the runtime come with the distributed modes.
#![warn(missing_docs)]

pub mod cache;
pub mod cluster;
pub mod config;
pub mod device;
pub mod dist;
pub mod error;
pub mod pipeline;
pub mod raf;
pub mod report;
pub mod trainer;

pub use config::{Config, Mode, RafEmbeddings, TrainingConfig};
pub use error::{Result, TrainError};
pub use report::{EpochReport, Report};
pub use trainer::{train, TrainObserver};
