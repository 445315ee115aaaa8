//! The miss-penalty-aware device cache (Heta §6), one per trainer or raf
//! worker device. Before training it pre-samples a few epochs to count visits
//! per node, measures each node type's miss penalty, splits `cache_bytes`
//! between types in proportion to visits × penalty (or visits alone), and
//! fills each type's share with its most visited rows.
//!
//! Plain feature rows are read-only and may be cached on every device.
//! Learnable rows are cached with their Adam state by the one device that
//! updates them (a single process, or the raf worker holding the table), so
//! writes need no invalidation and a cached run computes exactly what an
//! uncached one does. Data-parallel trainers cache feature rows only: their
//! learnable rows belong to the embedding stores, which every trainer reads.

pub mod alloc;
pub mod hotness;
pub mod manager;
pub mod profile;
pub mod rows;

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use graphs::{HetGraph, MiniBatch};
use models::embedding::EmbeddingTable;
use models::model::FeatureGather;
use models::optim::AdamConfig;
use models::rgcn::PerType;
use models::Model;
use serde::{Deserialize, Serialize};

pub use alloc::CachePolicy;
use alloc::Demand;
use hotness::Visits;
use rows::{learnable_row_bytes, LearnableCache, RowCache};

use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};

/// One node type's cache figures in the run report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheTypeReport {
    /// Fraction of the cache budget the type's rows take.
    pub share: f64,
    /// Rows cached (summed over devices).
    pub rows: u64,
    /// Cache bytes they take (learnable rows: value, Adam moments and step count).
    pub bytes: u64,
    /// Hits over lookups of the training steps.
    pub hit_rate: f64,
    /// Rows of training batches served by the cache.
    pub hits: u64,
    /// Rows of training batches looked up.
    pub lookups: u64,
    /// What a miss costs more than a hit, per cache byte, in microseconds
    /// (measured; mean over devices): the allocation's weight per visit.
    pub miss_penalty_us_per_byte: f64,
    /// Measured cost of a miss per cache byte (microseconds): the fetch, and
    /// for learnable rows the write-back of the row and its Adam moments.
    pub miss_us_per_byte: f64,
    /// Measured cost of a hit per cache byte (microseconds).
    pub hit_us_per_byte: f64,
    /// Visits counted by pre-sampling.
    pub visits: u64,
    /// Whether the rows are learnable embeddings.
    pub learnable: bool,
    /// Why the type is not cached, when it cannot be. (No `skip_serializing_if`:
    /// the report also travels in bincode, which needs every field.)
    #[serde(default)]
    pub note: Option<String>,
}

/// Merges the reports of several devices, each with `budget` bytes.
pub fn merge_reports(
    reports: &[BTreeMap<String, CacheTypeReport>],
    budget: u64,
) -> BTreeMap<String, CacheTypeReport> {
    let mut out: BTreeMap<String, CacheTypeReport> = BTreeMap::new();
    let mut measured: BTreeMap<String, Vec<[f64; 3]>> = BTreeMap::new();
    for r in reports {
        for (name, t) in r {
            let o = out.entry(name.clone()).or_insert_with(|| CacheTypeReport {
                learnable: t.learnable,
                note: t.note.clone(),
                ..CacheTypeReport::default()
            });
            o.rows += t.rows;
            o.bytes += t.bytes;
            o.hits += t.hits;
            o.lookups += t.lookups;
            o.visits += t.visits;
            if t.miss_us_per_byte > 0.0 {
                measured.entry(name.clone()).or_default().push([
                    t.miss_penalty_us_per_byte,
                    t.miss_us_per_byte,
                    t.hit_us_per_byte,
                ]);
            }
        }
    }
    let total = (budget * reports.len() as u64).max(1) as f64;
    for (name, o) in &mut out {
        o.share = o.bytes as f64 / total;
        o.hit_rate = o.hits as f64 / o.lookups.max(1) as f64;
        if let Some(p) = measured.get(name) {
            let mean = |i: usize| p.iter().map(|m| m[i]).sum::<f64>() / p.len() as f64;
            (
                o.miss_penalty_us_per_byte,
                o.miss_us_per_byte,
                o.hit_us_per_byte,
            ) = (mean(0), mean(1), mean(2));
        }
    }
    out
}

