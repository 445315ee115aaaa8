//! `hetgnn import tables` against GraphStorm's `gconstruct` on the same
//! tables: mag-like graphs exported as Parquet tables with string ids, then
//! imported by each system (one partition for GraphStorm), runs interleaved.
//! Each run is its own process; the figures are wall time and the peak
//! resident memory of its process tree (sampled every 20 ms). Every hetgnn
//! import is checked to give back the original graph, byte for byte.
//!
//! `cargo build --release && cargo run --release -p bench --bin tables --
//! [--scales 0.05,0.5,1] [--repeats 2] [--graphstorm PYTHON]` prints a table
//! and writes bench/results/tables.json. Without `--graphstorm` only hetgnn
//! runs. GraphStorm 0.4 needs (see docs/guide/tables.md):
//!
//! ```sh
//! python3 -m venv ~/.cache/hetgnn/gs-venv
//! ~/.cache/hetgnn/gs-venv/bin/pip install torch==2.2.1 dgl==2.1.0 "numpy<2" \
//!     torchdata==0.7.1 "pandas<2.3" "pyarrow<18" pydantic pyyaml graphstorm==0.4.0
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use bench::measure::{run_measured, Measured};
use clap::Parser;
use serde_json::{json, Value};
use tables::config::{FileFormat, TablesConfig};

#[derive(Parser)]
struct Args {
    /// Scales of the mag-like graph (0.05: about 1M edges; 0.5: 10M; 1: 21M).
    #[arg(long, default_value = "0.05,0.5", value_delimiter = ',')]
    scales: Vec<f64>,
    /// Runs of each system per scale, interleaved.
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// Python with GraphStorm installed (none: hetgnn only).
    #[arg(long)]
    graphstorm: Option<PathBuf>,
    /// Table format of the exported tables.
    #[arg(long, default_value = "parquet")]
    format: String,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Longest run allowed, in seconds.
    #[arg(long, default_value_t = 3600)]
    limit_s: u64,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench/results/tables.json")]
    out: PathBuf,
}

/// The exported tables of `graph` (made once, kept under the bench data root).
fn tables_of(bin: &Path, graph: &Path, format: &str) -> anyhow::Result<PathBuf> {
    let name = graph
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = bench::data_root().join(format!("tables-{name}-{format}"));
    if !dir.join("graph.toml").exists() {
        eprintln!(
            "exporting {} as {format} tables into {}",
            graph.display(),
            dir.display()
        );
        bench::run_hetgnn(
            bin,
            Path::new("."),
            &[
                "export".into(),
                "tables".into(),
                "--data".into(),
                graph.display().to_string(),
                "--out".into(),
                dir.display().to_string(),
                "--format".into(),
                format.into(),
                "--force".into(),
            ],
        )?;
    }
    Ok(dir)
}

