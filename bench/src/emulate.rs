//! Emulated machines on one host, for distributed benchmarks: each node in a
//! network namespace of its own with its own address, joined to the others
//! through a veth pair and a bridge, every link rate-limited by the kernel
//! (`tc` token bucket filters on both ends of its veth, so uploads and
//! downloads are both capped), and each node's processes in a control group
//! with its own CPU quota. Peers (DistDGL) run under the same harness, so a
//! comparison is one emulated cluster in one run.
//!
//! Everything made is removed when the [`Cluster`] is dropped, on Ctrl-C
//! (the handler removes what is registered, then exits), and, for a run that
//! was killed outright, by the next run's sweep of names whose owner is gone.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Mutex;

use anyhow::{bail, Context};
use runtime::cgroup::{Controller, CpuShare};

/// Namespaces are named `hgemu<pid>-<what>`, so a sweep can tell whose they are.
const PREFIX: &str = "hgemu";

/// What the emulated machines are given.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Machines {
    /// CPUs per machine (cgroup quota); `None`: unlimited.
    pub cpus: Option<f64>,
    /// Link rate in bits per second, enforced by the kernel; `None`: the veth's speed.
    pub rate_bits: Option<u64>,
    /// Links' MTU in bytes (9000: jumbo frames); `None`: Ethernet's 1500.
    pub mtu: Option<u32>,
}

/// Namespaces this process made and has not removed yet (for the Ctrl-C handler).
static MADE: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn made() -> std::sync::MutexGuard<'static, Vec<String>> {
    MADE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs a command, failing with its stderr.
fn sh(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} (iproute2 is needed)"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn delete_namespace(ns: &str) {
    // Deleting a namespace takes its veth ends and their qdiscs with it.
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

/// The namespaces on this machine whose name starts with `prefix`.
fn namespaces_with(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(String::from)
        .collect()
}

/// Removes the namespaces of earlier runs whose process no longer exists.
fn sweep() {
    for ns in namespaces_with(PREFIX) {
        if runtime::cgroup::owner_gone(&ns, PREFIX) {
            delete_namespace(&ns);
        }
    }
}

/// On Ctrl-C: let the nodes (which got the signal too) exit, stop those that
/// did not, remove what this process made, and exit as interrupted. Installed once.
fn clean_up_on_interrupt() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let installed = ctrlc::set_handler(|| {
            eprintln!("emulate: interrupted, removing the emulated machines");
            std::thread::sleep(std::time::Duration::from_millis(500));
            // Processes that missed the signal (only this one was sent it) are stopped.
            let left = runtime::cgroup::own_group_processes();
            for &pid in &left {
                // SAFETY: sends a signal; a pid that has exited meanwhile is answered with ESRCH.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            if !left.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            for ns in made().drain(..) {
                delete_namespace(&ns);
            }
            runtime::cgroup::remove_own_groups();
            std::process::exit(130);
        });
        if let Err(e) = installed {
            eprintln!("emulate: no Ctrl-C handler ({e}); an interrupted run is swept by the next");
        }
    });
}

/// `n` emulated machines: namespaces, links, addresses and CPU shares.
pub struct Cluster {
    names: Vec<String>,
    hub: String,
    /// This process's link to the bridge ([`Cluster::link_host`]), if made.
    host: Option<String>,
    shares: Vec<Option<CpuShare>>,
    machines: Machines,
}

