//! A node of the runtime: its local actors, and (unless embedded) its QUIC
//! transport, failure detector, fault plan and metrics endpoint. Every node
//! runs a system actor, `node/<id>` ([`crate::node_actor`]), answering status
//! and ping requests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Addr, Context, Handler, Recipient};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::actor_ref::{ActorRef, AskError, Deliver, Msg};
use crate::chaos::Faults;
use crate::config::{ChaosConfig, ConfigError, LinksConfig, Topology};
use crate::membership::{MemberEvent, PeerState};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::registry::{Lookup, Registry};
use crate::tls::{Identity, QuicConfigs, TlsError};
use crate::transport::{bind_endpoint, Settings, Transport};
use crate::wire::{decode_msg_shared, encode_msg, ActorName, RemoteError, WireError};

/// How long a remote `tell` keeps resending before giving up (and logging it).
pub const TELL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The topology is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Certificates are missing or do not fit.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// An address could not be bound.
    #[error("{key}: cannot listen on {addr}: {msg}")]
    Bind {
        /// The configuration key naming the address.
        key: String,
        /// The address.
        addr: SocketAddr,
        /// Why.
        msg: String,
    },
}

/// One peer as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Node id.
    pub id: String,
    /// Failure-detector state.
    pub state: PeerState,
    /// Milliseconds since its last heartbeat.
    pub last_heard_ms: Option<u64>,
    /// Whether a QUIC connection is open to it.
    pub connected: bool,
}

struct Inner {
    id: String,
    system: ActorName,
    registry: Arc<Registry>,
    transport: Option<Arc<Transport>>,
    topology: Option<Topology>,
    metrics: Arc<Metrics>,
    started: Instant,
    events: broadcast::Sender<MemberEvent>,
    cancel: CancellationToken,
    /// Where actors the topology does not place run, as learned at run time
    /// (from a node's status, say).
    learned: dashmap::DashMap<String, String>,
}

/// A handle on a running node (cheap to clone).
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

/// A reference to a node that does not keep it alive.
#[derive(Clone)]
pub struct WeakNode(std::sync::Weak<Inner>);

impl WeakNode {
    /// The node, if it still exists.
    pub fn upgrade(&self) -> Option<Node> {
        self.0.upgrade().map(|inner| Node { inner })
    }
}

/// The name of node `id`'s system actor.
pub fn system_actor(id: &str) -> Result<ActorName, WireError> {
    ActorName::new(&format!("node/{id}"))
}

enum Route {
    Local,
    Remote(String),
}

/// Adds message types to a registered actor ([`Node::register`]).
pub struct Registration<'a, A: Actor> {
    node: &'a Node,
    name: ActorName,
    addr: Addr<A>,
}

impl<A: Actor<Context = Context<A>>> Registration<'_, A> {
    /// The actor handles `M` (it implements `Handler<Deliver<M>>`).
    pub fn handle<M: Msg>(self) -> Self
    where
        A: Handler<Deliver<M>>,
    {
        self.node
            .inner
            .registry
            .insert::<M>(&self.name, self.addr.clone().recipient());
        self
    }
}

impl Node {
    fn build(
        id: &str,
        transport: Option<Arc<Transport>>,
        topology: Option<Topology>,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        events: broadcast::Sender<MemberEvent>,
    ) -> Result<Node, WireError> {
        Ok(Node {
            inner: Arc::new(Inner {
                id: id.to_string(),
                system: system_actor(id)?,
                registry,
                transport,
                topology,
                metrics,
                started: Instant::now(),
                events,
                cancel: CancellationToken::new(),
                learned: dashmap::DashMap::new(),
            }),
        })
    }

    /// A node with local mailboxes only: no sockets, no certificates. Every
    /// actor is local; must be called inside an actix system.
    pub fn embedded(id: &str) -> Result<Node, WireError> {
        let (events, _) = broadcast::channel(256);
        let node = Node::build(id, None, None, Arc::default(), Arc::default(), events)?;
        crate::node_actor::NodeActor::serve(&node);
        Ok(node)
    }

