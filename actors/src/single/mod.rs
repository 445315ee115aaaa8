//! Single-process training: sample → gather → forward/backward → update, with
//! evaluation after every epoch. Every source of randomness is keyed by the
//! seed, so two runs with the same configuration are bit-identical on CPU.

use std::time::Instant;

use candle_core::{DType, Device};
use graphs::{HetGraph, LoadOptions, Sampler};
use models::checkpoint;
use models::model::DropoutKey;
use models::optim::{Adam, AdamConfig};
use models::rgcn::PerType;
use models::Model;

use std::collections::BTreeMap;

use crate::config::Config;
use crate::distributed::checkpoint::Progress;
use crate::distributed::messages::EpochStats;
use crate::epoch::run::{Attempt, Items, StepFigures, Steps};
use crate::epoch::{lap, prepare, sample, Prepared, SamplingPlan, EVAL_BATCH};
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;
use crate::observer::TrainObserver;
use crate::report::{EpochReport, Report};
use crate::task::edge::{EdgeBatch, EdgeTask};
use crate::task::link::LinkTask;
use crate::task::multi::{EdgesBeside, NodeTasks, EDGE_BATCH_KEY};
use crate::task::node::Scores;

mod config;
pub use config::SingleConfig;

/// Single-process training: the graph in `training.data`, one model, one optimiser.
pub struct Single;

impl crate::modes::seam::TrainingMode for Single {
    fn train_embedded(
        &self,
        cfg: &Config,
        observer: &mut dyn TrainObserver,
    ) -> Result<(Report, Model)> {
        train(cfg, observer)
    }

    /// A node of a cluster with nothing to train: it serves the runtime
    /// (`hetgnn doctor` asks it) until Ctrl-C or SIGTERM.
    fn run_node(
        &self,
        cfg: &Config,
        id: &str,
        _observer: &mut dyn TrainObserver,
    ) -> Result<Option<Report>> {
        crate::cluster::run_node(cfg, id, crate::cluster::stop_signal())?;
        Ok(None)
    }
}

/// Every setting that shapes a single-process run's trajectory, as the
/// distributed modes fingerprint theirs.
fn run_fingerprint(t: &crate::config::TrainingConfig, g: &HetGraph) -> String {
    crate::distributed::checkpoint::fingerprint(
        t,
        g.name(),
        &[b"single", t.link_fingerprint().as_bytes()],
    )
}

