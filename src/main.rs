//! The `hetgnn` command line: parses arguments, calls the libraries, prints
//! errors once with their causes, and maps the outcome to an exit code
//! (0 success, 1 failure, 2 bad usage).

/// Training allocates and frees tensors of megabytes every step: glibc returns
/// them to the OS and pays page faults and TLB shootdowns each time (a third
/// of a step's time measured); mimalloc keeps them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[macro_use]
mod console;

mod bar;
mod cluster;
mod embed;
mod inspect;
mod launch;
mod limits;
mod output;
mod partition;
mod plot;
mod predict;
mod predict_edges;
mod predict_parts;
mod profile;
mod serve;
mod tables;
mod train;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use graphs::generate::{generate, Like};
use graphs::ogb::{import_ogb, OgbImport};
use output::{Kind, Output};

/// Distributed training of graph neural networks on large heterogeneous graphs.
#[derive(Parser)]
#[command(name = "hetgnn", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a synthetic heterogeneous graph in the graph directory format.
    Generate {
        /// Which real graph to imitate (schema and proportions).
        #[arg(long, default_value = "mag")]
        like: Like,
        /// Size relative to the real graph (1.0 = ogbn-mag's 1.9M nodes, 21M edges).
        #[arg(long, default_value_t = 0.01)]
        scale: f64,
        /// Random seed; the output is byte-identical for the same seed and scale.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Replace the output directory if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Cluster certificates for mutual TLS between nodes.
    #[command(subcommand)]
    Certs(Certs),
    /// Convert a dataset from another layout (tables, OGB) into the graph directory format.
    #[command(subcommand)]
    Import(Import),
    /// Write a graph directory in another layout (node and edge tables).
    #[command(subcommand)]
    Export(Export),
    /// Split a graph into partitions for data-parallel training.
    Partition(partition::PartitionArgs),
    /// Train a model (with no options: R-GCN on a built-in mag-like graph).
    Train(Box<train::TrainArgs>),
    /// Draw the loss and accuracy curves of a run report (--report) as a PNG.
    Plot {
        /// The JSON report.
        report: PathBuf,
        /// Output PNG.
        #[arg(long, default_value = "curves.png")]
        out: PathBuf,
        /// Replace the output file if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Predict classes (and final-layer embeddings) of every target node from a checkpoint.
    Predict(predict::PredictArgs),
    /// Embeddings of every node of every type from a checkpoint, by exact offline inference.
    Embed(embed::EmbedArgs),
    /// Answer predict and embed requests over HTTP/JSON from a checkpoint (until SIGTERM).
    Serve(serve::ServeArgs),
    /// Run one node of a cluster from a topology file (until Ctrl-C or SIGTERM).
    Node {
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
        /// Which node of the file this process is.
        #[arg(long)]
        node: String,
    },
    /// Start every node of a topology file as a local child process; stop them all on Ctrl-C or when one fails.
    Launch {
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
        /// Restart a node killed by a signal (kill -9, the OOM killer) up to this many times;
        /// a data-parallel run rolls back to its last checkpoint and goes on.
        #[arg(long, default_value_t = 3)]
        restarts: u32,
    },
    /// Check a topology file and its certificates, then ask every node for its state and round-trip time.
    #[command(allow_negative_numbers = true)]
    Doctor {
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
        /// Seconds to wait for each node.
        #[arg(long, default_value_t = 5.0)]
        timeout: f64,
    },
    /// Validate a graph directory and print its schema, sizes and degree statistics.
    Inspect {
        /// The graph directory.
        dir: PathBuf,
        /// Also show the `rev_<name>` relations training would add.
        #[arg(long)]
        reverse_edges: bool,
    },
}

#[derive(Subcommand)]
enum Certs {
    /// Create a cluster CA and one certificate per node (ca.pem, ca.key, <node>.pem, <node>.key).
    Init {
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Node ids, comma-separated (e.g. n0,n1,n2).
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// Replace the output directory if it exists.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
enum Import {
    /// Node and edge tables (Parquet, CSV) described by a TOML configuration.
    Tables(tables::ImportTablesArgs),
    /// OGB's raw heterogeneous layout (raw/, split/ as ogbn-mag ships them).
    Ogb {
        /// The OGB dataset directory (holding raw/ and split/).
        dir: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Graph name (default: the dataset directory's name).
        #[arg(long)]
        name: Option<String>,
        /// Which split/<NAME> to use when there are several.
        #[arg(long)]
        split: Option<String>,
        /// Replace the output directory if it exists.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
enum Export {
    /// Node and edge tables with string ids, and the configuration that imports them back.
    Tables(tables::ExportTablesArgs),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    limits::check_memory_budget()?;
    if matches!(
        cli.command,
        Command::Train(_) | Command::Node { .. } | Command::Launch { .. } | Command::Serve(_)
    ) {
        limits::require_open_files()?;
    }
    match cli.command {
        Command::Generate {
            like,
            scale,
            seed,
            out,
            force,
        } => {
            output::check(
                &[Output {
                    flag: "--out",
                    path: &out,
                    kind: Kind::Dir,
                }],
                force,
                &[],
            )?;
            let start = Instant::now();
            let schema = generate(like, scale, seed, &out, force, &mut bar::Bars::new())
                .with_context(|| format!("generating into {}", out.display()))?;
            let nodes: u64 = schema.node_types.iter().map(|(_, t)| t.count).sum();
            let edges: u64 = schema.relations.iter().map(|r| r.count).sum();
            sayln!(
                "wrote {} to {} ({nodes} nodes, {edges} edges) in {:.1}s",
                schema.name,
                out.display(),
                start.elapsed().as_secs_f64()
            );
        }
        Command::Import(Import::Ogb {
            dir,
            out,
            name,
            split,
            force,
        }) => {
            output::check(
                &[Output {
                    flag: "--out",
                    path: &out,
                    kind: Kind::Dir,
                }],
                force,
                &[("DIR", &dir)],
            )?;
            let opts = OgbImport {
                name,
                split,
                overwrite: force,
            };
            let schema = import_ogb(&dir, &out, &opts, &mut bar::Bars::new())
                .with_context(|| format!("importing {} into {}", dir.display(), out.display()))?;
            sayln!(
                "wrote {} to {} (target {}, {} classes)",
                schema.name,
                out.display(),
                schema.target,
                schema.num_classes
            );
        }
        Command::Import(Import::Tables(args)) => tables::import(&args)?,
        Command::Export(Export::Tables(args)) => tables::export(&args)?,
        Command::Inspect { dir, reverse_edges } => inspect::run(&dir, reverse_edges)?,
        Command::Certs(Certs::Init { out, nodes, force }) => {
            output::check(
                &[Output {
                    flag: "--out",
                    path: &out,
                    kind: Kind::Dir,
                }],
                force,
                &[],
            )?;
            runtime::certs::init(&out, &nodes, force)
                .with_context(|| format!("creating certificates in {}", out.display()))?;
            sayln!(
                "wrote the cluster CA and certificates for {} to {}",
                nodes.join(", "),
                out.display()
            );
            sayln!(
                "keep {} private: it can sign new nodes into the cluster",
                out.join("ca.key").display()
            );
        }
        Command::Partition(args) => partition::run(&args)?,
        Command::Train(args) => {
            graphs::memory::track_anon();
            train::run(&args)?
        }
        Command::Plot { report, out, force } => {
            output::check(
                &[Output {
                    flag: "--out",
                    path: &out,
                    kind: Kind::File,
                }],
                force,
                &[("REPORT", &report)],
            )?;
            plot::run(&report, &out)?
        }
        Command::Predict(args) => predict::run(&args)?,
        Command::Embed(args) => embed::run(&args)?,
        Command::Serve(args) => serve::run(&args)?,
        Command::Node { cluster, node } => {
            graphs::memory::track_anon();
            cluster::node(&cluster, &node)?
        }
        Command::Launch { cluster, restarts } => launch::run(&cluster, restarts)?,
        Command::Doctor { cluster, timeout } => {
            anyhow::ensure!(
                timeout.is_finite() && timeout > 0.0 && timeout <= 3600.0,
                "--timeout must be a number of seconds in (0, 3600], got {timeout}"
            );
            cluster::doctor(&cluster, std::time::Duration::from_secs_f64(timeout))?
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    models::threads::init_cpu_threads();
    runtime::alloc::keep_freed_memory();
    let cli = Cli::parse();
    // A server keeps the tables it reads at random for its whole life: huge
    // pages spare it TLB misses. Every other command touches most of its
    // memory once or a few times, where zeroing fresh huge pages costs more.
    if !matches!(cli.command, Command::Serve(_)) {
        runtime::alloc::avoid_huge_pages();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if let Some(i) = err.downcast_ref::<launch::Interrupted>() {
                warnln!("error: {i}");
                return ExitCode::from(i.exit_code());
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            warnln!("error: {}", describe(&err));
            ExitCode::FAILURE
        }
    }
}

/// `err` and its causes, each once: library errors that name a file often
/// print their cause in their own message too.
fn describe(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_in_its_message_is_printed_once() {
        let io = std::io::Error::other("No space left on device");
        let lib = graphs::GraphError::Io {
            path: "out.npy".into(),
            source: io,
        };
        let err = anyhow::Error::new(lib).context("writing predictions");
        assert_eq!(
            super::describe(&err),
            "writing predictions: out.npy: No space left on device"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::describe(&plain), "outer: inner");
    }
}
