//! ByteGNN's block partitioner against METIS and random, measured the way
//! data-parallel training feels them.
//!
//! Each partitioning runs as its own `hetgnn partition` process, so its time
//! and peak memory (from its `report.json`) are its own; the edge cut and
//! the train/valid/test balance (largest over mean of each split's owned
//! nodes; the figure reported is the worst of the three) come from the same
//! report. Then, in this process, training steps are sampled with the real
//! sampler ([`graphs::Sampler`], the training defaults: fanouts 25,20, batch
//! 1024, reverse relations added except on planetoid-cora, whose citations
//! are stored both ways), `--epochs` epochs of batches in
//! [`graphs::sampler::epoch_batches`]' order. Seeds are assigned as
//! data-parallel training's `seed_assignment = "owner"` does: partition `k`'s
//! share of a batch is the seeds it owns, sampled as one mini-batch. Per
//! step, summed over the partitions:
//!
//! - **input rows**: the sources of the share's first block (every type);
//!   **remote** ones are not owned by the partition, so their features (or
//!   learnable embeddings) are pulled from their owners;
//! - **sampling bytes**: per hop, every destination the partition does not
//!   own is asked of its owner: 4 bytes per node id asked, and back, per
//!   relation into its type, 4 bytes per offset (one per asked node, plus
//!   one) and 4 bytes per picked neighbour id ([`graphs::RelationPicks`]'
//!   payload; framing and headers not counted);
//! - **pull bytes**: remote input rows × row width × 4 bytes, the width being
//!   the type's feature width, or the learnable embedding width (64, the
//!   default `embed_dim`) for a featureless type.
//!
//! The same figures are computed a second time with batches drawn from all
//! labelled nodes (train, valid and test, as sampled evaluation reads them):
//! the real graphs have 60 to 140 training nodes, a single short batch per
//! epoch, too few for the training figures alone to say much. Ratios to
//! METIS are per graph and partition count (`rows/M`, `bytes/M`; `L…` for
//! the labelled-node batches).
//!
//! `cargo build --release && cargo run --release -p bench --bin bytegnn_partition
//! [-- --scales 0.05,0.1 --parts 2,4 --methods bytegnn,metis,random --epochs 2
//! --seeds 0,1,2,3,4]`
//! prints a table and writes bench/results/bytegnn-partition.json. A method
//! `bytegnn-hH-cC-pP-wW-bB` is bytegnn with `--bytegnn-hops H`,
//! `--bytegnn-clusters C`, `--bytegnn-passes P`, `--bytegnn-type-weight W`
//! and `--bytegnn-balance-weight B` (any subset, in any order; `-greedy` and
//! `-metis` set `--bytegnn-place`, `-nofollow` turns the last step off with
//! `--bytegnn-seed-weights 0,0,0`), for tuning:
//! `bytegnn-greedy-c0-p0-nofollow` is the paper's Algorithm 2 with only its
//! fixes.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use graphs::partition::PartitionSet;
use graphs::sampler::epoch_batches;
use graphs::{HetGraph, LoadOptions, Sampler};
use rayon::prelude::*;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Scales of the mag-like graph (none: `--scales ""`).
    #[arg(long, default_value = "0.05,0.1", value_delimiter = ',')]
    scales: Vec<String>,
    /// Real graphs, folders of `--datasets` (none: `--real ""`).
    #[arg(
        long,
        default_value = "heco-acm,planetoid-cora,heco-freebase",
        value_delimiter = ','
    )]
    real: Vec<String>,
    /// Where the real graphs are: `$HETGNN_DATASETS`, else ../shared/datasets
    /// beside the workspace.
    #[arg(long)]
    datasets: Option<PathBuf>,
    /// Partition counts.
    #[arg(long, default_value = "2,4", value_delimiter = ',')]
    parts: Vec<usize>,
    /// Methods (the first ratio column compares with metis).
    #[arg(
        long,
        default_value = "bytegnn,bytegnn-greedy,metis,random",
        value_delimiter = ','
    )]
    methods: Vec<String>,
    /// Fanouts per hop, seeds outward (training's default).
    #[arg(long, default_value = "25,20", value_delimiter = ',')]
    fanouts: Vec<usize>,
    /// Seeds per step (training's default).
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Epochs of steps sampled.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Width of a featureless type's learnable embedding rows (training's `embed_dim`).
    #[arg(long, default_value_t = 64)]
    embed_dim: usize,
    /// Partitioner seeds: each partitioning runs once per seed, and with
    /// several a summary gives each ratio's mean and range over them (the
    /// real graphs' 60-140 training nodes make one batch per epoch, so a
    /// single seed's ratio is a small sample).
    #[arg(long, default_value = "0", value_delimiter = ',')]
    seeds: Vec<u64>,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench/results/bytegnn-partition.json")]
    out: PathBuf,
}

