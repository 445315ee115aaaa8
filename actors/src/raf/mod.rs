//! Relation-aggregation-first training (Heta): one RelationAggWorker per
//! meta-partition and a designated Reducer, on the actor runtime. Worker 0
//! runs the partition holding the self sub-metatree and hosts the reducer
//! and the coordinator; with a `[cluster]`, it runs where `[placement]` puts
//! `reducer` (else on the first node) and the other partitions take the
//! other nodes in order. The generations, the coordinator and checkpoints
//! are `crate::distributed`'s.

mod config;
mod final_state;
pub mod messages;
pub mod worker;

use final_state::{assemble, final_state, gather_final, send_final};

use std::path::PathBuf;
use std::sync::Arc;

use actix::Actor;
use graphs::partition::meta::MetaSet;
use graphs::{HetGraph, RelationId};
use runtime::{Node, Topology};

use crate::cache::manager::{self, CacheDirectory};
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::Manifest;
use crate::distributed::generations::join_threads;
use crate::distributed::inbox::{Inbox, InboxActor};
use crate::distributed::messages::{Abort, Begin, Finish};
use crate::distributed::{load_options, Distributed, Part, System, Timeouts};
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;
use messages::{Final, FinalState, Partial, PartialGrad, SeedGrad, SeedRows, Shared};
use worker::{WorkerResult, WorkerSetup};

/// RAF's rules: a parameter no worker uses is in no worker's checkpoint
/// file (it keeps its initial value).
pub const RULES: crate::modes::seam::Rules = crate::modes::seam::Rules {
    partial_params: true,
    ..crate::modes::seam::PLAIN
};

pub use config::{RafConfig, RafEmbeddings};

/// Actor names of RAF training.
pub mod names {
    /// The reducer (an alias of worker 0's inbox).
    pub const REDUCER: &str = "reducer";
    /// Where workers send their final states (the coordinator's).
    pub const FINAL: &str = "coordinator/final";
    /// RelationAggWorker `w` (its inbox).
    pub fn worker(w: u32) -> String {
        format!("worker/{w}")
    }
}

/// A raf run: the meta-partitions in worker order (the reducer's first) and
/// each worker's relations per layer.
pub struct Raf {
    set: MetaSet,
    /// Partition index of each worker.
    part_of: Vec<usize>,
    cfg: TrainingConfig,
    raf: RafConfig,
    /// Every worker's relations per layer, once a graph is loaded.
    per_layer: std::sync::OnceLock<Arc<Vec<Vec<Vec<RelationId>>>>>,
    /// Per worker (by name), what its cache manager serves.
    views: Arc<CacheDirectory>,
}

impl Raf {
    /// The run `t` describes: its meta-partitions must exist and suit it.
    pub fn open(t: &TrainingConfig) -> Result<Raf> {
        let dir = t.partitions.as_ref().ok_or_else(|| TrainError::Config("training.partitions: raf training needs a meta-partition directory (hetgnn partition --method meta --out DIR)".into()))?;
        let set = MetaSet::open_for(dir, t.data.as_deref())?;
        if set.manifest.layers != t.layers {
            return Err(TrainError::Config(format!(
                "training.layers = {} but the meta-partitions in {} were built for {} layers (hetgnn partition --method meta --layers {})",
                t.layers,
                dir.display(),
                set.manifest.layers,
                t.layers
            )));
        }
        let r = set.reducer();
        let part_of = std::iter::once(r)
            .chain((0..set.manifest.parts).filter(|&k| k != r))
            .collect();
        Ok(Raf {
            set,
            part_of,
            cfg: t.clone(),
            raf: RafConfig::of(t)?,
            per_layer: std::sync::OnceLock::new(),
            views: Arc::default(),
        })
    }

    fn workers(&self) -> u32 {
        self.part_of.len() as u32
    }

    /// Every worker's `(replica, replicas)`.
    fn replicas(&self) -> Arc<Vec<(u32, u32)>> {
        Arc::new(
            self.part_of
                .iter()
                .map(|&k| {
                    (
                        self.set.manifest.info[k].replica[0] as u32,
                        self.set.manifest.info[k].replica[1] as u32,
                    )
                })
                .collect(),
        )
    }

