//! Model averaging (CATGNN) against data-parallel training (DistDGL), both
//! run by this program on the same graphs:
//!
//! - accuracy: mag-like and heco-acm, 2 and 4 workers, seeds 0-2: the test
//!   accuracy at the epoch of best validation accuracy, both runs evaluated
//!   the same way, on the whole graph: every epoch's checkpoint through
//!   `hetgnn predict` (model averaging's own per-epoch figures are taken
//!   inside each partition, whose halo's neighbourhoods are cut, and are
//!   kept beside them);
//! - a sweep of `sync_every` (accuracy and averaging bytes per epoch);
//! - heco-acm's final accuracy after more epochs (`--long-epochs`);
//! - bytes per epoch over the wire: both modes as node processes on
//!   loopback links shaped as asked, data-parallel on METIS partitions,
//!   model averaging on SPRING partitions with halo features.
//!
//! `cargo build --release && cargo run --release -p bench --bin averaging
//! [-- --scale 0.05 --workers 2,4 --seeds 0,1,2 --epochs 20 --sweep 1,2,5,10,20 --parts accuracy,sweep,bytes]`
//! prints tables and writes bench/results/averaging.json.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Scale of the mag-like graph.
    #[arg(long, default_value_t = 0.05)]
    scale: f64,
    /// The heco-acm graph directory (default: $HETGNN_DATASETS/heco-acm, else ../shared/datasets/heco-acm).
    #[arg(long)]
    acm: Option<PathBuf>,
    /// Worker (and partition) counts.
    #[arg(long, default_value = "2,4", value_delimiter = ',')]
    workers: Vec<usize>,
    /// Seeds.
    #[arg(long, default_value = "0,1,2", value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Epochs per accuracy run.
    #[arg(long, default_value_t = 20)]
    epochs: u64,
    /// `sync_every` values of the sweep (mag-like, the largest worker count, the first seed).
    #[arg(long, default_value = "1,2,5,10,20", value_delimiter = ',')]
    sweep: Vec<u64>,
    /// Epochs of the wire-bytes runs.
    #[arg(long, default_value_t = 2)]
    bytes_epochs: u64,
    /// Link bandwidth cap of the wire-bytes runs.
    #[arg(long, default_value = "10Gbit/s")]
    bandwidth: String,
    /// Fixed one-way link delay of the wire-bytes runs, in milliseconds.
    #[arg(long, default_value_t = 0.1)]
    delay_ms: f64,
    /// Epochs of the long heco-acm runs (part `long`: final accuracy of both modes).
    #[arg(long, default_value_t = 100)]
    long_epochs: u64,
    /// What to run.
    #[arg(
        long,
        default_value = "accuracy,sweep,bytes,long",
        value_delimiter = ','
    )]
    parts: Vec<String>,
    /// Graphs of the accuracy part: mag (mag-like) and acm (heco-acm).
    #[arg(long, default_value = "mag,acm", value_delimiter = ',')]
    graphs: Vec<String>,
    /// Seeds per step of every training run (default: hetgnn's, 1024).
    #[arg(long)]
    batch: Option<usize>,
    /// Further `section.key=value` settings for every training run (repeatable).
    #[arg(long = "set")]
    set: Vec<String>,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/averaging.json")]
    out: PathBuf,
}

/// Runs `hetgnn args` in `dir`.
fn hetgnn(bin: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    bench::run_hetgnn(
        bin,
        dir,
        &args.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    )
}

/// Partitions `data` into `k` parts with `method` (halo feature rows kept), once.
fn partitions(
    bin: &Path,
    work: &Path,
    name: &str,
    data: &Path,
    method: &str,
    k: usize,
) -> anyhow::Result<PathBuf> {
    let out = work.join(format!("parts-{name}-{method}-{k}"));
    if !out.join("manifest.json").exists() {
        eprintln!("partitioning {name} ({method}, {k} parts)");
        hetgnn(
            bin,
            work,
            &[
                "partition",
                "--data",
                &data.display().to_string(),
                "--parts",
                &k.to_string(),
                "--method",
                method,
                "--halo-features",
                "--out",
                &out.display().to_string(),
                "--force",
            ],
        )?;
    }
    Ok(out)
}

