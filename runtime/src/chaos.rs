//! Fault injection and link shaping, sans-IO: what to do with the `n`-th frame
//! on a link is a pure function of (seed, sender, receiver, n, time since
//! start), so the same seed gives the same faults. The transport applies the
//! decisions on the sending side; [`TokenBucket`] paces bytes to a bandwidth cap.

use std::time::{Duration, Instant};

use crate::config::{ChaosConfig, Delay, LinksConfig};

/// What to do with one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// How many copies to send: 0 (dropped), 1, or 2 (duplicated).
    pub copies: u32,
    /// How long to hold it before sending.
    pub delay: Duration,
}

/// The fault and shaping plan of one node's outgoing links.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    chaos: ChaosConfig,
    links: LinksConfig,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
    })
}

/// A uniform draw in [0, 1) keyed by everything that identifies the decision.
fn uniform(seed: u64, from: &str, to: &str, n: u64, purpose: u64) -> f64 {
    let h = mix(mix(mix(mix(seed ^ purpose) ^ hash_str(from)) ^ hash_str(to)) ^ n);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

fn sample(d: &Delay, u: f64, u2: f64) -> f64 {
    match *d {
        Delay::Fixed { ms } => ms,
        Delay::Uniform { min_ms, max_ms } => min_ms + (max_ms - min_ms) * u,
        Delay::Exponential { mean_ms } => -mean_ms * (1.0 - u).ln(),
        Delay::Normal { mean_ms, std_ms } => {
            // Box-Muller.
            let z = (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (mean_ms + std_ms * z).max(0.0)
        }
    }
}

impl Faults {
    /// The plan from the `[chaos]` and `[links]` sections.
    pub fn new(chaos: ChaosConfig, links: LinksConfig) -> Faults {
        Faults { chaos, links }
    }

    fn link(&self, from: &str, to: &str) -> Option<&crate::config::LinkSpec> {
        self.links.link.iter().find(|l| {
            (l.between[0] == from && l.between[1] == to)
                || (l.between[0] == to && l.between[1] == from)
        })
    }

    /// Whether a partition window cuts `from`–`to` at `since_start`.
    pub fn partitioned(&self, from: &str, to: &str, since_start: Duration) -> bool {
        let ms = since_start.as_millis() as u64;
        self.chaos.partitions.iter().any(|p| {
            (p.start_ms..p.end_ms).contains(&ms)
                && (p.nodes.iter().any(|n| n == from) != p.nodes.iter().any(|n| n == to))
        })
    }

    /// The fate of the `n`-th frame sent from `from` to `to`.
    pub fn decide(&self, from: &str, to: &str, n: u64, since_start: Duration) -> Decision {
        let seed = self.chaos.seed;
        if self.partitioned(from, to, since_start)
            || uniform(seed, from, to, n, 1) < self.chaos.drop
        {
            return Decision {
                copies: 0,
                delay: Duration::ZERO,
            };
        }
        let copies = if uniform(seed, from, to, n, 2) < self.chaos.duplicate {
            2
        } else {
            1
        };
        let mut ms = 0.0;
        let link_delay = self
            .link(from, to)
            .and_then(|l| l.delay)
            .or(self.links.delay);
        if let Some(d) = link_delay {
            ms += sample(
                &d,
                uniform(seed, from, to, n, 3),
                uniform(seed, from, to, n, 4),
            );
        }
        if let Some(d) = &self.chaos.delay {
            ms += sample(
                d,
                uniform(seed, from, to, n, 5),
                uniform(seed, from, to, n, 6),
            );
        }
        Decision {
            copies,
            delay: Duration::from_secs_f64(ms / 1000.0),
        }
    }

    /// The bandwidth cap of `from`–`to` in bytes per second, if any.
    pub fn bandwidth(&self, from: &str, to: &str) -> Option<u64> {
        self.link(from, to)
            .and_then(|l| l.bandwidth)
            .or(self.links.bandwidth)
            .map(|b| b.0)
    }
}

/// A token bucket: bytes may be sent at `rate` per second with bursts up to `burst`.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket; the burst is 10 ms worth of rate, at least 64 KiB.
    pub fn new(rate: u64, now: Instant) -> TokenBucket {
        let rate = rate.max(1) as f64;
        let burst = (rate / 100.0).max(65536.0);
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes `bytes` tokens (going into debt if needed) and says how long the
    /// caller must wait before sending them.
    pub fn reserve(&mut self, now: Instant, bytes: u64) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Bandwidth, LinkSpec, Partition};

    fn chaos(drop: f64, duplicate: f64) -> ChaosConfig {
        ChaosConfig {
            seed: 7,
            drop,
            duplicate,
            delay: None,
            partitions: vec![],
        }
    }

    #[test]
    fn decisions_are_seeded_and_match_their_rates() {
        let f = Faults::new(chaos(0.2, 0.1), LinksConfig::default());
        let g = Faults::new(chaos(0.2, 0.1), LinksConfig::default());
        let n = 20_000;
        let (mut dropped, mut dup) = (0, 0);
        for i in 0..n {
            let d = f.decide("n0", "n1", i, Duration::ZERO);
            assert_eq!(
                d,
                g.decide("n0", "n1", i, Duration::ZERO),
                "same seed, same fate"
            );
            dropped += (d.copies == 0) as u64;
            dup += (d.copies == 2) as u64;
        }
        let drop_rate = dropped as f64 / n as f64;
        let dup_rate = dup as f64 / (n - dropped) as f64;
        assert!((drop_rate - 0.2).abs() < 0.015, "{drop_rate}");
        assert!((dup_rate - 0.1).abs() < 0.015, "{dup_rate}");
        // Another seed gives other fates; links are independent.
        let h = Faults::new(
            ChaosConfig {
                seed: 8,
                ..chaos(0.2, 0.1)
            },
            LinksConfig::default(),
        );
        let differ = (0..1000)
            .filter(|&i| {
                f.decide("n0", "n1", i, Duration::ZERO) != h.decide("n0", "n1", i, Duration::ZERO)
            })
            .count();
        assert!(differ > 100);
        let cross = (0..1000)
            .filter(|&i| {
                f.decide("n0", "n1", i, Duration::ZERO) != f.decide("n1", "n0", i, Duration::ZERO)
            })
            .count();
        assert!(cross > 100);
    }

    #[test]
    fn partitions_cut_only_across_the_cut_and_only_in_the_window() {
        let c = ChaosConfig {
            partitions: vec![Partition {
                start_ms: 100,
                end_ms: 200,
                nodes: vec!["n2".into()],
            }],
            ..chaos(0.0, 0.0)
        };
        let f = Faults::new(c, LinksConfig::default());
        let at = Duration::from_millis;
        assert_eq!(f.decide("n0", "n2", 0, at(150)).copies, 0);
        assert_eq!(f.decide("n2", "n1", 0, at(199)).copies, 0);
        assert_eq!(f.decide("n0", "n1", 0, at(150)).copies, 1);
        assert_eq!(f.decide("n0", "n2", 0, at(99)).copies, 1);
        assert_eq!(f.decide("n0", "n2", 0, at(200)).copies, 1);
    }

    #[test]
    fn delays_follow_their_distribution_and_links_override_defaults() {
        let links = LinksConfig {
            bandwidth: Some(Bandwidth(1000)),
            delay: Some(Delay::Uniform {
                min_ms: 1.0,
                max_ms: 3.0,
            }),
            link: vec![LinkSpec {
                between: ["n1".into(), "n0".into()],
                bandwidth: Some(Bandwidth(50)),
                delay: Some(Delay::Fixed { ms: 10.0 }),
            }],
        };
        let c = ChaosConfig {
            delay: Some(Delay::Exponential { mean_ms: 2.0 }),
            ..chaos(0.0, 0.0)
        };
        let f = Faults::new(c, links);
        assert_eq!(f.bandwidth("n0", "n1"), Some(50));
        assert_eq!(f.bandwidth("n0", "n2"), Some(1000));
        let n = 20_000;
        let mean = |a: &str, b: &str| {
            (0..n)
                .map(|i| f.decide(a, b, i, Duration::ZERO).delay.as_secs_f64() * 1e3)
                .sum::<f64>()
                / n as f64
        };
        assert!(
            (mean("n0", "n2") - 4.0).abs() < 0.1,
            "uniform(1,3) + exp(2): {}",
            mean("n0", "n2")
        );
        assert!(
            (mean("n0", "n1") - 12.0).abs() < 0.1,
            "fixed 10 + exp(2): {}",
            mean("n0", "n1")
        );
        let normal = Faults::new(
            ChaosConfig {
                delay: Some(Delay::Normal {
                    mean_ms: 5.0,
                    std_ms: 1.0,
                }),
                ..chaos(0.0, 0.0)
            },
            LinksConfig::default(),
        );
        let xs: Vec<f64> = (0..n)
            .map(|i| {
                normal
                    .decide("a", "b", i, Duration::ZERO)
                    .delay
                    .as_secs_f64()
                    * 1e3
            })
            .collect();
        let m = xs.iter().sum::<f64>() / n as f64;
        let sd = (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!(
            (m - 5.0).abs() < 0.05 && (sd - 1.0).abs() < 0.05,
            "{m} {sd}"
        );
    }

    #[test]
    fn token_bucket_holds_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1_000_000, t0);
        // Sending 10 MB in 10 KB pieces as fast as allowed takes ~10 s of virtual time.
        let mut now = t0;
        for _ in 0..1000 {
            now += b.reserve(now, 10_000);
        }
        let secs = (now - t0).as_secs_f64();
        assert!((secs - 10.0).abs() < 0.1, "{secs}");
        // Idle time refills at most one burst.
        now += Duration::from_secs(100);
        assert_eq!(b.reserve(now, 10_000), Duration::ZERO);
        let wait = b.reserve(now, 1_000_000);
        assert!(wait > Duration::from_millis(900), "{wait:?}");
    }
}
