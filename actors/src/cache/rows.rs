//! The cached rows of one node type in device memory: plain feature rows
//! (read-only, so any number of devices may hold copies) and learnable rows
//! with their Adam state (held by one cache only, which then owns them: the
//! host table's copy is stale until [`LearnableCache::write_back`]).
//!
//! On a CPU device, device memory is host memory: rows are plain vectors and
//! learnable rows are updated by the same [`adam_row`](models::embedding::adam_row) as the host table, so
//! a cached run is bit-identical to an uncached one. On a GPU rows are
//! tensors, gathered with `index_select` and updated with tensor arithmetic
//! that follows `adam_row` operation for operation (checked bit for bit on
//! the CPU device in the tests).

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{DType, Device, Tensor};
use models::embedding::{adam_rows_picked, EmbeddingTable, RowsMut};
use models::optim::AdamConfig;
use models::prefetch::{prefetch, AHEAD};
use rayon::prelude::*;

use crate::error::{Result, TrainError};

/// Slot of a node that is not cached.
const NONE: u32 = u32::MAX;

/// Batches of at least this many ids look their slots up in parallel.
const PARALLEL_LOOKUP: usize = 1 << 16;

/// Where a cache keeps `rows × dim` values.
enum Store {
    /// Host memory (CPU device).
    Host(Vec<f32>),
    /// A `[rows, dim]` F32 tensor on the device.
    Device(Tensor),
}

impl Store {
    fn new(
        values: Vec<f32>,
        rows: usize,
        dim: usize,
        device: &Device,
        on_device: bool,
    ) -> Result<Store> {
        Ok(if on_device {
            Store::Device(Tensor::from_vec(values, (rows, dim), device)?)
        } else {
            Store::Host(values)
        })
    }

    /// The values, row-major (copied off the device only when on one).
    fn values(&self) -> Result<std::borrow::Cow<'_, [f32]>> {
        Ok(match self {
            Store::Host(v) => std::borrow::Cow::Borrowed(v.as_slice()),
            Store::Device(t) => std::borrow::Cow::Owned(t.flatten_all()?.to_vec1()?),
        })
    }
}

/// Which positions of a batch's rows the cache serves and which it does not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    /// Rows in the batch.
    pub len: usize,
    /// Positions served from the cache, and their slots.
    pub hit_pos: Vec<u32>,
    /// See `hit_pos`.
    pub hit_slot: Vec<u32>,
    /// Positions that miss, and their node ids (in batch order).
    pub miss_pos: Vec<u32>,
    /// See `miss_pos`.
    pub miss_ids: Vec<u32>,
}

/// One node type's cached rows.
pub struct RowCache {
    dim: usize,
    /// Per node of the type, its slot (`NONE`: not cached).
    slot: Vec<u32>,
    /// Per slot, its node.
    ids: Vec<u32>,
    data: Store,
    /// Every node cached, in its own slot (`ids` is `0..count`): a lookup is the ids themselves.
    identity: bool,
    hits: AtomicU64,
    lookups: AtomicU64,
}

impl RowCache {
    /// Caches `values` (row-major, `ids.len() × dim`) as the rows `ids` of a
    /// type of `count` nodes, on `device` (host memory for the CPU).
    pub fn new(
        count: usize,
        ids: Vec<u32>,
        dim: usize,
        values: Vec<f32>,
        device: &Device,
    ) -> Result<RowCache> {
        RowCache::build(count, ids, dim, values, device, !device.is_cpu())
    }

