//! hetgnn's data-parallel and raf training against DistDGL on the same
//! emulated machines in the same run: each machine a network namespace with
//! its own address, a kernel-capped link and a CPU share (`bench::emulate`).
//! On each, hetgnn runs one `hetgnn node` (data-parallel on METIS
//! partitions; raf on meta-partitions with synced tables);
//! DistDGL runs its graph server and its trainer
//! (`bench/baselines/distdgl_rgcn.py`, METIS partitions by
//! `dgl.distributed.partition_graph`) with a private `/dev/shm`, as on
//! separate machines. Both train the same 2-layer R-GCN on the mag-like
//! graph with the same global batch; each round starts with the next
//! system. Each hetgnn machine's peak memory is measured with GNU time.
//!
//! `cargo build --release && cargo run --release -p bench --bin distdgl --
//! --python PYTHON [--scale 0.05 --nodes 2,4 --cpus-per-node 0.5 --bandwidth 1Gbit/s --rounds 2]`
//! writes bench/results/distdgl.json. Needs root, and a Python with DGL 2.1
//! (see dgl_rgcn.py's header).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use bench::emulate::{Cluster, Machines};
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// The Python with DGL 2.1 and torch 2.2.1.
    #[arg(long)]
    python: PathBuf,
    /// Scale of the mag-like graph.
    #[arg(long, default_value_t = 0.05)]
    scale: f64,
    /// Machine counts.
    #[arg(long, default_value = "2,4", value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Epochs per run; the figure is the mean of every epoch after the first.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Rounds (each runs both systems, alternating which goes first).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// CPUs per machine (its control group's quota).
    #[arg(long, default_value_t = 0.5)]
    cpus_per_node: f64,
    /// Each machine's link rate, capped by the kernel.
    #[arg(long, default_value = "1Gbit/s")]
    bandwidth: String,
    /// The links' MTU in bytes (9000: jumbo frames).
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Longest a DistDGL run may take.
    #[arg(long, default_value_t = 1800)]
    timeout_s: u64,
    /// Which systems to run: hetgnn's data-parallel and raf, and DistDGL
    /// (a DistDGL-only run diagnoses the peer).
    #[arg(
        long,
        default_value = "data-parallel,raf,distdgl",
        value_delimiter = ','
    )]
    systems: Vec<String>,
    /// Give DistDGL's sockets TCP_NODELAY (`baselines/nodelay.c`, preloaded):
    /// DGL's RPC sends a header and a body as two writes, which Nagle's
    /// algorithm and delayed ACKs hold up by tens of milliseconds each.
    #[arg(long)]
    peer_nodelay: bool,
    /// DistDGL sampler processes per trainer (`DGL_NUM_SAMPLER`; 0 samples in the trainer).
    #[arg(long, default_value_t = 0)]
    peer_samplers: usize,
    /// A cache of remote feature rows per hetgnn trainer or raf worker
    /// (`cache_bytes`, e.g. "64MiB"; DistDGL has none).
    #[arg(long)]
    cache_bytes: Option<String>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/distdgl.json")]
    out: PathBuf,
}

/// The mean epoch seconds after the first (all of them with one epoch) and
/// the last epoch's test accuracy of a report's `epochs`.
fn figures(epochs: &[Value]) -> (f64, f64) {
    let later = if epochs.len() > 1 {
        &epochs[1..]
    } else {
        epochs
    };
    let secs: Vec<f64> = later.iter().filter_map(|e| e["seconds"].as_f64()).collect();
    let mean = secs.iter().sum::<f64>() / secs.len().max(1) as f64;
    let acc = epochs
        .last()
        .and_then(|e| e["test_acc"].as_f64())
        .unwrap_or(f64::NAN);
    (mean, acc)
}

