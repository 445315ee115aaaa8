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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor, Var};
use futures_util::future::join_all;
use graphs::{GraphError, HetGraph, MiniBatch, RelationFilter, RelationPicks, Sampler};
use models::model::DropoutKey;
use models::optim::{Adam, AdamConfig};
use models::rgcn::PerType;
use models::Model;
use runtime::{ActorRef, ByteVec, Node};

use super::messages::{Pull, Push, SampleReq, Save};
use super::names;
use crate::cache::rows::Lookup;
use crate::cache::{hotness, profile, CachePolicy, DeviceCache, FeatureCache};
use crate::config::{AllReduce, TrainingConfig};
use crate::distributed::checkpoint::{self, Progress};
use crate::distributed::epochs::{self, Attempt, StepFigures, Steps};
use crate::distributed::generations::abort_peers;
use crate::distributed::inbox::Inbox;
use crate::distributed::messages::{EpochStats, GradShare, Saved, StepDone};
use crate::distributed::{decode_f32, Timeouts};
use crate::epoch::{lap, EVAL_BATCH, EVAL_SEED};
use crate::error::{Result, TrainError};

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
    /// Device caches built by earlier generations in this process, by trainer.
    pub caches: super::CacheSlots,
}

struct Peers {
    samplers: Vec<ActorRef>,
    /// `[type][part]`, for types that have a store.
    stores: Vec<Vec<ActorRef>>,
    trainers: Vec<ActorRef>,
    coordinator: ActorRef,
}

/// Runs every epoch; returns the final replica. On failure, tells the other
/// trainers and the coordinator so they stop instead of waiting.
pub fn run(s: TrainerSetup) -> Result<Model> {
    let result = Trainer::new(&s).and_then(|mut t| {
        t.train()?;
        Ok(t.rep.model)
    });
    if let Err(e) = &result {
        let targets: Vec<String> = (0..s.trainers).filter(|&p| p != s.trainer).map(names::trainer).chain([names::COORDINATOR.to_string()]).collect();
        abort_peers(&s.node, &s.handle, &names::trainer(s.trainer), s.trainer, s.gen, &targets, &e.to_string());
    }
    result
}

/// What sampling and gathering need: shared by the trainer and its prefetch thread.
struct Ctx<'a> {
    s: &'a TrainerSetup,
    peers: Peers,
    /// Types whose inputs are learnable rows held by the stores.
    learnable: Vec<bool>,
    /// Types the model reads.
    wanted: Vec<bool>,
    device: Device,
    dtype: DType,
    uses_neighbors: bool,
    /// Feature rows cached on the device (set once the cache is built).
    cache: Option<Arc<FeatureCache>>,
}

/// Which input rows to gather.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// Plain features only (immutable: can be fetched ahead).
    Features,
    /// Learnable rows only (read when used: they change every step), as gradient leaves.
    Learnable,
    /// Both, learnable ones without gradients (evaluation).
    All,
}

/// A batch sampled and with its features gathered ahead of its step.
struct Prepared {
    seeds: Vec<u32>,
    share: f64,
    mb: Option<MiniBatch>,
    features: PerType,
    sample_s: f64,
    gather_s: f64,
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
}

/// Rows per pull when a cache is filled.
const FILL_ROWS: usize = 16 << 10;

