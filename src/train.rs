//! `hetgnn train`: configuration from file, flags and `--set`, the default
//! dataset, progress bars, and the report.

use std::path::{Path, PathBuf};
use std::time::Instant;

use actors::{Config, EpochReport, TrainObserver};
use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

/// Options of `hetgnn train` (each a shorthand for a `training.*` key).
/// Negative numbers are values (`--lr -0.01` is refused by validation, with the key named, not by the parser).
#[derive(Args, Default)]
#[command(allow_negative_numbers = true)]
pub struct TrainArgs {
    /// TOML configuration file (see docs/guide/configuration.md); flags and --set override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override any key: --set training.epochs=3 (repeatable; applied last).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Graph directory (default: mag-like S=0.01, generated once into the cache directory).
    #[arg(long)]
    data: Option<PathBuf>,
    /// single | data-parallel | raf | model-averaging | hopgnn | full-graph [default: single]
    #[arg(long)]
    mode: Option<String>,
    /// Model averaging: epochs between averagings [default: 1].
    #[arg(long)]
    sync_every: Option<u64>,
    /// Model averaging: workers, each training its share of the partitions in turn [default: one per partition].
    #[arg(long)]
    workers: Option<u32>,
    /// Partition directory for data-parallel, model-averaging, hopgnn and full-graph (hetgnn partition) or raf (--method meta).
    #[arg(long)]
    partitions: Option<PathBuf>,
    /// rgcn | rgat | hgt | mlp [default: rgcn]
    #[arg(long)]
    model: Option<String>,
    /// node-classification | link-prediction | node-regression | edge-classification | edge-regression | multi-label [default: node-classification]
    #[arg(long)]
    task: Option<String>,
    /// Link prediction and edge tasks: the relations to predict, canonical src__name__dst names, comma-separated.
    #[arg(long, value_name = "RELATIONS")]
    target_relations: Option<String>,
    /// Link prediction: negative edges per positive edge [default: 5].
    #[arg(long)]
    negatives: Option<usize>,
    /// Link prediction: dot | distmult [default: dot].
    #[arg(long)]
    decoder: Option<String>,
    /// Edge tasks: mlp | distmult [default: mlp].
    #[arg(long)]
    edge_decoder: Option<String>,
    /// Number of epochs [default: 10].
    #[arg(long)]
    epochs: Option<u64>,
    /// Validate and test after every N-th epoch and the last [default: 1].
    #[arg(long)]
    eval_every: Option<u64>,
    /// Seeds per step [default: 1024].
    #[arg(long)]
    batch: Option<usize>,
    /// Neighbors per relation and hop, seeds outward [default: 25,20].
    #[arg(long)]
    fanouts: Option<String>,
    /// Number of layers [default: 2; must match the number of fanouts].
    #[arg(long)]
    layers: Option<usize>,
    /// Hidden width [default: 64].
    #[arg(long)]
    hidden: Option<usize>,
    /// Attention heads of R-GAT and HGT [default: 4].
    #[arg(long)]
    heads: Option<usize>,
    /// Learnable embedding width for featureless types [default: 64].
    #[arg(long)]
    embed_dim: Option<usize>,
    /// Adam learning rate [default: 0.01].
    #[arg(long)]
    lr: Option<f64>,
    /// Dropout [default: 0.5].
    #[arg(long)]
    dropout: Option<f32>,
    /// Seed [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// Add reverse relations (the default).
    #[arg(long, conflicts_with = "no_reverse_edges")]
    reverse_edges: bool,
    /// Do not add reverse relations (for graphs that already hold both directions).
    #[arg(long)]
    no_reverse_edges: bool,
    /// cpu | cuda:N [default: cpu].
    #[arg(long)]
    device: Option<String>,
    /// Write the run report (JSON) here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Write a checkpoint to this directory after every epoch.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Resume from the newest valid checkpoint in --checkpoint.
    #[arg(long)]
    resume: bool,
    /// Start from another run's checkpoint (pre-train, then fine-tune): its
    /// relational layers and learnable rows, as --init-parts says.
    #[arg(long, value_name = "CHECKPOINT")]
    init_from: Option<PathBuf>,
    /// What --init-from loads: embed, gnn, decoder [default: embed,gnn].
    #[arg(long, value_name = "PARTS")]
    init_parts: Option<String>,
    /// Loaded parts left as loaded, not trained (e.g. embed,gnn).
    #[arg(long, value_name = "PARTS")]
    freeze: Option<String>,
    /// Device cache per trainer or raf worker, e.g. 4GiB [default: 0, no cache].
    #[arg(long)]
    cache_bytes: Option<String>,
    /// miss-penalty | hotness | none [default: miss-penalty].
    #[arg(long)]
    cache_policy: Option<String>,
    /// Replace an existing --report file.
    #[arg(long)]
    force: bool,
}

