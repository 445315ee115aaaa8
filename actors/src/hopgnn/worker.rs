//! The HopGNN worker of a partition. Ahead of each step (on the prefetch
//! thread) it plans the step's time steps ([`Plan`]), samples the
//! micrographs of the roots it trains at each (remote frontier nodes by their
//! owners) and, with pre-gathering, pulls the distinct remote rows of all of
//! them at once, one pull per owner and node type (HopGNN §5.2). In the step
//! it hosts one model per time step: it takes the model's accumulated
//! gradient (and parameters) from the worker it leaves, trains the
//! micrographs, and hands the model on; after the last time step the models'
//! gradients are all-reduced and every worker applies the same update.
//!
//! Learnable rows do not migrate: they stay with their owners' stores, are
//! pulled once per step after the previous step's sparse update, and their
//! gradient rows (summed over the time steps) are pushed once per step.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use candle_core::{DType, Tensor};
use graphs::MiniBatch;
use models::model::DropoutKey;
use models::optim::Adam;
use models::rgcn::PerType;
use models::Model;
use runtime::{ActorRef, ByteVec};

use super::examine::Examination;
use super::figures::HopFigures;
use super::messages::{Migrate, MIGRATE_ROUND};
use super::schedule::Plan;
use super::{HopConfig, HopMigrate, HopTimeSteps};
use crate::distributed::checkpoint::{self, Progress};
use crate::distributed::messages::{EpochStats, StepDone};
use crate::epoch::run::{self as epochs, Attempt, StepFigures, Steps};
use crate::epoch::{lap, SamplingPlan};
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;
use crate::owner::allreduce::{self, all_reduce, Group};
use crate::owner::client::{Client, Rows};
use crate::owner::worker::WorkerSetup;
use crate::task::multi::NodeTasks;

/// The checkpoint file of the examination period's state.
const EXAMINATION: &str = "hop-examination.safetensors";

/// Trains every epoch; returns the final replica.
pub fn train(s: &WorkerSetup) -> Result<Model> {
    let mut w = Worker::new(s)?;
    w.train()?;
    Ok(w.rep.model)
}

/// What sampling and gathering need: shared by the worker and its prefetch thread.
struct Ctx<'a> {
    s: &'a WorkerSetup,
    /// `[training.hopgnn]`
    hop: HopConfig,
    /// Every partition's sampler and stores.
    c: Client,
    /// Every worker's inbox, in partition order.
    workers: Vec<ActorRef>,
    coordinator: ActorRef,
    /// Time steps of the current epoch under `hop_time_steps = "auto"`
    /// (set by the training thread between epochs, read by the prefetch thread).
    auto_steps: AtomicU32,
}

impl std::ops::Deref for Ctx<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.c
    }
}

/// A step planned, its micrographs sampled and their features gathered.
struct Prepared {
    plan: Plan,
    /// Per time step, the micrograph of the roots this worker trains then.
    micro: Vec<Option<MiniBatch>>,
    /// Their feature rows.
    rows: Gathered,
    figures: HopFigures,
    sample_s: f64,
    gather_s: f64,
}

/// A step's feature rows, gathered ahead of it.
enum Gathered {
    /// Pre-gathering: the distinct input rows of every time step per type,
    /// their features, and per time step and type where its rows sit among them.
    Once {
        union: Vec<Vec<u32>>,
        features: PerType,
        index: Vec<Vec<Option<Tensor>>>,
    },
    /// Each time step's own features.
    PerStep(Vec<PerType>),
}

struct Worker<'a> {
    ctx: Ctx<'a>,
    rep: Replica<'a>,
}

/// The model replica and its optimiser: what the steps change.
struct Replica<'a> {
    model: Model,
    adam: Adam,
    /// Global step number.
    seq: u64,
    /// The epoch's figures so far.
    hop: HopFigures,
    /// `hop_time_steps = "auto"`: the examination period.
    exam: Option<Examination>,
    /// When this worker's previous all-reduce (or the epoch) began.
    since: Instant,
    /// What the steps learn (one node task, or several).
    task: NodeTasks<'a>,
    s: &'a WorkerSetup,
}