    fn build(
        count: usize,
        ids: Vec<u32>,
        dim: usize,
        values: Vec<f32>,
        device: &Device,
        on_device: bool,
    ) -> Result<RowCache> {
        if values.len() != ids.len() * dim {
            return Err(TrainError::Config(format!(
                "cache: {} values for {} rows of width {dim}",
                values.len(),
                ids.len()
            )));
        }
        let mut slot = vec![NONE; count];
        for (s, &v) in ids.iter().enumerate() {
            match slot.get_mut(v as usize) {
                Some(x) if *x == NONE => *x = s as u32,
                Some(_) => return Err(TrainError::Config(format!("cache: node {v} listed twice"))),
                None => {
                    return Err(TrainError::Config(format!(
                        "cache: node {v} out of range 0..{count}"
                    )))
                }
            }
        }
        let data = Store::new(values, ids.len(), dim, device, on_device)?;
        let identity = ids.len() == count && ids.iter().enumerate().all(|(s, &v)| s == v as usize);
        Ok(RowCache {
            dim,
            slot,
            ids,
            data,
            identity,
            hits: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
        })
    }

    /// Cached rows.
    pub fn rows(&self) -> usize {
        self.ids.len()
    }

    /// The cached nodes, by slot.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Row width.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Whether node `v` is cached.
    pub fn contains(&self, v: u32) -> bool {
        self.slot.get(v as usize).is_some_and(|&s| s != NONE)
    }

