//! A worker as the shared epoch loop (`crate::epoch::run`) drives
//! it: what its prefetch thread prepares, its steps, its evaluation.

use super::{share, Worker, EVAL_BIT};
use crate::distributed::checkpoint::Progress;
use crate::distributed::messages::{EpochStats, StepDone};
use crate::epoch::run::{StepFigures, Steps};
use crate::epoch::{prepare, Prepared, SamplingPlan, EVAL_BATCH};
use crate::error::Result;
use graphs::{HetGraph, RelationFilter, Sampler};
use models::model::DropoutKey;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a worker's prefetch thread reads: its partition and relations.
pub(super) struct Feed<'a> {
    pub(super) graph: &'a HetGraph,
    pub(super) filter: RelationFilter,
    pub(super) gather: models::model::FeatureGather,
    pub(super) cached: Option<Arc<crate::cache::FeatureCache>>,
    /// The worker's `(replica, replicas)`.
    pub(super) replica: (u32, u32),
    /// Fanouts and seeds.
    pub(super) plan: SamplingPlan,
}

impl<'a> Steps for Worker<'a> {
    type Feed = Feed<'a>;
    type Batch = Prepared;
    type State<'f>
        = Sampler<'f>
    where
        Self: 'f;

    fn seq(&self) -> u64 {
        self.seq
    }

    fn feed_state<'f>(feed: &'f Feed<'a>) -> Result<Sampler<'f>> {
        feed.plan.train(feed.graph)
    }

    /// Samples the worker's share of the batch over its relations and gathers its feature rows.
    fn prepare<'f>(
        feed: &'f Feed<'a>,
        sampler: &mut Sampler<'f>,
        epoch: u64,
        step: u64,
        seeds: &[u32],
    ) -> Result<Prepared> {
        let mine: Vec<u32> = share(seeds, feed.replica)
            .into_iter()
            .map(|i| seeds[i])
            .collect();
        prepare(
            feed.graph,
            &feed.gather,
            feed.cached.as_deref(),
            true,
            || Ok(sampler.sample_relations(epoch, step, &mine, &feed.filter)?),
        )
    }

    fn checkpoint(&mut self, _: &Feed<'a>, progress: Progress) -> Result<()> {
        Worker::checkpoint(self, progress)
    }

    fn step(
        &mut self,
        _: &Feed<'a>,
        epoch: u64,
        step: u64,
        seeds: &[u32],
        p: Prepared,
        st: &mut EpochStats,
    ) -> Result<StepFigures> {
        st.time.sample_s += p.sample_s;
        st.time.gather_s += p.gather_s;
        let out = self.step(
            &p.mb,
            p.features,
            seeds,
            Some(DropoutKey { epoch, step }),
            None,
            self.seq,
        )?;
        self.seq += 1;
        st.time.gather_s += out.gather_s;
        st.time.compute_s += out.compute_s;
        st.time.comm_s += out.comm_s;
        st.time.update_s += out.update_s;
        // Only the reducer sees predictions: the others count nothing.
        let reducer = self.setup.worker == 0;
        if reducer {
            self.send(
                &self.s.coordinator,
                StepDone {
                    gen: self.setup.gen,
                    epoch,
                    seq: self.seq - 1,
                    loss: out.loss,
                },
            )?;
        }
        Ok(StepFigures {
            loss: out.loss,
            correct: out.correct as f64,
            seen: if reducer { seeds.len() as u64 } else { 0 },
            tasks: out.each,
        })
    }

    fn evaluate(&mut self, feed: &Feed<'a>, epoch: u64, st: &mut EpochStats) -> Result<()> {
        let s = self.setup;
        let (_, splits) = s.graph.target_labels();
        let mut sampler = feed.plan.eval(&s.graph)?;
        let mut scores = [self.task.empty_scores(), self.task.empty_scores()];
        for (split, nodes) in [(1u64, &splits.valid), (2, &splits.test)] {
            let mut sc = std::mem::take(&mut scores[split as usize - 1]);
            for (step, seeds) in nodes.chunks(EVAL_BATCH).enumerate() {
                let mine: Vec<u32> = share(seeds, feed.replica)
                    .into_iter()
                    .map(|i| seeds[i])
                    .collect();
                let p = prepare(
                    &s.graph,
                    &feed.gather,
                    feed.cached.as_deref(),
                    false,
                    || Ok(sampler.sample_relations(epoch, step as u64, &mine, &feed.filter)?),
                )?;
                let seq = EVAL_BIT | (epoch << 32) | (split << 28) | step as u64;
                self.step(&p.mb, p.features, seeds, None, Some(&mut sc), seq)?;
            }
            scores[split as usize - 1] = sc;
        }
        let [valid, test] = scores;
        // Only the reducer sees predictions: the others' accounts stay empty.
        match self.setup.worker {
            0 => self.task.record(st, valid, test),
            _ => st.set_scores(Default::default(), Default::default()),
        }
        Ok(())
    }

    fn cache_figures(&self) -> BTreeMap<String, crate::cache::CacheTypeReport> {
        let Some(c) = &self.cache else {
            return BTreeMap::new();
        };
        let s = self.setup;
        s.cache_view.publish(
            &super::super::names::worker(s.worker),
            s.cfg.cache_policy.name(),
            &crate::cache::manager::type_names(&s.graph),
            c,
        );
        c.report()
    }

    fn send_stats(&mut self, _: &Feed<'a>, st: EpochStats) -> Result<()> {
        self.send(&self.s.coordinator, st)
    }
}
