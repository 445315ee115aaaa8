//! hetgnn's actor runtime, independent of graphs and models.
//!
//! So far: cluster certificates ([`certs`]), the wire format ([`wire`]): length-prefixed bincode envelopes with
//! limits checked before allocation, raw little-endian tensor payloads, and
//! the receiver-side duplicate filter ([`dedup`]) that makes at-least-once
//! delivery have exactly-once effect. The QUIC transport, registry,
//! membership and fault injection build on these (issue 4).
#![warn(missing_docs)]

pub mod certs;
pub mod dedup;
pub mod wire;

pub use dedup::Dedup;
pub use wire::{ActorName, Envelope, FrameDecoder, MsgId, TensorPayload, WireError};