/// A graph to partition: its directory, name, and whether training adds reverse relations.
struct Graph {
    name: String,
    dir: PathBuf,
    reverse: bool,
}

/// `method` as `hetgnn partition` flags (`bytegnn-h1-p3-w0.5` sets bytegnn's options).
fn method_flags(method: &str, reverse: bool) -> anyhow::Result<Vec<String>> {
    let mut parts = method.split('-');
    let base = parts.next().unwrap_or_default();
    let mut flags = vec!["--method".to_string(), base.to_string()];
    for opt in parts {
        if opt == "metis" || opt == "greedy" {
            flags.extend(["--bytegnn-place".to_string(), opt.to_string()]);
            continue;
        }
        if opt == "nofollow" {
            flags.extend(["--bytegnn-seed-weights".to_string(), "0,0,0".to_string()]);
            continue;
        }
        let (flag, value) = match opt.split_at(1) {
            ("h", v) => ("--bytegnn-hops", v),
            ("p", v) => ("--bytegnn-passes", v),
            ("w", v) => ("--bytegnn-type-weight", v),
            ("b", v) => ("--bytegnn-balance-weight", v),
            ("c", v) => ("--bytegnn-clusters", v),
            _ => anyhow::bail!(
                "method '{method}': '{opt}' is not hN, pN, cN, wX, bX, metis, greedy or nofollow"
            ),
        };
        flags.extend([flag.to_string(), value.to_string()]);
    }
    if base == "bytegnn" && !reverse {
        flags.push("--no-reverse-edges".into());
    }
    Ok(flags)
}

/// One `hetgnn partition` run into `out`: its report.
fn partition(
    bin: &Path,
    g: &Graph,
    method: &str,
    parts: usize,
    seed: u64,
    out: &Path,
) -> anyhow::Result<Value> {
    let mut args: Vec<String> = [
        "partition",
        "--data",
        &g.dir.display().to_string(),
        "--parts",
        &parts.to_string(),
        "--seed",
        &seed.to_string(),
        "--out",
        &out.display().to_string(),
        "--force",
    ]
    .map(String::from)
    .to_vec();
    args.extend(method_flags(method, g.reverse)?);
    bench::run_hetgnn(bin, &bench::data_root(), &args)?;
    Ok(serde_json::from_slice(&std::fs::read(
        out.join("report.json"),
    )?)?)
}

/// What sampling the training steps came to, summed over steps.
#[derive(Default, Clone, Copy)]
struct Traffic {
    steps: u64,
    input_rows: u64,
    remote_rows: u64,
    /// Largest remote input rows of one partition in one step, summed over steps.
    max_part_remote_rows: u64,
    remote_frontier: u64,
    sampling_bytes: u64,
    pull_bytes: u64,
}

impl Traffic {
    fn add(mut self, o: Traffic) -> Traffic {
        self.steps += o.steps;
        self.input_rows += o.input_rows;
        self.remote_rows += o.remote_rows;
        self.max_part_remote_rows += o.max_part_remote_rows;
        self.remote_frontier += o.remote_frontier;
        self.sampling_bytes += o.sampling_bytes;
        self.pull_bytes += o.pull_bytes;
        self
    }
    fn per_step(&self, x: u64) -> f64 {
        x as f64 / self.steps.max(1) as f64
    }
}

