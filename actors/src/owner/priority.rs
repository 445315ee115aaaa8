//! Requests served by priority instead of arrival (ByteGNN's fine-grained
//! scheduling at the owners): a handler parks each request with a reply
//! channel and notifies itself; actix drains the mailbox before it runs the
//! notifications, so a burst of requests is answered lowest priority value
//! (the oldest batch) first, ties first come, first served.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use tokio::sync::oneshot;

/// What a handler notifies itself with after parking: serve the most urgent parked request.
pub struct Serve;

impl actix::Message for Serve {
    type Result = ();
}

/// A parked request.
struct Entry<Req, Reply> {
    priority: u64,
    order: u64,
    req: Req,
    reply: oneshot::Sender<Reply>,
}

impl<Req, Reply> PartialEq for Entry<Req, Reply> {
    fn eq(&self, other: &Self) -> bool {
        (self.priority, self.order) == (other.priority, other.order)
    }
}
impl<Req, Reply> Eq for Entry<Req, Reply> {}
impl<Req, Reply> PartialOrd for Entry<Req, Reply> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<Req, Reply> Ord for Entry<Req, Reply> {
    /// The heap pops the greatest: the lowest priority value, then the earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.priority, other.order).cmp(&(self.priority, self.order))
    }
}

/// Requests waiting to be served.
pub struct Parked<Req, Reply> {
    heap: BinaryHeap<Entry<Req, Reply>>,
    next: u64,
}

impl<Req, Reply> Default for Parked<Req, Reply> {
    fn default() -> Self {
        Parked {
            heap: BinaryHeap::new(),
            next: 0,
        }
    }
}

impl<Req, Reply> Parked<Req, Reply> {
    /// Parks `req`; the receiver gets its reply once served.
    pub fn park(&mut self, priority: u64, req: Req) -> oneshot::Receiver<Reply> {
        let (reply, rx) = oneshot::channel();
        self.heap.push(Entry {
            priority,
            order: self.next,
            req,
            reply,
        });
        self.next += 1;
        rx
    }

    /// Serves the most urgent request with `answer`.
    pub fn serve_one(&mut self, answer: impl FnOnce(Req) -> Reply) {
        if let Some(e) = self.heap.pop() {
            // A requester that gave up dropped its receiver: nothing to tell.
            let _ = e.reply.send(answer(e.req));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_priority_value_is_served_first_then_arrival_order() {
        let mut p: Parked<&str, String> = Parked::default();
        let mut rx: Vec<_> = [(5, "e"), (1, "a"), (3, "c"), (1, "b")]
            .into_iter()
            .map(|(pr, r)| p.park(pr, r))
            .collect();
        let mut served = Vec::new();
        for _ in 0..4 {
            p.serve_one(|r| {
                served.push(r);
                r.to_uppercase()
            });
        }
        assert_eq!(served, ["a", "b", "c", "e"]);
        assert_eq!(rx[1].try_recv().unwrap(), "A");
        p.serve_one(|_| unreachable!("nothing parked"));
        drop(rx.remove(0));
    }
}
