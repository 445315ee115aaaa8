//! The client side of owner-compute: what a training thread uses to sample
//! a batch (remote frontier nodes by their owners' samplers) and gather its
//! input rows (local rows read here, the rest pulled from their owners'
//! stores, cached rows from a device cache), push gradient rows to the
//! stores, and write a partition's part of a checkpoint.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor, Var};
use futures_util::future::join_all;
use graphs::link::{ExcludeEdges, NoExclusion, StepEdges};
use graphs::{HetGraph, MiniBatch, RelationFilter, RelationPicks, Sampler};
use models::optim::Adam;
use models::rgcn::PerType;
use models::Model;
use runtime::{ActorRef, ByteVec, Node, SharedBytes};

use super::messages::{Pull, Push, SampleReq, Save};
use super::names;
use crate::cache::rows::Lookup;
use crate::cache::FeatureCache;
use crate::config::TrainingConfig;
use crate::distributed::checkpoint::{self, Progress};
use crate::distributed::inbox::Inbox;
use crate::distributed::messages::Saved;
use crate::distributed::Timeouts;
use crate::error::{Result, TrainError};

/// Which input rows to gather.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rows {
    /// Plain features only (immutable: can be fetched ahead).
    Features,
    /// Learnable rows only (read when used: they change every step), as gradient leaves.
    Learnable,
    /// Both, learnable ones without gradients (evaluation).
    All,
}

/// Who a client is and what it reads.
pub struct ClientSetup<'a> {
    /// The client's partition.
    pub part: u32,
    /// Partitions in all.
    pub parts: u32,
    /// The partition graph.
    pub graph: Arc<HetGraph>,
    /// Owner of every node, per type.
    pub owners: Arc<Vec<Vec<u16>>>,
    /// Training settings (fanouts, embedding width, model).
    pub cfg: &'a TrainingConfig,
    /// The model the rows feed (its device, dtype and which types it reads).
    pub model: &'a Model,
    /// Generation of the attempt.
    pub gen: u64,
    /// Deadlines.
    pub timeouts: Timeouts,
    /// The training thread's inbox (its `block_on` gives up when the run aborts).
    pub inbox: Arc<Inbox>,
    /// The node's runtime.
    pub handle: tokio::runtime::Handle,
    /// The node the client's actors live on.
    pub node: &'a Node,
    /// The name its requests are sent under.
    pub me: &'a str,
}

/// A training thread's access to every partition's sampler and stores.
pub struct Client {
    /// The client's partition.
    pub part: u32,
    /// Partitions in all.
    pub parts: u32,
    /// The partition graph.
    pub graph: Arc<HetGraph>,
    /// Owner of every node, per type.
    pub owners: Arc<Vec<Vec<u16>>>,
    /// Neighbours per relation and layer.
    pub fanouts: Vec<usize>,
    /// Width of learnable rows.
    pub embed_dim: usize,
    /// Most seeds one evaluation forward pass takes: a machine's share of a
    /// training batch, so that evaluation peaks no higher than training.
    pub eval_seeds: usize,
    /// Generation of the attempt.
    pub gen: u64,
    /// Deadlines.
    pub timeouts: Timeouts,
    /// The training thread's inbox.
    pub inbox: Arc<Inbox>,
    handle: tokio::runtime::Handle,
    /// Every partition's sampler.
    pub samplers: Vec<ActorRef>,
    /// `[type][part]`, for types that have a store.
    pub stores: Vec<Vec<ActorRef>>,
    /// Types whose inputs are learnable rows held by the stores.
    pub learnable: Vec<bool>,
    /// Types the model reads.
    pub wanted: Vec<bool>,
    /// Where input rows go.
    pub device: Device,
    /// Their dtype.
    pub dtype: DType,
    /// Whether the model reads neighbours at all.
    pub uses_neighbors: bool,
    /// Feature rows cached on the device (set once a cache is built).
    pub cache: Option<Arc<FeatureCache>>,
    /// Input rows pulled from other partitions so far (features and
    /// learnable rows; shared with the DAG sampler, which pulls on its own).
    pub remote_rows: Arc<AtomicU64>,
    /// Whether partition `p`'s node is known to be down: asks to it then
    /// fail at once instead of waiting out their timeout (a server goes on
    /// answering what needs no rows of it). `None`: always ask (training,
    /// whose coordinator handles a lost node).
    pub down: Option<Arc<dyn Fn(u32) -> bool + Send + Sync>>,
}

