//! The messages of relation-aggregation-first training. Each carries one
//! step's tensor (or gradient payload) from one worker; kinds name what they
//! carry, so the report's bytes per kind read as partial aggregations, their
//! gradients, the seeds' rows and the shared-parameter gradients.

use actix::{Context, Handler, MessageResult};
use runtime::{ByteVec, Deliver, Msg};
use serde::{Deserialize, Serialize};

use crate::distributed::inbox::InboxActor;

/// Inbox rounds (the `round` of [`crate::distributed::inbox::Inbox::raw`]) of each kind.
pub mod round {
    /// A worker's partial aggregation, at the reducer.
    pub const PARTIAL: u32 = 0x100;
    /// The gradient of a worker's partial, at the worker.
    pub const PARTIAL_GRAD: u32 = 0x101;
    /// The seeds' rows below the top layer, at a worker that cannot compute them.
    pub const SEED_ROWS: u32 = 0x102;
    /// A worker's gradient of the seeds' rows, at the reducer.
    pub const SEED_GRAD: u32 = 0x103;
    /// Gradients of parameters and embedding rows two workers share.
    pub const SHARED: u32 = 0x104;
    /// A worker's final parameters and embedding tables, at the coordinator.
    pub const FINAL: u32 = 0x105;
}

macro_rules! payload_message {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $round:expr) => {
        $(#[$doc])*
        #[derive(Debug, Serialize, Deserialize)]
        pub struct $name {
            /// Generation of the run (see `dist::coordinator`).
            pub gen: u64,
            /// Step number (training steps count from 0; evaluation steps have the top bit set).
            pub seq: u64,
            /// Sending worker.
            pub from: u32,
            /// The payload (little-endian f32 rows, or an encoded [`SharedGrads`] / [`FinalState`]).
            pub data: ByteVec,
        }

        impl Msg for $name {
            type Reply = ();
            const KIND: &'static str = $kind;
        }

        impl Handler<Deliver<$name>> for InboxActor {
            type Result = MessageResult<Deliver<$name>>;
            fn handle(&mut self, m: Deliver<$name>, _: &mut Context<Self>) -> Self::Result {
                // Filed under the worker the sending actor is, not the one it claims.
                if m.from.as_str() == super::names::worker(m.msg.from) {
                    self.0.file_gen(m.msg.gen, m.msg.seq, $round, m.msg.from, m.msg.data.0);
                } else {
                    tracing::warn!("dropped a {} message from {} claiming to be worker {}", $kind, m.from.as_str(), m.msg.from);
                }
                MessageResult(())
            }
        }
    };
}

payload_message!(
    /// A worker's partial aggregation of the seeds (all its top-layer relations combined).
    Partial, "partial", round::PARTIAL
);
payload_message!(
    /// The reducer's gradient of one worker's partial.
    PartialGrad, "partial.grad", round::PARTIAL_GRAD
);
payload_message!(
    /// The seeds' rows below the top layer, for a worker whose top-layer attention reads them.
    SeedRows, "seed_rows", round::SEED_ROWS
);
payload_message!(
    /// A worker's gradient of the seeds' rows it was sent.
    SeedGrad, "seed_rows.grad", round::SEED_GRAD
);
payload_message!(
    /// Gradients of the dense parameters and embedding rows the sender shares with the receiver.
    Shared, "shared.grad", round::SHARED
);
payload_message!(
    /// A worker's parameters and tables at the end of the run.
    Final, "final", round::FINAL
);

/// What a [`Shared`] message encodes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SharedGrads {
    /// Per shared parameter (in name order), whether the sender has a gradient.
    pub present: Vec<bool>,
    /// The present gradients, concatenated.
    pub dense: Vec<f32>,
    /// Per shared embedding table: `(node type, row ids, row gradients)`.
    pub rows: Vec<(u32, Vec<u32>, Vec<f32>)>,
}

/// A worker's parameters and tables (or, in a [`Final`] message, a piece of them).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FinalState {
    /// `(name, values)` of the parameters the worker holds.
    pub params: Vec<(String, Vec<f32>)>,
    /// `(node type, first value, values)`: pieces of the embedding tables it
    /// holds, each table's pieces in order and together whole.
    pub tables: Vec<(u32, u64, Vec<f32>)>,
}

/// Most table values one [`Final`] message carries (128 MB), well under the
/// transport's frame limit however large the tables are.
pub const FINAL_PIECE: usize = 32 << 20;

/// What a [`Final`] message encodes: piece `seq` of `pieces`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FinalPiece {
    /// How many pieces the worker sends.
    pub pieces: u32,
    /// This piece.
    pub state: FinalState,
}

pub use crate::distributed::messages::{decode, encode};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_malformed_ones_are_refused() {
        let m = SharedGrads {
            present: vec![true, false],
            dense: vec![1.0, 2.0],
            rows: vec![(1, vec![3, 4], vec![0.5; 4])],
        };
        let bytes = encode(&m).unwrap();
        let back: SharedGrads = decode(&bytes).unwrap();
        assert_eq!(
            (back.present, back.dense, back.rows),
            (m.present, m.dense, m.rows)
        );
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode::<SharedGrads>(&long)
            .unwrap_err()
            .to_string()
            .contains("trailing"));
        assert!(
            decode::<SharedGrads>(&bytes[..bytes.len() - 3]).is_err(),
            "a truncated payload is refused"
        );
        // A length prefix claiming more than the limit is refused before allocating.
        let huge = encode(&(u64::MAX, 0u8)).unwrap();
        assert!(decode::<Vec<f32>>(&huge).is_err());
    }
}
