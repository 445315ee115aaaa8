//! HopGNN's own message: a model migrating to the next worker of its step.
//! Its kind names it, so the report's bytes per kind show the migration
//! traffic apart from pulls, pushes, sampling and the gradient all-reduce.

use actix::{Context, Handler, MessageResult};
use runtime::{ByteVec, Deliver, Msg};
use serde::{Deserialize, Serialize};

use crate::distributed::inbox::InboxActor;

/// Inbox rounds of migrations: apart from the all-reduce's (0 to 2(K-1)-1).
pub const MIGRATE_ROUND: u32 = 1 << 20;

/// A model leaving a worker after time step `step` of step `seq`: the
/// gradient it has accumulated, then its parameters (`hop_migrate = "model"`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Migrate {
    /// Generation of the run.
    pub gen: u64,
    /// Global step number.
    pub seq: u64,
    /// The time step it leaves.
    pub step: u32,
    /// Sending worker.
    pub from: u32,
    /// Little-endian f32: the accumulated gradient (a presence flag per
    /// parameter, the loss and correct count included), then the parameters if they travel.
    pub data: ByteVec,
}

impl Msg for Migrate {
    type Reply = ();
    const KIND: &'static str = "migrate";
}

impl Handler<Deliver<Migrate>> for InboxActor {
    type Result = MessageResult<Deliver<Migrate>>;
    fn handle(&mut self, m: Deliver<Migrate>, _: &mut Context<Self>) -> Self::Result {
        // Filed under the worker the sending actor is, not the one it claims.
        if m.from.as_str() == super::names::worker(m.msg.from) && m.msg.step < MIGRATE_ROUND {
            self.0.file_gen(
                m.msg.gen,
                m.msg.seq,
                MIGRATE_ROUND + m.msg.step,
                m.msg.from,
                m.msg.data.0,
            );
        } else {
            tracing::warn!(
                "dropped a migration from {} claiming to be worker {}",
                m.from.as_str(),
                m.msg.from
            );
        }
        MessageResult(())
    }
}
