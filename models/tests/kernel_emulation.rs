//! The CUDA kernels of the custom ops (`models/src/ops/kernels.cu`) run on the
//! CPU against the CPU ops, so their indexing and arithmetic are checked in
//! every build, GPU or not.
//!
//! The kernels use no shared memory, atomics or barriers, so the emulator
//! (`emu`) gives exactly what the GPU computes, bar the last bit of `exp`.
//! Each kernel runs with the launch configuration `ops/cuda.rs` uses and with
//! a tiny grid that makes the grid-stride loops wrap, and must equal the CPU op's result value for value (zeros compare
//! equal whatever their sign: a sum may start from -0 on one side).
//!
//! Needs a C++ compiler (`$CXX`, else `c++`); without one the tests say so and
//! check nothing.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use candle_core::{Device, Tensor, Var};
use graphs::rng::{key, CounterRng};
use models::ops::{
    add_bias, attention_aggregate, dropout, lse_attention, segment_mean, SegmentCsr, EMPTY_MAX,
    NEGATIVE_SLOPE,
};

mod emu;

use emu::Emu;

/// `kernels.cu` compiled for the host, once per test binary; `None` without a C++ compiler.
fn emu() -> Option<&'static Emu> {
    static EMU: OnceLock<Option<Emu>> = OnceLock::new();
    EMU.get_or_init(|| {
        Emu::build(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/ops/kernels.cu"))
    })
    .as_ref()
}

/// `ops/cuda.rs`'s launch shapes, and a tiny grid that makes every grid-stride loop go round.
fn cfg_rows(rows: usize, h: usize) -> [(u32, u32); 2] {
    [
        (
            (rows as u32).clamp(1, 65_535),
            (h as u32).div_ceil(32).clamp(1, 8) * 32,
        ),
        (2, 32),
    ]
}

fn cfg_elems(n: usize) -> [(u32, u32); 2] {
    [((n as u32).div_ceil(256).clamp(1, 16_384), 256), (3, 32)]
}

/// Equal bit for bit, zeros' signs included (any NaN equals any NaN).
fn assert_same(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "{what}[{i}]: kernel {a:e}, CPU op {b:e}"
        );
    }
}

/// A float type the kernels are instantiated for.
trait F: candle_core::WithDType + Copy {
    const SUFFIX: &'static str;
}
impl F for f32 {
    const SUFFIX: &'static str = "f32";
}
impl F for f64 {
    const SUFFIX: &'static str = "f64";
}

fn values<T: F>(t: &Tensor) -> Vec<T> {
    t.flatten_all().unwrap().to_vec1::<T>().unwrap()
}

fn as_f64<T: F>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// `n` values in [-2, 2) drawn from `seed`, some exactly zero.
fn random<T: F>(seed: u64, n: usize) -> Vec<T> {
    let mut r = CounterRng::new(seed);
    (0..n)
        .map(|i| {
            T::from_f64(if i % 11 == 3 {
                0.0
            } else {
                r.next_f64() * 4.0 - 2.0
            })
        })
        .collect()
}

/// A random destination-major CSR with empty rows and repeated sources, and
/// its transpose in `SegmentCsr`'s order (each source's edges by destination).
struct Csr {
    n_src: usize,
    offsets: Vec<u32>,
    sources: Vec<u32>,
    t_offsets: Vec<u32>,
    t_dsts: Vec<u32>,
    t_edges: Vec<u32>,
    inv_deg: Vec<f64>,
}

impl Csr {
    fn new(seed: u64, n_src: usize, n_dst: usize) -> Csr {
        let mut r = CounterRng::new(seed);
        let mut offsets = vec![0u32];
        let mut sources = Vec::new();
        for d in 0..n_dst {
            let deg = if d % 7 == 2 { 0 } else { r.below(9) as usize };
            sources.extend((0..deg).map(|_| r.below(n_src as u64) as u32));
            offsets.push(sources.len() as u32);
        }
        let mut lists: Vec<Vec<(u32, u32)>> = vec![Vec::new(); n_src];
        for d in 0..n_dst {
            for e in offsets[d]..offsets[d + 1] {
                lists[sources[e as usize] as usize].push((d as u32, e));
            }
        }
        let mut t_offsets = vec![0u32];
        let (mut t_dsts, mut t_edges) = (Vec::new(), Vec::new());
        for l in &lists {
            t_dsts.extend(l.iter().map(|&(d, _)| d));
            t_edges.extend(l.iter().map(|&(_, e)| e));
            t_offsets.push(t_dsts.len() as u32);
        }
        let inv_deg = offsets
            .windows(2)
            .map(|w| {
                if w[1] > w[0] {
                    1.0 / f64::from(w[1] - w[0])
                } else {
                    0.0
                }
            })
            .collect();
        Csr {
            n_src,
            offsets,
            sources,
            t_offsets,
            t_dsts,
            t_edges,
            inv_deg,
        }
    }

