//! Neighbor-sampling throughput: 2-layer sampling with per-relation fanouts on a
//! mag-like graph (reverse relations added), batches of training papers.
//!
//! `cargo run --release -p bench --bin sample [-- --scale 0.1 --fanouts 25,20 --batch 1024]`
//! prints sampled edges/s and batches/s per core, single-threaded and with all
//! cores (or `--threads`), and writes the figures as JSON (`--out`, default
//! bench/results/sample.json).
//!
//! With `--device cuda:0` (a `--features cuda` build) it also samples the
//! same batches with every pick drawn on the GPU (`models::ops::DeviceSampler`,
//! blocks built on one host thread), checks each batch equals the CPU
//! sampler's, and gives its time per batch against the threads'.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use graphs::sampler::epoch_batches;
use graphs::{load, LoadOptions, Sampler};
use rayon::prelude::*;

#[derive(Parser)]
struct Args {
    /// Scale of the mag-like graph (1.0 = ogbn-mag's size).
    #[arg(long, default_value_t = 0.1)]
    scale: f64,
    /// Use this graph directory instead of a generated one.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Fanouts per hop, seeds outward.
    #[arg(long, default_value = "25,20", value_delimiter = ',')]
    fanouts: Vec<usize>,
    /// Seeds per batch.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Batches to time (default: one epoch).
    #[arg(long)]
    batches: Option<usize>,
    /// Threads of the parallel run (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Also sample on this device (`cuda:N`), against the CPU runs.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/sample.json")]
    out: PathBuf,
}

