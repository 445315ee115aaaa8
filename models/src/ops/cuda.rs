//! Native CUDA launches of the custom ops' kernels (`kernels.cu`).
//!
//! The kernels are compiled once per process with NVRTC (which candle's CUDA
//! build links already) for whatever GPU the driver finds, so the build needs
//! no nvcc step of its own. Each kernel repeats its CPU twin's arithmetic in
//! the same order without fused multiply-adds: GPU results have CPU bits.

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, DeviceId, WrapErr};
use candle_core::{CudaStorage, DType, Layout};

const SOURCE: &str = include_str!("kernels.cu");
const MODULE: &str = "hetgnn-ops";

/// A source's PTX, compiled at first use (or why it did not compile).
pub(crate) type PtxCell = OnceLock<Result<String, String>>;

/// The kernels' PTX, compiled at first use.
pub(crate) fn ptx() -> candle_core::Result<&'static str> {
    static PTX: PtxCell = PtxCell::new();
    compiled(&PTX, SOURCE, "hetgnn's")
}

/// `source` compiled by NVRTC once into `cell`; `what` names the kernels in an error.
pub(crate) fn compiled(
    cell: &'static PtxCell,
    source: &str,
    what: &str,
) -> candle_core::Result<&'static str> {
    use candle_core::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
    // Stated rather than left to NVRTC's defaults: no contraction into fused
    // multiply-adds, no flushing of subnormals, IEEE division and square root,
    // which is what keeps the kernels' bits equal to the CPU ops'.
    let opts = || CompileOptions {
        fmad: Some(false),
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ..Default::default()
    };
    cell.get_or_init(|| {
        compile_ptx_with_opts(source, opts())
            .map(|p| p.to_src())
            .map_err(|e| e.to_string())
    })
    .as_deref()
    .map_err(|e| candle_core::Error::Msg(format!("compiling {what} CUDA kernels with NVRTC: {e}")))
}

/// An element type the kernels are instantiated for.
pub(crate) trait Float: CudaDType + DeviceRepr + Copy {
    /// The kernels' name suffix.
    const SUFFIX: &'static str;
}

impl Float for f32 {
    const SUFFIX: &'static str = "f32";
}

impl Float for f64 {
    const SUFFIX: &'static str = "f64";
}

/// Runs `$body` with `$t` bound to the Rust type of `$dtype` (f32 or f64).
macro_rules! by_dtype {
    ($dtype:expr, $op:expr, |$t:ident| $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            d => Err(candle_core::Error::Msg(format!(
                "{}: {d:?} is not supported on CUDA (f32 and f64 are)",
                $op
            ))),
        }
    };
}