impl<'a> Worker<'a> {
    fn new(s: &'a WorkerSetup) -> Result<Worker<'a>> {
        let t = &s.cfg;
        let (model, adam, seq) = crate::owner::replica(t, &s.graph, &s.from, s.start.as_deref())?;
        let (c, workers, coordinator) = s.peers(&model)?;
        let hop = HopConfig::of(t)?;
        let exam = match (hop.time_steps, &s.from) {
            (HopTimeSteps::Auto, Some((dir, m))) => Some(Examination::from_tensors(
                &checkpoint::load_tensors(dir, m, EXAMINATION)?,
                s.parts,
            )?),
            (HopTimeSteps::Auto, None) => Some(Examination::new(s.parts)),
            _ => None,
        };
        let auto_steps = AtomicU32::new(exam.as_ref().map_or(s.parts, |e| e.steps));
        Ok(Worker {
            ctx: Ctx {
                s,
                hop,
                c,
                workers,
                coordinator,
                auto_steps,
            },
            rep: Replica {
                model,
                adam,
                seq,
                hop: HopFigures::default(),
                exam,
                since: Instant::now(),
                task: NodeTasks::of(t, &s.graph)?,
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
        let items = epochs::Items::Nodes(&s.graph.target_labels().1.train);
        let attempt = Attempt {
            node: Some(&s.node),
            gen: s.gen,
            trainer: s.part,
            cfg: &s.cfg,
            items,
            resumed,
        };
        epochs::run(&attempt, &self.ctx, &mut self.rep)
    }
}

impl Ctx<'_> {
    /// Time steps per step.
    fn time_steps(&self) -> u32 {
        match self.hop.time_steps {
            HopTimeSteps::All => self.s.parts,
            HopTimeSteps::Auto => self.auto_steps.load(Ordering::Acquire),
            HopTimeSteps::Fixed(n) => n.min(self.s.parts),
        }
    }

    /// Plans step `step` of `batch`, samples this worker's micrographs and
    /// gathers their features.
    fn prepare(&self, epoch: u64, step: u64, batch: &[u32]) -> Result<Prepared> {
        let s = self.s;
        let g = &*s.graph;
        let target = g.target().index();
        let owners = &s.owners;
        let plan = Plan::new(batch, s.parts, self.time_steps(), |v| {
            u32::from(owners[target][v as usize])
        });
        let clock = Instant::now();
        let mut micro = Vec::with_capacity(plan.steps());
        for i in 0..plan.steps() {
            let roots = plan.roots_at(s.part, i);
            micro.push(if roots.is_empty() {
                None
            } else {
                Some(self.sample(s.cfg.seed, epoch, step, roots)?)
            });
        }
        let sample_s = clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let types = g.node_types();
        let gathered = |ty: usize| self.gathers(ty, Rows::All);
        let remote =
            |ty: usize, ids: &[u32]| ids.iter().filter(|&&v| !self.owned(ty, v)).count() as u64;
        let mut figures = HopFigures {
            time_steps: plan.steps() as u32,
            rows: types.iter().map(|nt| (nt.name.clone(), 0, 0)).collect(),
            ..HopFigures::default()
        };
        for mb in micro.iter().flatten() {
            for (ty, ids) in mb.blocks[0].src.iter().enumerate() {
                if gathered(ty) {
                    let away = remote(ty, ids);
                    figures.rows[ty].1 += ids.len() as u64;
                    figures.rows[ty].2 += ids.len() as u64 - away;
                    figures.rows_pulled_per_time_step += away;
                }
            }
        }
        // One micrograph here this step: its rows are already distinct, so
        // pulling them in its own order is the same single pull per owner and
        // type, without selecting each time step's rows out of a union.
        let rows = if self.hop.pregather && micro.iter().flatten().count() > 1 {
            let mut union = vec![Vec::new(); types.len()];
            for mb in micro.iter().flatten() {
                for (ty, ids) in mb.blocks[0].src.iter().enumerate() {
                    union[ty].extend_from_slice(ids);
                }
            }
            for (ty, ids) in union.iter_mut().enumerate() {
                ids.sort_unstable();
                ids.dedup();
                if gathered(ty) {
                    figures.rows_pulled += remote(ty, ids);
                }
            }
            let features = self.gather(&union, Rows::Features, None)?;
            let mut index = Vec::with_capacity(micro.len());
            for mb in &micro {
                let at = match mb {
                    Some(mb) => mb.blocks[0]
                        .src
                        .iter()
                        .zip(&union)
                        .map(|(ids, all)| {
                            let pos: Vec<u32> = ids
                                .iter()
                                .map(|v| {
                                    all.binary_search(v).map(|p| p as u32).map_err(|_| {
                                        TrainError::Internal(
                                            "a micrograph row missing from the pre-gathered rows"
                                                .into(),
                                        )
                                    })
                                })
                                .collect::<Result<_>>()?;
                            Ok((!pos.is_empty())
                                .then(|| Tensor::from_vec(pos.clone(), pos.len(), &self.device))
                                .transpose()?)
                        })
                        .collect::<Result<Vec<_>>>()?,
                    None => Vec::new(),
                };
                index.push(at);
            }
            Gathered::Once {
                union,
                features,
                index,
            }
        } else {
            figures.rows_pulled = figures.rows_pulled_per_time_step;
            let per_step = micro
                .iter()
                .map(|mb| {
                    mb.as_ref().map_or(Ok(Vec::new()), |mb| {
                        self.gather(&mb.blocks[0].src, Rows::Features, None)
                    })
                })
                .collect::<Result<_>>()?;
            Gathered::PerStep(per_step)
        };
        Ok(Prepared {
            plan,
            micro,
            rows,
            figures,
            sample_s,
            gather_s: clock.elapsed().as_secs_f64(),
        })
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

    fn epoch_start(&mut self, _epoch: u64, _steps: u64) {
        self.since = Instant::now();
    }

    fn feed_state(_: &Ctx<'a>) -> Result<()> {
        Ok(())
    }

    fn prepare(
        ctx: &Ctx<'a>,
        _: &mut (),
        epoch: u64,
        step: u64,
        seeds: &[u32],
    ) -> Result<Prepared> {
        ctx.prepare(epoch, step, seeds)
    }

    /// Worker 0 writes the dense state (and the examination's, the same on
    /// every worker); every partition its stores' rows.
    fn checkpoint(&mut self, ctx: &Ctx<'a>, progress: Progress) -> Result<()> {
        let Some(root) = self.s.cfg.checkpoint_dir.as_ref() else {
            return Ok(());
        };
        let lead = self.s.part == 0;
        let dense = lead.then_some((&self.model, &self.adam));
        let files = match self.exam.as_ref().filter(|_| lead) {
            Some(e) => vec![checkpoint::write_tensors(
                &checkpoint::partial_dir(root, self.seq),
                EXAMINATION,
                &e.to_tensors()?,
            )?],
            None => Vec::new(),
        };
        ctx.checkpoint_part_with(&ctx.coordinator, root, self.seq, dense, progress, files)
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
        let f = &p.figures;
        self.hop.time_steps = f.time_steps;
        self.hop.rows_pulled += f.rows_pulled;
        self.hop.rows_pulled_per_time_step += f.rows_pulled_per_time_step;
        if self.hop.rows.is_empty() {
            self.hop.rows = f.rows.iter().map(|(n, _, _)| (n.clone(), 0, 0)).collect();
        }
        for (acc, r) in self.hop.rows.iter_mut().zip(&f.rows) {
            acc.1 += r.1;
            acc.2 += r.2;
        }
        let tally = self.train_step(ctx, epoch, step, seeds, p, st)?;
        let loss = tally.loss;
        if self.s.part == 0 {
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
        Ok(StepFigures {
            loss,
            correct: tally.correct,
            seen: seeds.len() as u64,
            tasks: tally.each,
        })
    }

    /// Each worker counts the validation and test nodes its partition owns.
    fn evaluate(&mut self, ctx: &Ctx<'a>, epoch: u64, st: &mut EpochStats) -> Result<()> {
        let (_, splits) = self.s.graph.target_labels();
        let target = self.s.graph.target().index();
        let (seed, after) = (
            SamplingPlan::of(&self.s.cfg).eval_seed(),
            self.seq.checked_sub(1),
        );
        let mine = |c: &[u32]| {
            c.iter()
                .copied()
                .filter(|&v| ctx.owned(target, v))
                .collect()
        };
        let task = &self.task;
        let valid = ctx.score(&self.model, task, seed, epoch, &splits.valid, after, mine)?;
        let test = ctx.score(&self.model, task, seed, epoch, &splits.test, after, mine)?;
        task.record(st, valid, test);
        Ok(())
    }

    fn cache_figures(&self) -> BTreeMap<String, crate::cache::CacheTypeReport> {
        BTreeMap::new()
    }

    /// The epoch's HopGNN figures go with the stats, and the examination
    /// period (`hop_time_steps = "auto"`) learns the epoch ended.
    fn send_stats(&mut self, ctx: &Ctx<'a>, mut st: EpochStats) -> Result<()> {
        if let Some(e) = &mut self.exam {
            self.hop.examined_s = e.epoch_end(st.epoch).map(|t| t / f64::from(self.s.parts));
            // The next epoch's prefetch starts after this returns.
            ctx.auto_steps.store(e.steps, Ordering::Release);
        }
        st.set_figures(&std::mem::take(&mut self.hop))?;
        let c = ctx.coordinator.clone();
        ctx.block_on(c.ask(st, self.s.timeouts.ask))??;
        Ok(())
    }

    fn remote_rows(ctx: &Ctx<'a>) -> u64 {
        ctx.remote_rows.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Replica<'_> {
    /// The model's flat parameter values, in parameter order.
    fn flat_params(&self) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for (_, var) in self.model.params.iter() {
            out.extend(
                var.as_tensor()
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            );
        }
        Ok(out)
    }

    /// The model arriving for time step `i` (`want` values: its gradient so
    /// far, and its parameters if they travel).
    fn receive(&self, ctx: &Ctx, plan: &Plan, i: usize, want: usize) -> Result<Vec<f32>> {
        let from = plan.came_from(ctx.s.part, i);
        Ok(ctx
            .s
            .inbox
            .gradients(
                self.seq,
                MIGRATE_ROUND + i as u32 - 1,
                &[from],
                want,
                ctx.s.timeouts.step,
            )?
            .swap_remove(0))
    }

    /// Takes the parameters a migrating model brought.
    fn set_params(&self, ctx: &Ctx, values: &[f32]) -> Result<()> {
        let mut at = 0;
        for (_, var) in self.model.params.iter() {
            let n = var.elem_count();
            let v = values.get(at..at + n).ok_or_else(|| {
                TrainError::Protocol("a migrating model brought too few parameters".into())
            })?;
            var.set(&Tensor::from_slice(v, var.shape(), &ctx.device)?.to_dtype(var.dtype())?)?;
            at += n;
        }
        Ok(())
    }

    /// One step: the time steps, the all-reduce and the update; returns the
    /// global loss, correct predictions and (several tasks) each task's loss.
    fn train_step(
        &mut self,
        ctx: &Ctx,
        epoch: u64,
        step: u64,
        batch: &[u32],
        p: Prepared,
        st: &mut EpochStats,
    ) -> Result<allreduce::Tally> {
        let s = ctx.s;
        let g = s.graph.clone();
        let me = s.part;
        let plan = &p.plan;
        let mut clock = Instant::now();
        let values: usize = self.model.params.iter().map(|(_, v)| v.elem_count()).sum();
        // Several tasks: each one's loss rides before the counts.
        let tasks = self.task.parts().len() * usize::from(self.task.is_multi());
        let len = values + allreduce::extra(&self.model.params) + tasks;
        let carry = ctx.hop.migrate == HopMigrate::Model;
        let after = self.seq.checked_sub(1);
        // Pre-gathering: the step's learnable rows, pulled once, as gradient leaves.
        let learn = match &p.rows {
            Gathered::Once { union, .. } => ctx.gather(union, Rows::Learnable, after)?,
            Gathered::PerStep(_) => Vec::new(),
        };
        st.time.gather_s += lap(&mut clock);
        let mut leaf_grads: Vec<Option<Tensor>> = vec![None; learn.len()];
        let mut pushes: Vec<Vec<(Vec<u32>, Vec<u8>)>> = Vec::new();
        let mut acc = Vec::new();
        let dropout = Some(DropoutKey { epoch, step });
        for i in 0..plan.steps() {
            // The model's parameters must be here before it trains; its
            // gradient so far only before it leaves: with the gradient alone
            // migrating, this time step trains while the model travels.
            let mut got = None;
            if i > 0 && carry {
                let v = self.receive(ctx, plan, i, len + values)?;
                self.set_params(ctx, &v[len..])?;
                got = Some(v);
                st.time.comm_s += lap(&mut clock);
            }
            let mut mine = vec![0.0f32; len];
            if let Some(mb) = &p.micro[i] {
                let roots = plan.roots_at(me, i);
                let inputs: PerType = match &p.rows {
                    Gathered::Once {
                        features, index, ..
                    } => (0..g.node_types().len())
                        .map(|ty| {
                            let idx = index[i].get(ty).and_then(Option::as_ref);
                            let whole = learn
                                .get(ty)
                                .and_then(Option::as_ref)
                                .or(features.get(ty).and_then(Option::as_ref));
                            match (idx, whole) {
                                (Some(idx), Some(x)) => Ok(Some(x.index_select(idx, 0)?)),
                                _ => Ok(None),
                            }
                        })
                        .collect::<Result<_>>()?,
                    Gathered::PerStep(features) => {
                        let mut x = ctx.gather(&mb.blocks[0].src, Rows::Learnable, after)?;
                        for (x, f) in x.iter_mut().zip(features[i].iter()) {
                            if x.is_none() {
                                *x = f.clone();
                            }
                        }
                        x
                    }
                };
                st.time.gather_s += lap(&mut clock);
                let logits = self.model.forward(&g, mb, inputs.clone(), dropout)?;
                let losses = self.task.loss_of_share(&logits, roots, batch)?;
                let share = self.task.share_weight(roots.len(), batch.len());
                let gs = (&losses.total * share)?.backward()?;
                let each = losses
                    .each
                    .iter()
                    .map(|l| l.to_dtype(DType::F64)?.to_scalar::<f64>())
                    .collect::<candle_core::Result<_>>()?;
                mine = allreduce::flatten(
                    &self.model.params,
                    Some(&gs),
                    allreduce::Tally {
                        loss: losses.total.to_dtype(DType::F64)?.to_scalar::<f64>()? * share,
                        correct: self.task.correct(&logits, roots)? as f64,
                        seen: 0.0,
                        each,
                    },
                )?;
                if let Gathered::Once { .. } = p.rows {
                    for (ty, x) in learn.iter().enumerate() {
                        if let Some(gr) = x.as_ref().and_then(|x| gs.get(x)) {
                            leaf_grads[ty] = Some(match leaf_grads[ty].take() {
                                Some(sum) => (sum + gr)?,
                                None => gr.clone(),
                            });
                        }
                    }
                } else {
                    let leaves: Vec<Option<Tensor>> = inputs
                        .iter()
                        .enumerate()
                        .map(|(ty, x)| {
                            x.as_ref()
                                .filter(|_| ctx.learnable[ty])
                                .and_then(|x| gs.get(x).cloned())
                        })
                        .collect();
                    ctx.gradient_rows(&mb.blocks[0].src, &leaves, &mut pushes)?;
                }
                st.time.compute_s += lap(&mut clock);
            }
            if i > 0 && !carry {
                got = Some(self.receive(ctx, plan, i, len)?);
                st.time.comm_s += lap(&mut clock);
            }
            // The model's gradient so far, then this time step's, in that order on every run.
            acc = match got {
                Some(v) => v[..len].iter().zip(&mine).map(|(a, b)| a + b).collect(),
                None => mine,
            };
            if i + 1 < plan.steps() {
                let to = plan.goes_to(me, i);
                let mut data = acc.clone();
                if carry {
                    data.extend(self.flat_params()?);
                }
                let msg = Migrate {
                    gen: s.gen,
                    seq: self.seq,
                    step: i as u32,
                    from: me,
                    data: ByteVec(bytemuck::cast_slice(&data).to_vec()),
                };
                ctx.block_on(ctx.workers[to as usize].ask(msg, s.timeouts.ask))??;
                st.time.comm_s += lap(&mut clock);
            }
        }
        if let Gathered::Once { union, .. } = &p.rows {
            ctx.gradient_rows(union, &leaf_grads, &mut pushes)?;
        }
        // Every worker pushes to every learnable store each step (empty if it
        // has nothing), so a store knows when the step's gradient is complete.
        let pushes = ctx.pushes(self.seq, me, pushes);
        let group = Group {
            trainers: &ctx.workers,
            me,
            seq: self.seq,
            kind: s.cfg.allreduce,
        };
        // The examination's clock rides on the all-reduce, so every worker sums the same seconds.
        if self.exam.is_some() {
            acc.push(
                std::mem::replace(&mut self.since, Instant::now())
                    .elapsed()
                    .as_secs_f32(),
            );
        }
        let mut sum = all_reduce(ctx, &group, acc, pushes)?;
        if let Some(e) = &mut self.exam {
            let seconds = sum
                .pop()
                .ok_or_else(|| TrainError::Internal("an empty all-reduce".into()))?;
            e.add(f64::from(seconds));
        }
        st.time.comm_s += lap(&mut clock);
        let tally = allreduce::apply(&self.model.params, &mut self.adam, &sum)?;
        st.time.update_s += lap(&mut clock);
        self.seq += 1;
        // Every share and migration of earlier steps has been taken: what is left of them is duplicates.
        s.inbox.forget_before(self.seq);
        Ok(tally)
    }
}
