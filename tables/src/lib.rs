//! Tables in and out of hetgnn: node and edge tables (Parquet, CSV) imported
//! into the graph directory format with id maps, feature transforms, labels
//! and splits, and graphs exported back to tables.
//!
//! An import is described by a TOML configuration ([`config::TablesConfig`]);
//! what it fitted (feature statistics, class names, id kinds) is saved beside
//! the graph in `tables.json`, and each type's original ids in
//! `nodes/<type>/ids.csv`, so results can be written under those ids.
#![warn(missing_docs)]

pub mod config;
mod edges;
pub mod error;
pub mod export;
pub mod ids;
pub mod import;
pub mod labels;
pub mod like;
pub mod results;
pub mod source;
pub mod transform;
pub mod write;

pub use config::TablesConfig;
pub use error::{Result, TableError};
pub use export::export_tables;
pub use import::{import_tables, ImportOptions, ImportRecord};