/// A node type the cache may hold, with its measured miss penalty.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Node type.
    pub ty: usize,
    /// Learnable rows (cached with their Adam state) rather than plain features.
    pub learnable: bool,
    /// Row width.
    pub dim: usize,
    /// Seconds a miss costs per cache byte.
    pub miss: f64,
    /// Seconds a hit costs per cache byte.
    pub hit: f64,
}

impl Candidate {
    /// What a miss costs more than a hit, per cache byte: see [`penalty`].
    pub fn penalty(&self) -> f64 {
        penalty(self.miss, self.hit)
    }

    /// Cache bytes one row takes.
    pub fn row_bytes(&self) -> u64 {
        if self.learnable {
            learnable_row_bytes(self.dim)
        } else {
            (self.dim * 4) as u64
        }
    }
}

/// Timings closer than this (relative) are taken as equal: noise must not
/// decide where the cache goes.
const NOISE: f64 = 0.1;

/// What a miss costs more than a hit (seconds per cache byte), zero unless
/// the miss is measurably slower.
pub fn penalty(miss: f64, hit: f64) -> f64 {
    if miss > hit * (1.0 + NOISE) {
        miss - hit
    } else {
        0.0
    }
}

/// The rows to cache per candidate (same order): each type's share of
/// `budget` filled with its most visited rows.
pub fn plan(
    policy: CachePolicy,
    budget: u64,
    visits: &Visits,
    candidates: &[Candidate],
) -> Vec<Vec<u32>> {
    let ranked: Vec<Vec<u32>> = candidates.iter().map(|c| visits.ranked(c.ty)).collect();
    let demands: Vec<Demand> = candidates
        .iter()
        .zip(&ranked)
        .map(|(c, r)| Demand {
            visits: visits.total(c.ty),
            visited_rows: r.len() as u64,
            row_bytes: c.row_bytes(),
            penalty: c.penalty(),
        })
        .collect();
    let rows = alloc::allocate(policy, budget, &demands);
    ranked
        .into_iter()
        .zip(rows)
        .map(|(mut r, n)| {
            r.truncate(n as usize);
            r
        })
        .collect()
}

/// Cached plain feature rows: read-only, shared with the threads that gather ahead of training.
#[derive(Default)]
pub struct FeatureCache {
    types: Vec<Option<RowCache>>,
}

impl FeatureCache {
    /// Type `ty`'s cached rows, if any.
    pub fn get(&self, ty: usize) -> Option<&RowCache> {
        self.types.get(ty).and_then(Option::as_ref)
    }

    /// Feature rows of `nodes[t]` for every type `fg` wants (as
    /// [`FeatureGather::gather`]), the cached ones from the cache; `count`:
    /// add the lookups to the hit rates.
    pub fn gather(
        &self,
        fg: &FeatureGather,
        g: &HetGraph,
        nodes: &[Vec<u32>],
        count: bool,
    ) -> Result<PerType> {
        let mut out = self.gather_uncached(fg, g, nodes)?;
        self.fill_cached(fg, g, nodes, &mut out, count)?;
        Ok(out)
    }

    /// Whether the cache serves type `t`'s rows to `fg`.
    fn serves(&self, fg: &FeatureGather, g: &HetGraph, t: usize) -> bool {
        self.get(t).is_some() && fg.wants(t) && g.node_types()[t].features.is_some()
    }

    /// [`FeatureCache::gather`] of the types the cache does not serve (as
    /// `fg` gathers them); `None` for those it serves. The part of a batch a
    /// prefetch thread can make without touching the device.
    pub fn gather_uncached(
        &self,
        fg: &FeatureGather,
        g: &HetGraph,
        nodes: &[Vec<u32>],
    ) -> Result<PerType> {
        nodes
            .iter()
            .enumerate()
            .map(|(t, ids)| {
                if self.serves(fg, g, t) && !ids.is_empty() {
                    Ok(None)
                } else {
                    Ok(fg.gather_type(g, t, ids)?)
                }
            })
            .collect()
    }

    /// Fills in the rows of the types the cache serves, where `inputs` has none.
    pub fn fill_cached(
        &self,
        fg: &FeatureGather,
        g: &HetGraph,
        nodes: &[Vec<u32>],
        inputs: &mut PerType,
        count: bool,
    ) -> Result<()> {
        for (t, ids) in nodes.iter().enumerate() {
            let (Some(c), Some(f)) = (self.get(t), &g.node_types()[t].features) else {
                continue;
            };
            if !fg.wants(t) || ids.is_empty() || inputs.get(t).is_some_and(Option::is_some) {
                continue;
            }
            let lk = c.lookup(ids, count);
            inputs[t] = Some(c.assemble_from(
                &lk,
                |j| f.row(lk.miss_ids[j] as usize),
                fg.dtype(),
                fg.device(),
            )?);
        }
        Ok(())
    }
}