fn read(path: &Path) -> anyhow::Result<Value> {
    serde_json::from_str(
        &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))
}

/// Whole-graph validation and test accuracy of every checkpoint under
/// `root` (or only the newest), in step order.
fn checkpoint_accuracy(
    bin: &Path,
    work: &Path,
    root: &Path,
    data: &Path,
    newest_only: bool,
) -> anyhow::Result<Vec<(f64, f64)>> {
    let g = graphs::load(data, &graphs::LoadOptions::default())?;
    let (labels, splits) = g.target_labels();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
        })
        .collect();
    dirs.sort();
    if newest_only {
        dirs = dirs.split_off(dirs.len().saturating_sub(1));
    }
    let mut out = Vec::new();
    for d in dirs {
        let pred = work.join("pred.npy");
        let _ = std::fs::remove_file(&pred);
        hetgnn(
            bin,
            work,
            &[
                "predict",
                "--checkpoint",
                &d.display().to_string(),
                "--data",
                &data.display().to_string(),
                "--out",
                &pred.display().to_string(),
            ],
        )?;
        let p = graphs::npy::NpyFile::open(&pred, graphs::npy::DType::I64)?;
        let acc = |ids: &[u32]| {
            ids.iter()
                .filter(|&&v| p.i64_at(v as usize) == labels[v as usize])
                .count() as f64
                / ids.len().max(1) as f64
        };
        out.push((acc(&splits.valid), acc(&splits.test)));
    }
    Ok(out)
}

/// The test accuracy at the first epoch of best validation accuracy.
fn best_valid(epochs: &[(f64, f64)]) -> f64 {
    epochs
        .iter()
        .fold(
            (f64::MIN, 0.0),
            |best, &(v, t)| if v > best.0 { (v, t) } else { best },
        )
        .1
}

