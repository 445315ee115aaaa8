//! The seam of the distributed training modes. A mode says what is its own
//! (its partitions and their actors, where they run, the run's fingerprint,
//! one attempt of a generation, the final model) through [`Distributed`];
//! the two drivers here run any mode: [`train_embedded`] with every
//! partition in this process, [`run_node`] as one node of a cluster. Both
//! drive the run's generations with the shared coordinator, so recovery,
//! checkpoints and the report work alike in every mode.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};
use graphs::HetGraph;
use models::Model;
use runtime::{Node, Topology};

use super::checkpoint::Manifest;
use super::coordinator::{shell, Coordinator, Deadlines, RunId, Shape};
use super::generations::{begin_from, new_generation, serve_generations};
use super::inbox::Inbox;
use super::messages::Begin;
use super::peers::{tell_finish, wait_for_peers, watch_peers};
use super::{names, System, Timeouts};
use crate::config::Config;
use crate::epoch::memory::{self, MemoryPlan, TRANSPORT_COPIES};
use crate::error::{Result, TrainError};
use crate::observer::TrainObserver;
use crate::report::Report;

/// What one partition's attempt works with.
pub struct Part<'a> {
    /// The partition.
    pub part: u32,
    /// Its graph.
    pub graph: &'a Arc<HetGraph>,
    /// The node its actors live on.
    pub node: &'a Node,
    /// The node's runtime, for asks from training threads.
    pub handle: &'a tokio::runtime::Handle,
    /// Its inboxes, as [`Distributed::serve`] returned them.
    pub inboxes: &'a [Arc<Inbox>],
    /// Deadlines.
    pub timeouts: Timeouts,
}

/// A distributed training mode: one folder under `actors/src/`, registered
/// in `crate::modes`. Partition `k` runs on one node; the coordinator runs
/// where [`Distributed::place`] puts it.
pub trait Distributed: Send + Sync + 'static {
    /// What a partition's finished attempt leaves for the final model.
    type Outcome: Send;

    /// The mode's name in reports and logs ("data-parallel", "raf").
    fn name(&self) -> &'static str;
    /// Partitions of the run (one per node in a cluster).
    fn parts(&self) -> u32;
    /// Trainers (or workers) in all: each sends its figures every epoch.
    fn trainers(&self) -> u32;
    /// Partition `part`'s actor that takes the coordinator's words.
    fn leader(&self, part: u32) -> String;
    /// Partition `part`'s actors to stop when a generation fails.
    fn members(&self, part: u32) -> Vec<String>;
    /// Checks the cluster suits the run and writes where every actor runs
    /// into `topology.placement` (the coordinator's name included); returns
    /// the node of each partition.
    fn place(&self, topology: &mut Topology) -> Result<Vec<String>>;
    /// Loads partition `part`'s graph.
    fn load(&self, part: u32) -> Result<HetGraph>;
    /// Steps per epoch of the run, given a loaded partition `graph` (by
    /// default its training nodes cut into `batch`-sized steps).
    fn steps_per_epoch(&self, graph: &HetGraph, t: &crate::config::TrainingConfig) -> u64 {
        graph.target_labels().1.train.len().div_ceil(t.batch.max(1)) as u64
    }
    /// The run's fingerprint: a checkpoint of another run is refused.
    fn fingerprint(&self, graph: &HetGraph) -> String;
    /// Copies of a step's input rows (or their gradients) a trainer has in
    /// flight beyond the step's own: by default those of rows pulled from
    /// stores ([`TRANSPORT_COPIES`]); 0 for trainers that read a graph of
    /// their own.
    fn rows_in_transit(&self) -> u128 {
        TRANSPORT_COPIES
    }
    /// Per node type, the rows partition `part`'s actors hold learnable
    /// rows and optimizer state for (`None`: every row, an upper bound).
    fn owned_rows(&self, _part: u32) -> Option<Vec<u64>> {
        None
    }
    /// The content of the graph the partitions were cut from, when recorded
    /// ([`graphs::fingerprint::content`]): checkpoints carry it, so that
    /// `predict` refuses a same-named graph of other content.
    fn graph_sha256(&self) -> Option<String> {
        None
    }
    /// Registers partition `part`'s actors on `node` (inside its actix
    /// system; actors wanting a thread of their own push an arbiter) and
    /// returns its inboxes, the leader's first.
    fn serve(
        &self,
        node: &Node,
        part: u32,
        graph: &Arc<HetGraph>,
        arbiters: &mut Vec<actix::Arbiter>,
    ) -> Result<Vec<Arc<Inbox>>>;
    /// What shared code asks of the mode (its figures, how its steps count,
    /// what its checkpoints may lack).
    fn rules(&self) -> &'static crate::modes::seam::Rules {
        &crate::modes::seam::PLAIN
    }
    /// The run's deadlines, from the defaults (a mode whose trainers may
    /// wait long on each other lengthens them; lost nodes are detected apart).
    fn timeouts(&self, t: Timeouts) -> Timeouts {
        t
    }
    /// Registers what the coordinator takes beyond the shared messages.
    fn serve_coordinator(&self, _node: &Node, _inbox: &Arc<Inbox>) -> Result<()> {
        Ok(())
    }
    /// One attempt of generation `begin` on a partition, from the checkpoint
    /// `from` (its directory and manifest) if any.
    fn attempt(
        &self,
        p: &Part,
        begin: Begin,
        run: &str,
        from: Option<(PathBuf, Manifest)>,
    ) -> Result<Self::Outcome>;
    /// After each attempt that finished, on a node without the coordinator
    /// (raf sends its worker's final state there). Best effort.
    fn after_attempt(&self, _p: &Part, _gen: u64, _outcome: &Self::Outcome) -> Result<()> {
        Ok(())
    }
    /// The trained model, on the coordinator's node once the run is over:
    /// from the last attempts of its own partitions (every partition when
    /// embedded), what reached the coordinator's `inbox`, and the actors that
    /// still serve.
    fn assemble(
        &self,
        system: &System,
        inbox: &Inbox,
        local: Vec<(u32, Result<Option<Self::Outcome>>)>,
        graph: &HetGraph,
    ) -> Result<Model>;
}

