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
use models::rgcn::PerType;
use models::Model;

use crate::config::Config;
use crate::epoch::{lap, run_steps, sample, EVAL_BATCH, EVAL_SEED, PREFETCH};
use crate::error::{Result, TrainError};
use crate::observer::TrainObserver;
use crate::report::{EpochReport, Report};

/// A batch sampled, with its feature rows gathered, ahead of its step.
struct Prepared {
    mb: graphs::MiniBatch,
    /// Feature rows of the first block's sources (`None` for embedding types).
    features: PerType,
    sample_s: f64,
    gather_s: f64,
}

/// Single-process training: the graph in `training.data`, one model, one optimiser.
pub struct Single;

impl crate::modes::TrainingMode for Single {
    fn train_embedded(&self, cfg: &Config, observer: &mut dyn TrainObserver) -> Result<(Report, Model)> {
        train(cfg, observer)
    }

    /// A node of a cluster with nothing to train: it serves the runtime
    /// (`hetgnn doctor` asks it) until Ctrl-C or SIGTERM.
    fn run_node(&self, cfg: &Config, id: &str, _observer: &mut dyn TrainObserver) -> Result<Option<Report>> {
        crate::cluster::run_node(cfg, id, crate::cluster::stop_signal())?;
        Ok(None)
    }
}

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
        crate::cache::build_local(t, &g, &model, &splits.train, |e, s, b| sample(&mut presampler, uses_neighbors, e, s, b))?
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
        let (gather, cached, uses_neighbors) = (model.feature_gather(), cache.as_ref().map(|c| c.features.clone()), model.uses_neighbors());
        let graph = &g;
        let produce = move || {
            let mut sampler = Sampler::new(graph, &t.fanouts, t.seed)?;
            Ok(move |step: u64, seeds: &[u32]| -> Result<Prepared> {
                let mut clock = Instant::now();
                let mb = sample(&mut sampler, uses_neighbors, epoch, step, seeds)?;
                let sample_s = lap(&mut clock);
                let features = match &cached {
                    Some(c) => c.gather(&gather, graph, &mb.blocks[0].src, true)?,
                    None => gather.gather(graph, &mb.blocks[0].src)?,
                };
                Ok(Prepared { mb, features, sample_s, gather_s: lap(&mut clock) })
            })
        };
        run_steps(PREFETCH, &batches, 0, produce, |step, _, p| {
            let mb = &p.mb;
            let seeds = &mb.seeds;
            er.time.sample_s += p.sample_s;
            er.time.gather_s += p.gather_s;
            let mut clock = Instant::now();
            let mut inputs = p.features;
            match &cache {
                Some(c) => c.gather_embeddings(&model, &mb.blocks[0].src, &mut inputs, true)?,
                None => model.gather_embeddings(&mb.blocks[0].src, &mut inputs)?,
            }
            let y = targets(labels, seeds, &device)?;
            er.time.gather_s += lap(&mut clock);
            let logits = model.forward(&g, mb, inputs.clone(), Some(DropoutKey { epoch, step }))?;
            let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
            let grads = loss.backward()?;
            er.time.compute_s += lap(&mut clock);
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
            er.time.update_s += lap(&mut clock);
            let l = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            loss_sum += l;
            correct += count_correct(&logits, labels, seeds)?;
            seen += seeds.len();
            report.steps += 1;
            observer.step(l);
            Ok(())
        })?;
        er.time.seconds = epoch_start.elapsed().as_secs_f64();
        // Evaluation and checkpoints read the tables: bring the cached rows home.
        if let Some(c) = &cache {
            c.write_back(&mut model)?;
        }
        er.loss = loss_sum / batches.len().max(1) as f64;
        er.train_acc = correct as f64 / seen.max(1) as f64;
        let eval_start = Instant::now();
        er.valid_acc = evaluate(&g, &model, &mut eval_sampler, epoch, &splits.valid)?;
        er.test_acc = evaluate(&g, &model, &mut eval_sampler, epoch, &splits.test)?;
        er.time.eval_s = eval_start.elapsed().as_secs_f64();
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
    crate::report::finish(&mut report, &model)?;
    Ok((report, model))
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
        let mb = sample(sampler, model.uses_neighbors(), epoch, step as u64, seeds)?;
        let inputs = model.gather_inputs(g, &mb.blocks[0].src)?;
        let logits = model.forward(g, &mb, inputs, None)?.detach();
        correct += count_correct(&logits, labels, seeds)?;
    }
    Ok(correct as f64 / nodes.len() as f64)
}