fn launch_cfg_rows(rows: u32, h: u32) -> LaunchConfig {
    // One block per row (grid-stride beyond 65535 blocks), a warp's multiple of threads over its columns.
    let threads = h.div_ceil(32).clamp(1, 8) * 32;
    LaunchConfig {
        grid_dim: (rows.clamp(1, 65_535), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn launch_cfg_elems(n: usize) -> LaunchConfig {
    // Grid-stride loops: enough blocks to fill any GPU, no more.
    let blocks = n.div_ceil(256).clamp(1, 16_384) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The largest size a kernel's 32-bit counters take: 2^31 - 1, so that a
/// grid-stride step (at most 65,535 blocks or 4Mi threads) never wraps one.
const MAX_DIM: usize = i32::MAX as usize;

fn dim(n: usize, what: &str) -> candle_core::Result<u32> {
    if n > MAX_DIM {
        return Err(candle_core::Error::Msg(format!(
            "{what} = {n} exceeds the CUDA kernels' limit of {MAX_DIM}"
        )));
    }
    Ok(n as u32)
}

/// `s`'s elements from its layout's start to its end (contiguous layouts only).
fn view<'a, T: Float>(
    s: &'a CudaStorage,
    l: &Layout,
    op: &str,
) -> candle_core::Result<CudaView<'a, T>> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op} needs contiguous inputs")))?;
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

fn kernel(dev: &CudaDevice, name: &str, suffix: &str) -> candle_core::Result<CudaFunction> {
    Ok(dev
        .get_or_load_custom_func(&format!("{name}_{suffix}"), MODULE, ptx()?)?
        .into_cuda_function())
}

/// A `SegmentCsr`'s arrays in one device's memory.
pub(crate) struct DeviceCsr {
    pub device: DeviceId,
    pub offsets: CudaSlice<u32>,
    pub sources: CudaSlice<u32>,
    pub inv_deg: CudaSlice<f64>,
    /// The source-major transpose, uploaded only for a backward pass: blocks
    /// over constant inputs (feature rows, the largest) never need it.
    pub transpose: OnceLock<DeviceTranspose>,
}

/// The source-major transpose of a [`DeviceCsr`], on its device.
pub(crate) struct DeviceTranspose {
    pub t_offsets: CudaSlice<u32>,
    pub t_dsts: CudaSlice<u32>,
    pub t_edges: CudaSlice<u32>,
}

impl DeviceCsr {
    /// The transpose, which a backward op has uploaded (`SegmentCsr::on_device` with `backward`).
    pub(crate) fn t(&self) -> candle_core::Result<&DeviceTranspose> {
        self.transpose.get().ok_or_else(|| {
            candle_core::Error::Msg(
                "segment CSR: the transpose was not uploaded for a backward pass".into(),
            )
        })
    }
}

impl Drop for DeviceCsr {
    /// The last holder may be a rayon thread (`SegmentCsr::transpose_ahead`)
    /// with no CUDA context current, where freeing device memory fails
    /// (cudarc records `CUDA_ERROR_INVALID_CONTEXT`, and the next CUDA call
    /// of the training thread returns it): bind the context before the
    /// arrays are freed.
    fn drop(&mut self) {
        // Straight to the driver: `bind_to_thread` first returns (and clears)
        // an error recorded earlier, and then binds nothing.
        // SAFETY: the context outlives its slices (each holds it).
        let _ = unsafe {
            candle_core::cuda_backend::cudarc::driver::result::ctx::set_current(
                self.offsets.context().cu_ctx(),
            )
        };
    }
}

impl std::fmt::Debug for DeviceCsr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceCsr({:?}, {} edges)",
            self.device,
            self.sources.len()
        )
    }
}

/// Host data uploaded for a kernel.
pub(crate) fn upload<T: DeviceRepr + 'static>(
    dev: &CudaDevice,
    data: &[T],
) -> candle_core::Result<CudaSlice<T>> {
    dev.clone_htod(data)
}

/// `out[r] = Σ_{p in offsets[r]..offsets[r+1]} w · x[idx[p]]` with `w = weights[r]`
/// (`per_row`) or `weights[idx[p]]`, for `x: [_, h]` and `rows` output rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_rows(
    x: &CudaStorage,
    l: &Layout,
    offsets: &CudaSlice<u32>,
    idx: &CudaSlice<u32>,
    weights: &CudaSlice<f64>,
    per_row: bool,
    rows: usize,
    h: usize,
) -> candle_core::Result<CudaStorage> {
    let dev = &x.device;
    let (r32, h32) = (dim(rows, "rows")?, dim(h, "width")?);
    dim(rows * h, "elements")?;
    by_dtype!(x.dtype(), "segment-mean", |T| {
        let xv = view::<T>(x, l, "segment-mean")?;
        // SAFETY: every element is written by the kernel below.
        let out = unsafe { dev.alloc::<T>(rows * h)? };
        if rows * h > 0 {
            let f = kernel(dev, "gather_rows", T::SUFFIX)?;
            let per_row = u32::from(per_row);
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(&xv)
                .arg(offsets)
                .arg(idx)
                .arg(weights)
                .arg(&per_row)
                .arg(&out)
                .arg(&r32)
                .arg(&h32);
            // SAFETY: argument types and counts match the kernel's signature; indices were checked on the host.
            unsafe { b.launch(launch_cfg_rows(r32, h32)) }.w()?;
        }
        Ok(T::wrap_cuda_slice(out, dev.clone()))
    })
}

