//! Inference across partitions. Offline and exact (`hetgnn embed
//! --partitions`, `predict --partitions`; this module): each partition
//! computes its own nodes' rows layer by layer with full in-neighbourhoods, pulling the previous layer's rows of its halo from the
//! partitions that own them, and writes its nodes' embeddings; the result
//! is single-process `embed`'s. Each layer is saved per partition as it
//! is served, so a partition restarted after a crash resumes from its last
//! layer while its peers wait for it. Online and sampled (`hetgnn serve
//! --partitions`): [`online`].

pub mod files;
pub mod messages;
pub mod online;
pub mod packed;
mod part;
pub mod rows;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use futures_util::future::join_all;
use graphs::partition::PartitionSet;
use graphs::{HetGraph, LoadOptions};
use runtime::Node;
use sha2::Digest;

use crate::distributed::System;
use crate::error::{Result, TrainError};
use crate::pretrained::Inference;
use files::{JobRecord, Manifest, Out, TypeEntry};
use messages::{Finished, Leaving, PartDone, StagePull};
use rows::{Published, RowServer};

/// Actor names of distributed inference.
pub mod names {
    /// The row server of partition `k`.
    pub fn rows(k: u32) -> String {
        format!("embed/{k}")
    }
}

/// What a job writes per partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Computes {
    /// Every node's embedding (`embed`: the classifier's input rows).
    Embeddings,
    /// The target nodes' logits (`predict`): every relational layer, the
    /// last one over the target type only, and the classifier where the
    /// model has one.
    Logits,
}

/// A distributed `embed` or `predict`: the model, the partitions, where to write.
pub struct Job<'a> {
    /// The trained model, built on one of the partitions' graphs (whose types
    /// and relations are the whole graph's), and its learnable rows.
    pub model: &'a Inference,
    /// The partitions.
    pub set: &'a PartitionSet,
    /// Load the partitions with reverse relations (as the model was trained).
    pub reverse_edges: bool,
    /// What identifies the job (the checkpoint and the partitions): a run
    /// resumes only a directory of the same job.
    pub fingerprint: String,
    /// The output directory ([`files`]).
    pub out: &'a Path,
    /// Destination nodes computed at a time.
    pub chunk: usize,
    /// Replace another job's output directory.
    pub force: bool,
    /// How long a partition waits for a peer's rows (a peer restarting included).
    pub wait: Duration,
    /// Embeddings or logits.
    pub computes: Computes,
}

impl Job<'_> {
    fn record(&self) -> Result<JobRecord> {
        if self.chunk == 0 {
            return Err(TrainError::Config(
                "the chunk of nodes must be at least 1".into(),
            ));
        }
        let model = &self.model.model;
        let layers = match self.computes {
            Computes::Embeddings => models::inference::embedding_layers(model)?,
            Computes::Logits => models::inference::classifier_layers(model)?,
        };
        Ok(JobRecord {
            format: files::FORMAT.into(),
            job: self.fingerprint.clone(),
            parts: self.set.manifest.parts as u32,
            layers: layers as u32,
            logits: self.computes == Computes::Logits,
        })
    }

    /// What every partition of the job computes with.
    fn shared<'s>(
        &'s self,
        id: u64,
        record: &JobRecord,
        names: &'s [String],
        out: &'s Out,
        progress: &'s (dyn Fn(u64) + Sync),
    ) -> part::Shared<'s> {
        part::Shared {
            job: id,
            model: self.model,
            halo_features: self.set.manifest.halo_features,
            owners: &self.set.owners,
            names,
            layers: record.layers,
            logits: record.logits,
            chunk: self.chunk,
            out,
            ask: Duration::from_secs(60),
            wait: self.wait,
            progress,
        }
    }

    /// The job's id in messages: a hash of its record.
    fn id(record: &JobRecord) -> u64 {
        let text = format!(
            "{}|{}|{}|{}",
            record.job, record.parts, record.layers, record.logits
        );
        let d = sha2::Sha256::digest(text.as_bytes());
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
    }

    fn names(&self) -> Vec<String> {
        self.set.manifest.node_types.clone()
    }

    /// Partition `k`'s graph, loaded as the model was trained.
    pub fn load_part(&self, k: u32) -> Result<HetGraph> {
        Ok(self.set.load_part(
            k as usize,
            &LoadOptions {
                mmap_features: true,
                reverse_edges: self.reverse_edges,
            },
        )?)
    }
}

