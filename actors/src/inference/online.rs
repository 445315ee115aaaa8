//! Online inference across partitions (`hetgnn serve --partitions`): each
//! node holds one partition and runs its sampler and feature stores, the
//! owner-compute actors training uses (learnable rows from the checkpoint,
//! frozen), and a request's sampled neighbourhood is drawn and read through
//! them: the owners of remote frontier nodes draw their picks with the same
//! keys, and remote input rows are pulled. A node's answer is therefore the
//! one single-process sampled inference (`predict`) gives, whichever node
//! answers it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use graphs::partition::PartitionSet;
use graphs::{HetGraph, MiniBatch};
use models::rgcn::PerType;
use models::Model;
use runtime::{Node, Topology};

use crate::config::TrainingConfig;
use crate::distributed::inbox::Inbox;
use crate::distributed::{System, Timeouts};
use crate::epoch::{SamplingPlan, INFERENCE_STEP};
use crate::error::{Result, TrainError};
use crate::owner::client::{Client, ClientSetup, Rows};
use crate::owner::{self, Served, StartRows};
use crate::pretrained::{Inference, Pretrained};

/// The name a serving node's requests go under.
fn reader(k: u32) -> String {
    format!("serve/{k}")
}

/// What a serving node is started with.
pub struct OnlineSetup<'a> {
    /// The checkpoint found (fanouts, seed, epochs trained).
    pub source: &'a Pretrained,
    /// Its model, with its learnable rows.
    pub model: &'a Inference,
    /// The partitions.
    pub set: &'a PartitionSet,
    /// One node of a topology and its id (the k-th node of `cluster.nodes`
    /// serves partition k), or `None`: every partition in this process.
    pub node: Option<(Topology, &'a str)>,
    /// Longest wait for one answer of another partition (a request
    /// touching a partition whose node is down fails after it).
    pub ask: Duration,
    /// The partition directory to load a down node's partition from and
    /// serve it here instead (`None`: requests that need it fail until the
    /// node is back).
    pub take_over: Option<&'a Path>,
}

/// A serving node's partition, its owner actors, and the client its
/// inference reads neighbourhoods through.
pub struct Online {
    client: Client,
    plan: SamplingPlan,
    epoch: u64,
    part: u32,
    /// Serving other partitions when their nodes are down, if asked to.
    take_over: Option<TakeOver>,
    /// Kept running while the client asks through it (dropped after it).
    _system: System,
}

/// What taking over a down node's partition needs.
struct TakeOver {
    /// The partition directory.
    dir: PathBuf,
    /// The checkpoint (its learnable rows are read again for the partition).
    source: Pretrained,
    /// The owner actors' settings.
    t: TrainingConfig,
    /// The node the partition's actors are registered on.
    node: Node,
    /// A thread of the node's actor system to start them from.
    spawner: actix::ArbiterHandle,
    /// Partitions served here for their down nodes (shared with the client's
    /// predicate, which then asks them again: here).
    taken: Arc<Mutex<BTreeSet<u32>>>,
    /// The threads their actors run on.
    arbiters: Mutex<Vec<actix::Arbiter>>,
}

