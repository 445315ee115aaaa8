//! Segment mean over a CSR: `out[d] = mean over s in row d of x[s]` (0 for an
//! empty row), with its exact transpose as the backward pass.
//!
//! Both directions parallelise over output rows and sum each row in a fixed
//! order, so results are bit-identical whatever the thread count.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::axpy::{gather_row, Elem};

thread_local! {
    /// Set while this thread computes answers no backward pass follows ([`no_backward`]).
    static NO_BACKWARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While the guard lives, this thread's forward passes start no transposes
/// for a backward pass ([`SegmentCsr::transpose_ahead`]): for inference,
/// whose products track gradients (the weights are variables) though none
/// will be taken. A backward pass taken anyway still works: the transpose
/// is then built when it is first needed.
pub fn no_backward() -> NoBackward {
    NoBackward {
        before: NO_BACKWARD.with(|f| f.replace(true)),
    }
}

/// Guard of [`no_backward`]: restores the thread's previous setting when dropped.
#[must_use = "the setting lasts as long as the guard"]
pub struct NoBackward {
    before: bool,
}

impl Drop for NoBackward {
    fn drop(&mut self) {
        NO_BACKWARD.with(|f| f.set(self.before));
    }
}

/// A destination-major CSR with its source-major transpose, shared by the
/// forward and backward ops.
#[derive(Debug)]
pub struct SegmentCsr {
    n_src: usize,
    offsets: Vec<u32>,
    sources: Vec<u32>,
    inv_deg: Vec<f64>,
    /// Built at first use: a block over constant inputs (feature rows) never
    /// runs a backward pass, so never needs it.
    transpose: std::sync::OnceLock<Transpose>,
    /// The arrays the CUDA kernels read, uploaded at first use on a device.
    #[cfg(feature = "cuda")]
    on_device: std::sync::Mutex<Option<Arc<super::cuda::DeviceCsr>>>,
}

/// The source-major transpose of a [`SegmentCsr`].
#[derive(Debug)]
struct Transpose {
    t_offsets: Vec<u32>,
    t_dsts: Vec<u32>,
    /// For each transposed entry, the edge's position in destination order.
    t_edges: Vec<u32>,
}

impl Transpose {
    fn of(n_src: usize, offsets: &[u32], sources: &[u32]) -> Transpose {
        let mut t_offsets = vec![0u32; n_src + 1];
        for &s in sources {
            t_offsets[s as usize + 1] += 1;
        }
        for i in 0..n_src {
            t_offsets[i + 1] += t_offsets[i];
        }
        let mut fill = t_offsets[..n_src].to_vec();
        let mut t_dsts = vec![0u32; sources.len()];
        let mut t_edges = vec![0u32; sources.len()];
        for (d, w) in offsets.windows(2).enumerate() {
            for (e, &s) in sources
                .iter()
                .enumerate()
                .take(w[1] as usize)
                .skip(w[0] as usize)
            {
                let s = s as usize;
                t_dsts[fill[s] as usize] = d as u32;
                t_edges[fill[s] as usize] = e as u32;
                fill[s] += 1;
            }
        }
        Transpose {
            t_offsets,
            t_dsts,
            t_edges,
        }
    }
}

impl SegmentCsr {
    /// Destination `d`'s sources are `sources[offsets[d]..offsets[d+1]]`, each `< n_src`.
    pub fn new(n_src: usize, offsets: Vec<u32>, sources: Vec<u32>) -> Arc<SegmentCsr> {
        assert!(
            !offsets.is_empty() && *offsets.last().expect("non-empty") as usize == sources.len()
        );
        assert!(
            sources.iter().all(|&s| (s as usize) < n_src),
            "source index out of range"
        );
        let inv_deg = inv_degrees(&offsets);
        Arc::new(SegmentCsr {
            n_src,
            offsets,
            sources,
            inv_deg,
            transpose: std::sync::OnceLock::new(),
            #[cfg(feature = "cuda")]
            on_device: std::sync::Mutex::new(None),
        })
    }

    /// Starts building the transpose on rayon's pool for a backward pass to
    /// come: it is then built while the forward pass's sequential parts leave
    /// a core idle, not on the backward pass's thread.
    pub fn transpose_ahead(self: &Arc<Self>) {
        if self.transpose.get().is_none() && !NO_BACKWARD.with(std::cell::Cell::get) {
            let csr = Arc::clone(self);
            rayon::spawn(move || {
                csr.t();
            });
        }
    }

    fn t(&self) -> &Transpose {
        self.transpose
            .get_or_init(|| Transpose::of(self.n_src, &self.offsets, &self.sources))
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
        let t = self.t();
        let r = t.t_offsets[s] as usize..t.t_offsets[s + 1] as usize;
        t.t_dsts[r.clone()]
            .iter()
            .zip(&t.t_edges[r])
            .map(|(&d, &e)| (d as usize, e as usize))
    }
}

#[cfg(feature = "cuda")]
impl SegmentCsr {
    /// The CSR's arrays on `dev`, uploaded once (the forward and backward ops
    /// share them); `backward`: with the transpose, uploaded at its first use.
    pub(super) fn on_device(
        &self,
        dev: &candle_core::CudaDevice,
        backward: bool,
    ) -> candle_core::Result<Arc<super::cuda::DeviceCsr>> {
        let mut slot = self
            .on_device
            .lock()
            .map_err(|_| candle_core::Error::Msg("segment CSR lock poisoned".into()))?;
        let d = match slot.as_ref().filter(|d| d.device == dev.id()) {
            Some(d) => Arc::clone(d),
            None => {
                let d = Arc::new(super::cuda::DeviceCsr {
                    device: dev.id(),
                    offsets: super::cuda::upload(dev, &self.offsets)?,
                    sources: super::cuda::upload(dev, &self.sources)?,
                    inv_deg: super::cuda::upload(dev, &self.inv_deg)?,
                    transpose: std::sync::OnceLock::new(),
                });
                *slot = Some(Arc::clone(&d));
                d
            }
        };
        if backward && d.transpose.get().is_none() {
            let t = self.t();
            let up = |v: &[u32]| super::cuda::upload(dev, v);
            // Under the lock: no other thread uploads it meanwhile.
            let _ = d.transpose.set(super::cuda::DeviceTranspose {
                t_offsets: up(&t.t_offsets)?,
                t_dsts: up(&t.t_dsts)?,
                t_edges: up(&t.t_edges)?,
            });
        }
        Ok(d)
    }
}

/// Each destination's 1 / (its number of sources), 0 for none.
fn inv_degrees(offsets: &[u32]) -> Vec<f64> {
    offsets
        .windows(2)
        .map(|w| match w[1] > w[0] {
            true => 1.0 / f64::from(w[1] - w[0]),
            false => 0.0,
        })
        .collect()
}

/// Mean of each destination's source rows of `x` (`[n_src, h]` → `[n_dst, h]`), differentiable.
pub fn segment_mean(x: &Tensor, csr: &Arc<SegmentCsr>) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1(SegmentMean(Arc::clone(csr)))
}

