//! One mini-batch's sampling as a DAG of small tasks (ByteGNN §4.2.1):
//!
//! ```text
//! seed ──> hop 1: pick(chunk 0) … pick(chunk c), ask(owner o) … ──> assemble ──┬──> hop 2 … ──> assemble ─┐
//!                                                                              └──> fetch(new rows of hop 1) ┴──> finish
//! ```
//!
//! The seed task takes the trainer's seeds (for link prediction it draws the
//! step's positive edges' endpoints and their negatives: the positive and
//! negative sampling operators). Each hop's destinations owned here are cut
//! into chunks of `chunk` rows, each picked by a task of its own; those
//! owned elsewhere go to their owners' samplers, one request per owner. When
//! every part of a hop is in, one task assembles its block (the merge keeps
//! destination order, so the block is the one the sequential sampler builds:
//! picks are pure functions of their keys). The rows a hop discovered are
//! fetched at once, local ones by tasks, remote ones by pulls, while the next
//! hop is sampled. The last task puts the rows in the first block's order.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use graphs::link::{ExcludeEdges, NoExclusion};
use graphs::{
    Block, HetGraph, MiniBatch, NodeTypeId, RelationFilter, RelationId, RelationPicks, Sampler,
};
use models::rgcn::PerType;
use runtime::ActorRef;

use super::executor::Executor;
use super::ops::{Op, OpTimes};
use crate::cache::rows::Lookup;
use crate::cache::FeatureCache;
use crate::distributed::Timeouts;
use crate::error::{Result, TrainError};
use crate::owner::client::{pull_from, Client, Rows};
use crate::owner::messages::SampleReq;
use crate::owner::names;
use crate::task::link::{LinkBatch, LinkTask};

/// What every DAG of a trainer reads: its partition, its peers' samplers and stores.
pub struct Source {
    graph: Arc<HetGraph>,
    owners: Arc<Vec<Vec<u16>>>,
    part: u32,
    fanouts: Vec<usize>,
    uses_neighbors: bool,
    samplers: Vec<ActorRef>,
    /// `[type][part]`, for types whose plain features are fetched (else empty).
    stores: Vec<Vec<ActorRef>>,
    dims: Vec<usize>,
    gen: u64,
    timeouts: Timeouts,
    handle: tokio::runtime::Handle,
    cache: Option<Arc<FeatureCache>>,
    dtype: DType,
    device: Device,
    chunk: usize,
    link: Option<Arc<LinkTask>>,
    /// Position maps for assembling blocks, reused.
    maps: Mutex<Vec<Vec<Vec<u32>>>>,
    /// The trainer's count of rows pulled from other partitions.
    remote_rows: Arc<std::sync::atomic::AtomicU64>,
}

impl Source {
    /// What `c`'s DAGs read, with `chunk` destination rows per task.
    pub fn new(c: &Client, link: Option<Arc<LinkTask>>, chunk: usize) -> Source {
        let g = &c.graph;
        let stores = (0..g.node_types().len())
            .map(|ty| {
                if c.gathers(ty, Rows::Features) {
                    c.stores[ty].clone()
                } else {
                    Vec::new()
                }
            })
            .collect();
        let dims = g
            .node_types()
            .iter()
            .map(|nt| nt.features.as_ref().map_or(c.embed_dim, |f| f.dim()))
            .collect();
        Source {
            graph: c.graph.clone(),
            owners: c.owners.clone(),
            part: c.part,
            fanouts: c.fanouts.clone(),
            uses_neighbors: c.uses_neighbors,
            samplers: c.samplers.clone(),
            stores,
            dims,
            gen: c.gen,
            timeouts: c.timeouts,
            handle: c.handle().clone(),
            cache: c.cache.clone(),
            dtype: c.dtype,
            device: c.device.clone(),
            chunk: chunk.max(1),
            link,
            maps: Mutex::default(),
            remote_rows: c.remote_rows.clone(),
        }
    }

    fn owner(&self, ty: usize, v: u32) -> usize {
        self.owners[ty]
            .get(v as usize)
            .map_or(usize::MAX, |&o| o as usize)
    }
}

