//! Parameter initialisation as a pure function of (seed, parameter name).

use graphs::rng::{hash_str, CounterRng};
use rayon::prelude::*;

/// The Glorot-uniform bound of a `[fan_in, fan_out]` matrix.
pub fn glorot_bound(fan_in: usize, fan_out: usize) -> f64 {
    (6.0 / (fan_in + fan_out) as f64).sqrt()
}

/// `n` values uniform in `[-bound, bound)` for the parameter named `name`.
pub fn uniform(seed: u64, name: &str, n: usize, bound: f64) -> Vec<f32> {
    let mut r = CounterRng::from_parts(&[seed, hash_str(name)]);
    (0..n)
        .map(|_| ((r.next_f64() * 2.0 - 1.0) * bound) as f32)
        .collect()
}

/// Standard normal values (learnable embedding rows), `n` of them.
pub fn normal(seed: u64, name: &str, n: usize) -> Vec<f32> {
    // Value k is draws 2k+1 and 2k+2 of one stream: stretches of it are drawn
    // on every core (an S=1 author table, 73 million values, took 3.6 s on one).
    const STRETCH: usize = 1 << 16;
    let start = CounterRng::from_parts(&[seed, hash_str(name)]);
    let mut out = vec![0f32; n];
    out.par_chunks_mut(STRETCH).enumerate().for_each(|(c, o)| {
        let mut r = start.clone();
        r.seek(2 * (c * STRETCH) as u64);
        for x in o {
            *x = r.normal() as f32;
        }
    });
    out
}

/// Rows `ids` (`dim` values each) of the `[rows, dim]` table [`normal`]
/// initialises, without drawing the others: a holder of some rows keeps
/// memory in proportion to them.
pub fn normal_rows(seed: u64, name: &str, dim: usize, ids: &[u32]) -> Vec<f32> {
    let mut r = CounterRng::from_parts(&[seed, hash_str(name)]);
    let mut out = Vec::with_capacity(ids.len() * dim);
    for &id in ids {
        // Each value takes two draws (Box-Muller).
        r.seek(2 * id as u64 * dim as u64);
        out.extend((0..dim).map(|_| r.normal() as f32));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_drawn_in_stretches_is_the_one_stream() {
        let n = 3 * (1 << 16) + 17;
        let mut r = CounterRng::from_parts(&[5, hash_str("embed.paper")]);
        let one: Vec<f32> = (0..n).map(|_| r.normal() as f32).collect();
        assert_eq!(normal(5, "embed.paper", n), one);
    }

    #[test]
    fn rows_drawn_alone_equal_those_of_the_whole_table() {
        let (rows, dim) = (50usize, 3usize);
        let whole = normal(7, "embed.author", rows * dim);
        let ids = [0u32, 3, 4, 49, 17];
        let picked: Vec<f32> = ids
            .iter()
            .flat_map(|&i| whole[i as usize * dim..(i as usize + 1) * dim].to_vec())
            .collect();
        assert_eq!(normal_rows(7, "embed.author", dim, &ids), picked);
        assert_ne!(
            normal_rows(8, "embed.author", dim, &ids),
            picked,
            "the seed keys the rows"
        );
    }
}