/// Trains as `cfg` says on the graph in `cfg.training.data` (which must be set).
pub fn train(cfg: &Config, observer: &mut dyn TrainObserver) -> Result<(Report, Model)> {
    let t = &cfg.training;
    let data = t
        .data
        .as_ref()
        .ok_or_else(|| TrainError::Config("training.data: no graph directory given".into()))?;
    let device = crate::device::open(&t.device)?;
    // Link prediction removes its held-out edges before the reverses are added.
    let edge_level = t.edge_level();
    let is_link = edge_level == Some(crate::config::Task::LinkPrediction);
    let g = graphs::load(
        data,
        &LoadOptions {
            mmap_features: true,
            reverse_edges: t.reverse_edges && !is_link,
        },
    )?;
    let (g, link) = match is_link {
        true => LinkTask::prepare(t, g).map(|(g, l)| (g, Some(l)))?,
        false => (g, None),
    };
    let edge = edge_level
        .filter(|e| e.on_edges())
        .map(|_| EdgeTask::prepare(t, &g))
        .transpose()?;
    let on_gpu = !device.is_cpu();
    let prefetch = crate::epoch::prefetch_workers(SingleConfig::of(t)?.prefetch_threads, on_gpu);
    // Batches ahead: the training queue, then evaluation's (two per thread).
    let ahead = crate::epoch::PREFETCH.max(2 * prefetch) + prefetch;
    let memory = crate::epoch::preflight::check(t, &g, true, ahead)?;
    let mut model = Model::new(&t.model_spec(), &g, DType::F32, &device)?;
    observer.ready(&g, &model);
    let mut adam = Adam::new(AdamConfig::with_lr(t.lr));
    let (_, splits) = g.target_labels();
    if t.task.on_nodes() {
        for (split, nodes) in [("validation", &splits.valid), ("test", &splits.test)] {
            if nodes.is_empty() {
                observer.note(&format!(
                    "the target type has no {split} nodes: {split} figures are reported as null"
                ));
            }
        }
    }
    let mut report = Report {
        config: cfg.clone(),
        mode: "single".into(),
        nodes: 1,
        link: link.as_ref().map(|l| l.report(&g, t)),
        edge: edge.as_ref().map(|e| e.report(&g, t)),
        memory_estimate_bytes: Some(memory.total().min(u128::from(u64::MAX)) as u64),
        ..Report::default()
    };
    // A task list's task on edges takes its batches beside the nodes' (`Mixed`).
    let mixed = EdgesBeside::of(
        t,
        match (&link, &edge) {
            (Some(l), _) => l.steps(),
            (None, Some(e)) => e.steps(),
            (None, None) => 1,
        },
    );
    let items = match (&link, &edge, &mixed) {
        (_, _, Some(m)) => Items::Mixed(&splits.train, m.steps),
        (Some(l), _, None) => Items::Link(l),
        (None, Some(e), None) => Items::Edges(e),
        (None, None, None) => Items::Nodes(&splits.train),
    };
    if let Some(r) = &report.edge {
        observer.note(&format!(
            "{} on {}: {} training, {} validation, {} test edges",
            edge_level.unwrap_or(t.task).name(),
            r.relations.join(", "),
            r.train_edges,
            r.valid_edges,
            r.test_edges
        ));
    }
    if let (Some(l), Some(r)) = (&link, &report.link) {
        observer.note(&format!(
            "link prediction on {}: {} training, {} validation, {} test edges",
            r.relations.join(", "),
            l.edges.train.len(),
            l.edges.valid.len(),
            l.edges.test.len()
        ));
    }

    let per_epoch = items.steps(t);
    // Checkpoints know the graph by its content, not its name alone.
    let graph_sha256 = match &t.checkpoint_dir {
        Some(_) => Some(graphs::fingerprint::content(data)?),
        None => None,
    };
    // Another run's parameters (read before the run's own checkpoint, which wins).
    let init = match &t.init_from {
        Some(_) => {
            let content = match &graph_sha256 {
                Some(c) => c.clone(),
                None => graphs::fingerprint::content(data)?,
            };
            crate::pretrained::init::Start::open(t, &g, Some(&content), &model)?
        }
        None => None,
    };
    if let (false, Some(root)) = (t.resume, &t.checkpoint_dir) {
        if !checkpoint::list(root)?.is_empty() {
            return Err(TrainError::Config(format!("training.checkpoint_dir: {} holds checkpoints of an earlier run; resume it (--resume) or use another directory", root.display())));
        }
    }
    if let (true, Some(root)) = (t.resume, &t.checkpoint_dir) {
        match checkpoint::latest(root)? {
            Some((dir, skipped)) => {
                for s in skipped {
                    observer.note(&format!("skipped checkpoint: {s}"));
                }
                let m = checkpoint::load(
                    &dir,
                    &mut model,
                    &mut adam,
                    g.name(),
                    graph_sha256.as_deref(),
                    t.reverse_edges,
                    Some(&run_fingerprint(t, &g)),
                )?;
                // The loop resumes by step: the checkpoint must end an epoch of this run's batches.
                if m.steps != m.epochs_done * per_epoch {
                    return Err(TrainError::Checkpoint(format!(
                        "{}: {} steps after {} epochs, but this run takes {per_epoch} steps per epoch (was training.batch or the training split changed?)",
                        dir.display(),
                        m.steps,
                        m.epochs_done
                    )));
                }
                report.steps = m.steps;
                report.resumed_from_step = Some(m.steps);
                observer.note(&format!(
                    "resumed from {} (epoch {}, step {})",
                    dir.display(),
                    m.epochs_done,
                    m.steps
                ));
            }
            None => observer.note(&format!(
                "no checkpoint in {}: starting from scratch",
                root.display()
            )),
        }
    }

    let mut frozen_tables = vec![false; g.node_types().len()];
    if let Some(start) = init {
        if report.resumed_from_step.is_none() {
            start.copy_params(&mut model)?;
            start.copy_tables(&mut model)?;
            observer.note(&start.sel.summary(&start.dir));
        }
        adam.frozen = start.sel.frozen_params();
        for (ty, f) in frozen_tables.iter_mut().enumerate() {
            *f = start.sel.frozen_table(ty);
        }
    }

    if t.cache_bytes.0 > 0
        && t.cache_policy != crate::cache::CachePolicy::None
        && !crate::cache::takes_every_row(t.cache_policy, t.cache_bytes.0, &g, &model)
    {
        observer.note(&format!(
            "cache: pre-sampling {} epoch(s) to count visits, then profiling miss penalties",
            t.cache_presample_epochs
        ));
    }
    let plan = SamplingPlan::of(t);
    let cache = {
        let mut presampler = plan.presample(&g)?;
        let uses_neighbors = model.uses_neighbors();
        crate::cache::build_local(t, &g, &model, &splits.train, |e, s, b| {
            sample(&mut presampler, uses_neighbors, e, s, b)
        })?
    };
    if let Some(c) = &cache {
        observer.note(&c.summary());
    }
    // On a GPU, prefetch threads only sample and gather into host memory; the
    // training thread copies the rows to the device and reads the cached ones
    // there: all CUDA work on one thread keeps the device's stream in step
    // order, and host threads never wait for it.
    let feed = Feed {
        graph: &g,
        gather: if on_gpu {
            model.feature_gather().on_host()
        } else {
            model.feature_gather()
        },
        cached: cache.as_ref().map(|c| c.features.clone()),
        cached_in_step: on_gpu,
        uses_neighbors: model.uses_neighbors(),
        plan: &plan,
        link: link.as_ref(),
        edge: edge.as_ref(),
        mixed,
    };
    // Kernels run behind the host: without a wait at each phase's end, a
    // phase's GPU time shows up in whichever later phase first waits for it.
    let sync_timing = on_gpu && std::env::var_os(SYNC_TIMING).is_some();
    if sync_timing {
        observer.note(&format!("{SYNC_TIMING}: waiting for the device at the end of every phase of a step (slower; for the split)"));
    }
    let mut run = Run {
        cfg,
        g: &g,
        device,
        model,
        adam,
        cache,
        report,
        observer,
        per_epoch,
        prefetch,
        sync_timing,
        task: NodeTasks::of(t, &g)?,
        graph_sha256,
        frozen_tables,
    };
    let attempt = Attempt {
        node: None,
        gen: 0,
        trainer: 0,
        cfg: t,
        items,
        resumed: Default::default(),
    };
    crate::epoch::run::run(&attempt, &feed, &mut run)?;
    let Run {
        model,
        cache,
        mut report,
        ..
    } = run;
    if let Some(c) = &cache {
        report.cache = c.report();
    }
    crate::report::finish(&mut report, &model)?;
    Ok((report, model))
}

