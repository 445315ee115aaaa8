//! An attempt's steps: where it starts (a checkpoint's step, mid-epoch
//! perhaps), which epochs it (re)enters and when it writes checkpoints.

use crate::config::TrainingConfig;

/// The steps of one attempt of a run.
pub struct Schedule {
    /// Steps per epoch.
    per_epoch: u64,
    /// Steps of the run.
    total: u64,
    /// The attempt's first step.
    first: u64,
    epochs: u64,
    every: u64,
    checkpoints: bool,
}

impl Schedule {
    /// The schedule of a run of `per_epoch` steps per epoch, starting at step `first`.
    pub fn new(t: &TrainingConfig, per_epoch: u64, first: u64) -> Schedule {
        Schedule {
            per_epoch,
            total: per_epoch * t.epochs,
            first,
            epochs: t.epochs,
            every: t.checkpoint_every,
            checkpoints: t.checkpoint_dir.is_some(),
        }
    }

    /// The same schedule with checkpoints at epoch ends only, whatever
    /// `checkpoint_every` says (for a checkpoint format without mid-epoch state).
    pub fn at_epoch_ends(mut self) -> Schedule {
        self.every = 0;
        self
    }

    /// The epochs the attempt (re)enters.
    pub fn epochs(&self) -> std::ops::Range<u64> {
        self.first / self.per_epoch.max(1)..self.epochs
    }

    /// Steps of `epoch` (of `len`) done before the attempt started.
    pub fn skip(&self, epoch: u64, len: usize) -> usize {
        (self.first.saturating_sub(epoch * self.per_epoch) as usize).min(len)
    }

    /// Whether a checkpoint is due before global step `seq`: every
    /// `checkpoint_every` steps (0: every epoch), and after the last step.
    pub fn due(&self, seq: u64) -> bool {
        let periodic = if self.every == 0 {
            seq.is_multiple_of(self.per_epoch.max(1))
        } else {
            seq.is_multiple_of(self.every)
        };
        self.checkpoints && seq > self.first && (seq == self.total || periodic)
    }
}

#[cfg(test)]
mod tests {
    use super::Schedule;
    use crate::config::TrainingConfig;

    #[test]
    fn a_resumed_schedule_skips_the_steps_done_and_checkpoints_on_its_period() {
        let mut t = TrainingConfig {
            epochs: 3,
            batch: 10,
            checkpoint_dir: Some("ck".into()),
            checkpoint_every: 4,
            ..TrainingConfig::default()
        };
        // 10 steps per epoch, 30 in all; resumed at step 12.
        let s = Schedule::new(&t, 10, 12);
        assert_eq!(s.epochs(), 1..3);
        assert_eq!((s.skip(1, 10), s.skip(2, 10)), (2, 0));
        let due: Vec<u64> = (0..=30).filter(|&q| s.due(q)).collect();
        assert_eq!(
            due,
            vec![16, 20, 24, 28, 30],
            "not at its own first step; always after the last"
        );
        t.checkpoint_every = 0;
        let s = Schedule::new(&t, 10, 0);
        assert_eq!(
            (0..=30).filter(|&q| s.due(q)).collect::<Vec<_>>(),
            vec![10, 20, 30],
            "0: at epoch boundaries"
        );
        t.checkpoint_dir = None;
        assert!(
            !(0..=30).any(|q| Schedule::new(&t, 10, 0).due(q)),
            "no directory, no checkpoints"
        );
    }
}
