//! Full-graph training's own messages: a worker's block of one layer and
//! node type, broadcast to every other worker in training
//! ([`Broadcast`], kind `broadcast`) and evaluation ([`EvalBroadcast`],
//! `broadcast.eval`), and the gradient of a worker's block sent back to its
//! owner ([`GradBlock`], `grad-block`). A skipped block travels as a
//! one-byte notice, so a receiver never has to guess what the sender
//! decided. Kinds name them so the report's bytes per kind show each apart.

use actix::{Context, Handler, MessageResult};
use runtime::{ByteVec, Deliver, Msg};
use serde::{Deserialize, Serialize};

use crate::distributed::inbox::InboxActor;

/// Inbox rounds of forward blocks: apart from the all-reduce's (0 to 2(K-1)-1).
pub const FORWARD_ROUND: u32 = 2 << 20;
/// Inbox rounds of gradient blocks.
pub const BACKWARD_ROUND: u32 = 3 << 20;
/// Most node types a round number can tell apart.
pub const MAX_TYPES: usize = 1 << 12;

/// The inbox round of layer `layer`'s blocks of type `ty`, from `base`.
pub fn round(base: u32, layer: usize, ty: usize) -> u32 {
    base + (layer * MAX_TYPES + ty) as u32
}

/// One worker's rows of one layer and node type, or the notice that the
/// receivers keep their copy.
#[derive(Debug, Serialize, Deserialize)]
pub struct BlockMsg {
    /// Generation of the run.
    pub gen: u64,
    /// Global step number (one step per epoch; the top bit set in evaluation).
    pub seq: u64,
    /// Inbox round: the layer and node type ([`round`]).
    pub round: u32,
    /// Sending worker.
    pub from: u32,
    /// A flag byte (1: rows follow, 0: skipped), then little-endian f32 rows.
    pub data: ByteVec,
}

macro_rules! block_message {
    ($name:ident, $kind:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub BlockMsg);

        impl Msg for $name {
            type Reply = ();
            const KIND: &'static str = $kind;
        }

        impl Handler<Deliver<$name>> for InboxActor {
            type Result = MessageResult<Deliver<$name>>;
            fn handle(&mut self, m: Deliver<$name>, _: &mut Context<Self>) -> Self::Result {
                let b = m.msg.0;
                // Filed under the worker the sending actor is, not the one it claims.
                if m.from.as_str() == super::names::worker(b.from)
                    && b.round >= FORWARD_ROUND
                    && b.round < BACKWARD_ROUND + (1 << 20)
                    && !b.data.0.is_empty()
                {
                    self.0.file_gen(b.gen, b.seq, b.round, b.from, b.data.0);
                } else {
                    tracing::warn!(
                        "dropped a {} message from {} claiming to be worker {} (round {})",
                        $kind,
                        m.from.as_str(),
                        b.from,
                        b.round
                    );
                }
                MessageResult(())
            }
        }
    };
}

block_message!(
    Broadcast,
    "broadcast",
    "A block broadcast in a training epoch's forward pass."
);
block_message!(
    EvalBroadcast,
    "broadcast.eval",
    "A block broadcast for evaluation (no block is skipped there)."
);
block_message!(
    GradBlock,
    "grad-block",
    "The gradient of the owner's block, from a worker that read it."
);

/// Payload flags.
const SKIPPED: u8 = 0;
const DENSE: u8 = 1;
const SPARSE: u8 = 2;

/// The payload of a block of `width`-wide rows (`None`: skipped): a flag,
/// then the rows (`DENSE`) or, with `sparse` and where it is shorter, their
/// non-zeros (`SPARSE`, `distributed::rows`). Bag-of-words features travel
/// about ten times smaller, with the same bits.
pub fn encode(rows: Option<&[f32]>, width: usize, sparse: bool) -> Vec<u8> {
    let Some(r) = rows else { return vec![SKIPPED] };
    match sparse
        .then(|| crate::distributed::rows::encode_sparse(r, width))
        .flatten()
    {
        Some(body) => [vec![SPARSE], body].concat(),
        None => {
            let mut out = Vec::with_capacity(1 + 4 * r.len());
            out.push(DENSE);
            out.extend_from_slice(bytemuck::cast_slice(r));
            out
        }
    }
}

/// The bytes a payload carries past its flag (what the report counts).
pub fn body_bytes(payload: &[u8]) -> u64 {
    payload.len().saturating_sub(1) as u64
}

/// Rows of a payload (`None`: skipped), checked to be `rows` rows of
/// `width` values before anything is allocated.
pub fn decode(data: &[u8], rows: usize, width: usize) -> crate::error::Result<Option<Vec<f32>>> {
    let len = rows * width;
    match data.split_first() {
        Some((&SKIPPED, [])) => Ok(None),
        Some((&DENSE, body)) => crate::distributed::decode_f32(body, len).map(Some),
        Some((&SPARSE, body)) => crate::distributed::rows::decode_sparse(body, rows, width).map(Some),
        _ => Err(crate::error::TrainError::Protocol(format!("a block payload of {} bytes is neither a skip notice nor {rows} rows of {width} values", data.len()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_bad_ones_are_refused() {
        assert_eq!(
            decode(&encode(Some(&[1.0, -2.5]), 2, true), 1, 2).unwrap(),
            Some(vec![1.0, -2.5])
        );
        assert_eq!(decode(&encode(None, 2, true), 1, 2).unwrap(), None);
        assert_eq!(
            decode(&encode(Some(&[]), 4, true), 0, 4).unwrap(),
            Some(vec![])
        );
        assert!(
            decode(&encode(Some(&[1.0]), 1, true), 2, 1).is_err(),
            "too few values"
        );
        assert!(decode(&[0, 1], 0, 1).is_err(), "a skip notice with a body");
        assert!(decode(&[7], 0, 1).is_err(), "an unknown flag");
        assert!(decode(&[], 0, 1).is_err(), "no flag");
        assert_ne!(round(FORWARD_ROUND, 1, 0), round(FORWARD_ROUND, 0, 1));
        assert!(round(FORWARD_ROUND, 200, MAX_TYPES - 1) < BACKWARD_ROUND);
    }

    #[test]
    fn mostly_zero_rows_travel_as_their_non_zeros_with_the_same_bits() {
        let (rows, width, x) = crate::distributed::rows::tests::mostly_zero();
        assert_eq!(
            encode(Some(&x), width, false)[0],
            DENSE,
            "sparse only where asked"
        );
        let p = encode(Some(&x), width, true);
        assert_eq!(p[0], SPARSE);
        assert_eq!(
            body_bytes(&p),
            4 * 4 + 8 * 4,
            "offsets and four non-zeros (-0.0 kept: its bits are not zero)"
        );
        let back = decode(&p, rows, width).unwrap().unwrap();
        assert_eq!(
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // Dense rows stay dense.
        let dense: Vec<f32> = (0..rows * width).map(|i| i as f32 + 1.0).collect();
        assert_eq!(encode(Some(&dense), width, true)[0], DENSE);
        // A damaged sparse payload is refused (distributed::rows tests the rest).
        assert!(decode(&p, rows, 7).is_err(), "a column past the width");
    }
}
