//! One epoch's steps, as every mode runs them: a producer thread prepares
//! each step's batch (sampling, feature rows) ahead of the step that trains
//! on it, up to [`PREFETCH`] batches ahead (several producer threads where a
//! mode allows, each making every n-th step), and bounded channels give
//! backpressure instead of an unbounded queue (DistDGLv2, ByteGNN). Only
//! immutable data may be touched ahead of time: learnable embeddings change
//! every step, so a mode reads them when it uses the batch. Batches arrive in
//! step order, so results equal those of the sequential loop.

pub mod cpu;
pub mod memory;
pub mod plan;
pub mod preflight;
pub mod run;
pub mod schedule;

use std::sync::mpsc::sync_channel;
use std::time::Instant;

use graphs::{Block, HetGraph, MiniBatch, Sampler};
use models::model::FeatureGather;
use models::rgcn::PerType;

use crate::cache::FeatureCache;

use crate::error::{Result, TrainError};

/// Batches prepared ahead of the step that trains on them.
pub const PREFETCH: usize = 2;

pub use plan::{SamplingPlan, EVAL_SEED, INFERENCE_STEP, PRESAMPLE_SEED};

/// Seeds per evaluation batch.
pub const EVAL_BATCH: usize = 4096;

/// Seconds since `clock`, restarting it (phases are timed end to end).
pub fn lap(clock: &mut Instant) -> f64 {
    let s = clock.elapsed().as_secs_f64();
    *clock = Instant::now();
    s
}

/// A batch sampled, with its feature rows gathered, ahead of its step.
pub struct Prepared {
    /// The sampled blocks.
    pub mb: MiniBatch,
    /// Feature rows of the first block's sources (`None` for embedding types).
    pub features: PerType,
    /// Seconds sampling it.
    pub sample_s: f64,
    /// Seconds gathering its feature rows.
    pub gather_s: f64,
    /// Link prediction: the batch's edges, negatives and seeds.
    pub link: Option<crate::task::link::LinkBatch>,
}

/// Samples a batch with `sample`, then gathers its first block's feature
/// rows (the cached ones from `cached`, counted in its hit rates when
/// `count`), timing both.
pub fn prepare(
    g: &HetGraph,
    gather: &FeatureGather,
    cached: Option<&FeatureCache>,
    count: bool,
    sample: impl FnOnce() -> Result<MiniBatch>,
) -> Result<Prepared> {
    let mut clock = Instant::now();
    let mb = sample()?;
    let sample_s = lap(&mut clock);
    let features = match cached {
        Some(c) => c.gather(gather, g, &mb.blocks[0].src, count)?,
        None => gather.gather(g, &mb.blocks[0].src)?,
    };
    Ok(Prepared {
        mb,
        features,
        sample_s,
        gather_s: lap(&mut clock),
        link: None,
    })
}

/// Samples a mini-batch, or for a features-only model a single block of the seeds.
pub fn sample(
    sampler: &mut Sampler,
    uses_neighbors: bool,
    epoch: u64,
    step: u64,
    seeds: &[u32],
) -> Result<MiniBatch> {
    if uses_neighbors {
        return Ok(sampler.sample(epoch, step, seeds)?);
    }
    let g = sampler.graph();
    let mut dst = vec![Vec::new(); g.node_types().len()];
    dst[g.target().index()] = seeds.to_vec();
    Ok(MiniBatch {
        epoch,
        step,
        seeds: seeds.to_vec(),
        blocks: vec![Block {
            layer: 0,
            src: dst.clone(),
            dst,
            relations: Vec::new(),
        }],
    })
}

