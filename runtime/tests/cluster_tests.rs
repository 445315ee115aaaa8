//! Clusters of real nodes in one process, on loopback with real QUIC and TLS:
//! location transparency, deadlines, refused peers and frames, delivery under
//! injected loss and duplication, failure detection.

use std::net::UdpSocket;
use std::path::Path;
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler, MessageResult, ResponseFuture};
use runtime::config::{ChaosConfig, ClusterConfig, LinksConfig, NodeSpec, Topology};
use runtime::{
    ActorRef, AskError, ByteVec, Deliver, MemberEvent, Msg, Node, Ping, RemoteError, Status,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Add(u64);
impl Msg for Add {
    type Reply = u64;
    const KIND: &'static str = "add";
}

#[derive(Serialize, Deserialize)]
struct Sleep(u64);
impl Msg for Sleep {
    type Reply = ();
    const KIND: &'static str = "sleep";
}

#[derive(Serialize, Deserialize)]
struct Unhandled;
impl Msg for Unhandled {
    type Reply = ();
    const KIND: &'static str = "unhandled";
}

/// Counts what it is sent: any duplicate delivery shows in the total.
#[derive(Default)]
struct Counter {
    total: u64,
}
impl Actor for Counter {
    type Context = Context<Self>;
}
impl Handler<Deliver<Add>> for Counter {
    type Result = MessageResult<Deliver<Add>>;
    fn handle(&mut self, m: Deliver<Add>, _: &mut Context<Self>) -> Self::Result {
        self.total += m.msg.0;
        MessageResult(self.total)
    }
}
impl Handler<Deliver<Sleep>> for Counter {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, m: Deliver<Sleep>, _: &mut Context<Self>) -> Self::Result {
        Box::pin(tokio::time::sleep(Duration::from_millis(m.msg.0)))
    }
}

fn serve_counter(node: &Node, name: &str) {
    let addr = Counter::default().start();
    node.register(name, &addr)
        .unwrap()
        .handle::<Add>()
        .handle::<Sleep>();
}

/// A free loopback port no other test of this binary got (the OS may hand a
/// just-released port out again, and tests run side by side).
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if given.insert(port) {
            return port;
        }
    }
}

fn topology(dir: &Path, n: usize) -> Topology {
    let ids: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
    let certs = dir.join("certs");
    runtime::certs::init(&certs, &ids, false).unwrap();
    let nodes = ids
        .iter()
        .map(|id| NodeSpec {
            id: id.clone(),
            addr: format!("127.0.0.1:{}", free_port()),
            cert: None,
            key: None,
            cpus: None,
        })
        .collect();
    let cluster = ClusterConfig {
        certs_dir: certs,
        metrics_addr: None,
        heartbeat_ms: 50,
        failure_timeout_ms: 600,
        retry_ms: 50,
        start_timeout_ms: 30_000,
        rejoin_timeout_ms: 600_000,
        nodes,
    };
    let mut t = Topology::new(cluster);
    for i in 0..n {
        t.placement.insert(format!("counter/{i}"), format!("n{i}"));
    }
    t
}

async fn start_all(t: &Topology) -> Vec<Node> {
    let mut nodes = Vec::new();
    for n in &t.cluster.nodes {
        let node = Node::start(t.clone(), &n.id).await.unwrap();
        serve_counter(&node, &format!("counter/{}", &n.id[1..]));
        nodes.push(node);
    }
    nodes
}

const T: Duration = Duration::from_secs(10);

/// The same calls against counters, whatever the nodes are.
async fn exercise(from: &Node, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let c: ActorRef = from.actor(name).unwrap();
        assert_eq!(c.ask(Add(5), T).await.unwrap(), 5, "{name}");
        c.tell(Add(1)).unwrap();
        // The tell was sent first, and small messages of a link keep their order.
        assert_eq!(
            c.ask(Add(10 + i as u64), T).await.unwrap(),
            16 + i as u64,
            "{name}"
        );
    }
}