    fn n_dst(&self) -> usize {
        self.offsets.len() - 1
    }

    fn segment(&self) -> Arc<SegmentCsr> {
        SegmentCsr::new(self.n_src, self.offsets.clone(), self.sources.clone())
    }
}

/// Forward value and input gradients of `op` for the upstream gradient `g`,
/// by candle's autograd on the CPU (`sum(op(x) · g)` has gradient `g` at the output).
fn cpu_op(
    inputs: &[Tensor],
    g: &Tensor,
    op: impl Fn(&[Tensor]) -> Tensor,
) -> (Tensor, Vec<Tensor>) {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let y = op(&ts);
    let grads = (&y * g).unwrap().sum_all().unwrap().backward().unwrap();
    let gs = ts
        .iter()
        .map(|t| grads.get(t).expect("an input without gradient").clone())
        .collect();
    (y.detach(), gs)
}

fn segment_mean_case<T: F>(e: &Emu) {
    let c = Csr::new(1, 37, 53);
    for h in [1usize, 5, 64, 300] {
        let x = Tensor::from_vec(random::<T>(2, c.n_src * h), (c.n_src, h), &Device::Cpu).unwrap();
        let g =
            Tensor::from_vec(random::<T>(3, c.n_dst() * h), (c.n_dst(), h), &Device::Cpu).unwrap();
        let csr = c.segment();
        let (y, gx) = cpu_op(std::slice::from_ref(&x), &g, |t| {
            segment_mean(&t[0], &csr).unwrap()
        });
        type K<T> = unsafe extern "C" fn(
            *const T,
            *const u32,
            *const u32,
            *const f64,
            u32,
            *mut T,
            u32,
            u32,
        );
        let k: K<T> = e.kernel(&format!("gather_rows_{}", T::SUFFIX));
        let (xv, gv) = (values::<T>(&x), values::<T>(&g));
        for (grid, block) in cfg_rows(c.n_dst(), h) {
            let mut out = vec![T::from_f64(f64::NAN); c.n_dst() * h];
            let o = out.as_mut_ptr();
            // SAFETY: buffers sized as the kernel indexes them.
            e.launch(grid, block, || unsafe {
                k(
                    xv.as_ptr(),
                    c.offsets.as_ptr(),
                    c.sources.as_ptr(),
                    c.inv_deg.as_ptr(),
                    1,
                    o,
                    c.n_dst() as u32,
                    h as u32,
                )
            });
            assert_same(
                &format!("segment mean h={h} grid={grid}"),
                &as_f64(&out),
                &as_f64(&values::<T>(&y)),
            );
        }
        for (grid, block) in cfg_rows(c.n_src, h) {
            let mut out = vec![T::from_f64(f64::NAN); c.n_src * h];
            let o = out.as_mut_ptr();
            // SAFETY: as above; the transpose weighs each edge by its destination's 1/degree.
            e.launch(grid, block, || unsafe {
                k(
                    gv.as_ptr(),
                    c.t_offsets.as_ptr(),
                    c.t_dsts.as_ptr(),
                    c.inv_deg.as_ptr(),
                    0,
                    o,
                    c.n_src as u32,
                    h as u32,
                )
            });
            assert_same(
                &format!("segment mean backward h={h} grid={grid}"),
                &as_f64(&out),
                &as_f64(&values::<T>(&gx[0])),
            );
        }
    }
}

#[test]
fn segment_mean_kernels_match_the_cpu() {
    let Some(e) = emu() else { return };
    segment_mean_case::<f32>(e);
    segment_mean_case::<f64>(e);
}

