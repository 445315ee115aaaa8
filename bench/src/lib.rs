//! Shared helpers of the benchmark programs.

use std::path::{Path, PathBuf};

use anyhow::Context;
use graphs::generate::{generate, Like};
use graphs::NoProgress;

pub mod emulate;
pub mod measure;

/// The model `actors::train` starts from under `t` on the graph at `data`,
/// written under `root` as a checkpoint of no steps (`run` names its maker);
/// returns the checkpoint's directory.
pub fn initial_checkpoint(
    t: &actors::TrainingConfig,
    data: &Path,
    root: &Path,
    run: &str,
) -> anyhow::Result<PathBuf> {
    let g = graphs::load(
        data,
        &graphs::LoadOptions {
            mmap_features: true,
            reverse_edges: t.reverse_edges,
        },
    )?;
    let model = models::Model::new(
        &t.model_spec(),
        &g,
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )?;
    let adam = models::optim::Adam::new(models::optim::AdamConfig::with_lr(t.lr));
    let info = models::checkpoint::RunInfo {
        graph: g.name().to_string(),
        graph_sha256: None,
        reverse_edges: t.reverse_edges,
        fanouts: t.fanouts.clone(),
        epochs_done: 0,
        steps: 0,
        run: run.into(),
    };
    Ok(models::checkpoint::save(root, &model, &adam, &info, 1)?)
}

/// Where generated graphs and partitions are kept: `$HETGNN_BENCH_DATA`, or
/// the workspace's `target/bench-data/` (a path fixed at build time, so a
/// benchmark binary carried to another machine is given the variable).
pub fn data_root() -> PathBuf {
    std::env::var_os("HETGNN_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data"))
}

/// Returns a mag-like graph directory at `scale` for `seed`, generating it once
/// under [`data_root`] (reused by later runs).
pub fn mag_like(scale: f64, seed: u64) -> anyhow::Result<PathBuf> {
    let root = data_root();
    let dir = root.join(format!(
        "mag-v{}-s{scale}-seed{seed}",
        graphs::generate::VERSION
    ));
    if !dir.join("schema.json").exists() {
        eprintln!(
            "generating mag-like S={scale} seed={seed} into {}",
            dir.display()
        );
        generate(Like::Mag, scale, seed, &dir, true, &mut NoProgress)
            .with_context(|| format!("generating {}", dir.display()))?;
    }
    Ok(dir)
}

/// `n` distinct free UDP ports on loopback (the sockets are held together
/// while choosing, so the OS cannot hand one out twice).
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let sockets = (0..n)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(sockets
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<_>>()?)
}

/// Peak resident memory of this process in bytes (Linux), if known.
pub use actors::report::peak_rss_bytes;

/// The hetgnn binary: `given`, else `target/release/hetgnn` (which must be built).
pub fn hetgnn_bin(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let bin = given
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/hetgnn"));
    if !bin.exists() {
        anyhow::bail!(
            "{} not found: build it first (cargo build --release)",
            bin.display()
        );
    }
    Ok(bin)
}

