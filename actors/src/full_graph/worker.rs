//! The full-graph worker of a partition: one step per epoch over the whole
//! graph. Forward, layer by layer: its rows of the types the layer reads
//! across relations are broadcast (or the broadcast skipped, as the
//! staleness rule says), every other worker's block is taken from its
//! message or the cache, the layer runs on the worker's rows with their full
//! in-neighbourhoods, and ReLU follows; dropout is applied to a layer's
//! input rows where they are read (keyed by node, so every worker applies
//! the same mask to a row). Backward, layer by layer from the loss: the
//! gradient of every other worker's block goes back to it, its own rows'
//! gradient is the sum of its own and what the others sent, and the layer
//! below is differentiated against it. Then one all-reduce of the dense
//! gradients and one Adam step; learnable rows' gradients are pushed to
//! their stores.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use candle_core::{DType, Tensor, Var};
use futures_util::future::join_all;
use models::model::DropoutKey;
use models::ops::with_f32;
use models::optim::Adam;
use models::rgcn::PerType;
use models::Model;
use runtime::{ActorRef, ByteVec};

use super::blocks::{plans, LayerPlan, Layout};
use super::figures::FullFigures;
use super::messages::{
    self, BlockMsg, Broadcast, EvalBroadcast, GradBlock, BACKWARD_ROUND, FORWARD_ROUND,
};
use super::staleness::{relative_change, Rule};
use super::{FullGraphConfig, Staleness};
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::{self, Progress};
use crate::distributed::messages::{EpochStats, StepDone};
use crate::epoch::lap;
use crate::epoch::run::{self as epochs, Attempt, StepFigures, Steps};
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;
use crate::owner::allreduce::{self, all_reduce, Group};
use crate::owner::client::{Client, Rows};
use crate::owner::worker::WorkerSetup;
use crate::task::multi::NodeTasks;

/// Trains every epoch with the blocks of `layout`; returns the final replica.
pub fn train(s: &WorkerSetup, layout: &Layout) -> Result<Model> {
    let mut w = Worker::new(s, layout)?;
    w.train()?;
    Ok(w.state.model)
}

/// Step numbers of evaluation passes have the top bit set.
const EVAL: u64 = 1 << 63;

/// The checkpoint file of worker `part`'s cached blocks.
fn cache_file(part: u32) -> String {
    format!("staleness.{part}.safetensors")
}

/// What the steps read and never change.
struct Ctx<'a> {
    s: &'a WorkerSetup,
    /// Who holds which rows.
    layout: &'a Layout,
    /// Its stores (learnable rows) and the all-reduce's plumbing.
    c: Client,
    /// Every worker's inbox, in partition order.
    workers: Vec<ActorRef>,
    coordinator: ActorRef,
    /// Per layer, what the worker computes.
    plans: Vec<LayerPlan>,
    /// The worker's own rows per type (what its stores hold).
    own: Vec<Vec<u32>>,
    /// Its own rows' input features per type (constant), `None` for learnable types.
    features: PerType,
    /// Input width per type.
    widths: Vec<usize>,
    /// Positions among its own target rows of its training, validation and
    /// test nodes, with the training nodes' ids.
    train: (Vec<u32>, Vec<u32>),
    valid: Vec<u32>,
    test: Vec<u32>,
    /// Training nodes of the whole graph.
    total_train: usize,
    /// What the steps learn (one node task, or several).
    task: NodeTasks<'a>,
    rule: Rule,
    /// `skip_gradients`: a stale block's gradient is skipped too.
    skip_gradients: bool,
}

impl std::ops::Deref for Ctx<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.c
    }
}

/// A block as the receivers hold it: the epoch it was broadcast and its rows.
#[derive(Clone)]
struct Copy {
    epoch: u64,
    rows: Tensor,
}

/// The model replica, its optimiser and the cache: what the steps change.
struct State<'a> {
    model: Model,
    adam: Adam,
    /// Global step number (= epochs done).
    seq: u64,
    /// `[layer][type][part]`: the newest copy of that partition's block
    /// (this worker's own: the copy it last broadcast).
    cache: Vec<Vec<Vec<Option<Copy>>>>,
    /// Per type: the first layer's input rows where they are constant
    /// features, once every block of them has come (the same every epoch).
    constant: PerType,
    /// The epoch's figures so far.
    figures: FullFigures,
    s: &'a WorkerSetup,
}

struct Worker<'a> {
    ctx: Ctx<'a>,
    state: State<'a>,
}