/// Seeds per evaluation pass on one of `parts` machines training batches of
/// `batch` seeds: its share of a batch, at least 64 (fewer round trips),
/// at most [`crate::epoch::EVAL_BATCH`].
pub fn eval_seeds(batch: usize, parts: u32) -> usize {
    batch
        .div_ceil(parts.max(1) as usize)
        .clamp(64, crate::epoch::EVAL_BATCH)
}

/// A reference to actor `name` on `node` whose messages say they come from `me`.
pub fn sender_ref(node: &Node, me: &str, name: &str) -> Result<ActorRef> {
    let from = runtime::ActorName::new(me).map_err(|e| TrainError::Internal(e.to_string()))?;
    node.actor(name)
        .map(|r| r.with_sender(from))
        .map_err(|e| TrainError::Internal(format!("{name}: {e}")))
}

/// Pulls `ids` of generation `gen` from `store` (served by `priority` among
/// waiting pulls), asking again while step `after`'s update is not applied
/// there or the store has not started the generation, until the step deadline.
pub async fn pull_from(
    store: &ActorRef,
    gen: u64,
    ids: &[u32],
    after: Option<u64>,
    priority: u64,
    timeouts: Timeouts,
) -> Result<SharedBytes> {
    let deadline = Instant::now() + timeouts.step;
    loop {
        match store
            .ask(
                Pull {
                    gen,
                    ids: ids.to_vec(),
                    after,
                    priority,
                },
                timeouts.ask,
            )
            .await
        {
            Ok(Ok(Some(rows))) => return Ok(rows),
            Ok(Ok(None)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_micros(500)).await
            }
            // Not there in time: the store's node is as good as lost.
            Ok(Ok(None)) => {
                return Err(TrainError::PeerLost(format!(
                    "{}: step {after:?} of generation {gen:x} not applied within {:?}",
                    store.name(),
                    timeouts.step
                )))
            }
            Ok(Err(e)) => return Err(e.from_actor(store.name())),
            Err(e) => return Err(TrainError::Ask(e)),
        }
    }
}

impl Client {
    /// The client `s` describes, with references to every sampler and store.
    pub fn new(s: ClientSetup) -> Result<Client> {
        let learnable = Model::learnable_types(s.cfg.model, &s.graph);
        let target = s.graph.target().index();
        let uses_neighbors = s.model.uses_neighbors();
        let wanted: Vec<bool> = (0..learnable.len())
            .map(|ty| uses_neighbors || ty == target)
            .collect();
        let mut stores = Vec::new();
        for (ty, nt) in s.graph.node_types().iter().enumerate() {
            let has = nt.features.is_some() || learnable[ty];
            stores.push(if has {
                (0..s.parts)
                    .map(|p| sender_ref(s.node, s.me, &names::store(&nt.name, p)))
                    .collect::<Result<Vec<_>>>()?
            } else {
                Vec::new()
            });
        }
        let samplers = (0..s.parts)
            .map(|p| sender_ref(s.node, s.me, &names::sampler(p)))
            .collect::<Result<_>>()?;
        Ok(Client {
            part: s.part,
            parts: s.parts,
            graph: s.graph,
            owners: s.owners,
            fanouts: s.cfg.fanouts.clone(),
            embed_dim: s.cfg.embed_dim,
            eval_seeds: eval_seeds(s.cfg.batch, s.parts),
            gen: s.gen,
            timeouts: s.timeouts,
            inbox: s.inbox,
            handle: s.handle,
            samplers,
            stores,
            learnable,
            wanted,
            device: s.model.device().clone(),
            dtype: s.model.dtype(),
            uses_neighbors,
            cache: None,
            remote_rows: Arc::default(),
            down: None,
        })
    }

