//! Miss penalties, measured on the machine before training (Heta §6): the
//! time a miss costs per byte of cache its row would take. For plain feature
//! rows a miss is the fetch (from host memory, or pulled from a remote owner
//! in data-parallel training) and the copy to the device; for learnable rows
//! it is that read plus the write-back of the updated row and its Adam
//! moments. A fetch has a fixed cost per request, so types with few or
//! narrow rows per batch pay more per byte.

use std::time::Instant;

use candle_core::{DType, Tensor};
use models::embedding::adam_row;
use models::optim::AdamConfig;

use crate::error::Result;

/// Timed repetitions of each probe (after one untimed warm-up); the median counts.
const REPS: usize = 7;
/// Most rows one probe fetches.
pub const MAX_PROBE_ROWS: usize = 8192;

/// Median seconds per byte of a miss and of a hit, timed in alternation so
/// that drift (frequency, other threads) affects both alike.
pub fn compare(
    rows: usize,
    row_bytes: u64,
    mut miss: impl FnMut() -> Result<()>,
    mut hit: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    miss()?;
    hit()?;
    let (mut m, mut h) = (Vec::with_capacity(REPS), Vec::with_capacity(REPS));
    for _ in 0..REPS {
        let t = Instant::now();
        miss()?;
        m.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        hit()?;
        h.push(t.elapsed().as_secs_f64());
    }
    let bytes = (rows.max(1) as u64 * row_bytes.max(1)) as f64;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[REPS / 2] / bytes
    };
    Ok((median(m), median(h)))
}

/// `n` ids spread over `ranked` (hot to cold), as the misses of a batch would be.
pub fn probe_ids(ranked: &[u32], n: usize) -> Vec<u32> {
    let n = n.clamp(1, MAX_PROBE_ROWS).min(ranked.len());
    (0..n).map(|i| ranked[i * ranked.len() / n]).collect()
}

/// Scratch rows with Adam state for timing a learnable miss's write-back
/// without touching the model.
pub struct Scratch {
    data: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    steps: Vec<u32>,
    dim: usize,
}

impl Scratch {
    /// Room for `rows` rows of width `dim`.
    pub fn new(rows: usize, dim: usize) -> Scratch {
        Scratch {
            data: vec![0.0; rows * dim],
            m: vec![0.0; rows * dim],
            v: vec![0.0; rows * dim],
            steps: vec![0; rows],
            dim,
        }
    }

    /// The write-back half of a learnable row's miss, as the uncached path
    /// does it: the gradient rows copied off the device, then one Adam step
    /// per row on its value and moments in host memory (here the scratch rows).
    pub fn write_back(&mut self, grad: &Tensor) -> Result<()> {
        let g: Vec<f32> = grad.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let (d, cfg) = (self.dim, AdamConfig::with_lr(0.0));
        for r in 0..(g.len() / d.max(1)).min(self.steps.len()) {
            let span = r * d..(r + 1) * d;
            adam_row(
                &mut self.data[span.clone()],
                &mut self.m[span.clone()],
                &mut self.v[span.clone()],
                &mut self.steps[r],
                &g[span],
                &cfg,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn probes_spread_over_the_ranking() {
        let ranked: Vec<u32> = (100..110).collect();
        assert_eq!(probe_ids(&ranked, 5), vec![100, 102, 104, 106, 108]);
        assert_eq!(probe_ids(&ranked, 50), ranked, "never more than there are");
        assert_eq!(probe_ids(&ranked, 0), vec![100], "at least one");
    }

    #[test]
    fn narrow_rows_cost_more_per_byte_than_wide_ones() {
        // The fixed cost of each row's copy weighs more when the row is narrow.
        let per_byte = |dim: usize| {
            let table: Vec<f32> = (0..4096 * dim).map(|i| i as f32).collect();
            let ids: Vec<usize> = (0..2048).map(|i| (i * 7919) % 4096).collect();
            let fetch = || {
                let mut out = Vec::with_capacity(ids.len() * dim);
                for &i in &ids {
                    out.extend_from_slice(&table[i * dim..(i + 1) * dim]);
                }
                std::hint::black_box(Tensor::from_vec(out, (ids.len(), dim), &Device::Cpu)?);
                Ok(())
            };
            compare(ids.len(), (dim * 4) as u64, fetch, || Ok(()))
                .unwrap()
                .0
        };
        let (narrow, wide) = (per_byte(2), per_byte(256));
        assert!(
            narrow > wide,
            "width 2: {narrow} s/B, width 256: {wide} s/B"
        );
    }

    #[test]
    fn a_probe_that_does_more_costs_more_per_byte() {
        let values: Vec<f32> = (0..64 * 512).map(|i| i as f32 * 1e-3).collect();
        let mut scratch = Scratch::new(512, 64);
        let learnable = || {
            std::hint::black_box(values.clone());
            scratch.write_back(&Tensor::from_slice(&values, (512, 64), &Device::Cpu)?)
        };
        let read = || {
            std::hint::black_box(values.clone());
            Ok(())
        };
        let (learnable, read) = compare(512, 256, learnable, read).unwrap();
        assert!(
            read > 0.0 && learnable > read,
            "read {read}, read + write-back {learnable}"
        );
        assert!(compare(
            1,
            1,
            || Err(crate::error::TrainError::Config("x".into())),
            || Ok(())
        )
        .is_err());
    }
}