impl TrainArgs {
    /// The flags as `training.key=value` overrides, then the explicit `--set`s.
    fn overrides(&self) -> anyhow::Result<Vec<String>> {
        // The configuration is TOML, which holds UTF-8 only: say so rather than mangle a path.
        let path = |flag: &str, p: &Option<PathBuf>| {
            p.as_deref()
                .map(|p| graphs::input::utf8_path(flag, p).map(|s| actors::config::toml_string(&s)))
                .transpose()
        };
        let (data, partitions, report, checkpoint, init_from) = (
            path("--data", &self.data)?,
            path("--partitions", &self.partitions)?,
            path("--report", &self.report)?,
            path("--checkpoint", &self.checkpoint)?,
            path("--init-from", &self.init_from)?,
        );
        let mut o = Vec::new();
        let mut push = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                o.push(format!("training.{k}={v}"));
            }
        };
        let quoted = actors::config::toml_string;
        push("data", data);
        push("mode", self.mode.as_deref().map(quoted));
        push(
            "model-averaging.sync_every",
            self.sync_every.map(|v| v.to_string()),
        );
        push(
            "model-averaging.workers",
            self.workers.map(|v| v.to_string()),
        );
        push("partitions", partitions);
        push("model", self.model.as_deref().map(quoted));
        push("task", self.task.as_deref().map(quoted));
        push(
            "target_relations",
            self.target_relations.as_deref().map(quoted),
        );
        push("negatives", self.negatives.map(|v| v.to_string()));
        push("decoder", self.decoder.as_deref().map(quoted));
        push("edge_decoder", self.edge_decoder.as_deref().map(quoted));
        push("epochs", self.epochs.map(|v| v.to_string()));
        push("eval_every", self.eval_every.map(|v| v.to_string()));
        push("batch", self.batch.map(|v| v.to_string()));
        push("fanouts", self.fanouts.as_deref().map(quoted));
        push("layers", self.layers.map(|v| v.to_string()));
        push("hidden", self.hidden.map(|v| v.to_string()));
        push("heads", self.heads.map(|v| v.to_string()));
        push("embed_dim", self.embed_dim.map(|v| v.to_string()));
        push("lr", self.lr.map(|v| format!("{v:?}")));
        push("dropout", self.dropout.map(|v| format!("{v:?}")));
        // As a string: TOML integers stop at 2^63 - 1, seeds do not.
        push("seed", self.seed.map(|v| quoted(&v.to_string())));
        push(
            "reverse_edges",
            (self.reverse_edges || self.no_reverse_edges).then(|| self.reverse_edges.to_string()),
        );
        push("device", self.device.as_deref().map(quoted));
        push("report", report);
        push("checkpoint_dir", checkpoint);
        push("resume", self.resume.then(|| "true".to_string()));
        push("init_from", init_from);
        push("init_parts", self.init_parts.as_deref().map(quoted));
        push("freeze", self.freeze.as_deref().map(quoted));
        push("cache_bytes", self.cache_bytes.as_deref().map(quoted));
        push("cache_policy", self.cache_policy.as_deref().map(quoted));
        o.extend(self.set.iter().cloned());
        Ok(o)
    }
}

/// Where the default dataset is cached: `$HETGNN_CACHE`, else `$XDG_CACHE_HOME/hetgnn`, else `~/.cache/hetgnn`.
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HETGNN_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("hetgnn");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/hetgnn"),
        None => PathBuf::from(".hetgnn-cache"),
    }
}

