//! The bounded batch pipeline (DistDGLv2, ByteGNN): a producer thread samples
//! each batch and gathers its feature rows ahead of the trainer; a bounded
//! channel gives backpressure instead of an unbounded queue. Only immutable
//! data is touched ahead of time: learnable embeddings change every step, so
//! the trainer reads them when it uses the batch. Batches arrive in order,
//! so results are identical to the sequential loop.

use std::sync::mpsc::sync_channel;
use std::time::Instant;

use graphs::{Block, HetGraph, MiniBatch, Sampler};
use models::model::FeatureGather;
use models::rgcn::PerType;

use crate::error::{Result, TrainError};

/// A batch ready for the trainer.
pub struct Prepared {
    /// Step within the epoch.
    pub step: u64,
    /// The sampled blocks.
    pub mb: MiniBatch,
    /// Feature rows of the first block's sources (`None` for embedding types).
    pub features: PerType,
    /// Seconds the producer spent sampling this batch.
    pub sample_s: f64,
    /// Seconds the producer spent gathering its features.
    pub gather_s: f64,
}

/// Samples a mini-batch, or for a features-only model a single block of the seeds.
pub fn sample(sampler: &mut Sampler, uses_neighbors: bool, epoch: u64, step: u64, seeds: &[u32]) -> Result<MiniBatch> {
    if uses_neighbors {
        return Ok(sampler.sample(epoch, step, seeds)?);
    }
    let g = sampler.graph();
    let mut dst = vec![Vec::new(); g.node_types().len()];
    dst[g.target().index()] = seeds.to_vec();
    Ok(MiniBatch { epoch, step, seeds: seeds.to_vec(), blocks: vec![Block { layer: 0, src: dst.clone(), dst, relations: Vec::new() }] })
}

/// How a pipeline samples and gathers.
pub struct Source<'a> {
    /// The graph.
    pub graph: &'a HetGraph,
    /// Fanouts per hop.
    pub fanouts: &'a [usize],
    /// Sampling seed.
    pub seed: u64,
    /// Whether the model reads neighborhoods.
    pub uses_neighbors: bool,
    /// Feature gathering for the model.
    pub gather: FeatureGather,
    /// Batches prepared ahead (channel capacity).
    pub depth: usize,
    /// Feature rows cached on the device, if any.
    pub cache: Option<std::sync::Arc<crate::cache::FeatureCache>>,
}

/// Calls `consume` on every batch of `batches` (epoch `epoch`), in order, with
/// sampling and feature gathering running up to `src.depth` batches ahead.
pub fn run(src: &Source, epoch: u64, batches: &[Vec<u32>], mut consume: impl FnMut(Prepared) -> Result<()>) -> Result<()> {
    std::thread::scope(|s| {
        let (tx, rx) = sync_channel::<Result<Prepared>>(src.depth.max(1));
        s.spawn(move || {
            let mut sampler = match Sampler::new(src.graph, src.fanouts, src.seed) {
                Ok(sm) => sm,
                Err(e) => {
                    let _ = tx.send(Err(e.into()));
                    return;
                }
            };
            for (step, seeds) in batches.iter().enumerate() {
                let prepared = (|| {
                    let t = Instant::now();
                    let mb = sample(&mut sampler, src.uses_neighbors, epoch, step as u64, seeds)?;
                    let sample_s = t.elapsed().as_secs_f64();
                    let t = Instant::now();
                    let features = match &src.cache {
                        Some(c) => c.gather(&src.gather, src.graph, &mb.blocks[0].src, true)?,
                        None => src.gather.gather(src.graph, &mb.blocks[0].src)?,
                    };
                    Ok(Prepared { step: step as u64, mb, features, sample_s, gather_s: t.elapsed().as_secs_f64() })
                })();
                let failed = prepared.is_err();
                // A closed channel means the trainer stopped: stop too.
                if tx.send(prepared).is_err() || failed {
                    return;
                }
            }
        });
        for _ in 0..batches.len() {
            let prepared = rx.recv().map_err(|_| TrainError::Config("the batch pipeline stopped unexpectedly".into()))??;
            consume(prepared)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use graphs::{Features, GraphBuilder, Splits};
    use models::{Model, ModelKind, ModelSpec};

    fn graph() -> HetGraph {
        let n = 50u32;
        let src: Vec<u32> = (0..200).map(|i| (i * 7) % n).collect();
        let dst: Vec<u32> = (0..200).map(|i| (i * 13 + 1) % n).collect();
        GraphBuilder::new("p", "paper", 2)
            .node_type("paper", n, Some(Features::from_vec(n as usize, 2, (0..2 * n).map(|i| i as f32).collect())))
            .labels((0..n).map(|i| i64::from(i % 2)).collect(), Splits { train: (0..n).collect(), valid: vec![], test: vec![] })
            .relation("paper", "cites", "paper", src, dst)
            .build()
            .unwrap()
    }

    #[test]
    fn batches_arrive_in_order_as_the_sequential_sampler_makes_them() {
        let g = graph();
        let spec = ModelSpec { kind: ModelKind::Rgcn, layers: 2, hidden: 4, embed_dim: 2, dropout: 0.0, seed: 0, heads: 1 };
        let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
        let src = Source { graph: &g, fanouts: &[3, 2], seed: 5, uses_neighbors: true, gather: model.feature_gather(), depth: 1, cache: None };
        let batches: Vec<Vec<u32>> = (0..10u32).map(|b| (b * 5..b * 5 + 5).collect()).collect();
        let mut seen = Vec::new();
        run(&src, 3, &batches, |p| {
            seen.push(p.step);
            let want = Sampler::new(&g, &[3, 2], 5).unwrap().sample(3, p.step, &batches[p.step as usize]).unwrap();
            assert_eq!(p.mb, want);
            let f: Vec<f32> = p.features[0].as_ref().unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let rows: Vec<f32> = p.mb.blocks[0].src[0].iter().flat_map(|&i| [2.0 * i as f32, 2.0 * i as f32 + 1.0]).collect();
            assert_eq!(f, rows);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, (0..10).collect::<Vec<u64>>());
    }

    #[test]
    fn errors_on_either_side_stop_the_pipeline_without_hanging() {
        let g = graph();
        let spec = ModelSpec { kind: ModelKind::Rgcn, layers: 1, hidden: 4, embed_dim: 2, dropout: 0.0, seed: 0, heads: 1 };
        let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
        let src = Source { graph: &g, fanouts: &[3], seed: 0, uses_neighbors: true, gather: model.feature_gather(), depth: 1, cache: None };
        // The producer fails on batch 2 (a seed out of range).
        let batches = vec![vec![0, 1], vec![2, 3], vec![4, 99], vec![5, 6]];
        let mut consumed = 0;
        let err = run(&src, 0, &batches, |_| {
            consumed += 1;
            Ok(())
        })
        .unwrap_err();
        assert!(err.to_string().contains("seed 99 is out of range"), "{err}");
        assert_eq!(consumed, 2);
        // The consumer fails on its first batch while the producer is blocked on a full channel.
        let many: Vec<Vec<u32>> = (0..40u32).map(|b| vec![b]).collect();
        let err = run(&src, 0, &many, |_| Err(TrainError::Config("stop".into()))).unwrap_err();
        assert!(err.to_string().contains("stop"));
    }
}
