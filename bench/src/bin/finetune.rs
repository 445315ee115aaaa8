//! Pre-train, then fine-tune: what link-prediction pre-training gives a node
//! classifier with few labels. Per seed, hetgnn trains link prediction on
//! every relation of the graph, then node classification three ways from the
//! same seed: afresh, from the predictor's checkpoint (`--init-from`), and
//! from it with the learnable embeddings frozen (`--freeze embed`); the test
//! accuracy after the last epoch of each.
//!
//! `cargo run --release -p bench --bin finetune [-- --data DIR --seeds 0,1,2]`
//! (default graph: heco-freebase from `$HETGNN_DATASETS` or
//! `../shared/datasets`, featureless, 60 training labels) prints a table and
//! writes bench/results/finetune.json.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// The graph (default: heco-freebase of the shared datasets).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Seeds, each a pre-training and its three node classifiers.
    #[arg(long, default_value = "0,1,2", value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Link-prediction epochs.
    #[arg(long, default_value_t = 10)]
    lp_epochs: u64,
    /// Node-classification epochs.
    #[arg(long, default_value_t = 100)]
    epochs: u64,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/finetune.json")]
    out: PathBuf,
}

/// The node classifiers, by name, and the flags each adds.
const VARIANTS: [(&str, &[&str]); 3] = [
    ("fresh", &[]),
    ("init-from", &["--init-from", "lp"]),
    (
        "init-from, embed frozen",
        &["--init-from", "lp", "--freeze", "embed"],
    ),
];

fn default_data() -> anyhow::Result<PathBuf> {
    let root = std::env::var_os("HETGNN_DATASETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/datasets"));
    let dir = root.join("heco-freebase");
    anyhow::ensure!(
        dir.join("schema.json").exists(),
        "{} not found: give --data or set HETGNN_DATASETS",
        dir.display()
    );
    Ok(dir)
}

fn report(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.bin.clone())?;
    let data = match &a.data {
        Some(d) => d.clone(),
        None => default_data()?,
    };
    let schema = report(&data.join("schema.json"))?;
    let relations: Vec<String> = schema["relations"]
        .as_array()
        .context("schema.json: no relations")?
        .iter()
        .map(|r| {
            format!(
                "{}__{}__{}",
                r["src"].as_str().unwrap_or(""),
                r["name"].as_str().unwrap_or(""),
                r["dst"].as_str().unwrap_or("")
            )
        })
        .collect();
    let data_s = data.display().to_string();
    let mut rows = Vec::new();
    for &seed in &a.seeds {
        let work = tempfile::tempdir()?;
        let s = seed.to_string();
        let base = |epochs: u64| -> Vec<String> {
            [
                "train",
                "--data",
                &data_s,
                "--seed",
                &s,
                "--epochs",
                &epochs.to_string(),
            ]
            .map(String::from)
            .to_vec()
        };
        let mut lp = base(a.lp_epochs);
        lp.extend(
            [
                "--task",
                "link-prediction",
                "--target-relations",
                &relations.join(","),
                "--checkpoint",
                "lp",
                "--report",
                "lp.json",
            ]
            .map(String::from),
        );
        eprintln!("seed {seed}: link prediction, {} epochs", a.lp_epochs);
        bench::run_hetgnn(&bin, work.path(), &lp)?;
        let lp_report = report(&work.path().join("lp.json"))?;
        let mut row = serde_json::json!({
            "seed": seed,
            "lp_test_mrr": lp_report["epochs"].as_array().and_then(|e| e.last()).map(|e| e["link"]["test"]["mrr"].clone()),
        });
        for (name, flags) in VARIANTS {
            let mut args = base(a.epochs);
            args.extend(flags.iter().map(|f| f.to_string()));
            args.extend([
                "--report".to_string(),
                "nc.json".to_string(),
                "--force".to_string(),
            ]);
            eprintln!("seed {seed}: node classification, {name}");
            bench::run_hetgnn(&bin, work.path(), &args)?;
            let r = report(&work.path().join("nc.json"))?;
            let last = r["epochs"]
                .as_array()
                .and_then(|e| e.last())
                .cloned()
                .unwrap_or_default();
            row[name] =
                serde_json::json!({ "test_acc": last["test_acc"], "valid_acc": last["valid_acc"] });
        }
        println!(
            "seed {seed}: test accuracy {}",
            VARIANTS
                .iter()
                .map(|(n, _)| format!("{n} {}", row[*n]["test_acc"]))
                .collect::<Vec<_>>()
                .join(", ")
        );
        rows.push(row);
    }
    let mean = |name: &str| {
        let v: Vec<f64> = rows
            .iter()
            .filter_map(|r| r[name]["test_acc"].as_f64())
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    println!(
        "| node classifier | mean test accuracy over seeds {:?} |\n| --- | --- |",
        a.seeds
    );
    for (name, _) in VARIANTS {
        println!("| {name} | {:.3} |", mean(name));
    }
    let out = serde_json::json!({
        "graph": data_s,
        "lp_epochs": a.lp_epochs,
        "epochs": a.epochs,
        "relations": relations,
        "runs": rows,
        "mean_test_acc": VARIANTS.iter().map(|(n, _)| (n.to_string(), serde_json::json!(mean(n)))).collect::<serde_json::Map<_, _>>(),
    });
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&out)?)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
