//! Relation-aggregation-first training (Heta): one RelationAggWorker per
//! meta-partition and a designated Reducer, on the actor runtime. Worker 0
//! runs the partition holding the self sub-metatree and hosts the reducer
//! and the coordinator; with a `[cluster]`, it runs where `[placement]` puts
//! `reducer` (else on the first node) and the other partitions take the
//! other nodes in order.

pub mod messages;
pub mod worker;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use candle_core::{DType, Tensor};
use graphs::partition::meta::MetaSet;
use graphs::{HetGraph, RelationId};
use runtime::Node;

use crate::config::{Config, TrainingConfig};
use crate::dist::coordinator::{Coordinator, Driver};
use crate::dist::inbox::{Inbox, InboxActor};
use crate::dist::messages::{Abort, Begin, Finish};
use crate::dist::{join_threads, load_options, serve_coordinator, wait_for_peers, watch_peers, System, Timeouts};
use crate::error::{Result, TrainError};
use crate::report::{peak_rss_bytes, Report};
use crate::trainer::TrainObserver;
use messages::{Final, FinalState, Partial, PartialGrad, SeedGrad, SeedRows, Shared};
use worker::{WorkerResult, WorkerSetup};

/// Actor names of RAF training.
pub mod names {
    /// The reducer (an alias of worker 0's inbox).
    pub const REDUCER: &str = "reducer";
    /// RelationAggWorker `w` (its inbox).
    pub fn worker(w: u32) -> String {
        format!("worker/{w}")
    }
}

/// The meta-partitions in worker order (the reducer's first) and each one's relations per layer.
struct Plan {
    set: MetaSet,
    /// Partition index of each worker.
    part_of: Vec<usize>,
}

fn open_plan(t: &TrainingConfig) -> Result<Plan> {
    if t.model == models::ModelKind::Mlp {
        return Err(TrainError::Config("training.model: mode = \"raf\" aggregates relations; the MLP reads none (use rgcn, rgat or hgt)".into()));
    }
    let dir = t.partitions.as_ref().ok_or_else(|| TrainError::Config("training.partitions: raf training needs a meta-partition directory (hetgnn partition --method meta --out DIR)".into()))?;
    let set = MetaSet::open(dir)?;
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
    let part_of = std::iter::once(r).chain((0..set.manifest.parts).filter(|&k| k != r)).collect();
    Ok(Plan { set, part_of })
}

/// The fingerprint of a raf run (see `dist::checkpoint::fingerprint`): its
/// meta-partitions, worker order and embedding mode too.
fn run_key(t: &TrainingConfig, plan: &Plan, g: &HetGraph) -> String {
    let layout = format!("raf|{:?}|{:?}|{:?}", t.raf_embeddings, plan.part_of, plan.set.manifest);
    crate::dist::checkpoint::fingerprint(t, g.name(), &[layout.as_bytes()])
}

/// What every worker thread of a run shares.
struct Common {
    /// The run's fingerprint.
    run: String,
    per_layer: Arc<Vec<Vec<Vec<RelationId>>>>,
    replicas: Arc<Vec<(u32, u32)>>,
    cfg: TrainingConfig,
    timeouts: Timeouts,
}

/// Worker `w` over the run's generations (see `dist::serve_generations`):
/// on each `Begin` it restores the named checkpoint and trains; `after` runs
/// on each attempt's result (a remote worker sends its final state there).
#[allow(clippy::too_many_arguments)] // one worker's whole context
fn serve_worker_generations(
    c: &Common,
    w: u32,
    graph: &Arc<HetGraph>,
    node: &Node,
    handle: &tokio::runtime::Handle,
    inbox: &Arc<Inbox>,
    rejoin: Duration,
    after: impl Fn(u64, &WorkerResult) -> Result<()>,
) -> Result<Option<WorkerResult>> {
    let inboxes = [inbox.clone()];
    crate::dist::serve_generations(node, handle, &names::worker(w), w, &inboxes, rejoin, |b| {
        let from = crate::dist::begin_from(&c.cfg, &c.run, b)?;
        let setup = WorkerSetup {
            worker: w,
            per_layer: c.per_layer.clone(),
            replicas: c.replicas.clone(),
            cfg: c.cfg.clone(),
            graph: graph.clone(),
            node: node.clone(),
            handle: handle.clone(),
            inbox: inbox.clone(),
            timeouts: c.timeouts,
            from,
            gen: b.gen,
        };
        let result = join_threads(vec![spawn_worker(setup)?])?.swap_remove(0);
        // The attempt succeeded whatever becomes of this: the coordinator may
        // have all it needs and be gone before the last acknowledgement.
        if let Err(e) = after(b.gen, &result) {
            tracing::warn!("worker {w}: sending the final state: {e}");
        }
        Ok(result)
    })
}