#[actix_rt::test]
async fn asks_cross_three_nodes_and_match_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let t = topology(dir.path(), 3);
    let nodes = start_all(&t).await;
    exercise(&nodes[0], &["counter/0", "counter/1", "counter/2"]).await;
    // Another node sees the state the first one left.
    let c1 = nodes[2].actor("counter/1").unwrap();
    assert_eq!(c1.ask(Add(0), T).await.unwrap(), 5 + 1 + 11);

    // The same actor code, embedded: identical answers through local mailboxes.
    let embedded = Node::embedded("solo").unwrap();
    for i in 0..3 {
        serve_counter(&embedded, &format!("counter/{i}"));
    }
    exercise(&embedded, &["counter/0", "counter/1", "counter/2"]).await;
    // The system actor (what `hetgnn doctor` asks across processes) answers embedded too.
    let st = embedded
        .actor("node/solo")
        .unwrap()
        .ask(Status, T)
        .await
        .unwrap();
    assert_eq!((st.id.as_str(), st.peers.len()), ("solo", 0));
    assert!(st.actors.contains(&"counter/2".to_string()));

    // System actors answer status and echo large payloads (their own stream).
    let st = nodes[0]
        .actor("node/n2")
        .unwrap()
        .ask(Status, T)
        .await
        .unwrap();
    assert_eq!(st.id, "n2");
    assert!(
        st.actors.contains(&"counter/2".to_string()),
        "{:?}",
        st.actors
    );
    let big = ByteVec((0..8 << 20).map(|i| (i * 7) as u8).collect());
    let back = nodes[1]
        .actor("node/n0")
        .unwrap()
        .ask(Ping(big.clone()), T)
        .await
        .unwrap();
    assert!(back == big);

    // An actor no placement names is unreachable until its node is learned
    // (as `doctor` learns a node's cache managers from its status).
    serve_counter(&nodes[2], "cache/extra");
    let extra = nodes[0].actor("cache/extra").unwrap();
    assert!(matches!(
        extra.ask(Add(1), T).await,
        Err(AskError::Unplaced(_))
    ));
    nodes[0].learn_placement("cache/extra", "n2");
    assert_eq!(extra.ask(Add(2), T).await.unwrap(), 2);

    // Metrics count what crossed the wire.
    let m = nodes[1].metrics();
    assert!(m.bytes_by_kind()["ping"] >= 8 << 20);
    assert!(m.messages_by_kind()["heartbeat"] > 0);
    // Membership: everybody up.
    let deadline = Instant::now() + Duration::from_secs(5);
    while nodes[0]
        .members()
        .iter()
        .any(|m| m.state != runtime::PeerState::Up)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        nodes[0]
            .members()
            .iter()
            .all(|m| m.state == runtime::PeerState::Up && m.connected),
        "{:?}",
        nodes[0].members()
    );
    for n in &nodes {
        n.shutdown().await;
    }
}

#[actix_rt::test]
async fn deadlines_and_bad_targets_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = topology(dir.path(), 2);
    t.placement.insert("ghost".into(), "n1".into());
    let nodes = start_all(&t).await;
    let remote = nodes[0].actor("counter/1").unwrap();
    let local = nodes[0].actor("counter/0").unwrap();
    for c in [&remote, &local] {
        let e = c
            .ask(Sleep(2000), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(
            matches!(e, AskError::Timeout { ref kind, .. } if kind == "sleep"),
            "{e}"
        );
        let e = c.ask(Unhandled, T).await.unwrap_err();
        assert!(
            matches!(
                e,
                AskError::Remote {
                    source: RemoteError::NoHandler { .. },
                    ..
                }
            ),
            "{e}"
        );
    }
    let e = nodes[0]
        .actor("nobody/3")
        .unwrap()
        .ask(Add(1), T)
        .await
        .unwrap_err();
    assert_eq!(e, AskError::Unplaced("nobody/3".into()));
    // Placed on n1 but never registered there: "no such actor" once the deadline passes.
    let e = nodes[0]
        .actor("ghost")
        .unwrap()
        .ask(Add(1), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            AskError::Remote {
                source: RemoteError::NoSuchActor(_),
                ..
            }
        ),
        "{e}"
    );
    // A node's address is its own: a second n0 cannot start.
    assert!(
        matches!(Node::start(t.clone(), "n0").await, Err(runtime::StartError::Bind { ref key, .. }) if key == "cluster.nodes[0].addr")
    );
    assert!(
        Node::start(t.clone(), "n7").await.is_err(),
        "unknown node id"
    );
    for n in &nodes {
        n.shutdown().await;
    }
}