/// Set (to anything) to time each phase of a GPU step by its device work:
/// the device is synchronised at every phase's end.
pub const SYNC_TIMING: &str = "HETGNN_SYNC_TIMING";

/// What the prefetch thread reads: the graph and how to gather its features.
struct Feed<'g> {
    graph: &'g HetGraph,
    gather: models::model::FeatureGather,
    cached: Option<std::sync::Arc<crate::cache::FeatureCache>>,
    /// The cached rows are read by the training thread (on a GPU), not the prefetch threads.
    cached_in_step: bool,
    uses_neighbors: bool,
    /// Fanouts and seeds.
    plan: &'g SamplingPlan,
    /// Link prediction's edges and settings (`None`: another task).
    link: Option<&'g LinkTask>,
    /// An edge task's edges and settings (`None`: another task).
    edge: Option<&'g EdgeTask>,
    /// Node tasks with `link` or `edge` beside them in one task list.
    mixed: Option<EdgesBeside>,
}

/// A batch prepared ahead of its step, with an edge task's edges (and a
/// mixed task list's batch on edges).
struct Batch {
    p: Prepared,
    edge: Option<EdgeBatch>,
    beside: Option<Box<Batch>>,
}

impl Feed<'_> {
    /// A mixed task list's batch on edges for step `step` of `epoch`: its
    /// step (whose edges the neighbourhoods leave out) and its edges.
    fn edges_beside(&self, epoch: u64, step: u64) -> Option<(u64, Vec<u32>)> {
        let m = self.mixed.as_ref()?;
        Some(m.batch(epoch, step, |e| match (self.link, self.edge) {
            (Some(l), _) => l.batches(e),
            (None, Some(t)) => t.batches(e),
            (None, None) => Vec::new(),
        }))
    }
}