/// What a DAG starts from.
#[derive(Clone, Debug)]
pub enum Seeds {
    /// The trainer's seed nodes of the target type.
    Nodes(Vec<u32>),
    /// Link prediction: the trainer's training edges of the step.
    Edges(Vec<u32>),
}

/// One batch to sample.
#[derive(Clone, Debug)]
pub struct Job {
    /// Its priority: lower runs first (the step's place in the epoch).
    pub dag: u64,
    /// Sampling seed.
    pub seed: u64,
    /// Epoch.
    pub epoch: u64,
    /// Step within the epoch.
    pub step: u64,
    /// What it starts from.
    pub seeds: Seeds,
}

/// A batch sampled, with its plain feature rows.
pub struct Sampled {
    /// The blocks.
    pub mb: MiniBatch,
    /// Plain feature rows of the first block's sources (`None`: not fetched).
    pub features: PerType,
    /// Link prediction: the step's edges, negatives and seeds.
    pub link: Option<LinkBatch>,
    /// Seconds from launch to the last block.
    pub sample_s: f64,
    /// Seconds from the last block to the rows in place.
    pub gather_s: f64,
}

/// Called once with the DAG's result.
pub type Done = Box<dyn FnOnce(Result<Sampled>) + Send>;

/// Rows fetched for one type of one hop's new nodes.
#[derive(Default)]
struct Fetch {
    /// What is fetched (the cache's misses, or every id).
    ids: Vec<u32>,
    /// The cache's answer for the hop's ids, if the type is cached.
    lookup: Option<Lookup>,
    /// Local rows, per chunk of the local ids (in order).
    local: Vec<Option<Vec<f32>>>,
    /// Pulled rows, per owner, as received (little-endian f32 bytes,
    /// length checked): copied once, into place, by the last task.
    remote: Vec<Option<runtime::SharedBytes>>,
}

#[derive(Default)]
struct State {
    typed: Vec<Vec<u32>>,
    link: Option<LinkBatch>,
    hop: usize,
    dst: Vec<Vec<u32>>,
    /// This hop's local picks, `[type][chunk]`.
    local: Vec<Vec<Option<Vec<RelationPicks>>>>,
    /// This hop's owners' answers, `[owner]`.
    remote: Vec<Option<Vec<Vec<RelationPicks>>>>,
    /// Parts of this hop still out.
    picking: usize,
    blocks: Vec<Block>,
    /// Per hop, per type.
    fetches: Vec<Vec<Fetch>>,
    /// Fetch parts still out.
    fetching: usize,
    sampled: Option<Instant>,
    /// The last task is queued.
    finishing: bool,
    done: Option<Done>,
}

/// A running DAG.
struct Dag {
    src: Arc<Source>,
    ex: Arc<Executor>,
    ops: Arc<OpTimes>,
    job: Job,
    start: Instant,
    st: Mutex<State>,
}

/// Starts `job`'s DAG on `ex`; `done` gets its result.
pub fn launch(src: Arc<Source>, ex: Arc<Executor>, ops: Arc<OpTimes>, job: Job, done: Done) {
    let dag = Arc::new(Dag {
        src,
        ex: ex.clone(),
        ops,
        job,
        start: Instant::now(),
        st: Mutex::new(State {
            done: Some(done),
            ..State::default()
        }),
    });
    let id = dag.job.dag;
    ex.spawn(id, u64::MAX, move || dag.run(Op::Seed, |d| d.seed()));
}

/// Picks of `nodes` (one type) with the job's keys.
fn pick_chunk(
    src: &Source,
    job: &Job,
    layer: usize,
    fanout: usize,
    ty: usize,
    nodes: &[u32],
) -> Result<Vec<RelationPicks>> {
    let mut sampler = Sampler::new(&src.graph, &src.fanouts, job.seed)?;
    let step_edges = match (&job.seeds, &src.link) {
        (Seeds::Edges(_), Some(l)) => Some(l.exclusion(job.epoch, job.step)),
        _ => None,
    };
    let excluded: &dyn ExcludeEdges = match &step_edges {
        Some(x) => x,
        None => &NoExclusion,
    };
    Ok(sampler.pick(
        job.epoch,
        job.step,
        layer,
        fanout,
        NodeTypeId(ty as u32),
        nodes,
        &RelationFilter::All,
        excluded,
    )?)
}

