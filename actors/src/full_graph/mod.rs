//! Full-graph training with bounded staleness (SANCUS). No sampling: each
//! worker owns a block of rows of every node type (a block-row partition,
//! or any partition by owner) with the full in-neighbourhoods of its rows,
//! and computes every layer for its rows. Before each layer the workers
//! broadcast their blocks of the types that layer reads across relations;
//! a worker may skip a broadcast while its receivers' cached copy is fresh
//! enough ([`staleness`]). In the backward pass each worker sends every
//! other worker the gradient of that worker's block, and the dense
//! gradients are all-reduced once per epoch (one step per epoch). Learnable
//! rows stay in their owners' feature stores (shared with the owner-compute
//! modes), which apply the pushed gradient rows. With `staleness = "none"`
//! the result is the single-worker run's.

pub mod blocks;
mod config;
pub mod figures;
pub mod messages;
pub mod staleness;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;

use actix::Actor;
use graphs::partition::PartitionSet;
use graphs::HetGraph;
use models::Model;
use runtime::{Node, Topology};

use crate::config::TrainingConfig;
use crate::distributed::checkpoint::{self, Manifest};
use crate::distributed::inbox::{Inbox, InboxActor};
use crate::distributed::messages::{Abort, Begin, Finish, GradShare};
use crate::distributed::{load_options, Distributed, Part, System};
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;
use crate::owner::worker::{run_thread, WorkerSetup};
use blocks::Layout;
use messages::{Broadcast, EvalBroadcast, GradBlock};

/// Full-graph training's rules: its figures (`full`).
pub const RULES: crate::modes::seam::Rules = crate::modes::seam::Rules {
    own_steps: false,
    partial_params: false,
    figures: figures::merge,
};

pub use config::{FullGraphConfig, Staleness, MAX_STALE_EPOCHS};

/// Actor names of full-graph training.
pub mod names {
    pub use crate::distributed::names::COORDINATOR;
    pub use crate::owner::names::{sampler, store};

    /// Worker (its inbox) of partition `p`.
    pub fn worker(p: u32) -> String {
        format!("full/{p}")
    }
}

/// Most layers a full-graph model may have (the inbox rounds name them).
pub const MAX_LAYERS: usize = 255;

/// A full-graph run: its partitions and settings.
pub struct FullGraph {
    set: PartitionSet,
    parts: u32,
    cfg: TrainingConfig,
    full: FullGraphConfig,
    owners: Arc<Vec<Vec<u16>>>,
    /// What a fine-tuned run starts from, read once in this process.
    start: crate::pretrained::init::SharedStart,
    layout: Arc<Layout>,
}

impl FullGraph {
    /// The run `t` describes: its partitions must exist.
    pub fn open(t: &TrainingConfig) -> Result<FullGraph> {
        let dir =
            t.partitions.as_ref().ok_or_else(|| TrainError::Config("training.partitions: full-graph training needs a partition directory (hetgnn partition --method block-row --out DIR)".into()))?;
        if t.layers > MAX_LAYERS {
            return Err(TrainError::Config(format!(
                "training.layers: full-graph training runs at most {MAX_LAYERS} layers"
            )));
        }
        let set = PartitionSet::open_for(dir, t.data.as_deref())?;
        if set.manifest.node_types.len() > messages::MAX_TYPES {
            return Err(TrainError::Config(format!(
                "full-graph training handles at most {} node types",
                messages::MAX_TYPES
            )));
        }
        let parts = set.manifest.parts as u32;
        let owners = Arc::new(set.owners.clone());
        let layout = Arc::new(Layout::new(&owners, parts)?);
        Ok(FullGraph {
            set,
            parts,
            cfg: t.clone(),
            full: FullGraphConfig::of(t)?,
            owners,
            layout,
            start: Default::default(),
        })
    }
}

impl FullGraph {
    /// The parameters a fine-tuned run starts from (`training.init_from`),
    /// read on first use with partition graph `g` (every partition has every id).
    fn start(&self, g: &HetGraph) -> Result<Option<Arc<crate::pretrained::init::Start>>> {
        let content = self.set.manifest.graph_sha256.as_deref();
        self.start.get(&self.cfg, g, content)
    }
}

