//! On a CUDA device every model gives the CPU device's loss and gradients
//! (f32, same seed, same batch), and the custom ops with native kernels give
//! the CPU's bits. Built only with `--features cuda`; where no GPU can be
//! opened the tests say so and check nothing.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor, Var};
use graphs::Sampler;
use models::{Model, ModelKind, ModelSpec};

mod common;
use common::graph;

/// Loss and per-parameter gradients (host vectors) of one batch on `device`.
fn run(kind: ModelKind, device: &Device) -> (f32, Vec<(String, Vec<f32>)>) {
    let g = graph();
    let spec = ModelSpec {
        kind,
        layers: 2,
        hidden: 8,
        embed_dim: 4,
        dropout: 0.0,
        seed: 1,
        heads: 2,
        link: None,
        head: Default::default(),
        task_heads: Vec::new(),
        edge: None,
    };
    let model = Model::new(&spec, &g, DType::F32, device).unwrap();
    let mb = Sampler::new(&g, &[3, 2], 0)
        .unwrap()
        .sample(0, 0, &[0, 1, 2, 3, 4])
        .unwrap();
    let inputs = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
    let logits = model.forward(&g, &mb, inputs, None).unwrap();
    let (labels, _) = g.target_labels();
    let y: Vec<u32> = mb
        .seeds
        .iter()
        .map(|&s| labels[s as usize] as u32)
        .collect();
    let y = Tensor::from_vec(y, mb.seeds.len(), device).unwrap();
    let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
    let grads = loss.backward().unwrap();
    let mut out = Vec::new();
    for (name, var) in model.params.iter() {
        if let Some(gr) = grads.get(var.as_tensor()) {
            out.push((
                name.to_string(),
                gr.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            ));
        }
    }
    (loss.to_scalar::<f32>().unwrap(), out)
}