/// Partition `p` over the run's generations; `remote`: its node has no coordinator.
fn serve_part<M: Distributed>(
    mode: &M,
    p: &Part,
    run: &str,
    t: &crate::config::TrainingConfig,
    rejoin: Duration,
    remote: bool,
) -> Result<Option<M::Outcome>> {
    serve_generations(
        p,
        &mode.leader(p.part),
        rejoin,
        t.checkpoint_dir.is_some(),
        |b| {
            let from = begin_from(t, run, b)?;
            let outcome = mode.attempt(p, b, run, from)?;
            // The attempt succeeded whatever becomes of this: the coordinator may
            // have all it needs and be gone before the last acknowledgement.
            if remote {
                if let Err(e) = mode.after_attempt(p, b.gen, &outcome) {
                    tracing::warn!("partition {}: after its attempt: {e}", p.part);
                }
            }
            Ok(outcome)
        },
    )
}

/// Trains with every partition's actors in this process.
pub fn train_embedded<M: Distributed>(
    mode: Arc<M>,
    cfg: &Config,
    observer: &mut dyn TrainObserver,
) -> Result<(Report, Model)> {
    let t = &cfg.training;
    let parts = mode.parts();
    let graphs: Vec<Arc<HetGraph>> = (0..parts)
        .map(|k| mode.load(k).map(Arc::new))
        .collect::<Result<_>>()?;
    if t.task.on_nodes() {
        crate::epoch::preflight::check_trainable(t, &graphs[0])?;
    }
    crate::epoch::preflight::check_distinct_names(&graphs[0])?;
    let memory = check_memory(
        &*mode,
        t,
        &graphs.iter().map(|g| &**g).collect::<Vec<_>>(),
        &(0..parts).collect::<Vec<_>>(),
    )?;
    let run = mode.fingerprint(&graphs[0]);
    let timeouts = mode.timeouts(Timeouts::default());
    let (m, gs) = (mode.clone(), graphs.clone());
    let (system, (inboxes, coord)) = System::start(move || async move {
        let node = Node::embedded("local").map_err(|e| TrainError::Internal(e.to_string()))?;
        let mut arbiters = Vec::new();
        let inboxes = (0..parts)
            .map(|k| m.serve(&node, k, &gs[k as usize], &mut arbiters))
            .collect::<Result<Vec<_>>>()?;
        let mailbox = shell::serve(&node)?;
        let gathered = Arc::new(Inbox::default());
        m.serve_coordinator(&node, &gathered)?;
        Ok((node, arbiters, (inboxes, (mailbox, gathered))))
    })?;
    let (mailbox, coord) = coord;
    // The ready line reads the model's shape: its tables are not needed.
    observer.ready(
        &graphs[0],
        &Model::without_tables(&t.model_spec(), &graphs[0], DType::F32, &Device::Cpu)?,
    );
    let (driven, mut report, local) = std::thread::scope(|scope| {
        let loops: Vec<_> = (0..parts)
            .map(|k| {
                let (mode, run, g, node, handle, inboxes) = (
                    &*mode,
                    &run,
                    &graphs[k as usize],
                    &system.node,
                    &system.handle,
                    &inboxes[k as usize],
                );
                scope.spawn(move || {
                    let p = Part {
                        part: k,
                        graph: g,
                        node,
                        handle,
                        inboxes,
                        timeouts,
                    };
                    serve_part(mode, &p, run, t, timeouts.finish, false)
                })
            })
            .collect();
        let mut c = coordinator(
            &*mode,
            t,
            &graphs[0],
            vec!["local".to_string(); parts as usize],
            timeouts,
            timeouts.finish,
            &run,
        );
        let shell = shell::Shell {
            system: &system,
            leaders: (0..parts).map(|k| mode.leader(k)).collect(),
            members: (0..parts).map(|k| mode.members(k)).collect(),
            gathered: &coord,
        };
        let driven = shell::drive(&mut c, t, &run, &shell, &mailbox, observer);
        for k in &inboxes {
            if let Err(e) = &driven {
                k[0].abort(format!("the coordinator failed: {e}"));
            }
            k[0].finish(driven.is_ok());
        }
        let local: Vec<_> = loops
            .into_iter()
            .enumerate()
            .map(|(k, h)| {
                (
                    k as u32,
                    h.join().unwrap_or_else(|_| {
                        Err(TrainError::Internal("a partition thread panicked".into()))
                    }),
                )
            })
            .collect();
        (driven, c.into_report(), local)
    });
    driven?;
    // The last epoch's buffers are dead: hand them back before the whole model is built.
    runtime::alloc::release_freed_memory();
    let model = mode.assemble(&system, &coord, local, &graphs[0])?;
    report.config = cfg.clone();
    report.memory_estimate_bytes = Some(memory.total().min(u128::from(u64::MAX)) as u64);
    crate::report::finish(&mut report, &model)?;
    drop(system);
    Ok((report, model))
}

