//! Data-parallel training (DistDGL / DistDGLv2): one Sampler, one
//! FeatureStore per node type and one or more Trainers per partition.
//! Embedded (`hetgnn train` with `mode = "data-parallel"` and no
//! `[cluster]`), every partition's actors share one process and talk through
//! local mailboxes; with a `[cluster]`, partition k runs on the k-th node.
//! The generations, the coordinator and checkpoints are `crate::distributed`'s.

mod config;
pub mod figures;
pub mod sampling;
pub mod trainer;

use std::path::PathBuf;
use std::sync::Arc;

use actix::Actor;
use graphs::partition::PartitionSet;
use graphs::HetGraph;
use models::Model;
use runtime::{Node, Topology};

use crate::cache::manager::{self, CacheDirectory};
use crate::config::{Task, TrainingConfig};
use crate::distributed::checkpoint::{self, Manifest};
use crate::distributed::generations::join_threads;
use crate::distributed::inbox::{Inbox, InboxActor};
use crate::distributed::messages::{Abort, Begin, Finish, GradShare};
use crate::distributed::{load_options, Distributed, Part, System};
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;
use crate::pretrained::init::{SharedStart, Start};
use crate::task::edge::EdgeTask;
use crate::task::link::LinkTask;

/// Data-parallel training's rules: its figures (`sampling`, with DAG sampling).
pub const RULES: crate::modes::seam::Rules = crate::modes::seam::Rules {
    own_steps: false,
    partial_params: false,
    figures: figures::merge,
};

pub use config::{
    DataParallelConfig, Sampling, SeedAssignment, MAX_DAG_IN_FLIGHT, MAX_DAG_THREADS,
};

/// Actor names of data-parallel training.
pub mod names {
    pub use crate::distributed::names::COORDINATOR;
    pub use crate::owner::names::{sampler, store};

    /// Trainer (its inbox) of partition `p`.
    pub fn trainer(p: u32) -> String {
        format!("trainer/{p}")
    }
}

/// Per trainer, its device cache once built: later generations in this
/// process reuse it instead of pre-sampling and profiling again.
pub(crate) type CacheSlots = Arc<dashmap::DashMap<u32, Arc<crate::cache::DeviceCache>>>;

/// A data-parallel run: its partitions and settings.
pub struct DataParallel {
    set: PartitionSet,
    parts: u32,
    /// Trainers per partition.
    per_part: u32,
    cfg: TrainingConfig,
    dp: DataParallelConfig,
    owners: Arc<Vec<Vec<u16>>>,
    trainer_of: Arc<Vec<u16>>,
    /// Per trainer, its device cache once built.
    caches: CacheSlots,
    /// Per trainer (by name), what its cache manager serves.
    views: Arc<CacheDirectory>,
    /// Edge-level tasks: per partition loaded in this process, its share of the task.
    tasks: std::sync::Mutex<std::collections::HashMap<u32, PartTask>>,
    /// `sampling = "dag"`: per partition loaded here, its sampling worker.
    sampling: crate::data_parallel::sampling::Workers,
    /// What a fine-tuned run starts from, read once in this process.
    start: SharedStart,
}

impl DataParallel {
    /// The run `t` describes: its partitions must exist.
    pub fn open(t: &TrainingConfig) -> Result<DataParallel> {
        let dir = t.partitions.as_ref().ok_or_else(|| TrainError::Config("training.partitions: data-parallel training needs a partition directory (hetgnn partition --out DIR)".into()))?;
        let set = PartitionSet::open_for(dir, t.data.as_deref())?;
        let (parts, per_part) = (set.manifest.parts as u32, set.manifest.trainers as u32);
        // The set keeps its copy: loading a partition checks against it.
        let (owners, trainer_of) = (
            Arc::new(set.owners.clone()),
            Arc::new(set.trainer_of.clone()),
        );
        Ok(DataParallel {
            set,
            parts,
            per_part,
            cfg: t.clone(),
            dp: DataParallelConfig::of(t)?,
            owners,
            trainer_of,
            caches: CacheSlots::default(),
            views: Arc::default(),
            tasks: Default::default(),
            sampling: Default::default(),
            start: Default::default(),
        })
    }

