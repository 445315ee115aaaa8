//! A worker's update after a step: its own gradients, those of parameters
//! and embedding rows it shares with other workers summed in worker order
//! (so every copy takes the same update), then Adam, dense and sparse.

use super::super::messages::{self, round, Shared, SharedGrads};
use super::{StepOut, Worker};
use crate::epoch::lap;
use crate::error::{Result, TrainError};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor};
use graphs::MiniBatch;
use models::Model;
use runtime::ByteVec;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

impl Worker<'_> {
    /// Sums the gradients of shared parameters and rows with their other
    /// holders (in worker order) and applies Adam to everything this worker holds.
    pub(super) fn update(
        &mut self,
        seq: u64,
        mb: &MiniBatch,
        inputs: &models::rgcn::PerType,
        grads: Option<&GradStore>,
        out: &mut StepOut,
    ) -> Result<()> {
        let mut clock = Instant::now();
        let s = self.setup;
        let w = s.worker as usize;
        let grad_of = |t: &Tensor| grads.and_then(|g| g.get(t)).cloned();
        let mine: BTreeMap<String, Tensor> = self
            .model
            .params
            .iter()
            .filter_map(|(n, v)| grad_of(v.as_tensor()).map(|g| (n.to_string(), g)))
            .collect();
        if let Some(stray) = mine.keys().find(|n| !self.used.contains(*n)) {
            return Err(TrainError::Internal(format!(
                "worker {w} computed a gradient for {stray}, outside its planned parameters"
            )));
        }
        let my_rows: Vec<Option<Vec<f32>>> = inputs
            .iter()
            .enumerate()
            .map(
                |(ty, x)| match (x, self.model.embeddings.get(ty).and_then(Option::as_ref)) {
                    (Some(x), Some(_)) => grad_of(x)
                        .map(|g| {
                            g.to_dtype(DType::F32)
                                .and_then(|g| g.flatten_all())
                                .and_then(|g| g.to_vec1::<f32>())
                        })
                        .transpose(),
                    _ => Ok(None),
                },
            )
            .collect::<candle_core::Result<_>>()?;
        // Send each co-holder what it shares with this worker.
        let mut msgs = Vec::new();
        for k in 0..self.workers() as usize {
            if k == w || (self.shared[k].is_empty() && self.shared_tables[k].is_empty()) {
                continue;
            }
            let mut msg = SharedGrads::default();
            for n in &self.shared[k] {
                match mine.get(n) {
                    Some(gr) => {
                        msg.present.push(true);
                        msg.dense
                            .extend(gr.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?);
                    }
                    None => msg.present.push(false),
                }
            }
            for &ty in &self.shared_tables[k] {
                if let Some(rows) = &my_rows[ty] {
                    msg.rows
                        .push((ty as u32, mb.blocks[0].src[ty].clone(), rows.clone()));
                }
            }
            msgs.push((
                &self.s.workers[k],
                Shared {
                    gen: s.gen,
                    seq,
                    from: w as u32,
                    data: ByteVec(messages::encode(&msg)?),
                },
            ));
        }
        self.send_all(msgs)?;
        let peers: Vec<u32> = (0..self.workers())
            .filter(|&k| {
                k as usize != w
                    && !(self.shared[k as usize].is_empty()
                        && self.shared_tables[k as usize].is_empty())
            })
            .collect();
        let raw = s.inbox.raw(
            "the shared gradients",
            seq,
            round::SHARED,
            &peers,
            s.timeouts.step,
        )?;
        out.comm_s += lap(&mut clock);
        let mut theirs: BTreeMap<u32, SharedGrads> = BTreeMap::new();
        for (k, bytes) in peers.iter().zip(&raw) {
            let m: SharedGrads = messages::decode(bytes)
                .map_err(|e| e.context(format!("worker {k}'s shared gradients")))?;
            if m.present.len() != self.shared[*k as usize].len() {
                return Err(TrainError::Protocol(format!(
                    "worker {k} sent {} shared gradients, {} expected",
                    m.present.len(),
                    self.shared[*k as usize].len()
                )));
            }
            theirs.insert(*k, m);
        }
        // Dense: per parameter, the present gradients in worker order.
        let mut summed: BTreeMap<String, Tensor> = BTreeMap::new();
        let mut offsets: BTreeMap<u32, usize> = theirs.keys().map(|&k| (k, 0)).collect();
        let mut contrib: BTreeMap<String, Vec<(u32, Tensor)>> = BTreeMap::new();
        for (k, m) in &theirs {
            for (n, &present) in self.shared[*k as usize].iter().zip(&m.present) {
                if !present {
                    continue;
                }
                let var = self
                    .model
                    .params
                    .get(n)
                    .ok_or_else(|| TrainError::internal(format!("unknown parameter {n}")))?;
                let len = var.elem_count();
                let at = offsets[k];
                let vals = m.dense.get(at..at + len).ok_or_else(|| {
                    TrainError::Protocol(format!("worker {k}'s shared gradients are short"))
                })?;
                offsets.insert(*k, at + len);
                contrib
                    .entry(n.clone())
                    .or_default()
                    .push((*k, Tensor::from_slice(vals, var.shape(), &self.device)?));
            }
        }
        for (k, m) in &theirs {
            if offsets[k] != m.dense.len() {
                return Err(TrainError::Protocol(format!(
                    "worker {k}'s shared gradients have {} extra values",
                    m.dense.len() - offsets[k]
                )));
            }
        }
        for (n, gr) in &mine {
            contrib
                .entry(n.clone())
                .or_default()
                .push((w as u32, gr.clone()));
        }
        for (n, mut parts) in contrib {
            parts.sort_by_key(|(k, _)| *k);
            let mut acc: Option<Tensor> = None;
            for (_, t) in parts {
                let t = t.to_dtype(DType::F32)?;
                acc = Some(match acc {
                    Some(a) => (a + t)?,
                    None => t,
                });
            }
            if let Some(a) = acc {
                summed.insert(n, a);
            }
        }
        // Embedding rows: the union of the holders' rows, gradients summed in
        // worker order. Everything is checked before anything is applied.
        for (k, m) in &theirs {
            let mut types = BTreeSet::new();
            for (ty, ids, vals) in &m.rows {
                let ty = *ty as usize;
                let dim = self
                    .model
                    .embeddings
                    .get(ty)
                    .and_then(Option::as_ref)
                    .map(|e| e.dim);
                let count = s.graph.node_types().get(ty).map_or(0, |t| t.count);
                let ok = dim.is_some_and(|d| vals.len() == ids.len() * d)
                    && self.shared_tables[*k as usize].contains(&ty)
                    && types.insert(ty)
                    && distinct_below(&mut self.row_slot, ids, count)
                    && vals.iter().all(|x| x.is_finite());
                if !ok {
                    return Err(TrainError::Protocol(format!(
                        "worker {k} sent malformed rows of node type {ty}"
                    )));
                }
            }
        }
        self.adam.step_named(&self.model.params, &summed)?;
        let n_types = self.model.embeddings.len();
        for ty in 0..n_types {
            let Some(dim) = self.model.embeddings[ty].as_ref().map(|e| e.dim) else {
                continue;
            };
            let mut sources: Vec<(u32, &[u32], &[f32])> = Vec::new();
            if let Some(Some(rows)) = my_rows.get(ty) {
                sources.push((w as u32, &mb.blocks[0].src[ty], rows));
            }
            for (k, m) in &theirs {
                sources.extend(
                    m.rows
                        .iter()
                        .filter(|(t2, _, _)| *t2 as usize == ty)
                        .map(|(_, ids, vals)| (*k, ids.as_slice(), vals.as_slice())),
                );
            }
            if sources.is_empty() {
                continue;
            }
            sources.sort_by_key(|(k, _, _)| *k);
            // Rows in order of first appearance, each summed in worker order,
            // straight into one gradient buffer (ids were checked < count).
            let count = s.graph.node_types()[ty].count as usize;
            if self.row_slot.len() < count {
                self.row_slot.resize(count, u32::MAX);
            }
            let mut order: Vec<u32> = Vec::new();
            let mut grads: Vec<f32> = Vec::new();
            for (_, ids, vals) in &sources {
                for (i, &v) in ids.iter().enumerate() {
                    let row = &vals[i * dim..(i + 1) * dim];
                    match self.row_slot[v as usize] {
                        u32::MAX => {
                            self.row_slot[v as usize] = order.len() as u32;
                            order.push(v);
                            grads.extend_from_slice(row);
                        }
                        at => grads[at as usize * dim..(at as usize + 1) * dim]
                            .iter_mut()
                            .zip(row)
                            .for_each(|(a, b)| *a += b),
                    }
                }
            }
            for &v in &order {
                self.row_slot[v as usize] = u32::MAX;
            }
            let cfg = self.adam.cfg;
            let table = self.model.embeddings[ty].as_mut().expect("checked above");
            match self.cache.as_mut() {
                Some(c) => c.adam_rows(ty, table, &order, &grads, &cfg)?,
                None => table.adam_rows(&order, &grads, &cfg)?,
            }
        }
        out.update_s += lap(&mut clock);
        Ok(())
    }
}

