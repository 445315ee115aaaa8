//! Distributed training on 1, 2 and 4 nodes of one machine, as separate
//! processes over QUIC on loopback, with every link shaped by the runtime
//! (default 10 Gbit/s and 0.1 ms): Heta's relation-aggregation-first
//! training on meta-partitions (`meta`) against the DistDGL baseline,
//! data-parallel on METIS or random partitions. Epoch time and its split,
//! bytes per training step by message kind, and accuracy, next to
//! single-process training measured in the same run, for each hidden width
//! asked for.
//!
//! `cargo build --release && cargo run --release -p bench --bin distributed
//! [-- --scale 0.05 --nodes 2,4 --methods meta,metis,random --hidden 64,256,1024 --epochs 2]`
//! prints a table and writes bench/results/distributed.json.

use std::path::PathBuf;

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
    /// Partitioners: meta (trains raf, embedding tables synced), meta-local
    /// (raf, each worker its own tables), metis and random (data-parallel).
    #[arg(
        long,
        default_value = "meta,meta-local,metis,random",
        value_delimiter = ','
    )]
    methods: Vec<String>,
    /// Model.
    #[arg(long, default_value = "rgcn")]
    model: String,
    /// Hidden widths to sweep.
    #[arg(long, default_value = "64", value_delimiter = ',')]
    hidden: Vec<usize>,
    /// Epochs per run (figures are means over them).
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    #[command(flatten)]
    links: bench::Links,
    /// Gradient all-reduce: all-gather or ring.
    #[arg(long, default_value = "all-gather")]
    allreduce: String,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/distributed.json")]
    out: PathBuf,
}

fn summary(r: &Value, label: &str) -> Value {
    let epochs = r["epochs"].as_array().cloned().unwrap_or_default();
    let mean = |k: &str| bench::epoch_mean(r, k);
    let per_step: f64 = r["bytes_per_step"].as_object().map_or(0.0, |m| {
        m.values().filter_map(Value::as_f64).fold(0.0, |a, b| a + b)
    });
    json!({
        "run": label,
        "epoch_s": mean("seconds"),
        "sample_s": mean("sample_s"), "gather_s": mean("gather_s"), "compute_s": mean("compute_s"),
        "comm_s": mean("comm_s"), "update_s": mean("update_s"),
        "mb_per_step": per_step / 1e6,
        "bytes_per_step": r["bytes_per_step"],
        "test_acc": epochs.last().map_or(Value::Null, |e| e["test_acc"].clone()),
        "steps": r["steps"],
        // The single process's own peak, or each emulated machine's (GNU time).
        "peak_mb": r["peak_memory_bytes"].as_f64().map(|b| b / 1048576.0),
        "node_peak_mb": r["node_peak_rss_bytes"].as_array().map(|v| {
            v.iter().map(|b| b.as_f64().map(|b| b / 1048576.0)).collect::<Vec<_>>()
        }),
    })
}

