//! Transport benchmark: two nodes on loopback, each on its own thread.
//!
//! - round-trip latency of small asks (64-byte echo), against a plain TCP ping-pong;
//! - throughput of 1 MiB and 64 MiB tensor messages (ask, acknowledged by the
//!   receiver), against a plain TCP socket copying the same bytes with the same
//!   acknowledgement, measured in the same run (ratio); rounds alternate QUIC
//!   and TCP and the medians are reported, as two processes sharing two cores
//!   make single measurements swing by a factor of two;
//! - the same bytes as replies (a small ask pulls a tensor back: how remote
//!   feature rows travel);
//! - a bandwidth cap: measured throughput against the configured cap.
//!
//! Writes `bench/results/transport.json`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler, MessageResult};
use anyhow::Context as _;
use clap::Parser;
use runtime::config::{Bandwidth, ClusterConfig, LinksConfig, NodeSpec, Topology};
use runtime::{Deliver, Msg, Node, TensorPayload};
use serde::{Deserialize, Serialize};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Small round trips to time.
    #[arg(long, default_value_t = 3000)]
    pings: usize,
    /// 1 MiB messages to send.
    #[arg(long, default_value_t = 300)]
    mib_messages: usize,
    /// 64 MiB messages to send.
    #[arg(long, default_value_t = 8)]
    big_messages: usize,
    /// Rounds of each throughput measurement (QUIC and TCP alternating).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Bandwidth cap to verify, bytes per second.
    #[arg(long, default_value_t = 100_000_000)]
    cap: u64,
    /// Output JSON.
    #[arg(long, default_value = "bench/results/transport.json")]
    out: std::path::PathBuf,
}

/// A tensor for the sink; it answers with the number of bytes received.
#[derive(Serialize, Deserialize)]
struct Blob(TensorPayload);
impl Msg for Blob {
    type Reply = u64;
    const KIND: &'static str = "blob";
}

/// Asks the sink for a tensor of this many bytes.
#[derive(Serialize, Deserialize)]
struct Pull(u64);
impl Msg for Pull {
    type Reply = Result<Blob, String>;
    const KIND: &'static str = "pull";
}

/// Receives tensors and serves them (one of each size, built once).
#[derive(Default)]
struct Sink(std::collections::HashMap<u64, TensorPayload>);
impl Actor for Sink {
    type Context = Context<Self>;
}
impl Handler<Deliver<Blob>> for Sink {
    type Result = MessageResult<Deliver<Blob>>;
    fn handle(&mut self, m: Deliver<Blob>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(m.msg.0.data.len() as u64)
    }
}
impl Handler<Deliver<Pull>> for Sink {
    type Result = MessageResult<Deliver<Pull>>;
    fn handle(&mut self, m: Deliver<Pull>, _: &mut Context<Self>) -> Self::Result {
        let n = m.msg.0 as usize;
        let t = match self.0.entry(m.msg.0) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => match blob(n) {
                Ok(b) => e.insert(b.0),
                Err(e) => return MessageResult(Err(e.to_string())),
            },
        };
        // A handler answers with an owned value, as a feature store copies rows out of its table.
        MessageResult(Ok(Blob(t.clone())))
    }
}

fn topology(certs: &std::path::Path) -> Topology {
    let ports = bench::free_ports(2).unwrap_or_else(|_| vec![0, 0]);
    let nodes = ["n0", "n1"]
        .iter()
        .zip(ports)
        .map(|(id, port)| NodeSpec {
            id: id.to_string(),
            addr: format!("127.0.0.1:{port}"),
            cert: None,
            key: None,
            cpus: None,
        })
        .collect();
    let mut t = Topology::new(ClusterConfig {
        certs_dir: certs.to_path_buf(),
        metrics_addr: None,
        heartbeat_ms: 200,
        failure_timeout_ms: 5000,
        retry_ms: 2000,
        start_timeout_ms: 30_000,
        rejoin_timeout_ms: 600_000,
        nodes,
    });
    t.placement.insert("sink".into(), "n1".into());
    t
}