    /// Splits `ids` into hits and misses; `count`: add them to the hit rate
    /// (training batches count, evaluation does not).
    pub fn lookup(&self, ids: &[u32], count: bool) -> Lookup {
        let mut lk = Lookup {
            len: ids.len(),
            ..Lookup::default()
        };
        if self.identity && ids.iter().all(|&v| (v as usize) < self.slot.len()) {
            // A cache of the whole type in id order (at S=1, a step's ~500,000 ids): nothing to read.
            lk.hit_pos = (0..ids.len() as u32).collect();
            lk.hit_slot = ids.to_vec();
            if count {
                self.hits.fetch_add(ids.len() as u64, Ordering::Relaxed);
                self.lookups.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
            return lk;
        }
        let slot_of = |&v: &u32| self.slot.get(v as usize).copied().unwrap_or(NONE);
        // A batch's ids are scattered over the slot map: read it on every core
        // for large batches (hundreds of thousands of rows at S=1), then split.
        let slots: Vec<u32> = match ids.len() >= PARALLEL_LOOKUP {
            true => ids
                .par_iter()
                .with_min_len(PARALLEL_LOOKUP / 4)
                .map(slot_of)
                .collect(),
            false => ids.iter().map(slot_of).collect(),
        };
        if !slots.contains(&NONE) {
            // Every row a hit (a cache holding the whole type): the slots are the lookup.
            lk.hit_pos = (0..ids.len() as u32).collect();
            lk.hit_slot = slots;
        } else {
            for (p, (&v, &s)) in ids.iter().zip(&slots).enumerate() {
                if s == NONE {
                    lk.miss_pos.push(p as u32);
                    lk.miss_ids.push(v);
                } else {
                    lk.hit_pos.push(p as u32);
                    lk.hit_slot.push(s);
                }
            }
        }
        if count {
            self.hits
                .fetch_add(lk.hit_pos.len() as u64, Ordering::Relaxed);
            self.lookups.fetch_add(ids.len() as u64, Ordering::Relaxed);
        }
        lk
    }

    /// The cached ones of `ids` and their rows (row-major, copied to the
    /// host), in `ids` order; uncached ids are left out.
    pub fn read(&self, ids: &[u32]) -> Result<(Vec<u32>, Vec<f32>)> {
        let (held, slots): (Vec<u32>, Vec<u32>) = ids
            .iter()
            .filter_map(|&v| {
                self.slot
                    .get(v as usize)
                    .filter(|&&s| s != NONE)
                    .map(|&s| (v, s))
            })
            .unzip();
        let d = self.dim;
        let rows = match &self.data {
            Store::Host(data) => slots
                .iter()
                .flat_map(|&s| data[s as usize * d..(s as usize + 1) * d].iter().copied())
                .collect(),
            Store::Device(_) if slots.is_empty() => Vec::new(),
            Store::Device(t) => {
                let at = Tensor::from_vec(slots, held.len(), t.device())?;
                t.index_select(&at, 0)?.flatten_all()?.to_vec1()?
            }
        };
        Ok((held, rows))
    }

    /// Rows hit and rows looked up so far (training batches only).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.lookups.load(Ordering::Relaxed),
        )
    }

    /// The batch's rows as a `[len, dim]` tensor of `dtype` on `device`: hits
    /// from the cache, misses from `misses` (row-major, in `lk.miss_ids` order).
    pub fn assemble(
        &self,
        lk: &Lookup,
        misses: Vec<f32>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let d = self.dim;
        if misses.len() != lk.miss_ids.len() * d {
            return Err(TrainError::Config(format!(
                "cache: {} miss values for {} rows of width {d}",
                misses.len(),
                lk.miss_ids.len()
            )));
        }
        if let Store::Device(data) = &self.data {
            return Ok(device_assemble(data, lk, misses, d, device)?.to_dtype(dtype)?);
        }
        self.assemble_from(lk, |j| &misses[j * d..(j + 1) * d], dtype, device)
    }

    /// [`RowCache::assemble`] with the `j`-th miss's row read by `miss_row(j)`
    /// (on the CPU straight into the batch: no intermediate copy).
    pub fn assemble_from<'a>(
        &self,
        lk: &Lookup,
        miss_row: impl Fn(usize) -> &'a [f32],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let d = self.dim;
        let x = match &self.data {
            Store::Host(data) => {
                // Hit and miss positions are both ascending: one merge walk in batch order.
                let mut out = Vec::with_capacity(lk.len * d);
                let (mut h, mut m) = (0, 0);
                for p in 0..lk.len as u32 {
                    // Rows are scattered: ask for later ones early, as the host gathers do.
                    if let Some(&s) = lk.hit_slot.get(h + AHEAD) {
                        prefetch(&data[s as usize * d..(s as usize + 1) * d]);
                    }
                    if m + AHEAD < lk.miss_ids.len() {
                        prefetch(miss_row(m + AHEAD));
                    }
                    if lk.hit_pos.get(h) == Some(&p) {
                        let s = lk.hit_slot[h] as usize;
                        out.extend_from_slice(&data[s * d..(s + 1) * d]);
                        h += 1;
                    } else {
                        let row = miss_row(m);
                        if row.len() != d {
                            return Err(TrainError::Config(format!(
                                "cache: a miss row of width {}, not {d}",
                                row.len()
                            )));
                        }
                        out.extend_from_slice(row);
                        m += 1;
                    }
                }
                Tensor::from_vec(out, (lk.len, d), device)?
            }
            Store::Device(data) => {
                let mut misses = Vec::with_capacity(lk.miss_ids.len() * d);
                for j in 0..lk.miss_ids.len() {
                    misses.extend_from_slice(miss_row(j));
                }
                device_assemble(data, lk, misses, d, device)?
            }
        };
        Ok(x.to_dtype(dtype)?)
    }

    /// Device bytes of the cached values.
    pub fn bytes(&self) -> u64 {
        (self.ids.len() * self.dim * 4) as u64
    }
}

/// Hits gathered on the device, misses uploaded, then both put in batch order.
fn device_assemble(
    data: &Tensor,
    lk: &Lookup,
    misses: Vec<f32>,
    d: usize,
    device: &Device,
) -> Result<Tensor> {
    if misses.len() != lk.miss_ids.len() * d {
        return Err(TrainError::Config(format!(
            "cache: {} miss values for {} rows of width {d}",
            misses.len(),
            lk.miss_ids.len()
        )));
    }
    let h = lk.hit_slot.len();
    // Every row hit (a cache holding the whole type): one gather, already in batch order.
    if lk.miss_ids.is_empty() {
        return Ok(models::ops::take_rows(data, &lk.hit_slot)?);
    }
    let hit = models::ops::take_rows(data, &lk.hit_slot)?;
    let miss = Tensor::from_vec(misses, (lk.miss_ids.len(), d), device)?;
    let mut order = vec![0u32; lk.len];
    for (k, &p) in lk.hit_pos.iter().enumerate() {
        order[p as usize] = k as u32;
    }
    for (j, &p) in lk.miss_pos.iter().enumerate() {
        order[p as usize] = (h + j) as u32;
    }
    Ok(Tensor::cat(&[hit, miss], 0)?.index_select(&Tensor::from_vec(order, lk.len, device)?, 0)?)
}

