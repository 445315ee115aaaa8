//! Partitioners head to head: streaming SPRING and its vertex-cut baselines
//! (HDRF, DBH) against METIS, on mag-like graphs of growing scale, each run as
//! its own `hetgnn partition` process so its peak memory is its own. Figures
//! come from each run's `report.json`: seconds, peak memory (the high-water
//! mark of resident memory), replication factor, edge cut and node balance.
//! With `--memory-cap`, METIS runs under that address-space limit (`ulimit
//! -v`), so a graph it cannot hold fails cleanly instead of meeting the
//! machine's out-of-memory killer.
//!
//! `cargo build --release && cargo run --release -p bench --bin partition
//! [-- --scales 0.5,1,2 --parts 4 --methods spring,metis,hdrf,dbh --memory-cap-gib 20]`
//! prints a table and writes bench/results/partition.json. With `--real
//! DIR,...` it partitions those graphs at `--real-parts` (4, 8, 16) instead
//! (quality only). A method `spring-rN` is SPRING with N restreaming passes.

use std::path::{Path, PathBuf};

use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Scales of the mag-like graph.
    #[arg(long, default_value = "0.5,1", value_delimiter = ',')]
    scales: Vec<f64>,
    /// Partitions.
    #[arg(long, default_value_t = 4)]
    parts: usize,
    /// Methods, each run at every scale.
    #[arg(long, default_value = "spring,metis,hdrf,dbh", value_delimiter = ',')]
    methods: Vec<String>,
    /// Address-space cap for METIS runs, in GiB (0: none).
    #[arg(long, default_value_t = 0.0)]
    memory_cap_gib: f64,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench/results/partition.json")]
    out: PathBuf,
    /// Instead of mag-like scales: these graph directories (the real ones in ../shared/datasets), at `--real-parts`.
    #[arg(long, value_delimiter = ',')]
    real: Vec<PathBuf>,
    /// Partition counts of the `--real` runs.
    #[arg(long, default_value = "4,8,16", value_delimiter = ',')]
    real_parts: Vec<usize>,
}

/// `method` as `hetgnn partition` flags: `spring-rN` is SPRING with N restreaming passes.
fn method_flags(method: &str) -> String {
    match method.strip_prefix("spring-r") {
        Some(n) => format!("--method spring --spring-refine {n}"),
        None => format!("--method {method}"),
    }
}

/// One `hetgnn partition` run: its report, or why it failed.
fn run(
    bin: &Path,
    data: &Path,
    method: &str,
    parts: usize,
    out: &Path,
    cap_gib: f64,
) -> anyhow::Result<Result<Value, String>> {
    let cmd = format!(
        "{} partition --data {:?} --parts {parts} {} --out {:?} --force",
        bin.display(),
        data.display().to_string(),
        method_flags(method),
        out.display().to_string()
    );
    let limited = if cap_gib > 0.0 {
        format!(
            "ulimit -v {}; exec {cmd}",
            (cap_gib * 1024.0 * 1024.0) as u64
        )
    } else {
        format!("exec {cmd}")
    };
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(&limited)
        .output()?;
    if !o.status.success() {
        let why = String::from_utf8_lossy(&o.stderr)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message")
            .to_string();
        return Ok(Err(format!("exit {:?}: {why}", o.status.code())));
    }
    Ok(Ok(serde_json::from_slice(&std::fs::read(
        out.join("report.json"),
    )?)?))
}