/// Dropout forward (`backward = None`) or backward (`Some((g, lg))`, `x` the forward input).
#[allow(clippy::too_many_arguments)]
pub(crate) fn dropout(
    x: &CudaStorage,
    lx: &Layout,
    backward: Option<(&CudaStorage, &Layout)>,
    row_keys: &[u64],
    p: f32,
    relu: bool,
    rows: usize,
    cols: usize,
) -> candle_core::Result<CudaStorage> {
    let dev = &x.device;
    let (r32, c32) = (dim(rows, "rows")?, dim(cols, "columns")?);
    let scale = 1.0 / (1.0 - p);
    let relu = u32::from(relu);
    by_dtype!(x.dtype(), "dropout", |T| {
        let xv = view::<T>(x, lx, "dropout")?;
        // SAFETY: every element is written by the kernel below.
        let out = unsafe { dev.alloc::<T>(rows * cols)? };
        if rows * cols > 0 {
            let keys = upload(dev, row_keys)?;
            let cfg = launch_cfg_elems(rows * cols);
            match backward {
                None => {
                    let f = kernel(dev, "dropout_fwd", T::SUFFIX)?;
                    let stream = dev.cuda_stream();
                    let mut b = stream.launch_builder(&f);
                    b.arg(&xv)
                        .arg(&keys)
                        .arg(&p)
                        .arg(&scale)
                        .arg(&relu)
                        .arg(&out)
                        .arg(&r32)
                        .arg(&c32);
                    // SAFETY: as in gather_rows.
                    unsafe { b.launch(cfg) }.w()?;
                }
                Some((g, lg)) => {
                    let gv = view::<T>(g, lg, "dropout")?;
                    let f = kernel(dev, "dropout_bwd", T::SUFFIX)?;
                    let stream = dev.cuda_stream();
                    let mut b = stream.launch_builder(&f);
                    b.arg(&gv)
                        .arg(&xv)
                        .arg(&keys)
                        .arg(&p)
                        .arg(&scale)
                        .arg(&relu)
                        .arg(&out)
                        .arg(&r32)
                        .arg(&c32);
                    // SAFETY: as in gather_rows.
                    unsafe { b.launch(cfg) }.w()?;
                }
            }
        }
        Ok(T::wrap_cuda_slice(out, dev.clone()))
    })
}

/// `x + b` for `x: [rows, cols]`, `b: [cols]`.
pub(crate) fn add_bias(
    x: &CudaStorage,
    lx: &Layout,
    bias: &CudaStorage,
    lb: &Layout,
    rows: usize,
    cols: usize,
) -> candle_core::Result<CudaStorage> {
    let dev = &x.device;
    let (r32, c32) = (dim(rows, "rows")?, dim(cols, "columns")?);
    dim(rows * cols, "elements")?;
    by_dtype!(x.dtype(), "add-bias", |T| {
        let (xv, bv) = (
            view::<T>(x, lx, "add-bias")?,
            view::<T>(bias, lb, "add-bias")?,
        );
        // SAFETY: every element is written by the kernel below.
        let out = unsafe { dev.alloc::<T>(rows * cols)? };
        if rows * cols > 0 {
            let f = kernel(dev, "add_bias", T::SUFFIX)?;
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(&xv).arg(&bv).arg(&out).arg(&r32).arg(&c32);
            // SAFETY: as in gather_rows.
            unsafe { b.launch(launch_cfg_elems(rows * cols)) }.w()?;
        }
        Ok(T::wrap_cuda_slice(out, dev.clone()))
    })
}

