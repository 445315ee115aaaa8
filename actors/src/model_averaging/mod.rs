//! Model-averaging training (CATGNN): one worker per node, each training
//! local models on its own partitions (their 1-hop halo included: written
//! with `--halo-features`) with its own Adam state and nothing fetched from
//! elsewhere, and every `sync_every` epochs all models averaged, weighted
//! by their training nodes (`average`). With more partitions than
//! workers, partition `p` is worker `p % workers`'s, and a worker trains its
//! partitions in turn. The generations, the coordinator and checkpoints are
//! `crate::distributed`'s; checkpoints come at the ends of rounds.

mod average;
mod config;
pub mod figures;
mod final_rows;
pub mod local;
pub mod messages;
mod worker;

/// Model averaging's rules: each worker steps on its own partitions; its figures (`workers`, `averaging_bytes`).
pub const RULES: crate::modes::seam::Rules = crate::modes::seam::Rules {
    own_steps: true,
    partial_params: false,
    figures: figures::merge,
};

pub use average::weighted_mean;
pub use config::{AveragingConfig, LocalBatch};

use std::path::PathBuf;
use std::sync::Arc;

use actix::Actor;
use candle_core::{DType, Device, Tensor};
use graphs::partition::PartitionSet;
use graphs::HetGraph;
use models::Model;
use runtime::{Node, Topology};

use crate::config::TrainingConfig;
use crate::distributed::checkpoint::{self, Manifest};
use crate::distributed::generations::join_threads;
use crate::distributed::inbox::{Inbox, InboxActor};
use crate::distributed::messages::{Abort, Begin, Finish};
use crate::distributed::{load_options, Distributed, Part, System, Timeouts};
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;
use local::Local;
use messages::Average;

/// Actor names of model-averaging training.
pub mod names {
    pub use crate::distributed::names::COORDINATOR;

    /// Where workers send their final rows (the coordinator's inbox).
    pub const FINAL: &str = "coordinator/final-rows";
    /// Worker `w` (its inbox).
    pub fn worker(w: u32) -> String {
        format!("averaging/{w}")
    }
}

/// A model-averaging run: its partitions and workers.
pub struct ModelAveraging {
    set: PartitionSet,
    parts: u32,
    workers: u32,
    cfg: TrainingConfig,
    avg: AveragingConfig,
    owners: Arc<Vec<Vec<u16>>>,
    /// Partitions loaded so far (a worker's second and later ones, kept across attempts).
    graphs: dashmap::DashMap<u32, Arc<HetGraph>>,
    /// What a fine-tuned run starts from, read once in this process.
    start: crate::pretrained::init::SharedStart,
}

impl ModelAveraging {
    /// The run `t` describes, on `nodes` nodes if it has a cluster: its
    /// partitions must exist and hold their halo's features.
    pub fn open(t: &TrainingConfig, nodes: Option<usize>) -> Result<ModelAveraging> {
        let dir = t.partitions.as_ref().ok_or_else(|| TrainError::Config("training.partitions: model averaging needs a partition directory (hetgnn partition --halo-features --out DIR)".into()))?;
        let set = PartitionSet::open_for(dir, t.data.as_deref())?;
        let parts = set.manifest.parts as u32;
        if parts > 1 && !set.manifest.halo_features {
            return Err(TrainError::Config(format!("training.partitions: {} holds no halo feature rows; model averaging trains on local data only (hetgnn partition --halo-features)", dir.display())));
        }
        let avg = AveragingConfig::of(t)?;
        // By default one worker per node of the cluster, or per partition in one process.
        let workers = match (avg.workers, nodes) {
            (0, Some(n)) => n as u32,
            (0, None) => parts,
            (w, _) => w,
        };
        if workers > parts {
            return Err(TrainError::Config(format!(
                "{workers} workers but {} holds {parts} partitions; each worker needs at least one (training.model-averaging.workers = {workers}; a cluster has one per node)",
                dir.display()
            )));
        }
        let owners = Arc::new(set.owners.clone());
        Ok(ModelAveraging {
            set,
            parts,
            workers,
            cfg: t.clone(),
            avg,
            owners,
            graphs: dashmap::DashMap::new(),
            start: Default::default(),
        })
    }