/// A run's peak memory in MiB: the largest machine's, else the process's own.
fn peak(r: &Value) -> f64 {
    let nodes = r["node_peak_mb"].as_array().into_iter().flatten();
    let max = nodes.filter_map(Value::as_f64).fold(f64::NAN, f64::max);
    if max.is_nan() {
        r["peak_mb"].as_f64().unwrap_or(f64::NAN)
    } else {
        max
    }
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.hetgnn.clone())?;
    let data = bench::mag_like(a.scale, 0)?;
    let work = tempfile::tempdir()?;
    let w = work.path();
    let d = data.display().to_string();
    let mut rows = Vec::new();

    let one_thread = std::thread::available_parallelism().map_or(1, |n| n.get());
    for &hidden in &a.hidden {
        let common = |report: &str| -> Vec<String> {
            [
                "--epochs",
                &a.epochs.to_string(),
                "--report",
                report,
                "--model",
                &a.model,
                "--hidden",
                &hidden.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        eprintln!(
            "single process, {} hidden {hidden}, {} epochs",
            a.model, a.epochs
        );
        let mut args: Vec<String> =
            vec!["train".into(), "--force".into(), "--data".into(), d.clone()];
        args.extend(common("single.json"));
        bench::run_hetgnn(&bin, w, &args)?;
        let single =
            serde_json::from_str::<Value>(&std::fs::read_to_string(w.join("single.json"))?)?;
        rows.push(summary(
            &single,
            &format!("single h{hidden} ({one_thread} thr)"),
        ));
        for method in &a.methods {
            for &k in &a.nodes {
                let (partitioner, local) = match method.as_str() {
                    "meta-local" => ("meta", true),
                    m => (m, false),
                };
                let parts = bench::partitions(&bin, &data, partitioner, k, a.scale)?;
                let mode = if partitioner == "meta" {
                    "raf"
                } else {
                    "data-parallel"
                };
                let report = format!("{mode}-{method}-{k}-h{hidden}.json");
                // Only raf takes raf's keys (the configuration refuses them elsewhere).
                let raf = if mode == "raf" {
                    format!(
                        "raf.embeddings = {:?}\n",
                        if local { "local" } else { "synced" }
                    )
                } else {
                    String::new()
                };
                let training = format!(
                    "mode = {mode:?}\npartitions = {:?}\nepochs = {}\nallreduce = {:?}\nmodel = {:?}\nhidden = {hidden}\n{raf}",
                    parts.display().to_string(),
                    a.epochs,
                    a.allreduce,
                    a.model,
                );
                eprintln!(
                    "{mode}, {method}, {k} node(s), hidden {hidden}, {} epochs",
                    a.epochs
                );
                let r = a.links.launch(&bin, w, k, &training, &report)?;
                let label = if mode == "raf" {
                    format!("raf {method} x{k} h{hidden}")
                } else {
                    format!("dp {method} x{k} h{hidden}")
                };
                rows.push(summary(&r, &label));
            }
        }
    }

    println!(
        "mag-like S={}, {}, fanouts 25,20, batch 1024; links {} + {} ms",
        a.scale, a.model, a.links.bandwidth, a.links.delay_ms
    );
    println!(
        "{:<30} {:>8} {:>7} {:>7} {:>8} {:>7} {:>7} {:>9} {:>8} {:>9}",
        "run",
        "epoch_s",
        "sample",
        "gather",
        "compute",
        "comm",
        "update",
        "MB/step",
        "test_acc",
        "peak MiB"
    );
    for r in &rows {
        println!(
            "{:<30} {:>8.2} {:>7.2} {:>7.2} {:>8.2} {:>7.2} {:>7.2} {:>9.2} {:>8.4} {:>9.0}",
            r["run"].as_str().unwrap_or(""),
            r["epoch_s"].as_f64().unwrap_or(0.0),
            r["sample_s"].as_f64().unwrap_or(0.0),
            r["gather_s"].as_f64().unwrap_or(0.0),
            r["compute_s"].as_f64().unwrap_or(0.0),
            r["comm_s"].as_f64().unwrap_or(0.0),
            r["update_s"].as_f64().unwrap_or(0.0),
            r["mb_per_step"].as_f64().unwrap_or(0.0),
            r["test_acc"].as_f64().unwrap_or(0.0),
            peak(r)
        );
    }
    // Ratios against the run of the same width and node count: raf vs data-parallel METIS.
    let find = |label: &str| rows.iter().find(|r| r["run"] == label);
    for &hidden in &a.hidden {
        for &k in &a.nodes {
            for variant in ["meta", "meta-local"] {
                if let (Some(raf), Some(dp)) = (
                    find(&format!("raf {variant} x{k} h{hidden}")),
                    find(&format!("dp metis x{k} h{hidden}")),
                ) {
                    let f = |r: &Value, key: &str| r[key].as_f64().unwrap_or(0.0);
                    println!(
                        "hidden {hidden}, {k} nodes: raf ({variant}) moves {:.1}x fewer bytes per step than data-parallel METIS ({:.2} vs {:.2} MB); epoch time {:.2}x of it",
                        f(dp, "mb_per_step") / f(raf, "mb_per_step").max(1e-9),
                        f(raf, "mb_per_step"),
                        f(dp, "mb_per_step"),
                        f(raf, "epoch_s") / f(dp, "epoch_s").max(1e-9)
                    );
                }
            }
        }
    }
    if let Some(p) = a.out.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(
        &a.out,
        serde_json::to_string_pretty(
            &json!({ "scale": a.scale, "model": a.model, "hidden": a.hidden, "epochs": a.epochs, "allreduce": a.allreduce, "bandwidth": a.links.bandwidth, "delay_ms": a.links.delay_ms, "emulation": a.links.describe(), "runs": rows }),
        )?,
    )?;
    println!("wrote {}", a.out.display());
    Ok(())
}
