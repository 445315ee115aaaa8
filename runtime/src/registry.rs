//! The actors running on this node, by name: for each, a typed mailbox per
//! message type (used by local callers, no serialization) and a decoding
//! dispatcher per message kind (used for requests that arrive over the wire).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use actix::Recipient;
use dashmap::DashMap;

use crate::actor_ref::{Deliver, Msg};
use crate::wire::{decode_msg, encode_msg, ActorName, ByteVec, RemoteError};

/// The future a dispatcher returns: the encoded reply or why there is none.
pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Result<ByteVec, RemoteError>> + Send>>;
/// Decodes a payload for one actor and message kind and delivers it.
pub(crate) type Dispatch = Arc<dyn Fn(ActorName, &[u8]) -> HandlerFuture + Send + Sync>;

#[derive(Default)]
struct Entry {
    typed: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    dispatch: HashMap<&'static str, Dispatch>,
}

/// What a local lookup found.
pub(crate) enum Lookup<M: Msg> {
    /// The actor's mailbox for `M`.
    Found(Recipient<Deliver<M>>),
    /// The actor exists but does not handle `M`.
    NoHandler,
    /// No actor of that name here.
    Missing,
}

/// The local actors of a node: looked up by every connection's reader and
/// every local ask at once, so a concurrent map.
#[derive(Default)]
pub struct Registry {
    actors: DashMap<ActorName, Entry>,
}

impl Registry {
    /// Adds (or replaces) `name`'s handler for `M`.
    pub(crate) fn insert<M: Msg>(&self, name: &ActorName, recipient: Recipient<Deliver<M>>) {
        let actor = name.to_string();
        let r = recipient.clone();
        let dispatch: Dispatch = Arc::new(move |from: ActorName, bytes: &[u8]| -> HandlerFuture {
            let msg = decode_msg::<M>(bytes);
            let r = r.clone();
            let actor = actor.clone();
            Box::pin(async move {
                let msg = msg.map_err(|e| RemoteError::BadMessage(e.to_string()))?;
                let reply = r
                    .send(Deliver { msg, from })
                    .await
                    .map_err(|_| RemoteError::Stopped(actor))?;
                encode_msg(&reply)
                    .map(ByteVec)
                    .map_err(|e| RemoteError::BadMessage(format!("reply: {e}")))
            })
        });
        let mut e = self.actors.entry(name.clone()).or_default();
        e.typed.insert(TypeId::of::<M>(), Box::new(recipient));
        e.dispatch.insert(M::KIND, dispatch);
    }

    /// Removes `name`; later messages to it fail with "no such actor".
    pub(crate) fn remove(&self, name: &ActorName) -> bool {
        self.actors.remove(name).is_some()
    }

    /// Whether `name` runs here.
    pub(crate) fn contains(&self, name: &ActorName) -> bool {
        self.actors.contains_key(name)
    }

    /// `name`'s mailbox for `M`.
    pub(crate) fn local<M: Msg>(&self, name: &ActorName) -> Lookup<M> {
        let Some(e) = self.actors.get(name) else {
            return Lookup::Missing;
        };
        match e
            .typed
            .get(&TypeId::of::<M>())
            .and_then(|b| b.downcast_ref::<Recipient<Deliver<M>>>())
        {
            Some(r) => Lookup::Found(r.clone()),
            None => Lookup::NoHandler,
        }
    }

    /// The dispatcher for a request that arrived over the wire.
    pub(crate) fn dispatch(&self, name: &ActorName, kind: &str) -> Result<Dispatch, RemoteError> {
        let e = self
            .actors
            .get(name)
            .ok_or_else(|| RemoteError::NoSuchActor(name.to_string()))?;
        e.dispatch
            .get(kind)
            .cloned()
            .ok_or_else(|| RemoteError::NoHandler {
                actor: name.to_string(),
                kind: kind.to_string(),
            })
    }

    /// Names of the local actors, sorted.
    pub fn names(&self) -> Vec<ActorName> {
        let mut v: Vec<_> = self.actors.iter().map(|e| e.key().clone()).collect();
        v.sort();
        v
    }
}