/// A single-process run as the epoch loop drives it.
struct Run<'g, 'o> {
    cfg: &'g Config,
    g: &'g HetGraph,
    device: Device,
    model: Model,
    adam: Adam,
    cache: Option<crate::cache::DeviceCache>,
    report: Report,
    observer: &'o mut dyn TrainObserver,
    /// Steps per epoch.
    per_epoch: u64,
    /// Prefetch threads.
    prefetch: usize,
    /// Wait for the device at the end of each phase of a step ([`SYNC_TIMING`]).
    sync_timing: bool,
    /// What the node steps learn (resolved once: class weights read the training split).
    task: NodeTasks<'g>,
    /// The graph's content, recorded in checkpoints.
    graph_sha256: Option<String>,
    /// Per node type, whether its table is frozen (`training.freeze`).
    frozen_tables: Vec<bool>,
}

impl Run<'_, '_> {
    /// The node tasks' validation and test figures into `st`.
    fn evaluate_nodes(&self, epoch: u64, st: &mut EpochStats) -> Result<()> {
        let (_, splits) = self.g.target_labels();
        let [valid, test] = [&splits.valid, &splits.test].map(|nodes| self.score(epoch, nodes));
        self.task.record(st, valid?, test?);
        Ok(())
    }

    /// The link or edge task's validation and test figures into `st`.
    fn evaluate_edges(&self, feed: &Feed<'_>, epoch: u64, st: &mut EpochStats) -> Result<()> {
        let t = &self.cfg.training;
        if let Some(task) = feed.link {
            st.link = Some(match t.exact_link_eval() {
                true => task.evaluate_exact(&self.model, self.g)?,
                false => task.evaluate_sampled(
                    &self.model,
                    self.g,
                    sampled_rows(self.g, &self.model, t, epoch)?,
                )?,
            });
        }
        if let Some(task) = feed.edge {
            let [valid, test] = match t.exact_edge_eval() {
                true => task.evaluate_exact(&self.model, self.g)?,
                false => task.evaluate_sampled(
                    &self.model,
                    self.g,
                    sampled_rows(self.g, &self.model, t, epoch)?,
                )?,
            };
            st.set_edge_scores(valid, test);
        }
        Ok(())
    }

    /// A batch's input rows on the device: its gathered features (those a
    /// GPU cache holds read here) and its learnable rows.
    fn inputs(
        &self,
        feed: &Feed<'_>,
        features: PerType,
        mb: &graphs::MiniBatch,
    ) -> Result<PerType> {
        // Rows gathered into host memory for a GPU (see `train`) go to the device here.
        let mut inputs: PerType = features
            .into_iter()
            .map(|x| x.map(|x| x.to_device(&self.device)).transpose())
            .collect::<candle_core::Result<_>>()?;
        let model = &self.model;
        if let (Some(c), true) = (&feed.cached, feed.cached_in_step) {
            c.fill_cached(
                &model.feature_gather(),
                self.g,
                &mb.blocks[0].src,
                &mut inputs,
                true,
            )?;
        }
        match &self.cache {
            Some(c) => c.gather_embeddings(model, &mb.blocks[0].src, &mut inputs, true)?,
            None => model.gather_embeddings(&mb.blocks[0].src, &mut inputs)?,
        }
        Ok(inputs)
    }

