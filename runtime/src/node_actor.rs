//! The system actor every node runs as `node/<id>`: it answers [`Status`]
//! (for `hetgnn doctor` and monitoring) and [`Ping`] (an echo, for tests and
//! round-trip measurements).

use actix::{Actor, Context, Handler, MessageResult};
use serde::{Deserialize, Serialize};

use crate::actor_ref::{Deliver, Msg};
use crate::node::{MemberInfo, Node, WeakNode};
use crate::wire::ByteVec;

/// Asks a node for its [`NodeStatus`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status;

/// What a node reports about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node id.
    pub id: String,
    /// Milliseconds since start.
    pub uptime_ms: u64,
    /// Its view of its peers.
    pub peers: Vec<MemberInfo>,
    /// Actors registered on it.
    pub actors: Vec<String>,
    /// Frames it has sent.
    pub messages_out: u64,
    /// Bytes it has sent (framed).
    pub wire_bytes_out: u64,
}

impl Msg for Status {
    type Reply = NodeStatus;
    const KIND: &'static str = "status";
}

/// Echo: the reply carries the same bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ping(pub ByteVec);

impl Msg for Ping {
    type Reply = ByteVec;
    const KIND: &'static str = "ping";
}

/// The system actor.
pub struct NodeActor {
    // Weak: the node's registry holds this actor's mailbox, so a strong
    // reference back would keep both alive forever.
    node: WeakNode,
}

impl Actor for NodeActor {
    type Context = Context<Self>;
}

impl NodeActor {
    /// Starts the system actor of `node` and registers it as `node/<id>`.
    pub(crate) fn serve(node: &Node) {
        let addr = NodeActor {
            node: node.downgrade(),
        }
        .start();
        let name = crate::node::system_actor(node.id()).expect("node ids are valid actor names");
        if let Ok(r) = node.register(name.as_str(), &addr) {
            r.handle::<Status>().handle::<Ping>();
        }
    }

    fn node(&self) -> Option<Node> {
        self.node.upgrade()
    }
}

impl Handler<Deliver<Status>> for NodeActor {
    type Result = MessageResult<Deliver<Status>>;
    fn handle(&mut self, _: Deliver<Status>, _: &mut Context<Self>) -> Self::Result {
        let Some(node) = self.node() else {
            return MessageResult(NodeStatus {
                id: String::new(),
                uptime_ms: 0,
                peers: vec![],
                actors: vec![],
                messages_out: 0,
                wire_bytes_out: 0,
            });
        };
        let m = node.metrics();
        let out = m
            .links
            .iter()
            .filter(|((_, d, _), _)| *d == crate::metrics::Dir::Out);
        let (messages_out, wire_bytes_out) =
            out.fold((0, 0), |(a, b), (_, c)| (a + c.messages, b + c.wire_bytes));
        MessageResult(NodeStatus {
            id: node.id().to_string(),
            uptime_ms: node.uptime().as_millis() as u64,
            peers: node.members(),
            actors: node.local_actors().into_iter().map(String::from).collect(),
            messages_out,
            wire_bytes_out,
        })
    }
}

impl Handler<Deliver<Ping>> for NodeActor {
    type Result = MessageResult<Deliver<Ping>>;
    fn handle(&mut self, m: Deliver<Ping>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(m.msg.0)
    }
}
