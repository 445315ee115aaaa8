//! A trainer's inputs: its share of a batch sampled and its plain features
//! gathered ahead of its step (through the owner-compute client), and the
//! device cache, built once per process.

use std::time::Instant;

use candle_core::DType;

use super::{Ctx, Prepared};
use crate::cache::{hotness, profile, CachePolicy, DeviceCache};
use crate::epoch::SamplingPlan;
use crate::error::{Result, TrainError};
use crate::owner::client::Rows;
use graphs::link::StepEdges;

use crate::task::edge::EdgeTask;
use crate::task::link::LinkTask;

/// Rows per pull when a cache is filled.
const FILL_ROWS: usize = 16 << 10;

impl Ctx<'_> {
    /// Samples step `step`'s share of `batch` and gathers its plain features.
    pub(super) fn prepare(
        &self,
        seed: u64,
        epoch: u64,
        step: u64,
        batch: &[u32],
        target: usize,
    ) -> Result<Prepared> {
        let seeds = self.my_seeds(target, batch);
        let share = seeds.len() as f64 / batch.len().max(1) as f64;
        if seeds.is_empty() {
            return Ok(Prepared {
                seeds,
                share,
                ..Prepared::nothing()
            });
        }
        let t = Instant::now();
        let mb = self.sample(seed, epoch, step, &seeds)?;
        let sample_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let features = self.gather(&mb.blocks[0].src, Rows::Features, None)?;
        Ok(Prepared {
            seeds,
            share,
            mb: Some(mb),
            features,
            sample_s,
            gather_s: t.elapsed().as_secs_f64(),
            ..Prepared::nothing()
        })
    }

    /// Link prediction: samples the endpoints and negatives of this
    /// trainer's edges `ids` of step `step`, the step's training edges left
    /// out of every neighbourhood (here and at the owners), and gathers their
    /// plain features.
    pub(super) fn prepare_link(
        &self,
        task: &LinkTask,
        epoch: u64,
        step: u64,
        ids: &[u32],
    ) -> Result<Prepared> {
        if ids.is_empty() {
            return Ok(Prepared::nothing());
        }
        let batch = task.batch(&self.s.graph, epoch, ids);
        let mut p =
            self.prepare_seeds(&batch.seeds, &task.exclusion(epoch, step), epoch, step, ids)?;
        p.link = Some(batch);
        Ok(p)
    }

    /// Edge tasks: samples the ends of this trainer's edges `ids` of step
    /// `step`, the step's edges (and their reverses) left out of every
    /// neighbourhood (here and at the owners), and gathers their plain features.
    pub(super) fn prepare_edges(
        &self,
        task: &EdgeTask,
        epoch: u64,
        step: u64,
        ids: &[u32],
    ) -> Result<Prepared> {
        if ids.is_empty() {
            return Ok(Prepared::nothing());
        }
        let batch = task.batch(&self.s.graph, ids);
        let mut p =
            self.prepare_seeds(&batch.seeds, &task.exclusion(epoch, step), epoch, step, ids)?;
        p.edge = Some(batch);
        Ok(p)
    }

    /// Samples `seeds` (per type) with `excluded` left out and gathers their
    /// plain features, for this trainer's edges `ids` of a step.
    fn prepare_seeds(
        &self,
        seeds: &[Vec<u32>],
        excluded: &StepEdges,
        epoch: u64,
        step: u64,
        ids: &[u32],
    ) -> Result<Prepared> {
        let t = Instant::now();
        let mb = self.sample_typed(self.s.cfg.seed, epoch, step, seeds, Some(excluded))?;
        let sample_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let features = self.gather(&mb.blocks[0].src, Rows::Features, None)?;
        Ok(Prepared {
            seeds: ids.to_vec(),
            mb: Some(mb),
            features,
            sample_s,
            gather_s: t.elapsed().as_secs_f64(),
            ..Prepared::nothing()
        })
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
        let plan = SamplingPlan::of(t);
        let seed = plan.presample_seed();
        let visits = hotness::presample(
            &sizes,
            &splits.train,
            t.batch,
            &plan,
            t.cache_presample_epochs,
            |e, st, batch| {
                let seeds = self.my_seeds(target, batch);
                if seeds.is_empty() {
                    return Ok(Vec::new());
                }
                Ok(self.sample(seed, e, st, &seeds)?.blocks.swap_remove(0).src)
            },
        )?;
        let batches =
            (t.cache_presample_epochs * splits.train.len().div_ceil(t.batch.max(1)) as u64).max(1);
        let only = |ty: usize, ids: &[u32]| -> Vec<Vec<u32>> {
            (0..sizes.len())
                .map(|k| if k == ty { ids.to_vec() } else { Vec::new() })
                .collect()
        };
        let mut candidates = Vec::new();
        for (ty, nt) in g.node_types().iter().enumerate() {
            let ranked = visits.ranked(ty);
            if nt.features.is_none() || ranked.is_empty() || !self.gathers(ty, Rows::Features) {
                continue;
            }
            let probe = profile::probe_ids(&ranked, (visits.total(ty) / batches) as usize);
            let values: Vec<f32> = self
                .gather(&only(ty, &probe), Rows::Features, None)?
                .swap_remove(ty)
                .map_or(Ok(Vec::new()), |x| {
                    x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
                })?;
            let miss = || {
                self.gather(&only(ty, &probe), Rows::Features, None)
                    .map(|_| ())
            };
            candidates.push(crate::cache::feature_candidate(
                ty,
                nt.count as usize,
                &probe,
                values,
                (self.dtype, &self.device),
                miss,
            )?);
        }
        let chosen = crate::cache::plan(t.cache_policy, budget, &visits, &candidates);
        // Filled in pieces: one pull of a whole share could pass the wire's message limits.
        let rows = |ty: usize, ids: &[u32]| -> Result<Vec<f32>> {
            let mut out = Vec::new();
            for piece in ids.chunks(FILL_ROWS) {
                let x = self
                    .gather(&only(ty, piece), Rows::Features, None)?
                    .swap_remove(ty)
                    .ok_or_else(|| TrainError::Internal("cache: no rows gathered".into()))?;
                out.extend(x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?);
            }
            Ok(out)
        };
        let planned = candidates.into_iter().zip(chosen).collect();
        let mut cache = DeviceCache::new(g, budget, &visits, planned, &[], &self.device, rows)?;
        for (ty, nt) in g.node_types().iter().enumerate() {
            if self.learnable[ty] && visits.total(ty) > 0 {
                cache.not_cached(
                    ty,
                    &nt.name,
                    visits.total(ty),
                    true,
                    "learnable rows stay with their embedding stores in data-parallel training",
                );
            }
        }
        Ok(Some(cache))
    }
}
