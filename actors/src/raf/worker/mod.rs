//! A RelationAggWorker (one per meta-partition), and on worker 0 the
//! designated Reducer.
//!
//! Each step every worker samples the global batch over its own relations,
//! runs the layers below the top on local features and embedding rows, and
//! sends the reducer one partial aggregation of the seeds (its top-layer
//! relations combined). The reducer, which also computes the seeds' own rows
//! (its partition holds the self sub-metatree), merges the partials, applies
//! the cross-relation step, head and loss, and returns each worker the
//! gradient of its partial. Workers backpropagate locally; a parameter or
//! embedding row that several workers hold gets the sum of their gradients,
//! added in worker order, so every copy takes the same update.
//!
//! Equivalence with single-process training (Heta Prop. 4.1): a partition
//! holding a relation at a layer holds every relation into that type at the
//! layers below (the metatree), so the rows it feeds the top layer are the
//! single-process rows; backpropagation is linear in the incoming gradient,
//! so the per-worker gradients of a shared parameter sum to the
//! single-process gradient.

mod steps;
mod update;

use steps::Feed;
use update::add_grads;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use futures_util::future::join_all;
use graphs::{HetGraph, MiniBatch, RelationFilter, RelationId};
use models::model::DropoutKey;
use models::optim::{Adam, AdamConfig};
use models::partials::RelationPartials;
use models::Model;
use runtime::{ActorRef, ByteVec, Msg, Node};

use super::messages::{self, round, Partial, PartialGrad, SeedGrad, SeedRows};
use super::names;
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::{self, Progress};
use crate::distributed::generations::abort_peers;
use crate::distributed::inbox::Inbox;
use crate::distributed::messages::Saved;
use crate::distributed::{decode_f32, Timeouts};
use crate::epoch::run::{self as epochs, Attempt};
use crate::epoch::{lap, SamplingPlan};
use crate::error::{Result, TrainError};
use crate::task::multi::NodeTasks;
use crate::task::node::Scores;

/// Positions in `batch` of the seeds replica `(j, r)` handles.
pub fn share(batch: &[u32], (j, r): (u32, u32)) -> Vec<usize> {
    (0..batch.len())
        .filter(|&i| r <= 1 || batch[i] % r == j)
        .collect()
}

/// The tag of a shipped whole partial (others are relation ids of shipped means).
const WHOLE: u32 = u32::MAX;

/// A replica's piece of a partial: its replica index, the batch positions it covers, the rows.
type ReplicaPiece = (u32, Vec<usize>, Tensor);

/// Evaluation steps are numbered apart from training steps.
const EVAL_BIT: u64 = 1 << 63;

/// Everything a worker thread needs.
pub struct WorkerSetup {
    /// This worker (0 hosts the reducer).
    pub worker: u32,
    /// Every worker's relations per layer (worker order).
    pub per_layer: Arc<Vec<Vec<Vec<RelationId>>>>,
    /// Every worker's `(replica, replicas)`: replicas of a sub-metatree split
    /// the seeds (seed `v` goes to replica `v % replicas`).
    pub replicas: Arc<Vec<(u32, u32)>>,
    /// Training settings.
    pub cfg: TrainingConfig,
    /// `[training.raf]`
    pub raf: crate::raf::RafConfig,
    /// This worker's partition.
    pub graph: Arc<HetGraph>,
    /// The node the worker's actors live on.
    pub node: Node,
    /// The node's runtime, for sends from this thread.
    pub handle: tokio::runtime::Handle,
    /// This worker's inbox.
    pub inbox: Arc<Inbox>,
    /// Deadlines.
    pub timeouts: Timeouts,
    /// The checkpoint the run resumes from (its directory and manifest).
    pub from: Option<(std::path::PathBuf, checkpoint::Manifest)>,
    /// Generation of the run this attempt is.
    pub gen: u64,
    /// What this worker's cache manager serves.
    pub cache_view: Arc<crate::cache::manager::CacheView>,
}

