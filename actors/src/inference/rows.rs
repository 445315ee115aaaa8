//! A partition's published rows: the stages it has computed for the nodes it
//! owns, answered to its peers by the [`RowServer`] actor.

use std::sync::{Arc, Mutex};

use actix::{Actor, Context, Handler, MessageResult};
use models::inference::TypeRows;
use runtime::{Deliver, SharedBytes};

use super::messages::{
    FinishState, Finished, Leaving, PartDone, ServeError, StagePull, StageRows, MAX_IDS,
};

/// One stage's rows of a partition's own nodes, per type (`None`: no rows of
/// that type), in the order of the partition's own nodes (ascending ids).
pub type Stage = Vec<Option<TypeRows>>;

/// Stages kept: a peer computing stage `s + 1` needs stage `s`, and no peer
/// can be two stages behind (it would have needed this partition's rows of
/// the stage before to get here).
const KEPT: usize = 2;

/// What a partition serves its peers.
pub struct Published {
    job: u64,
    part: u16,
    /// The partition's own nodes per type, ascending.
    own: Arc<Vec<Vec<u32>>>,
    stages: Mutex<Vec<(u32, Arc<Stage>)>>,
    finished: Mutex<FinishState>,
    /// Peers that said they are leaving ([`Leaving`]).
    left: Mutex<Vec<u32>>,
}

impl Published {
    /// Nothing published yet for partition `part` owning `own`.
    pub fn new(job: u64, part: u16, own: Arc<Vec<Vec<u32>>>) -> Published {
        Published {
            job,
            part,
            own,
            stages: Mutex::new(Vec::new()),
            finished: Mutex::new(FinishState::default()),
            left: Mutex::new(Vec::new()),
        }
    }

    /// Publishes stage `s` (the newest), dropping stages no peer can need.
    pub fn publish(&self, s: u32, rows: Arc<Stage>) {
        let mut stages = self.stages.lock().unwrap_or_else(|p| p.into_inner());
        stages.retain(|(k, _)| *k != s);
        stages.push((s, rows));
        stages.sort_by_key(|(k, _)| *k);
        let drop = stages.len().saturating_sub(KEPT);
        stages.drain(..drop);
    }

    /// Marks the partition's embeddings written, as `done` says.
    pub fn finish(&self, done: PartDone) {
        self.finished.lock().unwrap_or_else(|p| p.into_inner()).done = Some(done);
    }

    /// Marks every partition seen done.
    pub fn all_seen(&self) {
        self.finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .all_seen = true;
    }

    /// Records a peer's word that it is leaving (another job's is ignored).
    fn note_leaving(&self, m: &Leaving) {
        if m.job != self.job {
            return;
        }
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        if !left.contains(&m.part) {
            left.push(m.part);
        }
    }

    /// Whether partition `part` said it is leaving.
    pub fn has_left(&self, part: u32) -> bool {
        self.left
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&part)
    }

    fn answer(&self, m: &StagePull) -> Result<StageRows, ServeError> {
        if m.job != self.job {
            return Err(ServeError::refused(
                "a request of another embedding job (other checkpoint or partitions)",
            ));
        }
        let own = self
            .own
            .get(m.ntype as usize)
            .ok_or_else(|| ServeError::Refused(format!("node type {} does not exist", m.ntype)))?;
        if m.ids.len() > MAX_IDS {
            return Err(ServeError::Refused(format!(
                "{} ids in one request, at most {MAX_IDS}",
                m.ids.len()
            )));
        }
        let stage = {
            let stages = self.stages.lock().unwrap_or_else(|p| p.into_inner());
            match stages.iter().find(|(k, _)| *k == m.stage) {
                Some((_, rows)) => rows.clone(),
                None if stages.last().is_none_or(|(k, _)| *k < m.stage) => {
                    return Ok(StageRows::NotYet)
                }
                None => {
                    return Err(ServeError::Refused(format!(
                        "stage {} is no longer kept (a peer two stages behind)",
                        m.stage
                    )))
                }
            }
        };
        let Some(rows) = &stage[m.ntype as usize] else {
            return Ok(StageRows::Absent);
        };
        let w = rows.width;
        let mut asked = Vec::with_capacity(m.ids.len());
        for &v in &m.ids {
            let i = own.binary_search(&v).map_err(|_| {
                ServeError::Refused(format!(
                    "node {v} of type {} is not owned by partition {}",
                    m.ntype, self.part
                ))
            })?;
            asked.push(
                rows.data
                    .get(i * w..(i + 1) * w)
                    .ok_or_else(|| ServeError::failed("a stage holds fewer rows than nodes"))?,
            );
        }
        if let Some(data) = super::packed::pack(&asked, w) {
            return Ok(StageRows::Packed {
                width: w as u32,
                data: SharedBytes(data.into()),
            });
        }
        let mut out = Vec::with_capacity(m.ids.len() * w * 4);
        for row in asked {
            out.extend_from_slice(bytemuck::cast_slice(row));
        }
        Ok(StageRows::Rows {
            width: w as u32,
            data: SharedBytes(out.into()),
        })
    }
}

