//! Distributed offline inference against single-process `embed`, on
//! emulated machines: the single-process run on one machine, then `embed
//! --partitions` on 2 and 4 machines (each node its own network namespace,
//! link cap and CPU share), interleaved over repeats; each distributed
//! output checked against the single-process one (to 1e-5).
//!
//! `cargo run --release -p bench --bin embed [-- --scale 0.1 --nodes 2,4
//! --cpus-per-node 0.5 --repeats 3]` (root: namespaces and control groups)
//! prints a table and writes bench/results/embed.json.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use bench::emulate::{Cluster, Machines};
use clap::Parser;
use graphs::npy::{DType, NpyFile};

#[derive(Parser)]
struct Args {
    /// Partitions holding their halo's feature rows (`partition --halo-features`):
    /// the first layer's halo is read there, not pulled.
    #[arg(long)]
    halo_features: bool,
    /// Scale of the mag-like graph.
    #[arg(long, default_value_t = 0.1)]
    scale: f64,
    /// Node counts of the distributed runs (one partition each).
    #[arg(long, default_value = "2,4", value_delimiter = ',')]
    nodes: Vec<usize>,
    /// CPUs of each emulated machine, the single-process one included.
    #[arg(long, default_value_t = 0.5)]
    cpus_per_node: f64,
    /// Link rate of each machine, enforced by the kernel.
    #[arg(long, default_value = "10Gbit/s")]
    bandwidth: String,
    /// The links' MTU in bytes (9000: jumbo frames).
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Interleaved repeats of every configuration.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Model layers (R-GCN) and hidden width.
    #[arg(long, default_value_t = 3)]
    layers: usize,
    #[arg(long, default_value_t = 64)]
    hidden: usize,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/embed.json")]
    out: PathBuf,
}

/// Runs the commands `build` gives for a fresh cluster of `n` emulated
/// machines, the i-th on machine i, until all exit; the wall time from the
/// first start to the last exit and the CPU time (user and system) of all
/// of them together, in seconds.
fn timed_on(
    machines: &Machines,
    n: usize,
    build: impl Fn(&Cluster) -> anyhow::Result<Vec<Command>>,
) -> anyhow::Result<Run> {
    let cluster = Cluster::create(n, machines)?;
    let cmds = build(&cluster)?;
    // The previous run's outputs go to disk now, not while this run's
    // machines hold the cores.
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let cpu_before = bench::measure::children_cpu_s();
    let start = Instant::now();
    let mut children = cmds
        .iter()
        .enumerate()
        .map(|(i, c)| cluster.spawn(i, c))
        .collect::<anyhow::Result<Vec<_>>>()?;
    bench::wait_all(
        &mut children,
        |i| format!("machine {i}"),
        Some(std::time::Duration::from_secs(1800)),
    )?;
    Ok(Run {
        wall_s: start.elapsed().as_secs_f64(),
        cpu_s: bench::measure::children_cpu_s() - cpu_before,
    })
}

/// One timed run.
struct Run {
    wall_s: f64,
    /// CPU seconds of every process of the run (each machine's process is a
    /// child: `ip netns exec` runs it in place): the distributed runs' work
    /// against the single process's, whatever the waits.
    cpu_s: f64,
}

fn hetgnn(bin: &Path, work: &Path, threads: &str, args: &[String]) -> Command {
    let mut c = Command::new(bin);
    c.args(args)
        .current_dir(work)
        .env("RAYON_NUM_THREADS", threads)
        // `EMBED_LOG=info` shows each node's phases.
        .env(
            "RUST_LOG",
            std::env::var("EMBED_LOG").unwrap_or_else(|_| "warn".into()),
        );
    c
}

/// The largest relative difference between the partitioned output `dist`
/// and the single-process output `single`, every node checked once.
fn max_diff(single: &Path, dist: &Path) -> anyhow::Result<f32> {
    let text = std::fs::read_to_string(dist.join("manifest.json"))?;
    let m: serde_json::Value = serde_json::from_str(&text)?;
    let mut worst = 0f32;
    for t in m["types"].as_array().context("manifest types")? {
        let name = t["name"].as_str().context("type name")?;
        let width = t["width"].as_u64().context("width")? as usize;
        let want = NpyFile::open(&single.join(format!("{name}.npy")), DType::F32)?.to_f32_vec();
        let mut seen = vec![false; want.len() / width.max(1)];
        for k in 0..t["nodes"].as_array().map_or(0, Vec::len) {
            let dir = dist.join(format!("part-{k}"));
            let got = NpyFile::open(&dir.join(format!("{name}.npy")), DType::F32)?.to_f32_vec();
            let ids = NpyFile::open(&dir.join(format!("{name}.ids.npy")), DType::I64)?;
            for i in 0..got.len() / width.max(1) {
                let v = usize::try_from(ids.i64_at(i)).context("a negative id")?;
                anyhow::ensure!(
                    v < seen.len() && !seen[v],
                    "{name} node {v}: out of range or twice"
                );
                seen[v] = true;
                for j in 0..width {
                    let (a, b) = (got[i * width + j], want[v * width + j]);
                    worst = worst.max((a - b).abs() / b.abs().max(1.0));
                }
            }
        }
        anyhow::ensure!(seen.iter().all(|&s| s), "{name}: some nodes not written");
    }
    Ok(worst)
}