/// The manifest of a job whose partitions are `done`.
fn manifest(record: &JobRecord, names: &[String], done: &[PartDone]) -> Result<Manifest> {
    let mut types = Vec::new();
    for (t, name) in names.iter().enumerate() {
        let each: Vec<Option<(usize, u64)>> = done
            .iter()
            .map(|d| d.types.get(t).copied().flatten())
            .collect();
        let widths: std::collections::BTreeSet<usize> =
            each.iter().flatten().map(|&(w, _)| w).collect();
        match widths.len() {
            0 => continue,
            1 => {}
            _ => {
                return Err(TrainError::Protocol(format!(
                    "partitions wrote embeddings of {name} of different widths {widths:?}"
                )))
            }
        }
        types.push(TypeEntry {
            name: name.clone(),
            width: widths.into_iter().next().unwrap_or(0),
            nodes: each.iter().map(|e| e.map_or(0, |(_, n)| n)).collect(),
        });
    }
    Ok(Manifest {
        format: files::FORMAT.into(),
        job: record.clone(),
        types,
    })
}

/// Runs every partition of `job` in this process; `progress(n)` as each
/// chunk of `n` nodes is computed. A directory already complete for the job
/// is returned as it is.
pub fn embed_embedded(job: &Job, progress: &(dyn Fn(u64) + Sync)) -> Result<Manifest> {
    let record = job.record()?;
    let out = Out::open(job.out, &record, job.force)?;
    if let Some(m) = out.manifest()? {
        return Ok(m);
    }
    let parts = record.parts;
    let id = Job::id(&record);
    let names = job.names();
    let owners = &job.set.owners;
    let graphs: Vec<HetGraph> = (0..parts)
        .map(|k| job.load_part(k))
        .collect::<Result<_>>()?;
    let own: Vec<Arc<Vec<Vec<u32>>>> = (0..parts)
        .map(|k| Arc::new(part::own_nodes(owners, k)))
        .collect();
    let published: Vec<Arc<Published>> = (0..parts)
        .map(|k| Arc::new(Published::new(id, k as u16, own[k as usize].clone())))
        .collect();
    let served = published.clone();
    let (system, ()) = System::start(move || async move {
        let node = Node::embedded("local").map_err(TrainError::internal)?;
        for (k, p) in served.into_iter().enumerate() {
            serve(&node, k as u32, p)?;
        }
        Ok((node, Vec::new(), ()))
    })?;
    let shared = job.shared(id, &record, &names, &out, progress);
    let done: Vec<Result<PartDone>> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..parts as usize)
            .map(|k| {
                let p = part::Part {
                    shared: &shared,
                    k: k as u32,
                    graph: &graphs[k],
                    own: &own[k],
                    published: &published[k],
                    node: &system.node,
                    handle: &system.handle,
                };
                scope.spawn(move || p.run())
            })
            .collect();
        runs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(TrainError::Internal("a partition thread panicked".into()))
                })
            })
            .collect()
    });
    drop(system);
    let done: Vec<PartDone> = done.into_iter().collect::<Result<_>>()?;
    let m = manifest(&record, &names, &done)?;
    out.complete(&m)?;
    for k in 0..parts {
        out.clean(k)?;
    }
    Ok(m)
}

/// The partition node `id` of `topology` computes (the k-th node of
/// `cluster.nodes` computes partition k), for a job of `parts` partitions.
pub fn partition_of(topology: &runtime::Topology, id: &str, parts: u32) -> Result<u32> {
    let nodes = &topology.cluster.nodes;
    if nodes.len() != parts as usize {
        return Err(TrainError::Config(format!(
            "{parts} partitions for {} nodes in cluster.nodes: the k-th node computes partition k",
            nodes.len()
        )));
    }
    nodes
        .iter()
        .position(|n| n.id == id)
        .map(|k| k as u32)
        .ok_or_else(|| TrainError::Config(format!("--node {id}: not in cluster.nodes")))
}