/// Column sums of `g: [rows, cols]`: blocks of `SUM_BLOCK` rows summed in
/// parallel, each in order, then the blocks' sums in order (bias.rs's order).
pub(crate) fn column_sums(
    g: &CudaStorage,
    l: &Layout,
    rows: usize,
    cols: usize,
) -> candle_core::Result<CudaStorage> {
    let dev = &g.device;
    let (r32, c32) = (dim(rows, "rows")?, dim(cols, "columns")?);
    dim(rows * cols, "elements")?;
    let block = super::bias::SUM_BLOCK;
    let blocks = rows.div_ceil(block);
    let (b32, block32) = (dim(blocks, "row blocks")?, dim(block, "rows per block")?);
    by_dtype!(g.dtype(), "column-sums", |T| {
        let gv = view::<T>(g, l, "column-sums")?;
        // SAFETY: every element is written by the kernels below.
        let (partials, out) = unsafe {
            (
                dev.alloc::<T>((blocks * cols).max(1))?,
                dev.alloc::<T>(cols)?,
            )
        };
        if cols > 0 {
            let stream = dev.cuda_stream();
            if blocks > 0 {
                let f = kernel(dev, "column_partials", T::SUFFIX)?;
                let mut b = stream.launch_builder(&f);
                b.arg(&gv).arg(&partials).arg(&r32).arg(&c32).arg(&block32);
                // SAFETY: as in gather_rows.
                unsafe { b.launch(launch_cfg_elems(blocks * cols)) }.w()?;
            }
            let f = kernel(dev, "column_sums", T::SUFFIX)?;
            let mut b = stream.launch_builder(&f);
            b.arg(&partials).arg(&out).arg(&b32).arg(&c32);
            let cfg = LaunchConfig {
                grid_dim: (c32.div_ceil(128), 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: as in gather_rows.
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok(T::wrap_cuda_slice(out, dev.clone()))
    })
}

/// Sizes of an attention op: `values: [n_src, heads, width]`, `el: [n_src, heads]`, `er: [n_dst, heads]`.
#[derive(Clone, Copy)]
pub(crate) struct AttentionDims {
    pub n_src: usize,
    pub n_dst: usize,
    pub heads: usize,
    pub width: usize,
}

/// A contiguous CUDA input: storage and layout.
pub(crate) type Input<'a> = (&'a CudaStorage, &'a Layout);

/// Attention forward: `out[v, k, :]` as in `attention.rs`.
pub(crate) fn attention_fwd(
    values: Input,
    el: Input,
    er: Input,
    csr: &DeviceCsr,
    slope: f64,
    d: AttentionDims,
) -> candle_core::Result<CudaStorage> {
    let dev = &values.0.device;
    let (n_dst, heads, width) = (
        dim(d.n_dst, "destinations")?,
        dim(d.heads, "heads")?,
        dim(d.width, "width")?,
    );
    let n = d.n_dst * d.heads * d.width;
    dim(n, "elements")?;
    dim(d.n_src * d.heads * d.width, "elements")?;
    by_dtype!(values.0.dtype(), "attention", |T| {
        let (vv, lv, rv) = (
            view::<T>(values.0, values.1, "attention")?,
            view::<T>(el.0, el.1, "attention")?,
            view::<T>(er.0, er.1, "attention")?,
        );
        // SAFETY: every element is written by the kernel below.
        let out = unsafe { dev.alloc::<T>(n)? };
        if n > 0 {
            let f = kernel(dev, "attention_fwd", T::SUFFIX)?;
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(&vv)
                .arg(&lv)
                .arg(&rv)
                .arg(&csr.offsets)
                .arg(&csr.sources)
                .arg(&slope)
                .arg(&out)
                .arg(&n_dst)
                .arg(&heads)
                .arg(&width);
            // SAFETY: as in gather_rows.
            unsafe { b.launch(launch_cfg_rows(n_dst, heads * width)) }.w()?;
        }
        Ok(T::wrap_cuda_slice(out, dev.clone()))
    })
}

/// Attention backward: `(d values, d el, d er)` for the upstream gradient `g: [n_dst, heads, width]`.
pub(crate) fn attention_bwd(
    values: Input,
    el: Input,
    er: Input,
    g: Input,
    csr: &DeviceCsr,
    slope: f64,
    d: AttentionDims,
) -> candle_core::Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let dev = &values.0.device;
    let (n_src, n_dst, heads, width) = (
        dim(d.n_src, "sources")?,
        dim(d.n_dst, "destinations")?,
        dim(d.heads, "heads")?,
        dim(d.width, "width")?,
    );
    dim(d.n_src.max(d.n_dst) * d.heads * d.width, "elements")?;
    let per_edge = csr.sources.len() * d.heads;
    by_dtype!(values.0.dtype(), "attention", |T| {
        let (vv, lv, rv, gv) = (
            view::<T>(values.0, values.1, "attention")?,
            view::<T>(el.0, el.1, "attention")?,
            view::<T>(er.0, er.1, "attention")?,
            view::<T>(g.0, g.1, "attention")?,
        );
        // SAFETY: the destination pass writes every edge's entries and every d(er); the source pass every d(values), d(el).
        let (alpha_e, dpre_e) = unsafe {
            (
                dev.alloc::<f64>(per_edge.max(1))?,
                dev.alloc::<f64>(per_edge.max(1))?,
            )
        };
        let der = unsafe { dev.alloc::<T>(d.n_dst * d.heads)? };
        let dv = unsafe { dev.alloc::<T>(d.n_src * d.heads * d.width)? };
        let del = unsafe { dev.alloc::<T>(d.n_src * d.heads)? };
        let stream = dev.cuda_stream();
        if d.n_dst * d.heads > 0 {
            let f = kernel(dev, "attention_bwd_dst", T::SUFFIX)?;
            let mut b = stream.launch_builder(&f);
            b.arg(&vv)
                .arg(&lv)
                .arg(&rv)
                .arg(&gv)
                .arg(&csr.offsets)
                .arg(&csr.sources)
                .arg(&slope);
            b.arg(&alpha_e)
                .arg(&dpre_e)
                .arg(&der)
                .arg(&n_dst)
                .arg(&heads)
                .arg(&width);
            // SAFETY: as in gather_rows.
            unsafe { b.launch(launch_cfg_elems(d.n_dst * d.heads)) }.w()?;
        }
        if d.n_src * d.heads > 0 {
            let f = kernel(dev, "attention_bwd_src", T::SUFFIX)?;
            let mut b = stream.launch_builder(&f);
            let t = csr.t()?;
            b.arg(&gv)
                .arg(&alpha_e)
                .arg(&dpre_e)
                .arg(&t.t_offsets)
                .arg(&t.t_dsts)
                .arg(&t.t_edges);
            b.arg(&dv).arg(&del).arg(&n_src).arg(&heads).arg(&width);
            // SAFETY: as in gather_rows.
            unsafe { b.launch(launch_cfg_rows(n_src, (heads * width).max(heads))) }.w()?;
        }
        let wrap = |s| T::wrap_cuda_slice(s, dev.clone());
        Ok((wrap(dv), wrap(del), wrap(der)))
    })
}

/// Sizes of a log-sum-exp attention op: `q: [n_dst, heads, dk]`, `k: [n_src, heads, dk]`, `values: [n_src, heads, dv]`.
#[derive(Clone, Copy)]
pub(crate) struct LseDims {
    pub n_src: usize,
    pub n_dst: usize,
    pub heads: usize,
    pub dk: usize,
    pub dv: usize,
}

/// Log-sum-exp attention forward: the packed partial `[n_dst, heads, 2 + dv]`.
pub(crate) fn lse_fwd(
    q: Input,
    k: Input,
    values: Input,
    csr: &DeviceCsr,
    empty_max: f64,
    d: LseDims,
) -> candle_core::Result<CudaStorage> {
    let dev = &q.0.device;
    let gw = d.dv + 2;
    let (n_dst, heads, dk, dv) = (
        dim(d.n_dst, "destinations")?,
        dim(d.heads, "heads")?,
        dim(d.dk, "key width")?,
        dim(d.dv, "value width")?,
    );
    dim(d.n_src.max(d.n_dst) * d.heads * gw.max(d.dk), "elements")?;
    let n = d.n_dst * d.heads * gw;
    by_dtype!(q.0.dtype(), "lse-attention", |T| {
        let (qv, kv, vv) = (
            view::<T>(q.0, q.1, "lse-attention")?,
            view::<T>(k.0, k.1, "lse-attention")?,
            view::<T>(values.0, values.1, "lse-attention")?,
        );
        // SAFETY: every element is written by the kernel below.
        let out = unsafe { dev.alloc::<T>(n)? };
        if n > 0 {
            let f = kernel(dev, "lse_fwd", T::SUFFIX)?;
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(&qv)
                .arg(&kv)
                .arg(&vv)
                .arg(&csr.offsets)
                .arg(&csr.sources)
                .arg(&empty_max)
                .arg(&out);
            b.arg(&n_dst).arg(&heads).arg(&dk).arg(&dv);
            // SAFETY: as in gather_rows.
            unsafe { b.launch(launch_cfg_rows(n_dst, heads * (dv + 2))) }.w()?;
        }
        Ok(T::wrap_cuda_slice(out, dev.clone()))
    })
}

/// Log-sum-exp attention backward: `(d q, d k, d values)` for the upstream gradient `g: [n_dst, heads, 2 + dv]`.
pub(crate) fn lse_bwd(
    q: Input,
    k: Input,
    values: Input,
    g: Input,
    csr: &DeviceCsr,
    d: LseDims,
) -> candle_core::Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let dev = &q.0.device;
    let (n_src, n_dst, heads, dk, dv) = (
        dim(d.n_src, "sources")?,
        dim(d.n_dst, "destinations")?,
        dim(d.heads, "heads")?,
        dim(d.dk, "key width")?,
        dim(d.dv, "value width")?,
    );
    dim(
        d.n_src.max(d.n_dst) * d.heads * (d.dv + 2 + d.dk),
        "elements",
    )?;
    let per_edge = csr.sources.len() * d.heads;
    by_dtype!(q.0.dtype(), "lse-attention", |T| {
        let (qv, kv, vv, gv) = (
            view::<T>(q.0, q.1, "lse-attention")?,
            view::<T>(k.0, k.1, "lse-attention")?,
            view::<T>(values.0, values.1, "lse-attention")?,
            view::<T>(g.0, g.1, "lse-attention")?,
        );
        // SAFETY: the destination pass writes every edge's entries and all of d(q); the source pass d(k) and d(values).
        let (de_e, w_e) = unsafe {
            (
                dev.alloc::<f64>(per_edge.max(1))?,
                dev.alloc::<f64>(per_edge.max(1))?,
            )
        };
        let dq = unsafe { dev.alloc::<T>(d.n_dst * d.heads * d.dk)? };
        let dk_out = unsafe { dev.alloc::<T>(d.n_src * d.heads * d.dk)? };
        let dv_out = unsafe { dev.alloc::<T>(d.n_src * d.heads * d.dv)? };
        let stream = dev.cuda_stream();
        if d.n_dst * d.heads > 0 {
            let f = kernel(dev, "lse_bwd_dst", T::SUFFIX)?;
            let mut b = stream.launch_builder(&f);
            b.arg(&qv)
                .arg(&kv)
                .arg(&vv)
                .arg(&gv)
                .arg(&csr.offsets)
                .arg(&csr.sources)
                .arg(&de_e)
                .arg(&w_e)
                .arg(&dq);
            b.arg(&n_dst).arg(&heads).arg(&dk).arg(&dv);
            // SAFETY: as in gather_rows.
            unsafe { b.launch(launch_cfg_elems(d.n_dst * d.heads)) }.w()?;
        }
        if d.n_src * d.heads * (d.dk + d.dv) > 0 {
            let f = kernel(dev, "lse_bwd_src", T::SUFFIX)?;
            let mut b = stream.launch_builder(&f);
            let t = csr.t()?;
            b.arg(&qv)
                .arg(&gv)
                .arg(&de_e)
                .arg(&w_e)
                .arg(&t.t_offsets)
                .arg(&t.t_dsts)
                .arg(&t.t_edges)
                .arg(&dk_out)
                .arg(&dv_out);
            b.arg(&n_src).arg(&heads).arg(&dk).arg(&dv);
            // SAFETY: as in gather_rows.
            unsafe { b.launch(launch_cfg_rows(n_src, heads * (dk + dv))) }.w()?;
        }
        let wrap = |s| T::wrap_cuda_slice(s, dev.clone());
        Ok((wrap(dq), wrap(dk_out), wrap(dv_out)))
    })
}

/// [`dense_adam`]'s scalars, rounded to f32 as candle's affine maps round
/// them (`ops::adam::dense_adam_in_place` makes them).
pub(crate) struct DenseAdamConsts {
    pub b1: f32,
    pub ob1: f32,
    pub b2: f32,
    pub ob2: f32,
    pub ibc1: f32,
    pub ibc2: f32,
    pub eps: f32,
    pub lr: f32,
}

/// In place: `p`, `m` and `v` (`n` f32 each) take one Adam step with gradient `g`.
pub(crate) fn dense_adam(
    p: Input,
    m: Input,
    v: Input,
    g: Input,
    c: &DenseAdamConsts,
    n: usize,
) -> candle_core::Result<()> {
    let dev = &p.0.device;
    let n32 = dim(n, "elements")?;
    if n == 0 {
        return Ok(());
    }
    let (pv, mv, vv, gv) = (
        view::<f32>(p.0, p.1, "dense-adam")?,
        view::<f32>(m.0, m.1, "dense-adam")?,
        view::<f32>(v.0, v.1, "dense-adam")?,
        view::<f32>(g.0, g.1, "dense-adam")?,
    );
    let f = kernel(dev, "dense_adam", "f32")?;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&pv)
        .arg(&mv)
        .arg(&vv)
        .arg(&gv)
        .arg(&n32)
        .arg(&c.b1)
        .arg(&c.ob1)
        .arg(&c.b2)
        .arg(&c.ob2)
        .arg(&c.ibc1)
        .arg(&c.ibc2)
        .arg(&c.eps)
        .arg(&c.lr);
    // SAFETY: argument types and counts match the kernel; the four views hold n elements each (checked by the caller's shapes).
    unsafe { b.launch(launch_cfg_elems(n)) }.w()?;
    Ok(())
}

