//! The training thread of a mode with one worker per partition beside the
//! partition's owner-compute services (hopgnn, full-graph): what it is
//! given, the client and peers it talks to, and how it runs (on a thread of
//! its own, telling its peers when it fails).

use std::sync::Arc;

use graphs::HetGraph;
use models::Model;
use runtime::{ActorRef, Node};

use super::client::{sender_ref, Client, ClientSetup};
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::Manifest;
use crate::distributed::generations::{abort_peers, join_threads};
use crate::distributed::inbox::Inbox;
use crate::distributed::messages::Begin;
use crate::distributed::names::COORDINATOR;
use crate::distributed::{Part, Timeouts};
use crate::error::{Result, TrainError};

/// Everything a worker thread needs.
pub struct WorkerSetup {
    /// This worker's partition.
    pub part: u32,
    /// Partitions (= workers).
    pub parts: u32,
    /// Training settings.
    pub cfg: TrainingConfig,
    /// The partition graph.
    pub graph: Arc<HetGraph>,
    /// Owner of every node.
    pub owners: Arc<Vec<Vec<u16>>>,
    /// The node the worker's actors live on.
    pub node: Node,
    /// The node's runtime, for asks from this thread.
    pub handle: tokio::runtime::Handle,
    /// This worker's inbox.
    pub inbox: Arc<Inbox>,
    /// Deadlines.
    pub timeouts: Timeouts,
    /// Generation of the run this attempt is.
    pub gen: u64,
    /// The checkpoint this attempt starts from (its directory and manifest).
    pub from: Option<(std::path::PathBuf, Manifest)>,
    /// The actor name of worker `p`'s inbox in this mode.
    pub name: fn(u32) -> String,
    /// What a fine-tuned run starts from (`training.init_from`).
    pub start: Option<Arc<crate::pretrained::init::Start>>,
}

impl WorkerSetup {
    /// Partition `p`'s worker for the attempt `b` of a run of `parts`
    /// partitions, resumed `from` a checkpoint or fine-tuned from `start`.
    pub fn new(
        p: &Part,
        parts: u32,
        cfg: &TrainingConfig,
        owners: &Arc<Vec<Vec<u16>>>,
        b: &Begin,
        (from, start): (
            Option<(std::path::PathBuf, Manifest)>,
            Option<Arc<crate::pretrained::init::Start>>,
        ),
        name: fn(u32) -> String,
    ) -> Result<WorkerSetup> {
        Ok(WorkerSetup {
            part: p.part,
            parts,
            cfg: cfg.clone(),
            graph: p.graph.clone(),
            owners: owners.clone(),
            node: p.node.clone(),
            handle: p.handle.clone(),
            inbox: p.inboxes.first().cloned().ok_or_else(|| {
                TrainError::Internal(format!("partition {} without its worker's inbox", p.part))
            })?,
            timeouts: p.timeouts,
            gen: b.gen,
            from,
            name,
            start,
        })
    }

    /// The client this worker samples, gathers and pushes through for
    /// `model`, every worker's inbox (in partition order) and the coordinator's.
    pub fn peers(&self, model: &Model) -> Result<(Client, Vec<ActorRef>, ActorRef)> {
        let me = (self.name)(self.part);
        let c = Client::new(ClientSetup {
            part: self.part,
            parts: self.parts,
            graph: self.graph.clone(),
            owners: self.owners.clone(),
            cfg: &self.cfg,
            model,
            gen: self.gen,
            timeouts: self.timeouts,
            inbox: self.inbox.clone(),
            handle: self.handle.clone(),
            node: &self.node,
            me: &me,
        })?;
        let workers = (0..self.parts)
            .map(|p| sender_ref(&self.node, &me, &(self.name)(p)))
            .collect::<Result<_>>()?;
        let coordinator = sender_ref(&self.node, &me, COORDINATOR)?;
        Ok((c, workers, coordinator))
    }
}

/// Runs `train` on a thread of its own called `thread` and returns its
/// result; on failure tells the other workers and the coordinator, so they
/// stop instead of waiting.
pub fn run_thread<T: Send + 'static>(
    thread: String,
    s: WorkerSetup,
    train: impl FnOnce(&WorkerSetup) -> Result<T> + Send + 'static,
) -> Result<T> {
    let h = std::thread::Builder::new()
        .name(thread)
        .spawn(move || {
            let result = train(&s);
            if let Err(e) = &result {
                let targets: Vec<String> = (0..s.parts)
                    .filter(|&p| p != s.part)
                    .map(s.name)
                    .chain([COORDINATOR.to_string()])
                    .collect();
                abort_peers(
                    &s.node,
                    &s.handle,
                    &(s.name)(s.part),
                    s.part,
                    s.gen,
                    &targets,
                    e,
                );
            }
            result
        })
        .map_err(|e| TrainError::Internal(format!("cannot start a worker thread: {e}")))?;
    Ok(join_threads(vec![h])?.swap_remove(0))
}