fn range(xs: &[f64]) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(0f64, f64::max);
    format!("{lo:.2}-{hi:.2}")
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.bin.clone())?;
    let data = bench::mag_like(a.scale, 0)?;
    let work = bench::data_root().join(format!("embed-s{}-l{}-h{}", a.scale, a.layers, a.hidden));
    std::fs::create_dir_all(&work)?;
    let s = |x: &str| x.to_string();
    let d = data.display().to_string();
    let fanouts = vec!["10"; a.layers].join(",");
    if !work.join("ck").exists() {
        eprintln!("training the model to embed with (1 epoch)");
        let args = [
            "train",
            "--data",
            &d,
            "--epochs",
            "1",
            "--layers",
            &a.layers.to_string(),
            "--hidden",
            &a.hidden.to_string(),
            "--fanouts",
            &fanouts,
            "--checkpoint",
            "ck",
            "--report",
            "train.json",
            "--force",
        ];
        bench::run_hetgnn(&bin, &work, &args.map(s))?;
    }
    let parts: Vec<PathBuf> = a
        .nodes
        .iter()
        .map(|&k| {
            if a.halo_features {
                bench::partitions_with_halo(&bin, &data, "metis", k, a.scale)
            } else {
                bench::partitions(&bin, &data, "metis", k, a.scale)
            }
        })
        .collect::<anyhow::Result<_>>()?;
    let rate = runtime::config::Bandwidth::parse(&a.bandwidth)?;
    let machines = Machines {
        cpus: Some(a.cpus_per_node),
        rate_bits: Some(rate.0.saturating_mul(8)),
        mtu: Some(a.mtu),
    };
    let threads = (a.cpus_per_node.ceil() as usize).max(1).to_string();
    let (mut single_s, mut single_cpu) = (Vec::new(), Vec::new());
    let mut dist_s: Vec<Vec<f64>> = vec![Vec::new(); a.nodes.len()];
    let mut dist_cpu: Vec<Vec<f64>> = vec![Vec::new(); a.nodes.len()];
    let mut diffs: Vec<f32> = vec![0.0; a.nodes.len()];
    for r in 0..a.repeats {
        let _ = std::fs::remove_dir_all(work.join("single"));
        let args = [
            "embed",
            "--checkpoint",
            "ck",
            "--data",
            &d,
            "--out",
            "single",
            "--force",
        ];
        let t = timed_on(&machines, 1, |_| {
            Ok(vec![hetgnn(&bin, &work, &threads, &args.map(s))])
        })?;
        eprintln!(
            "repeat {r}: single-process {:.2} s ({:.2} CPU s)",
            t.wall_s, t.cpu_s
        );
        single_s.push(t.wall_s);
        single_cpu.push(t.cpu_s);
        for (i, (&k, p)) in a.nodes.iter().zip(&parts).enumerate() {
            let out = format!("dist-{k}");
            let _ = std::fs::remove_dir_all(work.join(&out));
            let t = timed_on(&machines, k, |cluster| {
                let addrs: Vec<String> = (0..k)
                    .map(|j| format!("{}:7000", cluster.addr(j)))
                    .collect();
                // The CPU shares are the harness's: no cpus in the file.
                let toml = bench::cluster_section(&bin, &work, &addrs, None)?;
                std::fs::write(work.join(format!("cluster-{k}.toml")), toml)?;
                Ok((0..k)
                    .map(|j| {
                        let args = [
                            s("embed"),
                            s("--checkpoint"),
                            s("ck"),
                            s("--partitions"),
                            p.display().to_string(),
                            s("--config"),
                            format!("cluster-{k}.toml"),
                            s("--node"),
                            format!("n{j}"),
                            s("--out"),
                            out.clone(),
                        ];
                        hetgnn(&bin, &work, &threads, &args)
                    })
                    .collect())
            })?;
            let diff = max_diff(&work.join("single"), &work.join(&out))?;
            eprintln!(
                "repeat {r}: {k} nodes {:.2} s ({:.2} CPU s, all nodes; max difference {diff:.1e})",
                t.wall_s, t.cpu_s
            );
            dist_s[i].push(t.wall_s);
            dist_cpu[i].push(t.cpu_s);
            diffs[i] = diffs[i].max(diff);
        }
    }
    println!(
        "mag-like S={}, R-GCN {} layers hidden {}, {} CPU(s) per machine, {} links (kernel)",
        a.scale, a.layers, a.hidden, a.cpus_per_node, a.bandwidth
    );
    println!("| run | wall s | vs single-process | CPU s, all processes | max difference |");
    println!("| --- | --- | --- | --- | --- |");
    println!(
        "| single-process | {} | 1 | {} | - |",
        range(&single_s),
        range(&single_cpu)
    );
    let mut rows = Vec::new();
    for (i, &k) in a.nodes.iter().enumerate() {
        // Ratios pair each repeat's runs, taken back to back.
        let ratios: Vec<f64> = dist_s[i]
            .iter()
            .zip(&single_s)
            .map(|(d, s)| d / s)
            .collect();
        println!(
            "| {k} nodes | {} | {}x | {} | {:.1e} |",
            range(&dist_s[i]),
            range(&ratios),
            range(&dist_cpu[i]),
            diffs[i]
        );
        rows.push(serde_json::json!({
            "nodes": k, "wall_s": dist_s[i], "ratio_to_single": ratios,
            "cpu_s": dist_cpu[i], "max_rel_difference": diffs[i],
        }));
    }
    let json = serde_json::json!({
        "benchmark": "embed",
        "graph": format!("mag-like S={} seed 0", a.scale),
        "model": {"kind": "rgcn", "layers": a.layers, "hidden": a.hidden},
        "emulation": {
            "cpus_per_node": a.cpus_per_node,
            "bandwidth": a.bandwidth,
            "shaping": "kernel",
        },
        "partitions": { "method": "metis", "halo_features": a.halo_features },
        "single_process_wall_s": single_s,
        "single_process_cpu_s": single_cpu,
        "distributed": rows,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    });
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&json)?)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