/// Samples `epochs` epochs of steps with owner seed assignment and counts the traffic.
fn traffic(
    g: &HetGraph,
    owners: &[Vec<u16>],
    parts: usize,
    args: &Args,
    seeds: &[u32],
) -> anyhow::Result<Traffic> {
    let target = g.target().index();
    let width: Vec<u64> = g
        .node_types()
        .iter()
        .map(|t| t.features.as_ref().map_or(args.embed_dim, |f| f.dim()) as u64)
        .collect();
    let steps: Vec<(u64, u64, Vec<u32>)> = (0..args.epochs)
        .flat_map(|e| {
            epoch_batches(seeds, args.batch, 0, e)
                .into_iter()
                .enumerate()
                .map(move |(s, b)| (e, s as u64, b))
        })
        .collect();
    let per_chunk: Vec<anyhow::Result<Traffic>> = steps
        .par_chunks(steps.len().div_ceil(rayon::current_num_threads()).max(1))
        .map(|chunk| {
            let mut sampler = Sampler::new(g, &args.fanouts, 0)?;
            let mut sum = Traffic::default();
            for (epoch, step, batch) in chunk {
                sum.steps += 1;
                let mut worst = 0u64;
                for k in 0..parts as u16 {
                    let share: Vec<u32> = batch
                        .iter()
                        .copied()
                        .filter(|&v| owners[target][v as usize] == k)
                        .collect();
                    if share.is_empty() {
                        continue;
                    }
                    let mb = sampler.sample(*epoch, *step, &share)?;
                    let away = |t: usize, v: u32| owners[t][v as usize] != k;
                    for block in &mb.blocks {
                        for (t, dst) in block.dst.iter().enumerate() {
                            let asked = dst.iter().filter(|&&v| away(t, v)).count() as u64;
                            sum.remote_frontier += asked;
                            sum.sampling_bytes += 4 * asked;
                        }
                        for r in &block.relations {
                            let t = g.relation(r.relation).dst.index();
                            let dst = &block.dst[t];
                            let asked: Vec<usize> =
                                (0..dst.len()).filter(|&i| away(t, dst[i])).collect();
                            if asked.is_empty() {
                                continue;
                            }
                            let picks: u64 = asked
                                .iter()
                                .map(|&i| u64::from(r.offsets[i + 1] - r.offsets[i]))
                                .sum();
                            sum.sampling_bytes += 4 * (asked.len() as u64 + 1) + 4 * picks;
                        }
                    }
                    let mut remote = 0u64;
                    for (t, src) in mb.blocks[0].src.iter().enumerate() {
                        let r = src.iter().filter(|&&v| away(t, v)).count() as u64;
                        sum.input_rows += src.len() as u64;
                        remote += r;
                        sum.pull_bytes += r * width[t] * 4;
                    }
                    sum.remote_rows += remote;
                    worst = worst.max(remote);
                }
                sum.max_part_remote_rows += worst;
            }
            Ok(sum)
        })
        .collect();
    per_chunk
        .into_iter()
        .try_fold(Traffic::default(), |acc, t| Ok(acc.add(t?)))
}

fn worst_of(map: &Value) -> f64 {
    map.as_object().map_or(0.0, |m| {
        m.values().filter_map(Value::as_f64).fold(0.0, f64::max)
    })
}