/// Little-endian f32 values of `bytes` (whatever their alignment).
pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Serves a partition's [`Published`] rows.
pub struct RowServer(pub Arc<Published>);

impl Actor for RowServer {
    type Context = Context<Self>;
}

impl Handler<Deliver<StagePull>> for RowServer {
    type Result = MessageResult<Deliver<StagePull>>;
    fn handle(&mut self, m: Deliver<StagePull>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.0.answer(&m.msg))
    }
}

impl Handler<Deliver<Finished>> for RowServer {
    type Result = MessageResult<Deliver<Finished>>;
    fn handle(&mut self, m: Deliver<Finished>, _: &mut Context<Self>) -> Self::Result {
        let state = self.0.finished.lock().unwrap_or_else(|p| p.into_inner());
        MessageResult(if m.msg.job == self.0.job {
            state.clone()
        } else {
            FinishState::default()
        })
    }
}

impl Handler<Deliver<Leaving>> for RowServer {
    type Result = MessageResult<Deliver<Leaving>>;
    fn handle(&mut self, m: Deliver<Leaving>, _: &mut Context<Self>) -> Self::Result {
        self.0.note_leaving(&m.msg);
        MessageResult(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pull(stage: u32, ntype: u32, ids: Vec<u32>) -> StagePull {
        StagePull {
            job: 7,
            stage,
            ntype,
            ids,
        }
    }

    #[test]
    fn rows_are_answered_in_the_order_asked_and_bad_requests_refused() {
        let own = Arc::new(vec![vec![2, 5, 9], vec![]]);
        let p = Published::new(7, 1, own);
        assert!(matches!(
            p.answer(&pull(1, 0, vec![2])),
            Ok(StageRows::NotYet)
        ));
        let rows = |base: f32| {
            Arc::new(vec![
                Some(TypeRows {
                    width: 2,
                    data: (0..6).map(|i| base + i as f32).collect(),
                }),
                None,
            ])
        };
        p.publish(1, rows(0.0));
        match p.answer(&pull(1, 0, vec![9, 2])) {
            Ok(StageRows::Rows { width: 2, data }) => {
                assert_eq!(floats(&data.0), vec![4.0, 5.0, 0.0, 1.0]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            p.answer(&pull(1, 1, vec![])),
            Ok(StageRows::Absent)
        ));
        let refused = |m: StagePull| match p.answer(&m) {
            Err(ServeError::Refused(e)) => e,
            other => panic!("{other:?}"),
        };
        assert!(refused(pull(1, 0, vec![3])).contains("not owned"));
        assert!(refused(pull(1, 2, vec![2])).contains("does not exist"));
        assert!(refused(StagePull {
            job: 8,
            ..pull(1, 0, vec![2])
        })
        .contains("another"));
        // Two stages are kept; an older one is refused, a newer one is not there yet.
        p.publish(2, rows(10.0));
        p.publish(3, rows(20.0));
        assert!(refused(pull(1, 0, vec![2])).contains("no longer kept"));
        assert!(matches!(
            p.answer(&pull(2, 0, vec![2])),
            Ok(StageRows::Rows { .. })
        ));
        assert!(matches!(
            p.answer(&pull(4, 0, vec![2])),
            Ok(StageRows::NotYet)
        ));
    }

    #[test]
    fn mostly_zero_rows_are_answered_packed() {
        let p = Published::new(7, 1, Arc::new(vec![vec![2, 5, 9]]));
        let mut data = vec![0.0f32; 3 * 16];
        data[16 + 3] = 2.5;
        data[32 + 15] = -1.0;
        p.publish(1, Arc::new(vec![Some(TypeRows { width: 16, data })]));
        match p.answer(&pull(1, 0, vec![9, 5])) {
            Ok(StageRows::Packed { width: 16, data }) => {
                let mut rows = vec![7.0f32; 32];
                super::super::packed::unpack(&data.0, 16, &mut rows).unwrap();
                let mut want = vec![0.0f32; 32];
                (want[15], want[16 + 3]) = (-1.0, 2.5);
                assert_eq!(rows, want);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_peer_leaving_is_remembered_for_its_job_only() {
        let p = Published::new(7, 1, Arc::new(vec![vec![2]]));
        p.note_leaving(&Leaving { job: 8, part: 0 });
        assert!(!p.has_left(0), "another job's word counts");
        p.note_leaving(&Leaving { job: 7, part: 0 });
        p.note_leaving(&Leaving { job: 7, part: 0 });
        assert!(p.has_left(0) && !p.has_left(2));
    }
}
