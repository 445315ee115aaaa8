//! A trainer's batches from its partition's sampling worker
//! (`sampling = "dag"`): the same shares of the same batches as
//! [`super::fetch`]'s prefetch thread makes, sampled by DAGs.

use std::sync::Arc;

use super::{Ctx, Prepared};
use crate::data_parallel::sampling::dag::{Job, Seeds, Source};
use crate::data_parallel::sampling::pipeline::DagBatches;
use crate::distributed::messages::EpochStats;
use crate::epoch::run::BatchSource;
use crate::error::Result;

/// The epoch's DAG-sampled batches, with each step's seeds and share.
pub(super) struct DagFeed<'a> {
    ctx: &'a Ctx<'a>,
    dags: DagBatches,
    /// Per step from the first one sampled: the trainer's seeds (or edges) and its share of the batch.
    shares: std::collections::VecDeque<(Vec<u32>, f64)>,
}

impl<'a> Ctx<'a> {
    /// Starts sampling the steps `skip..` of `epoch` (the global `batches`).
    pub(super) fn dag_batches(
        &'a self,
        epoch: u64,
        batches: &[Vec<u32>],
        skip: usize,
    ) -> Result<DagFeed<'a>> {
        let t = &self.s.cfg;
        let target = self.s.graph.target().index();
        let worker = crate::data_parallel::sampling::worker(
            &self.s.sampling,
            self.s.part,
            self.s.dp.dag_threads,
        )?;
        let src = Arc::new(Source::new(
            &self.c,
            self.s.link.clone(),
            self.s.dp.dag_chunk_rows as usize,
        ));
        let mut jobs = Vec::new();
        let mut shares = std::collections::VecDeque::new();
        for (step, batch) in batches.iter().enumerate().skip(skip) {
            let (mine, share, seeds) = match &self.s.link {
                Some(_) => {
                    let mine = self.my_edges(batch);
                    (mine.clone(), 0.0, Seeds::Edges(mine))
                }
                None => {
                    let mine = self.my_seeds(target, batch);
                    let share = mine.len() as f64 / batch.len().max(1) as f64;
                    (mine.clone(), share, Seeds::Nodes(mine))
                }
            };
            // A DAG's priority: its step's place in the run, the same for every trainer of the partition.
            let dag = (epoch << 32) | step as u64;
            jobs.push((!mine.is_empty()).then_some(Job {
                dag,
                seed: t.seed,
                epoch,
                step: step as u64,
                seeds,
            }));
            shares.push_back((mine, share));
        }
        let dags = DagBatches::start(
            src,
            worker,
            jobs,
            self.s.dp.dag_max_in_flight as usize,
            self.s.timeouts.step,
        )?;
        Ok(DagFeed {
            ctx: self,
            dags,
            shares,
        })
    }
}

impl BatchSource<Prepared> for DagFeed<'_> {
    fn next(&mut self) -> Result<Prepared> {
        let inbox = &self.ctx.s.inbox;
        let sampled = self.dags.next(|| inbox.abort_reason())?;
        let (seeds, share) = self.shares.pop_front().unwrap_or_default();
        Ok(match sampled {
            Some(s) => Prepared {
                seeds,
                share,
                link: s.link,
                edge: None,
                mb: Some(s.mb),
                features: s.features,
                sample_s: s.sample_s,
                gather_s: s.gather_s,
                beside: None,
            },
            None => Prepared {
                seeds,
                share,
                ..Prepared::nothing()
            },
        })
    }

    fn trained(&self, seconds: f64) {
        self.dags.trained(seconds);
    }

    fn figures(&self, st: &mut EpochStats) -> Result<()> {
        st.set_figures(&self.dags.figures())
    }
}
