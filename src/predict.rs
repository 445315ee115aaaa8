//! `hetgnn predict`: classes and final-layer embeddings of every target node
//! from a checkpoint (of a single-process or a distributed run), written as .npy.

use std::path::PathBuf;

use actors::distributed::checkpoint as dist;
use actors::epoch::sample;
use actors::epoch::SamplingPlan;
use anyhow::{bail, Context};
use candle_core::{DType, Device};
use clap::Args;

use crate::output::{Kind, Output};
use graphs::LoadOptions;
use models::checkpoint;
use models::optim::{Adam, AdamConfig};
use models::Model;
use tables::results::{result_format, NodeNames, ResultFormat};
use tables::write::{ColumnData, ColumnType, TableWriter};

/// A trained model's inputs, shared by `predict` and `embed`.
#[derive(Args)]
pub struct ModelArgs {
    /// A checkpoint directory, or a checkpoint root (its newest valid checkpoint is used);
    /// single-process (epoch-*) or distributed (step-*) checkpoints.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The graph directory the model was trained on.
    #[arg(long)]
    data: PathBuf,
}

impl ModelArgs {
    /// The graph directory.
    pub fn data(&self) -> &std::path::Path {
        &self.data
    }

    /// The inputs as `(flag, path)`, for checking outputs against them.
    pub fn inputs(&self) -> [(&str, &std::path::Path); 2] {
        [("--checkpoint", &self.checkpoint), ("--data", &self.data)]
    }

    /// The checkpoint's model on the graph, loaded as the model was trained
    /// (reverse relations or not).
    pub fn load(&self) -> anyhow::Result<(Model, graphs::HetGraph, Source)> {
        let src = source(&self.checkpoint)?;
        let dir = src.dir.clone();
        let g = graphs::load(
            &self.data,
            &LoadOptions {
                mmap_features: true,
                reverse_edges: src.reverse_edges,
            },
        )
        .with_context(|| format!("loading {}", self.data.display()))?;
        let mut model = Model::new(&src.spec, &g, DType::F32, &Device::Cpu)?;
        match &src.distributed {
            Some(m) => dist::assemble(&dir, m, &mut model, partial_params(&m.mode)?)
                .with_context(|| format!("assembling the model of {}", dir.display()))?,
            None => {
                checkpoint::load(
                    &dir,
                    &mut model,
                    &mut Adam::new(AdamConfig::with_lr(1e-3)),
                    g.name(),
                    src.reverse_edges,
                    None,
                )?;
            }
        }
        Ok((model, g, src))
    }
}

/// Options of `hetgnn predict`.
#[derive(Args)]
pub struct PredictArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Output: the predicted class per target node. `.npy`: int64 in node order;
    /// `.csv` or `.parquet`: columns `id` (the original ids of a graph imported
    /// from tables), `class` and, when the classes had names, `class_name`.
    #[arg(long)]
    out: PathBuf,
    /// Also write the final-layer input embeddings: `.npy` (float32, [nodes, width]),
    /// or `.csv` / `.parquet` (columns `id`, `e0`, `e1`, ...).
    #[arg(long)]
    embeddings: Option<PathBuf>,
    /// Only the nodes listed in this table (`.csv`, `.csv.gz` or `.parquet`), in its
    /// order; they get the predictions a run over every node gives them.
    #[arg(long)]
    ids: Option<PathBuf>,
    /// The column of `--ids` that holds the node ids.
    #[arg(long, default_value = "id", requires = "ids")]
    ids_column: String,
    /// Seeds per inference batch.
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    /// Replace existing output files.
    #[arg(long)]
    force: bool,
}

/// What `predict` needs of a checkpoint, single-process or distributed.
pub struct Source {
    /// The checkpoint directory used.
    pub dir: PathBuf,
    spec: models::ModelSpec,
    reverse_edges: bool,
    fanouts: Vec<usize>,
    /// Epochs trained (the sampling key of inference batches).
    epochs_done: u64,
    distributed: Option<dist::Manifest>,
}

