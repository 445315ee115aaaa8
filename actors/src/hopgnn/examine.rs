//! HopGNN's examination period (§5.3), `hop_time_steps = "auto"`: how many
//! time steps a step takes, chosen from measured epoch times.
//!
//! Epoch 0 runs unmerged and unmeasured (warm-up: connections, allocator).
//! Epoch 1 runs unmerged and is measured. From then on each epoch merges one
//! more time step while the epoch before it was faster than the one before
//! that; the first epoch that is not faster puts back its time step and
//! settles the count for the rest of the run. The paper compares epoch
//! times the same way and stops at the first one not reduced.
//!
//! An epoch's time is measured as its median step time times its steps: a
//! few steps stalled by something else on the machine (a burst of another
//! process, a page-in) move a sum but not a median, and on a shared machine
//! one such epoch was enough to undo a merge that helped.
//!
//! Every worker must choose the same count, so the time measured is the sum
//! over the workers of their step times, carried as one extra value of each
//! step's all-reduce (whose result is the same bits on every worker). The
//! state is written into checkpoints, so a resumed run goes on with the
//! count its checkpoint was cut at; the counts chosen after that depend on
//! the machine's timings, and so does the model's last bits (merged time
//! steps sum gradients in another order): use a fixed count where runs
//! must be reproducible bit for bit.

use std::collections::HashMap;

use candle_core::{Device, Tensor};

use crate::error::{Result, TrainError};

/// The checkpoint tensor holding the state.
const TENSOR: &str = "examination";

/// Where the examination stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Examination {
    /// Time steps of the current epoch.
    pub steps: u32,
    /// The measured seconds of the epoch before, run with `steps + 1` time
    /// steps (with `steps` in the first measured epoch).
    pub before: Option<f64>,
    /// Whether the count is chosen for the rest of the run.
    pub settled: bool,
    /// The current epoch's step seconds so far, each summed over the workers.
    pub seconds: Vec<f64>,
}

impl Examination {
    /// An examination over `workers` workers, starting unmerged.
    pub fn new(workers: u32) -> Examination {
        let steps = workers.max(1);
        Examination {
            steps,
            before: None,
            settled: steps == 1,
            seconds: Vec::new(),
        }
    }

    /// Adds a step's seconds (summed over the workers).
    pub fn add(&mut self, seconds: f64) {
        self.seconds.push(seconds);
    }

    /// The epoch's measure: its median step time times its steps.
    fn measure(seconds: &mut [f64]) -> f64 {
        if seconds.is_empty() {
            return 0.0;
        }
        seconds.sort_unstable_by(f64::total_cmp);
        let n = seconds.len();
        let median = if n % 2 == 1 {
            seconds[n / 2]
        } else {
            (seconds[n / 2 - 1] + seconds[n / 2]) / 2.0
        };
        median * n as f64
    }

    /// Epoch `epoch` ended: chooses the next epoch's time steps. Returns the
    /// epoch's measured seconds (`None` for the warm-up epoch and once settled).
    pub fn epoch_end(&mut self, epoch: u64) -> Option<f64> {
        let t = Self::measure(&mut std::mem::take(&mut self.seconds));
        if self.settled || epoch == 0 {
            return None;
        }
        match self.before {
            Some(b) if t >= b => {
                self.steps += 1;
                self.settled = true;
            }
            // The first measured epoch (unmerged), or one faster than the epoch before.
            _ => {
                self.before = Some(t);
                if self.steps > 1 {
                    self.steps -= 1;
                } else {
                    self.settled = true;
                }
            }
        }
        Some(t)
    }

