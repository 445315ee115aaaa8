//! Single-process training: sample → gather → forward/backward → update, with
//! evaluation after every epoch. Every source of randomness is keyed by the
//! seed, so two runs with the same configuration are bit-identical on CPU.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use graphs::sampler::epoch_batches;
use graphs::{HetGraph, LoadOptions, Sampler};
use models::checkpoint;
use models::model::DropoutKey;
use models::optim::{Adam, AdamConfig};
use models::Model;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::{Result, TrainError};
use crate::pipeline;
use crate::report::{peak_rss_bytes, EpochReport, Report};

/// Evaluation samples with a seed of its own so it never shares draws with training.
pub const EVAL_SEED: u64 = 0xE7A1_5EED;
/// Seeds per evaluation batch.
pub(crate) const EVAL_BATCH: usize = 4096;
/// Batches sampled and gathered ahead of the trainer.
const PIPELINE_DEPTH: usize = 2;

/// Receives progress from [`train`] (the CLI draws bars from it).
pub trait TrainObserver {
    /// The graph is loaded and the model built.
    fn ready(&mut self, _graph: &HetGraph, _model: &Model) {}
    /// An epoch of `steps` steps begins.
    fn epoch_start(&mut self, _epoch: u64, _steps: u64) {}
    /// A step finished with this loss.
    fn step(&mut self, _loss: f64) {}
    /// An epoch finished (evaluation included).
    fn epoch_end(&mut self, _report: &EpochReport) {}
    /// Something the user should know (resumed from a checkpoint, skipped a corrupt one).
    fn note(&mut self, _message: &str) {}
}

/// Ignores progress.
impl TrainObserver for () {}

/// Trains as `cfg` says on the graph in `cfg.training.data` (which must be set).
pub fn train(cfg: &Config, observer: &mut dyn TrainObserver) -> Result<(Report, Model)> {
    let t = &cfg.training;
    let data = t.data.as_ref().ok_or_else(|| TrainError::Config("training.data: no graph directory given".into()))?;
    let device = crate::device::open(&t.device)?;
    let g = graphs::load(data, &LoadOptions { mmap_features: true, reverse_edges: t.reverse_edges })?;
    let mut model = Model::new(&t.model_spec(), &g, DType::F32, &device)?;
    observer.ready(&g, &model);
    let mut adam = Adam::new(AdamConfig::with_lr(t.lr));
    let (labels, splits) = g.target_labels();
    let mut report = Report { config: cfg.clone(), mode: "single".into(), nodes: 1, ..Report::default() };
    let mut eval_sampler = Sampler::new(&g, &t.fanouts, t.seed ^ EVAL_SEED)?;

    let mut first_epoch = 0;
    if let (false, Some(root)) = (t.resume, &t.checkpoint_dir) {
        if !checkpoint::list(root)?.is_empty() {
            return Err(TrainError::Config(format!("training.checkpoint_dir: {} holds checkpoints of an earlier run; resume it (--resume) or use another directory", root.display())));
        }
    }
    if let (true, Some(root)) = (t.resume, &t.checkpoint_dir) {
        match checkpoint::latest(root)? {
            Some((dir, skipped)) => {
                for s in skipped {
                    observer.note(&format!("skipped checkpoint: {s}"));
                }
                let m = checkpoint::load(&dir, &mut model, &mut adam, g.name(), t.reverse_edges)?;
                first_epoch = m.epochs_done;
                report.steps = m.steps;
                report.resumed_from_step = Some(m.steps);
                observer.note(&format!("resumed from {} (epoch {}, step {})", dir.display(), m.epochs_done, m.steps));
            }
            None => observer.note(&format!("no checkpoint in {}: starting from scratch", root.display())),
        }
    }

    if t.cache_bytes.0 > 0 && t.cache_policy != crate::cache::CachePolicy::None {
        observer.note(&format!("cache: pre-sampling {} epoch(s) to count visits, then profiling miss penalties", t.cache_presample_epochs));
    }
    let mut cache = {
        let mut presampler = Sampler::new(&g, &t.fanouts, t.seed ^ crate::cache::hotness::PRESAMPLE_SEED)?;
        let uses_neighbors = model.uses_neighbors();
        crate::cache::build_local(t, &g, &model, &splits.train, |e, s, b| pipeline::sample(&mut presampler, uses_neighbors, e, s, b))?
    };
    if let Some(c) = &cache {
        observer.note(&c.summary());
    }

    for epoch in first_epoch..t.epochs {
        let batches = epoch_batches(&splits.train, t.batch, t.seed, epoch);
        observer.epoch_start(epoch, batches.len() as u64);
        let mut er = EpochReport { epoch, ..EpochReport::default() };
        let (mut loss_sum, mut correct, mut seen) = (0.0, 0usize, 0usize);
        let epoch_start = Instant::now();
        let source = pipeline::Source {
            graph: &g,
            fanouts: &t.fanouts,
            seed: t.seed,
            uses_neighbors: model.uses_neighbors(),
            gather: model.feature_gather(),
            depth: PIPELINE_DEPTH,
            cache: cache.as_ref().map(|c| c.features.clone()),
        };
        pipeline::run(&source, epoch, &batches, |p| {
            let (step, mb) = (p.step, &p.mb);
            let seeds = &mb.seeds;
            er.sample_s += p.sample_s;
            er.gather_s += p.gather_s;
            let mut clock = Instant::now();
            let mut inputs = p.features;
            match &cache {
                Some(c) => c.gather_embeddings(&model, &mb.blocks[0].src, &mut inputs, true)?,
                None => model.gather_embeddings(&mb.blocks[0].src, &mut inputs)?,
            }
            let y = targets(labels, seeds, &device)?;
            er.gather_s += lap(&mut clock);
            let logits = model.forward(&g, mb, inputs.clone(), Some(DropoutKey { epoch, step }))?;
            let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
            let grads = loss.backward()?;
            er.compute_s += lap(&mut clock);
            adam.step(&model.params, &grads)?;
            for (ty, x) in inputs.iter().enumerate() {
                if let (Some(x), Some(table)) = (x, model.embeddings[ty].as_mut()) {
                    if let Some(gr) = grads.get(x) {
                        match cache.as_mut() {
                            Some(c) => c.sparse_adam(ty, table, &mb.blocks[0].src[ty], gr, &adam.cfg)?,
                            None => table.sparse_adam(&mb.blocks[0].src[ty], gr, &adam.cfg)?,
                        }
                    }
                }
            }
            er.update_s += lap(&mut clock);
            let l = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            loss_sum += l;
            correct += count_correct(&logits, labels, seeds)?;
            seen += seeds.len();
            report.steps += 1;
            observer.step(l);
            Ok(())
        })?;
        er.seconds = epoch_start.elapsed().as_secs_f64();
        // Evaluation and checkpoints read the tables: bring the cached rows home.
        if let Some(c) = &cache {
            c.write_back(&mut model)?;
        }
        er.loss = loss_sum / batches.len().max(1) as f64;
        er.train_acc = correct as f64 / seen.max(1) as f64;
        let eval_start = Instant::now();
        er.valid_acc = evaluate(&g, &model, &mut eval_sampler, epoch, &splits.valid)?;
        er.test_acc = evaluate(&g, &model, &mut eval_sampler, epoch, &splits.test)?;
        er.eval_s = eval_start.elapsed().as_secs_f64();
        observer.epoch_end(&er);
        report.epochs.push(er);
        if let Some(root) = &t.checkpoint_dir {
            let info = checkpoint::RunInfo { graph: g.name().to_string(), reverse_edges: t.reverse_edges, fanouts: t.fanouts.clone(), epochs_done: epoch + 1, steps: report.steps };
            checkpoint::save(root, &model, &adam, &info, t.checkpoint_keep)?;
        }
    }
    if let Some(c) = &cache {
        report.cache = c.report();
    }
    report.peak_memory_bytes = peak_rss_bytes();
    report.parameters = (model.params.numel() + model.embeddings.iter().flatten().map(|e| e.data.len()).sum::<usize>()) as u64;
    report.final_model_sha256 = model_hash(&model)?;
    Ok((report, model))
}

