//! Keeping idle CPUs quick to wake while a server runs (Linux PM QoS).
//!
//! A request that arrives after a pause finds the CPUs idle. On a virtual
//! machine an idle vCPU halts, its host runs other work on the core, and the
//! request then pays the wake-up and caches that other work cooled: on this
//! project's 2-vCPU machine a 100-node request took 7-10 ms at 10 requests/s
//! against 5 ms back to back. A process that holds `/dev/cpu_dma_latency`
//! open with a bound asks the kernel to use no idle state slower to leave
//! than that bound, for as long as the file stays open: at 0 idle CPUs poll
//! instead of halting, which costs their power (or their host's CPU time).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The kernel's PM QoS device for the CPUs' wake-up latency.
pub const DEVICE: &str = "/dev/cpu_dma_latency";

/// The bound could not be requested; serving without it works, slower after pauses.
#[derive(Debug, thiserror::Error)]
#[error("cannot hold {} at {us} µs ({source}): it needs write access to that device (root, or a udev rule granting it); leave --cpu-latency-us out to serve with the kernel's idle states", .path.display())]
pub struct HoldError {
    /// The device written.
    pub path: PathBuf,
    /// The bound asked for, in µs.
    pub us: u32,
    /// Why it failed.
    #[source]
    pub source: std::io::Error,
}

/// A wake-up latency bound, in force until dropped.
#[derive(Debug)]
pub struct CpuLatency {
    _held: File,
}

impl CpuLatency {
    /// Asks that idle CPUs wake within `us` µs (0: poll, never halt) while this lives.
    pub fn hold(us: u32) -> Result<CpuLatency, HoldError> {
        CpuLatency::hold_at(Path::new(DEVICE), us)
    }

    /// [`CpuLatency::hold`] through the device at `path`.
    pub fn hold_at(path: &Path, us: u32) -> Result<CpuLatency, HoldError> {
        let fail = |source| HoldError {
            path: path.to_path_buf(),
            us,
            source,
        };
        // The device takes a native-endian 32-bit signed value; a larger bound means none.
        let value = i32::try_from(us).unwrap_or(i32::MAX);
        let mut file = OpenOptions::new().write(true).open(path).map_err(fail)?;
        file.write_all(&value.to_ne_bytes()).map_err(fail)?;
        Ok(CpuLatency { _held: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_written_as_the_device_takes_it_and_a_missing_device_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("cpu_dma_latency");
        std::fs::write(&dev, b"").unwrap();
        let held = CpuLatency::hold_at(&dev, 0).unwrap();
        assert_eq!(std::fs::read(&dev).unwrap(), 0i32.to_ne_bytes());
        drop(held);
        let _held = CpuLatency::hold_at(&dev, 3_000_000_000).unwrap();
        assert_eq!(std::fs::read(&dev).unwrap(), i32::MAX.to_ne_bytes());

        let missing = dir.path().join("none");
        let e = CpuLatency::hold_at(&missing, 5).unwrap_err().to_string();
        assert!(
            e.contains("none") && e.contains("5 µs") && e.contains("--cpu-latency-us"),
            "{e}"
        );
    }
}
