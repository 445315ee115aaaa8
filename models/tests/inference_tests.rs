//! Exact offline inference equals the model on mini-batches that sample
//! every neighbour: layer by layer over all nodes, every relational model.

use candle_core::{DType, Device};
use graphs::{LoadOptions, Sampler};
use models::inference::{embed_all, embedding_layers};
use models::{Model, ModelKind, ModelSpec};

/// A small mag-like graph of seed `seed`, loaded with reverse relations
/// (its directory lives as long as the returned guard).
fn mag_like(seed: u64) -> (tempfile::TempDir, graphs::HetGraph) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("g");
    graphs::generate::generate(
        graphs::generate::Like::Mag,
        0.002,
        seed,
        &dir,
        false,
        &mut graphs::NoProgress,
    )
    .unwrap();
    let opts = LoadOptions {
        mmap_features: true,
        reverse_edges: true,
    };
    let g = graphs::load(&dir, &opts).unwrap();
    (tmp, g)
}

/// A tensor's values as bits, to compare results exactly.
fn bits(x: &candle_core::Tensor) -> Vec<u32> {
    let v: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    v.iter().map(|f| f.to_bits()).collect()
}

/// A small model of `kind` (hidden 16, learnt rows of width 8).
fn spec(kind: ModelKind, layers: usize, seed: u64) -> ModelSpec {
    ModelSpec {
        kind,
        layers,
        hidden: 16,
        embed_dim: 8,
        dropout: 0.5,
        seed,
        heads: 2,
        link: None,
        head: Default::default(),
        task_heads: Vec::new(),
        edge: None,
    }
}

#[test]
fn layerwise_inference_equals_full_neighbourhood_minibatches() {
    let (_tmp, g) = mag_like(0);
    for (kind, layers) in [
        (ModelKind::Rgcn, 2),
        (ModelKind::Rgcn, 3),
        (ModelKind::Rgat, 2),
        (ModelKind::Hgt, 2),
    ] {
        let spec = spec(kind, layers, 3);
        let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
        let mut calls = 0;
        let rows = embed_all(&model, &g, 97, |_, _, _| calls += 1).unwrap();
        assert!(calls > 0);
        let t = g.target().index();
        let target = rows[t].as_ref().expect("target rows");
        assert_eq!(
            target.data.len(),
            g.node_types()[t].count as usize * target.width
        );
        // Every node of every type the model reads has a row.
        for (nt, r) in g.node_types().iter().zip(&rows) {
            assert_eq!(
                r.as_ref().map(|r| r.data.len() / r.width),
                Some(nt.count as usize),
                "{kind:?}: {}",
                nt.name
            );
        }
        // The same nodes through the model with every neighbour sampled (fanouts past any degree).
        let fanouts = vec![1 << 30; layers];
        let mut sampler = Sampler::new(&g, &fanouts, 0).unwrap();
        let seeds: Vec<u32> = (0..g.node_types()[t].count).step_by(7).take(300).collect();
        let mb = sampler.sample(0, 0, &seeds).unwrap();
        let inputs = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
        let (_, emb) = model
            .forward_with_embeddings(&g, &mb, inputs, None)
            .unwrap();
        let emb: Vec<f32> = emb.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(
            emb.len(),
            seeds.len() * target.width,
            "{kind:?} {layers}: {} layer(s) embed",
            embedding_layers(&model).unwrap()
        );
        let mut worst = 0f32;
        for (i, &v) in seeds.iter().enumerate() {
            for j in 0..target.width {
                let (a, b) = (
                    emb[i * target.width + j],
                    target.data[v as usize * target.width + j],
                );
                worst = worst.max((a - b).abs() / a.abs().max(1.0));
            }
        }
        assert!(
            worst < 1e-5,
            "{kind:?} {layers} layers: largest relative difference {worst}"
        );
    }
}

