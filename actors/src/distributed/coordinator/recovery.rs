//! The coordinator's recovery decisions, without IO: after each attempt of
//! a generation, whether the run is done, starts again from its last
//! checkpoint, or gives up; and each failure's record, from its detection to
//! the first step after the rollback. Time comes in as seconds since the
//! coordinator started, so the rules are tested without processes or sleeps.

use crate::error::TrainError;
use crate::report::FailureReport;

/// Attempts in a row that may fail before a single step succeeds, or fail at
/// the same step after the same rollback; past it the failure is taken as
/// permanent (a bug, bad data, a full disk: not a lost node).
pub(crate) const MAX_FRUITLESS_ATTEMPTS: u32 = 3;

/// What the coordinator does after an attempt.
#[derive(Debug)]
pub(crate) enum Next {
    /// The run is over.
    Done,
    /// Wait for every partition, then start the next generation from the
    /// last complete checkpoint.
    Retry,
    /// Stop the run with this error.
    GiveUp(TrainError),
}

/// The failures of a run and the counts that decide when to give up.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// The failure being recovered from (detected, not yet past its first step).
    open: Option<FailureReport>,
    /// Failed attempts in a row without a step.
    fruitless: u32,
    /// (rolled back to, failed at) of the last failure, and how often in a row.
    same: (Option<(u64, u64)>, u32),
    /// Failures whose recovery is complete, in order.
    pub(crate) failures: Vec<FailureReport>,
}

impl Recovery {
    /// Every partition is ready at `now` and the next attempt starts from
    /// step `from`; returns what to tell the user when it is a rollback.
    pub(crate) fn ready(&mut self, now: f64, from: u64) -> Option<String> {
        let f = self.open.as_mut()?;
        f.rejoined_at_s = now;
        f.resumed_from_step = from;
        f.steps_redone = f.failed_at_step.saturating_sub(from);
        Some(format!(
            "every node is ready: rolling back to step {from} ({} steps to redo)",
            f.steps_redone
        ))
    }