#[actix_rt::test]
async fn foreign_certificates_are_refused_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let t = topology(dir.path(), 2);
    let nodes = start_all(&t).await;
    // A client with a certificate from another CA, even one naming a real node.
    let rogue_dir = dir.path().join("rogue");
    runtime::certs::init(&rogue_dir, &["n1".to_string()], false).unwrap();
    let id = runtime::tls::Identity::load(
        &rogue_dir.join("ca.pem"),
        &rogue_dir.join("n1.pem"),
        &rogue_dir.join("n1.key"),
    )
    .unwrap();
    let rogue = Node::client(t.clone(), "rogue", id).await.unwrap();
    let e = rogue
        .actor("counter/0")
        .unwrap()
        .ask(Add(1), Duration::from_millis(800))
        .await
        .unwrap_err();
    assert!(matches!(e, AskError::Timeout { .. }), "{e}");
    // A client with a certificate the cluster CA minted is served.
    let minted =
        runtime::tls::mint_client(&t.ca_path(), &t.cluster.certs_dir.join("ca.key"), "doctor")
            .unwrap();
    let client = Node::client(t.clone(), "doctor", minted).await.unwrap();
    assert_eq!(
        client
            .actor("counter/0")
            .unwrap()
            .ask(Add(2), T)
            .await
            .unwrap(),
        2,
        "the rogue's request never ran"
    );
    assert_eq!(
        nodes[1]
            .actor("counter/0")
            .unwrap()
            .ask(Add(1), T)
            .await
            .unwrap(),
        3
    );
    for n in [&rogue, &client].into_iter().chain(&nodes) {
        n.shutdown().await;
    }
}

/// Opens a raw QUIC connection with a cluster-minted certificate and sends `bytes` on a fresh stream.
async fn raw_send(t: &Topology, to: usize, bytes: Vec<u8>) -> quinn::ConnectionError {
    let id = runtime::tls::mint_client(&t.ca_path(), &t.cluster.certs_dir.join("ca.key"), "fuzzer")
        .unwrap();
    let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = t.addr(to).unwrap();
    let conn = ep
        .connect_with(
            id.client_config(Duration::from_secs(10), runtime::tls::PathKind::Loopback)
                .unwrap(),
            addr,
            &t.cluster.nodes[to].id,
        )
        .unwrap()
        .await
        .unwrap();
    let mut s = conn.open_uni().await.unwrap();
    s.write_all(&bytes).await.unwrap();
    s.finish().unwrap();
    let e = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .expect("the node closes the connection");
    ep.close(0u32.into(), b"");
    e
}

#[actix_rt::test]
async fn malformed_truncated_and_oversized_frames_close_only_their_connection() {
    use runtime::testing::{close, TAG_LARGE, TAG_SMALL};
    let dir = tempfile::tempdir().unwrap();
    let t = topology(dir.path(), 2);
    let nodes = start_all(&t).await;
    let valid = runtime::wire::encode_frame(&runtime::Frame::Heartbeat { sent_us: 1 }).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "garbage small frame",
            [vec![TAG_SMALL], 8u32.to_le_bytes().to_vec(), vec![0xFF; 8]].concat(),
        ),
        (
            "oversized small frame",
            [vec![TAG_SMALL], u32::MAX.to_le_bytes().to_vec()].concat(),
        ),
        (
            "truncated small frame",
            [vec![TAG_SMALL], valid[..valid.len() - 1].to_vec()].concat(),
        ),
        (
            "oversized large frame",
            [vec![TAG_LARGE], u32::MAX.to_le_bytes().to_vec()].concat(),
        ),
        (
            "truncated large frame",
            [vec![TAG_LARGE], 100u32.to_le_bytes().to_vec(), vec![0; 10]].concat(),
        ),
        (
            "large frame longer than announced",
            [vec![TAG_LARGE], valid.clone(), vec![0; 3]].concat(),
        ),
        ("unknown stream tag", vec![9, 1, 2, 3]),
    ];
    for (what, bytes) in cases {
        let e = raw_send(&t, 0, bytes).await;
        match e {
            quinn::ConnectionError::ApplicationClosed(c) => {
                assert_eq!(c.error_code, close::BAD_FRAME.into(), "{what}: {c:?}")
            }
            other => panic!("{what}: {other}"),
        }
        // The node still serves its members.
        assert!(
            nodes[1]
                .actor("counter/0")
                .unwrap()
                .ask(Add(1), T)
                .await
                .is_ok(),
            "{what}"
        );
    }
    for n in &nodes {
        n.shutdown().await;
    }
}

