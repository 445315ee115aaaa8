//! Dot-product attention over one relation's CSR, returned as a mergeable
//! partial: per destination `v` and head `h`, with scores
//! `e_u = q[v,h]·k[u,h]` over `v`'s sources `u`,
//!
//! ```text
//! m = max_u e_u,   s = Σ_u exp(e_u − m),   M = Σ_u exp(e_u − m)·val[u,h,:]
//! ```
//!
//! packed as `[n_dst, H, 2 + D]` (`m`, `s`, `M`). Partials of several
//! relations (or workers) merge exactly by the log-sum-exp rule
//! ([`merge_partials`]), and `M / s` is then the softmax over all of them —
//! HGT's attention across relations, computed one relation at a time.
//!
//! `m` is a shift that cancels in `M / s`, so gradients treat it as a
//! constant (here and in the merge): the result is exact, and no gradient
//! flows through the max.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor, D};
use rayon::prelude::*;

use super::segment::SegmentCsr;
use super::to_f64;

/// The `m` of a destination without sources: finite, so merges stay NaN-free.
/// The running maximum of a row without edges (merges as the identity).
pub const EMPTY_MAX: f64 = -1e30;

/// The packed partial `[n_dst, H, 2 + D]` of `softmax(q·k)`-weighted `values`.
/// `q: [n_dst, H, Dk]`, `k: [n_src, H, Dk]`, `values: [n_src, H, D]`.
pub fn lse_attention(
    q: &Tensor,
    k: &Tensor,
    values: &Tensor,
    csr: &Arc<SegmentCsr>,
) -> candle_core::Result<Tensor> {
    q.contiguous()?.apply_op3(
        &k.contiguous()?,
        &values.contiguous()?,
        LseAttention(Arc::clone(csr)),
    )
}

/// Merges packed partials of the same destinations (log-sum-exp rule).
pub fn merge_partials(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    let width = a.dim(D::Minus1)?;
    let (ma, mb) = (
        a.narrow(D::Minus1, 0, 1)?.detach(),
        b.narrow(D::Minus1, 0, 1)?.detach(),
    );
    let m = ma.maximum(&mb)?;
    let (ca, cb) = ((ma - &m)?.exp()?, (mb - &m)?.exp()?);
    let rest = |t: &Tensor| t.narrow(D::Minus1, 1, width - 1);
    let merged = (rest(a)?.broadcast_mul(&ca)? + rest(b)?.broadcast_mul(&cb)?)?;
    Tensor::cat(&[&m, &merged], D::Minus1)
}

/// `M / s` of a packed partial: the attention output `[n_dst, H, D]` (zero where `s = 0`).
pub fn finish_partial(p: &Tensor) -> candle_core::Result<Tensor> {
    let width = p.dim(D::Minus1)?;
    let s = p.narrow(D::Minus1, 1, 1)?;
    let safe = s.clamp(1e-30, f64::INFINITY)?;
    p.narrow(D::Minus1, 2, width - 2)?.broadcast_div(&safe)
}

struct LseAttention(Arc<SegmentCsr>);

struct Dims {
    n_src: usize,
    n_dst: usize,
    heads: usize,
    dk: usize,
    dv: usize,
}

