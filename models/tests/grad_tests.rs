//! Gradient checks in f64 against central finite differences, and the
//! relation-partial seam.

use candle_core::{DType, Device, Tensor, Var};
use graphs::{HetGraph, Sampler};
use models::embedding::EmbeddingTable;
use models::ops::{segment_mean, SegmentCsr};
use models::optim::AdamConfig;
use models::rgcn::PerType;
use models::{Model, ModelKind, ModelSpec};

mod common;
use common::graph;

fn dense_mean(x: &[f64], h: usize, offsets: &[u32], sources: &[u32]) -> Vec<f64> {
    let mut out = vec![0.0; (offsets.len() - 1) * h];
    for d in 0..offsets.len() - 1 {
        let (a, b) = (offsets[d] as usize, offsets[d + 1] as usize);
        for &s in &sources[a..b] {
            for j in 0..h {
                out[d * h + j] += x[s as usize * h + j] / (b - a) as f64;
            }
        }
    }
    out
}

#[test]
fn segment_mean_matches_a_dense_reference_forward_and_backward() {
    let dev = Device::Cpu;
    let offsets = vec![0, 3, 3, 5, 9];
    let sources = vec![0, 2, 2, 1, 4, 0, 1, 2, 3];
    let csr = SegmentCsr::new(5, offsets.clone(), sources.clone());
    let xs: Vec<f64> = (0..15).map(|i| (i as f64 * 0.37).sin()).collect();
    let x = Var::from_tensor(&Tensor::from_vec(xs.clone(), (5, 3), &dev).unwrap()).unwrap();
    let y = segment_mean(x.as_tensor(), &csr).unwrap();
    let want = dense_mean(&xs, 3, &offsets, &sources);
    let got: Vec<f64> = y.flatten_all().unwrap().to_vec1().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-12);
    }
    assert_eq!(&got[3..6], &[0.0, 0.0, 0.0], "empty row is zero");
    // d/dx of sum(w ⊙ y) against finite differences.
    let w = Tensor::from_vec(
        (0..12).map(|i| i as f64 - 5.5).collect::<Vec<_>>(),
        (4, 3),
        &dev,
    )
    .unwrap();
    let loss = (y * &w).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let gx: Vec<f64> = grads
        .get(x.as_tensor())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let wv: Vec<f64> = w.flatten_all().unwrap().to_vec1().unwrap();
    let f = |xs: &[f64]| {
        dense_mean(xs, 3, &offsets, &sources)
            .iter()
            .zip(&wv)
            .map(|(a, b)| a * b)
            .sum::<f64>()
    };
    for i in 0..15 {
        let (mut p, mut m) = (xs.clone(), xs.clone());
        p[i] += 1e-6;
        m[i] -= 1e-6;
        let fd = (f(&p) - f(&m)) / 2e-6;
        assert!(
            (fd - gx[i]).abs() < 1e-6,
            "x[{i}]: analytic {} numeric {fd}",
            gx[i]
        );
    }
    // Second order: the backward op is itself differentiable (its transpose is the forward).
    let gx_t = grads.get(x.as_tensor()).unwrap();
    assert_eq!(gx_t.dims(), &[5, 3]);
}

/// Loss of the model on one batch with the given (variable) inputs.
fn loss(model: &Model, g: &HetGraph, mb: &graphs::MiniBatch, inputs: &PerType) -> Tensor {
    let logits = model.forward(g, mb, inputs.clone(), None).unwrap();
    let (labels, _) = g.target_labels();
    let y: Vec<u32> = mb
        .seeds
        .iter()
        .map(|&s| labels[s as usize] as u32)
        .collect();
    let y = Tensor::from_vec(y, mb.seeds.len(), &Device::Cpu).unwrap();
    candle_nn::loss::cross_entropy(&logits, &y).unwrap()
}

