//! Receiver-side duplicate suppression: senders retry with the same
//! [`MsgId`], so the receiver delivers each id once. Memory is bounded: per
//! sending node it remembers the last `window` ids; an id older than all of
//! them is treated as seen (a retry that late is moot: the sender's deadline
//! has passed).

use std::collections::{BTreeSet, HashMap, VecDeque};

use bytes::Bytes;

use crate::wire::{MsgId, RemoteError};

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
        Dedup {
            window: window.max(1),
            per_node: HashMap::new(),
        }
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

/// What the receiver knows of a request id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// First time: handle it.
    New,
    /// Being handled, or handled so long ago that its reply was evicted: drop it.
    Dropped,
    /// Handled: resend this reply (the first one may have been lost).
    Replied(Result<Bytes, RemoteError>),
}

/// Duplicate suppression for requests plus the replies already sent, so a
/// retried request gets the same answer without running its handler again.
/// Bounded in entries and in reply bytes; evicted replies leave the id
/// remembered, so a late retry is dropped rather than handled twice.
pub struct ReplyCache {
    dedup: Dedup,
    replies: HashMap<MsgId, Result<Bytes, RemoteError>>,
    order: VecDeque<MsgId>,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl ReplyCache {
    /// Remembers `window` ids per sender and up to `max_entries` replies of `max_bytes` in total.
    pub fn new(window: usize, max_entries: usize, max_bytes: usize) -> ReplyCache {
        ReplyCache {
            dedup: Dedup::new(window),
            replies: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            max_entries,
            max_bytes,
        }
    }

    /// Classifies an arriving request.
    pub fn check(&mut self, id: MsgId) -> Seen {
        if self.dedup.first_time(id) {
            return Seen::New;
        }
        match self.replies.get(&id) {
            Some(r) => Seen::Replied(r.clone()),
            None => Seen::Dropped,
        }
    }

    /// Stores the reply to `id`.
    pub fn complete(&mut self, id: MsgId, reply: Result<Bytes, RemoteError>) {
        self.bytes += reply.as_ref().map_or(64, |b| b.len());
        if self.replies.insert(id, reply).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > self.max_entries
            || (self.bytes > self.max_bytes && !self.order.is_empty())
        {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(r) = self.replies.remove(&old) {
                self.bytes -= r.as_ref().map_or(64, |b| b.len());
            }
        }
    }

    /// Replies held and their bytes.
    pub fn held(&self) -> (usize, usize) {
        (self.replies.len(), self.bytes)
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

    #[test]
    fn replies_are_resent_not_recomputed_and_bounded() {
        let id = |seq| MsgId { node: 1, seq };
        let mut c = ReplyCache::new(1000, 3, 100);
        assert_eq!(c.check(id(1)), Seen::New);
        assert_eq!(c.check(id(1)), Seen::Dropped, "in flight");
        c.complete(id(1), Ok(Bytes::from(vec![1; 10])));
        assert_eq!(c.check(id(1)), Seen::Replied(Ok(Bytes::from(vec![1; 10]))));
        for s in 2..6 {
            assert_eq!(c.check(id(s)), Seen::New);
            c.complete(id(s), Ok(Bytes::from(vec![0; 10])));
        }
        assert_eq!(c.held(), (3, 30));
        assert_eq!(
            c.check(id(1)),
            Seen::Dropped,
            "evicted reply: still not handled twice"
        );
        c.complete(id(9), Ok(Bytes::from(vec![0; 95])));
        assert!(c.held().1 <= 100);
    }
}