/// A worker's file in a checkpoint.
fn checkpoint_file(w: u32) -> String {
    format!("worker-{w}.safetensors")
}

/// A worker's result: its model (the parameters and tables it holds are current).
pub struct WorkerResult {
    /// The model; parameters outside `held` and tables outside `tables` are stale.
    pub model: Model,
    /// Names of the parameters it holds.
    pub held: BTreeSet<String>,
}

/// Runs every epoch. On failure, tells the other workers and the coordinator.
pub fn run(s: WorkerSetup) -> Result<WorkerResult> {
    let body = std::panic::AssertUnwindSafe(|| {
        Worker::new(&s).and_then(|mut w| {
            w.train()?;
            if let Some(c) = &w.cache {
                c.write_back(&mut w.model)?;
            }
            Ok(WorkerResult {
                held: w.used.clone(),
                model: w.model,
            })
        })
    });
    // A panic is a failure too: the others must hear of it rather than wait.
    let result = std::panic::catch_unwind(body).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(TrainError::Internal(format!(
            "worker {} panicked: {what}",
            s.worker
        )))
    });
    if let Err(e) = &result {
        let workers = s.per_layer.len() as u32;
        let targets: Vec<String> = (0..workers)
            .filter(|&p| p != s.worker)
            .map(names::worker)
            .chain([crate::distributed::names::COORDINATOR.to_string()])
            .collect();
        abort_peers(
            &s.node,
            &s.handle,
            &names::worker(s.worker),
            s.worker,
            s.gen,
            &targets,
            e,
        );
    }
    result
}

struct Worker<'a> {
    s: TrainerRefs,
    setup: &'a WorkerSetup,
    model: Model,
    adam: Adam,
    /// Parameters this worker may use.
    used: BTreeSet<String>,
    /// Per peer, the parameters both use (name order).
    shared: Vec<Vec<String>>,
    /// Per peer, the learnable types whose rows both read.
    shared_tables: Vec<Vec<usize>>,
    /// Per worker, whether the reducer sends it the seeds' rows.
    needs_seeds: Vec<bool>,
    /// Per worker, whether it ships its top-layer relation means (the reducer
    /// then holds those relations' top-layer weights).
    ships_means: Vec<bool>,
    device: Device,
    seq: u64,
    /// The device cache of this worker's feature rows and the table rows it owns.
    cache: Option<crate::cache::DeviceCache>,
    /// Scratch for summing embedding gradients: per node id, its place in the
    /// step's row order (`u32::MAX`: none). Kept across steps, reset after each.
    row_slot: Vec<u32>,
    /// What the reducer's steps learn (one node task, or several).
    task: NodeTasks<'a>,
}

/// The actors a worker talks to.
struct TrainerRefs {
    workers: Vec<ActorRef>,
    reducer: ActorRef,
    coordinator: ActorRef,
}

/// What one step produced on this worker.
struct StepOut {
    loss: f64,
    correct: u64,
    /// Several tasks: each one's own loss (the reducer's; empty elsewhere).
    each: Vec<f64>,
    gather_s: f64,
    compute_s: f64,
    comm_s: f64,
    update_s: f64,
}

fn to_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let v: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    Ok(bytemuck::cast_slice(&v).to_vec())
}