    /// The parameters a fine-tuned run starts from (`training.init_from`),
    /// read on first use with partition graph `g` (every partition has every id).
    fn start(&self, g: &HetGraph) -> Result<Option<Arc<Start>>> {
        let content = self.set.manifest.graph_sha256.as_deref();
        self.start.get(&self.cfg, g, content)
    }

    /// Starts the trainer threads of partition `p.part` for generation `gen`, one per inbox.
    fn spawn_trainers(
        &self,
        p: &Part,
        gen: u64,
        from: &Option<(PathBuf, Manifest)>,
    ) -> Result<Vec<std::thread::JoinHandle<Result<Model>>>> {
        let mut handles = Vec::new();
        for (j, inbox) in p.inboxes.iter().enumerate() {
            let trainer = p.part * self.per_part + j as u32;
            let setup = trainer::TrainerSetup {
                part: p.part,
                parts: self.parts,
                trainer,
                trainers: self.parts * self.per_part,
                trainer_of: self.trainer_of.clone(),
                cfg: self.cfg.clone(),
                dp: self.dp,
                graph: p.graph.clone(),
                owners: self.owners.clone(),
                node: p.node.clone(),
                handle: p.handle.clone(),
                inbox: inbox.clone(),
                timeouts: p.timeouts,
                gen,
                from: from.clone(),
                start: self.start(p.graph)?,
                caches: self.caches.clone(),
                cache_view: self
                    .views
                    .get(&names::trainer(trainer))
                    .map(|v| v.clone())
                    .ok_or_else(|| {
                        TrainError::Internal(format!("trainer {trainer} has no cache manager"))
                    })?,
                link: self.task(p.part).link,
                edge: self.task(p.part).edge,
                sampling: self.sampling.clone(),
            };
            let h = std::thread::Builder::new()
                .name(format!("trainer-{trainer}"))
                .spawn(move || trainer::run(setup))
                .map_err(|e| TrainError::Internal(format!("cannot start a trainer thread: {e}")))?;
            handles.push(h);
        }
        Ok(handles)
    }

    /// Partition `part`'s share of an edge-level task, once loaded (none for node tasks).
    fn task(&self, part: u32) -> PartTask {
        self.tasks
            .lock()
            .ok()
            .and_then(|l| l.get(&part).cloned())
            .unwrap_or_default()
    }

    /// Loads partition `part` for an edge task: its share of the task is the
    /// edges whose source it owns, the steps sized by the manifest's count of
    /// training edges in the whole graph.
    fn load_edge_task(&self, part: u32) -> Result<HetGraph> {
        let t = &self.cfg;
        let g = self.set.load_part(part as usize, &load_options(t))?;
        let m = &self.set.manifest;
        let mut total = 0;
        for name in &t.target_relations {
            let counts = m.edge_train.get(name).ok_or_else(|| {
                TrainError::Config(format!(
                    "training.partitions: the partitions hold no edge targets of '{name}' (written by a streaming partitioner or before edge tasks, or the relation has none): partition the graph again with hetgnn partition"
                ))
            })?;
            total += match t.edge_level() {
                Some(Task::EdgeRegression) => counts.valued,
                _ => counts.labelled,
            };
        }
        let task = EdgeTask::prepare_part(t, &g, Some(total), self.owned_by(part))?;
        self.keep(
            part,
            PartTask {
                link: None,
                edge: Some(Arc::new(task)),
            },
        )?;
        Ok(g)
    }

    /// Whether node `v` of type `ty` is owned by partition `part`.
    fn owned_by(&self, part: u32) -> impl Fn(usize, u32) -> bool {
        let owners = self.owners.clone();
        move |ty, v| {
            owners[ty]
                .get(v as usize)
                .is_some_and(|&o| u32::from(o) == part)
        }
    }

    /// Keeps partition `part`'s share of the task for its sampler and trainers.
    fn keep(&self, part: u32, task: PartTask) -> Result<()> {
        self.tasks
            .lock()
            .map_err(|_| TrainError::Internal("a task lock was poisoned".into()))?
            .insert(part, task);
        Ok(())
    }
}

impl Distributed for DataParallel {
    /// The replicas of a partition's trainers.
    type Outcome = Vec<Model>;

