//! Data-parallel training (the DistDGL baseline) on 1, 2 and 4 nodes of one
//! machine, as separate processes over QUIC on loopback, with every link
//! shaped by the runtime (default 10 Gbit/s and 0.1 ms): epoch time and its
//! split, bytes per training step by message kind, and accuracy, for METIS
//! and random partitions, next to single-process training measured in the
//! same run.
//!
//! `cargo build --release && cargo run --release -p bench --bin data_parallel
//! [-- --scale 0.05 --nodes 1,2,4 --methods metis,random --epochs 2]`
//! prints a table and writes bench/results/data_parallel.json.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Scale of the mag-like graph.
    #[arg(long, default_value_t = 0.05)]
    scale: f64,
    /// Node counts to run.
    #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Partitioners.
    #[arg(long, default_value = "metis,random", value_delimiter = ',')]
    methods: Vec<String>,
    /// Epochs per run (figures are means over them).
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Link bandwidth cap.
    #[arg(long, default_value = "10Gbit/s")]
    bandwidth: String,
    /// Fixed one-way link delay in milliseconds.
    #[arg(long, default_value_t = 0.1)]
    delay_ms: f64,
    /// Gradient all-reduce: all-gather or ring.
    #[arg(long, default_value = "all-gather")]
    allreduce: String,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/data_parallel.json")]
    out: PathBuf,
}

fn run(bin: &Path, dir: &Path, args: &[String]) -> anyhow::Result<()> {
    let out = Command::new(bin).args(args).current_dir(dir).output().with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!("hetgnn {} failed:\n{}\n{}", args.join(" "), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn summary(r: &Value, label: &str) -> Value {
    let epochs = r["epochs"].as_array().cloned().unwrap_or_default();
    let n = epochs.len().max(1) as f64;
    let mean = |k: &str| epochs.iter().map(|e| e[k].as_f64().unwrap_or(0.0)).sum::<f64>() / n;
    let per_step: f64 = r["bytes_per_step"].as_object().map_or(0.0, |m| m.values().filter_map(Value::as_f64).fold(0.0, |a, b| a + b));
    json!({
        "run": label,
        "epoch_s": mean("seconds"),
        "sample_s": mean("sample_s"), "gather_s": mean("gather_s"), "compute_s": mean("compute_s"),
        "comm_s": mean("comm_s"), "update_s": mean("update_s"),
        "mb_per_step": per_step / 1e6,
        "bytes_per_step": r["bytes_per_step"],
        "test_acc": epochs.last().map_or(Value::Null, |e| e["test_acc"].clone()),
        "steps": r["steps"],
    })
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = a.hetgnn.clone().unwrap_or_else(|| root.join("target/release/hetgnn"));
    if !bin.exists() {
        bail!("{} not found: build it first (cargo build --release)", bin.display());
    }
    let data = bench::mag_like(a.scale, 0)?;
    let work = tempfile::tempdir()?;
    let w = work.path();
    let d = data.display().to_string();
    let mut rows = Vec::new();

    eprintln!("single process, {} epochs", a.epochs);
    let one_thread = std::thread::available_parallelism().map_or(1, |n| n.get());
    run(&bin, w, &["train".into(), "--data".into(), d.clone(), "--epochs".into(), a.epochs.to_string(), "--report".into(), "single.json".into()])?;
    let single = serde_json::from_str::<Value>(&std::fs::read_to_string(w.join("single.json"))?)?;
    rows.push(summary(&single, &format!("single ({one_thread} threads)")));

    for method in &a.methods {
        for &k in &a.nodes {
            let parts = root.join(format!("target/bench-data/parts-{method}-{k}-s{}", a.scale));
            if !parts.join("manifest.json").exists() {
                eprintln!("partitioning ({method}, {k} parts)");
                run(&bin, w, &["partition".into(), "--data".into(), d.clone(), "--parts".into(), k.to_string(), "--method".into(), method.clone(), "--out".into(), parts.display().to_string(), "--force".into()])?;
            }
            let ids: Vec<String> = (0..k).map(|i| format!("n{i}")).collect();
            let certs = w.join(format!("certs{k}"));
            if !certs.exists() {
                run(&bin, w, &["certs".into(), "init".into(), "--out".into(), certs.display().to_string(), "--nodes".into(), ids.join(",")])?;
            }
            let mut toml = format!("[cluster]\ncerts_dir = {:?}\n", certs.display().to_string());
            for id in &ids {
                toml += &format!("[[cluster.nodes]]\nid = \"{id}\"\naddr = \"127.0.0.1:{}\"\n", free_port()?);
            }
            let report = format!("dp-{method}-{k}.json");
            toml += &format!(
                "[training]\nmode = \"data-parallel\"\npartitions = {:?}\nepochs = {}\nreport = {report:?}\nallreduce = {:?}\n[links]\nbandwidth = {:?}\ndelay = {{ dist = \"fixed\", ms = {} }}\n",
                parts.display().to_string(),
                a.epochs,
                a.allreduce,
                a.bandwidth,
                a.delay_ms
            );
            std::fs::write(w.join("cluster.toml"), toml)?;
            eprintln!("data-parallel, {method}, {k} node(s), {} epochs", a.epochs);
            run(&bin, w, &["launch".into(), "--config".into(), "cluster.toml".into()])?;
            let r = serde_json::from_str::<Value>(&std::fs::read_to_string(w.join(&report))?)?;
            rows.push(summary(&r, &format!("data-parallel {method} x{k} {}", a.allreduce)));
        }
    }

    println!("mag-like S={}, R-GCN hidden 64, fanouts 25,20, batch 1024; links {} + {} ms", a.scale, a.bandwidth, a.delay_ms);
    println!("{:<28} {:>8} {:>7} {:>7} {:>8} {:>7} {:>7} {:>9} {:>8}", "run", "epoch_s", "sample", "gather", "compute", "comm", "update", "MB/step", "test_acc");
    for r in &rows {
        println!(
            "{:<28} {:>8.2} {:>7.2} {:>7.2} {:>8.2} {:>7.2} {:>7.2} {:>9.2} {:>8.4}",
            r["run"].as_str().unwrap_or(""),
            r["epoch_s"].as_f64().unwrap_or(0.0),
            r["sample_s"].as_f64().unwrap_or(0.0),
            r["gather_s"].as_f64().unwrap_or(0.0),
            r["compute_s"].as_f64().unwrap_or(0.0),
            r["comm_s"].as_f64().unwrap_or(0.0),
            r["update_s"].as_f64().unwrap_or(0.0),
            r["mb_per_step"].as_f64().unwrap_or(0.0),
            r["test_acc"].as_f64().unwrap_or(0.0)
        );
    }
    let base = rows[0]["epoch_s"].as_f64().unwrap_or(1.0);
    for r in &rows[1..] {
        println!("{}: epoch time {:.2}x single process", r["run"].as_str().unwrap_or(""), r["epoch_s"].as_f64().unwrap_or(0.0) / base);
    }
    if let Some(p) = a.out.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&json!({ "scale": a.scale, "epochs": a.epochs, "allreduce": a.allreduce, "bandwidth": a.bandwidth, "delay_ms": a.delay_ms, "runs": rows }))?)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