/// A link predictor's embeddings (its last layer's rows, of every type) by
/// exact inference equal `forward_nodes` on seeds of several types with
/// every neighbour sampled.
#[test]
fn link_embeddings_equal_full_neighbourhood_minibatches() {
    let (_tmp, g) = mag_like(0);
    let link = models::link::LinkSpec {
        relations: vec!["author__writes__paper".into()],
        decoder: models::link::Decoder::Distmult,
    };
    for kind in [ModelKind::Rgcn, ModelKind::Hgt] {
        let spec = ModelSpec {
            link: Some(link.clone()),
            ..spec(kind, 2, 4)
        };
        let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(
            embedding_layers(&model).unwrap(),
            2,
            "every layer: the decoder reads the last one's rows"
        );
        assert!(model
            .params
            .get("decoder.author__writes__paper.diag")
            .is_some());
        let rows = embed_all(&model, &g, 61, |_, _, _| {}).unwrap();
        let mut seeds = vec![Vec::new(); g.node_types().len()];
        for name in ["author", "paper"] {
            let t = g.type_id(name).unwrap().index();
            seeds[t] = (0..g.node_types()[t].count).step_by(5).take(200).collect();
        }
        let mut sampler = Sampler::new(&g, &[1 << 30, 1 << 30], 0).unwrap();
        let mb = sampler
            .sample_typed(0, 0, &seeds, &graphs::link::NoExclusion)
            .unwrap();
        let inputs = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
        let out = model.forward_nodes(&g, &mb, inputs, None).unwrap();
        for (t, ids) in seeds.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
            let got: Vec<f32> = out[t]
                .as_ref()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let want = rows[t].as_ref().unwrap();
            assert_eq!(want.width, 16);
            let mut worst = 0f32;
            for (i, &v) in ids.iter().enumerate() {
                for j in 0..16 {
                    let (a, b) = (got[i * 16 + j], want.data[v as usize * 16 + j]);
                    worst = worst.max((a - b).abs() / a.abs().max(1.0));
                }
            }
            assert!(
                worst < 1e-5,
                "{kind:?}, type {t}: largest relative difference {worst}"
            );
        }
    }
}

#[test]
fn reused_block_tables_build_the_blocks_fresh_maps_build() {
    let (_tmp, g) = mag_like(1);
    let mut blocks = models::inference::FullBlocks::new(&g);
    for (t, nt) in g.node_types().iter().enumerate() {
        let t = graphs::NodeTypeId(t as u32);
        let ids: Vec<u32> = (0..nt.count).rev().collect();
        for chunk in ids.chunks(37) {
            let want = models::inference::full_block(&g, 1, t, chunk);
            let got = blocks.block(&g, 1, t, chunk);
            assert_eq!(got.src, want.src);
            assert_eq!(got.dst, want.dst);
            assert_eq!(got.relations.len(), want.relations.len());
            for (a, b) in got.relations.iter().zip(&want.relations) {
                assert_eq!(
                    (a.relation, &a.offsets, &a.sources),
                    (b.relation, &b.offsets, &b.sources)
                );
            }
        }
    }
}

/// Inference over stored rows read where they lie equals gathering every
/// input row first, bit for bit: R-GCN of 1 to 3 layers (dense features,
/// learnt rows, relations with fewer sources than destinations), sampled and
/// full neighbourhoods, and a model that gathers instead (R-GAT).
#[test]
fn stored_rows_read_in_place_give_the_gathered_rows_bits() {
    let (_tmp, g) = mag_like(1);
    let _inference = models::ops::no_backward();
    for (kind, layers) in [
        (ModelKind::Rgcn, 1),
        (ModelKind::Rgcn, 2),
        (ModelKind::Rgcn, 3),
        (ModelKind::Rgat, 2),
    ] {
        let spec = spec(kind, layers, 5);
        let model = Model::new(&spec, &g, DType::F32, &Device::Cpu).unwrap();
        let t = g.target().index();
        let seeds: Vec<u32> = (0..g.node_types()[t].count).step_by(5).take(200).collect();
        for fanouts in [vec![10; layers], vec![1 << 30; layers]] {
            let mut sampler = Sampler::new(&g, &fanouts, 0).unwrap();
            let mb = sampler.sample(0, 0, &seeds).unwrap();
            let inputs = model.gather_inputs(&g, &mb.blocks[0].src).unwrap();
            let gathered = model
                .forward_with_embeddings(&g, &mb, inputs, None)
                .unwrap();
            let in_place = model.forward_stored(&g, &mb).unwrap();
            let what = format!("{kind:?}, {layers} layer(s), fanouts {:?}", fanouts[0]);
            assert_eq!(bits(&gathered.0), bits(&in_place.0), "{what}: logits");
            assert_eq!(bits(&gathered.1), bits(&in_place.1), "{what}: embeddings");
            assert!(!bits(&gathered.0).is_empty(), "{what}");
        }
    }
}

