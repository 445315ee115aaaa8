//! `[training.full-graph]`: full-graph training's own settings.

use serde::{Deserialize, Serialize};

use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;
use models::ModelKind;

/// Most epochs a cached copy may lag (`staleness_epochs`).
pub const MAX_STALE_EPOCHS: u32 = 1000;

/// When a full-graph worker may skip broadcasting a block (SANCUS §4.3.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Staleness {
    /// Every block, every layer, every epoch (the CAGNET-style baseline).
    #[default]
    None,
    /// Definition 1: every block broadcast once every `staleness_epochs + 1`
    /// epochs, all workers in the same epochs.
    Fixed,
    /// Definition 2: no copy older than `staleness_epochs` epochs, each
    /// worker's broadcasts in epochs of its own (see docs/modes/full-graph.md).
    Adaptive,
    /// Definition 3: a block broadcast when it has moved more than
    /// `staleness_variation` (relative Frobenius norm) from its last broadcast copy.
    Variation,
}

/// `[training.full-graph]`
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FullGraphConfig {
    /// When a block's broadcast may be skipped (default "none").
    pub staleness: Staleness,
    /// `staleness = "fixed"` or `"adaptive"`: epochs a cached copy may lag (default 1).
    pub staleness_epochs: u32,
    /// `staleness = "variation"`: the relative change that forces a broadcast (default 0.05).
    pub staleness_variation: f64,
    /// Skip a block's gradient too when its forward broadcast was skipped (default false).
    pub skip_gradients: bool,
}

impl Default for FullGraphConfig {
    fn default() -> Self {
        FullGraphConfig {
            staleness: Staleness::None,
            staleness_epochs: 1,
            staleness_variation: 0.05,
            skip_gradients: false,
        }
    }
}

impl ModeConfig for FullGraphConfig {
    const FORMER_KEYS: &'static [(&'static str, &'static str)] = &[
        ("staleness", "staleness"),
        ("staleness_epochs", "staleness_epochs"),
        ("staleness_variation", "staleness_variation"),
        ("skip_gradients", "skip_gradients"),
    ];

    fn check(&self, t: &TrainingConfig) -> Result<()> {
        let bad = |m: String| Err(TrainError::Config(m));
        if self.staleness_epochs == 0 || self.staleness_epochs > MAX_STALE_EPOCHS {
            return bad(format!("training.full-graph.staleness_epochs must be in 1..={MAX_STALE_EPOCHS} (0 is staleness = \"none\"), got {}", self.staleness_epochs));
        }
        if !(self.staleness_variation.is_finite()
            && self.staleness_variation > 0.0
            && self.staleness_variation <= 1.0)
        {
            return bad(format!(
                "training.full-graph.staleness_variation must be in (0, 1] (a relative change), got {}",
                self.staleness_variation
            ));
        }
        if self.skip_gradients && self.staleness == Staleness::None {
            return bad("training.full-graph.skip_gradients skips the gradients of skipped broadcasts: it needs a staleness rule (fixed, adaptive or variation)".into());
        }
        if !matches!(t.model, ModelKind::Rgcn | ModelKind::Rgat) {
            return bad(format!("training.model = \"{}\": full-graph training runs rgcn and rgat (ReLU and dropout between layers, no separate classifier)", t.model));
        }
        if t.cache_bytes.0 > 0 {
            return bad("training.cache_bytes: full-graph training keeps every row of a layer; it has no device cache (its staleness cache is not one to size)".into());
        }
        Ok(())
    }
}
