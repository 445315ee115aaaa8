//! Transport metrics: messages, payload bytes and wire bytes per (peer,
//! direction, message kind), injected faults, and ask latency histograms per
//! kind. Read in-process with [`Metrics::snapshot`] (for run reports) or as
//! Prometheus text with [`Metrics::prometheus`].

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds of the latency buckets, microseconds (powers of 4 from 16 µs to ~17 s).
pub const LATENCY_BUCKETS_US: [u64; 11] = [
    16, 64, 256, 1024, 4096, 16384, 65536, 262_144, 1_048_576, 4_194_304, 16_777_216,
];

/// Direction of traffic on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    /// Sent by this node.
    Out,
    /// Received by this node.
    In,
}

/// Counters of one (peer, direction, kind).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Frames.
    pub messages: u64,
    /// Message payload bytes (what the application encoded).
    pub payload_bytes: u64,
    /// Bytes on the stream, framing included (before QUIC and TLS overhead).
    pub wire_bytes: u64,
    /// Frames dropped by fault injection.
    pub dropped: u64,
    /// Extra copies sent by fault injection.
    pub duplicated: u64,
}

/// A latency histogram.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Counts per bucket of [`LATENCY_BUCKETS_US`], plus one for larger values.
    pub buckets: Vec<u64>,
    /// Number of samples.
    pub count: u64,
    /// Sum of samples, microseconds.
    pub sum_us: u64,
}

impl Histogram {
    fn record(&mut self, d: Duration) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; LATENCY_BUCKETS_US.len() + 1];
        }
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let i = LATENCY_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.buckets[i] += 1;
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }
}

/// A copy of all metrics at one time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsSnapshot {
    /// Per (peer, direction, kind).
    pub links: BTreeMap<(String, Dir, String), Counters>,
    /// Ask latency (send to reply, retries included) per kind.
    pub latency: BTreeMap<String, Histogram>,
    /// Requests sent again because they may have been lost (dropped unwritten,
    /// their connection replaced, or unheard by the peer): zero in a run without faults.
    pub resends: u64,
    /// Framed bytes of those resends.
    pub resent_bytes: u64,
    /// Probes asking a peer after a late reply (a few bytes each).
    pub probes: u64,
}

/// What a node sent again, and the probes it sent instead (a report field).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resends {
    /// Requests sent again because they may have been lost: zero without faults.
    pub requests: u64,
    /// Their framed bytes.
    pub bytes: u64,
    /// Probes asking a peer after a late reply.
    pub probes: u64,
}

impl std::ops::AddAssign for Resends {
    fn add_assign(&mut self, o: Resends) {
        self.requests += o.requests;
        self.bytes += o.bytes;
        self.probes += o.probes;
    }
}

impl MetricsSnapshot {
    /// The resend counters.
    pub fn resent(&self) -> Resends {
        Resends {
            requests: self.resends,
            bytes: self.resent_bytes,
            probes: self.probes,
        }
    }

    /// Wire bytes sent per message kind, over all peers.
    pub fn bytes_by_kind(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((_, dir, kind), c) in &self.links {
            if *dir == Dir::Out {
                *out.entry(kind.clone()).or_default() += c.wire_bytes;
            }
        }
        out
    }

    /// Messages sent per kind, over all peers.
    pub fn messages_by_kind(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((_, dir, kind), c) in &self.links {
            if *dir == Dir::Out {
                *out.entry(kind.clone()).or_default() += c.messages;
            }
        }
        out
    }
}