/// A worker of the coordinator's process: its last attempt must have finished.
fn finished(r: Option<WorkerResult>) -> Result<WorkerResult> {
    r.ok_or_else(|| TrainError::Distributed("a worker of the coordinator's process did not finish its last attempt".into()))
}

/// The coordinator's driver of a raf run of `workers` workers.
#[allow(clippy::too_many_arguments)] // the run's whole context
fn driver<'a>(t: &'a TrainingConfig, workers: u32, inbox: &'a Inbox, system: &'a System, timeouts: Timeouts, run: String, nodes: Vec<String>, rejoin: Duration) -> Driver<'a> {
    let c = Coordinator::new("raf", t, workers, workers, inbox, timeouts, run);
    let leaders: Vec<String> = (0..workers).map(names::worker).collect();
    let members = leaders.iter().map(|l| vec![l.clone()]).collect();
    Driver { c, system, leaders, members, nodes, start: timeouts.start, rejoin }
}

fn replicas(plan: &Plan) -> Arc<Vec<(u32, u32)>> {
    Arc::new(plan.part_of.iter().map(|&k| (plan.set.manifest.info[k].replica[0] as u32, plan.set.manifest.info[k].replica[1] as u32)).collect())
}

fn per_layer(plan: &Plan, g: &HetGraph) -> Result<Arc<Vec<Vec<Vec<RelationId>>>>> {
    Ok(Arc::new(plan.part_of.iter().map(|&k| plan.set.per_layer(k, g)).collect::<graphs::Result<_>>()?))
}

/// Registers worker `w`'s inbox (and on worker 0 the reducer's name).
fn serve_worker(node: &Node, w: u32) -> Result<Arc<Inbox>> {
    let reg = |e: runtime::WireError| TrainError::Distributed(e.to_string());
    let inbox = Arc::new(Inbox::default());
    let addr = InboxActor(inbox.clone()).start();
    let names = if w == 0 { vec![names::worker(0), names::REDUCER.to_string()] } else { vec![names::worker(w)] };
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
    Ok(inbox)
}

/// Registers the coordinator, which also takes the workers' final states.
fn serve_raf_coordinator(node: &Node) -> Result<Arc<Inbox>> {
    let inbox = serve_coordinator(node)?;
    let addr = InboxActor(inbox.clone()).start();
    node.register(&format!("{}/final", crate::dist::names::COORDINATOR), &addr).map_err(|e| TrainError::Distributed(e.to_string()))?.handle::<Final>();
    Ok(inbox)
}

fn spawn_worker(setup: WorkerSetup) -> Result<std::thread::JoinHandle<Result<WorkerResult>>> {
    std::thread::Builder::new().name(format!("raf-worker-{}", setup.worker)).spawn(move || worker::run(setup)).map_err(|e| TrainError::Distributed(format!("cannot start a worker thread: {e}")))
}