/// A device's cache: feature rows (shareable) and learnable rows it owns.
pub struct DeviceCache {
    /// Cached feature rows.
    pub features: Arc<FeatureCache>,
    learnable: Vec<Option<LearnableCache>>,
    /// Per node type (by index): name, visits, measured penalty, whether learnable, note.
    planned: Vec<Option<Planned>>,
    budget: u64,
}

#[derive(Clone, Debug)]
struct Planned {
    name: String,
    visits: u64,
    /// Miss and hit seconds per cache byte.
    miss: f64,
    hit: f64,
    learnable: bool,
    note: Option<String>,
}

impl DeviceCache {
    /// Caches, for each candidate, the rows chosen for it (`plan`, in
    /// candidate order): feature values read by `feature_rows(ty, ids)`,
    /// learnable rows taken from `tables`.
    pub fn new(
        g: &HetGraph,
        budget: u64,
        visits: &Visits,
        plan: Vec<(Candidate, Vec<u32>)>,
        tables: &[Option<EmbeddingTable>],
        device: &Device,
        mut feature_rows: impl FnMut(usize, &[u32]) -> Result<Vec<f32>>,
    ) -> Result<DeviceCache> {
        let n = g.node_types().len();
        let mut features: Vec<Option<RowCache>> = (0..n).map(|_| None).collect();
        let mut learnable: Vec<Option<LearnableCache>> = (0..n).map(|_| None).collect();
        let mut planned: Vec<Option<Planned>> = vec![None; n];
        for (c, ids) in plan {
            let nt = &g.node_types()[c.ty];
            planned[c.ty] = Some(Planned {
                name: nt.name.clone(),
                visits: visits.total(c.ty),
                miss: c.miss,
                hit: c.hit,
                learnable: c.learnable,
                note: None,
            });
            if ids.is_empty() {
                continue;
            }
            if c.learnable {
                let table = tables.get(c.ty).and_then(Option::as_ref).ok_or_else(|| {
                    TrainError::Config(format!(
                        "cache: node type {} has no embedding table here",
                        nt.name
                    ))
                })?;
                learnable[c.ty] = Some(LearnableCache::from_table(table, ids, device)?);
            } else {
                let values = feature_rows(c.ty, &ids)?;
                features[c.ty] = Some(RowCache::new(
                    nt.count as usize,
                    ids,
                    c.dim,
                    values,
                    device,
                )?);
            }
        }
        Ok(DeviceCache {
            features: Arc::new(FeatureCache { types: features }),
            learnable,
            planned,
            budget,
        })
    }

    /// Notes that type `ty` (named `name`, visited `visits` times) is not cached, and why.
    pub fn not_cached(&mut self, ty: usize, name: &str, visits: u64, learnable: bool, why: &str) {
        if let Some(p) = self.planned.get_mut(ty) {
            *p = Some(Planned {
                name: name.to_string(),
                visits,
                miss: 0.0,
                hit: 0.0,
                learnable,
                note: Some(why.to_string()),
            });
        }
    }

    /// The budget the cache was planned for.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The device bytes the cached rows take (never more than the budget).
    pub fn bytes(&self) -> u64 {
        self.features
            .types
            .iter()
            .flatten()
            .map(RowCache::bytes)
            .sum::<u64>()
            + self
                .learnable
                .iter()
                .flatten()
                .map(LearnableCache::bytes)
                .sum::<u64>()
    }

    /// [`Model::gather_inputs`] with the rows the cache holds read from it.
    pub fn gather_inputs(
        &self,
        model: &Model,
        g: &HetGraph,
        nodes: &[Vec<u32>],
        count: bool,
    ) -> Result<PerType> {
        let mut inputs = self
            .features
            .gather(&model.feature_gather(), g, nodes, count)?;
        self.gather_embeddings(model, nodes, &mut inputs, count)?;
        Ok(inputs)
    }