/// Learnable rows cached with their Adam state; the cache owns them.
pub struct LearnableCache {
    rows: RowCache,
    m: Store,
    v: Store,
    /// Per slot, its step count (on a CUDA device, `device_steps` holds the current ones).
    steps: Vec<u32>,
    bias: models::optim::BiasTable,
    device_steps: Option<DeviceSteps>,
}

/// A GPU cache's step counts, kept there (its Adam kernel bumps them), and
/// Adam's bias corrections by step count for the kernel to read.
struct DeviceSteps {
    /// `[rows]` u32, by slot.
    steps: Tensor,
    /// `[len, 2]` f64: row `t`, the corrections after `t` updates.
    table: Tensor,
    /// No row's count is above this.
    bound: u32,
    /// The betas (bits) of the table; `None` before the first is made.
    betas: Option<(u64, u64)>,
}

/// Cache bytes one learnable row of width `dim` takes: value, both moments and its step count.
pub fn learnable_row_bytes(dim: usize) -> u64 {
    (3 * dim * 4 + 4) as u64
}

impl LearnableCache {
    /// Takes rows `ids` of `table` (values and Adam state) into the cache on `device`.
    pub fn from_table(
        table: &EmbeddingTable,
        ids: Vec<u32>,
        device: &Device,
    ) -> Result<LearnableCache> {
        LearnableCache::build(table, ids, device, !device.is_cpu())
    }

    fn build(
        table: &EmbeddingTable,
        ids: Vec<u32>,
        device: &Device,
        on_device: bool,
    ) -> Result<LearnableCache> {
        let d = table.dim;
        let pick = |src: &[f32]| -> Vec<f32> {
            let mut out = Vec::with_capacity(ids.len() * d);
            for &v in &ids {
                out.extend_from_slice(&src[v as usize * d..(v as usize + 1) * d]);
            }
            out
        };
        if let Some(&bad) = ids.iter().find(|&&v| v as usize >= table.rows) {
            return Err(TrainError::Config(format!(
                "cache: node {bad} out of range 0..{}",
                table.rows
            )));
        }
        let (data, m, v) = (pick(&table.data), pick(&table.m), pick(&table.v));
        let steps = ids.iter().map(|&i| table.steps[i as usize]).collect();
        let n = ids.len();
        let rows = RowCache::build(table.rows, ids, d, data, device, on_device)?;
        Ok(LearnableCache {
            rows,
            m: Store::new(m, n, d, device, on_device)?,
            v: Store::new(v, n, d, device, on_device)?,
            steps,
            bias: Default::default(),
            device_steps: None,
        })
    }

    /// The cached rows (for lookups and gathers).
    pub fn rows(&self) -> &RowCache {
        &self.rows
    }

    /// Device bytes: values, moments and step counts.
    pub fn bytes(&self) -> u64 {
        self.rows.rows() as u64 * learnable_row_bytes(self.rows.dim)
    }

