//! Rate limiting of log lines a stranger can trigger at will (refused
//! connections): a burst, then a steady trickle, and the next line printed
//! says how many were held back since the last one.
//!
//! A sans-IO core like [`crate::membership`]: the caller passes the time in,
//! so the limiter is tested without sleeps.

use std::time::{Duration, Instant};

/// Allows `burst` lines at once, then one per `interval`; counts the rest.
#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    burst: u32,
    /// When the budget is whole again (the "theoretical arrival time" of
    /// GCRA): each printed line pushes it one interval later.
    full_at: Instant,
    suppressed: u64,
}

impl LogLimit {
    /// A limiter with a full burst available at `now`.
    pub fn new(interval: Duration, burst: u32, now: Instant) -> LogLimit {
        LogLimit {
            interval,
            burst: burst.max(1),
            full_at: now,
            suppressed: 0,
        }
    }

    /// Whether to print a line at `now`: `Some(n)` with the `n` lines held back
    /// since the last printed one, or `None` (the line is counted, not printed).
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        let full_at = self.full_at.max(now);
        if full_at.saturating_duration_since(now) > self.interval * (self.burst - 1) {
            self.suppressed += 1;
            return None;
        }
        self.full_at = full_at + self.interval;
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// The note a printed line ends with when `suppressed` similar lines were held back.
pub fn suppressed_note(suppressed: u64, what: &str) -> String {
    if suppressed == 0 {
        String::new()
    } else {
        format!(" (and {suppressed} more {what} since the last warning)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_interval_with_the_count_held_back() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut l = LogLimit::new(s, 5, t0);
        // A flood at one instant: the burst passes, the rest are counted.
        let printed: Vec<Option<u64>> = (0..100).map(|_| l.allow(t0)).collect();
        assert_eq!(printed.iter().filter(|p| p.is_some()).count(), 5);
        assert!(printed[..5].iter().all(|p| *p == Some(0)));
        // Half an interval later nothing has refilled yet.
        assert_eq!(l.allow(t0 + s / 2), None);
        // One interval later one line passes and reports the 96 held back.
        assert_eq!(l.allow(t0 + s), Some(96));
        assert_eq!(l.allow(t0 + s), None);
        // A sustained flood of 1000 a second prints one line a second.
        let mut lines = 0;
        for ms in 1000..11_000u64 {
            if l.allow(t0 + Duration::from_millis(ms)).is_some() {
                lines += 1;
            }
        }
        assert_eq!(lines, 9, "one line a second from t0 + 2 s to t0 + 10 s");
        // After a quiet spell the whole burst is back, and the first line
        // counts what was held back since the last one (the flood's last 999 ms).
        let later = t0 + Duration::from_secs(60);
        assert_eq!(l.allow(later), Some(999));
        assert_eq!(
            (0..4).map(|_| l.allow(later)).collect::<Vec<_>>(),
            vec![Some(0); 4]
        );
        assert_eq!(l.allow(later), None);
    }

    #[test]
    fn a_quiet_source_is_never_limited() {
        let t0 = Instant::now();
        let mut l = LogLimit::new(Duration::from_secs(1), 5, t0);
        for i in 0..100u64 {
            assert_eq!(l.allow(t0 + Duration::from_secs(2 * i)), Some(0));
        }
    }

    #[test]
    fn the_note_names_what_was_held_back() {
        assert_eq!(suppressed_note(0, "refused connections"), "");
        assert_eq!(
            suppressed_note(37, "refused connections"),
            " (and 37 more refused connections since the last warning)"
        );
    }
}
