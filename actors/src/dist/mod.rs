//! Data-parallel training (DistDGL / DistDGLv2) on the actor runtime: one
//! Sampler, one FeatureStore per node type and one Trainer per partition, and
//! a Coordinator that gathers each epoch's figures and writes the report.
//! Embedded (`hetgnn train` with `mode = "data-parallel"` and no `[cluster]`),
//! every partition's actors share one process and talk through local
//! mailboxes; with a `[cluster]`, partition k runs on the k-th node.

pub mod inbox;
pub mod messages;
pub mod sampler;
pub mod store;
pub mod trainer;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use futures_util::future::join_all;
use graphs::partition::PartitionSet;
use graphs::{HetGraph, LoadOptions};
use models::optim::AdamConfig;
use runtime::{Node, PeerState};

use crate::config::{Config, TrainingConfig};
use crate::error::{Result, TrainError};
use crate::report::{peak_rss_bytes, EpochReport, Report};
use crate::trainer::TrainObserver;
use inbox::{Inbox, InboxActor};
use messages::{Abort, EpochStats, Export, Finish, GradShare, Pull, Push, SampleReq, StepDone};
use sampler::SamplerActor;
use store::{FeatureStore, Shard, StoreData};

/// Actor names of data-parallel training.
pub mod names {
    /// The coordinator.
    pub const COORDINATOR: &str = "coordinator";
    /// Sampler of partition `p`.
    pub fn sampler(p: u32) -> String {
        format!("sampler/{p}")
    }
    /// Trainer (its inbox) of partition `p`.
    pub fn trainer(p: u32) -> String {
        format!("trainer/{p}")
    }
    /// FeatureStore of node type `ty` in partition `p` (the type name made a valid actor name).
    pub fn store(ty: &str, p: u32) -> String {
        let ty: String = ty.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c.to_ascii_lowercase() } else { '_' }).collect();
        format!("features/{ty}/{p}")
    }
}

/// Deadlines of the protocol: nothing waits forever.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// One request (sampling, pull, push, gradient share).
    pub ask: Duration,
    /// Waiting for the other trainers' gradients of a step.
    pub step: Duration,
    /// Waiting for every peer to be up at start.
    pub start: Duration,
    /// A non-coordinator node waiting for the end of the run after its last epoch.
    pub finish: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { ask: Duration::from_secs(60), step: Duration::from_secs(300), start: Duration::from_secs(30), finish: Duration::from_secs(600) }
    }
}

/// Registers partition `part`'s actors on `node` (inside its actix system)
/// and returns its trainers' inboxes (`per_part` of them).
/// The sampler and the stores each get a thread of their own (an actix
/// arbiter): serving a large pull must not hold up a push, a sampling request
/// or the transport, which stays on the node's thread.
#[allow(clippy::too_many_arguments)] // one partition's whole context
fn serve_partition(node: &Node, part: u32, parts: u32, per_part: u32, graph: Arc<HetGraph>, owners: Arc<Vec<Vec<u16>>>, t: &TrainingConfig, arbiters: &mut Vec<actix::Arbiter>) -> Result<Vec<Arc<Inbox>>> {
    let reg = |e: runtime::WireError| TrainError::Distributed(e.to_string());
    let on_own_thread = |arbiters: &mut Vec<actix::Arbiter>| {
        arbiters.push(actix::Arbiter::new());
        arbiters.last().map(actix::Arbiter::handle).expect("just pushed")
    };
    let sampler = SamplerActor::new(part as u16, graph.clone(), owners.clone());
    let addr = SamplerActor::start_in_arbiter(&on_own_thread(arbiters), move |_| sampler);
    node.register(&names::sampler(part), &addr).map_err(reg)?.handle::<SampleReq>();
    let learnable = models::Model::learnable_types(t.model, &graph);
    for (ty, nt) in graph.node_types().iter().enumerate() {
        let data = if nt.features.is_some() {
            StoreData::Features { graph: graph.clone(), ty }
        } else if learnable[ty] {
            let owned: Vec<u32> = (0..nt.count).filter(|&v| owners[ty][v as usize] as u32 == part).collect();
            let name = format!("embed.{}", nt.name);
            StoreData::Embeddings(Box::new(Shard::new(t.seed, &name, nt.count as usize, t.embed_dim, owned, AdamConfig::with_lr(t.lr), (parts * per_part) as usize)))
        } else {
            continue;
        };
        let store = FeatureStore::new(part as u16, owners.clone(), ty, data);
        let addr = FeatureStore::start_in_arbiter(&on_own_thread(arbiters), move |_| store);
        node.register(&names::store(&nt.name, part), &addr).map_err(reg)?.handle::<Pull>().handle::<Push>().handle::<Export>();
    }
    let mut inboxes = Vec::new();
    for j in 0..per_part {
        let inbox = Arc::new(Inbox::default());
        let addr = InboxActor(inbox.clone()).start();
        node.register(&names::trainer(part * per_part + j), &addr).map_err(reg)?.handle::<GradShare>().handle::<Abort>().handle::<Finish>();
        inboxes.push(inbox);
    }
    Ok(inboxes)
}