/// Seconds since `clock`, restarting it (phases are timed end to end).
pub(crate) fn lap(clock: &mut Instant) -> f64 {
    let s = clock.elapsed().as_secs_f64();
    *clock = Instant::now();
    s
}

fn targets(labels: &[i64], seeds: &[u32], device: &Device) -> Result<Tensor> {
    let y: Vec<u32> = seeds.iter().map(|&s| labels[s as usize] as u32).collect();
    Ok(Tensor::from_vec(y, seeds.len(), device)?)
}

fn count_correct(logits: &Tensor, labels: &[i64], seeds: &[u32]) -> Result<usize> {
    let pred: Vec<u32> = logits.argmax(1)?.to_vec1()?;
    Ok(pred.iter().zip(seeds).filter(|(p, s)| i64::from(**p) == labels[**s as usize]).count())
}

/// Accuracy on `nodes` with sampled neighborhoods and no dropout.
pub fn evaluate(g: &HetGraph, model: &Model, sampler: &mut Sampler, epoch: u64, nodes: &[u32]) -> Result<f64> {
    if nodes.is_empty() {
        return Ok(0.0);
    }
    let (labels, _) = g.target_labels();
    let mut correct = 0;
    for (step, seeds) in nodes.chunks(EVAL_BATCH).enumerate() {
        let mb = pipeline::sample(sampler, model.uses_neighbors(), epoch, step as u64, seeds)?;
        let inputs = model.gather_inputs(g, &mb.blocks[0].src)?;
        let logits = model.forward(g, &mb, inputs, None)?.detach();
        correct += count_correct(&logits, labels, seeds)?;
    }
    Ok(correct as f64 / nodes.len() as f64)
}

/// SHA-256 over parameter names and values, then embedding names and values.
pub fn model_hash(model: &Model) -> Result<String> {
    hash_parts(&model.params, model.embeddings.iter().flatten().map(|e| (e.name.as_str(), e.data.as_slice())))
}

/// [`model_hash`] from dense parameters and whole embedding tables given
/// separately (data-parallel training assembles the tables from the stores).
pub fn hash_parts<'a>(params: &models::params::ParamStore, tables: impl Iterator<Item = (&'a str, &'a [f32])>) -> Result<String> {
    let mut h = Sha256::new();
    for (name, var) in params.iter() {
        h.update(name.as_bytes());
        let v: Vec<f32> = var.as_tensor().to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        for x in v {
            h.update(x.to_le_bytes());
        }
    }
    for (name, data) in tables {
        h.update(name.as_bytes());
        for x in data {
            h.update(x.to_le_bytes());
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
