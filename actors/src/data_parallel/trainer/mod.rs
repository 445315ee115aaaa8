//! The data-parallel Trainer (one per partition): each step it takes the
//! seeds of the global batch its partition owns, samples them (remote
//! frontier nodes by their owners), gathers input rows (local ones from its
//! partition, the rest pulled from their owners' stores), runs forward and
//! backward on its share of the loss, pushes embedding gradients to the stores
//! and all-reduces the dense gradients with the other trainers.
//!
//! Equivalence with single-process training: the global batches, the
//! neighbors of every node and the dropout mask of every node are the same
//! pure functions of the seed; each trainer scales its mean loss by its share
//! of the batch, so the summed gradients are the single-process gradients.
//! Gradients are summed in trainer order, so every replica applies the same
//! update, bit for bit.

mod dag;
mod fetch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Tensor};
use graphs::{HetGraph, MiniBatch};
use models::model::DropoutKey;
use models::optim::Adam;
use models::rgcn::PerType;
use models::Model;
use runtime::{ActorRef, Node};

use super::names;
use super::{DataParallelConfig, Sampling, SeedAssignment};
use crate::cache::manager::{type_names, CacheView};
use crate::cache::DeviceCache;
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::{self, Progress};
use crate::distributed::generations::abort_peers;
use crate::distributed::inbox::Inbox;
use crate::distributed::messages::{EpochStats, StepDone};
use crate::distributed::Timeouts;
use crate::epoch::run::{self as epochs, Attempt, BatchSource, StepFigures, Steps};
use crate::epoch::{lap, SamplingPlan};
use crate::error::Result;
use crate::owner::allreduce::{self, all_reduce, Group};
use crate::owner::client::{sender_ref, Client, ClientSetup, Rows};
use crate::task::edge::{EdgeBatch, EdgeTask};
use crate::task::link::{LinkBatch, LinkTask};
use crate::task::multi::{EdgesBeside, NodeTasks, EDGE_BATCH_KEY};

/// Everything a trainer thread needs.
pub struct TrainerSetup {
    /// This trainer's partition.
    pub part: u32,
    /// Number of partitions (= trainers).
    pub parts: u32,
    /// This trainer (`part · per_part + j`).
    pub trainer: u32,
    /// Trainers in all (`parts · per_part`).
    pub trainers: u32,
    /// Per target node, its trainer within its partition (second level).
    pub trainer_of: Arc<Vec<u16>>,
    /// Training settings.
    pub cfg: TrainingConfig,
    /// `[training.data-parallel]`
    pub dp: DataParallelConfig,
    /// The partition graph.
    pub graph: Arc<HetGraph>,
    /// Owner of every node.
    pub owners: Arc<Vec<Vec<u16>>>,
    /// The node the trainer's actors live on.
    pub node: Node,
    /// The node's runtime, for asks from this thread.
    pub handle: tokio::runtime::Handle,
    /// This trainer's inbox (gradient shares, abort).
    pub inbox: Arc<Inbox>,
    /// Deadlines.
    pub timeouts: Timeouts,
    /// Generation of the run this attempt is.
    pub gen: u64,
    /// The checkpoint this attempt starts from (its directory and manifest).
    pub from: Option<(std::path::PathBuf, checkpoint::Manifest)>,
    /// What a fine-tuned run starts from (`training.init_from`).
    pub start: Option<Arc<crate::pretrained::init::Start>>,
    /// Device caches built by earlier generations in this process, by trainer.
    pub caches: super::CacheSlots,
    /// What this trainer's cache manager serves.
    pub cache_view: Arc<CacheView>,
    /// Link prediction: the partition's share of the task (the edges whose source it owns).
    pub link: Option<Arc<LinkTask>>,
    /// Edge classification or regression: the partition's share of the task (the edges whose source it owns).
    pub edge: Option<Arc<EdgeTask>>,
    /// `sampling = "dag"`: the sampling workers of the partitions loaded in this process.
    pub sampling: crate::data_parallel::sampling::Workers,
}