/// The whole model from the workers' final states: each parameter from its
/// first holder, each table from its first holder (untouched ones at their
/// initial values), on a model built on `g`.
fn assemble(t: &TrainingConfig, g: &HetGraph, states: &[FinalState]) -> Result<models::Model> {
    let model = models::Model::new(&t.model_spec(), g, DType::F32, &candle_core::Device::Cpu)?;
    let mut model = model;
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut tables_done: BTreeSet<usize> = BTreeSet::new();
    for (w, st) in states.iter().enumerate() {
        // Each table this worker sent: its pieces in order, together whole.
        let mut next: std::collections::BTreeMap<usize, u64> = std::collections::BTreeMap::new();
        for (name, values) in &st.params {
            if done.contains(name) {
                continue;
            }
            let var = model.params.get(name).ok_or_else(|| TrainError::Distributed(format!("worker {w} sent unknown parameter {name}")))?;
            if var.elem_count() != values.len() {
                return Err(TrainError::Distributed(format!("worker {w} sent {} values for {name} ({} expected)", values.len(), var.elem_count())));
            }
            var.set(&Tensor::from_slice(values, var.shape(), var.device())?)?;
            done.insert(name.clone());
        }
        for (ty, at, rows) in &st.tables {
            let ty = *ty as usize;
            if tables_done.contains(&ty) {
                continue;
            }
            let e = model.embeddings.get_mut(ty).and_then(Option::as_mut).ok_or_else(|| TrainError::Distributed(format!("worker {w} sent a table for type {ty}, which has none")))?;
            let from = next.get(&ty).copied().unwrap_or(0);
            let to = from as usize + rows.len();
            if *at != from || to > e.data.len() {
                return Err(TrainError::Distributed(format!("worker {w} sent values {at}..{} of {} where {from}.. were due ({} in all)", *at as usize + rows.len(), e.name, e.data.len())));
            }
            e.data[from as usize..to].copy_from_slice(rows);
            next.insert(ty, to as u64);
        }
        for (ty, end) in next {
            let len = model.embeddings[ty].as_ref().map_or(0, |e| e.data.len());
            if end as usize != len {
                return Err(TrainError::Distributed(format!("worker {w} sent {end} of the {len} values of node type {ty}'s table")));
            }
            tables_done.insert(ty);
        }
    }
    Ok(model)
}

fn finish_report(report: &mut Report, cfg: &Config, model: &models::Model) -> Result<()> {
    report.config = cfg.clone();
    report.final_model_sha256 = crate::trainer::model_hash(model)?;
    report.parameters = (model.params.numel() + model.embeddings.iter().flatten().map(|e| e.data.len()).sum::<usize>()) as u64;
    report.peak_memory_bytes = peak_rss_bytes();
    Ok(())
}

/// Trains RAF with every worker's actors in this process.
pub fn train_embedded(cfg: &Config, observer: &mut dyn TrainObserver) -> Result<(Report, models::Model)> {
    let t = cfg.training.clone();
    let plan = open_plan(&t)?;
    let workers = plan.part_of.len() as u32;
    let graphs: Vec<Arc<HetGraph>> = plan.part_of.iter().map(|&k| plan.set.load_part(k, &load_options(&t)).map(Arc::new)).collect::<graphs::Result<_>>()?;
    let timeouts = Timeouts::default();
    let run = run_key(&t, &plan, &graphs[0]);
    let common = Common { run: run.clone(), per_layer: per_layer(&plan, &graphs[0])?, replicas: replicas(&plan), cfg: t.clone(), timeouts };
    let (system, (inboxes, coord)) = System::start(move || async move {
        let node = Node::embedded("local").map_err(|e| TrainError::Distributed(e.to_string()))?;
        let inboxes = (0..workers).map(|w| serve_worker(&node, w)).collect::<Result<Vec<_>>>()?;
        let coord = serve_raf_coordinator(&node)?;
        Ok((node, Vec::new(), (inboxes, coord)))
    })?;
    observer.ready(&graphs[0], &models::Model::new(&t.model_spec(), &graphs[0], DType::F32, &candle_core::Device::Cpu)?);
    let (driven, report, results) = std::thread::scope(|scope| {
        let loops: Vec<_> = (0..workers)
            .map(|w| {
                let (common, g, node, handle, inbox) = (&common, graphs[w as usize].clone(), system.node.clone(), system.handle.clone(), inboxes[w as usize].clone());
                scope.spawn(move || serve_worker_generations(common, w, &g, &node, &handle, &inbox, timeouts.finish, |_, _| Ok(())))
            })
            .collect();
        let mut d = driver(&t, workers, &coord, &system, timeouts, run, vec!["local".into(); workers as usize], timeouts.finish);
        let driven = d.run(&graphs[0], observer);
        for i in &inboxes {
            if let Err(e) = &driven {
                i.abort(format!("the coordinator failed: {e}"));
            }
            i.finish(driven.is_ok());
        }
        let results: Vec<Result<Option<WorkerResult>>> = loops.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(TrainError::Distributed("a worker thread panicked".into())))).collect();
        (driven, d.c.report, results)
    });
    driven?;
    let mut report = report;
    let states = results.into_iter().map(|r| r.and_then(finished).and_then(|r| worker::final_state(&r))).collect::<Result<Vec<_>>>()?;
    let model = assemble(&t, &graphs[0], &states)?;
    finish_report(&mut report, cfg, &model)?;
    drop(system);
    Ok((report, model))
}