fn check_model_gradients(kind: ModelKind) {
    let g = graph();
    let spec = ModelSpec {
        kind,
        layers: 2,
        hidden: 4,
        embed_dim: 3,
        dropout: 0.0,
        seed: 1,
        heads: 2,
        link: None,
        head: Default::default(),
        task_heads: Vec::new(),
        edge: None,
    };
    let model = Model::new(&spec, &g, DType::F64, &Device::Cpu).unwrap();
    let mb = Sampler::new(&g, &[3, 2], 0)
        .unwrap()
        .sample(0, 0, &[0, 1, 2, 3, 4])
        .unwrap();
    let inputs = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
    let l = loss(&model, &g, &mb, &inputs);
    let grads = l.backward().unwrap();
    let eval =
        |model: &Model, inputs: &PerType| loss(model, &g, &mb, inputs).to_scalar::<f64>().unwrap();
    let eps = 1e-6;
    let mut checked = 0;
    for (name, var) in model.params.iter() {
        let Some(gr) = grads.get(var.as_tensor()) else {
            continue;
        };
        let gr: Vec<f64> = gr.flatten_all().unwrap().to_vec1().unwrap();
        let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        for i in (0..base.len()).step_by(base.len().div_ceil(4)) {
            let shape = var.as_tensor().shape().clone();
            let mut p = base.clone();
            p[i] += eps;
            var.set(&Tensor::from_vec(p, shape.clone(), &Device::Cpu).unwrap())
                .unwrap();
            let lp = eval(&model, &inputs);
            let mut m = base.clone();
            m[i] -= eps;
            var.set(&Tensor::from_vec(m, shape.clone(), &Device::Cpu).unwrap())
                .unwrap();
            let lm = eval(&model, &inputs);
            var.set(&Tensor::from_vec(base.clone(), shape, &Device::Cpu).unwrap())
                .unwrap();
            let fd = (lp - lm) / (2.0 * eps);
            assert!(
                (fd - gr[i]).abs() <= 1e-6 + 1e-5 * fd.abs(),
                "{name}[{i}]: analytic {} numeric {fd}",
                gr[i]
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "checked {checked} entries");
    // The learnable (sparse) embedding rows of the batch.
    let author = g.type_id("author").unwrap().index();
    if let Some(x) = &inputs[author] {
        let gr: Vec<f64> = grads
            .get(x)
            .expect("embedding rows get a gradient")
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let base: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
        for i in 0..base.len().min(9) {
            let perturbed = |d: f64| {
                let mut v = base.clone();
                v[i] += d;
                let mut inp = inputs.clone();
                inp[author] = Some(Tensor::from_vec(v, x.shape(), &Device::Cpu).unwrap());
                eval(&model, &inp)
            };
            let fd = (perturbed(eps) - perturbed(-eps)) / (2.0 * eps);
            assert!(
                (fd - gr[i]).abs() <= 1e-6 + 1e-5 * fd.abs(),
                "embedding[{i}]: analytic {} numeric {fd}",
                gr[i]
            );
        }
    } else {
        assert_eq!(kind, ModelKind::Mlp);
    }
}

#[test]
fn rgcn_gradients_match_finite_differences() {
    check_model_gradients(ModelKind::Rgcn);
}

#[test]
fn rgat_gradients_match_finite_differences() {
    check_model_gradients(ModelKind::Rgat);
}

#[test]
fn hgt_gradients_match_finite_differences() {
    check_model_gradients(ModelKind::Hgt);
}

#[test]
fn mlp_gradients_match_finite_differences() {
    check_model_gradients(ModelKind::Mlp);
}

#[test]
fn a_layer_is_the_sum_of_its_relation_partials() {
    let g = graph();
    let spec = ModelSpec {
        kind: ModelKind::Rgcn,
        layers: 2,
        hidden: 4,
        embed_dim: 3,
        dropout: 0.0,
        seed: 2,
        heads: 2,
        link: None,
        head: Default::default(),
        task_heads: Vec::new(),
        edge: None,
    };
    let model = Model::new(&spec, &g, DType::F64, &Device::Cpu).unwrap();
    let mut store = models::params::ParamStore::new();
    // Layer `index` of width `out_dim` (the spec's 2 heads and seed 2), inputs [5, 3].
    fn args<'a>(
        store: &'a mut models::params::ParamStore,
        (g, spec): (&'a graphs::HetGraph, &'a ModelSpec),
        index: usize,
        out_dim: usize,
        last: bool,
    ) -> models::layer::LayerArgs<'a> {
        models::layer::LayerArgs {
            store,
            g,
            index,
            in_dims: &[5, 3],
            out_dim,
            last,
            spec,
            dtype: DType::F64,
            device: &Device::Cpu,
        }
    }
    let at = (&g, &spec);
    let layers: [Box<dyn models::layer::RelationalLayer>; 4] = [
        Box::new(models::rgcn::RgcnLayer::new(args(&mut store, at, 0, 4, false)).unwrap()),
        Box::new(models::rgat::RgatLayer::new(args(&mut store, at, 1, 4, false)).unwrap()),
        Box::new(models::rgat::RgatLayer::new(args(&mut store, at, 2, 3, true)).unwrap()),
        Box::new(models::hgt::HgtLayer::new(args(&mut store, at, 3, 4, false)).unwrap()),
    ];
    for layer in &layers {
        let mb = Sampler::new(&g, &[4, 3], 0)
            .unwrap()
            .sample(0, 0, &[5, 6, 7])
            .unwrap();
        let h = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
        let block = &mb.blocks[0];
        let all: Vec<graphs::RelationId> = (0..g.relations().len() as u32)
            .map(graphs::RelationId)
            .collect();
        let whole = layer
            .cross_relation(
                block,
                &h,
                layer.relation_partials(&g, block, &all, &h).unwrap(),
            )
            .unwrap();
        // Split the relations across two "workers" and sum their partials.
        let (a, b) = all.split_at(2);
        let pa = layer.relation_partials(&g, block, a, &h).unwrap();
        let pb = layer.relation_partials(&g, block, b, &h).unwrap();
        let summed: PerType = pa
            .into_iter()
            .zip(pb)
            .map(|(x, y)| match (x, y) {
                (Some(x), Some(y)) => Some(layer.combine_partials(&x, &y).unwrap()),
                (x, None) => x,
                (None, y) => y,
            })
            .collect();
        let split = layer.cross_relation(block, &h, summed).unwrap();
        for (w, s) in whole.iter().zip(&split) {
            match (w, s) {
                (Some(w), Some(s)) => {
                    let diff: f64 = (w - s)
                        .unwrap()
                        .abs()
                        .unwrap()
                        .max_all()
                        .unwrap()
                        .to_scalar()
                        .unwrap();
                    assert!(diff < 1e-12, "partials differ by {diff}");
                }
                (None, None) => {}
                _ => panic!("type present in one computation only"),
            }
        }
    }
}