/// [`segment_mean`] of rows read where they lie: destination `d`'s mean of
/// rows `sources[offsets[d]..offsets[d + 1]]` of the row-major `x` (`width`
/// wide, row `v` for node `v`), without copying the rows out first. The same
/// bits as gathering them into a tensor and taking its segment mean; for
/// inference (no backward pass).
pub fn segment_mean_in_place(
    x: &[f32],
    width: usize,
    offsets: &[u32],
    sources: &[u32],
    device: &candle_core::Device,
) -> candle_core::Result<Tensor> {
    let bad = |m: String| {
        Err(candle_core::Error::Msg(format!(
            "segment-mean in place: {m}"
        )))
    };
    if width == 0 || !x.len().is_multiple_of(width) {
        return bad(format!("{} values are not rows of width {width}", x.len()));
    }
    let rows = x.len() / width;
    if offsets.last().map(|&e| e as usize) != Some(sources.len()) {
        return bad("the offsets do not end at the number of sources".into());
    }
    if let Some(&s) = sources.iter().find(|&&s| s as usize >= rows) {
        return bad(format!("source row {s} of {rows}"));
    }
    let inv = inv_degrees(offsets);
    // Rounded to f32 per term, as SegmentMean's f32 forward does.
    let out = gather_rows(x, width, offsets, sources, |d, _| inv[d] as f32);
    Tensor::from_vec(out, (offsets.len() - 1, width), device)
}

struct SegmentMean(Arc<SegmentCsr>);
struct SegmentMeanT(Arc<SegmentCsr>);