/// Which node runs which worker: worker 0 (the reducer's partition) where
/// `[placement]` puts `reducer`, else on the first node; the others in node order.
pub fn raf_placement(topology: &mut runtime::Topology) -> Vec<String> {
    let ids: Vec<String> = topology.cluster.nodes.iter().map(|n| n.id.clone()).collect();
    let first = topology.placed(names::REDUCER).map(str::to_string).filter(|r| ids.contains(r)).unwrap_or_else(|| ids.first().cloned().unwrap_or_default());
    let order: Vec<String> = std::iter::once(first.clone()).chain(ids.into_iter().filter(|i| *i != first)).collect();
    for (w, id) in order.iter().enumerate() {
        topology.placement.insert(names::worker(w as u32), id.clone());
    }
    topology.placement.insert(names::REDUCER.to_string(), first.clone());
    topology.placement.insert(crate::dist::names::COORDINATOR.to_string(), first.clone());
    topology.placement.insert(format!("{}/final", crate::dist::names::COORDINATOR), first);
    order
}

/// Runs node `id`'s worker over the run's generations; on the reducer's node
/// also the coordination, checkpoints and report (returned there).
pub fn run_node(cfg: &Config, id: &str, observer: &mut dyn TrainObserver) -> Result<Option<Report>> {
    let t = cfg.training.clone();
    let mut topology = cfg.topology().ok_or_else(|| TrainError::Config("cluster: hetgnn node needs a [cluster] section".into()))?;
    let plan = open_plan(&t)?;
    let workers = plan.part_of.len() as u32;
    if workers as usize != topology.cluster.nodes.len() {
        return Err(TrainError::Config(format!(
            "training.partitions: {workers} meta-partitions for {} nodes; raf runs one partition per node (hetgnn partition --method meta --parts {})",
            topology.cluster.nodes.len(),
            topology.cluster.nodes.len()
        )));
    }
    let order = raf_placement(&mut topology);
    let w = order.iter().position(|n| n == id).ok_or_else(|| TrainError::Config(format!("--node {id}: not in cluster.nodes")))? as u32;
    let graph = Arc::new(plan.set.load_part(plan.part_of[w as usize], &load_options(&t))?);
    let timeouts = Timeouts { start: Duration::from_millis(topology.cluster.start_timeout_ms), ..Timeouts::default() };
    let rejoin = Duration::from_millis(topology.cluster.rejoin_timeout_ms);
    let run = run_key(&t, &plan, &graph);
    let common = Common { run: run.clone(), per_layer: per_layer(&plan, &graph)?, replicas: replicas(&plan), cfg: t.clone(), timeouts };
    let (topo, me) = (topology.clone(), id.to_string());
    let (system, (inbox, coord)) = System::start(move || async move {
        let node = Node::start(topo.clone(), &me).await?;
        let inbox = serve_worker(&node, w)?;
        let coord = if w == 0 { Some(serve_raf_coordinator(&node)?) } else { None };
        tracing::info!("{me}: raf worker {w} of {workers} served; waiting for peers");
        if let Err(e) = wait_for_peers(&node, &topo, timeouts.start).await {
            node.shutdown().await;
            return Err(e);
        }
        watch_peers(&node, std::iter::once(inbox.clone()).chain(coord.clone()).collect());
        Ok((node, Vec::new(), (inbox, coord)))
    })?;
    let Some(coord) = coord else {
        // Each successful attempt's final state goes to the coordinator, which takes the last one.
        let send = |gen: u64, r: &WorkerResult| worker::send_final(&system.node, &system.handle, &inbox, w, gen, r, timeouts.ask);
        serve_worker_generations(&common, w, &graph, &system.node, &system.handle, &inbox, rejoin, send)?;
        tracing::info!("{id}: the run is over");
        return Ok(None);
    };
    let (driven, report, mine) = std::thread::scope(|scope| {
        let (common, g, node, handle, ib) = (&common, graph.clone(), system.node.clone(), system.handle.clone(), inbox.clone());
        let mine = scope.spawn(move || serve_worker_generations(common, w, &g, &node, &handle, &ib, rejoin, |_, _| Ok(())));
        let mut d = driver(&t, workers, &coord, &system, timeouts, run, order.clone(), rejoin);
        let driven = d.run(&graph, observer);
        // The peers' final states (sent after their last attempt) are gathered before they hear the end.
        let gathered = driven.as_ref().map_err(|e| TrainError::Distributed(e.to_string())).and_then(|()| (1..workers).map(|k| gather_final(&coord, k, timeouts)).collect::<Result<Vec<_>>>());
        if let Err(e) = &driven {
            inbox.abort(format!("the coordinator failed: {e}"));
        }
        inbox.finish(driven.is_ok());
        let mine = mine.join().unwrap_or_else(|_| Err(TrainError::Distributed("the worker thread panicked".into())));
        (driven.and(gathered), d.c.report, mine)
    });
    let finished = driven.and_then(|peers| {
        let mut report = report;
        let states = std::iter::once(finished(mine?).and_then(|r| worker::final_state(&r))).chain(peers.into_iter().map(Ok)).collect::<Result<Vec<_>>>()?;
        let model = assemble(&t, &graph, &states)?;
        finish_report(&mut report, cfg, &model)?;
        Ok(report)
    });
    let peers: Vec<(String, String)> = (1..workers).map(|k| (names::worker(k), order[k as usize].clone())).collect();
    crate::dist::tell_finish(&system, &peers, finished.is_ok());
    let report = finished?;
    drop(system);
    Ok(Some(report))
}