#[test]
fn sparse_adam_is_exact_adam_per_touched_row() {
    let cfg = AdamConfig::with_lr(0.1);
    let mut t = EmbeddingTable::new(0, "embed.x", 4, 2);
    let before = t.data.clone();
    let grads = [[0.5f32, -1.0], [2.0, 0.25]];
    // Row 1 is touched twice, row 3 once; rows 0 and 2 never.
    t.sparse_adam(&[1, 3], &Tensor::new(&grads, &Device::Cpu).unwrap(), &cfg)
        .unwrap();
    t.sparse_adam(
        &[1],
        &Tensor::new(&[[0.5f32, -1.0]], &Device::Cpu).unwrap(),
        &cfg,
    )
    .unwrap();
    assert_eq!(&t.data[0..2], &before[0..2]);
    assert_eq!(&t.data[4..6], &before[4..6]);
    // Reference: dense Adam on one scalar with the same gradient sequence.
    let adam = |x0: f32, gs: &[f32]| {
        let (mut m, mut v, mut x) = (0f64, 0f64, f64::from(x0));
        for (k, &g) in gs.iter().enumerate() {
            let t = k as i32 + 1;
            m = 0.9 * m + 0.1 * f64::from(g);
            v = 0.999 * v + 0.001 * f64::from(g) * f64::from(g);
            x -=
                0.1 * (m / (1.0 - 0.9f64.powi(t))) / ((v / (1.0 - 0.999f64.powi(t))).sqrt() + 1e-8);
        }
        x as f32
    };
    assert!(
        (t.data[2] - adam(before[2], &[0.5, 0.5])).abs() < 1e-5,
        "{} vs {}",
        t.data[2],
        adam(before[2], &[0.5, 0.5])
    );
    assert!((t.data[3] - adam(before[3], &[-1.0, -1.0])).abs() < 1e-5);
    assert!((t.data[6] - adam(before[6], &[2.0])).abs() < 1e-5);
    assert!((t.data[7] - adam(before[7], &[0.25])).abs() < 1e-5);
    assert_eq!(t.steps, vec![0, 2, 0, 1]);
}

