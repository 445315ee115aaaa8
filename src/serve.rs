//! `hetgnn serve`: a trained model answering HTTP/JSON requests (see the
//! `serving` crate for the API and docs/serving.md for its use).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serving::batcher::BatchLimits;
use serving::server::{Limits, Loader, ServerConfig};
use serving::{Engine, ServeError};

use crate::predict::InferenceArg;

/// Options of `hetgnn serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// A checkpoint directory, or a checkpoint root (its newest valid checkpoint is used);
    /// single-process (epoch-*) or distributed (step-*) checkpoints.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The graph directory the model was trained on (with `--partitions`: optional, checked
    /// to be the graph the partitions were cut from; its original ids are then answered).
    #[arg(long, required_unless_present = "partitions")]
    data: Option<PathBuf>,
    /// A partition directory (`hetgnn partition`): serve from partitions whose rows live on
    /// the nodes of a topology (`--config`, `--node`; each node runs this command and
    /// answers requests for any node). Sampled inference only; requests with new nodes or
    /// edges are a whole-graph server's. Without `--config`, every partition runs here.
    #[arg(long, conflicts_with = "admin_token_file")]
    partitions: Option<PathBuf>,
    /// With `--partitions`: a topology file; this process is one node of it (`--node`),
    /// the k-th node of `cluster.nodes` holding partition k.
    #[arg(long, requires_all = ["partitions", "node"])]
    config: Option<PathBuf>,
    /// With `--config`: this process's node id.
    #[arg(long, requires = "config")]
    node: Option<String>,
    /// With `--config`: when another partition's node is down, load its partition from
    /// `--partitions` and serve it here (the directory must be readable on every node):
    /// its requests are answered, the same, instead of refused with 503 until it is back.
    #[arg(long, requires = "config")]
    take_over: bool,
    /// The address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Sampled (the training fanouts, a fixed sampling key; `predict`'s answers) or
    /// exact (full neighbourhoods, every node computed at load; `embed`'s answers).
    #[arg(long, value_enum, default_value_t = InferenceArg::Sampled)]
    inference: InferenceArg,
    /// With sampled inference on the whole graph: compute every layer but the last for
    /// every node at load (and at each reload), with the same draws, so that a request
    /// samples one hop and runs one layer. The same answers, several times sooner, for
    /// one hidden row per node of every type in memory and a load of about an epoch's
    /// inference.
    #[arg(long, conflicts_with = "partitions")]
    precompute: bool,
    /// A model trained for several tasks (`training.tasks`): the task
    /// `/v1/predict` answers ("node-classification", "node-regression" or
    /// "multi-label") [default: its first]; a reloaded checkpoint must have it too.
    #[arg(long)]
    task: Option<String>,
    /// The longest a request waits for others to share its inference batch, in ms.
    /// At 0, a batch is whatever queued while the previous one ran (the lowest
    /// latency, and under load the same batches).
    #[arg(long, default_value_t = 0.0)]
    batch_wait_ms: f64,
    /// Nodes after which a batch runs without waiting longer.
    #[arg(long, default_value_t = 4096)]
    batch_nodes: usize,
    /// Requests that may wait for inference; more are refused with 503.
    #[arg(long, default_value_t = 1024)]
    queue: usize,
    /// Largest request body, in bytes (413 beyond).
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Most ids in one request (413 beyond).
    #[arg(long, default_value_t = 10_000)]
    max_ids: usize,
    /// Longest a request may take, in ms (503 beyond).
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Requests per second admitted over all clients, 0 for no limit (429 beyond).
    #[arg(long, default_value_t = 0)]
    max_rps: u32,
    /// A file holding the token `POST /admin/reload` must carry as
    /// `Authorization: Bearer <token>` (without it the endpoint is off; `SIGHUP` reloads too).
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM; with --tls-key). A
    /// cluster node's certificate from `hetgnn certs init` will do.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// While serving, ask the kernel to keep idle CPUs able to wake within this many µs
    /// (Linux PM QoS, /dev/cpu_dma_latency; needs write access to it). 0 keeps them polling
    /// instead of halting: requests after a pause are answered as fast as back to back
    /// ones, at the cost of the idle CPUs' power (on a virtual machine, its host's CPU time).
    #[arg(long)]
    cpu_latency_us: Option<u32>,
}

/// Loads the checkpoint on the whole graph, again at every reload.
fn whole(a: &ServeArgs) -> Loader {
    let (checkpoint, data) = (a.checkpoint.clone(), a.data.clone().unwrap_or_default());
    let inference = a.inference.into();
    let (task, precompute) = (a.task.clone(), a.precompute);
    Arc::new(move || -> Result<Engine, ServeError> {
        let (trained, skipped) = serving::Trained::open(&checkpoint, &data)?;
        for s in skipped {
            warnln!("skipped checkpoint: {s}");
        }
        let mut last = usize::MAX;
        let mut engine = Engine::new(trained, inference, 4096, |layer, _, _| {
            if layer != last {
                warnln!("exact inference: layer {} over every node", layer + 1);
                last = layer;
            }
        })?;
        let keep = engine.precompute_bytes();
        let sampled = inference == serving::Inference::Sampled;
        if !precompute && sampled && engine.classifies() && keep > 0 {
            warnln!(
                "serve: --precompute would answer sampled requests about 3x sooner, for up to {} more memory and a pass over every node at load",
                graphs::memory::human(keep)
            );
        }
        if precompute {
            let mut last = usize::MAX;
            engine = engine.precompute(4096, |layer, _, _| {
                if layer != last {
                    warnln!(
                        "precompute: layer {} over every node (sampled draws)",
                        layer + 1
                    );
                    last = layer;
                }
            })?;
        }
        if let Some(t) = &task {
            engine.choose_task(t)?;
        }
        Ok(engine)
    })
}

