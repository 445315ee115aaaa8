//! The QUIC transport: one mutually authenticated connection per pair of
//! nodes (the node listed first dials, the other accepts; clients such as
//! `hetgnn doctor` always dial), one ordered stream per direction for small
//! frames and a fresh stream per large frame, requests resent until answered,
//! replies cached for duplicates, heartbeats feeding the failure detector, and
//! the seeded fault plan applied to every frame sent.
//!
//! Streams start with a one-byte tag: [`TAG_SMALL`] (a sequence of
//! length-prefixed frames) or [`TAG_LARGE`] (exactly one frame). A stream that
//! breaks the format closes its connection, and only that one. Large frames
//! a peer has announced and not yet had handled share a byte budget per peer
//! ([`LargeBudget`]); a frame refused for want of room, or whose body stalls,
//! is stopped alone (the sender's resends bring it again).
//!
//! Why one file of ~900 lines: like quinn's `connection` module, this is one
//! state machine (dialling, accepting, the writer and reader of each
//! connection, asks and their retries, replies to duplicates) whose parts
//! share the peer table and the pending asks; split, each part would reach
//! into the others' state. The pieces without that state live apart: framing
//! in `wire.rs`, duplicates in `dedup.rs`, faults in `chaos.rs`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use tokio::sync::{
    broadcast, mpsc, oneshot, watch, Notify, Semaphore, SemaphorePermit, TryAcquireError,
};
use tokio_util::sync::CancellationToken;

use crate::actor_ref::AskError;
use crate::chaos::{Faults, TokenBucket};
use crate::dedup::{Probed, ReplyCache, Seen};
use crate::log_limit::{suppressed_note, LogLimit};
use crate::membership::{MemberEvent, Membership};
use crate::metrics::{Dir, Metrics};
use crate::registry::Registry;
use crate::tls;
use crate::wire::{
    decode_large_ref, encode_frame, encode_reply_head, encode_request_head, ActorName, Envelope,
    Frame, FrameDecoder, FrameRef, MsgId, RemoteError, WireError, MAX_LARGE_FRAME, SMALL_FRAME,
};

/// Tag of the shared stream of small frames.
pub const TAG_SMALL: u8 = 0;
/// Tag of a stream carrying one large frame.
pub const TAG_LARGE: u8 = 1;

/// Connection close codes.
pub mod close {
    /// The peer broke the wire format.
    pub const BAD_FRAME: u32 = 1;
    /// A newer connection to the same peer replaced this one.
    pub const REPLACED: u32 = 2;
    /// This node is shutting down.
    pub const SHUTDOWN: u32 = 3;
    /// The failure detector declared the peer down.
    pub const PEER_DOWN: u32 = 4;
    /// The certificate names no usable identity.
    pub const IDENTITY: u32 = 5;
}

/// Codes a receiver stops one large-frame stream with (its connection stays
/// up; the sender's resends bring the frame again).
pub mod stop {
    /// The peer's large frames in flight already fill its budget, and enough wait for room.
    pub const BUSY: u32 = 1;
    /// The frame's body made no progress for the stall timeout (30 s).
    pub const STALLED: u32 = 2;
}

/// Pieces in which large frames are paced through a bandwidth cap.
const PACE_PIECE: usize = 256 << 10;
/// Frames waiting to be written to one peer; beyond this, frames are dropped
/// (asks resend them) rather than queued without bound.
const OUTBOX: usize = 8192;
/// Longest wait between resends of an ask.
const MAX_RETRY: Duration = Duration::from_secs(5);
/// Request ids remembered per sender, and replies kept for resending.
const DEDUP_WINDOW: usize = 1 << 16;
const REPLY_ENTRIES: usize = 1 << 16;
/// Large replies leave the cache once the peer acknowledged them, so this
/// holds small replies: at 256 MiB they alone kept 150 MB resident on each
/// node of a 4-node data-parallel run at mag-like S=1.
const REPLY_BYTES: usize = 64 << 20;

/// Bytes of large frames one peer may have announced and not yet had handled
/// (two maximal frames): a peer that announces frames and withholds their
/// bodies pins at most this much of the node's memory.
const LARGE_BUDGET: usize = 2 * MAX_LARGE_FRAME;
/// Large frames of one peer that may wait for room in its budget; more are refused.
///
/// Waiting is back-pressure, but a waiting stream is not read, so quinn holds
/// what the peer already sent on it (up to the 64 MiB stream window of
/// `tls::transport_config`) against the connection's 256 MiB receive window.
/// Enough waiters would fill that window and starve the very frames holding
/// the budget, which then never finish: a deadlock. Two waiters pin at most
/// 128 MiB and leave the frames being read room to finish; past them a frame
/// is refused ([`stop::BUSY`]) and resent by the sender's retries.
const LARGE_WAITERS: usize = 2;
/// A large frame whose body makes no progress for this long is dropped
/// ([`stop::STALLED`]), releasing its budget. The connection's idle timeout
/// does not cover this: both ends send keep-alives every second, so a live
/// connection never idles, however long one of its streams is silent. A
/// sender paced by a bandwidth cap pauses at most one 256 KiB piece's time,
/// well under this for any cap above ~70 kbit/s.
const LARGE_STALL: Duration = Duration::from_secs(30);
/// First buffer of a large frame's body: it grows as bytes arrive, so memory
/// follows the bytes received rather than the length announced.
const LARGE_FIRST_ALLOC: usize = 8 << 20;
/// Refused connections logged at once, then one warning per interval (a
/// stranger hammering the port would otherwise flood the log).
const REFUSED_LOG_BURST: u32 = 5;
const REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The bytes of large frames a peer has in flight (announced, not yet
/// handled), bounded, and how many more frames wait for room.
pub(crate) struct LargeBudget {
    bytes: Semaphore,
    total: usize,
    waiting: AtomicU64,
    max_waiting: u64,
}

impl LargeBudget {
    fn new(total: usize, max_waiting: usize) -> LargeBudget {
        LargeBudget {
            bytes: Semaphore::new(total),
            total,
            waiting: AtomicU64::new(0),
            max_waiting: max_waiting as u64,
        }
    }

    /// Room for a frame of `len` bytes, held until the permit is dropped: at
    /// once, after waiting in turn (first come, first served), or `None` when
    /// the frame can never fit or enough frames wait already.
    async fn admit(&self, len: usize) -> Option<SemaphorePermit<'_>> {
        let n = u32::try_from(len).ok().filter(|_| len <= self.total)?;
        match self.bytes.try_acquire_many(n) {
            Ok(p) => return Some(p),
            Err(TryAcquireError::NoPermits) => {}
            Err(TryAcquireError::Closed) => return None,
        }
        self.waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (w < self.max_waiting).then_some(w + 1)
            })
            .ok()?;
        // Counted until the wait ends, however it ends (the stream's task may be dropped).
        let _waiting = Waiting(&self.waiting);
        self.bytes.acquire_many(n).await.ok()
    }

    /// Bytes held by frames admitted and not yet handled (or set aside for the first in line).
    fn in_use(&self) -> usize {
        self.total - self.bytes.available_permits()
    }

    /// Frames waiting for room.
    fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::SeqCst)
    }
}

/// One frame waiting for room in a [`LargeBudget`].
struct Waiting<'a>(&'a AtomicU64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct Conn {
    quic: quinn::Connection,
    control: Arc<tokio::sync::Mutex<quinn::SendStream>>,
    /// Which of the peer's connections this is: a frame written on an earlier
    /// one may have died with it, one written on this one is delivered.
    generation: u64,
}

/// Told once what became of a frame: written to the connection of the given
/// generation, or lost. A frame dropped unwritten (by the fault plan, a full
/// queue, a shutdown) tells `Err` as it goes.
struct Done(Option<Box<Tell>>);

