//! Segment mean over a CSR: `out[d] = mean over s in row d of x[s]` (0 for an
//! empty row), with its exact transpose as the backward pass.
//!
//! Both directions parallelise over output rows and sum each row in a fixed
//! order, so results are bit-identical whatever the thread count.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::axpy::{axpy, Elem};
use crate::prefetch::{prefetch, AHEAD};

/// A destination-major CSR with its source-major transpose, shared by the
/// forward and backward ops.
#[derive(Debug)]
pub struct SegmentCsr {
    n_src: usize,
    offsets: Vec<u32>,
    sources: Vec<u32>,
    inv_deg: Vec<f64>,
    t_offsets: Vec<u32>,
    t_dsts: Vec<u32>,
    /// For each transposed entry, the edge's position in destination order.
    t_edges: Vec<u32>,
    /// The arrays the CUDA kernels read, uploaded at first use on a device.
    #[cfg(feature = "cuda")]
    on_device: std::sync::Mutex<Option<Arc<super::cuda::DeviceCsr>>>,
}

impl SegmentCsr {
    /// Destination `d`'s sources are `sources[offsets[d]..offsets[d+1]]`, each `< n_src`.
    pub fn new(n_src: usize, offsets: Vec<u32>, sources: Vec<u32>) -> Arc<SegmentCsr> {
        assert!(!offsets.is_empty() && *offsets.last().expect("non-empty") as usize == sources.len());
        assert!(sources.iter().all(|&s| (s as usize) < n_src), "source index out of range");
        let inv_deg = offsets.windows(2).map(|w| if w[1] > w[0] { 1.0 / f64::from(w[1] - w[0]) } else { 0.0 }).collect();
        let mut t_offsets = vec![0u32; n_src + 1];
        for &s in &sources {
            t_offsets[s as usize + 1] += 1;
        }
        for i in 0..n_src {
            t_offsets[i + 1] += t_offsets[i];
        }
        let mut fill = t_offsets[..n_src].to_vec();
        let mut t_dsts = vec![0u32; sources.len()];
        let mut t_edges = vec![0u32; sources.len()];
        for (d, w) in offsets.windows(2).enumerate() {
            for (e, &s) in sources.iter().enumerate().take(w[1] as usize).skip(w[0] as usize) {
                let s = s as usize;
                t_dsts[fill[s] as usize] = d as u32;
                t_edges[fill[s] as usize] = e as u32;
                fill[s] += 1;
            }
        }
        Arc::new(SegmentCsr {
            n_src,
            offsets,
            sources,
            inv_deg,
            t_offsets,
            t_dsts,
            t_edges,
            #[cfg(feature = "cuda")]
            on_device: std::sync::Mutex::new(None),
        })
    }

    /// Number of destination rows.
    pub fn n_dst(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Number of source rows.
    pub fn n_src(&self) -> usize {
        self.n_src
    }

    /// Number of edges.
    pub fn n_edges(&self) -> usize {
        self.sources.len()
    }

    /// Destination `d`'s edge positions and sources.
    pub(crate) fn row(&self, d: usize) -> (std::ops::Range<usize>, &[u32]) {
        let r = self.offsets[d] as usize..self.offsets[d + 1] as usize;
        (r.clone(), &self.sources[r])
    }

    /// Source `s`'s edges: `(destination, edge position)` pairs.
    pub(crate) fn out_edges(&self, s: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let r = self.t_offsets[s] as usize..self.t_offsets[s + 1] as usize;
        self.t_dsts[r.clone()].iter().zip(&self.t_edges[r]).map(|(&d, &e)| (d as usize, e as usize))
    }
}

#[cfg(feature = "cuda")]
impl SegmentCsr {
    /// The CSR's arrays on `dev`, uploaded once (the forward and backward ops share them).
    pub(super) fn on_device(&self, dev: &candle_core::CudaDevice) -> candle_core::Result<Arc<super::cuda::DeviceCsr>> {
        let mut slot = self.on_device.lock().map_err(|_| candle_core::Error::Msg("segment CSR lock poisoned".into()))?;
        if let Some(d) = slot.as_ref().filter(|d| d.device == dev.id()) {
            return Ok(Arc::clone(d));
        }
        let up = |v: &[u32]| super::cuda::upload(dev, v);
        let d = Arc::new(super::cuda::DeviceCsr {
            device: dev.id(),
            offsets: up(&self.offsets)?,
            sources: up(&self.sources)?,
            t_offsets: up(&self.t_offsets)?,
            t_dsts: up(&self.t_dsts)?,
            t_edges: up(&self.t_edges)?,
            inv_deg: super::cuda::upload(dev, &self.inv_deg)?,
        });
        *slot = Some(Arc::clone(&d));
        Ok(d)
    }
}

/// Mean of each destination's source rows of `x` (`[n_src, h]` → `[n_dst, h]`), differentiable.
pub fn segment_mean(x: &Tensor, csr: &Arc<SegmentCsr>) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1(SegmentMean(Arc::clone(csr)))
}