    /// The evaluation figures of the run's task on `nodes` with sampled
    /// neighborhoods (evaluation's sampling key) and no dropout, the batches
    /// sampled on the prefetch threads ahead of the model (samples are pure
    /// functions of (epoch, step, seeds): the same batches as one sampler's),
    /// reading the rows the cache holds from it, as the steps read them (on a
    /// GPU: no copy from the host). The values are the tables', so the
    /// predictions are too.
    fn score(&self, epoch: u64, nodes: &[u32]) -> Result<Vec<Scores>> {
        let (g, model, task) = (self.g, &self.model, &self.task);
        let plan = SamplingPlan::of(&self.cfg.training);
        let (workers, cache) = (self.prefetch, self.cache.as_ref());
        let batches: Vec<Vec<u32>> = nodes.chunks(EVAL_BATCH).map(<[u32]>::to_vec).collect();
        let uses_neighbors = model.uses_neighbors();
        let make = || -> Result<_> {
            let mut sampler = plan.eval(g)?;
            Ok(move |step: u64, seeds: &[u32]| {
                sample(&mut sampler, uses_neighbors, epoch, step, seeds)
            })
        };
        let mut scores = task.empty_scores();
        crate::epoch::run_steps(2 * workers, workers, &batches, 0, make, |_, seeds, mb| {
            let src = &mb.blocks[0].src;
            let inputs = match cache {
                Some(c) => c.gather_inputs(model, g, src, false)?,
                None => model.gather_inputs(g, src)?,
            };
            let logits = model.forward(g, &mb, inputs, None)?.detach();
            task.score(&logits, seeds, &mut scores)
        })?;
        Ok(scores)
    }
}

