//! The Coordinator: drives the generations of a run — starts one when every
//! partition is ready, from the newest valid checkpoint; gathers each
//! epoch's figures into the report; completes a checkpoint once every
//! partition has written its files; and when a node fails, stops every
//! trainer, waits for the node to come back (restarted by hand or by
//! `hetgnn launch`) and starts the next generation from the last complete
//! checkpoint. Determinism makes the redone steps exact.
//!
//! `core` is the protocol without IO (`handle(now, event) -> outputs`), with
//! `figures` (the report) and `recovery` (retry or give up) beside it;
//! `shell` drives it with actors, a thread and the clock; the tests drive it
//! on a simulated network (`sim`).

mod core;
mod figures;
mod recovery;
pub(crate) mod shell;
#[cfg(test)]
mod sim;

pub(crate) use self::core::{Coordinator, Deadlines, RunId, Shape};