    fn name(&self) -> &'static str {
        "data-parallel"
    }

    fn graph_sha256(&self) -> Option<String> {
        self.set.manifest.graph_sha256.clone()
    }

    fn rules(&self) -> &'static crate::modes::seam::Rules {
        &RULES
    }

    fn parts(&self) -> u32 {
        self.parts
    }

    fn trainers(&self) -> u32 {
        self.parts * self.per_part
    }

    /// A partition's first trainer.
    fn leader(&self, part: u32) -> String {
        names::trainer(part * self.per_part)
    }

    fn members(&self, part: u32) -> Vec<String> {
        (0..self.per_part)
            .map(|j| names::trainer(part * self.per_part + j))
            .collect()
    }

    /// Partition k's actors run on the k-th node (which loads partition k),
    /// whatever `[placement]` says; the coordinator where `[placement]` puts
    /// it, else on the first node.
    fn place(&self, topology: &mut Topology) -> Result<Vec<String>> {
        let nodes = topology.cluster.nodes.len();
        if self.parts as usize != nodes {
            return Err(TrainError::Config(format!("training.partitions: {} partitions for {nodes} nodes; data-parallel runs one partition per node (hetgnn partition --parts {nodes})", self.parts)));
        }
        data_parallel_placement(topology, &self.set.manifest.node_types, self.per_part);
        Ok(topology
            .cluster
            .nodes
            .iter()
            .map(|n| n.id.clone())
            .collect())
    }

    /// An edge-level task's steps are the task's (a hash of each edge), the
    /// same in every partition; beside node tasks, the longer of the two.
    fn steps_per_epoch(&self, graph: &HetGraph, t: &TrainingConfig) -> u64 {
        let task = self
            .tasks
            .lock()
            .ok()
            .and_then(|l| l.values().next().cloned());
        let nodes = graph.target_labels().1.train.len().div_ceil(t.batch.max(1)) as u64;
        match (task.and_then(|k| k.batching()), t.mixed_tasks()) {
            (Some(b), None) => b.steps(),
            (Some(b), Some(_)) => b.steps().max(nodes),
            (None, _) => nodes,
        }
    }

    /// For link prediction, the partition's held-out edges leave it before
    /// its reverse relations are added; for edge-level tasks, its share of
    /// the task (the edges whose source it owns) is kept for its sampler and
    /// trainers.
    fn load(&self, part: u32) -> Result<HetGraph> {
        let t = &self.cfg;
        match t.edge_level() {
            Some(Task::LinkPrediction) => {}
            Some(_) => return self.load_edge_task(part),
            None => return Ok(self.set.load_part(part as usize, &load_options(t))?),
        }
        let g = self.set.load_part(
            part as usize,
            &graphs::LoadOptions {
                reverse_edges: false,
                ..load_options(t)
            },
        )?;
        let m = &self.set.manifest;
        let mut total = 0;
        for name in &t.target_relations {
            total += m.relation_edges.get(name).copied().ok_or_else(|| {
                TrainError::Config(format!(
                    "training.partitions: the manifest does not record the edges of '{name}' (partitions written before link prediction, or no such relation): partition the graph again"
                ))
            })?;
        }
        let (g, task) = LinkTask::prepare_part(t, g, total, self.owned_by(part))?;
        self.keep(
            part,
            PartTask {
                link: Some(Arc::new(task)),
                edge: None,
            },
        )?;
        Ok(g)
    }

    /// Its partitioning (owners included) and all-reduce order too.
    fn owned_rows(&self, part: u32) -> Option<Vec<u64>> {
        Some(crate::owner::owned_counts(&self.owners, part))
    }

    fn fingerprint(&self, g: &HetGraph) -> String {
        let (t, m) = (&self.cfg, &self.set.manifest);
        let layout = format!(
            "data-parallel|{:?}|{}|{}|{:?}|{:?}",
            t.allreduce, m.parts, m.trainers, m.method, self.dp.seed_assignment
        );
        let link = t.link_fingerprint();
        let mut extra: Vec<&[u8]> = vec![layout.as_bytes(), link.as_bytes()];
        extra.extend(
            self.owners
                .iter()
                .map(|o| bytemuck::cast_slice::<u16, u8>(o)),
        );
        extra.push(bytemuck::cast_slice::<u16, u8>(&self.trainer_of));
        checkpoint::fingerprint(t, g.name(), &extra)
    }

    /// The sampler and the stores each get a thread of their own (an actix
    /// arbiter): serving a large pull must not hold up a push, a sampling
    /// request or the transport, which stays on the node's thread.
    fn serve(
        &self,
        node: &Node,
        part: u32,
        graph: &Arc<HetGraph>,
        arbiters: &mut Vec<actix::Arbiter>,
    ) -> Result<Vec<Arc<Inbox>>> {
        let (parts, per_part) = (self.parts, self.per_part);
        let reg = |e: runtime::WireError| TrainError::Internal(e.to_string());
        let start = self.start(graph)?;
        crate::owner::serve(
            node,
            crate::owner::Served {
                part,
                graph,
                owners: &self.owners,
                steps: self.task(part).batching(),
                pushers: parts * per_part,
                start: start.as_deref().map(|s| s as &dyn crate::owner::StartRows),
            },
            &self.cfg,
            arbiters,
        )?;
        let mut inboxes = Vec::new();
        for j in 0..per_part {
            let inbox = Arc::new(Inbox::default());
            let addr = InboxActor(inbox.clone()).start();
            node.register(&names::trainer(part * per_part + j), &addr)
                .map_err(reg)?
                .handle::<GradShare>()
                .handle::<Abort>()
                .handle::<Finish>()
                .handle::<Begin>();
            manager::serve(node, &names::trainer(part * per_part + j), &self.views).map_err(reg)?;
            inboxes.push(inbox);
        }
        Ok(inboxes)
    }

    /// The partition's stores restore the checkpoint, its trainers train.
    fn attempt(
        &self,
        p: &Part,
        b: Begin,
        _run: &str,
        from: Option<(PathBuf, Manifest)>,
    ) -> Result<Vec<Model>> {
        crate::owner::reset_stores(p, &self.cfg, b)?;
        let handles = self.spawn_trainers(p, b.gen, &from)?;
        join_threads(handles)
    }

    /// A replica of the coordinator's own partition (its last attempt
    /// finished: the coordinator saw every step; every replica is the same)
    /// and the learnable tables from the stores.
    fn assemble(
        &self,
        system: &System,
        _inbox: &Inbox,
        local: Vec<(u32, Result<Option<Vec<Model>>>)>,
        g: &HetGraph,
    ) -> Result<Model> {
        let (_, own) = local
            .into_iter()
            .next()
            .ok_or_else(|| TrainError::Internal("no partition".into()))?;
        let replica = own?.and_then(|mut r| (!r.is_empty()).then(|| r.swap_remove(0)));
        let replica = replica.ok_or_else(|| {
            TrainError::PeerLost(
                "the coordinator's own partition did not finish its last attempt".into(),
            )
        })?;
        crate::owner::assemble(&self.cfg, system, self.parts, &replica, g)
    }
}

