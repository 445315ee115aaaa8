//! Link prediction against DGL: the 2-layer R-GCN encoder with a dot
//! decoder, 5 uniform negatives per edge and binary cross-entropy, trained
//! for the same epochs on the same split by hetgnn and by DGL
//! (bench/baselines/dgl_link.py), seeds 0-2; test MRR and Hits@K against the
//! same 1000 fixed negatives per held-out edge, and epoch times.
//!
//! `cargo run --release -p bench --bin link -- --dgl PYTHON [--graphs heco-acm,mag-0.05 --epochs 5]`
//! writes the split (graphs::link, as `hetgnn train` draws it) for DGL to
//! read, prints a table and writes bench/results/link.json.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::Command;

use actors::Config;
use anyhow::{bail, Context};
use clap::Parser;
use graphs::link::{eval_negatives, EdgeList, LinkEdges};

#[derive(Parser)]
struct Args {
    /// Graphs: `heco-acm` (author__writes__paper, from the shared datasets) and/or `mag-S` (mag-like at scale S, author__writes__paper).
    #[arg(long, default_value = "heco-acm,mag-0.05", value_delimiter = ',')]
    graphs: Vec<String>,
    /// Training seeds (the split is the same for all).
    #[arg(long, default_value = "0,1,2", value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Epochs per run.
    #[arg(long, default_value_t = 5)]
    epochs: u64,
    /// Positive edges per step.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Negatives per positive edge.
    #[arg(long, default_value_t = 5)]
    negatives: usize,
    /// Fixed negatives per held-out edge.
    #[arg(long, default_value_t = 1000)]
    eval_negatives: usize,
    /// Further `--set` overrides for hetgnn (the DGL side does not follow them).
    #[arg(long = "set")]
    set: Vec<String>,
    /// A Python interpreter with dgl 2.1 and torch 2.2.1: also train DGL's model.
    #[arg(long)]
    dgl: Option<PathBuf>,
    /// Where the heco-acm graph is.
    #[arg(long, default_value = "../shared/datasets/heco-acm")]
    acm: PathBuf,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/link.json")]
    out: PathBuf,
}

const RELATION: &str = "author__writes__paper";

/// Writes the split as DGL reads it: `[3, n]` int64 (relation, source,
/// destination) per split, and `[n, k]` evaluation negatives.
fn write_split(data: &Path, dir: &Path, a: &Args) -> anyhow::Result<(u64, u64, u64)> {
    let g = graphs::load(
        data,
        &graphs::LoadOptions {
            mmap_features: true,
            reverse_edges: false,
        },
    )?;
    // The split `hetgnn` draws under the same overrides.
    let mut o = vec![
        "training.task=\"link-prediction\"".to_string(),
        format!("training.target_relations=[{RELATION:?}]"),
    ];
    o.extend(a.set.iter().cloned());
    let cfg = Config::parse("", &o)?;
    let spec = cfg.training.split_spec();
    let e = LinkEdges::split(&g, &[RELATION.into()], &spec)?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("relations.json"),
        serde_json::to_string(&[RELATION])?,
    )?;
    let rel = g.relation(e.relations[0]);
    let count = g.node_type(rel.dst).count;
    let flat = |l: &EdgeList| -> Vec<i64> {
        l.rel
            .iter()
            .map(|&r| i64::from(r))
            .chain(l.src.iter().map(|&v| i64::from(v)))
            .chain(l.dst.iter().map(|&v| i64::from(v)))
            .collect()
    };
    for (name, l) in [("train", &e.train), ("valid", &e.valid), ("test", &e.test)] {
        graphs::npy::write_i64(
            &dir.join(format!("{name}.npy")),
            &[3, l.len() as u64],
            &flat(l),
        )?;
        if name != "train" {
            let negs: Vec<i64> = (0..l.len())
                .flat_map(|i| {
                    eval_negatives(rel.key(), l.src[i], l.dst[i], a.eval_negatives, count)
                })
                .map(i64::from)
                .collect();
            graphs::npy::write_i64(
                &dir.join(format!("{name}_neg.npy")),
                &[l.len() as u64, a.eval_negatives as u64],
                &negs,
            )?;
        }
    }
    Ok((
        e.train.len() as u64,
        e.valid.len() as u64,
        e.test.len() as u64,
    ))
}

/// One hetgnn run: (mean epoch seconds, final test metrics, final valid MRR).
fn hetgnn(
    data: &Path,
    seed: u64,
    a: &Args,
) -> anyhow::Result<(f64, actors::task::link::LinkEpoch, Vec<actors::EpochReport>)> {
    let mut o = vec![
        format!("training.data={:?}", data.display().to_string()),
        "training.task=\"link-prediction\"".into(),
        format!("training.target_relations=[{RELATION:?}]"),
        format!("training.epochs={}", a.epochs),
        format!("training.batch={}", a.batch),
        format!("training.negatives={}", a.negatives),
        format!("training.eval_negatives={}", a.eval_negatives),
        format!("training.seed={seed}"),
    ];
    o.extend(a.set.iter().cloned());
    let cfg = Config::parse("", &o)?;
    let (report, _) = actors::train(&cfg, &mut ())?;
    let n = report.epochs.len().max(1) as f64;
    let secs = report.epochs.iter().map(|e| e.time.seconds).sum::<f64>() / n;
    let last = report
        .epochs
        .last()
        .and_then(|e| e.link)
        .context("no link figures")?;
    Ok((secs, last, report.epochs))
}

