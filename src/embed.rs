//! `hetgnn embed`: every node's embedding, of every type, from a checkpoint
//! by exact offline inference (full neighbourhoods, layer by layer), written
//! as one float32 `.npy` per node type; or across partitions, each computing
//! its own nodes (in this process, or one node of a topology per process).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use graphs::npy::{DType as NpyType, NpyWriter};
use graphs::Progress as _;
use tables::config::FileFormat;

use crate::output::{Kind, Output};

/// Options of `hetgnn embed`.
#[derive(Args)]
pub struct EmbedArgs {
    /// A checkpoint directory, or a checkpoint root (its newest valid checkpoint is used);
    /// single-process (epoch-*) or distributed (step-*) checkpoints.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The graph directory the model was trained on (with `--partitions`: optional,
    /// and checked to be the graph the partitions were cut from).
    #[arg(long, required_unless_present = "partitions")]
    data: Option<PathBuf>,
    /// A partition directory (`hetgnn partition`): each partition computes the nodes it
    /// owns, pulling its halo's rows from their owners, and writes `part-K/<type>.npy`
    /// with `part-K/<type>.ids.npy` (int64 node ids) and a `manifest.json`; a run that
    /// stopped resumes from each partition's last layer.
    #[arg(long)]
    partitions: Option<PathBuf>,
    /// With `--partitions`: a topology file; this process runs one node of it (`--node`),
    /// the k-th node of `cluster.nodes` computing partition k. Without it every partition
    /// runs in this process.
    #[arg(long, requires_all = ["partitions", "node"])]
    config: Option<PathBuf>,
    /// With `--config`: this process's node id.
    #[arg(long, requires = "config")]
    node: Option<String>,
    /// With `--partitions`: seconds a partition waits for a peer's rows (a peer that
    /// restarts included) before it gives up.
    #[arg(long, default_value_t = 600)]
    wait: u64,
    /// Output directory: one file per node type, `<type>.npy` (float32, [nodes, width]),
    /// or `<type>.csv` / `<type>.parquet` with `--format`.
    #[arg(long)]
    out: PathBuf,
    /// File format: `npy` (rows in node order), or `csv` / `parquet` (columns `id`,
    /// the original ids of a graph imported from tables, then `e0`, `e1`, ...).
    #[arg(long, value_enum, default_value_t = EmbedFormat::Npy)]
    format: EmbedFormat,
    /// Destination nodes computed at a time.
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    /// Replace the output directory if it exists (with `--partitions`: if it holds
    /// another job's output; the same job's is resumed).
    #[arg(long)]
    force: bool,
}

/// Output formats of `embed`.
#[derive(Clone, Copy, ValueEnum)]
pub enum EmbedFormat {
    /// One float32 `.npy` per type.
    Npy,
    /// One CSV table per type.
    Csv,
    /// One Parquet table per type.
    Parquet,
}

pub fn run(a: &EmbedArgs) -> anyhow::Result<()> {
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if let Some(parts) = &a.partitions {
        return partitioned(a, parts);
    }
    let Some(data) = &a.data else {
        bail!("--data (the graph directory) is needed without --partitions");
    };
    let model = crate::predict::ModelArgs {
        checkpoint: a.checkpoint.clone(),
        data: data.clone(),
    };
    crate::output::check(
        &[Output {
            flag: "--out",
            path: &a.out,
            kind: Kind::Dir,
        }],
        a.force,
        &model.inputs(),
    )?;
    let start = Instant::now();
    let trained = model.load()?;
    let (model, g, src) = (&trained.model, &trained.graph, &trained.source);
    let layers = models::inference::embedding_layers(model)?;
    let total: u64 = g.node_types().iter().map(|t| u64::from(t.count)).sum();
    let mut bars = crate::bar::Bars::new();
    let (mut phase, mut counted) = (usize::MAX, 0u64);
    let rows = models::inference::embed_all(model, g, a.batch, |layer, done, _| {
        if layer != phase {
            bars.finish();
            bars.start(
                &format!("layer {} of {layers}, every node", layer + 1),
                total,
            );
            (phase, counted) = (layer, 0);
        }
        bars.advance(done - counted);
        counted = done;
    })
    .with_context(|| format!("inference with {}", src.dir.display()))?;
    bars.finish();
    let dir = graphs::format::AtomicDir::create(&a.out, a.force)?;
    let mut written = Vec::new();
    for (t, r) in rows.iter().enumerate() {
        let Some(r) = r else { continue };
        let nt = &g.node_types()[t];
        let table = match a.format {
            EmbedFormat::Npy => None,
            EmbedFormat::Csv => Some((FileFormat::Csv, "csv")),
            EmbedFormat::Parquet => Some((FileFormat::Parquet, "parquet")),
        };
        match table {
            None => {
                let path = dir.path().join(format!("{}.npy", nt.name));
                let mut w =
                    NpyWriter::create(&path, NpyType::F32, &[u64::from(nt.count), r.width as u64])?;
                w.write_f32(&r.data)?;
                w.finish()?;
            }
            Some((format, ext)) => {
                let path = dir.path().join(format!("{}.{ext}", nt.name));
                let nodes: Vec<u32> = (0..nt.count).collect();
                crate::predict::write_embedding_table(
                    &path,
                    format,
                    &trained.names[t],
                    &nodes,
                    &r.data,
                    r.width,
                )?;
            }
        }
        written.push(format!("{} [{}, {}]", nt.name, nt.count, r.width));
    }
    dir.commit()?;
    let peak = graphs::memory::peak_rss_bytes()
        .map_or("unknown".into(), |b| graphs::memory::human(u128::from(b)));
    sayln!(
        "wrote embeddings of {} to {} in {:.1}s, peak memory {peak} (checkpoint {}; {layers} layer(s), full neighbourhoods)",
        written.join(", "),
        a.out.display(),
        start.elapsed().as_secs_f64(),
        src.dir.display()
    );
    Ok(())
}

