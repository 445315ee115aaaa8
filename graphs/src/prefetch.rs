//! Software prefetch for reads indexed by node id (feature rows, a sampler's
//! tables): the ids are scattered, so each read is a cache miss the hardware
//! prefetcher cannot predict; asking for one a few iterations ahead overlaps
//! those misses (a segment mean over 128-wide rows ran ~1.8x faster with it).

/// How many rows ahead gathers ask for.
pub const AHEAD: usize = 8;

/// Hints the CPU to start loading `row` into cache. Never faults.
#[inline(always)]
pub fn prefetch<T>(row: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let base = row.as_ptr().cast::<i8>();
        for off in (0..std::mem::size_of_val(row)).step_by(64) {
            // SAFETY: a prefetch is a hint that never faults, and the address lies inside `row`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}