/// Runs every epoch; returns the final replica. On failure, tells the other
/// trainers and the coordinator so they stop instead of waiting.
pub fn run(s: TrainerSetup) -> Result<Model> {
    let result = Trainer::new(&s).and_then(|mut t| {
        t.train()?;
        Ok(t.rep.model)
    });
    if let Err(e) = &result {
        let targets: Vec<String> = (0..s.trainers)
            .filter(|&p| p != s.trainer)
            .map(names::trainer)
            .chain([names::COORDINATOR.to_string()])
            .collect();
        abort_peers(
            &s.node,
            &s.handle,
            &names::trainer(s.trainer),
            s.trainer,
            s.gen,
            &targets,
            e,
        );
    }
    result
}

/// What sampling and gathering need: shared by the trainer and its prefetch thread.
struct Ctx<'a> {
    s: &'a TrainerSetup,
    /// Every partition's sampler and stores.
    c: Client,
    /// A task list's task on edges, trained beside its node tasks.
    beside: Option<EdgesBeside>,
    /// Every trainer's inbox, in trainer order.
    trainers: Vec<ActorRef>,
    coordinator: ActorRef,
}

impl std::ops::Deref for Ctx<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.c
    }
}

/// A batch sampled and with its features gathered ahead of its step.
struct Prepared {
    seeds: Vec<u32>,
    share: f64,
    /// Link prediction: the trainer's edges of the step, their negatives and seeds.
    link: Option<LinkBatch>,
    /// Edge tasks: the trainer's edges of the step and their ends.
    edge: Option<EdgeBatch>,
    mb: Option<MiniBatch>,
    features: PerType,
    sample_s: f64,
    gather_s: f64,
    /// A task list's batch of its task on edges, beside the nodes'.
    beside: Option<Box<Prepared>>,
}

impl Prepared {
    /// A batch with nothing for this trainer.
    fn nothing() -> Prepared {
        Prepared {
            seeds: Vec::new(),
            share: 0.0,
            link: None,
            edge: None,
            mb: None,
            features: Vec::new(),
            sample_s: 0.0,
            gather_s: 0.0,
            beside: None,
        }
    }
}

struct Trainer<'a> {
    ctx: Ctx<'a>,
    rep: Replica<'a>,
}

/// The model replica and its optimiser: what the steps change.
struct Replica<'a> {
    model: Model,
    adam: Adam,
    /// Global step number.
    seq: u64,
    /// The device cache (its feature rows are shared with the `Ctx`).
    cache: Option<Arc<DeviceCache>>,
    /// The trainer's setup.
    s: &'a TrainerSetup,
    /// What the node steps learn (resolved once: class weights read the training split).
    task: NodeTasks<'a>,
}

impl<'a> Trainer<'a> {
    fn new(s: &'a TrainerSetup) -> Result<Trainer<'a>> {
        let t = &s.cfg;
        let (model, adam, seq) = crate::owner::replica(t, &s.graph, &s.from, s.start.as_deref())?;
        let me = names::trainer(s.trainer);
        let c = Client::new(ClientSetup {
            part: s.part,
            parts: s.parts,
            graph: s.graph.clone(),
            owners: s.owners.clone(),
            cfg: t,
            model: &model,
            gen: s.gen,
            timeouts: s.timeouts,
            inbox: s.inbox.clone(),
            handle: s.handle.clone(),
            node: &s.node,
            me: &me,
        })?;
        let trainers = (0..s.trainers)
            .map(|p| sender_ref(&s.node, &me, &names::trainer(p)))
            .collect::<Result<_>>()?;
        let coordinator = sender_ref(&s.node, &me, names::COORDINATOR)?;
        let steps = match (&s.link, &s.edge) {
            (Some(l), _) => l.steps(),
            (None, Some(e)) => e.steps(),
            (None, None) => 1,
        };
        let mut ctx = Ctx {
            s,
            c,
            beside: EdgesBeside::of(t, steps),
            trainers,
            coordinator,
        };
        // Feature rows do not change: a cache built by an earlier generation of this process serves on.
        let reused = s.caches.get(&s.trainer).map(|c| c.clone());
        let cache = match reused {
            Some(c) => Some(c),
            None => {
                let built = ctx.build_cache()?.map(Arc::new);
                if let Some(c) = &built {
                    s.caches.insert(s.trainer, c.clone());
                }
                built
            }
        };
        ctx.c.cache = cache.as_ref().map(|c| c.features.clone());
        if let Some(c) = &cache {
            s.cache_view.publish(
                &names::trainer(s.trainer),
                s.cfg.cache_policy.name(),
                &type_names(&s.graph),
                c,
            );
        }
        Ok(Trainer {
            ctx,
            rep: Replica {
                model,
                adam,
                seq,
                cache,
                s,
                task: NodeTasks::of(&s.cfg, &s.graph)?,
            },
        })
    }

    fn train(&mut self) -> Result<()> {
        let s = self.ctx.s;
        let resumed = s
            .from
            .as_ref()
            .map(|(_, m)| m.progress.clone())
            .unwrap_or_default();
        let train = &s.graph.target_labels().1.train;
        let items = match (&s.link, &s.edge, &self.ctx.beside) {
            (_, _, Some(b)) => epochs::Items::Mixed(train, b.steps),
            (Some(l), _, None) => epochs::Items::Link(l),
            (None, Some(e), None) => epochs::Items::Edges(e),
            (None, None, None) => epochs::Items::Nodes(train),
        };
        let attempt = Attempt {
            node: Some(&s.node),
            gen: s.gen,
            trainer: s.trainer,
            cfg: &s.cfg,
            items,
            resumed,
        };
        epochs::run(&attempt, &self.ctx, &mut self.rep)
    }
}

impl<'a> Steps for Replica<'a> {
    type Feed = Ctx<'a>;
    type Batch = Prepared;
    type State<'f>
        = ()
    where
        Self: 'f;