impl Dag {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` as operator `op`, timed; an error ends the DAG.
    fn run(self: &Arc<Self>, op: Op, f: impl FnOnce(&Arc<Self>) -> Result<()>) {
        if self.lock().done.is_none() {
            return; // failed already
        }
        let t = Instant::now();
        let r = f(self);
        self.ops.add(op, t.elapsed());
        if let Err(e) = r {
            self.fail(e);
        }
    }

    fn fail(&self, e: TrainError) {
        let done = self.lock().done.take();
        if let Some(d) = done {
            d(Err(e));
        }
    }

    /// Queues `f` as a task of this DAG.
    fn task(
        self: &Arc<Self>,
        op: Op,
        cost: u64,
        f: impl FnOnce(&Arc<Self>) -> Result<()> + Send + 'static,
    ) {
        let me = self.clone();
        self.ex.spawn(self.job.dag, cost, move || me.run(op, f));
    }

    /// The seed operator: typed seeds (and, for link prediction, the positive and negative samplers).
    fn seed(self: &Arc<Self>) -> Result<()> {
        let g = &self.src.graph;
        let (typed, link) = match (&self.job.seeds, &self.src.link) {
            (Seeds::Nodes(s), _) => {
                let mut typed = vec![Vec::new(); g.node_types().len()];
                typed[g.target().index()] = s.clone();
                (typed, None)
            }
            (Seeds::Edges(ids), Some(task)) => {
                let b = task.batch(g, self.job.epoch, ids);
                (b.seeds.clone(), Some(b))
            }
            (Seeds::Edges(_), None) => {
                return Err(TrainError::Config(
                    "training edges given to a run without link prediction".into(),
                ))
            }
        };
        {
            let mut st = self.lock();
            st.typed = typed.clone();
            st.link = link;
        }
        if !self.src.uses_neighbors {
            let block = Block {
                layer: 0,
                src: typed.clone(),
                dst: typed.clone(),
                relations: Vec::new(),
            };
            return self.hop_done(block, true);
        }
        self.start_hop(0, typed)
    }

    /// Launches hop `hop`'s picks for destinations `dst`.
    fn start_hop(self: &Arc<Self>, hop: usize, dst: Vec<Vec<u32>>) -> Result<()> {
        let src = &self.src;
        let g = &src.graph;
        let layers = src.fanouts.len();
        let (layer, fanout) = (layers - 1 - hop, src.fanouts[hop]);
        let parts = src.samplers.len();
        let mut away = vec![vec![Vec::new(); dst.len()]; parts];
        let mut chunks: Vec<Vec<Vec<u32>>> = Vec::with_capacity(dst.len());
        for (t, nodes) in dst.iter().enumerate() {
            let mut mine = Vec::new();
            for &v in nodes {
                match src.owner(t, v) {
                    o if o == src.part as usize => mine.push(v),
                    o if o < parts => away[o][t].push(v),
                    _ => {
                        return Err(TrainError::Internal(format!(
                            "node {v} of type {t} has no owner"
                        )))
                    }
                }
            }
            chunks.push(mine.chunks(src.chunk).map(<[u32]>::to_vec).collect());
        }
        let asking: Vec<usize> = (0..parts)
            .filter(|&o| away[o].iter().any(|a| !a.is_empty()))
            .collect();
        let parts_out = chunks.iter().map(Vec::len).sum::<usize>() + asking.len();
        {
            let mut st = self.lock();
            st.hop = hop;
            st.dst = dst;
            st.local = chunks.iter().map(|c| vec![None; c.len()]).collect();
            st.remote = vec![None; parts];
            st.picking = parts_out;
        }
        for (o, nodes) in asking
            .into_iter()
            .map(|o| (o, std::mem::take(&mut away[o])))
        {
            let exclude = matches!(self.job.seeds, Seeds::Edges(_));
            let msg = SampleReq {
                seed: self.job.seed,
                epoch: self.job.epoch,
                step: self.job.step,
                layer: layer as u32,
                fanout: fanout as u32,
                nodes,
                exclude,
                priority: self.job.dag,
            };
            let (me, sampler, ask) = (self.clone(), src.samplers[o].clone(), src.timeouts.ask);
            let sent = Instant::now();
            src.handle.spawn(async move {
                let answer = sampler.ask(msg, ask).await;
                let waited = sent.elapsed();
                let d = me.clone();
                me.ex.spawn(me.job.dag, u64::MAX, move || {
                    d.ops.add(Op::RemotePick, waited);
                    d.run(Op::Merge, |d| {
                        let picks = answer
                            .map_err(TrainError::Ask)?
                            .map_err(|e| e.from_actor(names::sampler(o as u32)))?;
                        d.picked(|st| st.remote[o] = Some(picks))
                    });
                });
            });
        }
        for (t, list) in chunks.into_iter().enumerate() {
            for (c, nodes) in list.into_iter().enumerate() {
                let cost: u64 = g
                    .in_relations(NodeTypeId(t as u32))
                    .iter()
                    .map(|&r| {
                        nodes
                            .iter()
                            .map(|&v| g.relation(r).in_csr().neighbors(v).len().min(fanout) as u64)
                            .sum::<u64>()
                    })
                    .sum();
                self.task(Op::Pick, cost, move |d| {
                    let picks = pick_chunk(&d.src, &d.job, layer, fanout, t, &nodes)?;
                    d.picked(|st| st.local[t][c] = Some(picks))
                });
            }
        }
        Ok(())
    }

    /// Records one part of the hop; the last one queues the assembly.
    fn picked(self: &Arc<Self>, put: impl FnOnce(&mut State)) -> Result<()> {
        let last = {
            let mut st = self.lock();
            put(&mut st);
            st.picking -= 1;
            st.picking == 0
        };
        if last {
            self.task(Op::Assemble, u64::MAX, |d| d.assemble());
        }
        Ok(())
    }

    /// Merges the hop's parts in destination order and builds its block.
    fn assemble(self: &Arc<Self>) -> Result<()> {
        let src = &self.src;
        let g = &src.graph;
        let (hop, dst, local, remote) = {
            let mut st = self.lock();
            (
                st.hop,
                std::mem::take(&mut st.dst),
                std::mem::take(&mut st.local),
                std::mem::take(&mut st.remote),
            )
        };
        let (layer, fanout) = (src.fanouts.len() - 1 - hop, src.fanouts[hop]);
        let mut picks = Vec::with_capacity(dst.len());
        for (t, nodes) in dst.iter().enumerate() {
            picks.push(merge_type(src, t, nodes, &local[t], &remote)?);
        }
        let mut maps = src
            .maps
            .lock()
            .ok()
            .and_then(|mut m| m.pop())
            .unwrap_or_default();
        let block = graphs::sampler::assemble(
            g,
            &mut maps,
            layer,
            fanout,
            dst,
            &picks,
            &RelationFilter::All,
        );
        if let Ok(mut m) = src.maps.lock() {
            m.push(maps);
        }
        self.hop_done(block?, hop + 1 == src.fanouts.len())
    }

    /// A hop's block is built: fetch its new rows, start the next hop.
    fn hop_done(self: &Arc<Self>, block: Block, last: bool) -> Result<()> {
        let first = self.lock().blocks.is_empty();
        // The first hop fetches its destinations (the seeds) too.
        let new: Vec<Vec<u32>> = block
            .src
            .iter()
            .zip(&block.dst)
            .map(|(s, d)| s[if first { 0 } else { d.len() }..].to_vec())
            .collect();
        let next = block.src.clone();
        let hop = {
            let mut st = self.lock();
            st.blocks.push(block);
            st.fetches.len()
        };
        self.fetch(hop, new, last)?;
        if !last {
            self.start_hop(hop + 1, next)?;
        }
        self.maybe_finish();
        Ok(())
    }

    /// Launches the fetches of `new` rows (per type), recorded as hop `hop`'s.
    /// `last`: the DAG's sampling is then complete (recorded with the
    /// fetches, so the last task cannot start before they are counted).
    fn fetch(self: &Arc<Self>, hop: usize, new: Vec<Vec<u32>>, last: bool) -> Result<()> {
        let src = &self.src;
        let parts = src.samplers.len();
        let mut fetches: Vec<Fetch> = Vec::with_capacity(new.len());
        let mut launches = Vec::new();
        for (t, ids) in new.into_iter().enumerate() {
            if src.stores[t].is_empty() || ids.is_empty() {
                fetches.push(Fetch::default());
                continue;
            }
            let lookup = src
                .cache
                .as_ref()
                .and_then(|c| c.get(t))
                .map(|c| c.lookup(&ids, true));
            let ids = match &lookup {
                Some(lk) => lk.miss_ids.clone(),
                None => ids,
            };
            let local_rows = src.graph.node_types()[t].features.is_some();
            let mut mine = Vec::new();
            let mut away = vec![Vec::new(); parts];
            for &v in &ids {
                match src.owner(t, v) {
                    o if o == src.part as usize && local_rows => mine.push(v),
                    o if o < parts => away[o].push(v),
                    _ => {
                        return Err(TrainError::Internal(format!(
                            "node {v} of type {t} has no owner"
                        )))
                    }
                }
            }
            let chunks: Vec<Vec<u32>> = mine.chunks(src.chunk).map(<[u32]>::to_vec).collect();
            fetches.push(Fetch {
                ids,
                lookup,
                local: vec![None; chunks.len()],
                remote: vec![None; parts],
            });
            launches.push((t, chunks, away));
        }
        let out = launches
            .iter()
            .map(|(_, c, a)| c.len() + a.iter().filter(|a| !a.is_empty()).count())
            .sum::<usize>();
        {
            let mut st = self.lock();
            st.fetches.push(fetches);
            st.fetching += out;
            if last {
                st.sampled = Some(Instant::now());
            }
        }
        for (t, chunks, away) in launches {
            let dim = src.dims[t];
            for (o, ids) in away.into_iter().enumerate().filter(|(_, a)| !a.is_empty()) {
                src.remote_rows
                    .fetch_add(ids.len() as u64, std::sync::atomic::Ordering::Relaxed);
                let (me, store, gen, timeouts) = (
                    self.clone(),
                    src.stores[t][o].clone(),
                    src.gen,
                    src.timeouts,
                );
                let sent = Instant::now();
                src.handle.spawn(async move {
                    let answer = pull_from(&store, gen, &ids, None, me.job.dag, timeouts).await;
                    let waited = sent.elapsed();
                    let d = me.clone();
                    me.ex.spawn(me.job.dag, 0, move || {
                        d.ops.add(Op::RemoteFetch, waited);
                        d.run(Op::Merge, |d| {
                            let bytes = answer?;
                            // Rows that came as their non-zeros are laid out dense here, where they are copied from.
                            let bytes = crate::distributed::rows::dense(bytes, ids.len(), dim)
                                .map_err(|e| e.context(store.name()))?;
                            d.fetched(|st| st.fetches[hop][t].remote[o] = Some(bytes))
                        });
                    });
                });
            }
            for (c, ids) in chunks.into_iter().enumerate() {
                self.task(Op::Fetch, (ids.len() * dim) as u64, move |d| {
                    let f = d.src.graph.node_types()[t]
                        .features
                        .as_ref()
                        .ok_or_else(|| {
                            TrainError::Internal(format!("type {t} has no local features"))
                        })?;
                    let mut rows = Vec::with_capacity(ids.len() * dim);
                    for (i, &v) in ids.iter().enumerate() {
                        if let Some(&ahead) = ids.get(i + models::prefetch::AHEAD) {
                            models::prefetch::prefetch(f.row(ahead as usize));
                        }
                        rows.extend_from_slice(f.row(v as usize));
                    }
                    d.fetched(|st| st.fetches[hop][t].local[c] = Some(rows))
                });
            }
        }
        Ok(())
    }

    /// Records one fetch part.
    fn fetched(self: &Arc<Self>, put: impl FnOnce(&mut State)) -> Result<()> {
        {
            let mut st = self.lock();
            put(&mut st);
            st.fetching -= 1;
        }
        self.maybe_finish();
        Ok(())
    }

    /// Queues the last task once every block is built and every row is in (once).
    fn maybe_finish(self: &Arc<Self>) {
        let ready = {
            let mut st = self.lock();
            let ready =
                st.sampled.is_some() && st.fetching == 0 && !st.finishing && st.done.is_some();
            st.finishing |= ready;
            ready
        };
        if ready {
            self.task(Op::Finish, u64::MAX, |d| d.finish());
        }
    }

    /// Puts every type's rows in the first block's source order.
    fn finish(self: &Arc<Self>) -> Result<()> {
        let src = &self.src;
        let (mut blocks, fetches, link, typed, sampled) = {
            let mut st = self.lock();
            (
                std::mem::take(&mut st.blocks),
                std::mem::take(&mut st.fetches),
                st.link.take(),
                std::mem::take(&mut st.typed),
                st.sampled.unwrap_or(self.start),
            )
        };
        blocks.reverse();
        let first = blocks
            .first()
            .ok_or_else(|| TrainError::Internal("a batch without blocks".into()))?;
        let mut features: PerType = Vec::with_capacity(first.src.len());
        for (t, ids) in first.src.iter().enumerate() {
            if src.stores[t].is_empty() || ids.is_empty() {
                features.push(None);
                continue;
            }
            let dim = src.dims[t];
            // Sized once for every hop's rows: no copies as it grows.
            let mut misses = Vec::with_capacity(
                fetches
                    .iter()
                    .filter_map(|h| h.get(t))
                    .map(|f| f.ids.len() * dim)
                    .sum(),
            );
            let mut lookup: Option<Lookup> = None;
            let mut at = 0usize;
            for hop in &fetches {
                let Some(f) = hop.get(t) else { continue };
                let start = misses.len() / dim.max(1);
                in_order(src, t, f, &mut misses)?;
                if let Some(lk) = &f.lookup {
                    let all = lookup.get_or_insert_with(Lookup::default);
                    all.hit_pos
                        .extend(lk.hit_pos.iter().map(|&p| p + at as u32));
                    all.hit_slot.extend_from_slice(&lk.hit_slot);
                    all.miss_pos
                        .extend(lk.miss_pos.iter().map(|&p| p + at as u32));
                    all.miss_ids.extend_from_slice(&lk.miss_ids);
                    at += lk.len;
                } else {
                    at += misses.len() / dim.max(1) - start;
                }
            }
            if at != ids.len() {
                return Err(TrainError::Protocol(format!(
                    "type {t}: {at} rows fetched for {} inputs",
                    ids.len()
                )));
            }
            let x = match (src.cache.as_ref().and_then(|c| c.get(t)), lookup) {
                (Some(c), Some(mut lk)) => {
                    lk.len = at;
                    c.assemble(&lk, misses, src.dtype, &src.device)?
                }
                _ => {
                    Tensor::from_vec(misses, (ids.len(), dim), &src.device)?.to_dtype(src.dtype)?
                }
            };
            features.push(Some(x));
        }
        let g = &src.graph;
        let mb = MiniBatch {
            epoch: self.job.epoch,
            step: self.job.step,
            seeds: typed[g.target().index()].clone(),
            blocks,
        };
        let out = Sampled {
            mb,
            features,
            link,
            sample_s: (sampled - self.start).as_secs_f64(),
            gather_s: sampled.elapsed().as_secs_f64(),
        };
        let done = self.lock().done.take();
        if let Some(d) = done {
            d(Ok(out));
        }
        Ok(())
    }
}

/// One type's fetched rows, appended to `out` in the order of `f.ids`.
fn in_order(src: &Source, t: usize, f: &Fetch, out: &mut Vec<f32>) -> Result<()> {
    let dim = src.dims[t];
    let local_rows = src.graph.node_types()[t].features.is_some();
    let missing = || TrainError::Internal("a fetch part is missing".into());
    // Local rows are read chunk by chunk where they lie: no copy of them all first.
    let (mut chunk, mut row) = (0usize, 0usize);
    let mut next = vec![0usize; f.remote.len()];
    for &v in &f.ids {
        let o = src.owner(t, v);
        if o == src.part as usize && local_rows {
            let c = f
                .local
                .get(chunk)
                .and_then(Option::as_deref)
                .ok_or_else(missing)?;
            out.extend_from_slice(
                c.get(row * dim..(row + 1) * dim)
                    .ok_or_else(|| TrainError::Internal("too few local rows".into()))?,
            );
            row += 1;
            if row * dim >= c.len() {
                chunk += 1;
                row = 0;
            }
        } else {
            let rows = f.remote.get(o).and_then(Option::as_ref).ok_or_else(|| {
                TrainError::Protocol(format!("no rows pulled for type {t} from partition {o}"))
            })?;
            let row = rows
                .0
                .get(next[o] * dim * 4..(next[o] + 1) * dim * 4)
                .ok_or_else(|| TrainError::Protocol("too few pulled rows".into()))?;
            crate::distributed::rows::append_row(out, row);
            next[o] += 1;
        }
    }
    Ok(())
}

/// Type `t`'s picks over all of `nodes` (in order), from the local chunks
/// (over its local nodes, in order) and the owners' answers (over theirs).
/// The owners' answers come from the network: their shape is checked.
fn merge_type(
    src: &Source,
    t: usize,
    nodes: &[u32],
    local: &[Option<Vec<RelationPicks>>],
    remote: &[Option<Vec<Vec<RelationPicks>>>],
) -> Result<Vec<RelationPicks>> {
    let g = &src.graph;
    let rels: Vec<RelationId> = g.in_relations(NodeTypeId(t as u32)).to_vec();
    let bad = |m: String| TrainError::Protocol(m);
    let local: Vec<&Vec<RelationPicks>> = local
        .iter()
        .map(|c| {
            c.as_ref()
                .ok_or_else(|| bad("a pick part is missing".into()))
        })
        .collect::<Result<_>>()?;
    // How many of `nodes` each owner was asked for.
    let mut asked = vec![0usize; remote.len()];
    for &v in nodes {
        if let Some(a) = asked.get_mut(src.owner(t, v)) {
            *a += 1;
        }
    }
    asked[src.part as usize] = 0;
    for (o, &n) in asked.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let answer = remote[o].as_ref().and_then(|a| a.get(t)).ok_or_else(|| {
            bad(format!(
                "{} sent no picks for type {t}",
                names::sampler(o as u32)
            ))
        })?;
        let ok = answer.len() == rels.len()
            && answer.iter().zip(&rels).all(|(p, r)| {
                p.relation == *r
                    && p.offsets.len() == n + 1
                    && p.offsets.first() == Some(&0)
                    && p.offsets.windows(2).all(|w| w[0] <= w[1])
                    && p.offsets.last().map(|&e| e as usize) == Some(p.picks.len())
            });
        if !ok {
            return Err(bad(format!(
                "{} sent malformed picks",
                names::sampler(o as u32)
            )));
        }
    }
    let mut out = Vec::with_capacity(rels.len());
    for (j, &rel) in rels.iter().enumerate() {
        let mut offsets = Vec::with_capacity(nodes.len() + 1);
        offsets.push(0u32);
        let mut picks = Vec::new();
        let (mut chunk, mut row) = (0usize, 0usize);
        let mut next = vec![0usize; remote.len()];
        for &v in nodes {
            let o = src.owner(t, v);
            let (p, i) = if o == src.part as usize {
                let p = local
                    .get(chunk)
                    .and_then(|c| c.get(j))
                    .ok_or_else(|| bad("too few local picks".into()))?;
                let i = row;
                row += 1;
                if row + 1 >= p.offsets.len() {
                    chunk += 1;
                    row = 0;
                }
                (p, i)
            } else {
                let p = &remote[o]
                    .as_ref()
                    .ok_or_else(|| bad("no remote picks".into()))?[t][j];
                next[o] += 1;
                (p, next[o] - 1)
            };
            picks.extend_from_slice(&p.picks[p.offsets[i] as usize..p.offsets[i + 1] as usize]);
            offsets.push(picks.len() as u32);
        }
        out.push(RelationPicks {
            relation: rel,
            offsets,
            picks,
        });
    }
    Ok(out)
}
