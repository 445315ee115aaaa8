//! Data-parallel training (DistDGL / DistDGLv2) on the actor runtime: one
//! Sampler, one FeatureStore per node type and one Trainer per partition, and
//! a Coordinator that gathers each epoch's figures and writes the report.
//! Embedded (`hetgnn train` with `mode = "data-parallel"` and no `[cluster]`),
//! every partition's actors share one process and talk through local
//! mailboxes; with a `[cluster]`, partition k runs on the k-th node.
//!
//! A run is a sequence of generations (see [`coordinator`]): each node's
//! partition waits for the coordinator's `Begin`, restores the checkpoint it
//! names and trains; when a node fails, the survivors stop and wait for the
//! next `Begin`, which comes once the failed node is back.

pub mod checkpoint;
pub mod coordinator;
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
use crate::report::{peak_rss_bytes, Report};
use crate::trainer::TrainObserver;
use inbox::{Control, Inbox, InboxActor};
use messages::{Abort, Begin, EpochStats, Export, Finish, GradShare, LastAttempt, Pull, Push, Ready, Reset, SampleReq, Save, Saved, StepDone};
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
    /// FeatureStore of node type `ty` in partition `p`.
    pub fn store(ty: &str, p: u32) -> String {
        format!("features/{}/{p}", plain(ty))
    }

    /// A node type's name made a valid actor (and file) name.
    pub fn plain(ty: &str) -> String {
        ty.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c.to_ascii_lowercase() } else { '_' }).collect()
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
fn serve_partition(
    node: &Node,
    part: u32,
    parts: u32,
    per_part: u32,
    graph: Arc<HetGraph>,
    owners: Arc<Vec<Vec<u16>>>,
    t: &TrainingConfig,
    arbiters: &mut Vec<actix::Arbiter>,
) -> Result<Vec<Arc<Inbox>>> {
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
        let files = t.checkpoint_dir.clone().map(|root| (root, checkpoint::shard_file(&nt.name, part)));
        let store = FeatureStore::new(part as u16, owners.clone(), ty, data, files);
        let addr = FeatureStore::start_in_arbiter(&on_own_thread(arbiters), move |_| store);
        node.register(&names::store(&nt.name, part), &addr).map_err(reg)?.handle::<Pull>().handle::<Push>().handle::<Export>().handle::<Reset>().handle::<Save>();
    }
    let mut inboxes = Vec::new();
    for j in 0..per_part {
        let inbox = Arc::new(Inbox::default());
        let addr = InboxActor(inbox.clone()).start();
        node.register(&names::trainer(part * per_part + j), &addr).map_err(reg)?.handle::<GradShare>().handle::<Abort>().handle::<Finish>().handle::<Begin>();
        inboxes.push(inbox);
    }
    Ok(inboxes)
}

/// What every trainer thread of a run shares.
struct Shared {
    /// The run's fingerprint.
    run: String,
    parts: u32,
    per_part: u32,
    cfg: TrainingConfig,
    owners: Arc<Vec<Vec<u16>>>,
    trainer_of: Arc<Vec<u16>>,
    timeouts: Timeouts,
    /// Per trainer, its device cache once built: later generations in this
    /// process reuse it instead of pre-sampling and profiling again.
    caches: CacheSlots,
}

/// One slot per trainer for its device cache.
pub(crate) type CacheSlots = Arc<Vec<std::sync::Mutex<Option<Arc<crate::cache::DeviceCache>>>>>;

/// Empty cache slots for `trainers` trainers.
fn cache_slots(trainers: u32) -> CacheSlots {
    Arc::new((0..trainers).map(|_| std::sync::Mutex::new(None)).collect())
}