impl Online {
    /// Starts serving `graph`, this node's partition (partition 0 when every
    /// partition runs here), loaded as the model was trained; waits for the
    /// other nodes up to the topology's start timeout, and goes on without
    /// the missing ones (requests that touch their partitions fail until they are up).
    pub fn start(s: OnlineSetup, graph: Arc<HetGraph>) -> Result<Online> {
        let parts = s.set.manifest.parts as u32;
        let owners = Arc::new(s.set.owners.clone());
        let t = training_of(s.source);
        let model = &s.model.model;
        let (part, node) = match s.node {
            Some((mut topology, id)) => {
                let k = super::partition_of(&topology, id, parts)?;
                owner::place_one_per_node(
                    &mut topology,
                    parts,
                    &s.set.manifest.node_types,
                    reader,
                    "serve",
                )?;
                (k, Some((topology, id.to_string())))
            }
            None => (0, None),
        };
        // The node of each partition (the k-th of cluster.nodes holds partition k).
        let ids: Vec<String> = node.as_ref().map_or_else(Vec::new, |(t, _)| {
            t.cluster.nodes.iter().map(|n| n.id.clone()).collect()
        });
        // Every partition served here: its graph and its learnable rows.
        let mut served: Vec<(u32, Arc<HetGraph>, Learnt)> = Vec::new();
        let here: Vec<u32> = match node {
            Some(_) => vec![part],
            None => (0..parts).collect(),
        };
        for k in here {
            let g = match k == part {
                true => graph.clone(),
                false => Arc::new(s.set.load_part(
                    k as usize,
                    &graphs::LoadOptions {
                        mmap_features: true,
                        reverse_edges: s.source.reverse_edges,
                    },
                )?),
            };
            let learnt = Learnt::of(s.model, &g, &owners, k)?;
            served.push((k, g, learnt));
        }
        let (tc, owners_c) = (t.clone(), owners.clone());
        let (system, spawner) = System::start(move || async move {
            let (node, topology) = match node {
                Some((topology, id)) => (Node::start(topology.clone(), &id).await?, Some(topology)),
                None => (Node::embedded("local").map_err(TrainError::internal)?, None),
            };
            let mut arbiters = Vec::new();
            for (k, g, learnt) in &served {
                let start: &dyn StartRows = learnt;
                owner::serve(
                    &node,
                    Served {
                        part: *k,
                        graph: g,
                        owners: &owners_c,
                        steps: None,
                        pushers: 1,
                        start: Some(start),
                    },
                    &tc,
                    &mut arbiters,
                )?;
            }
            if let Some(topology) = topology {
                let wait = Duration::from_millis(topology.cluster.start_timeout_ms);
                if let Err(e) =
                    crate::distributed::peers::wait_for_peers(&node, &topology, wait).await
                {
                    tracing::warn!("serving without every partition for now: {e}");
                }
            }
            // A thread inside the actor system, from which a down node's
            // partition is started here when it is taken over.
            let spare = actix::Arbiter::new();
            let spawner = spare.handle();
            arbiters.push(spare);
            Ok((node, arbiters, spawner))
        })?;
        let me = reader(part);
        let mut client = Client::new(ClientSetup {
            part,
            parts,
            graph,
            owners,
            cfg: &t,
            model,
            gen: 0,
            timeouts: Timeouts {
                ask: s.ask,
                step: s.ask,
                ..Timeouts::default()
            },
            inbox: Arc::new(Inbox::default()),
            handle: system.handle.clone(),
            node: &system.node,
            me: &me,
        })?;
        let taken: Arc<Mutex<BTreeSet<u32>>> = Arc::default();
        if !ids.is_empty() {
            // A partition whose node the failure detector holds down is not
            // asked (unless it is served here now): requests that need it are
            // answered 503 at once, and the inference thread goes on with the others.
            let node = system.node.clone();
            let here = taken.clone();
            client.down = Some(Arc::new(move |p: u32| {
                let Some(id) = ids.get(p as usize) else {
                    return false;
                };
                if here.lock().is_ok_and(|h| h.contains(&p)) {
                    return false;
                }
                node.members()
                    .iter()
                    .any(|m| &m.id == id && m.state == runtime::PeerState::Down)
            }));
        }
        let take_over = s.take_over.map(|dir| TakeOver {
            dir: dir.to_path_buf(),
            source: s.source.clone(),
            t: t.clone(),
            node: system.node.clone(),
            spawner,
            taken,
            arbiters: Mutex::default(),
        });
        Ok(Online {
            client,
            plan: SamplingPlan::new(&s.source.fanouts, s.source.spec.seed),
            epoch: s.source.epochs_done,
            part,
            take_over,
            _system: system,
        })
    }

    /// The partition this node serves.
    pub fn part(&self) -> u32 {
        self.part
    }

    /// The sampled blocks of target nodes `nodes` (distinct, any owner),
    /// drawn as single-process sampled inference draws them, and their
    /// input rows (features and learnable rows, local or pulled).
    /// With take-over, a partition whose node is down is loaded and served
    /// here first (once), and the request drawn again: the same answer, later.
    pub fn neighbourhoods(&self, nodes: &[u32]) -> Result<(MiniBatch, PerType)> {
        let draw = || -> Result<(MiniBatch, PerType)> {
            let mb =
                self.client
                    .sample(self.plan.eval_seed(), self.epoch, INFERENCE_STEP, nodes)?;
            let inputs = self.client.gather(&mb.blocks[0].src, Rows::All, None)?;
            Ok((mb, inputs))
        };
        match (draw(), &self.take_over, &self.client.down) {
            (Err(e), Some(over), Some(down)) if e.is_recoverable() => {
                let lost: Vec<u32> = (0..self.client.parts).filter(|&p| down(p)).collect();
                if lost.is_empty() {
                    return Err(e);
                }
                for p in lost {
                    // A take-over that cannot be done (the partition's files
                    // unreadable here, say) leaves the request to be retried.
                    over.serve(p, &self.client.owners).map_err(|e| {
                        TrainError::PeerLost(format!(
                            "partition {p}'s node is down and serving its partition here failed: {e}"
                        ))
                    })?;
                }
                draw()
            }
            (r, _, _) => r,
        }
    }