/// What a [`Done`] calls: the generation written on, or why the frame was lost.
type Tell = dyn FnOnce(Result<u64, String>) + Send + Sync;

impl Done {
    fn new(f: impl FnOnce(Result<u64, String>) + Send + Sync + 'static) -> Done {
        Done(Some(Box::new(f)))
    }

    /// A `Done` and the receiver it tells.
    fn channel() -> (Done, oneshot::Receiver<Result<u64, String>>) {
        let (tx, rx) = oneshot::channel();
        (
            Done::new(move |r| {
                let _ = tx.send(r);
            }),
            rx,
        )
    }

    fn tell(mut self, r: Result<u64, String>) {
        if let Some(f) = self.0.take() {
            f(r)
        }
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(Err("dropped unwritten".into()))
        }
    }
}

/// A frame queued for a peer's writer.
struct Outgoing {
    /// The frame: `head` then `body` (a request's payload or a reply's bytes, sent without copying them into the frame).
    head: Bytes,
    body: Bytes,
    kind: String,
    payload: usize,
    wait_until: Option<Instant>,
    done: Option<Done>,
    /// Counts the frame as not yet written until it is dropped.
    _unsent: Unsent,
}

/// One frame queued or being written: shutdown waits (briefly) for none to be
/// left, so a reply sent just before a node stops still leaves.
struct Unsent(Arc<AtomicU64>);

impl Unsent {
    fn new(count: &Arc<AtomicU64>) -> Unsent {
        count.fetch_add(1, Ordering::SeqCst);
        Unsent(count.clone())
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Outgoing {
    fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    fn finish(self, r: Result<u64, String>) {
        if let Some(d) = self.done {
            d.tell(r)
        }
    }
}

/// A peer: a node of the topology, or a client that connected to us. Its
/// writer task sends small frames in the order they were queued.
pub(crate) struct Peer {
    pub(crate) id: String,
    addr: Option<SocketAddr>,
    /// Whether this node dials it (and redials after a loss).
    dial: bool,
    /// Whether it is a node of the topology (watched by the failure detector).
    member: bool,
    conn: watch::Sender<Option<Conn>>,
    /// Bumped whenever the connection is replaced or lost.
    generation: AtomicU64,
    sent: AtomicU64,
    bucket: Mutex<Option<TokenBucket>>,
    outbox: mpsc::Sender<Outgoing>,
    cancel: CancellationToken,
    /// Large frames received from it and not yet handled.
    large: LargeBudget,
}

impl Peer {
    fn new(
        id: String,
        addr: Option<SocketAddr>,
        dial: bool,
        member: bool,
        cancel: CancellationToken,
        budget: usize,
    ) -> (Arc<Peer>, mpsc::Receiver<Outgoing>) {
        let (outbox, rx) = mpsc::channel(OUTBOX);
        let large = LargeBudget::new(budget, LARGE_WAITERS);
        let p = Peer {
            id,
            addr,
            dial,
            member,
            conn: watch::Sender::new(None),
            generation: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            bucket: Mutex::new(None),
            outbox,
            cancel,
            large,
        };
        (Arc::new(p), rx)
    }

    fn enqueue(&self, item: Outgoing) {
        if let Err(e) = self.outbox.try_send(item) {
            tracing::debug!("outbox to {} full or closed: frame dropped ({e})", self.id);
        }
    }

    /// How long to wait before sending `bytes` more under the link's cap.
    fn pace(&self, bytes: usize) -> Option<Duration> {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        b.as_mut()
            .map(|b| b.reserve(Instant::now(), bytes as u64))
            .filter(|d| !d.is_zero())
    }

    fn current(&self) -> Option<Conn> {
        self.conn.borrow().clone()
    }
}

/// Settings of a transport.
pub(crate) struct Settings {
    pub me: String,
    pub index: u32,
    pub retry: Duration,
    pub heartbeat: Duration,
    pub failure_timeout: Duration,
    /// How long a peer not yet heard from may take to start (`start_timeout_ms`).
    pub start_grace: Duration,
    /// Bytes of large frames each peer may have in flight.
    pub large_budget: usize,
    /// Longest a large frame's body may make no progress.
    pub large_stall: Duration,
}

impl Settings {
    /// The timing of `[cluster]` for the transport of `me`.
    pub fn new(c: &crate::config::ClusterConfig, me: &str, index: u32) -> Settings {
        Settings {
            me: me.to_string(),
            index,
            retry: Duration::from_millis(c.retry_ms),
            heartbeat: Duration::from_millis(c.heartbeat_ms),
            failure_timeout: Duration::from_millis(c.failure_timeout_ms),
            start_grace: Duration::from_millis(c.start_timeout_ms),
            large_budget: LARGE_BUDGET,
            large_stall: LARGE_STALL,
        }
    }
}

/// Socket buffer size asked of the kernel (it grants at most `net.core.rmem_max`
/// / `wmem_max`): a burst of 64 KiB datagrams overflows the usual 208 KiB
/// default, and every loss costs a congestion-window cut.
const SOCKET_BUFFER: usize = 8 << 20;

/// A QUIC endpoint on `bind` that accepts datagrams up to loopback's size and
/// asks for large socket buffers; it serves with `server` when given.
pub(crate) fn bind_endpoint(
    bind: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<quinn::Endpoint> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(bind),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if bind.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    // Best effort: a kernel that grants less still works, only slower.
    socket.set_recv_buffer_size(SOCKET_BUFFER).ok();
    socket.set_send_buffer_size(SOCKET_BUFFER).ok();
    // Linux reports twice what it grants (the other half is its bookkeeping).
    let granted = socket
        .recv_buffer_size()
        .unwrap_or(0)
        .min(socket.send_buffer_size().unwrap_or(0))
        / 2;
    if granted < SOCKET_BUFFER / 4 {
        tracing::info!(
            "UDP socket buffers: {} KiB granted of {} KiB asked; bulk transfers lose packets with less \
             (raise net.core.rmem_max and net.core.wmem_max, see docs/guide/cluster.md)",
            granted >> 10,
            SOCKET_BUFFER >> 10
        );
    }
    socket.bind(&bind.into())?;
    let mut config = quinn::EndpointConfig::default();
    // 64 KiB datagrams only where loopback peers can be: quinn sizes its receive
    // batch from this limit (~128 MiB of address space at 64 KiB, ~3 MiB at the
    // default 1472, ~18 MiB at a jumbo frame's). Elsewhere, jumbo frames: a peer
    // sends no datagram larger than this endpoint says it takes.
    let ip = bind.ip().to_canonical();
    let largest = match ip.is_loopback() || ip.is_unspecified() {
        true => tls::MAX_UDP_PAYLOAD,
        false => tls::JUMBO_UDP_PAYLOAD,
    };
    config
        .max_udp_payload_size(largest)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let runtime = quinn::default_runtime()
        .ok_or_else(|| std::io::Error::other("no async runtime for QUIC"))?;
    let socket = crate::udp::SplitSocket::new(runtime.wrap_udp_socket(socket.into())?);
    quinn::Endpoint::new_with_abstract_socket(config, server, Arc::new(socket), runtime)
}

/// Whether a frame of `len` bytes (its 4-byte length included) travels on a
/// stream of its own, whose write completes once the peer acknowledged it.
fn is_large(len: usize) -> bool {
    len.saturating_sub(4) > SMALL_FRAME
}

/// One node's (or client's) end of the cluster network.
pub(crate) struct Transport {
    pub(crate) me: String,
    index: u32,
    endpoint: Mutex<Option<quinn::Endpoint>>,
    configs: tls::QuicConfigs,
    peers: DashMap<String, Arc<Peer>>,
    pending: DashMap<MsgId, Waiter>,
    seq: AtomicU64,
    replies: Mutex<ReplyCache>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    faults: RwLock<Faults>,
    pub(crate) membership: Mutex<Membership>,
    events: broadcast::Sender<MemberEvent>,
    started: Instant,
    retry: Duration,
    heartbeat: Duration,
    cancel: CancellationToken,
    /// Frames queued or being written.
    unsent: Arc<AtomicU64>,
    large_budget: usize,
    large_stall: Duration,
    /// Warnings about refused connections, and about refused or stalled large frames.
    refused_log: Mutex<LogLimit>,
    large_log: Mutex<LogLimit>,
}

/// Longest a shutdown waits for queued frames to be written.
const DRAIN: Duration = Duration::from_secs(1);
/// Longest a shutdown waits, once the endpoint is closed, for its
/// connections' close frames to go out. Waiting for the endpoint to be
/// idle would wait out each connection's draining period (three probe
/// timeouts: 0.2-0.25 s on the emulated cluster, a twentieth of a 4-node
/// `embed`) though the frames leave at once.
const CLOSE_FLUSH: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ids start from the wall clock, so a restarted node does not reuse the ids of its previous life.
fn seq_base() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
}

impl Transport {
    /// Starts the transport on `endpoint`: accepting (if it serves), dialing the
    /// peers marked to dial, heartbeating the members.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        s: Settings,
        endpoint: quinn::Endpoint,
        configs: tls::QuicConfigs,
        peers: Vec<(String, SocketAddr, bool)>,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        faults: Faults,
        events: broadcast::Sender<MemberEvent>,
        serve: bool,
    ) -> Arc<Transport> {
        let now = Instant::now();
        let members: Vec<String> = if serve {
            peers.iter().map(|p| p.0.clone()).collect()
        } else {
            Vec::new()
        };
        let cancel = CancellationToken::new();
        let mut writers = Vec::new();
        let table = DashMap::new();
        for (id, addr, dial) in &peers {
            let (p, rx) = Peer::new(
                id.clone(),
                Some(*addr),
                *dial,
                serve,
                cancel.child_token(),
                s.large_budget,
            );
            writers.push((p.clone(), rx));
            table.insert(id.clone(), p);
        }
        let t = Arc::new(Transport {
            me: s.me,
            index: s.index,
            endpoint: Mutex::new(Some(endpoint)),
            configs,
            peers: table,
            pending: DashMap::new(),
            seq: AtomicU64::new(seq_base()),
            replies: Mutex::new(ReplyCache::new(DEDUP_WINDOW, REPLY_ENTRIES, REPLY_BYTES)),
            registry,
            metrics,
            faults: RwLock::new(Faults::default()),
            membership: Mutex::new(
                Membership::new(members, s.failure_timeout, now).with_first_timeout(s.start_grace),
            ),
            events,
            started: now,
            retry: s.retry,
            heartbeat: s.heartbeat,
            cancel,
            unsent: Arc::new(AtomicU64::new(0)),
            large_budget: s.large_budget,
            large_stall: s.large_stall,
            refused_log: Mutex::new(LogLimit::new(REFUSED_LOG_INTERVAL, REFUSED_LOG_BURST, now)),
            large_log: Mutex::new(LogLimit::new(REFUSED_LOG_INTERVAL, REFUSED_LOG_BURST, now)),
        });
        t.set_faults(faults);
        for (p, rx) in writers {
            tokio::spawn(t.clone().writer(p, rx));
        }
        if serve {
            tokio::spawn(t.clone().accept_loop());
            tokio::spawn(t.clone().heartbeat_loop());
        }
        for p in t.all_peers() {
            if p.dial {
                tokio::spawn(t.clone().dial_loop(p));
            }
        }
        t
    }

