//! The failure detector, sans-IO: feed it heartbeats with the time they
//! arrived ([`Membership::handle_heartbeat`]), ask it what changed at a given
//! time ([`Membership::poll`]) and when to ask next
//! ([`Membership::next_deadline`]). A peer is up from its first heartbeat and
//! down once it has been silent for the failure timeout. A peer never heard
//! from is given the longer start-up timeout: it may still be loading its
//! partition, with no transport yet to answer from.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// A change in a peer's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberEvent {
    /// The peer was heard from after being down or unknown.
    Up(String),
    /// The peer was silent for the failure timeout.
    Down(String),
}

impl actix::Message for MemberEvent {
    type Result = ();
}

/// A peer's state as seen by this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerState {
    /// Never heard from.
    Unknown,
    /// Heard from within the failure timeout.
    Up,
    /// Silent for longer than the failure timeout.
    Down,
}

#[derive(Clone, Debug)]
struct Peer {
    state: PeerState,
    last_heard: Option<Instant>,
}

/// This node's view of its peers.
#[derive(Clone, Debug)]
pub struct Membership {
    timeout: Duration,
    /// How long a peer never heard from may stay silent.
    first_timeout: Duration,
    peers: BTreeMap<String, Peer>,
    started: Instant,
}

impl Membership {
    /// Watches `peers`; a peer silent for `timeout` is down.
    pub fn new(
        peers: impl IntoIterator<Item = String>,
        timeout: Duration,
        now: Instant,
    ) -> Membership {
        let peers = peers
            .into_iter()
            .map(|p| {
                (
                    p,
                    Peer {
                        state: PeerState::Unknown,
                        last_heard: None,
                    },
                )
            })
            .collect();
        Membership {
            timeout,
            first_timeout: timeout,
            peers,
            started: now,
        }
    }

    /// Gives peers never heard from `first` (at least the failure timeout) to
    /// send their first heartbeat: nodes of a cluster start their transports
    /// seconds apart when they load partitions of different sizes first.
    pub fn with_first_timeout(mut self, first: Duration) -> Membership {
        self.first_timeout = first.max(self.timeout);
        self
    }

    /// When `p` is down if it stays silent.
    fn deadline(&self, p: &Peer) -> Instant {
        match p.last_heard {
            Some(t) => t + self.timeout,
            None => self.started + self.first_timeout,
        }
    }

    /// Records a heartbeat from `peer` (ignored for peers not watched); returns
    /// `Up` if the peer was not up.
    pub fn handle_heartbeat(&mut self, peer: &str, now: Instant) -> Option<MemberEvent> {
        let p = self.peers.get_mut(peer)?;
        p.last_heard = Some(p.last_heard.map_or(now, |t| t.max(now)));
        if p.state != PeerState::Up {
            p.state = PeerState::Up;
            return Some(MemberEvent::Up(peer.to_string()));
        }
        None
    }

    /// Peers that went silent by `now` (each reported once per outage). A peer
    /// never heard from is reported down once the first timeout has passed since start.
    pub fn poll(&mut self, now: Instant) -> Vec<MemberEvent> {
        let due: Vec<String> = self
            .peers
            .iter()
            .filter(|(_, p)| p.state != PeerState::Down && now >= self.deadline(p))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &due {
            if let Some(p) = self.peers.get_mut(id) {
                p.state = PeerState::Down;
            }
        }
        due.into_iter().map(MemberEvent::Down).collect()
    }

    /// The earliest time at which [`Membership::poll`] could report something.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.peers
            .values()
            .filter(|p| p.state != PeerState::Down)
            .map(|p| self.deadline(p))
            .min()
    }

    /// The state of `peer`.
    pub fn state(&self, peer: &str) -> Option<PeerState> {
        self.peers.get(peer).map(|p| p.state)
    }

    /// Every watched peer with its state and time since last heard.
    pub fn view(&self, now: Instant) -> Vec<(String, PeerState, Option<Duration>)> {
        self.peers
            .iter()
            .map(|(id, p)| {
                (
                    id.clone(),
                    p.state,
                    p.last_heard.map(|t| now.saturating_duration_since(t)),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_go_up_down_and_up_again() {
        let t0 = Instant::now();
        let ms = |m| t0 + Duration::from_millis(m);
        let mut m = Membership::new(
            ["a".to_string(), "b".to_string()],
            Duration::from_millis(1000),
            t0,
        );
        assert_eq!(m.next_deadline(), Some(ms(1000)));
        assert_eq!(
            m.handle_heartbeat("a", ms(100)),
            Some(MemberEvent::Up("a".into()))
        );
        assert_eq!(m.handle_heartbeat("a", ms(300)), None);
        assert_eq!(
            m.handle_heartbeat("zz", ms(300)),
            None,
            "unknown peers are ignored"
        );
        assert!(m.poll(ms(999)).is_empty());
        // b was never heard from: down once the timeout has passed since start.
        assert_eq!(m.poll(ms(1000)), vec![MemberEvent::Down("b".into())]);
        assert_eq!(m.next_deadline(), Some(ms(1300)));
        assert!(m.poll(ms(1299)).is_empty());
        assert_eq!(m.poll(ms(1300)), vec![MemberEvent::Down("a".into())]);
        assert!(m.poll(ms(5000)).is_empty(), "reported once per outage");
        assert_eq!(m.state("a"), Some(PeerState::Down));
        assert_eq!(
            m.handle_heartbeat("a", ms(6000)),
            Some(MemberEvent::Up("a".into()))
        );
        // A late heartbeat (reordered) does not move the clock back.
        m.handle_heartbeat("a", ms(5500));
        assert!(m.poll(ms(6999)).is_empty());
        assert_eq!(m.poll(ms(7000)), vec![MemberEvent::Down("a".into())]);
    }

    #[test]
    fn a_peer_never_heard_from_has_the_start_up_timeout_then_the_failure_timeout() {
        let t0 = Instant::now();
        let ms = |m| t0 + Duration::from_millis(m);
        let mut m = Membership::new(
            ["a".to_string(), "b".to_string()],
            Duration::from_millis(1000),
            t0,
        )
        .with_first_timeout(Duration::from_millis(30_000));
        // Both still loading: not down after the failure timeout.
        assert!(m.poll(ms(5000)).is_empty());
        assert_eq!(m.state("b"), Some(PeerState::Unknown));
        assert_eq!(m.next_deadline(), Some(ms(30_000)));
        // Once heard, a peer is held to the failure timeout.
        assert_eq!(
            m.handle_heartbeat("a", ms(6000)),
            Some(MemberEvent::Up("a".into()))
        );
        assert_eq!(m.next_deadline(), Some(ms(7000)));
        assert_eq!(m.poll(ms(7000)), vec![MemberEvent::Down("a".into())]);
        // One that never comes is down at the start-up timeout.
        assert!(m.poll(ms(29_999)).is_empty());
        assert_eq!(m.poll(ms(30_000)), vec![MemberEvent::Down("b".into())]);
        // A first timeout shorter than the failure timeout is the failure timeout.
        let m = Membership::new(["c".to_string()], Duration::from_millis(1000), t0)
            .with_first_timeout(Duration::from_millis(10));
        assert_eq!(m.next_deadline(), Some(ms(1000)));
    }
}