fn dropout_case<T: F>(e: &Emu) {
    let (rows, cols) = (41usize, 70usize);
    let ids: Vec<u32> = (0..rows as u32).map(|i| i * 7 + 3).collect();
    let mask_key = 99u64;
    let keys: Vec<u64> = ids
        .iter()
        .map(|&id| key(&[mask_key, u64::from(id)]))
        .collect();
    let x = Tensor::from_vec(random::<T>(4, rows * cols), (rows, cols), &Device::Cpu).unwrap();
    let g = Tensor::from_vec(random::<T>(5, rows * cols), (rows, cols), &Device::Cpu).unwrap();
    let (xv, gv) = (values::<T>(&x), values::<T>(&g));
    for (relu, p) in [(true, 0.5f32), (false, 0.3), (true, 0.0)] {
        let (y, gx) = cpu_op(std::slice::from_ref(&x), &g, |t| {
            dropout(&t[0], relu, mask_key, p, &ids).unwrap()
        });
        let scale = 1.0 / (1.0 - p);
        let fwd: unsafe extern "C" fn(*const T, *const u64, f32, f32, u32, *mut T, u32, u32) =
            e.kernel(&format!("dropout_fwd_{}", T::SUFFIX));
        let bwd: unsafe extern "C" fn(
            *const T,
            *const T,
            *const u64,
            f32,
            f32,
            u32,
            *mut T,
            u32,
            u32,
        ) = e.kernel(&format!("dropout_bwd_{}", T::SUFFIX));
        for (grid, block) in cfg_elems(rows * cols) {
            let what = format!("relu={relu} p={p} grid={grid}");
            let mut out = vec![T::from_f64(f64::NAN); rows * cols];
            let o = out.as_mut_ptr();
            // SAFETY: buffers sized as the kernels index them.
            e.launch(grid, block, || unsafe {
                fwd(
                    xv.as_ptr(),
                    keys.as_ptr(),
                    p,
                    scale,
                    u32::from(relu),
                    o,
                    rows as u32,
                    cols as u32,
                )
            });
            assert_same(
                &format!("dropout {what}"),
                &as_f64(&out),
                &as_f64(&values::<T>(&y)),
            );
            // SAFETY: as above.
            e.launch(grid, block, || unsafe {
                bwd(
                    gv.as_ptr(),
                    xv.as_ptr(),
                    keys.as_ptr(),
                    p,
                    scale,
                    u32::from(relu),
                    o,
                    rows as u32,
                    cols as u32,
                )
            });
            assert_same(
                &format!("dropout backward {what}"),
                &as_f64(&out),
                &as_f64(&values::<T>(&gx[0])),
            );
        }
    }
}

#[test]
fn dropout_kernels_match_the_cpu() {
    let Some(e) = emu() else { return };
    dropout_case::<f32>(e);
    dropout_case::<f64>(e);
}