impl<'g> Steps for Run<'g, '_> {
    type Feed = Feed<'g>;
    type Batch = Batch;
    type State<'f>
        = Sampler<'f>
    where
        Self: 'f;

    fn seq(&self) -> u64 {
        self.report.steps
    }

    /// Its checkpoint format keeps no running figures of a cut epoch.
    fn checkpoints_mid_epoch(&self) -> bool {
        false
    }

    fn epoch_start(&mut self, epoch: u64, steps: u64) {
        self.observer.epoch_start(epoch, steps);
    }

    /// Batches are pure functions of (epoch, step, seeds): any number of threads may make them.
    fn prefetch_workers(&self) -> usize {
        self.prefetch
    }

    fn feed_state<'f>(feed: &'f Feed<'g>) -> Result<Sampler<'f>> {
        feed.plan.train(feed.graph)
    }

    /// Samples the batch and gathers its feature rows.
    /// Link prediction and edge tasks: `seeds` are training edges, whose
    /// ends (and negatives) are sampled with the step's own edges left out.
    /// A mixed task list: `seeds` are nodes, and the step's batch of the
    /// task on edges is prepared beside them.
    fn prepare<'f>(
        feed: &'f Feed<'g>,
        sampler: &mut Sampler<'f>,
        epoch: u64,
        step: u64,
        seeds: &[u32],
    ) -> Result<Batch> {
        if let Some((bucket, ids)) = feed.edges_beside(epoch, step) {
            let p = prepare_nodes(feed, sampler, epoch, step, seeds)?;
            let beside = prepare_edges(feed, sampler, epoch, bucket, &ids)?;
            return Ok(Batch {
                p,
                edge: None,
                beside: Some(Box::new(beside)),
            });
        }
        if feed.edge.is_some() || feed.link.is_some() {
            return prepare_edges(feed, sampler, epoch, step, seeds);
        }
        Ok(Batch {
            p: prepare_nodes(feed, sampler, epoch, step, seeds)?,
            edge: None,
            beside: None,
        })
    }

    /// The model after the steps before [`Steps::seq`] (an epoch end).
    fn checkpoint(&mut self, _: &Feed<'g>, _: Progress) -> Result<()> {
        let (t, Some(root)) = (&self.cfg.training, &self.cfg.training.checkpoint_dir) else {
            return Ok(());
        };
        // Checkpoints read the tables: bring the cached rows home.
        if let Some(c) = &self.cache {
            c.write_back(&mut self.model)?;
        }
        let steps = self.report.steps;
        let info = checkpoint::RunInfo {
            graph: self.g.name().to_string(),
            graph_sha256: self.graph_sha256.clone(),
            reverse_edges: t.reverse_edges,
            fanouts: t.fanouts.clone(),
            epochs_done: steps / self.per_epoch.max(1),
            steps,
            run: run_fingerprint(t, self.g),
        };
        checkpoint::save(root, &self.model, &self.adam, &info, t.checkpoint_keep)?;
        Ok(())
    }

    /// On the CPU, runs as a job on rayon's pool, so that the step's parallel
    /// ops split their work among the pool's threads without waking one from
    /// outside each time (mag-like S=0.05 on 2 cores: 130,000 context
    /// switches fewer in 3 epochs, 12% off an epoch). Only a step that waits
    /// for no other thread may: a pool thread blocked there could hold work
    /// that thread needs. On a GPU the step stays on the thread that made the
    /// device's context, and its host ops are few.
    fn step(
        &mut self,
        feed: &Feed<'g>,
        epoch: u64,
        step: u64,
        _: &[u32],
        batch: Batch,
        st: &mut EpochStats,
    ) -> Result<StepFigures> {
        match self.device.is_cpu() {
            true => rayon::scope(|_| self.step_here(feed, epoch, step, batch, st)),
            false => self.step_here(feed, epoch, step, batch, st),
        }
    }

    fn evaluate(&mut self, feed: &Feed<'g>, epoch: u64, st: &mut EpochStats) -> Result<()> {
        // Evaluation reads the tables: bring the cached rows home.
        if let Some(c) = &self.cache {
            c.write_back(&mut self.model)?;
        }
        let Some(m) = &feed.mixed else {
            if feed.link.is_some() || feed.edge.is_some() {
                return self.evaluate_edges(feed, epoch, st);
            }
            return self.evaluate_nodes(epoch, st);
        };
        // The task on edges' own account, between the node tasks' in list order.
        let mut own = match m.at < st.tasks.len() {
            true => st.tasks.remove(m.at),
            false => EpochStats::default(),
        };
        self.evaluate_nodes(epoch, st)?;
        self.evaluate_edges(feed, epoch, &mut own)?;
        st.tasks.insert(m.at.min(st.tasks.len()), own);
        Ok(())
    }

    fn cache_figures(&self) -> BTreeMap<String, crate::cache::CacheTypeReport> {
        self.cache.as_ref().map(|c| c.report()).unwrap_or_default()
    }

    /// The epoch's account becomes the report's epoch.
    fn send_stats(&mut self, _: &Feed<'g>, st: EpochStats) -> Result<()> {
        let (_, splits) = self.g.target_labels();
        let (valid, test) = (splits.valid.len(), splits.test.len());
        let mut er =
            EpochReport::from_stats(st.epoch, std::slice::from_ref(&st), valid, test, false);
        if self.task.is_multi() {
            let tasks = &self.cfg.training.tasks;
            er.tasks = crate::report::TaskEpoch::all(st.epoch, &[st], tasks, (valid, test), false);
        }
        self.observer.epoch_end(&er);
        self.report.epochs.push(er);
        Ok(())
    }
}