impl<'a> Worker<'a> {
    fn new(s: &'a WorkerSetup, layout: &'a Layout) -> Result<Worker<'a>> {
        let t = &s.cfg;
        let g = &*s.graph;
        let (model, adam, seq) = crate::owner::replica(t, g, &s.from, s.start.as_deref())?;
        if !model.relu_between_layers() {
            return Err(TrainError::Config(format!("training.model = \"{}\": full-graph training needs ReLU and dropout between layers and no separate classifier (rgcn, rgat)", t.model)));
        }
        let (c, workers, coordinator) = s.peers(&model)?;
        let plans = plans(g, layout, s.part, t.layers)?;
        let own: Vec<Vec<u32>> = layout.rows[s.part as usize].clone();
        let gather = model.feature_gather();
        let features = (0..own.len())
            .map(|ty| {
                if c.learnable[ty] || own[ty].is_empty() {
                    Ok(None)
                } else {
                    Ok(gather.gather_type(g, ty, &own[ty])?)
                }
            })
            .collect::<Result<PerType>>()?;
        let widths = g
            .node_types()
            .iter()
            .map(|nt| nt.features.as_ref().map_or(t.embed_dim, |f| f.dim()))
            .collect();
        let target = g.target().index();
        let (_, splits) = g.target_labels();
        let at = |nodes: &[u32]| -> Vec<u32> {
            nodes
                .iter()
                .filter_map(|&v| {
                    layout
                        .locate(target, v)
                        .filter(|(q, _)| *q == s.part)
                        .map(|(_, i)| i)
                })
                .collect()
        };
        let mine: Vec<u32> = splits
            .train
            .iter()
            .copied()
            .filter(|&v| c.owned(target, v))
            .collect();
        let full = FullGraphConfig::of(t)?;
        let ctx = Ctx {
            s,
            layout,
            c,
            workers,
            coordinator,
            plans,
            own,
            features,
            widths,
            train: (at(&mine), mine),
            valid: at(&splits.valid),
            test: at(&splits.test),
            total_train: splits.train.len(),
            task: NodeTasks::of(t, &s.graph)?,
            rule: Rule {
                kind: full.staleness,
                epochs: full.staleness_epochs,
                variation: full.staleness_variation,
            },
            skip_gradients: full.skip_gradients,
        };
        let types = g.node_types().len();
        let mut cache = vec![vec![vec![None; s.parts as usize]; types]; t.layers];
        if let Some((dir, m)) = &s.from {
            restore_cache(
                &mut cache,
                &checkpoint::load_tensors(dir, m, &cache_file(s.part))?,
                layout,
                &ctx.widths,
                t.hidden,
                &ctx.device,
            )?;
        }
        Ok(Worker {
            ctx,
            state: State {
                model,
                adam,
                seq,
                cache,
                constant: vec![None; types],
                figures: FullFigures::default(),
                s,
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
        let all: Vec<u32> = s.graph.target_labels().1.train.clone();
        let batch = all.len().max(1);
        // One step per epoch: the batch is every training node.
        let cfg = TrainingConfig {
            batch,
            ..s.cfg.clone()
        };
        let attempt = Attempt {
            node: Some(&s.node),
            gen: s.gen,
            trainer: s.part,
            cfg: &cfg,
            items: epochs::Items::Nodes(&all),
            resumed,
        };
        epochs::run(&attempt, &self.ctx, &mut self.state)
    }
}

/// Width of layer `l`'s input rows of type `ty`.
fn width(widths: &[usize], hidden: usize, l: usize, ty: usize) -> usize {
    if l == 0 {
        widths[ty]
    } else {
        hidden
    }
}

/// Restores the cached copies a checkpoint kept (constant blocks are not kept: they are broadcast again).
fn restore_cache(
    cache: &mut [Vec<Vec<Option<Copy>>>],
    tensors: &HashMap<String, Tensor>,
    layout: &Layout,
    widths: &[usize],
    hidden: usize,
    device: &candle_core::Device,
) -> Result<()> {
    for (l, per_type) in cache.iter_mut().enumerate() {
        for (ty, per_part) in per_type.iter_mut().enumerate() {
            for (q, slot) in per_part.iter_mut().enumerate() {
                let name = format!("l{l}.t{ty}.p{q}");
                let (Some(rows), Some(epoch)) =
                    (tensors.get(&name), tensors.get(&format!("{name}.epoch")))
                else {
                    continue;
                };
                let want = (layout.count(q as u32, ty), width(widths, hidden, l, ty));
                if rows.dims2()? != want {
                    return Err(TrainError::Checkpoint(format!(
                        "cached block {name}: shape {:?}, expected {want:?}",
                        rows.dims()
                    )));
                }
                let epoch = epoch
                    .to_vec1::<i64>()?
                    .first()
                    .copied()
                    .and_then(|e| u64::try_from(e).ok())
                    .ok_or_else(|| {
                        TrainError::Checkpoint(format!("cached block {name}: a bad epoch"))
                    })?;
                *slot = Some(Copy {
                    epoch,
                    rows: rows.to_device(device)?,
                });
            }
        }
    }
    Ok(())
}

/// Gradient rows for the learnable stores, `[type][part] = (ids, rows as little-endian f32 bytes)`.
type Pushes = Vec<Vec<(Vec<u32>, Vec<u8>)>>;

/// A forward pass's tensors that backward needs.
#[derive(Default)]
struct Forward {
    /// Per layer and type (layers above the first): the leaf of the layer's
    /// input rows, the worker's own first, then the other workers' blocks in
    /// source order.
    inputs: Vec<PerType>,
    /// Per type: the leaf of the first layer's learnable rows, own and others' together.
    learn: PerType,
    /// Per layer and type, per partition: whether its block was broadcast this epoch (this worker's own included).
    fresh: Vec<Vec<Vec<bool>>>,
    /// Per layer: the worker's output rows (after ReLU below the last layer; the logits there).
    out: Vec<PerType>,
}

/// Whether a pass trains (with dropout, staleness and the cache) or evaluates.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Train,
    Eval,
}

impl Ctx<'_> {
    /// Sends `data` (per other worker, in partition order; `None`: nothing
    /// to it) as `round`'s message of step `seq` and returns what every other
    /// worker sent, in partition order: `None` from those `expect` says send
    /// nothing. A round nobody sends in costs no message and no wait.
    fn exchange(
        &self,
        pass: Pass,
        backward: bool,
        seq: u64,
        round: u32,
        data: Vec<Option<Vec<u8>>>,
        expect: &[bool],
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let (s, me) = (self.s, self.s.part);
        let others: Vec<u32> = (0..s.parts).filter(|&q| q != me).collect();
        let asks: Vec<_> = others
            .iter()
            .zip(data)
            .filter_map(|(&q, d)| d.map(|d| (q, d)))
            .map(|(q, d)| {
                let b = BlockMsg {
                    gen: s.gen,
                    seq,
                    round,
                    from: me,
                    data: ByteVec(d),
                };
                let to = &self.workers[q as usize];
                async move {
                    match (backward, pass) {
                        (true, _) => to.ask(GradBlock(b), s.timeouts.ask).await,
                        (false, Pass::Train) => to.ask(Broadcast(b), s.timeouts.ask).await,
                        (false, Pass::Eval) => to.ask(EvalBroadcast(b), s.timeouts.ask).await,
                    }
                }
            })
            .collect();
        if !asks.is_empty() {
            for r in self.block_on(join_all(asks))? {
                r?;
            }
        }
        let from: Vec<u32> = others
            .iter()
            .zip(expect)
            .filter(|(_, &e)| e)
            .map(|(&q, _)| q)
            .collect();
        let mut got = if from.is_empty() {
            Vec::new()
        } else {
            s.inbox.raw("blocks", seq, round, &from, s.timeouts.step)?
        }
        .into_iter();
        Ok(expect
            .iter()
            .map(|&e| if e { got.next() } else { None })
            .collect())
    }
}