impl Cluster {
    /// Makes `n` machines (at most 250), refusing clearly where this is not root.
    pub fn create(n: usize, machines: &Machines) -> anyhow::Result<Cluster> {
        if !(1..=250).contains(&n) {
            bail!("{n} emulated machines: give 1 to 250");
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("emulated machines need root (network namespaces, tc, control groups)");
        }
        sweep();
        clean_up_on_interrupt();
        let pid = std::process::id();
        let hub = format!("{PREFIX}{pid}-hub");
        let mut c = Cluster {
            names: Vec::new(),
            hub: hub.clone(),
            host: None,
            shares: Vec::new(),
            machines: machines.clone(),
        };
        let add = |ns: &str| -> anyhow::Result<()> {
            sh("ip", &["netns", "add", ns])?;
            made().push(ns.to_string());
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])
        };
        add(&hub)?;
        sh("ip", &["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        sh("ip", &["-n", &hub, "link", "set", "br0", "up"])?;
        let controller = match machines.cpus {
            Some(_) => Some(Controller::detect().context("CPU shares for emulated machines")?),
            None => None,
        };
        for i in 0..n {
            let ns = format!("{PREFIX}{pid}-n{i}");
            add(&ns)?;
            c.names.push(ns.clone());
            let (inner, outer) = (format!("veth{i}"), format!("hub{i}"));
            sh(
                "ip",
                &[
                    "link", "add", &inner, "netns", &ns, "type", "veth", "peer", "name", &outer,
                    "netns", &hub,
                ],
            )?;
            let addr = format!("{}/24", c.addr(i));
            sh("ip", &["-n", &ns, "addr", "add", &addr, "dev", &inner])?;
            if let Some(mtu) = machines.mtu {
                let mtu = mtu.to_string();
                sh("ip", &["-n", &ns, "link", "set", &inner, "mtu", &mtu])?;
                sh("ip", &["-n", &hub, "link", "set", &outer, "mtu", &mtu])?;
                sh("ip", &["-n", &hub, "link", "set", "br0", "mtu", &mtu])?;
            }
            sh("ip", &["-n", &ns, "link", "set", &inner, "up"])?;
            sh(
                "ip",
                &["-n", &hub, "link", "set", &outer, "master", "br0", "up"],
            )?;
            if let Some(bits) = machines.rate_bits {
                // Egress of each end: the machine's uploads, and its downloads from the bridge.
                shape(&ns, &inner, bits)?;
                shape(&hub, &outer, bits)?;
            }
            let share = match (&controller, machines.cpus) {
                (Some(ctl), Some(cpus)) => Some(
                    CpuShare::create(ctl, &format!("emu-n{i}"), cpus)
                        .with_context(|| format!("a CPU share for machine {i}"))?,
                ),
                _ => None,
            };
            c.shares.push(share);
        }
        Ok(c)
    }

    /// Links this process's namespace to the machines' bridge (a veth,
    /// unshaped, this side at 10.77.0.254), so that a client here, such as a
    /// load generator, reaches them at their addresses; it goes with the
    /// cluster (removed first, at once: a deleted namespace's links go later).
    pub fn link_host(&mut self) -> anyhow::Result<Ipv4Addr> {
        let host = format!("{PREFIX}{}h", std::process::id());
        sh(
            "ip",
            &[
                "link", "add", &host, "type", "veth", "peer", "name", "hubh", "netns", &self.hub,
            ],
        )?;
        self.host = Some(host.clone());
        if let Some(mtu) = self.machines.mtu {
            let mtu = mtu.to_string();
            sh("ip", &["link", "set", &host, "mtu", &mtu])?;
            sh("ip", &["-n", &self.hub, "link", "set", "hubh", "mtu", &mtu])?;
        }
        let addr = Ipv4Addr::new(10, 77, 0, 254);
        sh("ip", &["addr", "add", &format!("{addr}/24"), "dev", &host])?;
        sh("ip", &["link", "set", &host, "up"])?;
        sh(
            "ip",
            &[
                "-n", &self.hub, "link", "set", "hubh", "master", "br0", "up",
            ],
        )?;
        Ok(addr)
    }

    /// Machine `i`'s address.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, i as u8 + 1)
    }

    /// How many machines.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// What the machines were given.
    pub fn machines(&self) -> &Machines {
        &self.machines
    }

    /// Starts `program args` on machine `i`: in its namespace and its CPU share.
    pub fn spawn(&self, i: usize, cmd: &Command) -> anyhow::Result<Child> {
        let mut wrapped = Command::new("ip");
        wrapped.args(["netns", "exec", &self.names[i]]);
        wrapped.arg(cmd.get_program()).args(cmd.get_args());
        if let Some(dir) = cmd.get_current_dir() {
            wrapped.current_dir(dir);
        }
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => wrapped.env(k, v),
                None => wrapped.env_remove(k),
            };
        }
        if let Some(share) = &self.shares[i] {
            join_before_exec(&mut wrapped, &share.dir().join("cgroup.procs"))?;
        }
        wrapped
            .spawn()
            .with_context(|| format!("starting {:?} on machine {i}", cmd.get_program()))
    }
}

