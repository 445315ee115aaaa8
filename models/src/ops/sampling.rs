//! Neighbour sampling on a CUDA device (`sampling.cu`): each relation's
//! in-CSR in device memory, a thread per destination drawing exactly the
//! picks of graphs' CPU sampler (the draws are pure functions of the layer's
//! key and the node), the blocks then built on the host from the picks
//! ([`graphs::Sampler::sample_by`]), so a batch is the CPU sampler's bit for
//! bit.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::Device;
use graphs::{HetGraph, MiniBatch, RelationId, RelationPicks, Sampler};

use super::cuda::{compiled, launch_cfg_elems, upload, PtxCell};
use crate::{ModelError, Result};

const SOURCE: &str = include_str!("sampling.cu");
const MODULE: &str = "hetgnn-sampling";

/// The largest fanout the kernels draw (`PICK_MAX_FANOUT` in sampling.cu).
pub const MAX_DEVICE_FANOUT: usize = 64;

/// A graph's relations' in-CSRs in one device's memory, for drawing picks there.
pub struct DeviceSampler {
    dev: CudaDevice,
    /// Per relation (by id): row offsets, neighbour ids, and the row count.
    relations: Vec<(CudaSlice<u64>, CudaSlice<u32>, usize)>,
}

impl DeviceSampler {
    /// Uploads every relation's in-CSR of `g` to `device` (a CUDA device).
    pub fn new(g: &HetGraph, device: &Device) -> Result<DeviceSampler> {
        let Device::Cuda(dev) = device else {
            return Err(ModelError::Config(format!(
                "device sampling needs a CUDA device, not {device:?}"
            )));
        };
        let relations = g
            .relations()
            .iter()
            .map(|r| {
                let csr = r.in_csr();
                Ok((
                    upload(dev, csr.offsets())?,
                    upload(dev, csr.indices())?,
                    csr.offsets().len().saturating_sub(1),
                ))
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(DeviceSampler {
            dev: dev.clone(),
            relations,
        })
    }

    /// `sampler`'s batch for `seeds` at (`epoch`, `step`), every pick drawn on
    /// the device: [`Sampler::sample`]'s batch. Fanouts above
    /// [`MAX_DEVICE_FANOUT`] are refused.
    pub fn sample(
        &self,
        sampler: &mut Sampler<'_>,
        epoch: u64,
        step: u64,
        seeds: &[u32],
    ) -> Result<MiniBatch> {
        sampler.sample_by(epoch, step, seeds, |rid, key, nodes, fanout| {
            self.pick(rid, key, nodes, fanout)
        })
    }

    /// Relation `rid`'s picks for `nodes` under its layer key `key`
    /// (`graphs::sampler::layer_key`): [`Sampler::pick`]'s answer.
    pub fn pick(
        &self,
        rid: RelationId,
        key: u64,
        nodes: &[u32],
        fanout: usize,
    ) -> Result<RelationPicks> {
        let (offsets, indices, rows) = self.relations.get(rid.index()).ok_or_else(|| {
            ModelError::Config(format!("relation {} is not on the device", rid.0))
        })?;
        if fanout > MAX_DEVICE_FANOUT {
            return Err(ModelError::Config(format!(
                "fanout {fanout}: the device sampler draws at most {MAX_DEVICE_FANOUT}"
            )));
        }
        // The kernels read rows by node id: an id past the CSR would read past its arrays.
        if let Some(&bad) = nodes.iter().find(|&&v| v as usize >= *rows) {
            return Err(ModelError::Config(format!(
                "node {bad} is out of range 0..{rows} of relation {}",
                rid.0
            )));
        }
        let n = u32::try_from(nodes.len())
            .ok()
            .filter(|&n| n <= i32::MAX as u32)
            .ok_or_else(|| ModelError::Config(format!("{} destinations", nodes.len())))?;
        if n == 0 {
            return Ok(RelationPicks {
                relation: rid,
                offsets: vec![0],
                picks: Vec::new(),
            });
        }
        let dev = &self.dev;
        let ptx = compiled(&PTX, SOURCE, "the device sampler's")?;
        let fanout32 = fanout as u32;
        let cfg = launch_cfg_elems(nodes.len());
        let d_nodes = upload(dev, nodes)?;
        // SAFETY: every element is written by pick_counts.
        let counts = unsafe { dev.alloc::<u32>(nodes.len())? };
        let stream = dev.cuda_stream();
        {
            let f = dev
                .get_or_load_custom_func("pick_counts", MODULE, ptx)?
                .into_cuda_function();
            let mut b = stream.launch_builder(&f);
            b.arg(offsets)
                .arg(&d_nodes)
                .arg(&counts)
                .arg(&n)
                .arg(&fanout32);
            // SAFETY: argument types and counts match the kernel; node ids were checked above.
            unsafe { b.launch(cfg) }.w()?;
        }
        let counts = dev.clone_dtoh(&counts)?;
        let mut out = Vec::with_capacity(nodes.len() + 1);
        out.push(0u32);
        let mut total = 0u64;
        for c in counts {
            total += u64::from(c);
            let at = u32::try_from(total).map_err(|_| {
                ModelError::Config(format!("more than 2^32 picks for {n} destinations"))
            })?;
            out.push(at);
        }
        let mut picks = Vec::new();
        if total > 0 {
            let d_out = upload(dev, &out)?;
            // SAFETY: pick_neighbors writes every slot (each destination its counted picks).
            let d_picks = unsafe { dev.alloc::<u32>(total as usize)? };
            let f = dev
                .get_or_load_custom_func("pick_neighbors", MODULE, ptx)?
                .into_cuda_function();
            let mut b = stream.launch_builder(&f);
            b.arg(offsets)
                .arg(indices)
                .arg(&d_nodes)
                .arg(&d_out)
                .arg(&key)
                .arg(&n)
                .arg(&fanout32)
                .arg(&d_picks);
            // SAFETY: as above; `out` bounds every write within `d_picks`.
            unsafe { b.launch(cfg) }.w()?;
            picks = dev.clone_dtoh(&d_picks)?;
        }
        Ok(RelationPicks {
            relation: rid,
            offsets: out,
            picks,
        })
    }
}

impl Drop for DeviceSampler {
    /// Binds the device's context before the arrays are freed: the last
    /// holder may be a thread with none current (see `DeviceCsr`'s drop).
    fn drop(&mut self) {
        if let Some((offsets, _, _)) = self.relations.first() {
            // SAFETY: the context outlives its slices (each holds it).
            let _ = unsafe {
                candle_core::cuda_backend::cudarc::driver::result::ctx::set_current(
                    offsets.context().cu_ctx(),
                )
            };
        }
    }
}

/// The kernels' PTX, compiled at first use.
static PTX: PtxCell = PtxCell::new();

#[cfg(test)]
mod tests {
    /// NVRTC needs no GPU: the kernels must compile wherever the `cuda` build runs.
    #[test]
    fn kernels_compile_with_nvrtc() {
        let ptx = super::compiled(&super::PTX, super::SOURCE, "the device sampler's").unwrap();
        for k in ["pick_counts", "pick_neighbors"] {
            assert!(
                ptx.contains(&format!(".entry {k}(")),
                "{k} missing from the PTX"
            );
        }
    }
}
