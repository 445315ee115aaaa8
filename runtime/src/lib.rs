//! hetgnn's actor runtime, independent of graphs and models.
//!
//! Actors are actix actors registered on a [`Node`] under a name
//! (`sampler/2`, `features/author/1`); anyone holding an [`ActorRef`] can
//! `tell` or `ask` them ([`Msg`] types, with deadlines) without knowing
//! whether they run in this process or on another node. Embedded nodes use
//! local mailboxes only; a node started from a [`Topology`] also speaks QUIC
//! with mutual TLS against the cluster CA ([`certs`], [`tls`]).
//!
//! Pieces, each a module: the wire format ([`wire`]) and duplicate
//! suppression ([`dedup`]); the topology file's runtime sections
//! ([`config`]); the sans-IO cores — failure detector ([`membership`]),
//! seeded fault plan with bandwidth shaping ([`chaos`]) and log rate limit
//! ([`log_limit`]) — that take the time
//! as input and so are tested without sockets or sleeps; the transport that
//! drives them; [`metrics`] readable in-process and as Prometheus text.
//!
//! Delivery: every request has an id; `ask` resends it until answered, and
//! the receiver handles each id once and resends its cached reply to
//! duplicates, so handlers see each message exactly once even when frames
//! are lost or duplicated. Fault decisions are a pure function of the seed,
//! the link and the frame's position on it: same seed, same faults.
#![warn(missing_docs)]

pub mod actor_ref;
pub mod alloc;
pub mod certs;
pub mod cgroup;
pub mod chaos;
pub mod config;
pub mod dedup;
pub mod log_limit;
pub mod membership;
pub mod metrics;
pub mod node;
pub mod node_actor;
mod registry;
pub mod tls;
mod transport;
mod udp;
pub mod wire;

pub use actor_ref::{ActorRef, AskError, Deliver, Msg};
pub use config::{
    ByteSize, ChaosConfig, ClusterConfig, ConfigError, LinksConfig, NodeSpec, Placement, Topology,
};
pub use dedup::Dedup;
pub use membership::{MemberEvent, PeerState};
pub use metrics::{MetricsSnapshot, Resends};
pub use node::{MemberInfo, Node, StartError};
pub use node_actor::{NodeStatus, Ping, Status};
pub use wire::{
    ActorName, ByteVec, Envelope, Frame, FrameDecoder, MsgId, RemoteError, SharedBytes,
    TensorPayload, WireError,
};

/// Internals exposed for tests and benchmarks of the wire protocol (not a stable API).
#[doc(hidden)]
pub mod testing {
    pub use crate::transport::{close, stop, TAG_LARGE, TAG_SMALL};
}