struct SegmentMean(Arc<SegmentCsr>);
struct SegmentMeanT(Arc<SegmentCsr>);

/// `out[r] = scale(r) · Σ_{j in row r} x[idx[j]]` for every output row.
fn gather_rows<T: Elem>(x: &[T], h: usize, offsets: &[u32], idx: &[u32], weight: impl Fn(usize, u32) -> T + Sync) -> Vec<T> {
    let rows = offsets.len() - 1;
    let mut out = vec![T::default(); rows * h];
    if h == 0 {
        return out;
    }
    out.par_chunks_mut(h).enumerate().with_min_len(64).for_each(|(r, o)| {
        let span = offsets[r] as usize..offsets[r + 1] as usize;
        for (p, &s) in span.clone().zip(&idx[span]) {
            if let Some(&a) = idx.get(p + AHEAD) {
                prefetch(&x[a as usize * h..(a as usize + 1) * h]);
            }
            axpy(o, weight(r, s), &x[s as usize * h..(s as usize + 1) * h]);
        }
    });
    out
}

fn input<'a, T: candle_core::WithDType>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [T]> {
    let (start, end) = l.contiguous_offsets().ok_or_else(|| candle_core::Error::Msg("segment op needs a contiguous input".into()))?;
    Ok(&s.as_slice::<T>()?[start..end])
}

fn width(l: &Layout, rows: usize, what: &str) -> candle_core::Result<usize> {
    match l.dims() {
        [r, h] if *r == rows => Ok(*h),
        dims => Err(candle_core::Error::Msg(format!("{what}: input shape {dims:?}, expected [{rows}, h]"))),
    }
}

impl CustomOp1 for SegmentMean {
    fn name(&self) -> &'static str {
        "segment-mean"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let c = &self.0;
        let h = width(l, c.n_src, self.name())?;
        let shape = Shape::from((c.n_dst(), h));
        let st = match s {
            CpuStorage::F32(_) => {
                let x = input::<f32>(s, l)?;
                CpuStorage::F32(gather_rows(x, h, &c.offsets, &c.sources, |d, _| c.inv_deg[d] as f32))
            }
            CpuStorage::F64(_) => {
                let x = input::<f64>(s, l)?;
                CpuStorage::F64(gather_rows(x, h, &c.offsets, &c.sources, |d, _| c.inv_deg[d]))
            }
            _ => return Err(candle_core::Error::Msg("segment-mean supports f32 and f64".into())),
        };
        Ok((st, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let c = &self.0;
        let h = width(l, c.n_src, self.name())?;
        let d = c.on_device(&s.device)?;
        let out = super::cuda::gather_rows(s, l, &d.offsets, &d.sources, &d.inv_deg, true, c.n_dst(), h)?;
        Ok((out, Shape::from((c.n_dst(), h))))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op1(SegmentMeanT(Arc::clone(&self.0)))?))
    }
}

impl CustomOp1 for SegmentMeanT {
    fn name(&self) -> &'static str {
        "segment-mean-transpose"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let c = &self.0;
        let h = width(l, c.n_dst(), self.name())?;
        let shape = Shape::from((c.n_src, h));
        let st = match s {
            CpuStorage::F32(_) => {
                let g = input::<f32>(s, l)?;
                CpuStorage::F32(gather_rows(g, h, &c.t_offsets, &c.t_dsts, |_, d| c.inv_deg[d as usize] as f32))
            }
            CpuStorage::F64(_) => {
                let g = input::<f64>(s, l)?;
                CpuStorage::F64(gather_rows(g, h, &c.t_offsets, &c.t_dsts, |_, d| c.inv_deg[d as usize]))
            }
            _ => return Err(candle_core::Error::Msg("segment-mean supports f32 and f64".into())),
        };
        Ok((st, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let c = &self.0;
        let h = width(l, c.n_dst(), self.name())?;
        let d = c.on_device(&s.device)?;
        let out = super::cuda::gather_rows(s, l, &d.t_offsets, &d.t_dsts, &d.inv_deg, false, c.n_src, h)?;
        Ok((out, Shape::from((c.n_src, h))))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op1(SegmentMean(Arc::clone(&self.0)))?))
    }
}
