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

    /// Whether `id` was delivered, or is older than the window (so a retry is moot).
    pub fn knows(&self, id: MsgId) -> bool {
        match self.per_node.get(&id.node) {
            Some(seen) => {
                seen.contains(&id.seq)
                    || (seen.len() >= self.window && seen.first().is_some_and(|&o| id.seq < o))
            }
            // A sender past the node limit is never delivered: asking again changes nothing.
            None => self.per_node.len() >= MAX_NODES,
        }
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

/// What the receiver tells an asker that probes for a late reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probed {
    /// Never received: the asker must send the request again.
    Unheard,
    /// Being handled, or its reply is on its way (or is too old to matter): nothing to do.
    Underway,
    /// Its reply never left (a fault, a lost connection, a full queue): send it again.
    Lost(Result<Bytes, RemoteError>),
}

/// Where a cached reply is: a probe resends only a reply known not to have left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delivery {
    /// Queued or being written.
    Sending,
    /// Handed to a live connection, which delivers it unless the connection dies
    /// (then the asker resends its request, and gets the reply again).
    Written,
    /// Dropped before it was written.
    Lost,
}

/// Duplicate suppression for requests plus the replies already sent, so a
/// retried request gets the same answer without running its handler again.
/// Bounded in entries and in reply bytes; evicted replies leave the id
/// remembered, so a late retry is dropped rather than handled twice.
pub struct ReplyCache {
    dedup: Dedup,
    replies: HashMap<MsgId, (Result<Bytes, RemoteError>, Delivery)>,
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
        match self.replies.get_mut(&id) {
            Some((r, d)) => {
                *d = Delivery::Sending;
                Seen::Replied(r.clone())
            }
            None => Seen::Dropped,
        }
    }

    /// Answers a probe for `id` without marking it seen; a lost reply is
    /// marked as being sent again.
    pub fn probe(&mut self, id: MsgId) -> Probed {
        if !self.dedup.knows(id) {
            return Probed::Unheard;
        }
        match self.replies.get_mut(&id) {
            Some((r, d)) if *d == Delivery::Lost => {
                *d = Delivery::Sending;
                Probed::Lost(r.clone())
            }
            _ => Probed::Underway,
        }
    }

    /// Records whether the reply to `id` was written to a connection.
    pub fn delivered(&mut self, id: MsgId, written: bool) {
        if let Some((_, d)) = self.replies.get_mut(&id) {
            *d = if written {
                Delivery::Written
            } else {
                Delivery::Lost
            };
        }
    }

    /// Releases the reply to `id`: the peer acknowledged every byte of it
    /// (a large frame's stream is acknowledged before its write completes),
    /// so only the loss of that connection before the asker read it could
    /// bring the request again, and then it is dropped as an evicted one is.
    /// Large replies would otherwise hold the cache's whole byte budget.
    pub fn received(&mut self, id: MsgId) {
        if let Some((r, _)) = self.replies.remove(&id) {
            self.bytes -= r.as_ref().map_or(64, |b| b.len());
        }
    }

    /// Stores the reply to `id` (being sent).
    pub fn complete(&mut self, id: MsgId, reply: Result<Bytes, RemoteError>) {
        self.bytes += reply.as_ref().map_or(64, |b| b.len());
        if self
            .replies
            .insert(id, (reply, Delivery::Sending))
            .is_none()
        {
            self.order.push_back(id);
        }
        while self.order.len() > self.max_entries
            || (self.bytes > self.max_bytes && !self.order.is_empty())
        {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((r, _)) = self.replies.remove(&old) {
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

    #[test]
    fn a_reply_the_peer_acknowledged_is_released_and_still_not_handled_twice() {
        let id = |seq| MsgId { node: 3, seq };
        let mut c = ReplyCache::new(100, 10, 1000);
        for s in [1, 2] {
            assert_eq!(c.check(id(s)), Seen::New);
            c.complete(id(s), Ok(Bytes::from(vec![7; 300])));
        }
        assert_eq!(c.held(), (2, 600));
        c.received(id(1));
        assert_eq!(c.held(), (1, 300), "its bytes are given back at once");
        assert_eq!(c.check(id(1)), Seen::Dropped, "a late duplicate");
        assert_eq!(c.probe(id(1)), Probed::Underway);
        assert_eq!(c.check(id(2)), Seen::Replied(Ok(Bytes::from(vec![7; 300]))));
        c.received(id(1));
        assert_eq!(c.held(), (1, 300), "released once");
    }

    #[test]
    fn probes_resend_only_what_never_arrived_or_never_left() {
        let id = |seq| MsgId { node: 2, seq };
        let mut c = ReplyCache::new(4, 10, 1000);
        assert_eq!(c.probe(id(10)), Probed::Unheard, "never received");
        assert_eq!(c.probe(id(10)), Probed::Unheard, "a probe marks nothing");
        assert_eq!(c.check(id(10)), Seen::New);
        assert_eq!(c.probe(id(10)), Probed::Underway, "being handled");
        c.complete(id(10), Ok(Bytes::from_static(b"r")));
        assert_eq!(c.probe(id(10)), Probed::Underway, "being sent");
        c.delivered(id(10), true);
        assert_eq!(
            c.probe(id(10)),
            Probed::Underway,
            "written: the connection delivers it"
        );
        c.delivered(id(10), false);
        assert_eq!(c.probe(id(10)), Probed::Lost(Ok(Bytes::from_static(b"r"))));
        assert_eq!(
            c.probe(id(10)),
            Probed::Underway,
            "resent once per probe, not per probe while it is on its way"
        );
        // A duplicate request (the asker's connection was replaced) resends the reply too.
        c.delivered(id(10), true);
        assert_eq!(c.check(id(10)), Seen::Replied(Ok(Bytes::from_static(b"r"))));
        // Ids older than the window are moot: never "unheard".
        for s in 11..20 {
            c.check(id(s));
        }
        assert_eq!(c.probe(id(1)), Probed::Underway);
        assert_eq!(c.probe(id(25)), Probed::Unheard);
    }
}
