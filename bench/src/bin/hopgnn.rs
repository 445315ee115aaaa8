//! HopGNN against its baselines, as node processes over QUIC on loopback
//! with every link shaped by the runtime (default 10 Gbit/s and 0.1 ms), all
//! on the same METIS partitions and measured in the same run:
//!
//! - `random`: data-parallel with `seed_assignment = "random"` (trainer k
//!   takes slice k of the batch wherever its seeds live: the paper's
//!   model-centric baseline);
//! - `owner`: today's owner-compute data-parallel training;
//! - `hop`: `mode = "hopgnn"` (models migrate with their parameters), and
//!   `hop-grad` (the gradient only), `hop-merged` (one time step fewer) and
//!   `hop-auto` (the examination period picks the time steps; run it with 5
//!   or more epochs: its `settled_s` is the mean epoch after it settled).
//!
//! Per run: epoch time and its split, bytes per step by message kind (feature
//! rows travel as `pull`), HopGNN's micrograph locality R_micro and rows
//! pulled with and without pre-gathering; then the paper's bound: HopGNN's
//! pull bytes against (1 - R_micro) / (1 - 1/N) of the baseline's.
//! Epoch times are compared over every epoch but the first (warm-up), and
//! hop-auto's over the epochs after its examination period settled.
//!
//! `cargo build --release && cargo run --release -p bench --bin hopgnn
//! [-- --graph mag-0.05 --nodes 2,4 --hidden 64,256,1024 --epochs 2 --repeat 1]`
//! (`--repeat R`: R interleaved rounds of every run; each ratio is taken
//! within a round and printed as its range over the rounds)
//! (`--graph heco-acm` for the shared dataset) prints a table and writes
//! bench/results/hopgnn-<graph>.json.

use std::path::PathBuf;

