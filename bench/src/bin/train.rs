//! Single-process training throughput: epoch time, its split, peak memory and
//! accuracy of the 2-layer R-GCN (hidden 64, 64-d embeddings, fanouts 25,20,
//! batch 1024, Adam 0.01) on mag-like graphs of several scales.
//!
//! `cargo run --release -p bench --bin train [-- --scales 0.01,0.05,0.1 --epochs 3]`
//! runs each scale in a child process (so peak memory is per scale), prints a
//! table and writes bench/results/train.json. With `--dgl PYTHON` it also runs
//! bench/baselines/dgl_rgcn.py (DGL's R-GCN, same model and settings) on the
//! same graph directory with that interpreter and reports the ratios; with
//! `--pyg PYTHON`, bench/baselines/pyg_rgcn.py (PyTorch Geometric's layers, the
//! same model, on the benchmark's `--device`) likewise. `--set KEY=VALUE`
//! (repeatable) passes a setting to hetgnn's runs, such as
//! `training.cache_bytes=8GiB` to keep every row on a GPU. `--task
//! node-regression` trains both sides on the graph's values (MSE) and compares
//! test RMSE instead of accuracy; `--seed` seeds both sides. With
//! `--same-init` (node tasks) DGL starts from hetgnn's initial model (its
//! weights and learnable rows, written as a checkpoint), so the two sides
//! differ only in sampling, dropout and arithmetic, not in their draw of
//! initial weights.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::Command;

use actors::Config;
use anyhow::{bail, Context};
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Scales of the mag-like graph.
    #[arg(long, default_value = "0.01,0.05,0.1", value_delimiter = ',')]
    scales: Vec<f64>,
    /// Epochs per scale (the first is included in the mean: no warm-up effects to hide).
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Model to train.
    #[arg(long, default_value = "rgcn")]
    model: String,
    /// node-classification, node-regression, edge-classification, edge-regression or multi-label (both sides).
    #[arg(long, default_value = "node-classification")]
    task: String,
    /// Edge tasks: the relation whose edges are predicted (given to both systems).
    #[arg(long, default_value = "")]
    target_relations: String,
    /// Seed of both sides' runs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Device.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// A Python interpreter with dgl 2.1 and torch 2.2.1: also train DGL's R-GCN on each graph (R-GCN only).
    #[arg(long)]
    dgl: Option<PathBuf>,
    /// Node tasks: DGL starts from hetgnn's initial weights and learnable rows.
    #[arg(long)]
    same_init: bool,
    /// A Python interpreter with torch and torch_geometric: also train PyG's R-GCN on each graph, on `--device` (R-GCN only).
    #[arg(long)]
    pyg: Option<PathBuf>,
    /// A setting for hetgnn's runs (`training.cache_bytes=8GiB`, say), repeatable; the peers take none.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/train.json")]
    out: PathBuf,
    /// Internal: run one scale in this process and print its report as JSON.
    #[arg(long, hide = true)]
    child: Option<f64>,
}

/// The configuration of hetgnn's run at `scale`.
fn config(a: &Args, scale: f64) -> anyhow::Result<Config> {
    let data = bench::mag_like(scale, 0)?;
    let overrides = vec![
        format!("training.data={:?}", data.display().to_string()),
        format!("training.epochs={}", a.epochs),
        format!("training.model={}", a.model),
        format!("training.task={:?}", a.task),
        format!("training.seed={}", a.seed),
        format!("training.device={:?}", a.device),
    ];
    let relations = (!a.target_relations.is_empty())
        .then(|| format!("training.target_relations={:?}", a.target_relations));
    let overrides: Vec<String> = overrides
        .into_iter()
        .chain(relations)
        .chain(a.set.iter().cloned())
        .collect();
    Ok(Config::parse("", &overrides)?)
}

