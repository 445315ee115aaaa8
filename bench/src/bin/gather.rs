//! The feature gather on a device against its bandwidth floor: a batch's rows
//! picked out of a table held on the device (what a cache holding every row
//! does each step), timed with the device synchronised, against the bytes it
//! must move (rows read and rows written) at the device's memory bandwidth:
//! candle's `index_select` and hetgnn's `take_rows`.
//!
//! `cargo run --release -p bench --bin gather -- [--device cuda:0] [--rows 736389 --dim 128 --batch 200000]`
//!
//! The defaults are the paper table of mag-like S=1 and about the paper rows
//! of one of its batches. `--bandwidth` is the floor's bandwidth (default 3
//! TB/s, an H100's device-to-device copy counting bytes read and written).

use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Device holding the table.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Rows of the table.
    #[arg(long, default_value_t = 736_389)]
    rows: usize,
    /// Row width (f32 values).
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Rows gathered per batch (distinct, uniformly drawn).
    #[arg(long, default_value_t = 200_000)]
    batch: usize,
    /// Timed batches.
    #[arg(long, default_value_t = 50)]
    repeat: usize,
    /// The floor's memory bandwidth in bytes per second (read plus written).
    #[arg(long, default_value_t = 3.0e12)]
    bandwidth: f64,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/gather.json")]
    out: std::path::PathBuf,
}

/// Distinct ids in `0..rows`, `n` of them, in a shuffled order (a fixed seed).
fn ids(rows: usize, n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut all: Vec<u32> = (0..rows as u32).collect();
    let n = n.min(rows);
    // A partial Fisher-Yates shuffle: the first n are a uniform sample.
    for i in 0..n {
        let j = i + (next() % (rows - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

/// Seconds per batch (min, median) of `f`, the device synchronised after each.
fn time(
    device: &Device,
    repeat: usize,
    mut f: impl FnMut(usize) -> candle_core::Result<Tensor>,
) -> anyhow::Result<(f64, f64)> {
    f(0)?;
    device.synchronize()?;
    let mut s = Vec::with_capacity(repeat);
    for r in 0..repeat {
        let t = Instant::now();
        std::hint::black_box(f(r)?);
        device.synchronize()?;
        s.push(t.elapsed().as_secs_f64());
    }
    s.sort_by(f64::total_cmp);
    Ok((s[0], s[s.len() / 2]))
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(
        a.rows > 0 && a.dim > 0 && a.batch > 0 && a.repeat > 0,
        "--rows, --dim, --batch and --repeat must be positive"
    );
    let device = actors::device::open(&a.device)?;
    let table = Tensor::randn(0f32, 1f32, (a.rows, a.dim), &device)
        .context("the table")?
        .to_dtype(DType::F32)?;
    // A few batches' ids, cycled, so caches see different rows each time.
    let batches: Vec<Vec<u32>> = (0..4)
        .map(|k| ids(a.rows, a.batch, 0x9E37_79B9 + k))
        .collect();
    let on_device: Vec<Tensor> = batches
        .iter()
        .map(|b| Tensor::from_slice(b, b.len(), &device))
        .collect::<candle_core::Result<_>>()?;
    let n = batches[0].len();
    let bytes = (2 * n * a.dim * 4) as f64;
    let floor = bytes / a.bandwidth;
    let (kernel_min, kernel_med) = time(&device, a.repeat, |r| {
        table.index_select(&on_device[r % 4], 0)
    })?;
    let (step_min, step_med) = time(&device, a.repeat, |r| {
        let b = &batches[r % 4];
        table.index_select(&Tensor::from_slice(b, b.len(), &device)?, 0)
    })?;
    let (take_min, take_med) = time(&device, a.repeat, |r| {
        models::ops::take_rows(&table, &batches[r % 4])
    })?;
    // What the uploads and the device's own copies cost alone: the ids'
    // upload (to take from take_rows' time) and a contiguous copy of as many
    // rows (the bandwidth a gather could reach, with nothing scattered).
    let (up_min, up_med) = time(&device, a.repeat, |r| {
        Tensor::from_slice(&batches[r % 4], n, &device)
    })?;
    let (copy_min, copy_med) = time(&device, a.repeat, |r| {
        table
            .narrow(0, (r % 4) * (a.rows - n) / 4, n)?
            .force_contiguous()
    })?;
    println!(
        "{} rows of {} f32 from a table of {} on {}: {:.1} MB moved, floor {:.1} us at {:.2} TB/s",
        n,
        a.dim,
        a.rows,
        a.device,
        bytes / 1e6,
        floor * 1e6,
        a.bandwidth / 1e12
    );
    println!(
        "  index_select, ids on the device: min {:.1} us, median {:.1} us = {:.2}x the floor",
        kernel_min * 1e6,
        kernel_med * 1e6,
        kernel_med / floor
    );
    println!(
        "  ids uploaded first (as a step does): min {:.1} us, median {:.1} us = {:.2}x the floor",
        step_min * 1e6,
        step_med * 1e6,
        step_med / floor
    );
    println!("  models::ops::take_rows (what the cache uses; ids uploaded): min {:.1} us, median {:.1} us = {:.2}x the floor", take_min * 1e6, take_med * 1e6, take_med / floor);
    println!("  the ids' upload alone: min {:.1} us, median {:.1} us; take_rows less it: {:.2}x the floor", up_min * 1e6, up_med * 1e6, (take_med - up_med).max(0.0) / floor);
    println!(
        "  a contiguous copy of as many rows: min {:.1} us, median {:.1} us = {:.2}x the floor",
        copy_min * 1e6,
        copy_med * 1e6,
        copy_med / floor
    );
    let json = serde_json::json!({
        "device": a.device, "rows": a.rows, "dim": a.dim, "batch": n, "repeat": a.repeat, "bandwidth": a.bandwidth,
        "bytes_moved": bytes, "floor_s": floor,
        "index_select_s": { "min": kernel_min, "median": kernel_med, "ratio_to_floor": kernel_med / floor },
        "with_upload_s": { "min": step_min, "median": step_med, "ratio_to_floor": step_med / floor },
        "take_rows_s": { "min": take_min, "median": take_med, "ratio_to_floor": take_med / floor },
        "upload_ids_s": { "min": up_min, "median": up_med },
        "take_rows_less_upload_ratio_to_floor": (take_med - up_med).max(0.0) / floor,
        "contiguous_copy_s": { "min": copy_min, "median": copy_med, "ratio_to_floor": copy_med / floor },
    });
    if let Some(parent) = a.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&json)? + "\n")?;
    println!("wrote {}", a.out.display());
    Ok(())
}
