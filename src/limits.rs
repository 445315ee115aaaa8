//! The process's resource limits, checked before work starts: a malformed
//! memory budget and an open-file limit too low for a run's threads, sockets
//! and files are refused with what to do, instead of a panic deep inside the
//! actor system ("Too many open files") or an abort.

use anyhow::bail;

/// Open files a training run, node, launcher or server needs at least: each
/// actor arbiter, the QUIC socket, the runtime's event loop and the mapped
/// graph files hold descriptors (measured: 52 for an embedded two-partition
/// data-parallel run, 32 per node process under `launch`).
pub const MIN_OPEN_FILES: u64 = 256;

/// Refuses a malformed `HETGNN_MEMORY_BYTES` (every command).
pub fn check_memory_budget() -> anyhow::Result<()> {
    graphs::memory::env_budget()?;
    Ok(())
}

/// Raises the soft limit on open files to the hard one and refuses to start
/// when even that is under [`MIN_OPEN_FILES`]. Returns the limit in force.
pub fn require_open_files() -> anyhow::Result<u64> {
    let (soft, hard) = raise_fd_limit();
    if soft < MIN_OPEN_FILES {
        bail!(
            "the open-file limit is {soft} (hard limit {hard}): hetgnn needs at least {MIN_OPEN_FILES} for its threads, sockets and files; raise it (ulimit -n 4096)"
        );
    }
    Ok(soft)
}

/// Raises the soft limit on open files to the hard one (a busy server's
/// connections are file descriptors too; the soft default of 1024 would
/// refuse its clients long before memory does). Returns (soft, hard) after.
pub fn raise_fd_limit() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            // Unknown: let the run try rather than refuse it.
            return (u64::MAX, u64::MAX);
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r = raised;
            }
        }
    }
    (r.rlim_cur, r.rlim_max)
}
