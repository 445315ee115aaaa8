//! `o += a · x` on one row: the inner loop of the CSR kernels. Built for the
//! baseline x86-64 (SSE2, what a portable binary may assume) and again for
//! AVX2, chosen at run time. The multiply and the add stay separate
//! instructions (no fused multiply-add), so every CPU gets the same bits.

use std::ops::{AddAssign, Mul};

/// An element the kernels compute in (f32 or f64).
pub(crate) trait Elem: Copy + Default + AddAssign + Mul<Output = Self> + Send + Sync {}
impl Elem for f32 {}
impl Elem for f64 {}

/// `o[i] += a · x[i]` over the shorter of the two.
#[inline]
pub(crate) fn axpy<T: Elem>(o: &mut [T], a: T, x: &[T]) {
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
}