/// A partition's share of an edge-level task (both empty for node tasks).
#[derive(Clone, Default)]
pub(crate) struct PartTask {
    /// Link prediction.
    pub link: Option<Arc<LinkTask>>,
    /// Edge classification or regression.
    pub edge: Option<Arc<EdgeTask>>,
}

impl PartTask {
    /// How the task's training edges fall into steps.
    fn batching(&self) -> Option<graphs::link::Batching> {
        match (&self.link, &self.edge) {
            (Some(l), _) => Some(l.batching().clone()),
            (None, Some(e)) => Some(e.batching().clone()),
            (None, None) => None,
        }
    }
}

/// Placement for data-parallel training: partition k's actors run on the
/// k-th node (which loads partition k), whatever `[placement]` says; the
/// coordinator where `[placement]` puts it, else on the first node.
pub fn data_parallel_placement(topology: &mut runtime::Topology, types: &[String], per_part: u32) {
    let ids: Vec<String> = topology
        .cluster
        .nodes
        .iter()
        .map(|n| n.id.clone())
        .collect();
    for (k, id) in ids.iter().enumerate() {
        let k = k as u32;
        let trainers = (0..per_part).map(|j| names::trainer(k * per_part + j));
        let names = [names::sampler(k)]
            .into_iter()
            .chain(trainers)
            .chain(types.iter().map(|ty| names::store(ty, k)));
        for name in names {
            topology.placement.insert(name, id.clone());
        }
    }
    if topology.placed(names::COORDINATOR).is_none() {
        if let Some(first) = ids.first() {
            topology
                .placement
                .insert(names::COORDINATOR.to_string(), first.clone());
        }
    }
}