    /// Partitions this node serves for their down nodes.
    pub fn taken_over(&self) -> Vec<u32> {
        self.take_over
            .as_ref()
            .and_then(|o| o.taken.lock().ok().map(|t| t.iter().copied().collect()))
            .unwrap_or_default()
    }

    /// Partitions in all.
    pub fn parts(&self) -> u32 {
        self.client.parts
    }

    /// Input rows pulled from other partitions so far.
    pub fn remote_rows(&self) -> u64 {
        self.client
            .remote_rows
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl TakeOver {
    /// Loads partition `p` (whose node is down) and registers its sampler
    /// and stores on this node, where the client's asks for it now go.
    fn serve(&self, p: u32, owners: &Arc<Vec<Vec<u16>>>) -> Result<()> {
        tracing::warn!("partition {p}'s node is down: serving its partition here");
        let set = PartitionSet::open(&self.dir)?;
        let g = Arc::new(set.load_part(
            p as usize,
            &graphs::LoadOptions {
                mmap_features: true,
                reverse_edges: self.source.reverse_edges,
            },
        )?);
        let model = self
            .source
            .for_inference(&g, set.manifest.graph_sha256.as_deref())?;
        let learnt = Learnt::of(&model, &g, owners, p)?;
        let (node, owners, t) = (self.node.clone(), owners.clone(), self.t.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let started = self.spawner.spawn_fn(move || {
            let mut arbiters = Vec::new();
            let r = owner::serve(
                &node,
                Served {
                    part: p,
                    graph: &g,
                    owners: &owners,
                    steps: None,
                    pushers: 1,
                    start: Some(&learnt),
                },
                &t,
                &mut arbiters,
            );
            let _ = tx.send(r.map(|()| arbiters));
        });
        if !started {
            return Err(TrainError::Internal(
                "the actor system stopped before a partition could be taken over".into(),
            ));
        }
        let arbiters = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| TrainError::Internal("taking over a partition did not finish".into()))??;
        self.arbiters
            .lock()
            .map_err(|_| TrainError::internal("a take-over panicked"))?
            .extend(arbiters);
        self.taken
            .lock()
            .map_err(|_| TrainError::internal("a take-over panicked"))?
            .insert(p);
        Ok(())
    }
}

/// The training settings a checkpoint's owner actors and client read.
fn training_of(src: &Pretrained) -> TrainingConfig {
    TrainingConfig {
        model: src.spec.kind,
        seed: src.spec.seed,
        embed_dim: src.spec.embed_dim,
        fanouts: src.fanouts.clone(),
        ..TrainingConfig::default()
    }
}

/// A partition's learnable rows as the checkpoint holds them, per type,
/// with the owned nodes they belong to.
struct Learnt(BTreeMap<usize, (Vec<u32>, Vec<f32>)>);

impl Learnt {
    /// Partition `k`'s rows of every learnable type of `model` on `g`.
    fn of(model: &Inference, g: &HetGraph, owners: &[Vec<u16>], k: u32) -> Result<Learnt> {
        let mut rows = BTreeMap::new();
        let learnable = Model::learnable_types(model.model.spec().kind, g);
        for (ty, nt) in g.node_types().iter().enumerate() {
            if !learnable[ty] || nt.features.is_some() {
                continue;
            }
            let owned: Vec<u32> = (0..nt.count)
                .filter(|&v| u32::from(owners[ty][v as usize]) == k)
                .collect();
            if let Some(x) = model.inputs(g, ty, &owned)? {
                let x = x.to_dtype(candle_core::DType::F32)?.flatten_all()?;
                rows.insert(ty, (owned, x.to_vec1::<f32>()?));
            }
        }
        Ok(Learnt(rows))
    }
}

impl StartRows for Learnt {
    fn rows(&self, ty: usize, ids: &[u32]) -> Result<Option<Vec<f32>>> {
        match self.0.get(&ty) {
            Some((owned, rows)) if owned.as_slice() == ids => Ok(Some(rows.clone())),
            Some(_) => Err(TrainError::Internal(format!(
                "the store of type {ty} asked for other rows than its partition owns"
            ))),
            None => Ok(None),
        }
    }

    fn frozen(&self, _: usize) -> bool {
        true
    }
}