    /// Fills the learnable rows of `inputs` (as gradient leaves), the cached
    /// ones from the cache; the model's [`Model::gather_embeddings`] otherwise.
    pub fn gather_embeddings(
        &self,
        model: &Model,
        nodes: &[Vec<u32>],
        inputs: &mut PerType,
        count: bool,
    ) -> Result<()> {
        let fg = model.feature_gather();
        for (t, ids) in nodes.iter().enumerate() {
            let (Some(c), Some(table)) = (
                self.learnable.get(t).and_then(Option::as_ref),
                model.embeddings.get(t).and_then(Option::as_ref),
            ) else {
                continue;
            };
            if ids.is_empty() || inputs[t].is_some() || !fg.wants(t) {
                continue;
            }
            let lk = c.rows().lookup(ids, count);
            let d = table.dim;
            let row = |j: usize| {
                let v = lk.miss_ids[j] as usize;
                &table.data[v * d..(v + 1) * d]
            };
            let x = c
                .rows()
                .assemble_from(&lk, row, model.dtype(), model.device())?;
            inputs[t] = Some(candle_core::Var::from_tensor(&x)?.into_inner());
        }
        Ok(model.gather_embeddings(nodes, inputs)?)
    }

    /// One Adam step for rows `ids` (distinct) of type `ty` with gradient
    /// rows `grads` (row-major): cached rows in the cache, the rest in `table`.
    pub fn adam_rows(
        &mut self,
        ty: usize,
        table: &mut EmbeddingTable,
        ids: &[u32],
        grads: &[f32],
        cfg: &AdamConfig,
    ) -> Result<()> {
        let d = table.dim;
        if grads.len() != ids.len() * d {
            return Err(TrainError::Config(format!(
                "{} gradient values for {} rows of width {d}",
                grads.len(),
                ids.len()
            )));
        }
        // Both parts update their rows in parallel, as an uncached run does.
        let Some(c) = self.learnable.get_mut(ty).and_then(Option::as_mut) else {
            return Ok(table.adam_rows(ids, grads, cfg)?);
        };
        let lk = c.rows().lookup(ids, false);
        c.adam(&lk.hit_slot, grads, &lk.hit_pos, cfg)?;
        table.adam_rows_picked(&lk.miss_ids, grads, &lk.miss_pos, cfg)?;
        Ok(())
    }

    /// [`DeviceCache::adam_rows`] with the gradient as a `[ids.len(), dim]` tensor.
    pub fn sparse_adam(
        &mut self,
        ty: usize,
        table: &mut EmbeddingTable,
        ids: &[u32],
        grad: &Tensor,
        cfg: &AdamConfig,
    ) -> Result<()> {
        if grad.device().is_cpu() {
            return models::ops::with_f32(grad, |g| self.adam_rows(ty, table, ids, g, cfg))?;
        }
        let Some(c) = self.learnable.get_mut(ty).and_then(Option::as_mut) else {
            return Ok(table.sparse_adam(ids, grad, cfg)?);
        };
        // On a GPU the cached rows' gradients stay there; only the misses' come to the host table.
        let lk = c.rows().lookup(ids, false);
        c.adam_tensor(&lk.hit_slot, grad, &lk.hit_pos, cfg)?;
        if !lk.miss_ids.is_empty() {
            let misses = grad.index_select(
                &Tensor::from_slice(&lk.miss_pos, lk.miss_pos.len(), grad.device())?,
                0,
            )?;
            table.sparse_adam(&lk.miss_ids, &misses, cfg)?;
        }
        Ok(())
    }

    /// Copies the cached learnable rows into the model's tables, which then
    /// hold every row's current value (before checkpoints, evaluation and the end).
    pub fn write_back(&self, model: &mut Model) -> Result<()> {
        for (c, table) in self.learnable.iter().zip(model.embeddings.iter_mut()) {
            if let (Some(c), Some(table)) = (c, table) {
                c.write_back(table)?;
            }
        }
        Ok(())
    }