/// Makes the child join the control group whose `procs` file is given before
/// it runs anything, so that nothing it starts escapes its share.
fn join_before_exec(cmd: &mut Command, procs: &Path) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let path = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes())
        .context("a control group path with a NUL byte")?;
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (open, getpid, write, close) on stack memory.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut digits = [0u8; 20];
            let mut at = digits.len();
            let mut pid = libc::getpid() as u64;
            loop {
                at -= 1;
                digits[at] = b'0' + (pid % 10) as u8;
                pid /= 10;
                if pid == 0 {
                    break;
                }
            }
            let n = digits.len() - at;
            let wrote = libc::write(fd, digits[at..].as_ptr().cast(), n);
            libc::close(fd);
            if wrote != n as isize {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// A token bucket filter on `dev` in `ns`: `bits` per second, with a burst of
/// 10 ms of traffic (at least 64 KiB, so a segmentation-offload batch passes)
/// and at most 50 ms of queue.
fn shape(ns: &str, dev: &str, bits: u64) -> anyhow::Result<()> {
    let burst = (bits / 8 / 100).max(64 << 10);
    sh(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            &format!("{bits}bit"),
            "burst",
            &burst.to_string(),
            "latency",
            "50ms",
        ],
    )
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The shares go first only once their processes have exited; the caller waits for them.
        self.shares.clear();
        if let Some(host) = self.host.take() {
            let _ = sh("ip", &["link", "del", &host]);
        }
        let mine: Vec<String> = self.names.drain(..).chain([self.hub.clone()]).collect();
        for ns in &mine {
            delete_namespace(ns);
        }
        made().retain(|n| !mine.contains(n));
    }
}

/// Whether anything of this process's emulation is still on the machine.
pub fn leftovers() -> Vec<String> {
    namespaces_with(&format!("{PREFIX}{}-", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_are_linked_shaped_and_leave_nothing_behind() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || Controller::detect().is_err() {
            eprintln!("skipped: emulated machines need root and a CPU controller");
            return;
        }
        // Root in a container may still be refused namespaces, or lack tc.
        let probe = format!("{PREFIX}{}-probe", std::process::id());
        if sh("ip", &["netns", "add", &probe]).is_err() || sh("tc", &["-V"]).is_err() {
            eprintln!("skipped: this machine refuses network namespaces or has no tc");
            delete_namespace(&probe);
            return;
        }
        delete_namespace(&probe);
        // What a killed run leaves: a namespace of a process that is gone.
        let stale = format!("{PREFIX}4000000000-hub");
        sh("ip", &["netns", "add", &stale]).unwrap();
        let machines = Machines {
            cpus: Some(0.5),
            rate_bits: Some(100_000_000),
            mtu: None,
        };
        let c = Cluster::create(2, &machines).unwrap();
        assert!(
            !namespaces_with(PREFIX).contains(&stale),
            "the stale namespace was swept"
        );
        assert_eq!(leftovers().len(), 3, "two machines and the hub");
        // The link is capped on both ends.
        let qdisc = Command::new("ip")
            .args([
                "netns",
                "exec",
                &c.names[1],
                "tc",
                "qdisc",
                "show",
                "dev",
                "veth1",
            ])
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&qdisc.stdout);
        assert!(
            shown.contains("tbf") && shown.contains("100Mbit"),
            "{shown}"
        );
        // Machine 0 reaches machine 1 through the bridge, from inside its CPU share.
        let mut reach = Command::new("sh");
        reach.args([
            "-c",
            "cat /proc/self/cgroup | grep -q hetgnn- && ip route get 10.77.0.2 | grep -q veth0",
        ]);
        let st = c.spawn(0, &reach).unwrap().wait().unwrap();
        assert!(
            st.success(),
            "machine 0 is in its share and routes to machine 1"
        );
        let groups: Vec<_> = c
            .shares
            .iter()
            .flatten()
            .map(|s| s.dir().to_path_buf())
            .collect();
        assert_eq!(groups.len(), 2);
        drop(c);
        assert!(leftovers().is_empty(), "{:?}", leftovers());
        for g in groups {
            assert!(!g.exists(), "{} left behind", g.display());
        }
    }
}