    fn seq(&self) -> u64 {
        self.seq
    }

    fn feed_state(_: &Ctx<'a>) -> Result<()> {
        Ok(())
    }

    /// `sampling = "dag"`: the epoch's batches from the partition's sampling worker.
    fn batch_source<'f>(
        ctx: &'f Ctx<'a>,
        epoch: u64,
        batches: &[Vec<u32>],
        skip: usize,
    ) -> Result<Option<Box<dyn BatchSource<Prepared> + 'f>>> {
        if ctx.s.dp.sampling != Sampling::Dag {
            return Ok(None);
        }
        Ok(Some(Box::new(ctx.dag_batches(epoch, batches, skip)?)))
    }

    /// Samples the trainer's share of the batch and gathers its plain features.
    /// Edge-level tasks: `seeds` are the partition's training edges of the step.
    /// A task list with a task on edges: `seeds` are nodes, and the trainer's
    /// share of the task's batch of the step comes beside them.
    fn prepare(
        ctx: &Ctx<'a>,
        _: &mut (),
        epoch: u64,
        step: u64,
        seeds: &[u32],
    ) -> Result<Prepared> {
        if let Some(b) = &ctx.beside {
            let target = ctx.s.graph.target().index();
            let mut p = ctx.prepare(ctx.s.cfg.seed, epoch, step, seeds, target)?;
            let (bucket, ids) = b.batch(epoch, step, |e| match (&ctx.s.link, &ctx.s.edge) {
                (Some(l), _) => l.batches(e),
                (None, Some(t)) => t.batches(e),
                (None, None) => Vec::new(),
            });
            let mine = ctx.my_edges(&ids);
            let edges = match (&ctx.s.link, &ctx.s.edge) {
                (Some(task), _) => ctx.prepare_link(task, epoch, bucket, &mine)?,
                (None, Some(task)) => ctx.prepare_edges(task, epoch, bucket, &mine)?,
                (None, None) => Prepared::nothing(),
            };
            p.beside = Some(Box::new(edges));
            return Ok(p);
        }
        match (&ctx.s.link, &ctx.s.edge) {
            (Some(task), _) => ctx.prepare_link(task, epoch, step, &ctx.my_edges(seeds)),
            (None, Some(task)) => ctx.prepare_edges(task, epoch, step, &ctx.my_edges(seeds)),
            (None, None) => ctx.prepare(
                ctx.s.cfg.seed,
                epoch,
                step,
                seeds,
                ctx.s.graph.target().index(),
            ),
        }
    }

    fn checkpoint(&mut self, ctx: &Ctx<'a>, progress: Progress) -> Result<()> {
        ctx.checkpoint(self, progress)
    }

    fn step(
        &mut self,
        ctx: &Ctx<'a>,
        epoch: u64,
        step: u64,
        seeds: &[u32],
        p: Prepared,
        st: &mut EpochStats,
    ) -> Result<StepFigures> {
        st.time.sample_s += p.sample_s;
        st.time.gather_s += p.gather_s;
        let (loss, correct, seen, tasks) = match ctx.s.dp.sampling_sink {
            // The batch is dropped: the epoch measures sampling alone.
            true => {
                self.seq += 1;
                (0.0, 0.0, None, Vec::new())
            }
            false => {
                let edges = ctx.s.edge.is_some() && ctx.beside.is_none();
                let tally = self.train_step(ctx, (epoch, step), seeds, p, st)?;
                // An edge step's size is known only summed over the trainers.
                let seen = edges.then_some(tally.seen.round() as u64);
                (tally.loss, tally.correct, seen, tally.each)
            }
        };
        if self.s.trainer == 0 {
            let c = ctx.coordinator.clone();
            ctx.block_on(c.ask(
                StepDone {
                    gen: self.s.gen,
                    epoch,
                    seq: self.seq - 1,
                    loss,
                },
                self.s.timeouts.ask,
            ))??;
        }
        let seen = match seen {
            Some(n) => n,
            None => seeds.len() as u64,
        };
        Ok(StepFigures {
            loss,
            correct,
            seen,
            tasks,
        })
    }

    fn evaluate(&mut self, ctx: &Ctx<'a>, epoch: u64, st: &mut EpochStats) -> Result<()> {
        if ctx.s.dp.sampling_sink {
            st.evaluated = false;
            return Ok(());
        }
        let g = ctx.s.graph.clone();
        let (model, after) = (&self.model, self.seq.checked_sub(1));
        let seed = SamplingPlan::of(&ctx.s.cfg).eval_seed();
        // Edge-level tasks' rows: step 0 for every chunk, as a node's rows do
        // not depend on its chunk (as in one process).
        let rows = |seeds: &[Vec<u32>]| -> Result<models::rgcn::PerType> {
            let mb = ctx.sample_typed(seed, epoch, 0, seeds, None)?;
            let inputs = ctx.gather(&mb.blocks[0].src, Rows::All, after)?;
            Ok(model.forward_nodes(&g, &mb, inputs, None)?)
        };
        // A task list's task on edges: its own account, between the node
        // tasks' in list order (its figures below, the node tasks' after).
        let mut own = match &ctx.beside {
            Some(b) if b.at < st.tasks.len() => Some((b.at, st.tasks.remove(b.at))),
            Some(b) => Some((b.at, EpochStats::default())),
            None => None,
        };
        let edges = match own.as_mut() {
            Some((_, o)) => o,
            None => &mut *st,
        };
        if let Some(task) = &self.s.link {
            edges.link = Some(task.evaluate_sampled(model, &g, rows)?);
        } else if let Some(task) = &self.s.edge {
            let [valid, test] = task.evaluate_sampled(model, &g, rows)?;
            edges.set_edge_scores(valid, test);
            edges.limit_ranked();
        }
        if own.is_none() && (self.s.link.is_some() || self.s.edge.is_some()) {
            return Ok(());
        }
        let (_, splits) = self.s.graph.target_labels();
        let target = self.s.graph.target().index();
        let (seed, after) = (
            SamplingPlan::of(&ctx.s.cfg).eval_seed(),
            self.seq.checked_sub(1),
        );
        let [valid, test] = [&splits.valid, &splits.test].map(|nodes| {
            ctx.score(&self.model, &self.task, seed, epoch, nodes, after, |c| {
                ctx.my_seeds(target, c)
            })
        });
        self.task.record(st, valid?, test?);
        if let Some((at, o)) = own {
            st.tasks.insert(at.min(st.tasks.len()), o);
        }
        Ok(())
    }

    fn cache_figures(&self) -> BTreeMap<String, crate::cache::CacheTypeReport> {
        let Some(c) = &self.cache else {
            return BTreeMap::new();
        };
        self.s.cache_view.publish(
            &names::trainer(self.s.trainer),
            self.s.cfg.cache_policy.name(),
            &type_names(&self.s.graph),
            c,
        );
        c.report()
    }

    fn send_stats(&mut self, ctx: &Ctx<'a>, st: EpochStats) -> Result<()> {
        let c = ctx.coordinator.clone();
        ctx.block_on(c.ask(st, self.s.timeouts.ask))??;
        Ok(())
    }

    fn remote_rows(ctx: &Ctx<'a>) -> u64 {
        ctx.remote_rows.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Replica<'_> {
    /// One training step of `batch` (node tasks: the step's global seeds);
    /// returns the global loss, correct predictions and (edge tasks) edges.
    fn train_step(
        &mut self,
        ctx: &Ctx,
        (epoch, step): (u64, u64),
        batch: &[u32],
        p: Prepared,
        st: &mut EpochStats,
    ) -> Result<allreduce::Tally> {
        let g = ctx.s.graph.clone();
        let task = &self.task;
        let mut clock = Instant::now();
        let mut grads = None;
        let (mut wloss, mut correct, mut seen) = (0.0, 0.0, 0.0);
        // Multi-task: each task's loss, this trainer's share (zeros without seeds).
        let mut each = vec![0.0; task.parts().len() * usize::from(task.is_multi())];
        let mut pushes: Vec<Vec<(Vec<u32>, Vec<u8>)>> = Vec::new();
        let (seeds, share) = (&p.seeds, p.share);
        // The learnable rows of a batch's sources, its plain features where it has them.
        let inputs_of = |mb: &MiniBatch, features: PerType| -> Result<PerType> {
            let mut inputs =
                ctx.gather(&mb.blocks[0].src, Rows::Learnable, self.seq.checked_sub(1))?;
            for (x, f) in inputs.iter_mut().zip(features) {
                if x.is_none() {
                    *x = f;
                }
            }
            Ok(inputs)
        };
        // What the backward pass starts from, and each batch's inputs (their gradients go to the stores).
        let mut total: Option<Tensor> = None;
        let mut read: Vec<(&MiniBatch, PerType)> = Vec::new();
        if let Some(mb) = &p.mb {
            let inputs = inputs_of(mb, p.features)?;
            st.time.gather_s += lap(&mut clock);
            let dropout = Some(DropoutKey { epoch, step });
            let loss = match (&ctx.s.link, &p.link, &ctx.s.edge, &p.edge) {
                // Link prediction: the loss is already this trainer's share (divided by the mean step size).
                (Some(task), Some(batch), _, _) => {
                    let loss = task.loss(
                        &self.model,
                        &self.model.forward_nodes(&g, mb, inputs.clone(), dropout)?,
                        batch,
                    )?;
                    wloss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                    loss
                }
                // Edge tasks: so is theirs.
                (_, _, Some(task), Some(batch)) => {
                    let out = self.model.forward_nodes(&g, mb, inputs.clone(), dropout)?;
                    let loss = task.loss(&self.model, &out, batch)?;
                    wloss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                    correct = task.correct(&self.model, &out, batch)? as f64;
                    seen = batch.edges.len() as f64;
                    loss
                }
                _ => {
                    let logits = self.model.forward(&g, mb, inputs.clone(), dropout)?;
                    let losses = task.loss_of_share(&logits, seeds, batch)?;
                    let loss = losses.total;
                    // Several tasks' losses are this trainer's parts already.
                    let share = match task.is_multi() {
                        true => 1.0,
                        false => share,
                    };
                    wloss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()? * share;
                    for (e, l) in each.iter_mut().zip(&losses.each) {
                        *e = l.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                    }
                    correct = task.correct(&logits, seeds)? as f64;
                    (&loss * share)?
                }
            };
            total = Some(loss);
            read.push((mb, inputs));
            st.time.compute_s += lap(&mut clock);
        }
        // A task list's task on edges: its loss on this trainer's edges of the
        // step (its share already), weighted, joins the sum; every trainer
        // reports it (0 without edges) so the all-reduced vectors line up.
        if let Some(b) = &ctx.beside {
            let mut own = 0.0;
            if let Some(bp) = p.beside.as_deref() {
                st.time.sample_s += bp.sample_s;
                st.time.gather_s += bp.gather_s;
                if let Some(bmb) = &bp.mb {
                    let inputs = inputs_of(bmb, bp.features.clone())?;
                    st.time.gather_s += lap(&mut clock);
                    let key = Some(DropoutKey {
                        epoch,
                        step: step + EDGE_BATCH_KEY,
                    });
                    let out = self.model.forward_nodes(&g, bmb, inputs.clone(), key)?;
                    let loss = match (&ctx.s.link, &bp.link, &ctx.s.edge, &bp.edge) {
                        (Some(task), Some(batch), _, _) => {
                            Some(task.loss(&self.model, &out, batch)?)
                        }
                        (_, _, Some(task), Some(batch)) => {
                            Some(task.loss(&self.model, &out, batch)?)
                        }
                        _ => None,
                    };
                    if let Some(l) = loss {
                        own = l.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                        wloss += b.weight * own;
                        let weighted = l.affine(b.weight, 0.0)?;
                        total = Some(match total {
                            Some(t) => (t + weighted)?,
                            None => weighted,
                        });
                        read.push((bmb, inputs));
                    }
                    st.time.compute_s += lap(&mut clock);
                }
            }
            each.insert(b.at.min(each.len()), own);
        }
        if let Some(loss) = total {
            let gs = loss.backward()?;
            for (mb, inputs) in &read {
                let leaves: Vec<Option<Tensor>> = inputs
                    .iter()
                    .map(|x| x.as_ref().and_then(|x| gs.get(x).cloned()))
                    .collect();
                ctx.gradient_rows(&mb.blocks[0].src, &leaves, &mut pushes)?;
            }
            st.time.compute_s += lap(&mut clock);
            grads = Some(gs);
        }
        // Every trainer pushes to every learnable store each step (empty if it
        // has nothing), so a store knows when the step's gradient is complete.
        let pushes = ctx.pushes(self.seq, ctx.s.trainer, pushes);

        // Dense gradients, a presence flag per parameter, the loss and the correct count.
        let tally = allreduce::Tally {
            loss: wloss,
            correct,
            seen,
            each,
        };
        let flat = allreduce::flatten(&self.model.params, grads.as_ref(), tally)?;
        let group = Group {
            trainers: &ctx.trainers,
            me: ctx.s.trainer,
            seq: self.seq,
            kind: ctx.s.cfg.allreduce,
        };
        let sum = all_reduce(ctx, &group, flat, pushes)?;
        st.time.comm_s += lap(&mut clock);
        let figures = allreduce::apply(&self.model.params, &mut self.adam, &sum)?;
        st.time.update_s += lap(&mut clock);
        self.seq += 1;
        // Every share of earlier steps has been taken: what is left of them is duplicates.
        ctx.s.inbox.forget_before(self.seq);
        Ok(figures)
    }
}