/// `[0, width]` rows on the model's device.
fn empty(width: usize, c: &Client) -> Result<Tensor> {
    Ok(Tensor::zeros((0, width), c.dtype, &c.device)?)
}

/// Concatenates row blocks (skipping empty ones), `[0, width]` if all are.
fn cat_rows(parts: &[Tensor], width: usize, c: &Client) -> Result<Tensor> {
    let kept: Vec<&Tensor> = parts
        .iter()
        .filter(|t| t.dim(0).is_ok_and(|n| n > 0))
        .collect();
    match kept.len() {
        0 => empty(width, c),
        1 => Ok(kept[0].clone()),
        _ => Ok(Tensor::cat(&kept, 0)?),
    }
}

/// Stacks row blocks (skipping empty ones) into one `[rows, width]` tensor,
/// copying each row once; with `leaf`, a fresh variable whose gradient
/// backward reads. On the CPU the rows are copied straight into the
/// variable's storage (`cat` then `Var::from_tensor` copied them twice).
fn stack_rows(parts: &[Tensor], width: usize, leaf: bool, c: &Client) -> Result<Tensor> {
    if !leaf {
        return cat_rows(parts, width, c);
    }
    if c.device.is_cpu() && c.dtype == DType::F32 {
        let rows = parts
            .iter()
            .map(|t| t.dim(0))
            .sum::<candle_core::Result<usize>>()?;
        let mut out: Vec<f32> = Vec::with_capacity(rows * width);
        for t in parts {
            with_f32(t, |v| out.extend_from_slice(v))?;
        }
        return Ok(Var::from_vec(out, (rows, width), &c.device)?.into_inner());
    }
    Ok(Var::from_tensor(&cat_rows(parts, width, c)?.detach())?.into_inner())
}