/// DistDGL's partitions of `data` in `k` parts, made once under `work`.
fn distdgl_parts(a: &Args, data: &Path, work: &Path, k: usize) -> anyhow::Result<PathBuf> {
    let dir = work.join(format!("distdgl-{k}"));
    if !dir.join("mag.json").exists() {
        let out = Command::new(&a.python)
            .arg(script())
            .args(["partition", "--data"])
            .arg(data)
            .args(["--parts", &k.to_string(), "--out"])
            .arg(&dir)
            .output()
            .context("running the DistDGL partitioner")?;
        if !out.status.success() {
            bail!(
                "DistDGL partitioning failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(dir)
}

/// `baselines/nodelay.c` built into `work`: preloaded, it sets TCP_NODELAY
/// on every TCP socket a DistDGL process opens.
fn nodelay_lib(work: &Path) -> anyhow::Result<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/nodelay.c");
    let lib = work.join("nodelay.so");
    let out = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .output()
        .context("running cc to build baselines/nodelay.c (--peer-nodelay needs a C compiler)")?;
    if !out.status.success() {
        bail!(
            "building nodelay.so failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(lib)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/distdgl_rgcn.py")
}

/// One DistDGL run on `k` emulated machines; trainer 0's report.
fn distdgl(
    a: &Args,
    parts: &Path,
    work: &Path,
    k: usize,
    machines: &Machines,
    nodelay: Option<&Path>,
) -> anyhow::Result<Value> {
    let cluster = Cluster::create(k, machines)?;
    let ips: String = (0..k)
        .map(|i| format!("{} 30050\n", cluster.addr(i)))
        .collect();
    let ip_config = work.join(format!("ips-{k}.txt"));
    std::fs::write(&ip_config, ips)?;
    let threads = (a.cpus_per_node.ceil() as usize).max(1);
    let master = format!("{}:29500", cluster.addr(0));
    let part_config = parts.join("mag.json");
    let py = a.python.display().to_string();
    let common = format!(
        "--part-config {} --ip-config {} --machines {k} --samplers {}",
        part_config.display(),
        ip_config.display(),
        a.peer_samplers
    );
    let mut children = Vec::new();
    for i in 0..k {
        // A private /dev/shm per machine: DGL's server and its local trainer
        // share memory there, and servers of other machines must not see it.
        let sh = format!(
            "mount -t tmpfs tmpfs /dev/shm && \
             {py} {s} server {common} --machine {i} > server{i}.log 2>&1 & \
             sleep 4; GLOO_SOCKET_IFNAME=veth{i} {py} {s} trainer {common} --machine {i} \
             --master {master} --epochs {e} --threads {threads} > trainer{i}.out 2> trainer{i}.log; \
             st=$?; wait; exit $st",
            s = script().display(),
            e = a.epochs,
        );
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "sh", "-c", &sh])
            .current_dir(work)
            .env("OMP_NUM_THREADS", threads.to_string())
            .stdout(Stdio::null());
        if let Some(lib) = nodelay {
            cmd.env("LD_PRELOAD", lib);
        }
        children.push(cluster.spawn(i, &cmd)?);
    }
    let waited = bench::wait_all(
        &mut children,
        |i| {
            format!(
                "DistDGL machine {i} (see {}/trainer{i}.log)",
                work.display()
            )
        },
        Some(Duration::from_secs(a.timeout_s)),
    );
    // The servers were started by the shells: stop any left.
    let _ = Command::new("pkill")
        .args(["-f", "distdgl_rgcn.py server"])
        .status();
    drop(cluster);
    waited?;
    let out = std::fs::read_to_string(work.join("trainer0.out"))?;
    let last = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("no DistDGL report")?;
    Ok(serde_json::from_str(last)?)
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.hetgnn.clone())?;
    let data = bench::mag_like(a.scale, 0)?;
    let work = tempfile::tempdir()?;
    let w = work.path();
    let links = bench::Links {
        bandwidth: a.bandwidth.clone(),
        delay_ms: 0.0,
        cpus_per_node: Some(a.cpus_per_node),
        shaping: bench::Shaping::Kernel,
        mtu: a.mtu,
    };
    let rate = runtime::config::Bandwidth::parse(&a.bandwidth)?;
    let machines = Machines {
        cpus: Some(a.cpus_per_node),
        rate_bits: Some(rate.0.saturating_mul(8)),
        mtu: Some(a.mtu),
    };
    const SYSTEMS: [&str; 3] = ["data-parallel", "raf", "distdgl"];
    for s in &a.systems {
        if !SYSTEMS.contains(&s.as_str()) {
            bail!("--systems takes {}, not {s:?}", SYSTEMS.join(", "));
        }
    }
    let systems: Vec<&str> = SYSTEMS
        .into_iter()
        .filter(|s| a.systems.iter().any(|x| x == s))
        .collect();
    let nodelay = if a.peer_nodelay {
        Some(nodelay_lib(w)?)
    } else {
        None
    };
    let mut rows = Vec::new();
    for &k in &a.nodes {
        // Per system, each round's (epoch seconds, test accuracy).
        let mut figs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); systems.len()];
        let mut peaks: Vec<Vec<Value>> = vec![Vec::new(); systems.len()];
        let mut reports = Vec::new();
        for round in 0..a.rounds {
            // Each round starts with the next system, so none always runs first.
            for j in 0..systems.len() {
                let at = (j + round) % systems.len();
                let system = systems[at];
                eprintln!("{system}, {k} machines, round {round}");
                let r = if system == "distdgl" {
                    let parts = distdgl_parts(&a, &data, w, k)?;
                    let r = distdgl(&a, &parts, w, k, &machines, nodelay.as_deref())?;
                    reports.push(r.clone());
                    r
                } else {
                    let (method, extra) = if system == "raf" {
                        ("meta", "raf.embeddings = \"synced\"\n")
                    } else {
                        ("metis", "")
                    };
                    let parts = bench::partitions(&bin, &data, method, k, a.scale)?;
                    let cache = a
                        .cache_bytes
                        .as_ref()
                        .map(|c| format!("cache_bytes = {c:?}\n"))
                        .unwrap_or_default();
                    let training = format!(
                        "mode = {system:?}\npartitions = {:?}\nepochs = {}\n{extra}{cache}",
                        parts.display().to_string(),
                        a.epochs
                    );
                    let report = format!("{system}-{k}-{round}.json");
                    links.launch(&bin, w, k, &training, &report)?
                };
                let e = r["epochs"].as_array().cloned().unwrap_or_default();
                figs[at].push(figures(&e));
                peaks[at].push(r["node_peak_rss_bytes"].clone());
            }
        }
        let range = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
            let x: Vec<f64> = v.iter().map(f).collect();
            [
                x.iter().copied().fold(f64::INFINITY, f64::min),
                x.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ]
        };
        let peer = systems.iter().position(|s| *s == "distdgl");
        let mut row = json!({ "machines": k, "distdgl_reports": reports });
        for (at, system) in systems.iter().enumerate() {
            let f = &figs[at];
            println!(
                "{k} machines of {} CPU at {}: {system} epoch {:?} s (test {:?})",
                a.cpus_per_node,
                a.bandwidth,
                range(f, |x| x.0),
                range(f, |x| x.1),
            );
            row[*system] = json!(f
                .iter()
                .zip(&peaks[at])
                .map(
                    |((s, acc), p)| json!({"epoch_s": s, "test_acc": acc, "node_peak_rss_bytes": p})
                )
                .collect::<Vec<_>>());
            if let Some(p) = peer.filter(|&p| p != at) {
                // Round by round: each system against the peer's run of the same round.
                let ratios: Vec<f64> = f.iter().zip(&figs[p]).map(|(o, t)| o.0 / t.0).collect();
                println!("  {system} / DistDGL: {ratios:.3?}");
                row[format!("{system}_ratio")] = json!(ratios);
            }
        }
        rows.push(row);
    }
    if let Some(p) = a.out.parent() {
        std::fs::create_dir_all(p)?;
    }
    let emulation =
        json!({ "cpus_per_node": a.cpus_per_node, "bandwidth": a.bandwidth, "shaping": "kernel" });
    std::fs::write(
        &a.out,
        serde_json::to_string_pretty(&json!({
            "scale": a.scale, "epochs": a.epochs, "rounds": a.rounds, "emulation": emulation,
            "model": "rgcn",
            "hetgnn_modes": "data-parallel (metis partitions), raf (meta partitions, synced tables)",
            "peer": "DistDGL (dgl 2.1, metis, DistEmbedding + SparseAdam, DDP)",
            "peer_tuning": { "tcp_nodelay": a.peer_nodelay, "samplers": a.peer_samplers },
            "hetgnn_cache_bytes": a.cache_bytes,
            "runs": rows,
        }))? + "\n",
    )?;
    println!("wrote {}", a.out.display());
    Ok(())
}
