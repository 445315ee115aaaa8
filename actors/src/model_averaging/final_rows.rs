//! The learnable rows of the trained model: after the last round each row's
//! owner holds its average; workers on other nodes send the rows their
//! partitions own to the coordinator, which puts every row in its place.

use futures_util::future::join_all;
use models::Model;
use runtime::ByteVec;

use super::local::Local;
use super::messages::{self, phase, Average, TypeRows};
use super::names;
use crate::distributed::inbox::Inbox;
use crate::distributed::Part;
use crate::distributed::Timeouts;
use crate::error::{Result, TrainError};

/// The rows `locals` own: `(node type, ids, values)`.
pub(crate) fn owned(locals: &[Local], owners: &[Vec<u16>]) -> TypeRows {
    let mut out = Vec::new();
    for l in locals {
        for (ty, rows) in l.rows.iter().enumerate() {
            let Some(rows) = rows else { continue };
            let (mut ids, mut values) = (Vec::new(), Vec::new());
            for (k, &id) in rows.ids.iter().enumerate() {
                if u32::from(owners[ty][id as usize]) == l.part {
                    ids.push(id);
                    values.extend_from_slice(rows.row(k));
                }
            }
            out.push((ty as u32, ids, values));
        }
    }
    out
}

/// Sends the rows worker `p.part`'s partitions own to the coordinator
/// (cluster runs), in pieces.
pub(crate) fn send(p: &Part, gen: u64, locals: &[Local], owners: &[Vec<u16>]) -> Result<()> {
    let (node, handle, w, timeout) = (p.node, p.handle, p.part, p.timeouts.ask);
    let inbox = p
        .inboxes
        .first()
        .ok_or_else(|| TrainError::Internal(format!("worker {w} without its inbox")))?;
    let bytes = messages::encode(&owned(locals, owners))?;
    let me = runtime::ActorName::new(&names::worker(w)).map_err(TrainError::internal)?;
    let to = node
        .actor(names::FINAL)
        .map_err(TrainError::internal)?
        .with_sender(me);
    let pieces = messages::pieces(bytes);
    let n = pieces.len() as u32;
    let asks = pieces.into_iter().enumerate().map(|(i, p)| {
        to.ask(
            Average {
                gen,
                round: 0,
                phase: phase::FINAL,
                piece: i as u32,
                pieces: n,
                from: w,
                data: ByteVec(p),
            },
            timeout,
        )
    });
    // The coordinator may say the run is over (it has everything) before the last answer.
    inbox
        .block_on(handle, join_all(asks))?
        .into_iter()
        .try_for_each(|r| r.map_err(TrainError::peer_lost))
}

/// Worker `w`'s owned rows, gathered from the coordinator's inbox.
pub(crate) fn gather(inbox: &Inbox, w: u32, timeouts: Timeouts) -> Result<TypeRows> {
    let bytes = messages::gather(
        inbox,
        &format!("worker {w}'s final rows"),
        0,
        phase::FINAL,
        w,
        timeouts.step,
    )?;
    messages::decode(&bytes).map_err(|e| e.context(format!("worker {w}'s final rows")))
}

/// Puts `rows` into `model`'s tables: every row of every table exactly once.
pub(crate) fn fill(model: &mut Model, rows: TypeRows) -> Result<()> {
    let mut seen: Vec<Vec<bool>> = model
        .embeddings
        .iter()
        .map(|e| vec![false; e.as_ref().map_or(0, |e| e.rows)])
        .collect();
    for (ty, ids, values) in rows {
        let e = model
            .embeddings
            .get_mut(ty as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| {
                TrainError::Protocol(format!("rows for node type {ty}, which has no table"))
            })?;
        let d = e.dim;
        if values.len() != ids.len() * d {
            return Err(TrainError::Protocol(format!(
                "{}: {} values for {} rows",
                e.name,
                values.len(),
                ids.len()
            )));
        }
        for (i, &id) in ids.iter().enumerate() {
            let k = id as usize;
            if k >= e.rows || std::mem::replace(&mut seen[ty as usize][k], true) {
                return Err(TrainError::Protocol(format!(
                    "{}: row {id} out of range or sent twice",
                    e.name
                )));
            }
            e.data[k * d..(k + 1) * d].copy_from_slice(&values[i * d..(i + 1) * d]);
        }
    }
    for (e, s) in model.embeddings.iter().zip(&seen) {
        if let (Some(e), Some(k)) = (e, s.iter().position(|s| !s)) {
            return Err(TrainError::Protocol(format!(
                "{}: no worker sent row {k}",
                e.name
            )));
        }
    }
    Ok(())
}
