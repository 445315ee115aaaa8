//! `hetgnn launch`: every node of a topology file as a child process of this
//! one (for trying a cluster on one machine). Child output is prefixed with
//! the node id; Ctrl-C (or SIGTERM, SIGHUP), or any child failing with an
//! error, stops them all, and an interrupted launch exits as a shell expects
//! of a process ended by that signal (130 for SIGINT, 143 for SIGTERM). A
//! child killed by a signal is started again (a bounded number of times): a
//! data-parallel run takes it back and resumes from its last checkpoint.
//! A node given `cpus` runs in a control group of its own with that CPU
//! quota, so co-located nodes compete for compute as separate machines do.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::cluster::ClusterArgs;

fn forward(id: String, from: impl std::io::Read + Send + 'static, to_stderr: bool) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if to_stderr {
                warnln!("[{id}] {line}");
            } else {
                sayln!("[{id}] {line}");
            }
        }
    });
}

/// The launch was ended by a signal (its number): every node was stopped.
#[derive(Debug)]
pub struct Interrupted(pub i32);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            libc::SIGHUP => "SIGHUP",
            _ => "a signal",
        };
        write!(
            f,
            "interrupted by {name}: every node was stopped and no report was written"
        )
    }
}

impl std::error::Error for Interrupted {}

impl Interrupted {
    /// The exit status a shell gives a process ended by this signal.
    pub fn exit_code(&self) -> u8 {
        (128 + self.0).clamp(0, 255) as u8
    }
}