async fn counters_under_chaos(chaos: ChaosConfig) -> (u64, runtime::MetricsSnapshot) {
    let dir = tempfile::tempdir().unwrap();
    let mut t = topology(dir.path(), 3);
    t.chaos = chaos;
    t.cluster.failure_timeout_ms = 5000;
    let nodes = start_all(&t).await;
    let asks = 150u64;
    for i in 0..asks {
        let from = &nodes[(i % 3) as usize];
        let to = from.actor(&format!("counter/{}", (i + 1) % 3)).unwrap();
        to.ask(Add(1), Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("ask {i}: {e}"));
    }
    // Read the counters without faults.
    for n in &nodes {
        n.set_faults(ChaosConfig::default(), LinksConfig::default());
    }
    let mut sum = 0;
    for i in 0..3 {
        sum += nodes[0]
            .actor(&format!("counter/{i}"))
            .unwrap()
            .ask(Add(0), T)
            .await
            .unwrap();
    }
    let mut m = nodes[0].metrics();
    for n in &nodes[1..] {
        let o = n.metrics();
        m.links.extend(
            o.links
                .into_iter()
                .map(|((p, d, k), c)| ((format!("{}>{p}", n.id()), d, k), c)),
        );
        m.resends += o.resends;
    }
    for n in &nodes {
        n.shutdown().await;
    }
    assert_eq!(sum, asks, "every ask handled exactly once");
    (sum, m)
}

#[actix_rt::test]
async fn duplicates_are_dropped_under_injected_duplication() {
    let (_, m) = counters_under_chaos(ChaosConfig {
        seed: 1,
        duplicate: 0.5,
        ..Default::default()
    })
    .await;
    let dups: u64 = m.links.values().map(|c| c.duplicated).sum();
    assert!(dups > 50, "duplication was injected: {dups}");
}

#[actix_rt::test]
async fn all_asks_complete_under_twenty_percent_drop() {
    let (_, m) = counters_under_chaos(ChaosConfig {
        seed: 2,
        drop: 0.2,
        duplicate: 0.05,
        ..Default::default()
    })
    .await;
    let drops: u64 = m.links.values().map(|c| c.dropped).sum();
    assert!(drops > 30, "loss was injected: {drops}");
    assert!(m.resends > 10, "asks were resent: {}", m.resends);
}

/// Sums what every node's metrics counted out for `kind`: (messages, wire bytes).
fn sent(nodes: &[Node], kind: &str) -> (u64, u64) {
    let mut out = (0, 0);
    for n in nodes {
        let m = n.metrics();
        out.0 += m.messages_by_kind().get(kind).copied().unwrap_or(0);
        out.1 += m.bytes_by_kind().get(kind).copied().unwrap_or(0);
    }
    out
}

#[actix_rt::test]
async fn a_late_reply_is_asked_after_not_resent() {
    let dir = tempfile::tempdir().unwrap();
    let t = topology(dir.path(), 2);
    let nodes = start_all(&t).await;
    // Sixteen times the first resend timer (50 ms): before, the request went out 5 times.
    nodes[0]
        .actor("counter/1")
        .unwrap()
        .ask(Sleep(800), Duration::from_secs(20))
        .await
        .unwrap();
    let m = nodes[0].metrics();
    assert_eq!(sent(&nodes, "sleep").0, 1, "the request went out once");
    assert_eq!(m.resends, 0);
    assert!(
        m.probes >= 2,
        "the late reply was asked after: {}",
        m.probes
    );
    for n in &nodes {
        n.shutdown().await;
    }
}

#[actix_rt::test]
async fn traffic_does_not_grow_on_a_slow_link() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = topology(dir.path(), 2);
    t.cluster.failure_timeout_ms = 2000;
    let nodes = start_all(&t).await;
    let ping = |n: usize| {
        let big = ByteVec((0..n).map(|i| (i * 13) as u8).collect());
        let to = nodes[0].actor("node/n1").unwrap();
        async move { assert!(to.ask(Ping(big.clone()), T).await.unwrap() == big) }
    };
    ping(3 << 20).await;
    let fast = sent(&nodes, "ping.reply");
    // The same exchange at 40 Mbit/s: the 3 MiB reply takes ~0.6 s, twelve resend timers.
    for n in &nodes {
        let links = LinksConfig {
            bandwidth: Some(runtime::config::Bandwidth(5_000_000)),
            ..Default::default()
        };
        n.set_faults(ChaosConfig::default(), links);
    }
    ping(3 << 20).await;
    let slow = sent(&nodes, "ping.reply");
    assert_eq!(slow.0 - fast.0, fast.0, "one reply each time");
    assert_eq!(slow.1 - fast.1, fast.1, "the same bytes whatever the link");
    assert_eq!(sent(&nodes, "ping").0, 2, "each request went out once");
    for n in &nodes {
        assert_eq!(n.metrics().resends, 0, "{}", n.id());
    }
    // Heartbeats kept flowing beside the bulk bytes: nobody was reported down.
    for n in &nodes {
        assert!(
            n.members()
                .iter()
                .all(|m| m.state == runtime::PeerState::Up),
            "{}: {:?}",
            n.id(),
            n.members()
        );
    }
    for n in &nodes {
        n.shutdown().await;
    }
}