fn dgl(
    python: &Path,
    data: &Path,
    split: &Path,
    seed: u64,
    a: &Args,
    threads: usize,
) -> anyhow::Result<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines/dgl_link.py");
    let out = Command::new(python)
        .arg(&script)
        .args([
            "--data",
            &data.display().to_string(),
            "--split",
            &split.display().to_string(),
        ])
        .args([
            "--epochs",
            &a.epochs.to_string(),
            "--batch",
            &a.batch.to_string(),
            "--negatives",
            &a.negatives.to_string(),
        ])
        .args([
            "--seed",
            &seed.to_string(),
            "--threads",
            &threads.to_string(),
        ])
        .output()
        .context("running the DGL baseline")?;
    if !out.status.success() {
        bail!(
            "the DGL baseline failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let last = out
        .stdout
        .rsplit(|&b| b == b'\n')
        .find(|l| !l.is_empty())
        .unwrap_or(&[]);
    serde_json::from_slice(last).context("the DGL baseline's report")
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let m = v.iter().sum::<f64>() / n;
    (
        m,
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt(),
    )
}

fn main() -> anyhow::Result<()> {
    models::threads::init_cpu_threads();
    runtime::alloc::keep_freed_memory();
    let a = Args::parse();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let work = tempfile::tempdir()?;
    let mut rows = Vec::new();
    for name in &a.graphs {
        let data = match name.strip_prefix("mag-") {
            Some(s) => bench::mag_like(
                s.parse()
                    .with_context(|| format!("--graphs {name}: not mag-SCALE"))?,
                0,
            )?,
            None if name == "heco-acm" => a.acm.clone(),
            None => bail!("--graphs {name}: expected heco-acm or mag-SCALE"),
        };
        let split = work.path().join(name);
        let (train, valid, test) = write_split(&data, &split, &a)?;
        println!("{name}: {train} training, {valid} validation, {test} test edges ({RELATION}); {} epochs, batch {}, {} negatives", a.epochs, a.batch, a.negatives);
        let mut runs = Vec::new();
        let (mut ours_mrr, mut theirs_mrr, mut ours_s, mut theirs_s) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &seed in &a.seeds {
            let (secs, m, epochs) = hetgnn(&data, seed, &a)?;
            println!("  seed {seed} hetgnn: {secs:>7.2} s/epoch  test MRR {:.4}  Hits@1 {:.4}  Hits@10 {:.4}  Hits@100 {:.4}", m.test.mrr, m.test.hits1, m.test.hits10, m.test.hits100);
            ours_mrr.push(m.test.mrr);
            ours_s.push(secs);
            let mut run = serde_json::json!({ "seed": seed, "hetgnn": { "epoch_seconds": secs, "test": m.test, "valid": m.valid, "epochs": epochs } });
            if let Some(python) = &a.dgl {
                let r = dgl(python, &data, &split, seed, &a, cores)?;
                let s = bench::epoch_mean(&r, "seconds");
                let last = r["epochs"]
                    .as_array()
                    .and_then(|e| e.last())
                    .cloned()
                    .unwrap_or_default();
                let mrr = last["test"]["mrr"].as_f64().unwrap_or(f64::NAN);
                println!(
                    "  seed {seed} dgl:    {s:>7.2} s/epoch  test MRR {mrr:.4}  Hits@1 {:.4}  Hits@10 {:.4}  Hits@100 {:.4}",
                    last["test"]["hits1"].as_f64().unwrap_or(f64::NAN),
                    last["test"]["hits10"].as_f64().unwrap_or(f64::NAN),
                    last["test"]["hits100"].as_f64().unwrap_or(f64::NAN)
                );
                theirs_mrr.push(mrr);
                theirs_s.push(s);
                run["dgl"] = r;
            }
            runs.push(run);
        }
        let (om, osd) = mean_sd(&ours_mrr);
        let mut row = serde_json::json!({ "graph": name, "relation": RELATION, "train_edges": train, "valid_edges": valid, "test_edges": test,
            "hetgnn": { "test_mrr_mean": om, "test_mrr_sd": osd, "epoch_seconds_mean": mean_sd(&ours_s).0 }, "runs": runs });
        println!(
            "  hetgnn test MRR {om:.4} ± {osd:.4}, {:.2} s/epoch",
            mean_sd(&ours_s).0
        );
        if !theirs_mrr.is_empty() {
            let (tm, tsd) = mean_sd(&theirs_mrr);
            let ratio = mean_sd(&ours_s).0 / mean_sd(&theirs_s).0;
            println!("  dgl    test MRR {tm:.4} ± {tsd:.4}, {:.2} s/epoch: MRR difference {:+.2} points, time hetgnn/dgl {ratio:.2}x", mean_sd(&theirs_s).0, (om - tm) * 100.0);
            row["dgl"] = serde_json::json!({ "test_mrr_mean": tm, "test_mrr_sd": tsd, "epoch_seconds_mean": mean_sd(&theirs_s).0 });
            row["mrr_points_vs_dgl"] = serde_json::json!((om - tm) * 100.0);
            row["time_ratio_vs_dgl"] = serde_json::json!(ratio);
        }
        rows.push(row);
    }
    let json = serde_json::json!({ "epochs": a.epochs, "batch": a.batch, "negatives": a.negatives, "eval_negatives": a.eval_negatives, "cores": cores, "set": a.set, "graphs": rows });
    if let Some(parent) = a.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&json)? + "\n")?;
    println!("wrote {}", a.out.display());
    Ok(())
}
