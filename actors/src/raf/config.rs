//! `[training.raf]`: relation-aggregation-first training's own settings.

use serde::{Deserialize, Serialize};

use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;

/// How RAF workers treat an embedding table that several of them read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RafEmbeddings {
    /// One table, its copies kept identical by summing the holders' row
    /// gradients every step: the single-process model.
    #[default]
    Synced,
    /// Each worker learns its own copy (Heta's learnable features as
    /// per-partition parameters): no row traffic, a different model.
    Local,
}

/// `[training.raf]`
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RafConfig {
    /// Embedding tables several workers read: "synced" (default) or "local".
    pub embeddings: RafEmbeddings,
}

impl ModeConfig for RafConfig {
    const FORMER_KEYS: &'static [(&'static str, &'static str)] =
        &[("raf_embeddings", "embeddings")];

    fn check(&self, t: &TrainingConfig) -> Result<()> {
        if t.model == models::ModelKind::Mlp {
            return Err(TrainError::Config("training.model: mode = \"raf\" aggregates relations; the MLP reads none (use rgcn, rgat or hgt)".into()));
        }
        Ok(())
    }
}