impl Distributed for FullGraph {
    /// The worker's final replica.
    type Outcome = Model;

    fn name(&self) -> &'static str {
        "full-graph"
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
        self.parts
    }

    fn leader(&self, part: u32) -> String {
        names::worker(part)
    }

    fn members(&self, part: u32) -> Vec<String> {
        vec![names::worker(part)]
    }

    /// Partition k's actors run on the k-th node (which loads partition k);
    /// the coordinator where `[placement]` puts it, else on the first node.
    fn place(&self, topology: &mut Topology) -> Result<Vec<String>> {
        crate::owner::place_one_per_node(
            topology,
            self.parts,
            &self.set.manifest.node_types,
            names::worker,
            "full-graph training",
        )
    }

    fn load(&self, part: u32) -> Result<HetGraph> {
        Ok(self
            .set
            .load_part(part as usize, &load_options(&self.cfg))?)
    }

    /// One step per epoch: the whole graph.
    fn steps_per_epoch(&self, _graph: &HetGraph, _t: &TrainingConfig) -> u64 {
        1
    }

    /// Its partitioning and staleness settings too.
    fn owned_rows(&self, part: u32) -> Option<Vec<u64>> {
        Some(crate::owner::owned_counts(&self.owners, part))
    }

    fn fingerprint(&self, g: &HetGraph) -> String {
        let (t, m) = (&self.cfg, &self.set.manifest);
        let full = &self.full;
        let layout = format!(
            "full-graph|{:?}|{}|{:?}|{:?}|{}|{}|{}",
            t.allreduce,
            m.parts,
            m.method,
            full.staleness,
            full.staleness_epochs,
            full.staleness_variation,
            full.skip_gradients
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
        part: u32,
        graph: &Arc<HetGraph>,
        arbiters: &mut Vec<actix::Arbiter>,
    ) -> Result<Vec<Arc<Inbox>>> {
        let start = self.start(graph)?;
        crate::owner::serve(
            node,
            crate::owner::Served {
                part,
                graph,
                owners: &self.owners,
                steps: None,
                pushers: self.parts,
                start: start.as_deref().map(|s| s as &dyn crate::owner::StartRows),
            },
            &self.cfg,
            arbiters,
        )?;
        let inbox = Arc::new(Inbox::default());
        let addr = InboxActor(inbox.clone()).start();
        node.register(&names::worker(part), &addr)
            .map_err(|e| TrainError::Internal(e.to_string()))?
            .handle::<GradShare>()
            .handle::<Broadcast>()
            .handle::<EvalBroadcast>()
            .handle::<GradBlock>()
            .handle::<Abort>()
            .handle::<Finish>()
            .handle::<Begin>();
        Ok(vec![inbox])
    }

    /// The partition's stores restore the checkpoint, its worker trains.
    fn attempt(
        &self,
        p: &Part,
        b: Begin,
        _run: &str,
        from: Option<(PathBuf, Manifest)>,
    ) -> Result<Model> {
        crate::owner::reset_stores(p, &self.cfg, b)?;
        let setup = WorkerSetup::new(
            p,
            self.parts,
            &self.cfg,
            &self.owners,
            &b,
            (from, self.start(p.graph)?),
            names::worker,
        )?;
        let layout = self.layout.clone();
        run_thread(format!("full-worker-{}", p.part), setup, move |s| {
            worker::train(s, &layout)
        })
    }

    /// The coordinator's own worker's replica (every replica is the same)
    /// and the learnable tables from the stores.
    fn assemble(
        &self,
        system: &System,
        _inbox: &Inbox,
        local: Vec<(u32, Result<Option<Model>>)>,
        g: &HetGraph,
    ) -> Result<Model> {
        let (_, own) = local
            .into_iter()
            .next()
            .ok_or_else(|| TrainError::Internal("no partition".into()))?;
        let replica = own?.ok_or_else(|| {
            TrainError::PeerLost(
                "the coordinator's own partition did not finish its last attempt".into(),
            )
        })?;
        crate::owner::assemble(&self.cfg, system, self.parts, &replica, g)
    }
}