/// The built-in default graph: mag-like at scale 0.01, seed 0, generated once.
fn default_data() -> anyhow::Result<PathBuf> {
    let dir = cache_dir().join(format!(
        "mag-like-v{}-s0.01-seed0",
        graphs::generate::VERSION
    ));
    if !dir.join("schema.json").exists() {
        warnln!(
            "generating the default graph (mag-like, scale 0.01) into {} (once)",
            dir.display()
        );
        graphs::generate::generate(
            graphs::generate::Like::Mag,
            0.01,
            0,
            &dir,
            true,
            &mut crate::bar::Bars::new(),
        )
        .with_context(|| format!("generating the default graph into {}", dir.display()))?;
    } else {
        warnln!("using the default graph in {}", dir.display());
    }
    Ok(dir)
}

pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    let overrides = args.overrides()?;
    let mut cfg = match &args.config {
        Some(path) => Config::load(path, &overrides)?,
        None => Config::parse("", &overrides)?,
    };
    for w in &cfg.warnings {
        warnln!("warning: {w}");
    }
    // Single-process training reads a graph directory; the others read partitions.
    if cfg.training.mode == actors::Mode::Single && cfg.training.data.is_none() {
        cfg.training.data = Some(default_data()?);
    }
    check_outputs(&cfg, args.force, args.config.as_deref())?;
    let input = cfg
        .training
        .partitions
        .clone()
        .or_else(|| cfg.training.data.clone())
        .unwrap_or_default();
    let start = Instant::now();
    let profile = crate::profile::HostProfile::start();
    let (report, _) = actors::train(&cfg, &mut Progress::default()).with_context(|| {
        format!(
            "{} training on {}",
            cfg.training.mode.name(),
            input.display()
        )
    })?;
    profile.finish();
    finish(&cfg, &report, start)
}

/// Refuses, before any work, a report or checkpoint path that would
/// overwrite a report without `--force`, name a directory, or fall inside an input.
pub fn check_outputs(cfg: &Config, force: bool, config_file: Option<&Path>) -> anyhow::Result<()> {
    use crate::output::{Kind, Output};
    let t = &cfg.training;
    let mut outputs = Vec::new();
    if let Some(r) = &t.report {
        outputs.push(Output {
            flag: "--report",
            path: r,
            kind: Kind::File,
        });
    }
    if let Some(c) = &t.checkpoint_dir {
        outputs.push(Output {
            flag: "--checkpoint",
            path: c,
            kind: Kind::AddTo,
        });
    }
    let mut inputs: Vec<(&str, &Path)> = Vec::new();
    inputs.extend(t.data.as_deref().map(|p| ("--data", p)));
    inputs.extend(t.partitions.as_deref().map(|p| ("--partitions", p)));
    inputs.extend(config_file.map(|p| ("--config", p)));
    crate::output::check(&outputs, force, &inputs)
}

