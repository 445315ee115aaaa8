//! Receiver-side duplicate suppression: senders retry with the same
//! [`MsgId`], so the receiver delivers each id once. Memory is bounded: per
//! sending node it remembers the last `window` ids; an id older than all of
//! them is treated as seen (a retry that late is moot: the sender's deadline
//! has passed).

use std::collections::{BTreeSet, HashMap};

use crate::wire::MsgId;

/// Most distinct sending nodes remembered; ids from further nodes are dropped
/// (node ids come from the topology, so a real cluster never gets near it).
pub const MAX_NODES: usize = 4096;

/// Remembers recently delivered message ids.
pub struct Dedup {
    window: usize,
    per_node: HashMap<u32, BTreeSet<u64>>,
}

impl Dedup {
    /// Remembers up to `window` ids per sending node (at least 1).
    pub fn new(window: usize) -> Dedup {
        Dedup { window: window.max(1), per_node: HashMap::new() }
    }

    /// True the first time `id` is seen (deliver it), false for a duplicate
    /// or an id older than the remembered window (drop it).
    pub fn first_time(&mut self, id: MsgId) -> bool {
        if self.per_node.len() >= MAX_NODES && !self.per_node.contains_key(&id.node) {
            return false;
        }
        let seen = self.per_node.entry(id.node).or_default();
        if seen.len() >= self.window && seen.first().is_some_and(|&oldest| id.seq < oldest) {
            return false;
        }
        if !seen.insert(id.seq) {
            return false;
        }
        while seen.len() > self.window {
            seen.pop_first();
        }
        true
    }

    /// Ids remembered, over all nodes.
    pub fn len(&self) -> usize {
        self.per_node.values().map(BTreeSet::len).sum()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_dropped_and_memory_is_bounded() {
        let mut d = Dedup::new(4);
        let id = |node, seq| MsgId { node, seq };
        assert!(d.first_time(id(0, 1)));
        assert!(!d.first_time(id(0, 1)));
        assert!(d.first_time(id(1, 1)), "ids are per sending node");
        // Out-of-order delivery within the window is fine.
        for s in [5, 3, 4, 2] {
            assert!(d.first_time(id(0, s)), "seq {s}");
        }
        assert!(!d.first_time(id(0, 3)));
        // The window holds 4 per node: seq 1 was evicted, and anything older than the window is refused.
        assert_eq!(d.len(), 4 + 1);
        assert!(!d.first_time(id(0, 1)));
        assert!(d.first_time(id(0, 100)));
        for s in 0..10_000 {
            d.first_time(id(7, s));
        }
        assert!(d.len() <= 3 * 4);
        for n in 0..(MAX_NODES as u32 + 10) {
            d.first_time(id(1000 + n, 0));
        }
        assert!(d.per_node.len() <= MAX_NODES, "node sets are bounded too");
    }
}