    fn all_peers(&self) -> Vec<Arc<Peer>> {
        self.peers.iter().map(|e| e.value().clone()).collect()
    }

    pub(crate) fn peer(&self, id: &str) -> Option<Arc<Peer>> {
        self.peers.get(id).map(|e| e.value().clone())
    }

    /// Replaces the fault plan (and resets the bandwidth buckets).
    pub(crate) fn set_faults(&self, faults: Faults) {
        for p in self.all_peers() {
            *lock(&p.bucket) = faults
                .bandwidth(&self.me, &p.id)
                .map(|r| TokenBucket::new(r, Instant::now()));
        }
        *self.faults.write().unwrap_or_else(|p| p.into_inner()) = faults;
    }

    /// Whether `peer` currently has a connection.
    pub(crate) fn connected(&self, peer: &str) -> bool {
        self.peer(peer).is_some_and(|p| p.current().is_some())
    }

    pub(crate) fn next_id(&self) -> MsgId {
        MsgId {
            node: self.index,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn endpoint(&self) -> Option<quinn::Endpoint> {
        lock(&self.endpoint).clone()
    }

    /// Stops every task and closes every connection; the socket is released
    /// once the connections have drained (a few probe timeouts later, while
    /// the runtime lives: a node started again at once on the same address
    /// retries its bind).
    pub(crate) async fn shutdown(&self) {
        let start = Instant::now();
        while self.unsent.load(Ordering::SeqCst) > 0 && start.elapsed() < DRAIN {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.cancel.cancel();
        let Some(ep) = lock(&self.endpoint).take() else {
            return;
        };
        ep.close(close::SHUTDOWN.into(), b"shutdown");
        for p in self.all_peers() {
            p.conn.send_replace(None);
        }
        let _ = tokio::time::timeout(CLOSE_FLUSH, ep.wait_idle()).await;
    }

    async fn accept_loop(self: Arc<Self>) {
        let Some(endpoint) = self.endpoint() else {
            return;
        };
        loop {
            let incoming = tokio::select! {
                _ = self.cancel.cancelled() => return,
                i = endpoint.accept() => match i { Some(i) => i, None => return },
            };
            let me = self.clone();
            tokio::spawn(async move {
                let config = me.configs.server(&incoming.remote_address());
                let connecting = match incoming.accept_with(config) {
                    Ok(c) => c,
                    Err(e) => return me.refused(&e),
                };
                let quic = match tokio::time::timeout(Duration::from_secs(10), connecting).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => return me.refused(&e),
                    Err(_) => return,
                };
                let Some(id) = tls::peer_id(&quic).filter(|id| *id != me.me) else {
                    quic.close(
                        close::IDENTITY.into(),
                        b"certificate names no usable node id",
                    );
                    return;
                };
                let peer = match me.peer(&id) {
                    Some(p) => p,
                    None => {
                        let (p, rx) = Peer::new(
                            id.clone(),
                            None,
                            false,
                            false,
                            me.cancel.child_token(),
                            me.large_budget,
                        );
                        let old = me.peers.insert(id.clone(), p.clone());
                        if let Some(old) = old {
                            old.cancel.cancel();
                        }
                        tokio::spawn(me.clone().writer(p.clone(), rx));
                        p
                    }
                };
                tracing::debug!("{}: accepted {id} from {}", me.me, quic.remote_address());
                if let Err(e) = me.install(&peer, quic).await {
                    tracing::debug!("{}: connection from {id} lost during setup: {e}", me.me);
                }
            });
        }
    }

    /// Logs a refused connection, within the rate limit (the rest at debug level).
    fn refused(&self, e: &dyn std::fmt::Display) {
        let allowed = lock(&self.refused_log).allow(Instant::now());
        match allowed {
            Some(n) => tracing::warn!(
                "{}: refused a connection: {e}{}",
                self.me,
                suppressed_note(n, "refused connections")
            ),
            None => tracing::debug!("{}: refused a connection: {e}", self.me),
        }
    }

    /// Logs a large frame dropped without closing its connection, within the rate limit.
    fn dropped_large(&self, peer: &Peer, why: &str) {
        let allowed = lock(&self.large_log).allow(Instant::now());
        match allowed {
            Some(n) => tracing::warn!(
                "{}: dropped a large frame from {}: {why}{}",
                self.me,
                peer.id,
                suppressed_note(n, "dropped large frames")
            ),
            None => tracing::debug!("{}: dropped a large frame from {}: {why}", self.me, peer.id),
        }
    }

    async fn dial_loop(self: Arc<Self>, peer: Arc<Peer>) {
        let Some(addr) = peer.addr else { return };
        let mut backoff = Duration::from_millis(50);
        loop {
            let attempt = async {
                let endpoint = self.endpoint().ok_or("shutting down")?;
                let connecting = endpoint
                    .connect_with(self.configs.client(&addr), addr, &peer.id)
                    .map_err(|e| e.to_string())?;
                connecting.await.map_err(|e| e.to_string())
            };
            let result = tokio::select! {
                _ = self.cancel.cancelled() => return,
                r = tokio::time::timeout(Duration::from_secs(5), attempt) => r,
            };
            match result {
                Ok(Ok(quic)) => {
                    backoff = Duration::from_millis(50);
                    if self.install(&peer, quic.clone()).await.is_ok() {
                        tokio::select! {
                            _ = self.cancel.cancelled() => return,
                            _ = quic.closed() => {}
                        }
                    }
                }
                Ok(Err(e)) => tracing::debug!("{}: dialing {} at {addr}: {e}", self.me, peer.id),
                Err(_) => tracing::debug!("{}: dialing {} at {addr}: timed out", self.me, peer.id),
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Makes `quic` the connection to `peer`: opens our small-frame stream and starts reading.
    async fn install(
        self: &Arc<Self>,
        peer: &Arc<Peer>,
        quic: quinn::Connection,
    ) -> Result<(), String> {
        let mut control = quic.open_uni().await.map_err(|e| e.to_string())?;
        // Small frames (control messages among them) go before large ones' bytes.
        control.set_priority(1).map_err(|e| e.to_string())?;
        control
            .write_all(&[TAG_SMALL])
            .await
            .map_err(|e| e.to_string())?;
        let conn = Conn {
            quic: quic.clone(),
            control: Arc::new(tokio::sync::Mutex::new(control)),
            generation: peer.generation.fetch_add(1, Ordering::SeqCst) + 1,
        };
        if let Some(old) = peer.conn.send_replace(Some(conn)) {
            if old.quic.stable_id() != quic.stable_id() {
                old.quic
                    .close(close::REPLACED.into(), b"replaced by a newer connection");
            }
        }
        tokio::spawn(self.clone().datagram_loop(peer.clone(), quic.clone()));
        tokio::spawn(self.clone().read_loop(peer.clone(), quic));
        // A heartbeat now, not at the next tick: a peer waiting for every
        // member to be up (the start of a run) hears from this one at once.
        if peer.member {
            let sent_us = self.started.elapsed().as_micros() as u64;
            if let Ok(hb) = encode_frame(&Frame::Heartbeat { sent_us }) {
                self.send_datagram(peer, Bytes::from(hb), "heartbeat");
            }
        }
        Ok(())
    }

    /// Reads heartbeats, which travel as datagrams so that no stream's bytes hold them up.
    async fn datagram_loop(self: Arc<Self>, peer: Arc<Peer>, quic: quinn::Connection) {
        loop {
            let d = tokio::select! {
                _ = self.cancel.cancelled() => return,
                d = quic.read_datagram() => match d { Ok(d) => d, Err(_) => return },
            };
            let mut dec = FrameDecoder::new();
            let frame = dec.push(&d).and_then(|()| dec.next_frame());
            match frame {
                Ok(Some(f @ Frame::Heartbeat { .. })) if dec.pending() == 0 => {
                    self.handle(&peer, f, d.len())
                }
                other => {
                    let why = match other {
                        Err(e) => e.to_string(),
                        _ => "a datagram that is not one heartbeat".into(),
                    };
                    tracing::warn!(
                        "{}: closing the connection from {}: {why}",
                        self.me,
                        peer.id
                    );
                    quic.close(close::BAD_FRAME.into(), why.as_bytes());
                    return;
                }
            }
        }
    }

    /// Any frame from a member proves it alive, as a heartbeat does: a peer
    /// busy sending bulk data is not silent.
    fn heard_from(&self, peer: &Peer) {
        if !peer.member {
            return;
        }
        let ev = lock(&self.membership).handle_heartbeat(&peer.id, Instant::now());
        if let Some(ev) = ev {
            tracing::info!("{}: peer {} up", self.me, peer.id);
            let _ = self.events.send(ev);
        }
    }

    async fn read_loop(self: Arc<Self>, peer: Arc<Peer>, quic: quinn::Connection) {
        loop {
            let stream = tokio::select! {
                _ = self.cancel.cancelled() => return,
                s = quic.accept_uni() => s,
            };
            match stream {
                Ok(s) => {
                    let me = self.clone();
                    let peer = peer.clone();
                    let quic = quic.clone();
                    tokio::spawn(async move {
                        if let Err(e) = me.read_stream(&peer, s).await {
                            tracing::warn!(
                                "{}: closing the connection from {}: {e}",
                                me.me,
                                peer.id
                            );
                            quic.close(close::BAD_FRAME.into(), e.as_bytes());
                        }
                    });
                }
                Err(e) => {
                    tracing::debug!("{}: connection to {} ended: {e}", self.me, peer.id);
                    let same = peer
                        .current()
                        .is_some_and(|c| c.quic.stable_id() == quic.stable_id());
                    if same {
                        peer.conn.send_replace(None);
                        peer.generation.fetch_add(1, Ordering::SeqCst);
                        if !peer.member && !peer.dial {
                            self.peers.remove_if(&peer.id, |_, p| Arc::ptr_eq(p, &peer));
                            peer.cancel.cancel();
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Reads one stream to its end. `Err` means the peer broke the format (close
    /// its connection); a lost connection ends the stream quietly.
    async fn read_stream(
        self: &Arc<Self>,
        peer: &Arc<Peer>,
        mut s: quinn::RecvStream,
    ) -> Result<(), String> {
        let mut tag = [0u8; 1];
        if s.read_exact(&mut tag).await.is_err() {
            return Ok(());
        }
        match tag[0] {
            TAG_SMALL => {
                let mut dec = FrameDecoder::new();
                loop {
                    let chunk = match s.read_chunk(1 << 20, true).await {
                        Ok(Some(c)) => c,
                        Ok(None) if dec.pending() == 0 => return Ok(()),
                        Ok(None) => {
                            return Err(format!(
                                "stream ended inside a frame ({} bytes pending)",
                                dec.pending()
                            ))
                        }
                        Err(_) => return Ok(()),
                    };
                    dec.push(&chunk.bytes).map_err(|e| e.to_string())?;
                    while let Some(frame) = dec.next_frame().map_err(|e| e.to_string())? {
                        let wire = dec.last_frame_len();
                        self.handle(peer, frame, wire);
                    }
                }
            }
            TAG_LARGE => {
                let mut len = [0u8; 4];
                match s.read_exact(&mut len).await {
                    Ok(()) => {}
                    Err(quinn::ReadExactError::FinishedEarly(_)) => {
                        return Err("large-frame stream ended inside its length".into())
                    }
                    Err(_) => return Ok(()),
                }
                let len = u32::from_le_bytes(len) as usize;
                if len > MAX_LARGE_FRAME {
                    return Err(WireError::FrameTooLarge {
                        got: len,
                        limit: MAX_LARGE_FRAME,
                    }
                    .to_string());
                }
                if len == 0 {
                    return Err("empty large frame".into());
                }
                // Room in the peer's budget before any buffer is sized for the frame;
                // held until the frame is handled or dropped, however this task ends.
                let Some(_room) = peer.large.admit(len).await else {
                    let (taken, waiting) = (peer.large.in_use(), peer.large.waiting());
                    self.dropped_large(peer, &format!("{len} bytes announced while {taken} of its {}-byte budget are taken and {waiting} frames wait", self.large_budget));
                    let _ = s.stop(stop::BUSY.into());
                    return Ok(());
                };
                let Some(body) = self.read_large_body(peer, &mut s, len).await? else {
                    return Ok(());
                };
                let reply = match decode_large_ref(&body).map_err(|e| e.to_string())? {
                    FrameRef::Request(r) => {
                        self.handle_request(
                            peer,
                            r.to,
                            r.from,
                            r.msg_id,
                            r.kind,
                            r.payload,
                            5 + len,
                        );
                        return Ok(());
                    }
                    // A reply's bytes stay where they were received: found by their place in the body.
                    FrameRef::Reply { id, result: Ok(b) } => Some((
                        id,
                        (b.0.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize),
                        b.0.len(),
                    )),
                    other => {
                        self.handle(peer, other.into_owned(), 5 + len);
                        None
                    }
                };
                if let Some((id, at, n)) = reply {
                    // The decoder borrows from `body`; checked all the same, as `slice` panics out of range.
                    let bytes = match at.checked_add(n) {
                        _ if n == 0 => Bytes::new(),
                        Some(end) if end <= body.len() => Bytes::from(body).slice(at..end),
                        _ => return Err("reply bytes outside their frame".into()),
                    };
                    self.reply_arrived(peer, id, Ok(bytes), 5 + len);
                }
                Ok(())
            }
            t => Err(format!("unknown stream tag {t}")),
        }
    }

    /// Reads the `len`-byte body of a large frame: `Ok(None)` if the stream was
    /// lost or stalled (and stopped), `Err` if it breaks the format.
    async fn read_large_body(
        &self,
        peer: &Peer,
        s: &mut quinn::RecvStream,
        len: usize,
    ) -> Result<Option<Vec<u8>>, String> {
        let mut body: Vec<u8> = Vec::with_capacity(len.min(LARGE_FIRST_ALLOC));
        let mut heard = Instant::now();
        loop {
            // Past the announced length, one more byte is read: anything there breaks the format.
            let want = (len - body.len()).max(1);
            let chunk = match tokio::time::timeout(self.large_stall, s.read_chunk(want, true)).await
            {
                Ok(Ok(c)) => c,
                // A lost stream: the frame is dropped, unless it had already arrived whole.
                Ok(Err(_)) => return Ok((body.len() == len).then_some(body)),
                Err(_) => {
                    self.dropped_large(
                        peer,
                        &format!(
                            "no progress for {:?} ({} of {len} bytes received)",
                            self.large_stall,
                            body.len()
                        ),
                    );
                    let _ = s.stop(stop::STALLED.into());
                    return Ok(None);
                }
            };
            match chunk {
                Some(_) if body.len() == len => {
                    return Err(format!("large frame longer than its announced {len} bytes"))
                }
                Some(c) => {
                    // A long body proves its sender alive, checked a few times a second
                    // rather than under the membership lock for every chunk.
                    if heard.elapsed() >= self.heartbeat {
                        self.heard_from(peer);
                        heard = Instant::now();
                    }
                    grow(&mut body, c.bytes.len(), len);
                    body.extend_from_slice(&c.bytes);
                }
                None if body.len() == len => return Ok(Some(body)),
                None => {
                    return Err(format!(
                        "large frame of {} bytes where {len} were announced",
                        body.len()
                    ))
                }
            }
        }
    }

    fn handle(self: &Arc<Self>, peer: &Arc<Peer>, frame: Frame, wire: usize) {
        self.heard_from(peer);
        match frame {
            Frame::Request(env) => self.handle_request(
                peer,
                env.to,
                env.from,
                env.msg_id,
                env.kind,
                &env.payload,
                wire,
            ),
            Frame::Reply { id, result } => {
                self.reply_arrived(peer, id, result.map(|b| Bytes::from(b.0)), wire)
            }
            Frame::Heartbeat { .. } => self.metrics.count(&peer.id, Dir::In, "heartbeat", 0, wire),
            Frame::Probe { id } => {
                self.metrics.count(&peer.id, Dir::In, "probe", 0, wire);
                // A large frame being read may be the request: an id is unheard only
                // when none is.
                let reading = peer.large.in_use() > 0 || peer.large.waiting() > 0;
                let probed = lock(&self.replies).probe(id);
                match probed {
                    Probed::Unheard if !reading => {
                        if let Ok(f) = encode_frame(&Frame::Unheard { id }) {
                            self.send(peer, Bytes::from(f), Bytes::new(), "unheard", 0, None, None);
                        }
                    }
                    Probed::Lost(r) => self.spawn_reply(peer, id, "probed", r, false),
                    Probed::Unheard | Probed::Underway => {}
                }
            }
            Frame::Unheard { id } => {
                self.metrics.count(&peer.id, Dir::In, "unheard", 0, wire);
                if let Some(w) = self.pending.get(&id) {
                    w.unheard.notify_one();
                }
            }
        }
    }

    /// Hands a reply to the ask waiting for it, if any still is.
    fn reply_arrived(
        &self,
        peer: &Peer,
        id: MsgId,
        result: Result<Bytes, RemoteError>,
        wire: usize,
    ) {
        let len = result.as_ref().map_or(0, |b| b.len());
        self.metrics.count(&peer.id, Dir::In, "reply", len, wire);
        if let Some((_, w)) = self.pending.remove(&id) {
            let _ = w.reply.send(result);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn handle_request(
        self: &Arc<Self>,
        peer: &Arc<Peer>,
        to: ActorName,
        from: ActorName,
        id: MsgId,
        kind: ActorName,
        payload: &[u8],
        wire: usize,
    ) {
        self.metrics
            .count(&peer.id, Dir::In, kind.as_str(), payload.len(), wire);
        // Bound first: a guard in the match scrutinee would live through the arms.
        let seen = lock(&self.replies).check(id);
        match seen {
            Seen::Dropped => {}
            Seen::Replied(r) => self.spawn_reply(peer, id, kind.as_str(), r, false),
            Seen::New => match self.registry.dispatch(&to, kind.as_str()) {
                // Not cached: the asker retries under a new id once the actor is registered.
                Err(e @ RemoteError::NoSuchActor(_)) => {
                    self.spawn_reply(peer, id, kind.as_str(), Err(e), false)
                }
                Err(e) => self.spawn_reply(peer, id, kind.as_str(), Err(e), true),
                Ok(dispatch) => {
                    // Called here, not in the task, so the message enters the mailbox in stream order.
                    let fut = dispatch(from, payload);
                    let me = self.clone();
                    let peer = peer.clone();
                    tokio::spawn(async move {
                        let r = fut.await;
                        me.spawn_reply(&peer, id, kind.as_str(), r.map(|b| Bytes::from(b.0)), true);
                    });
                }
            },
        }
    }

    /// Sends a reply, counted in the metrics as `<kind>.reply`.
    fn spawn_reply(
        self: &Arc<Self>,
        peer: &Arc<Peer>,
        id: MsgId,
        kind: &str,
        result: Result<Bytes, RemoteError>,
        cache: bool,
    ) {
        if cache {
            lock(&self.replies).complete(id, result.clone());
        }
        let len = result.as_ref().map_or(0, |b| b.len());
        // The reply's bytes follow their head uncopied, as a request's payload does.
        let frame = match result {
            Ok(body) => encode_reply_head(id, body.len()).map(|head| (Bytes::from(head), body)),
            Err(e) => encode_frame(&Frame::Reply { id, result: Err(e) })
                .map(|f| (Bytes::from(f), Bytes::new())),
        };
        // A large frame's write completes once the peer acknowledged it all.
        let acked = frame
            .as_ref()
            .is_ok_and(|(head, body)| is_large(head.len() + body.len()));
        // Whether it left decides what a probe for it gets (a reply not cached ignores this).
        let me = Arc::downgrade(self);
        let done = Done::new(move |r| {
            if let Some(t) = me.upgrade() {
                let mut replies = lock(&t.replies);
                match r {
                    Ok(_) if acked => replies.received(id),
                    r => replies.delivered(id, r.is_ok()),
                }
            }
        });
        match frame {
            // A reply is not waited for: if it is lost unwritten, the asker's probe
            // brings it again; if its connection dies, the asker resends its request.
            Ok((head, body)) => self.send(
                peer,
                head,
                body,
                &format!("{kind}.reply"),
                len,
                None,
                Some(done),
            ),
            Err(e) => tracing::error!("{}: cannot encode a reply: {e}", self.me),
        }
    }

    async fn heartbeat_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let sent_us = self.started.elapsed().as_micros() as u64;
            let Ok(hb) = encode_frame(&Frame::Heartbeat { sent_us }) else {
                continue;
            };
            let hb = Bytes::from(hb);
            for p in self.all_peers().into_iter().filter(|p| p.member) {
                self.send_datagram(&p, hb.clone(), "heartbeat");
            }
            let events = lock(&self.membership).poll(Instant::now());
            for ev in events {
                if let MemberEvent::Down(id) = &ev {
                    tracing::warn!(
                        "{}: peer {id} down (silent for the failure timeout)",
                        self.me
                    );
                    // A silent connection may be dead without knowing it: drop it so the dialer starts afresh.
                    if let Some(c) = self.peer(id).and_then(|p| p.current()) {
                        c.quic.close(
                            close::PEER_DOWN.into(),
                            b"no heartbeat within the failure timeout",
                        );
                    }
                }
                let _ = self.events.send(ev);
            }
        }
    }

    /// What the fault plan does to the next frame to `peer` (counted when it drops or copies).
    fn fate(&self, peer: &Peer, kind: &str) -> crate::chaos::Decision {
        let n = peer.sent.fetch_add(1, Ordering::Relaxed);
        let d = self
            .faults
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .decide(&self.me, &peer.id, n, self.started.elapsed());
        if d.copies != 1 {
            self.metrics.fault(&peer.id, kind, d.copies);
        }
        d
    }

    /// Sends one encoded frame to `peer` as a QUIC datagram, through the fault
    /// plan: unreliable, and never queued behind stream data.
    fn send_datagram(self: &Arc<Self>, peer: &Arc<Peer>, frame: Bytes, kind: &'static str) {
        let d = self.fate(peer, kind);
        let Some(conn) = peer.current().filter(|_| d.copies > 0) else {
            return;
        };
        let (metrics, id) = (self.metrics.clone(), peer.id.clone());
        let go = move || {
            for _ in 0..d.copies {
                match conn.quic.send_datagram(frame.clone()) {
                    Ok(()) => metrics.count(&id, Dir::Out, kind, 0, frame.len()),
                    Err(e) => tracing::debug!("{kind} to {id} not sent: {e}"),
                }
            }
        };
        if d.delay.is_zero() {
            go();
        } else {
            tokio::spawn(async move {
                tokio::time::sleep(d.delay).await;
                go();
            });
        }
    }

    /// Queues one encoded frame for `peer` through the fault plan (frames
    /// queued without delay keep their order). Waits for a connection until
    /// `wait_until` (not at all if `None`). `done` is told when the frame is
    /// written (small) or received by the peer (large), or lost.
    #[allow(clippy::too_many_arguments)]
    fn send(
        self: &Arc<Self>,
        peer: &Arc<Peer>,
        head: Bytes,
        body: Bytes,
        kind: &str,
        payload: usize,
        wait_until: Option<Instant>,
        mut done: Option<Done>,
    ) {
        let d = self.fate(peer, kind);
        if d.copies == 0 {
            return;
        }
        let item = |done| Outgoing {
            head: head.clone(),
            body: body.clone(),
            kind: kind.to_string(),
            payload,
            wait_until,
            done,
            _unsent: Unsent::new(&self.unsent),
        };
        // The first copy tells `done`.
        let items: Vec<Outgoing> = (0..d.copies).map(|_| item(done.take())).collect();
        if d.delay.is_zero() {
            for i in items {
                peer.enqueue(i);
            }
        } else {
            let peer = peer.clone();
            tokio::spawn(async move {
                tokio::time::sleep(d.delay).await;
                for i in items {
                    peer.enqueue(i);
                }
            });
        }
    }

    /// Writes `peer`'s queued frames: small ones in order on the shared stream,
    /// large ones each on a stream of its own, concurrently.
    async fn writer(self: Arc<Self>, peer: Arc<Peer>, mut rx: mpsc::Receiver<Outgoing>) {
        loop {
            let item = tokio::select! {
                _ = peer.cancel.cancelled() => return,
                i = rx.recv() => match i { Some(i) => i, None => return },
            };
            let conn = match self.connection(&peer, item.wait_until).await {
                Ok(c) => c,
                Err(e) => {
                    item.finish(Err(e));
                    continue;
                }
            };
            let generation = conn.generation;
            if is_large(item.len()) {
                let me = self.clone();
                let peer = peer.clone();
                tokio::spawn(async move {
                    let r = me.write_large(&peer, &conn, &item).await;
                    item.finish(r.map(|()| generation));
                });
            } else {
                let r = self.write_small(&peer, &conn, &item).await;
                item.finish(r.map(|()| generation));
            }
        }
    }

    async fn connection(&self, peer: &Peer, wait_until: Option<Instant>) -> Result<Conn, String> {
        let mut rx = peer.conn.subscribe();
        loop {
            if let Some(c) = rx.borrow_and_update().clone() {
                return Ok(c);
            }
            let Some(until) = wait_until else {
                return Err(format!("not connected to {}", peer.id));
            };
            tokio::select! {
                _ = peer.cancel.cancelled() => return Err("shutting down".into()),
                r = tokio::time::timeout_at(until.into(), rx.changed()) => match r {
                    Ok(Ok(())) => {}
                    _ => return Err(format!("no connection to {} before the deadline", peer.id)),
                },
            }
        }
    }

    async fn write_small(&self, peer: &Peer, conn: &Conn, item: &Outgoing) -> Result<(), String> {
        let mut s = conn.control.lock().await;
        self.paced_write(peer, &mut s, item)
            .await
            .map_err(|x| format!("sending to {}: {x}", peer.id))?;
        self.metrics
            .count(&peer.id, Dir::Out, &item.kind, item.payload, item.len());
        Ok(())
    }

    async fn write_large(&self, peer: &Peer, conn: &Conn, item: &Outgoing) -> Result<(), String> {
        let e = |e: &dyn std::fmt::Display| format!("sending to {}: {e}", peer.id);
        let mut s = conn.quic.open_uni().await.map_err(|x| e(&x))?;
        s.write_all(&[TAG_LARGE]).await.map_err(|x| e(&x))?;
        self.paced_write(peer, &mut s, item)
            .await
            .map_err(|x| e(&x))?;
        s.finish().map_err(|x| e(&x))?;
        self.metrics
            .count(&peer.id, Dir::Out, &item.kind, item.payload, item.len());
        match s.stopped().await {
            Ok(None) => Ok(()),
            Ok(Some(code)) => Err(e(&format!("stream stopped by the peer ({code})"))),
            Err(x) => Err(e(&x)),
        }
    }

    async fn paced_write(
        &self,
        peer: &Peer,
        s: &mut quinn::SendStream,
        item: &Outgoing,
    ) -> Result<(), quinn::WriteError> {
        let capped = lock(&peer.bucket).is_some();
        for bytes in [&item.head, &item.body] {
            let mut off = 0;
            while off < bytes.len() {
                let end = if capped {
                    (off + PACE_PIECE).min(bytes.len())
                } else {
                    bytes.len()
                };
                if let Some(wait) = peer.pace(end - off) {
                    tokio::time::sleep(wait).await;
                }
                s.write_chunk(bytes.slice(off..end)).await?;
                off = end;
            }
        }
        Ok(())
    }

    /// Asks actor `to` on `peer_id` and waits for the encoded reply until `timeout`.
    ///
    /// A request is sent again only when it may be lost: its copy was dropped
    /// unwritten, its connection was replaced since, or the peer answers a probe
    /// saying it never got it. A reply that is late because it is large, or the
    /// link slow, is waited for, and the probes that ask after it are a few
    /// bytes each, so the traffic of a step does not grow as links slow down.
    pub(crate) async fn ask(
        self: &Arc<Self>,
        peer_id: &str,
        to: &ActorName,
        from: &ActorName,
        kind: ActorName,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes, AskError> {
        let started = self.begin(peer_id, to, from, kind, payload, timeout)?;
        self.complete(started).await
    }

    /// Sends a request now (so it is queued behind everything sent before it)
    /// and returns what [`Transport::complete`] needs to wait for its reply.
    pub(crate) fn begin(
        self: &Arc<Self>,
        peer_id: &str,
        to: &ActorName,
        from: &ActorName,
        kind: ActorName,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Asking, AskError> {
        let started = Instant::now();
        let peer = self
            .peer(peer_id)
            .ok_or_else(|| AskError::Unplaced(to.to_string()))?;
        let ttl_ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        let env = Envelope {
            to: to.clone(),
            from: from.clone(),
            msg_id: self.next_id(),
            kind,
            ttl_ms,
            payload: Vec::new(),
        };
        let body = Bytes::from(payload);
        let mut a = Asking {
            peer,
            env,
            head: Bytes::new(),
            body,
            rx: None,
            unheard: Arc::new(Notify::new()),
            sent: None,
            forget: None,
            started,
            timeout,
        };
        self.attempt(&mut a)?;
        Ok(a)
    }

    /// Registers `a`'s current id as pending and sends it the first time.
    fn attempt(self: &Arc<Self>, a: &mut Asking) -> Result<(), AskError> {
        let id = a.env.msg_id;
        a.head = Bytes::from(
            encode_request_head(&a.env, a.body.len())
                .map_err(|e| AskError::Codec(e.to_string()))?,
        );
        let (tx, rx) = oneshot::channel();
        a.unheard = Arc::new(Notify::new());
        self.pending.insert(
            id,
            Waiter {
                reply: tx,
                unheard: a.unheard.clone(),
            },
        );
        a.forget = Some(Forget(self.clone(), id));
        a.rx = Some(rx);
        self.transmit(a);
        Ok(())
    }

    /// Sends `a`'s request (again), to be told where it went in `a.sent`.
    fn transmit(self: &Arc<Self>, a: &mut Asking) {
        let (done, sent) = Done::channel();
        a.sent = Some(sent);
        let deadline = a.started + a.timeout;
        let kind = a.env.kind.as_str();
        let (head, body, len) = (a.head.clone(), a.body.clone(), a.body.len());
        self.send(&a.peer, head, body, kind, len, Some(deadline), Some(done));
    }

    /// Asks `a`'s peer whether it has `a`'s request (a few bytes, on the stream
    /// the request took, so it arrives after it).
    fn probe(self: &Arc<Self>, a: &Asking) {
        self.metrics.probe();
        if let Ok(f) = encode_frame(&Frame::Probe { id: a.env.msg_id }) {
            self.send(
                &a.peer,
                Bytes::from(f),
                Bytes::new(),
                "probe",
                0,
                None,
                None,
            );
        }
    }

    /// Waits for the reply to a request [`Transport::begin`] sent, resending as needed.
    pub(crate) async fn complete(self: &Arc<Self>, mut a: Asking) -> Result<Bytes, AskError> {
        let deadline = a.started + a.timeout;
        let (to, kind) = (a.env.to.to_string(), a.env.kind.to_string());
        let after = a.timeout;
        // If the actor was reported missing before the deadline, say so rather than "timed out".
        let mut missing: Option<RemoteError> = None;
        let timed_out = |missing: &Option<RemoteError>| match missing {
            Some(source) => AskError::Remote {
                actor: to.clone(),
                source: source.clone(),
            },
            None => AskError::Timeout {
                actor: to.clone(),
                kind: kind.clone(),
                after,
            },
        };
        loop {
            let mut wait = self.retry;
            let Some(mut rx) = a.rx.take() else {
                return Err(AskError::Shutdown);
            };
            // The connection that took the latest copy; `None` while it may be lost.
            let mut written_on: Option<u64> = None;
            let result = loop {
                if let Some(done) = a.sent.take() {
                    // The timer starts once the frame is out (large frames: received).
                    written_on = match tokio::time::timeout_at(deadline.into(), done).await {
                        Ok(Ok(Ok(generation))) => Some(generation),
                        Ok(Ok(Err(e))) => {
                            tracing::debug!("{}: {kind} to {}: {e}", self.me, a.peer.id);
                            None
                        }
                        Ok(Err(_)) => None,
                        Err(_) => return Err(timed_out(&missing)),
                    };
                }
                let until = (Instant::now() + wait).min(deadline);
                let unheard = a.unheard.clone();
                tokio::select! {
                    _ = self.cancel.cancelled() => return Err(AskError::Shutdown),
                    _ = unheard.notified() => {
                        // The peer never got it (lost with a connection or a fault).
                        self.metrics.resend(a.head.len() + a.body.len());
                        self.transmit(&mut a);
                    }
                    r = tokio::time::timeout_at(until.into(), &mut rx) => match r {
                        Ok(Ok(r)) => break r,
                        Ok(Err(_)) => return Err(AskError::Shutdown),
                        Err(_) => {
                            if Instant::now() >= deadline {
                                return Err(timed_out(&missing));
                            }
                            wait = (wait * 2).min(MAX_RETRY);
                            let live = a.peer.current().map(|c| c.generation);
                            if written_on.is_some() && written_on == live {
                                self.probe(&a);
                            } else {
                                self.metrics.resend(a.head.len() + a.body.len());
                                self.transmit(&mut a);
                            }
                        }
                    },
                }
            };
            match result {
                Ok(b) => {
                    self.metrics.latency(&kind, a.started.elapsed());
                    return Ok(b);
                }
                // The actor may not be registered yet: try again under a new id until the deadline.
                Err(e @ RemoteError::NoSuchActor(_))
                    if Instant::now() + Duration::from_millis(20) < deadline =>
                {
                    missing = Some(e);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    a.env.msg_id = self.next_id();
                    self.attempt(&mut a)?;
                }
                Err(source) => return Err(AskError::Remote { actor: to, source }),
            }
        }
    }
}

/// Makes room in `body`, the body of a `len`-byte frame, for `more` bytes:
/// the capacity doubles, never past `len`, so memory follows the bytes
/// received, and the copies made in growing add up to less than twice the frame.
fn grow(body: &mut Vec<u8>, more: usize, len: usize) {
    let need = body.len() + more;
    if need > body.capacity() {
        let target = (body.capacity() * 2).min(len).max(need);
        body.reserve_exact(target - body.len());
    }
}

/// A request on its way: what is needed to resend it and to wait for its reply.
pub(crate) struct Asking {
    peer: Arc<Peer>,
    /// The request without its payload.
    env: Envelope,
    head: Bytes,
    body: Bytes,
    rx: Option<oneshot::Receiver<Result<Bytes, RemoteError>>>,
    /// Woken when the peer says it never got the request.
    unheard: Arc<Notify>,
    sent: Option<oneshot::Receiver<Result<u64, String>>>,
    forget: Option<Forget>,
    started: Instant,
    timeout: Duration,
}

/// What a pending ask is told: its reply, and that its request went unheard.
struct Waiter {
    reply: oneshot::Sender<Result<Bytes, RemoteError>>,
    unheard: Arc<Notify>,
}

/// Removes a pending ask when it finishes, however it finishes.
struct Forget(Arc<Transport>, MsgId);

impl Drop for Forget {
    fn drop(&mut self) {
        self.0.pending.remove(&self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_large_budget_admits_in_turn_and_refuses_past_its_waiters() {
        let b = Arc::new(LargeBudget::new(1000, 2));
        let first = b.admit(600).await.expect("room at once");
        assert_eq!((b.in_use(), b.waiting()), (600, 0));
        assert!(
            b.admit(1001).await.is_none(),
            "a frame larger than the whole budget never fits"
        );
        // Two frames wait their turn, a third is refused rather than queued.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for len in [500, 300] {
            let (budget, tx) = (b.clone(), tx.clone());
            waiters.push(tokio::spawn(async move {
                let room = budget.admit(len).await;
                tx.send((len, room.is_some())).unwrap();
                // Held a moment, as a frame being read would be.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }));
            while b.waiting() < waiters.len() as u64 {
                tokio::task::yield_now().await;
            }
        }
        assert!(b.admit(10).await.is_none(), "a third waiter is refused");
        assert_eq!(b.waiting(), 2);
        assert!(
            rx.try_recv().is_err(),
            "nobody admitted while the budget is full"
        );
        // Freeing the first frame admits both waiters (500 + 300 fit), never past the budget.
        drop(first);
        let mut admitted = vec![rx.recv().await, rx.recv().await];
        admitted.sort();
        assert_eq!(admitted, vec![Some((300, true)), Some((500, true))]);
        assert!(b.in_use() <= 1000);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!((b.in_use(), b.waiting()), (0, 0));
        // A waiter whose task is dropped gives its place back.
        let hold = b.admit(1000).await.unwrap();
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.admit(1).await.is_some() }
        });
        while b.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(b.waiting(), 0);
        drop(hold);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn large_bodies_grow_with_the_bytes_received() {
        let len = 100 << 20;
        let mut body: Vec<u8> = Vec::with_capacity(LARGE_FIRST_ALLOC);
        let mut copied = 0;
        while body.len() < len {
            let more = (len - body.len()).min(1 << 20);
            let before = body.capacity();
            grow(&mut body, more, len);
            if body.capacity() != before {
                copied += body.len();
            }
            body.resize(body.len() + more, 0);
            assert!(
                body.capacity() <= len && body.capacity() <= 2 * body.len().max(LARGE_FIRST_ALLOC),
                "{} for {}",
                body.capacity(),
                body.len()
            );
        }
        assert_eq!(body.capacity(), len, "never past the announced length");
        assert!(copied < 2 * len, "growing copied {copied} bytes");
    }

    /// A node and a raw QUIC client with a cluster certificate, to speak the wire format by hand.
    struct Rig {
        _dir: tempfile::TempDir,
        node: Arc<Transport>,
        client: quinn::Endpoint,
        conn: quinn::Connection,
    }

    async fn rig(large_budget: usize, large_stall: Duration) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        crate::certs::init(&certs, &["n0".to_string()], false).unwrap();
        let (cert, key) = crate::certs::node_paths(&certs, "n0");
        let ca = certs.join("ca.pem");
        let idle = Duration::from_secs(10);
        let configs =
            tls::QuicConfigs::new(&tls::Identity::load(&ca, &cert, &key).unwrap(), idle).unwrap();
        let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let endpoint = bind_endpoint(bind, Some((*configs.server(&bind)).clone())).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let s = Settings {
            me: "n0".into(),
            index: 0,
            retry: Duration::from_millis(50),
            heartbeat: Duration::from_millis(100),
            failure_timeout: Duration::from_secs(2),
            start_grace: Duration::from_secs(2),
            large_budget,
            large_stall,
        };
        let (events, _) = broadcast::channel(16);
        let node = Transport::start(
            s,
            endpoint,
            configs,
            Vec::new(),
            Arc::default(),
            Arc::default(),
            Faults::default(),
            events,
            true,
        );
        let id = tls::mint_client(&ca, &certs.join("ca.key"), "prober").unwrap();
        let client = quinn::Endpoint::client(bind).unwrap();
        let conn = client
            .connect_with(
                id.client_config(idle, tls::PathKind::Loopback).unwrap(),
                addr,
                "n0",
            )
            .unwrap()
            .await
            .unwrap();
        Rig {
            _dir: dir,
            node,
            client,
            conn,
        }
    }

    /// Opens a large-frame stream announcing `len` bytes and sends `body` of them.
    async fn announce(conn: &quinn::Connection, len: usize, body: &[u8]) -> quinn::SendStream {
        let mut s = conn.open_uni().await.unwrap();
        s.write_all(&[&[TAG_LARGE][..], &(len as u32).to_le_bytes(), body].concat())
            .await
            .unwrap();
        s
    }

    async fn until(what: &str, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_peer_announcing_past_its_budget_holds_no_more_and_stalled_frames_are_dropped() {
        let budget = 1 << 20;
        let stall = Duration::from_millis(400);
        let r = rig(budget, stall).await;
        // Announced: 600 KiB four times, 2.4 MiB against a 1 MiB budget; one body
        // is started, none is finished.
        let len = 600 << 10;
        let started = announce(&r.conn, len, &vec![7; 100 << 10]).await;
        until("the prober is a peer", || r.node.peer("prober").is_some()).await;
        let peer = r.node.peer("prober").unwrap();
        until("the first frame is admitted", || peer.large.in_use() == len).await;
        let waiting = vec![
            announce(&r.conn, len, &[]).await,
            announce(&r.conn, len, &[]).await,
        ];
        until("two frames wait", || peer.large.waiting() == 2).await;
        let refused = announce(&r.conn, len, &[]).await;
        assert_eq!(refused.stopped().await.unwrap(), Some(stop::BUSY.into()));
        assert!(peer.large.in_use() <= budget);
        // The started frame stalls and is dropped; each waiter then gets the room in
        // turn, holds it no more than the budget allows, and stalls in turn.
        assert_eq!(started.stopped().await.unwrap(), Some(stop::STALLED.into()));
        for s in &waiting {
            assert!(peer.large.in_use() <= budget);
            assert_eq!(s.stopped().await.unwrap(), Some(stop::STALLED.into()));
        }
        until("the budget is free again", || {
            peer.large.in_use() == 0 && peer.large.waiting() == 0
        })
        .await;
        // Nothing closed the connection: a whole large frame is still handled.
        assert!(r.conn.close_reason().is_none());
        let frame = encode_frame(&Frame::Heartbeat { sent_us: 1 }).unwrap();
        let mut whole = announce(&r.conn, frame.len() - 4, &frame[4..]).await;
        whole.finish().unwrap();
        assert_eq!(whole.stopped().await.unwrap(), None);
        let key = ("prober".to_string(), Dir::In, "heartbeat".to_string());
        until("the frame is handled", || {
            r.node.metrics.snapshot().links.contains_key(&key)
        })
        .await;
        assert_eq!(peer.large.in_use(), 0);
        r.node.shutdown().await;
        r.client.close(0u32.into(), b"");
    }
}