    /// Refuses at once to ask partition `o` when its node is known to be down.
    fn check_up(&self, o: usize) -> Result<()> {
        match &self.down {
            Some(down) if o as u32 != self.part && down(o as u32) => Err(TrainError::PeerLost(
                format!("partition {o}'s node is down"),
            )),
            _ => Ok(()),
        }
    }

    /// Whether partition `part` owns node `v` of type `ty`.
    pub fn owned(&self, ty: usize, v: u32) -> bool {
        self.owners[ty][v as usize] as u32 == self.part
    }

    /// Runs `f` on the node's runtime from this thread; gives up as soon as
    /// the run is aborted (a peer failed or went down).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> Result<F::Output> {
        self.inbox.block_on(&self.handle, f)
    }

    /// Pushes a step's gradient rows to a store, again while the store has
    /// not started this generation.
    pub async fn push(&self, store: &ActorRef, msg: Push) -> Result<()> {
        let deadline = Instant::now() + self.timeouts.step;
        loop {
            let again = Push {
                gen: msg.gen,
                seq: msg.seq,
                trainer: msg.trainer,
                ids: msg.ids.clone(),
                grad: msg.grad.clone(),
            };
            match store.ask(again, self.timeouts.ask).await {
                Ok(Ok(Some(()))) => return Ok(()),
                Ok(Ok(None)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(1)).await
                }
                Ok(Ok(None)) => {
                    return Err(TrainError::PeerLost(format!(
                        "{}: not at generation {:x} within {:?}",
                        store.name(),
                        msg.gen,
                        self.timeouts.step
                    )))
                }
                Ok(Err(e)) => return Err(e.from_actor(store.name())),
                Err(e) => return Err(TrainError::Ask(e)),
            }
        }
    }

    /// Step `seq`'s pushes from `trainer` to every learnable store: the
    /// gradient rows of `src` (per type, the gradient of `inputs`' leaves in
    /// `grads`, if any) grouped by owner. Every store gets a push, empty if
    /// there is nothing for it, so it knows when the step's gradient is complete.
    pub fn pushes<'c>(
        &'c self,
        seq: u64,
        trainer: u32,
        rows: Vec<Vec<(Vec<u32>, Vec<u8>)>>,
    ) -> Vec<impl std::future::Future<Output = Result<()>> + 'c> {
        let mut rows = rows;
        let mut asks = Vec::new();
        for (ty, stores) in self.stores.iter().enumerate() {
            if !self.learnable[ty] {
                continue;
            }
            for (p, store) in stores.iter().enumerate() {
                let (ids, grad) = rows
                    .get_mut(ty)
                    .and_then(|o| o.get_mut(p))
                    .map(std::mem::take)
                    .unwrap_or_default();
                let msg = Push {
                    gen: self.gen,
                    seq,
                    trainer,
                    ids,
                    grad: ByteVec(grad),
                };
                asks.push(self.push(store, msg));
            }
        }
        asks
    }

    /// Gradient rows of the rows `src` (per learnable type, their gradient
    /// in `grads`, if any) added to `out`, grouped per type by owner:
    /// `[type][part] = (ids, rows)`. A store adds up rows named twice.
    /// The rows go as the little-endian bytes a push carries, sized exactly
    /// before they are written (no growing, no copy into the message).
    pub fn gradient_rows(
        &self,
        src: &[Vec<u32>],
        grads: &[Option<Tensor>],
        out: &mut Vec<Vec<(Vec<u32>, Vec<u8>)>>,
    ) -> Result<()> {
        if out.is_empty() {
            *out = vec![vec![(Vec::new(), Vec::new()); self.parts as usize]; src.len()];
        }
        for (ty, gr) in grads.iter().enumerate() {
            if let (true, Some(gr)) = (self.learnable[ty], gr) {
                let dim = gr.dim(1)?;
                let owners = &self.owners[ty];
                let mut per = vec![0usize; self.parts as usize];
                src[ty]
                    .iter()
                    .for_each(|&v| per[owners[v as usize] as usize] += 1);
                for (o, n) in out[ty].iter_mut().zip(per) {
                    o.0.reserve(n);
                    o.1.reserve(n * dim * 4);
                }
                // Read in place (a gradient is a contiguous f32 tensor on the CPU).
                models::ops::with_f32(gr, |gv| {
                    for (i, &v) in src[ty].iter().enumerate() {
                        let o = &mut out[ty][owners[v as usize] as usize];
                        o.0.push(v);
                        o.1.extend_from_slice(bytemuck::cast_slice(&gv[i * dim..(i + 1) * dim]));
                    }
                })?;
            }
        }
        Ok(())
    }

    /// Asks this partition's learnable stores to write their rows into the
    /// checkpoint of step `seq`; returns the files and their hashes.
    pub fn save_stores(&self, seq: u64) -> Result<Vec<(String, String)>> {
        let mut files = Vec::new();
        let deadline = Instant::now() + self.timeouts.step;
        for (ty, stores) in self.stores.iter().enumerate() {
            if !self.learnable[ty] {
                continue;
            }
            let store = &stores[self.part as usize];
            loop {
                match self.block_on(store.ask(Save { gen: self.gen, seq }, self.timeouts.ask))?? {
                    Ok(Some(f)) => {
                        files.push(f);
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Ok(None) => {
                        return Err(TrainError::PeerLost(format!(
                            "{}: not at step {seq} within {:?}",
                            store.name(),
                            self.timeouts.step
                        )))
                    }
                    Err(e) => return Err(e.from_actor(store.name())),
                }
            }
        }
        Ok(files)
    }

    /// Samples seeds of any types (owned here) with `excluded` edges left out,
    /// asking owners for the picks of remote frontier nodes under the same exclusions.
    pub fn sample_typed(
        &self,
        seed: u64,
        epoch: u64,
        step: u64,
        seeds: &[Vec<u32>],
        excluded: Option<&StepEdges>,
    ) -> Result<MiniBatch> {
        let g = &*self.graph;
        let mut sampler = Sampler::new(g, &self.fanouts, seed)?;
        let owners = &self.owners;
        let part = self.part;
        let exclude = excluded.is_some();
        let remote = |layer: usize, fanout: usize, away: &[Vec<u32>]| {
            self.remote_picks(seed, epoch, step, layer, fanout, away, exclude)
        };
        let ex: &dyn ExcludeEdges = match excluded {
            Some(x) => x,
            None => &NoExclusion,
        };
        sampler.sample_seeds(
            epoch,
            step,
            seeds,
            ex,
            &RelationFilter::All,
            |t, v| owners[t][v as usize] as u32 == part,
            remote,
        )
    }

    /// Samples `seeds` (owned here), asking owners for the picks of remote frontier nodes.
    pub fn sample(&self, seed: u64, epoch: u64, step: u64, seeds: &[u32]) -> Result<MiniBatch> {
        let g = &*self.graph;
        if !self.uses_neighbors {
            return crate::epoch::sample(
                &mut Sampler::new(g, &self.fanouts, seed)?,
                false,
                epoch,
                step,
                seeds,
            );
        }
        let mut sampler = Sampler::new(g, &self.fanouts, seed)?;
        let owners = &self.owners;
        let part = self.part;
        let remote = |layer: usize, fanout: usize, away: &[Vec<u32>]| {
            self.remote_picks(seed, epoch, step, layer, fanout, away, false)
        };
        sampler.sample_with(
            epoch,
            step,
            seeds,
            &RelationFilter::All,
            |t, v| owners[t][v as usize] as u32 == part,
            remote,
        )
    }

    /// The owners' picks for remote frontier nodes `away`; `exclude`: they
    /// leave the link-prediction step's training edges out.
    #[allow(clippy::too_many_arguments)] // the sampling key's parts, flat
    pub fn remote_picks(
        &self,
        seed: u64,
        epoch: u64,
        step: u64,
        layer: usize,
        fanout: usize,
        away: &[Vec<u32>],
        exclude: bool,
    ) -> Result<Vec<Vec<RelationPicks>>> {
        let parts = self.parts as usize;
        let nt = away.len();
        let mut reqs = vec![vec![Vec::new(); nt]; parts];
        let mut pos = vec![vec![Vec::new(); nt]; parts];
        for (t, nodes) in away.iter().enumerate() {
            for (i, &v) in nodes.iter().enumerate() {
                let o = self.owners[t][v as usize] as usize;
                reqs[o][t].push(v);
                pos[o][t].push(i);
            }
        }
        let asking: Vec<usize> = (0..parts)
            .filter(|&o| reqs[o].iter().any(|r| !r.is_empty()))
            .collect();
        for &o in &asking {
            self.check_up(o)?;
        }
        let asks = asking.iter().map(|&o| {
            let msg = SampleReq {
                seed,
                epoch,
                step,
                layer: layer as u32,
                fanout: fanout as u32,
                nodes: std::mem::take(&mut reqs[o]),
                exclude,
                priority: 0,
            };
            self.samplers[o].ask(msg, self.timeouts.ask)
        });
        // A lost owner (an ask that timed out) is the run's to recover from;
        // an answer that breaks the protocol stops it.
        let bad = |m: String| TrainError::Protocol(m);
        let answers = self.block_on(join_all(asks.collect::<Vec<_>>()))?;
        let mut by_owner: Vec<Option<Vec<Vec<RelationPicks>>>> = vec![None; parts];
        for (&o, a) in asking.iter().zip(answers) {
            let picks = a?.map_err(|e| e.from_actor(names::sampler(o as u32)))?;
            if picks.len() != nt {
                return Err(bad(format!(
                    "{} answered for {} types, {nt} asked",
                    names::sampler(o as u32),
                    picks.len()
                )));
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
            let rels: Vec<graphs::RelationId> = by_owner[first]
                .as_ref()
                .map(|a| a[t].iter().map(|p| p.relation).collect())
                .unwrap_or_default();
            let mut merged = Vec::with_capacity(rels.len());
            for (j, &rel) in rels.iter().enumerate() {
                let mut lists: Vec<&[u32]> = vec![&[]; nodes.len()];
                for &o in &holders {
                    let p = by_owner[o]
                        .as_ref()
                        .and_then(|a| a[t].get(j))
                        .filter(|p| p.relation == rel)
                        .ok_or_else(|| {
                            bad(format!(
                                "{} answered other relations",
                                names::sampler(o as u32)
                            ))
                        })?;
                    let n = pos[o][t].len();
                    let ok = p.offsets.len() == n + 1
                        && p.offsets.windows(2).all(|w| w[0] <= w[1])
                        && p.offsets.last().map(|&e| e as usize) == Some(p.picks.len());
                    if !ok {
                        return Err(bad(format!(
                            "{} sent malformed picks",
                            names::sampler(o as u32)
                        )));
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
                merged.push(RelationPicks {
                    relation: rel,
                    offsets,
                    picks,
                });
            }
            out.push(merged);
        }
        Ok(out)
    }

    /// Pulls `ids` from `store`, asking again while step `after`'s update is
    /// not applied there (pushes travel alongside the all-reduce).
    pub async fn pull(
        &self,
        store: &ActorRef,
        ids: &[u32],
        after: Option<u64>,
    ) -> Result<SharedBytes> {
        pull_from(store, self.gen, ids, after, 0, self.timeouts).await
    }

    /// The node's runtime (for requests sent from other threads).
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Whether `rows` includes type `ty`'s inputs.
    pub fn gathers(&self, ty: usize, rows: Rows) -> bool {
        let kind = match rows {
            Rows::Features => !self.learnable[ty],
            Rows::Learnable => self.learnable[ty],
            Rows::All => true,
        };
        kind && self.wanted[ty] && !self.stores[ty].is_empty()
    }

    /// Input rows of `src` per type: features (local rows read here, the rest
    /// pulled from their owners) and learnable rows (pulled; as gradient
    /// leaves when `train`).
    pub fn gather(&self, src: &[Vec<u32>], rows: Rows, after: Option<u64>) -> Result<PerType> {
        let g = &*self.graph;
        let parts = self.parts as usize;
        // Cached feature rows are taken from the device cache; only the misses are read or pulled.
        let cached = |ty: usize| {
            self.cache
                .as_ref()
                .and_then(|c| c.get(ty))
                .filter(|_| rows != Rows::Learnable)
        };
        let lookups: Vec<Option<Lookup>> = src
            .iter()
            .enumerate()
            .map(|(ty, ids)| {
                cached(ty)
                    .filter(|_| self.gathers(ty, rows))
                    .map(|c| c.lookup(ids, rows == Rows::Features))
            })
            .collect();
        let fetch: Vec<&[u32]> = src
            .iter()
            .zip(&lookups)
            .map(|(ids, lk)| {
                lk.as_ref()
                    .map_or(ids.as_slice(), |lk| lk.miss_ids.as_slice())
            })
            .collect();
        let mut plan = Vec::new();
        for (ty, ids) in fetch.iter().enumerate() {
            if !self.gathers(ty, rows) || ids.is_empty() {
                continue;
            }
            let local_rows = g.node_types()[ty].features.is_some();
            for o in 0..parts {
                if local_rows && o as u32 == self.part {
                    continue;
                }
                let want: Vec<u32> = ids
                    .iter()
                    .copied()
                    .filter(|&v| self.owners[ty][v as usize] as usize == o)
                    .collect();
                if !want.is_empty() {
                    self.check_up(o)?;
                    plan.push((ty, o, want));
                }
            }
        }
        self.remote_rows.fetch_add(
            plan.iter()
                .filter(|(_, o, _)| *o as u32 != self.part)
                .map(|(_, _, want)| want.len() as u64)
                .sum(),
            Ordering::Relaxed,
        );
        let asks = plan.iter().map(|(ty, o, want)| {
            self.pull(
                &self.stores[*ty][*o],
                want,
                if self.learnable[*ty] { after } else { None },
            )
        });
        let answers = self.block_on(join_all(asks.collect::<Vec<_>>()))?;
        // Pulled rows stay as received (little-endian f32 bytes) and are copied once, into place.
        let mut pulled: BTreeMap<(usize, usize), SharedBytes> = BTreeMap::new();
        let dims: Vec<usize> = (0..src.len())
            .map(|ty| {
                g.node_types()[ty]
                    .features
                    .as_ref()
                    .map_or(self.embed_dim, |f| f.dim())
            })
            .collect();
        for ((ty, o, want), a) in plan.iter().zip(answers) {
            let bytes = a?;
            pulled.insert(
                (*ty, *o),
                crate::distributed::rows::dense(bytes, want.len(), dims[*ty])?,
            );
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
                let o = self.owners[ty][v as usize] as usize;
                match (feats, o as u32 == self.part) {
                    (Some(f), true) => buf.extend_from_slice(f.row(v as usize)),
                    _ => {
                        let rows = pulled.get(&(ty, o)).ok_or_else(|| {
                            TrainError::Protocol(format!(
                                "no rows pulled for type {ty} from partition {o}"
                            ))
                        })?;
                        let row = rows
                            .0
                            .get(next[o] * dim * 4..(next[o] + 1) * dim * 4)
                            .ok_or_else(|| TrainError::Protocol("too few pulled rows".into()))?;
                        crate::distributed::rows::append_row(&mut buf, row);
                        next[o] += 1;
                    }
                }
            }
            let x = match (cached(ty), &lookups[ty]) {
                (Some(c), Some(lk)) => c.assemble(lk, buf, self.dtype, &self.device)?,
                // A gradient leaf made from the rows themselves: `Var::from_tensor` would copy them.
                _ if rows == Rows::Learnable && self.dtype == DType::F32 => {
                    Var::from_vec(buf, (ids.len(), dim), &self.device)?.into_inner()
                }
                _ => Tensor::from_vec(buf, (ids.len(), dim), &self.device)?.to_dtype(self.dtype)?,
            };
            out.push(Some(if rows == Rows::Learnable && !x.is_variable() {
                Var::from_tensor(&x)?.into_inner()
            } else {
                x
            }));
        }
        Ok(out)
    }

    /// Each task's evaluation figures for `model` (no dropout) on the share of `nodes`
    /// that `mine` picks from each evaluation chunk, sampled with `seed`.
    #[allow(clippy::too_many_arguments)]
    pub fn score(
        &self,
        model: &Model,
        task: &crate::task::multi::NodeTasks,
        seed: u64,
        epoch: u64,
        nodes: &[u32],
        after: Option<u64>,
        mine: impl Fn(&[u32]) -> Vec<u32>,
    ) -> Result<Vec<crate::task::node::Scores>> {
        let g = self.graph.clone();
        // A node's draws are keyed by its chunk's step, not by the nodes
        // beside it: pieces of the share sample what the chunk would.
        let (mut keys, mut pieces) = (Vec::new(), Vec::new());
        for (step, chunk) in nodes.chunks(crate::epoch::EVAL_BATCH).enumerate() {
            for piece in mine(chunk).chunks(self.eval_seeds) {
                keys.push(step as u64);
                pieces.push(piece.to_vec());
            }
        }
        let mut scores = task.empty_scores();
        // The next piece is sampled and pulled while this one runs forward
        // (one more waits: a few pieces in memory, not a whole chunk).
        let make = || {
            Ok(|k: u64, seeds: &[u32]| -> Result<_> {
                let mb = self.sample(seed, epoch, keys[k as usize], seeds)?;
                let inputs = self.gather(&mb.blocks[0].src, Rows::All, after)?;
                Ok((mb, inputs))
            })
        };
        crate::epoch::run_steps(1, 1, &pieces, 0, make, |_, seeds, (mb, inputs)| {
            let logits = model.forward(&g, &mb, inputs, None)?.detach();
            task.score(&logits, seeds, &mut scores)
        })?;
        Ok(scores)
    }

    /// This partition's part of the checkpoint before step `seq` under
    /// `root`: the dense state if `dense` (one training thread of the run
    /// writes it), the rows of its learnable stores; then the coordinator
    /// hears of the files (with the epoch's `progress` from the thread that writes the dense state).
    pub fn checkpoint_part(
        &self,
        coordinator: &ActorRef,
        root: &std::path::Path,
        seq: u64,
        dense: Option<(&Model, &Adam)>,
        progress: Progress,
    ) -> Result<()> {
        self.checkpoint_part_with(coordinator, root, seq, dense, progress, Vec::new())
    }

    /// [`Client::checkpoint_part`] with `files` the training thread wrote itself (name, SHA-256).
    pub fn checkpoint_part_with(
        &self,
        coordinator: &ActorRef,
        root: &std::path::Path,
        seq: u64,
        dense: Option<(&Model, &Adam)>,
        progress: Progress,
        mut files: Vec<(String, String)>,
    ) -> Result<()> {
        if let Some((model, adam)) = dense {
            files.push(checkpoint::write_dense(root, seq, model, adam)?);
        }
        files.extend(self.save_stores(seq)?);
        let msg = Saved {
            gen: self.gen,
            seq,
            part: self.part,
            files,
            progress: dense.is_some().then_some(progress),
        };
        self.block_on(coordinator.ask(msg, self.timeouts.ask))??;
        Ok(())
    }
}