    /// Per node type figures so far (one device).
    pub fn report(&self) -> BTreeMap<String, CacheTypeReport> {
        let mut out = BTreeMap::new();
        for (ty, p) in self.planned.iter().enumerate() {
            let Some(p) = p else { continue };
            let (rows, bytes, (hits, lookups)) = match (
                self.features.get(ty),
                self.learnable.get(ty).and_then(Option::as_ref),
            ) {
                (Some(c), _) => (c.rows() as u64, c.bytes(), c.counts()),
                (_, Some(c)) => (c.rows().rows() as u64, c.bytes(), c.rows().counts()),
                _ => (0, 0, (0, 0)),
            };
            out.insert(
                p.name.clone(),
                CacheTypeReport {
                    share: bytes as f64 / self.budget.max(1) as f64,
                    rows,
                    bytes,
                    hit_rate: hits as f64 / lookups.max(1) as f64,
                    hits,
                    lookups,
                    miss_penalty_us_per_byte: penalty(p.miss, p.hit) * 1e6,
                    miss_us_per_byte: p.miss * 1e6,
                    hit_us_per_byte: p.hit * 1e6,
                    visits: p.visits,
                    learnable: p.learnable,
                    note: p.note.clone(),
                },
            );
        }
        out
    }

    /// One line per cached type, for progress output.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .report()
            .iter()
            .map(|(name, r)| match &r.note {
                Some(n) => format!("{name}: {n}"),
                None => format!(
                    "{name} {} rows ({:.0}%; miss {:.2e}, hit {:.2e} us/B)",
                    r.rows,
                    r.share * 100.0,
                    r.miss_us_per_byte,
                    r.hit_us_per_byte
                ),
            })
            .collect();
        let mut line = format!(
            "cache {}/{} bytes: {}",
            self.bytes(),
            self.budget,
            parts.join(", ")
        );
        if self.bytes() == 0 && self.planned.iter().flatten().any(|p| p.note.is_none()) {
            line += ". Nothing cached: on this device a hit costs as much as a miss (the cache and the rows share host memory); cache_policy = \"hotness\" caches by visits regardless";
        }
        line
    }
}

/// Profiles feature type `ty` (of `count` nodes) on the rows `probe`, whose
/// values are `values`: `miss` fetches them the uncached way; a hit serves
/// them from a scratch cache holding all of them, as `dtype` on `device`.
pub fn feature_candidate(
    ty: usize,
    count: usize,
    probe: &[u32],
    values: Vec<f32>,
    (dtype, device): (DType, &Device),
    miss: impl FnMut() -> Result<()>,
) -> Result<Candidate> {
    let dim = values.len() / probe.len().max(1);
    let scratch = RowCache::new(count, probe.to_vec(), dim, values, device)?;
    let hit = || {
        let lk = scratch.lookup(probe, false);
        std::hint::black_box(scratch.assemble_from(&lk, |_| &[], dtype, device)?);
        Ok(())
    };
    let (miss, hit) = profile::compare(probe.len(), (dim * 4) as u64, miss, hit)?;
    Ok(Candidate {
        ty,
        learnable: false,
        dim,
        miss,
        hit,
    })
}