/// Forwards the membership events it receives.
struct Recorder(tokio::sync::mpsc::UnboundedSender<MemberEvent>);
impl Actor for Recorder {
    type Context = Context<Self>;
}
impl Handler<MemberEvent> for Recorder {
    type Result = ();
    fn handle(&mut self, e: MemberEvent, _: &mut Context<Self>) {
        let _ = self.0.send(e);
    }
}

async fn wait_for(
    events: &mut tokio::sync::broadcast::Receiver<MemberEvent>,
    want: MemberEvent,
    within: Duration,
) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Ok(e)) if e == want => return Instant::now(),
            Ok(_) => {}
            Err(_) => panic!("no {want:?} within {within:?}"),
        }
    }
}

#[actix_rt::test]
async fn a_stopped_peer_is_reported_down_then_up_when_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let t = topology(dir.path(), 3);
    let nodes = start_all(&t).await;
    let mut events = nodes[0].subscribe();
    // An actor subscribed to membership events sees the same sequence.
    let (tx, mut actor_events) = tokio::sync::mpsc::unbounded_channel();
    nodes[0].subscribe_actor(Recorder(tx).start().recipient());
    wait_for(
        &mut events,
        MemberEvent::Up("n2".into()),
        Duration::from_secs(5),
    )
    .await;
    // n2 stops answering (its transport shuts down).
    let stopped = Instant::now();
    nodes[2].shutdown().await;
    let timeout = Duration::from_millis(t.cluster.failure_timeout_ms);
    let seen = wait_for(&mut events, MemberEvent::Down("n2".into()), timeout * 3).await;
    let took = seen - stopped;
    assert!(
        took <= timeout + Duration::from_millis(2 * t.cluster.heartbeat_ms + 200),
        "down after {took:?}"
    );
    // Restarted on the same address, it is reported up again and serves.
    let mut restarted = None;
    for _ in 0..50 {
        match Node::start(t.clone(), "n2").await {
            Ok(n) => {
                restarted = Some(n);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let n2 = restarted.expect("n2 restarts on its address");
    serve_counter(&n2, "counter/2");
    wait_for(
        &mut events,
        MemberEvent::Up("n2".into()),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        nodes[0]
            .actor("counter/2")
            .unwrap()
            .ask(Add(4), T)
            .await
            .unwrap(),
        4
    );
    let mut seen = Vec::new();
    while let Ok(e) = actor_events.try_recv() {
        if matches!(&e, MemberEvent::Up(p) | MemberEvent::Down(p) if p == "n2") {
            seen.push(e);
        }
    }
    assert_eq!(
        seen,
        vec![
            MemberEvent::Up("n2".into()),
            MemberEvent::Down("n2".into()),
            MemberEvent::Up("n2".into())
        ]
    );
    for n in nodes.iter().chain([&n2]) {
        n.shutdown().await;
    }
}

#[actix_rt::test]
async fn metrics_are_served_as_prometheus_text() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let mut t = topology(dir.path(), 1);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    t.cluster.metrics_addr = Some(format!("127.0.0.1:{port}"));
    let nodes = start_all(&t).await;
    let minted =
        runtime::tls::mint_client(&t.ca_path(), &t.cluster.certs_dir.join("ca.key"), "probe")
            .unwrap();
    let client = Node::client(t.clone(), "probe", minted).await.unwrap();
    client
        .actor("node/n0")
        .unwrap()
        .ask(Ping(ByteVec(vec![1; 1000])), T)
        .await
        .unwrap();
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(
        text.contains(
            "hetgnn_messages_total{node=\"n0\",peer=\"probe\",dir=\"in\",kind=\"ping\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "hetgnn_wire_bytes_total{node=\"n0\",peer=\"probe\",dir=\"out\",kind=\"ping.reply\"}"
        ),
        "{text}"
    );
    // The client measured its ask's latency.
    assert_eq!(client.metrics().latency["ping"].count, 1);
    client.shutdown().await;
    nodes[0].shutdown().await;
}