impl State<'_> {
    /// The forward pass of epoch `epoch` (a training step when `pass` is
    /// `Train`); `counts` gets the blocks broadcast and skipped.
    fn forward(
        &mut self,
        ctx: &Ctx,
        epoch: u64,
        pass: Pass,
        st: &mut EpochStats,
    ) -> Result<Forward> {
        let s = ctx.s;
        let g = &*s.graph;
        let (me, types, layers) = (s.part, g.node_types().len(), ctx.plans.len());
        let order = ctx.layout.order(me);
        let train = pass == Pass::Train;
        let seq = if train { self.seq } else { EVAL | self.seq };
        let key = train.then_some(DropoutKey { epoch, step: 0 });
        let mut clock = Instant::now();
        let mut f = Forward::default();
        // The worker's own learnable rows, after the last update.
        let learnable = ctx.gather(&ctx.own, Rows::Learnable, self.seq.checked_sub(1))?;
        st.time.gather_s += lap(&mut clock);
        for (l, plan) in ctx.plans.iter().enumerate() {
            let mut h_src: PerType = vec![None; types];
            let mut leaves: PerType = vec![None; types];
            let mut fresh = vec![vec![false; s.parts as usize]; types];
            for ty in (0..types).filter(|&ty| plan.read[ty]) {
                let w = width(&ctx.widths, s.cfg.hidden, l, ty);
                let mine = match l {
                    0 => ctx.features[ty].clone().or_else(|| learnable[ty].clone()),
                    _ => f.out[l - 1][ty].clone(),
                };
                let mine = match mine {
                    Some(x) => x,
                    None => empty(w, &ctx.c)?,
                };
                let constant = l == 0 && ctx.features[ty].is_some();
                // Once every block has come, constant inputs need no round and no copy:
                // no worker sends a constant block twice.
                if let Some(x) = self.constant[ty].as_ref().filter(|_| constant) {
                    h_src[ty] = Some(x.clone());
                    continue;
                }
                let mut remote = Vec::new();
                if plan.shared[ty] && s.parts > 1 {
                    // Whether worker q sends its block, its receivers holding `slot` of it
                    // (`variation` measures the block against it: only q itself can).
                    let sends = |q: u32, slot: &Option<Copy>, variation: &dyn Fn(&Copy) -> f64| {
                        match pass {
                            _ if constant => slot.is_none(),
                            Pass::Eval => true,
                            Pass::Train => {
                                ctx.rule
                                    .broadcast(epoch, q, slot.as_ref().map(|c| c.epoch), || {
                                        slot.as_ref().map_or(f64::INFINITY, variation)
                                    })
                            }
                        }
                    };
                    // Send this worker's block (or the notice that it is skipped) ...
                    let send = sends(me, &self.cache[l][ty][me as usize], &|c| {
                        with_f32(&mine, |a| with_f32(&c.rows, |b| relative_change(a, b)))
                            .and_then(|x| x)
                            .unwrap_or(f64::INFINITY)
                    });
                    // Constant features travel as their non-zeros where that is shorter (bag-of-words);
                    // hidden blocks stay dense, so their bytes do not depend on their values.
                    let payload = match send {
                        true => with_f32(&mine, |v| messages::encode(Some(v), w, constant))?,
                        false => messages::encode(None, w, constant),
                    };
                    let bytes = messages::body_bytes(&payload) * u64::from(s.parts - 1);
                    let counts = self
                        .figures
                        .blocks
                        .entry(format!("l{l}.{}", g.node_types()[ty].name))
                        .or_default();
                    // A constant block is sent once and never stale: only the one broadcast counts.
                    if train && (send || !constant) {
                        if send {
                            counts.sent += 1;
                            self.figures.forward_bytes += bytes;
                        } else {
                            counts.skipped += 1;
                        }
                    } else {
                        self.figures.eval_bytes += bytes;
                    }
                    // Whether worker q sends its block: the epoch rules and a constant
                    // block's one broadcast are functions of what every worker knows
                    // (the epoch and the version cached of it), so a skipped block costs
                    // no message; the variation rule's skip is a notice.
                    let variation = train && !constant && ctx.rule.kind == Staleness::Variation;
                    let expect: Vec<bool> = order[1..]
                        .iter()
                        .map(|&q| {
                            variation
                                || sends(q, &self.cache[l][ty][q as usize], &|_| f64::INFINITY)
                        })
                        .collect();
                    let out = (send || variation).then_some(payload);
                    let got = ctx.exchange(
                        pass,
                        false,
                        seq,
                        messages::round(FORWARD_ROUND, l, ty),
                        vec![out; s.parts as usize - 1],
                        &expect,
                    )?;
                    st.time.comm_s += lap(&mut clock);
                    fresh[ty][me as usize] = send;
                    if send && (train || constant) {
                        self.cache[l][ty][me as usize] = Some(Copy {
                            epoch,
                            rows: mine.detach(),
                        });
                    }
                    // ... and take every other worker's, fresh or cached.
                    for (&q, data) in order[1..].iter().zip(&got) {
                        let n = ctx.layout.count(q, ty);
                        let rows = match data {
                            Some(data) => messages::decode(data, n, w).map_err(|e| {
                                e.context(format!("worker {q}'s block of layer {l}, type {ty}"))
                            })?,
                            None => None,
                        };
                        let block = match rows {
                            Some(v) => {
                                fresh[ty][q as usize] = true;
                                let x = Tensor::from_vec(v, (n, w), &ctx.device)?.to_dtype(ctx.dtype)?;
                                if train || constant {
                                    self.cache[l][ty][q as usize] = Some(Copy { epoch, rows: x.clone() });
                                }
                                x
                            }
                            None => self.cache[l][ty][q as usize]
                                .as_ref()
                                .map(|c| c.rows.clone())
                                .ok_or_else(|| TrainError::Protocol(format!("worker {q} skipped its block of layer {l}, type {ty}, which this worker has no copy of")))?,
                        };
                        remote.push(block);
                    }
                }
                // The layer's input rows, own first, copied once; a leaf where backward needs their gradient.
                remote.insert(0, mine);
                let leaf = train && (l > 0 || ctx.learnable[ty]);
                let x = stack_rows(&remote, w, leaf, &ctx.c)?;
                if leaf && l == 0 {
                    f.learn.resize(types, None);
                    f.learn[ty] = Some(x.clone());
                } else if leaf {
                    leaves[ty] = Some(x.clone());
                }
                if constant {
                    // The cached blocks become views of the kept input, so its rows are held once.
                    let mut at = 0;
                    for &q in &order {
                        let n = ctx.layout.count(q, ty);
                        if let Some(c) = self.cache[l][ty][q as usize].as_mut().filter(|_| n > 0) {
                            c.rows = x.narrow(0, at, n)?;
                        }
                        at += n;
                    }
                    self.constant[ty] = Some(x.clone());
                }
                // Dropout of the rows a layer reads, where it reads them.
                h_src[ty] = Some(if l > 0 {
                    self.model
                        .dropout_rows(x, key, l - 1, ty, &plan.block.src[ty])?
                } else {
                    x
                });
            }
            let mut out = self.model.layer_forward(g, l, &plan.block, &h_src)?;
            if l + 1 < layers {
                for o in out.iter_mut() {
                    if let Some(x) = o.take() {
                        *o = Some(x.relu()?);
                    }
                }
            }
            st.time.compute_s += lap(&mut clock);
            f.inputs.push(leaves);
            f.fresh.push(fresh);
            f.out.push(out);
        }
        Ok(f)
    }

    /// Backward from the worker's loss share; returns the flattened dense
    /// gradients (with the loss and correct count) and the learnable rows' pushes.
    fn backward(
        &mut self,
        ctx: &Ctx,
        f: Forward,
        st: &mut EpochStats,
    ) -> Result<(Vec<f32>, Pushes)> {
        let s = ctx.s;
        let g = &*s.graph;
        let (me, types, layers) = (s.part, g.node_types().len(), ctx.plans.len());
        let target = g.target().index();
        let order = ctx.layout.order(me);
        let mut clock = Instant::now();
        let (pos, seeds) = &ctx.train;
        let task = &ctx.task;
        let logits = f.out[layers - 1][target].clone();
        // Several tasks: each one's loss, this worker's part (zeros without training nodes).
        let mut each = vec![0.0; task.parts().len() * usize::from(task.is_multi())];
        let (mut upstream, loss, correct) = match logits {
            Some(logits) if !pos.is_empty() => {
                let idx = Tensor::from_slice(pos, pos.len(), &ctx.device)?;
                let picked = logits.index_select(&idx, 0)?;
                let losses = task.loss_of_share(&picked, seeds, &g.target_labels().1.train)?;
                let share = task.share_weight(pos.len(), ctx.total_train);
                let loss = (losses.total * share)?;
                for (e, l) in each.iter_mut().zip(&losses.each) {
                    *e = l.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                }
                let correct = task.correct(&picked, seeds)? as f64;
                let value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                (Some(loss.backward()?), value, correct)
            }
            _ => (None, 0.0, 0.0),
        };
        let mut grads: HashMap<String, Tensor> = HashMap::new();
        let mut pushes = Vec::new();
        for l in (0..layers).rev() {
            let plan = &ctx.plans[l];
            if let Some(gs) = &upstream {
                for (name, var) in self.model.params.iter() {
                    if let Some(gr) = gs.get(var.as_tensor()) {
                        grads.insert(name.to_string(), gr.clone());
                    }
                }
            }
            let grad_of = |x: &Option<Tensor>| -> Option<Tensor> {
                x.as_ref()
                    .and_then(|x| upstream.as_ref().and_then(|gs| gs.get(x).cloned()))
            };
            st.time.compute_s += lap(&mut clock);
            if l == 0 {
                let mut learn: Vec<Option<Tensor>> = (0..types)
                    .map(|ty| grad_of(f.learn.get(ty).unwrap_or(&None)))
                    .collect();
                // Learnable rows are the first layer's blocks: their gradient rows go
                // back to the owners' stores, those of stale blocks only unless skipped too.
                let mut src = std::borrow::Cow::Borrowed(&plan.block.src);
                for ty in
                    (0..types).filter(|&ty| plan.shared[ty] && ctx.learnable[ty] && s.parts > 1)
                {
                    let stale: Vec<bool> = order[1..]
                        .iter()
                        .map(|&q| !f.fresh[0][ty][q as usize])
                        .collect();
                    let skipped = if ctx.skip_gradients {
                        stale.iter().filter(|&&x| x).count() as u64
                    } else {
                        0
                    };
                    let counts = self
                        .figures
                        .blocks
                        .entry(format!("l0.{}", g.node_types()[ty].name))
                        .or_default();
                    counts.grad_sent += stale.len() as u64 - skipped;
                    counts.grad_skipped += skipped;
                    if skipped == 0 {
                        continue;
                    }
                    let Some(gr) = learn[ty].take() else { continue };
                    // Only the own rows and those of fresh blocks: cut the stale blocks' rows out.
                    let (mut rows, mut ids, mut at) = (Vec::new(), Vec::new(), 0usize);
                    for (i, &q) in order.iter().enumerate() {
                        let n = ctx.layout.count(q, ty);
                        if i == 0 || !stale[i - 1] {
                            rows.push(gr.narrow(0, at, n)?);
                            ids.extend_from_slice(&src[ty][at..at + n]);
                        }
                        at += n;
                    }
                    learn[ty] = Some(cat_rows(&rows, gr.dim(1)?, &ctx.c)?);
                    src.to_mut()[ty] = ids;
                }
                ctx.gradient_rows(&src, &learn, &mut pushes)?;
                break;
            }
            // The gradient of each layer-l input row of this worker's, then the layer below against it.
            let mut surrogate: Option<Tensor> = None;
            for ty in (0..types).filter(|&ty| plan.read[ty]) {
                let w = s.cfg.hidden;
                // The input leaf's gradient: the worker's own rows, then the others' blocks.
                let n_me = ctx.layout.count(me, ty);
                let grad = grad_of(&f.inputs[l][ty]);
                let part = |at: usize, n: usize| {
                    grad.as_ref()
                        .filter(|_| n > 0)
                        .map(|g| g.narrow(0, at, n))
                        .transpose()
                };
                let mut mine = part(0, n_me)?;
                if plan.shared[ty] && s.parts > 1 {
                    let n_away = grad
                        .as_ref()
                        .map_or(Ok(0), |g| g.dim(0))?
                        .saturating_sub(n_me);
                    let away = part(n_me, n_away)?;
                    let mut data = Vec::with_capacity(order.len() - 1);
                    let mut at = 0usize;
                    let counts = self
                        .figures
                        .blocks
                        .entry(format!("l{l}.{}", g.node_types()[ty].name))
                        .or_default();
                    for &q in &order[1..] {
                        let n = ctx.layout.count(q, ty);
                        let skip = ctx.skip_gradients && !f.fresh[l][ty][q as usize];
                        if skip {
                            // q knows its block was not fresh here (it did not send it): nothing to tell it.
                            counts.grad_skipped += 1;
                            data.push(None);
                        } else {
                            let payload = match &away {
                                Some(x) => with_f32(&x.narrow(0, at, n)?, |v| {
                                    messages::encode(Some(v), w, false)
                                })?,
                                None => messages::encode(None, w, false),
                            };
                            counts.grad_sent += 1;
                            self.figures.backward_bytes += messages::body_bytes(&payload);
                            data.push(Some(payload));
                        }
                        at += n;
                    }
                    // Every other worker sends the gradient of this worker's block unless
                    // gradients of stale blocks are skipped and it was stale there
                    // (not sent this epoch, so stale at every receiver).
                    let sent_mine = f.fresh[l][ty][me as usize];
                    let expect = vec![!ctx.skip_gradients || sent_mine; order.len() - 1];
                    st.time.compute_s += lap(&mut clock);
                    let got = ctx.exchange(
                        Pass::Train,
                        true,
                        self.seq,
                        messages::round(BACKWARD_ROUND, l, ty),
                        data,
                        &expect,
                    )?;
                    st.time.comm_s += lap(&mut clock);
                    let n = ctx.layout.count(me, ty);
                    for (&q, data) in order[1..].iter().zip(&got) {
                        let Some(data) = data else { continue };
                        let rows = messages::decode(data, n, w).map_err(|e| {
                            e.context(format!("worker {q}'s gradient of layer {l}, type {ty}"))
                        })?;
                        if let Some(v) = rows {
                            let x =
                                Tensor::from_vec(v, (n, w), &ctx.device)?.to_dtype(ctx.dtype)?;
                            mine = Some(match mine {
                                Some(m) => (m + x)?,
                                None => x,
                            });
                        }
                    }
                }
                if let (Some(gr), Some(out)) = (mine, &f.out[l - 1][ty]) {
                    let term = (out * gr.detach())?.sum_all()?;
                    surrogate = Some(match surrogate {
                        Some(acc) => (acc + term)?,
                        None => term,
                    });
                }
            }
            upstream = surrogate.map(|x| x.backward()).transpose()?;
        }
        st.time.compute_s += lap(&mut clock);
        Ok((
            allreduce::flatten_named(
                &self.model.params,
                |name, _| grads.get(name).cloned(),
                allreduce::Tally {
                    loss,
                    correct,
                    seen: 0.0,
                    each,
                },
            )?,
            pushes,
        ))
    }

    /// The checkpoint tensors of the cache: every copy but the constant blocks.
    fn cache_tensors(&self, ctx: &Ctx) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for (l, per_type) in self.cache.iter().enumerate() {
            for (ty, per_part) in per_type.iter().enumerate() {
                if l == 0 && !ctx.learnable[ty] {
                    continue;
                }
                for (q, c) in per_part.iter().enumerate() {
                    if let Some(c) = c {
                        let name = format!("l{l}.t{ty}.p{q}");
                        out.insert(
                            format!("{name}.epoch"),
                            Tensor::new(&[c.epoch as i64], &candle_core::Device::Cpu)?,
                        );
                        out.insert(
                            name,
                            c.rows
                                .to_dtype(DType::F32)?
                                .to_device(&candle_core::Device::Cpu)?,
                        );
                    }
                }
            }
        }
        Ok(out)
    }

    /// Bytes the cache holds (the worker's own last-broadcast copies included).
    fn cache_bytes(&self) -> u64 {
        self.cache
            .iter()
            .flatten()
            .flatten()
            .flatten()
            .map(|c| (c.rows.elem_count() * c.rows.dtype().size_in_bytes()) as u64)
            .sum()
    }
}