/// Starts the trainer threads of partition `part` for generation `gen`, one per inbox.
#[allow(clippy::too_many_arguments)] // one attempt's whole context
fn spawn_trainers(
    sh: &Shared,
    part: u32,
    graph: &Arc<HetGraph>,
    node: &Node,
    handle: &tokio::runtime::Handle,
    inboxes: &[Arc<Inbox>],
    gen: u64,
    from: &Option<(std::path::PathBuf, checkpoint::Manifest)>,
) -> Result<Vec<std::thread::JoinHandle<Result<models::Model>>>> {
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
            node: node.clone(),
            handle: handle.clone(),
            inbox: inbox.clone(),
            timeouts: sh.timeouts,
            gen,
            from: from.clone(),
            caches: sh.caches.clone(),
        };
        let h =
            std::thread::Builder::new().name(format!("trainer-{trainer}")).spawn(move || trainer::run(setup)).map_err(|e| TrainError::Distributed(format!("cannot start a trainer thread: {e}")))?;
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
pub(crate) fn abort_peers(node: &Node, handle: &tokio::runtime::Handle, me: &str, from: u32, gen: u64, targets: &[String], reason: &str) {
    send_abort(node, handle, me, Abort { gen, all_but: false, from, reason: reason.to_string() }, targets);
}

/// Tells `targets` to stop whatever generation they run unless it is `keep`.
pub(crate) fn stop_all_but(node: &Node, handle: &tokio::runtime::Handle, me: &str, keep: u64, targets: &[String], reason: &str) {
    send_abort(node, handle, me, Abort { gen: keep, all_but: true, from: u32::MAX, reason: reason.to_string() }, targets);
}

fn send_abort(node: &Node, handle: &tokio::runtime::Handle, me: &str, abort: Abort, targets: &[String]) {
    let Ok(me) = runtime::ActorName::new(me) else { return };
    let asks = targets.iter().filter_map(|n| node.actor(n).ok()).map(|r| {
        let (r, abort) = (r.with_sender(me.clone()), Abort { reason: abort.reason.clone(), ..abort });
        async move { r.ask(abort, ABORT_NOTICE).await }
    });
    let _ = handle.block_on(join_all(asks));
}

/// Registers the coordinator's inbox on `node`.
pub(crate) fn serve_coordinator(node: &Node) -> Result<Arc<Inbox>> {
    let inbox = Arc::new(Inbox::default());
    let addr = InboxActor(inbox.clone()).start();
    node.register(names::COORDINATOR, &addr).map_err(|e| TrainError::Distributed(e.to_string()))?.handle::<EpochStats>().handle::<StepDone>().handle::<Abort>().handle::<Saved>().handle::<Ready>();
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
    let graphs: Vec<Arc<HetGraph>> = (0..parts as usize).map(|k| set.load_part(k, &load_options(&t))).map(|g| g.map(Arc::new)).collect::<graphs::Result<_>>()?;
    let per_part = set.manifest.trainers as u32;
    let run = run_key(&t, &set, &graphs[0]);
    let sh = Shared {
        run: run.clone(),
        parts,
        per_part,
        cfg: t.clone(),
        owners: Arc::new(set.owners),
        trainer_of: Arc::new(set.trainer_of),
        timeouts: Timeouts::default(),
        caches: cache_slots(parts * per_part),
    };
    let (gs, os, tc) = (graphs.clone(), sh.owners.clone(), t.clone());
    let (system, (inboxes, coord)) = System::start(move || async move {
        let node = Node::embedded("local").map_err(|e| TrainError::Distributed(e.to_string()))?;
        let mut arbiters = Vec::new();
        let inboxes = (0..parts).map(|k| serve_partition(&node, k, parts, per_part, gs[k as usize].clone(), os.clone(), &tc, &mut arbiters)).collect::<Result<Vec<_>>>()?;
        let coord = serve_coordinator(&node)?;
        Ok((node, arbiters, (inboxes, coord)))
    })?;
    observer.ready(&graphs[0], &models::Model::new(&t.model_spec(), &graphs[0], candle_core::DType::F32, &candle_core::Device::Cpu)?);
    let timeouts = sh.timeouts;
    let (driven, mut report, models) = std::thread::scope(|scope| {
        let loops: Vec<_> = (0..parts)
            .map(|k| {
                let (sh, g, node, handle, inboxes) = (&sh, graphs[k as usize].clone(), system.node.clone(), system.handle.clone(), inboxes[k as usize].clone());
                scope.spawn(move || run_partition(sh, k, &g, &node, &handle, &inboxes, timeouts.finish))
            })
            .collect();
        let c = coordinator::Coordinator::new("data-parallel", &t, parts, parts * per_part, &coord, timeouts, run);
        let nodes = vec!["local".to_string(); parts as usize];
        let mut d = coordinator::Driver { c, system: &system, leaders: leaders(parts, per_part), members: members(parts, per_part), nodes, start: timeouts.start, rejoin: timeouts.finish };
        let driven = d.run(&graphs[0], observer);
        for k in &inboxes {
            if let Err(e) = &driven {
                k[0].abort(format!("the coordinator failed: {e}"));
            }
            k[0].finish(driven.is_ok());
        }
        let models: Vec<_> = loops.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(TrainError::Distributed("a partition thread panicked".into())))).collect();
        (driven, d.c.report, models)
    });
    driven?;
    let mut models = own_replicas(models.into_iter().next().ok_or_else(|| TrainError::Distributed("no partition".into()))?)?;
    report.config = cfg.clone();
    let tables = finish(&mut report, &system, &models[0], &graphs[0], &t, parts)?;
    drop(system);
    Ok((report, FinalModel { replica: models.swap_remove(0), tables }))
}

