//! Checkpoints and recovery of data-parallel training on three node processes
//! of one machine (QUIC on loopback), mag-like graph: epoch time without and
//! with checkpoints (their cost per step), checkpoint size, and for a node
//! killed with SIGKILL and restarted at once, the recovery time split into
//! detection (kill to the coordinator noticing), rollback (until every node,
//! the restarted one included, is ready again) and resume (restoring the
//! checkpoint to the first step done), and the steps redone. The recovered
//! run's model hash is checked against the failure-free run's.
//!
//! `cargo build --release && cargo run --release -p bench --bin recovery
//! [-- --scale 0.01 --every 5,25 --kills 3]` prints a table and writes
//! bench/results/recovery.json.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Scale of the mag-like graph.
    #[arg(long, default_value_t = 0.01)]
    scale: f64,
    /// Epochs per run.
    #[arg(long, default_value_t = 4)]
    epochs: u64,
    /// Seeds per step.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Checkpoint intervals (steps) to measure.
    #[arg(long, default_value = "5,25", value_delimiter = ',')]
    every: Vec<u64>,
    /// Failure-free runs per setting (the fastest counts).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Kill-and-restart runs (each strikes a later step).
    #[arg(long, default_value_t = 3)]
    kills: usize,
    /// `cluster.failure_timeout_ms` of the runs.
    #[arg(long, default_value_t = 2000)]
    failure_timeout_ms: u64,
    /// The hetgnn binary (default: target/release/hetgnn).
    #[arg(long)]
    hetgnn: Option<PathBuf>,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench/results/recovery.json")]
    out: PathBuf,
}

const NODES: [&str; 3] = ["n0", "n1", "n2"];

