//! Exact offline inference equals the model on mini-batches that sample
//! every neighbour: layer by layer over all nodes, every relational model.

use candle_core::{DType, Device};
use graphs::{LoadOptions, Sampler};
use models::inference::{embed_all, embedding_layers};
use models::{Model, ModelKind, ModelSpec};

#[test]
fn layerwise_inference_equals_full_neighbourhood_minibatches() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("g");
    graphs::generate::generate(graphs::generate::Like::Mag, 0.002, 0, &dir, false, &mut graphs::NoProgress).unwrap();
    let g = graphs::load(&dir, &LoadOptions { mmap_features: true, reverse_edges: true }).unwrap();
    for (kind, layers) in [(ModelKind::Rgcn, 2), (ModelKind::Rgcn, 3), (ModelKind::Rgat, 2), (ModelKind::Hgt, 2)] {
        let spec = ModelSpec { kind, layers, hidden: 16, embed_dim: 8, dropout: 0.5, seed: 3, heads: 2, link: None };
        let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
        let mut calls = 0;
        let rows = embed_all(&model, &g, 97, |_, _, _| calls += 1).unwrap();
        assert!(calls > 0);
        let t = g.target().index();
        let target = rows[t].as_ref().expect("target rows");
        assert_eq!(target.data.len(), g.node_types()[t].count as usize * target.width);
        // Every node of every type the model reads has a row.
        for (nt, r) in g.node_types().iter().zip(&rows) {
            assert_eq!(r.as_ref().map(|r| r.data.len() / r.width), Some(nt.count as usize), "{kind:?}: {}", nt.name);
        }
        // The same nodes through the model with every neighbour sampled (fanouts past any degree).
        let fanouts = vec![1 << 30; layers];
        let mut sampler = Sampler::new(&g, &fanouts, 0).unwrap();
        let seeds: Vec<u32> = (0..g.node_types()[t].count).step_by(7).take(300).collect();
        let mb = sampler.sample(0, 0, &seeds).unwrap();
        let inputs = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
        let (_, emb) = model.forward_with_embeddings(&g, &mb, inputs, None).unwrap();
        let emb: Vec<f32> = emb.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(emb.len(), seeds.len() * target.width, "{kind:?} {layers}: {} layer(s) embed", embedding_layers(&model).unwrap());
        let mut worst = 0f32;
        for (i, &v) in seeds.iter().enumerate() {
            for j in 0..target.width {
                let (a, b) = (emb[i * target.width + j], target.data[v as usize * target.width + j]);
                worst = worst.max((a - b).abs() / a.abs().max(1.0));
            }
        }
        assert!(worst < 1e-5, "{kind:?} {layers} layers: largest relative difference {worst}");
    }
}
