//! `hetgnn serve` under load: latency of one-node and 100-node requests at a
//! fixed request rate (open loop: each request is sent at its scheduled time
//! whatever the server's pace, and its latency counts from that time, so a
//! slow server cannot hide its queue), and throughput with batching against
//! the same server with batching off (`--batch-nodes 1`), in the same run.
//!
//! `cargo run --release -p bench --bin serve -- [--scale 1 --seconds 20]`
//! makes a 2-layer R-GCN checkpoint with fanouts 10,10 on mag-like S (the
//! parameters are initialised, not trained: the work of a request does not
//! depend on their values), starts `target/release/hetgnn serve`, prints a
//! table and writes bench/results/serve.json. With `--partitions K
//! --cpus-per-node C` (root) every server runs on an emulated machine of C
//! CPUs (its own network namespace and kernel-capped link), the load
//! generator here, on a link of its own to the machines.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bench::emulate::Cluster;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// mag-like scale of the graph.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Seconds of each measured phase.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Requests per second of the open-loop phases.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// A second, lower rate of one-node requests (one a Python server keeps up with).
    #[arg(long, default_value_t = 20.0)]
    low_rate: f64,
    /// Requests per second of the 100-node phase.
    #[arg(long, default_value_t = 10.0)]
    rate_100: f64,
    /// Clients of the closed-loop throughput phase (each sends one-node requests back to back).
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// The batching server's `--batch-wait-ms`.
    #[arg(long, default_value_t = 0.0)]
    batch_wait_ms: f64,
    /// Slow clients held open (a partial request each) during a last one-node
    /// phase against the batching server.
    #[arg(long, default_value_t = 10_000)]
    idle_connections: usize,
    /// A Python with DGL 2.1 (see bench/baselines/dgl_rgcn.py): also measure
    /// bench/baselines/dgl_serve.py, a DGL server with the same weights, on the
    /// same open-loop phases.
    #[arg(long)]
    dgl: Option<PathBuf>,
    /// Also serve from this many METIS partitions: one `serve --partitions`
    /// process per partition on loopback (sharing this machine's cores), the
    /// stored-node phases measured against the first one, beside the
    /// whole-graph server's in the same run.
    #[arg(long, default_value_t = 0)]
    partitions: usize,
    /// CPUs of each emulated machine (a control group's quota; needs root):
    /// the whole-graph servers and each partition's node then run on a
    /// machine of their own, in a network namespace with a kernel-capped
    /// link, and the load generator reaches them over a link of its own.
    /// Default: processes on loopback, sharing this machine's cores.
    #[arg(long)]
    cpus_per_node: Option<f64>,
    /// Link rate of each emulated machine (with --cpus-per-node).
    #[arg(long, default_value = "10Gbit/s")]
    bandwidth: String,
    /// Hold idle CPUs to this wake-up latency, in µs, for the whole run (Linux
    /// PM QoS, as `serve --cpu-latency-us` does; needs root): every server of
    /// the run, DGL's too, is measured under it.
    #[arg(long)]
    cpu_latency_us: Option<u32>,
    /// Start the whole-graph servers with `serve --precompute` (layer 1 of
    /// every node computed at load; a request samples and computes one layer).
    #[arg(long)]
    precompute: bool,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// The JSON report.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results/serve.json"))]
    out: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.bin.clone())?;
    let data = bench::mag_like(a.scale, 0)?;
    let ck = checkpoint(&data, a.scale)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let new_paper = new_paper_ask(&data)?;
    let _latency = a
        .cpu_latency_us
        .map(serving::cpu_latency::CpuLatency::hold)
        .transpose()?;
    if a.cpus_per_node.is_some() && a.dgl.is_some() {
        bail!("--dgl runs its server on loopback: leave out --cpus-per-node to compare with it");
    }
    let emulated = match a.cpus_per_node {
        Some(cpus) => {
            let rate = runtime::config::Bandwidth::parse(&a.bandwidth)?;
            let machines = bench::emulate::Machines {
                cpus: Some(cpus),
                rate_bits: Some(rate.0.saturating_mul(8)),
                mtu: None,
            };
            let mut cluster = bench::emulate::Cluster::create(a.partitions.max(1), &machines)?;
            cluster.link_host()?;
            Some(cluster)
        }
        None => None,
    };
    let on = emulated.as_ref();
    let mut phases = Vec::new();
    let mut target_nodes = 0;
    let mut idle = None;
    // Phase 1-3 against the batching server, phase 4 against the one without.
    for (batching, label) in [(true, "batching"), (false, "no batching")] {
        let wait = batching.then_some(a.batch_wait_ms);
        let mut server = Server::start(&bin, &data, &ck, wait, a.precompute, on)?;
        let targets = rt.block_on(target_count(&server.addr))?;
        target_nodes = targets;
        let result = rt.block_on(async {
            let mut out = Vec::new();
            // Warm-up: page the graph in, so the first phase is not a cold start.
            open_loop(&server.addr, Ask::Stored { targets, nodes: 1 }, a.rate, 3.0, 7).await?;
            if batching {
                out.push((
                    "1 node, open loop".to_string(),
                    open_loop(&server.addr, Ask::Stored { targets, nodes: 1 }, a.rate, a.seconds, 1).await?,
                ));
                out.push((
                    "1 node, open loop, low rate".to_string(),
                    open_loop(&server.addr, Ask::Stored { targets, nodes: 1 }, a.low_rate, a.seconds, 4).await?,
                ));
                out.push((
                    "100 nodes, open loop".to_string(),
                    open_loop(&server.addr, Ask::Stored { targets, nodes: 100 }, a.rate_100, a.seconds, 2).await?,
                ));
                out.push((
                    "1 new paper (10 cites, 3 authors), open loop".to_string(),
                    open_loop(&server.addr, new_paper, a.rate, a.seconds, 6).await?,
                ));
            }
            out.push((
                format!("1 node, {} clients, {label}", a.clients),
                closed_loop(&server.addr, targets, a.clients, a.seconds, 3).await?,
            ));
            if batching && a.idle_connections > 0 {
                let before = rss_mib(server.child.id());
                let held = hold_connections(&server.addr, a.idle_connections).await?;
                let during = rss_mib(server.child.id());
                out.push((
                    format!("1 node, open loop, {} slow clients held", held.len()),
                    open_loop(&server.addr, Ask::Stored { targets, nodes: 1 }, a.rate, a.seconds, 5).await?,
                ));
                eprintln!("server memory: {before:.0} MiB before the slow clients, {during:.0} MiB with them");
                idle = Some((held.len(), before, during));
            }
            anyhow::Ok(out)
        });
        server.stop();
        phases.extend(result?);
    }
    if a.partitions > 0 {
        let targets = target_nodes;
        let mut nodes = cluster(&bin, &data, &ck, a.partitions, a.scale, a.batch_wait_ms, on)?;
        let first = nodes[0].addr.clone();
        let label = format!("{} partitions", a.partitions);
        let result = rt.block_on(async {
            open_loop(&first, Ask::Stored { targets, nodes: 1 }, a.rate, 3.0, 7).await?;
            anyhow::Ok(vec![
                (
                    format!("{label}: 1 node, open loop"),
                    open_loop(
                        &first,
                        Ask::Stored { targets, nodes: 1 },
                        a.rate,
                        a.seconds,
                        1,
                    )
                    .await?,
                ),
                (
                    format!("{label}: 100 nodes, open loop"),
                    open_loop(
                        &first,
                        Ask::Stored {
                            targets,
                            nodes: 100,
                        },
                        a.rate_100,
                        a.seconds,
                        2,
                    )
                    .await?,
                ),
                (
                    format!("{label}: 1 node, {} clients, batching", a.clients),
                    closed_loop(&first, targets, a.clients, a.seconds, 3).await?,
                ),
            ])
        });
        for n in &mut nodes {
            n.stop();
        }
        phases.extend(result?);
    }
    if let Some(python) = &a.dgl {
        let port = bench::free_ports(1)?[0];
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/dgl_serve.py");
        let mut cmd = Command::new(python);
        cmd.arg(script)
            .arg("--data")
            .arg(&data)
            .arg("--checkpoint")
            .arg(ck.join("epoch-000000"))
            .args(["--fanouts", "10,10", "--port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let mut peer = Server::spawn(cmd, format!("127.0.0.1:{port}"))?;
        let targets = target_nodes;
        let result = rt.block_on(async {
            open_loop(
                &peer.addr,
                Ask::Stored { targets, nodes: 1 },
                a.low_rate,
                3.0,
                7,
            )
            .await?;
            anyhow::Ok(vec![
                (
                    "DGL: 1 node, open loop".to_string(),
                    open_loop(
                        &peer.addr,
                        Ask::Stored { targets, nodes: 1 },
                        a.rate,
                        a.seconds,
                        1,
                    )
                    .await?,
                ),
                (
                    "DGL: 1 node, open loop, low rate".to_string(),
                    open_loop(
                        &peer.addr,
                        Ask::Stored { targets, nodes: 1 },
                        a.low_rate,
                        a.seconds,
                        4,
                    )
                    .await?,
                ),
                (
                    "DGL: 100 nodes, open loop".to_string(),
                    open_loop(
                        &peer.addr,
                        Ask::Stored {
                            targets,
                            nodes: 100,
                        },
                        a.rate_100,
                        a.seconds,
                        2,
                    )
                    .await?,
                ),
            ])
        });
        peer.stop();
        phases.extend(result?);
    }
    println!("\nserve on mag-like S={} (2-layer R-GCN, fanouts 10,10, sampled inference), {} s per phase", a.scale, a.seconds);
    println!("| phase | requests/s offered | answered/s | nodes/s | p50 ms | p90 ms | p99 ms | max ms | errors |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (name, p) in &phases {
        println!(
            "| {name} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            p.offered
                .map_or("closed loop".into(), |r| format!("{r:.0}")),
            p.answered_per_s,
            p.nodes_per_s,
            p.p50_ms,
            p.p90_ms,
            p.p99_ms,
            p.max_ms,
            p.errors
        );
    }
    let through = |label: &str| {
        phases
            .iter()
            .find(|(n, _)| n.ends_with(label) && !n.contains("partitions"))
            .map_or(0.0, |(_, p)| p.nodes_per_s)
    };
    let ratio = through(", batching") / through("no batching").max(1e-9);
    println!("batching: {ratio:.2}x the nodes/s of the same server without it");
    let p99 = |name: &str| {
        phases
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.p99_ms)
    };
    let mut against_dgl = serde_json::Map::new();
    for shape in [
        "1 node, open loop",
        "1 node, open loop, low rate",
        "100 nodes, open loop",
    ] {
        if let (Some(ours), Some(theirs)) = (p99(shape), p99(&format!("DGL: {shape}"))) {
            println!("{shape}: p99 {:.3}x DGL's", ours / theirs);
            against_dgl.insert(shape.to_string(), json!(ours / theirs));
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let report = json!({
        "benchmark": "serve",
        "command": format!("cargo run --release -p bench --bin serve -- --scale {} --seconds {} --rate {} --low-rate {} --rate-100 {} --clients {} --batch-wait-ms {} --partitions {}{}{}{}{}", a.scale, a.seconds, a.rate, a.low_rate, a.rate_100, a.clients, a.batch_wait_ms, a.partitions, if a.dgl.is_some() { " --dgl PYTHON" } else { "" }, a.cpus_per_node.map(|c| format!(" --cpus-per-node {c} --bandwidth {}", a.bandwidth)).unwrap_or_default(), a.cpu_latency_us.map(|u| format!(" --cpu-latency-us {u}")).unwrap_or_default(), if a.precompute { " --precompute" } else { "" }),
        "partitions": (a.partitions > 0).then(|| match a.cpus_per_node {
            None => format!("{} METIS partitions, one serve --partitions process each on loopback (mutual-TLS QUIC between them), sharing this machine's cores; phases against the first node", a.partitions),
            Some(c) => format!("{} METIS partitions, one serve --partitions process each on an emulated machine of {c} CPU with a {} link (mutual-TLS QUIC between them); phases against the first node; the whole-graph servers on one such machine", a.partitions, a.bandwidth),
        }),
        "emulation": a.cpus_per_node.map(|c| json!({"cpus_per_node": c, "bandwidth": a.bandwidth, "shaping": "kernel", "load_generator": "this machine's own namespace, over an unshaped link to the machines' bridge"})),
        "cpu_latency_us": a.cpu_latency_us,
        "commit": commit,
        "graph": format!("mag-like S={}", a.scale),
        "model": format!("rgcn, 2 layers, hidden 64, fanouts 10,10, sampled inference{}", if a.precompute { " (serve --precompute: layer 1 of every node computed at load)" } else { "" }),
        "phases": phases.iter().map(|(n, p)| json!({"phase": n, "offered_rps": p.offered, "answered_per_s": p.answered_per_s, "nodes_per_s": p.nodes_per_s, "p50_ms": p.p50_ms, "p90_ms": p.p90_ms, "p99_ms": p.p99_ms, "max_ms": p.max_ms, "errors": p.errors, "requests": p.requests})).collect::<Vec<_>>(),
        "batching_over_none": ratio,
        "p99_over_dgl": against_dgl,
        "slow_clients": idle.map(|(n, before, during)| json!({"connections": n, "server_rss_mib_before": before, "server_rss_mib_with": during})),
        "batch_wait_ms": a.batch_wait_ms,
    });
    std::fs::write(&a.out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", a.out.display()))?;
    println!("wrote {}", a.out.display());
    Ok(())
}

/// The new-paper requests' shape: the graph's papers, authors and paper feature width.
fn new_paper_ask(data: &Path) -> anyhow::Result<Ask> {
    let g = graphs::load(
        data,
        &graphs::LoadOptions {
            mmap_features: true,
            reverse_edges: false,
        },
    )?;
    let of = |name: &str| {
        g.node_types()
            .iter()
            .find(|t| t.name == name)
            .with_context(|| format!("{}: no node type {name}", data.display()))
    };
    let (paper, author) = (of("paper")?, of("author")?);
    let width = paper
        .features
        .as_ref()
        .map(|f| f.dim())
        .context("papers without features")?;
    Ok(Ask::NewPaper {
        papers: paper.count,
        authors: author.count,
        width,
    })
}

/// A checkpoint of a 2-layer R-GCN (fanouts 10,10) on the graph, made once.
fn checkpoint(data: &Path, scale: f64) -> anyhow::Result<PathBuf> {
    let root = bench::data_root().join(format!("serve-ck-s{scale}"));
    if root.join("epoch-000000").exists() {
        return Ok(root);
    }
    let t = actors::TrainingConfig {
        fanouts: vec![10, 10],
        ..Default::default()
    };
    bench::initial_checkpoint(&t, data, &root, "bench serve")?;
    Ok(root)
}

/// `hetgnn serve` of checkpoint `ck` at `addr`, unbounded in queue and rate
/// (the load generator decides the load).
fn serve_cmd(bin: &Path, addr: &str, ck: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args([
        "serve",
        "--listen",
        addr,
        "--queue",
        "100000",
        "--max-rps",
        "0",
    ])
    .arg("--checkpoint")
    .arg(ck);
    cmd
}

/// `k` `serve --partitions` processes over METIS partitions of `data`, one
/// node of a loopback topology each, or each on machine `i` of `on`; all ready.
fn cluster(
    bin: &Path,
    data: &Path,
    ck: &Path,
    k: usize,
    scale: f64,
    batch_wait_ms: f64,
    on: Option<&Cluster>,
) -> anyhow::Result<Vec<Server>> {
    let parts = bench::partitions(bin, data, "metis", k, scale)?;
    let work = bench::data_root().join("serve-cluster");
    std::fs::create_dir_all(&work)?;
    let config = work.join(format!("cluster{k}.toml"));
    let http: Vec<String> = match on {
        None => {
            std::fs::write(&config, bench::local_cluster(bin, &work, k)?)?;
            bench::free_ports(k)?
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect()
        }
        Some(c) => {
            let quic: Vec<String> = (0..k).map(|i| format!("{}:7000", c.addr(i))).collect();
            // The CPU shares are the harness's: no cpus in the file.
            std::fs::write(&config, bench::cluster_section(bin, &work, &quic, None)?)?;
            (0..k).map(|i| format!("{}:8080", c.addr(i))).collect()
        }
    };
    let mut launched = Vec::new();
    for (i, addr) in http.into_iter().enumerate() {
        let mut cmd = serve_cmd(bin, &addr, ck);
        cmd.arg("--partitions")
            .arg(&parts)
            .arg("--config")
            .arg(&config)
            .args(["--node", &format!("n{i}")])
            .args(["--batch-wait-ms", &batch_wait_ms.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = launch(cmd, on, i)?;
        launched.push(Server { child, addr });
    }
    for s in &mut launched {
        s.wait_ready()?;
    }
    Ok(launched)
}

/// Starts `cmd` here, or on machine `i` of `on` (its namespace, its CPU
/// share, as many rayon threads as it has CPUs).
fn launch(mut cmd: Command, on: Option<&Cluster>, i: usize) -> anyhow::Result<Child> {
    match on {
        None => cmd.spawn().with_context(|| format!("starting {cmd:?}")),
        Some(c) => {
            if let Some(cpus) = c.machines().cpus {
                cmd.env(
                    "RAYON_NUM_THREADS",
                    (cpus.ceil() as usize).max(1).to_string(),
                );
            }
            c.spawn(i, &cmd)
        }
    }
}

/// A `hetgnn serve` child, stopped with SIGTERM.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    /// A whole-graph server, here or on the first machine of `on`.
    fn start(
        bin: &Path,
        data: &Path,
        ck: &Path,
        batch_wait_ms: Option<f64>,
        precompute: bool,
        on: Option<&Cluster>,
    ) -> anyhow::Result<Server> {
        let addr = match on {
            None => format!("127.0.0.1:{}", bench::free_ports(1)?[0]),
            Some(c) => format!("{}:8080", c.addr(0)),
        };
        let mut cmd = serve_cmd(bin, &addr, ck);
        cmd.arg("--data")
            .arg(data)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        match batch_wait_ms {
            Some(ms) => cmd.args(["--batch-wait-ms", &ms.to_string()]),
            None => cmd.args(["--batch-nodes", "1", "--batch-wait-ms", "0"]),
        };
        if precompute {
            cmd.arg("--precompute");
        }
        let child = launch(cmd, on, 0)?;
        let mut server = Server { child, addr };
        server.wait_ready()?;
        Ok(server)
    }

    /// Starts `cmd`, a server at `addr`, and waits until `/readyz` answers 200.
    fn spawn(mut cmd: Command, addr: String) -> anyhow::Result<Server> {
        let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let mut server = Server { child, addr };
        server.wait_ready()?;
        Ok(server)
    }

    /// Waits until `/readyz` answers 200 (300 s at most).
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let server = self;
        let start = Instant::now();
        loop {
            if let Ok(mut s) = std::net::TcpStream::connect(&server.addr) {
                use std::io::{Read, Write};
                let _ =
                    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let mut out = String::new();
                let _ = s.read_to_string(&mut out);
                if out.starts_with("HTTP/1.1 200") {
                    return Ok(());
                }
            }
            if start.elapsed() > Duration::from_secs(300) {
                bail!("{} did not get ready in 300 s", server.addr);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                bail!("the server at {} exited: {status}", server.addr);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Figures of one phase.
struct Phase {
    offered: Option<f64>,
    requests: usize,
    answered_per_s: f64,
    nodes_per_s: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    errors: u64,
}

fn phase(
    offered: Option<f64>,
    mut lat: Vec<f64>,
    nodes: usize,
    elapsed: f64,
    errors: u64,
) -> Phase {
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| {
        if lat.is_empty() {
            f64::NAN
        } else {
            lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1]
        }
    };
    Phase {
        offered,
        requests: lat.len(),
        answered_per_s: lat.len() as f64 / elapsed,
        nodes_per_s: (lat.len() * nodes) as f64 / elapsed,
        p50_ms: q(0.5),
        p90_ms: q(0.9),
        p99_ms: q(0.99),
        max_ms: lat.last().copied().unwrap_or(f64::NAN),
        errors,
    }
}

/// A pool of kept-alive connections to the server.
#[derive(Clone)]
struct Pool {
    addr: String,
    idle: Arc<Mutex<Vec<SendRequest<Full<Bytes>>>>>,
}

impl Pool {
    fn new(addr: &str) -> Pool {
        Pool {
            addr: addr.to_string(),
            idle: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// POSTs `body` to `path`; the status.
    async fn post(&self, path: &str, body: String) -> anyhow::Result<u16> {
        let idle = self
            .idle
            .lock()
            .map_err(|_| anyhow::anyhow!("pool poisoned"))?
            .pop();
        let mut conn = match idle {
            Some(c) if !c.is_closed() => c,
            _ => {
                let stream = tokio::net::TcpStream::connect(&self.addr).await?;
                stream.set_nodelay(true)?;
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await?;
                tokio::spawn(conn);
                sender
            }
        };
        let req = hyper::Request::post(path)
            .header(hyper::header::HOST, &self.addr)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        conn.ready().await?;
        let resp = conn.send_request(req).await?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await?;
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
        Ok(status)
    }
}

/// The number of target nodes the model classifies.
async fn target_count(addr: &str) -> anyhow::Result<u32> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /v1/model HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).context("GET /v1/model")?;
    let target = v["target"].as_str().unwrap_or_default();
    v["types"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == target))
        .and_then(|t| t["nodes"].as_u64())
        .map(|n| n as u32)
        .context("the target type's node count")
}

/// Opens `n` connections that each send the start of a request and stall
/// (slow clients); they stay open while the returned streams live.
async fn hold_connections(addr: &str, n: usize) -> anyhow::Result<Vec<tokio::net::TcpStream>> {
    use tokio::io::AsyncWriteExt;
    raise_fd_limit(n + 1024);
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(mut s) => {
                s.write_all(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
                    .await?;
                held.push(s);
            }
            // Out of file descriptors or ports: hold what was opened.
            Err(e) => {
                eprintln!("held {} slow connections, then: {e}", held.len());
                break;
            }
        }
    }
    Ok(held)
}

/// Raises this process's soft limit on open files to at least `want` (up to the hard limit).
fn raise_fd_limit(want: usize) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && (r.rlim_cur as usize) < want {
            r.rlim_cur = (want as libc::rlim_t).min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Resident memory of process `pid` in MiB (0 when unknown).
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// A request body for `nodes` target nodes drawn by `rng`.
fn body(rng: &AtomicU64, targets: u32, nodes: usize) -> String {
    let ids: Vec<u32> = (0..nodes).map(|_| draw(rng, targets)).collect();
    json!({ "ids": ids }).to_string()
}

/// A node id below `n` from the request mix's stream (splitmix64: fixed and reproducible).
fn draw(rng: &AtomicU64, n: u32) -> u32 {
    let mut z = rng.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % u64::from(n.max(1))) as u32
}

/// What the requests of an open-loop phase ask.
#[derive(Clone, Copy)]
enum Ask {
    /// `nodes` stored target nodes.
    Stored { targets: u32, nodes: usize },
    /// A new paper (its feature row of `width` floats) citing 10 stored
    /// papers and written by 3 stored authors, answered for itself.
    NewPaper {
        papers: u32,
        authors: u32,
        width: usize,
    },
}

impl Ask {
    /// Nodes answered per request.
    fn nodes(&self) -> usize {
        match self {
            Ask::Stored { nodes, .. } => *nodes,
            Ask::NewPaper { .. } => 1,
        }
    }

    fn body(&self, rng: &AtomicU64) -> String {
        match *self {
            Ask::Stored { targets, nodes } => body(rng, targets, nodes),
            Ask::NewPaper {
                papers,
                authors,
                width,
            } => {
                let features: Vec<f32> = (0..width)
                    .map(|_| draw(rng, 2001) as f32 / 1000.0 - 1.0)
                    .collect();
                let mut edges: Vec<serde_json::Value> = (0..10)
                    .map(|_| json!({"relation": "cites", "src": "new", "dst": draw(rng, papers)}))
                    .collect();
                edges.extend((0..3).map(
                    |_| json!({"relation": "writes", "src": draw(rng, authors), "dst": "new"}),
                ));
                json!({
                    "ids": ["new"],
                    "new_nodes": [{"type": "paper", "id": "new", "features": features}],
                    "new_edges": edges,
                })
                .to_string()
            }
        }
    }
}

/// Sends `rate` requests per second of `nodes` nodes for `seconds`, each at its
/// scheduled time; latency counts from that time.
async fn open_loop(
    addr: &str,
    ask: Ask,
    rate: f64,
    seconds: f64,
    seed: u64,
) -> anyhow::Result<Phase> {
    let pool = Pool::new(addr);
    let rng = Arc::new(AtomicU64::new(seed));
    let total = (rate * seconds).round() as usize;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let at = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at).await;
        let (pool, body) = (pool.clone(), ask.body(&rng));
        tasks.push(tokio::spawn(async move {
            let result = pool.post("/v1/predict", body).await;
            let ms = at.elapsed().as_secs_f64() * 1e3;
            match result {
                Ok(200) => (None, ms),
                Ok(code) => (Some(format!("status {code}")), ms),
                Err(e) => (Some(format!("{e:#}")), ms),
            }
        }));
    }
    let (mut lat, mut errors, mut first) = (Vec::with_capacity(total), 0, None);
    for t in tasks {
        match t.await {
            Ok((None, ms)) => lat.push(ms),
            Ok((Some(e), _)) => {
                errors += 1;
                first.get_or_insert(e);
            }
            Err(e) => {
                errors += 1;
                first.get_or_insert(e.to_string());
            }
        }
    }
    if let Some(e) = first {
        eprintln!("{addr}: {errors} failed requests, the first: {e}");
    }
    Ok(phase(
        Some(rate),
        lat,
        ask.nodes(),
        start.elapsed().as_secs_f64(),
        errors,
    ))
}

/// `clients` clients each sending one-node requests back to back for `seconds`.
async fn closed_loop(
    addr: &str,
    targets: u32,
    clients: usize,
    seconds: f64,
    seed: u64,
) -> anyhow::Result<Phase> {
    let rng = Arc::new(AtomicU64::new(seed));
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (pool, rng) = (Pool::new(addr), Arc::clone(&rng));
            tokio::spawn(async move {
                let (mut lat, mut errors) = (Vec::new(), 0u64);
                while tokio::time::Instant::now() < end {
                    let sent = tokio::time::Instant::now();
                    match pool.post("/v1/predict", body(&rng, targets, 1)).await {
                        Ok(200) => lat.push(sent.elapsed().as_secs_f64() * 1e3),
                        _ => errors += 1,
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let (mut lat, mut errors) = (Vec::new(), 0);
    for t in tasks {
        let (l, e) = t.await?;
        lat.extend(l);
        errors += e;
    }
    Ok(phase(None, lat, 1, start.elapsed().as_secs_f64(), errors))
}