/// Tells each `(actor, its node)` the run is over, well or not, skipping nodes
/// that are down (they would not hear it); the others wait for the word.
pub(crate) fn tell_finish(system: &System, peers: &[(String, String)], ok: bool) {
    let down: Vec<String> = system.node.members().into_iter().filter(|m| m.state != PeerState::Up).map(|m| m.id).collect();
    let refs = peers.iter().filter(|(_, node)| !down.contains(node)).filter_map(|(actor, _)| system.node.actor(actor).ok());
    let asks: Vec<_> = refs.map(|r| async move { r.ask(Finish { ok }, Duration::from_secs(5)).await }).collect();
    for r in system.handle.block_on(join_all(asks)) {
        if let Err(e) = r {
            tracing::warn!("could not tell a peer the run is over: {e}");
        }
    }
}

/// Each partition's first trainer: it takes the coordinator's words.
fn leaders(parts: u32, per_part: u32) -> Vec<String> {
    (0..parts).map(|p| names::trainer(p * per_part)).collect()
}

/// Every partition's trainers.
fn members(parts: u32, per_part: u32) -> Vec<Vec<String>> {
    (0..parts).map(|p| (0..per_part).map(|j| names::trainer(p * per_part + j)).collect()).collect()
}

/// The fingerprint of a data-parallel run (see [`checkpoint::fingerprint`]):
/// its partitioning (owners included) and all-reduce order too.
fn run_key(t: &TrainingConfig, set: &PartitionSet, g: &HetGraph) -> String {
    let layout = format!("data-parallel|{:?}|{}|{}|{:?}", t.allreduce, set.manifest.parts, set.manifest.trainers, set.manifest.method);
    let mut extra: Vec<&[u8]> = vec![layout.as_bytes()];
    extra.extend(set.owners.iter().map(|o| bytemuck::cast_slice::<u16, u8>(o)));
    extra.push(bytemuck::cast_slice::<u16, u8>(&set.trainer_of));
    checkpoint::fingerprint(t, g.name(), &extra)
}