/// Writes the run's report if asked, then prints its summary (a closed
/// stdout loses only the summary).
pub fn finish(cfg: &Config, report: &actors::Report, start: Instant) -> anyhow::Result<()> {
    if let Some(path) = &cfg.training.report {
        write_report(report, path)?;
    }
    if let Some(link) = report.epochs.last().and_then(|e| e.link) {
        sayln!(
            "done: {} epochs, {} steps in {:.1}s; final test MRR {:.4}, Hits@10 {:.4} (valid MRR {:.4}); model sha256 {}",
            report.epochs.len(),
            report.steps,
            start.elapsed().as_secs_f64(),
            link.test.mrr,
            link.test.hits10,
            link.valid.mrr,
            &report.final_model_sha256[..16]
        );
    } else if let Some(v) = report.epochs.last().and_then(|e| e.regression) {
        sayln!(
            "done: {} epochs, {} steps in {:.1}s; final test RMSE {:.4}, MAE {:.4}, R² {:.4} (valid RMSE {:.4}); model sha256 {}",
            report.epochs.len(),
            report.steps,
            start.elapsed().as_secs_f64(),
            v.test.rmse,
            v.test.mae,
            v.test.r2,
            v.valid.rmse,
            &report.final_model_sha256[..16]
        );
    } else if let Some((last, [vm, tm])) = report
        .epochs
        .last()
        .and_then(|e| e.micro_f1.map(|f| (e, f)))
    {
        let ap = last.average_precision.map_or(String::new(), |[_, t]| {
            format!(", average precision {t:.4}")
        });
        sayln!(
            "done: {} epochs, {} steps in {:.1}s; final test micro F1 {tm:.4}{ap} (valid micro F1 {vm:.4}); model sha256 {}",
            report.epochs.len(),
            report.steps,
            start.elapsed().as_secs_f64(),
            &report.final_model_sha256[..16]
        );
    } else if let Some(last) = report.epochs.last() {
        sayln!(
            "done: {} epochs, {} steps in {:.1}s; final test accuracy {} (valid {}); model sha256 {}",
            report.epochs.len(),
            report.steps,
            start.elapsed().as_secs_f64(),
            accuracy(last.test_acc),
            accuracy(last.valid_acc),
            &report.final_model_sha256[..16]
        );
    }
    // Only worth a line when the last epoch is not the best.
    if let Some(b) = report
        .best
        .as_ref()
        .filter(|b| Some(b.epoch) != report.epochs.last().map(|e| e.epoch))
    {
        sayln!(
            "best epoch {} by validation {} {:.4} (test {:.4})",
            b.epoch,
            b.metric,
            b.valid,
            b.test
        );
    }
    if !report.cache.is_empty() {
        let per_type: Vec<String> = report
            .cache
            .iter()
            .filter(|(_, c)| c.note.is_none())
            .map(|(name, c)| {
                format!(
                    "{name} {:.0}% of it, hit rate {:.2}",
                    c.share * 100.0,
                    c.hit_rate
                )
            })
            .collect();
        sayln!(
            "cache ({}, {} bytes per device): {}",
            cfg.training.cache_policy.name(),
            cfg.training.cache_bytes.0,
            per_type.join("; ")
        );
    }
    if let Some(path) = &cfg.training.report {
        sayln!("report written to {}", path.display());
    }
    Ok(())
}

/// An accuracy as printed: four decimals, or "-" for an epoch not evaluated (`training.eval_every`).
fn accuracy(a: Option<f64>) -> String {
    a.map_or_else(|| "-".into(), |a| format!("{a:.4}"))
}

fn write_report(report: &actors::Report, path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    report.write(path)?;
    Ok(())
}

/// One bar per epoch on stderr (where stderr is not a terminal, a line there
/// every [`PLAIN_EVERY`] instead), one summary line per epoch on stdout.
#[derive(Default)]
pub struct Progress {
    bar: Option<ProgressBar>,
    started: Option<Instant>,
    loss: f64,
    steps: u64,
    /// The epoch and its steps, for the plain lines.
    epoch: (u64, u64),
    /// When the last plain line was written.
    said: Option<Instant>,
}