impl<'g> Run<'g, '_> {
    /// [`Steps::step`]'s work, on whichever thread calls it.
    fn step_here(
        &mut self,
        feed: &Feed<'g>,
        epoch: u64,
        step: u64,
        batch: Batch,
        st: &mut EpochStats,
    ) -> Result<StepFigures> {
        let Batch { p, edge, beside } = batch;
        let task = &self.task;
        let link = feed.link.zip(p.link.as_ref());
        let edge = feed.edge.zip(edge.as_ref());
        // A link or edge step's size is binomial: one may, rarely, hold no edge.
        if link.is_some_and(|(_, b)| b.edges.is_empty())
            || edge.is_some_and(|(_, b)| b.edges.is_empty())
        {
            self.report.steps += 1;
            self.observer.step(0.0);
            return Ok(StepFigures::default());
        }
        let mb = &p.mb;
        let seeds = &mb.seeds;
        st.time.sample_s += p.sample_s;
        st.time.gather_s += p.gather_s;
        let mut clock = Instant::now();
        let inputs = self.inputs(feed, p.features, mb)?;
        let beside = match beside {
            Some(b) => {
                st.time.sample_s += b.p.sample_s;
                st.time.gather_s += b.p.gather_s;
                let x = self.inputs(feed, b.p.features, &b.p.mb)?;
                Some((x, b.p.mb, b.p.link, b.edge))
            }
            None => None,
        };
        let model = &mut self.model;
        let wait = |on: bool, device: &Device| if on { device.synchronize() } else { Ok(()) };
        wait(self.sync_timing, &self.device)?;
        st.time.gather_s += lap(&mut clock);
        let dropout = Some(DropoutKey { epoch, step });
        let mut edge_correct = 0;
        let mut each = Vec::new();
        let (mut loss, logits) = match (link, edge) {
            (Some((task, batch)), _) => (
                task.loss(
                    model,
                    &model.forward_nodes(self.g, mb, inputs.clone(), dropout)?,
                    batch,
                )?,
                None,
            ),
            (None, Some((task, batch))) => {
                let out = model.forward_nodes(self.g, mb, inputs.clone(), dropout)?;
                edge_correct = task.correct(model, &out, batch)?;
                (task.loss(model, &out, batch)?, None)
            }
            (None, None) => {
                let logits = model.forward(self.g, mb, inputs.clone(), dropout)?;
                let losses = task.loss(&logits, seeds)?;
                each = losses.each;
                (losses.total, Some(logits))
            }
        };
        // A mixed task list: the task on edges' loss on its batch, weighted, joins the sum.
        if let (Some(m), Some((x, bmb, blink, bedge))) = (&feed.mixed, &beside) {
            let key = Some(DropoutKey {
                epoch,
                step: step + EDGE_BATCH_KEY,
            });
            let own = match (feed.link.zip(blink.as_ref()), feed.edge.zip(bedge.as_ref())) {
                (Some((t, b)), _) if !b.edges.is_empty() => {
                    let out = model.forward_nodes(self.g, bmb, x.clone(), key)?;
                    Some(t.loss(model, &out, b)?)
                }
                (None, Some((t, b))) if !b.edges.is_empty() => {
                    let out = model.forward_nodes(self.g, bmb, x.clone(), key)?;
                    Some(t.loss(model, &out, b)?)
                }
                _ => None,
            };
            let own = match own {
                Some(l) => {
                    loss = (loss + l.affine(m.weight, 0.0)?)?;
                    l.detach()
                }
                None => candle_core::Tensor::zeros((), loss.dtype(), loss.device())?,
            };
            each.insert(m.at.min(each.len()), own);
        }
        let grads = loss.backward()?;
        wait(self.sync_timing, &self.device)?;
        st.time.compute_s += lap(&mut clock);
        self.adam.step(&model.params, &grads)?;
        let cache = &mut self.cache;
        for (ty, x) in inputs.iter().enumerate() {
            if self.frozen_tables[ty] {
                continue;
            }
            let Some(table) = model.embeddings[ty].as_mut() else {
                continue;
            };
            if let Some((bx, bmb, ..)) = &beside {
                // Rows both batches read take one step of their summed gradients.
                let parts: Vec<(&[u32], &candle_core::Tensor)> = [
                    (mb.blocks[0].src[ty].as_slice(), x.as_ref()),
                    (bmb.blocks[0].src[ty].as_slice(), bx[ty].as_ref()),
                ]
                .into_iter()
                .filter_map(|(ids, x)| Some((ids, grads.get(x?)?)))
                .collect();
                table.sparse_adam_parts(&parts, &self.adam.cfg)?;
                continue;
            }
            if let Some(gr) = x.as_ref().and_then(|x| grads.get(x)) {
                match cache.as_mut() {
                    Some(c) => {
                        c.sparse_adam(ty, table, &mb.blocks[0].src[ty], gr, &self.adam.cfg)?
                    }
                    None => table.sparse_adam(&mb.blocks[0].src[ty], gr, &self.adam.cfg)?,
                }
            }
        }
        wait(self.sync_timing, &self.device)?;
        st.time.update_s += lap(&mut clock);
        let l = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        if !l.is_finite() {
            return Err(TrainError::Diverged {
                epoch,
                step: self.report.steps,
                loss: l,
            });
        }
        let tasks = each
            .iter()
            .map(|e| e.to_dtype(DType::F64)?.to_scalar::<f64>())
            .collect::<candle_core::Result<Vec<f64>>>()?;
        let (correct, seen) = match (&logits, link, edge) {
            (Some(logits), _, _) => (task.correct(logits, seeds)?, seeds.len() as u64),
            (None, Some((_, batch)), _) => (0, batch.edges.len() as u64),
            (None, None, Some((_, batch))) => (edge_correct, batch.edges.len() as u64),
            (None, None, None) => (0, 0),
        };
        self.report.steps += 1;
        self.observer.step(l);
        Ok(StepFigures {
            loss: l,
            correct: correct as f64,
            seen,
            tasks,
        })
    }
}

