#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;
use candle_core::{DType, Device, Tensor};
use graphs::{load, LoadOptions, Sampler};
use models::{Model, ModelKind, ModelSpec};
fn main() {
    let g = load(std::path::Path::new("target/bench-data/mag-s0.05-seed0"), &LoadOptions { mmap_features: true, reverse_edges: true }).unwrap();
    let spec = ModelSpec { kind: ModelKind::Rgcn, layers: 2, hidden: 64, embed_dim: 64, dropout: 0.5, seed: 0 };
    let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
    let (labels, splits) = g.target_labels();
    let seeds: Vec<u32> = splits.train[..1024].to_vec();
    let mut s = Sampler::new(&g, &[25, 20], 0).unwrap();
    for step in 0..12 {
        let t = Instant::now();
        let mb = s.sample(0, step, &seeds).unwrap();
        let inputs = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
        let t1 = t.elapsed();
        let logits = model.forward(&g, &mb, inputs, Some(models::model::DropoutKey { epoch: 0, step })).unwrap();
        let y = Tensor::from_vec(seeds.iter().map(|&x| labels[x as usize] as u32).collect::<Vec<_>>(), 1024, &Device::Cpu).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
        let t2 = t.elapsed();
        let grads = loss.backward().unwrap();
        let t3 = t.elapsed();
        drop(grads);
        eprintln!("sample+gather {:?} forward {:?} backward {:?}", t1, t2 - t1, t3 - t2);
    }
}
