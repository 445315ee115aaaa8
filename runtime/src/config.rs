//! The runtime's sections of the topology file: `[cluster]` (nodes,
//! certificates, timing), `[placement]` (which actor runs where), `[links]`
//! (network shaping) and `[chaos]` (fault injection). Every key has a default
//! where one makes sense; [`Topology::validate`] refuses a bad file with an
//! error naming the key.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::certs;
use crate::wire::ActorName;

/// A configuration problem, naming the key it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {msg}")]
pub struct ConfigError {
    /// The key, e.g. `cluster.nodes[1].addr` or `placement."sampler/0"`.
    pub key: String,
    /// What is wrong.
    pub msg: String,
}

impl ConfigError {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, msg: impl Into<String>) -> ConfigError {
        ConfigError {
            key: key.into(),
            msg: msg.into(),
        }
    }
}

/// A quantity (a bandwidth, a size) that does not parse: bad input, to refuse
/// with the message (it says what a valid one looks like).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadQuantity(pub String);

fn default_certs_dir() -> PathBuf {
    PathBuf::from("certs")
}
fn default_heartbeat_ms() -> u64 {
    200
}
fn default_start_timeout_ms() -> u64 {
    30_000
}

fn default_rejoin_timeout_ms() -> u64 {
    600_000
}

fn default_failure_timeout_ms() -> u64 {
    2000
}
fn default_retry_ms() -> u64 {
    200
}

/// `[cluster]`: the nodes and how they watch each other.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Directory holding `ca.pem` and `<node>.pem`/`<node>.key` (default `certs`,
    /// relative to the working directory), as written by `hetgnn certs init`.
    #[serde(default = "default_certs_dir")]
    pub certs_dir: PathBuf,
    /// Address for Prometheus text metrics (`GET /metrics`), e.g. `127.0.0.1:9100`;
    /// on a multi-node file each node adds its index to the port. Default: none.
    #[serde(default)]
    pub metrics_addr: Option<String>,
    /// Milliseconds between heartbeats to each peer (default 200).
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Milliseconds without a heartbeat after which a peer is reported down
    /// (default 2000; at least twice `heartbeat_ms`).
    #[serde(default = "default_failure_timeout_ms")]
    pub failure_timeout_ms: u64,
    /// Milliseconds an `ask` waits before its first resend (default 200; doubles per attempt).
    #[serde(default = "default_retry_ms")]
    pub retry_ms: u64,
    /// Milliseconds a training node waits for every peer to be up before it
    /// gives up naming the missing ones (default 30000).
    #[serde(default = "default_start_timeout_ms")]
    pub start_timeout_ms: u64,
    /// Milliseconds a training run waits, after a node failed, for it (or the
    /// coordinator) to come back before it gives up (default 600000).
    #[serde(default = "default_rejoin_timeout_ms")]
    pub rejoin_timeout_ms: u64,
    /// The nodes, `[[cluster.nodes]]`.
    pub nodes: Vec<NodeSpec>,
}

/// `[[cluster.nodes]]`: one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Node id: 1-64 characters of `[a-z0-9_-]`, the name in its certificate.
    pub id: String,
    /// UDP address the node listens on, `host:port`.
    pub addr: String,
    /// Certificate (default `<certs_dir>/<id>.pem`).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// Private key (default `<certs_dir>/<id>.key`).
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// CPUs this node may use when `launch` runs it beside others on one
    /// machine (0.5 = half a core's time), enforced by the kernel's CPU
    /// controller; default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
}

/// A number (bytes) or a string with a unit, as TOML gives it.
#[derive(Deserialize)]
#[serde(untagged)]
enum Quantity {
    Number(u64),
    Text(String),
}

/// Bytes in `text` (`"4GiB"`, `"1.5MB"`, `"300"`; with `bits`, also `"10Gbit"`,
/// `"800Mbps"`), or `None` if it is not one.
fn parse_bytes(text: &str, bits: bool) -> Option<f64> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().ok()?;
    let (scale, is_bits) = match unit.trim() {
        "" | "B" => (1.0, false),
        "kB" | "KB" => (1e3, false),
        "MB" => (1e6, false),
        "GB" => (1e9, false),
        "TB" => (1e12, false),
        "KiB" => (1024.0, false),
        "MiB" => (1048576.0, false),
        "GiB" => (1073741824.0, false),
        "TiB" => (1099511627776.0, false),
        "bit" | "bps" if bits => (1.0, true),
        "kbit" | "Kbit" | "kbps" | "Kbps" if bits => (1e3, true),
        "Mbit" | "Mbps" if bits => (1e6, true),
        "Gbit" | "Gbps" if bits => (1e9, true),
        _ => return None,
    };
    Some(value * scale / if is_bits { 8.0 } else { 1.0 })
}

