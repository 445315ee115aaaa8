//! `hetgnn embed`: every node's embedding, of every type, from a checkpoint
//! by exact offline inference (full neighbourhoods, layer by layer), written
//! as one float32 `.npy` per node type.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use graphs::npy::{DType as NpyType, NpyWriter};
use graphs::Progress as _;
use tables::config::FileFormat;

use crate::output::{Kind, Output};

/// Options of `hetgnn embed`.
#[derive(Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    model: crate::predict::ModelArgs,
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
    /// Replace the output directory if it exists.
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
    crate::output::check(
        &[Output {
            flag: "--out",
            path: &a.out,
            kind: Kind::Dir,
        }],
        a.force,
        &a.model.inputs(),
    )?;
    let start = Instant::now();
    let trained = a.model.load()?;
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