    /// One Adam step for the cached rows at `slots` (distinct), the gradient
    /// of `slots[k]` being row `at[k]` of `grads` (row-major): what
    /// [`adam_row`](models::embedding::adam_row) does to them in the host table.
    pub fn adam(
        &mut self,
        slots: &[u32],
        grads: &[f32],
        at: &[u32],
        cfg: &AdamConfig,
    ) -> Result<()> {
        let d = self.rows.dim;
        if at.len() != slots.len()
            || at.iter().any(|&p| (p as usize + 1) * d > grads.len())
            || slots.iter().any(|&s| s as usize >= self.steps.len())
        {
            return Err(TrainError::Config(format!(
                "cache: {} gradient values for {} cached rows of width {d}",
                grads.len(),
                slots.len()
            )));
        }
        if slots.is_empty() {
            return Ok(());
        }
        match (&mut self.rows.data, &mut self.m, &mut self.v) {
            // Rows in parallel, as the host table updates its own.
            (Store::Host(data), Store::Host(m), Store::Host(v)) => adam_rows_picked(
                RowsMut {
                    data,
                    m,
                    v,
                    steps: &mut self.steps,
                    dim: d,
                },
                slots,
                grads,
                at,
                cfg,
            )
            .map_err(|e| TrainError::Config(format!("cache: {e}"))),
            (Store::Device(data), _, _) => {
                let dev = data.device().clone();
                let grads: Vec<f32> = at
                    .iter()
                    .flat_map(|&p| grads[p as usize * d..(p as usize + 1) * d].iter().copied())
                    .collect();
                let g = Tensor::from_vec(grads, (slots.len(), d), &dev)?;
                self.device_adam(slots, &g, cfg)
            }
            _ => unreachable!("a cache keeps all its arrays in one place"),
        }
    }

    /// [`LearnableCache::adam`] with the gradient a tensor on the cache's
    /// device (row `at[k]` for slot `slots[k]`): on a GPU the rows never
    /// leave it, so the step needs no copy to the host and back.
    pub fn adam_tensor(
        &mut self,
        slots: &[u32],
        grad: &Tensor,
        at: &[u32],
        cfg: &AdamConfig,
    ) -> Result<()> {
        let d = self.rows.dim;
        let n = grad.dims().first().copied().unwrap_or(0);
        if grad.dims() != [n, d]
            || at.len() != slots.len()
            || at.iter().any(|&p| p as usize >= n)
            || slots.iter().any(|&s| s as usize >= self.steps.len())
        {
            return Err(TrainError::Config(format!(
                "cache: a gradient of shape {:?} for {} cached rows of width {d}",
                grad.dims(),
                slots.len()
            )));
        }
        if slots.is_empty() {
            return Ok(());
        }
        let grad = grad.to_dtype(DType::F32)?;
        if !matches!(self.rows.data, Store::Device(_)) {
            return models::ops::with_f32(&grad, |g| self.adam(slots, g, at, cfg))?;
        }
        let all_in_order = at.len() == n && at.iter().enumerate().all(|(k, &p)| p as usize == k);
        let g = match all_in_order {
            true => grad,
            false => grad.index_select(&Tensor::from_slice(at, at.len(), grad.device())?, 0)?,
        };
        self.device_adam(slots, &g, cfg)
    }

