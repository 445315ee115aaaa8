//! The whole CATGNN pipeline on a graph larger than METIS can partition on
//! this machine: generate a mag-like graph, partition it with streaming
//! SPRING (halo features kept), then train with model averaging on node
//! processes (one per partition, over QUIC on loopback). Prints the time of
//! each phase, each process's peak memory (the high-water mark, and the
//! anonymous part: mapped feature pages excluded), and the memory
//! arithmetic of a partition: the feature rows and learnable rows (with
//! their Adam state) it holds, against the whole graph's.
//!
//! `cargo build --release && cargo run --release -p bench --bin pipeline
//! [-- --scale 4 --parts 4 --epochs 1]` writes bench/results/pipeline.json.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Scale of the mag-like graph.
    #[arg(long, default_value_t = 4.0)]
    scale: f64,
    /// Partitions (and node processes).
    #[arg(long, default_value_t = 4)]
    parts: usize,
    /// Epochs of training.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Learnable embedding width.
    #[arg(long, default_value_t = 64)]
    embed_dim: u64,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/pipeline.json")]
    out: PathBuf,
}

fn read(path: &Path) -> anyhow::Result<Value> {
    serde_json::from_str(
        &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))
}

fn gib(b: f64) -> f64 {
    b / (1u64 << 30) as f64
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let bin = bench::hetgnn_bin(a.hetgnn.clone())?;
    let work = bench::data_root().join(format!("pipeline-s{}", a.scale));
    std::fs::create_dir_all(&work)?;
    let (data, parts) = (work.join("graph"), work.join("parts"));
    let run = |args: &[&str]| {
        bench::run_hetgnn(
            &bin,
            &work,
            &args.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    };

    let clock = Instant::now();
    let generated = if data.join("schema.json").exists() {
        eprintln!("reusing {}", data.display());
        None
    } else {
        eprintln!("generating mag-like S={}", a.scale);
        run(&[
            "generate",
            "--scale",
            &a.scale.to_string(),
            "--out",
            &data.display().to_string(),
            "--force",
        ])?;
        Some(clock.elapsed().as_secs_f64())
    };

    eprintln!("partitioning: spring, {} parts, halo features", a.parts);
    let clock = Instant::now();
    run(&[
        "partition",
        "--data",
        &data.display().to_string(),
        "--parts",
        &a.parts.to_string(),
        "--method",
        "spring",
        "--halo-features",
        "--out",
        &parts.display().to_string(),
        "--force",
    ])?;
    let partition_s = clock.elapsed().as_secs_f64();
    let pr = read(&parts.join("report.json"))?;

    eprintln!(
        "training: model averaging on {} node processes, {} epoch(s)",
        a.parts, a.epochs
    );
    // Loading a partition of a large graph takes a while: the peers wait for each other longer.
    let mut toml = bench::local_cluster(&bin, &work, a.parts)?.replacen(
        "[cluster]\n",
        "[cluster]\nstart_timeout_ms = 600000\n",
        1,
    );
    toml += &format!("[training]\nmode = \"model-averaging\"\npartitions = {:?}\nepochs = {}\nembed_dim = {}\nreport = \"train.json\"\n", parts.display().to_string(), a.epochs, a.embed_dim);
    std::fs::write(work.join("cluster.toml"), toml)?;
    let clock = Instant::now();
    run(&["launch", "--force", "--config", "cluster.toml"])?;
    let train_s = clock.elapsed().as_secs_f64();
    let tr = read(&work.join("train.json"))?;

    // The memory arithmetic of each partition, from the schema and the manifest.
    let schema = read(&data.join("schema.json"))?;
    let manifest = read(&parts.join("manifest.json"))?;
    let types: Vec<String> = manifest["node_types"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|t| t.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let dim = |t: &str| schema["node_types"][t]["feature_dim"].as_u64();
    let count = |t: &str| schema["node_types"][t]["count"].as_u64().unwrap_or(0);
    // A feature row: dim f32; a learnable row: value, two Adam moments (embed_dim f32 each) and a step count.
    let feature_bytes = |t: &str, n: u64| dim(t).map_or(0, |d| n * d * 4);
    let row_bytes = |t: &str, n: u64| {
        if dim(t).is_none() {
            n * (a.embed_dim * 12 + 4)
        } else {
            0
        }
    };
    let whole_features: u64 = types.iter().map(|t| feature_bytes(t, count(t))).sum();
    let whole_rows: u64 = types.iter().map(|t| row_bytes(t, count(t))).sum();
    let mut per_part = Vec::new();
    for (k, info) in manifest["info"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .enumerate()
    {
        let held = |i: usize| {
            info["core"][i].as_u64().unwrap_or(0) + info["halo"][i].as_u64().unwrap_or(0)
        };
        let f: u64 = types
            .iter()
            .enumerate()
            .map(|(i, t)| feature_bytes(t, held(i)))
            .sum();
        let r: u64 = types
            .iter()
            .enumerate()
            .map(|(i, t)| row_bytes(t, held(i)))
            .sum();
        per_part.push(json!({ "part": k, "feature_bytes": f, "row_bytes": r }));
    }
    let workers = tr["epochs"]
        .as_array()
        .and_then(|e| e.last())
        .map(|e| e["workers"].clone())
        .unwrap_or(Value::Null);

    println!(
        "mag-like S={} ({} parts, model averaging, {} epoch(s)) on this machine",
        a.scale, a.parts, a.epochs
    );
    println!(
        "graph: {} nodes, {} edges",
        types.iter().map(|t| count(t)).sum::<u64>(),
        pr["total_edges"]
    );
    match generated {
        Some(s) => println!("generate   {s:>8.1} s"),
        None => println!("generate   (reused)"),
    }
    println!(
        "partition  {partition_s:>8.1} s   peak {:.2} GiB (anonymous {:.2} GiB), replication {:.3}",
        gib(pr["peak_memory_bytes"].as_f64().unwrap_or(0.0)),
        gib(pr["peak_anon_bytes"].as_f64().unwrap_or(0.0)),
        pr["replication_factor"].as_f64().unwrap_or(0.0)
    );
    println!(
        "train      {train_s:>8.1} s   final test accuracy {:.4} (evaluated inside the partitions)",
        tr["epochs"]
            .as_array()
            .and_then(|e| e.last())
            .and_then(|e| e["test_acc"].as_f64())
            .unwrap_or(0.0)
    );
    for (w, rep) in workers
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .enumerate()
    {
        let p = &per_part[w.min(per_part.len().saturating_sub(1))];
        println!(
            "  worker {w}: peak {:.2} GiB (anonymous {:.2} GiB); holds features {:.2} GiB (mapped), learnable rows with Adam state {:.2} GiB",
            gib(rep["peak_memory_bytes"].as_f64().unwrap_or(0.0)),
            gib(rep["peak_anon_bytes"].as_f64().unwrap_or(0.0)),
            gib(p["feature_bytes"].as_f64().unwrap_or(0.0)),
            gib(p["row_bytes"].as_f64().unwrap_or(0.0))
        );
    }
    let held_f: u64 = per_part
        .iter()
        .filter_map(|p| p["feature_bytes"].as_u64())
        .sum();
    let held_r: u64 = per_part
        .iter()
        .filter_map(|p| p["row_bytes"].as_u64())
        .sum();
    println!(
        "whole graph: features {:.2} GiB, learnable rows with Adam state {:.2} GiB; all partitions together {:.2} and {:.2} GiB ({:.2}x and {:.2}x: the replication)",
        gib(whole_features as f64),
        gib(whole_rows as f64),
        gib(held_f as f64),
        gib(held_r as f64),
        held_f as f64 / whole_features.max(1) as f64,
        held_r as f64 / whole_rows.max(1) as f64
    );
    if let Some(p) = a.out.parent() {
        std::fs::create_dir_all(p)?;
    }
    let out = json!({
        "scale": a.scale, "parts": a.parts, "epochs": a.epochs,
        "generate_s": generated, "partition_s": partition_s, "train_s": train_s,
        "partition": pr, "workers": workers, "per_partition": per_part,
        "whole_feature_bytes": whole_features, "whole_row_bytes": whole_rows,
        "train_epochs": tr["epochs"],
    });
    std::fs::write(&a.out, serde_json::to_string_pretty(&out)?)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