fn stop_all(children: &mut [(String, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
}

/// Runs until every node exits successfully, one fails, or Ctrl-C; restarts
/// nodes killed by a signal up to `restarts` times in all.
pub fn run(args: &ClusterArgs, restarts: u32) -> anyhow::Result<()> {
    let cfg = args.load()?;
    let topology = cfg
        .topology()
        .context("hetgnn launch needs a [cluster] section with [[cluster.nodes]]")?;
    crate::train::check_outputs(&cfg, args.force, Some(&args.config))?;
    // The nodes share the checkpoint directory; other runs may not.
    let _held = models::run_lock::hold(cfg.training.checkpoint_dir.as_deref())?;
    topology
        .check_certs()
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    let exe = std::env::current_exe().context("locating the hetgnn binary")?;
    // The signal that interrupted the launch, 0 while none has.
    let interrupted = Arc::new(AtomicUsize::new(0));
    for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        signal_hook::flag::register_usize(s, interrupted.clone(), s as usize)
            .context("installing the signal handlers")?;
    }
    let shares = cpu_shares(&topology.cluster.nodes)?;
    // The nodes share this machine's cores: give each its share of compute
    // threads rather than letting every node oversubscribe all of them.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let unset = std::env::var_os("RAYON_NUM_THREADS").is_none();
    let threads = |id: &str| -> Option<usize> {
        match shares.iter().find(|(n, _)| n == id) {
            Some((_, s)) if unset => Some((s.cpus().ceil() as usize).clamp(1, cores)),
            _ => unset.then(|| (cores / topology.cluster.nodes.len()).max(1)),
        }
    };
    if unset && shares.is_empty() {
        warnln!(
            "launch: {} node(s) share this machine: {} compute thread(s) each (set \
             RAYON_NUM_THREADS to choose)",
            topology.cluster.nodes.len(),
            (cores / topology.cluster.nodes.len()).max(1)
        );
    }
    let start = |id: &str| -> anyhow::Result<Child> {
        let mut cmd = Command::new(&exe);
        cmd.arg("node")
            .arg("--config")
            .arg(&args.config)
            .arg("--node")
            .arg(id);
        for s in &args.set {
            cmd.arg("--set").arg(s);
        }
        if args.force {
            cmd.arg("--force");
        }
        if let Some(t) = threads(id) {
            cmd.env("RAYON_NUM_THREADS", t.to_string());
        }
        // As main() asks through the API; set before the allocator starts, it takes effect for sure.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            cmd.env("MIMALLOC_PURGE_DELAY", "-1");
        }
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().with_context(|| format!("starting node {id}"))?;
        if let Some((_, share)) = shares.iter().find(|(n, _)| n == id) {
            if let Err(e) = share.add(child.id()) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).with_context(|| format!("giving node {id} its CPU share"));
            }
        }
        if let Some(out) = child.stdout.take() {
            forward(id.to_string(), out, false);
        }
        if let Some(err) = child.stderr.take() {
            forward(id.to_string(), err, true);
        }
        Ok(child)
    };
    let mut children: Vec<(String, Child)> = Vec::new();
    for n in &topology.cluster.nodes {
        match start(&n.id) {
            Ok(child) => {
                warnln!(
                    "launch: started {} (pid {}) on {}",
                    n.id,
                    child.id(),
                    n.addr
                );
                children.push((n.id.clone(), child));
            }
            Err(e) => {
                stop_all(&mut children);
                return Err(e);
            }
        }
    }
    let mut restarted = 0;
    loop {
        let signal = interrupted.load(Ordering::SeqCst);
        if signal != 0 {
            warnln!("launch: interrupted, stopping every node");
            stop_all(&mut children);
            return Err(Interrupted(signal as i32).into());
        }
        let mut running = 0;
        for i in 0..children.len() {
            match children[i].1.try_wait() {
                Ok(Some(status))
                    if killed(&status)
                        && restarted < restarts
                        && interrupted.load(Ordering::SeqCst) == 0 =>
                {
                    restarted += 1;
                    let id = children[i].0.clone();
                    warnln!("launch: node {id} was killed ({status}); restarting it ({restarted} of at most {restarts} restarts)");
                    match start(&id) {
                        Ok(child) => children[i].1 = child,
                        Err(e) => {
                            stop_all(&mut children);
                            return Err(e);
                        }
                    }
                    running += 1;
                }
                Ok(Some(status)) if !status.success() => {
                    let id = children[i].0.clone();
                    warnln!("launch: node {id} failed ({status}), stopping the others");
                    stop_all(&mut children);
                    anyhow::bail!("node {id} failed ({status})");
                }
                Ok(Some(_)) => {}
                Ok(None) => running += 1,
                Err(e) => {
                    stop_all(&mut children);
                    return Err(e).context("watching the nodes");
                }
            }
        }
        if running == 0 {
            warnln!("launch: every node finished");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A control group for each node that names `cpus`, made before any node starts.
fn cpu_shares(
    nodes: &[runtime::config::NodeSpec],
) -> anyhow::Result<Vec<(String, runtime::cgroup::CpuShare)>> {
    let wanted: Vec<_> = nodes
        .iter()
        .filter_map(|n| n.cpus.map(|c| (n, c)))
        .collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let controller = runtime::cgroup::Controller::detect().context(
        "cluster.nodes ask for cpus, which launch enforces with the kernel's CPU controller",
    )?;
    let mut shares = Vec::new();
    for (n, cpus) in wanted {
        let share = runtime::cgroup::CpuShare::create(&controller, &n.id, cpus)
            .with_context(|| format!("giving node {} a share of {cpus} CPUs", n.id))?;
        warnln!(
            "launch: node {} gets {cpus} CPU(s) ({})",
            n.id,
            share.dir().display()
        );
        shares.push((n.id.clone(), share));
    }
    Ok(shares)
}

/// A node must not outlive its launcher (killed with SIGKILL, it cannot stop
/// them): on Linux the kernel sends the child SIGKILL when this process dies.
/// Not SIGTERM: a node that is stopped (SIGSTOP) would keep it pending and
/// live on as an orphan holding its port; checkpoints are written whole, so
/// nothing a killed node leaves is half-written.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before the prctl: then nobody is left to stop this node.
            if libc::getppid() != parent as libc::pid_t {
                return Err(std::io::Error::other(
                    "the launcher exited while starting this node",
                ));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}

/// Whether the process died of a signal rather than exiting with its own error.
fn killed(status: &std::process::ExitStatus) -> bool {
    #[cfg(unix)]
    {
        std::os::unix::process::ExitStatusExt::signal(status).is_some()
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}