impl Ctx<'_> {
    /// The partition's part of the checkpoint before step `rep.seq` (its
    /// first trainer does it): trainer 0 writes the dense state, each
    /// embedding store its rows; then the coordinator hears of the files.
    fn checkpoint(&self, rep: &Replica, progress: Progress) -> Result<()> {
        let s = self.s;
        let per_part = s.trainers / s.parts;
        let Some(root) = s.cfg.checkpoint_dir.as_ref() else {
            return Ok(());
        };
        if !s.trainer.is_multiple_of(per_part) {
            return Ok(());
        }
        let dense = (s.trainer == 0).then_some((&rep.model, &rep.adam));
        self.checkpoint_part(&self.coordinator, root, rep.seq, dense, progress)
    }

    /// This trainer's share of its partition's edges `ids` of a step (the
    /// partition's trainers take every n-th).
    fn my_edges(&self, ids: &[u32]) -> Vec<u32> {
        let per_part = (self.s.trainers / self.s.parts).max(1);
        let me = self.s.trainer % per_part;
        ids.iter()
            .copied()
            .filter(|&i| i % per_part == me)
            .collect()
    }

    /// This trainer's seeds of the global `batch` of target nodes, in batch order.
    fn my_seeds(&self, target: usize, batch: &[u32]) -> Vec<u32> {
        match self.s.dp.seed_assignment {
            SeedAssignment::Owner => {
                let per_part = self.s.trainers / self.s.parts;
                batch
                    .iter()
                    .copied()
                    .filter(|&v| {
                        self.owned(target, v)
                            && self
                                .s
                                .trainer_of
                                .get(v as usize)
                                .map_or(0, |&t| u32::from(t))
                                == self.s.trainer % per_part
                    })
                    .collect()
            }
            SeedAssignment::Random => {
                let (k, n, len) = (
                    self.s.trainer as usize,
                    self.s.trainers as usize,
                    batch.len(),
                );
                batch[len * k / n.max(1)..len * (k + 1) / n.max(1)].to_vec()
            }
        }
    }
}