fn dims(c: &SegmentCsr, q: &[usize], k: &[usize], v: &[usize]) -> candle_core::Result<Dims> {
    match (q, k, v) {
        ([nd, h, dk], [ns, h2, dk2], [ns2, h3, dv])
            if *nd == c.n_dst()
                && *ns == c.n_src()
                && ns2 == ns
                && h2 == h
                && h3 == h
                && dk2 == dk =>
        {
            Ok(Dims {
                n_src: *ns,
                n_dst: *nd,
                heads: *h,
                dk: *dk,
                dv: *dv,
            })
        }
        _ => Err(candle_core::Error::Msg(format!(
            "lse-attention: shapes q {q:?}, k {k:?}, values {v:?} do not fit the CSR"
        ))),
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    // Folded from +0.0 as the CUDA kernels do (`Sum` starts at -0.0), so empty
    // and all-zero sums carry the same sign on both devices.
    a.iter().zip(b).map(|(x, y)| x * y).fold(0.0, |s, x| s + x)
}

/// Scores of `v`'s edges for head `h` shifted by their max: `(max, exp(e − max))`.
fn weights(
    c: &SegmentCsr,
    q: &[f64],
    k: &[f64],
    d: &Dims,
    v: usize,
    h: usize,
    w: &mut Vec<f64>,
) -> f64 {
    let (_, srcs) = c.row(v);
    let qv = &q[(v * d.heads + h) * d.dk..][..d.dk];
    w.clear();
    w.extend(
        srcs.iter()
            .map(|&u| dot(qv, &k[(u as usize * d.heads + h) * d.dk..][..d.dk])),
    );
    let m = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    for x in w.iter_mut() {
        *x = (*x - m).exp();
    }
    if srcs.is_empty() {
        EMPTY_MAX
    } else {
        m
    }
}

#[cfg(feature = "cuda")]
impl Dims {
    fn for_cuda(&self) -> super::cuda::LseDims {
        super::cuda::LseDims {
            n_src: self.n_src,
            n_dst: self.n_dst,
            heads: self.heads,
            dk: self.dk,
            dv: self.dv,
        }
    }
}

/// The backward pass with the native kernels: `(d q, d k, d values)`.
#[cfg(feature = "cuda")]
fn cuda_bwd(
    c: &SegmentCsr,
    d: &Dims,
    q: &Tensor,
    k: &Tensor,
    values: &Tensor,
    grad: &Tensor,
) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    use candle_core::op::BackpropOp;
    use candle_core::Storage;
    let grad = grad.contiguous()?;
    let (q, k, values) = (q.contiguous()?, k.contiguous()?, values.contiguous()?);
    let (sq, lq) = q.storage_and_layout();
    let (sk, lk) = k.storage_and_layout();
    let (sv, lv) = values.storage_and_layout();
    let (sg, lg) = grad.storage_and_layout();
    let (Storage::Cuda(sq), Storage::Cuda(sk), Storage::Cuda(sv), Storage::Cuda(sg)) =
        (&*sq, &*sk, &*sv, &*sg)
    else {
        return Err(candle_core::Error::Msg(
            "lse-attention: backward inputs on different devices".into(),
        ));
    };
    let on = c.on_device(&sq.device, true)?;
    let (dq, dk, dv) =
        super::cuda::lse_bwd((sq, lq), (sk, lk), (sv, lv), (sg, lg), &on, d.for_cuda())?;
    let tensor =
        |s, shape: Shape| Tensor::from_storage(Storage::Cuda(s), shape, BackpropOp::none(), false);
    Ok((
        Some(tensor(dq, Shape::from((d.n_dst, d.heads, d.dk)))),
        Some(tensor(dk, Shape::from((d.n_src, d.heads, d.dk)))),
        Some(tensor(dv, Shape::from((d.n_src, d.heads, d.dv)))),
    ))
}