/// One run of `mode` on `parts`, checkpointing every epoch (or round) and keeping all;
/// `sets`: further `--set` overrides.
#[allow(clippy::too_many_arguments)]
fn train(
    bin: &Path,
    work: &Path,
    mode: &str,
    parts: &Path,
    epochs: u64,
    seed: u64,
    sync_every: u64,
    tag: &str,
    sets: &[String],
) -> anyhow::Result<(Value, PathBuf)> {
    let (report, ck) = (
        work.join(format!("{tag}.json")),
        work.join(format!("ck-{tag}")),
    );
    let _ = std::fs::remove_dir_all(&ck);
    let keep = format!("training.checkpoint_keep={}", epochs + 1);
    let sync = format!("training.model-averaging.sync_every={sync_every}");
    let args = [
        "train",
        "--force",
        "--mode",
        mode,
        "--partitions",
        &parts.display().to_string(),
        "--epochs",
        &epochs.to_string(),
        "--seed",
        &seed.to_string(),
        "--checkpoint",
        &ck.display().to_string(),
        "--set",
        &keep,
        "--set",
        &sync,
        "--report",
        &report.display().to_string(),
    ];
    let mut args: Vec<&str> = args.to_vec();
    for s in sets {
        args.extend(["--set", s.as_str()]);
    }
    hetgnn(bin, work, &args)?;
    Ok((read(&report)?, ck))
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Wire bytes of a run report per epoch (everything its nodes sent).
fn bytes_per_epoch(r: &Value) -> f64 {
    let total: u64 = r["bytes_by_kind"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
    total as f64 / r["epochs"].as_array().map_or(1, Vec::len).max(1) as f64
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.hetgnn.clone())?;
    let work = bench::data_root().join("averaging");
    std::fs::create_dir_all(&work)?;
    let mag = bench::mag_like(a.scale, 0)?;
    let acm = a.acm.clone().unwrap_or_else(|| {
        std::env::var_os("HETGNN_DATASETS")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/datasets"))
            .join("heco-acm")
    });
    let mag_name = format!("mag-like-S{}", a.scale);
    let graphs: Vec<(String, PathBuf)> = vec![
        (mag_name.clone(), mag.clone()),
        ("heco-acm".to_string(), acm),
    ];
    let chosen: Vec<&(String, PathBuf)> = graphs
        .iter()
        .zip(["mag", "acm"])
        .filter(|(_, key)| a.graphs.iter().any(|g| g == key))
        .map(|(g, _)| g)
        .collect();
    let sets: Vec<String> = a
        .batch
        .map(|b| format!("training.batch={b}"))
        .into_iter()
        .chain(a.set.iter().cloned())
        .collect();
    let train = |mode: &str, parts: &Path, epochs: u64, seed: u64, sync_every: u64, tag: &str| {
        train(
            &bin, &work, mode, parts, epochs, seed, sync_every, tag, &sets,
        )
    };
    let mut out = json!({ "scale": a.scale, "epochs": a.epochs, "seeds": a.seeds, "workers": a.workers, "batch": a.batch, "set": a.set });

    if a.parts.iter().any(|p| p == "accuracy") {
        let mut rows = Vec::new();
        println!("best-validation test accuracy, whole-graph evaluation of every epoch's model; {} epochs, sync every epoch", a.epochs);
        println!(
            "{:<18} {:>3} {:>22} {:>22} {:>8} {:>22}",
            "graph",
            "k",
            "data-parallel (METIS)",
            "model averaging",
            "diff",
            "averaging, local eval"
        );
        for (name, data) in chosen.iter().copied() {
            for &k in &a.workers {
                let dp_parts = partitions(&bin, &work, name, data, "metis", k)?;
                let ma_parts = partitions(&bin, &work, name, data, "spring", k)?;
                let (mut dp, mut ma, mut local) = (Vec::new(), Vec::new(), Vec::new());
                for &seed in &a.seeds {
                    eprintln!("{name}, {k} workers, seed {seed}");
                    let (_, ck) = train("data-parallel", &dp_parts, a.epochs, seed, 1, "dp")?;
                    dp.push(best_valid(&checkpoint_accuracy(
                        &bin, &work, &ck, data, false,
                    )?));
                    let (r, ck) = train("model-averaging", &ma_parts, a.epochs, seed, 1, "ma")?;
                    ma.push(best_valid(&checkpoint_accuracy(
                        &bin, &work, &ck, data, false,
                    )?));
                    let per_epoch: Vec<(f64, f64)> = r["epochs"]
                        .as_array()
                        .map_or(&[][..], Vec::as_slice)
                        .iter()
                        .map(|e| {
                            (
                                e["valid_acc"].as_f64().unwrap_or(0.0),
                                e["test_acc"].as_f64().unwrap_or(0.0),
                            )
                        })
                        .collect();
                    local.push(best_valid(&per_epoch));
                }
                let f = |v: &[f64]| {
                    format!(
                        "{:.4} ({})",
                        mean(v),
                        v.iter()
                            .map(|x| format!("{x:.3}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                };
                println!(
                    "{:<18} {:>3} {:>22} {:>22} {:>+8.4} {:>22}",
                    name,
                    k,
                    f(&dp),
                    f(&ma),
                    mean(&ma) - mean(&dp),
                    f(&local)
                );
                rows.push(json!({ "graph": name, "workers": k, "data_parallel": dp, "model_averaging": ma, "model_averaging_local_eval": local, "diff": mean(&ma) - mean(&dp) }));
            }
        }
        out["accuracy"] = Value::Array(rows);
    }

    if a.parts.iter().any(|p| p == "sweep") {
        let k = a.workers.iter().copied().max().unwrap_or(4);
        let seed = a.seeds.first().copied().unwrap_or(0);
        let parts = partitions(&bin, &work, &mag_name, &mag, "spring", k)?;
        println!(
            "sync_every sweep: mag-like S={}, {k} workers, seed {seed}, {} epochs",
            a.scale, a.epochs
        );
        println!(
            "{:>10} {:>16} {:>22} {:>12}",
            "sync_every", "best-valid test", "averaging MB/epoch", "epoch s"
        );
        let mut rows = Vec::new();
        for &s in &a.sweep {
            eprintln!("sweep: sync_every {s}");
            let (r, ck) = train("model-averaging", &parts, a.epochs, seed, s, "sweep")?;
            let acc = best_valid(&checkpoint_accuracy(&bin, &work, &ck, &mag, false)?);
            let mb = bench::epoch_mean(&r, "averaging_bytes") / 1e6;
            let secs = bench::epoch_mean(&r, "seconds");
            println!("{:>10} {:>16.4} {:>22.2} {:>12.2}", s, acc, mb, secs);
            rows.push(json!({ "sync_every": s, "test_acc": acc, "averaging_mb_per_epoch": mb, "epoch_s": secs }));
        }
        out["sweep"] = Value::Array(rows);
    }

    if a.parts.iter().any(|p| p == "long") {
        let (name, data) = &graphs[1];
        println!(
            "{name}, {} epochs: whole-graph test accuracy of the final model",
            a.long_epochs
        );
        println!(
            "{:>3} {:>22} {:>22} {:>8}",
            "k", "data-parallel (METIS)", "model averaging", "diff"
        );
        let mut rows = Vec::new();
        for &k in &a.workers {
            let (mut dp, mut ma) = (Vec::new(), Vec::new());
            for &seed in &a.seeds {
                eprintln!("{name}, {k} workers, seed {seed}, {} epochs", a.long_epochs);
                for (mode, method, out) in [
                    ("data-parallel", "metis", &mut dp),
                    ("model-averaging", "spring", &mut ma),
                ] {
                    let parts = partitions(&bin, &work, name, data, method, k)?;
                    let (_, ck) = train(mode, &parts, a.long_epochs, seed, 1, "long")?;
                    // The newest checkpoint is the final model.
                    let last = checkpoint_accuracy(&bin, &work, &ck, data, true)?
                        .last()
                        .map_or(0.0, |e| e.1);
                    out.push(last);
                }
            }
            let f = |v: &[f64]| {
                format!(
                    "{:.4} ({})",
                    mean(v),
                    v.iter()
                        .map(|x| format!("{x:.3}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            };
            println!(
                "{:>3} {:>22} {:>22} {:>+8.4}",
                k,
                f(&dp),
                f(&ma),
                mean(&ma) - mean(&dp)
            );
            rows.push(json!({ "workers": k, "epochs": a.long_epochs, "data_parallel": dp, "model_averaging": ma }));
        }
        out["long"] = Value::Array(rows);
    }

    if a.parts.iter().any(|p| p == "bytes") {
        println!("wire bytes per epoch, node processes on loopback ({} + {} ms), mag-like S={}, {} epochs", a.bandwidth, a.delay_ms, a.scale, a.bytes_epochs);
        println!(
            "{:>3} {:>22} {:>22} {:>8}",
            "k", "data-parallel MB", "model averaging MB", "ratio"
        );
        let mut rows = Vec::new();
        for &k in &a.workers {
            let mut mb = Vec::new();
            for (mode, method) in [("data-parallel", "metis"), ("model-averaging", "spring")] {
                let parts = partitions(&bin, &work, &mag_name, &mag, method, k)?;
                let report = format!("wire-{mode}-{k}.json");
                let mut toml = bench::local_cluster(&bin, &work, k)?;
                toml += &format!(
                    "[training]\nmode = {mode:?}\npartitions = {:?}\nepochs = {}\nreport = {report:?}\n[links]\nbandwidth = {:?}\ndelay = {{ dist = \"fixed\", ms = {} }}\n",
                    parts.display().to_string(),
                    a.bytes_epochs,
                    a.bandwidth,
                    a.delay_ms
                );
                std::fs::write(work.join("cluster.toml"), toml)?;
                eprintln!("{mode}, {k} node processes");
                hetgnn(
                    &bin,
                    &work,
                    &["launch", "--force", "--config", "cluster.toml"],
                )?;
                mb.push(bytes_per_epoch(&read(&work.join(&report))?) / 1e6);
            }
            println!(
                "{:>3} {:>22.1} {:>22.1} {:>7.1}x",
                k,
                mb[0],
                mb[1],
                mb[0] / mb[1].max(1e-9)
            );
            rows.push(json!({ "workers": k, "data_parallel_mb_per_epoch": mb[0], "model_averaging_mb_per_epoch": mb[1], "ratio": mb[0] / mb[1].max(1e-9) }));
        }
        out["bytes"] = Value::Array(rows);
    }

    if let Some(p) = a.out.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&out)?)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