/// What every trainer thread of a run shares.
struct Shared {
    parts: u32,
    per_part: u32,
    cfg: TrainingConfig,
    owners: Arc<Vec<Vec<u16>>>,
    trainer_of: Arc<Vec<u16>>,
    timeouts: Timeouts,
}

/// Starts the trainer threads of partition `part`, one per inbox.
fn spawn_trainers(sh: &Shared, part: u32, graph: &Arc<HetGraph>, system: &System, inboxes: &[Arc<Inbox>]) -> Result<Vec<std::thread::JoinHandle<Result<models::Model>>>> {
    let mut handles = Vec::new();
    for (j, inbox) in inboxes.iter().enumerate() {
        let trainer = part * sh.per_part + j as u32;
        let setup = trainer::TrainerSetup {
            part,
            parts: sh.parts,
            trainer,
            trainers: sh.parts * sh.per_part,
            trainer_of: sh.trainer_of.clone(),
            cfg: sh.cfg.clone(),
            graph: graph.clone(),
            owners: sh.owners.clone(),
            node: system.node.clone(),
            handle: system.handle.clone(),
            inbox: inbox.clone(),
            timeouts: sh.timeouts,
        };
        let h = std::thread::Builder::new()
            .name(format!("trainer-{trainer}"))
            .spawn(move || trainer::run(setup))
            .map_err(|e| TrainError::Distributed(format!("cannot start a trainer thread: {e}")))?;
        handles.push(h);
    }
    Ok(handles)
}

