//! `hetgnn predict --edges`: the class or value an edge model gives each of a
//! list of edges, or a link predictor's score and probability, by exact
//! inference (as its evaluation during training).

use std::path::Path;

use anyhow::{bail, Context};
use graphs::npy::{DType, NpyFile};
use models::edge::EdgeSpec;
use serving::Trained;
use tables::results::ResultFormat;
use tables::write::{ColumnData, ColumnType, TableWriter};

/// Destinations per chunk of exact inference.
const INFERENCE_CHUNK: usize = 4096;

/// What scores a model's edges.
pub enum Scorer {
    /// An edge task's decoder: a class or a value per edge.
    Edge(EdgeSpec),
    /// A link predictor's decoder over its target relations: a score.
    Link(Vec<String>),
}

impl Scorer {
    /// The relations whose edges it scores.
    pub fn relations(&self) -> &[String] {
        match self {
            Scorer::Edge(e) => &e.relations,
            Scorer::Link(r) => r,
        }
    }

    /// The task, for messages.
    pub fn task(&self) -> &'static str {
        match self {
            Scorer::Edge(_) => "an edge task",
            Scorer::Link(_) => "link prediction",
        }
    }
}

/// Scores the edges in `path` (of `relation`, or the model's first target
/// relation) with `trained` and writes them to `out`.
pub fn run(
    trained: &Trained,
    scorer: &Scorer,
    relation: Option<&str>,
    path: &Path,
    out: &Path,
    format: ResultFormat,
) -> anyhow::Result<()> {
    let g = &trained.graph;
    let relations = scorer.relations();
    let name = match relation {
        Some(r) if relations.iter().any(|x| x == r) => r.to_string(),
        Some(r) => bail!(
            "--relation {r}: the model was trained on {}",
            relations.join(", ")
        ),
        None => relations
            .first()
            .cloned()
            .context("the model names no target relation")?,
    };
    let rid = g
        .relation_id(&name)
        .with_context(|| format!("relation '{name}' is not in graph '{}'", g.name()))?;
    let rel = g.relation(rid);
    let (st, dt) = (rel.src.index(), rel.dst.index());
    let (src, dst) = read_edges(trained, st, dt, path)?;
    let rows = models::inference::embed_all(&trained.model, g, INFERENCE_CHUNK, |_, _, _| {})
        .context("exact inference")?;
    // A model with node tasks too: the decoder's columns.
    let rows = models::inference::decoder_type_rows(&trained.model, rows);
    let table = |t: usize| {
        rows[t]
            .as_ref()
            .with_context(|| format!("no embeddings for node type '{}'", g.node_types()[t].name))
    };
    let names = |t: usize, ids: &[u32]| trained.names[t].column(ids);
    let ends = [
        ("src".to_string(), trained.names[st].column_type()),
        ("dst".to_string(), trained.names[dt].column_type()),
    ];
    let spec = match scorer {
        Scorer::Edge(spec) => spec,
        Scorer::Link(relations) => {
            let at = relations.iter().position(|r| *r == name).unwrap_or(0);
            let scores =
                models::link::score_rows(&trained.model, at, table(st)?, table(dt)?, &src, &dst)
                    .with_context(|| format!("scoring the edges of {}", path.display()))?;
            match format {
                ResultFormat::Npy => graphs::npy::write_f32(out, &[scores.len() as u64], &scores)?,
                ResultFormat::Table(f) => {
                    let mut columns = ends.to_vec();
                    columns.push(("score".into(), ColumnType::Float32));
                    columns.push(("probability".into(), ColumnType::Float32));
                    let p = scores
                        .iter()
                        .copied()
                        .map(models::link::probability)
                        .collect();
                    let mut w = TableWriter::create(out, f, &columns)?;
                    w.write(vec![
                        names(st, &src),
                        names(dt, &dst),
                        ColumnData::Float32(scores),
                        ColumnData::Float32(p),
                    ])?;
                    w.finish()?;
                }
            }
            sayln!(
                "wrote scores of {} {name} edges to {} (checkpoint {})",
                src.len(),
                out.display(),
                trained.source.dir.display()
            );
            return Ok(());
        }
    };
    let y = models::edge::decode_rows(&trained.model, table(st)?, table(dt)?, &src, &dst)
        .with_context(|| format!("scoring the edges of {}", path.display()))?;
    if spec.values {
        let values: Vec<f32> = y.squeeze(1)?.to_vec1()?;
        match format {
            ResultFormat::Npy => graphs::npy::write_f32(out, &[values.len() as u64], &values)?,
            ResultFormat::Table(f) => {
                let mut columns = ends.to_vec();
                columns.push(("value".into(), ColumnType::Float32));
                let mut w = TableWriter::create(out, f, &columns)?;
                w.write(vec![
                    names(st, &src),
                    names(dt, &dst),
                    ColumnData::Float32(values),
                ])?;
                w.finish()?;
            }
        }
    } else {
        let classes: Vec<i64> = y
            .argmax(1)?
            .to_vec1::<u32>()?
            .into_iter()
            .map(i64::from)
            .collect();
        match format {
            ResultFormat::Npy => graphs::npy::write_i64(out, &[classes.len() as u64], &classes)?,
            ResultFormat::Table(f) => {
                let mut columns = ends.to_vec();
                columns.push(("class".into(), ColumnType::Int));
                let class_names = trained.edge_classes.get(&name);
                let mut data = vec![names(st, &src), names(dt, &dst)];
                if let Some(n) = class_names {
                    columns.push(("class_name".into(), ColumnType::Text));
                    data.push(ColumnData::Int(classes.iter().map(|&c| Some(c)).collect()));
                    data.push(ColumnData::Text(
                        classes
                            .iter()
                            .map(|&c| n.get(c as usize).cloned())
                            .collect(),
                    ));
                } else {
                    data.push(ColumnData::Int(classes.into_iter().map(Some).collect()));
                }
                let mut w = TableWriter::create(out, f, &columns)?;
                w.write(data)?;
                w.finish()?;
            }
        }
    }
    sayln!(
        "wrote predictions for {} {name} edges to {} (checkpoint {})",
        src.len(),
        out.display(),
        trained.source.dir.display()
    );
    Ok(())
}