/// With several seeds: per graph, parts and method, the mean, min and max
/// over the seeds of each ratio to METIS and the worst split balance, printed
/// and returned.
fn summarise(rows: &[Value], seeds: usize) -> Vec<Value> {
    let mut out = Vec::new();
    if seeds < 2 {
        return out;
    }
    let mut keys: Vec<(String, u64, String)> = Vec::new();
    for r in rows {
        let key = (
            r["graph"].as_str().unwrap_or("").to_string(),
            r["parts"].as_u64().unwrap_or(0),
            r["method"].as_str().unwrap_or("").to_string(),
        );
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    println!("over {seeds} seeds: mean (min-max) of the ratios to METIS; t/v/t the worst");
    println!(
        "{:<14} {:>2} {:<20} {:>21} {:>21} {:>21} {:>6}",
        "graph", "k", "method", "remote rows", "bytes/step", "remote rows, all lab.", "t/v/t"
    );
    for (graph, k, method) in keys {
        let of = |f: &dyn Fn(&Value) -> f64| -> (f64, f64, f64) {
            let v: Vec<f64> = rows
                .iter()
                .filter(|r| {
                    r["graph"] == graph.as_str()
                        && r["parts"] == k
                        && r["method"] == method.as_str()
                })
                .map(f)
                .collect();
            let n = v.len().max(1) as f64;
            (
                v.iter().sum::<f64>() / n,
                v.iter().copied().fold(f64::INFINITY, f64::min),
                v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            )
        };
        let rows_vs = of(&|r| r["remote_rows_vs_metis"].as_f64().unwrap_or(f64::NAN));
        let bytes_vs = of(&|r| r["bytes_vs_metis"].as_f64().unwrap_or(f64::NAN));
        let l_rows_vs = of(&|r| {
            r["labelled_seeds"]["remote_rows_vs_metis"]
                .as_f64()
                .unwrap_or(f64::NAN)
        });
        let tvt = of(&|r| r["split_balance_worst"].as_f64().unwrap_or(f64::NAN)).2;
        let show = |(m, lo, hi): (f64, f64, f64)| format!("{m:.3} ({lo:.3}-{hi:.3})");
        println!(
            "{graph:<14} {k:>2} {method:<20} {:>21} {:>21} {:>21} {tvt:>6.3}",
            show(rows_vs),
            show(bytes_vs),
            show(l_rows_vs)
        );
        let j = |(m, lo, hi): (f64, f64, f64)| json!({ "mean": m, "min": lo, "max": hi });
        out.push(json!({ "graph": graph, "parts": k, "method": method, "remote_rows_vs_metis": j(rows_vs), "bytes_vs_metis": j(bytes_vs),
            "labelled_remote_rows_vs_metis": j(l_rows_vs), "split_balance_worst": tvt }));
    }
    out
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = bench::hetgnn_bin(args.hetgnn.clone())?;
    let mut graphs_list = Vec::new();
    for scale in args.scales.iter().filter(|s| !s.is_empty()) {
        let scale: f64 = scale
            .parse()
            .with_context(|| format!("--scales: '{scale}' is not a number"))?;
        graphs_list.push(Graph {
            name: format!("mag-s{scale}"),
            dir: bench::mag_like(scale, 0)?,
            reverse: true,
        });
    }
    let datasets = args
        .datasets
        .clone()
        .or_else(|| std::env::var_os("HETGNN_DATASETS").map(PathBuf::from))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/datasets"));
    for name in args.real.iter().filter(|n| !n.is_empty()) {
        let dir = datasets.join(name);
        anyhow::ensure!(
            dir.join("schema.json").exists(),
            "{} is not a graph directory (set --datasets or HETGNN_DATASETS)",
            dir.display()
        );
        // Cora stores each citation both ways: training it adds no reverse relations.
        graphs_list.push(Graph {
            name: name.clone(),
            dir,
            reverse: name != "planetoid-cora",
        });
    }
    println!(
        "{:<14} {:>2} {:<20} {:>5} {:>5} {:>5} {:>6} {:>6} {:>8} {:>5} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7}",
        "graph", "k", "method", "sec", "MiB", "cut%", "t/v/t", "nodes", "rem.rows", "rem%", "rows/M", "MB/step", "smplMB", "bytes/M", "Lrows/M", "Lbyte/M"
    );
    let mut rows = Vec::new();
    for gr in &graphs_list {
        let g = graphs::load(
            &gr.dir,
            &LoadOptions {
                mmap_features: true,
                reverse_edges: gr.reverse,
            },
        )
        .with_context(|| format!("loading {}", gr.dir.display()))?;
        let (_, splits) = g.target_labels();
        let train = splits.train.clone();
        let mut labelled: Vec<u32> = splits
            .named()
            .iter()
            .flat_map(|(_, ids)| ids.iter().copied())
            .collect();
        labelled.sort_unstable();
        labelled.dedup();
        for &k in &args.parts {
            for &seed in &args.seeds {
                let mut metis = None;
                let mut results = Vec::new();
                for method in &args.methods {
                    let out =
                        bench::data_root().join(format!("bench-bytegnn-{method}-{k}-{}", gr.name));
                    let report = partition(&bin, gr, method, k, seed, &out)?;
                    let set = PartitionSet::open(&out)?;
                    let t = traffic(&g, &set.owners, k, &args, &train)?;
                    let l = traffic(&g, &set.owners, k, &args, &labelled)?;
                    let _ = std::fs::remove_dir_all(&out);
                    let bytes = t.per_step(t.sampling_bytes + t.pull_bytes);
                    if method == "metis" {
                        metis = Some((
                            t.per_step(t.remote_rows),
                            bytes,
                            l.per_step(l.remote_rows),
                            l.per_step(l.sampling_bytes + l.pull_bytes),
                        ));
                    }
                    results.push((method.clone(), report, t, bytes, l));
                }
                for (method, r, t, bytes, l) in results {
                    let cut = 100.0 * r["edge_cut"].as_f64().unwrap_or(0.0)
                        / r["total_edges"].as_f64().unwrap_or(1.0).max(1.0);
                    let tvt = worst_of(&r["split_balance"]);
                    let nodes = r["balance"].as_object().map_or(0.0, |m| {
                        m.iter()
                            .filter(|(k, _)| *k != "edges")
                            .filter_map(|(_, v)| v.as_f64())
                            .fold(0.0, f64::max)
                    });
                    let peak = r["peak_memory_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64;
                    let rows_vs =
                        metis.map_or(f64::NAN, |(m, ..)| t.per_step(t.remote_rows) / m.max(1.0));
                    let vs = metis.map_or(f64::NAN, |(_, m, ..)| bytes / m.max(1.0));
                    let l_bytes = l.per_step(l.sampling_bytes + l.pull_bytes);
                    let l_rows_vs = metis.map_or(f64::NAN, |(_, _, m, _)| {
                        l.per_step(l.remote_rows) / m.max(1.0)
                    });
                    let l_vs = metis.map_or(f64::NAN, |(.., m)| l_bytes / m.max(1.0));
                    let mb = |x: f64| x / 1e6;
                    println!(
                        "{:<14} {k:>2} {method:<20} {:>5.2} {peak:>5.0} {cut:>5.1} {tvt:>6.3} {nodes:>6.3} {:>8.0} {:>5.1} {rows_vs:>7.3} {:>8.2} {:>7.2} {vs:>7.3} {l_rows_vs:>7.3} {l_vs:>7.3}",
                        gr.name,
                        r["seconds"].as_f64().unwrap_or(0.0),
                        t.per_step(t.remote_rows),
                        100.0 * t.remote_rows as f64 / t.input_rows.max(1) as f64,
                        mb(bytes),
                        mb(t.per_step(t.sampling_bytes)),
                    );
                    rows.push(json!({
                        "graph": gr.name, "parts": k, "method": method, "seed": seed, "seconds": r["seconds"], "peak_memory_bytes": r["peak_memory_bytes"],
                        "edge_cut": r["edge_cut"], "total_edges": r["total_edges"], "edge_cut_percent": cut,
                        "split_balance": r["split_balance"], "split_balance_worst": tvt, "balance": r["balance"], "node_balance_worst": nodes,
                        "steps": t.steps, "input_rows_per_step": t.per_step(t.input_rows), "remote_rows_per_step": t.per_step(t.remote_rows),
                        "remote_rows_percent": 100.0 * t.remote_rows as f64 / t.input_rows.max(1) as f64,
                        "max_partition_remote_rows_per_step": t.per_step(t.max_part_remote_rows),
                        "remote_frontier_per_step": t.per_step(t.remote_frontier),
                        "sampling_bytes_per_step": t.per_step(t.sampling_bytes), "pull_bytes_per_step": t.per_step(t.pull_bytes),
                        "bytes_per_step": bytes, "remote_rows_vs_metis": rows_vs, "bytes_vs_metis": vs,
                        "labelled_seeds": { "steps": l.steps, "input_rows_per_step": l.per_step(l.input_rows), "remote_rows_per_step": l.per_step(l.remote_rows),
                            "sampling_bytes_per_step": l.per_step(l.sampling_bytes), "pull_bytes_per_step": l.per_step(l.pull_bytes), "bytes_per_step": l_bytes,
                            "remote_rows_vs_metis": l_rows_vs, "bytes_vs_metis": l_vs },
                    }));
                }
            }
        }
    }
    let summary = summarise(&rows, args.seeds.len());
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let config = json!({ "fanouts": args.fanouts, "batch": args.batch, "epochs": args.epochs, "embed_dim": args.embed_dim, "seeds": args.seeds });
    std::fs::write(
        &args.out,
        serde_json::to_string_pretty(
            &json!({ "config": config, "runs": rows, "over_seeds": summary }),
        )? + "\n",
    )?;
    println!("wrote {}", args.out.display());
    Ok(())
}
