//! ByteGNN's DAG sampling against today's pipeline, as node processes over
//! QUIC on loopback with every link shaped by the runtime (default 10 Gbit/s
//! and 0.1 ms), data-parallel on the same METIS partitions, measured in the
//! same run:
//!
//! - `pipeline-sink` / `dag-sink`: the trainers drop every batch
//!   (`sampling_sink = true`), so an epoch is sampling and fetching alone:
//!   batches per second = steps / epoch seconds;
//! - `pipeline` / `dag`: end to end; the trainer's wait share is its time
//!   between a step's end and the next batch over the epoch, and both must
//!   end with the same model bits.
//!
//! `cargo build --release && cargo run --release -p bench --bin bytegnn
//! [-- --graph mag-0.05 --nodes 2,4 --epochs 2 --repeat 2]` prints a table
//! and writes bench/results/bytegnn-<graph>.json.

use std::path::PathBuf;

use anyhow::bail;
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// `mag-S` (mag-like at scale S).
    #[arg(long, default_value = "mag-0.05")]
    graph: String,
    /// Node counts to run.
    #[arg(long, default_value = "2,4", value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Runs: pipeline-sink, dag-sink, pipeline, dag.
    #[arg(
        long,
        default_value = "pipeline-sink,dag-sink,pipeline,dag",
        value_delimiter = ','
    )]
    runs: Vec<String>,
    /// Epochs per run (figures are means over them).
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Each run this many times, interleaved (the machine is noisy: ranges are printed).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Untimed 1-epoch runs per node count before the timed ones: the first
    /// launch after building reads the graph and binary cold and was up to
    /// 2x slower, which flattered whichever run came second.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Seed nodes per step.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Extra `[training]` lines for the dag runs (e.g. "data-parallel.dag_max_in_flight = 4").
    #[arg(long, default_value = "")]
    dag: String,
    #[command(flatten)]
    links: bench::Links,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON figures (default bench/results/bytegnn-<graph>.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

fn summary(r: &Value, run: &str, k: usize) -> Value {
    let mean = |key: &str| bench::epoch_mean(r, key);
    let epochs = r["epochs"].as_array().cloned().unwrap_or_default();
    let steps_per_epoch = r["steps"].as_f64().unwrap_or(0.0) / epochs.len().max(1) as f64;
    let seconds = mean("seconds");
    json!({
        "run": run, "nodes": k,
        "epoch_s": seconds,
        "batches_per_s": steps_per_epoch / seconds.max(1e-12),
        "wait_share": mean("wait_s") / seconds.max(1e-12),
        "cpu_util": mean("cpu_util"),
        "sample_s": mean("sample_s"), "gather_s": mean("gather_s"), "compute_s": mean("compute_s"), "comm_s": mean("comm_s"),
        "sampling": epochs.last().map_or(Value::Null, |e| e["sampling"].clone()),
        "bytes_per_step": r["bytes_per_step"],
        "model": r["final_model_sha256"],
        "test_acc": epochs.last().map_or(Value::Null, |e| e["test_acc"].clone()),
    })
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.hetgnn.clone())?;
    let Some(scale) = a.graph.strip_prefix("mag-") else {
        bail!("--graph {}: expected mag-SCALE", a.graph)
    };
    let data = bench::mag_like(scale.parse()?, 0)?;
    let work = tempfile::tempdir()?;
    let w = work.path();
    let mut rows = Vec::new();
    for &k in &a.nodes {
        let parts = bench::partitions_named(&bin, &data, "metis", k, &a.graph)?;
        for i in 0..a.warmup {
            eprintln!("warm-up {i}, {k} nodes, 1 epoch (not counted)");
            let training = format!("mode = \"data-parallel\"\ndata-parallel.sampling_sink = true\npartitions = {:?}\nepochs = 1\nbatch = {}\n", parts.display().to_string(), a.batch);
            a.links
                .launch(&bin, w, k, &training, &format!("warmup-{k}-{i}.json"))?;
        }
        for rep in 0..a.repeat {
            for run in &a.runs {
                let mut extra = match run.as_str() {
                    "pipeline" => String::new(),
                    "dag" => format!("data-parallel.sampling = \"dag\"\n{}\n", a.dag),
                    "pipeline-sink" => "data-parallel.sampling_sink = true\n".into(),
                    "dag-sink" => format!("data-parallel.sampling = \"dag\"\ndata-parallel.sampling_sink = true\n{}\n", a.dag),
                    other => {
                        bail!("--runs {other}: expected pipeline, dag, pipeline-sink or dag-sink")
                    }
                };
                extra = extra.replace("\\n", "\n");
                let training = format!(
                    "mode = \"data-parallel\"\n{extra}partitions = {:?}\nepochs = {}\nbatch = {}\n",
                    parts.display().to_string(),
                    a.epochs,
                    a.batch
                );
                eprintln!("{run}, {k} nodes, repeat {rep}, {} epochs", a.epochs);
                let r = a
                    .links
                    .launch(&bin, w, k, &training, &format!("{run}-{k}-{rep}.json"))?;
                rows.push(summary(&r, run, k));
            }
        }
    }

    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "{}, batch {}, METIS partitions, default fanouts; links {} + {} ms; {cores} cores",
        a.graph, a.batch, a.links.bandwidth, a.links.delay_ms
    );
    println!(
        "{:<15} {:>5} {:>8} {:>9} {:>7} {:>6} {:>8} {:>8} {:>9}",
        "run", "nodes", "epoch_s", "batches/s", "wait %", "cpu %", "in-fl", "queued", "test_acc"
    );
    let f = |r: &Value, key: &str| r[key].as_f64().unwrap_or(0.0);
    for r in &rows {
        println!(
            "{:<15} {:>5} {:>8.2} {:>9.2} {:>7.1} {:>6.1} {:>8.2} {:>8.2} {:>9.4}",
            r["run"].as_str().unwrap_or(""),
            f(r, "nodes"),
            f(r, "epoch_s"),
            f(r, "batches_per_s"),
            100.0 * f(r, "wait_share"),
            100.0 * f(r, "cpu_util"),
            r["sampling"]["in_flight_mean"].as_f64().unwrap_or(0.0),
            r["sampling"]["queued_mean"].as_f64().unwrap_or(0.0),
            f(r, "test_acc")
        );
    }
    // Ratios per node count, over the repeats: min..max of each pairing.
    let of = |run: &str, k: usize, key: &str| -> Vec<f64> {
        rows.iter()
            .filter(|r| r["run"] == run && r["nodes"] == k)
            .map(|r| f(r, key))
            .collect()
    };
    let range = |v: &[f64]| {
        (
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    };
    let mut checks = Vec::new();
    for &k in &a.nodes {
        let mut check = json!({ "nodes": k });
        let (ps, ds) = (
            of("pipeline-sink", k, "batches_per_s"),
            of("dag-sink", k, "batches_per_s"),
        );
        if !ps.is_empty() && ps.len() == ds.len() {
            let r: Vec<f64> = ds.iter().zip(&ps).map(|(d, p)| d / p.max(1e-12)).collect();
            let (lo, hi) = range(&r);
            println!("{k} nodes: sampling alone, dag {lo:.2}-{hi:.2}x the pipeline's batches per second (target >= 1.5)");
            check["sampling_speedup"] = json!([lo, hi]);
        }
        let (pe, de) = (of("pipeline", k, "epoch_s"), of("dag", k, "epoch_s"));
        if !pe.is_empty() && pe.len() == de.len() {
            let r: Vec<f64> = de.iter().zip(&pe).map(|(d, p)| d / p.max(1e-12)).collect();
            let (lo, hi) = range(&r);
            let (wlo, whi) = range(&of("dag", k, "wait_share"));
            let (plo, phi) = range(&of("pipeline", k, "wait_share"));
            let same = rows
                .iter()
                .filter(|r| r["nodes"] == k && (r["run"] == "pipeline" || r["run"] == "dag"))
                .map(|r| r["model"].as_str().unwrap_or("").to_string())
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                == 1;
            println!(
                "{k} nodes: end to end, dag epoch {lo:.2}-{hi:.2}x the pipeline's (target <= 0.85); trainer waiting {:.1}-{:.1}% of the epoch (pipeline {:.1}-{:.1}%; target <= 5%); same model: {same}",
                100.0 * wlo,
                100.0 * whi,
                100.0 * plo,
                100.0 * phi
            );
            check["epoch_ratio"] = json!([lo, hi]);
            check["dag_wait_share"] = json!([wlo, whi]);
            check["pipeline_wait_share"] = json!([plo, phi]);
            check["same_model"] = json!(same);
        }
        checks.push(check);
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench/results/bytegnn-{}.json", a.graph)));
    if let Some(p) = out.parent() {
        std::fs::create_dir_all(p)?;
    }
    let doc = json!({ "graph": a.graph, "cores": cores, "warmup": a.warmup, "batch": a.batch, "epochs": a.epochs, "repeat": a.repeat, "dag": a.dag, "bandwidth": a.links.bandwidth, "delay_ms": a.links.delay_ms, "emulation": a.links.describe(), "runs": rows, "checks": checks });
    std::fs::write(&out, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", out.display());
    Ok(())
}