impl<'a> Trainer<'a> {
    fn new(s: &'a TrainerSetup) -> Result<Trainer<'a>> {
        let t = &s.cfg;
        let device = crate::device::open(&t.device)?;
        let mut model = Model::new(&t.model_spec(), &s.graph, DType::F32, &device)?;
        let learnable: Vec<bool> = model.embeddings.iter().map(Option::is_some).collect();
        // The stores own the learnable rows: the replica keeps none.
        for e in &mut model.embeddings {
            *e = None;
        }
        let target = s.graph.target().index();
        let wanted = (0..learnable.len()).map(|ty| model.uses_neighbors() || ty == target).collect();
        let me = runtime::ActorName::new(&names::trainer(s.trainer)).map_err(|e| TrainError::Distributed(e.to_string()))?;
        let actor = |n: String| s.node.actor(&n).map(|r| r.with_sender(me.clone())).map_err(|e| TrainError::Distributed(format!("{n}: {e}")));
        let types = s.graph.node_types();
        let mut stores = Vec::new();
        for (ty, nt) in types.iter().enumerate() {
            let has = nt.features.is_some() || learnable[ty];
            stores.push(if has { (0..s.parts).map(|p| actor(names::store(&nt.name, p))).collect::<Result<Vec<_>>>()? } else { Vec::new() });
        }
        let peers = Peers {
            samplers: (0..s.parts).map(|p| actor(names::sampler(p))).collect::<Result<_>>()?,
            stores,
            trainers: (0..s.trainers).map(|p| actor(names::trainer(p))).collect::<Result<_>>()?,
            coordinator: actor(names::COORDINATOR.to_string())?,
        };
        let mut adam = Adam::new(AdamConfig::with_lr(t.lr));
        let mut seq = 0;
        if let Some((dir, m)) = &s.from {
            let mut tensors = checkpoint::load_tensors(dir, m, checkpoint::DENSE)?;
            models::checkpoint::restore_dense(dir, &mut tensors, &mut model, &mut adam)?;
            seq = m.seq;
        }
        let mut ctx = Ctx { s, peers, learnable, wanted, device, dtype: model.dtype(), uses_neighbors: model.uses_neighbors(), cache: None };
        // Feature rows do not change: a cache built by an earlier generation of this process serves on.
        let slot = s.caches.get(s.trainer as usize).ok_or_else(|| TrainError::Distributed(format!("no cache slot for trainer {}", s.trainer)))?;
        let reused = slot.lock().map_err(|_| TrainError::Distributed("a trainer panicked while building its cache".into()))?.clone();
        let cache = match reused {
            Some(c) => Some(c),
            None => {
                let built = ctx.build_cache()?.map(Arc::new);
                *slot.lock().map_err(|_| TrainError::Distributed("a trainer panicked while building its cache".into()))? = built.clone();
                built
            }
        };
        ctx.cache = cache.as_ref().map(|c| c.features.clone());
        Ok(Trainer { ctx, rep: Replica { model, adam, seq, cache, s } })
    }

    fn train(&mut self) -> Result<()> {
        let s = self.ctx.s;
        let resumed = s.from.as_ref().map(|(_, m)| m.progress).unwrap_or_default();
        let attempt = Attempt { node: &s.node, gen: s.gen, trainer: s.trainer, cfg: &s.cfg, graph: &s.graph, resumed };
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

    /// Samples the trainer's share of the batch and gathers its plain features.
    fn prepare(ctx: &Ctx<'a>, _: &mut (), epoch: u64, step: u64, seeds: &[u32]) -> Result<Prepared> {
        ctx.prepare(ctx.s.cfg.seed, epoch, step, seeds, ctx.s.graph.target().index())
    }

    fn checkpoint(&mut self, ctx: &Ctx<'a>, progress: Progress) -> Result<()> {
        ctx.checkpoint(self, progress)
    }

    fn step(&mut self, ctx: &Ctx<'a>, epoch: u64, step: u64, seeds: &[u32], p: Prepared, st: &mut EpochStats) -> Result<StepFigures> {
        st.time.sample_s += p.sample_s;
        st.time.gather_s += p.gather_s;
        let (loss, correct) = self.train_step(ctx, epoch, step, p, st)?;
        if self.s.trainer == 0 {
            let c = ctx.peers.coordinator.clone();
            ctx.block_on(c.ask(StepDone { gen: self.s.gen, epoch, seq: self.seq - 1, loss }, self.s.timeouts.ask))??;
        }
        Ok(StepFigures { loss, correct, seen: seeds.len() as u64 })
    }

    fn evaluate(&mut self, ctx: &Ctx<'a>, epoch: u64, st: &mut EpochStats) -> Result<()> {
        let (_, splits) = self.s.graph.target_labels();
        st.valid_correct = self.count_correct(ctx, epoch, &splits.valid)?;
        st.test_correct = self.count_correct(ctx, epoch, &splits.test)?;
        Ok(())
    }

    fn cache_report(&self) -> BTreeMap<String, crate::cache::CacheTypeReport> {
        self.cache.as_ref().map(|c| c.report()).unwrap_or_default()
    }

    fn send_stats(&self, ctx: &Ctx<'a>, st: EpochStats) -> Result<()> {
        let c = ctx.peers.coordinator.clone();
        ctx.block_on(c.ask(st, self.s.timeouts.ask))??;
        Ok(())
    }
}

impl Replica<'_> {
    /// One training step; returns the global loss and the global number of correct predictions.
    fn train_step(&mut self, ctx: &Ctx, epoch: u64, step: u64, p: Prepared, st: &mut EpochStats) -> Result<(f64, f64)> {
        let g = ctx.s.graph.clone();
        let (labels, _) = g.target_labels();
        let mut clock = Instant::now();
        let mut grads = None;
        let (mut wloss, mut correct) = (0.0, 0.0);
        let mut pushes: Vec<Vec<(Vec<u32>, Vec<f32>)>> = Vec::new();
        let (seeds, share) = (&p.seeds, p.share);
        if let Some(mb) = &p.mb {
            let mut inputs = ctx.gather(&mb.blocks[0].src, Rows::Learnable, self.seq.checked_sub(1))?;
            for (x, f) in inputs.iter_mut().zip(p.features) {
                if x.is_none() {
                    *x = f;
                }
            }
            st.time.gather_s += lap(&mut clock);
            let y: Vec<u32> = seeds.iter().map(|&s| labels[s as usize] as u32).collect();
            let y = Tensor::from_vec(y, seeds.len(), &ctx.device)?;
            let logits = self.model.forward(&g, mb, inputs.clone(), Some(DropoutKey { epoch, step }))?;
            let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
            let scaled = (&loss * share)?;
            let gs = scaled.backward()?;
            wloss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()? * share;
            let pred: Vec<u32> = logits.argmax(1)?.to_vec1()?;
            correct = pred.iter().zip(seeds).filter(|(p, s)| i64::from(**p) == labels[**s as usize]).count() as f64;
            st.time.compute_s += lap(&mut clock);
            for (ty, x) in inputs.iter().enumerate() {
                let mut per_owner = vec![(Vec::new(), Vec::new()); ctx.s.parts as usize];
                if let (true, Some(x)) = (ctx.learnable[ty], x) {
                    if let Some(gr) = gs.get(x) {
                        let dim = gr.dim(1)?;
                        let gv: Vec<f32> = gr.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
                        for (i, &v) in mb.blocks[0].src[ty].iter().enumerate() {
                            let o = &mut per_owner[ctx.s.owners[ty][v as usize] as usize];
                            o.0.push(v);
                            o.1.extend_from_slice(&gv[i * dim..(i + 1) * dim]);
                        }
                    }
                }
                pushes.push(per_owner);
            }
            grads = Some(gs);
        }
        // Every trainer pushes to every learnable store each step (empty if it
        // has nothing), so a store knows when the step's gradient is complete.
        let me = ctx.s.trainer;
        let mut asks = Vec::new();
        for (ty, stores) in ctx.peers.stores.iter().enumerate() {
            if !ctx.learnable[ty] {
                continue;
            }
            for (p, store) in stores.iter().enumerate() {
                let (ids, grad) = pushes.get_mut(ty).map(|o| std::mem::take(&mut o[p])).unwrap_or_default();
                let msg = Push { gen: ctx.s.gen, seq: self.seq, trainer: me, ids, grad: ByteVec(bytemuck::cast_slice(&grad).to_vec()) };
                asks.push(ctx.push(store, msg));
            }
        }
        let pushes = asks;

        // Dense gradients, a presence flag per parameter, the loss and the correct count.
        let mut flat = Vec::new();
        let mut flags = Vec::new();
        for (_, var) in self.model.params.iter() {
            match grads.as_ref().and_then(|gs| gs.get(var.as_tensor())) {
                Some(gr) => {
                    flat.extend(gr.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?);
                    flags.push(1.0);
                }
                None => {
                    flat.resize(flat.len() + var.elem_count(), 0.0);
                    flags.push(0.0);
                }
            }
        }
        flat.extend(flags);
        flat.push(wloss as f32);
        flat.push(correct as f32);
        let sum = self.all_reduce(ctx, flat, pushes)?;
        st.time.comm_s += lap(&mut clock);
        let n_params = self.model.params.len();
        let values = sum.len() - n_params - 2;
        let mut named = BTreeMap::new();
        let mut at = 0;
        for (i, (name, var)) in self.model.params.iter().enumerate() {
            let n = var.elem_count();
            if sum[values + i] > 0.0 {
                named.insert(name.to_string(), Tensor::from_slice(&sum[at..at + n], var.shape(), &ctx.device)?.to_dtype(var.dtype())?);
            }
            at += n;
        }
        self.adam.step_named(&self.model.params, &named)?;
        st.time.update_s += lap(&mut clock);
        self.seq += 1;
        // Every share of earlier steps has been taken: what is left of them is duplicates.
        ctx.s.inbox.forget_before(self.seq);
        Ok((f64::from(sum[sum.len() - 2]), f64::from(sum[sum.len() - 1])))
    }

    /// Sums `mine` with every other trainer's vector of the same step, in trainer order.
    /// Sums `mine` with the other trainers' vectors of this step, in trainer
    /// order, while `pushes` (this step's embedding gradients) travel; both
    /// are acknowledged before it returns. A store serves this step's rows to
    /// the next only once every push has arrived (see [`Pull::after`]).
    fn all_reduce<P>(&mut self, ctx: &Ctx, mine: Vec<f32>, pushes: Vec<P>) -> Result<Vec<f32>>
    where
        P: std::future::Future<Output = std::result::Result<(), String>>,
    {
        match ctx.s.cfg.allreduce {
            AllReduce::AllGather => self.all_gather(ctx, mine, pushes),
            AllReduce::Ring => self.ring(ctx, mine, pushes),
        }
    }

    /// Every trainer sends its whole vector to every other and sums all of
    /// them in trainer order: one round, (K-1)·n values sent per trainer.
    fn all_gather<P>(&mut self, ctx: &Ctx, mine: Vec<f32>, pushes: Vec<P>) -> Result<Vec<f32>>
    where
        P: std::future::Future<Output = std::result::Result<(), String>>,
    {
        let s = ctx.s;
        let me = s.trainer;
        let bytes = ByteVec(bytemuck::cast_slice(&mine).to_vec());
        let asks = ctx
            .peers
            .trainers
            .iter()
            .enumerate()
            .filter(|(p, _)| *p as u32 != me)
            .map(|(_, r)| r.ask(GradShare { gen: s.gen, seq: self.seq, round: 0, from: me, data: bytes.clone() }, s.timeouts.ask));
        let (shared, pushed) = ctx.block_on(futures_util::future::join(join_all(asks), join_all(pushes)))?;
        for r in shared {
            r?;
        }
        for r in pushed {
            r.map_err(TrainError::Distributed)?;
        }
        let others: Vec<u32> = (0..s.trainers).filter(|&p| p != me).collect();
        let mut shares = s.inbox.gradients(self.seq, 0, &others, mine.len(), s.timeouts.step)?.into_iter();
        let mut sum = vec![0.0f32; mine.len()];
        for p in 0..s.trainers {
            let v = if p == me { mine.clone() } else { shares.next().expect("one share per peer") };
            sum.iter_mut().zip(&v).for_each(|(a, b)| *a += b);
        }
        Ok(sum)
    }

    /// Ring all-reduce: K-1 rounds of reduce-scatter, then K-1 of all-gather,
    /// one chunk of n/K values to the next trainer per round: 2(K-1)/K·n
    /// values sent per trainer. Each chunk is summed once, on one trainer,
    /// and copied to the others, so every replica gets the same bits.
    fn ring<P>(&mut self, ctx: &Ctx, mine: Vec<f32>, pushes: Vec<P>) -> Result<Vec<f32>>
    where
        P: std::future::Future<Output = std::result::Result<(), String>>,
    {
        let s = ctx.s;
        let (k, r, n) = (s.trainers as usize, s.trainer as usize, mine.len());
        let mut pushes = Some(join_all(pushes));
        let mut v = mine;
        let span = |c: usize| c * n / k..(c + 1) * n / k;
        let next = &ctx.peers.trainers[(r + 1) % k];
        let prev = ((r + k - 1) % k) as u32;
        for i in 0..2 * (k - 1) {
            let (send, recv) = if i < k - 1 {
                ((r + k - i) % k, (r + 2 * k - i - 1) % k)
            } else {
                let j = i - (k - 1);
                ((r + 1 + k - j) % k, (r + k - j) % k)
            };
            let msg = GradShare { gen: s.gen, seq: self.seq, round: i as u32, from: s.trainer, data: ByteVec(bytemuck::cast_slice(&v[span(send)]).to_vec()) };
            let ask = next.ask(msg, s.timeouts.ask);
            match pushes.take() {
                Some(p) => {
                    let (sent, pushed) = ctx.block_on(futures_util::future::join(ask, p))?;
                    sent?;
                    for r in pushed {
                        r.map_err(TrainError::Distributed)?;
                    }
                }
                None => ctx.block_on(ask)??,
            }
            let got = s.inbox.gradients(self.seq, i as u32, &[prev], span(recv).len(), s.timeouts.step)?.remove(0);
            let dst = &mut v[span(recv)];
            if i < k - 1 {
                dst.iter_mut().zip(&got).for_each(|(a, b)| *a += b);
            } else {
                dst.copy_from_slice(&got);
            }
        }
        if let Some(p) = pushes {
            for r in ctx.block_on(p)? {
                r.map_err(TrainError::Distributed)?;
            }
        }
        Ok(v)
    }

    /// Correct predictions on this trainer's share of `nodes` (no dropout).
    fn count_correct(&self, ctx: &Ctx, epoch: u64, nodes: &[u32]) -> Result<u64> {
        let g = ctx.s.graph.clone();
        let (labels, _) = g.target_labels();
        let target = g.target().index();
        let mut correct = 0;
        for (step, chunk) in nodes.chunks(EVAL_BATCH).enumerate() {
            let seeds: Vec<u32> = chunk.iter().copied().filter(|&v| ctx.mine(target, v)).collect();
            if seeds.is_empty() {
                continue;
            }
            let mb = ctx.sample(ctx.s.cfg.seed ^ EVAL_SEED, epoch, step as u64, &seeds)?;
            let inputs = ctx.gather(&mb.blocks[0].src, Rows::All, self.seq.checked_sub(1))?;
            let logits = self.model.forward(&g, &mb, inputs, None)?.detach();
            let pred: Vec<u32> = logits.argmax(1)?.to_vec1()?;
            correct += pred.iter().zip(&seeds).filter(|(p, s)| i64::from(**p) == labels[**s as usize]).count() as u64;
        }
        Ok(correct)
    }
}

impl Ctx<'_> {
    /// The partition's part of the checkpoint before step `rep.seq` (its
    /// first trainer does it): trainer 0 writes the dense state, each
    /// embedding store its rows; then the coordinator hears of the files.
    fn checkpoint(&self, rep: &Replica, progress: Progress) -> Result<()> {
        let s = self.s;
        let per_part = s.trainers / s.parts;
        let Some(root) = s.cfg.checkpoint_dir.as_ref() else { return Ok(()) };
        if s.trainer % per_part != 0 {
            return Ok(());
        }
        let seq = rep.seq;
        let mut files = Vec::new();
        if s.trainer == 0 {
            files.push(checkpoint::write_dense(root, seq, &rep.model, &rep.adam)?);
        }
        let deadline = Instant::now() + s.timeouts.step;
        for (ty, stores) in self.peers.stores.iter().enumerate() {
            if !self.learnable[ty] {
                continue;
            }
            let store = &stores[s.part as usize];
            loop {
                match self.block_on(store.ask(Save { gen: s.gen, seq }, s.timeouts.ask))?? {
                    Ok(Some(f)) => {
                        files.push(f);
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                    Ok(None) => return Err(TrainError::Distributed(format!("{}: not at step {seq} within {:?}", store.name(), s.timeouts.step))),
                    Err(e) => return Err(TrainError::Checkpoint(format!("{}: {e}", store.name()))),
                }
            }
        }
        let msg = Saved { gen: s.gen, seq, part: s.part, files, progress: (s.trainer == 0).then_some(progress) };
        self.block_on(self.peers.coordinator.ask(msg, s.timeouts.ask))??;
        Ok(())
    }

    /// Pushes a step's gradient rows to a store, again while the store has
    /// not started this generation.
    async fn push(&self, store: &ActorRef, msg: Push) -> std::result::Result<(), String> {
        let deadline = Instant::now() + self.s.timeouts.step;
        loop {
            let again = Push { gen: msg.gen, seq: msg.seq, trainer: msg.trainer, ids: msg.ids.clone(), grad: msg.grad.clone() };
            match store.ask(again, self.s.timeouts.ask).await {
                Ok(Ok(Some(()))) => return Ok(()),
                Ok(Ok(None)) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(1)).await,
                Ok(Ok(None)) => return Err(format!("not at generation {:x} within {:?}", msg.gen, self.s.timeouts.step)),
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn owned(&self, ty: usize, v: u32) -> bool {
        self.s.owners[ty][v as usize] as u32 == self.s.part
    }

    /// Whether target node `v` is one of this trainer's seeds.
    fn mine(&self, target: usize, v: u32) -> bool {
        let per_part = self.s.trainers / self.s.parts;
        self.owned(target, v) && self.s.trainer_of.get(v as usize).map_or(0, |&t| u32::from(t)) == self.s.trainer % per_part
    }

    /// Runs `f` on the node's runtime from this thread; gives up as soon as
    /// the run is aborted (a peer failed or went down).
    fn block_on<F: std::future::Future>(&self, f: F) -> Result<F::Output> {
        let inbox = &self.s.inbox;
        self.s.handle.block_on(async {
            tokio::select! {
                r = f => Ok(r),
                reason = inbox.aborted() => Err(TrainError::Distributed(reason)),
            }
        })
    }

    /// Samples step `step`'s share of `batch` and gathers its plain features.
    fn prepare(&self, seed: u64, epoch: u64, step: u64, batch: &[u32], target: usize) -> Result<Prepared> {
        let seeds: Vec<u32> = batch.iter().copied().filter(|&v| self.mine(target, v)).collect();
        let share = seeds.len() as f64 / batch.len().max(1) as f64;
        if seeds.is_empty() {
            return Ok(Prepared { seeds, share, mb: None, features: Vec::new(), sample_s: 0.0, gather_s: 0.0 });
        }
        let t = Instant::now();
        let mb = self.sample(seed, epoch, step, &seeds)?;
        let sample_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let features = self.gather(&mb.blocks[0].src, Rows::Features, None)?;
        Ok(Prepared { seeds, share, mb: Some(mb), features, sample_s, gather_s: t.elapsed().as_secs_f64() })
    }

    /// Samples `seeds` (owned here), asking owners for the picks of remote frontier nodes.
    fn sample(&self, seed: u64, epoch: u64, step: u64, seeds: &[u32]) -> Result<MiniBatch> {
        let g = &*self.s.graph;
        if !self.uses_neighbors {
            return crate::epoch::sample(&mut Sampler::new(g, &self.s.cfg.fanouts, seed)?, false, epoch, step, seeds);
        }
        let mut sampler = Sampler::new(g, &self.s.cfg.fanouts, seed)?;
        let owners = &self.s.owners;
        let part = self.s.part;
        let remote = |layer: usize, fanout: usize, away: &[Vec<u32>]| self.remote_picks(seed, epoch, step, layer, fanout, away);
        Ok(sampler.sample_with(epoch, step, seeds, &RelationFilter::All, |t, v| owners[t][v as usize] as u32 == part, remote)?)
    }

    fn remote_picks(&self, seed: u64, epoch: u64, step: u64, layer: usize, fanout: usize, away: &[Vec<u32>]) -> graphs::Result<Vec<Vec<RelationPicks>>> {
        let parts = self.s.parts as usize;
        let nt = away.len();
        let mut reqs = vec![vec![Vec::new(); nt]; parts];
        let mut pos = vec![vec![Vec::new(); nt]; parts];
        for (t, nodes) in away.iter().enumerate() {
            for (i, &v) in nodes.iter().enumerate() {
                let o = self.s.owners[t][v as usize] as usize;
                reqs[o][t].push(v);
                pos[o][t].push(i);
            }
        }
        let asking: Vec<usize> = (0..parts).filter(|&o| reqs[o].iter().any(|r| !r.is_empty())).collect();
        let asks = asking.iter().map(|&o| {
            let msg = SampleReq { seed, epoch, step, layer: layer as u32, fanout: fanout as u32, nodes: std::mem::take(&mut reqs[o]) };
            self.peers.samplers[o].ask(msg, self.s.timeouts.ask)
        });
        let bad = |m: String| GraphError::InvalidArgument(m);
        let answers = self.block_on(join_all(asks.collect::<Vec<_>>())).map_err(|e| bad(e.to_string()))?;
        let mut by_owner: Vec<Option<Vec<Vec<RelationPicks>>>> = vec![None; parts];
        for (&o, a) in asking.iter().zip(answers) {
            let picks = a.map_err(|e| bad(e.to_string()))?.map_err(|e| bad(format!("{}: {e}", names::sampler(o as u32))))?;
            if picks.len() != nt {
                return Err(bad(format!("{} answered for {} types, {nt} asked", names::sampler(o as u32), picks.len())));
            }
            by_owner[o] = Some(picks);
        }
        // Put the owners' answers back in request order, per type and relation.
        let mut out = Vec::with_capacity(nt);
        for (t, nodes) in away.iter().enumerate() {
            let holders: Vec<usize> = (0..parts).filter(|&o| !pos[o][t].is_empty()).collect();
            let Some(&first) = holders.first() else {
                out.push(Vec::new());
                continue;
            };
            let rels: Vec<graphs::RelationId> = by_owner[first].as_ref().map(|a| a[t].iter().map(|p| p.relation).collect()).unwrap_or_default();
            let mut merged = Vec::with_capacity(rels.len());
            for (j, &rel) in rels.iter().enumerate() {
                let mut lists: Vec<&[u32]> = vec![&[]; nodes.len()];
                for &o in &holders {
                    let p = by_owner[o].as_ref().and_then(|a| a[t].get(j)).filter(|p| p.relation == rel).ok_or_else(|| bad(format!("{} answered other relations", names::sampler(o as u32))))?;
                    let n = pos[o][t].len();
                    let ok = p.offsets.len() == n + 1 && p.offsets.windows(2).all(|w| w[0] <= w[1]) && p.offsets.last().map(|&e| e as usize) == Some(p.picks.len());
                    if !ok {
                        return Err(bad(format!("{} sent malformed picks", names::sampler(o as u32))));
                    }
                    for (q, &i) in pos[o][t].iter().enumerate() {
                        lists[i] = &p.picks[p.offsets[q] as usize..p.offsets[q + 1] as usize];
                    }
                }
                let mut offsets = Vec::with_capacity(nodes.len() + 1);
                offsets.push(0u32);
                let mut picks = Vec::new();
                for l in lists {
                    picks.extend_from_slice(l);
                    offsets.push(picks.len() as u32);
                }
                merged.push(RelationPicks { relation: rel, offsets, picks });
            }
            out.push(merged);
        }
        Ok(out)
    }

    /// Pulls `ids` from `store`, asking again while step `after`'s update is
    /// not applied there (pushes travel alongside the all-reduce).
    async fn pull(&self, store: &ActorRef, ids: &[u32], after: Option<u64>) -> std::result::Result<ByteVec, String> {
        let deadline = Instant::now() + self.s.timeouts.step;
        loop {
            match store.ask(Pull { gen: self.s.gen, ids: ids.to_vec(), after }, self.s.timeouts.ask).await {
                Ok(Ok(Some(rows))) => return Ok(rows),
                Ok(Ok(None)) if Instant::now() < deadline => tokio::time::sleep(Duration::from_micros(500)).await,
                Ok(Ok(None)) => return Err(format!("step {after:?} of generation {:x} not applied within {:?}", self.s.gen, self.s.timeouts.step)),
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Whether `rows` includes type `ty`'s inputs.
    fn gathers(&self, ty: usize, rows: Rows) -> bool {
        let kind = match rows {
            Rows::Features => !self.learnable[ty],
            Rows::Learnable => self.learnable[ty],
            Rows::All => true,
        };
        kind && self.wanted[ty] && !self.peers.stores[ty].is_empty()
    }

    /// Input rows of `src` per type: features (local rows read here, the rest
    /// pulled from their owners) and learnable rows (pulled; as gradient
    /// leaves when `train`).
    fn gather(&self, src: &[Vec<u32>], rows: Rows, after: Option<u64>) -> Result<PerType> {
        let g = &*self.s.graph;
        let parts = self.s.parts as usize;
        // Cached feature rows are taken from the device cache; only the misses are read or pulled.
        let cached = |ty: usize| self.cache.as_ref().and_then(|c| c.get(ty)).filter(|_| rows != Rows::Learnable);
        let lookups: Vec<Option<Lookup>> = src.iter().enumerate().map(|(ty, ids)| cached(ty).filter(|_| self.gathers(ty, rows)).map(|c| c.lookup(ids, rows == Rows::Features))).collect();
        let fetch: Vec<&[u32]> = src.iter().zip(&lookups).map(|(ids, lk)| lk.as_ref().map_or(ids.as_slice(), |lk| lk.miss_ids.as_slice())).collect();
        let mut plan = Vec::new();
        for (ty, ids) in fetch.iter().enumerate() {
            if !self.gathers(ty, rows) || ids.is_empty() {
                continue;
            }
            let local_rows = g.node_types()[ty].features.is_some();
            for o in 0..parts {
                if local_rows && o as u32 == self.s.part {
                    continue;
                }
                let want: Vec<u32> = ids.iter().copied().filter(|&v| self.s.owners[ty][v as usize] as usize == o).collect();
                if !want.is_empty() {
                    plan.push((ty, o, want));
                }
            }
        }
        let asks = plan.iter().map(|(ty, o, want)| self.pull(&self.peers.stores[*ty][*o], want, if self.learnable[*ty] { after } else { None }));
        let answers = self.block_on(join_all(asks.collect::<Vec<_>>()))?;
        let mut pulled: BTreeMap<(usize, usize), Vec<f32>> = BTreeMap::new();
        let dims: Vec<usize> = (0..src.len()).map(|ty| g.node_types()[ty].features.as_ref().map_or(self.s.cfg.embed_dim, |f| f.dim())).collect();
        for ((ty, o, want), a) in plan.iter().zip(answers) {
            let bytes = a.map_err(|e| TrainError::Distributed(format!("{}: {e}", names::store(&g.node_types()[*ty].name, *o as u32))))?;
            pulled.insert((*ty, *o), decode_f32(&bytes.0, want.len() * dims[*ty]).map_err(TrainError::Distributed)?);
        }
        let mut out: PerType = Vec::with_capacity(src.len());
        for (ty, ids) in src.iter().enumerate() {
            if !self.gathers(ty, rows) || ids.is_empty() {
                out.push(None);
                continue;
            }
            let dim = dims[ty];
            let feats = g.node_types()[ty].features.as_ref();
            let mut next = vec![0usize; parts];
            let mut buf = Vec::with_capacity(fetch[ty].len() * dim);
            for &v in fetch[ty] {
                let o = self.s.owners[ty][v as usize] as usize;
                match (feats, o as u32 == self.s.part) {
                    (Some(f), true) => buf.extend_from_slice(f.row(v as usize)),
                    _ => {
                        let rows = pulled.get(&(ty, o)).ok_or_else(|| TrainError::Distributed(format!("no rows pulled for type {ty} from partition {o}")))?;
                        buf.extend_from_slice(&rows[next[o] * dim..(next[o] + 1) * dim]);
                        next[o] += 1;
                    }
                }
            }
            let x = match (cached(ty), &lookups[ty]) {
                (Some(c), Some(lk)) => c.assemble(lk, buf, self.dtype, &self.device)?,
                _ => Tensor::from_vec(buf, (ids.len(), dim), &self.device)?.to_dtype(self.dtype)?,
            };
            out.push(Some(if rows == Rows::Learnable { Var::from_tensor(&x)?.into_inner() } else { x }));
        }
        Ok(out)
    }

    /// The device cache of this trainer's feature rows (learnable rows stay
    /// with their stores: every trainer reads them, so a cached copy would
    /// need invalidating). Pre-samples its own seeds, measures the miss
    /// penalty of each feature type through the real fetch path (local
    /// reads and remote pulls), and fills its share with pulled rows.
    fn build_cache(&self) -> Result<Option<DeviceCache>> {
        let t = &self.s.cfg;
        let budget = t.cache_bytes.0;
        if t.cache_policy == CachePolicy::None || budget == 0 {
            return Ok(None);
        }
        let g = &*self.s.graph;
        let (_, splits) = g.target_labels();
        let target = g.target().index();
        let sizes: Vec<usize> = g.node_types().iter().map(|nt| nt.count as usize).collect();
        let seed = t.seed ^ hotness::PRESAMPLE_SEED;
        let visits = hotness::presample(&sizes, &splits.train, t.batch, t.seed, t.cache_presample_epochs, |e, st, batch| {
            let seeds: Vec<u32> = batch.iter().copied().filter(|&v| self.mine(target, v)).collect();
            if seeds.is_empty() {
                return Ok(Vec::new());
            }
            Ok(self.sample(seed, e, st, &seeds)?.blocks.swap_remove(0).src)
        })?;
        let batches = (t.cache_presample_epochs * splits.train.len().div_ceil(t.batch.max(1)) as u64).max(1);
        let only = |ty: usize, ids: &[u32]| -> Vec<Vec<u32>> { (0..sizes.len()).map(|k| if k == ty { ids.to_vec() } else { Vec::new() }).collect() };
        let mut candidates = Vec::new();
        for (ty, nt) in g.node_types().iter().enumerate() {
            let ranked = visits.ranked(ty);
            if nt.features.is_none() || ranked.is_empty() || !self.gathers(ty, Rows::Features) {
                continue;
            }
            let probe = profile::probe_ids(&ranked, (visits.total(ty) / batches) as usize);
            let values: Vec<f32> = self.gather(&only(ty, &probe), Rows::Features, None)?.swap_remove(ty).map_or(Ok(Vec::new()), |x| x.to_dtype(DType::F32)?.flatten_all()?.to_vec1())?;
            let miss = || self.gather(&only(ty, &probe), Rows::Features, None).map(|_| ());
            candidates.push(crate::cache::feature_candidate(ty, nt.count as usize, &probe, values, (self.dtype, &self.device), miss)?);
        }
        let chosen = crate::cache::plan(t.cache_policy, budget, &visits, &candidates);
        // Filled in pieces: one pull of a whole share could pass the wire's message limits.
        let rows = |ty: usize, ids: &[u32]| -> Result<Vec<f32>> {
            let mut out = Vec::new();
            for piece in ids.chunks(FILL_ROWS) {
                let x = self.gather(&only(ty, piece), Rows::Features, None)?.swap_remove(ty).ok_or_else(|| TrainError::Distributed("cache: no rows gathered".into()))?;
                out.extend(x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?);
            }
            Ok(out)
        };
        let planned = candidates.into_iter().zip(chosen).collect();
        let mut cache = DeviceCache::new(g, budget, &visits, planned, &[], &self.device, rows)?;
        for (ty, nt) in g.node_types().iter().enumerate() {
            if self.learnable[ty] && visits.total(ty) > 0 {
                cache.not_cached(ty, &nt.name, visits.total(ty), true, "learnable rows stay with their embedding stores in data-parallel training");
            }
        }
        Ok(Some(cache))
    }
}
