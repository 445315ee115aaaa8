//! Progress reporting for long work (generation, import), so the CLI can draw bars
//! while the library stays free of terminal code.

/// Receives progress from long operations.
pub trait Progress {
    /// A new phase begins with `total` units of work.
    fn start(&mut self, phase: &str, total: u64);
    /// `n` more units are done.
    fn advance(&mut self, n: u64);
    /// The current phase is complete.
    fn finish(&mut self);
}

/// Discards progress.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _phase: &str, _total: u64) {}
    fn advance(&mut self, _n: u64) {}
    fn finish(&mut self) {}
}