/// Builds the cache of a device that reads its feature rows from `g` and
/// owns the learnable tables of `model` (a single process, a raf worker):
/// pre-samples with `sample(epoch, step, seeds)` over `train`, measures miss
/// penalties, plans and fills. `None` when the configuration asks for no cache.
pub fn build_local(
    t: &TrainingConfig,
    g: &HetGraph,
    model: &Model,
    train: &[u32],
    mut sample: impl FnMut(u64, u64, &[u32]) -> Result<MiniBatch>,
) -> Result<Option<DeviceCache>> {
    let budget = t.cache_bytes.0;
    if t.cache_policy == CachePolicy::None || budget == 0 {
        return Ok(None);
    }
    let sizes: Vec<usize> = g.node_types().iter().map(|nt| nt.count as usize).collect();
    if let Some(cache) = whole(t.cache_policy, budget, g, model)? {
        return Ok(Some(cache));
    }
    let visits = hotness::presample(
        &sizes,
        train,
        t.batch,
        &crate::epoch::plan::SamplingPlan::of(t),
        t.cache_presample_epochs,
        |e, s, b| Ok(sample(e, s, b)?.blocks.swap_remove(0).src),
    )?;
    let batches = (t.cache_presample_epochs * train.len().div_ceil(t.batch.max(1)) as u64).max(1);
    let fg = model.feature_gather();
    let (device, dtype) = (model.device().clone(), model.dtype());
    let mut candidates = Vec::new();
    for (ty, nt) in g.node_types().iter().enumerate() {
        let ranked = visits.ranked(ty);
        if ranked.is_empty() || !fg.wants(ty) {
            continue;
        }
        let probe = profile::probe_ids(&ranked, (visits.total(ty) / batches) as usize);
        if let Some(f) = &nt.features {
            let values: Vec<f32> = probe
                .iter()
                .flat_map(|&v| f.row(v as usize).iter().copied())
                .collect();
            let miss = || {
                std::hint::black_box(fg.gather_type(g, ty, &probe)?);
                Ok(())
            };
            candidates.push(feature_candidate(
                ty,
                nt.count as usize,
                &probe,
                values,
                (dtype, &device),
                miss,
            )?);
        } else if let Some(table) = model.embeddings.get(ty).and_then(Option::as_ref) {
            let dim = table.dim;
            let bytes = learnable_row_bytes(dim);
            // A miss reads the rows from the table and writes them back after
            // the update; a hit reads and updates them in the cache (scratch
            // copies of the probed rows both: the model is not touched).
            let mut rows = profile::Scratch::new(probe.len(), dim);
            let n = probe.len();
            let values: Vec<f32> = probe
                .iter()
                .flat_map(|&v| {
                    table.data[v as usize * dim..(v as usize + 1) * dim]
                        .iter()
                        .copied()
                })
                .collect();
            let scratch_table = EmbeddingTable {
                name: table.name.clone(),
                rows: n,
                dim,
                data: values,
                m: vec![0.0; n * dim],
                v: vec![0.0; n * dim],
                steps: vec![0; n],
            };
            let local: Vec<u32> = (0..n as u32).collect();
            let mut scratch = LearnableCache::from_table(&scratch_table, local.clone(), &device)?;
            let cfg = AdamConfig::with_lr(0.0);
            let (miss, hit) = profile::compare(
                n,
                bytes,
                || {
                    let x = table.gather(&probe, dtype, &device)?;
                    rows.write_back(&x)
                },
                || {
                    let lk = scratch.rows().lookup(&local, false);
                    let x = scratch.rows().assemble_from(&lk, |_| &[], dtype, &device)?;
                    let grads: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
                    scratch.adam(&lk.hit_slot, &grads, &lk.hit_pos, &cfg)
                },
            )?;
            candidates.push(Candidate {
                ty,
                learnable: true,
                dim,
                miss,
                hit,
            });
        }
    }
    let chosen = plan(t.cache_policy, budget, &visits, &candidates);
    let planned = candidates.into_iter().zip(chosen).collect();
    let rows = |ty: usize, ids: &[u32]| -> Result<Vec<f32>> {
        let f = g.node_types()[ty]
            .features
            .as_ref()
            .ok_or_else(|| TrainError::Config("cache: a feature type without features".into()))?;
        Ok(ids
            .iter()
            .flat_map(|&v| f.row(v as usize).iter().copied())
            .collect())
    };
    Ok(Some(DeviceCache::new(
        g,
        budget,
        &visits,
        planned,
        &model.embeddings,
        &device,
        rows,
    )?))
}

/// What a cache holding every row of every type the model reads takes: no
/// choice to make, so no pre-sampling and no profiling.
const WHOLE_NOTE: &str = "every row cached (the budget holds them all: no pre-sampling)";

/// Whether a cache of `budget` under `policy` takes every row of every type
/// `model` reads at once, with no pre-sampling: when they all fit, on a GPU,
/// or on the CPU under `hotness`. On the CPU `miss-penalty` still measures,
/// since there a hit costs what a miss does and copying every row would only
/// double the host memory they take.
pub fn takes_every_row(policy: CachePolicy, budget: u64, g: &HetGraph, model: &Model) -> bool {
    if policy == CachePolicy::None || (policy != CachePolicy::Hotness && model.device().is_cpu()) {
        return false;
    }
    let candidates = every_type(g, model);
    !candidates.is_empty()
        && candidates
            .iter()
            .map(|c| u64::from(g.node_types()[c.ty].count) * c.row_bytes())
            .sum::<u64>()
            <= budget
}

/// Every type `model` reads, as an unmeasured candidate.
fn every_type(g: &HetGraph, model: &Model) -> Vec<Candidate> {
    let fg = model.feature_gather();
    let mut candidates = Vec::new();
    for (ty, nt) in g.node_types().iter().enumerate() {
        if nt.count == 0 || !fg.wants(ty) {
            continue;
        }
        let (learnable, dim) = match (
            &nt.features,
            model.embeddings.get(ty).and_then(Option::as_ref),
        ) {
            (Some(f), _) => (false, f.dim()),
            (None, Some(table)) => (true, table.dim),
            (None, None) => continue,
        };
        candidates.push(Candidate {
            ty,
            learnable,
            dim,
            miss: 0.0,
            hit: 0.0,
        });
    }
    candidates
}