/// Bytes per second. In TOML: a number of bytes per second, or a string such
/// as `"10Gbit/s"`, `"800Mbps"`, `"100MB/s"`, `"1GiB/s"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Quantity", into = "u64")]
pub struct Bandwidth(pub u64);

impl From<Bandwidth> for u64 {
    fn from(b: Bandwidth) -> u64 {
        b.0
    }
}

impl TryFrom<Quantity> for Bandwidth {
    type Error = BadQuantity;
    fn try_from(t: Quantity) -> Result<Bandwidth, BadQuantity> {
        match t {
            Quantity::Number(0) => Err(BadQuantity("bandwidth must be positive".into())),
            Quantity::Number(n) => Ok(Bandwidth(n)),
            Quantity::Text(s) => Bandwidth::parse(&s),
        }
    }
}

impl Bandwidth {
    /// Parses `"10Gbit/s"`, `"800Mbps"`, `"100MB/s"`, `"1GiB/s"`, `"5000"` (bytes/s).
    pub fn parse(text: &str) -> Result<Bandwidth, BadQuantity> {
        let bad = || {
            BadQuantity(format!("bad bandwidth {text:?}: use e.g. \"10Gbit/s\", \"800Mbps\", \"100MB/s\" or bytes per second"))
        };
        let s = text.trim();
        let bytes = parse_bytes(s.strip_suffix("/s").unwrap_or(s), true).ok_or_else(bad)?;
        if !(1.0..1e15).contains(&bytes) {
            return Err(bad());
        }
        Ok(Bandwidth(bytes as u64))
    }
}

/// A number of bytes. In TOML: an integer, or a string such as `"4GiB"`,
/// `"512MiB"`, `"1.5GB"`, `"0"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Quantity", into = "u64")]
pub struct ByteSize(pub u64);

impl From<ByteSize> for u64 {
    fn from(b: ByteSize) -> u64 {
        b.0
    }
}

impl TryFrom<Quantity> for ByteSize {
    type Error = BadQuantity;
    fn try_from(t: Quantity) -> Result<ByteSize, BadQuantity> {
        match t {
            Quantity::Number(n) => Ok(ByteSize(n)),
            Quantity::Text(s) => ByteSize::parse(&s),
        }
    }
}

impl ByteSize {
    /// Parses `"4GiB"`, `"512MiB"`, `"100MB"`, `"1.5GB"`, `"64KiB"`, `"5000"` (bytes).
    pub fn parse(text: &str) -> Result<ByteSize, BadQuantity> {
        let bad = || {
            BadQuantity(format!(
                "bad size {text:?}: use e.g. \"4GiB\", \"512MiB\", \"100MB\" or a number of bytes"
            ))
        };
        let bytes = parse_bytes(text, false).ok_or_else(bad)?;
        if !(0.0..1e18).contains(&bytes) {
            return Err(bad());
        }
        Ok(ByteSize(bytes as u64))
    }
}

/// A delay distribution. In TOML: `{ dist = "fixed", ms = 1 }`,
/// `{ dist = "uniform", min_ms = 0.5, max_ms = 2 }`,
/// `{ dist = "exponential", mean_ms = 1 }` or `{ dist = "normal", mean_ms = 1, std_ms = 0.2 }`
/// (normal draws below zero count as zero).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
pub enum Delay {
    /// Always `ms`.
    Fixed {
        /// Milliseconds.
        ms: f64,
    },
    /// Uniform in `[min_ms, max_ms]`.
    Uniform {
        /// Lower bound, milliseconds.
        min_ms: f64,
        /// Upper bound, milliseconds.
        max_ms: f64,
    },
    /// Exponential with mean `mean_ms`.
    Exponential {
        /// Mean, milliseconds.
        mean_ms: f64,
    },
    /// Normal, truncated at zero.
    Normal {
        /// Mean, milliseconds.
        mean_ms: f64,
        /// Standard deviation, milliseconds.
        std_ms: f64,
    },
}

