//! CPU shares for co-located nodes: a control group per node with a CPU
//! quota, through the kernel's CPU controller (cgroup v2 `cpu.max`, or v1
//! `cpu.cfs_quota_us`), so that nodes on one machine compete for compute as
//! separate machines would not. A group is removed when its [`CpuShare`] is
//! dropped; groups left by a launcher that was killed are swept by the next.

use std::path::{Path, PathBuf};

/// Scheduler period the quota is a share of (the kernel's default, 100 ms).
const PERIOD_US: u64 = 100_000;
/// Prefix of the groups this module makes (`hetgnn-<launcher pid>-<name>`).
const PREFIX: &str = "hetgnn-";
/// Smallest share: the kernel refuses quotas under 1 ms per period.
pub const MIN_CPUS: f64 = 0.01;
/// Largest share accepted (a machine of 1024 cores).
pub const MAX_CPUS: f64 = 1024.0;

/// Why a CPU share could not be set up: the caller should refuse the run (the
/// machine cannot emulate it) or fix the value.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Neither controller is mounted here.
    #[error(
        "no CPU controller: need cgroup v2 at {v2} with the cpu controller, or v1 at {v1} \
         (or drop the cpus setting)"
    )]
    Unavailable {
        /// Where v2 was looked for.
        v2: String,
        /// Where v1 was looked for.
        v1: String,
    },
    /// A share outside [`MIN_CPUS`, `MAX_CPUS`] or not a number.
    #[error("cpus = {0}: give a number of CPUs from {MIN_CPUS} to {MAX_CPUS}")]
    BadShare(f64),
    /// The kernel refused a write or a directory.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

/// Which CPU controller a group is made under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Controller {
    /// cgroup v2: a unified hierarchy whose root lists `cpu` in `cgroup.controllers`.
    V2(PathBuf),
    /// cgroup v1: the `cpu` hierarchy, with `cpu.cfs_quota_us`.
    V1(PathBuf),
}

impl Controller {
    /// The machine's CPU controller, if one is mounted at the usual place
    /// (whether it is writable shows when a group is made).
    pub fn detect() -> Result<Controller, CgroupError> {
        Controller::detect_at(Path::new("/sys/fs/cgroup"))
    }

    /// As [`Controller::detect`], under `root` instead of `/sys/fs/cgroup`.
    pub fn detect_at(root: &Path) -> Result<Controller, CgroupError> {
        let v2 = root.to_path_buf();
        let v1 = root.join("cpu");
        let controllers =
            std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "cpu") {
            return Ok(Controller::V2(v2));
        }
        if v1.join("cpu.cfs_quota_us").is_file() {
            return Ok(Controller::V1(v1));
        }
        Err(CgroupError::Unavailable {
            v2: v2.display().to_string(),
            v1: v1.display().to_string(),
        })
    }

    fn root(&self) -> &Path {
        match self {
            Controller::V2(p) | Controller::V1(p) => p,
        }
    }
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io("writing", path))
}

/// A control group holding a CPU quota; removed on drop (once its processes
/// have exited: the owner stops them first).
#[derive(Debug)]
pub struct CpuShare {
    dir: PathBuf,
    cpus: f64,
}

impl CpuShare {
    /// A group named after `name` limited to `cpus` CPUs (0.5 = half of one core's time).
    pub fn create(c: &Controller, name: &str, cpus: f64) -> Result<CpuShare, CgroupError> {
        if !(MIN_CPUS..=MAX_CPUS).contains(&cpus) {
            return Err(CgroupError::BadShare(cpus));
        }
        sweep(c.root());
        let safe: String = name
            .chars()
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || ch == '-' {
                    ch
                } else {
                    '_'
                }
            })
            .collect();
        let dir = c
            .root()
            .join(format!("{PREFIX}{}-{safe}", std::process::id()));
        if dir.is_dir() {
            // Ours from an earlier share of the same name: empty, or the rmdir fails and says why.
            std::fs::remove_dir(&dir).map_err(io("removing the old group", &dir))?;
        }
        std::fs::create_dir(&dir).map_err(io(
            "creating the control group (root or a delegated cgroup is needed)",
            &dir,
        ))?;
        let share = CpuShare { dir, cpus };
        let quota = ((cpus * PERIOD_US as f64).round() as u64).max(1000);
        match c {
            Controller::V2(root) => {
                // The cpu controller must be enabled for the root's children; it already is where listed.
                let subtree = root.join("cgroup.subtree_control");
                let enabled = std::fs::read_to_string(&subtree).unwrap_or_default();
                if !enabled.split_whitespace().any(|c| c == "cpu") {
                    write(&subtree, "+cpu")?;
                }
                write(&share.dir.join("cpu.max"), &format!("{quota} {PERIOD_US}"))?;
            }
            Controller::V1(_) => {
                write(&share.dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                write(&share.dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
            }
        }
        Ok(share)
    }

    /// Moves process `pid` (all its threads, and the children it starts later) into the group.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The share, in CPUs.
    pub fn cpus(&self) -> f64 {
        self.cpus
    }
}

