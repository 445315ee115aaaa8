//! Running one node of a cluster (`hetgnn node`) and checking a whole cluster
//! from outside (`hetgnn doctor`).

use std::time::{Duration, Instant};

use runtime::{Node, NodeStatus, Ping, Status};

use crate::cache::manager::CacheQuery;
use crate::config::Config;
use crate::error::{Result, TrainError};

fn topology(config: &Config, what: &str) -> Result<runtime::Topology> {
    config.topology().ok_or_else(|| {
        TrainError::Config(format!(
            "cluster: {what} needs a [cluster] section with [[cluster.nodes]]"
        ))
    })
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs node `id` of the configured cluster until `stop` resolves: joins the
/// cluster, serves its actors, watches its peers.
pub fn run_node(
    config: &Config,
    id: &str,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let topology = topology(config, "hetgnn node")?;
    let system = actix_rt::System::new();
    system.block_on(async move {
        let node = Node::start(topology, id).await?;
        tracing::info!(
            "{id}: up; {} peer(s); stop with Ctrl-C",
            node.members().len()
        );
        stop.await;
        tracing::info!("{id}: stopping");
        node.shutdown().await;
        Ok(())
    })
}

/// What `doctor` learned about one node.
#[derive(Clone, Debug)]
pub struct DoctorRow {
    /// Node id.
    pub id: String,
    /// Its configured address.
    pub addr: String,
    /// Its answer to a status request, if it answered.
    pub status: Option<NodeStatus>,
    /// Median round-trip time of pings through the authenticated transport.
    pub rtt: Option<Duration>,
    /// Why it did not answer.
    pub error: Option<String>,
    /// Each device cache manager it runs (`cache/...`): its status, `None`
    /// while its cache is not built (or the run has none), or why it did not answer.
    pub caches: Vec<(
        String,
        std::result::Result<Option<crate::cache::manager::CacheStatus>, String>,
    )>,
}

/// Checks the file and its certificates, then asks every node for its status
/// and pings it, each within `timeout`.
pub fn doctor(config: &Config, timeout: Duration) -> Result<Vec<DoctorRow>> {
    let topology = topology(config, "hetgnn doctor")?;
    topology
        .check_certs()
        .map_err(|e| TrainError::Config(e.to_string()))?;
    let ca_key = topology.cluster.certs_dir.join("ca.key");
    let identity = runtime::tls::mint_client(&topology.ca_path(), &ca_key, "doctor")
        .map_err(|e| TrainError::Config(format!("cluster.certs_dir: {e}")))?;
    let system = actix_rt::System::new();
    system.block_on(async move {
        let client = Node::client(topology.clone(), "doctor", identity).await?;
        let asks = topology.cluster.nodes.iter().map(|n| {
            let client = client.clone();
            async move {
                let mut row = DoctorRow {
                    id: n.id.clone(),
                    addr: n.addr.clone(),
                    status: None,
                    rtt: None,
                    error: None,
                    caches: Vec::new(),
                };
                let target = match client.actor(&format!("node/{}", n.id)) {
                    Ok(t) => t,
                    Err(e) => {
                        row.error = Some(e.to_string());
                        return row;
                    }
                };
                match target.ask(Status, timeout).await {
                    Ok(s) => row.status = Some(s),
                    Err(e) => {
                        row.error = Some(e.to_string());
                        return row;
                    }
                }
                let mut rtts = Vec::new();
                for _ in 0..5 {
                    let t0 = Instant::now();
                    if target
                        .ask(Ping(runtime::ByteVec(vec![0; 64])), timeout)
                        .await
                        .is_ok()
                    {
                        rtts.push(t0.elapsed());
                    }
                }
                rtts.sort();
                row.rtt = rtts.get(rtts.len() / 2).copied();
                // The node's device cache managers, found in its status.
                let managers: Vec<String> = row
                    .status
                    .as_ref()
                    .map(|s| {
                        s.actors
                            .iter()
                            .filter(|a| a.starts_with("cache/"))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                for name in managers {
                    client.learn_placement(&name, &n.id);
                    let answer = match client.actor(&name) {
                        Ok(r) => r.ask(CacheQuery, timeout).await.map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    row.caches.push((name, answer));
                }
                row
            }
        });
        let rows = futures_util::future::join_all(asks).await;
        client.shutdown().await;
        Ok(rows)
    })
}