/// How often a log (stderr not a terminal) hears how an epoch is going.
const PLAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl TrainObserver for Progress {
    fn ready(&mut self, g: &graphs::HetGraph, model: &models::Model) {
        let spec = model.spec();
        sayln!(
            "training {} ({} layers, hidden {}) on {}: {} node types, {} relations, {} dense parameters",
            spec.kind,
            spec.layers,
            spec.hidden,
            g.name(),
            g.node_types().len(),
            g.relations().len(),
            model.params.numel()
        );
    }
    fn epoch_start(&mut self, epoch: u64, steps: u64) {
        let bar = ProgressBar::new(steps);
        bar.set_style(
            ProgressStyle::with_template("epoch {prefix:>3} [{bar:30}] {pos}/{len} {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(epoch.to_string());
        self.bar = Some(bar);
        self.started = Some(Instant::now());
        self.said = self.started;
        self.epoch = (epoch, steps);
        self.loss = 0.0;
        self.steps = 0;
    }
    fn step(&mut self, loss: f64) {
        self.loss += loss;
        self.steps += 1;
        if let (Some(bar), Some(t)) = (&self.bar, self.started) {
            let rate = self.steps as f64 / t.elapsed().as_secs_f64().max(1e-9);
            bar.set_message(format!(
                "loss {:.4}  {rate:.2} batches/s",
                self.loss / self.steps as f64
            ));
            bar.inc(1);
            // A log file shows no bar: a line now and then says the epoch is moving, and how fast.
            if bar.is_hidden() && self.said.is_some_and(|s| s.elapsed() >= PLAIN_EVERY) {
                self.said = Some(Instant::now());
                warnln!(
                    "epoch {:>3}: step {}/{}  loss {:.4}  {rate:.2} batches/s",
                    self.epoch.0,
                    self.steps,
                    self.epoch.1,
                    self.loss / self.steps as f64
                );
            }
        }
    }
    fn note(&mut self, message: &str) {
        warnln!("{message}");
    }
    fn epoch_end(&mut self, r: &EpochReport) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let figures = match (&r.link, &r.regression) {
            (Some(l), _) => {
                format!("valid MRR {:.4} Hits@10 {:.4}  test MRR {:.4} Hits@1 {:.4} Hits@10 {:.4} Hits@100 {:.4}", l.valid.mrr, l.valid.hits10, l.test.mrr, l.test.hits1, l.test.hits10, l.test.hits100)
            }
            (None, Some(v)) => format!(
                "valid RMSE {:.4} MAE {:.4} R² {:.4}  test RMSE {:.4} MAE {:.4} R² {:.4}",
                v.valid.rmse, v.valid.mae, v.valid.r2, v.test.rmse, v.test.mae, v.test.r2
            ),
            (None, None) => {
                let f1 = r.macro_f1.map_or(String::new(), |[v, t]| {
                    format!("  macro F1 valid {v:.4} test {t:.4}")
                });
                let auc = r.roc_auc.map_or(String::new(), |[v, t]| {
                    format!("  ROC-AUC valid {v:.4} test {t:.4}")
                });
                let micro = r.micro_f1.map_or(String::new(), |[v, t]| {
                    format!("  micro F1 valid {v:.4} test {t:.4}")
                });
                let ap = r.average_precision.map_or(String::new(), |[v, t]| {
                    format!("  AP valid {v:.4} test {t:.4}")
                });
                format!(
                    "train {:.4}  valid {}  test {}{micro}{f1}{ap}{auc}",
                    r.train_acc,
                    accuracy(r.valid_acc),
                    accuracy(r.test_acc)
                )
            }
        };
        let t = &r.time;
        sayln!(
            "epoch {:>3}  loss {:.4}  {figures}  {:.2}s (sample {:.2}, gather {:.2}, compute {:.2}, update {:.2}; eval {:.2})",
            r.epoch,
            r.loss,
            t.seconds,
            t.sample_s,
            t.gather_s,
            t.compute_s,
            t.update_s,
            t.eval_s
        );
        for task in &r.tasks {
            sayln!("      {}", task_line(task));
        }
    }
}

/// One task's figures of a multi-task epoch, for the epoch's lines.
fn task_line(t: &actors::report::TaskEpoch) -> String {
    let mut line = format!("{} (weight {}): loss {:.4}", t.task, t.weight, t.loss);
    let pair = |name: &str, p: Option<[f64; 2]>| {
        p.map_or(String::new(), |[v, t]| {
            format!("  {name} valid {v:.4} test {t:.4}")
        })
    };
    if let Some(l) = &t.link {
        line += &format!(
            "  valid MRR {:.4}  test MRR {:.4} Hits@10 {:.4}",
            l.valid.mrr, l.test.mrr, l.test.hits10
        );
    }
    if let Some(v) = &t.regression {
        line += &format!(
            "  valid RMSE {:.4}  test RMSE {:.4}",
            v.valid.rmse, v.test.rmse
        );
    }
    if let (Some(v), Some(te)) = (t.valid_acc, t.test_acc) {
        line += &format!("  valid {v:.4}  test {te:.4}");
    }
    line += &pair("micro F1", t.micro_f1);
    line += &pair("macro F1", t.macro_f1);
    line += &pair("ROC-AUC", t.roc_auc);
    line
}
