//! Thread settings for candle's CPU backend.

/// Gives candle's own element-wise thread pool a single thread, unless the
/// user set `CANDLE_NUM_THREADS`. The heavy kernels (matrix products, the
/// graph ops, the optimisers) run on rayon's pool; candle's separate pool
/// spins for about a millisecond after each element-wise op and takes cores
/// from rayon's workers in the ops that follow. On 2 cores that cost 13% of
/// an R-GCN epoch (mag-like S=0.05: 2.9 -> 2.5 s). Results do not change:
/// element-wise ops compute each element alone. With no threads of its own,
/// the vendored candle hands large element-wise ops to rayon's pool instead
/// (third_party/README.md, change 3).
///
/// Call it first in `main`, before any other thread exists (it sets an
/// environment variable, which candle reads when it first needs its pool).
pub fn init_cpu_threads() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