fn bias_case<T: F>(e: &Emu) {
    let (rows, cols) = (300usize, 45usize);
    let x = Tensor::from_vec(random::<T>(6, rows * cols), (rows, cols), &Device::Cpu).unwrap();
    let b = Tensor::from_vec(random::<T>(7, cols), cols, &Device::Cpu).unwrap();
    let g = Tensor::from_vec(random::<T>(8, rows * cols), (rows, cols), &Device::Cpu).unwrap();
    let (y, grads) = cpu_op(&[x.clone(), b.clone()], &g, |t| {
        add_bias(&t[0], &t[1]).unwrap()
    });
    let (xv, bv, gv) = (values::<T>(&x), values::<T>(&b), values::<T>(&g));
    let add: unsafe extern "C" fn(*const T, *const T, *mut T, u32, u32) =
        e.kernel(&format!("add_bias_{}", T::SUFFIX));
    let sums: unsafe extern "C" fn(*const T, *mut T, u32, u32) =
        e.kernel(&format!("column_sums_{}", T::SUFFIX));
    let partials: unsafe extern "C" fn(*const T, *mut T, u32, u32, u32) =
        e.kernel(&format!("column_partials_{}", T::SUFFIX));
    for (grid, block) in cfg_elems(rows * cols) {
        let mut out = vec![T::from_f64(f64::NAN); rows * cols];
        let o = out.as_mut_ptr();
        // SAFETY: buffers sized as the kernel indexes them.
        e.launch(grid, block, || unsafe {
            add(xv.as_ptr(), bv.as_ptr(), o, rows as u32, cols as u32)
        });
        assert_same(
            &format!("add bias grid={grid}"),
            &as_f64(&out),
            &as_f64(&values::<T>(&y)),
        );
    }
    // cuda.rs: blocks of rows summed by a thread per (block, column), then a
    // thread per column, 128 to a block, over the blocks' sums (no stride
    // loop there, so every column needs its thread). 300 rows: two blocks of 256.
    let (block, blocks) = (256usize, rows.div_ceil(256));
    for (grid, threads) in cfg_elems(blocks * cols) {
        let mut part = vec![T::from_f64(f64::NAN); blocks * cols];
        let p = part.as_mut_ptr();
        // SAFETY: as above.
        e.launch(grid, threads, || unsafe {
            partials(gv.as_ptr(), p, rows as u32, cols as u32, block as u32)
        });
        let mut out = vec![T::from_f64(f64::NAN); cols];
        let o = out.as_mut_ptr();
        // SAFETY: as above.
        e.launch((cols as u32).div_ceil(128), 128, || unsafe {
            sums(part.as_ptr(), o, blocks as u32, cols as u32)
        });
        assert_same(
            &format!("column sums grid={grid}"),
            &as_f64(&out),
            &as_f64(&values::<T>(&grads[1])),
        );
    }
    assert_same(
        "add bias backward (input)",
        &as_f64(&values::<T>(&grads[0])),
        &as_f64(&gv),
    );
}

#[test]
fn bias_kernels_match_the_cpu() {
    let Some(e) = emu() else { return };
    bias_case::<f32>(e);
    bias_case::<f64>(e);
}