/// Adam's per-row constants for [`sparse_adam`], as `embedding::adam_row` computes them.
pub(crate) struct AdamConsts {
    pub b1: f32,
    pub b2: f32,
    pub lr: f64,
    pub eps: f64,
}

/// In place: rows `slots` of `data`, `m`, `v` (`[_, cols]` f32) take one Adam
/// step with gradient rows `g` (`[slots.len(), cols]`), each with the bias
/// corrections of its own step count (`steps`, u32, bumped here) from the
/// table `bc` (`[bc_len, 2]` f64, by step count). The caller checked shapes,
/// slots, contiguity and that the table outlasts every count.
///
/// The tables are written through shared borrows of their storage: the
/// kernels write device memory that no host reference reads, on the one
/// stream every op of the device runs on, so they are ordered after every
/// earlier reader and before every later one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sparse_adam(
    data: Input,
    m: Input,
    v: Input,
    steps: Input,
    g: Input,
    slots: &[u32],
    bc: Input,
    c: &AdamConsts,
    cols: usize,
) -> candle_core::Result<()> {
    let dev = &data.0.device;
    let (r32, c32) = (dim(slots.len(), "rows")?, dim(cols, "columns")?);
    let bc_len = dim(bc.1.shape().elem_count() / 2, "bias corrections")?;
    if slots.is_empty() || cols == 0 {
        return Ok(());
    }
    let (dv, mv, vv, gv) = (
        view::<f32>(data.0, data.1, "sparse-adam")?,
        view::<f32>(m.0, m.1, "sparse-adam")?,
        view::<f32>(v.0, v.1, "sparse-adam")?,
        view::<f32>(g.0, g.1, "sparse-adam")?,
    );
    let bcv = view::<f64>(bc.0, bc.1, "sparse-adam")?;
    let (a, b) = steps.1.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg("sparse-adam needs contiguous step counts".into())
    })?;
    let sv = steps.0.as_cuda_slice::<u32>()?.slice(a..b);
    let slots = upload(dev, slots)?;
    let (ob1, ob2) = (1.0 - c.b1, 1.0 - c.b2);
    let stream = dev.cuda_stream();
    let f = kernel(dev, "sparse_adam", "f32")?;
    let mut l = stream.launch_builder(&f);
    l.arg(&dv)
        .arg(&mv)
        .arg(&vv)
        .arg(&sv)
        .arg(&slots)
        .arg(&gv)
        .arg(&bcv)
        .arg(&bc_len)
        .arg(&c.b1)
        .arg(&ob1)
        .arg(&c.b2)
        .arg(&ob2)
        .arg(&c.lr)
        .arg(&c.eps)
        .arg(&r32)
        .arg(&c32);
    // SAFETY: argument types and counts match the kernel's signature; slots were checked against the tables' rows, and step counts are clamped to the table.
    unsafe { l.launch(launch_cfg_rows(r32, c32)) }.w()?;
    let f = kernel(dev, "bump_steps", "u32")?;
    let mut l = stream.launch_builder(&f);
    l.arg(&sv).arg(&slots).arg(&bc_len).arg(&r32);
    // SAFETY: as above; one thread per row, each slot distinct.
    unsafe { l.launch(launch_cfg_elems(slots.len())) }.w()?;
    Ok(())
}