/// The edges in `path`: `.npy` int64 [2, n] of ids, or a table's `src` and
/// `dst` columns (original ids), each id checked against its type.
fn read_edges(
    trained: &Trained,
    st: usize,
    dt: usize,
    path: &Path,
) -> anyhow::Result<(Vec<u32>, Vec<u32>)> {
    let g = &trained.graph;
    let (ns, nd) = (g.node_types()[st].count, g.node_types()[dt].count);
    if path.extension().is_some_and(|e| e == "npy") {
        let f = NpyFile::open(path, DType::I64)?;
        let shape = f.shape().to_vec();
        if shape.len() != 2 || shape[0] != 2 {
            bail!(
                "{}: edges must be int64 [2, n] (sources, then destinations); the shape is {shape:?}",
                path.display()
            );
        }
        let n = shape[1] as usize;
        let ids = |row: usize, bound: u32, end: &str| -> anyhow::Result<Vec<u32>> {
            (0..n)
                .map(|i| {
                    let v = f.i64_at(row * n + i);
                    match u32::try_from(v) {
                        Ok(v) if v < bound => Ok(v),
                        _ => bail!(
                            "{}: edge {i}: {end} id {v} is out of range 0..{bound}",
                            path.display()
                        ),
                    }
                })
                .collect()
        };
        return Ok((ids(0, ns, "source")?, ids(1, nd, "destination")?));
    }
    let src = trained.names[st].read(path, "src")?;
    let dst = trained.names[dt].read(path, "dst")?;
    if src.len() != dst.len() {
        bail!(
            "{}: {} sources for {} destinations",
            path.display(),
            src.len(),
            dst.len()
        );
    }
    Ok((src, dst))
}