impl Delay {
    fn check(&self, key: &str) -> Result<(), ConfigError> {
        let ok = |v: f64| v.is_finite() && (0.0..=600_000.0).contains(&v);
        let fine = match *self {
            Delay::Fixed { ms } => ok(ms),
            Delay::Uniform { min_ms, max_ms } => ok(min_ms) && ok(max_ms) && min_ms <= max_ms,
            Delay::Exponential { mean_ms } => ok(mean_ms),
            Delay::Normal { mean_ms, std_ms } => ok(mean_ms) && ok(std_ms),
        };
        if fine {
            Ok(())
        } else {
            Err(ConfigError::new(
                key,
                "delays must be finite, 0-600000 ms, with min_ms <= max_ms",
            ))
        }
    }
}

/// `[links]`: shaping that makes loopback behave like a real network.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinksConfig {
    /// Cap on every link's sending rate (token bucket); default: none.
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
    /// Added latency on every link; default: none.
    #[serde(default)]
    pub delay: Option<Delay>,
    /// Per-link settings, `[[links.link]] between = ["n0", "n1"]`, overriding the defaults above in both directions.
    #[serde(default)]
    pub link: Vec<LinkSpec>,
}

/// `[[links.link]]`: one link's shaping.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// The two node ids.
    pub between: [String; 2],
    /// Rate cap on this link.
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
    /// Added latency on this link.
    #[serde(default)]
    pub delay: Option<Delay>,
}

/// `[chaos]`: seeded fault injection on every link (sender side).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChaosConfig {
    /// Seed of every fault decision (default 0): same seed, same faults.
    #[serde(default)]
    pub seed: u64,
    /// Probability that a message is dropped (default 0).
    #[serde(default)]
    pub drop: f64,
    /// Probability that a message is sent twice (default 0).
    #[serde(default)]
    pub duplicate: f64,
    /// Extra delay per message (default none).
    #[serde(default)]
    pub delay: Option<Delay>,
    /// Windows during which nodes are cut off from the rest, `[[chaos.partitions]]`.
    #[serde(default)]
    pub partitions: Vec<Partition>,
}

/// `[[chaos.partitions]]`: from `start_ms` to `end_ms` after each node's start,
/// links between `nodes` and every other node carry nothing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    /// Window start, milliseconds after node start.
    pub start_ms: u64,
    /// Window end (exclusive).
    pub end_ms: u64,
    /// The nodes cut off.
    pub nodes: Vec<String>,
}

/// Which node runs each named actor. Keys are actor names (`"reducer"`) or
/// prefixes ending in `/*` (`"sampler/*"`); the most specific key wins.
pub type Placement = BTreeMap<String, String>;

/// The runtime's part of a topology file.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// `[cluster]`
    pub cluster: ClusterConfig,
    /// `[placement]`
    pub placement: Placement,
    /// `[links]`
    pub links: LinksConfig,
    /// `[chaos]`
    pub chaos: ChaosConfig,
}

impl Topology {
    /// A topology of `nodes` with defaults elsewhere.
    pub fn new(cluster: ClusterConfig) -> Topology {
        Topology {
            cluster,
            placement: Placement::new(),
            links: LinksConfig::default(),
            chaos: ChaosConfig::default(),
        }
    }

    /// Index of node `id` in `cluster.nodes`.
    pub fn index(&self, id: &str) -> Option<usize> {
        self.cluster.nodes.iter().position(|n| n.id == id)
    }

    /// Certificate and key of node `id` (explicit paths or the `certs_dir` defaults).
    pub fn cert_paths(&self, id: &str) -> (PathBuf, PathBuf) {
        let (c, k) = certs::node_paths(&self.cluster.certs_dir, id);
        match self.index(id).map(|i| &self.cluster.nodes[i]) {
            Some(n) => (n.cert.clone().unwrap_or(c), n.key.clone().unwrap_or(k)),
            None => (c, k),
        }
    }

