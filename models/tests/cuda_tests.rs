//! On a CUDA device every model gives the CPU device's loss and gradients
//! (f32, same seed, same batch). Built only with `--features cuda`; where no
//! GPU can be opened the test says so and checks nothing.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use graphs::Sampler;
use models::{Model, ModelKind, ModelSpec};

mod common;
use common::graph;

/// Loss and per-parameter gradients (host vectors) of one batch on `device`.
fn run(kind: ModelKind, device: &Device) -> (f32, Vec<(String, Vec<f32>)>) {
    let g = graph();
    let spec = ModelSpec { kind, layers: 2, hidden: 8, embed_dim: 4, dropout: 0.0, seed: 1, heads: 2 };
    let model = Model::new(&spec, &g, DType::F32, device).unwrap();
    let mb = Sampler::new(&g, &[3, 2], 0).unwrap().sample(0, 0, &[0, 1, 2, 3, 4]).unwrap();
    let inputs = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
    let logits = model.forward(&g, &mb, inputs, None).unwrap();
    let (labels, _) = g.target_labels();
    let y: Vec<u32> = mb.seeds.iter().map(|&s| labels[s as usize] as u32).collect();
    let y = Tensor::from_vec(y, mb.seeds.len(), device).unwrap();
    let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
    let grads = loss.backward().unwrap();
    let mut out = Vec::new();
    for (name, var) in model.params.iter() {
        if let Some(gr) = grads.get(var.as_tensor()) {
            out.push((name.to_string(), gr.flatten_all().unwrap().to_vec1::<f32>().unwrap()));
        }
    }
    (loss.to_scalar::<f32>().unwrap(), out)
}

#[test]
fn every_model_matches_the_cpu_on_cuda() {
    let gpu = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            return;
        }
    };
    for kind in [ModelKind::Rgcn, ModelKind::Rgat, ModelKind::Hgt, ModelKind::Mlp] {
        let (lc, gc) = run(kind, &Device::Cpu);
        let (lg, gg) = run(kind, &gpu);
        assert!((lc - lg).abs() <= 1e-4 * lc.abs().max(1.0), "{kind:?}: loss {lc} on the CPU, {lg} on the GPU");
        assert_eq!(gc.len(), gg.len(), "{kind:?}: parameters with gradients");
        assert!(gc.len() >= 2, "{kind:?}: gradients reached the parameters");
        for ((name, a), (gpu_name, b)) in gc.iter().zip(&gg) {
            assert_eq!(name, gpu_name, "{kind:?}: the same parameters in the same order");
            let scale = a.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(worst <= 1e-3 * scale, "{kind:?} {name}: gradients differ by {worst} (scale {scale})");
        }
    }
}
