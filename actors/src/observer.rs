//! Progress of a run as it happens, for whoever drives it (the CLI draws bars).

use graphs::HetGraph;
use models::Model;

use crate::report::EpochReport;

/// Receives progress from a run (the CLI draws bars from it); `Send`, as a
/// step may report from a thread of rayon's pool.
pub trait TrainObserver: Send {
    /// The graph is loaded and the model built.
    fn ready(&mut self, _graph: &HetGraph, _model: &Model) {}
    /// An epoch of `steps` steps begins.
    fn epoch_start(&mut self, _epoch: u64, _steps: u64) {}
    /// A step finished with this loss.
    fn step(&mut self, _loss: f64) {}
    /// An epoch finished (evaluation included).
    fn epoch_end(&mut self, _report: &EpochReport) {}
    /// Something the user should know (resumed from a checkpoint, skipped a corrupt one).
    fn note(&mut self, _message: &str) {}
}

/// Ignores progress.
impl TrainObserver for () {}
