//! Per-destination attention over a CSR, fused: for each destination `v` and
//! head `k`, scores `leaky_relu(el[u,k] + er[v,k])` over its sources `u`,
//! softmax, and the weighted sum of `values[u,k,:]`. Per-edge rows are never
//! materialised; only `[edges × heads]` scalars are kept for the backward.
//!
//! Arithmetic is in f64 whatever the input dtype, and every sum runs in a
//! fixed order, so results do not depend on the thread count.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::segment::SegmentCsr;
use super::to_f64;

/// LeakyReLU slope for negative scores (GAT's 0.2).
pub const NEGATIVE_SLOPE: f64 = 0.2;

/// `out[v,k,:] = Σ_u softmax_u(leaky(el[u,k] + er[v,k])) · values[u,k,:]`;
/// `values: [n_src, K, D]`, `el: [n_src, K]`, `er: [n_dst, K]` → `[n_dst, K, D]`.
pub fn attention_aggregate(
    values: &Tensor,
    el: &Tensor,
    er: &Tensor,
    csr: &Arc<SegmentCsr>,
) -> candle_core::Result<Tensor> {
    values.contiguous()?.apply_op3(
        &el.contiguous()?,
        &er.contiguous()?,
        Attention(Arc::clone(csr)),
    )
}

struct Attention(Arc<SegmentCsr>);

fn from_f64(v: Vec<f64>, dtype: DType) -> CpuStorage {
    match dtype {
        DType::F64 => CpuStorage::F64(v),
        _ => CpuStorage::F32(v.into_iter().map(|x| x as f32).collect()),
    }
}

fn leaky(x: f64) -> f64 {
    if x > 0.0 {
        x
    } else {
        NEGATIVE_SLOPE * x
    }
}

/// Softmax weights of destination `v`'s edges for head `k`, into `alpha` (edge order).
fn softmax_row(
    csr: &SegmentCsr,
    el: &[f64],
    er: &[f64],
    heads: usize,
    v: usize,
    k: usize,
    alpha: &mut Vec<f64>,
) {
    let (_, srcs) = csr.row(v);
    alpha.clear();
    let mut m = f64::NEG_INFINITY;
    for &u in srcs {
        let s = leaky(el[u as usize * heads + k] + er[v * heads + k]);
        m = m.max(s);
        alpha.push(s);
    }
    let mut z = 0.0;
    for a in alpha.iter_mut() {
        *a = (*a - m).exp();
        z += *a;
    }
    for a in alpha.iter_mut() {
        *a /= z;
    }
}

struct Dims {
    n_src: usize,
    n_dst: usize,
    heads: usize,
    width: usize,
}

fn dims(csr: &SegmentCsr, lv: &[usize], ll: &[usize], lr: &[usize]) -> candle_core::Result<Dims> {
    match (lv, ll, lr) {
        ([ns, k, d], [ns2, k2], [nd, k3]) if *ns == csr.n_src() && ns2 == ns && *nd == csr.n_dst() && k2 == k && k3 == k => Ok(Dims { n_src: *ns, n_dst: *nd, heads: *k, width: *d }),
        _ => Err(candle_core::Error::Msg(format!("attention: shapes values {lv:?}, el {ll:?}, er {lr:?} do not fit a CSR of {} sources and {} destinations", csr.n_src(), csr.n_dst()))),
    }
}

#[cfg(feature = "cuda")]
impl Dims {
    fn for_cuda(&self) -> super::cuda::AttentionDims {
        super::cuda::AttentionDims {
            n_src: self.n_src,
            n_dst: self.n_dst,
            heads: self.heads,
            width: self.width,
        }
    }
}

