//! `hetgnn predict`: classes and final-layer embeddings of every target node
//! from a checkpoint (of a single-process or a distributed run), written as
//! .npy or a table; for an edge model, the class or value of given edges.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serving::{Engine, Inference, Trained, Want};

use crate::output::{Kind, Output};
use tables::results::{result_format, ResultFormat};
use tables::write::{ColumnData, ColumnType, TableWriter};

/// A trained model's inputs, shared by `predict`, `embed` and `serve`.
#[derive(Args)]
pub struct ModelArgs {
    /// A checkpoint directory, or a checkpoint root (its newest valid checkpoint is used);
    /// single-process (epoch-*) or distributed (step-*) checkpoints.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The graph directory the model was trained on.
    #[arg(long)]
    pub data: PathBuf,
}

impl ModelArgs {
    /// The inputs as `(flag, path)`, for checking outputs against them.
    pub fn inputs(&self) -> [(&str, &std::path::Path); 2] {
        [("--checkpoint", &self.checkpoint), ("--data", &self.data)]
    }

    /// The checkpoint's model on the graph, loaded as the model was trained
    /// (reverse relations or not).
    pub fn load(&self) -> anyhow::Result<Trained> {
        let (trained, skipped) = Trained::open(&self.checkpoint, &self.data)?;
        for s in skipped {
            warnln!("skipped checkpoint: {s}");
        }
        Ok(trained)
    }
}

/// How `predict` computes its answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InferenceArg {
    /// The training fanouts, with a fixed sampling key: a node's answer does not
    /// depend on the batch or on the other nodes asked.
    Sampled,
    /// Every layer over full neighbourhoods (as `embed`).
    Exact,
}

impl From<InferenceArg> for Inference {
    fn from(a: InferenceArg) -> Inference {
        match a {
            InferenceArg::Sampled => Inference::Sampled,
            InferenceArg::Exact => Inference::Exact,
        }
    }
}

/// Options of `hetgnn predict`.
#[derive(Args)]
pub struct PredictArgs {
    /// A checkpoint directory, or a checkpoint root (its newest valid checkpoint is used);
    /// single-process (epoch-*) or distributed (step-*) checkpoints.
    #[arg(long)]
    pub(crate) checkpoint: PathBuf,
    /// The graph directory the model was trained on (with `--partitions`: optional,
    /// and checked to be the graph the partitions were cut from).
    #[arg(long, required_unless_present = "partitions")]
    pub(crate) data: Option<PathBuf>,
    /// A partition directory (`hetgnn partition`): each partition predicts the target
    /// nodes it owns by exact inference, pulling its halo's rows from their owners;
    /// `--out` is then a directory of `part-K/predictions.npy` (as `--out x.npy` writes
    /// them) with `part-K/<type>.ids.npy` (int64 node ids), the logits
    /// `part-K/<type>.npy` and a `manifest.json`; a run that stopped resumes from each
    /// partition's last layer.
    #[arg(long, conflicts_with_all = ["ids", "embeddings", "edges"])]
    pub(crate) partitions: Option<PathBuf>,
    /// With `--partitions`: a topology file; this process runs one node of it (`--node`),
    /// the k-th node of `cluster.nodes` computing partition k. Without it every partition
    /// runs in this process.
    #[arg(long, requires_all = ["partitions", "node"])]
    pub(crate) config: Option<PathBuf>,
    /// With `--config`: this process's node id.
    #[arg(long, requires = "config")]
    pub(crate) node: Option<String>,
    /// With `--partitions`: seconds a partition waits for a peer's rows (a peer that
    /// restarts included) before it gives up.
    #[arg(long, default_value_t = 600)]
    pub(crate) wait: u64,
    /// Output: the predicted class per target node. `.npy`: int64 in node order;
    /// `.csv` or `.parquet`: columns `id` (the original ids of a graph imported
    /// from tables), `class` and, when the classes had names, `class_name`.
    /// A regression model writes its values instead: float32 `.npy`, or a `value` column;
    /// a multi-label model its label sets: int8 `.npy` [nodes, labels] of 0/1, or a
    /// `labels` column of the predicted labels joined by `;` (`0;3;7`, or their
    /// names where the label sets were imported as names).
    #[arg(long)]
    pub(crate) out: PathBuf,
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
    /// Sampled (the training fanouts) or exact (full neighbourhoods) inference
    /// [default: sampled; exact, the only one, with `--partitions`].
    #[arg(long, value_enum)]
    pub(crate) inference: Option<InferenceArg>,
    /// An edge model: the edges to score, `.npy` (int64 [2, n]: sources, then
    /// destinations) or a table (`.csv`, `.csv.gz`, `.parquet`) with columns
    /// `src` and `dst` (original ids of a graph imported from tables).
    #[arg(long)]
    edges: Option<PathBuf>,
    /// An edge model trained on several relations: the one `--edges` belongs to
    /// (canonical `src__name__dst`) [default: its first target relation].
    #[arg(long, requires = "edges")]
    pub(crate) relation: Option<String>,
    /// A model trained for several tasks (`training.tasks`): the task to
    /// predict ("node-classification", "node-regression" or "multi-label")
    /// [default: its first].
    #[arg(long)]
    pub(crate) task: Option<String>,
    /// Nodes per inference batch (answers do not depend on it).
    #[arg(long, default_value_t = 4096)]
    pub(crate) batch: usize,
    /// Replace existing output files.
    #[arg(long)]
    pub(crate) force: bool,
}