/// Runs node `id`'s partition of `job` on `graph`, that partition's graph as
/// [`Job::load_part`] loads it ([`partition_of`] says which), waits until
/// every partition is done, and on the first node writes the manifest
/// (returned there).
pub fn embed_node(
    job: &Job,
    mut topology: runtime::Topology,
    id: &str,
    graph: &HetGraph,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Option<Manifest>> {
    let record = job.record()?;
    let parts = record.parts;
    let k = partition_of(&topology, id, parts)?;
    let nodes: Vec<String> = topology
        .cluster
        .nodes
        .iter()
        .map(|n| n.id.clone())
        .collect();
    for (p, n) in nodes.iter().enumerate() {
        topology.placement.insert(names::rows(p as u32), n.clone());
    }
    let out = Out::open(job.out, &record, job.force)?;
    let job_id = Job::id(&record);
    let names = job.names();
    let own = Arc::new(part::own_nodes(&job.set.owners, k));
    let published = Arc::new(Published::new(job_id, k as u16, own.clone()));
    let start = Duration::from_millis(topology.cluster.start_timeout_ms);
    let (served, topo, me) = (published.clone(), topology.clone(), id.to_string());
    let (system, ()) = System::start(move || async move {
        let node = Node::start(topo.clone(), &me).await?;
        serve(&node, k, served)?;
        tracing::info!("{me}: embedding partition {k} of {parts}; waiting for peers");
        if let Err(e) = crate::distributed::peers::wait_for_peers(&node, &topo, start).await {
            node.shutdown().await;
            return Err(e);
        }
        Ok((node, Vec::new(), ()))
    })?;
    let shared = job.shared(job_id, &record, &names, &out, progress);
    part::Part {
        shared: &shared,
        k,
        graph,
        own: &own,
        published: &published,
        node: &system.node,
        handle: &system.handle,
    }
    .run()?;
    let done = system
        .handle
        .block_on(barrier(&system.node, job_id, parts, k, job.wait))?;
    published.all_seen();
    system
        .handle
        .block_on(linger(&system.node, &published, job_id, parts, k));
    out.clean(k)?;
    drop(system);
    if k != 0 {
        return Ok(None);
    }
    let m = manifest(&record, &names, &done)?;
    out.complete(&m)?;
    Ok(Some(m))
}

/// Waits until every partition has written its embeddings (a peer still
/// computing may need this one's rows): their accounts, in partition order.
async fn barrier(
    node: &Node,
    job: u64,
    parts: u32,
    me: u32,
    wait: Duration,
) -> Result<Vec<PartDone>> {
    let deadline = std::time::Instant::now() + wait;
    let mut done: Vec<Option<PartDone>> = vec![None; parts as usize];
    loop {
        let asked: Vec<u32> = (0..parts).filter(|&p| done[p as usize].is_none()).collect();
        let actors = asked
            .iter()
            .map(|&p| node.actor(&names::rows(p)).map_err(TrainError::internal))
            .collect::<Result<Vec<_>>>()?;
        let states = join_all(
            actors
                .iter()
                .map(|a| a.ask(Finished { job }, Duration::from_secs(5))),
        )
        .await;
        for (&p, state) in asked.iter().zip(states) {
            if let Ok(state) = state {
                done[p as usize] = state.done;
            }
        }
        if done.iter().all(Option::is_some) {
            return Ok(done.into_iter().flatten().collect());
        }
        if std::time::Instant::now() >= deadline {
            let missing: Vec<String> = (0..parts)
                .filter(|&p| p != me && done[p as usize].is_none())
                .map(|p| p.to_string())
                .collect();
            return Err(TrainError::PeerLost(format!(
                "partitions {} did not finish within {wait:?}",
                missing.join(", ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Keeps serving until every peer has seen every partition done too (or
/// is gone: it leaves only once it has), so that none is left asking; then
/// tells the peers it leaves.
async fn linger(node: &Node, published: &Published, job: u64, parts: u32, me: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let peers: Vec<(u32, runtime::ActorRef)> = (0..parts)
        .filter(|&p| p != me)
        .filter_map(|p| Some((p, node.actor(&names::rows(p)).ok()?)))
        .collect();
    let mut waiting: Vec<&(u32, runtime::ActorRef)> = peers.iter().collect();
    while !waiting.is_empty() && std::time::Instant::now() < deadline {
        // A peer that left had seen everything (it leaves only then); one
        // whose word of it was lost costs this short timeout.
        waiting.retain(|(p, _)| !published.has_left(*p));
        let states = join_all(
            waiting
                .iter()
                .map(|(_, a)| a.ask(Finished { job }, Duration::from_millis(500))),
        )
        .await;
        let mut states = states.into_iter();
        waiting.retain(|_| matches!(states.next(), Some(Ok(s)) if !s.all_seen));
        if !waiting.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    join_all(
        peers
            .iter()
            .filter(|(p, _)| !published.has_left(*p))
            .map(|(_, a)| a.ask(Leaving { job, part: me }, Duration::from_millis(500))),
    )
    .await;
}

/// Registers partition `k`'s row server on `node`.
fn serve(node: &Node, k: u32, p: Arc<Published>) -> Result<()> {
    let addr = RowServer(p).start();
    node.register(&names::rows(k), &addr)
        .map_err(TrainError::internal)?
        .handle::<StagePull>()
        .handle::<Finished>()
        .handle::<Leaving>();
    Ok(())
}