impl<'a> Worker<'a> {
    fn new(setup: &'a WorkerSetup) -> Result<Worker<'a>> {
        let t = &setup.cfg;
        let g = &setup.graph;
        let device = crate::device::open(&t.device)?;
        let mut model = Model::new(&t.model_spec(), g, DType::F32, &device)?;
        let workers = setup.per_layer.len();
        let w = setup.worker as usize;
        let used_of = |k: usize| {
            model
                .params_for(g, &setup.per_layer[k], k == 0)
                .map_err(TrainError::from)
        };
        let mut all_used: Vec<BTreeSet<String>> =
            (0..workers).map(used_of).collect::<Result<_>>()?;
        let top = setup.per_layer[0].len().saturating_sub(1);
        let ships_means: Vec<bool> = (0..workers)
            .map(|k| Ok(k != 0 && model.ships_means(&setup.per_layer[k][top])?))
            .collect::<Result<_>>()?;
        for k in (1..workers).filter(|&k| ships_means[k]) {
            for &r in &setup.per_layer[k][top] {
                let prefix = models::partials::relation_prefix(g, top, r);
                let moved: Vec<String> = all_used[k]
                    .iter()
                    .filter(|n| n.starts_with(&prefix))
                    .cloned()
                    .collect();
                for n in moved {
                    all_used[k].remove(&n);
                    all_used[0].insert(n);
                }
            }
        }
        let learnable: Vec<bool> = model.embeddings.iter().map(Option::is_some).collect();
        let reads = |k: usize| -> Vec<bool> {
            let types = models::partials::types_per_layer(g, &setup.per_layer[k]);
            types.first().map_or_else(Vec::new, |(_, src)| {
                src.iter().zip(&learnable).map(|(a, b)| *a && *b).collect()
            })
        };
        let mine = reads(w);
        // Tables this worker never reads are dropped: only their holders keep them.
        for (ty, e) in model.embeddings.iter_mut().enumerate() {
            if !mine.get(ty).copied().unwrap_or(false) {
                *e = None;
            }
        }
        let shared = (0..workers)
            .map(|k| {
                if k == w {
                    Vec::new()
                } else {
                    all_used[w].intersection(&all_used[k]).cloned().collect()
                }
            })
            .collect();
        let local = setup.raf.embeddings == crate::raf::RafEmbeddings::Local;
        let shared_tables = (0..workers)
            .map(|k| {
                let theirs = reads(k);
                if k == w || local {
                    Vec::new()
                } else {
                    (0..mine.len())
                        .filter(|&ty| mine[ty] && theirs[ty])
                        .collect()
                }
            })
            .collect();
        let layers = setup.per_layer[0].len();
        let target = g.target();
        let into_target: BTreeSet<RelationId> = g.in_relations(target).iter().copied().collect();
        let needs_seeds = (0..workers)
            .map(|k| {
                let complete = layers < 2
                    || into_target
                        .iter()
                        .all(|r| setup.per_layer[k][layers - 2].contains(r));
                k != 0 && model.partial_reads_seeds() && !complete
            })
            .collect();
        let me =
            runtime::ActorName::new(&names::worker(setup.worker)).map_err(TrainError::internal)?;
        let actor = |n: String| {
            setup
                .node
                .actor(&n)
                .map(|r| r.with_sender(me.clone()))
                .map_err(|e| TrainError::Internal(format!("{n}: {e}")))
        };
        let refs = TrainerRefs {
            workers: (0..workers as u32)
                .map(|k| actor(names::worker(k)))
                .collect::<Result<_>>()?,
            reducer: actor(names::REDUCER.to_string())?,
            coordinator: actor(crate::distributed::names::COORDINATOR.to_string())?,
        };
        let mut adam = Adam::new(AdamConfig::with_lr(t.lr));
        let mut seq = 0;
        if let Some((dir, m)) = &setup.from {
            let mut tensors = checkpoint::load_tensors(dir, m, &checkpoint_file(setup.worker))?;
            let held = &all_used[w];
            models::checkpoint::restore_model_where(
                dir,
                &mut tensors,
                &mut model,
                &mut adam,
                |n| held.contains(n),
            )?;
            seq = m.seq;
        }
        let cache = {
            let (filter, replica) = (
                RelationFilter::PerLayer(setup.per_layer[w].clone()),
                setup.replicas[w],
            );
            let mut presampler = SamplingPlan::of(t).presample(g)?;
            let (_, splits) = g.target_labels();
            crate::cache::build_local(t, g, &model, &splits.train, |e, st, batch| {
                let mine: Vec<u32> = share(batch, replica)
                    .into_iter()
                    .map(|i| batch[i])
                    .collect();
                Ok(presampler.sample_relations(e, st, &mine, &filter)?)
            })?
        };
        if let Some(c) = &cache {
            setup.cache_view.publish(
                &names::worker(setup.worker),
                t.cache_policy.name(),
                &crate::cache::manager::type_names(g),
                c,
            );
        }
        Ok(Worker {
            s: refs,
            setup,
            used: all_used[w].clone(),
            model,
            adam,
            shared,
            shared_tables,
            needs_seeds,
            ships_means,
            device,
            seq,
            cache,
            row_slot: Vec::new(),
            task: NodeTasks::of(t, g)?,
        })
    }

    /// Writes this worker's parameters, tables and optimiser state into the
    /// checkpoint before step `self.seq` and tells the coordinator.
    fn checkpoint(&mut self, progress: Progress) -> Result<()> {
        let Some(root) = &self.setup.cfg.checkpoint_dir else {
            return Ok(());
        };
        if let Some(c) = &self.cache {
            c.write_back(&mut self.model)?;
        }
        // Only what this worker holds: the rest of its model is stale.
        let mut tensors = models::checkpoint::dense_tensors(&self.model, &self.adam)?;
        let held = |name: &str| {
            ["param.", "adam.m.", "adam.v."]
                .iter()
                .find_map(|p| name.strip_prefix(p))
                .is_none_or(|n| self.used.contains(n))
        };
        tensors.retain(|name, _| held(name));
        tensors.extend(models::checkpoint::embedding_tensors(&self.model)?);
        let w = self.setup.worker;
        let file = checkpoint::write_tensors(
            &checkpoint::partial_dir(root, self.seq),
            &checkpoint_file(w),
            &tensors,
        )?;
        self.send(
            &self.s.coordinator,
            Saved {
                gen: self.setup.gen,
                seq: self.seq,
                part: w,
                files: vec![file],
                progress: (w == 0).then_some(progress),
            },
        )
    }

    fn workers(&self) -> u32 {
        self.setup.per_layer.len() as u32
    }

    fn send<M: Msg<Reply = ()>>(&self, to: &ActorRef, m: M) -> Result<()> {
        self.send_all(vec![(to, m)])
    }

    /// Sends every message concurrently; each is acknowledged on delivery.
    fn send_all<M: Msg<Reply = ()>>(&self, msgs: Vec<(&ActorRef, M)>) -> Result<()> {
        let timeout = self.setup.timeouts.ask;
        let asks = msgs.into_iter().map(|(to, m)| to.ask(m, timeout));
        // A peer reported down ends the wait at once (not at the ask's deadline).
        let answers = self
            .setup
            .inbox
            .block_on(&self.setup.handle, join_all(asks))?;
        for r in answers {
            r.map_err(|e| TrainError::PeerLost(format!("{}: {e}", M::KIND)))?;
        }
        Ok(())
    }

    fn train(&mut self) -> Result<()> {
        let s = self.setup;
        let feed = Feed {
            graph: &s.graph,
            filter: RelationFilter::PerLayer(s.per_layer[s.worker as usize].clone()),
            gather: self.model.feature_gather(),
            cached: self.cache.as_ref().map(|c| c.features.clone()),
            replica: s.replicas[s.worker as usize],
            plan: SamplingPlan::of(&s.cfg),
        };
        let resumed = s
            .from
            .as_ref()
            .map(|(_, m)| m.progress.clone())
            .unwrap_or_default();
        let attempt = Attempt {
            node: Some(&s.node),
            gen: s.gen,
            trainer: s.worker,
            cfg: &s.cfg,
            items: epochs::Items::Nodes(&s.graph.target_labels().1.train),
            resumed,
        };
        epochs::run(&attempt, &feed, self)
    }

    /// One training step (`dropout` is `Some`) or evaluation batch. On the
    /// reducer, `loss` and `correct` are the batch's, and an evaluation
    /// batch's figures are added to `scores`; elsewhere nothing. `mb` is
    /// sampled from this worker's share of `batch`.
    fn step(
        &mut self,
        mb: &MiniBatch,
        features: models::rgcn::PerType,
        batch: &[u32],
        dropout: Option<DropoutKey>,
        scores: Option<&mut [Scores]>,
        seq: u64,
    ) -> Result<StepOut> {
        let s = self.setup;
        let g = &s.graph;
        let w = s.worker;
        let train = dropout.is_some();
        let target = g.target().index();
        let b = mb.seeds.len();
        let mut out = StepOut {
            loss: 0.0,
            correct: 0,
            each: Vec::new(),
            gather_s: 0.0,
            compute_s: 0.0,
            comm_s: 0.0,
            update_s: 0.0,
        };
        // Every message of earlier steps has been taken: what is left of them is duplicates.
        s.inbox.forget_before(seq);
        let mut clock = Instant::now();
        let mut inputs = features;
        match &self.cache {
            Some(c) => c.gather_embeddings(&self.model, &mb.blocks[0].src, &mut inputs, train)?,
            None => self
                .model
                .gather_embeddings(&mb.blocks[0].src, &mut inputs)?,
        }
        out.gather_s += lap(&mut clock);
        let mut h = self
            .model
            .hidden_below_top(g, mb, inputs.clone(), dropout)?;
        out.compute_s += lap(&mut clock);
        let timeout = s.timeouts.step;
        // The seeds' own rows: the reducer's are exact; a worker whose top
        // layer reads them but lacks the relations below gets them sent.
        let mut seed_leaf = None;
        let mut seed_width = 0;
        if w == 0 {
            let own = h[target]
                .as_ref()
                .ok_or_else(|| TrainError::internal("the reducer has no rows of the target type"))?
                .narrow(0, 0, b)?;
            let data = ByteVec(to_bytes(&own)?);
            let msgs = (1..self.workers())
                .filter(|&k| self.needs_seeds[k as usize])
                .map(|k| {
                    (
                        &self.s.workers[k as usize],
                        SeedRows {
                            gen: s.gen,
                            seq,
                            from: 0,
                            data: data.clone(),
                        },
                    )
                })
                .collect();
            self.send_all(msgs)?;
        } else if self.needs_seeds[w as usize] {
            let raw = s
                .inbox
                .raw("the seeds' rows", seq, round::SEED_ROWS, &[0], timeout)?;
            seed_width = raw[0].len() / 4 / batch.len().max(1);
            let all = decode_f32(&raw[0], batch.len() * seed_width)?;
            // A replica whose share of this batch is empty has no rows to replace.
            if let Some(x) = h[target].as_ref().filter(|_| b > 0) {
                let (n, width) = x.dims2()?;
                if width != seed_width {
                    return Err(TrainError::Protocol(format!(
                        "the reducer sent seed rows {seed_width} wide, this worker's are {width}"
                    )));
                }
                // This worker's share of the batch, in its order.
                let rows: Vec<f32> = share(batch, s.replicas[w as usize])
                    .iter()
                    .flat_map(|&i| all[i * width..(i + 1) * width].iter().copied())
                    .collect();
                let leaf = Var::from_tensor(&Tensor::from_vec(rows, (b, width), &self.device)?)?;
                let rest = x.narrow(0, b, n - b)?;
                h[target] = Some(Tensor::cat(&[leaf.as_tensor(), &rest], 0)?);
                seed_leaf = Some(leaf);
            }
        }
        out.comm_s += lap(&mut clock);
        // What this worker ships: one partial, or (R-GCN, when narrower) its relation means.
        let shipped: Vec<(u32, Tensor)> = if w != 0 && self.ships_means[w as usize] {
            self.model
                .top_means(g, mb, &h)?
                .into_iter()
                .map(|(r, t)| (r.0, t))
                .collect()
        } else {
            self.model
                .top_partial(g, mb, &h)?
                .into_iter()
                .map(|t| (WHOLE, t))
                .collect()
        };
        out.compute_s += lap(&mut clock);
        let grads: Option<GradStore>;
        if w == 0 {
            let own = h[target]
                .as_ref()
                .ok_or_else(|| TrainError::internal("no target rows"))?
                .narrow(0, 0, b)?;
            let peers: Vec<u32> = (1..self.workers()).collect();
            let raw = s.inbox.raw(
                "the partial aggregations",
                seq,
                round::PARTIAL,
                &peers,
                timeout,
            )?;
            out.comm_s += lap(&mut clock);
            // The head runs on leaves: the workers' gradients go out before
            // this worker backpropagates through its own layers (in parallel
            // with theirs), not after.
            let own_leaf = Var::from_tensor(&own.detach())?;
            let own_part: Option<(Tensor, Var)> = shipped
                .first()
                .map(|(_, t)| {
                    Ok::<_, candle_core::Error>((t.clone(), Var::from_tensor(&t.detach())?))
                })
                .transpose()?;
            let mut partials: Vec<Tensor> = own_part
                .iter()
                .map(|(_, l)| l.as_tensor().clone())
                .collect();
            let mut leaves: Vec<Vec<Var>> = Vec::new();
            let top = self.setup.per_layer[0].len() - 1;
            // Replicas' partials cover disjoint seeds: gathered per replica group, then put in batch order.
            let mut groups: BTreeMap<Vec<Vec<RelationId>>, Vec<ReplicaPiece>> = BTreeMap::new();
            for (k, bytes) in peers.iter().zip(&raw) {
                let pieces: Vec<(u32, Vec<u32>, Vec<f32>)> = messages::decode(bytes)
                    .map_err(|e| e.context(format!("worker {k}'s partial")))?;
                let (j, r) = s.replicas[*k as usize];
                let rows = share(batch, (j, r));
                let mut mine = Vec::new();
                let mut means = Vec::new();
                let mut whole = None;
                let means_expected = self.ships_means[*k as usize];
                let mut tags = BTreeSet::new();
                if (!means_expected && pieces.len() > 1)
                    || pieces
                        .iter()
                        .any(|p| (p.0 == WHOLE) == means_expected || !tags.insert(p.0))
                {
                    return Err(TrainError::Protocol(format!("worker {k} sent {} pieces that are not one partial or distinct relation means", pieces.len())));
                }
                for (tag, shape, values) in pieces {
                    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
                    let mut want = vec![rows.len()];
                    if tag == WHOLE {
                        want.extend(self.model.partial_dims()?);
                    } else {
                        want.push(self.model.mean_width(RelationId(tag))?);
                    }
                    if dims != want
                        || want.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
                            != Some(values.len())
                    {
                        return Err(TrainError::Protocol(format!("worker {k}'s partial has shape {dims:?} and {} values; {want:?} expected", values.len())));
                    }
                    let leaf = Var::from_tensor(&Tensor::from_vec(values, dims, &self.device)?)?;
                    if tag == WHOLE {
                        whole = Some(leaf.as_tensor().clone());
                    } else {
                        let r = RelationId(tag);
                        if !self.ships_means[*k as usize]
                            || !self.setup.per_layer[*k as usize][top].contains(&r)
                        {
                            return Err(TrainError::Protocol(format!("worker {k} sent the means of relation {tag}, which it does not ship")));
                        }
                        means.push((r, leaf.as_tensor().clone()));
                    }
                    mine.push(leaf);
                }
                if !means.is_empty() {
                    whole = self.model.transform_means(&means)?;
                }
                // A replica whose seeds have no top-layer edges sends nothing:
                // its rows are the neutral partial.
                if whole.is_none() && r > 1 && !rows.is_empty() {
                    whole = Some(self.model.neutral_partial(rows.len())?);
                }
                if let Some(p) = whole {
                    if r > 1 {
                        groups
                            .entry(self.setup.per_layer[*k as usize].clone())
                            .or_default()
                            .push((j, rows, p));
                    } else {
                        partials.push(p);
                    }
                }
                leaves.push(mine);
            }
            for (_, mut reps) in groups {
                reps.sort_by_key(|(j, _, _)| *j);
                let mut index = vec![0u32; b];
                let mut covered = 0;
                let mut offset = 0;
                for (_, rows, p) in &reps {
                    for (k, &i) in rows.iter().enumerate() {
                        index[i] = (offset + k) as u32;
                    }
                    covered += rows.len();
                    offset += p.dim(0)?;
                }
                if covered != b {
                    return Err(TrainError::Internal(format!(
                        "the replicas of a sub-metatree cover {covered} of {b} seeds"
                    )));
                }
                let cat = Tensor::cat(
                    &reps.iter().map(|(_, _, p)| p.clone()).collect::<Vec<_>>(),
                    0,
                )?;
                partials.push(cat.index_select(&Tensor::from_vec(index, b, &self.device)?, 0)?);
            }
            let logits =
                self.model
                    .reduce_top(&mb.seeds, own_leaf.as_tensor(), &partials, dropout)?;
            if !train {
                if let Some(scores) = scores {
                    self.task.score(&logits.detach(), &mb.seeds, scores)?;
                }
                out.compute_s += lap(&mut clock);
                return Ok(out);
            }
            out.correct = self.task.correct(&logits, &mb.seeds)?;
            let losses = self.task.loss(&logits, &mb.seeds)?;
            let scalar = |x: &Tensor| x.to_dtype(DType::F64)?.to_scalar::<f64>();
            out.loss = scalar(&losses.total)?;
            out.each = losses
                .each
                .iter()
                .map(scalar)
                .collect::<candle_core::Result<_>>()?;
            let gs = losses.total.backward()?;
            out.compute_s += lap(&mut clock);
            let mut msgs = Vec::new();
            for (k, mine) in peers.iter().zip(&leaves) {
                let mut data = Vec::new();
                for leaf in mine {
                    match gs.get(leaf.as_tensor()) {
                        Some(gr) => data.extend(to_bytes(gr)?),
                        None => data.extend(to_bytes(&leaf.as_tensor().zeros_like()?)?),
                    }
                }
                msgs.push((
                    &self.s.workers[*k as usize],
                    PartialGrad {
                        gen: s.gen,
                        seq,
                        from: 0,
                        data: ByteVec(data),
                    },
                ));
            }
            self.send_all(msgs)?;
            out.comm_s += lap(&mut clock);
            // Detached: a gradient can still reference the head's graph.
            let grad_or_zeros = |l: &Var| {
                gs.get(l.as_tensor())
                    .map(Tensor::detach)
                    .map_or_else(|| l.as_tensor().zeros_like(), Ok)
            };
            let mut surrogate = (&own * grad_or_zeros(&own_leaf)?)?.sum_all()?;
            if let Some((p, l)) = &own_part {
                surrogate = (surrogate + (p * grad_or_zeros(l)?)?.sum_all()?)?;
            }
            let mut local = surrogate.backward()?;
            add_grads(&mut local, &gs, &self.model, &inputs)?;
            let mut gs = local;
            out.compute_s += lap(&mut clock);
            let askers: Vec<u32> = (1..self.workers())
                .filter(|&k| self.needs_seeds[k as usize])
                .collect();
            if !askers.is_empty() {
                let raw = s.inbox.raw(
                    "the seeds' row gradients",
                    seq,
                    round::SEED_GRAD,
                    &askers,
                    timeout,
                )?;
                out.comm_s += lap(&mut clock);
                let width = own.dim(1)?;
                let mut sum: Option<Tensor> = None;
                for bytes in &raw {
                    let gr =
                        Tensor::from_vec(decode_f32(bytes, b * width)?, (b, width), &self.device)?;
                    sum = Some(match sum {
                        Some(s) => (s + gr)?,
                        None => gr,
                    });
                }
                if let Some(sum) = sum {
                    let more = (own * sum)?.sum_all()?.backward()?;
                    add_grads(&mut gs, &more, &self.model, &inputs)?;
                }
                out.compute_s += lap(&mut clock);
            }
            grads = Some(gs);
        } else {
            let mut pieces = Vec::new();
            for (tag, t) in &shipped {
                let shape: Vec<u32> = t.dims().iter().map(|&d| d as u32).collect();
                pieces.push((
                    *tag,
                    shape,
                    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
                ));
            }
            self.send(
                &self.s.reducer,
                Partial {
                    gen: s.gen,
                    seq,
                    from: w,
                    data: ByteVec(messages::encode(&pieces)?),
                },
            )?;
            out.comm_s += lap(&mut clock);
            if !train {
                return Ok(out);
            }
            let raw = s.inbox.raw(
                "the gradient of this worker's partial",
                seq,
                round::PARTIAL_GRAD,
                &[0],
                timeout,
            )?;
            out.comm_s += lap(&mut clock);
            let total: usize = shipped.iter().map(|(_, t)| t.elem_count()).sum();
            let flat = decode_f32(&raw[0], total)?;
            let mut surrogate: Option<Tensor> = None;
            let mut at = 0;
            for (_, t) in &shipped {
                let gr =
                    Tensor::from_slice(&flat[at..at + t.elem_count()], t.shape(), &self.device)?;
                at += t.elem_count();
                let term = (t * gr)?.sum_all()?;
                surrogate = Some(match surrogate {
                    Some(s) => (s + term)?,
                    None => term,
                });
            }
            let gs = surrogate.map(|s| s.backward()).transpose()?;
            out.compute_s += lap(&mut clock);
            if self.needs_seeds[w as usize] {
                let width = seed_width;
                let mine: Vec<f32> = match seed_leaf
                    .as_ref()
                    .and_then(|l| gs.as_ref().and_then(|g| g.get(l.as_tensor())))
                {
                    Some(gr) => gr.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
                    None => vec![0.0; b * width],
                };
                // Rows of the whole batch (zero where another replica's seeds are).
                let mut full = vec![0f32; batch.len() * width];
                for (k, &i) in share(batch, s.replicas[w as usize]).iter().enumerate() {
                    full[i * width..(i + 1) * width]
                        .copy_from_slice(&mine[k * width..(k + 1) * width]);
                }
                self.send(
                    &self.s.reducer,
                    SeedGrad {
                        gen: s.gen,
                        seq,
                        from: w,
                        data: ByteVec(bytemuck::cast_slice(&full).to_vec()),
                    },
                )?;
            }
            grads = gs;
        }
        self.update(seq, mb, &inputs, grads.as_ref(), &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::share;
    use super::update::distinct_below;

    #[test]
    fn received_row_ids_must_be_distinct_and_in_range_and_leave_the_scratch_clean() {
        let mut slot = Vec::new();
        assert!(distinct_below(&mut slot, &[3, 0, 9], 10));
        assert!(
            !distinct_below(&mut slot, &[3, 5, 3, 7], 10),
            "a repeated id"
        );
        assert!(
            !distinct_below(&mut slot, &[3, 10], 10),
            "an id out of range"
        );
        assert!(
            slot.iter().all(|&s| s == u32::MAX),
            "marks undone after a refusal too"
        );
        assert!(
            distinct_below(&mut slot, &[7, 5, 3], 10),
            "earlier calls leave nothing behind"
        );
        assert!(distinct_below(&mut slot, &[], 0));
    }

    #[test]
    fn replicas_split_a_batch_into_disjoint_shares_that_cover_it() {
        let batch = [7u32, 2, 9, 4, 11, 6];
        assert_eq!(share(&batch, (0, 1)), vec![0, 1, 2, 3, 4, 5]);
        let (a, b) = (share(&batch, (0, 2)), share(&batch, (1, 2)));
        assert_eq!(a, vec![1, 3, 5]);
        assert_eq!(b, vec![0, 2, 4]);
        let thirds: Vec<usize> = (0..3).flat_map(|j| share(&batch, (j, 3))).collect();
        let mut sorted = thirds.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2, 3, 4, 5]);
    }
}