pub fn run(a: &PredictArgs) -> anyhow::Result<()> {
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if let Some(parts) = &a.partitions {
        return crate::predict_parts::run(a, parts);
    }
    let Some(data) = &a.data else {
        bail!("--data (the graph directory) is needed without --partitions");
    };
    let model = ModelArgs {
        checkpoint: a.checkpoint.clone(),
        data: data.clone(),
    };
    let inference = a.inference.unwrap_or(InferenceArg::Sampled);
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
    let mut inputs = model.inputs().to_vec();
    if let Some(ids) = &a.ids {
        inputs.push(("--ids", ids));
    }
    if let Some(edges) = &a.edges {
        inputs.push(("--edges", edges));
    }
    crate::output::check(&outputs, a.force, &inputs)?;
    // After the output check, so that an output naming an input is refused as such.
    let out_format = result_format(&a.out)?;
    let emb_format = a.embeddings.as_deref().map(result_format).transpose()?;
    let trained = model.load()?;
    let dir = trained.source.dir.clone();
    let spec = &trained.source.spec;
    let scorer = match (&spec.edge, &spec.link) {
        (Some(e), _) => Some(crate::predict_edges::Scorer::Edge(e.clone())),
        (None, Some(l)) => Some(crate::predict_edges::Scorer::Link(l.relations.clone())),
        (None, None) => None,
    };
    // A model with node tasks too predicts nodes unless given edges to score.
    if let Some(scorer) = scorer.filter(|_| a.edges.is_some() || !spec.predicts_nodes()) {
        let Some(path) = &a.edges else {
            bail!("{}: this checkpoint was trained for {} ({}): give the edges to score with --edges FILE (`hetgnn embed` writes its node embeddings)", dir.display(), scorer.task(), scorer.relations().join(", "));
        };
        if a.ids.is_some() || a.embeddings.is_some() {
            bail!(
                "--ids and --embeddings apply to node models; an edge or link model scores --edges"
            );
        }
        return crate::predict_edges::run(
            &trained,
            &scorer,
            a.relation.as_deref(),
            path,
            &a.out,
            out_format,
        );
    }
    if a.edges.is_some() {
        bail!("{}: --edges applies to a model trained for edge classification or regression; this one predicts nodes", dir.display());
    }
    let target = trained.graph.node_type(trained.graph.target());
    let (target_name, count) = (target.name.clone(), target.count);
    let wanted: Vec<u32> = match &a.ids {
        Some(path) => trained.names[trained.graph.target().index()].read(path, &a.ids_column)?,
        None => (0..count).collect(),
    };
    let mut engine = Engine::new(trained, inference.into(), a.batch, |_, _, _| {})
        .with_context(|| format!("inference with {}", dir.display()))?;
    if let Some(task) = &a.task {
        engine
            .choose_task(task)
            .with_context(|| format!("--task {task}"))?;
    }
    // Sampled draws are keyed by node: the layers below the last, computed
    // once for every node, give every batch the rows it would compute itself.
    if engine.inference() == Inference::Sampled && engine.precompute_pays_for(wanted.len()) {
        let bytes = engine.precompute_bytes();
        // A malformed budget is refused, not taken for a full machine.
        graphs::memory::env_budget()?;
        match engine.check_precompute_fits() {
            Ok(()) => {
                warnln!(
                    "predict: the layers below the last over every node first ({} of rows; fewer rows than per batch for {} nodes)",
                    graphs::memory::human(bytes),
                    wanted.len()
                );
                engine = engine
                    .precompute(a.batch.max(1024), |_, _, _| {})
                    .with_context(|| format!("inference with {}", dir.display()))?;
            }
            Err(_) => warnln!(
                "predict: every layer per batch (the rows of every node, {}, would not fit)",
                graphs::memory::human(bytes)
            ),
        }
    }
    let names = &engine.trained().names[engine.trained().graph.target().index()];
    let want = Want {
        probabilities: false,
        embeddings: a.embeddings.is_some(),
    };
    // Each node's answer is independent of the batch, so batches follow the
    // wanted order (repeats computed once per batch they fall in).
    let mut classes: Vec<i64> = Vec::with_capacity(wanted.len());
    let mut values: Vec<f32> = Vec::new();
    let mut sets: Vec<Vec<u32>> = Vec::new();
    let (regresses, multi_label) = (engine.regresses(), engine.multi_label());
    let label_count = engine.outputs();
    let mut emb_out: Vec<f32> = Vec::new();
    let mut width = 0;
    for batch in wanted.chunks(a.batch) {
        let c = engine
            .classify(batch, want)
            .with_context(|| format!("inference with {}", dir.display()))?;
        classes.extend(c.classes.iter().map(|&k| i64::from(k)));
        values.extend(c.values.unwrap_or_default());
        sets.extend(c.labels.unwrap_or_default());
        if let Some(e) = c.embeddings {
            width = e.width;
            emb_out.extend_from_slice(&e.data);
        }
    }
    // The predictions and the embeddings land together or not at all.
    let mut staged = crate::output::Staged::new();
    let out = staged.path(&a.out);
    (|| -> anyhow::Result<()> {
        match out_format {
            ResultFormat::Npy if regresses => {
                graphs::npy::write_f32(&out, &[values.len() as u64], &values)?
            }
            ResultFormat::Table(f) if regresses => {
                let columns = [
                    ("id".to_string(), names.column_type()),
                    ("value".into(), ColumnType::Float32),
                ];
                let data = vec![names.column(&wanted), ColumnData::Float32(values.clone())];
                let mut w = TableWriter::create(&out, f, &columns)?;
                w.write(data)?;
                w.finish()?;
            }
            ResultFormat::Npy if multi_label => {
                let shape = [sets.len() as u64, label_count as u64];
                graphs::npy::write_i8(&out, &shape, &label_bits(&sets, label_count))?
            }
            ResultFormat::Table(f) if multi_label => {
                let columns = [
                    ("id".to_string(), names.column_type()),
                    ("labels".into(), ColumnType::Text),
                ];
                // Labels imported as names are written as their names.
                let label_names = names.labels();
                let joined = sets.iter().map(|set| {
                    let s: Vec<String> = set
                        .iter()
                        .map(|&j| match label_names.get(j as usize) {
                            Some(n) => n.clone(),
                            None => j.to_string(),
                        })
                        .collect();
                    Some(s.join(";"))
                });
                let data = vec![names.column(&wanted), ColumnData::Text(joined.collect())];
                let mut w = TableWriter::create(&out, f, &columns)?;
                w.write(data)?;
                w.finish()?;
            }
            ResultFormat::Npy => graphs::npy::write_i64(&out, &[classes.len() as u64], &classes)?,
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
                let mut w = TableWriter::create(&out, f, &columns)?;
                w.write(data)?;
                w.finish()?;
            }
        }
        Ok(())
    })()
    .with_context(|| format!("writing {}", a.out.display()))?;
    if let (Some(path), Some(format)) = (&a.embeddings, emb_format) {
        let (flat, dest) = (emb_out, path);
        let path = staged.path(dest);
        match format {
            ResultFormat::Npy => {
                graphs::npy::write_f32(&path, &[wanted.len() as u64, width as u64], &flat)
                    .map_err(anyhow::Error::from)
            }
            ResultFormat::Table(f) => write_embedding_table(&path, f, names, &wanted, &flat, width),
        }
        .with_context(|| format!("writing {}", dest.display()))?;
    }
    staged.commit()?;
    sayln!(
        "wrote predictions for {} {} nodes to {} (checkpoint {})",
        wanted.len(),
        target_name,
        a.out.display(),
        dir.display()
    );
    if let Some(p) = &a.embeddings {
        sayln!("wrote embeddings to {}", p.display());
    }
    Ok(())
}

/// Label sets as rows of `labels` 0/1 flags, as `predict` writes them to `.npy`.
pub fn label_bits(sets: &[Vec<u32>], labels: usize) -> Vec<i8> {
    let mut bits = vec![0i8; sets.len() * labels];
    for (i, set) in sets.iter().enumerate() {
        for &j in set {
            bits[i * labels + j as usize] = 1;
        }
    }
    bits
}

/// Writes embedding rows (`width` floats per node of `nodes`) as a table with an id column.
pub fn write_embedding_table(
    path: &std::path::Path,
    format: tables::config::FileFormat,
    names: &tables::results::NodeNames,
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
