//! The messages of model-averaging training: one kind, [`Average`], whose
//! phase says what it carries (the dense parameters and the rows for their
//! owners, the averaged rows for their holders, which rows a partition
//! holds, or a worker's final rows for the coordinator). Payloads larger than
//! a piece travel in pieces, the first saying how many follow.

use actix::{Context, Handler, MessageResult};
use runtime::{ByteVec, Deliver, Msg};
use serde::{Deserialize, Serialize};

use crate::distributed::inbox::{Inbox, InboxActor};
pub use crate::distributed::messages::{decode, encode};
use crate::error::{Result, TrainError};

/// What an [`Average`] message carries (its `round` in the inbox).
pub mod phase {
    /// Which rows of the receiver's partitions a partition holds (once per attempt).
    pub const HOLD: u32 = 0x200;
    /// A worker's dense parameters and the rows it changed that the receiver owns.
    pub const UP: u32 = 0x201;
    /// Averaged rows the receiver's partitions hold.
    pub const DOWN: u32 = 0x202;
    /// A worker's owned rows, at the coordinator (cluster runs).
    pub const FINAL: u32 = 0x203;
}

/// Most pieces one payload may be split into (a bound checked before waiting for them).
const MAX_PIECES: u32 = 1 << 16;

/// Bytes per piece: well under the transport's 1 GiB frame limit.
pub const PIECE_BYTES: usize = 64 << 20;

/// A piece of a payload from worker `from`, for averaging round `round`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Average {
    /// Generation of the run.
    pub gen: u64,
    /// Averaging round (the epoch it ends), or 0 for [`phase::HOLD`] and [`phase::FINAL`].
    pub round: u64,
    /// What it carries: one of [`phase`].
    pub phase: u32,
    /// Piece number.
    pub piece: u32,
    /// Pieces of this payload in all.
    pub pieces: u32,
    /// Sending worker.
    pub from: u32,
    /// The piece's bytes.
    pub data: ByteVec,
}

impl Msg for Average {
    type Reply = ();
    const KIND: &'static str = "average";
}

impl Handler<Deliver<Average>> for InboxActor {
    type Result = MessageResult<Deliver<Average>>;
    fn handle(&mut self, m: Deliver<Average>, _: &mut Context<Self>) -> Self::Result {
        let a = m.msg;
        // Filed under the worker the sending actor is, not the one it claims.
        if m.from.as_str() != super::names::worker(a.from)
            || a.piece >= a.pieces
            || a.pieces > MAX_PIECES
        {
            tracing::warn!(
                "dropped an average message from {} (worker {}, piece {} of {})",
                m.from.as_str(),
                a.from,
                a.piece,
                a.pieces
            );
            return MessageResult(());
        }
        // Piece 0 carries the count; the others are filed by their number.
        let mut data = a.data.0;
        if a.piece == 0 {
            data.extend_from_slice(&a.pieces.to_le_bytes());
        }
        self.0
            .file_gen(a.gen, key(a.round, a.piece), a.phase, a.from, data);
        MessageResult(())
    }
}

/// The inbox key of piece `piece` of round `round`.
fn key(round: u64, piece: u32) -> u64 {
    (round << 20) | u64::from(piece)
}

/// Splits an encoded payload into the pieces of [`Average`] messages (one
/// piece is the payload itself, not a copy).
pub fn pieces(bytes: Vec<u8>) -> Vec<Vec<u8>> {
    if bytes.len() <= PIECE_BYTES {
        return vec![bytes];
    }
    bytes.chunks(PIECE_BYTES).map(<[u8]>::to_vec).collect()
}

/// The payload of `phase` and round `round` from worker `from`, its pieces
/// joined, waiting for each up to `timeout`.
pub fn gather(
    inbox: &Inbox,
    what: &str,
    round: u64,
    phase: u32,
    from: u32,
    timeout: std::time::Duration,
) -> Result<Vec<u8>> {
    let mut first = inbox
        .raw(what, key(round, 0), phase, &[from], timeout)?
        .swap_remove(0);
    let split = first
        .len()
        .checked_sub(4)
        .ok_or_else(|| TrainError::Protocol(format!("{what}: a piece without its count")))?;
    let count = u32::from_le_bytes(
        first[split..]
            .try_into()
            .map_err(|_| TrainError::Protocol(format!("{what}: bad piece count")))?,
    );
    first.truncate(split);
    for piece in 1..count {
        let more = inbox
            .raw(what, key(round, piece), phase, &[from], timeout)?
            .swap_remove(0);
        first.extend_from_slice(&more);
    }
    Ok(first)
}

/// One partition's rows of some node types: `(node type, ids, values)`.
pub type TypeRows = Vec<(u32, Vec<u32>, Vec<f32>)>;

/// What a worker sends each other worker at the end of a round ([`phase::UP`]).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Up {
    /// Per partition of the sender: its dense parameters (every worker gets them).
    pub dense: Vec<Dense>,
    /// Per partition of the sender: the rows it changed in the round that a
    /// partition of the receiver owns.
    pub rows: Vec<(u32, TypeRows)>,
}

/// A partition's dense parameters at the end of a round.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Dense {
    /// The partition.
    pub part: u32,
    /// Its weight: the training nodes it owns.
    pub weight: u64,
    /// Per parameter (name order), whether it changed in the round.
    pub changed: Vec<bool>,
    /// The changed parameters' values, concatenated.
    pub values: Vec<f32>,
}

/// Averaged rows for the receiver's partitions ([`phase::DOWN`]), or which
/// rows they hold ([`phase::HOLD`]: values empty), by partition.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Rows {
    /// `(partition, its rows)`.
    pub parts: Vec<(u32, TypeRows)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_split_into_pieces_and_join_again() {
        let up = Up {
            dense: vec![Dense {
                part: 1,
                weight: 3,
                changed: vec![true, false],
                values: vec![0.5; 3],
            }],
            rows: vec![(1, vec![(2, vec![7, 9], vec![1.0; 4])])],
        };
        let bytes = encode(&up).unwrap();
        let joined: Vec<u8> = pieces(bytes).concat();
        let back: Up = decode(&joined).unwrap();
        assert_eq!(
            (
                back.dense[0].part,
                &back.dense[0].changed,
                &back.rows[0].1[0].1
            ),
            (1, &vec![true, false], &vec![7, 9])
        );
        assert_eq!(
            pieces(Vec::new()).len(),
            1,
            "an empty payload is one empty piece"
        );
        let big = vec![0u8; PIECE_BYTES * 2 + 1];
        assert_eq!(
            pieces(big).iter().map(|p| p.len()).collect::<Vec<_>>(),
            vec![PIECE_BYTES, PIECE_BYTES, 1]
        );
    }
}
