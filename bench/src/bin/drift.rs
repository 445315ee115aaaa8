//! How far data-parallel training's losses drift from one process's, step by
//! step: hetgnn's side of bench/baselines/split_drift.py.
//!
//! `cargo run --release -p bench --bin drift [-- --task edge-classification
//! --scale 0.003 --epochs 4 --seeds 0,1,2]` trains each seed twice on the
//! mag-like graph, in one process and data-parallel on `--parts` METIS
//! partitions (one trainer each), with the settings of the equality test
//! (batch 512, hidden 32, 16-d learnable rows, dropout 0, sampled
//! evaluation), and prints per epoch the largest step-loss difference
//! relative to the loss, and the first step beyond 1e-5. Writes
//! bench/results/drift.json. Both runs take the same steps on the same
//! samples, so the difference is the order in which gradients are summed.
//! With `--perturb-lr REL` the second run is another single-process run
//! whose learning rate is multiplied by 1 + REL: how far a perturbation of
//! rounding's size carries in this training by itself.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;

use actors::{Config, TrainObserver};
use anyhow::Context;
use clap::Parser;
use graphs::partition::{self, Method};
use graphs::{LoadOptions, NoProgress};

/// Adam's learning rate of every run (the default, written out so a perturbed run can scale it).
const LR: f64 = 0.01;

#[derive(Parser)]
struct Args {
    /// Task of both runs.
    #[arg(long, default_value = "edge-classification")]
    task: String,
    /// Edge tasks: the relation whose edges are predicted.
    #[arg(long, default_value = "author__writes__paper")]
    target_relations: String,
    /// Scale of the mag-like graph.
    #[arg(long, default_value_t = 0.003)]
    scale: f64,
    /// Epochs per run.
    #[arg(long, default_value_t = 4)]
    epochs: u64,
    /// Seeds, each a pair of runs.
    #[arg(long, default_value = "0,1,2", value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Partitions (trainers) of the data-parallel run.
    #[arg(long, default_value_t = 2)]
    parts: usize,
    /// Seeds per step.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Hidden width.
    #[arg(long, default_value_t = 32)]
    hidden: usize,
    /// Width of the learnable rows.
    #[arg(long, default_value_t = 16)]
    embed_dim: usize,
    /// Compare with a single-process run whose learning rate is multiplied by 1 + this, not a data-parallel run.
    #[arg(long)]
    perturb_lr: Option<f64>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/drift.json")]
    out: PathBuf,
}

/// Each step's loss and the steps per epoch.
#[derive(Default)]
struct Steps {
    losses: Vec<f64>,
    per_epoch: Vec<u64>,
}

impl TrainObserver for Steps {
    fn epoch_start(&mut self, _epoch: u64, steps: u64) {
        self.per_epoch.push(steps);
    }
    fn step(&mut self, loss: f64) {
        self.losses.push(loss);
    }
}

fn main() -> anyhow::Result<()> {
    models::threads::init_cpu_threads();
    let a = Args::parse();
    let data = bench::mag_like(a.scale, 0)?;
    let parts = bench::data_root().join(format!("drift-metis-{}-s{}", a.parts, a.scale));
    if !parts.join("manifest.json").exists() {
        let g = graphs::load(&data, &LoadOptions::default())?;
        let assign = partition::assign_two_level(&g, a.parts, 1, Method::Metis, 0)?;
        partition::write(&g, &assign, &parts, false, &mut NoProgress)?;
    }
    let mut rows = Vec::new();
    for &seed in &a.seeds {
        let mut base = vec![
            format!("training.data={:?}", data.display().to_string()),
            format!("training.epochs={}", a.epochs),
            format!("training.batch={}", a.batch),
            format!("training.hidden={}", a.hidden),
            format!("training.embed_dim={}", a.embed_dim),
            "training.dropout=0.0".into(),
            format!("training.task={:?}", a.task),
            format!("training.seed={seed}"),
            format!("training.lr={LR}"),
        ];
        if a.task.starts_with("edge-") || a.task == "link-prediction" {
            base.push(format!(
                "training.target_relations={:?}",
                a.target_relations
            ));
            base.push("training.edge_eval=\"sampled\"".into());
        }
        let mut single = Steps::default();
        actors::train(&Config::parse("", &base)?, &mut single).context("the single-process run")?;
        let mut other = base.clone();
        match a.perturb_lr {
            Some(rel) => other.push(format!("training.lr={}", LR * (1.0 + rel))),
            None => {
                other.push("training.mode=\"data-parallel\"".into());
                other.push(format!(
                    "training.partitions={:?}",
                    parts.display().to_string()
                ));
            }
        }
        let mut split = Steps::default();
        actors::train(&Config::parse("", &other)?, &mut split).context("the second run")?;
        anyhow::ensure!(
            single.losses.len() == split.losses.len(),
            "the runs took {} and {} steps",
            single.losses.len(),
            split.losses.len()
        );
        let diffs: Vec<f64> = single
            .losses
            .iter()
            .zip(&split.losses)
            .map(|(x, y)| (x - y).abs() / x.abs().max(1e-2))
            .collect();
        let first = diffs.iter().position(|&d| d > 1e-5);
        let mut by_epoch = Vec::new();
        let mut at = 0usize;
        for &n in &single.per_epoch {
            let end = (at + n as usize).min(diffs.len());
            by_epoch.push(diffs[at..end].iter().fold(0f64, |m, &d| m.max(d)));
            at = end;
        }
        let shown: Vec<String> = by_epoch.iter().map(|d| format!("{d:.1e}")).collect();
        println!(
            "seed {seed}: {} steps, first beyond 1e-5: {}, largest by epoch: {}",
            diffs.len(),
            first.map_or("none".into(), |s| s.to_string()),
            shown.join(" ")
        );
        rows.push(serde_json::json!({ "seed": seed, "first_step_beyond_1e-5": first,
            "largest_by_epoch": by_epoch, "losses": single.losses, (if a.perturb_lr.is_some() { "losses_perturbed" } else { "losses_data_parallel" }): split.losses }));
    }
    let json = serde_json::json!({ "task": a.task, "scale": a.scale, "parts": a.parts, "perturb_lr": a.perturb_lr, "batch": a.batch,
        "hidden": a.hidden, "embed_dim": a.embed_dim, "epochs": a.epochs, "runs": rows });
    if let Some(parent) = a.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&json)? + "\n")?;
    println!("wrote {}", a.out.display());
    Ok(())
}
