//! Miss penalties, measured on the machine before training (Heta §6): the
//! time a miss costs per byte of cache its row would take. For plain feature
//! rows a miss is the fetch (from host memory, or pulled from a remote owner
//! in data-parallel training) and the copy to the device; for learnable rows
//! it is that read plus the write-back of the updated row and its Adam
//! moments. A fetch has a fixed cost per request, so types with few or
//! narrow rows per batch pay more per byte.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use models::embedding::adam_row;
use models::optim::AdamConfig;

use crate::error::Result;

/// Timed repetitions of a probe (after one untimed warm-up); the median counts.
const REPS: usize = 5;
/// Most rows one probe fetches.
pub const MAX_PROBE_ROWS: usize = 8192;

/// Median seconds per byte of `miss` (which handles `rows` rows of `row_bytes` cache bytes each).
pub fn measure(rows: usize, row_bytes: u64, mut miss: impl FnMut() -> Result<()>) -> Result<f64> {
    miss()?;
    let mut times = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let t = Instant::now();
        miss()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[REPS / 2] / (rows.max(1) as u64 * row_bytes.max(1)) as f64)
}

/// `n` ids spread over `ranked` (hot to cold), as the misses of a batch would be.
pub fn probe_ids(ranked: &[u32], n: usize) -> Vec<u32> {
    let n = n.clamp(1, MAX_PROBE_ROWS).min(ranked.len());
    (0..n).map(|i| ranked[i * ranked.len() / n]).collect()
}

/// The write-back half of a learnable row's miss: the gradient rows copied
/// off the device and one Adam step on each row (value and moments) in host
/// memory. Works on scratch copies: the model is not touched.
pub fn learnable_write_back(values: &[f32], dim: usize, device: &Device) -> Result<()> {
    let rows = values.len() / dim.max(1);
    let grad = Tensor::from_slice(values, (rows, dim), device)?;
    let g: Vec<f32> = grad.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    let (mut data, mut m, mut v) = (values.to_vec(), vec![0f32; values.len()], vec![0f32; values.len()]);
    let mut steps = 0u32;
    let cfg = AdamConfig::with_lr(0.0);
    for r in 0..rows {
        let span = r * dim..(r + 1) * dim;
        steps = 0;
        adam_row(&mut data[span.clone()], &mut m[span.clone()], &mut v[span.clone()], &mut steps, &g[span], &cfg);
    }
    std::hint::black_box((data, m, v, steps));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_spread_over_the_ranking() {
        let ranked: Vec<u32> = (100..110).collect();
        assert_eq!(probe_ids(&ranked, 5), vec![100, 102, 104, 106, 108]);
        assert_eq!(probe_ids(&ranked, 50), ranked, "never more than there are");
        assert_eq!(probe_ids(&ranked, 0), vec![100], "at least one");
    }

    #[test]
    fn a_probe_that_does_more_costs_more_per_byte() {
        let values: Vec<f32> = (0..64 * 512).map(|i| i as f32 * 1e-3).collect();
        let read = measure(512, 256, || {
            std::hint::black_box(values.clone());
            Ok(())
        })
        .unwrap();
        let learnable = measure(512, 256, || {
            std::hint::black_box(values.clone());
            learnable_write_back(&values, 64, &Device::Cpu)
        })
        .unwrap();
        assert!(read > 0.0 && learnable > read, "read {read}, read + write-back {learnable}");
        assert!(measure(1, 1, || Err(crate::error::TrainError::Config("x".into()))).is_err());
    }
}