/// Runs `bin args` in `dir`; an error carries its output.
pub fn run_hetgnn(bin: &Path, dir: &Path, args: &[String]) -> anyhow::Result<()> {
    let out = std::process::Command::new(bin)
        .args(args)
        .current_dir(dir)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "hetgnn {} failed:\n{}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Partitions `data` (mag-like at `scale`) into `k` parts with `method`,
/// once, under [`data_root`]; returns the directory.
pub fn partitions(
    bin: &Path,
    data: &Path,
    method: &str,
    k: usize,
    scale: f64,
) -> anyhow::Result<PathBuf> {
    partitions_named(bin, data, method, k, &format!("s{scale}"))
}

/// Partitions `data` (called `name` in the cache) into `k` parts with
/// `method`, once, under [`data_root`]; returns the directory.
pub fn partitions_named(
    bin: &Path,
    data: &Path,
    method: &str,
    k: usize,
    name: &str,
) -> anyhow::Result<PathBuf> {
    partition_once(bin, data, method, k, name, &[])
}

/// [`partitions`] with each partition holding its halo's feature rows too
/// (`hetgnn partition --halo-features`).
pub fn partitions_with_halo(
    bin: &Path,
    data: &Path,
    method: &str,
    k: usize,
    scale: f64,
) -> anyhow::Result<PathBuf> {
    partition_once(
        bin,
        data,
        method,
        k,
        &format!("s{scale}-halo"),
        &["--halo-features"],
    )
}

fn partition_once(
    bin: &Path,
    data: &Path,
    method: &str,
    k: usize,
    name: &str,
    extra: &[&str],
) -> anyhow::Result<PathBuf> {
    let parts = data_root().join(format!("parts-{method}-{k}-{name}"));
    if !parts.join("manifest.json").exists() {
        eprintln!("partitioning ({method}, {k} parts)");
        let mut args = vec![
            "partition".to_string(),
            "--data".into(),
            data.display().to_string(),
            "--parts".into(),
            k.to_string(),
            "--method".into(),
            method.into(),
            "--out".into(),
            parts.display().to_string(),
            "--force".into(),
        ];
        args.extend(extra.iter().map(|e| e.to_string()));
        run_hetgnn(bin, data.parent().unwrap_or(Path::new(".")), &args)?;
    }
    Ok(parts)
}

/// The `[cluster]` section of `k` local nodes `n0..` on free loopback ports,
/// with certificates created once under `work/certs<k>`.
pub fn local_cluster(bin: &Path, work: &Path, k: usize) -> anyhow::Result<String> {
    let addrs = free_ports(k)?
        .into_iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>();
    cluster_section(bin, work, &addrs, None)
}

/// The `[cluster]` section of nodes `n0..` at `addrs`, each limited to `cpus`
/// CPUs when given, with certificates created once under `work/certs<k>`.
pub fn cluster_section(
    bin: &Path,
    work: &Path,
    addrs: &[String],
    cpus: Option<f64>,
) -> anyhow::Result<String> {
    let k = addrs.len();
    let ids: Vec<String> = (0..k).map(|i| format!("n{i}")).collect();
    let certs = work.join(format!("certs{k}"));
    if !certs.exists() {
        let args = [
            "certs",
            "init",
            "--out",
            &certs.display().to_string(),
            "--nodes",
            &ids.join(","),
        ];
        run_hetgnn(bin, work, &args.map(String::from))?;
    }
    let mut toml = format!("[cluster]\ncerts_dir = {:?}\n", certs.display().to_string());
    for (id, addr) in ids.iter().zip(addrs) {
        toml += &format!("[[cluster.nodes]]\nid = \"{id}\"\naddr = \"{addr}\"\n");
        if let Some(c) = cpus {
            toml += &format!("cpus = {c}\n");
        }
    }
    Ok(toml)
}

/// Who enforces a benchmark's link bandwidth.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shaping {
    /// Each node's token bucket (`[links] bandwidth`), on loopback.
    Runtime,
    /// The kernel: each node in a network namespace of its own, its link
    /// capped by `tc` (needs root; see `emulate`).
    Kernel,
}

/// The emulated machines and links of a benchmark's node processes (flatten
/// into its arguments; [`Links::describe`] goes into its JSON).
#[derive(clap::Args, Clone, Debug)]
pub struct Links {
    /// Link bandwidth cap.
    #[arg(long, default_value = "10Gbit/s")]
    pub bandwidth: String,
    /// Fixed one-way link delay in milliseconds (added by the runtime: the
    /// kernel here has no netem).
    #[arg(long, default_value_t = 0.1)]
    pub delay_ms: f64,
    /// CPUs each node process may use (a control group's quota; needs root).
    /// Default: the nodes share the machine's cores.
    #[arg(long)]
    pub cpus_per_node: Option<f64>,
    /// Who enforces the bandwidth: the runtime on loopback, or the kernel
    /// between network namespaces.
    #[arg(long, value_enum, default_value = "runtime")]
    pub shaping: Shaping,
    /// The links' MTU in bytes with kernel shaping (9000: jumbo frames).
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
}