/// The cache of every row of every type `model` reads (feature rows and
/// learnable rows with their Adam state), when [`takes_every_row`].
fn whole(
    policy: CachePolicy,
    budget: u64,
    g: &HetGraph,
    model: &Model,
) -> Result<Option<DeviceCache>> {
    if !takes_every_row(policy, budget, g, model) {
        return Ok(None);
    }
    let candidates = every_type(g, model);
    let sizes: Vec<usize> = g.node_types().iter().map(|nt| nt.count as usize).collect();
    let plan = candidates
        .into_iter()
        .map(|c| {
            let all = (0..g.node_types()[c.ty].count).collect();
            (c, all)
        })
        .collect();
    let rows = |ty: usize, ids: &[u32]| -> Result<Vec<f32>> {
        let f = g.node_types()[ty]
            .features
            .as_ref()
            .ok_or_else(|| TrainError::Config("cache: a feature type without features".into()))?;
        Ok(ids
            .iter()
            .flat_map(|&v| f.row(v as usize).iter().copied())
            .collect())
    };
    let mut cache = DeviceCache::new(
        g,
        budget,
        &hotness::Visits::new(&sizes),
        plan,
        &model.embeddings,
        model.device(),
        rows,
    )?;
    for p in cache.planned.iter_mut().flatten() {
        p.note = Some(WHOLE_NOTE.into());
    }
    Ok(Some(cache))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_fill_each_share_with_the_most_visited_rows() {
        let mut v = Visits::new(&[6, 4]);
        v.add(&[vec![5, 5, 5, 2, 2, 0], vec![1, 3]]);
        // Type 0: 4-byte rows, type 1: learnable width 1 (16 bytes); hotness by visits 6 : 2.
        let cands = [
            Candidate {
                ty: 0,
                learnable: false,
                dim: 1,
                miss: 0.0,
                hit: 0.0,
            },
            Candidate {
                ty: 1,
                learnable: true,
                dim: 1,
                miss: 0.0,
                hit: 0.0,
            },
        ];
        let chosen = plan(CachePolicy::Hotness, 24, &v, &cands);
        assert_eq!(chosen, vec![vec![5, 2, 0], vec![]], "type 0 takes its 3 visited rows (12 of its 18 bytes); the 12 left cannot hold a 16-byte row");
        assert_eq!(
            plan(CachePolicy::Hotness, 28, &v, &cands),
            vec![vec![5, 2, 0], vec![1]],
            "the rest goes to type 1"
        );
        // Miss-penalty: no measurable saving, no rows.
        assert_eq!(
            plan(CachePolicy::MissPenalty, 1000, &v, &cands),
            vec![Vec::<u32>::new(), vec![]]
        );
        assert_eq!(
            (penalty(1.05, 1.0), penalty(2.0, 1.0), penalty(1.0, 2.0)),
            (0.0, 1.0, 0.0)
        );
    }

    #[test]
    fn device_reports_merge_into_run_figures() {
        let one = |rows, bytes, hits, lookups, miss| CacheTypeReport {
            rows,
            bytes,
            hits,
            lookups,
            visits: 10,
            miss_us_per_byte: miss,
            hit_us_per_byte: miss / 4.0,
            miss_penalty_us_per_byte: miss * 0.75,
            ..CacheTypeReport::default()
        };
        let a = BTreeMap::from([("paper".to_string(), one(10, 400, 30, 100, 2.0))]);
        let b = BTreeMap::from([
            ("paper".to_string(), one(20, 800, 10, 100, 4.0)),
            ("author".to_string(), one(0, 0, 0, 0, 0.0)),
        ]);
        let m = merge_reports(&[a, b], 1000);
        let p = &m["paper"];
        assert_eq!(
            (p.rows, p.bytes, p.hits, p.lookups, p.visits),
            (30, 1200, 40, 200, 20)
        );
        assert_eq!((p.share, p.hit_rate), (0.6, 0.2));
        assert_eq!(
            (
                p.miss_us_per_byte,
                p.hit_us_per_byte,
                p.miss_penalty_us_per_byte
            ),
            (3.0, 0.75, 2.25),
            "means over the devices that measured"
        );
        assert_eq!(m["author"].hit_rate, 0.0);
    }
}
