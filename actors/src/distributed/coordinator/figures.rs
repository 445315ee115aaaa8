//! The run's report as the coordinator builds it: each epoch's figures from
//! every trainer's statistics (the mode merges its own), the network's
//! traffic, and the steps the run took.

use std::collections::BTreeMap;

use crate::config::TrainingConfig;
use crate::distributed::messages::EpochStats;
use crate::error::Result;
use crate::modes::seam::Rules;
use crate::report::{EpochReport, Report};

/// The report so far and what it is built from.
pub(crate) struct Figures {
    /// The report.
    pub(crate) report: Report,
    /// Network bytes of training steps by kind, summed over the epochs seen.
    step_bytes: BTreeMap<String, u64>,
    /// Steps taken in this process's attempts (what `own_steps` modes report).
    steps_run: u64,
    /// Nodes of the run's validation and test splits.
    valid: usize,
    test: usize,
}

impl Figures {
    /// An empty report of a run of `mode` over `parts` partitions.
    pub(crate) fn new(mode: &str, parts: u32, valid: usize, test: usize) -> Figures {
        Figures {
            report: Report {
                mode: mode.into(),
                nodes: parts as usize,
                ..Report::default()
            },
            step_bytes: BTreeMap::new(),
            steps_run: 0,
            valid,
            test,
        }
    }

    /// Epoch `epoch`'s figures from every trainer's `stats`.
    pub(crate) fn epoch(
        &mut self,
        t: &TrainingConfig,
        rules: &Rules,
        epoch: u64,
        stats: &[EpochStats],
    ) -> Result<EpochReport> {
        let (valid, test) = (self.valid, self.test);
        let mut er = EpochReport::from_stats(epoch, stats, valid, test, rules.own_steps);
        if !t.tasks.is_empty() {
            er.tasks = crate::report::TaskEpoch::all(
                epoch,
                stats,
                &t.tasks,
                (valid, test),
                rules.own_steps,
            );
        }
        (rules.figures)(&mut er, stats)?;
        // Trainers with steps of their own take them apart; the others share the global ones.
        self.steps_run += if rules.own_steps {
            stats.iter().map(|s| s.steps).sum()
        } else {
            stats.first().map_or(0, |s| s.steps)
        };
        let caches: Vec<_> = stats
            .iter()
            .map(|s| s.cache.clone())
            .filter(|c| !c.is_empty())
            .collect();
        if !caches.is_empty() {
            self.report.cache = crate::cache::merge_reports(&caches, t.cache_bytes.0);
        }
        // Each trainer reports its node's cumulative traffic; in one process they share a node.
        self.report.bytes_by_kind.clear();
        self.report.messages_by_kind.clear();
        self.report.resends = runtime::Resends::default();
        let distinct = if stats
            .windows(2)
            .all(|w| w[0].bytes_by_kind == w[1].bytes_by_kind)
        {
            &stats[..stats.len().min(1)]
        } else {
            stats
        };
        for s in distinct {
            for (k, v) in &s.bytes_by_kind {
                *self.report.bytes_by_kind.entry(k.clone()).or_default() += v;
            }
            self.report.resends += s.resends;
            for (k, v) in &s.messages_by_kind {
                *self.report.messages_by_kind.entry(k.clone()).or_default() += v;
            }
            for (k, v) in &s.step_bytes_by_kind {
                *self.step_bytes.entry(k.clone()).or_default() += v;
            }
        }
        Ok(er)
    }

    /// The run is over after `total` global steps.
    pub(crate) fn finish(&mut self, rules: &Rules, total: u64) {
        // Global steps are numbered: the model took `total` of them, however
        // many attempts (and resumed runs) it took; an epoch's statistics
        // count only the steps since the attempt began.
        self.report.steps = if rules.own_steps {
            self.steps_run
        } else {
            total
        };
        let steps = self.steps_run.max(1) as f64;
        self.report.bytes_per_step = self
            .step_bytes
            .iter()
            .map(|(k, v)| (k.clone(), *v as f64 / steps))
            .collect();
    }
}
