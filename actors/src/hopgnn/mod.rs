//! HopGNN: feature-centric training. One worker per partition, with the
//! partition's sampler and feature stores (owner-compute, as data-parallel
//! training has them). Each step the global batch is cut into one slice per
//! model (the model-centric assignment); each model's roots are grouped by
//! the partition holding them, and the models visit the workers in time
//! steps, training at each the micrographs of their roots homed there and
//! carrying their accumulated gradient (and parameters) to the next. One
//! all-reduce of the models' gradients and one optimiser step end the step.
//! Every worker holds the same parameters within a step, so the result is
//! the single-process model whatever the time steps.

mod config;
pub mod examine;
pub mod figures;
pub mod messages;
pub mod schedule;
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
use messages::Migrate;

/// HopGNN's rules: its figures (`hop`).
pub const RULES: crate::modes::seam::Rules = crate::modes::seam::Rules {
    own_steps: false,
    partial_params: false,
    figures: figures::merge,
};

pub use config::{HopConfig, HopMigrate, HopTimeSteps};

/// Actor names of HopGNN training.
pub mod names {
    pub use crate::distributed::names::COORDINATOR;
    pub use crate::owner::names::{sampler, store};

    /// Worker (its inbox) of partition `p`.
    pub fn worker(p: u32) -> String {
        format!("hop/{p}")
    }
}

/// A HopGNN run: its partitions and settings.
pub struct HopGnn {
    set: PartitionSet,
    parts: u32,
    cfg: TrainingConfig,
    hop: HopConfig,
    owners: Arc<Vec<Vec<u16>>>,
    /// What a fine-tuned run starts from, read once in this process.
    start: crate::pretrained::init::SharedStart,
}

impl HopGnn {
    /// The run `t` describes: its partitions must exist.
    pub fn open(t: &TrainingConfig) -> Result<HopGnn> {
        let dir = t.partitions.as_ref().ok_or_else(|| TrainError::Config("training.partitions: hopgnn training needs a partition directory (hetgnn partition --out DIR)".into()))?;
        let set = PartitionSet::open_for(dir, t.data.as_deref())?;
        let parts = set.manifest.parts as u32;
        let owners = Arc::new(set.owners.clone());
        Ok(HopGnn {
            set,
            parts,
            cfg: t.clone(),
            hop: HopConfig::of(t)?,
            owners,
            start: Default::default(),
        })
    }
}

impl HopGnn {
    /// The parameters a fine-tuned run starts from (`training.init_from`),
    /// read on first use with partition graph `g` (every partition has every id).
    fn start(&self, g: &HetGraph) -> Result<Option<Arc<crate::pretrained::init::Start>>> {
        let content = self.set.manifest.graph_sha256.as_deref();
        self.start.get(&self.cfg, g, content)
    }
}

impl Distributed for HopGnn {
    /// The worker's final replica.
    type Outcome = Model;

    fn name(&self) -> &'static str {
        "hopgnn"
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
            "hopgnn",
        )
    }

    fn load(&self, part: u32) -> Result<HetGraph> {
        Ok(self
            .set
            .load_part(part as usize, &load_options(&self.cfg))?)
    }

    /// Its partitioning and how models migrate and merge too.
    fn owned_rows(&self, part: u32) -> Option<Vec<u64>> {
        Some(crate::owner::owned_counts(&self.owners, part))
    }

    fn fingerprint(&self, g: &HetGraph) -> String {
        let (t, m) = (&self.cfg, &self.set.manifest);
        let layout = format!(
            "hopgnn|{:?}|{}|{:?}|{:?}|{:?}|{}",
            t.allreduce,
            m.parts,
            m.method,
            self.hop.migrate,
            self.hop.time_steps,
            self.hop.pregather
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
            .handle::<Migrate>()
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
        run_thread(format!("hop-worker-{}", p.part), setup, worker::train)
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