/// Loads the checkpoint on this node's partition and starts serving the
/// partition to the other nodes, once: its stores hold the checkpoint's rows
/// for as long as the process runs, so a new checkpoint is served by
/// restarting the nodes.
fn partitioned(a: &ServeArgs, parts: &std::path::Path) -> anyhow::Result<Loader> {
    let node = match (&a.config, &a.node) {
        (Some(config), Some(id)) => {
            crate::cluster::init_logging();
            let cfg = actors::Config::load(config, &[])
                .with_context(|| format!("reading {}", config.display()))?;
            let Some(topology) = cfg.topology() else {
                bail!("{}: has no [cluster] section", config.display());
            };
            Some((topology, id.clone()))
        }
        _ => None,
    };
    let (checkpoint, parts, data) = (a.checkpoint.clone(), parts.to_path_buf(), a.data.clone());
    let task = a.task.clone();
    let ask = Duration::from_millis(a.timeout_ms);
    let take_over = a.take_over;
    let loaded = std::sync::atomic::AtomicBool::new(false);
    Ok(Arc::new(move || -> Result<Engine, ServeError> {
        if loaded.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(ServeError::Load(
                "a server of partitions loads its checkpoint once (its stores serve the other nodes): restart every node with the new checkpoint".into(),
            ));
        }
        let (trained, online, skipped) =
            serving::Trained::open_partitioned(serving::trained::Partitioned {
                checkpoint: &checkpoint,
                partitions: &parts,
                data: data.as_deref(),
                node: node.as_ref().map(|(t, id)| (t.clone(), id.as_str())),
                ask,
                take_over,
            })?;
        for s in skipped {
            warnln!("skipped checkpoint: {s}");
        }
        warnln!(
            "serve: partition {} of {} (sampled inference; other partitions' rows are pulled from their nodes)",
            online.part(),
            online.parts()
        );
        let mut engine = Engine::partitioned(trained, online);
        if let Some(t) = &task {
            engine.choose_task(t)?;
        }
        Ok(engine)
    }))
}

pub fn run(a: &ServeArgs) -> anyhow::Result<()> {
    if !(a.batch_wait_ms.is_finite() && (0.0..=1000.0).contains(&a.batch_wait_ms)) {
        bail!(
            "--batch-wait-ms must be between 0 and 1000, got {}",
            a.batch_wait_ms
        );
    }
    for (flag, v) in [
        ("--batch-nodes", a.batch_nodes),
        ("--queue", a.queue),
        ("--max-body-bytes", a.max_body_bytes),
        ("--max-ids", a.max_ids),
        ("--timeout-ms", a.timeout_ms as usize),
    ] {
        if v == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    let admin_token = a
        .admin_token_file
        .as_deref()
        .map(|p| -> anyhow::Result<String> {
            let t = std::fs::read_to_string(p)
                .with_context(|| format!("reading --admin-token-file {}", p.display()))?;
            let t = t.trim().to_string();
            if t.len() < 16 {
                bail!(
                    "--admin-token-file {}: the token must be at least 16 characters",
                    p.display()
                );
            }
            Ok(t)
        })
        .transpose()?;
    // The checkpoint and graph are checked before the port is taken, so a
    // mistyped path fails at once instead of as a server that never gets ready.
    let inputs = [
        ("--checkpoint", Some(&a.checkpoint)),
        ("--data", a.data.as_ref()),
        ("--partitions", a.partitions.as_ref()),
        ("--config", a.config.as_ref()),
    ];
    for (flag, path) in inputs {
        if let Some(path) = path.filter(|p| !p.exists()) {
            bail!("{flag} {}: no such file or directory", path.display());
        }
    }
    if a.precompute && a.inference == InferenceArg::Exact {
        bail!("--precompute is for sampled inference: --inference exact computes every layer of every node at load already");
    }
    if a.partitions.is_some() && a.inference == InferenceArg::Exact {
        bail!("--inference exact is a whole-graph server's (--data without --partitions); `hetgnn embed --partitions` and `predict --partitions` compute exact answers across partitions offline");
    }
    // A bad certificate or key is refused before the port is taken, too.
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(
            runtime::tls::https_server_config(cert, key)
                .context("loading --tls-cert and --tls-key")?,
        ),
        _ => None,
    };
    // Held until the server stops; refused before the port is taken.
    let _latency = a
        .cpu_latency_us
        .map(serving::cpu_latency::CpuLatency::hold)
        .transpose()?;
    let load = match &a.partitions {
        Some(parts) => partitioned(a, parts)?,
        None => whole(a),
    };
    let config = ServerConfig {
        listen: a.listen,
        limits: Limits {
            max_body_bytes: a.max_body_bytes,
            max_ids: a.max_ids,
            timeout: Duration::from_millis(a.timeout_ms),
            max_rps: a.max_rps,
            batch: BatchLimits {
                max_wait: Duration::from_secs_f64(a.batch_wait_ms / 1e3),
                max_nodes: a.batch_nodes,
                queue: a.queue,
            },
        },
        admin_token,
        load,
        log: Arc::new(|m: &str| warnln!("serve: {m}")),
        tls,
    };
    let fds = crate::limits::require_open_files()?;
    warnln!("serve: up to {fds} open files and connections (RLIMIT_NOFILE)");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("serve-http")
        .build()
        .context("starting the HTTP runtime")?;
    let addr = runtime.block_on(serving::server::run(config))?;
    warnln!("serve: stopped ({addr})");
    Ok(())
}