fn blob(bytes: usize) -> anyhow::Result<Blob> {
    let data: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
    Ok(Blob(TensorPayload::new(
        runtime::wire::WireDType::F32,
        &[(bytes / 4) as u64],
        data,
    )?))
}

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

fn median(v: &[f64]) -> f64 {
    stats(v.to_vec()).0
}

/// Plain TCP: `count` messages of `bytes`, each acknowledged with 8 bytes; returns bytes/s.
fn tcp_throughput(bytes: usize, count: usize) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; bytes];
        for _ in 0..count {
            let mut len = [0u8; 8];
            s.read_exact(&mut len)?;
            s.read_exact(&mut buf)?;
            // Own the bytes as the QUIC receiver does.
            let owned = buf.clone();
            s.write_all(&(owned.len() as u64).to_le_bytes())?;
        }
        Ok(())
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let payload = blob(bytes)?.0.data;
    let start = Instant::now();
    for _ in 0..count {
        let msg = payload.clone();
        c.write_all(&(msg.len() as u64).to_le_bytes())?;
        c.write_all(&msg)?;
        let mut ack = [0u8; 8];
        c.read_exact(&mut ack)?;
    }
    let secs = start.elapsed().as_secs_f64();
    server
        .join()
        .map_err(|_| anyhow::anyhow!("tcp server panicked"))??;
    Ok((bytes * count) as f64 / secs)
}

fn tcp_latency(count: usize) -> anyhow::Result<Vec<f64>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        for _ in 0..count {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        Ok(())
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let mut buf = [7u8; 64];
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        c.write_all(&buf)?;
        c.read_exact(&mut buf)?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    server
        .join()
        .map_err(|_| anyhow::anyhow!("tcp server panicked"))??;
    Ok(out)
}