/// Worker `k`'s final state, gathered piece by piece (piece 0 says how many follow).
fn gather_final(coord: &Inbox, k: u32, timeouts: Timeouts) -> Result<FinalState> {
    let mut state = FinalState::default();
    let mut pieces = 1;
    let mut i = 0u32;
    while i < pieces {
        let bytes = coord.raw("a worker's final state", u64::from(i), messages::round::FINAL, &[k], timeouts.step)?.swap_remove(0);
        let p: messages::FinalPiece = messages::decode(&bytes).map_err(|e| TrainError::Distributed(format!("worker {k}'s final state: {e}")))?;
        if i == 0 {
            pieces = p.pieces.max(1);
        }
        state.params.extend(p.state.params);
        state.tables.extend(p.state.tables);
        i += 1;
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphs::graph::GraphBuilder;
    use graphs::{Features, Splits};

    fn graph() -> HetGraph {
        let (papers, authors) = (20u32, 30u32);
        GraphBuilder::new("g", "paper", 2)
            .node_type("paper", papers, Some(Features::from_vec(papers as usize, 2, vec![0.5; 2 * papers as usize])))
            .node_type("author", authors, None)
            .labels((0..papers).map(|i| i64::from(i % 2)).collect(), Splits { train: (0..papers).collect(), valid: vec![], test: vec![] })
            .relation("author", "writes", "paper", (0..40).map(|i| i % authors).collect(), (0..40).map(|i| i % papers).collect())
            .build()
            .unwrap()
    }

    #[test]
    fn final_states_in_pieces_assemble_whole_tables_and_gaps_are_refused() {
        let g = graph();
        let t = TrainingConfig { hidden: 4, embed_dim: 3, ..TrainingConfig::default() };
        let rows: Vec<f32> = (0..90).map(|i| i as f32).collect();
        let author = g.type_id("author").unwrap().index() as u32;
        let pieces = |cuts: &[(u64, usize, usize)]| FinalState { params: Vec::new(), tables: cuts.iter().map(|&(at, a, b)| (author, at, rows[a..b].to_vec())).collect() };
        let m = assemble(&t, &g, &[pieces(&[(0, 0, 40), (40, 40, 41), (41, 41, 90)])]).unwrap();
        assert_eq!(m.embeddings[author as usize].as_ref().unwrap().data, rows);
        let gap = assemble(&t, &g, &[pieces(&[(0, 0, 40), (41, 41, 90)])]).unwrap_err().to_string();
        assert!(gap.contains("where 40.. were due"), "{gap}");
        let short = assemble(&t, &g, &[pieces(&[(0, 0, 40)])]).unwrap_err().to_string();
        assert!(short.contains("40 of the 90 values"), "{short}");
    }
}