    /// Every worker's relations per layer (the relation ids of `g`, which every partition shares).
    fn per_layer(&self, g: &HetGraph) -> Result<Arc<Vec<Vec<Vec<RelationId>>>>> {
        if let Some(p) = self.per_layer.get() {
            return Ok(p.clone());
        }
        let p = Arc::new(
            self.part_of
                .iter()
                .map(|&k| self.set.per_layer(k, g))
                .collect::<graphs::Result<Vec<_>>>()?,
        );
        Ok(self.per_layer.get_or_init(|| p).clone())
    }
}

fn spawn_worker(setup: WorkerSetup) -> Result<std::thread::JoinHandle<Result<WorkerResult>>> {
    std::thread::Builder::new()
        .name(format!("raf-worker-{}", setup.worker))
        .spawn(move || worker::run(setup))
        .map_err(|e| TrainError::Internal(format!("cannot start a worker thread: {e}")))
}

impl Distributed for Raf {
    /// The worker's model (the parameters and tables it holds are current).
    type Outcome = WorkerResult;

    fn name(&self) -> &'static str {
        "raf"
    }

    fn rules(&self) -> &'static crate::modes::seam::Rules {
        &RULES
    }

    fn parts(&self) -> u32 {
        self.workers()
    }

    fn trainers(&self) -> u32 {
        self.workers()
    }

    fn leader(&self, part: u32) -> String {
        names::worker(part)
    }

    fn members(&self, part: u32) -> Vec<String> {
        vec![names::worker(part)]
    }

    /// Worker 0 (the reducer's partition) where `[placement]` puts
    /// `reducer`, else on the first node; the others in node order.
    fn place(&self, topology: &mut Topology) -> Result<Vec<String>> {
        let nodes = topology.cluster.nodes.len();
        if self.workers() as usize != nodes {
            return Err(TrainError::Config(format!(
                "training.partitions: {} meta-partitions for {nodes} nodes; raf runs one partition per node (hetgnn partition --method meta --parts {nodes})",
                self.workers()
            )));
        }
        Ok(raf_placement(topology))
    }

    fn load(&self, part: u32) -> Result<HetGraph> {
        Ok(self
            .set
            .load_part(self.part_of[part as usize], &load_options(&self.cfg))?)
    }

    /// Its meta-partitions, worker order and embedding mode too.
    /// Workers share the learnable rows they all read: each step a worker
    /// holds its rows' gradients, their encoding, every peer's decoded and
    /// their sum, beyond the pulled rows' copies.
    fn rows_in_transit(&self) -> u128 {
        crate::epoch::memory::TRANSPORT_COPIES + 2 + u128::from(self.trainers())
    }

    fn graph_sha256(&self) -> Option<String> {
        self.set.manifest.graph_sha256.clone()
    }

    fn fingerprint(&self, g: &HetGraph) -> String {
        let layout = format!(
            "raf|{:?}|{:?}|{:?}",
            self.raf.embeddings, self.part_of, self.set.manifest
        );
        crate::distributed::checkpoint::fingerprint(&self.cfg, g.name(), &[layout.as_bytes()])
    }

    /// The worker's inbox (on worker 0 also under the reducer's name).
    fn serve(
        &self,
        node: &Node,
        w: u32,
        _graph: &Arc<HetGraph>,
        _arbiters: &mut Vec<actix::Arbiter>,
    ) -> Result<Vec<Arc<Inbox>>> {
        let reg = |e: runtime::WireError| TrainError::Internal(e.to_string());
        let inbox = Arc::new(Inbox::default());
        let addr = InboxActor(inbox.clone()).start();
        let names = if w == 0 {
            vec![names::worker(0), names::REDUCER.to_string()]
        } else {
            vec![names::worker(w)]
        };
        for n in names {
            node.register(&n, &addr)
                .map_err(reg)?
                .handle::<Partial>()
                .handle::<PartialGrad>()
                .handle::<SeedRows>()
                .handle::<SeedGrad>()
                .handle::<Shared>()
                .handle::<Abort>()
                .handle::<Finish>()
                .handle::<Begin>();
        }
        manager::serve(node, &names::worker(w), &self.views).map_err(reg)?;
        Ok(vec![inbox])
    }

    /// The coordinator also takes the workers' final states.
    fn serve_coordinator(&self, node: &Node, inbox: &Arc<Inbox>) -> Result<()> {
        let addr = InboxActor(inbox.clone()).start();
        node.register(names::FINAL, &addr)
            .map_err(|e| TrainError::Internal(e.to_string()))?
            .handle::<Final>();
        Ok(())
    }

    fn attempt(
        &self,
        p: &Part,
        b: Begin,
        _run: &str,
        from: Option<(PathBuf, Manifest)>,
    ) -> Result<WorkerResult> {
        let setup = WorkerSetup {
            worker: p.part,
            per_layer: self.per_layer(p.graph)?,
            replicas: self.replicas(),
            cfg: self.cfg.clone(),
            raf: self.raf,
            graph: p.graph.clone(),
            node: p.node.clone(),
            handle: p.handle.clone(),
            inbox: p.inboxes[0].clone(),
            timeouts: p.timeouts,
            from,
            gen: b.gen,
            cache_view: self
                .views
                .get(&names::worker(p.part))
                .map(|v| v.clone())
                .ok_or_else(|| {
                    TrainError::Internal(format!("worker {} has no cache manager", p.part))
                })?,
        };
        Ok(join_threads(vec![spawn_worker(setup)?])?.swap_remove(0))
    }

    /// Each successful attempt's final state goes to the coordinator, which takes the last one.
    fn after_attempt(&self, p: &Part, gen: u64, r: &WorkerResult) -> Result<()> {
        send_final(
            p.node,
            p.handle,
            &p.inboxes[0],
            p.part,
            gen,
            r,
            p.timeouts.ask,
        )
    }

    /// Every worker's final state (the remote ones gathered from the
    /// coordinator's inbox), each parameter and table from its first holder.
    fn assemble(
        &self,
        _system: &System,
        inbox: &Inbox,
        local: Vec<(u32, Result<Option<WorkerResult>>)>,
        g: &HetGraph,
    ) -> Result<Model> {
        let timeouts = Timeouts::default();
        let mut states: Vec<Option<FinalState>> = (0..self.workers()).map(|_| None).collect();
        for (w, r) in local {
            let r = r?.ok_or_else(|| {
                TrainError::PeerLost(
                    "a worker of the coordinator's process did not finish its last attempt".into(),
                )
            })?;
            states[w as usize] = Some(final_state(&r)?);
        }
        for (w, s) in states.iter_mut().enumerate() {
            if s.is_none() {
                *s = Some(gather_final(inbox, w as u32, timeouts)?);
            }
        }
        assemble(
            &self.cfg,
            g,
            &states.into_iter().flatten().collect::<Vec<_>>(),
        )
    }
}

use models::Model;

/// Which node runs which worker: worker 0 (the reducer's partition) where
/// `[placement]` puts `reducer`, else on the first node; the others in node order.
pub fn raf_placement(topology: &mut Topology) -> Vec<String> {
    let ids: Vec<String> = topology
        .cluster
        .nodes
        .iter()
        .map(|n| n.id.clone())
        .collect();
    let first = topology
        .placed(names::REDUCER)
        .map(str::to_string)
        .filter(|r| ids.contains(r))
        .unwrap_or_else(|| ids.first().cloned().unwrap_or_default());
    let order: Vec<String> = std::iter::once(first.clone())
        .chain(ids.into_iter().filter(|i| *i != first))
        .collect();
    for (w, id) in order.iter().enumerate() {
        topology
            .placement
            .insert(names::worker(w as u32), id.clone());
    }
    topology
        .placement
        .insert(names::REDUCER.to_string(), first.clone());
    topology.placement.insert(
        crate::distributed::names::COORDINATOR.to_string(),
        first.clone(),
    );
    topology.placement.insert(names::FINAL.to_string(), first);
    order
}