fn main() -> anyhow::Result<()> {
    // As the hetgnn binary does: buffers of a message are reused, not re-faulted.
    runtime::alloc::keep_freed_memory();
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let certs = dir.path().join("certs");
    runtime::certs::init(&certs, &["n0".into(), "n1".into()], false)?;
    let topo = topology(&certs);

    // n1 on its own thread and actix system, serving the sink until told to stop.
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let t1 = topo.clone();
    let receiver = std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let node = match Node::start(t1, "n1").await {
                Ok(n) => n,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let sink = Sink::default().start();
            if let Ok(r) = node.register("sink", &sink) {
                r.handle::<Blob>().handle::<Pull>();
            }
            let _ = ready_tx.send(Ok(()));
            while stop_rx.try_recv().is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            node.shutdown().await;
        })
    });
    ready_rx
        .recv()
        .context("receiver thread")?
        .map_err(|e| anyhow::anyhow!(e))?;

    let report = actix_rt::System::new().block_on(async move {
        let node = Node::start(topo.clone(), "n0").await?;
        let sink = node.actor("sink")?;
        let echo = node.actor("node/n1")?;
        let t = Duration::from_secs(120);
        // Warm up: connection, MTU discovery, congestion window.
        for _ in 0..50 {
            echo.ask(runtime::Ping(runtime::ByteVec(vec![1; 64])), t).await?;
        }
        sink.ask(blob(64 << 20)?, t).await?;

        let mut lat = Vec::with_capacity(args.pings);
        for _ in 0..args.pings {
            let s = Instant::now();
            echo.ask(runtime::Ping(runtime::ByteVec(vec![1; 64])), t).await?;
            lat.push(s.elapsed().as_secs_f64() * 1e6);
        }
        let (p50, p99) = stats(lat);
        let (tcp_p50, tcp_p99) = stats(tcp_latency(args.pings)?);
        println!("small ask round trip: p50 {p50:.0} µs, p99 {p99:.0} µs (plain TCP ping-pong: p50 {tcp_p50:.0} µs, p99 {tcp_p99:.0} µs)");

        let mut sizes = Vec::new();
        for (bytes, count) in [(1usize << 20, args.mib_messages), (64 << 20, args.big_messages)] {
            let msg = blob(bytes)?;
            let (mut quic, mut pull, mut tcp, mut ratio, mut pull_ratio) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for round in 0..args.rounds.max(1) {
                let q = async {
                    let start = Instant::now();
                    for _ in 0..count {
                        let got = sink.ask(Blob(msg.0.clone()), t).await?;
                        anyhow::ensure!(got == bytes as u64, "sink got {got} bytes");
                    }
                    let sent = (bytes * count) as f64 / start.elapsed().as_secs_f64();
                    let start = Instant::now();
                    for _ in 0..count {
                        let got = sink.ask(Pull(bytes as u64), t).await?.map_err(anyhow::Error::msg)?;
                        anyhow::ensure!(got.0.data.len() == bytes, "pulled {} bytes", got.0.data.len());
                    }
                    anyhow::Ok((sent, (bytes * count) as f64 / start.elapsed().as_secs_f64()))
                };
                // Alternate which goes first so neither always runs on a warmer machine.
                let ((q, p), c) = if round % 2 == 0 {
                    let q = q.await?;
                    (q, tcp_throughput(bytes, count)?)
                } else {
                    let c = tcp_throughput(bytes, count)?;
                    (q.await?, c)
                };
                quic.push(q);
                pull.push(p);
                tcp.push(c);
                ratio.push(q / c);
                pull_ratio.push(p / c);
            }
            let (q, p, c, r, pr) = (median(&quic), median(&pull), median(&tcp), median(&ratio), median(&pull_ratio));
            println!(
                "{:>3} MiB messages x{count}, median of {} rounds: QUIC {:.0} MB/s, as replies {:.0} MB/s, plain TCP {:.0} MB/s, ratio {:.2} (replies {:.2}; target >= 0.70)",
                bytes >> 20,
                ratio.len(),
                q / 1e6,
                p / 1e6,
                c / 1e6,
                r,
                pr
            );
            sizes.push(serde_json::json!({
                "bytes": bytes, "messages": count, "rounds": ratio.len(),
                "quic_bytes_per_s": q, "quic_reply_bytes_per_s": p, "tcp_bytes_per_s": c,
                "ratio": r, "reply_ratio": pr, "ratio_per_round": ratio, "reply_ratio_per_round": pull_ratio,
            }));
        }

        // The cap: 64 MiB messages through a token bucket on n0's link to n1.
        let links = LinksConfig { bandwidth: Some(Bandwidth(args.cap)), ..Default::default() };
        node.set_faults(Default::default(), links);
        let msg = blob(16 << 20)?;
        let n = ((args.cap as f64 * 3.0) / (16u64 << 20) as f64).ceil().max(2.0) as usize;
        sink.ask(Blob(msg.0.clone()), t).await?; // drains the initial burst allowance
        let start = Instant::now();
        for _ in 0..n {
            sink.ask(Blob(msg.0.clone()), t).await?;
        }
        let capped = (n * (16 << 20)) as f64 / start.elapsed().as_secs_f64();
        let cap_ratio = capped / args.cap as f64;
        println!("bandwidth cap {:.0} MB/s: measured {:.1} MB/s ({:+.1}% of the cap; target within 10%)", args.cap as f64 / 1e6, capped / 1e6, (cap_ratio - 1.0) * 100.0);
        node.shutdown().await;
        anyhow::Ok(serde_json::json!({
            "small_ask_us": { "p50": p50, "p99": p99, "tcp_p50": tcp_p50, "tcp_p99": tcp_p99 },
            "throughput": sizes,
            "bandwidth_cap": { "cap_bytes_per_s": args.cap, "measured_bytes_per_s": capped, "ratio": cap_ratio },
            "machine": { "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) },
        }))
    })?;
    let _ = stop_tx.send(());
    let _ = receiver.join();
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}