/// Finds the checkpoint `path` names: a checkpoint directory of either kind,
/// or a root of `epoch-*` (single-process) or `step-*` (distributed) ones.
fn source(path: &std::path::Path) -> anyhow::Result<Source> {
    let is_dist = |d: &std::path::Path| {
        d.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
    };
    let dir = if path.join("manifest.json").exists() {
        path.to_path_buf()
    } else if !dist::list(path)?.is_empty() {
        let (m, skipped) = dist::latest_any(path)?
            .with_context(|| format!("{}: no usable checkpoint", path.display()))?;
        for s in skipped {
            warnln!("skipped checkpoint: {s}");
        }
        dist::dir(path, m.seq)
    } else {
        checkpoint::resolve(path)?
    };
    if is_dist(&dir) {
        let m = dist::manifest(&dir)?;
        return Ok(Source {
            spec: m.spec.clone(),
            reverse_edges: m.reverse_edges,
            fanouts: m.fanouts.clone(),
            epochs_done: m.epochs.len() as u64,
            dir,
            distributed: Some(m),
        });
    }
    let (m, _) = checkpoint::verify(&dir)?;
    Ok(Source {
        spec: m.spec,
        reverse_edges: m.reverse_edges,
        fanouts: m.fanouts,
        epochs_done: m.epochs_done,
        dir,
        distributed: None,
    })
}

