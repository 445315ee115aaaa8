//! Allocator policy for processes that move large messages.

/// Keeps freed memory in the process for about a minute before returning it
/// to the OS. A training step frees and reallocates the same megabytes of
/// tensors and message buffers; once returned, they come back as page
/// faults and zeroed pages. mimalloc's arenas do not purge what was freed
/// `delay` ago: when the first pending purge expires they purge everything
/// freed since, so any short delay returns the whole working set every
/// `delay`. Its default (10 ms × 10 for arenas) and the second we used
/// before both did: 270-340 thousand page faults in a 3-epoch 2-node
/// data-parallel run on mag-like S=0.05, zeroing pages a fifth of the CPU
/// profile; at a minute, 4 thousand, and the epoch 0.90x (measured, 2
/// nodes on 2 cores). Never returning it kept the transient peaks of
/// loading a large partition and of averaging models resident for the
/// whole run: gigabytes per process at mag-like S=4.
/// Takes effect only in programs whose global allocator is mimalloc.
pub fn keep_freed_memory() {
    // mimalloc.h (v2 and v3): mi_option_purge_delay comes just before
    // mi_option_use_numa_nodes, mi_option_arena_purge_mult 8 after it.
    let purge_delay = libmimalloc_sys::mi_option_use_numa_nodes - 1;
    let arena_purge_mult = libmimalloc_sys::mi_option_use_numa_nodes + 8;
    // SAFETY: sets integer options; mimalloc reads them when it next considers purging.
    unsafe {
        libmimalloc_sys::mi_option_set(purge_delay, PURGE_DELAY_MS);
        libmimalloc_sys::mi_option_set(arena_purge_mult, ARENA_PURGE_MULT);
    }
}

/// Base purge delay in milliseconds (pages; arenas multiply it).
const PURGE_DELAY_MS: std::os::raw::c_long = 1000;
/// Arenas purge after this many base delays: a minute.
const ARENA_PURGE_MULT: std::os::raw::c_long = 60;

/// Returns the memory freed so far to the OS now, whatever the delay
/// [`keep_freed_memory`] set: for the end of a phase whose working set is
/// dead and will not come back, such as the coordinator about to assemble
/// the whole trained model (at mag-like S=1 the last epoch's freed batches
/// were still resident under it, some 400 MB). Takes effect only in
/// programs whose global allocator is mimalloc.
pub fn release_freed_memory() {
    // SAFETY: a collection request with no arguments besides `force`.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Asks the kernel for no transparent huge pages in this process, and in
/// the processes it starts, from now on (mimalloc asks for them on the
/// arenas it maps). Where a program touches fresh memory once or a few
/// times, 2 MiB pages zeroed at the first touch cost more than they save:
/// on a VM that returns free memory to its host, the host zeroes them as
/// well. A 4-machine `embed` spent 38% of its CPU zeroing them, a
/// mag-like S=0.1 training run 2.5 s of system time against 1.4 s without
/// (docs/design.md). Returns whether the kernel agreed.
#[cfg(target_os = "linux")]
pub fn avoid_huge_pages() -> bool {
    // SAFETY: a prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 }
}

/// Transparent huge pages are a Linux setting: nothing to ask elsewhere.
#[cfg(not(target_os = "linux"))]
pub fn avoid_huge_pages() -> bool {
    false
}
