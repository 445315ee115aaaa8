//! Allocator policy for processes that move large messages.

/// Keeps freed memory in the process for a second before returning it to the
/// OS, instead of 10 ms (mimalloc's default): a training step frees and
/// reallocates the same megabytes of tensors and message buffers, and
/// re-faulting them as zeroed pages cost 10-15% of a data-parallel epoch
/// (measured, 2 nodes on 2 cores). Never returning it (as before) kept the
/// transient peaks of loading a large partition and of averaging models
/// resident for the whole run: gigabytes per process at mag-like S=4.
/// Takes effect only in programs whose global allocator is mimalloc.
pub fn keep_freed_memory() {
    // mimalloc.h (v2 and v3): mi_option_purge_delay comes just before mi_option_use_numa_nodes.
    let purge_delay = libmimalloc_sys::mi_option_use_numa_nodes - 1;
    // SAFETY: sets an integer option (milliseconds); mimalloc reads it when it next considers purging.
    unsafe { libmimalloc_sys::mi_option_set(purge_delay, PURGE_DELAY_MS) };
}

/// How long freed memory stays in the process (steps reuse it well within this).
const PURGE_DELAY_MS: std::os::raw::c_long = 1000;
