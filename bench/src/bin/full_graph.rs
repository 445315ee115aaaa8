//! Full-graph training (SANCUS) against its broadcast-everything baseline,
//! on block-row partitions, measured in the same run:
//!
//! - accuracy and bytes: every staleness setting trained `--epochs` epochs
//!   with all workers in one process (the model and the bytes the workers
//!   count do not depend on the transport: runs are deterministic), test
//!   accuracy of the final model, forward / backward broadcast bytes, skipped
//!   broadcasts and cache memory;
//! - time: the same settings as node processes over QUIC on loopback, every
//!   link shaped by the runtime (`--bandwidth`, default 10 Gbit/s and
//!   1 Gbit/s, + `--delay-ms`), `--timed-epochs` epochs each, epoch time
//!   the mean over epochs after the first (which also sends the constant
//!   features);
//! - full-graph against mini-batch: single-process sampled training
//!   (fanouts 25,20, batch 1024) for `--sampled-epochs` epochs, its time per
//!   epoch and accuracy.
//!
//! Settings: `none` (the baseline), `fixed<K>`, `adaptive<K>` (staleness
//! bound K epochs), `variation<E>` (relative change E), and `-g` after any
//! of them to skip the gradients of skipped blocks too.
//!
//! `cargo build --release && cargo run --release -p bench --bin full_graph
//! [-- --graph heco-acm --nodes 2,4 --epochs 200 --seeds 0 --repeat 1]`
//! (`--seeds`: accuracy runs per seed, their means compared; `--repeat`:
//! interleaved rounds of the timed runs, ratios given as ranges) (`--graph mag-S`,
//! `heco-acm` or `planetoid-cora`) prints tables and writes
//! bench/results/full-graph-<graph>.json.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// `mag-S` (mag-like at scale S), `heco-acm` or `planetoid-cora` (from the shared datasets).
    #[arg(long, default_value = "heco-acm")]
    graph: String,
    /// Where the shared datasets are.
    #[arg(long, default_value = "../shared/datasets")]
    datasets: PathBuf,
    /// Node counts to run.
    #[arg(long, default_value = "2,4", value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Staleness settings (none, fixedK, adaptiveK, variationE; a `-g` suffix skips gradients too).
    #[arg(
        long,
        default_value = "none,fixed1,adaptive1,variation0.05,variation0.1,variation0.2,fixed1-g",
        value_delimiter = ','
    )]
    settings: Vec<String>,
    /// Epochs of the accuracy runs.
    #[arg(long, default_value_t = 200)]
    epochs: u64,
    /// Seeds of the accuracy runs: accuracies and bytes are their means (one
    /// seed's test accuracy moves by a few nodes between settings).
    #[arg(long, default_value = "0", value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Interleaved rounds of the timed runs (ratios are taken within a round
    /// and printed as their range).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Epochs of the timed runs (0: none).
    #[arg(long, default_value_t = 6)]
    timed_epochs: u64,
    /// Settings of the timed runs.
    #[arg(
        long,
        default_value = "none,fixed1,adaptive1,variation0.1",
        value_delimiter = ','
    )]
    timed: Vec<String>,
    /// Link bandwidth caps of the timed runs.
    #[arg(long, default_value = "10Gbit/s,1Gbit/s", value_delimiter = ',')]
    bandwidth: Vec<String>,
    /// Fixed one-way link delay in milliseconds.
    #[arg(long, default_value_t = 0.1)]
    delay_ms: f64,
    /// CPUs per node process in the timed runs (a control group's quota; root).
    #[arg(long)]
    cpus_per_node: Option<f64>,
    /// Who caps the timed runs' links: the runtime on loopback, or the
    /// kernel between network namespaces (root).
    #[arg(long, value_enum, default_value = "runtime")]
    shaping: bench::Shaping,
    /// The links' MTU in bytes with kernel shaping (9000: jumbo frames).
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Epochs of the sampled single-process comparison (0: none).
    #[arg(long, default_value_t = 10)]
    sampled_epochs: u64,
    /// Hidden width.
    #[arg(long, default_value_t = 64)]
    hidden: usize,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON figures (default bench/results/full-graph-<graph>.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The `[training]` lines of a staleness setting.
fn setting(s: &str) -> anyhow::Result<String> {
    let (s, grads) = match s.strip_suffix("-g") {
        Some(base) => (base, "full-graph.skip_gradients = true\n"),
        None => (s, ""),
    };
    let body = if s == "none" {
        String::new()
    } else if let Some(k) = s.strip_prefix("fixed") {
        format!(
            "full-graph.staleness = \"fixed\"\nfull-graph.staleness_epochs = {}\n",
            k.parse::<u32>()?
        )
    } else if let Some(k) = s.strip_prefix("adaptive") {
        format!(
            "full-graph.staleness = \"adaptive\"\nfull-graph.staleness_epochs = {}\n",
            k.parse::<u32>()?
        )
    } else if let Some(e) = s.strip_prefix("variation") {
        format!(
            "full-graph.staleness = \"variation\"\nfull-graph.staleness_variation = {}\n",
            e.parse::<f64>()?
        )
    } else {
        bail!("--settings {s}: expected none, fixedK, adaptiveK or variationE (with -g to skip gradients)");
    };
    Ok(format!("{body}{grads}"))
}

/// Sum of `key` over a report's epochs' full-graph figures.
fn full_sum(r: &Value, key: &str) -> f64 {
    r["epochs"].as_array().map_or(0.0, |es| {
        es.iter()
            .map(|e| e["full"][key].as_f64().unwrap_or(0.0))
            .sum()
    })
}

/// Broadcasts skipped over all epochs and blocks, and made.
fn skips(r: &Value) -> (u64, u64) {
    let mut out = (0, 0);
    for e in r["epochs"].as_array().into_iter().flatten() {
        for c in e["full"]["blocks"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
        {
            out.0 += c["skipped"].as_u64().unwrap_or(0);
            out.1 += c["sent"].as_u64().unwrap_or(0);
        }
    }
    out
}

/// Mean of `key` over the epochs after the first.
fn later_mean(r: &Value, key: &str) -> f64 {
    let es = r["epochs"].as_array().map_or(&[][..], Vec::as_slice);
    let later = if es.len() > 1 { &es[1..] } else { es };
    later
        .iter()
        .map(|e| e[key].as_f64().unwrap_or(0.0))
        .sum::<f64>()
        / later.len().max(1) as f64
}

fn read(path: PathBuf) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )?)
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.hetgnn.clone())?;
    let data = match a.graph.strip_prefix("mag-") {
        Some(s) => bench::mag_like(s.parse()?, 0)?,
        None if ["heco-acm", "planetoid-cora"].contains(&a.graph.as_str()) => {
            std::fs::canonicalize(a.datasets.join(&a.graph))?
        }
        None => bail!(
            "--graph {}: expected mag-SCALE, heco-acm or planetoid-cora",
            a.graph
        ),
    };
    let work = tempfile::tempdir()?;
    let w = work.path();
    let model = format!("hidden = {}\nlayers = 2\nmodel = \"rgcn\"\n", a.hidden);
    let mut accuracy = Vec::new();
    let mut timed = Vec::new();
    for &k in &a.nodes {
        let parts = bench::partitions_named(&bin, &data, "block-row", k, &a.graph)?;
        for s in &a.settings {
            let mut per_seed = Vec::new();
            for &seed in &a.seeds {
                let report = format!("acc-{s}-{k}-{seed}.json");
                let toml = format!(
                    "[training]\nmode = \"full-graph\"\ndata = {:?}\npartitions = {:?}\nepochs = {}\nseed = {seed}\n{model}{}report = {report:?}\n",
                    data.display().to_string(),
                    parts.display().to_string(),
                    a.epochs,
                    setting(s)?
                );
                std::fs::write(w.join("acc.toml"), toml)?;
                eprintln!(
                    "{s}, {k} workers in one process, seed {seed}, {} epochs",
                    a.epochs
                );
                bench::run_hetgnn(
                    &bin,
                    w,
                    &["train".into(), "--config".into(), "acc.toml".into()],
                )?;
                let r = read(w.join(&report))?;
                let last = r["epochs"]
                    .as_array()
                    .and_then(|e| e.last())
                    .cloned()
                    .unwrap_or(Value::Null);
                let (skipped, sent) = skips(&r);
                per_seed.push(json!({
                    "seed": seed,
                    "test_acc": last["test_acc"], "valid_acc": last["valid_acc"], "loss": last["loss"],
                    "forward_bytes": full_sum(&r, "forward_bytes"), "backward_bytes": full_sum(&r, "backward_bytes"),
                    "eval_bytes": full_sum(&r, "eval_bytes"),
                    "skipped": skipped, "sent": sent,
                    "cache_bytes": last["full"]["cache_bytes"],
                }));
            }
            let mean = |key: &str| {
                per_seed
                    .iter()
                    .map(|r| r[key].as_f64().unwrap_or(0.0))
                    .sum::<f64>()
                    / per_seed.len().max(1) as f64
            };
            let total = |key: &str| {
                per_seed
                    .iter()
                    .map(|r| r[key].as_u64().unwrap_or(0))
                    .sum::<u64>()
            };
            accuracy.push(json!({
                "setting": s, "nodes": k,
                "test_acc": mean("test_acc"), "valid_acc": mean("valid_acc"), "loss": mean("loss"),
                "forward_bytes": mean("forward_bytes"), "backward_bytes": mean("backward_bytes"),
                "eval_bytes": mean("eval_bytes"),
                "skipped": total("skipped"), "sent": total("sent"),
                "cache_bytes": mean("cache_bytes"),
                "seeds": per_seed,
            }));
        }
        for (round, bw) in (0..a.repeat).flat_map(|r| a.bandwidth.iter().map(move |bw| (r, bw))) {
            for s in a.timed.iter().filter(|_| a.timed_epochs > 0) {
                let report = format!("time-{s}-{k}-{round}.json");
                let training = format!(
                    "mode = \"full-graph\"\npartitions = {:?}\nepochs = {}\n{model}{}",
                    parts.display().to_string(),
                    a.timed_epochs,
                    setting(s)?,
                );
                eprintln!(
                    "{s}, {k} node processes, {bw}, round {round}, {} epochs",
                    a.timed_epochs
                );
                let links = bench::Links {
                    bandwidth: bw.clone(),
                    delay_ms: a.delay_ms,
                    cpus_per_node: a.cpus_per_node,
                    shaping: a.shaping,
                    mtu: a.mtu,
                };
                let r = links.launch(&bin, w, k, &training, &report)?;
                timed.push(json!({
                    "setting": s, "nodes": k, "bandwidth": bw, "round": round,
                    "emulation": links.describe(),
                    "epoch_s": later_mean(&r, "seconds"), "compute_s": later_mean(&r, "compute_s"), "comm_s": later_mean(&r, "comm_s"),
                    "first_epoch_s": r["epochs"][0]["seconds"],
                    "bytes_per_step": r["bytes_per_step"],
                }));
            }
        }
    }
    let sampled = if a.sampled_epochs > 0 {
        let toml = format!(
            "[training]\ndata = {:?}\nepochs = {}\n{model}report = \"sampled.json\"\n",
            data.display().to_string(),
            a.sampled_epochs
        );
        std::fs::write(w.join("sampled.toml"), toml)?;
        eprintln!(
            "sampled single-process training, {} epochs",
            a.sampled_epochs
        );
        bench::run_hetgnn(
            &bin,
            w,
            &["train".into(), "--config".into(), "sampled.toml".into()],
        )?;
        let r = read(w.join("sampled.json"))?;
        let last = r["epochs"]
            .as_array()
            .and_then(|e| e.last())
            .cloned()
            .unwrap_or(Value::Null);
        json!({ "epochs": a.sampled_epochs, "epoch_s": bench::epoch_mean(&r, "seconds"), "test_acc": last["test_acc"], "valid_acc": last["valid_acc"] })
    } else {
        Value::Null
    };

    let f = |r: &Value, key: &str| r[key].as_f64().unwrap_or(0.0);
    println!(
        "{}: 2-layer R-GCN, hidden {}, {} epochs, block-row partitions",
        a.graph, a.hidden, a.epochs
    );
    println!(
        "{:<16} {:>5} {:>9} {:>12} {:>10} {:>12} {:>12} {:>9}",
        "setting",
        "nodes",
        "test_acc",
        "forward MB",
        "vs none",
        "backward MB",
        "skipped",
        "cache MB"
    );
    let mut checks = Vec::new();
    for r in &accuracy {
        let k = r["nodes"].as_u64().unwrap_or(0);
        let base = accuracy
            .iter()
            .find(|b| b["nodes"] == r["nodes"] && b["setting"] == "none");
        let ratio = base.map_or(f64::NAN, |b| {
            f(r, "forward_bytes") / f(b, "forward_bytes").max(1.0)
        });
        let drop = base.map_or(f64::NAN, |b| 100.0 * (f(b, "test_acc") - f(r, "test_acc")));
        println!(
            "{:<16} {k:>5} {:>9.4} {:>12.1} {:>10.3} {:>12.1} {:>12} {:>9.1}",
            r["setting"].as_str().unwrap_or(""),
            f(r, "test_acc"),
            f(r, "forward_bytes") / 1e6,
            ratio,
            f(r, "backward_bytes") / 1e6,
            format!(
                "{}/{}",
                r["skipped"],
                r["sent"].as_u64().unwrap_or(0) + r["skipped"].as_u64().unwrap_or(0)
            ),
            f(r, "cache_bytes") / 1e6
        );
        checks.push(json!({ "setting": r["setting"], "nodes": k, "forward_bytes_vs_none": ratio, "test_acc_drop_points": drop }));
    }
    if !timed.is_empty() {
        println!(
            "{:<16} {:>5} {:>10} {:>9} {:>9} {:>9} {:>10}",
            "timed", "nodes", "link", "epoch_s", "compute", "comm", "vs none"
        );
        for r in &timed {
            let base = timed.iter().find(|b| {
                b["nodes"] == r["nodes"]
                    && b["bandwidth"] == r["bandwidth"]
                    && b["round"] == r["round"]
                    && b["setting"] == "none"
            });
            let ratio = base.map_or(f64::NAN, |b| f(r, "epoch_s") / f(b, "epoch_s").max(1e-12));
            println!(
                "{:<16} {:>5} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>10.3}",
                r["setting"].as_str().unwrap_or(""),
                r["nodes"],
                r["bandwidth"].as_str().unwrap_or(""),
                f(r, "epoch_s"),
                f(r, "compute_s"),
                f(r, "comm_s"),
                ratio
            );
            checks.push(json!({ "setting": r["setting"], "nodes": r["nodes"], "bandwidth": r["bandwidth"], "round": r["round"], "epoch_time_vs_none": ratio }));
        }
        if a.repeat > 1 {
            for r in timed.iter().filter(|r| r["round"] == 0) {
                let v: Vec<f64> = checks
                    .iter()
                    .filter(|c| {
                        c["setting"] == r["setting"]
                            && c["nodes"] == r["nodes"]
                            && c["bandwidth"] == r["bandwidth"]
                    })
                    .filter_map(|c| c["epoch_time_vs_none"].as_f64())
                    .collect();
                let (lo, hi) = v
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                        (lo.min(x), hi.max(x))
                    });
                println!(
                    "{} on {} nodes at {}: {lo:.3}-{hi:.3}x the baseline's epoch time over {} rounds",
                    r["setting"].as_str().unwrap_or(""),
                    r["nodes"],
                    r["bandwidth"].as_str().unwrap_or(""),
                    v.len()
                );
            }
        }
    }
    if !sampled.is_null() {
        println!("sampled single-process (fanouts 25,20, batch 1024): {:.3} s/epoch, test_acc {:.4} after {} epochs", f(&sampled, "epoch_s"), f(&sampled, "test_acc"), a.sampled_epochs);
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench/results/full-graph-{}.json", a.graph)));
    if let Some(p) = out.parent() {
        std::fs::create_dir_all(p)?;
    }
    let doc = json!({ "graph": a.graph, "epochs": a.epochs, "seeds": a.seeds, "repeat": a.repeat, "hidden": a.hidden, "delay_ms": a.delay_ms, "accuracy": accuracy, "timed": timed, "sampled": sampled, "checks": checks });
    std::fs::write(&out, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", out.display());
    Ok(())
}