/// The metrics of one node (thread-safe).
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<MetricsSnapshot>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut MetricsSnapshot) -> R) -> R {
        // A panic elsewhere while holding the lock leaves counters that are still meaningful.
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Counts one frame.
    pub fn count(&self, peer: &str, dir: Dir, kind: &str, payload: usize, wire: usize) {
        self.with(|m| {
            let c = m
                .links
                .entry((peer.to_string(), dir, kind.to_string()))
                .or_default();
            c.messages += 1;
            c.payload_bytes += payload as u64;
            c.wire_bytes += wire as u64;
        })
    }

    /// Counts an injected drop (`copies == 0`) or duplication (`copies == 2`).
    pub fn fault(&self, peer: &str, kind: &str, copies: u32) {
        self.with(|m| {
            let c = m
                .links
                .entry((peer.to_string(), Dir::Out, kind.to_string()))
                .or_default();
            match copies {
                0 => c.dropped += 1,
                2 => c.duplicated += 1,
                _ => {}
            }
        })
    }

    /// Records the latency of a completed ask.
    pub fn latency(&self, kind: &str, d: Duration) {
        self.with(|m| m.latency.entry(kind.to_string()).or_default().record(d))
    }

    /// Counts a request sent again, `bytes` framed.
    pub fn resend(&self, bytes: usize) {
        self.with(|m| {
            m.resends += 1;
            m.resent_bytes += bytes as u64;
        })
    }

    /// Counts a probe for a late reply.
    pub fn probe(&self) {
        self.with(|m| m.probes += 1)
    }

    /// A copy of everything.
    pub fn snapshot(&self) -> MetricsSnapshot {
        self.with(|m| m.clone())
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub fn prometheus(&self, node: &str) -> String {
        let m = self.snapshot();
        let mut s = String::new();
        let esc = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"");
        for (name, help, get) in [
            (
                "hetgnn_messages_total",
                "Frames sent or received",
                (|c: &Counters| c.messages) as fn(&Counters) -> u64,
            ),
            ("hetgnn_payload_bytes_total", "Message payload bytes", |c| {
                c.payload_bytes
            }),
            (
                "hetgnn_wire_bytes_total",
                "Framed bytes on QUIC streams",
                |c| c.wire_bytes,
            ),
            (
                "hetgnn_injected_drops_total",
                "Frames dropped by fault injection",
                |c| c.dropped,
            ),
            (
                "hetgnn_injected_duplicates_total",
                "Extra copies sent by fault injection",
                |c| c.duplicated,
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}.\n# TYPE {name} counter");
            for ((peer, dir, kind), c) in &m.links {
                let dir = if *dir == Dir::Out { "out" } else { "in" };
                let _ = writeln!(
                    s,
                    "{name}{{node=\"{}\",peer=\"{}\",dir=\"{dir}\",kind=\"{}\"}} {}",
                    esc(node),
                    esc(peer),
                    esc(kind),
                    get(c)
                );
            }
        }
        for (name, help, v) in [
            (
                "hetgnn_ask_resends_total",
                "Requests sent again because they may have been lost",
                m.resends,
            ),
            (
                "hetgnn_ask_resent_bytes_total",
                "Framed bytes of requests sent again",
                m.resent_bytes,
            ),
            (
                "hetgnn_ask_probes_total",
                "Probes asking a peer after a late reply",
                m.probes,
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}.\n# TYPE {name} counter");
            let _ = writeln!(s, "{name}{{node=\"{}\"}} {v}", esc(node));
        }
        let _ = writeln!(s, "# HELP hetgnn_ask_latency_seconds Ask latency, retries included.\n# TYPE hetgnn_ask_latency_seconds histogram");
        for (kind, h) in &m.latency {
            let mut cum = 0;
            for (i, b) in LATENCY_BUCKETS_US.iter().enumerate() {
                cum += h.buckets.get(i).copied().unwrap_or(0);
                let _ = writeln!(
                    s,
                    "hetgnn_ask_latency_seconds_bucket{{node=\"{}\",kind=\"{}\",le=\"{}\"}} {cum}",
                    esc(node),
                    esc(kind),
                    *b as f64 / 1e6
                );
            }
            let _ = writeln!(
                s,
                "hetgnn_ask_latency_seconds_bucket{{node=\"{}\",kind=\"{}\",le=\"+Inf\"}} {}",
                esc(node),
                esc(kind),
                h.count
            );
            let _ = writeln!(
                s,
                "hetgnn_ask_latency_seconds_sum{{node=\"{}\",kind=\"{}\"}} {}",
                esc(node),
                esc(kind),
                h.sum_us as f64 / 1e6
            );
            let _ = writeln!(
                s,
                "hetgnn_ask_latency_seconds_count{{node=\"{}\",kind=\"{}\"}} {}",
                esc(node),
                esc(kind),
                h.count
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_histograms_and_text() {
        let m = Metrics::default();
        m.count("n1", Dir::Out, "feature_pull", 100, 130);
        m.count("n1", Dir::Out, "feature_pull", 50, 70);
        m.count("n2", Dir::Out, "feature_pull", 1, 1);
        m.count("n1", Dir::In, "reply", 10, 20);
        m.fault("n1", "feature_pull", 0);
        m.latency("feature_pull", Duration::from_micros(100));
        m.latency("feature_pull", Duration::from_micros(300));
        m.latency("feature_pull", Duration::from_secs(100));
        let s = m.snapshot();
        let c = s.links[&("n1".to_string(), Dir::Out, "feature_pull".to_string())];
        assert_eq!(
            (c.messages, c.payload_bytes, c.wire_bytes, c.dropped),
            (2, 150, 200, 1)
        );
        assert_eq!(s.bytes_by_kind()["feature_pull"], 201);
        assert!(
            !s.bytes_by_kind().contains_key("reply"),
            "only outgoing bytes count"
        );
        let h = &s.latency["feature_pull"];
        assert_eq!(h.buckets[2], 1); // 100 µs <= 256
        assert_eq!(h.buckets[3], 1); // 300 µs <= 1024
        assert_eq!(h.buckets[LATENCY_BUCKETS_US.len()], 1);
        let text = m.prometheus("n0");
        assert!(text.contains("hetgnn_wire_bytes_total{node=\"n0\",peer=\"n1\",dir=\"out\",kind=\"feature_pull\"} 200"), "{text}");
        assert!(text.contains(
            "hetgnn_ask_latency_seconds_bucket{node=\"n0\",kind=\"feature_pull\",le=\"+Inf\"} 3"
        ));
        assert!(text.contains("hetgnn_ask_latency_seconds_bucket{node=\"n0\",kind=\"feature_pull\",le=\"0.001024\"} 2"));
    }
}