    /// Partition `p`'s graph, loaded once.
    fn graph(&self, p: u32) -> Result<Arc<HetGraph>> {
        if let Some(g) = self.graphs.get(&p) {
            return Ok(g.clone());
        }
        let g = Arc::new(self.set.load_part(p as usize, &load_options(&self.cfg))?);
        self.graphs.insert(p, g.clone());
        Ok(g)
    }

    /// Worker `w`'s partitions.
    fn parts_of(&self, w: u32) -> impl Iterator<Item = u32> {
        (w..self.parts).step_by(self.workers as usize)
    }
}

impl Distributed for ModelAveraging {
    /// The worker's partitions.
    type Outcome = Vec<Local>;

    fn name(&self) -> &'static str {
        "model-averaging"
    }

    fn graph_sha256(&self) -> Option<String> {
        self.set.manifest.graph_sha256.clone()
    }

    fn rules(&self) -> &'static crate::modes::seam::Rules {
        &RULES
    }

    /// A worker is a "partition" of the shared machinery: one per node.
    #[allow(clippy::misnamed_getters)]
    fn parts(&self) -> u32 {
        self.workers
    }

    fn trainers(&self) -> u32 {
        self.workers
    }

    /// A round ends when the slowest worker's local epochs do: the others,
    /// and the coordinator, wait as long as a node may take to finish.
    fn timeouts(&self, t: Timeouts) -> Timeouts {
        Timeouts {
            step: t.step.max(t.finish),
            ..t
        }
    }

    fn leader(&self, w: u32) -> String {
        names::worker(w)
    }

    fn members(&self, w: u32) -> Vec<String> {
        vec![names::worker(w)]
    }

    /// Worker k runs on the k-th node; the coordinator where `[placement]`
    /// puts it, else on the first node.
    fn place(&self, topology: &mut Topology) -> Result<Vec<String>> {
        let ids: Vec<String> = topology
            .cluster
            .nodes
            .iter()
            .map(|n| n.id.clone())
            .collect();
        if ids.len() != self.workers as usize {
            return Err(TrainError::Config(format!(
                "training.workers: {} workers for {} nodes; model averaging runs one worker per node (set training.model-averaging.workers = {} or leave it 0)",
                self.workers,
                ids.len(),
                ids.len()
            )));
        }
        for (w, id) in ids.iter().enumerate() {
            topology
                .placement
                .insert(names::worker(w as u32), id.clone());
        }
        let coordinator = topology
            .placed(names::COORDINATOR)
            .map(str::to_string)
            .filter(|c| ids.contains(c))
            .unwrap_or_else(|| ids[0].clone());
        topology
            .placement
            .insert(names::COORDINATOR.to_string(), coordinator.clone());
        topology
            .placement
            .insert(names::FINAL.to_string(), coordinator);
        Ok(ids)
    }

    /// Worker `w`'s first partition (its others load when it trains).
    fn load(&self, w: u32) -> Result<HetGraph> {
        Ok(self.set.load_part(w as usize, &load_options(&self.cfg))?)
    }

    /// Its partitioning (owners included), workers and rounds too.
    /// Workers train on their partitions' own rows (halo included).
    fn rows_in_transit(&self) -> u128 {
        0
    }

    fn fingerprint(&self, g: &HetGraph) -> String {
        let (t, m) = (&self.cfg, &self.set.manifest);
        let layout = format!(
            "model-averaging|{}|{}|{}|{:?}|{:?}",
            m.parts, self.workers, self.avg.sync_every, self.avg.local_batch, m.method
        );
        let mut extra: Vec<&[u8]> = vec![layout.as_bytes()];
        extra.extend(
            self.owners
                .iter()
                .map(|o| bytemuck::cast_slice::<u16, u8>(o)),
        );
        checkpoint::fingerprint(t, g.name(), &extra)
    }

    fn serve(
        &self,
        node: &Node,
        w: u32,
        graph: &Arc<HetGraph>,
        _arbiters: &mut Vec<actix::Arbiter>,
    ) -> Result<Vec<Arc<Inbox>>> {
        self.graphs.entry(w).or_insert_with(|| graph.clone());
        let inbox = Arc::new(Inbox::default());
        let addr = InboxActor(inbox.clone()).start();
        node.register(&names::worker(w), &addr)
            .map_err(|e| TrainError::Internal(e.to_string()))?
            .handle::<Average>()
            .handle::<Abort>()
            .handle::<Finish>()
            .handle::<Begin>();
        Ok(vec![inbox])
    }

    /// The coordinator also takes the workers' final rows.
    fn serve_coordinator(&self, node: &Node, inbox: &Arc<Inbox>) -> Result<()> {
        let addr = InboxActor(inbox.clone()).start();
        node.register(names::FINAL, &addr)
            .map_err(|e| TrainError::Internal(e.to_string()))?
            .handle::<Average>();
        Ok(())
    }

    fn attempt(
        &self,
        p: &Part,
        b: Begin,
        _run: &str,
        from: Option<(PathBuf, Manifest)>,
    ) -> Result<Vec<Local>> {
        let parts = self
            .parts_of(p.part)
            .map(|k| Ok((k, self.graph(k)?)))
            .collect::<Result<Vec<_>>>()?;
        // Every partition has every id: the first one reads the start.
        let content = self.set.manifest.graph_sha256.as_deref();
        let start = match parts.first() {
            Some((_, g)) => self.start.get(&self.cfg, g, content)?,
            None => None,
        };
        let setup = worker::WorkerSetup {
            worker: p.part,
            workers: self.workers,
            parts,
            owners: self.owners.clone(),
            cfg: self.cfg.clone(),
            avg: self.avg,
            node: p.node.clone(),
            handle: p.handle.clone(),
            inbox: p.inboxes[0].clone(),
            timeouts: p.timeouts,
            from,
            gen: b.gen,
            start,
        };
        let h = std::thread::Builder::new()
            .name(format!("averaging-{}", p.part))
            .spawn(move || worker::run(setup))
            .map_err(|e| TrainError::Internal(format!("cannot start a worker thread: {e}")))?;
        Ok(join_threads(vec![h])?.swap_remove(0))
    }

    /// Each finished attempt's owned rows go to the coordinator, which keeps the last.
    fn after_attempt(&self, p: &Part, gen: u64, locals: &Vec<Local>) -> Result<()> {
        final_rows::send(p, gen, locals, &self.owners)
    }

    /// The averaged dense parameters (every partition holds them after the
    /// last round) and each row from its owner.
    fn assemble(
        &self,
        _system: &System,
        inbox: &Inbox,
        local: Vec<(u32, Result<Option<Vec<Local>>>)>,
        g: &HetGraph,
    ) -> Result<Model> {
        let mut model = Model::new(&self.cfg.model_spec(), g, DType::F32, &Device::Cpu)?;
        let mut dense = None;
        let mut rows = Vec::new();
        let mut have = vec![false; self.workers as usize];
        for (w, r) in local {
            let locals = r?.ok_or_else(|| {
                TrainError::PeerLost(format!(
                    "worker {w} of the coordinator's process did not finish its last attempt"
                ))
            })?;
            if dense.is_none() {
                dense = locals.first().map(Local::params).transpose()?;
            }
            rows.extend(final_rows::owned(&locals, &self.owners));
            have[w as usize] = true;
        }
        for w in (0..self.workers).filter(|&w| !have[w as usize]) {
            rows.extend(final_rows::gather(inbox, w, Timeouts::default())?);
        }
        let dense = dense.ok_or_else(|| {
            TrainError::PeerLost("no worker's parameters reached the coordinator".into())
        })?;
        for ((name, var), v) in model.params.iter().zip(&dense) {
            if v.len() != var.elem_count() {
                return Err(TrainError::Protocol(format!(
                    "parameter {name}: {} values for {}",
                    v.len(),
                    var.elem_count()
                )));
            }
            var.set(&Tensor::from_slice(v, var.shape(), &Device::Cpu)?)?;
        }
        final_rows::fill(&mut model, rows)?;
        Ok(model)
    }
}
