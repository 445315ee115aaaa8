//! Time spent per DAG operator, summed over a trainer's batches (the
//! report's `sampling.op_seconds`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A DAG operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Seeds (link prediction: positive and negative sampling).
    Seed,
    /// One chunk of a hop's local destinations picked.
    Pick,
    /// A hop's destinations picked by their owner (wall time of the request).
    RemotePick,
    /// A hop's picks merged into its block.
    Assemble,
    /// One chunk of local feature rows copied.
    Fetch,
    /// Feature rows pulled from an owner (wall time of the request).
    RemoteFetch,
    /// An answer from the network checked and recorded.
    Merge,
    /// The rows put in the first block's order.
    Finish,
}

const OPS: [Op; 8] = [
    Op::Seed,
    Op::Pick,
    Op::RemotePick,
    Op::Assemble,
    Op::Fetch,
    Op::RemoteFetch,
    Op::Merge,
    Op::Finish,
];

impl Op {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Op::Seed => "seed",
            Op::Pick => "pick",
            Op::RemotePick => "remote-pick",
            Op::Assemble => "assemble",
            Op::Fetch => "fetch",
            Op::RemoteFetch => "remote-fetch",
            Op::Merge => "merge",
            Op::Finish => "finish",
        }
    }
}

/// Nanoseconds per operator.
#[derive(Default)]
pub struct OpTimes([AtomicU64; OPS.len()]);

impl OpTimes {
    /// Adds `d` to `op`.
    pub fn add(&self, op: Op, d: Duration) {
        self.0[op as usize].fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Seconds per operator name, those with any.
    pub fn seconds(&self) -> BTreeMap<String, f64> {
        OPS.iter()
            .map(|&op| {
                (
                    op.name().to_string(),
                    self.0[op as usize].load(Ordering::Relaxed) as f64 * 1e-9,
                )
            })
            .filter(|(_, s)| *s > 0.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_add_up_per_operator() {
        let t = OpTimes::default();
        t.add(Op::Pick, Duration::from_millis(3));
        t.add(Op::Pick, Duration::from_millis(2));
        t.add(Op::Finish, Duration::from_micros(10));
        let s = t.seconds();
        assert!((s["pick"] - 0.005).abs() < 1e-12);
        assert!((s["finish"] - 1e-5).abs() < 1e-12);
        assert!(!s.contains_key("seed"));
        assert_eq!(
            OPS.iter().map(|o| *o as usize).collect::<Vec<_>>(),
            (0..OPS.len()).collect::<Vec<_>>()
        );
    }
}
