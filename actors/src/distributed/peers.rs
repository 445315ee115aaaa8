//! The other nodes of a cluster run: waiting until they are up, stopping the
//! run when one goes down, telling them when the run is over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use runtime::{Node, PeerState};

use super::inbox::Inbox;
use super::messages::Finish;
use super::System;
use crate::error::{Result, TrainError};

/// Waits until every peer of `node` is up, or names those that are not.
pub(crate) async fn wait_for_peers(
    node: &Node,
    topology: &runtime::Topology,
    timeout: Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let missing: Vec<String> = node
            .members()
            .into_iter()
            .filter(|m| m.state != PeerState::Up)
            .map(|m| m.id)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            let named: Vec<String> = missing
                .iter()
                .map(|id| {
                    let addr = topology
                        .cluster
                        .nodes
                        .iter()
                        .find(|n| &n.id == id)
                        .map_or("?", |n| n.addr.as_str());
                    format!("{id} at {addr}")
                })
                .collect();
            return Err(TrainError::PeerLost(format!(
                "cannot reach {} within {timeout:?}: start `hetgnn node` for each of them (or use `hetgnn launch`) and check the addresses and firewalls",
                named.join(", ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stops the run as soon as a peer is reported down: every step needs every
/// trainer, so waiting out the deadlines would only delay the error.
/// (Recovery from checkpoints is the chaos issue's.)
pub(crate) fn watch_peers(node: &Node, inboxes: Vec<Arc<Inbox>>) {
    let mut events = node.subscribe();
    let me = node.id().to_string();
    tokio::spawn(async move {
        while let Ok(ev) = events.recv().await {
            if let runtime::MemberEvent::Down(peer) = ev {
                tracing::error!("{me}: peer {peer} is down: stopping the run");
                for i in &inboxes {
                    i.abort(format!("node {peer} stopped answering (no heartbeat within cluster.failure_timeout_ms)"));
                }
            }
        }
    });
}

/// Tells each `(actor, its node)` the run is over, well or not, skipping nodes
/// that are down (they would not hear it); the others wait for the word.
pub(crate) fn tell_finish(system: &System, peers: &[(String, String)], ok: bool) {
    let down: Vec<String> = system
        .node
        .members()
        .into_iter()
        .filter(|m| m.state != PeerState::Up)
        .map(|m| m.id)
        .collect();
    let refs = peers
        .iter()
        .filter(|(_, node)| !down.contains(node))
        .filter_map(|(actor, _)| system.node.actor(actor).ok());
    let asks: Vec<_> = refs
        .map(|r| async move { r.ask(Finish { ok }, Duration::from_secs(5)).await })
        .collect();
    for r in system.handle.block_on(join_all(asks)) {
        if let Err(e) = r {
            tracing::warn!("could not tell a peer the run is over: {e}");
        }
    }
}
