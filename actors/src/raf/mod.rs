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
use crate::dist::inbox::{Inbox, InboxActor};
use crate::dist::messages::{Abort, Finish};
use crate::dist::checkpoint;
use crate::dist::coordinator::Coordinator;
use crate::dist::{abort_peers, join_threads, load_options, serve_coordinator, wait_for_peers, watch_peers, System, Timeouts};
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

/// Fingerprint of everything that shapes a raf run's bits: checkpoints are
/// only resumed by an equal run.
fn run_key(t: &TrainingConfig, plan: &Plan, g: &HetGraph) -> String {
    use sha2::{Digest, Sha256};
    let text = format!(
        "raf|{:?}|{}|{}|{:?}|{}|{}|{}|{:?}|{:?}|{:?}",
        t.model_spec(),
        g.name(),
        t.reverse_edges,
        t.fanouts,
        t.batch,
        t.lr,
        t.seed,
        t.raf_embeddings,
        plan.part_of,
        plan.set.manifest
    );
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The newest valid checkpoint of this run in `checkpoint_dir`, if any (every
/// node reads the same directory before training starts, so all pick the same).
fn resume_point(t: &TrainingConfig, run: &str, observer: &mut dyn TrainObserver) -> Result<Option<(std::path::PathBuf, checkpoint::Manifest)>> {
    let Some(root) = &t.checkpoint_dir else { return Ok(None) };
    let Some((m, skipped)) = checkpoint::latest(root, run)? else { return Ok(None) };
    for s in skipped {
        observer.note(&format!("skipped checkpoint: {s}"));
    }
    observer.note(&format!("resuming from the checkpoint at step {}", m.seq));
    Ok(Some((checkpoint::dir(root, m.seq), m)))
}

/// Follows the run from `from` to its end, completing its checkpoints.
#[allow(clippy::too_many_arguments)] // the coordinator's whole context
fn coordinate(t: &TrainingConfig, workers: u32, inbox: &Inbox, g: &HetGraph, observer: &mut dyn TrainObserver, timeouts: Timeouts, run: String, from: Option<&checkpoint::Manifest>) -> Result<Report> {
    let mut c = Coordinator::new("raf", t, workers, workers, inbox, timeouts, run);
    c.attempt(g, observer, from)?;
    let mut report = c.report;
    report.resumed_from_step = from.map(|m| m.seq);
    Ok(report)
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
            .handle::<Finish>();
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
    std::thread::Builder::new()
        .name(format!("raf-worker-{}", setup.worker))
        .spawn(move || worker::run(setup))
        .map_err(|e| TrainError::Distributed(format!("cannot start a worker thread: {e}")))
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
    let per_layer = per_layer(&plan, &graphs[0])?;
    let timeouts = Timeouts::default();
    let run = run_key(&t, &plan, &graphs[0]);
    let from = resume_point(&t, &run, observer)?;
    let (system, (inboxes, coord)) = System::start(move || async move {
        let node = Node::embedded("local").map_err(|e| TrainError::Distributed(e.to_string()))?;
        let inboxes = (0..workers).map(|w| serve_worker(&node, w)).collect::<Result<Vec<_>>>()?;
        let coord = serve_raf_coordinator(&node)?;
        Ok((node, Vec::new(), (inboxes, coord)))
    })?;
    let mut handles = Vec::new();
    for w in 0..workers {
        handles.push(spawn_worker(WorkerSetup {
            worker: w,
            per_layer: per_layer.clone(),
            replicas: replicas(&plan),
            cfg: t.clone(),
            graph: graphs[w as usize].clone(),
            node: system.node.clone(),
            handle: system.handle.clone(),
            inbox: inboxes[w as usize].clone(),
            timeouts,
            from: from.clone(),
        })?);
    }
    observer.ready(&graphs[0], &models::Model::new(&t.model_spec(), &graphs[0], DType::F32, &candle_core::Device::Cpu)?);
    let coordinated = coordinate(&t, workers, &coord, &graphs[0], observer, timeouts, run, from.as_ref().map(|(_, m)| m));
    if let Err(e) = &coordinated {
        // The workers stop instead of training on unobserved.
        for i in &inboxes {
            i.abort(format!("the coordinator failed: {e}"));
        }
    }
    let results = join_threads(handles)?;
    let mut report = coordinated?;
    let states = results.iter().map(worker::final_state).collect::<Result<Vec<_>>>()?;
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

/// Runs node `id`'s worker; on the reducer's node also the coordination and
/// report (returned there).
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
    let per_layer = per_layer(&plan, &graph)?;
    let timeouts = Timeouts { start: Duration::from_millis(topology.cluster.start_timeout_ms), ..Timeouts::default() };
    let run = run_key(&t, &plan, &graph);
    let from = resume_point(&t, &run, observer)?;
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
    let handle = spawn_worker(WorkerSetup {
        worker: w,
        per_layer,
        replicas: replicas(&plan),
        cfg: t.clone(),
        graph: graph.clone(),
        node: system.node.clone(),
        handle: system.handle.clone(),
        inbox: inbox.clone(),
        timeouts,
        from: from.clone(),
    })?;
    let Some(coord) = coord else {
        let result = join_threads(vec![handle])?;
        worker::send_final(&system.node, &system.handle, w, &result[0], timeouts.ask)?;
        tracing::info!("{id}: training done; serving until the coordinator finishes");
        inbox.finished(timeouts.finish)?;
        return Ok(None);
    };
    let coordinated = coordinate(&t, workers, &coord, &graph, observer, timeouts, run, from.as_ref().map(|(_, m)| m));
    if let Err(e) = &coordinated {
        inbox.abort(format!("the coordinator failed: {e}"));
    }
    let finished = join_threads(vec![handle]).and_then(|mine| {
        let mut report = coordinated?;
        let mut states = vec![worker::final_state(&mine[0])?];
        let peers: Vec<u32> = (1..workers).collect();
        for k in peers {
            // Piece 0 says how many follow; pieces are gathered in order.
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
            states.push(state);
        }
        let model = assemble(&t, &graph, &states)?;
        finish_report(&mut report, cfg, &model)?;
        Ok(report)
    });
    let report = match finished {
        Ok(r) => r,
        Err(e) => {
            // The other nodes would otherwise wait out their deadlines.
            let targets: Vec<String> = (1..workers).map(names::worker).collect();
            abort_peers(&system.node, &system.handle, &names::worker(0), 0, 0, &targets, &e.to_string());
            return Err(e);
        }
    };
    let asks: Vec<_> = (1..workers).filter_map(|k| system.node.actor(&names::worker(k)).ok()).map(|r| async move { r.ask(Finish, Duration::from_secs(10)).await }).collect();
    for r in system.handle.block_on(futures_util::future::join_all(asks)) {
        if let Err(e) = r {
            tracing::warn!("{id}: could not tell a peer the run is over: {e}");
        }
    }
    drop(system);
    Ok(Some(report))
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