fn attention_case<T: F>(e: &Emu) {
    let c = Csr::new(9, 29, 31);
    let csr = c.segment();
    let (heads, width) = (3usize, 5usize);
    let (n_src, n_dst) = (c.n_src, c.n_dst());
    let cpu = |v: Vec<T>, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
    let vals = cpu(
        random::<T>(10, n_src * heads * width),
        &[n_src, heads, width],
    );
    let el = cpu(random::<T>(11, n_src * heads), &[n_src, heads]);
    let er = cpu(random::<T>(12, n_dst * heads), &[n_dst, heads]);
    let g = cpu(
        random::<T>(13, n_dst * heads * width),
        &[n_dst, heads, width],
    );
    let (y, grads) = cpu_op(&[vals.clone(), el.clone(), er.clone()], &g, |t| {
        attention_aggregate(&t[0], &t[1], &t[2], &csr).unwrap()
    });
    let (vv, lv, rv, gv) = (
        values::<T>(&vals),
        values::<T>(&el),
        values::<T>(&er),
        values::<T>(&g),
    );
    type Fwd<T> = unsafe extern "C" fn(
        *const T,
        *const T,
        *const T,
        *const u32,
        *const u32,
        f64,
        *mut T,
        u32,
        u32,
        u32,
    );
    type BwdDst<T> = unsafe extern "C" fn(
        *const T,
        *const T,
        *const T,
        *const T,
        *const u32,
        *const u32,
        f64,
        *mut f64,
        *mut f64,
        *mut T,
        u32,
        u32,
        u32,
    );
    type BwdSrc<T> = unsafe extern "C" fn(
        *const T,
        *const f64,
        *const f64,
        *const u32,
        *const u32,
        *const u32,
        *mut T,
        *mut T,
        u32,
        u32,
        u32,
    );
    let fwd: Fwd<T> = e.kernel(&format!("attention_fwd_{}", T::SUFFIX));
    let bwd_dst: BwdDst<T> = e.kernel(&format!("attention_bwd_dst_{}", T::SUFFIX));
    let bwd_src: BwdSrc<T> = e.kernel(&format!("attention_bwd_src_{}", T::SUFFIX));
    let (nd, ns, hk, wd) = (n_dst as u32, n_src as u32, heads as u32, width as u32);
    let nan = T::from_f64(f64::NAN);
    for (grid, block) in cfg_rows(n_dst, heads * width) {
        let mut out = vec![nan; n_dst * heads * width];
        let o = out.as_mut_ptr();
        // SAFETY: buffers sized as the kernel indexes them.
        e.launch(grid, block, || unsafe {
            fwd(
                vv.as_ptr(),
                lv.as_ptr(),
                rv.as_ptr(),
                c.offsets.as_ptr(),
                c.sources.as_ptr(),
                NEGATIVE_SLOPE,
                o,
                nd,
                hk,
                wd,
            )
        });
        assert_same(
            &format!("attention grid={grid}"),
            &as_f64(&out),
            &as_f64(&values::<T>(&y)),
        );
    }
    for ((g1, b1), (g2, b2)) in cfg_elems(n_dst * heads)
        .into_iter()
        .zip(cfg_rows(n_src, (heads * width).max(heads)))
    {
        let per_edge = c.sources.len() * heads;
        let (mut alpha_e, mut dpre_e) = (vec![f64::NAN; per_edge], vec![f64::NAN; per_edge]);
        let mut der = vec![nan; n_dst * heads];
        let (mut dv, mut del) = (vec![nan; n_src * heads * width], vec![nan; n_src * heads]);
        let (a, p, r) = (alpha_e.as_mut_ptr(), dpre_e.as_mut_ptr(), der.as_mut_ptr());
        // SAFETY: as above; the source pass reads what the destination pass wrote, as the stream orders them.
        e.launch(g1, b1, || unsafe {
            bwd_dst(
                vv.as_ptr(),
                lv.as_ptr(),
                rv.as_ptr(),
                gv.as_ptr(),
                c.offsets.as_ptr(),
                c.sources.as_ptr(),
                NEGATIVE_SLOPE,
                a,
                p,
                r,
                nd,
                hk,
                wd,
            )
        });
        let (o1, o2) = (dv.as_mut_ptr(), del.as_mut_ptr());
        // SAFETY: as above.
        e.launch(g2, b2, || unsafe {
            bwd_src(
                gv.as_ptr(),
                a,
                p,
                c.t_offsets.as_ptr(),
                c.t_dsts.as_ptr(),
                c.t_edges.as_ptr(),
                o1,
                o2,
                ns,
                hk,
                wd,
            )
        });
        assert_same(
            &format!("attention d(values) grids={g1},{g2}"),
            &as_f64(&dv),
            &as_f64(&values::<T>(&grads[0])),
        );
        assert_same(
            &format!("attention d(el) grids={g1},{g2}"),
            &as_f64(&del),
            &as_f64(&values::<T>(&grads[1])),
        );
        assert_same(
            &format!("attention d(er) grids={g1},{g2}"),
            &as_f64(&der),
            &as_f64(&values::<T>(&grads[2])),
        );
    }
}

#[test]
fn attention_kernels_match_the_cpu() {
    let Some(e) = emu() else { return };
    attention_case::<f32>(e);
    attention_case::<f64>(e);
}