impl Drop for CpuShare {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            tracing::warn!("cannot remove control group {}: {e}", self.dir.display());
        }
    }
}

/// The processes inside this process's groups: for an interrupt handler to
/// stop what was started in them (a child that missed the signal, such as a
/// node started behind `ip netns exec` when only this process was signalled).
pub fn own_group_processes() -> Vec<u32> {
    let Ok(c) = Controller::detect() else {
        return Vec::new();
    };
    let mine = format!("{PREFIX}{}-", std::process::id());
    let Ok(entries) = std::fs::read_dir(c.root()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&mine)))
        .filter_map(|e| std::fs::read_to_string(e.path().join("cgroup.procs")).ok())
        .flat_map(|procs| {
            procs
                .lines()
                .filter_map(|l| l.trim().parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Removes this process's groups (their processes must have exited): for an
/// interrupt handler, which cannot reach the [`CpuShare`]s to drop them.
pub fn remove_own_groups() {
    let Ok(c) = Controller::detect() else { return };
    let mine = format!("{PREFIX}{}-", std::process::id());
    let Ok(entries) = std::fs::read_dir(c.root()) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_str().is_some_and(|n| n.starts_with(&mine)) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// Whether `name`, made as `<prefix><pid>-...` by process `pid`, outlived
/// that process (so a later run may remove it).
pub fn owner_gone(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.split('-').next())
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes the empty groups of launchers that no longer run.
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name()
            .to_str()
            .is_some_and(|n| owner_gone(n, PREFIX))
        {
            // Fails harmlessly while a process is still inside.
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_outside_the_range_are_refused_before_any_file_is_touched() {
        let c = Controller::V1(PathBuf::from("/nonexistent/cgroup/cpu"));
        for bad in [0.0, 0.001, -1.0, f64::NAN, f64::INFINITY, 2048.0] {
            assert!(
                matches!(
                    CpuShare::create(&c, "n0", bad),
                    Err(CgroupError::BadShare(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_machine_without_a_controller_is_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let e = Controller::detect_at(dir.path()).unwrap_err();
        assert!(matches!(e, CgroupError::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("cgroup v2"), "{e}");
    }

    #[test]
    fn a_fake_v1_hierarchy_gets_the_quota_written() {
        // A directory laid out as v1's cpu hierarchy: the files are plain files here.
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("cpu");
        std::fs::create_dir(&cpu).unwrap();
        std::fs::write(cpu.join("cpu.cfs_quota_us"), "-1").unwrap();
        let c = Controller::detect_at(dir.path()).unwrap();
        assert_eq!(c, Controller::V1(cpu.clone()));
        let share = CpuShare::create(&c, "n/1", 0.25).unwrap();
        let read = |f: &str| std::fs::read_to_string(share.dir().join(f)).unwrap();
        assert_eq!(read("cpu.cfs_quota_us"), "25000");
        assert_eq!(read("cpu.cfs_period_us"), "100000");
        assert!(share
            .dir()
            .ends_with(format!("hetgnn-{}-n_1", std::process::id())));
        // Real groups hold only kernel files, which rmdir takes with them; here they are ours.
        for f in ["cpu.cfs_quota_us", "cpu.cfs_period_us"] {
            std::fs::remove_file(share.dir().join(f)).unwrap();
        }
        let d = share.dir().to_path_buf();
        drop(share);
        assert!(!d.exists(), "the group is removed on drop");
    }

    /// CPU seconds process `pid` has used (utime + stime; 100 ticks a second on Linux).
    fn cpu_seconds(pid: u32) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        (f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) as f64 / 100.0
    }

    #[test]
    fn a_busy_process_gets_its_share_and_the_group_goes_with_it() {
        let Ok(c) = Controller::detect() else {
            eprintln!("skipped: no CPU controller on this machine");
            return;
        };
        let share = match CpuShare::create(&c, "share-test", 0.2) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipped: cannot make a control group here ({e})");
                return;
            }
        };
        let mut busy = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        share.add(busy.id()).unwrap();
        let before = cpu_seconds(busy.id());
        let t = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let used = (cpu_seconds(busy.id()) - before) / t.elapsed().as_secs_f64();
        busy.kill().unwrap();
        busy.wait().unwrap();
        let dir = share.dir().to_path_buf();
        drop(share);
        assert!(used < 0.3, "a 0.2-CPU share used {used:.2} CPUs");
        // No lower bound beyond running at all: other tests may take the cores.
        assert!(used > 0.0, "the share ran at all");
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
