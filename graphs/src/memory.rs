//! The process's peak memory, for reports, and the machine's, for refusing
//! sizes that cannot fit before anything is allocated.

/// Address space that threads' stacks and the allocator reserve without
/// using it: an address-space limit (`ulimit -v`) leaves this much less for data.
pub const ADDRESS_SPACE_RESERVE: u64 = 256 << 20;

/// Work refused for the memory or disk it needs, or a malformed budget:
/// the caller refuses the work with the message (it says what to change).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// The memory a run may plan for, and where that figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Bytes.
    pub bytes: u64,
    /// What sets it, for messages ("this machine's memory", ...).
    pub source: &'static str,
}

/// `$HETGNN_MEMORY_BYTES`, if set: a whole number of bytes, else an error
/// saying so (a malformed budget is refused, not ignored).
pub fn env_budget() -> Result<Option<u64>, Refused> {
    let Some(v) = std::env::var_os("HETGNN_MEMORY_BYTES") else {
        return Ok(None);
    };
    v.to_str()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .filter(|&b| b > 0)
        .map(Some)
        .ok_or_else(|| {
            Refused(format!(
                "HETGNN_MEMORY_BYTES={:?} is not a positive whole number of bytes (e.g. 8589934592 for 8 GiB); unset it to plan for the whole machine",
                v.to_string_lossy()
            ))
        })
}

/// The memory a run may plan for: `$HETGNN_MEMORY_BYTES` if set (a share of
/// a machine, or a test), else the smallest of the machine's physical memory
/// (Linux `MemTotal`), the container's limit (cgroup v2 `memory.max`, v1
/// `memory.limit_in_bytes`) and the address-space limit (`RLIMIT_AS`, less
/// [`ADDRESS_SPACE_RESERVE`]); `None` when none is known. A malformed
/// `$HETGNN_MEMORY_BYTES` gives `None` here: [`env_budget`] refuses it.
pub fn budget() -> Option<Budget> {
    if std::env::var_os("HETGNN_MEMORY_BYTES").is_some() {
        return env_budget().ok().flatten().map(|bytes| Budget {
            bytes,
            source: "the budget HETGNN_MEMORY_BYTES sets",
        });
    }
    let mut best: Option<Budget> = None;
    let mut take = |bytes: Option<u64>, source: &'static str| {
        if let Some(bytes) = bytes {
            if best.is_none_or(|b| bytes < b.bytes) {
                best = Some(Budget { bytes, source });
            }
        }
    };
    take(mem_total(), "this machine's memory");
    // "max" (no limit) and v1's huge "unlimited" value fail to parse or exceed the total.
    take(
        [
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        ]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok()),
        "the container's memory limit",
    );
    take(
        address_space_limit().map(|l| l.saturating_sub(ADDRESS_SPACE_RESERVE)),
        "the address-space limit (ulimit -v) less 256 MiB of thread stacks and allocator reserve",
    );
    best
}

/// The budget's bytes (see [`budget`]).
pub fn budget_bytes() -> Option<u64> {
    budget().map(|b| b.bytes)
}

fn mem_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// The soft address-space limit of this process, if one is set.
fn address_space_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid pointer to a local struct.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Refuses `bytes` (at least what `what` will allocate) when over [`budget`],
/// or when `$HETGNN_MEMORY_BYTES` is malformed.
pub fn check_fits(what: &str, bytes: u128) -> Result<(), Refused> {
    env_budget()?;
    match budget() {
        Some(b) if bytes > u128::from(b.bytes) => Err(Refused(format!(
            "{what} needs about {} of memory, more than {}, {}{}",
            human(bytes),
            b.source,
            human(u128::from(b.bytes)),
            match std::env::var_os("HETGNN_MEMORY_BYTES") {
                Some(_) => "",
                None => " (HETGNN_MEMORY_BYTES sets another budget)",
            }
        ))),
        _ => Ok(()),
    }
}

/// Refuses writing `bytes` (what `what` takes) under `dir` when the file
/// system there (its nearest existing ancestor) has less free space.
pub fn check_disk(what: &str, bytes: u128, dir: &std::path::Path) -> Result<(), Refused> {
    use std::os::unix::ffi::OsStrExt;
    let mut at = Some(dir);
    while let Some(d) = at {
        let probe = if d.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            d
        };
        if probe.exists() {
            let Ok(c) = std::ffi::CString::new(probe.as_os_str().as_bytes()) else {
                return Ok(());
            };
            // SAFETY: statvfs with a NUL-terminated path and a zeroed local struct.
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
                return Ok(());
            }
            let free = u128::from(s.f_bavail) * u128::from(s.f_frsize);
            return if bytes > free {
                Err(Refused(format!(
                    "{what} takes about {} on disk, more than the {} free in {}",
                    human(bytes),
                    human(free),
                    probe.display()
                )))
            } else {
                Ok(())
            };
        }
        at = d.parent();
    }
    Ok(())
}

/// Bytes in binary units, for messages.
pub fn human(bytes: u128) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Peak resident memory of this process (Linux), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident anonymous memory of this process now (Linux): heap, stacks and
/// private copies, but not pages of memory-mapped files, which the kernel can
/// drop and read again (they count in [`peak_rss_bytes`]).
pub fn anon_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

static ANON_PEAK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static TRACKING: std::sync::Once = std::sync::Once::new();

/// How often [`track_anon`] samples.
const ANON_SAMPLE: std::time::Duration = std::time::Duration::from_millis(20);

/// Starts sampling [`anon_rss_bytes`] on a thread of its own (once per
/// process, until it exits): the kernel keeps no peak of it.
pub fn track_anon() {
    TRACKING.call_once(|| {
        note_anon();
        let _ = std::thread::Builder::new()
            .name("anon-rss".into())
            .spawn(|| loop {
                std::thread::sleep(ANON_SAMPLE);
                note_anon();
            });
    });
}

fn note_anon() {
    if let Some(b) = anon_rss_bytes() {
        ANON_PEAK.fetch_max(b, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The largest anonymous resident memory seen since [`track_anon`] started
/// (sampled every 20 ms, and now); `None` if it never ran or is unknown here.
pub fn peak_anon_bytes() -> Option<u64> {
    if !TRACKING.is_completed() {
        return None;
    }
    note_anon();
    Some(ANON_PEAK.load(std::sync::atomic::Ordering::Relaxed)).filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_anonymous_peak_sees_a_large_allocation_and_stays_below_the_high_water_mark() {
        track_anon();
        let before = peak_anon_bytes().unwrap_or(0);
        // 64 MiB touched, so it is resident.
        let v = vec![1u8; 64 << 20];
        std::thread::sleep(ANON_SAMPLE * 3);
        let peak = peak_anon_bytes().unwrap_or(0);
        assert!(v.iter().step_by(4096).all(|&b| b == 1));
        assert!(peak >= before + (48 << 20), "peak {peak}, before {before}");
        assert!(peak <= peak_rss_bytes().unwrap_or(u64::MAX));
    }
}