    /// The CA certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.cluster.certs_dir.join("ca.pem")
    }

    /// Resolves node `i`'s address.
    pub fn addr(&self, i: usize) -> Result<SocketAddr, ConfigError> {
        let n = &self.cluster.nodes[i];
        let key = format!("cluster.nodes[{i}].addr");
        n.addr
            .to_socket_addrs()
            .map_err(|e| ConfigError::new(&key, format!("cannot resolve {:?}: {e}", n.addr)))?
            .next()
            .ok_or_else(|| ConfigError::new(&key, format!("{:?} resolves to no address", n.addr)))
            .and_then(|a| {
                // Peers dial this address: a port the kernel picks is unknown to them.
                if a.port() == 0 {
                    Err(ConfigError::new(&key, format!("{:?}: port 0 lets the system pick a port the other nodes cannot know; give a fixed port", n.addr)))
                } else {
                    Ok(a)
                }
            })
    }

    /// The node running actor `name`, if the placement names one.
    pub fn placed(&self, name: &str) -> Option<&str> {
        if let Some(n) = self.placement.get(name) {
            return Some(n);
        }
        self.placement
            .iter()
            .filter_map(|(k, v)| {
                k.strip_suffix('*')
                    .filter(|p| name.starts_with(p))
                    .map(|p| (p.len(), v))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, v)| v.as_str())
    }

    /// Checks everything that can be checked without touching files or sockets.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if c.nodes.is_empty() {
            return Err(ConfigError::new(
                "cluster.nodes",
                "no nodes: add [[cluster.nodes]] entries with id and addr",
            ));
        }
        if c.nodes.len() > crate::dedup::MAX_NODES {
            return Err(ConfigError::new(
                "cluster.nodes",
                format!(
                    "{} nodes (limit {})",
                    c.nodes.len(),
                    crate::dedup::MAX_NODES
                ),
            ));
        }
        if c.heartbeat_ms == 0 {
            return Err(ConfigError::new("cluster.heartbeat_ms", "must be positive"));
        }
        if c.failure_timeout_ms < 2 * c.heartbeat_ms {
            return Err(ConfigError::new(
                "cluster.failure_timeout_ms",
                format!(
                    "{} ms is less than twice heartbeat_ms ({} ms): every peer would flap",
                    c.failure_timeout_ms, c.heartbeat_ms
                ),
            ));
        }
        if c.retry_ms == 0 {
            return Err(ConfigError::new("cluster.retry_ms", "must be positive"));
        }
        let mut addrs = BTreeMap::new();
        for (i, n) in c.nodes.iter().enumerate() {
            if !certs::valid_node_id(&n.id) {
                return Err(ConfigError::new(
                    format!("cluster.nodes[{i}].id"),
                    format!("{:?}: use 1-64 characters of [a-z0-9_-], not \"ca\"", n.id),
                ));
            }
            if let Some(j) = c.nodes[..i].iter().position(|m| m.id == n.id) {
                return Err(ConfigError::new(
                    format!("cluster.nodes[{i}].id"),
                    format!("node id {:?} appears twice (also cluster.nodes[{j}])", n.id),
                ));
            }
            if let Some(cpus) = n.cpus {
                if !(crate::cgroup::MIN_CPUS..=crate::cgroup::MAX_CPUS).contains(&cpus) {
                    return Err(ConfigError::new(
                        format!("cluster.nodes[{i}].cpus"),
                        crate::cgroup::CgroupError::BadShare(cpus).to_string(),
                    ));
                }
            }
            let a = self.addr(i)?;
            if let Some(j) = addrs.insert(a, i) {
                return Err(ConfigError::new(
                    format!("cluster.nodes[{i}].addr"),
                    format!("{a} is also the address of cluster.nodes[{j}]"),
                ));
            }
        }
        let known = |key: String, id: &str| -> Result<(), ConfigError> {
            if self.index(id).is_none() {
                return Err(ConfigError::new(
                    key,
                    format!("node {id:?} is not in cluster.nodes"),
                ));
            }
            Ok(())
        };
        for (name, node) in &self.placement {
            let key = format!("placement.{name:?}");
            let bare = name.strip_suffix("/*").unwrap_or(name);
            if ActorName::new(bare).is_err() {
                return Err(ConfigError::new(
                    key,
                    "not an actor name (1-256 characters of [a-z0-9_./-], optionally ending in /*)",
                ));
            }
            known(key, node)?;
        }
        if let Some(d) = &self.links.delay {
            d.check("links.delay")?;
        }
        for (i, l) in self.links.link.iter().enumerate() {
            for id in &l.between {
                known(format!("links.link[{i}].between"), id)?;
            }
            if l.between[0] == l.between[1] {
                return Err(ConfigError::new(
                    format!("links.link[{i}].between"),
                    "a link joins two different nodes",
                ));
            }
            if let Some(d) = &l.delay {
                d.check(&format!("links.link[{i}].delay"))?;
            }
        }
        let ch = &self.chaos;
        for (key, p) in [("chaos.drop", ch.drop), ("chaos.duplicate", ch.duplicate)] {
            if !(0.0..=1.0).contains(&p) {
                return Err(ConfigError::new(
                    key,
                    format!("{p} is not a probability in [0, 1]"),
                ));
            }
        }
        if ch.drop >= 1.0 {
            return Err(ConfigError::new(
                "chaos.drop",
                "1.0 drops everything: nothing could ever be delivered",
            ));
        }
        if let Some(d) = &ch.delay {
            d.check("chaos.delay")?;
        }
        for (i, p) in ch.partitions.iter().enumerate() {
            if p.start_ms >= p.end_ms {
                return Err(ConfigError::new(
                    format!("chaos.partitions[{i}]"),
                    "start_ms must be before end_ms",
                ));
            }
            for id in &p.nodes {
                known(format!("chaos.partitions[{i}].nodes"), id)?;
            }
        }
        Ok(())
    }

    /// Checks that the CA and every node's certificate and key exist, parse,
    /// and that each certificate is signed by the CA and names its node.
    pub fn check_certs(&self) -> Result<(), ConfigError> {
        let ca = self.ca_path();
        crate::tls::load_ca(&ca)
            .map_err(|e| ConfigError::new("cluster.certs_dir", e.to_string()))?;
        for (i, n) in self.cluster.nodes.iter().enumerate() {
            let (cert, key) = self.cert_paths(&n.id);
            let k = if n.cert.is_some() {
                format!("cluster.nodes[{i}].cert")
            } else {
                "cluster.certs_dir".to_string()
            };
            crate::tls::check_node_cert(&ca, &cert, &key, &n.id)
                .map_err(|e| ConfigError::new(k, e.to_string()))?;
        }
        Ok(())
    }

    /// The metrics address of node `i` (the configured port plus `i`).
    pub fn metrics_addr(&self, i: usize) -> Result<Option<SocketAddr>, ConfigError> {
        let Some(text) = &self.cluster.metrics_addr else {
            return Ok(None);
        };
        let key = "cluster.metrics_addr";
        let a = text
            .to_socket_addrs()
            .map_err(|e| ConfigError::new(key, format!("cannot resolve {text:?}: {e}")))?
            .next()
            .ok_or_else(|| ConfigError::new(key, format!("{text:?} resolves to no address")))?;
        // Port 0 asks the OS for a free port on every node.
        let port = if a.port() == 0 {
            Some(0)
        } else {
            u16::try_from(i).ok().and_then(|i| a.port().checked_add(i))
        };
        let port = port.ok_or_else(|| ConfigError::new(key, "port + node index exceeds 65535"))?;
        Ok(Some(SocketAddr::new(a.ip(), port)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        cluster: ClusterConfig,
        #[serde(default)]
        placement: Placement,
        #[serde(default)]
        links: LinksConfig,
        #[serde(default)]
        chaos: ChaosConfig,
    }

    fn parse(text: &str) -> Result<Topology, String> {
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let t = Topology {
            cluster: f.cluster,
            placement: f.placement,
            links: f.links,
            chaos: f.chaos,
        };
        t.validate().map_err(|e| e.to_string())?;
        Ok(t)
    }

    const BASE: &str = r#"
[cluster]
[[cluster.nodes]]
id = "n0"
addr = "127.0.0.1:47000"
[[cluster.nodes]]
id = "n1"
addr = "127.0.0.1:47001"
"#;

    #[test]
    fn a_full_file_parses_with_defaults() {
        let t = parse(&format!(
            "{BASE}
[placement]
\"sampler/*\" = \"n0\"
\"sampler/1\" = \"n1\"
reducer = \"n1\"
[links]
bandwidth = \"10Gbit/s\"
delay = {{ dist = \"uniform\", min_ms = 0.1, max_ms = 0.3 }}
[[links.link]]
between = [\"n0\", \"n1\"]
bandwidth = 1000000
[chaos]
seed = 3
drop = 0.2
duplicate = 0.1
delay = {{ dist = \"exponential\", mean_ms = 1 }}
[[chaos.partitions]]
start_ms = 100
end_ms = 200
nodes = [\"n1\"]
"
        ))
        .unwrap();
        assert_eq!(t.cluster.heartbeat_ms, 200);
        assert_eq!(t.cluster.certs_dir, PathBuf::from("certs"));
        assert_eq!(t.links.bandwidth, Some(Bandwidth(1_250_000_000)));
        assert_eq!(t.placed("sampler/0"), Some("n0"));
        assert_eq!(t.placed("sampler/1"), Some("n1"));
        assert_eq!(t.placed("reducer"), Some("n1"));
        assert_eq!(t.placed("trainer/0"), None);
        assert_eq!(t.cert_paths("n1").0, PathBuf::from("certs/n1.pem"));
    }

    #[test]
    fn bad_files_name_the_key() {
        let cases: &[(&str, &str)] = &[
            ("[cluster]\nnodes = []\n", "cluster.nodes"),
            (&format!("{BASE}[[cluster.nodes]]\nid = \"n1\"\naddr = \"127.0.0.1:47002\"\n"), "cluster.nodes[2].id"),
            (&format!("{BASE}[[cluster.nodes]]\nid = \"n2\"\naddr = \"127.0.0.1:47001\"\n"), "cluster.nodes[2].addr"),
            (&format!("{BASE}[[cluster.nodes]]\nid = \"N2\"\naddr = \"127.0.0.1:47002\"\n"), "cluster.nodes[2].id"),
            (&format!("{BASE}[[cluster.nodes]]\nid = \"n2\"\naddr = \"no-such-host.invalid:1\"\n"), "cluster.nodes[2].addr"),
            (&format!("{BASE}[[cluster.nodes]]\nid = \"n2\"\naddr = \"127.0.0.1\"\n"), "cluster.nodes[2].addr"),
            (&format!("{BASE}[[cluster.nodes]]\nid = \"n2\"\naddr = \"127.0.0.1:0\"\n"), "cluster.nodes[2].addr"),
            (&format!("{BASE}[placement]\nreducer = \"n9\"\n"), "placement.\"reducer\""),
            (&format!("{BASE}[placement]\n\"Bad Name\" = \"n0\"\n"), "placement.\"Bad Name\""),
            (&format!("{BASE}[chaos]\ndrop = 1.5\n"), "chaos.drop"),
            (&format!("{BASE}[chaos]\ndrop = 1.0\n"), "chaos.drop"),
            (&format!("{BASE}[[chaos.partitions]]\nstart_ms = 5\nend_ms = 5\nnodes = [\"n0\"]\n"), "chaos.partitions[0]"),
            (&format!("{BASE}[[chaos.partitions]]\nstart_ms = 5\nend_ms = 9\nnodes = [\"n7\"]\n"), "chaos.partitions[0].nodes"),
            (&format!("{BASE}[[links.link]]\nbetween = [\"n0\", \"n0\"]\n"), "links.link[0].between"),
            (&format!("{BASE}[links]\ndelay = {{ dist = \"uniform\", min_ms = 3, max_ms = 1 }}\n"), "links.delay"),
            ("[cluster]\nheartbeat_ms = 500\nfailure_timeout_ms = 600\n[[cluster.nodes]]\nid = \"a\"\naddr = \"127.0.0.1:1\"\n", "cluster.failure_timeout_ms"),
        ];
        for (text, key) in cases {
            let e = parse(text).unwrap_err();
            assert!(
                e.starts_with(&format!("{key}:")),
                "expected an error about {key}, got {e}"
            );
        }
        // Unknown keys and bad values are refused by the parser, which names them.
        for (text, word) in [
            (format!("{BASE}[chaos]\ndorp = 0.1\n"), "dorp"),
            (
                "[cluster]\n[[cluster.nodes]]\nid = \"a\"\nadr = \"x\"\n".to_string(),
                "adr",
            ),
            (
                format!("{BASE}[links]\nbandwidth = \"fast\"\n"),
                "bandwidth",
            ),
            (
                format!("{BASE}[links]\ndelay = {{ dist = \"gamma\", k = 1 }}\n"),
                "gamma",
            ),
        ] {
            let e = parse(&text).unwrap_err();
            assert!(e.contains(word), "{e}");
        }
    }

    #[test]
    fn bandwidth_units() {
        assert_eq!(Bandwidth::parse("10Gbit/s"), Ok(Bandwidth(1_250_000_000)));
        assert_eq!(Bandwidth::parse("800Mbps"), Ok(Bandwidth(100_000_000)));
        assert_eq!(Bandwidth::parse("100MB/s"), Ok(Bandwidth(100_000_000)));
        assert_eq!(Bandwidth::parse("1GiB/s"), Ok(Bandwidth(1 << 30)));
        assert_eq!(Bandwidth::parse("1.5 MB"), Ok(Bandwidth(1_500_000)));
        for bad in ["", "fast", "0", "-5MB", "5 furlongs", "1e30GB"] {
            assert!(Bandwidth::parse(bad).is_err(), "{bad}");
        }
    }
}