/// Samples `batches` with every pick drawn on `device`, one batch after
/// another on this thread, each checked against the CPU sampler's batch.
#[cfg(feature = "cuda")]
fn on_device(
    g: &graphs::HetGraph,
    batches: &[Vec<u32>],
    fanouts: &[usize],
    device: &str,
) -> anyhow::Result<Run> {
    let dev = actors::device::open(device)?;
    let ds = models::ops::DeviceSampler::new(g, &dev)?;
    let mut s = Sampler::new(g, fanouts, 0)?;
    // Warm-up: the kernels' compilation and first launches do not count.
    for (i, b) in batches.iter().take(2).enumerate() {
        ds.sample(&mut s, 0, i as u64, b)?;
    }
    let start = Instant::now();
    let (mut edges, mut nodes) = (0u64, 0u64);
    let mut made = Vec::with_capacity(batches.len());
    for (i, b) in batches.iter().enumerate() {
        let mb = ds.sample(&mut s, 0, i as u64, b)?;
        edges += mb.num_edges() as u64;
        nodes += mb.num_input_nodes() as u64;
        made.push(mb);
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut cpu = Sampler::new(g, fanouts, 0)?;
    for (i, (b, mb)) in batches.iter().zip(&made).enumerate() {
        anyhow::ensure!(
            *mb == cpu.sample(0, i as u64, b)?,
            "batch {i}: the device's picks differ from the CPU sampler's"
        );
    }
    Ok(Run {
        seconds,
        edges,
        nodes,
        batches: batches.len(),
    })
}

#[cfg(not(feature = "cuda"))]
fn on_device(
    _: &graphs::HetGraph,
    _: &[Vec<u32>],
    _: &[usize],
    device: &str,
) -> anyhow::Result<Run> {
    anyhow::bail!("--device {device} needs a build with CUDA (--features cuda)")
}

struct Run {
    seconds: f64,
    edges: u64,
    nodes: u64,
    batches: usize,
}

fn run(
    g: &graphs::HetGraph,
    batches: &[Vec<u32>],
    fanouts: &[usize],
    threads: usize,
) -> anyhow::Result<Run> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let start = Instant::now();
    let per_thread: Vec<anyhow::Result<(u64, u64)>> = pool.install(|| {
        batches
            .par_chunks(batches.len().div_ceil(threads))
            .enumerate()
            .map(|(c, chunk)| {
                let mut s = Sampler::new(g, fanouts, 0)?;
                let (mut edges, mut nodes) = (0u64, 0u64);
                for (i, b) in chunk.iter().enumerate() {
                    let mb = s.sample(0, (c * chunk.len() + i) as u64, b)?;
                    edges += mb.num_edges() as u64;
                    nodes += mb.num_input_nodes() as u64;
                }
                Ok((edges, nodes))
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let (mut edges, mut nodes) = (0, 0);
    for r in per_thread {
        let (e, n) = r?;
        edges += e;
        nodes += n;
    }
    Ok(Run {
        seconds,
        edges,
        nodes,
        batches: batches.len(),
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = match &args.data {
        Some(d) => d.clone(),
        None => bench::mag_like(args.scale, 0)?,
    };
    let t = Instant::now();
    let g = load(
        &dir,
        &LoadOptions {
            mmap_features: true,
            reverse_edges: true,
        },
    )
    .with_context(|| format!("loading {}", dir.display()))?;
    let load_s = t.elapsed().as_secs_f64();
    let (_, splits) = g.target_labels();
    let mut batches = epoch_batches(&splits.train, args.batch, 0, 0);
    if let Some(n) = args.batches {
        batches.truncate(n);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "graph {} ({} relations incl. reverse), loaded in {load_s:.2}s",
        g.name(),
        g.relations().len()
    );
    println!(
        "fanouts {:?}, batch {}, {} batches, {cores} cores",
        args.fanouts,
        args.batch,
        batches.len()
    );

    // Warm-up pass so page faults of the mapping do not count.
    run(&g, &batches[..batches.len().min(2)], &args.fanouts, 1)?;
    let single = run(&g, &batches, &args.fanouts, 1)?;
    let threads = args.threads.unwrap_or(cores).max(1);
    let multi = run(&g, &batches, &args.fanouts, threads)?;
    let device = match args.device.as_str() {
        "cpu" => None,
        d => Some(on_device(&g, &batches, &args.fanouts, d)?),
    };
    let report = |name: &str, r: &Run, threads: usize| {
        let eps = r.edges as f64 / r.seconds;
        println!(
            "{name:>8}: {threads} thread(s) {:.3}s  {:.2} M edges/s  ({:.2} M/s per core)  {:.1} batches/s ({:.1} per core)",
            r.seconds,
            eps / 1e6,
            eps / 1e6 / threads as f64,
            r.batches as f64 / r.seconds,
            r.batches as f64 / r.seconds / threads as f64
        );
    };
    report("single", &single, 1);
    report("parallel", &multi, threads);
    if let Some(d) = &device {
        report(&args.device, d, 1);
        println!(
            "{}: {:.2} ms a batch, {:.2}x faster than {threads} threads ({:.2} ms)",
            args.device,
            d.seconds / d.batches as f64 * 1e3,
            multi.seconds / d.seconds,
            multi.seconds / multi.batches as f64 * 1e3
        );
    }
    let mean_edges = single.edges as f64 / single.batches as f64;
    let mean_nodes = single.nodes as f64 / single.batches as f64;
    println!("mean per batch: {mean_edges:.0} sampled edges, {mean_nodes:.0} input nodes");

    let mut json = serde_json::json!({
        "graph": g.name(), "fanouts": args.fanouts, "batch": args.batch, "batches": batches.len(),
        "cores": cores, "load_seconds": load_s,
        "single_thread": { "seconds": single.seconds, "edges_per_s": single.edges as f64 / single.seconds,
                           "batches_per_s": single.batches as f64 / single.seconds },
        "all_cores": { "threads": threads, "seconds": multi.seconds,
                       "edges_per_s_per_core": multi.edges as f64 / multi.seconds / cores as f64,
                       "batches_per_s_per_core": multi.batches as f64 / multi.seconds / cores as f64 },
        "mean_edges_per_batch": mean_edges, "mean_input_nodes_per_batch": mean_nodes,
        "peak_rss_bytes": bench::peak_rss_bytes(),
    });
    if let Some(d) = &device {
        json["device"] = serde_json::json!({ "device": args.device, "seconds": d.seconds,
            "ms_per_batch": d.seconds / d.batches as f64 * 1e3,
            "speedup_over_threads": multi.seconds / d.seconds, "equal_to_cpu": true });
    }
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}