fn child(a: &Args, scale: f64) -> anyhow::Result<()> {
    let (report, _) = actors::train(&config(a, scale)?, &mut ())?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// hetgnn's initial model for the run at `scale` (the one `actors::train`
/// starts from), written as a checkpoint for the peer to load; its directory.
fn initial_model(a: &Args, scale: f64) -> anyhow::Result<PathBuf> {
    let cfg = config(a, scale)?;
    let t = &cfg.training;
    let data = t.data.clone().context("the benchmark names its graph")?;
    let root = bench::data_root().join(format!("init-{}-s{scale}-seed{}", a.task, a.seed));
    let _ = std::fs::remove_dir_all(&root);
    bench::initial_checkpoint(t, &data, &root, "bench train --same-init")
}

/// Runs the baseline `script` (under bench/baselines/) on `data` with `python` and returns its JSON report.
fn baseline(
    python: &std::path::Path,
    script: &str,
    data: &std::path::Path,
    epochs: u64,
    threads: usize,
    extra: &[&str],
) -> anyhow::Result<serde_json::Value> {
    // The build's checkout, or (a binary carried to another machine) the current directory's.
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("baselines")
        .join(script);
    let script = if built.exists() {
        built
    } else {
        std::path::Path::new("bench/baselines").join(script)
    };
    let out = Command::new(python)
        .arg(&script)
        .args([
            "--data",
            &data.display().to_string(),
            "--epochs",
            &epochs.to_string(),
            "--threads",
            &threads.to_string(),
        ])
        .args(extra)
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    if !out.status.success() {
        bail!(
            "the baseline {} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let last = out
        .stdout
        .rsplit(|&b| b == b'\n')
        .find(|l| !l.is_empty())
        .unwrap_or(&[]);
    serde_json::from_slice(last).with_context(|| format!("the report of {}", script.display()))
}

fn main() -> anyhow::Result<()> {
    // As the hetgnn binary does, so the figures are those of `hetgnn train`.
    models::threads::init_cpu_threads();
    runtime::alloc::keep_freed_memory();
    let a = Args::parse();
    if let Some(scale) = a.child {
        return child(&a, scale);
    }
    if (a.dgl.is_some() || a.pyg.is_some()) && a.model != "rgcn" {
        bail!(
            "--dgl and --pyg compare R-GCN only (got --model {})",
            a.model
        );
    }
    if a.same_init && !(a.task.starts_with("node-") || a.task == "multi-label") {
        bail!("--same-init is for node tasks (got --task {})", a.task);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let exe = std::env::current_exe()?;
    let mut rows = Vec::new();
    println!(
        "{:>6} {:>6} {:>9} {:>8} {:>8} {:>8} {:>8} {:>10} {:>9}",
        "scale",
        "steps",
        "epoch_s",
        "sample",
        "gather",
        "compute",
        "update",
        "peak_MiB",
        "test_acc"
    );
    for &scale in &a.scales {
        let sets = a.set.iter().flat_map(|s| ["--set", s.as_str()]);
        let out = Command::new(&exe)
            .args([
                "--child",
                &scale.to_string(),
                "--epochs",
                &a.epochs.to_string(),
                "--model",
                &a.model,
                "--task",
                &a.task,
                "--target-relations",
                &a.target_relations,
                "--seed",
                &a.seed.to_string(),
                "--device",
                &a.device,
            ])
            .args(sets)
            .output()
            .context("running a child benchmark")?;
        if !out.status.success() {
            bail!(
                "scale {scale} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let report: actors::Report = serde_json::from_slice(
            out.stdout
                .rsplit(|&b| b == b'\n')
                .find(|l| !l.is_empty())
                .unwrap_or(&[]),
        )?;
        let n = report.epochs.len() as f64;
        let mean =
            |f: fn(&actors::EpochReport) -> f64| report.epochs.iter().map(f).sum::<f64>() / n;
        let last = report.epochs.last().context("no epochs")?;
        // The figure compared: test accuracy, test RMSE for regression, test
        // micro F1 for multi-label.
        let ours = match (last.regression, last.micro_f1) {
            (Some(r), _) => r.test.rmse,
            (None, Some([_, t])) => t,
            (None, None) => last.test_acc.unwrap_or(f64::NAN),
        };
        let peak = report.peak_memory_bytes.unwrap_or(0) as f64 / (1 << 20) as f64;
        println!(
            "{scale:>6} {:>6} {:>9.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {peak:>10.0} {:>9.4}",
            report.steps / report.epochs.len() as u64,
            mean(|e| e.time.seconds),
            mean(|e| e.time.sample_s),
            mean(|e| e.time.gather_s),
            mean(|e| e.time.compute_s),
            mean(|e| e.time.update_s),
            ours
        );
        let mut row = serde_json::json!({
            "scale": scale, "steps_per_epoch": report.steps / report.epochs.len() as u64,
            "epoch_seconds": mean(|e| e.time.seconds), "sample_s": mean(|e| e.time.sample_s), "gather_s": mean(|e| e.time.gather_s),
            "compute_s": mean(|e| e.time.compute_s), "update_s": mean(|e| e.time.update_s),
            "peak_memory_bytes": report.peak_memory_bytes, "test_acc": last.test_acc,
            "test_rmse": last.regression.map(|r| r.test.rmse), "test_micro_f1": last.micro_f1.map(|f| f[1]),
            "epochs": report.epochs,
        });
        let seed = a.seed.to_string();
        let init = match (&a.dgl, a.same_init) {
            (Some(_), true) => Some(initial_model(&a, scale)?.display().to_string()),
            _ => None,
        };
        let mut dgl_args = vec![
            "--task",
            a.task.as_str(),
            "--seed",
            seed.as_str(),
            "--target-relations",
            a.target_relations.as_str(),
        ];
        if let Some(dir) = &init {
            dgl_args.extend(["--init-from", dir.as_str()]);
        }
        let peers = [
            ("dgl", "dgl_rgcn.py", &a.dgl, dgl_args),
            (
                "pyg",
                "pyg_rgcn.py",
                &a.pyg,
                vec!["--device", a.device.as_str()],
            ),
        ];
        for (name, script, python, extra) in peers {
            let Some(python) = python else { continue };
            let theirs = baseline(
                python,
                script,
                &bench::mag_like(scale, 0)?,
                a.epochs,
                cores,
                &extra,
            )?;
            let epoch_s = bench::epoch_mean(&theirs, "seconds");
            let final_epoch = theirs["epochs"].as_array().and_then(|e| e.last());
            let test = final_epoch
                .and_then(|e| match (last.regression, last.micro_f1) {
                    (Some(_), _) => e["regression"]["test"]["rmse"].as_f64(),
                    (None, Some(_)) => e["micro_f1"][1].as_f64(),
                    (None, None) => e["test_acc"].as_f64(),
                })
                .unwrap_or(f64::NAN);
            let ratio = mean(|e| e.time.seconds) / epoch_s;
            let what = match (last.regression, last.micro_f1) {
                (Some(_), _) => "test RMSE",
                (None, Some(_)) => "test micro F1",
                (None, None) => "test accuracy",
            };
            println!("{:>6} {name} {} {epoch_s:>9.3} s/epoch, {what} {test:.4}: hetgnn/{name} time {ratio:.2}x, {what} {:+.4}", "", theirs[name], ours - test);
            row[name] = serde_json::json!({ "epoch_seconds": epoch_s, "test": test, "time_ratio": ratio,
                "test_diff": ours - test, "metric": what, "report": theirs });
        }
        rows.push(row);
    }
    let json = serde_json::json!({ "model": a.model, "task": a.task, "seed": a.seed, "device": a.device, "epochs": a.epochs,
        "same_init": a.same_init,
        "settings": a.set, "cores": cores, "runs": rows });
    if let Some(parent) = a.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&json)? + "\n")?;
    println!("wrote {}", a.out.display());
    Ok(())
}