    /// Adam on the device for `slots` (distinct, checked) with gradient rows `g` (`[slots.len(), dim]`, on the device).
    fn device_adam(&mut self, slots: &[u32], g: &Tensor, cfg: &AdamConfig) -> Result<()> {
        let (Store::Device(data), Store::Device(m), Store::Device(v)) =
            (&mut self.rows.data, &mut self.m, &mut self.v)
        else {
            unreachable!("a cache keeps all its arrays in one place")
        };
        let dev = data.device().clone();
        let (n, d) = (slots.len(), self.rows.dim);
        // On a GPU one kernel updates every row in place, and another bumps
        // the rows' step counts, which live there: nothing is done per row here.
        if dev.is_cuda() {
            let ds = match &mut self.device_steps {
                Some(ds) => ds,
                slot => {
                    let bound = self.steps.iter().copied().max().unwrap_or(0);
                    let steps = Tensor::from_slice(&self.steps, self.steps.len(), &dev)?;
                    slot.insert(DeviceSteps {
                        table: Tensor::zeros((2, 2), DType::F64, &dev)?,
                        steps,
                        bound,
                        betas: None,
                    })
                }
            };
            // This update takes no row's count past bound + 1; the table must reach it.
            ds.bound = ds.bound.saturating_add(1);
            let betas = Some((cfg.beta1.to_bits(), cfg.beta2.to_bits()));
            let len = ds.table.dims()[0];
            if ds.betas != betas || len <= ds.bound as usize {
                let len = (2 * (ds.bound as usize + 1)).max(1024);
                let pairs: Vec<f64> = (0..len as u32)
                    .flat_map(|t| <[f64; 2]>::from(self.bias.get(cfg, t)))
                    .collect();
                ds.table = Tensor::from_vec(pairs, (len, 2), &dev)?;
                ds.betas = betas;
            }
            models::ops::adam_rows_in_place(
                data,
                m,
                v,
                &ds.steps,
                slots,
                &g.contiguous()?,
                &ds.table,
                cfg,
            )?;
            return Ok(());
        }
        // Each row's step count after this step (written back once the update is made).
        let (steps, table) = (&self.steps, &mut self.bias);
        let top = slots.iter().map(|&s| steps[s as usize]).max().unwrap_or(0);
        table.get(cfg, top + 1);
        let table = &*table;
        // Elsewhere (the CPU device, in tests) tensor arithmetic does the same, operation for operation.
        let (bc1, bc2): (Vec<f64>, Vec<f64>) = slots
            .iter()
            .map(|&s| table.at(steps[s as usize] + 1))
            .unzip();
        let (bc1, bc2) = (
            Tensor::from_vec(bc1, (n, 1), &dev)?,
            Tensor::from_vec(bc2, (n, 1), &dev)?,
        );
        let idx = Tensor::from_slice(slots, n, &dev)?;
        let at = idx.unsqueeze(1)?.broadcast_as((n, d))?.contiguous()?;
        let (b1, b2) = (cfg.beta1 as f32, cfg.beta2 as f32);
        // The order of adam_row's operations, each rounded the same way.
        let m1 = (m.index_select(&idx, 0)?.affine(f64::from(b1), 0.0)?
            + g.affine(f64::from(1.0 - b1), 0.0)?)?;
        let v1 = (v.index_select(&idx, 0)?.affine(f64::from(b2), 0.0)?
            + (g.affine(f64::from(1.0 - b2), 0.0)? * g)?)?;
        let mhat = m1.to_dtype(DType::F64)?.broadcast_div(&bc1)?;
        let vhat = v1.to_dtype(DType::F64)?.broadcast_div(&bc2)?;
        let step = (mhat.affine(cfg.lr, 0.0)? / vhat.sqrt()?.affine(1.0, cfg.eps)?)?
            .to_dtype(DType::F32)?;
        let x1 = (data.index_select(&idx, 0)? - step)?;
        m.scatter_set(&at, &m1, 0)?;
        v.scatter_set(&at, &v1, 0)?;
        data.scatter_set(&at, &x1, 0)?;
        for &s in slots {
            self.steps[s as usize] += 1;
        }
        Ok(())
    }