    /// Starts node `id` of `topology`: checks the file and its certificates,
    /// binds the node's address, connects to its peers. Must be called inside
    /// an actix system.
    pub async fn start(topology: Topology, id: &str) -> Result<Node, StartError> {
        topology.validate()?;
        let i = topology.index(id).ok_or_else(|| {
            ConfigError::new(
                "--node",
                format!("{id:?} is not in cluster.nodes ({})", node_list(&topology)),
            )
        })?;
        let (cert, key) = topology.cert_paths(id);
        let ca = topology.ca_path();
        // Certificate problems name the key that points at the file.
        let key_name = if topology.cluster.nodes[i].cert.is_some() {
            format!("cluster.nodes[{i}].cert")
        } else {
            "cluster.certs_dir".to_string()
        };
        let named = |e: TlsError| ConfigError::new(&key_name, e.to_string());
        crate::tls::check_node_cert(&ca, &cert, &key, id).map_err(named)?;
        let identity = Identity::load(&ca, &cert, &key).map_err(named)?;
        let c = &topology.cluster;
        let idle = idle_timeout(c.failure_timeout_ms);
        let bind = topology.addr(i)?;
        let configs = QuicConfigs::new(&identity, idle)?;
        let endpoint =
            bind_endpoint(bind, Some((*configs.server(&bind)).clone())).map_err(|e| {
                StartError::Bind {
                    key: format!("cluster.nodes[{i}].addr"),
                    addr: bind,
                    msg: e.to_string(),
                }
            })?;
        let mut peers = Vec::new();
        for (j, n) in c.nodes.iter().enumerate() {
            if j != i {
                peers.push((n.id.clone(), topology.addr(j)?, i < j));
            }
        }
        let settings = Settings::new(c, id, i as u32);
        let metrics_addr = topology.metrics_addr(i)?;
        let (events, _) = broadcast::channel(256);
        let registry: Arc<Registry> = Arc::default();
        let metrics: Arc<Metrics> = Arc::default();
        let faults = Faults::new(topology.chaos.clone(), topology.links.clone());
        let transport = Transport::start(
            settings,
            endpoint,
            configs,
            peers,
            registry.clone(),
            metrics.clone(),
            faults,
            events.clone(),
            true,
        );
        let node = Node::build(
            id,
            Some(transport),
            Some(topology),
            registry,
            metrics,
            events,
        )
        .map_err(|e| ConfigError::new("--node", e.to_string()))?;
        if let Some(addr) = metrics_addr {
            node.serve_metrics(addr).await?;
        }
        crate::node_actor::NodeActor::serve(&node);
        tracing::info!("{id}: listening on {bind}");
        Ok(node)
    }

    /// A client of the cluster (for tools such as `hetgnn doctor`): it hosts no
    /// actors, dials every node and can ask their actors.
    pub async fn client(
        topology: Topology,
        name: &str,
        identity: Identity,
    ) -> Result<Node, StartError> {
        topology.validate()?;
        let c = &topology.cluster;
        let idle = idle_timeout(c.failure_timeout_ms);
        let first = topology.addr(0)?;
        let bind: SocketAddr = if first.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let endpoint = bind_endpoint(bind, None).map_err(|e| StartError::Bind {
            key: "client".into(),
            addr: bind,
            msg: e.to_string(),
        })?;
        let configs = QuicConfigs::new(&identity, idle)?;
        let mut peers = Vec::new();
        for (j, n) in c.nodes.iter().enumerate() {
            peers.push((n.id.clone(), topology.addr(j)?, true));
        }
        let index = 0x8000_0000
            | (name.bytes().fold(0x811C_9DC5u32, |h, b| {
                (h ^ b as u32).wrapping_mul(0x0100_0193)
            }) & 0x7FFF_FFFF);
        let settings = Settings::new(c, name, index);
        let (events, _) = broadcast::channel(16);
        let registry: Arc<Registry> = Arc::default();
        let metrics: Arc<Metrics> = Arc::default();
        let transport = Transport::start(
            settings,
            endpoint,
            configs,
            peers,
            registry.clone(),
            metrics.clone(),
            Faults::default(),
            events.clone(),
            false,
        );
        Node::build(
            name,
            Some(transport),
            Some(topology),
            registry,
            metrics,
            events,
        )
        .map_err(|e| StartError::Config(ConfigError::new("client", e.to_string())))
    }

    /// A reference that does not keep the node alive.
    pub fn downgrade(&self) -> WeakNode {
        WeakNode(Arc::downgrade(&self.inner))
    }

    /// This node's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// How long this node has run.
    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// A reference to actor `name`, wherever it runs.
    pub fn actor(&self, name: &str) -> Result<ActorRef, WireError> {
        Ok(ActorRef {
            name: ActorName::new(name)?,
            from: self.inner.system.clone(),
            node: self.clone(),
        })
    }