/// Waits for training threads (trainers or RAF workers); the first error wins.
pub(crate) fn join_threads<T>(handles: Vec<std::thread::JoinHandle<Result<T>>>) -> Result<Vec<T>> {
    let mut out = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(TrainError::Distributed("a training thread panicked".into()));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// How long a failing thread tries to tell the others (best effort: a peer
/// that is down will not answer).
const ABORT_NOTICE: Duration = Duration::from_secs(1);

/// Tells the actors `targets` that `me` (numbered `from`) failed, best effort
/// (a peer that is down will not answer), so they stop instead of waiting.
pub(crate) fn abort_peers(node: &Node, handle: &tokio::runtime::Handle, me: &str, from: u32, targets: &[String], reason: &str) {
    let Ok(me) = runtime::ActorName::new(me) else { return };
    let asks = targets.iter().filter_map(|n| node.actor(n).ok()).map(|r| {
        let (r, reason) = (r.with_sender(me.clone()), reason.to_string());
        async move { r.ask(Abort { from, reason }, ABORT_NOTICE).await }
    });
    let _ = handle.block_on(join_all(asks));
}

/// Registers the coordinator's inbox on `node`.
pub(crate) fn serve_coordinator(node: &Node) -> Result<Arc<Inbox>> {
    let inbox = Arc::new(Inbox::default());
    let addr = InboxActor(inbox.clone()).start();
    node.register(names::COORDINATOR, &addr).map_err(|e| TrainError::Distributed(e.to_string()))?.handle::<EpochStats>().handle::<StepDone>().handle::<Abort>();
    Ok(inbox)
}

/// An actix system running on a thread of its own, so training threads can
/// block while it serves the actors.
pub(crate) struct System {
    pub(crate) node: Node,
    pub(crate) handle: tokio::runtime::Handle,
    arbiters: Vec<actix::Arbiter>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl System {
    /// Starts the system and runs `setup` in it.
    pub(crate) fn start<T, F, S>(setup: S) -> Result<(System, T)>
    where
        T: Send + 'static,
        F: Future<Output = Result<(Node, Vec<actix::Arbiter>, T)>> + 'static,
        S: FnOnce() -> F + Send + 'static,
    {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("actors".into())
            .spawn(move || {
                let system = actix_rt::System::new();
                system.block_on(async move {
                    match setup().await {
                        Ok((node, arbiters, extra)) => {
                            let _ = ready_tx.send(Ok((node.clone(), tokio::runtime::Handle::current(), arbiters, extra)));
                            let _ = stop_rx.await;
                            node.shutdown().await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })
            .map_err(|e| TrainError::Distributed(format!("cannot start the actor thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok((node, handle, arbiters, extra))) => Ok((System { node, handle, arbiters, stop: Some(stop_tx), thread: Some(thread) }, extra)),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(TrainError::Distributed("the actor thread stopped during start-up".into())),
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        for a in &self.arbiters {
            a.stop();
        }
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn open_partitions(t: &TrainingConfig) -> Result<PartitionSet> {
    if t.checkpoint_dir.is_some() || t.resume {
        return Err(TrainError::Config(
            "training.checkpoint_dir: checkpoints of data-parallel runs (sharded embedding rows) are not built yet; remove checkpoint_dir and resume".into(),
        ));
    }
    let dir = t.partitions.as_ref().ok_or_else(|| TrainError::Config("training.partitions: data-parallel training needs a partition directory (hetgnn partition --out DIR)".into()))?;
    Ok(PartitionSet::open(dir)?)
}

pub(crate) fn load_options(t: &TrainingConfig) -> LoadOptions {
    LoadOptions { mmap_features: true, reverse_edges: t.reverse_edges }
}

/// The trained model of a data-parallel run: a replica's dense parameters
/// and the learnable tables assembled from the stores.
pub struct FinalModel {
    /// Trainer 0's replica (its embedding tables are empty: see `tables`).
    pub replica: models::Model,
    /// `(embed.<type>, rows)` for every learnable type, whole.
    pub tables: Vec<(String, Vec<f32>)>,
}

/// Trains data-parallel with every partition's actors in this process.
pub fn train_embedded(cfg: &Config, observer: &mut dyn TrainObserver) -> Result<(Report, FinalModel)> {
    let t = cfg.training.clone();
    let set = open_partitions(&t)?;
    let parts = set.manifest.parts as u32;
    let graphs: Vec<Arc<HetGraph>> = (0..parts as usize).map(|k| set.load_part(k, &load_options(&t)).map(Arc::new)).collect::<graphs::Result<_>>()?;
    let per_part = set.manifest.trainers as u32;
    let sh = Shared { parts, per_part, cfg: t.clone(), owners: Arc::new(set.owners), trainer_of: Arc::new(set.trainer_of), timeouts: Timeouts::default() };
    let (gs, os, tc) = (graphs.clone(), sh.owners.clone(), t.clone());
    let (system, (inboxes, coord)) = System::start(move || async move {
        let node = Node::embedded("local").map_err(|e| TrainError::Distributed(e.to_string()))?;
        let mut arbiters = Vec::new();
        let inboxes = (0..parts).map(|k| serve_partition(&node, k, parts, per_part, gs[k as usize].clone(), os.clone(), &tc, &mut arbiters)).collect::<Result<Vec<_>>>()?;
        let coord = serve_coordinator(&node)?;
        Ok((node, arbiters, (inboxes, coord)))
    })?;
    let mut handles = Vec::new();
    for k in 0..parts {
        handles.extend(spawn_trainers(&sh, k, &graphs[k as usize], &system, &inboxes[k as usize])?);
    }
    observer.ready(&graphs[0], &models::Model::new(&t.model_spec(), &graphs[0], candle_core::DType::F32, &candle_core::Device::Cpu)?);
    let coordinated = coordinate(&t, parts, parts * per_part, &coord, &graphs[0], observer, &sh.timeouts);
    let mut models = join_threads(handles)?;
    let mut report = coordinated?;
    report.config = cfg.clone();
    let tables = finish(&mut report, &system, &models[0], &graphs[0], &t, parts)?;
    drop(system);
    Ok((report, FinalModel { replica: models.swap_remove(0), tables }))
}

/// Gathers every epoch's statistics from the trainers into a report.
pub(crate) fn coordinate(t: &TrainingConfig, parts: u32, trainers: u32, inbox: &Inbox, g: &HetGraph, observer: &mut dyn TrainObserver, timeouts: &Timeouts) -> Result<Report> {
    coordinate_mode("data-parallel", t, parts, trainers, inbox, g, observer, timeouts)
}

/// [`coordinate`] for a run of `mode`: the statistics of trainer (or worker)
/// 0 carry the loss and training accuracy.
#[allow(clippy::too_many_arguments)]
pub(crate) fn coordinate_mode(mode: &str, t: &TrainingConfig, parts: u32, trainers: u32, inbox: &Inbox, g: &HetGraph, observer: &mut dyn TrainObserver, timeouts: &Timeouts) -> Result<Report> {
    let (_, splits) = g.target_labels();
    let mut report = Report { mode: mode.into(), nodes: parts as usize, ..Report::default() };
    let mut step_bytes: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for epoch in 0..t.epochs {
        let steps = splits.train.len().div_ceil(t.batch.max(1)) as u64;
        observer.epoch_start(epoch, steps);
        let stats = loop {
            match inbox.epoch_progress(epoch, trainers, timeouts.step)? {
                inbox::EpochProgress::Step(loss) => observer.step(loss),
                inbox::EpochProgress::Done(stats) => break stats,
            }
        };
        let s0 = &stats[0];
        let n = stats.len() as f64;
        let mean = |f: fn(&EpochStats) -> f64| stats.iter().map(f).sum::<f64>() / n;
        let er = EpochReport {
            epoch,
            loss: s0.loss,
            train_acc: s0.train_correct as f64 / s0.train_seen.max(1) as f64,
            valid_acc: stats.iter().map(|s| s.valid_correct).sum::<u64>() as f64 / splits.valid.len().max(1) as f64,
            test_acc: stats.iter().map(|s| s.test_correct).sum::<u64>() as f64 / splits.test.len().max(1) as f64,
            seconds: stats.iter().map(|s| s.seconds).fold(0.0, f64::max),
            sample_s: mean(|s| s.sample_s),
            gather_s: mean(|s| s.gather_s),
            compute_s: mean(|s| s.compute_s),
            comm_s: mean(|s| s.comm_s),
            update_s: mean(|s| s.update_s),
            eval_s: stats.iter().map(|s| s.eval_s).fold(0.0, f64::max),
        };
        report.steps += steps;
        // Each trainer reports its node's cumulative traffic; in one process they share a node.
        report.bytes_by_kind.clear();
        report.messages_by_kind.clear();
        let distinct = if stats.windows(2).all(|w| w[0].bytes_by_kind == w[1].bytes_by_kind) { &stats[..1] } else { &stats[..] };
        for s in distinct {
            for (k, v) in &s.bytes_by_kind {
                *report.bytes_by_kind.entry(k.clone()).or_default() += v;
            }
            for (k, v) in &s.messages_by_kind {
                *report.messages_by_kind.entry(k.clone()).or_default() += v;
            }
            for (k, v) in &s.step_bytes_by_kind {
                *step_bytes.entry(k.clone()).or_default() += v;
            }
        }
        observer.epoch_end(&er);
        report.epochs.push(er);
    }
    report.bytes_per_step = step_bytes.into_iter().map(|(k, v)| (k, v as f64 / report.steps.max(1) as f64)).collect();
    Ok(report)
}

/// Final model hash (dense parameters of a replica, embedding rows from every
/// store) and the figures that need the whole model.
fn finish(report: &mut Report, system: &System, replica: &models::Model, g: &HetGraph, t: &TrainingConfig, parts: u32) -> Result<Vec<(String, Vec<f32>)>> {
    let learnable = models::Model::learnable_types(t.model, g);
    let mut tables: Vec<(String, Vec<f32>)> = Vec::new();
    let ask = Timeouts::default().ask;
    for (ty, nt) in g.node_types().iter().enumerate() {
        if !learnable[ty] {
            continue;
        }
        let dim = t.embed_dim;
        let mut table = vec![0.0f32; nt.count as usize * dim];
        let refs = (0..parts).map(|p| system.node.actor(&names::store(&nt.name, p))).collect::<std::result::Result<Vec<_>, _>>().map_err(|e| TrainError::Distributed(e.to_string()))?;
        let answers = system.handle.block_on(join_all(refs.iter().map(|r| r.ask(Export, ask))));
        for (p, a) in answers.into_iter().enumerate() {
            let (ids, data) = a?.map_err(|e| TrainError::Distributed(format!("{}: {e}", names::store(&nt.name, p as u32))))?;
            let rows = store::decode_f32(&data.0, ids.len() * dim).map_err(TrainError::Distributed)?;
            for (k, &id) in ids.iter().enumerate() {
                let at = id as usize * dim;
                table.get_mut(at..at + dim).ok_or_else(|| TrainError::Distributed(format!("exported row {id} out of range")))?.copy_from_slice(&rows[k * dim..(k + 1) * dim]);
            }
        }
        tables.push((format!("embed.{}", nt.name), table));
    }
    report.final_model_sha256 = crate::trainer::hash_parts(&replica.params, tables.iter().map(|(n, d)| (n.as_str(), d.as_slice())))?;
    report.parameters = (replica.params.numel() + tables.iter().map(|(_, d)| d.len()).sum::<usize>()) as u64;
    report.peak_memory_bytes = peak_rss_bytes();
    Ok(tables)
}

/// Placement for data-parallel training: partition k's actors run on the
/// k-th node (which loads partition k), whatever `[placement]` says; the
/// coordinator where `[placement]` puts it, else on the first node.
pub fn data_parallel_placement(topology: &mut runtime::Topology, types: &[String], per_part: u32) {
    let ids: Vec<String> = topology.cluster.nodes.iter().map(|n| n.id.clone()).collect();
    for (k, id) in ids.iter().enumerate() {
        let k = k as u32;
        let trainers = (0..per_part).map(|j| names::trainer(k * per_part + j));
        let names = [names::sampler(k)].into_iter().chain(trainers).chain(types.iter().map(|ty| names::store(ty, k)));
        for name in names {
            topology.placement.insert(name, id.clone());
        }
    }
    if topology.placed(names::COORDINATOR).is_none() {
        if let Some(first) = ids.first() {
            topology.placement.insert(names::COORDINATOR.to_string(), first.clone());
        }
    }
}

/// Waits until every peer of `node` is up, or names those that are not.
pub(crate) async fn wait_for_peers(node: &Node, topology: &runtime::Topology, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let missing: Vec<String> = node.members().into_iter().filter(|m| m.state != PeerState::Up).map(|m| m.id).collect();
        if missing.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            let named: Vec<String> = missing
                .iter()
                .map(|id| {
                    let addr = topology.cluster.nodes.iter().find(|n| &n.id == id).map_or("?", |n| n.addr.as_str());
                    format!("{id} at {addr}")
                })
                .collect();
            return Err(TrainError::Distributed(format!(
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

/// Runs node `id`'s part of data-parallel training: its partition's actors
/// and trainer, and on the coordinator's node the coordination and report.
/// Returns the report on the coordinator's node.
pub fn run_node(cfg: &Config, id: &str, observer: &mut dyn TrainObserver) -> Result<Option<Report>> {
    let t = cfg.training.clone();
    let mut topology = cfg.topology().ok_or_else(|| TrainError::Config("cluster: hetgnn node needs a [cluster] section".into()))?;
    let part = topology.cluster.nodes.iter().position(|n| n.id == id).ok_or_else(|| TrainError::Config(format!("--node {id}: not in cluster.nodes")))? as u32;
    let set = open_partitions(&t)?;
    let parts = set.manifest.parts as u32;
    if parts as usize != topology.cluster.nodes.len() {
        return Err(TrainError::Config(format!(
            "training.partitions: {} partitions for {} nodes; data-parallel runs one partition per node (hetgnn partition --parts {})",
            parts,
            topology.cluster.nodes.len(),
            topology.cluster.nodes.len()
        )));
    }
    data_parallel_placement(&mut topology, &set.manifest.node_types, set.manifest.trainers as u32);
    let coordinator_here = topology.placed(names::COORDINATOR) == Some(id);
    let graph = Arc::new(set.load_part(part as usize, &load_options(&t))?);
    let per_part = set.manifest.trainers as u32;
    let timeouts = Timeouts { start: Duration::from_millis(topology.cluster.start_timeout_ms), ..Timeouts::default() };
    let sh = Shared { parts, per_part, cfg: t.clone(), owners: Arc::new(set.owners), trainer_of: Arc::new(set.trainer_of), timeouts };
    let (g, o, tc, topo, me) = (graph.clone(), sh.owners.clone(), t.clone(), topology.clone(), id.to_string());
    let (system, (inboxes, coord)) = System::start(move || async move {
        let node = Node::start(topo.clone(), &me).await?;
        let mut arbiters = Vec::new();
        let inboxes = serve_partition(&node, part, parts, per_part, g, o, &tc, &mut arbiters)?;
        let coord = if coordinator_here { Some(serve_coordinator(&node)?) } else { None };
        tracing::info!("{me}: partition {part} of {parts} served ({per_part} trainer(s)); waiting for peers");
        if let Err(e) = wait_for_peers(&node, &topo, timeouts.start).await {
            node.shutdown().await;
            arbiters.iter().for_each(|a| {
                a.stop();
            });
            return Err(e);
        }
        watch_peers(&node, inboxes.iter().cloned().chain(coord.clone()).collect());
        Ok((node, arbiters, (inboxes, coord)))
    })?;
    let handles = spawn_trainers(&sh, part, &graph, &system, &inboxes)?;
    let Some(coord) = coord else {
        join_threads(handles)?;
        tracing::info!("{id}: training done; serving until the coordinator finishes");
        inboxes[0].finished(timeouts.finish)?;
        return Ok(None);
    };
    let coordinated = coordinate(&t, parts, parts * per_part, &coord, &graph, observer, &timeouts);
    let model = join_threads(handles)?.swap_remove(0);
    let mut report = coordinated?;
    report.config = cfg.clone();
    finish(&mut report, &system, &model, &graph, &t, parts)?;
    // The first trainer of every other node waits for the word.
    let peers = (0..parts).filter(|&p| p != part).filter_map(|p| system.node.actor(&names::trainer(p * per_part)).ok());
    let asks: Vec<_> = peers.map(|r| async move { r.ask(Finish, Duration::from_secs(10)).await }).collect();
    for r in system.handle.block_on(join_all(asks)) {
        if let Err(e) = r {
            tracing::warn!("{id}: could not tell a peer the run is over: {e}");
        }
    }
    drop(system);
    Ok(Some(report))
}
