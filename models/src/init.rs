//! Parameter initialisation as a pure function of (seed, parameter name).

use graphs::rng::{hash_str, CounterRng};

/// The Glorot-uniform bound of a `[fan_in, fan_out]` matrix.
pub fn glorot_bound(fan_in: usize, fan_out: usize) -> f64 {
    (6.0 / (fan_in + fan_out) as f64).sqrt()
}

/// `n` values uniform in `[-bound, bound)` for the parameter named `name`.
pub fn uniform(seed: u64, name: &str, n: usize, bound: f64) -> Vec<f32> {
    let mut r = CounterRng::from_parts(&[seed, hash_str(name)]);
    (0..n).map(|_| ((r.next_f64() * 2.0 - 1.0) * bound) as f32).collect()
}

/// Standard normal values (learnable embedding rows), `n` of them.
pub fn normal(seed: u64, name: &str, n: usize) -> Vec<f32> {
    let mut r = CounterRng::from_parts(&[seed, hash_str(name)]);
    (0..n).map(|_| r.normal() as f32).collect()
}