/// Runs the steps `skip..` of an epoch whose batches are `batches`, in order:
/// `consume(step, seeds, prepared)` on this thread, with the batches made by
/// `produce(step, seeds)` up to `depth` steps ahead on `workers` threads of
/// their own (at least one), worker `w` making every `workers`-th step from
/// `skip + w`. `make` builds a worker's producer on its thread (a sampler,
/// say). Producers must be pure functions of (step, seeds) for the result to
/// equal the sequential loop's; batches are consumed in step order whatever
/// the workers' pace. The first error on either side stops all, without
/// hanging.
pub fn run_steps<P, F, M>(
    depth: usize,
    workers: usize,
    batches: &[Vec<u32>],
    skip: usize,
    make: M,
    mut consume: impl FnMut(u64, &[u32], P) -> Result<()>,
) -> Result<()>
where
    P: Send,
    F: FnMut(u64, &[u32]) -> Result<P>,
    M: Fn() -> Result<F> + Sync,
{
    let workers = workers.clamp(1, batches.len().saturating_sub(skip).max(1));
    // Each worker's own queue; together about `depth` batches ahead.
    let per_worker = depth.div_ceil(workers).max(1);
    std::thread::scope(|s| {
        let mut queues = Vec::with_capacity(workers);
        for w in 0..workers {
            let (tx, rx) = sync_channel::<Result<P>>(per_worker);
            queues.push(rx);
            let make = &make;
            s.spawn(move || {
                let mut produce = match make() {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                for (step, seeds) in batches.iter().enumerate().skip(skip + w).step_by(workers) {
                    let prepared = produce(step as u64, seeds);
                    let failed = prepared.is_err();
                    // A closed channel means the consumer stopped: stop too.
                    if tx.send(prepared).is_err() || failed {
                        return;
                    }
                }
            });
        }
        for (k, (step, seeds)) in batches.iter().enumerate().skip(skip).enumerate() {
            let prepared = queues[k % workers]
                .recv()
                .map_err(|_| TrainError::PipelineStopped)??;
            consume(step as u64, seeds, prepared)?;
        }
        Ok(())
    })
}

/// Prefetch workers for `training.prefetch_threads` (0: one per four cores, at most four; with a GPU, one per two cores, at most eight).
pub fn prefetch_workers(configured: u32, gpu: bool) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match configured {
        // With the model on a GPU the host's cores have nothing to do but make batches.
        0 if gpu => (cores / 2).clamp(1, 8),
        0 => (cores / 4).clamp(1, 4),
        n => n as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphs::{Features, GraphBuilder, HetGraph, Splits};
    use models::rgcn::PerType;
    use models::{Model, ModelKind, ModelSpec};

    fn graph() -> HetGraph {
        let n = 50u32;
        let src: Vec<u32> = (0..200).map(|i| (i * 7) % n).collect();
        let dst: Vec<u32> = (0..200).map(|i| (i * 13 + 1) % n).collect();
        GraphBuilder::new("p", "paper", 2)
            .node_type(
                "paper",
                n,
                Some(Features::from_vec(
                    n as usize,
                    2,
                    (0..2 * n).map(|i| i as f32).collect(),
                )),
            )
            .labels(
                (0..n).map(|i| i64::from(i % 2)).collect(),
                Splits {
                    train: (0..n).collect(),
                    valid: vec![],
                    test: vec![],
                },
            )
            .relation("paper", "cites", "paper", src, dst)
            .build()
            .unwrap()
    }

    /// A producer of sampled batches with their feature rows.
    type Producer<'a> = Box<dyn FnMut(u64, &[u32]) -> Result<(MiniBatch, PerType)> + 'a>;

    /// A producer as single-process training builds it: sample, then gather features.
    fn producer<'a>(
        g: &'a HetGraph,
        model: &Model,
        fanouts: &'a [usize],
        seed: u64,
        epoch: u64,
    ) -> impl Fn() -> Result<Producer<'a>> + Sync + 'a {
        let gather = model.feature_gather();
        move || {
            let mut sampler = Sampler::new(g, fanouts, seed)?;
            let gather = gather.clone();
            Ok(Box::new(move |step, seeds: &[u32]| {
                let mb = sample(&mut sampler, true, epoch, step, seeds)?;
                let f = gather.gather(g, &mb.blocks[0].src)?;
                Ok((mb, f))
            }) as Producer<'a>)
        }
    }

    fn model(g: &HetGraph, layers: usize) -> Model {
        let spec = ModelSpec {
            kind: ModelKind::Rgcn,
            layers,
            hidden: 4,
            embed_dim: 2,
            dropout: 0.0,
            seed: 0,
            heads: 1,
            link: None,
            head: Default::default(),
            task_heads: Vec::new(),
            edge: None,
        };
        Model::new(&spec, g, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap()
    }

    #[test]
    fn batches_arrive_in_order_as_the_sequential_sampler_makes_them() {
        let g = graph();
        let m = model(&g, 2);
        let batches: Vec<Vec<u32>> = (0..10u32).map(|b| (b * 5..b * 5 + 5).collect()).collect();
        // One worker, several (each making every n-th step), more than the steps left.
        for workers in [1, 3, 20] {
            let mut seen = Vec::new();
            run_steps(
                2,
                workers,
                &batches,
                3,
                producer(&g, &m, &[3, 2], 5, 3),
                |step, seeds, (mb, features)| {
                    seen.push(step);
                    assert_eq!(seeds, batches[step as usize].as_slice());
                    let want = Sampler::new(&g, &[3, 2], 5)
                        .unwrap()
                        .sample(3, step, &batches[step as usize])
                        .unwrap();
                    assert_eq!(mb, want);
                    let f: Vec<f32> = features[0]
                        .as_ref()
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap();
                    let rows: Vec<f32> = mb.blocks[0].src[0]
                        .iter()
                        .flat_map(|&i| [2.0 * i as f32, 2.0 * i as f32 + 1.0])
                        .collect();
                    assert_eq!(f, rows);
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(
                seen,
                (3..10).collect::<Vec<u64>>(),
                "{workers} workers: the steps before `skip` are not run, the rest in order"
            );
        }
    }

    #[test]
    fn a_failing_worker_stops_the_others_after_the_steps_before_its_failure() {
        let g = graph();
        let m = model(&g, 1);
        // Batch 5 fails (a seed out of range); with 3 workers steps 0..5 still arrive, in order.
        let mut batches: Vec<Vec<u32>> = (0..30u32).map(|b| vec![b]).collect();
        batches[5] = vec![99];
        let mut seen = Vec::new();
        let err = run_steps(
            2,
            3,
            &batches,
            0,
            producer(&g, &m, &[3], 0, 0),
            |step, _, _| {
                seen.push(step);
                Ok(())
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("seed 99 is out of range"), "{err}");
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        // The consumer fails while every worker is blocked on a full queue.
        let err = run_steps(
            2,
            3,
            &batches,
            0,
            producer(&g, &m, &[3], 0, 0),
            |_, _, _| Err(TrainError::Config("stop".into())),
        )
        .unwrap_err();
        assert!(err.to_string().contains("stop"));
    }

    #[test]
    fn errors_on_either_side_stop_the_pipeline_without_hanging() {
        let g = graph();
        let m = model(&g, 1);
        // The producer fails on batch 2 (a seed out of range).
        let batches = vec![vec![0, 1], vec![2, 3], vec![4, 99], vec![5, 6]];
        let mut consumed = 0;
        let err = run_steps(
            1,
            1,
            &batches,
            0,
            producer(&g, &m, &[3], 0, 0),
            |_, _, _| {
                consumed += 1;
                Ok(())
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("seed 99 is out of range"), "{err}");
        assert_eq!(consumed, 2);
        // The consumer fails on its first batch while the producer is blocked on a full channel.
        let many: Vec<Vec<u32>> = (0..40u32).map(|b| vec![b]).collect();
        let err = run_steps(1, 1, &many, 0, producer(&g, &m, &[3], 0, 0), |_, _, _| {
            Err(TrainError::Config("stop".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("stop"));
        // A producer that cannot be built says why.
        let err = run_steps(
            1,
            1,
            &many,
            0,
            || Err::<fn(u64, &[u32]) -> Result<()>, _>(TrainError::Config("no sampler".into())),
            |_, _, _: ()| Ok(()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("no sampler"), "{err}");
    }
}