fn hetgnn(bin: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "hetgnn {} failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One cluster run in `dir` (a fresh case directory under `root`).
struct Run {
    dir: PathBuf,
    procs: Vec<(String, Child)>,
}

impl Run {
    fn start(
        bin: &Path,
        root: &Path,
        case: &str,
        a: &Args,
        every: Option<u64>,
    ) -> anyhow::Result<Run> {
        let dir = root.join(case);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let mut nodes = String::new();
        for (id, port) in NODES.iter().zip(bench::free_ports(NODES.len())?) {
            nodes += &format!("[[cluster.nodes]]\nid = \"{id}\"\naddr = \"127.0.0.1:{port}\"\n");
        }
        let ck = every.map_or(String::new(), |e| {
            format!("checkpoint_dir = \"ck\"\ncheckpoint_every = {e}\n")
        });
        let text = format!(
            "[cluster]\ncerts_dir = \"../certs\"\nheartbeat_ms = 100\nfailure_timeout_ms = {}\n{nodes}[training]\nmode = \"data-parallel\"\npartitions = \"../parts\"\nepochs = {}\nbatch = {}\nreport = \"run.json\"\n{ck}",
            a.failure_timeout_ms, a.epochs, a.batch
        );
        std::fs::write(dir.join("cluster.toml"), text)?;
        let mut run = Run {
            dir,
            procs: Vec::new(),
        };
        for id in NODES {
            run.spawn(bin, id)?;
        }
        Ok(run)
    }

    fn spawn(&mut self, bin: &Path, id: &str) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.join(format!("{id}.{}.log", self.procs.len())))?;
        let child = Command::new(bin)
            .args(["node", "--force", "--config", "cluster.toml", "--node", id])
            .env("RAYON_NUM_THREADS", "1")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.procs.push((id.to_string(), child));
        Ok(())
    }

    fn wait_for_checkpoint(&self, step: u64) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            let done = std::fs::read_dir(self.dir.join("ck"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .strip_prefix("step-")
                        .and_then(|n| n.parse::<u64>().ok())
                })
                .max();
            if done.is_some_and(|d| d >= step) {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(300) {
                bail!("no checkpoint at step {step} in {}", self.dir.display());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILLs `id` and starts it again; returns the kill's Unix time in ms.
    fn kill_and_restart(&mut self, bin: &Path, id: &str) -> anyhow::Result<u64> {
        let i = self
            .procs
            .iter()
            .position(|(n, c)| n == id && c.id() > 0)
            .context("no such node")?;
        let (_, mut child) = self.procs.remove(i);
        child.kill()?;
        let at = unix_ms();
        child.wait()?;
        self.spawn(bin, id)?;
        Ok(at)
    }

    fn finish(mut self) -> anyhow::Result<Value> {
        for (id, c) in self.procs.iter_mut() {
            let status = c.wait()?;
            if !status.success() {
                bail!("{id} failed ({status}); logs in {}", self.dir.display());
            }
        }
        Ok(serde_json::from_str(&std::fs::read_to_string(
            self.dir.join("run.json"),
        )?)?)
    }
}

fn mean_epoch_s(r: &Value) -> f64 {
    let e = r["epochs"].as_array().cloned().unwrap_or_default();
    e.iter()
        .map(|e| e["seconds"].as_f64().unwrap_or(0.0))
        .sum::<f64>()
        / e.len().max(1) as f64
}

fn mean_checkpoint_s(r: &Value) -> f64 {
    let e = r["epochs"].as_array().cloned().unwrap_or_default();
    e.iter()
        .map(|e| e["checkpoint_s"].as_f64().unwrap_or(0.0))
        .sum::<f64>()
        / e.len().max(1) as f64
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = a
        .hetgnn
        .clone()
        .unwrap_or_else(|| repo.join("target/release/hetgnn"));
    if !bin.exists() {
        bail!(
            "{} not found: build it first (cargo build --release)",
            bin.display()
        );
    }
    let data = bench::mag_like(a.scale, 0)?;
    let root = repo.join("target/bench-recovery");
    std::fs::create_dir_all(&root)?;
    let data_s = data.display().to_string();
    if !root.join("parts/manifest.json").exists() {
        hetgnn(
            &bin,
            &root,
            &[
                "partition",
                "--data",
                &data_s,
                "--parts",
                "3",
                "--out",
                "parts",
            ],
        )?;
    }
    if !root.join("certs/ca.pem").exists() {
        hetgnn(
            &bin,
            &root,
            &["certs", "init", "--out", "certs", "--nodes", "n0,n1,n2"],
        )?;
    }

    // Runs with and without checkpoints alternate, `rounds` times each; the
    // fastest of each counts (three processes on a small machine are noisy).
    let mut best: Vec<f64> = vec![f64::INFINITY; a.every.len() + 1];
    let mut sizes = vec![0u64; a.every.len()];
    let mut writing = vec![f64::INFINITY; a.every.len()];
    let mut want = String::new();
    let mut steps = 0;
    for round in 0..a.rounds {
        for (i, every) in std::iter::once(None)
            .chain(a.every.iter().copied().map(Some))
            .enumerate()
        {
            eprintln!(
                "failure-free run {}, {}",
                round + 1,
                every.map_or("no checkpoints".to_string(), |e| format!(
                    "a checkpoint every {e} steps"
                ))
            );
            let r = Run::start(
                &bin,
                &root,
                &format!("every-{}", every.unwrap_or(0)),
                &a,
                every,
            )?;
            let dir = r.dir.clone();
            let rep = r.finish()?;
            let hash = rep["final_model_sha256"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if want.is_empty() {
                (want, steps) = (hash, rep["steps"].as_u64().unwrap_or(0));
            } else if hash != want {
                bail!("checkpointing changed the model");
            }
            best[i] = best[i].min(mean_epoch_s(&rep));
            if i > 0 {
                let newest = std::fs::read_dir(dir.join("ck"))?
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
                    })
                    .max()
                    .context("no checkpoint written")?;
                sizes[i - 1] = dir_bytes(&newest);
                writing[i - 1] = writing[i - 1].min(mean_checkpoint_s(&rep));
            }
        }
    }
    let per_epoch = steps / a.epochs.max(1);
    let base = best[0];
    let mut checkpointing = Vec::new();
    for (i, &every) in a.every.iter().enumerate() {
        let epoch_s = best[i + 1];
        checkpointing.push(json!({
            "every": every,
            "epoch_s": epoch_s,
            "checkpoint_bytes": sizes[i],
            "epoch_s_difference_per_step_ms": (epoch_s - base) / per_epoch.max(1) as f64 * 1e3,
            "writing_per_step_ms": writing[i] / per_epoch.max(1) as f64 * 1e3,
            "writing_per_checkpoint_ms": writing[i] / (per_epoch as f64 / every as f64).max(1e-9) * 1e3,
        }));
    }
    let every = a.every.first().copied().unwrap_or(5);
    let mut recoveries = Vec::new();
    for k in 0..a.kills {
        let strike = every * (2 + k as u64 * 3) + every / 2;
        if strike + every >= steps {
            break;
        }
        let victim = NODES[1 + k % 2];
        eprintln!(
            "kill -9 {victim} after step ~{strike} and restart it (checkpoint every {every})"
        );
        let mut r = Run::start(&bin, &root, &format!("kill-{k}"), &a, Some(every))?;
        r.wait_for_checkpoint(strike - every / 2)?;
        // Strike a little later each time: more steps to redo.
        std::thread::sleep(Duration::from_millis(150 + 250 * k as u64));
        let killed = r.kill_and_restart(&bin, victim)?;
        let rep = r.finish()?;
        let same = rep["final_model_sha256"].as_str() == Some(&want);
        let f = &rep["failures"][0];
        let start = rep["started_at_unix_ms"].as_u64().unwrap_or(0);
        let kill_s = (killed.saturating_sub(start)) as f64 / 1e3;
        let g = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
        recoveries.push(json!({
            "victim": victim,
            "failed_at_step": f["failed_at_step"], "resumed_from_step": f["resumed_from_step"], "steps_redone": f["steps_redone"],
            "detection_s": g("detected_at_s") - kill_s,
            "rollback_s": g("rejoined_at_s") - g("detected_at_s"),
            "resume_s": g("resumed_at_s") - g("rejoined_at_s"),
            "total_s": g("resumed_at_s") - kill_s,
            "same_model": same,
        }));
    }

    println!(
        "3 node processes, mag-like S={}, batch {}, {} steps per epoch, failure timeout {} ms",
        a.scale, a.batch, per_epoch, a.failure_timeout_ms
    );
    println!("no checkpoints: {base:.2} s per epoch");
    println!(
        "{:>6} {:>9} {:>9} {:>18} {:>16} {:>18}",
        "every", "epoch_s", "ckpt_MB", "write_ms/ckpt", "write_ms/step", "epoch_diff_ms/step"
    );
    for c in &checkpointing {
        println!(
            "{:>6} {:>9.2} {:>9.2} {:>18.1} {:>16.2} {:>18.1}",
            c["every"].as_u64().unwrap_or(0),
            c["epoch_s"].as_f64().unwrap_or(0.0),
            c["checkpoint_bytes"].as_f64().unwrap_or(0.0) / 1e6,
            c["writing_per_checkpoint_ms"].as_f64().unwrap_or(0.0),
            c["writing_per_step_ms"].as_f64().unwrap_or(0.0),
            c["epoch_s_difference_per_step_ms"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "{:>7} {:>7} {:>7} {:>12} {:>11} {:>9} {:>8} {:>5}",
        "victim", "failed", "redone", "detection_s", "rollback_s", "resume_s", "total_s", "same"
    );
    for r in &recoveries {
        println!(
            "{:>7} {:>7} {:>7} {:>12.2} {:>11.2} {:>9.2} {:>8.2} {:>5}",
            r["victim"].as_str().unwrap_or(""),
            r["failed_at_step"].as_u64().unwrap_or(0),
            r["steps_redone"].as_u64().unwrap_or(0),
            r["detection_s"].as_f64().unwrap_or(f64::NAN),
            r["rollback_s"].as_f64().unwrap_or(f64::NAN),
            r["resume_s"].as_f64().unwrap_or(f64::NAN),
            r["total_s"].as_f64().unwrap_or(f64::NAN),
            r["same_model"].as_bool().unwrap_or(false)
        );
    }
    let out = json!({
        "scale": a.scale, "batch": a.batch, "epochs": a.epochs, "steps_per_epoch": per_epoch,
        "failure_timeout_ms": a.failure_timeout_ms,
        "epoch_s_without_checkpoints": base,
        "checkpointing": checkpointing,
        "recoveries": recoveries,
    });
    let path = repo.join(&a.out);
    std::fs::write(&path, serde_json::to_string_pretty(&out)?)?;
    println!("written to {}", path.display());
    Ok(())
}