fn lse_case<T: F>(e: &Emu) {
    let c = Csr::new(14, 23, 27);
    let csr = c.segment();
    let (heads, dk, dv) = (2usize, 4usize, 6usize);
    let (n_src, n_dst, gw) = (c.n_src, c.n_dst(), 2 + dv);
    let cpu = |v: Vec<T>, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
    let q = cpu(random::<T>(15, n_dst * heads * dk), &[n_dst, heads, dk]);
    let k = cpu(random::<T>(16, n_src * heads * dk), &[n_src, heads, dk]);
    let vals = cpu(random::<T>(17, n_src * heads * dv), &[n_src, heads, dv]);
    let g = cpu(random::<T>(18, n_dst * heads * gw), &[n_dst, heads, gw]);
    let (y, grads) = cpu_op(&[q.clone(), k.clone(), vals.clone()], &g, |t| {
        lse_attention(&t[0], &t[1], &t[2], &csr).unwrap()
    });
    let (qv, kv, vv, gv) = (
        values::<T>(&q),
        values::<T>(&k),
        values::<T>(&vals),
        values::<T>(&g),
    );
    type Fwd<T> = unsafe extern "C" fn(
        *const T,
        *const T,
        *const T,
        *const u32,
        *const u32,
        f64,
        *mut T,
        u32,
        u32,
        u32,
        u32,
    );
    type BwdDst<T> = unsafe extern "C" fn(
        *const T,
        *const T,
        *const T,
        *const T,
        *const u32,
        *const u32,
        *mut f64,
        *mut f64,
        *mut T,
        u32,
        u32,
        u32,
        u32,
    );
    type BwdSrc<T> = unsafe extern "C" fn(
        *const T,
        *const T,
        *const f64,
        *const f64,
        *const u32,
        *const u32,
        *const u32,
        *mut T,
        *mut T,
        u32,
        u32,
        u32,
        u32,
    );
    let fwd: Fwd<T> = e.kernel(&format!("lse_fwd_{}", T::SUFFIX));
    let bwd_dst: BwdDst<T> = e.kernel(&format!("lse_bwd_dst_{}", T::SUFFIX));
    let bwd_src: BwdSrc<T> = e.kernel(&format!("lse_bwd_src_{}", T::SUFFIX));
    let (nd, ns, hk, k32, v32) = (
        n_dst as u32,
        n_src as u32,
        heads as u32,
        dk as u32,
        dv as u32,
    );
    let nan = T::from_f64(f64::NAN);
    for (grid, block) in cfg_rows(n_dst, heads * gw) {
        let mut out = vec![nan; n_dst * heads * gw];
        let o = out.as_mut_ptr();
        // SAFETY: buffers sized as the kernel indexes them.
        e.launch(grid, block, || unsafe {
            fwd(
                qv.as_ptr(),
                kv.as_ptr(),
                vv.as_ptr(),
                c.offsets.as_ptr(),
                c.sources.as_ptr(),
                EMPTY_MAX,
                o,
                nd,
                hk,
                k32,
                v32,
            )
        });
        assert_same(
            &format!("lse attention grid={grid}"),
            &as_f64(&out),
            &as_f64(&values::<T>(&y)),
        );
    }
    for ((g1, b1), (g2, b2)) in cfg_elems(n_dst * heads)
        .into_iter()
        .zip(cfg_rows(n_src, heads * (dk + dv)))
    {
        let per_edge = c.sources.len() * heads;
        let (mut de_e, mut w_e) = (vec![f64::NAN; per_edge], vec![f64::NAN; per_edge]);
        let mut dq = vec![nan; n_dst * heads * dk];
        let (mut dk_out, mut dv_out) =
            (vec![nan; n_src * heads * dk], vec![nan; n_src * heads * dv]);
        let (a, w, r) = (de_e.as_mut_ptr(), w_e.as_mut_ptr(), dq.as_mut_ptr());
        // SAFETY: as above; the source pass reads what the destination pass wrote.
        e.launch(g1, b1, || unsafe {
            bwd_dst(
                qv.as_ptr(),
                kv.as_ptr(),
                vv.as_ptr(),
                gv.as_ptr(),
                c.offsets.as_ptr(),
                c.sources.as_ptr(),
                a,
                w,
                r,
                nd,
                hk,
                k32,
                v32,
            )
        });
        let (o1, o2) = (dk_out.as_mut_ptr(), dv_out.as_mut_ptr());
        // SAFETY: as above.
        e.launch(g2, b2, || unsafe {
            bwd_src(
                qv.as_ptr(),
                gv.as_ptr(),
                a,
                w,
                c.t_offsets.as_ptr(),
                c.t_dsts.as_ptr(),
                c.t_edges.as_ptr(),
                o1,
                o2,
                ns,
                hk,
                k32,
                v32,
            )
        });
        assert_same(
            &format!("lse d(q) grids={g1},{g2}"),
            &as_f64(&dq),
            &as_f64(&values::<T>(&grads[0])),
        );
        assert_same(
            &format!("lse d(k) grids={g1},{g2}"),
            &as_f64(&dk_out),
            &as_f64(&values::<T>(&grads[1])),
        );
        assert_same(
            &format!("lse d(values) grids={g1},{g2}"),
            &as_f64(&dv_out),
            &as_f64(&values::<T>(&grads[2])),
        );
    }
}

#[test]
fn lse_attention_kernels_match_the_cpu() {
    let Some(e) = emu() else { return };
    lse_case::<f32>(e);
    lse_case::<f64>(e);
}