impl Links {
    /// The emulation, as a benchmark's JSON records it.
    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "bandwidth": self.bandwidth,
            "delay_ms": self.delay_ms,
            "cpus_per_node": self.cpus_per_node,
            "shaping": self.shaping,
            "mtu": self.mtu,
        })
    }

    /// Launches `k` node processes in `work` training with `training`
    /// (`[training]` lines) over these links, and returns the run's report
    /// (written as `report`).
    pub fn launch(
        &self,
        bin: &Path,
        work: &Path,
        k: usize,
        training: &str,
        report: &str,
    ) -> anyhow::Result<serde_json::Value> {
        self.launch_with(bin, work, k, training, report, "")
    }

    /// As [`Links::launch`], with `extra` TOML appended to the topology file.
    pub fn launch_with(
        &self,
        bin: &Path,
        work: &Path,
        k: usize,
        training: &str,
        report: &str,
        extra: &str,
    ) -> anyhow::Result<serde_json::Value> {
        let delay = format!("delay = {{ dist = \"fixed\", ms = {} }}\n", self.delay_ms);
        match self.shaping {
            Shaping::Runtime => {
                let addrs: Vec<String> = free_ports(k)?
                    .into_iter()
                    .map(|p| format!("127.0.0.1:{p}"))
                    .collect();
                let mut toml = cluster_section(bin, work, &addrs, self.cpus_per_node)?;
                toml += &format!(
                    "[training]\n{training}report = {report:?}\n[links]\nbandwidth = {:?}\n{delay}{extra}",
                    self.bandwidth
                );
                std::fs::write(work.join("cluster.toml"), toml)?;
                let args = ["launch", "--force", "--config", "cluster.toml"];
                run_hetgnn(bin, work, &args.map(String::from))?;
            }
            Shaping::Kernel => {
                let rate = runtime::config::Bandwidth::parse(&self.bandwidth)?;
                let machines = emulate::Machines {
                    cpus: self.cpus_per_node,
                    rate_bits: Some(rate.0.saturating_mul(8)),
                    mtu: Some(self.mtu),
                };
                let cluster = emulate::Cluster::create(k, &machines)?;
                let addrs: Vec<String> = (0..k)
                    .map(|i| format!("{}:7000", cluster.addr(i)))
                    .collect();
                // The CPU shares are the harness's, not launch's: no cpus in the file.
                let mut toml = cluster_section(bin, work, &addrs, None)?;
                toml +=
                    &format!("[training]\n{training}report = {report:?}\n[links]\n{delay}{extra}");
                std::fs::write(work.join("cluster.toml"), toml)?;
                let peaks = run_nodes(bin, work, &cluster)?;
                let mut r: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(work.join(report))?)?;
                r["node_peak_rss_bytes"] = serde_json::json!(peaks);
                return Ok(r);
            }
        }
        Ok(serde_json::from_str(&std::fs::read_to_string(
            work.join(report),
        )?)?)
    }
}

/// GNU time, which reports a command's peak resident memory (`%M`).
const GNU_TIME: &str = "/usr/bin/time";

/// Runs `hetgnn node` for every machine of `cluster` on `work/cluster.toml`
/// until all exit; the first failure stops the others. Answers each node's
/// peak resident memory in bytes, where GNU time is installed to measure it.
fn run_nodes(
    bin: &Path,
    work: &Path,
    cluster: &emulate::Cluster,
) -> anyhow::Result<Vec<Option<u64>>> {
    let threads = cluster
        .machines()
        .cpus
        .map(|c| (c.ceil() as usize).max(1).to_string());
    let timed = Path::new(GNU_TIME).exists();
    let peak_file = |i: usize| work.join(format!("peak-n{i}.txt"));
    let mut children = Vec::new();
    for i in 0..cluster.len() {
        let mut cmd = if timed {
            let _ = std::fs::remove_file(peak_file(i));
            let mut c = std::process::Command::new(GNU_TIME);
            c.args(["-f", "%M", "-o"]).arg(peak_file(i)).arg(bin);
            c
        } else {
            std::process::Command::new(bin)
        };
        cmd.args(["node", "--force", "--config", "cluster.toml", "--node"])
            .arg(format!("n{i}"))
            .current_dir(work);
        if let Some(t) = &threads {
            cmd.env("RAYON_NUM_THREADS", t);
        }
        children.push(cluster.spawn(i, &cmd)?);
    }
    wait_all(&mut children, |i| format!("node n{i}"), None)?;
    // GNU time writes the peak in KiB as the file's last line.
    Ok((0..cluster.len())
        .map(|i| {
            let text = std::fs::read_to_string(peak_file(i)).ok()?;
            let kib: u64 = text.lines().last()?.trim().parse().ok()?;
            Some(kib * 1024)
        })
        .collect())
}

/// Waits until every child of `children` exits, at most `timeout`; the first
/// failure (named by `name`) or the timeout kills the others and is the error.
pub fn wait_all(
    children: &mut [std::process::Child],
    name: impl Fn(usize) -> String,
    timeout: Option<std::time::Duration>,
) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let mut failed = None;
    loop {
        let mut running = 0;
        for (i, c) in children.iter_mut().enumerate() {
            match c.try_wait()? {
                Some(st) if !st.success() && failed.is_none() => {
                    failed = Some(format!("{} failed ({st})", name(i)))
                }
                Some(_) => {}
                None => running += 1,
            }
        }
        if failed.is_some() || running == 0 {
            break;
        }
        if timeout.is_some_and(|t| start.elapsed() > t) {
            failed = Some(format!("not finished in {} s", start.elapsed().as_secs()));
            break;
        }
        // The callers time runs of a few seconds: a coarser poll would add
        // up to its period to each.
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    match failed {
        Some(f) => anyhow::bail!("{f}"),
        None => Ok(()),
    }
}

/// The mean of `key` over a run report's epochs (0 without epochs).
pub fn epoch_mean(report: &serde_json::Value, key: &str) -> f64 {
    let epochs = report["epochs"].as_array().map_or(&[][..], Vec::as_slice);
    epochs
        .iter()
        .map(|e| e[key].as_f64().unwrap_or(0.0))
        .sum::<f64>()
        / epochs.len().max(1) as f64
}