/// Layer-wise inference reads each layer's source rows where they lie
/// (R-GCN in f32 on the CPU): the same bits as gathering them into each
/// block's inputs first, layer by layer.
#[test]
fn layerwise_rows_read_in_place_are_the_gathered_rows_bits() {
    let (_tmp, g) = mag_like(0);
    for layers in [2, 3] {
        let model = Model::new(
            &spec(ModelKind::Rgcn, layers, 3),
            &g,
            DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        let got = embed_all(&model, &g, 97, |_, _, _| {}).unwrap();
        // The gathering reference: every block's source rows copied first.
        let mut current: Option<Vec<Option<models::inference::TypeRows>>> = None;
        for l in 0..embedding_layers(&model).unwrap() {
            let mut next = vec![None; g.node_types().len()];
            for (t, nt) in g.node_types().iter().enumerate() {
                let ids: Vec<u32> = (0..nt.count).collect();
                let t = graphs::NodeTypeId(t as u32);
                // The same chunks: a block's shape decides its sums' order.
                for chunk in ids.chunks(97) {
                    let block = models::inference::full_block(&g, l, t, chunk);
                    let h = match &current {
                        None => model.gather_inputs(&g, &block.src).unwrap(),
                        Some(rows) => models::inference::rows_of(rows, &block.src, &model).unwrap(),
                    };
                    let x = models::inference::layer_chunk(&model, &g, l, &block, &h, t).unwrap();
                    if let Some(x) = x {
                        let (width, data) = models::inference::host_rows(&x).unwrap();
                        let r: &mut Option<models::inference::TypeRows> = &mut next[t.index()];
                        let r = r.get_or_insert_with(|| models::inference::TypeRows {
                            width,
                            data: Vec::new(),
                        });
                        r.data.extend_from_slice(&data);
                    }
                }
            }
            current = Some(next);
        }
        assert_eq!(got, current.unwrap(), "{layers} layers");
    }
}

/// Rows held for some nodes only, in another order (a partition's: a place
/// per node id), give the bits of rows held by id; a block needing a node
/// whose row is not held is left to the caller to gather (`None`).
#[test]
fn rows_held_out_of_id_order_give_the_rows_by_id_bits() {
    use models::model::RowsInPlace;
    let (_tmp, g) = mag_like(1);
    let model = Model::new(&spec(ModelKind::Rgcn, 2, 7), &g, DType::F32, &Device::Cpu).unwrap();
    let t = g.target();
    let seeds: Vec<u32> = (0..g.node_types()[t.index()].count)
        .step_by(3)
        .take(150)
        .collect();
    let block = models::inference::full_block(&g, 0, t, &seeds);
    let by_id = model
        .stored_rows(&g, &block)
        .expect("rows stored in id order");
    // Every type's rows reversed, each node's place given by its slot.
    let reversed: Vec<Option<Vec<f32>>> = by_id
        .iter()
        .map(|r| r.map(|r| r.values.chunks(r.width).rev().flatten().copied().collect()))
        .collect();
    let slots: Vec<Option<Vec<u32>>> = by_id
        .iter()
        .map(|r| r.map(|r| (0..(r.values.len() / r.width) as u32).rev().collect()))
        .collect();
    // The same, but the first seed's own row not held.
    let mut missing = slots.clone();
    if let Some(slot) = &mut missing[t.index()] {
        slot[seeds[0] as usize] = graphs::Features::ABSENT;
    }
    fn held<'a>(
        by_id: &[Option<RowsInPlace<'_>>],
        reversed: &'a [Option<Vec<f32>>],
        slots: &'a [Option<Vec<u32>>],
    ) -> Vec<Option<RowsInPlace<'a>>> {
        (0..by_id.len())
            .map(|u| {
                let (r, values, slot) = (by_id[u]?, reversed[u].as_ref()?, slots[u].as_ref()?);
                Some(RowsInPlace {
                    values,
                    width: r.width,
                    slot: Some(slot),
                })
            })
            .collect()
    }
    let want = model
        .layer_in_place(&g, 0, &block, &by_id)
        .unwrap()
        .expect("R-GCN in place");
    let got = model
        .layer_in_place(&g, 0, &block, &held(&by_id, &reversed, &slots))
        .unwrap()
        .expect("held rows in place");
    assert_eq!(
        bits(want.1[t.index()].as_ref().unwrap()),
        bits(got.1[t.index()].as_ref().unwrap()),
        "layer output"
    );
    assert_eq!(
        bits(want.0[t.index()].as_ref().unwrap()),
        bits(got.0[t.index()].as_ref().unwrap()),
        "own rows"
    );
    assert!(!bits(want.1[t.index()].as_ref().unwrap()).is_empty());
    // The first seed's own row not held: the layer cannot read it in place.
    assert!(model
        .layer_in_place(&g, 0, &block, &held(&by_id, &reversed, &missing))
        .unwrap()
        .is_none());
    // A place for a node past the held rows is refused the same way.
    let (values, width) = (vec![0.0f32; 8], 4);
    let short = RowsInPlace {
        values: &values,
        width,
        slot: None,
    };
    assert_eq!(short.places(&[0, 1]).unwrap().to_vec(), vec![0, 1]);
    assert_eq!(short.places(&[1, 2, 0]).unwrap_err(), 2);
    let slot = [1u32, graphs::Features::ABSENT, 0];
    let kept = RowsInPlace {
        slot: Some(&slot),
        ..short
    };
    assert_eq!(kept.places(&[2, 0]).unwrap().to_vec(), vec![0, 1]);
    assert_eq!(kept.places(&[0, 1]).unwrap_err(), 1);
}