/// A node's partition over the run's generations: it tells the coordinator
/// it is ready (again and again, so a restarted coordinator hears it too),
/// and on each `Begin` starts its inboxes' new generation and runs `attempt`.
/// Once the coordinator says the run is over (well), returns the last
/// attempt's result, or `None` if that attempt did not finish (the
/// coordinator had all it needed: a last acknowledgement was lost as it
/// left). `leader` (named `me`) takes the coordinator's words.
#[allow(clippy::too_many_arguments)] // one partition's whole context
pub(crate) fn serve_generations<T>(
    node: &Node,
    handle: &tokio::runtime::Handle,
    me: &str,
    part: u32,
    inboxes: &[Arc<Inbox>],
    rejoin: Duration,
    mut attempt: impl FnMut(Begin) -> Result<T>,
) -> Result<Option<T>> {
    let leader = inboxes.first().ok_or_else(|| TrainError::Distributed("a partition without trainers".into()))?;
    let me = runtime::ActorName::new(me).map_err(|e| TrainError::Distributed(e.to_string()))?;
    let coordinator = node.actor(names::COORDINATOR).map_err(|e| TrainError::Distributed(e.to_string()))?.with_sender(me);
    let incarnation = coordinator::new_generation();
    let mut last = LastAttempt::None;
    let mut result = None;
    loop {
        let waiting = Instant::now();
        let control = loop {
            let ready = Ready { part, incarnation, last };
            let _ = handle.block_on(coordinator.ask(ready, Duration::from_secs(1)));
            if let Some(c) = leader.control(Duration::from_millis(200)) {
                break c;
            }
            if waiting.elapsed() > rejoin {
                return Err(TrainError::Distributed(format!("no word from the coordinator within {rejoin:?}: is its node up?")));
            }
        };
        let b = match control {
            Control::Finish(true) => return Ok(result),
            Control::Finish(false) => return Err(TrainError::Distributed("the coordinator gave up the run (its log says why)".into())),
            Control::Begin(b) => b,
        };
        // The leader started the generation as it took the word.
        for i in &inboxes[1..] {
            i.reset(b.gen);
        }
        match attempt(b) {
            Ok(r) => {
                result = Some(r);
                last = LastAttempt::Done(b.gen);
            }
            Err(e) => {
                result = None;
                tracing::warn!("partition {part}: generation {:x} stopped: {e}", b.gen);
                last = LastAttempt::Failed(b.gen);
            }
        }
    }
}

/// The checkpoint a `Begin` names: its directory and manifest, which must
/// be of this node's run (`run`: its fingerprint).
pub(crate) fn begin_from(t: &TrainingConfig, run: &str, b: Begin) -> Result<Option<(std::path::PathBuf, checkpoint::Manifest)>> {
    match (b.from, &t.checkpoint_dir) {
        (None, _) => Ok(None),
        (Some(seq), Some(root)) => {
            let dir = checkpoint::dir(root, seq);
            let m = checkpoint::manifest(&dir)?;
            if m.run != run {
                return Err(TrainError::Checkpoint(format!(
                    "{}: written by another run than this node's (is training.checkpoint_dir one directory all nodes share, with the same settings?)",
                    dir.display()
                )));
            }
            Ok(Some((dir, m)))
        }
        (Some(seq), None) => Err(TrainError::Config(format!("the coordinator resumes from the checkpoint at step {seq}, but this node has no training.checkpoint_dir"))),
    }
}

/// Data-parallel partition `part` over the run's generations (see [`serve_generations`]).
fn run_partition(sh: &Shared, part: u32, graph: &Arc<HetGraph>, node: &Node, handle: &tokio::runtime::Handle, inboxes: &[Arc<Inbox>], rejoin: Duration) -> Result<Option<Vec<models::Model>>> {
    serve_generations(node, handle, &names::trainer(part * sh.per_part), part, inboxes, rejoin, |b| run_generation(sh, part, graph, node, handle, inboxes, b))
}

/// The replicas of the coordinator's own partition (their last attempt finished: the
/// coordinator saw every step).
fn own_replicas(r: Result<Option<Vec<models::Model>>>) -> Result<Vec<models::Model>> {
    r?.ok_or_else(|| TrainError::Distributed("the coordinator's own partition did not finish its last attempt".into()))
}