/// Largest over mean of the nodes each partition of `out` owns.
fn node_balance(out: &Path) -> anyhow::Result<f64> {
    let m: Value = serde_json::from_slice(&std::fs::read(out.join("manifest.json"))?)?;
    let core: Vec<u64> = m["info"].as_array().map_or(Vec::new(), |a| {
        a.iter()
            .map(|p| {
                p["core"]
                    .as_array()
                    .map_or(0, |c| c.iter().filter_map(Value::as_u64).sum())
            })
            .collect()
    });
    Ok(*core.iter().max().unwrap_or(&0) as f64 * core.len() as f64
        / core.iter().sum::<u64>().max(1) as f64)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = bench::hetgnn_bin(args.hetgnn.clone())?;
    let mut rows = Vec::new();
    if !args.real.is_empty() {
        println!(
            "{:<16} {:>5} {:>10} {:>8} {:>9} {:>9}",
            "graph", "parts", "method", "repl.", "cut %", "nodes bal"
        );
        for data in &args.real {
            let name = data
                .file_name()
                .map_or("graph".into(), |n| n.to_string_lossy().to_string());
            for &k in &args.real_parts {
                for method in &args.methods {
                    let out = bench::data_root().join(format!("bench-parts-{method}-{k}-{name}"));
                    match run(&bin, data, method, k, &out, 0.0)? {
                        Ok(r) => {
                            let cut = 100.0 * r["edge_cut"].as_f64().unwrap_or(0.0)
                                / r["total_edges"].as_f64().unwrap_or(1.0).max(1.0);
                            let nb = node_balance(&out)?;
                            println!(
                                "{name:<16} {k:>5} {method:>10} {:>8.3} {cut:>9.1} {nb:>9.3}",
                                r["replication_factor"].as_f64().unwrap_or(0.0)
                            );
                            rows.push(json!({ "graph": name, "method": method, "parts": k, "replication_factor": r["replication_factor"], "edge_cut_percent": cut, "node_balance": nb, "balance": r["balance"] }));
                            let _ = std::fs::remove_dir_all(&out);
                        }
                        Err(why) => println!("{name:<16} {k:>5} {method:>10} failed ({why})"),
                    }
                }
            }
        }
        std::fs::write(
            &args.out,
            serde_json::to_string_pretty(&json!({ "runs": rows }))? + "\n",
        )?;
        println!("wrote {}", args.out.display());
        return Ok(());
    }
    println!(
        "{:>6} {:>8} {:>9} {:>10} {:>8} {:>9} {:>9}",
        "scale", "method", "seconds", "peak MiB", "repl.", "cut %", "nodes bal"
    );
    for &scale in &args.scales {
        let data = bench::mag_like(scale, 0)?;
        let mut peaks = std::collections::BTreeMap::new();
        for method in &args.methods {
            let out =
                bench::data_root().join(format!("bench-parts-{method}-{}-s{scale}", args.parts));
            let cap = if method == "metis" {
                args.memory_cap_gib
            } else {
                0.0
            };
            match run(&bin, &data, method, args.parts, &out, cap)? {
                Ok(r) => {
                    let peak = r["peak_memory_bytes"].as_u64().unwrap_or(0);
                    peaks.insert(method.clone(), peak);
                    let node_balance = node_balance(&out)?;
                    let cut = 100.0 * r["edge_cut"].as_f64().unwrap_or(0.0)
                        / r["total_edges"].as_f64().unwrap_or(1.0).max(1.0);
                    println!(
                        "{scale:>6} {method:>8} {:>9.1} {:>10.0} {:>8.3} {cut:>9.1} {node_balance:>9.3}",
                        r["seconds"].as_f64().unwrap_or(0.0),
                        peak as f64 / (1 << 20) as f64,
                        r["replication_factor"].as_f64().unwrap_or(0.0)
                    );
                    rows.push(json!({ "scale": scale, "method": method, "parts": args.parts, "seconds": r["seconds"], "peak_memory_bytes": peak,
                        "replication_factor": r["replication_factor"], "edge_cut_percent": cut, "node_balance": node_balance, "balance": r["balance"] }));
                    let _ = std::fs::remove_dir_all(&out);
                }
                Err(why) => {
                    println!("{scale:>6} {method:>8} failed ({why})");
                    rows.push(json!({ "scale": scale, "method": method, "parts": args.parts, "failed": why, "memory_cap_gib": cap }));
                }
            }
        }
        if let (Some(s), Some(m)) = (peaks.get("spring"), peaks.get("metis")) {
            println!(
                "{scale:>6} spring peak memory {:.3}x METIS's",
                *s as f64 / (*m).max(1) as f64
            );
        }
    }
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        &args.out,
        serde_json::to_string_pretty(&json!({ "runs": rows }))? + "\n",
    )?;
    println!("wrote {}", args.out.display());
    Ok(())
}
