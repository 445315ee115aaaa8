//! SANCUS's bounded embedding staleness (§4.3.5): whether a worker broadcasts
//! a block of rows this epoch or lets the receivers reuse the copy they
//! cached. Workers run in lock step (every epoch synchronous, so that runs
//! are deterministic), which fixes two points the paper leaves open:
//!
//! - Definition 2 (epoch-adaptive) bounds the age of the copy at every
//!   receiver; in lock step every receiver holds the same version, so the
//!   bound alone would be Definition 1. What stays adaptive is when each
//!   worker refreshes: worker `p` broadcasts in the epochs `e` with
//!   `(e + p) mod (k + 1) = 0`, so the workers' broadcasts are spread over
//!   the epochs (Figure 14(b)'s pattern) instead of all falling in the same
//!   one, and no copy is ever more than `k` epochs old.
//! - Definition 3's norm is unspecified: the variation is the Frobenius norm
//!   of the change since the last broadcast copy relative to that copy's
//!   norm, so one bound fits layers of any width and scale.

use super::Staleness;

/// A staleness rule with its bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    /// Which rule.
    pub kind: Staleness,
    /// Epochs a copy may lag (fixed, adaptive).
    pub epochs: u32,
    /// Relative change that forces a broadcast (variation).
    pub variation: f64,
}

impl Rule {
    /// Whether worker `part` broadcasts its block in `epoch`, its receivers
    /// holding the copy of epoch `last` (`None`: they hold none);
    /// `variation` measures the block against that copy (only called by the
    /// variation rule).
    pub fn broadcast(
        &self,
        epoch: u64,
        part: u32,
        last: Option<u64>,
        variation: impl FnOnce() -> f64,
    ) -> bool {
        let Some(last) = last else { return true };
        let k = u64::from(self.epochs);
        match self.kind {
            Staleness::None => true,
            Staleness::Fixed => epoch.saturating_sub(last) > k,
            Staleness::Adaptive => {
                epoch > last
                    && ((epoch + u64::from(part)).is_multiple_of(k + 1) || epoch - last > k)
            }
            Staleness::Variation => variation() > self.variation,
        }
    }
}

/// `||now - then|| / ||then||` (Frobenius), 0 for two empty blocks and
/// infinite when `then` is zero and `now` is not.
pub fn relative_change(now: &[f32], then: &[f32]) -> f64 {
    let (mut diff, mut base) = (0.0f64, 0.0f64);
    for (a, b) in now.iter().zip(then) {
        let d = f64::from(*a) - f64::from(*b);
        diff += d * d;
        base += f64::from(*b) * f64::from(*b);
    }
    if now.len() != then.len() {
        return f64::INFINITY;
    }
    if diff == 0.0 {
        0.0
    } else if base == 0.0 {
        f64::INFINITY
    } else {
        (diff / base).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(kind: Staleness, epochs: u32) -> Rule {
        Rule {
            kind,
            epochs,
            variation: 0.1,
        }
    }

    /// The epochs in `0..n` in which `part` broadcasts, following its own decisions.
    fn pattern(r: Rule, part: u32, n: u64) -> Vec<u64> {
        let mut last = None;
        let mut out = Vec::new();
        for e in 0..n {
            if r.broadcast(e, part, last, || 0.0) {
                last = Some(e);
                out.push(e);
            }
        }
        out
    }

    #[test]
    fn the_epoch_rules_keep_every_copy_within_the_bound() {
        assert_eq!(pattern(rule(Staleness::None, 1), 0, 5), vec![0, 1, 2, 3, 4]);
        assert_eq!(pattern(rule(Staleness::Fixed, 1), 0, 7), vec![0, 2, 4, 6]);
        assert_eq!(
            pattern(rule(Staleness::Fixed, 1), 3, 7),
            vec![0, 2, 4, 6],
            "fixed: every worker in the same epochs"
        );
        assert_eq!(pattern(rule(Staleness::Fixed, 2), 1, 7), vec![0, 3, 6]);
        // Adaptive: the workers' refreshes fall in different epochs.
        assert_eq!(
            pattern(rule(Staleness::Adaptive, 1), 0, 7),
            vec![0, 2, 4, 6]
        );
        assert_eq!(
            pattern(rule(Staleness::Adaptive, 1), 1, 7),
            vec![0, 1, 3, 5]
        );
        assert_eq!(
            pattern(rule(Staleness::Adaptive, 2), 2, 8),
            vec![0, 1, 4, 7]
        );
        for kind in [Staleness::Fixed, Staleness::Adaptive] {
            for k in 1..4 {
                for part in 0..5 {
                    let p = pattern(rule(kind, k), part, 40);
                    let worst = p.windows(2).map(|w| w[1] - w[0] - 1).max().unwrap();
                    assert!(
                        worst <= u64::from(k),
                        "{kind:?} k={k} part {part}: a copy {worst} epochs old in {p:?}"
                    );
                    assert!(
                        p.len() as u64 <= 40 / (u64::from(k) + 1) + 2,
                        "{kind:?} k={k}: {} broadcasts",
                        p.len()
                    );
                }
            }
        }
        // Without a copy at the receivers, every rule broadcasts.
        for kind in [Staleness::Fixed, Staleness::Adaptive, Staleness::Variation] {
            assert!(rule(kind, 3).broadcast(5, 0, None, || 0.0));
        }
    }

    #[test]
    fn the_variation_rule_broadcasts_when_the_block_moved_enough() {
        let r = rule(Staleness::Variation, 1);
        assert!(!r.broadcast(3, 0, Some(2), || 0.05));
        assert!(r.broadcast(3, 0, Some(2), || 0.2));
        assert_eq!(relative_change(&[1.0, 0.0], &[1.0, 0.0]), 0.0);
        assert!((relative_change(&[1.1, 0.0], &[1.0, 0.0]) - 0.1).abs() < 1e-6);
        assert!((relative_change(&[3.0, 4.0], &[0.0, 5.0]) - (10.0f64).sqrt() / 5.0).abs() < 1e-6);
        assert_eq!(relative_change(&[1.0], &[0.0]), f64::INFINITY);
        assert_eq!(relative_change(&[], &[]), 0.0);
        assert_eq!(relative_change(&[1.0], &[1.0, 2.0]), f64::INFINITY);
    }
}