/// The coordinator of a run of `mode` on `nodes` (`graph`: a partition, for
/// the run's shape), waiting `rejoin` for its partitions after a failure.
fn coordinator<'a, M: Distributed>(
    mode: &M,
    t: &'a crate::config::TrainingConfig,
    graph: &HetGraph,
    nodes: Vec<String>,
    timeouts: Timeouts,
    rejoin: Duration,
    run: &str,
) -> Coordinator<'a> {
    let (_, splits) = graph.target_labels();
    let shape = Shape {
        parts: mode.parts(),
        trainers: mode.trainers(),
        per_epoch: mode.steps_per_epoch(graph, t),
        nodes,
        valid: splits.valid.len(),
        test: splits.test.len(),
    };
    let deadlines = Deadlines {
        start: timeouts.start,
        rejoin,
        step: timeouts.step,
    };
    let id = RunId {
        run: run.to_string(),
        graph_sha256: mode.graph_sha256(),
        started_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        salt: new_generation(),
    };
    Coordinator::new(t, mode.rules(), shape, deadlines, id)
}

/// The memory of the partitions `graphs` served in this process (each its
/// node's actors: stores holding its learnable rows, its trainers with
/// their model replicas and pulled input rows), refused when over the
/// machine's budget.
fn check_memory<M: Distributed>(
    mode: &M,
    t: &crate::config::TrainingConfig,
    graphs: &[&HetGraph],
    parts: &[u32],
) -> Result<MemoryPlan> {
    let mut plan = MemoryPlan::process();
    let trainers = (mode.trainers() / mode.parts().max(1)).max(1);
    for (g, part) in graphs.iter().zip(parts) {
        plan.add("cluster nodes", crate::epoch::memory::NODE_BYTES);
        plan.graph(g)
            .tables(t, g, mode.owned_rows(*part).as_deref());
        for _ in 0..trainers {
            plan.model(t, g, false).trainer(
                t,
                g,
                crate::epoch::PREFETCH + 1,
                mode.rows_in_transit(),
            );
        }
    }
    let what = match graphs.len() {
        1 => format!("this node's partition ({})", memory::settings(t, graphs[0])),
        n => format!(
            "{n} partitions in this process ({})",
            memory::settings(t, graphs[0])
        ),
    };
    plan.check(&what)?;
    Ok(plan)
}

