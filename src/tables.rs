//! `hetgnn import tables` and `hetgnn export tables`: graphs in and out of
//! node and edge tables (Parquet, CSV).

use std::path::{Path, PathBuf};
use std::time::Instant;

use ::tables::config::FileFormat;
use ::tables::{export_tables, import_tables, ImportOptions, TablesConfig};
use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::bar;
use crate::output::{self, Kind, Output};

/// Arguments of `import tables`.
#[derive(Args)]
pub struct ImportTablesArgs {
    /// The table configuration (TOML; see docs/guide/tables.md).
    #[arg(long)]
    config: PathBuf,
    /// Output graph directory.
    #[arg(long)]
    out: PathBuf,
    /// Graph name (default: the configuration's `name`, else the output directory's name).
    #[arg(long)]
    name: Option<String>,
    /// Continue an earlier import (a graph directory made by `import tables`): keep its
    /// nodes, edges and ids, reuse its fitted statistics and classes, and add these tables.
    #[arg(long)]
    like: Option<PathBuf>,
    /// Replace the output directory if it exists.
    #[arg(long)]
    force: bool,
}

/// Arguments of `export tables`.
#[derive(Args)]
pub struct ExportTablesArgs {
    /// The graph directory to export.
    #[arg(long)]
    data: PathBuf,
    /// Output directory (tables under nodes/ and edges/, and graph.toml).
    #[arg(long)]
    out: PathBuf,
    /// Table format.
    #[arg(long, value_enum, default_value_t = Format::Parquet)]
    format: Format,
    /// Replace the output directory if it exists.
    #[arg(long)]
    force: bool,
}

/// Table formats on the command line.
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// Apache Parquet (Snappy-compressed).
    Parquet,
    /// CSV with a header row.
    Csv,
}

/// Runs `import tables`.
pub fn import(args: &ImportTablesArgs) -> anyhow::Result<()> {
    let cfg = TablesConfig::read(&args.config)?;
    let base = args.config.parent().unwrap_or(Path::new("."));
    let files: Vec<PathBuf> = cfg
        .nodes
        .iter()
        .flat_map(|n| n.files.iter())
        .chain(cfg.edges.iter().flat_map(|e| e.files.iter()))
        .map(|f| base.join(f))
        .collect();
    let mut inputs: Vec<(&str, &Path)> = vec![("--config", &args.config)];
    if let Some(like) = &args.like {
        inputs.push(("--like", like));
    }
    inputs.extend(files.iter().map(|f| ("(a table of --config)", f.as_path())));
    output::check(
        &[Output {
            flag: "--out",
            path: &args.out,
            kind: Kind::Dir,
        }],
        args.force,
        &inputs,
    )?;
    let start = Instant::now();
    let opts = ImportOptions {
        name: args.name.clone(),
        overwrite: args.force,
        like: args.like.clone(),
    };
    let (schema, record) = import_tables(&args.config, &args.out, &opts, &mut bar::Bars::new())
        .with_context(|| {
            format!(
                "importing the tables of {} into {}",
                args.config.display(),
                args.out.display()
            )
        })?;
    let nodes: u64 = schema.node_types.iter().map(|(_, t)| t.count).sum();
    let edges: u64 = schema.relations.iter().map(|r| r.count).sum();
    sayln!(
        "wrote {} to {} ({nodes} nodes, {edges} edges; target {}, {} classes) in {:.1}s",
        schema.name,
        args.out.display(),
        schema.target,
        schema.num_classes,
        start.elapsed().as_secs_f64()
    );
    for (rel, n) in &record.dropped_edges {
        sayln!("left out {n} edges of {rel} naming unknown nodes (unknown_ids = \"drop\")");
    }
    Ok(())
}

/// Runs `export tables`.
pub fn export(args: &ExportTablesArgs) -> anyhow::Result<()> {
    output::check(
        &[Output {
            flag: "--out",
            path: &args.out,
            kind: Kind::Dir,
        }],
        args.force,
        &[("--data", &args.data)],
    )?;
    let format = match args.format {
        Format::Parquet => FileFormat::Parquet,
        Format::Csv => FileFormat::Csv,
    };
    let start = Instant::now();
    let config = export_tables(
        &args.data,
        &args.out,
        format,
        args.force,
        &mut bar::Bars::new(),
    )
    .with_context(|| {
        format!(
            "exporting {} as tables into {}",
            args.data.display(),
            args.out.display()
        )
    })?;
    sayln!(
        "wrote the tables of {} to {} in {:.1}s; import them with: hetgnn import tables --config {} --out DIR",
        args.data.display(),
        args.out.display(),
        start.elapsed().as_secs_f64(),
        config.display()
    );
    Ok(())
}
