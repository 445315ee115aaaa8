//! `hetgnn predict`: classes and final-layer embeddings of every target node
//! from a checkpoint (of a single-process or a distributed run), written as .npy.

use std::path::PathBuf;

use actors::distributed::checkpoint as dist;
use actors::epoch::sample;
use actors::epoch::EVAL_SEED;
use anyhow::{bail, Context};
use candle_core::{DType, Device};
use clap::Args;

use crate::output::{Kind, Output};
use graphs::npy::{DType as NpyType, NpyWriter};
use graphs::{LoadOptions, Sampler};
use models::checkpoint;
use models::optim::{Adam, AdamConfig};
use models::Model;

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
            Some(m) => dist::assemble(&dir, m, &mut model)
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
    /// Output: predicted class per target node (int64 .npy).
    #[arg(long)]
    out: PathBuf,
    /// Also write the final-layer input embeddings (float32 .npy, [nodes, width]).
    #[arg(long)]
    embeddings: Option<PathBuf>,
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
    crate::output::check(&outputs, a.force, &a.model.inputs())?;
    let (model, g, manifest) = a.model.load()?;
    let dir = manifest.dir.clone();
    if manifest.spec.link.is_some() {
        bail!("{}: this checkpoint was trained for link prediction and predicts no classes; `hetgnn embed` writes its node embeddings", dir.display());
    }
    let n = g.node_type(g.target()).count;
    let ids: Vec<u32> = (0..n).collect();
    let mut sampler = Sampler::new(&g, &manifest.fanouts, manifest.spec.seed ^ EVAL_SEED)?;
    let mut preds = NpyWriter::create(&a.out, NpyType::I64, &[u64::from(n)])?;
    let mut emb_writer: Option<NpyWriter> = None;
    for (step, seeds) in ids.chunks(a.batch).enumerate() {
        let mb = sample(
            &mut sampler,
            model.uses_neighbors(),
            manifest.epochs_done,
            step as u64,
            seeds,
        )?;
        let inputs = model.gather_inputs(&g, &mb.blocks[0].src)?;
        let (logits, emb) = model.forward_with_embeddings(&g, &mb, inputs, None)?;
        let p: Vec<i64> = logits
            .argmax(1)?
            .to_vec1::<u32>()?
            .into_iter()
            .map(i64::from)
            .collect();
        preds.write_i64(&p)?;
        if let Some(path) = &a.embeddings {
            let emb = emb.to_dtype(DType::F32)?;
            if emb_writer.is_none() {
                emb_writer = Some(NpyWriter::create(
                    path,
                    NpyType::F32,
                    &[u64::from(n), emb.dims2()?.1 as u64],
                )?);
            }
            let w = emb_writer.as_mut().expect("created above");
            w.write_f32(&emb.flatten_all()?.to_vec1::<f32>()?)?;
        }
    }
    preds.finish()?;
    if let Some(w) = emb_writer {
        w.finish()?;
    }
    sayln!(
        "wrote predictions for {n} {} nodes to {} (checkpoint {})",
        g.node_type(g.target()).name,
        a.out.display(),
        dir.display()
    );
    if let Some(p) = &a.embeddings {
        sayln!("wrote embeddings to {}", p.display());
    }
    Ok(())
}