#[test]
fn initialisation_depends_only_on_seed_and_name() {
    let g = graph();
    let spec = ModelSpec {
        kind: ModelKind::Rgcn,
        layers: 2,
        hidden: 4,
        embed_dim: 3,
        dropout: 0.5,
        seed: 9,
        heads: 2,
        link: None,
        head: Default::default(),
        task_heads: Vec::new(),
        edge: None,
    };
    let a = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
    let b = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
    let c = Model::new(
        &ModelSpec {
            seed: 10,
            ..spec.clone()
        },
        &g,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let vals = |m: &Model| -> Vec<Vec<f32>> {
        m.params
            .iter()
            .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
            .collect()
    };
    assert_eq!(vals(&a), vals(&b));
    assert_ne!(vals(&a), vals(&c));
    assert!("gat".parse::<ModelKind>().is_err());
    assert!(Model::new(
        &ModelSpec {
            layers: 0,
            ..spec.clone()
        },
        &g,
        DType::F32,
        &Device::Cpu
    )
    .is_err());
    assert!(Model::new(
        &ModelSpec {
            dropout: 1.0,
            ..spec
        },
        &g,
        DType::F32,
        &Device::Cpu
    )
    .is_err());
}

#[test]
fn adam_state_never_holds_the_step_graph() {
    // A moment derived from an undetached gradient would keep every step's
    // forward graph alive through the next step's moment: memory grows without bound.
    let g = graph();
    let spec = ModelSpec {
        kind: ModelKind::Rgcn,
        layers: 2,
        hidden: 4,
        embed_dim: 3,
        dropout: 0.0,
        seed: 1,
        heads: 2,
        link: None,
        head: Default::default(),
        task_heads: Vec::new(),
        edge: None,
    };
    let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
    let mut adam = models::optim::Adam::new(AdamConfig::with_lr(0.01));
    for step in 0..2 {
        let mb = Sampler::new(&g, &[3, 2], 0)
            .unwrap()
            .sample(0, step, &[0, 1, 2, 3])
            .unwrap();
        let inputs = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
        let grads = loss(&model, &g, &mb, &inputs).backward().unwrap();
        adam.step(&model.params, &grads).unwrap();
    }
    assert!(
        adam.moments.len() >= 8,
        "parameters that got gradients have moments"
    );
    for (name, (m, v)) in &adam.moments {
        assert!(
            !m.track_op() && !v.track_op(),
            "moments of {name} reference a computation graph"
        );
    }
}

fn dense_attention(
    vals: &[f64],
    el: &[f64],
    er: &[f64],
    k_n: usize,
    d_n: usize,
    offsets: &[u32],
    sources: &[u32],
) -> Vec<f64> {
    let n_dst = offsets.len() - 1;
    let mut out = vec![0.0; n_dst * k_n * d_n];
    for v in 0..n_dst {
        let srcs = &sources[offsets[v] as usize..offsets[v + 1] as usize];
        for k in 0..k_n {
            let scores: Vec<f64> = srcs
                .iter()
                .map(|&u| {
                    let x = el[u as usize * k_n + k] + er[v * k_n + k];
                    if x > 0.0 {
                        x
                    } else {
                        0.2 * x
                    }
                })
                .collect();
            let z: f64 = scores.iter().map(|s| s.exp()).sum();
            for (i, &u) in srcs.iter().enumerate() {
                for j in 0..d_n {
                    out[(v * k_n + k) * d_n + j] +=
                        scores[i].exp() / z * vals[(u as usize * k_n + k) * d_n + j];
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_a_dense_reference_forward_and_backward() {
    let dev = Device::Cpu;
    let (k_n, d_n, n_src) = (2usize, 3usize, 5usize);
    let offsets = vec![0, 3, 3, 5, 9];
    let sources = vec![0, 2, 2, 1, 4, 0, 1, 2, 3];
    let csr = SegmentCsr::new(n_src, offsets.clone(), sources.clone());
    let vals: Vec<f64> = (0..n_src * k_n * d_n)
        .map(|i| (i as f64 * 0.37).sin())
        .collect();
    let el: Vec<f64> = (0..n_src * k_n).map(|i| (i as f64 * 1.3).cos()).collect();
    let er: Vec<f64> = (0..4 * k_n).map(|i| (i as f64 * 0.7).sin() - 0.3).collect();
    let var = |v: &[f64], shape: &[usize]| {
        Var::from_tensor(&Tensor::from_vec(v.to_vec(), shape, &dev).unwrap()).unwrap()
    };
    let (tv, tl, tr) = (
        var(&vals, &[n_src, k_n, d_n]),
        var(&el, &[n_src, k_n]),
        var(&er, &[4, k_n]),
    );
    let y = models::ops::attention_aggregate(tv.as_tensor(), tl.as_tensor(), tr.as_tensor(), &csr)
        .unwrap();
    let want = dense_attention(&vals, &el, &er, k_n, d_n, &offsets, &sources);
    let got: Vec<f64> = y.flatten_all().unwrap().to_vec1().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
    let w: Vec<f64> = (0..want.len()).map(|i| i as f64 * 0.1 - 1.0).collect();
    let loss = (y * Tensor::from_vec(w.clone(), (4, k_n, d_n), &dev).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    let f = |v: &[f64], l: &[f64], r: &[f64]| {
        dense_attention(v, l, r, k_n, d_n, &offsets, &sources)
            .iter()
            .zip(&w)
            .map(|(a, b)| a * b)
            .sum::<f64>()
    };
    let eps = 1e-6;
    for (which, base, t) in [(0, &vals, &tv), (1, &el, &tl), (2, &er, &tr)] {
        let analytic: Vec<f64> = grads
            .get(t.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for i in 0..base.len() {
            let shift = |d: f64| {
                let mut b = base.clone();
                b[i] += d;
                match which {
                    0 => f(&b, &el, &er),
                    1 => f(&vals, &b, &er),
                    _ => f(&vals, &el, &b),
                }
            };
            let fd = (shift(eps) - shift(-eps)) / (2.0 * eps);
            assert!(
                (fd - analytic[i]).abs() < 1e-6,
                "input {which}[{i}]: analytic {} numeric {fd}",
                analytic[i]
            );
        }
    }
}

#[test]
fn lse_partials_merge_into_the_softmax_over_all_relations() {
    use models::ops::{finish_partial, lse_attention, merge_partials};
    let dev = Device::Cpu;
    let (h_n, dk, dv) = (2usize, 3usize, 2usize);
    // Two relations into the same 4 destinations; destination 1 has no edges in the first.
    let rels = [
        (5usize, vec![0u32, 2, 2, 4, 6], vec![0u32, 1, 3, 4, 1, 2]),
        (3, vec![0, 1, 3, 3, 5], vec![2, 0, 1, 1, 2]),
    ];
    let val = |n: usize, w: usize, salt: f64| -> Vec<f64> {
        (0..n * h_n * w)
            .map(|i| (i as f64 * 0.61 + salt).sin())
            .collect()
    };
    let q = val(4, dk, 0.3);
    let inputs: Vec<(Vec<f64>, Vec<f64>)> = rels
        .iter()
        .enumerate()
        .map(|(r, (n, _, _))| (val(*n, dk, r as f64), val(*n, dv, 2.0 + r as f64)))
        .collect();
    // Dense reference: softmax over the union of both relations' edges.
    let reference = |q: &[f64], ins: &[(Vec<f64>, Vec<f64>)]| -> Vec<f64> {
        let mut out = vec![0.0; 4 * h_n * dv];
        for v in 0..4 {
            for h in 0..h_n {
                let mut scored = Vec::new();
                for (r, (_, off, src)) in rels.iter().enumerate() {
                    for &u in &src[off[v] as usize..off[v + 1] as usize] {
                        let u = u as usize;
                        let e: f64 = (0..dk)
                            .map(|j| q[(v * h_n + h) * dk + j] * ins[r].0[(u * h_n + h) * dk + j])
                            .sum();
                        scored.push((e, r, u));
                    }
                }
                let z: f64 = scored.iter().map(|s| s.0.exp()).sum();
                for (e, r, u) in scored {
                    for j in 0..dv {
                        out[(v * h_n + h) * dv + j] +=
                            e.exp() / z * ins[r].1[(u * h_n + h) * dv + j];
                    }
                }
            }
        }
        out
    };
    let tq = Var::from_tensor(&Tensor::from_vec(q.clone(), (4, h_n, dk), &dev).unwrap()).unwrap();
    let tins: Vec<(Var, Var)> = inputs
        .iter()
        .zip(&rels)
        .map(|((k, v), (n, _, _))| {
            (
                Var::from_tensor(&Tensor::from_vec(k.clone(), (*n, h_n, dk), &dev).unwrap())
                    .unwrap(),
                Var::from_tensor(&Tensor::from_vec(v.clone(), (*n, h_n, dv), &dev).unwrap())
                    .unwrap(),
            )
        })
        .collect();
    let parts: Vec<Tensor> = rels
        .iter()
        .zip(&tins)
        .map(|((n, off, src), (k, v))| {
            lse_attention(
                tq.as_tensor(),
                k.as_tensor(),
                v.as_tensor(),
                &SegmentCsr::new(*n, off.clone(), src.clone()),
            )
            .unwrap()
        })
        .collect();
    let out = finish_partial(&merge_partials(&parts[0], &parts[1]).unwrap()).unwrap();
    let got: Vec<f64> = out.flatten_all().unwrap().to_vec1().unwrap();
    let want = reference(&q, &inputs);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
    // Gradients of a weighted sum against finite differences, for q and every k and value.
    let w: Vec<f64> = (0..want.len()).map(|i| (i as f64 * 0.37).cos()).collect();
    let loss = (out * Tensor::from_vec(w.clone(), (4, h_n, dv), &dev).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    let f = |q: &[f64], ins: &[(Vec<f64>, Vec<f64>)]| {
        reference(q, ins)
            .iter()
            .zip(&w)
            .map(|(a, b)| a * b)
            .sum::<f64>()
    };
    let eps = 1e-6;
    let gq: Vec<f64> = grads
        .get(tq.as_tensor())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    for i in 0..q.len() {
        let mut p = q.clone();
        p[i] += eps;
        let mut m = q.clone();
        m[i] -= eps;
        let fd = (f(&p, &inputs) - f(&m, &inputs)) / (2.0 * eps);
        assert!(
            (fd - gq[i]).abs() < 1e-6,
            "q[{i}]: analytic {} numeric {fd}",
            gq[i]
        );
    }
    for r in 0..2 {
        for (which, t) in [(0, &tins[r].0), (1, &tins[r].1)] {
            let an: Vec<f64> = grads
                .get(t.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for (i, &analytic) in an.iter().enumerate() {
                let shifted = |d: f64| {
                    let mut ins = inputs.clone();
                    if which == 0 {
                        ins[r].0[i] += d
                    } else {
                        ins[r].1[i] += d
                    }
                    f(&q, &ins)
                };
                let fd = (shifted(eps) - shifted(-eps)) / (2.0 * eps);
                assert!(
                    (fd - analytic).abs() < 1e-6,
                    "relation {r} input {which}[{i}]: analytic {analytic} numeric {fd}"
                );
            }
        }
    }
}

/// Bag-of-words paper features: 300 wide, about 3% non-zero.
fn bag_of_words_graph() -> HetGraph {
    let mut r = graphs::rng::CounterRng::new(11);
    let (np, na, dim) = (40u32, 9u32, 300usize);
    let feats: Vec<f32> = (0..np as usize * dim)
        .map(|_| {
            if r.below(100) < 3 {
                1.0 + r.below(4) as f32
            } else {
                0.0
            }
        })
        .collect();
    let mut e = |n_src: u32, n_dst: u32, m: usize| -> (Vec<u32>, Vec<u32>) {
        (0..m)
            .map(|_| (r.below(n_src.into()) as u32, r.below(n_dst.into()) as u32))
            .unzip()
    };
    let (ws, wd) = e(na, np, 60);
    let (cs, cd) = e(np, np, 80);
    let mut g = graphs::GraphBuilder::new("bow", "paper", 3)
        .node_type(
            "paper",
            np,
            Some(graphs::Features::from_vec(np as usize, dim, feats)),
        )
        .node_type("author", na, None)
        .labels(
            (0..np).map(|i| i64::from(i % 3)).collect(),
            graphs::Splits {
                train: (0..30).collect(),
                valid: vec![30, 31],
                test: vec![32, 33],
            },
        )
        .relation("author", "writes", "paper", ws, wd)
        .relation("paper", "cites", "paper", cs, cd)
        .build()
        .unwrap();
    g.add_reverse_relations().unwrap();
    g
}

#[test]
fn a_gather_on_rayon_s_pool_copies_the_rows_one_thread_does() {
    let (n, dim) = (6000u32, 7usize);
    let mut r = graphs::rng::CounterRng::new(9);
    let feats: Vec<f32> = (0..n as usize * dim).map(|_| r.normal() as f32).collect();
    let g = graphs::GraphBuilder::new("wide", "paper", 2)
        .node_type(
            "paper",
            n,
            Some(graphs::Features::from_vec(n as usize, dim, feats)),
        )
        .labels(
            (0..n).map(|i| i64::from(i % 2)).collect(),
            graphs::Splits {
                train: (0..n).collect(),
                valid: vec![],
                test: vec![],
            },
        )
        .relation("paper", "cites", "paper", vec![0, 1], vec![1, 2])
        .build()
        .unwrap();
    let spec = ModelSpec {
        kind: ModelKind::Rgcn,
        layers: 1,
        hidden: 4,
        embed_dim: 4,
        dropout: 0.0,
        seed: 1,
        heads: 1,
        link: None,
        head: Default::default(),
        task_heads: Vec::new(),
        edge: None,
    };
    let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
    // Enough rows for several pool tasks, in no order, with repeats.
    let ids: Vec<u32> = (0..3 * models::model::PARALLEL_ROWS as u32)
        .map(|i| i * 7919 % n)
        .collect();
    let flat = |t: &Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
    let fg = model.feature_gather();
    let rows =
        |fg: &models::model::FeatureGather| flat(&fg.gather_type(&g, 0, &ids).unwrap().unwrap());
    let one = rows(&fg);
    let table = g.node_types()[0].features.as_ref().unwrap();
    let expected: Vec<f32> = ids
        .iter()
        .flat_map(|&i| table.row(i as usize).to_vec())
        .collect();
    assert_eq!(one, expected);
    assert_eq!(rows(&fg.clone().in_parallel()), expected);
    let inputs = model.gather_inputs(&g, std::slice::from_ref(&ids)).unwrap();
    assert_eq!(flat(inputs[0].as_ref().unwrap()), expected);
}

#[test]
fn feature_rows_picked_from_the_tables_nonzeros_give_the_dense_rows_and_the_same_model_output() {
    let g = bag_of_words_graph();
    let table = g.node_types()[0].features.as_ref().unwrap();
    let nz = table.nonzeros().expect("3% of 300 columns is sparse");
    assert_eq!(
        nz.nnz(),
        table.to_vec().iter().filter(|v| **v != 0.0).count()
    );
    let spec = ModelSpec {
        kind: ModelKind::Rgcn,
        layers: 2,
        hidden: 8,
        embed_dim: 4,
        dropout: 0.0,
        seed: 5,
        heads: 2,
        link: None,
        head: Default::default(),
        task_heads: Vec::new(),
        edge: None,
    };
    let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
    let mb = Sampler::new(&g, &[4, 4], 0)
        .unwrap()
        .sample(0, 0, &[0, 1, 2, 3, 4, 5])
        .unwrap();
    let ids = &mb.blocks[0].src[0];
    let fg = model.feature_gather();
    let picked = fg.gather_type(&g, 0, ids).unwrap().unwrap();
    // The host gather copies dense rows and is never taken as sparse.
    let dense = fg.on_host().gather_type(&g, 0, ids).unwrap().unwrap();
    let (a, b): (Vec<f32>, Vec<f32>) = (
        picked.flatten_all().unwrap().to_vec1().unwrap(),
        dense.flatten_all().unwrap().to_vec1().unwrap(),
    );
    assert_eq!(
        a, b,
        "the rows picked from the non-zeros are the table's rows"
    );
    let sp = models::ops::sparse::rows_of(&picked)
        .unwrap()
        .expect("picked rows come with their non-zeros");
    assert_eq!(sp.rows(), ids.len());
    assert_eq!(sp.nnz(), a.iter().filter(|v| **v != 0.0).count());
    // The model's output over the picked rows equals that over a fresh scan of the dense rows, bit for bit.
    let mut with = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
    let out_picked: Vec<f32> = model
        .forward(&g, &mb, with.clone(), None)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    with[0] = Some(dense.copy().unwrap());
    let out_scanned: Vec<f32> = model
        .forward(&g, &mb, with, None)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(out_picked, out_scanned);
}
