//! Coarse-grained scheduling (ByteGNN Algorithm 1): when to launch the next
//! batch's DAG, from the measured sampling and training times, the output
//! queue's length, the machine's CPU use and the time since the last launch.
//!
//! The thesis multiplies quantities of different units and leaves its
//! threshold σ open. Here every factor is normalised so that 1 means "as
//! wanted", and σ = 1:
//!
//! - balance = T_sample / ((k + 1) · T_train · Q), capped at [`BALANCE_CAP`]:
//!   with k DAGs in flight a new batch arrives about every T_sample / (k + 1)
//!   once one more is launched, and the Q batches waiting last Q · T_train;
//!   above 1 the queue drains before the next batch arrives. An empty queue
//!   (Q = 0) counts as the cap: launch.
//! - cpu = f(C) / f(C*) with the thesis's f(C) = 101 − e^(C / c), c = 100 /
//!   ln 101, and C* = [`TARGET_UTIL`]: above 1 while the machine's cores are
//!   less busy than C*, falling steeply towards 0 at 100%.
//! - gap = min(1, T_gap / (T_sample / max)): launches spread over one DAG's
//!   latency, because CPU use reacts late to a launch.
//!
//! A DAG is launched when balance · cpu · gap ≥ 1, always when none is in
//! flight and none waits, never when `max` are in flight or waiting.

/// Upper bound of the balance factor (an empty queue counts as this).
pub const BALANCE_CAP: f64 = 4.0;
/// The CPU use (percent) at which the CPU factor is 1.
pub const TARGET_UTIL: f64 = 90.0;

/// The thesis's f(C), C in percent: 100 at 0%, 0 at 100%.
pub fn f_util(c: f64) -> f64 {
    let c = c.clamp(0.0, 100.0);
    101.0 - (c / (100.0 / 101f64.ln())).exp()
}

/// What the launcher knows when it decides.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measures {
    /// DAGs launched and not finished.
    pub in_flight: usize,
    /// Finished batches the trainer has not taken.
    pub queued: usize,
    /// Mean seconds from a DAG's launch to its batch (0: none finished yet).
    pub sample_s: f64,
    /// Mean seconds the trainer spends on a batch between takes (0: none yet).
    pub train_s: f64,
    /// Seconds since the last launch (infinite: none yet).
    pub gap_s: f64,
    /// The machine's CPU use, percent.
    pub util: f64,
}

/// The launch score of `m` with at most `max` DAGs in flight.
pub fn score(m: &Measures, max: usize) -> f64 {
    let balance = if m.queued == 0 || m.train_s <= 0.0 || m.sample_s <= 0.0 {
        BALANCE_CAP
    } else {
        (m.sample_s / ((m.in_flight + 1) as f64 * m.train_s * m.queued as f64)).min(BALANCE_CAP)
    };
    let cpu = f_util(m.util) / f_util(TARGET_UTIL);
    let gap = if m.sample_s <= 0.0 {
        1.0
    } else {
        (m.gap_s / (m.sample_s / max.max(1) as f64)).min(1.0)
    };
    balance * cpu * gap
}

/// Whether to launch now.
pub fn decide(m: &Measures, max: usize) -> bool {
    if m.in_flight >= max || m.queued >= max {
        return false;
    }
    (m.in_flight == 0 && m.queued == 0) || score(m, max) >= 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f_spans_100_to_0() {
        assert!((f_util(0.0) - 100.0).abs() < 1e-9);
        assert!(f_util(100.0).abs() < 1e-9);
        assert!(f_util(50.0) > f_util(90.0));
        assert_eq!(f_util(-5.0), f_util(0.0));
    }

    #[test]
    fn launches_follow_the_queue_the_cpu_and_the_gap() {
        let m = Measures {
            in_flight: 2,
            queued: 0,
            sample_s: 0.1,
            train_s: 0.02,
            gap_s: 1.0,
            util: 50.0,
        };
        assert!(decide(&m, 8), "an empty queue launches");
        assert!(
            !decide(&Measures { in_flight: 8, ..m }, 8),
            "never more than max"
        );
        assert!(
            decide(
                &Measures {
                    in_flight: 0,
                    queued: 0,
                    util: 100.0,
                    ..m
                },
                8
            ),
            "always when none is in flight and none waits"
        );
        assert!(
            !decide(
                &Measures {
                    in_flight: 0,
                    queued: 8,
                    util: 0.0,
                    ..m
                },
                8
            ),
            "never when max wait"
        );
        // Queue drains in 3 x 0.02 = 0.06 s; next batch in 0.1 / 3 = 0.033 s: no hurry.
        let full = Measures { queued: 3, ..m };
        assert!(score(&full, 8) > 1.0 / BALANCE_CAP);
        assert!(!decide(&Measures { queued: 6, ..m }, 8));
        // A busy machine holds launches back; an idle one lets them through.
        assert!(!decide(&Measures { util: 99.5, ..m }, 8));
        assert!(decide(
            &Measures {
                queued: 1,
                util: 10.0,
                ..m
            },
            8
        ));
        // Right after a launch, wait.
        assert!(!decide(&Measures { gap_s: 0.0, ..m }, 8));
    }
}