/// `embed --partitions`: every partition in this process, or this node's.
fn partitioned(a: &EmbedArgs, parts: &Path) -> anyhow::Result<()> {
    if !matches!(a.format, EmbedFormat::Npy) {
        bail!("--partitions writes .npy files per partition (with their node ids); --format csv or parquet is for single-process embed");
    }
    let mut inputs: Vec<(&str, &Path)> =
        vec![("--checkpoint", &a.checkpoint), ("--partitions", parts)];
    if let Some(d) = &a.data {
        inputs.push(("--data", d));
    }
    crate::output::check(
        &[Output {
            flag: "--out",
            path: &a.out,
            kind: Kind::AddTo,
        }],
        a.force,
        &inputs,
    )?;
    if a.config.is_some() {
        crate::cluster::init_logging();
    }
    let start = Instant::now();
    let (src, skipped) = actors::pretrained::Pretrained::find(&a.checkpoint)?;
    for s in skipped {
        warnln!("skipped checkpoint: {s}");
    }
    let set = graphs::partition::PartitionSet::open_for(parts, a.data.as_deref())
        .with_context(|| format!("opening the partitions {}", parts.display()))?;
    // One node of a topology: its partition, loaded once, builds the model
    // (any partition's graph has every type and relation of the whole graph).
    let node = match (&a.config, &a.node) {
        (Some(config), Some(id)) => {
            let cfg = actors::Config::load(config, &[])
                .with_context(|| format!("reading {}", config.display()))?;
            let Some(topology) = cfg.topology() else {
                bail!("{}: has no [cluster] section", config.display());
            };
            let k = actors::inference::partition_of(&topology, id, set.manifest.parts as u32)
                .with_context(|| format!("{}", config.display()))?;
            Some((topology, id, k))
        }
        _ => None,
    };
    let g = set.load_part(
        node.as_ref().map_or(0, |n| n.2 as usize),
        &graphs::LoadOptions {
            mmap_features: true,
            reverse_edges: src.reverse_edges,
        },
    )?;
    let model = src
        .for_inference(&g, set.manifest.graph_sha256.as_deref())
        .with_context(|| format!("loading the model of {}", src.dir.display()))?;
    tracing::info!(
        "partition and model loaded in {:.2}s",
        start.elapsed().as_secs_f64()
    );
    let layers = models::inference::embedding_layers(&model.model)?;
    let fingerprint = format!(
        "checkpoint {} partitions {}",
        graphs::fingerprint::file(&src.dir.join("manifest.json"))?,
        graphs::fingerprint::file(&parts.join("manifest.json"))?
    );
    let job = actors::inference::Job {
        model: &model,
        set: &set,
        reverse_edges: src.reverse_edges,
        fingerprint,
        out: &a.out,
        chunk: a.batch,
        force: a.force,
        wait: Duration::from_secs(a.wait),
    };
    let (manifest, nodes) = match node {
        Some((topology, id, k)) => {
            let mine = own_nodes(&set, k as usize);
            let bars = bar(layers, mine);
            let progress = |n: u64| advance(&bars, n);
            let m = actors::inference::embed_node(&job, topology, id, &g, &progress)
                .with_context(|| format!("node {id}: embedding its partition"))?;
            finish(&bars);
            (m, mine)
        }
        None => {
            drop(g);
            let all: u64 = set.owners.iter().map(|o| o.len() as u64).sum();
            let bars = bar(layers, all);
            let progress = |n: u64| advance(&bars, n);
            let m = actors::inference::embed_embedded(&job, &progress)
                .context("embedding the partitions")?;
            finish(&bars);
            (Some(m), all)
        }
    };
    let took = start.elapsed().as_secs_f64();
    match manifest {
        Some(m) => {
            let types: Vec<String> = m
                .types
                .iter()
                .map(|t| format!("{} [{}, {}]", t.name, t.nodes.iter().sum::<u64>(), t.width))
                .collect();
            sayln!(
                "wrote embeddings of {} in {} partitions to {} in {took:.1}s (checkpoint {}; {layers} layer(s), full neighbourhoods)",
                types.join(", "),
                set.manifest.parts,
                a.out.display(),
                src.dir.display()
            );
        }
        None => sayln!(
            "wrote this node's partition ({nodes} nodes) to {} in {took:.1}s; the first node writes the manifest",
            a.out.display()
        ),
    }
    Ok(())
}

/// The nodes partition `k` owns, of every type.
fn own_nodes(set: &graphs::partition::PartitionSet, k: usize) -> u64 {
    set.owners
        .iter()
        .map(|o| o.iter().filter(|&&p| usize::from(p) == k).count() as u64)
        .sum()
}

/// One bar over every layer of `nodes` nodes, shared by the partitions' threads.
fn bar(layers: usize, nodes: u64) -> Mutex<crate::bar::Bars> {
    let mut bars = crate::bar::Bars::new();
    bars.start(
        &format!("{layers} layer(s), own nodes"),
        nodes * layers as u64,
    );
    Mutex::new(bars)
}

fn advance(bars: &Mutex<crate::bar::Bars>, n: u64) {
    if let Ok(mut b) = bars.lock() {
        b.advance(n);
    }
}

fn finish(bars: &Mutex<crate::bar::Bars>) {
    if let Ok(mut b) = bars.lock() {
        b.finish();
    }
}
