//! Random owners: a pure function of (seed, type, node), about `1/parts` each.

use super::NodePartitioner;
use crate::error::Result;
use crate::graph::HetGraph;
use crate::rng::key;

/// A seeded hash of (type, node).
pub struct Random;

impl NodePartitioner for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    /// Every node hashed on its own, so `within` changes nothing.
    fn assign(
        &self,
        g: &HetGraph,
        parts: usize,
        seed: u64,
        _within: Option<(&[Vec<u16>], u16)>,
    ) -> Result<Vec<Vec<u16>>> {
        Ok(g.node_types()
            .iter()
            .enumerate()
            .map(|(t, nt)| {
                (0..nt.count)
                    .map(|v| (key(&[seed, t as u64, u64::from(v)]) % parts as u64) as u16)
                    .collect()
            })
            .collect())
    }
}