impl CustomOp3 for LseAttention {
    fn name(&self) -> &'static str {
        "lse-attention"
    }

    fn cpu_fwd(
        &self,
        sq: &CpuStorage,
        lq: &Layout,
        sk: &CpuStorage,
        lk: &Layout,
        sv: &CpuStorage,
        lv: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let c = &self.0;
        let d = dims(c, lq.dims(), lk.dims(), lv.dims())?;
        let (q, k, vals) = (
            to_f64(sq, lq, "lse-attention")?,
            to_f64(sk, lk, "lse-attention")?,
            to_f64(sv, lv, "lse-attention")?,
        );
        let stride = d.heads * (2 + d.dv);
        let mut out = vec![0.0f64; d.n_dst * stride];
        out.par_chunks_mut(stride.max(1))
            .enumerate()
            .with_min_len(32)
            .for_each(|(v, o)| {
                let mut w = Vec::new();
                let (_, srcs) = c.row(v);
                for h in 0..d.heads {
                    let m = weights(c, &q, &k, &d, v, h, &mut w);
                    let oh = &mut o[h * (2 + d.dv)..(h + 1) * (2 + d.dv)];
                    oh[0] = m;
                    oh[1] = w.iter().fold(0.0, |s, x| s + x);
                    for (&u, &wt) in srcs.iter().zip(&w) {
                        for (x, &y) in oh[2..]
                            .iter_mut()
                            .zip(&vals[(u as usize * d.heads + h) * d.dv..][..d.dv])
                        {
                            *x += wt * y;
                        }
                    }
                }
            });
        let out = match sq.dtype() {
            DType::F64 => CpuStorage::F64(out),
            _ => CpuStorage::F32(out.into_iter().map(|x| x as f32).collect()),
        };
        Ok((out, Shape::from((d.n_dst, d.heads, 2 + d.dv))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sq: &candle_core::CudaStorage,
        lq: &Layout,
        sk: &candle_core::CudaStorage,
        lk: &Layout,
        sv: &candle_core::CudaStorage,
        lv: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let c = &self.0;
        let d = dims(c, lq.dims(), lk.dims(), lv.dims())?;
        let on = c.on_device(&sq.device, false)?;
        let out = super::cuda::lse_fwd((sq, lq), (sk, lk), (sv, lv), &on, EMPTY_MAX, d.for_cuda())?;
        Ok((out, Shape::from((d.n_dst, d.heads, 2 + d.dv))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        values: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let c = &self.0;
        let d = dims(c, q.dims(), k.dims(), values.dims())?;
        #[cfg(feature = "cuda")]
        if q.device().is_cuda() {
            return cuda_bwd(c, &d, q, k, values, grad);
        }
        let flat = |t: &Tensor| -> candle_core::Result<Vec<f64>> {
            t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
        };
        let (qv, kv, vals, g) = (
            flat(q)?,
            flat(k)?,
            flat(values)?,
            flat(&grad.contiguous()?)?,
        );
        let (hn, e_n, gw) = (d.heads, c.n_edges(), 2 + d.dv);
        // Destination pass: dL/de per edge and head, and dL/dq.
        let per_dst: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = (0..d.n_dst)
            .into_par_iter()
            .with_min_len(32)
            .map(|v| {
                let (_, srcs) = c.row(v);
                let mut w = Vec::new();
                let mut de = vec![0.0; srcs.len() * hn];
                let mut wts = vec![0.0; srcs.len() * hn];
                let mut dq = vec![0.0; hn * d.dk];
                for h in 0..hn {
                    weights(c, &qv, &kv, &d, v, h, &mut w);
                    let gs = g[(v * hn + h) * gw + 1];
                    let gm = &g[(v * hn + h) * gw + 2..][..d.dv];
                    for (i, &u) in srcs.iter().enumerate() {
                        let u = u as usize;
                        let dw = gs + dot(gm, &vals[(u * hn + h) * d.dv..][..d.dv]);
                        let dei = w[i] * dw;
                        de[i * hn + h] = dei;
                        wts[i * hn + h] = w[i];
                        for (x, &y) in dq[h * d.dk..(h + 1) * d.dk]
                            .iter_mut()
                            .zip(&kv[(u * hn + h) * d.dk..][..d.dk])
                        {
                            *x += dei * y;
                        }
                    }
                }
                (de, wts, dq)
            })
            .collect();
        let mut de_e = vec![0.0; e_n * hn];
        let mut w_e = vec![0.0; e_n * hn];
        let mut dq = Vec::with_capacity(d.n_dst * hn * d.dk);
        for (v, (de, w, q)) in per_dst.into_iter().enumerate() {
            let (range, _) = c.row(v);
            de_e[range.start * hn..range.end * hn].copy_from_slice(&de);
            w_e[range.start * hn..range.end * hn].copy_from_slice(&w);
            dq.extend(q);
        }
        // Source pass: dL/dk and dL/dvalues, each source's edges in a fixed order.
        let per_src: Vec<(Vec<f64>, Vec<f64>)> = (0..d.n_src)
            .into_par_iter()
            .with_min_len(32)
            .map(|u| {
                let mut dk = vec![0.0; hn * d.dk];
                let mut dv = vec![0.0; hn * d.dv];
                for (v, e) in c.out_edges(u) {
                    for h in 0..hn {
                        let (dei, wt) = (de_e[e * hn + h], w_e[e * hn + h]);
                        for (x, &y) in dk[h * d.dk..(h + 1) * d.dk]
                            .iter_mut()
                            .zip(&qv[(v * hn + h) * d.dk..][..d.dk])
                        {
                            *x += dei * y;
                        }
                        for (x, &y) in dv[h * d.dv..(h + 1) * d.dv]
                            .iter_mut()
                            .zip(&g[(v * hn + h) * gw + 2..][..d.dv])
                        {
                            *x += wt * y;
                        }
                    }
                }
                (dk, dv)
            })
            .collect();
        let (dk, dv): (Vec<Vec<f64>>, Vec<Vec<f64>>) = per_src.into_iter().unzip();
        let dev = q.device();
        let dq = Tensor::from_vec(dq, (d.n_dst, hn, d.dk), dev)?.to_dtype(q.dtype())?;
        let dk = Tensor::from_vec(dk.concat(), (d.n_src, hn, d.dk), dev)?.to_dtype(k.dtype())?;
        let dv =
            Tensor::from_vec(dv.concat(), (d.n_src, hn, d.dv), dev)?.to_dtype(values.dtype())?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}
