//! Data-parallel training's own figures: DAG sampling's (`sampling =
//! "dag"`), merged into the report as `sampling` in each epoch.

use crate::data_parallel::sampling::pipeline::DagFigures;
use crate::distributed::messages::EpochStats;
use crate::error::Result;
use crate::report::EpochReport;

/// The DAG figures of every trainer: launches and operator seconds summed,
/// in-flight and queued means averaged, the largest in flight.
pub(crate) fn merge(report: &mut EpochReport, stats: &[EpochStats]) -> Result<()> {
    let all: Vec<DagFigures> = stats
        .iter()
        .filter_map(|s| s.figures().transpose())
        .collect::<Result<_>>()?;
    if all.is_empty() {
        return Ok(());
    }
    let n = all.len() as f64;
    let mut out = DagFigures::default();
    for f in &all {
        out.threads = out.threads.max(f.threads);
        out.launches += f.launches;
        out.in_flight_mean += f.in_flight_mean / n;
        out.in_flight_max = out.in_flight_max.max(f.in_flight_max);
        out.queued_mean += f.queued_mean / n;
        for (k, v) in &f.op_seconds {
            *out.op_seconds.entry(k.clone()).or_default() += v;
        }
    }
    report.set_figures("sampling", &out)
}