    /// Copies the cached rows and their Adam state into `table`, which then
    /// holds the current values of every row (for checkpoints, evaluation
    /// readers and the final model).
    pub fn write_back(&self, table: &mut EmbeddingTable) -> Result<()> {
        let d = self.rows.dim;
        let (data, m, v) = (self.rows.data.values()?, self.m.values()?, self.v.values()?);
        let steps = match &self.device_steps {
            Some(ds) => ds.steps.to_vec1::<u32>()?,
            None => self.steps.clone(),
        };
        for (s, &id) in self.rows.ids.iter().enumerate() {
            let (dst, src) = (id as usize * d..(id as usize + 1) * d, s * d..(s + 1) * d);
            table.data[dst.clone()].copy_from_slice(&data[src.clone()]);
            table.m[dst.clone()].copy_from_slice(&m[src.clone()]);
            table.v[dst].copy_from_slice(&v[src]);
            table.steps[id as usize] = steps[s];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: usize, dim: usize) -> EmbeddingTable {
        EmbeddingTable::new(7, "embed.t", rows, dim)
    }

    #[test]
    fn lookups_split_hits_and_misses_and_assemble_in_batch_order() {
        let t = table(10, 3);
        for on_device in [false, true] {
            let ids = [4usize, 1, 8];
            let vals: Vec<f32> = ids
                .iter()
                .flat_map(|&v| t.data[v * 3..v * 3 + 3].to_vec())
                .collect();
            let c = RowCache::build(
                10,
                ids.iter().map(|&v| v as u32).collect(),
                3,
                vals,
                &Device::Cpu,
                on_device,
            )
            .unwrap();
            let batch = [8u32, 0, 1, 9, 4];
            let lk = c.lookup(&batch, true);
            assert_eq!(
                (lk.hit_pos.clone(), lk.hit_slot.clone()),
                (vec![0, 2, 4], vec![2, 1, 0])
            );
            assert_eq!(
                (lk.miss_pos.clone(), lk.miss_ids.clone()),
                (vec![1, 3], vec![0, 9])
            );
            let misses: Vec<f32> = lk
                .miss_ids
                .iter()
                .flat_map(|&v| t.data[v as usize * 3..v as usize * 3 + 3].to_vec())
                .collect();
            let x: Vec<f32> = c
                .assemble(&lk, misses, DType::F32, &Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let want: Vec<f32> = batch
                .iter()
                .flat_map(|&v| t.data[v as usize * 3..v as usize * 3 + 3].to_vec())
                .collect();
            assert_eq!(x, want);
            // Every row a hit: the device store's one-gather path.
            let all = [1u32, 8, 4, 1];
            let lk_all = c.lookup(&all, false);
            let x: Vec<f32> = c
                .assemble(&lk_all, Vec::new(), DType::F32, &Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(
                x,
                all.iter()
                    .flat_map(|&v| t.data[v as usize * 3..v as usize * 3 + 3].to_vec())
                    .collect::<Vec<f32>>()
            );
            c.lookup(&batch, false);
            assert_eq!(c.counts(), (3, 5), "evaluation lookups are not counted");
            assert!(
                c.assemble(&lk, vec![1.0], DType::F32, &Device::Cpu)
                    .is_err(),
                "wrong number of miss values"
            );
        }
        assert!(
            RowCache::new(5, vec![1, 1], 1, vec![0.0, 0.0], &Device::Cpu).is_err(),
            "a row twice"
        );
        assert!(
            RowCache::new(5, vec![5], 1, vec![0.0], &Device::Cpu).is_err(),
            "a row out of range"
        );
    }

    #[test]
    fn large_lookups_read_slots_in_parallel_and_split_as_small_ones_do() {
        let count = 200_000u32;
        let ids: Vec<u32> = (0..count).filter(|v| v % 3 == 0).collect();
        let c = RowCache::build(
            count as usize,
            ids.clone(),
            0,
            Vec::new(),
            &Device::Cpu,
            false,
        )
        .unwrap();
        let batch: Vec<u32> = (0..100_000u32)
            .map(|k| k.wrapping_mul(2_654_435_761) % count)
            .collect();
        let lk = c.lookup(&batch, true);
        let (mut hit_pos, mut hit_slot, mut miss_pos, mut miss_ids) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (p, &v) in batch.iter().enumerate() {
            if v % 3 == 0 {
                hit_pos.push(p as u32);
                hit_slot.push(v / 3);
            } else {
                miss_pos.push(p as u32);
                miss_ids.push(v);
            }
        }
        assert_eq!(
            lk,
            Lookup {
                len: batch.len(),
                hit_pos,
                hit_slot,
                miss_pos,
                miss_ids
            }
        );
        // A cache of every row in id order answers without its slot map, as one built otherwise would.
        let whole = RowCache::build(
            count as usize,
            (0..count).collect(),
            0,
            Vec::new(),
            &Device::Cpu,
            false,
        )
        .unwrap();
        let shuffled = RowCache::build(
            count as usize,
            (0..count).rev().collect(),
            0,
            Vec::new(),
            &Device::Cpu,
            false,
        )
        .unwrap();
        assert!(whole.identity && !shuffled.identity);
        let lk = whole.lookup(&batch, true);
        assert_eq!(
            (lk.hit_pos.len(), lk.hit_slot.clone(), lk.miss_pos.len()),
            (batch.len(), batch.clone(), 0)
        );
        assert_eq!(whole.counts(), (batch.len() as u64, batch.len() as u64));
        let far = [3u32, count];
        assert_eq!(
            (
                whole.lookup(&far, false).miss_ids,
                shuffled.lookup(&far, false).miss_ids
            ),
            (vec![count], vec![count]),
            "an id past the end misses"
        );
        let all: Vec<u32> = batch.iter().map(|v| v - v % 3).collect();
        let lk = c.lookup(&all, true);
        assert_eq!((lk.hit_pos.len(), lk.miss_pos.len()), (all.len(), 0));
        assert!(lk.hit_slot.iter().zip(&all).all(|(&s, &v)| s == v / 3));
        assert_eq!(
            c.counts(),
            (
                lk.hit_pos.len() as u64 + batch.iter().filter(|v| *v % 3 == 0).count() as u64,
                2 * batch.len() as u64
            )
        );
    }

    #[test]
    fn cached_adam_matches_the_host_table_bit_for_bit_in_both_stores() {
        let cfg = AdamConfig::with_lr(0.05);
        for (on_device, via_tensor) in [(false, false), (true, false), (false, true), (true, true)]
        {
            let mut host = table(20, 5);
            let mut cached = table(20, 5);
            let ids = vec![3u32, 17, 0, 9];
            let mut c =
                LearnableCache::build(&cached, ids.clone(), &Device::Cpu, on_device).unwrap();
            let mut x = 99u32;
            for step in 0..6 {
                // A different subset each step: rows' step counts diverge.
                let touched: Vec<u32> = (0..20u32).filter(|v| (v + step) % 3 != 0).collect();
                let g: Vec<f32> = (0..touched.len() * 5)
                    .map(|_| {
                        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                        (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                    })
                    .collect();
                let gt = Tensor::from_slice(&g, (touched.len(), 5), &Device::Cpu).unwrap();
                host.sparse_adam(&touched, &gt, &cfg).unwrap();
                let lk = c.rows().lookup(&touched, true);
                match via_tensor {
                    // The gradient stays a tensor (on a GPU it would stay there).
                    true => c.adam_tensor(&lk.hit_slot, &gt, &lk.hit_pos, &cfg).unwrap(),
                    false => c.adam(&lk.hit_slot, &g, &lk.hit_pos, &cfg).unwrap(),
                }
                cached
                    .adam_rows_picked(&lk.miss_ids, &g, &lk.miss_pos, &cfg)
                    .unwrap();
            }
            c.write_back(&mut cached).unwrap();
            assert_eq!(
                cached.data, host.data,
                "on_device={on_device}, via_tensor={via_tensor}"
            );
            assert_eq!(
                (cached.m.clone(), cached.v.clone(), cached.steps.clone()),
                (host.m.clone(), host.v.clone(), host.steps.clone())
            );
            assert_eq!(c.bytes(), 4 * learnable_row_bytes(5));
            assert!(
                c.adam(&[0], &[0.0; 5], &[1], &cfg).is_err(),
                "a gradient row past the end"
            );
            assert!(
                c.adam(&[0, 1], &[0.0; 10], &[0], &cfg).is_err(),
                "a position per row"
            );
            let two = Tensor::zeros((2, 5), DType::F32, &Device::Cpu).unwrap();
            assert!(
                c.adam_tensor(&[0], &two, &[2], &cfg).is_err(),
                "a gradient row past the end"
            );
            assert!(
                c.adam_tensor(
                    &[0],
                    &Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap(),
                    &[0],
                    &cfg
                )
                .is_err(),
                "a narrower gradient"
            );
        }
    }
}