/// GraphStorm's `gconstruct` configuration for the same tables and columns.
fn gconstruct_config(tables: &Path) -> anyhow::Result<PathBuf> {
    let cfg = TablesConfig::read(&tables.join("graph.toml"))?;
    let fmt =
        |f: Option<FileFormat>, file: &Path| match f.or_else(|| tables::config::format_of(file)) {
            Some(FileFormat::Csv) => json!({"name": "csv", "separator": ","}),
            _ => json!({"name": "parquet"}),
        };
    let nodes: Vec<Value> = cfg
        .nodes
        .iter()
        .map(|n| {
            let mut v = json!({
                "node_type": n.ntype,
                "format": fmt(n.format, &n.files[0]),
                "files": n.files.iter().map(|f| tables.join(f)).collect::<Vec<_>>(),
                "node_id_col": n.id,
            });
            if !n.features.is_empty() {
                v["features"] = json!([{
                    "feature_col": n.features.iter().flat_map(|f| f.columns.clone()).collect::<Vec<_>>(),
                    "feature_name": "feat",
                }]);
            }
            if let Some(l) = &n.label {
                // The random split is the same work as reading a split column.
                v["labels"] = json!([{"label_col": l.column, "task_type": "classification", "split_pct": [0.8, 0.1, 0.1]}]);
            }
            v
        })
        .collect();
    let edges: Vec<Value> = cfg
        .edges
        .iter()
        .map(|e| {
            json!({
                "source_id_col": e.source,
                "dest_id_col": e.destination,
                "relation": e.relation,
                "format": fmt(e.format, &e.files[0]),
                "files": e.files.iter().map(|f| tables.join(f)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let path = tables.join("gconstruct.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(
            &json!({"version": "gconstruct-v0.1", "nodes": nodes, "edges": edges}),
        )?,
    )?;
    Ok(path)
}

fn logged(cmd: &mut Command, log: &Path) -> anyhow::Result<()> {
    let f = std::fs::File::create(log)?;
    cmd.stdout(Stdio::from(f.try_clone()?))
        .stderr(Stdio::from(f));
    Ok(())
}

/// Every format file of `a` equals the one in `b`.
fn same_graph(a: &Path, b: &Path) -> anyhow::Result<bool> {
    let schema = graphs::Schema::read(&a.join("schema.json"))?;
    let mut files = vec!["schema.json".to_string()];
    for (t, ts) in &schema.node_types {
        if ts.feature_dim.is_some() {
            files.push(format!("nodes/{t}/features.npy"));
        }
    }
    for f in ["labels", "train", "valid", "test"] {
        files.push(format!("nodes/{}/{f}.npy", schema.target));
    }
    files.extend(
        schema
            .relations
            .iter()
            .map(|r| format!("edges/{}.npy", r.canonical())),
    );
    for f in files {
        if std::fs::read(a.join(&f))? != std::fs::read(b.join(&f))? {
            eprintln!("{f} differs");
            return Ok(false);
        }
    }
    Ok(true)
}

fn fig(m: &Measured) -> Value {
    json!({"seconds": m.secs, "peak_bytes": m.peak_bytes, "ok": m.ok})
}

fn range(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = bench::hetgnn_bin(args.hetgnn.clone())?;
    let work = bench::data_root().join("tables-runs");
    std::fs::create_dir_all(&work)?;
    let limit = Duration::from_secs(args.limit_s);
    let mut rows = Vec::new();
    for &scale in &args.scales {
        let graph = bench::mag_like(scale, 0)?;
        let schema = graphs::Schema::read(&graph.join("schema.json"))?;
        let nodes: u64 = schema.node_types.iter().map(|(_, t)| t.count).sum();
        let edges: u64 = schema.relations.iter().map(|r| r.count).sum();
        let tables = tables_of(&bin, &graph, &args.format)?;
        let table_bytes: u64 =
            walk_bytes(&tables.join("nodes")) + walk_bytes(&tables.join("edges"));
        let gs_cfg = args
            .graphstorm
            .as_ref()
            .map(|_| gconstruct_config(&tables))
            .transpose()?;
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for r in 0..args.repeats {
            let out = work.join("hetgnn-out");
            let _ = std::fs::remove_dir_all(&out);
            let mut cmd = Command::new(&bin);
            cmd.args(["import", "tables", "--config"])
                .arg(tables.join("graph.toml"))
                .arg("--out")
                .arg(&out);
            logged(&mut cmd, &work.join("hetgnn.log"))?;
            let m = run_measured(&mut cmd, limit)?;
            anyhow::ensure!(
                m.ok,
                "hetgnn import failed: see {}",
                work.join("hetgnn.log").display()
            );
            anyhow::ensure!(
                same_graph(&graph, &out)?,
                "the import of S={scale} differs from the original graph"
            );
            eprintln!(
                "S={scale} run {r}: hetgnn {:.2}s, peak {:.0} MiB",
                m.secs,
                m.peak_bytes as f64 / 1048576.0
            );
            ours.push(m);
            let _ = std::fs::remove_dir_all(&out);
            if let (Some(py), Some(cfg)) = (&args.graphstorm, &gs_cfg) {
                let out = work.join("gs-out");
                let _ = std::fs::remove_dir_all(&out);
                let mut cmd = Command::new(py);
                cmd.args(["-m", "graphstorm.gconstruct.construct_graph", "--conf-file"])
                    .arg(cfg)
                    .arg("--output-dir")
                    .arg(&out)
                    .args(["--num-parts", "1", "--graph-name", "mag"]);
                logged(&mut cmd, &work.join("graphstorm.log"))?;
                let m = run_measured(&mut cmd, limit).context("running gconstruct")?;
                anyhow::ensure!(
                    m.ok,
                    "gconstruct failed: see {}",
                    work.join("graphstorm.log").display()
                );
                eprintln!(
                    "S={scale} run {r}: gconstruct {:.2}s, peak {:.0} MiB",
                    m.secs,
                    m.peak_bytes as f64 / 1048576.0
                );
                theirs.push(m);
                let _ = std::fs::remove_dir_all(&out);
            }
        }
        let secs: Vec<f64> = ours.iter().map(|m| m.secs).collect();
        let peaks: Vec<f64> = ours.iter().map(|m| m.peak_bytes as f64).collect();
        let mut row = json!({
            "scale": scale, "nodes": nodes, "edges": edges, "table_bytes": table_bytes,
            "hetgnn": ours.iter().map(fig).collect::<Vec<_>>(),
            "hetgnn_seconds": range(&secs), "hetgnn_peak_bytes": range(&peaks),
        });
        if !theirs.is_empty() {
            let time_ratio: Vec<f64> = ours
                .iter()
                .zip(&theirs)
                .map(|(a, b)| a.secs / b.secs)
                .collect();
            let mem_ratio: Vec<f64> = ours
                .iter()
                .zip(&theirs)
                .map(|(a, b)| a.peak_bytes as f64 / b.peak_bytes as f64)
                .collect();
            row["graphstorm"] = json!(theirs.iter().map(fig).collect::<Vec<_>>());
            row["time_ratio"] = json!(range(&time_ratio));
            row["memory_ratio"] = json!(range(&mem_ratio));
        }
        rows.push(row);
    }
    println!(
        "{:>6} {:>10} {:>11} {:>16} {:>16} {:>15} {:>15}",
        "scale", "nodes", "edges", "hetgnn s", "hetgnn MiB", "time ratio", "memory ratio"
    );
    for r in &rows {
        let pair = |k: &str, div: f64| {
            r.get(k)
                .and_then(|v| v.as_array())
                .map_or("-".to_string(), |a| {
                    format!(
                        "{:.2}-{:.2}",
                        a[0].as_f64().unwrap_or(0.0) / div,
                        a[1].as_f64().unwrap_or(0.0) / div
                    )
                })
        };
        println!(
            "{:>6} {:>10} {:>11} {:>16} {:>16} {:>15} {:>15}",
            r["scale"],
            r["nodes"],
            r["edges"],
            pair("hetgnn_seconds", 1.0),
            pair("hetgnn_peak_bytes", 1048576.0),
            pair("time_ratio", 1.0),
            pair("memory_ratio", 1.0)
        );
    }
    let report = json!({
        "benchmark": "tables",
        "what": "hetgnn import tables vs GraphStorm gconstruct (one partition) on mag-like Parquet tables with string ids; ratios are hetgnn / GraphStorm per interleaved pair",
        "format": args.format,
        "repeats": args.repeats,
        "graphstorm": args.graphstorm,
        "rows": rows,
    });
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

fn walk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
