//! hetgnn's training roles and what drives them: the run configuration (TOML
//! with `--set` overrides), one folder per training mode (`single`,
//! `data_parallel`, `raf`, `model_averaging`, `hopgnn`, `full_graph`) behind one
//! seam, each with its own settings (`[training.<mode>]`), what every distributed mode
//! shares (`distributed`), the device cache, and the run report.
//!
//! [`train`] runs any mode embedded in this process and [`run_node`] one node
//! of a cluster; `modes` is the one place that dispatches on the mode.
#![warn(missing_docs)]

pub mod cache;
pub mod cluster;
pub mod config;
pub mod data_parallel;
pub mod device;
pub mod distributed;
pub mod epoch;
pub mod error;
pub mod full_graph;
pub mod hopgnn;
pub mod inference;
pub mod model_averaging;
pub mod modes;
pub mod observer;
pub mod owner;
pub mod pretrained;
pub mod raf;
pub mod report;
pub mod single;
pub mod task;
#[cfg(test)]
mod toy;

pub use config::{Config, Mode, TrainingConfig};
pub use error::{Result, TrainError};
pub use modes::{run_node, train, TrainingMode};
pub use observer::TrainObserver;
pub use report::{EpochReport, Report, Timings};
