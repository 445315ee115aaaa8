//! Location-transparent references to actors. A message type implements
//! [`Msg`]; an actix actor that handles [`Deliver<M>`] is registered under a
//! name with [`crate::Node::register`]; anyone holding an [`ActorRef`] can
//! `tell` or `ask` it without knowing whether it runs in this process (local
//! mailbox, no serialization) or on another node (bincode over QUIC).

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::node::Node;
use crate::wire::{ActorName, RemoteError};

/// A message that can cross the wire.
pub trait Msg: Serialize + DeserializeOwned + Send + 'static {
    /// What the handler answers.
    type Reply: Serialize + DeserializeOwned + Send + 'static;
    /// The kind: a short `[a-z0-9_./-]` name for dispatch and metrics, unique per actor.
    const KIND: &'static str;
}

/// A message as delivered to a handler, with its sender's name.
pub struct Deliver<M: Msg> {
    /// The message.
    pub msg: M,
    /// The sending actor.
    pub from: ActorName,
}

impl<M: Msg> actix::Message for Deliver<M> {
    type Result = M::Reply;
}

/// Why an `ask` or `tell` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// No reply before the deadline (the message may or may not have been handled).
    #[error("{actor} did not answer a {kind} message within {after:?}")]
    Timeout {
        /// The actor asked.
        actor: String,
        /// The message kind.
        kind: String,
        /// The deadline.
        after: Duration,
    },
    /// No node runs an actor of that name.
    #[error("no node runs actor {0} (check [placement])")]
    Unplaced(String),
    /// The receiving side refused or failed the request.
    #[error("{actor}: {source}")]
    Remote {
        /// The actor asked.
        actor: String,
        /// What went wrong there.
        #[source]
        source: RemoteError,
    },
    /// The message or its reply could not be encoded or decoded.
    #[error("{0}")]
    Codec(String),
    /// This node is shutting down.
    #[error("node is shutting down")]
    Shutdown,
}

/// A handle on a named actor, wherever it runs.
#[derive(Clone)]
pub struct ActorRef {
    pub(crate) name: ActorName,
    pub(crate) from: ActorName,
    pub(crate) node: Node,
}

impl ActorRef {
    /// The actor's name.
    pub fn name(&self) -> &ActorName {
        &self.name
    }

    /// The same reference, sending as `sender` (handlers see it in [`Deliver::from`]).
    pub fn with_sender(mut self, sender: ActorName) -> ActorRef {
        self.from = sender;
        self
    }

    /// Sends `msg` and waits up to `timeout` for the reply. Over the network the
    /// request is resent (same id) until answered, so it is handled once even
    /// if frames are lost or duplicated.
    pub async fn ask<M: Msg>(&self, msg: M, timeout: Duration) -> Result<M::Reply, AskError> {
        self.node.ask(&self.name, &self.from, msg, timeout).await
    }

    /// Sends `msg` without waiting: delivered locally at once, or over the
    /// network with resends for up to [`crate::node::TELL_TIMEOUT`]; the reply is discarded.
    /// Must be called inside a tokio runtime.
    pub fn tell<M: Msg>(&self, msg: M) -> Result<(), AskError> {
        self.node.tell(&self.name, &self.from, msg)
    }
}

impl std::fmt::Debug for ActorRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ActorRef({} on {})", self.name, self.node.id())
    }
}