/// cuda:0, or `None` (the test checks nothing) where there is none, unless
/// `HETGNN_REQUIRE_GPU` is set (scripts/gpu-figures.sh sets it): then a
/// missing device or driver fails the test instead of passing it unchecked.
fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var_os("HETGNN_REQUIRE_GPU").is_some() => {
            panic!("HETGNN_REQUIRE_GPU is set but cuda:0 cannot be opened: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// Values and the gradient of `sum(out * w)` with respect to `x`, for an op applied to `x`.
fn value_and_grad(
    x: &[f64],
    shape: (usize, usize),
    dtype: DType,
    dev: &Device,
    op: impl Fn(&Tensor) -> Tensor,
) -> (Vec<f64>, Vec<f64>) {
    let x = Var::from_tensor(
        &Tensor::from_vec(x.to_vec(), shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .to_device(dev)
            .unwrap(),
    )
    .unwrap();
    let out = op(x.as_tensor());
    let n = out.elem_count();
    let w = Tensor::from_vec(
        (0..n)
            .map(|i| ((i * 13 % 29) as f64 - 14.0) / 3.0)
            .collect::<Vec<_>>(),
        out.shape(),
        &Device::Cpu,
    )
    .unwrap();
    let w = w.to_dtype(dtype).unwrap().to_device(dev).unwrap();
    let grad = (&out * &w)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap()
        .get(&x)
        .unwrap()
        .clone();
    let host = |t: &Tensor| {
        t.flatten_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    };
    (host(&out), host(&grad))
}

/// Bits equal, zeros' signs aside.
fn same_bits(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x + 0.0).to_bits() == (y + 0.0).to_bits())
}

/// An op under test, applied to its input.
type Op<'a> = Box<dyn Fn(&Tensor) -> Tensor + 'a>;

#[test]
fn native_ops_give_the_cpu_bits_on_cuda() {
    let Some(gpu) = gpu() else { return };
    let (n_src, n_dst, h) = (500, 300, 70);
    let offsets: Vec<u32> = (0..=n_dst as u32)
        .map(|d| d * (d % 7) / 2)
        .scan(0, |acc, k| {
            *acc = (*acc).max(k);
            Some(*acc)
        })
        .collect();
    let e = *offsets.last().unwrap() as usize;
    let sources: Vec<u32> = (0..e as u32)
        .map(|i| (i * 2_654_435_761u32) % n_src as u32)
        .collect();
    let csr = models::ops::SegmentCsr::new(n_src, offsets, sources);
    let x: Vec<f64> = (0..n_src * h)
        .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0)
        .collect();
    let ids: Vec<u32> = (0..n_src as u32).map(|i| i * 3 + 1).collect();
    let bias = Tensor::from_vec(
        (0..h).map(|j| j as f64 / 10.0 - 3.0).collect::<Vec<_>>(),
        h,
        &Device::Cpu,
    )
    .unwrap();
    for dtype in [DType::F32, DType::F64] {
        let ops: Vec<(&str, Op)> = vec![
            (
                "segment-mean",
                Box::new(|t: &Tensor| models::ops::segment_mean(t, &csr).unwrap()),
            ),
            (
                "relu-dropout",
                Box::new(|t: &Tensor| models::ops::dropout(t, true, 17, 0.5, &ids).unwrap()),
            ),
            (
                "dropout",
                Box::new(|t: &Tensor| models::ops::dropout(t, false, 17, 0.3, &ids).unwrap()),
            ),
            (
                "add-bias",
                Box::new(|t: &Tensor| {
                    let b = Var::from_tensor(
                        &bias.to_dtype(dtype).unwrap().to_device(t.device()).unwrap(),
                    )
                    .unwrap();
                    models::ops::add_bias(t, b.as_tensor()).unwrap()
                }),
            ),
        ];
        for (name, op) in &ops {
            let (vc, gc) = value_and_grad(&x, (n_src, h), dtype, &Device::Cpu, op);
            let (vg, gg) = value_and_grad(&x, (n_src, h), dtype, &gpu, op);
            assert!(
                same_bits(&vc, &vg),
                "{name} {dtype:?}: forward differs from the CPU"
            );
            assert!(
                same_bits(&gc, &gg),
                "{name} {dtype:?}: backward differs from the CPU"
            );
        }
        // The bias's own gradient: column sums.
        let g = Tensor::from_vec(x.clone(), (n_src, h), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let sums = |dev: &Device| {
            let b =
                Var::from_tensor(&bias.to_dtype(dtype).unwrap().to_device(dev).unwrap()).unwrap();
            let out = models::ops::add_bias(&g.to_device(dev).unwrap(), b.as_tensor()).unwrap();
            let gb = (out * g.to_device(dev).unwrap())
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap()
                .get(&b)
                .unwrap()
                .clone();
            gb.to_dtype(DType::F64)
                .unwrap()
                .to_device(&Device::Cpu)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        assert!(
            same_bits(&sums(&Device::Cpu), &sums(&gpu)),
            "column sums {dtype:?} differ from the CPU"
        );
    }
}

/// Attention: exp may differ from the CPU's in its last bit, so values and all
/// three gradients are compared with a tolerance of a few ulps of the f64 result.
#[test]
fn native_attention_matches_the_cpu_on_cuda() {
    let Some(gpu) = gpu() else { return };
    let (n_src, n_dst, heads, width) = (400, 250, 3, 20);
    // Degrees 0 to 6, one destination in seven with no sources.
    let offsets: Vec<u32> = std::iter::once(0)
        .chain((0..n_dst as u32).scan(0, |end, d| {
            *end += d * 3 % 7;
            Some(*end)
        }))
        .collect();
    let e = *offsets.last().unwrap() as usize;
    let sources: Vec<u32> = (0..e as u32)
        .map(|i| (i * 2_654_435_761u32) % n_src as u32)
        .collect();
    let csr = models::ops::SegmentCsr::new(n_src, offsets, sources);
    let data = |n: usize, m: usize| -> Vec<f64> {
        (0..n)
            .map(|i| ((i * m % 97) as f64 - 48.0) / 31.0)
            .collect()
    };
    let run = |dtype: DType, dev: &Device| -> Vec<Vec<f64>> {
        let var = |v: Vec<f64>, shape: &[usize]| {
            Var::from_tensor(
                &Tensor::from_vec(v, shape, &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .to_device(dev)
                    .unwrap(),
            )
            .unwrap()
        };
        let values = var(data(n_src * heads * width, 37), &[n_src, heads, width]);
        let el = var(data(n_src * heads, 13), &[n_src, heads]);
        let er = var(data(n_dst * heads, 17), &[n_dst, heads]);
        let out = models::ops::attention_aggregate(
            values.as_tensor(),
            el.as_tensor(),
            er.as_tensor(),
            &csr,
        )
        .unwrap();
        let w = Tensor::from_vec(data(out.elem_count(), 7), out.shape(), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .to_device(dev)
            .unwrap();
        let grads = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let host = |t: &Tensor| {
            t.flatten_all()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_device(&Device::Cpu)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        vec![
            host(&out),
            host(grads.get(&values).unwrap()),
            host(grads.get(&el).unwrap()),
            host(grads.get(&er).unwrap()),
        ]
    };
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
        let (c, g) = (run(dtype, &Device::Cpu), run(dtype, &gpu));
        for (what, (a, b)) in ["values", "d values", "d el", "d er"]
            .iter()
            .zip(c.iter().zip(&g))
        {
            assert_eq!(a.len(), b.len(), "{what} {dtype:?}");
            let scale = a.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
            let worst = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                worst <= tol * scale,
                "attention {what} {dtype:?}: differs from the CPU by {worst} (scale {scale})"
            );
        }
    }
}

/// Log-sum-exp attention partials (HGT, raf): the packed partial and all
/// three gradients, with the same tolerance as attention.
#[test]
fn native_lse_attention_matches_the_cpu_on_cuda() {
    let Some(gpu) = gpu() else { return };
    let (n_src, n_dst, heads, dk, dv) = (300, 200, 2, 8, 12);
    let offsets: Vec<u32> = std::iter::once(0)
        .chain((0..n_dst as u32).scan(0, |end, d| {
            *end += d * 5 % 9;
            Some(*end)
        }))
        .collect();
    let e = *offsets.last().unwrap() as usize;
    let sources: Vec<u32> = (0..e as u32)
        .map(|i| (i * 2_654_435_761u32) % n_src as u32)
        .collect();
    let csr = models::ops::SegmentCsr::new(n_src, offsets, sources);
    let data = |n: usize, m: usize| -> Vec<f64> {
        (0..n)
            .map(|i| ((i * m % 89) as f64 - 44.0) / 40.0)
            .collect()
    };
    let run = |dtype: DType, dev: &Device| -> Vec<Vec<f64>> {
        let var = |v: Vec<f64>, shape: &[usize]| {
            Var::from_tensor(
                &Tensor::from_vec(v, shape, &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .to_device(dev)
                    .unwrap(),
            )
            .unwrap()
        };
        let q = var(data(n_dst * heads * dk, 31), &[n_dst, heads, dk]);
        let k = var(data(n_src * heads * dk, 23), &[n_src, heads, dk]);
        let values = var(data(n_src * heads * dv, 11), &[n_src, heads, dv]);
        let out =
            models::ops::lse_attention(q.as_tensor(), k.as_tensor(), values.as_tensor(), &csr)
                .unwrap();
        let w = Tensor::from_vec(data(out.elem_count(), 7), out.shape(), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .to_device(dev)
            .unwrap();
        let grads = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let host = |t: &Tensor| {
            t.flatten_all()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_device(&Device::Cpu)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        };
        vec![
            host(&out),
            host(grads.get(&q).unwrap()),
            host(grads.get(&k).unwrap()),
            host(grads.get(&values).unwrap()),
        ]
    };
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
        let (c, g) = (run(dtype, &Device::Cpu), run(dtype, &gpu));
        for (what, (a, b)) in ["partial", "d q", "d k", "d values"]
            .iter()
            .zip(c.iter().zip(&g))
        {
            assert_eq!(a.len(), b.len(), "{what} {dtype:?}");
            // The scale leaves out the empty rows' max (EMPTY_MAX), which must match exactly.
            let scale = a
                .iter()
                .filter(|x| x.abs() < 1e29)
                .fold(1e-30f64, |m, x| m.max(x.abs()));
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= tol * scale.max(x.abs()), "lse-attention {what} {dtype:?}: {y} on the GPU, {x} on the CPU (scale {scale})");
            }
        }
    }
}

#[test]
fn every_model_matches_the_cpu_on_cuda() {
    let Some(gpu) = gpu() else { return };
    for kind in [
        ModelKind::Rgcn,
        ModelKind::Rgat,
        ModelKind::Hgt,
        ModelKind::Mlp,
    ] {
        let (lc, gc) = run(kind, &Device::Cpu);
        let (lg, gg) = run(kind, &gpu);
        assert!(
            (lc - lg).abs() <= 1e-4 * lc.abs().max(1.0),
            "{kind:?}: loss {lc} on the CPU, {lg} on the GPU"
        );
        assert_eq!(gc.len(), gg.len(), "{kind:?}: parameters with gradients");
        assert!(gc.len() >= 2, "{kind:?}: gradients reached the parameters");
        for ((name, a), (gpu_name, b)) in gc.iter().zip(&gg) {
            assert_eq!(
                name, gpu_name,
                "{kind:?}: the same parameters in the same order"
            );
            let scale = a.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                worst <= 1e-3 * scale,
                "{kind:?} {name}: gradients differ by {worst} (scale {scale})"
            );
        }
    }
}

/// The in-place sparse Adam on rows in device memory gives the host table's
/// bits, and a segment CSR whose last holder is another thread frees its
/// device arrays there without breaking the device's next call.
#[test]
fn sparse_adam_in_place_gives_the_host_tables_bits_on_cuda() {
    use models::embedding::EmbeddingTable;
    use models::optim::AdamConfig;
    let Some(dev) = gpu() else { return };
    let cfg = AdamConfig::with_lr(0.05);
    let (rows, dim) = (300usize, 64usize);
    let mut host = EmbeddingTable::new(5, "embed.x", rows, dim);
    let on = |v: &[f32]| Tensor::from_slice(v, (rows, dim), &dev).unwrap();
    let (d, m, v) = (on(&host.data), on(&host.m), on(&host.v));
    // Step counts on the device, bumped by the kernels; corrections by count (counts reach 3).
    let steps = Tensor::zeros(rows, DType::U32, &dev).unwrap();
    let bc: Vec<f64> = (0..4u32)
        .flat_map(|t| <[f64; 2]>::from(cfg.bias_corrections(t)))
        .collect();
    let table = Tensor::from_vec(bc, (4, 2), &dev).unwrap();
    for step in 0..3u32 {
        let ids: Vec<u32> = (0..rows as u32)
            .map(|i| (i * 7 + step * 11) % rows as u32)
            .filter(|i| (i + step) % 4 != 0)
            .collect();
        let g: Vec<f32> = (0..ids.len() * dim)
            .map(|k| ((k as u32 * 2_654_435_761u32.wrapping_add(step)) >> 20) as f32 / 2048.0 - 1.0)
            .collect();
        host.adam_rows(&ids, &g, &cfg).unwrap();
        let gt = Tensor::from_slice(&g, (ids.len(), dim), &dev).unwrap();
        assert!(
            models::ops::adam_rows_in_place(&d, &m, &v, &steps, &ids, &gt, &table, &cfg).unwrap()
        );
    }
    let back = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(back(&d), host.data, "values");
    assert_eq!(
        (back(&m), back(&v)),
        (host.m.clone(), host.v.clone()),
        "moments"
    );
    assert_eq!(steps.to_vec1::<u32>().unwrap(), host.steps, "step counts");
    let g1 = Tensor::zeros((1, dim), DType::F32, &dev).unwrap();
    assert!(
        models::ops::adam_rows_in_place(&d, &m, &v, &steps, &[rows as u32], &g1, &table, &cfg)
            .is_err(),
        "a row out of range"
    );
    // Rows picked on the device (16-byte vectors, and a view whose offset rules them out).
    let want: Vec<f32> = [7usize, 0, 299, 7]
        .iter()
        .flat_map(|&i| host.data[i * dim..(i + 1) * dim].to_vec())
        .collect();
    assert_eq!(
        back(&models::ops::take_rows(&d, &[7, 0, 299, 7]).unwrap()),
        want,
        "take_rows"
    );
    let view = d
        .flatten_all()
        .unwrap()
        .narrow(0, 1, 299 * dim)
        .unwrap()
        .reshape((299, dim))
        .unwrap();
    assert_eq!(
        back(&models::ops::take_rows(&view, &[0]).unwrap()),
        host.data[1..1 + dim].to_vec(),
        "take_rows of an unaligned view"
    );
    // A CSR used on the device, then dropped last on another thread.
    let csr = models::ops::SegmentCsr::new(3, vec![0, 2, 3], vec![0, 2, 1]);
    let x = Var::from_tensor(&Tensor::ones((3, 4), DType::F32, &dev).unwrap()).unwrap();
    let y = models::ops::segment_mean(x.as_tensor(), &csr).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    drop(y);
    std::thread::spawn(move || drop(csr)).join().unwrap();
    assert_eq!(
        Tensor::ones(4, DType::F32, &dev)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        4.0,
        "the device works after a free on another thread"
    );
}

#[test]
fn device_sampling_gives_the_cpu_samplers_batches() {
    let Some(dev) = gpu() else { return };
    // A graph with rows longer than the fanouts, so draws are made.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("g");
    let like = graphs::generate::Like::Mag;
    graphs::generate::generate(like, 0.003, 0, &dir, false, &mut graphs::NoProgress).unwrap();
    let opts = graphs::LoadOptions {
        mmap_features: true,
        reverse_edges: true,
    };
    let g = graphs::load(&dir, &opts).unwrap();
    let ds = models::ops::DeviceSampler::new(&g, &dev).unwrap();
    let train = &g.target_labels().1.train;
    let fanouts = [25, 20];
    for (step, seeds) in train.chunks(256).take(4).enumerate() {
        let want = Sampler::new(&g, &fanouts, 3)
            .unwrap()
            .sample(1, step as u64, seeds)
            .unwrap();
        let mut s = Sampler::new(&g, &fanouts, 3).unwrap();
        let got = ds.sample(&mut s, 1, step as u64, seeds).unwrap();
        assert_eq!(got, want, "step {step}");
    }
    // Refused, not drawn out of bounds.
    let r = graphs::RelationId(0);
    let rows = g.relation(r).in_csr().offsets().len() as u32 - 1;
    assert!(ds.pick(r, 1, &[rows], 5).is_err(), "a node past the CSR");
    assert!(
        ds.pick(r, 1, &[0], 65).is_err(),
        "a fanout past the kernels'"
    );
    let none = ds.pick(r, 1, &[], 5).unwrap();
    assert_eq!((none.offsets, none.picks), (vec![0], vec![]));
}

#[test]
fn dense_adam_on_cuda_gives_the_cpu_bits() {
    use models::optim::{Adam, AdamConfig};
    use models::params::ParamStore;
    let Some(dev) = gpu() else { return };
    let n = 4099usize;
    let values = |seed: u64| -> Vec<f32> {
        let mut r = graphs::rng::CounterRng::new(seed);
        (0..n).map(|_| r.normal() as f32).collect()
    };
    // The same start and gradients on both devices; the kernel on one, the tensor ops on the other.
    let run = |device: &Device| -> Vec<Vec<u32>> {
        let mut store = ParamStore::new();
        let w = store.zeros("w", n, DType::F32, device).unwrap();
        let var = store.get("w").unwrap();
        var.set(&Tensor::from_vec(values(1), n, device).unwrap())
            .unwrap();
        let mut adam = Adam::new(AdamConfig::with_lr(0.05));
        let mut out = Vec::new();
        for step in 0..4 {
            let g = Tensor::from_vec(values(10 + step), n, device).unwrap();
            let grads = std::collections::BTreeMap::from([("w".to_string(), g)]);
            adam.step_named(&store, &grads).unwrap();
            let (m, v) = &adam.moments["w"];
            for t in [&w, m, v] {
                let host: Vec<f32> = t.to_device(&Device::Cpu).unwrap().to_vec1().unwrap();
                out.push(host.iter().map(|x| x.to_bits()).collect());
            }
        }
        out
    };
    assert_eq!(run(&dev), run(&Device::Cpu));
}