    /// The state as a checkpoint tensor: time steps, the epoch before's
    /// measure (NaN: none), settled (0 or 1), then the epoch's step seconds.
    pub fn to_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let mut v = vec![
            f64::from(self.steps),
            self.before.unwrap_or(f64::NAN),
            if self.settled { 1.0 } else { 0.0 },
        ];
        v.extend_from_slice(&self.seconds);
        let n = v.len();
        Ok(HashMap::from([(
            TENSOR.to_string(),
            Tensor::from_vec(v, n, &Device::Cpu)?,
        )]))
    }

    /// The state a checkpoint holds, checked against `workers`.
    pub fn from_tensors(t: &HashMap<String, Tensor>, workers: u32) -> Result<Examination> {
        let bad = |why: &str| {
            TrainError::Checkpoint(format!("the examination state in the checkpoint {why}"))
        };
        let v: Vec<f64> = t
            .get(TENSOR)
            .ok_or_else(|| bad("is missing"))?
            .to_dtype(candle_core::DType::F64)?
            .to_vec1()?;
        let [steps, before, settled, ref seconds @ ..] = v[..] else {
            return Err(bad("has fewer than 3 values"));
        };
        if !(steps >= 1.0 && steps <= f64::from(workers.max(1)) && steps.fract() == 0.0) {
            return Err(bad(&format!("has {steps} time steps, not 1 to {workers}")));
        }
        if seconds.iter().any(|s| !(s.is_finite() && *s >= 0.0))
            || !(before.is_nan() || before.is_finite() && before >= 0.0)
            || !(settled == 0.0 || settled == 1.0)
        {
            return Err(bad("is damaged"));
        }
        Ok(Examination {
            steps: steps as u32,
            before: (!before.is_nan()).then_some(before),
            settled: settled == 1.0,
            seconds: seconds.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs epochs with the given measured seconds; returns the time steps of each epoch.
    fn run(workers: u32, seconds: &[f64]) -> (Vec<u32>, Examination) {
        let mut e = Examination::new(workers);
        let mut steps = Vec::new();
        for (epoch, &t) in seconds.iter().enumerate() {
            steps.push(e.steps);
            let was_settled = e.settled;
            e.add(t / 2.0);
            e.add(t / 2.0);
            let measured = e.epoch_end(epoch as u64);
            assert_eq!(
                measured,
                (epoch > 0 && !was_settled).then_some(t),
                "epoch {epoch}"
            );
        }
        (steps, e)
    }

    #[test]
    fn merges_while_epochs_get_faster_and_puts_back_the_step_that_did_not_help() {
        // The warm-up epoch's 100 s is not compared with anything.
        let (steps, e) = run(4, &[100.0, 10.0, 8.0, 9.0, 1.0, 1.0]);
        assert_eq!(steps, vec![4, 4, 3, 2, 3, 3]);
        assert!(e.settled);
        assert_eq!(e.before, Some(8.0));
    }

    #[test]
    fn merges_down_to_one_time_step_and_stops_there() {
        let (steps, e) = run(3, &[5.0, 10.0, 9.0, 8.0, 7.0]);
        assert_eq!(steps, vec![3, 3, 2, 1, 1]);
        assert!(e.settled && e.steps == 1);
        // A tie is not faster.
        let (steps, _) = run(3, &[5.0, 10.0, 10.0, 1.0]);
        assert_eq!(steps, vec![3, 3, 2, 3]);
        // One worker has nothing to merge.
        let (steps, e) = run(1, &[1.0, 2.0]);
        assert_eq!(steps, vec![1, 1]);
        assert!(e.settled && e.before.is_none());
    }

    #[test]
    fn a_few_stalled_steps_do_not_decide() {
        // Epoch 2 (3 time steps) is faster on most steps; two stalls make its sum larger.
        let mut e = Examination::new(4);
        e.epoch_end(0);
        for _ in 0..10 {
            e.add(1.0);
        }
        assert_eq!(e.epoch_end(1), Some(10.0));
        assert_eq!(e.steps, 3);
        for t in [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 5.0, 5.0] {
            e.add(t);
        }
        assert_eq!(e.epoch_end(2), Some(9.0), "median 0.9 x 10 steps");
        assert_eq!(e.steps, 2, "the merge helped: merge another");
        assert!(!e.settled);
        // An even count takes the mean of the middle two.
        assert_eq!(Examination::measure(&mut [4.0, 1.0, 2.0, 3.0]), 10.0);
        assert_eq!(Examination::measure(&mut []), 0.0);
    }

    #[test]
    fn the_state_survives_a_checkpoint_and_damage_is_refused() {
        let mut e = Examination::new(4);
        e.epoch_end(0);
        e.add(3.5);
        e.epoch_end(1);
        e.add(1.25);
        let back = Examination::from_tensors(&e.to_tensors().unwrap(), 4).unwrap();
        assert_eq!(back, e);
        let fresh = Examination::new(4);
        assert_eq!(
            Examination::from_tensors(&fresh.to_tensors().unwrap(), 4).unwrap(),
            fresh
        );
        let err = Examination::from_tensors(&e.to_tensors().unwrap(), 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("3 time steps, not 1 to 2"), "{err}");
        let bad = HashMap::from([(
            TENSOR.to_string(),
            Tensor::from_slice(&[2.0f64, 1.0, 0.5, 0.0], 4, &Device::Cpu).unwrap(),
        )]);
        assert!(Examination::from_tensors(&bad, 4)
            .unwrap_err()
            .to_string()
            .contains("damaged"));
        let bad = HashMap::from([(
            TENSOR.to_string(),
            Tensor::from_slice(&[2.0f64, 1.0, 0.0, 0.5, -1.0], 5, &Device::Cpu).unwrap(),
        )]);
        assert!(
            Examination::from_tensors(&bad, 4)
                .unwrap_err()
                .to_string()
                .contains("damaged"),
            "a negative step time"
        );
        let short = HashMap::from([(
            TENSOR.to_string(),
            Tensor::from_slice(&[2.0f64, 1.0], 2, &Device::Cpu).unwrap(),
        )]);
        assert!(Examination::from_tensors(&short, 4)
            .unwrap_err()
            .to_string()
            .contains("fewer than 3"));
        assert!(Examination::from_tensors(&HashMap::new(), 4)
            .unwrap_err()
            .to_string()
            .contains("missing"));
    }
}