/// Whether `ids` are distinct and all below `count`, marking them in `slot`
/// (all `u32::MAX` before and after: the marks are undone before returning).
pub(super) fn distinct_below(slot: &mut Vec<u32>, ids: &[u32], count: u32) -> bool {
    if ids.iter().any(|&v| v >= count) {
        return false;
    }
    if slot.len() < count as usize {
        slot.resize(count as usize, u32::MAX);
    }
    let mut seen = 0;
    let distinct = ids.iter().all(|&v| {
        let fresh = slot[v as usize] == u32::MAX;
        slot[v as usize] = 0;
        seen += 1;
        fresh
    });
    for &v in &ids[..seen] {
        slot[v as usize] = u32::MAX;
    }
    distinct
}

/// Adds the gradients in `more` (of parameters and learnable inputs) into `into`.
pub(super) fn add_grads(
    into: &mut GradStore,
    more: &GradStore,
    model: &Model,
    inputs: &models::rgcn::PerType,
) -> Result<()> {
    let tensors = model
        .params
        .iter()
        .map(|(_, v)| v.as_tensor().clone())
        .chain(inputs.iter().flatten().cloned());
    for t in tensors {
        if let Some(g2) = more.get(&t) {
            let sum = match into.get(&t) {
                Some(g1) => (g1 + g2)?,
                None => g2.clone(),
            };
            into.insert(&t, sum);
        }
    }
    Ok(())
}
