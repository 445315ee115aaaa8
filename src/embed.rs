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
    let job = Partitioned {
        checkpoint: &a.checkpoint,
        partitions: parts,
        data: a.data.as_deref(),
        config: a.config.as_deref(),
        node: a.node.as_deref(),
        out: &a.out,
        batch: a.batch,
        force: a.force,
        wait: a.wait,
        task: None,
    };
    let ran = job.run(actors::inference::Computes::Embeddings)?;
    match ran.manifest {
        Some(m) => {
            let types: Vec<String> = m
                .types
                .iter()
                .map(|t| format!("{} [{}, {}]", t.name, t.nodes.iter().sum::<u64>(), t.width))
                .collect();
            sayln!(
                "wrote embeddings of {} in {} partitions to {} in {:.1}s (checkpoint {}; {} layer(s), full neighbourhoods)",
                types.join(", "),
                ran.parts,
                a.out.display(),
                ran.took,
                ran.checkpoint.display(),
                ran.layers
            );
        }
        None => sayln!(
            "wrote this node's partition ({} nodes) to {} in {:.1}s; the first node writes the manifest",
            ran.nodes,
            a.out.display(),
            ran.took
        ),
    }
    Ok(())
}

/// A distributed `embed` or `predict` over a partition directory: every
/// partition in this process, or one node of a topology (`config`, `node`).
pub struct Partitioned<'a> {
    pub checkpoint: &'a Path,
    pub partitions: &'a Path,
    /// The whole graph, checked to be the one the partitions were cut from.
    pub data: Option<&'a Path>,
    pub config: Option<&'a Path>,
    pub node: Option<&'a str>,
    pub out: &'a Path,
    pub batch: usize,
    pub force: bool,
    /// Seconds a partition waits for a peer's rows.
    pub wait: u64,
    /// A logits job of a model trained for several node tasks: the task
    /// whose head [`Ran::head`] is (checked before any work) [default: the first].
    pub task: Option<&'a str>,
}

/// What a distributed job did.
pub struct Ran {
    /// The job's manifest, on the process that writes it.
    pub manifest: Option<actors::inference::files::Manifest>,
    /// The partitions computed in this process.
    pub here: Vec<u32>,
    /// Partitions of the job.
    pub parts: usize,
    /// Relational layers run.
    pub layers: usize,
    /// Nodes computed here, of every type.
    pub nodes: u64,
    /// A logits job's head: its kind and its columns of a target node's logits.
    pub head: Option<(models::model::Head, std::ops::Range<usize>)>,
    /// The target node type.
    pub target: String,
    /// The checkpoint used.
    pub checkpoint: PathBuf,
    /// Seconds it took.
    pub took: f64,
}

impl Partitioned<'_> {
    /// Runs the job, writing what `computes` says under `out`.
    pub fn run(&self, computes: actors::inference::Computes) -> anyhow::Result<Ran> {
        let parts = self.partitions;
        let mut inputs: Vec<(&str, &Path)> =
            vec![("--checkpoint", self.checkpoint), ("--partitions", parts)];
        if let Some(d) = self.data {
            inputs.push(("--data", d));
        }
        crate::output::check(
            &[Output {
                flag: "--out",
                path: self.out,
                kind: Kind::AddTo,
            }],
            self.force,
            &inputs,
        )?;
        if self.config.is_some() {
            crate::cluster::init_logging();
        }
        let start = Instant::now();
        let (src, skipped) = actors::pretrained::Pretrained::find(self.checkpoint)?;
        for s in skipped {
            warnln!("skipped checkpoint: {s}");
        }
        let set = graphs::partition::PartitionSet::open_for(parts, self.data)
            .with_context(|| format!("opening the partitions {}", parts.display()))?;
        // One node of a topology: its partition, loaded once, builds the model
        // (any partition's graph has every type and relation of the whole graph).
        let node = match (self.config, self.node) {
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
        let m = &model.model;
        let (layers, head) = match computes {
            actors::inference::Computes::Embeddings => {
                (models::inference::embedding_layers(m)?, None)
            }
            actors::inference::Computes::Logits => {
                let layers = models::inference::classifier_layers(m)
                    .with_context(|| format!("{}", src.dir.display()))?;
                (layers, Some(head_of(m.spec().head_columns(&g), self.task)?))
            }
        };
        let target = g.target();
        let target_name = g.node_type(target).name.clone();
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
            out: self.out,
            chunk: self.batch,
            force: self.force,
            wait: Duration::from_secs(self.wait),
            computes,
        };
        // The nodes each layer computes: every own node, but for a logits job
        // whose last layer classifies, which computes the target's only.
        let work = |k: Option<usize>| -> (u64, u64) {
            let all = own_nodes(&set, k, None);
            let last = match layers > models::inference::embedding_layers(m).unwrap_or(layers) {
                true => own_nodes(&set, k, Some(target.index())),
                false => all,
            };
            (all, all * (layers as u64).saturating_sub(1) + last)
        };
        let (manifest, here, nodes) = match node {
            Some((topology, id, k)) => {
                let (mine, total) = work(Some(k as usize));
                let bars = bar(layers, total);
                let progress = |n: u64| advance(&bars, n);
                let m = actors::inference::embed_node(&job, topology, id, &g, &progress)
                    .with_context(|| format!("node {id}: computing its partition"))?;
                finish(&bars);
                (m, vec![k], mine)
            }
            None => {
                drop(g);
                let (all, total) = work(None);
                let bars = bar(layers, total);
                let progress = |n: u64| advance(&bars, n);
                let m = actors::inference::embed_embedded(&job, &progress)
                    .context("computing the partitions")?;
                finish(&bars);
                let here = (0..set.manifest.parts as u32).collect();
                (Some(m), here, all)
            }
        };
        Ok(Ran {
            manifest,
            here,
            parts: set.manifest.parts,
            layers,
            nodes,
            head,
            target: target_name,
            checkpoint: src.dir.clone(),
            took: start.elapsed().as_secs_f64(),
        })
    }
}

/// The head of node task `task` among `heads` [default: the first].
fn head_of(
    heads: Vec<(models::model::Head, std::ops::Range<usize>)>,
    task: Option<&str>,
) -> anyhow::Result<(models::model::Head, std::ops::Range<usize>)> {
    let tasks: Vec<&str> = heads
        .iter()
        .map(|(h, _)| serving::engine::head_task(*h))
        .collect();
    let found = match task {
        None => heads.first().cloned(),
        Some(t) => heads
            .iter()
            .find(|(h, _)| serving::engine::head_task(*h) == t)
            .cloned(),
    };
    match found {
        Some(h) => Ok(h),
        None => bail!(
            "--task {}: this model was not trained for it (it predicts: {})",
            task.unwrap_or_default(),
            tasks.join(", ")
        ),
    }
}

/// The nodes partition `k` owns (every partition's: `None`), of every type
/// or of type `only`.
fn own_nodes(set: &graphs::partition::PartitionSet, k: Option<usize>, only: Option<usize>) -> u64 {
    set.owners
        .iter()
        .enumerate()
        .filter(|&(t, _)| only.is_none_or(|o| o == t))
        .map(|(_, o)| {
            o.iter()
                .filter(|&&p| k.is_none_or(|k| usize::from(p) == k))
                .count() as u64
        })
        .sum()
}

/// One bar over the `total` nodes of every layer, shared by the partitions' threads.
fn bar(layers: usize, total: u64) -> Mutex<crate::bar::Bars> {
    let mut bars = crate::bar::Bars::new();
    bars.start(&format!("{layers} layer(s), own nodes"), total);
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
