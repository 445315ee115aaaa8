//! Running a command while watching its time and the resident memory of its
//! whole process tree (a Python peer may fork workers), sampled every 20 ms.

use std::process::Command;
use std::time::{Duration, Instant};

/// What one measured run took.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Wall-clock seconds.
    pub secs: f64,
    /// Highest sampled sum of resident memory over the process tree, in bytes.
    pub peak_bytes: u64,
    /// Whether the command exited with status 0.
    pub ok: bool,
}

/// Resident bytes of `pid` (from /proc), 0 once it is gone.
fn rss(pid: u32) -> u64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// User and system seconds of this process's children waited for so far
/// (a run's CPU time: the difference across it).
pub fn children_cpu_s() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    s(u.ru_utime) + s(u.ru_stime)
}

/// `pid` and all its descendants.
fn tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() && out.len() < 4096 {
        let p = out[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                    out.extend(c.split_whitespace().filter_map(|s| s.parse::<u32>().ok()));
                }
            }
        }
        i += 1;
    }
    out
}

/// Runs `cmd` to completion (at most `limit`), measuring it; output goes to
/// the log files the caller set on `cmd`.
pub fn run_measured(cmd: &mut Command, limit: Duration) -> anyhow::Result<Measured> {
    let start = Instant::now();
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let mut peak = 0;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Measured {
                secs: start.elapsed().as_secs_f64(),
                peak_bytes: peak,
                ok: status.success(),
            });
        }
        peak = peak.max(tree(pid).into_iter().map(rss).sum());
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("{cmd:?} ran past {}s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
