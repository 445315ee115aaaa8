//! `o += a · x` on one row: the inner loop of the CSR kernels, and a whole
//! gathered row ([`gather_row`]). Built for the baseline x86-64 (SSE2, what a
//! portable binary may assume) and again for AVX2 and AVX-512, chosen at run
//! time. The
//! multiply and the add stay separate instructions (no fused multiply-add),
//! so every CPU gets the same bits.

use std::mem::MaybeUninit;
use std::ops::{AddAssign, Mul, Range};

use crate::prefetch::{prefetch, AHEAD};

/// An element the kernels compute in (f32 or f64).
pub(crate) trait Elem:
    Copy + Default + AddAssign + Mul<Output = Self> + Send + Sync
{
}
impl Elem for f32 {}
impl Elem for f64 {}

/// `o[i] += a · x[i]` over the shorter of the two.
#[inline]
pub(crate) fn axpy<T: Elem>(o: &mut [T], a: T, x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512 F.
        unsafe { axpy_avx512(o, a, x) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        unsafe { axpy_avx2(o, a, x) };
        return;
    }
    axpy_any(o, a, x);
}

#[inline(always)]
fn axpy_any<T: Elem>(o: &mut [T], a: T, x: &[T]) {
    for (o, &x) in o.iter_mut().zip(x) {
        *o += a * x;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn axpy_avx2<T: Elem>(o: &mut [T], a: T, x: &[T]) {
    axpy_any(o, a, x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn axpy_avx512<T: Elem>(o: &mut [T], a: T, x: &[T]) {
    axpy_any(o, a, x);
}

/// Writes `o = Σ_{p in span} weight(idx[p]) · x[idx[p]]` (each term added in
/// `span`'s order to 0, exactly as [`axpy`] into a zeroed row would), where
/// `x` holds rows of width `o.len()`; prefetches the rows `AHEAD` entries on.
/// The feature test is made once per row, not per term, so the term loop
/// inlines into one AVX-512 (or AVX2) body.
#[inline]
pub(crate) fn gather_row<T: Elem>(
    o: &mut [MaybeUninit<T>],
    x: &[T],
    idx: &[u32],
    span: Range<usize>,
    weight: impl Fn(u32) -> T,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512 F.
        unsafe { gather_row_avx512(o, x, idx, span, weight) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        unsafe { gather_row_avx2(o, x, idx, span, weight) };
        return;
    }
    gather_row_any(o, x, idx, span, weight);
}

#[inline(always)]
fn gather_row_any<T: Elem>(
    o: &mut [MaybeUninit<T>],
    x: &[T],
    idx: &[u32],
    span: Range<usize>,
    weight: impl Fn(u32) -> T,
) {
    let h = o.len();
    let row = |s: u32| &x[s as usize * h..(s as usize + 1) * h];
    let mut terms = span.map(|p| {
        if let Some(&a) = idx.get(p + AHEAD) {
            prefetch(row(a));
        }
        idx[p]
    });
    let Some(s) = terms.next() else {
        o.fill(MaybeUninit::new(T::default()));
        return;
    };
    let a = weight(s);
    // 0 + a·x, not a·x: the same bits as adding into zeros (-0.0 becomes 0.0).
    for (o, &x) in o.iter_mut().zip(row(s)) {
        let mut v = T::default();
        v += a * x;
        o.write(v);
    }
    // SAFETY: the loop above wrote every element of `o`; MaybeUninit<T> has T's layout.
    let o = unsafe { &mut *(std::ptr::from_mut::<[MaybeUninit<T>]>(o) as *mut [T]) };
    for s in terms {
        axpy_any(o, weight(s), row(s));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn gather_row_avx2<T: Elem>(
    o: &mut [MaybeUninit<T>],
    x: &[T],
    idx: &[u32],
    span: Range<usize>,
    weight: impl Fn(u32) -> T,
) {
    gather_row_any(o, x, idx, span, weight);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn gather_row_avx512<T: Elem>(
    o: &mut [MaybeUninit<T>],
    x: &[T],
    idx: &[u32],
    span: Range<usize>,
    weight: impl Fn(u32) -> T,
) {
    gather_row_any(o, x, idx, span, weight);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_plain_loop_bit_for_bit() {
        for n in [0usize, 1, 7, 8, 9, 64, 131] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut got: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut want = got.clone();
            axpy(&mut got, 0.731, &x);
            axpy_any(&mut want, 0.731, &x);
            assert_eq!(got, want, "{n}");
        }
        let mut o = vec![1.0f64; 5];
        axpy(&mut o, 2.0, &[1.0, 2.0, 3.0]);
        assert_eq!(o, vec![3.0, 5.0, 7.0, 1.0, 1.0]);
    }

    #[test]
    fn a_gathered_row_equals_axpy_into_zeros_bit_for_bit() {
        let h = 13;
        let x: Vec<f32> = (0..h * 6)
            .map(|i| (i as f32 * 0.29).sin() * if i % 7 == 0 { -0.0 } else { 1.0 })
            .collect();
        let idx = [4u32, 0, 5, 5, 2, 1, 3];
        let weight = |s: u32| 0.3 + s as f32 * 0.17;
        for span in [0..0, 0..1, 2..3, 1..7, 0..7] {
            let mut want = vec![0.0f32; h];
            for &s in &idx[span.clone()] {
                axpy(
                    &mut want,
                    weight(s),
                    &x[s as usize * h..(s as usize + 1) * h],
                );
            }
            let mut got = vec![MaybeUninit::new(f32::NAN); h];
            gather_row(&mut got, &x, &idx, span.clone(), weight);
            // SAFETY: gather_row wrote every element.
            let got: Vec<u32> = got
                .iter()
                .map(|v| unsafe { v.assume_init() }.to_bits())
                .collect();
            assert_eq!(
                got,
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{span:?}"
            );
        }
    }
}
