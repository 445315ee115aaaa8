//! `hetgnn node` and `hetgnn doctor`: run one node of a topology file, or
//! check every node of it through the authenticated transport.

use std::path::PathBuf;
use std::time::Duration;

use actors::Config;
use anyhow::Context;
use clap::Args;

/// Options shared by the cluster commands.
#[derive(Args, Clone)]
pub struct ClusterArgs {
    /// Topology file (TOML: [cluster], [placement], [training], [links], [chaos]; see docs/guide/configuration.md).
    #[arg(long)]
    pub config: PathBuf,
    /// Override any key: --set training.epochs=2 (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Replace an existing training.report file.
    #[arg(long)]
    pub force: bool,
}

impl ClusterArgs {
    /// The validated configuration.
    pub fn load(&self) -> anyhow::Result<Config> {
        let cfg = Config::load(&self.config, &self.set)
            .with_context(|| format!("reading {}", self.config.display()))?;
        for w in &cfg.warnings {
            warnln!("warning: {}: {w}", self.config.display());
        }
        Ok(cfg)
    }
}

/// Logs to stderr, `info` unless `RUST_LOG` says otherwise.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,quinn=warn,rustls=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// `hetgnn node`: runs until Ctrl-C or SIGTERM.
pub fn node(args: &ClusterArgs, id: &str) -> anyhow::Result<()> {
    init_logging();
    let cfg = args.load()?;
    crate::train::check_outputs(&cfg, args.force, Some(&args.config))?;
    let start = std::time::Instant::now();
    let report = actors::run_node(&cfg, id, &mut crate::train::Progress::default())
        .with_context(|| format!("node {id}: {} training", cfg.training.mode.name()))?;
    if let Some(report) = report {
        crate::train::finish(&cfg, &report, start)?;
    }
    Ok(())
}

/// One device cache as `doctor` shows it.
fn cache_line(answer: &Result<Option<actors::cache::manager::CacheStatus>, String>) -> String {
    match answer {
        Err(e) => format!("did not answer: {e}"),
        Ok(None) => "no cache (none configured, or not built yet)".into(),
        Ok(Some(s)) => {
            let mib = |b: u64| b as f64 / (1 << 20) as f64;
            let types: Vec<String> = s
                .types
                .iter()
                .filter(|(_, t)| t.note.is_none())
                .map(|(name, t)| format!("{name} {} rows, hit rate {:.2}", t.rows, t.hit_rate))
                .collect();
            format!(
                "{} policy, {:.1} of {:.1} MiB; {}",
                s.policy,
                mib(s.used_bytes),
                mib(s.budget_bytes),
                types.join("; ")
            )
        }
    }
}

/// `hetgnn doctor`: prints one line per node; fails if any node did not answer.
pub fn doctor(args: &ClusterArgs, timeout: Duration) -> anyhow::Result<()> {
    let cfg = args.load()?;
    if let Some(topology) = cfg.topology() {
        topology
            .check_certs()
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    }
    sayln!(
        "{}: configuration and certificates ok",
        args.config.display()
    );
    let rows = actors::cluster::doctor(&cfg, timeout)?;
    sayln!(
        "{:<12} {:<22} {:<8} {:>9} {:>10}  peers",
        "node",
        "address",
        "state",
        "rtt_ms",
        "uptime_s"
    );
    let mut missing = Vec::new();
    for r in &rows {
        match &r.status {
            Some(s) => {
                let peers: Vec<String> = s
                    .peers
                    .iter()
                    .map(|p| format!("{}:{}", p.id, format!("{:?}", p.state).to_lowercase()))
                    .collect();
                let rtt = r
                    .rtt
                    .map_or("-".to_string(), |d| format!("{:.3}", d.as_secs_f64() * 1e3));
                sayln!(
                    "{:<12} {:<22} {:<8} {:>9} {:>10.1}  {}",
                    r.id,
                    r.addr,
                    "up",
                    rtt,
                    s.uptime_ms as f64 / 1e3,
                    peers.join(" ")
                );
                for (name, answer) in &r.caches {
                    sayln!("{:<12} {name}: {}", "", cache_line(answer));
                }
            }
            None => {
                sayln!(
                    "{:<12} {:<22} {:<8} {:>9} {:>10}  {}",
                    r.id,
                    r.addr,
                    "MISSING",
                    "-",
                    "-",
                    r.error.as_deref().unwrap_or("")
                );
                missing.push(r.id.clone());
            }
        }
    }
    if !missing.is_empty() {
        anyhow::bail!(
            "{} of {} nodes did not answer: {}",
            missing.len(),
            rows.len(),
            missing.join(", ")
        );
    }
    sayln!("all {} nodes answered", rows.len());
    Ok(())
}