/// One attempt of a partition: its stores restore the checkpoint, its trainers train.
fn run_generation(sh: &Shared, part: u32, graph: &Arc<HetGraph>, node: &Node, handle: &tokio::runtime::Handle, inboxes: &[Arc<Inbox>], b: Begin) -> Result<Vec<models::Model>> {
    let from = begin_from(&sh.cfg, &sh.run, b)?;
    let learnable = models::Model::learnable_types(sh.cfg.model, graph);
    let stores: Vec<String> = graph.node_types().iter().enumerate().filter(|(ty, _)| learnable[*ty]).map(|(_, nt)| names::store(&nt.name, part)).collect();
    let refs = stores.iter().map(|n| node.actor(n)).collect::<std::result::Result<Vec<_>, _>>().map_err(|e| TrainError::Distributed(e.to_string()))?;
    let answers = handle.block_on(join_all(refs.iter().map(|r| r.ask(Reset { gen: b.gen, from: b.from }, sh.timeouts.ask))));
    for (name, a) in stores.iter().zip(answers) {
        a?.map_err(|e| TrainError::Checkpoint(format!("{name}: {e}")))?;
    }
    let handles = spawn_trainers(sh, part, graph, node, handle, inboxes, b.gen, &from)?;
    join_threads(handles)
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
/// and trainers over the run's generations, and on the coordinator's node the
/// coordination, checkpoints and report. Returns the report on the
/// coordinator's node.
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
    let run = run_key(&t, &set, &graph);
    let per_part = set.manifest.trainers as u32;
    let timeouts = Timeouts { start: Duration::from_millis(topology.cluster.start_timeout_ms), ..Timeouts::default() };
    let rejoin = Duration::from_millis(topology.cluster.rejoin_timeout_ms);
    let sh = Shared { run: run.clone(), parts, per_part, cfg: t.clone(), owners: Arc::new(set.owners), trainer_of: Arc::new(set.trainer_of), timeouts, caches: cache_slots(parts * per_part) };
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
    let Some(coord) = coord else {
        run_partition(&sh, part, &graph, &system.node, &system.handle, &inboxes, rejoin)?;
        tracing::info!("{id}: the run is over");
        return Ok(None);
    };
    let (driven, mut report, models) = std::thread::scope(|scope| {
        let (sh, g, node, handle, ib) = (&sh, graph.clone(), system.node.clone(), system.handle.clone(), inboxes.clone());
        let mine = scope.spawn(move || run_partition(sh, part, &g, &node, &handle, &ib, rejoin));
        let c = coordinator::Coordinator::new("data-parallel", &t, parts, parts * per_part, &coord, timeouts, run);
        let nodes = topology.cluster.nodes.iter().map(|n| n.id.clone()).collect();
        let mut d = coordinator::Driver { c, system: &system, leaders: leaders(parts, per_part), members: members(parts, per_part), nodes, start: timeouts.start, rejoin };
        let driven = d.run(&graph, observer);
        if let Err(e) = &driven {
            inboxes[0].abort(format!("the coordinator failed: {e}"));
        }
        inboxes[0].finish(driven.is_ok());
        let models = mine.join().unwrap_or_else(|_| Err(TrainError::Distributed("the partition thread panicked".into())));
        (driven, d.c.report, models)
    });
    let finished = driven.and_then(|()| {
        let model = own_replicas(models)?.swap_remove(0);
        report.config = cfg.clone();
        finish(&mut report, &system, &model, &graph, &t, parts)
    });
    let peers: Vec<(String, String)> = (0..parts).filter(|&p| p != part).map(|p| (names::trainer(p * per_part), topology.cluster.nodes[p as usize].id.clone())).collect();
    tell_finish(&system, &peers, finished.is_ok());
    finished?;
    drop(system);
    Ok(Some(report))
}