    /// The attempt that started from step `from` ended at `now`, its first
    /// step (if any) done at `stepped`, the run at step `seq`, with `result`.
    pub(crate) fn ended(
        &mut self,
        now: f64,
        stepped: Option<f64>,
        from: u64,
        seq: u64,
        result: Result<(), TrainError>,
    ) -> Next {
        // A step after the rollback closes the failure being recovered from.
        if let Some(at) = stepped {
            if let Some(mut f) = self.open.take() {
                f.resumed_at_s = at;
                self.failures.push(f);
            }
        }
        let err = match result {
            Ok(()) => {
                // Resumed at the very end (nothing left to redo): recovered all the same.
                if let Some(mut f) = self.open.take() {
                    f.resumed_at_s = now;
                    self.failures.push(f);
                }
                return Next::Done;
            }
            Err(e) => e,
        };
        if !err.is_recoverable() {
            return Next::GiveUp(err);
        }
        self.fruitless = if stepped.is_some() {
            1
        } else {
            self.fruitless + 1
        };
        if self.fruitless > MAX_FRUITLESS_ATTEMPTS {
            return Next::GiveUp(TrainError::PeerLost(format!(
                "{MAX_FRUITLESS_ATTEMPTS} restarts in a row failed before any step; giving up: {err}"
            )));
        }
        let key = (from, seq);
        self.same = if self.same.0 == Some(key) {
            (Some(key), self.same.1 + 1)
        } else {
            (Some(key), 1)
        };
        if self.same.1 >= MAX_FRUITLESS_ATTEMPTS {
            return Next::GiveUp(TrainError::PeerLost(format!(
                "failed {} times at step {seq} after rolling back to step {from}; giving up: {err}",
                self.same.1
            )));
        }
        match self.open.as_mut() {
            // Failed again before its first step: the same failure goes on.
            Some(f) => f.what = format!("{}; then {err}", f.what),
            None => {
                self.open = Some(FailureReport {
                    what: err.to_string(),
                    detected_at_s: now,
                    failed_at_step: seq,
                    ..FailureReport::default()
                })
            }
        }
        Next::Retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost() -> Result<(), TrainError> {
        Err(TrainError::peer_lost("node n1 is down"))
    }

    #[test]
    fn a_lost_node_is_recovered_and_recorded() {
        let mut r = Recovery::default();
        assert_eq!(r.ready(0.0, 0), None, "the first start is no rollback");
        assert!(matches!(
            r.ended(4.0, Some(0.5), 0, 12, lost()),
            Next::Retry
        ));
        let note = r.ready(9.0, 10).unwrap();
        assert!(
            note.contains("rolling back to step 10 (2 steps to redo)"),
            "{note}"
        );
        assert!(matches!(
            r.ended(20.0, Some(9.5), 10, 40, Ok(())),
            Next::Done
        ));
        assert_eq!(
            r.failures,
            vec![FailureReport {
                what: "distributed training: node n1 is down".into(),
                detected_at_s: 4.0,
                rejoined_at_s: 9.0,
                resumed_at_s: 9.5,
                failed_at_step: 12,
                resumed_from_step: 10,
                steps_redone: 2,
            }]
        );
    }

    #[test]
    fn a_protocol_violation_or_a_bug_stops_at_once() {
        for e in [
            TrainError::protocol("worker 1 sent 3 values for 4 rows"),
            TrainError::internal("worker 0 panicked"),
        ] {
            let mut r = Recovery::default();
            let want = e.to_string();
            match r.ended(1.0, Some(0.1), 0, 5, Err(e)) {
                Next::GiveUp(got) => assert_eq!(got.to_string(), want),
                other => panic!("{other:?}"),
            }
            assert!(r.failures.is_empty());
        }
    }

    #[test]
    fn attempts_that_never_step_give_up_after_three() {
        let mut r = Recovery::default();
        assert!(matches!(r.ended(1.0, Some(0.5), 0, 7, lost()), Next::Retry));
        // Then the restarts fail before any step, at other points each time.
        for k in 0..2 {
            r.ready(2.0 + k as f64, 5);
            assert!(matches!(
                r.ended(3.0 + k as f64, None, 5 + k, 5 + k, lost()),
                Next::Retry
            ));
        }
        r.ready(6.0, 5);
        match r.ended(7.0, None, 9, 9, lost()) {
            Next::GiveUp(e) => assert!(e.to_string().contains("3 restarts in a row"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(
            r.failures.is_empty(),
            "no attempt stepped after the rollback"
        );
        assert!(
            r.open.as_ref().unwrap().what.contains("; then "),
            "the same failure went on"
        );
    }

    #[test]
    fn the_same_failure_at_the_same_step_gives_up_after_three() {
        let mut r = Recovery::default();
        for k in 0..2 {
            // Each attempt steps (not fruitless) but fails at step 30 after rolling back to 20.
            assert!(matches!(
                r.ended(k as f64, Some(k as f64), 20, 30, lost()),
                Next::Retry
            ));
            r.ready(k as f64 + 0.5, 20);
        }
        match r.ended(3.0, Some(2.5), 20, 30, lost()) {
            Next::GiveUp(e) => assert!(e.to_string().contains("failed 3 times at step 30"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            r.failures.len(),
            2,
            "each rollback that stepped closed its failure"
        );
    }

    #[test]
    fn resuming_at_the_very_end_closes_the_failure() {
        let mut r = Recovery::default();
        assert!(matches!(
            r.ended(1.0, Some(0.2), 0, 50, lost()),
            Next::Retry
        ));
        r.ready(2.0, 50);
        assert!(matches!(r.ended(2.5, None, 50, 50, Ok(())), Next::Done));
        assert_eq!(r.failures.len(), 1);
        assert_eq!(
            (r.failures[0].resumed_at_s, r.failures[0].steps_redone),
            (2.5, 0)
        );
    }
}
