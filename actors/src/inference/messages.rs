//! Messages of distributed offline inference: a partition's rows of one
//! stage, asked by the partitions whose halo holds them.

use runtime::{Msg, SharedBytes};
use serde::{Deserialize, Serialize};

pub use crate::owner::messages::ServeError;

/// What a partition computed (`done.json`, and the word to its peers): its types' widths and node counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartDone {
    /// Per type: `(width, nodes)`; `None` where the type has no embeddings.
    pub types: Vec<Option<(usize, u64)>>,
}
/// Most node ids one [`StagePull`] may name.
pub const MAX_IDS: usize = 1 << 20;

/// The rows of stage `stage` (0: the model's inputs, `s`: relational layer
/// `s - 1`'s output) of nodes `ids` of type `ntype`, all owned by the receiver.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StagePull {
    /// The job's id: a partition of another job refuses the request.
    pub job: u64,
    /// The stage.
    pub stage: u32,
    /// Node type index.
    pub ntype: u32,
    /// Global ids, owned by the receiver.
    pub ids: Vec<u32>,
}

/// A partition's answer to a [`StagePull`].
#[derive(Debug, Serialize, Deserialize)]
pub enum StageRows {
    /// The partition has not computed the stage yet: ask again.
    NotYet,
    /// The stage has no rows of the type (the model reads none).
    Absent,
    /// `ids.len() × width` little-endian f32, in the order asked.
    Rows {
        /// Floats per node.
        width: u32,
        /// The rows.
        data: SharedBytes,
    },
    /// The same rows with their zeros left out ([`super::packed`]), where
    /// that makes them at most three quarters of their size.
    Packed {
        /// Floats per node.
        width: u32,
        /// The packed rows.
        data: SharedBytes,
    },
}

impl Msg for StagePull {
    type Reply = Result<StageRows, ServeError>;
    const KIND: &'static str = "embed-pull";
}

/// Whether the receiver has written its partition's embeddings (a node
/// leaves only once every partition has, as a peer may still need its rows).
#[derive(Debug, Serialize, Deserialize)]
pub struct Finished {
    /// The job's id.
    pub job: u64,
}

/// A partition's answer to [`Finished`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FinishState {
    /// Its account, once its embeddings are written (`None` before, and to another job).
    pub done: Option<PartDone>,
    /// It has seen every partition done: it needs no peer any more.
    pub all_seen: bool,
}

impl Msg for Finished {
    type Reply = FinishState;
    const KIND: &'static str = "embed-finished";
}

/// The sender, partition `part`, is leaving: every partition has been seen
/// done and it has seen every peer see it. A peer waiting on it for that
/// stops waiting (its silence would otherwise cost a timeout).
#[derive(Debug, Serialize, Deserialize)]
pub struct Leaving {
    /// The job's id.
    pub job: u64,
    /// The partition leaving.
    pub part: u32,
}

impl Msg for Leaving {
    type Reply = ();
    const KIND: &'static str = "embed-leaving";
}
