//! `hetgnn launch`: every node of a topology file as a child process of this
//! one (for trying a cluster on one machine). Child output is prefixed with
//! the node id; Ctrl-C, or any child failing, stops them all.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::cluster::ClusterArgs;

fn forward(id: String, from: impl std::io::Read + Send + 'static, to_stderr: bool) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if to_stderr {
                eprintln!("[{id}] {line}");
            } else {
                println!("[{id}] {line}");
            }
        }
    });
}

fn stop_all(children: &mut [(String, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
}

/// Runs until every node exits successfully, one fails, or Ctrl-C.
pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let cfg = args.load()?;
    let topology = cfg.topology().context("hetgnn launch needs a [cluster] section with [[cluster.nodes]]")?;
    topology.check_certs().map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    let exe = std::env::current_exe().context("locating the hetgnn binary")?;
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = interrupted.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;
    // The nodes share this machine's cores: give each its share of compute
    // threads rather than letting every node oversubscribe all of them.
    let threads = std::env::var_os("RAYON_NUM_THREADS").is_none().then(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / topology.cluster.nodes.len()).max(1)
    });
    if let Some(t) = threads {
        eprintln!("launch: {} node(s) share this machine: {t} compute thread(s) each (set RAYON_NUM_THREADS to choose)", topology.cluster.nodes.len());
    }
    let mut children: Vec<(String, Child)> = Vec::new();
    for n in &topology.cluster.nodes {
        let mut cmd = Command::new(&exe);
        cmd.arg("node").arg("--config").arg(&args.config).arg("--node").arg(&n.id);
        for s in &args.set {
            cmd.arg("--set").arg(s);
        }
        if let Some(t) = threads {
            cmd.env("RAYON_NUM_THREADS", t.to_string());
        }
        // As main() asks through the API; set before the allocator starts, it takes effect for sure.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            cmd.env("MIMALLOC_PURGE_DELAY", "-1");
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut children);
                return Err(e).with_context(|| format!("starting node {}", n.id));
            }
        };
        if let Some(out) = child.stdout.take() {
            forward(n.id.clone(), out, false);
        }
        if let Some(err) = child.stderr.take() {
            forward(n.id.clone(), err, true);
        }
        eprintln!("launch: started {} (pid {}) on {}", n.id, child.id(), n.addr);
        children.push((n.id.clone(), child));
    }
    loop {
        if interrupted.load(Ordering::SeqCst) {
            eprintln!("launch: interrupted, stopping every node");
            stop_all(&mut children);
            return Ok(());
        }
        let mut running = 0;
        for i in 0..children.len() {
            match children[i].1.try_wait() {
                Ok(Some(status)) if !status.success() => {
                    let id = children[i].0.clone();
                    eprintln!("launch: node {id} failed ({status}), stopping the others");
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
            eprintln!("launch: every node finished");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
