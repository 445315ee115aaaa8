//! Averaging the partitions' models at the end of a round (CATGNN §3.3).
//!
//! Dense parameters: every worker sends every other its partitions' values
//! (an all-gather), and each computes the same weighted mean in partition
//! order, so every copy ends bit-identical. A partition weighs as many as
//! the training nodes it owns, and only in the parameters it changed in the
//! round: one that never touched a parameter does not pull the mean back.
//!
//! Learnable rows: a row may be held by several partitions (its owner and
//! those whose halo it is). Each partition sends the rows it changed to the
//! worker of their owner; the owner takes the weighted mean over the
//! partitions that changed the row, in partition order, and sends it back
//! to every partition holding the row (known from a [`phase::HOLD`]
//! exchange at the start of each attempt), so every copy agrees again.
//! Adam state stays each partition's own.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use runtime::{ActorRef, ByteVec};

use super::local::Local;
use super::messages::{self, phase, Average, Dense, Rows, TypeRows, Up};
use crate::distributed::inbox::Inbox;
use crate::distributed::Timeouts;
use crate::error::{Result, TrainError};

/// The weighted mean of `contribs` (weight, values), summed in order in f64;
/// a single contribution is taken as it is, and weights that are all zero
/// count equally.
pub fn weighted_mean(contribs: &[(u64, &[f32])], out: &mut [f32]) {
    if let [(_, only)] = contribs {
        out.copy_from_slice(only);
        return;
    }
    let total: u64 = contribs.iter().map(|c| c.0).sum();
    let w = |c: u64| if total == 0 { 1.0 } else { c as f64 };
    let denom: f64 = contribs.iter().map(|c| w(c.0)).sum();
    for (j, o) in out.iter_mut().enumerate() {
        let s: f64 = contribs.iter().map(|(c, v)| w(*c) * f64::from(v[j])).sum();
        *o = (s / denom) as f32;
    }
}

/// Averaged rows of one node type, ids ascending.
#[derive(Default)]
struct Rows1 {
    ids: Vec<u32>,
    /// Their means, row after row.
    values: Vec<f32>,
    /// The partition that alone changed each (`u32::MAX`: several did).
    sole: Vec<u32>,
}

/// Averaged rows by node type.
type Averaged = BTreeMap<usize, Rows1>;

/// A partition's changed row: (id, partition, values).
type Contribution<'a> = (u32, u32, &'a [f32]);

/// Who holds which owned rows: per holding partition, per node type, the
/// ids (ascending) of rows owned by a partition of this worker.
pub type Holders = BTreeMap<u32, Vec<Vec<u32>>>;

/// A worker's side of the averaging protocol.
pub(crate) struct Averager<'a> {
    /// This worker.
    pub worker: u32,
    /// Workers in all.
    pub workers: u32,
    /// The run's generation.
    pub gen: u64,
    /// Partition owners by node type.
    pub owners: &'a [Vec<u16>],
    /// Its runtime.
    pub handle: &'a tokio::runtime::Handle,
    /// Its inbox.
    pub inbox: &'a Inbox,
    /// Every worker's inbox actor (from this worker).
    pub peers: Vec<ActorRef>,
    /// Deadlines.
    pub timeouts: Timeouts,
}