/// The batch of training nodes `seeds`: sampled, its rows gathered (those
/// a GPU cache holds are read in the step).
fn prepare_nodes<'f>(
    feed: &'f Feed<'_>,
    sampler: &mut Sampler<'f>,
    epoch: u64,
    step: u64,
    seeds: &[u32],
) -> Result<Prepared> {
    match (&feed.cached, feed.cached_in_step) {
        (Some(c), true) => {
            let mut clock = Instant::now();
            let mb = sample(sampler, feed.uses_neighbors, epoch, step, seeds)?;
            let sample_s = lap(&mut clock);
            let features = c.gather_uncached(&feed.gather, feed.graph, &mb.blocks[0].src)?;
            Ok(Prepared {
                mb,
                features,
                sample_s,
                gather_s: lap(&mut clock),
                link: None,
            })
        }
        _ => prepare(
            feed.graph,
            &feed.gather,
            feed.cached.as_deref(),
            true,
            || sample(sampler, feed.uses_neighbors, epoch, step, seeds),
        ),
    }
}

/// The batch of training edges `ids` of the link or edge task's step
/// `bucket`: their ends (and negatives) sampled with the step's key,
/// leaving out the step's edges (the batch's own, and their reverses).
fn prepare_edges<'f>(
    feed: &'f Feed<'_>,
    sampler: &mut Sampler<'f>,
    epoch: u64,
    bucket: u64,
    ids: &[u32],
) -> Result<Batch> {
    let clock = Instant::now();
    if let Some(task) = feed.edge {
        let batch = task.batch(feed.graph, ids);
        let extra = clock.elapsed().as_secs_f64();
        let mut p =
            prepare(feed.graph, &feed.gather, None, false, || {
                Ok(sampler.sample_typed(
                    epoch,
                    bucket,
                    &batch.seeds,
                    &task.exclusion(epoch, bucket),
                )?)
            })?;
        p.sample_s += extra;
        return Ok(Batch {
            p,
            edge: Some(batch),
            beside: None,
        });
    }
    let task = feed
        .link
        .ok_or_else(|| TrainError::Config("no link or edge task to batch edges of".into()))?;
    let batch = task.batch(feed.graph, epoch, ids);
    let extra = clock.elapsed().as_secs_f64();
    let mut p = prepare(feed.graph, &feed.gather, None, false, || {
        Ok(sampler.sample_typed(epoch, bucket, &batch.seeds, &task.exclusion(epoch, bucket))?)
    })?;
    p.sample_s += extra;
    p.link = Some(batch);
    Ok(Batch {
        p,
        edge: None,
        beside: None,
    })
}

/// The last layer's rows of seeds (per type) by neighbourhoods sampled with
/// evaluation's key, step 0 for every chunk (a node's rows do not depend on
/// its chunk): what sampled evaluation of edge-level tasks embeds with.
fn sampled_rows<'a>(
    g: &'a HetGraph,
    model: &'a Model,
    t: &crate::config::TrainingConfig,
    epoch: u64,
) -> Result<impl FnMut(&[Vec<u32>]) -> Result<PerType> + 'a> {
    let mut sampler = SamplingPlan::of(t).eval(g)?;
    Ok(move |seeds: &[Vec<u32>]| -> Result<PerType> {
        let mb = sampler.sample_typed(epoch, 0, seeds, &graphs::link::NoExclusion)?;
        let inputs = model.gather_inputs(g, &mb.blocks[0].src)?;
        Ok(model.forward_nodes(g, &mb, inputs, None)?)
    })
}