    /// Notes that actor `name` runs on node `node`, for an actor the topology
    /// does not place (one a node's status lists, say).
    pub fn learn_placement(&self, name: &str, node: &str) {
        self.inner
            .learned
            .insert(name.to_string(), node.to_string());
    }

    /// Registers a local actor under `name`; chain [`Registration::handle`] for
    /// each message type it accepts over location-transparent references.
    pub fn register<A: Actor<Context = Context<A>>>(
        &self,
        name: &str,
        addr: &Addr<A>,
    ) -> Result<Registration<'_, A>, WireError> {
        Ok(Registration {
            node: self,
            name: ActorName::new(name)?,
            addr: addr.clone(),
        })
    }

    /// Removes a local actor's registration.
    pub fn unregister(&self, name: &str) -> bool {
        ActorName::new(name).is_ok_and(|n| self.inner.registry.remove(&n))
    }

    /// Names of this node's actors.
    pub fn local_actors(&self) -> Vec<ActorName> {
        self.inner.registry.names()
    }

    /// Peer up/down events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<MemberEvent> {
        self.inner.events.subscribe()
    }

    /// Delivers peer up/down events to an actor. Must be called inside a tokio runtime.
    pub fn subscribe_actor(&self, recipient: Recipient<MemberEvent>) {
        let mut rx = self.subscribe();
        let cancel = self.inner.cancel.clone();
        tokio::spawn(async move {
            loop {
                let ev = tokio::select! {
                    _ = cancel.cancelled() => return,
                    ev = rx.recv() => ev,
                };
                match ev {
                    Ok(ev) => recipient.do_send(ev),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!("an event subscriber missed {n} membership events")
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    /// The peers and their states (empty when embedded).
    pub fn members(&self) -> Vec<MemberInfo> {
        let Some(t) = &self.inner.transport else {
            return Vec::new();
        };
        let view = t
            .membership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .view(Instant::now());
        view.into_iter()
            .map(|(id, state, since)| MemberInfo {
                connected: t.connected(&id),
                id,
                state,
                last_heard_ms: since.map(|d| d.as_millis() as u64),
            })
            .collect()
    }

    /// The transport's metrics so far.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// Replaces the fault plan (the `[chaos]` and `[links]` sections) while running.
    pub fn set_faults(&self, chaos: ChaosConfig, links: LinksConfig) {
        if let Some(t) = &self.inner.transport {
            t.set_faults(Faults::new(chaos, links));
        }
    }

    /// The topology this node runs (none when embedded).
    pub fn topology(&self) -> Option<&Topology> {
        self.inner.topology.as_ref()
    }

    /// Stops the transport and background tasks. Actors keep their mailboxes
    /// until the actix system stops.
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        if let Some(t) = &self.inner.transport {
            t.shutdown().await;
        }
    }

    fn route(&self, name: &ActorName) -> Result<Route, AskError> {
        let inner = &self.inner;
        let (Some(t), Some(topo)) = (&inner.transport, &inner.topology) else {
            return Ok(Route::Local);
        };
        if inner.registry.contains(name) {
            return Ok(Route::Local);
        }
        let learned: Option<String>;
        let placed = match name.as_str().strip_prefix("node/") {
            Some(id) if topo.index(id).is_some() => Some(id),
            _ => match topo.placed(name.as_str()) {
                Some(n) => Some(n),
                None => {
                    learned = inner.learned.get(name.as_str()).map(|e| e.value().clone());
                    learned.as_deref()
                }
            },
        };
        match placed {
            Some(n) if n == inner.id => Ok(Route::Local),
            Some(n) if t.peer(n).is_some() => Ok(Route::Remote(n.to_string())),
            _ => Err(AskError::Unplaced(name.to_string())),
        }
    }

    pub(crate) async fn ask<M: Msg>(
        &self,
        to: &ActorName,
        from: &ActorName,
        msg: M,
        timeout: Duration,
    ) -> Result<M::Reply, AskError> {
        let start = Instant::now();
        let deadline = start + timeout;
        let kind =
            ActorName::new(M::KIND).map_err(|e| AskError::Codec(format!("message kind: {e}")))?;
        match self.route(to)? {
            Route::Local => loop {
                match self.inner.registry.local::<M>(to) {
                    Lookup::Found(r) => {
                        let fut = r.send(Deliver {
                            msg,
                            from: from.clone(),
                        });
                        return match tokio::time::timeout_at(deadline.into(), fut).await {
                            Err(_) => Err(AskError::Timeout {
                                actor: to.to_string(),
                                kind: kind.to_string(),
                                after: timeout,
                            }),
                            Ok(Err(_)) => {
                                Err(local_error(to, RemoteError::Stopped(to.to_string())))
                            }
                            Ok(Ok(v)) => {
                                self.inner.metrics.latency(M::KIND, start.elapsed());
                                Ok(v)
                            }
                        };
                    }
                    Lookup::NoHandler => {
                        return Err(local_error(
                            to,
                            RemoteError::NoHandler {
                                actor: to.to_string(),
                                kind: kind.to_string(),
                            },
                        ))
                    }
                    // Placed here but not registered yet (start-up): wait for it until the deadline.
                    Lookup::Missing if Instant::now() + Duration::from_millis(5) < deadline => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Lookup::Missing => {
                        return Err(local_error(to, RemoteError::NoSuchActor(to.to_string())))
                    }
                }
            },
            Route::Remote(peer) => {
                let t = self.inner.transport.as_ref().ok_or(AskError::Shutdown)?;
                let payload = encode_msg(&msg).map_err(|e| AskError::Codec(e.to_string()))?;
                let reply = t.ask(&peer, to, from, kind, payload, timeout).await?;
                // Byte blocks in the reply stay where they were received.
                decode_msg_shared::<M::Reply>(&reply)
                    .map_err(|e| AskError::Codec(format!("reply from {to}: {e}")))
            }
        }
    }

    pub(crate) fn tell<M: Msg>(
        &self,
        to: &ActorName,
        from: &ActorName,
        msg: M,
    ) -> Result<(), AskError> {
        let kind =
            ActorName::new(M::KIND).map_err(|e| AskError::Codec(format!("message kind: {e}")))?;
        match self.route(to)? {
            Route::Local => match self.inner.registry.local::<M>(to) {
                Lookup::Found(r) => {
                    r.do_send(Deliver {
                        msg,
                        from: from.clone(),
                    });
                    Ok(())
                }
                Lookup::NoHandler => Err(local_error(
                    to,
                    RemoteError::NoHandler {
                        actor: to.to_string(),
                        kind: kind.to_string(),
                    },
                )),
                Lookup::Missing => Err(local_error(to, RemoteError::NoSuchActor(to.to_string()))),
            },
            Route::Remote(peer) => {
                let t = self.inner.transport.clone().ok_or(AskError::Shutdown)?;
                let payload = encode_msg(&msg).map_err(|e| AskError::Codec(e.to_string()))?;
                let asking = t.begin(&peer, to, from, kind, payload, TELL_TIMEOUT)?;
                let to = to.clone();
                tokio::spawn(async move {
                    if let Err(e) = t.complete(asking).await {
                        tracing::warn!("tell to {to} failed: {e}");
                    }
                });
                Ok(())
            }
        }
    }

    async fn serve_metrics(&self, addr: SocketAddr) -> Result<(), StartError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| StartError::Bind {
                key: "cluster.metrics_addr".into(),
                addr,
                msg: e.to_string(),
            })?;
        let metrics = self.inner.metrics.clone();
        let id = self.inner.id.clone();
        let cancel = self.inner.cancel.clone();
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = tokio::select! {
                    _ = cancel.cancelled() => return,
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                };
                let body = metrics.prometheus(&id);
                tokio::spawn(async move {
                    // Read (and ignore) the request head, bounded in size and time.
                    let mut buf = [0u8; 4096];
                    let _ = tokio::time::timeout(Duration::from_secs(2), sock.read(&mut buf)).await;
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(body.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        tracing::info!("{}: metrics on http://{addr}/metrics", self.inner.id);
        Ok(())
    }
}

/// The error a local delivery reports, shaped like a remote one so callers cannot tell them apart.
fn local_error(to: &ActorName, source: RemoteError) -> AskError {
    AskError::Remote {
        actor: to.to_string(),
        source,
    }
}

fn idle_timeout(failure_timeout_ms: u64) -> Duration {
    Duration::from_millis(failure_timeout_ms.saturating_mul(3)).max(Duration::from_secs(10))
}

fn node_list(t: &Topology) -> String {
    t.cluster
        .nodes
        .iter()
        .map(|n| n.id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