impl Averager<'_> {
    fn worker_of(&self, part: u32) -> u32 {
        part % self.workers
    }

    fn owner_worker(&self, ty: usize, id: u32) -> u32 {
        self.worker_of(u32::from(self.owners[ty][id as usize]))
    }

    /// Sends `payloads[q]` to every other worker `q`, then gathers theirs;
    /// returns every worker's payload in worker order (this one's included).
    fn exchange(&self, round: u64, ph: u32, payloads: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
        let mut asks = Vec::new();
        let mut mine = None;
        for (q, bytes) in payloads.into_iter().enumerate() {
            if q as u32 == self.worker {
                mine = Some(bytes);
                continue;
            }
            let parts = messages::pieces(bytes);
            let pieces = parts.len() as u32;
            for (i, piece) in parts.into_iter().enumerate() {
                let msg = Average {
                    gen: self.gen,
                    round,
                    phase: ph,
                    piece: i as u32,
                    pieces,
                    from: self.worker,
                    data: ByteVec(piece),
                };
                asks.push(self.peers[q].ask(msg, self.timeouts.ask));
            }
        }
        let inbox = self.inbox;
        for r in inbox.block_on(self.handle, join_all(asks))? {
            r?;
        }
        (0..self.workers)
            .map(|q| match q == self.worker {
                true => Ok(mine.take().unwrap_or_default()),
                false => messages::gather(
                    inbox,
                    &format!("worker {q}'s averaging (phase {ph:#x}, round {round})"),
                    round,
                    ph,
                    q,
                    self.timeouts.step,
                ),
            })
            .collect()
    }

    /// Tells each owner which of its rows this worker's partitions hold;
    /// returns who holds the rows this worker's partitions own.
    pub fn holders(&self, locals: &[Local]) -> Result<Holders> {
        let mut out: Vec<Rows> = (0..self.workers).map(|_| Rows::default()).collect();
        for l in locals {
            let mut per: Vec<TypeRows> = (0..self.workers).map(|_| Vec::new()).collect();
            for (ty, rows) in l.rows.iter().enumerate() {
                let Some(rows) = rows else { continue };
                let mut by: Vec<Vec<u32>> = vec![Vec::new(); self.workers as usize];
                for &id in &rows.ids {
                    if u32::from(self.owners[ty][id as usize]) != l.part {
                        by[self.owner_worker(ty, id) as usize].push(id);
                    }
                }
                for (q, ids) in by.into_iter().enumerate() {
                    per[q].push((ty as u32, ids, Vec::new()));
                }
            }
            for (q, rows) in per.into_iter().enumerate() {
                out[q].parts.push((l.part, rows));
            }
        }
        let payloads = out
            .iter()
            .map(messages::encode)
            .collect::<Result<Vec<_>>>()?;
        let mut holders = Holders::new();
        for (q, bytes) in self
            .exchange(0, phase::HOLD, payloads)?
            .into_iter()
            .enumerate()
        {
            let rows: Rows = messages::decode(&bytes)
                .map_err(|e| e.context(format!("worker {q}'s held rows")))?;
            for (part, types) in rows.parts {
                if self.worker_of(part) != q as u32 {
                    return Err(TrainError::Protocol(format!(
                        "worker {q} sent the held rows of partition {part}, not its own"
                    )));
                }
                let entry = holders
                    .entry(part)
                    .or_insert_with(|| vec![Vec::new(); self.owners.len()]);
                for (ty, ids, _) in types {
                    let ty = ty as usize;
                    if ty >= self.owners.len()
                        || ids.iter().any(|&id| {
                            (id as usize) >= self.owners[ty].len()
                                || self.owner_worker(ty, id) != self.worker
                        })
                    {
                        return Err(TrainError::Protocol(format!(
                            "worker {q} claims rows of type {ty} this worker does not own"
                        )));
                    }
                    entry[ty] = ids;
                }
            }
        }
        Ok(holders)
    }

    /// Averages the models of every partition at the end of round `round`;
    /// returns the bytes of the payloads this worker sent.
    pub fn average(&self, round: u64, locals: &mut [Local], holders: &Holders) -> Result<u64> {
        let mut sent = 0u64;
        // Up: dense parameters to everyone, changed rows to their owners.
        let mut dense = Vec::new();
        let mut up_rows: Vec<Vec<(u32, TypeRows)>> =
            (0..self.workers).map(|_| Vec::new()).collect();
        for l in locals.iter() {
            let (changed, values) = l.changed()?;
            dense.push(Dense {
                part: l.part,
                weight: l.weight(),
                changed,
                values,
            });
            let mut per: Vec<TypeRows> = (0..self.workers).map(|_| Vec::new()).collect();
            for (ty, rows) in l.rows.iter().enumerate() {
                let Some(rows) = rows else { continue };
                let mut by: Vec<(Vec<u32>, Vec<f32>)> =
                    vec![(Vec::new(), Vec::new()); self.workers as usize];
                for (k, &id) in rows
                    .ids
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| rows.touched[*k])
                {
                    let q = self.owner_worker(ty, id) as usize;
                    by[q].0.push(id);
                    by[q].1.extend_from_slice(rows.row(k));
                }
                for (q, (ids, values)) in by.into_iter().enumerate() {
                    per[q].push((ty as u32, ids, values));
                }
            }
            for (q, rows) in per.into_iter().enumerate() {
                up_rows[q].push((l.part, rows));
            }
        }
        let payloads = up_rows
            .into_iter()
            .map(|rows| {
                messages::encode(&Up {
                    dense: dense.clone(),
                    rows,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        sent += payloads
            .iter()
            .enumerate()
            .filter(|(q, _)| *q as u32 != self.worker)
            .map(|(_, b)| b.len() as u64)
            .sum::<u64>();
        let ups: Vec<Up> = self
            .exchange(round, phase::UP, payloads)?
            .into_iter()
            .enumerate()
            .map(|(q, b)| {
                messages::decode(&b).map_err(|e| e.context(format!("worker {q}'s averaging")))
            })
            .collect::<Result<_>>()?;
        self.average_dense(&ups, locals)?;
        let averaged = self.average_rows(&ups, locals)?;
        // Down: the averaged rows to every partition holding them.
        let mut down: Vec<Rows> = (0..self.workers).map(|_| Rows::default()).collect();
        for (&part, types) in holders {
            let mut rows: TypeRows = Vec::new();
            for (ty, ids) in types.iter().enumerate() {
                let Some(avg) = averaged.get(&ty) else {
                    continue;
                };
                let d = avg.values.len() / avg.ids.len().max(1);
                let (mut got, mut values) = (Vec::new(), Vec::new());
                // Both ascending: a merge.
                let mut k = 0;
                for &id in ids {
                    while k < avg.ids.len() && avg.ids[k] < id {
                        k += 1;
                    }
                    // A row one partition alone changed is already current there.
                    if k < avg.ids.len() && avg.ids[k] == id && avg.sole[k] != part {
                        got.push(id);
                        values.extend_from_slice(&avg.values[k * d..(k + 1) * d]);
                    }
                }
                if !got.is_empty() {
                    rows.push((ty as u32, got, values));
                }
            }
            down[self.worker_of(part) as usize].parts.push((part, rows));
        }
        let payloads = down
            .iter()
            .map(messages::encode)
            .collect::<Result<Vec<_>>>()?;
        sent += payloads
            .iter()
            .enumerate()
            .filter(|(q, _)| *q as u32 != self.worker)
            .map(|(_, b)| b.len() as u64)
            .sum::<u64>();
        for (q, bytes) in self
            .exchange(round, phase::DOWN, payloads)?
            .into_iter()
            .enumerate()
        {
            let rows: Rows = messages::decode(&bytes)
                .map_err(|e| e.context(format!("worker {q}'s averaged rows")))?;
            for (part, types) in rows.parts {
                let l = locals.iter_mut().find(|l| l.part == part).ok_or_else(|| {
                    TrainError::Protocol(format!(
                        "worker {q} sent rows for partition {part}, not this worker's"
                    ))
                })?;
                for (ty, ids, values) in types {
                    let rows = l
                        .rows
                        .get_mut(ty as usize)
                        .and_then(Option::as_mut)
                        .ok_or_else(|| {
                            TrainError::Protocol(format!(
                                "worker {q} sent rows of node type {ty}, which has none"
                            ))
                        })?;
                    let d = rows.table.dim;
                    if values.len() != ids.len() * d {
                        return Err(TrainError::Protocol(format!(
                            "worker {q} sent {} values for {} rows",
                            values.len(),
                            ids.len()
                        )));
                    }
                    for (i, id) in ids.iter().enumerate() {
                        let k = rows.index(*id).ok_or_else(|| {
                            TrainError::Protocol(format!(
                                "worker {q} sent row {id}, which partition {part} does not hold"
                            ))
                        })?;
                        rows.set_row(k, &values[i * d..(i + 1) * d]);
                    }
                }
            }
        }
        for l in locals.iter_mut() {
            l.begin_round()?;
        }
        Ok(sent)
    }

    /// Every partition's dense parameters, averaged (the same on every worker).
    fn average_dense(&self, ups: &[Up], locals: &mut [Local]) -> Result<()> {
        let Some(first) = locals.first() else {
            return Ok(());
        };
        let averaged = dense_mean(
            ups.iter().flat_map(|u| u.dense.iter()).collect(),
            first.params()?,
        )?;
        locals.iter_mut().try_for_each(|l| l.set_params(&averaged))
    }

    /// The mean of every row a partition changed whose owner is here, by
    /// node type; set in every partition of this worker owning it (the
    /// others holding it get it through the down messages).
    fn average_rows(&self, ups: &[Up], locals: &mut [Local]) -> Result<Averaged> {
        let weights: BTreeMap<u32, u64> = ups
            .iter()
            .flat_map(|u| u.dense.iter().map(|d| (d.part, d.weight)))
            .collect();
        let dims: Vec<Option<usize>> = locals
            .first()
            .map(|l| {
                l.rows
                    .iter()
                    .map(|r| r.as_ref().map(|r| r.table.dim))
                    .collect()
            })
            .unwrap_or_default();
        let dim = |ty: usize| dims.get(ty).copied().flatten();
        // Per type, every contribution (id, partition, its values), flat: sorted, a row's are adjacent in partition order.
        let mut contribs: BTreeMap<usize, Vec<Contribution>> = BTreeMap::new();
        for (q, up) in ups.iter().enumerate() {
            for (part, types) in &up.rows {
                if self.worker_of(*part) != q as u32 {
                    return Err(TrainError::Protocol(format!(
                        "worker {q} sent rows of partition {part}, not its own"
                    )));
                }
                for (ty, ids, values) in types {
                    let ty = *ty as usize;
                    let d = dim(ty).ok_or_else(|| {
                        TrainError::Protocol(format!(
                            "worker {q} sent rows of node type {ty}, which has none"
                        ))
                    })?;
                    if values.len() != ids.len() * d
                        || ids.iter().any(|&id| {
                            (id as usize) >= self.owners[ty].len()
                                || self.owner_worker(ty, id) != self.worker
                        })
                    {
                        return Err(TrainError::Protocol(format!("worker {q} sent rows of type {ty} that do not fit or are not owned here")));
                    }
                    let c = contribs.entry(ty).or_default();
                    c.extend(
                        ids.iter()
                            .enumerate()
                            .map(|(i, &id)| (id, *part, &values[i * d..(i + 1) * d])),
                    );
                }
            }
        }
        let mut out = Averaged::new();
        for (ty, mut c) in contribs {
            c.sort_unstable_by_key(|&(id, part, _)| (id, part));
            let d = dim(ty).unwrap_or(0);
            let mut avg = Rows1::default();
            let mut i = 0;
            while i < c.len() {
                let j = i + c[i..].iter().take_while(|x| x.0 == c[i].0).count();
                let group: Vec<(u64, &[f32])> = c[i..j]
                    .iter()
                    .map(|&(_, p, v)| (weights.get(&p).copied().unwrap_or(0), v))
                    .collect();
                let at = avg.values.len();
                avg.values.resize(at + d, 0.0);
                weighted_mean(&group, &mut avg.values[at..]);
                avg.ids.push(c[i].0);
                avg.sole.push(if j - i == 1 { c[i].1 } else { u32::MAX });
                i = j;
            }
            // The owners' own copies.
            for l in locals.iter_mut() {
                let Some(rows) = l.rows.get_mut(ty).and_then(Option::as_mut) else {
                    continue;
                };
                for (k, &id) in avg.ids.iter().enumerate() {
                    if u32::from(self.owners[ty][id as usize]) == l.part {
                        if let Some(at) = rows.index(id) {
                            rows.set_row(at, &avg.values[k * d..(k + 1) * d]);
                        }
                    }
                }
            }
            out.insert(ty, avg);
        }
        Ok(out)
    }
}

/// The dense parameters averaged over the partitions `all` sent (any
/// order), each from `current` (this worker's values, name order) where no
/// partition changed it.
fn dense_mean(mut all: Vec<&Dense>, current: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
    all.sort_by_key(|d| d.part);
    // Per partition, where each changed parameter's values start.
    let mut offsets = Vec::new();
    for d in &all {
        if d.changed.len() != current.len() {
            return Err(TrainError::Protocol(format!(
                "partition {} sent {} parameters, {} expected",
                d.part,
                d.changed.len(),
                current.len()
            )));
        }
        let mut at = 0usize;
        let mut offs = Vec::with_capacity(current.len());
        for (i, &c) in d.changed.iter().enumerate() {
            offs.push(at);
            at += if c { current[i].len() } else { 0 };
        }
        if at != d.values.len() {
            return Err(TrainError::Protocol(format!(
                "partition {} sent {} values, its flags say {at}",
                d.part,
                d.values.len()
            )));
        }
        offsets.push(offs);
    }
    let mut averaged = current;
    for (i, out) in averaged.iter_mut().enumerate() {
        let n = out.len();
        let contribs: Vec<(u64, &[f32])> = all
            .iter()
            .zip(&offsets)
            .filter(|(d, _)| d.changed[i])
            .map(|(d, o)| (d.weight, &d.values[o[i]..o[i] + n]))
            .collect();
        // Nobody changed it: every copy still holds the last mean.
        if !contribs.is_empty() {
            weighted_mean(&contribs, out);
        }
    }
    Ok(averaged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weighted_mean_weighs_by_training_nodes_and_keeps_a_lone_value_exact() {
        let mut out = [0.0f32; 2];
        weighted_mean(&[(1, &[1.0, 10.0]), (3, &[5.0, 2.0])], &mut out);
        assert_eq!(out, [4.0, 4.0]);
        let odd = [0.1f32 + 1e-7, -3.3];
        weighted_mean(&[(7, &odd)], &mut out);
        assert_eq!(out, odd, "one contribution is taken bit for bit");
        weighted_mean(&[(0, &[1.0, 1.0]), (0, &[3.0, 5.0])], &mut out);
        assert_eq!(out, [2.0, 3.0], "weights all zero count equally");
    }

    #[test]
    fn a_parameter_a_partition_did_not_change_does_not_pull_the_mean_back() {
        let current = vec![vec![1.0f32, 1.0], vec![7.0]];
        // Partition 0 changed only the first parameter; partition 1 both.
        let a = Dense {
            part: 0,
            weight: 1,
            changed: vec![true, false],
            values: vec![3.0, 3.0],
        };
        let b = Dense {
            part: 1,
            weight: 1,
            changed: vec![true, true],
            values: vec![5.0, 1.0, 9.0],
        };
        let m = dense_mean(vec![&b, &a], current.clone()).unwrap();
        assert_eq!(
            m,
            vec![vec![4.0, 2.0], vec![9.0]],
            "the second is partition 1's alone"
        );
        let nobody = Dense {
            part: 2,
            weight: 5,
            changed: vec![false, false],
            values: vec![],
        };
        assert_eq!(
            dense_mean(vec![&nobody], current.clone()).unwrap(),
            current,
            "unchanged everywhere: kept"
        );
        let lying = Dense {
            part: 3,
            weight: 1,
            changed: vec![true, true],
            values: vec![1.0],
        };
        assert!(dense_mean(vec![&lying], current.clone())
            .unwrap_err()
            .to_string()
            .contains("its flags say 3"));
        let short = Dense {
            part: 4,
            weight: 1,
            changed: vec![true],
            values: vec![1.0, 1.0],
        };
        assert!(dense_mean(vec![&short], current)
            .unwrap_err()
            .to_string()
            .contains("1 parameters, 2 expected"));
    }
}
