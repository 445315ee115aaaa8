//! A trainer's inputs: its share of a batch sampled (remote frontier nodes by
//! their owners' samplers), and input rows gathered (local rows read here,
//! the rest pulled from their owners' stores, cached rows from the device
//! cache), and the device cache itself, built once per process.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use candle_core::{DType, Tensor, Var};
use futures_util::future::join_all;
use graphs::link::{ExcludeEdges, NoExclusion, StepEdges};
use graphs::{GraphError, MiniBatch, RelationFilter, RelationPicks, Sampler};
use models::rgcn::PerType;
use runtime::{ActorRef, ByteVec};

use super::super::messages::{Pull, SampleReq};
use super::super::names;
use super::{Ctx, Prepared, Rows};
use crate::cache::rows::Lookup;
use crate::cache::{hotness, profile, CachePolicy, DeviceCache};
use crate::distributed::decode_f32;
use crate::error::{Result, TrainError};
use crate::task::link::LinkTask;

/// Rows per pull when a cache is filled.
const FILL_ROWS: usize = 16 << 10;

impl Ctx<'_> {
    /// Samples step `step`'s share of `batch` and gathers its plain features.
    pub(super) fn prepare(&self, seed: u64, epoch: u64, step: u64, batch: &[u32], target: usize) -> Result<Prepared> {
        let seeds = self.my_seeds(target, batch);
        let share = seeds.len() as f64 / batch.len().max(1) as f64;
        if seeds.is_empty() {
            return Ok(Prepared { seeds, share, link: None, mb: None, features: Vec::new(), sample_s: 0.0, gather_s: 0.0 });
        }
        let t = Instant::now();
        let mb = self.sample(seed, epoch, step, &seeds)?;
        let sample_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let features = self.gather(&mb.blocks[0].src, Rows::Features, None)?;
        Ok(Prepared { seeds, share, link: None, mb: Some(mb), features, sample_s, gather_s: t.elapsed().as_secs_f64() })
    }

    /// Link prediction: samples the endpoints and negatives of this
    /// trainer's edges `ids` of step `step`, the step's training edges left
    /// out of every neighbourhood (here and at the owners), and gathers their
    /// plain features.
    pub(super) fn prepare_link(&self, task: &LinkTask, epoch: u64, step: u64, ids: &[u32]) -> Result<Prepared> {
        if ids.is_empty() {
            return Ok(Prepared { seeds: Vec::new(), share: 0.0, link: None, mb: None, features: Vec::new(), sample_s: 0.0, gather_s: 0.0 });
        }
        let t = Instant::now();
        let batch = task.batch(&self.s.graph, epoch, ids);
        let mb = self.sample_typed(self.s.cfg.seed, epoch, step, &batch.seeds, Some(&task.exclusion(epoch, step)))?;
        let sample_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let features = self.gather(&mb.blocks[0].src, Rows::Features, None)?;
        Ok(Prepared { seeds: ids.to_vec(), share: 0.0, link: Some(batch), mb: Some(mb), features, sample_s, gather_s: t.elapsed().as_secs_f64() })
    }

    /// Samples seeds of any types (owned here) with `excluded` edges left out,
    /// asking owners for the picks of remote frontier nodes under the same exclusions.
    pub(super) fn sample_typed(&self, seed: u64, epoch: u64, step: u64, seeds: &[Vec<u32>], excluded: Option<&StepEdges>) -> Result<MiniBatch> {
        let g = &*self.s.graph;
        let mut sampler = Sampler::new(g, &self.s.cfg.fanouts, seed)?;
        let owners = &self.s.owners;
        let part = self.s.part;
        let exclude = excluded.is_some();
        let remote = |layer: usize, fanout: usize, away: &[Vec<u32>]| self.remote_picks(seed, epoch, step, layer, fanout, away, exclude);
        let ex: &dyn ExcludeEdges = match excluded {
            Some(x) => x,
            None => &NoExclusion,
        };
        Ok(sampler.sample_seeds(epoch, step, seeds, ex, &RelationFilter::All, |t, v| owners[t][v as usize] as u32 == part, remote)?)
    }

    /// Samples `seeds` (owned here), asking owners for the picks of remote frontier nodes.
    pub(super) fn sample(&self, seed: u64, epoch: u64, step: u64, seeds: &[u32]) -> Result<MiniBatch> {
        let g = &*self.s.graph;
        if !self.uses_neighbors {
            return crate::epoch::sample(&mut Sampler::new(g, &self.s.cfg.fanouts, seed)?, false, epoch, step, seeds);
        }
        let mut sampler = Sampler::new(g, &self.s.cfg.fanouts, seed)?;
        let owners = &self.s.owners;
        let part = self.s.part;
        let remote = |layer: usize, fanout: usize, away: &[Vec<u32>]| self.remote_picks(seed, epoch, step, layer, fanout, away, false);
        Ok(sampler.sample_with(epoch, step, seeds, &RelationFilter::All, |t, v| owners[t][v as usize] as u32 == part, remote)?)
    }

    /// The owners' picks for remote frontier nodes `away`; `exclude`: they
    /// leave the link-prediction step's training edges out.
    #[allow(clippy::too_many_arguments)] // the sampling key's parts, flat
    pub(super) fn remote_picks(&self, seed: u64, epoch: u64, step: u64, layer: usize, fanout: usize, away: &[Vec<u32>], exclude: bool) -> graphs::Result<Vec<Vec<RelationPicks>>> {
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
            let msg = SampleReq { seed, epoch, step, layer: layer as u32, fanout: fanout as u32, nodes: std::mem::take(&mut reqs[o]), exclude };
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
    pub(super) async fn pull(&self, store: &ActorRef, ids: &[u32], after: Option<u64>) -> std::result::Result<ByteVec, String> {
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
    pub(super) fn gathers(&self, ty: usize, rows: Rows) -> bool {
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
    pub(super) fn gather(&self, src: &[Vec<u32>], rows: Rows, after: Option<u64>) -> Result<PerType> {
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
    pub(super) fn build_cache(&self) -> Result<Option<DeviceCache>> {
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
            let seeds = self.my_seeds(target, batch);
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