/// The backward pass with the native kernels: `(d values, d el, d er)`.
#[cfg(feature = "cuda")]
fn cuda_bwd(
    c: &SegmentCsr,
    dm: &Dims,
    values: &Tensor,
    el: &Tensor,
    er: &Tensor,
    grad: &Tensor,
) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    use candle_core::op::BackpropOp;
    use candle_core::Storage;
    let grad = grad.contiguous()?;
    let (values, el, er) = (values.contiguous()?, el.contiguous()?, er.contiguous()?);
    let (sv, lv) = values.storage_and_layout();
    let (sl, ll) = el.storage_and_layout();
    let (sr, lr) = er.storage_and_layout();
    let (sg, lg) = grad.storage_and_layout();
    let (Storage::Cuda(sv), Storage::Cuda(sl), Storage::Cuda(sr), Storage::Cuda(sg)) =
        (&*sv, &*sl, &*sr, &*sg)
    else {
        return Err(candle_core::Error::Msg(
            "attention: backward inputs on different devices".into(),
        ));
    };
    let d = c.on_device(&sv.device, true)?;
    let (dv, del, der) = super::cuda::attention_bwd(
        (sv, lv),
        (sl, ll),
        (sr, lr),
        (sg, lg),
        &d,
        NEGATIVE_SLOPE,
        dm.for_cuda(),
    )?;
    let tensor =
        |s, shape: Shape| Tensor::from_storage(Storage::Cuda(s), shape, BackpropOp::none(), false);
    Ok((
        Some(tensor(dv, Shape::from((dm.n_src, dm.heads, dm.width)))),
        Some(tensor(del, Shape::from((dm.n_src, dm.heads)))),
        Some(tensor(der, Shape::from((dm.n_dst, dm.heads)))),
    ))
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "attention-aggregate"
    }

    fn cpu_fwd(
        &self,
        sv: &CpuStorage,
        lv: &Layout,
        sl: &CpuStorage,
        ll: &Layout,
        sr: &CpuStorage,
        lr: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let c = &self.0;
        let dm = dims(c, lv.dims(), ll.dims(), lr.dims())?;
        let (values, el, er) = (
            to_f64(sv, lv, "attention")?,
            to_f64(sl, ll, "attention")?,
            to_f64(sr, lr, "attention")?,
        );
        let (k_n, d_n) = (dm.heads, dm.width);
        let mut out = vec![0.0f64; dm.n_dst * k_n * d_n];
        if k_n * d_n > 0 {
            out.par_chunks_mut(k_n * d_n)
                .enumerate()
                .with_min_len(32)
                .for_each(|(v, o)| {
                    let mut alpha = Vec::new();
                    let (_, srcs) = c.row(v);
                    for k in 0..k_n {
                        softmax_row(c, &el, &er, k_n, v, k, &mut alpha);
                        let ok = &mut o[k * d_n..(k + 1) * d_n];
                        for (&u, &a) in srcs.iter().zip(&alpha) {
                            let row = &values[(u as usize * k_n + k) * d_n..][..d_n];
                            for (x, &y) in ok.iter_mut().zip(row) {
                                *x += a * y;
                            }
                        }
                    }
                });
        }
        Ok((from_f64(out, sv.dtype()), Shape::from((dm.n_dst, k_n, d_n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sv: &candle_core::CudaStorage,
        lv: &Layout,
        sl: &candle_core::CudaStorage,
        ll: &Layout,
        sr: &candle_core::CudaStorage,
        lr: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let c = &self.0;
        let dm = dims(c, lv.dims(), ll.dims(), lr.dims())?;
        let d = c.on_device(&sv.device, false)?;
        let out = super::cuda::attention_fwd(
            (sv, lv),
            (sl, ll),
            (sr, lr),
            &d,
            NEGATIVE_SLOPE,
            dm.for_cuda(),
        )?;
        Ok((out, Shape::from((dm.n_dst, dm.heads, dm.width))))
    }

    fn bwd(
        &self,
        values: &Tensor,
        el: &Tensor,
        er: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let c = &self.0;
        let dm = dims(c, values.dims(), el.dims(), er.dims())?;
        #[cfg(feature = "cuda")]
        if values.device().is_cuda() {
            return cuda_bwd(c, &dm, values, el, er, grad);
        }
        let flat = |t: &Tensor| -> candle_core::Result<Vec<f64>> {
            t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
        };
        let (vals, elv, erv, g) = (
            flat(values)?,
            flat(el)?,
            flat(er)?,
            flat(&grad.contiguous()?)?,
        );
        let (k_n, d_n, e_n) = (dm.heads, dm.width, c.n_edges());
        // Destination pass: per-edge attention and score gradients, and d(er).
        let per_dst: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = (0..dm.n_dst)
            .into_par_iter()
            .with_min_len(32)
            .map(|v| {
                let (_, srcs) = c.row(v);
                let mut alphas = vec![0.0; srcs.len() * k_n];
                let mut dpre = vec![0.0; srcs.len() * k_n];
                let mut der = vec![0.0; k_n];
                let mut alpha = Vec::new();
                for k in 0..k_n {
                    softmax_row(c, &elv, &erv, k_n, v, k, &mut alpha);
                    let gk = &g[(v * k_n + k) * d_n..][..d_n];
                    // Sums fold from +0.0 as the CUDA kernels do (`Sum` starts at -0.0).
                    let da: Vec<f64> = srcs
                        .iter()
                        .map(|&u| {
                            vals[(u as usize * k_n + k) * d_n..][..d_n]
                                .iter()
                                .zip(gk)
                                .map(|(a, b)| a * b)
                                .fold(0.0, |s, x| s + x)
                        })
                        .collect();
                    let dot: f64 = alpha
                        .iter()
                        .zip(&da)
                        .map(|(a, b)| a * b)
                        .fold(0.0, |s, x| s + x);
                    for (i, &u) in srcs.iter().enumerate() {
                        let ds = alpha[i] * (da[i] - dot);
                        let pre = elv[u as usize * k_n + k] + erv[v * k_n + k];
                        let dp = if pre > 0.0 { ds } else { ds * NEGATIVE_SLOPE };
                        alphas[i * k_n + k] = alpha[i];
                        dpre[i * k_n + k] = dp;
                        der[k] += dp;
                    }
                }
                (alphas, dpre, der)
            })
            .collect();
        let mut alpha_e = vec![0.0; e_n * k_n];
        let mut dpre_e = vec![0.0; e_n * k_n];
        let mut der = Vec::with_capacity(dm.n_dst * k_n);
        for (v, (a, d, r)) in per_dst.into_iter().enumerate() {
            let (range, _) = c.row(v);
            alpha_e[range.start * k_n..range.end * k_n].copy_from_slice(&a);
            dpre_e[range.start * k_n..range.end * k_n].copy_from_slice(&d);
            der.extend(r);
        }
        // Source pass: d(values) and d(el), summing each source's edges in a fixed order.
        let per_src: Vec<(Vec<f64>, Vec<f64>)> = (0..dm.n_src)
            .into_par_iter()
            .with_min_len(32)
            .map(|u| {
                let mut dv = vec![0.0; k_n * d_n];
                let mut del = vec![0.0; k_n];
                for (v, e) in c.out_edges(u) {
                    for k in 0..k_n {
                        let a = alpha_e[e * k_n + k];
                        let gk = &g[(v * k_n + k) * d_n..][..d_n];
                        for (x, &y) in dv[k * d_n..(k + 1) * d_n].iter_mut().zip(gk) {
                            *x += a * y;
                        }
                        del[k] += dpre_e[e * k_n + k];
                    }
                }
                (dv, del)
            })
            .collect();
        let (dv, del): (Vec<Vec<f64>>, Vec<Vec<f64>>) = per_src.into_iter().unzip();
        let dev = values.device();
        let dv =
            Tensor::from_vec(dv.concat(), (dm.n_src, k_n, d_n), dev)?.to_dtype(values.dtype())?;
        let del = Tensor::from_vec(del.concat(), (dm.n_src, k_n), dev)?.to_dtype(el.dtype())?;
        let der = Tensor::from_vec(der, (dm.n_dst, k_n), dev)?.to_dtype(er.dtype())?;
        Ok((Some(dv), Some(del), Some(der)))
    }
}