/// Rows `idx` of `x` (`[_, cols]` f32, contiguous), each in range (checked by the caller).
pub(crate) fn take_rows(x: Input, idx: &[u32], cols: usize) -> candle_core::Result<CudaStorage> {
    let dev = &x.0.device;
    let (r32, c32) = (dim(idx.len(), "rows")?, dim(cols, "columns")?);
    dim(idx.len() * cols, "elements")?;
    let (a, _) =
        x.1.contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("take-rows needs a contiguous input".into()))?;
    let xv = view::<f32>(x.0, x.1, "take-rows")?;
    // SAFETY: every element is written by the kernel below.
    let out = unsafe { dev.alloc::<f32>(idx.len() * cols)? };
    if idx.len() * cols > 0 {
        let ids = upload(dev, idx)?;
        // Allocations are 256-byte aligned: the view's offset decides.
        let vec = u32::from(cols.is_multiple_of(4) && a.is_multiple_of(4));
        let f = kernel(dev, "take_rows", "f32")?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&xv).arg(&ids).arg(&out).arg(&vec).arg(&r32).arg(&c32);
        // Eight rows (warps) to a block, enough blocks to fill any GPU.
        let cfg = LaunchConfig {
            grid_dim: (r32.div_ceil(8).clamp(1, 65_535), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types and counts match the kernel's signature; indices were checked on the host.
        unsafe { b.launch(cfg) }.w()?;
    }
    Ok(f32::wrap_cuda_slice(out, dev.clone()))
}

