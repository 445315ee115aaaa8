//! The messages of data-parallel training's own actors (samplers and feature
//! stores). Kinds name what they carry, so the report's bytes per kind read as
//! sampling, feature pulls and embedding pushes.

use graphs::RelationPicks;
use runtime::{ByteVec, Msg, SharedBytes};
use serde::{Deserialize, Serialize};

use crate::error::TrainError;

/// Why a sampler or feature store did not answer a request (it travels in
/// the reply): what the requester should do follows from the variant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ServeError {
    /// The request breaks the protocol (rows not owned there, a trainer out
    /// of range, a malformed gradient): stop the run; asking again repeats it.
    #[error("refused: {0}")]
    Refused(String),
    /// The actor could not do what was asked (a checkpoint it cannot read or
    /// write, a failed computation): stop the run with the message.
    #[error("failed: {0}")]
    Failed(String),
    /// The actor stopped before it answered (its node is shutting down or
    /// restarting): retry once the run has recovered.
    #[error("stopped: {0}")]
    Stopped(String),
}

impl ServeError {
    /// A [`ServeError::Refused`] saying `e`.
    pub fn refused(e: impl std::fmt::Display) -> ServeError {
        ServeError::Refused(e.to_string())
    }

    /// A [`ServeError::Failed`] saying `e`.
    pub fn failed(e: impl std::fmt::Display) -> ServeError {
        ServeError::Failed(e.to_string())
    }

    /// The run's error for this answer from `actor`: a refusal is a
    /// protocol violation, a failure the actor's own.
    pub fn from_actor(self, actor: impl std::fmt::Display) -> TrainError {
        match self {
            ServeError::Refused(m) => TrainError::Protocol(format!("{actor} refused: {m}")),
            ServeError::Failed(m) => TrainError::Internal(format!("{actor} failed: {m}")),
            ServeError::Stopped(m) => TrainError::PeerLost(format!("{actor} stopped: {m}")),
        }
    }
}

/// Owner-compute sampling: the picks of every relation into each requested
/// node (per type) at one hop, drawn with the requester's keys.
#[derive(Debug, Serialize, Deserialize)]
pub struct SampleReq {
    /// Sampling seed (training or evaluation stream).
    pub seed: u64,
    /// Epoch.
    pub epoch: u64,
    /// Step within the epoch.
    pub step: u64,
    /// Model layer the hop feeds.
    pub layer: u32,
    /// Neighbors per relation.
    pub fanout: u32,
    /// Destination nodes per node type, all owned by the receiver.
    pub nodes: Vec<Vec<u32>>,
    /// Link prediction: leave the step's training edges out of the neighbourhoods.
    #[serde(default)]
    pub exclude: bool,
    /// Requests waiting together are served lowest value first (ByteGNN: the oldest batch's).
    #[serde(default)]
    pub priority: u64,
}

impl Msg for SampleReq {
    type Reply = Result<Vec<Vec<RelationPicks>>, ServeError>;
    const KIND: &'static str = "sample";
}

/// Rows of a feature store by global id (owned by the receiver).
#[derive(Debug, Serialize, Deserialize)]
pub struct Pull {
    /// Generation (attempt) of the run the message belongs to: a recovery
    /// starts a new one, and messages of others are not mixed in.
    pub gen: u64,
    /// Global ids.
    pub ids: Vec<u32>,
    /// Learnable rows: only once the pushes of this step have been applied.
    pub after: Option<u64>,
    /// Requests waiting together are served lowest value first (ByteGNN: the oldest batch's).
    #[serde(default)]
    pub priority: u64,
}

impl Msg for Pull {
    /// `ids.len() × dim` little-endian f32, or `None` if step `after` is not
    /// applied yet or the store is not at generation `gen` yet (ask again).
    type Reply = Result<Option<SharedBytes>, ServeError>;
    const KIND: &'static str = "pull";
}

/// One trainer's gradient for learnable rows in one step; the store applies
/// Adam once every trainer's push for the step has arrived.
#[derive(Debug, Serialize, Deserialize)]
pub struct Push {
    /// Generation (attempt) of the run the message belongs to: a recovery
    /// starts a new one, and messages of others are not mixed in.
    pub gen: u64,
    /// Global step number (over all epochs).
    pub seq: u64,
    /// Pushing trainer.
    pub trainer: u32,
    /// Global ids (owned by the receiver, distinct).
    pub ids: Vec<u32>,
    /// `ids.len() × dim` little-endian f32.
    pub grad: ByteVec,
}

impl Msg for Push {
    /// `None`: the store is not at generation `gen` yet (push again).
    type Reply = Result<Option<()>, ServeError>;
    const KIND: &'static str = "push";
}

/// All rows a store owns, for the final model hash.
#[derive(Debug, Serialize, Deserialize)]
pub struct Export;

impl Msg for Export {
    /// Owned ids (ascending) and their rows.
    type Reply = Result<(Vec<u32>, ByteVec), ServeError>;
    const KIND: &'static str = "export";
}

/// Sent by a node to its own embedding stores: restore the checkpoint at step
/// `from` (or the initial rows) and serve generation `gen`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Reset {
    /// Generation about to start.
    pub gen: u64,
    /// The checkpoint (its step) to restore, if any.
    pub from: Option<u64>,
}

impl Msg for Reset {
    type Reply = Result<(), ServeError>;
    const KIND: &'static str = "reset";
}

/// Write the store's rows into the checkpoint of step `seq` (its state once
/// the updates of steps before `seq` are applied).
#[derive(Debug, Serialize, Deserialize)]
pub struct Save {
    /// Generation.
    pub gen: u64,
    /// Checkpoint step.
    pub seq: u64,
}

impl Msg for Save {
    /// The file written and its SHA-256, or `None` while the store is not at
    /// that step (ask again).
    type Reply = Result<Option<(String, String)>, ServeError>;
    const KIND: &'static str = "save";
}
