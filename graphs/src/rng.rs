//! Counter-based random numbers: every draw is a pure function of a key and a
//! counter, so any process or thread that knows the key draws the same values.
//!
//! The mixer is SplitMix64's finaliser (Stafford variant 13), which passes
//! BigCrush when fed a counter; keys are built by folding each component
//! through it, so `(1, 2)` and `(2, 1)` give unrelated streams.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's bijective finaliser.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Folds `parts` into one 64-bit key.
#[inline]
pub fn key(parts: &[u64]) -> u64 {
    extend_key(0x6A09_E667_F3BC_C909, parts)
}

/// Folds more `parts` into a key: `extend_key(key(a), b) == key(a ++ b)`, so
/// a prefix shared by many keys is folded once.
#[inline]
pub fn extend_key(mut h: u64, parts: &[u64]) -> u64 {
    for &p in parts {
        h = mix64(h ^ p.wrapping_mul(GOLDEN)).wrapping_add(GOLDEN);
    }
    h
}

/// Stable 64-bit hash of a string (FNV-1a folded through the mixer), used to
/// key relations by name rather than by position.
pub fn hash_str(s: &str) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for b in s.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
    }
    mix64(h)
}

/// Draw `ctr` (counting from 1) of the stream of `key`: what
/// [`CounterRng::next_u64`] returns as its `ctr`-th value.
#[inline(always)]
pub fn draw(key: u64, ctr: u64) -> u64 {
    mix64(key.wrapping_add(ctr.wrapping_mul(GOLDEN)))
}

/// A stream of draws for one key: draw `i` is `mix64(key + (i+1)·φ)`.
#[derive(Clone, Debug)]
pub struct CounterRng {
    key: u64,
    ctr: u64,
}

impl CounterRng {
    /// Starts the stream of `key` at counter 0.
    #[inline]
    pub fn new(key: u64) -> Self {
        CounterRng { key, ctr: 0 }
    }

    /// Starts the stream keyed by `parts`.
    #[inline]
    pub fn from_parts(parts: &[u64]) -> Self {
        Self::new(key(parts))
    }

    /// Moves to just after draw `draws` (the next draw is `draws + 1`): any
    /// stretch of the stream can be drawn without drawing what comes before.
    #[inline]
    pub fn seek(&mut self, draws: u64) {
        self.ctr = draws;
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.ctr = self.ctr.wrapping_add(1);
        draw(self.key, self.ctr)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Exactly uniform in `0..n` (Lemire's method with rejection); `n > 0`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = (self.next_u64() as u128) * (n as u128);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = (self.next_u64() as u128) * (n as u128);
            }
        }
        (m >> 64) as u64
    }

    /// A standard normal draw (Box–Muller, one of the pair).
    #[inline]
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]: ln is finite
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_key_order_matters() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = CounterRng::from_parts(&[1, 2]);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = CounterRng::from_parts(&[1, 2]);
                move |_| r.next_u64()
            })
            .collect();
        let c: Vec<u64> = (0..4)
            .map({
                let mut r = CounterRng::from_parts(&[2, 1]);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn a_key_extended_equals_the_key_of_all_parts() {
        let parts = [7u64, 0xBA7C_4ED6E5, 3, u64::MAX, 12, 0];
        for cut in 0..=parts.len() {
            assert_eq!(
                extend_key(key(&parts[..cut]), &parts[cut..]),
                key(&parts),
                "cut at {cut}"
            );
        }
        let mut rng = CounterRng::new(5);
        let (a, b) = (rng.next_u64(), rng.next_u64());
        assert_eq!(
            (draw(5, 1), draw(5, 2)),
            (a, b),
            "draw is the stream's value"
        );
    }

    #[test]
    fn below_is_uniform() {
        let mut r = CounterRng::new(7);
        let n = 6u64;
        let draws = 60_000;
        let mut counts = [0u64; 6];
        for _ in 0..draws {
            counts[r.below(n) as usize] += 1;
        }
        let expected = draws as f64 / n as f64;
        let chi2: f64 = counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        // 5 degrees of freedom: p = 0.001 at 20.5.
        assert!(chi2 < 20.5, "chi2 {chi2} counts {counts:?}");
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = CounterRng::new(3);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }
}