impl<'a> Steps for State<'a> {
    type Feed = Ctx<'a>;
    type Batch = ();
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

    fn prepare(_: &Ctx<'a>, _: &mut (), _: u64, _: u64, _: &[u32]) -> Result<()> {
        Ok(())
    }

    /// Worker 0 writes the dense state; every worker its cache and its stores' rows.
    fn checkpoint(&mut self, ctx: &Ctx<'a>, progress: Progress) -> Result<()> {
        let Some(root) = self.s.cfg.checkpoint_dir.as_ref() else {
            return Ok(());
        };
        let cache = checkpoint::write_tensors(
            &checkpoint::partial_dir(root, self.seq),
            &cache_file(self.s.part),
            &self.cache_tensors(ctx)?,
        )?;
        let dense = (self.s.part == 0).then_some((&self.model, &self.adam));
        ctx.checkpoint_part_with(
            &ctx.coordinator,
            root,
            self.seq,
            dense,
            progress,
            vec![cache],
        )
    }

    fn step(
        &mut self,
        ctx: &Ctx<'a>,
        epoch: u64,
        _step: u64,
        seeds: &[u32],
        _: (),
        st: &mut EpochStats,
    ) -> Result<StepFigures> {
        let s = ctx.s;
        let f = self.forward(ctx, epoch, Pass::Train, st)?;
        let (mine, pushes) = self.backward(ctx, f, st)?;
        let mut clock = Instant::now();
        let pushes = ctx.pushes(self.seq, s.part, pushes);
        let group = Group {
            trainers: &ctx.workers,
            me: s.part,
            seq: self.seq,
            kind: s.cfg.allreduce,
        };
        let sum = all_reduce(ctx, &group, mine, pushes)?;
        st.time.comm_s += lap(&mut clock);
        let allreduce::Tally {
            loss,
            correct,
            each,
            ..
        } = allreduce::apply(&self.model.params, &mut self.adam, &sum)?;
        st.time.update_s += lap(&mut clock);
        self.seq += 1;
        s.inbox.forget_before(self.seq);
        if s.part == 0 {
            let c = ctx.coordinator.clone();
            ctx.block_on(c.ask(
                StepDone {
                    gen: s.gen,
                    epoch,
                    seq: self.seq - 1,
                    loss,
                },
                s.timeouts.ask,
            ))??;
        }
        Ok(StepFigures {
            loss,
            correct,
            seen: seeds.len() as u64,
            tasks: each,
        })
    }