/// Keeps memory freed on `dev` in its stream-ordered pool, up to half the
/// device, rather than handing it back to the driver at every
/// synchronisation (the pool's default release threshold is 0). A training step allocates and frees hundreds of MB and
/// synchronises at least once (its loss is read back): without this, every
/// step maps its memory afresh.
pub(crate) fn keep_pool_memory(dev: &CudaDevice) -> candle_core::Result<()> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let stream = dev.cuda_stream();
    let ctx = stream.context();
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    ctx.bind_to_thread().w()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a valid device handle and an out-pointer to a pool handle.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .w()?;
    // Half the device: all a step needs stays pooled, and the pool never
    // starves allocations made outside it (cuBLAS's workspaces) of the rest.
    // SAFETY: a valid device handle.
    let total = unsafe {
        candle_core::cuda_backend::cudarc::driver::result::device::total_mem(ctx.cu_device())
    }
    .w()?;
    let mut threshold = (total / 2) as u64;
    // SAFETY: the release threshold attribute takes a pointer to a u64.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    }
    .result()
    .w()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// NVRTC needs no GPU: the kernels must compile wherever the `cuda` build runs.
    #[test]
    fn kernels_compile_with_nvrtc() {
        let ptx = super::ptx().unwrap();
        for k in [
            "gather_rows",
            "dropout_fwd",
            "dropout_bwd",
            "add_bias",
            "column_partials",
            "column_sums",
            "attention_fwd",
            "attention_bwd_dst",
            "attention_bwd_src",
            "lse_fwd",
            "lse_bwd_dst",
            "lse_bwd_src",
        ] {
            for t in ["f32", "f64"] {
                assert!(
                    ptx.contains(&format!(".entry {k}_{t}(")),
                    "{k}_{t} missing from the PTX"
                );
            }
        }
        // f32 only: the cache's rows.
        for k in [
            "sparse_adam_f32",
            "bump_steps_u32",
            "take_rows_f32",
            "dense_adam_f32",
        ] {
            assert!(
                ptx.contains(&format!(".entry {k}(")),
                "{k} missing from the PTX"
            );
        }
    }
}