/// Runs node `id`'s partition over the run's generations; on the
/// coordinator's node also the coordination, checkpoints and report
/// (returned there).
pub fn run_node<M: Distributed>(
    mode: Arc<M>,
    cfg: &Config,
    id: &str,
    observer: &mut dyn TrainObserver,
) -> Result<Option<Report>> {
    let t = &cfg.training;
    let mut topology = cfg.topology().ok_or_else(|| {
        TrainError::Config("cluster: hetgnn node needs a [cluster] section".into())
    })?;
    let nodes = mode.place(&mut topology)?;
    let part = nodes
        .iter()
        .position(|n| n == id)
        .ok_or_else(|| TrainError::Config(format!("--node {id}: not in cluster.nodes")))?
        as u32;
    let parts = mode.parts();
    let coordinator_here = topology.placed(names::COORDINATOR) == Some(id);
    let graph = Arc::new(mode.load(part)?);
    if coordinator_here && t.task.on_nodes() {
        crate::epoch::preflight::check_trainable(t, &graph)?;
    }
    crate::epoch::preflight::check_distinct_names(&graph)?;
    let memory = check_memory(&*mode, t, &[&graph], &[part])?;
    let run = mode.fingerprint(&graph);
    let timeouts = mode.timeouts(Timeouts {
        start: Duration::from_millis(topology.cluster.start_timeout_ms),
        ..Timeouts::default()
    });
    let rejoin = Duration::from_millis(topology.cluster.rejoin_timeout_ms);
    let (m, g, topo, me) = (
        mode.clone(),
        graph.clone(),
        topology.clone(),
        id.to_string(),
    );
    let (system, (inboxes, coord)) = System::start(move || async move {
        let node = Node::start(topo.clone(), &me).await?;
        let mut arbiters = Vec::new();
        let inboxes = m.serve(&node, part, &g, &mut arbiters)?;
        let coord = if coordinator_here {
            let mailbox = shell::serve(&node)?;
            shell::watch(&node, mailbox.sender());
            let gathered = Arc::new(Inbox::default());
            m.serve_coordinator(&node, &gathered)?;
            Some((mailbox, gathered))
        } else {
            None
        };
        tracing::info!("{me}: {} partition {part} of {parts} served ({} actor(s) taking steps); waiting for peers", m.name(), inboxes.len());
        if let Err(e) = wait_for_peers(&node, &topo, timeouts.start).await {
            node.shutdown().await;
            arbiters.iter().for_each(|a| {
                a.stop();
            });
            return Err(e);
        }
        watch_peers(
            &node,
            inboxes
                .iter()
                .cloned()
                .chain(coord.as_ref().map(|c| c.1.clone()))
                .collect(),
        );
        Ok((node, arbiters, (inboxes, coord)))
    })?;
    let p = Part {
        part,
        graph: &graph,
        node: &system.node,
        handle: &system.handle,
        inboxes: &inboxes,
        timeouts,
    };
    let Some((mailbox, coord)) = coord else {
        serve_part(&*mode, &p, &run, t, rejoin, true)?;
        tracing::info!("{id}: the run is over");
        return Ok(None);
    };
    let (driven, mut report, mine) = std::thread::scope(|scope| {
        let (mode_ref, p, run_ref) = (&*mode, &p, &run);
        let mine = scope.spawn(move || serve_part(mode_ref, p, run_ref, t, rejoin, false));
        let mut c = coordinator(&*mode, t, p.graph, nodes.clone(), timeouts, rejoin, &run);
        let shell = shell::Shell {
            system: &system,
            leaders: (0..parts).map(|k| mode.leader(k)).collect(),
            members: (0..parts).map(|k| mode.members(k)).collect(),
            gathered: &coord,
        };
        let driven = shell::drive(&mut c, t, &run, &shell, &mailbox, observer);
        if let Err(e) = &driven {
            inboxes[0].abort(format!("the coordinator failed: {e}"));
        }
        inboxes[0].finish(driven.is_ok());
        let mine = mine
            .join()
            .unwrap_or_else(|_| Err(TrainError::Internal("the partition thread panicked".into())));
        (driven, c.into_report(), mine)
    });
    let finished = driven.and_then(|()| {
        runtime::alloc::release_freed_memory();
        let model = mode.assemble(&system, &coord, vec![(part, mine)], &graph)?;
        report.config = cfg.clone();
        report.memory_estimate_bytes = Some(memory.total().min(u128::from(u64::MAX)) as u64);
        crate::report::finish(&mut report, &model)
    });
    let peers: Vec<(String, String)> = (0..parts)
        .filter(|&k| k != part)
        .map(|k| (mode.leader(k), nodes[k as usize].clone()))
        .collect();
    tell_finish(&system, &peers, finished.is_ok());
    finished?;
    drop(system);
    Ok(Some(report))
}
