//! Traffic against link speed: each distributed mode trained over links of
//! several speeds (node processes on emulated machines), with the bytes per
//! training step by message kind, the requests resent, the failures reported
//! and the epoch time. A step needs the same bytes however slow its links:
//! the check is that bytes per step stay within 1% across the speeds, that
//! nothing is resent, and that no node is reported down.
//!
//! `cargo run --release -p bench --bin links -- --shaping kernel --cpus-per-node 0.5`
//! (root: each node in its own network namespace and CPU share).

use std::path::Path;

use anyhow::Context;
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Mag-like graph scale.
    #[arg(long, default_value_t = 0.01)]
    scale: f64,
    /// Node processes.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Modes to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "data-parallel,raf,hopgnn,full-graph,model-averaging"
    )]
    modes: Vec<String>,
    /// Link speeds, comma-separated (each as `[links] bandwidth` takes it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10Gbit/s,1Gbit/s,200Mbit/s,50Mbit/s,10Mbit/s"
    )]
    speeds: Vec<String>,
    /// Epochs per run.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Mini-batch size (fewer, larger steps keep the slow links' runs short).
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// One-way delay added by the runtime, in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// CPUs per node process (needs root).
    #[arg(long)]
    cpus_per_node: Option<f64>,
    /// Who caps the links.
    #[arg(long, value_enum, default_value = "kernel")]
    shaping: bench::Shaping,
    /// The links' MTU in bytes with kernel shaping (9000: jumbo frames).
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<std::path::PathBuf>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/links.json")]
    out: std::path::PathBuf,
}

/// The partitioning a mode trains on, and its extra `[training]` lines.
fn setup(bin: &Path, data: &Path, mode: &str, k: usize, name: &str) -> anyhow::Result<String> {
    let (method, extra) = match mode {
        "data-parallel" | "hopgnn" => ("metis", ""),
        "raf" => ("meta", ""),
        "full-graph" => ("block-row", ""),
        "model-averaging" => ("spring", "--halo-features"),
        other => anyhow::bail!("unknown mode {other:?}"),
    };
    let parts = bench::data_root().join(format!("parts-{method}{extra}-{k}-{name}"));
    if !parts.join("manifest.json").exists() {
        let mut args = vec!["partition", "--data"];
        let (d, k, out) = (
            data.display().to_string(),
            k.to_string(),
            parts.display().to_string(),
        );
        args.extend([d.as_str(), "--parts", &k, "--method", method]);
        if !extra.is_empty() {
            args.push(extra);
        }
        args.extend(["--out", &out, "--force"]);
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        bench::run_hetgnn(bin, data.parent().unwrap_or(Path::new(".")), &args)?;
    }
    let data_line = if mode == "full-graph" {
        format!("data = {:?}\n", data.display().to_string())
    } else {
        String::new()
    };
    Ok(format!(
        "mode = {mode:?}\n{data_line}partitions = {:?}\n",
        parts.display().to_string()
    ))
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.hetgnn.clone())?;
    let data = bench::mag_like(a.scale, 0)?;
    let name = format!("s{}", a.scale);
    let work = tempfile::tempdir()?;
    let mut rows = Vec::new();
    let mut checks = Vec::new();
    for mode in &a.modes {
        let lines = setup(&bin, &data, mode, a.nodes, &name)?;
        let mut per_speed = Vec::new();
        for speed in &a.speeds {
            let links = bench::Links {
                bandwidth: speed.clone(),
                delay_ms: a.delay_ms,
                cpus_per_node: a.cpus_per_node,
                shaping: a.shaping,
                mtu: a.mtu,
            };
            let report = format!("{mode}-{}.json", speed.replace('/', "_"));
            let training = format!("{lines}epochs = {}\nbatch = {}\n", a.epochs, a.batch);
            eprintln!("{mode} at {speed} ({} nodes)", a.nodes);
            let r = links
                .launch(&bin, work.path(), a.nodes, &training, &report)
                .with_context(|| format!("{mode} at {speed}"))?;
            let per_step: f64 = r["bytes_per_step"]
                .as_object()
                .map_or(0.0, |m| m.values().filter_map(Value::as_f64).sum());
            let row = json!({
                "mode": mode,
                "links": links.describe(),
                "bytes_per_step": per_step,
                "bytes_per_step_by_kind": r["bytes_per_step"],
                "resends": r["resends"],
                "failures": r["failures"].as_array().map_or(0, Vec::len),
                "epoch_s": bench::epoch_mean(&r, "seconds"),
                "model": r["final_model_sha256"],
            });
            println!(
                "{mode:>16} {speed:>10} {:>12.0} B/step  resends {}  failures {}  epoch {:.2} s",
                per_step, row["resends"]["requests"], row["failures"], row["epoch_s"]
            );
            per_speed.push(row.clone());
            rows.push(row);
        }
        let bytes: Vec<f64> = per_speed
            .iter()
            .map(|r| r["bytes_per_step"].as_f64().unwrap_or(0.0))
            .collect();
        let (lo, hi) = bytes
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), &b| (l.min(b), h.max(b)));
        let spread = if lo > 0.0 { hi / lo - 1.0 } else { f64::NAN };
        let resent: u64 = per_speed
            .iter()
            .map(|r| r["resends"]["requests"].as_u64().unwrap_or(0))
            .sum();
        let failures: usize = per_speed
            .iter()
            .map(|r| r["failures"].as_u64().unwrap_or(0) as usize)
            .sum();
        let same_model = per_speed.windows(2).all(|w| w[0]["model"] == w[1]["model"]);
        println!(
            "{mode}: bytes per step spread {:.3}% over the speeds, {resent} resends, {failures} \
             failures, same model at every speed: {same_model}",
            spread * 100.0
        );
        checks.push(json!({
            "mode": mode,
            "bytes_per_step_spread": spread,
            "within_1_percent": spread <= 0.01,
            "resends": resent,
            "failures": failures,
            "same_model": same_model,
        }));
    }
    let doc = json!({
        "graph": format!("mag-like S={}", a.scale),
        "nodes": a.nodes,
        "epochs": a.epochs,
        "batch": a.batch,
        "runs": rows,
        "checks": checks,
    });
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