use anyhow::bail;
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// `mag-S` (mag-like at scale S) or `heco-acm` (from the shared datasets).
    #[arg(long, default_value = "mag-0.05")]
    graph: String,
    /// Where the heco-acm graph is.
    #[arg(long, default_value = "../shared/datasets/heco-acm")]
    acm: PathBuf,
    /// Node counts to run.
    #[arg(long, default_value = "2,4", value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Hidden widths to sweep.
    #[arg(long, default_value = "64", value_delimiter = ',')]
    hidden: Vec<usize>,
    /// Runs: random, owner, hop, hop-grad, hop-merged, hop-auto.
    #[arg(
        long,
        default_value = "random,owner,hop,hop-grad,hop-merged",
        value_delimiter = ','
    )]
    runs: Vec<String>,
    /// Epochs per run (figures are means over them).
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Rounds of every run, interleaved (ratios are taken within a round and
    /// given as ranges: this machine's timings drift between runs).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Seed nodes per step.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    #[command(flatten)]
    links: bench::Links,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON figures (default bench/results/hopgnn-<graph>.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

fn summary(r: &Value, label: &str) -> Value {
    let epochs = r["epochs"].as_array().cloned().unwrap_or_default();
    let mean = |k: &str| bench::epoch_mean(r, k);
    // A kind's bytes both ways: the requests and their replies (feature rows come back as `pull.reply`).
    let kind = |k: &str| {
        r["bytes_per_step"][k].as_f64().unwrap_or(0.0)
            + r["bytes_per_step"][format!("{k}.reply")]
                .as_f64()
                .unwrap_or(0.0)
    };
    let per_step: f64 = r["bytes_per_step"]
        .as_object()
        .map_or(0.0, |m| m.values().filter_map(Value::as_f64).sum());
    let hop = epochs.last().map_or(Value::Null, |e| e["hop"].clone());
    let seconds = |from: usize| {
        let s: Vec<f64> = epochs
            .iter()
            .skip(from)
            .filter_map(|e| e["seconds"].as_f64())
            .collect();
        if s.is_empty() {
            Value::Null
        } else {
            json!(s.iter().sum::<f64>() / s.len() as f64)
        }
    };
    // hop-auto: the epochs after the last one the examination period measured.
    let measured = epochs
        .iter()
        .rposition(|e| !e["hop"]["examined_s"].is_null());
    let time_steps: Vec<Value> = epochs
        .iter()
        .map(|e| e["hop"]["time_steps"].clone())
        .collect();
    json!({
        "run": label,
        "epoch_s": mean("seconds"),
        "sample_s": mean("sample_s"), "gather_s": mean("gather_s"), "compute_s": mean("compute_s"),
        "comm_s": mean("comm_s"), "update_s": mean("update_s"),
        "mb_per_step": per_step / 1e6,
        "pull_mb_per_step": kind("pull") / 1e6,
        "migrate_mb_per_step": kind("migrate") / 1e6,
        // Input rows pulled from other partitions (the paper's bound is on rows:
        // bytes per row differ by type once bag-of-words rows travel as their non-zeros).
        "remote_rows_per_step": mean("remote_rows_per_step"),
        "bytes_per_step": r["bytes_per_step"],
        "hop": hop,
        "time_steps_per_epoch": time_steps,
        // Every epoch but the first (connections, allocator warm-up).
        "steady_s": seconds(usize::from(epochs.len() > 1)),
        "settled_s": measured.map_or(Value::Null, |m| seconds(m + 1)),
        "test_acc": epochs.last().map_or(Value::Null, |e| e["test_acc"].clone()),
        "steps": r["steps"],
    })
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.hetgnn.clone())?;
    let data = match a.graph.strip_prefix("mag-") {
        Some(s) => bench::mag_like(s.parse()?, 0)?,
        None if a.graph == "heco-acm" => std::fs::canonicalize(&a.acm)?,
        None => bail!("--graph {}: expected mag-SCALE or heco-acm", a.graph),
    };
    let work = tempfile::tempdir()?;
    let w = work.path();
    let mut rows = Vec::new();
    for &k in &a.nodes {
        let parts = bench::partitions_named(&bin, &data, "metis", k, &a.graph)?;
        for &hidden in &a.hidden {
            for (rep, run) in (0..a.repeat).flat_map(|rep| a.runs.iter().map(move |r| (rep, r))) {
                let mode = match run.as_str() {
                    "random" => "mode = \"data-parallel\"\ndata-parallel.seed_assignment = \"random\"\n".to_string(),
                    "owner" => "mode = \"data-parallel\"\n".to_string(),
                    "hop" => "mode = \"hopgnn\"\n".to_string(),
                    "hop-grad" => "mode = \"hopgnn\"\nhopgnn.migrate = \"gradient\"\n".to_string(),
                    "hop-merged" => format!("mode = \"hopgnn\"\nhopgnn.time_steps = {}\n", (k - 1).max(1)),
                    "hop-auto" => "mode = \"hopgnn\"\nhopgnn.time_steps = \"auto\"\n".to_string(),
                    other => bail!("--runs {other}: expected random, owner, hop, hop-grad, hop-merged or hop-auto"),
                };
                let training = format!(
                    "{mode}partitions = {:?}\nepochs = {}\nbatch = {}\nhidden = {hidden}\n",
                    parts.display().to_string(),
                    a.epochs,
                    a.batch
                );
                eprintln!(
                    "{run}, {k} nodes, hidden {hidden}, round {rep}, {} epochs",
                    a.epochs
                );
                let r = a.links.launch(
                    &bin,
                    w,
                    k,
                    &training,
                    &format!("{run}-{k}-h{hidden}-{rep}.json"),
                )?;
                let mut row = summary(&r, &format!("{run} x{k} h{hidden}"));
                row["round"] = json!(rep);
                rows.push(row);
            }
        }
    }

    println!(
        "{}, fanouts 25,20, batch {}, METIS partitions; links {} + {} ms",
        a.graph, a.batch, a.links.bandwidth, a.links.delay_ms
    );
    println!(
        "{:<22} {:>8} {:>8} {:>7} {:>7} {:>8} {:>7} {:>9} {:>8} {:>9} {:>8} {:>7} {:>8}",
        "run",
        "epoch_s",
        "steady_s",
        "sample",
        "gather",
        "compute",
        "comm",
        "MB/step",
        "pull MB",
        "rows/step",
        "migr MB",
        "R_micro",
        "test_acc"
    );
    let f = |r: &Value, key: &str| r[key].as_f64().unwrap_or(0.0);
    for r in &rows {
        let r_micro = 1.0 - r["hop"]["remote_row_rate"].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<22} {:>8.2} {:>8.2} {:>7.2} {:>7.2} {:>8.2} {:>7.2} {:>9.2} {:>8.2} {:>9.0} {:>8.2} {:>7.3} {:>8.4}",
            format!("{}{}", r["run"].as_str().unwrap_or(""), if a.repeat > 1 { format!(" #{}", r["round"]) } else { String::new() }),
            f(r, "epoch_s"),
            f(r, "steady_s"),
            f(r, "sample_s"),
            f(r, "gather_s"),
            f(r, "compute_s"),
            f(r, "comm_s"),
            f(r, "mb_per_step"),
            f(r, "pull_mb_per_step"),
            f(r, "remote_rows_per_step"),
            f(r, "migrate_mb_per_step"),
            r_micro,
            f(r, "test_acc")
        );
    }
    // Micrograph locality per node type (the paper's Table 1), from each node count's hop run.
    for r in rows
        .iter()
        .filter(|r| r["run"].as_str().is_some_and(|l| l.starts_with("hop x")))
    {
        if let Some(loc) = r["hop"]["locality"].as_object() {
            let per: Vec<String> = loc
                .iter()
                .map(|(k, v)| format!("{k} {:.3}", v.as_f64().unwrap_or(0.0)))
                .collect();
            println!(
                "{}: micrograph locality per node type: {}",
                r["run"].as_str().unwrap_or(""),
                per.join(", ")
            );
        }
    }
    for r in rows
        .iter()
        .filter(|r| r["run"].as_str().is_some_and(|l| l.starts_with("hop-auto")))
    {
        let steps: Vec<String> = r["time_steps_per_epoch"]
            .as_array()
            .map_or(Vec::new(), |v| v.iter().map(|t| t.to_string()).collect());
        let settled = r["settled_s"]
            .as_f64()
            .map_or("not settled: give more epochs".to_string(), |t| {
                format!("{t:.2} s per epoch once settled")
            });
        println!(
            "{}: time steps per epoch {}; {settled}",
            r["run"].as_str().unwrap_or(""),
            steps.join(" ")
        );
    }
    let find =
        |label: &str, rep: usize| rows.iter().find(|r| r["run"] == label && r["round"] == rep);
    // Epoch times compared: every epoch but the first; hop-auto's once settled.
    let time = |r: &Value| {
        r["settled_s"]
            .as_f64()
            .or(r["steady_s"].as_f64())
            .unwrap_or(f64::NAN)
    };
    let mut checks = Vec::new();
    for &k in &a.nodes {
        for (hidden, rep) in a
            .hidden
            .iter()
            .flat_map(|&h| (0..a.repeat).map(move |rep| (h, rep)))
        {
            let run = |v: &str| find(&format!("{v} x{k} h{hidden}"), rep);
            let mut check = json!({ "nodes": k, "hidden": hidden, "round": rep });
            if let (Some(hop), Some(random)) = (run("hop"), run("random")) {
                let r_micro = 1.0 - hop["hop"]["remote_row_rate"].as_f64().unwrap_or(1.0);
                let bound = (1.0 - r_micro) / (1.0 - 1.0 / k as f64);
                let ratio =
                    f(hop, "remote_rows_per_step") / f(random, "remote_rows_per_step").max(1e-12);
                let bytes = f(hop, "pull_mb_per_step") / f(random, "pull_mb_per_step").max(1e-12);
                let t = time(hop) / time(random);
                println!(
                    "{k} nodes, hidden {hidden}: hopgnn pulls {ratio:.3}x the model-centric baseline's remote input rows (bound (1 - R_micro)/(1 - 1/N) = {bound:.3}, R_micro {r_micro:.3}; {bytes:.3}x its pull bytes); epoch time {t:.2}x of it"
                );
                check["r_micro"] = json!(r_micro);
                check["pull_ratio_vs_random"] = json!(ratio);
                check["pull_bytes_ratio_vs_random"] = json!(bytes);
                check["bound"] = json!(bound);
                check["epoch_ratio_vs_random"] = json!(t);
            }
            if let (Some(hop), Some(owner)) = (run("hop"), run("owner")) {
                let t = time(hop) / time(owner);
                println!(
                    "{k} nodes, hidden {hidden}: against owner-compute data-parallel, hopgnn's epoch time is {t:.2}x; it adds {:.2} MB/step of migration and pulls {:.2} vs {:.2} MB/step",
                    f(hop, "migrate_mb_per_step"),
                    f(hop, "pull_mb_per_step"),
                    f(owner, "pull_mb_per_step")
                );
                check["epoch_ratio_vs_owner"] = json!(t);
            }
            if let Some(auto) = run("hop-auto") {
                let steps = auto["time_steps_per_epoch"]
                    .as_array()
                    .and_then(|v| v.last())
                    .cloned()
                    .unwrap_or(Value::Null);
                let vs = |v: &str| run(v).map(|r| time(auto) / time(r));
                let say = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}x"));
                println!(
                    "{k} nodes, hidden {hidden}: hop-auto settled at {steps} time steps, {:.2} s per epoch: {} the model-centric baseline's, {} owner-compute's",
                    time(auto),
                    say(vs("random")),
                    say(vs("owner"))
                );
                check["auto_time_steps"] = steps;
                check["auto_epoch_ratio_vs_random"] = json!(vs("random"));
                check["auto_epoch_ratio_vs_owner"] = json!(vs("owner"));
            }
            let best = ["hop", "hop-grad", "hop-merged", "hop-auto"]
                .iter()
                .filter_map(|v| run(v))
                .map(time)
                .fold(f64::INFINITY, f64::min);
            if let Some(owner) = run("owner").filter(|_| best.is_finite()) {
                check["best_epoch_ratio_vs_owner"] = json!(best / time(owner));
            }
            checks.push(check);
        }
    }
    // Each ratio's range over the rounds.
    if a.repeat > 1 {
        for &k in &a.nodes {
            for &hidden in &a.hidden {
                let mine: Vec<&Value> = checks
                    .iter()
                    .filter(|c| c["nodes"] == k && c["hidden"] == hidden)
                    .collect();
                for key in [
                    "epoch_ratio_vs_random",
                    "epoch_ratio_vs_owner",
                    "auto_epoch_ratio_vs_random",
                    "auto_epoch_ratio_vs_owner",
                    "best_epoch_ratio_vs_owner",
                ] {
                    let v: Vec<f64> = mine.iter().filter_map(|c| c[key].as_f64()).collect();
                    if !v.is_empty() {
                        let (lo, hi) = v
                            .iter()
                            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                                (lo.min(x), hi.max(x))
                            });
                        println!(
                            "{k} nodes, hidden {hidden}: {key} {lo:.2}-{hi:.2} over {} rounds",
                            v.len()
                        );
                    }
                }
            }
        }
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench/results/hopgnn-{}.json", a.graph)));
    if let Some(p) = out.parent() {
        std::fs::create_dir_all(p)?;
    }
    let doc = json!({ "graph": a.graph, "batch": a.batch, "epochs": a.epochs, "repeat": a.repeat, "bandwidth": a.links.bandwidth, "delay_ms": a.links.delay_ms, "emulation": a.links.describe(), "runs": rows, "checks": checks });
    std::fs::write(&out, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", out.display());
    Ok(())
}