/// `out[r] = scale(r) · Σ_{j in row r} x[idx[j]]` for every output row.
fn gather_rows<T: Elem>(
    x: &[T],
    h: usize,
    offsets: &[u32],
    idx: &[u32],
    weight: impl Fn(usize, u32) -> T + Sync,
) -> Vec<T> {
    let rows = offsets.len() - 1;
    let mut out = Vec::with_capacity(rows * h);
    if h == 0 {
        return out;
    }
    // Every row is written once (no zeroing pass first: a row's first term is written, not added).
    out.spare_capacity_mut()[..rows * h]
        .par_chunks_mut(h)
        .enumerate()
        .with_min_len(64)
        .for_each(|(r, o)| {
            gather_row(
                o,
                x,
                idx,
                offsets[r] as usize..offsets[r + 1] as usize,
                |s| weight(r, s),
            );
        });
    // SAFETY: the loop above wrote all `rows * h` elements (gather_row writes its whole row).
    unsafe { out.set_len(rows * h) };
    out
}

fn input<'a, T: candle_core::WithDType>(
    s: &'a CpuStorage,
    l: &Layout,
) -> candle_core::Result<&'a [T]> {
    let (start, end) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("segment op needs a contiguous input".into()))?;
    Ok(&s.as_slice::<T>()?[start..end])
}

fn width(l: &Layout, rows: usize, what: &str) -> candle_core::Result<usize> {
    match l.dims() {
        [r, h] if *r == rows => Ok(*h),
        dims => Err(candle_core::Error::Msg(format!(
            "{what}: input shape {dims:?}, expected [{rows}, h]"
        ))),
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
                CpuStorage::F32(gather_rows(x, h, &c.offsets, &c.sources, |d, _| {
                    c.inv_deg[d] as f32
                }))
            }
            CpuStorage::F64(_) => {
                let x = input::<f64>(s, l)?;
                CpuStorage::F64(gather_rows(x, h, &c.offsets, &c.sources, |d, _| {
                    c.inv_deg[d]
                }))
            }
            _ => {
                return Err(candle_core::Error::Msg(
                    "segment-mean supports f32 and f64".into(),
                ))
            }
        };
        Ok((st, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let c = &self.0;
        let h = width(l, c.n_src, self.name())?;
        let d = c.on_device(&s.device, false)?;
        let out =
            super::cuda::gather_rows(s, l, &d.offsets, &d.sources, &d.inv_deg, true, c.n_dst(), h)?;
        Ok((out, Shape::from((c.n_dst(), h))))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(
            grad.contiguous()?
                .apply_op1(SegmentMeanT(Arc::clone(&self.0)))?,
        ))
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
                let t = c.t();
                CpuStorage::F32(gather_rows(g, h, &t.t_offsets, &t.t_dsts, |_, d| {
                    c.inv_deg[d as usize] as f32
                }))
            }
            CpuStorage::F64(_) => {
                let g = input::<f64>(s, l)?;
                let t = c.t();
                CpuStorage::F64(gather_rows(g, h, &t.t_offsets, &t.t_dsts, |_, d| {
                    c.inv_deg[d as usize]
                }))
            }
            _ => {
                return Err(candle_core::Error::Msg(
                    "segment-mean supports f32 and f64".into(),
                ))
            }
        };
        Ok((st, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let c = &self.0;
        let h = width(l, c.n_dst(), self.name())?;
        let d = c.on_device(&s.device, true)?;
        let t = d.t()?;
        let out =
            super::cuda::gather_rows(s, l, &t.t_offsets, &t.t_dsts, &d.inv_deg, false, c.n_src, h)?;
        Ok((out, Shape::from((c.n_src, h))))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(
            grad.contiguous()?
                .apply_op1(SegmentMean(Arc::clone(&self.0)))?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(csr: &SegmentCsr) -> bool {
        csr.transpose.get().is_some()
    }

    #[test]
    fn no_transpose_is_started_for_inference_and_the_setting_nests() {
        let csr = || SegmentCsr::new(4, vec![0, 2, 3], vec![0, 3, 1]);
        {
            let _outer = no_backward();
            {
                let _inner = no_backward();
            }
            // The inner guard restored the outer one's setting, not the default.
            let c = csr();
            c.transpose_ahead();
            // Bounded: a spawned build would finish within this on an idle pool.
            std::thread::sleep(std::time::Duration::from_millis(200));
            assert!(!built(&c), "a transpose was started under no_backward");
            // Asked for anyway (a backward pass after all), it is built then.
            assert_eq!(c.t().t_offsets.len(), 5);
        }
        let c = csr();
        c.transpose_ahead();
        let start = std::time::Instant::now();
        while !built(&c) && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(built(&c), "without the guard the transpose is built ahead");
    }
}
