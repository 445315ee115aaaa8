//! The parts of a model a run can take from a checkpoint or freeze
//! (`training.init_parts`, `training.freeze`), as the configuration names
//! them: checked with the configuration, used by `init`.

use std::collections::BTreeSet;

use crate::error::{Result, TrainError};

/// A part of a model that a run can take from a checkpoint, or freeze.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// The learnable embedding tables of featureless node types.
    Embed,
    /// The relational layers (the MLP's layers).
    Gnn,
    /// The task's own head: a classifier after the layers, a link or edge decoder.
    Decoder,
}

/// Every part, as the configuration names them.
pub const PARTS: [(&str, Part); 3] = [
    ("embed", Part::Embed),
    ("gnn", Part::Gnn),
    ("decoder", Part::Decoder),
];

impl Part {
    /// The part called `name` in `key` (for the error).
    pub fn parse(key: &str, name: &str) -> Result<Part> {
        PARTS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                TrainError::Config(format!(
                    "{key}: unknown part '{name}' (known: embed, gnn, decoder)"
                ))
            })
    }

    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        PARTS
            .iter()
            .find(|(_, p)| *p == self)
            .map(|(n, _)| *n)
            .expect("every part is named")
    }

    /// The part a dense parameter belongs to, by its name.
    pub(crate) fn of_param(name: &str) -> Part {
        if name.starts_with("layer") || name.starts_with("mlp.layer") {
            Part::Gnn
        } else {
            Part::Decoder
        }
    }
}

/// The parts named in `names` (the value of `key`), each once.
pub fn parts(key: &str, names: &[String]) -> Result<BTreeSet<Part>> {
    let mut out = BTreeSet::new();
    for n in names {
        if !out.insert(Part::parse(key, n)?) {
            return Err(TrainError::Config(format!("{key}: '{n}' is named twice")));
        }
    }
    Ok(out)
}