/// The sparse Adam kernel a GPU cache runs on its learnable rows, against the
/// host table's update: several steps over shuffled, partly overlapping rows,
/// so each row's own step count (and bias corrections) differs.
#[test]
fn sparse_adam_kernel_matches_the_host_table() {
    use models::embedding::EmbeddingTable;
    use models::optim::AdamConfig;
    let Some(e) = emu() else { return };
    let cfg = AdamConfig::with_lr(0.05);
    let (rows, dim) = (40usize, 37usize);
    type Kernel = unsafe extern "C" fn(
        *mut f32,
        *mut f32,
        *mut f32,
        *const u32,
        *const u32,
        *const f32,
        *const f64,
        u32,
        f32,
        f32,
        f32,
        f32,
        f64,
        f64,
        u32,
        u32,
    );
    type Bump = unsafe extern "C" fn(*mut u32, *const u32, u32, u32);
    let (adam, bump): (Kernel, Bump) = (e.kernel("sparse_adam_f32"), e.kernel("bump_steps_u32"));
    let touched: Vec<Vec<u32>> = (0..4u32)
        .map(|step| {
            (0..rows as u32)
                .map(|i| (i * 7 + step * 3) % rows as u32)
                .filter(|i| (i + step) % 3 != 0)
                .collect()
        })
        .collect();
    let grads: Vec<Vec<f32>> = touched
        .iter()
        .enumerate()
        .map(|(k, ids)| random::<f32>(20 + k as u64, ids.len() * dim))
        .collect();
    let mut host = EmbeddingTable::new(5, "embed.x", rows, dim);
    for (ids, g) in touched.iter().zip(&grads) {
        host.adam_rows(ids, g, &cfg).unwrap();
    }
    // The corrections by step count, as the cache uploads them (5 entries: counts up to 4).
    let bc: Vec<f64> = (0..5u32)
        .flat_map(|t| <[f64; 2]>::from(cfg.bias_corrections(t)))
        .collect();
    for ((grid, block), (bgrid, bblock)) in cfg_rows(touched[0].len(), dim)
        .into_iter()
        .zip(cfg_elems(touched[0].len()))
    {
        let mut t = EmbeddingTable::new(5, "embed.x", rows, dim);
        let mut steps = vec![0u32; rows];
        for (ids, g) in touched.iter().zip(&grads) {
            let (b1, b2) = (cfg.beta1 as f32, cfg.beta2 as f32);
            let (d, m, v, st) = (
                t.data.as_mut_ptr(),
                t.m.as_mut_ptr(),
                t.v.as_mut_ptr(),
                steps.as_mut_ptr(),
            );
            let n = ids.len() as u32;
            // SAFETY: buffers sized as the kernels index them; ids are distinct and in range.
            e.launch(grid, block, || unsafe {
                adam(
                    d,
                    m,
                    v,
                    st,
                    ids.as_ptr(),
                    g.as_ptr(),
                    bc.as_ptr(),
                    5,
                    b1,
                    1.0 - b1,
                    b2,
                    1.0 - b2,
                    cfg.lr,
                    cfg.eps,
                    n,
                    dim as u32,
                )
            });
            // SAFETY: as above.
            e.launch(bgrid, bblock, || unsafe { bump(st, ids.as_ptr(), 5, n) });
        }
        let f = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
        assert_same(
            &format!("sparse adam values grid={grid}"),
            &f(&t.data),
            &f(&host.data),
        );
        assert_same(
            &format!("sparse adam first moments grid={grid}"),
            &f(&t.m),
            &f(&host.m),
        );
        assert_same(
            &format!("sparse adam second moments grid={grid}"),
            &f(&t.v),
            &f(&host.v),
        );
        assert_eq!(steps, host.steps);
    }
}