    /// Every row computed again without dropout from fresh blocks; each
    /// worker counts the validation and test nodes it owns.
    fn evaluate(&mut self, ctx: &Ctx<'a>, epoch: u64, st: &mut EpochStats) -> Result<()> {
        let mut scratch = EpochStats::default();
        let f = self.forward(ctx, epoch, Pass::Eval, &mut scratch)?;
        let g = &*ctx.s.graph;
        let target = g.target().index();
        let own = &ctx.own[target];
        let task = &ctx.task;
        let logits = &f.out[ctx.plans.len() - 1][target];
        // Each task's figures on the nodes at positions `at` of the worker's own rows.
        let scores = |at: &[u32]| -> Result<Vec<crate::task::node::Scores>> {
            let mut s = task.empty_scores();
            if let (Some(logits), false) = (logits, at.is_empty()) {
                let idx = Tensor::from_slice(at, at.len(), logits.device())?;
                let seeds: Vec<u32> = at.iter().map(|&i| own[i as usize]).collect();
                task.score(&logits.index_select(&idx, 0)?, &seeds, &mut s)?;
            }
            Ok(s)
        };
        task.record(st, scores(&ctx.valid)?, scores(&ctx.test)?);
        // Evaluation's messages are taken; what is left of them is duplicates.
        ctx.s.inbox.forget_before(EVAL | self.seq.saturating_add(1));
        Ok(())
    }

    fn cache_figures(&self) -> BTreeMap<String, crate::cache::CacheTypeReport> {
        BTreeMap::new()
    }

    /// The epoch's figures (its evaluation's broadcast included) go with the stats.
    fn send_stats(&mut self, ctx: &Ctx<'a>, mut st: EpochStats) -> Result<()> {
        self.figures.cache_bytes = self.cache_bytes();
        st.set_figures(&std::mem::take(&mut self.figures))?;
        let c = ctx.coordinator.clone();
        ctx.block_on(c.ask(st, self.s.timeouts.ask))??;
        Ok(())
    }
}