pub fn run(a: &PredictArgs) -> anyhow::Result<()> {
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let mut outputs = vec![Output {
        flag: "--out",
        path: &a.out,
        kind: Kind::File,
    }];
    outputs.extend(a.embeddings.as_deref().map(|p| Output {
        flag: "--embeddings",
        path: p,
        kind: Kind::File,
    }));
    let mut inputs = a.model.inputs().to_vec();
    if let Some(ids) = &a.ids {
        inputs.push(("--ids", ids));
    }
    crate::output::check(&outputs, a.force, &inputs)?;
    // After the output check, so that an output naming an input is refused as such.
    let out_format = result_format(&a.out).map_err(anyhow::Error::msg)?;
    let emb_format = a
        .embeddings
        .as_deref()
        .map(result_format)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let (model, g, manifest) = a.model.load()?;
    let dir = manifest.dir.clone();
    if manifest.spec.link.is_some() {
        bail!("{}: this checkpoint was trained for link prediction and predicts no classes; `hetgnn embed` writes its node embeddings", dir.display());
    }
    let target = g.node_type(g.target());
    let n = target.count;
    let names = NodeNames::load(&a.model.data, &target.name, n)?;
    let wanted: Vec<u32> = match &a.ids {
        Some(path) => names.read(path, &a.ids_column)?,
        None => (0..n).collect(),
    };
    // The batches a run over every node makes, restricted to those holding a
    // wanted node: each node gets the neighbourhood sample it gets there.
    let mut steps: Vec<usize> = wanted.iter().map(|&w| w as usize / a.batch).collect();
    steps.dedup();
    steps.sort_unstable();
    steps.dedup();
    let mut sampler = SamplingPlan::new(&manifest.fanouts, manifest.spec.seed).eval(&g)?;
    // Results are kept for the wanted nodes only: (node, position in the
    // output), sorted by node, so each batch finds its nodes by bisection.
    let mut order: Vec<(u32, usize)> = wanted.iter().copied().zip(0..).collect();
    order.sort_unstable();
    let mut classes = vec![-1i64; wanted.len()];
    let mut emb_out: Vec<f32> = Vec::new();
    let mut width = 0;
    for step in steps {
        let (lo, hi) = (step * a.batch, ((step + 1) * a.batch).min(n as usize));
        let seeds: Vec<u32> = (lo..hi).map(|s| s as u32).collect();
        let mb = sample(
            &mut sampler,
            model.uses_neighbors(),
            manifest.epochs_done,
            step as u64,
            &seeds,
        )?;
        let inputs = model.gather_inputs(&g, &mb.blocks[0].src)?;
        let (logits, emb) = model.forward_with_embeddings(&g, &mb, inputs, None)?;
        let p = logits.argmax(1)?.to_vec1::<u32>()?;
        let from = order.partition_point(|&(v, _)| (v as usize) < lo);
        let to = order.partition_point(|&(v, _)| (v as usize) < hi);
        for &(v, pos) in &order[from..to] {
            classes[pos] = i64::from(p[v as usize - lo]);
        }
        if a.embeddings.is_some() {
            let emb = emb.to_dtype(DType::F32)?;
            width = emb.dims2()?.1;
            if emb_out.is_empty() {
                emb_out = vec![0.0; wanted.len() * width];
            }
            let flat = emb.flatten_all()?.to_vec1::<f32>()?;
            for &(v, pos) in &order[from..to] {
                let k = v as usize - lo;
                emb_out[pos * width..(pos + 1) * width]
                    .copy_from_slice(&flat[k * width..(k + 1) * width]);
            }
        }
    }
    match out_format {
        ResultFormat::Npy => graphs::npy::write_i64(&a.out, &[classes.len() as u64], &classes)?,
        ResultFormat::Table(f) => {
            let mut columns = vec![
                ("id".to_string(), names.column_type()),
                ("class".into(), ColumnType::Int),
            ];
            let mut data = vec![
                names.column(&wanted),
                ColumnData::Int(classes.iter().map(|&c| Some(c)).collect()),
            ];
            if !names.classes().is_empty() {
                columns.push(("class_name".into(), ColumnType::Text));
                data.push(ColumnData::Text(
                    classes
                        .iter()
                        .map(|&c| names.classes().get(c as usize).cloned())
                        .collect(),
                ));
            }
            let mut w = TableWriter::create(&a.out, f, &columns)?;
            w.write(data)?;
            w.finish()?;
        }
    }
    if let (Some(path), Some(format)) = (&a.embeddings, emb_format) {
        let flat = emb_out;
        match format {
            ResultFormat::Npy => {
                graphs::npy::write_f32(path, &[wanted.len() as u64, width as u64], &flat)?
            }
            ResultFormat::Table(f) => {
                write_embedding_table(path, f, &names, &wanted, &flat, width)?
            }
        }
    }
    sayln!(
        "wrote predictions for {} {} nodes to {} (checkpoint {})",
        wanted.len(),
        target.name,
        a.out.display(),
        dir.display()
    );
    if let Some(p) = &a.embeddings {
        sayln!("wrote embeddings to {}", p.display());
    }
    Ok(())
}

/// Writes embedding rows (`width` floats per node of `nodes`) as a table with an id column.
pub fn write_embedding_table(
    path: &std::path::Path,
    format: tables::config::FileFormat,
    names: &NodeNames,
    nodes: &[u32],
    rows: &[f32],
    width: usize,
) -> anyhow::Result<()> {
    let mut columns = vec![("id".to_string(), names.column_type())];
    columns.extend((0..width).map(|j| (format!("e{j}"), ColumnType::Float32)));
    let mut w = TableWriter::create(path, format, &columns)?;
    for (k, chunk) in nodes.chunks(1 << 16).enumerate() {
        let base = k << 16;
        let mut data = vec![names.column(chunk)];
        for j in 0..width {
            data.push(ColumnData::Float32(
                (0..chunk.len())
                    .map(|i| rows[(base + i) * width + j])
                    .collect(),
            ));
        }
        w.write(data)?;
    }
    w.finish()?;
    Ok(())
}

/// Whether a distributed checkpoint written by mode `mode` may lack a
/// parameter no partition used (its rules say so).
fn partial_params(mode: &str) -> anyhow::Result<bool> {
    actors::modes::rules_of(mode)
        .map(|r| r.partial_params)
        .ok_or_else(|| {
            anyhow::anyhow!("the checkpoint was written by an unknown training mode '{mode}'")
        })
}