/// The row-picking kernel of a GPU cache's gathers, whole 16-byte vectors and single values.
#[test]
fn take_rows_kernel_matches_the_host_gather() {
    let Some(e) = emu() else { return };
    type Kernel = unsafe extern "C" fn(*const f32, *const u32, *mut f32, u32, u32, u32);
    let take: Kernel = e.kernel("take_rows_f32");
    for (cols, vec) in [(128usize, 1u32), (37, 0), (8, 0)] {
        let n = 50usize;
        let x = random::<f32>(30 + cols as u64, n * cols);
        let idx: Vec<u32> = (0..70u32).map(|i| (i * 13 + 5) % n as u32).collect();
        let want: Vec<f64> = idx
            .iter()
            .flat_map(|&i| {
                x[i as usize * cols..(i as usize + 1) * cols]
                    .iter()
                    .map(|&v| f64::from(v))
            })
            .collect();
        for (grid, block) in [((idx.len() as u32).div_ceil(8), 256), (2, 64)] {
            let mut out = vec![f32::NAN; idx.len() * cols];
            let o = out.as_mut_ptr();
            // SAFETY: buffers sized as the kernel indexes them; ids in range.
            e.launch(grid, block, || unsafe {
                take(
                    x.as_ptr(),
                    idx.as_ptr(),
                    o,
                    vec,
                    idx.len() as u32,
                    cols as u32,
                )
            });
            assert_same(
                &format!("take rows cols={cols} grid={grid}"),
                &out.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
                &want,
            );
        }
    }
}

#[test]
fn dense_adam_kernel_matches_the_candle_ops() {
    use models::optim::{Adam, AdamConfig};
    use models::params::ParamStore;
    let Some(e) = emu() else { return };
    type Kernel = unsafe extern "C" fn(
        *mut f32,
        *mut f32,
        *mut f32,
        *const f32,
        u32,
        f32,
        f32,
        f32,
        f32,
        f32,
        f32,
        f32,
        f32,
    );
    let adam_kernel: Kernel = e.kernel("dense_adam_f32");
    let cfg = AdamConfig::with_lr(0.05);
    let n = 1000usize;
    // Some entries zero, of either sign, where `+ 0` and `p - u` decide the sign.
    let start: Vec<f32> = random::<f32>(30, n)
        .into_iter()
        .enumerate()
        .map(|(i, x)| if i % 17 == 5 { -0.0 } else { x })
        .collect();
    let grads: Vec<Vec<f32>> = (0..4u64)
        .map(|k| {
            random::<f32>(40 + k, n)
                .into_iter()
                .enumerate()
                .map(|(i, x)| if i % 13 == 2 { -0.0 } else { x })
                .collect()
        })
        .collect();
    // The candle ops' Adam on the CPU.
    let mut store = ParamStore::new();
    let w = store
        .zeros("w", n, candle_core::DType::F32, &Device::Cpu)
        .unwrap();
    store
        .get("w")
        .unwrap()
        .set(&Tensor::from_vec(start.clone(), n, &Device::Cpu).unwrap())
        .unwrap();
    let mut adam = Adam::new(cfg);
    let mut want = Vec::new();
    for g in &grads {
        let grads = std::collections::BTreeMap::from([(
            "w".to_string(),
            Tensor::from_vec(g.clone(), n, &Device::Cpu).unwrap(),
        )]);
        adam.step_named(&store, &grads).unwrap();
        let (m, v) = &adam.moments["w"];
        want.push([values::<f32>(&w), values::<f32>(m), values::<f32>(v)]);
    }
    for (grid, block) in cfg_elems(n) {
        let (mut p, mut m, mut v) = (start.clone(), vec![0f32; n], vec![0f32; n]);
        for (t, g) in grads.iter().enumerate() {
            let (bc1, bc2) = cfg.bias_corrections(t as u32 + 1);
            let (pp, mp, vp) = (p.as_mut_ptr(), m.as_mut_ptr(), v.as_mut_ptr());
            e.launch(grid, block, || unsafe {
                adam_kernel(
                    pp,
                    mp,
                    vp,
                    g.as_ptr(),
                    n as u32,
                    cfg.beta1 as f32,
                    (1.0 - cfg.beta1) as f32,
                    cfg.beta2 as f32,
                    (1.0 - cfg.beta2) as f32,
                    (1.0 / bc1) as f32,
                    (1.0 / bc2) as f32,
                    cfg.eps as f32,
                    cfg.lr as f32,
                )
            });
            for (what, got, want) in [
                ("p", &p, &want[t][0]),
                ("m", &m, &want[t][1]),
                ("v", &v, &want[t][2]),
            ] {
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(got),
                    bits(want),
                    "{what} after step {t}, launch ({grid}, {block})"
                );
            }
        }
    }
}
