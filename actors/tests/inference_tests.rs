//! Distributed offline inference (`actors::inference`): every partition
//! computes its own nodes layer by layer, pulling its halo's rows from their
//! owners; the embeddings equal single-process `embed`'s, and a partition
//! that crashed resumes from its last saved layer.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actors::inference::{embed_embedded, files::Manifest, Computes, Job};
use actors::pretrained::{Inference, Pretrained};
use candle_core::{DType, Device};
use graphs::npy::{DType as NpyType, NpyFile};
use graphs::partition::{self, Method, PartitionSet};
use graphs::{LoadOptions, NoProgress};
use models::inference::TypeRows;
use models::Model;

/// Partitions of the test graph (reverse relations are added when they are
/// loaded); with their halo's feature rows too (read there, not pulled) on
/// random partitions.
fn partitions(parts: usize, method: Method) -> std::path::PathBuf {
    let halo_features = method == Method::Random;
    let name = format!("parts-{parts}-{method:?}-halo-{halo_features}");
    common::derived(&name, false, |g, out| {
        let a = partition::assign_two_level(g, parts, 1, method, 0).unwrap();
        let opts = partition::WriteOptions {
            halo_features,
            ..partition::WriteOptions::default()
        };
        partition::write_with(g, &a, out, &opts, &mut NoProgress).unwrap();
    })
}

/// A model built on partition 0's graph, as `hetgnn embed --partitions` builds it.
fn model(set: &PartitionSet, extra: &[&str], reverse_edges: bool) -> Model {
    let mut o = vec!["training.hidden=16", "training.embed_dim=8"];
    o.extend_from_slice(extra);
    let cfg = common::config(&o, &[]);
    let g = set
        .load_part(
            0,
            &LoadOptions {
                mmap_features: true,
                reverse_edges,
            },
        )
        .unwrap();
    Model::new(&cfg.training.model_spec(), &g, DType::F32, &Device::Cpu).unwrap()
}

fn reference(model: &Model, reverse_edges: bool) -> Vec<Option<TypeRows>> {
    let g = graphs::load(
        &common::graph(),
        &LoadOptions {
            mmap_features: true,
            reverse_edges,
        },
    )
    .unwrap();
    models::inference::embed_all(model, &g, 97, |_, _, _| {}).unwrap()
}

/// The largest difference between the partitions' files and `want`, checking
/// that every node is written once.
fn max_diff(out: &Path, m: &Manifest, want: &[Option<TypeRows>], names: &[String]) -> f32 {
    let mut worst = 0f32;
    let with_rows = want.iter().filter(|w| w.is_some()).count();
    assert_eq!(m.types.len(), with_rows, "types with embeddings");
    for e in &m.types {
        let t = names.iter().position(|n| *n == e.name).unwrap();
        let w = want[t].as_ref().expect("a type the reference has rows of");
        assert_eq!(e.width, w.width, "{}", e.name);
        let count = w.data.len() / w.width;
        let mut seen = vec![false; count];
        for (k, &n) in e.nodes.iter().enumerate() {
            let dir = out.join(format!("part-{k}"));
            let rows = NpyFile::open(&dir.join(format!("{}.npy", e.name)), NpyType::F32).unwrap();
            let ids =
                NpyFile::open(&dir.join(format!("{}.ids.npy", e.name)), NpyType::I64).unwrap();
            assert_eq!(rows.shape(), &[n, e.width as u64]);
            assert_eq!(ids.shape(), &[n]);
            let got = rows.to_f32_vec();
            for i in 0..n as usize {
                let v = ids.i64_at(i) as usize;
                assert!(!seen[v], "{} node {v} written twice", e.name);
                seen[v] = true;
                for j in 0..e.width {
                    let (a, b) = (got[i * e.width + j], w.data[v * e.width + j]);
                    worst = worst.max((a - b).abs() / b.abs().max(1.0));
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "{}: every node written", e.name);
    }
    worst
}

/// `model` written as a checkpoint and read back for inference, as `hetgnn
/// embed --partitions` reads it: dense parameters, learnable rows mapped.
fn saved(model: &Model, set: &PartitionSet, reverse_edges: bool, name: &str) -> Inference {
    let g = set
        .load_part(
            0,
            &LoadOptions {
                mmap_features: true,
                reverse_edges,
            },
        )
        .unwrap();
    let root = common::root().join(format!("ck-{name}"));
    let _ = std::fs::remove_dir_all(&root);
    let info = models::checkpoint::RunInfo {
        graph: g.name().to_string(),
        graph_sha256: None,
        reverse_edges,
        fanouts: vec![5; model.spec().layers],
        epochs_done: 1,
        steps: 1,
        run: "test".into(),
    };
    let adam = models::optim::Adam::new(models::optim::AdamConfig::with_lr(1e-3));
    let dir = models::checkpoint::save(&root, model, &adam, &info, 1).unwrap();
    let (found, _) = Pretrained::find(&dir).unwrap();
    found.for_inference(&g, None).unwrap()
}

/// A 2-layer model trained on partition 0 of 2 METIS partitions, saved as a
/// checkpoint under root `ck-<name>`: the model, the partition, the root and
/// the checkpoint's directory.
fn checkpointed(
    name: &str,
) -> (
    Model,
    graphs::HetGraph,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let dir = partitions(2, Method::Metis);
    let set = PartitionSet::open(&dir).unwrap();
    let trained = model(&set, &["training.layers=2"], false);
    let g = set
        .load_part(
            0,
            &LoadOptions {
                mmap_features: true,
                reverse_edges: false,
            },
        )
        .unwrap();
    drop(saved(&trained, &set, false, name));
    let root = common::root().join(format!("ck-{name}"));
    let ck = models::checkpoint::list(&root).unwrap().pop().unwrap();
    (trained, g, root, ck)
}

fn job<'a>(
    model: &'a Inference,
    set: &'a PartitionSet,
    reverse_edges: bool,
    out: &'a Path,
) -> Job<'a> {
    Job {
        model,
        set,
        reverse_edges,
        fingerprint: "test".into(),
        out,
        chunk: 64,
        force: false,
        wait: Duration::from_secs(20),
        computes: Computes::Embeddings,
    }
}

#[test]
fn partitions_embed_every_node_as_single_process_embed_does() {
    let cases: [(usize, Method, &[&str], bool); 4] = [
        (
            2,
            Method::Metis,
            &["training.layers=3", "training.fanouts=[5,5,5]"],
            false,
        ),
        (
            4,
            Method::Random,
            &["training.layers=3", "training.fanouts=[5,5,5]"],
            false,
        ),
        (
            3,
            Method::Random,
            &["training.model=\"rgat\"", "training.layers=2"],
            true,
        ),
        (
            2,
            Method::Random,
            &["training.model=\"hgt\"", "training.layers=2"],
            false,
        ),
    ];
    for (parts, method, extra, reverse) in cases {
        let what = format!("{parts} {method:?} partitions, {extra:?}, reverse {reverse}");
        let dir = partitions(parts, method);
        let set = PartitionSet::open(&dir).unwrap();
        let model = model(&set, extra, reverse);
        let want = reference(&model, reverse);
        let name = format!(
            "{parts}-{method:?}-{}",
            extra.join("-").replace(['"', '='], "")
        );
        let model = saved(&model, &set, reverse, &name);
        let out = common::root().join(format!("embed-{name}"));
        let counted = AtomicU64::new(0);
        let count = |n| {
            counted.fetch_add(n, Ordering::Relaxed);
        };
        let m = embed_embedded(&job(&model, &set, reverse, &out), &count).unwrap();
        assert_eq!(m.job.parts as usize, parts);
        let diff = max_diff(&out, &m, &want, &set.manifest.node_types);
        assert!(
            diff <= 1e-5,
            "{what}: differs from single-process embed by {diff}"
        );
        // Nothing but the embeddings is left: the stages are removed.
        for k in 0..parts {
            let left: Vec<_> = std::fs::read_dir(out.join(format!("part-{k}")))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("stage"))
                .collect();
            assert!(left.is_empty(), "{what}: {left:?} left");
        }
        assert!(counted.load(Ordering::Relaxed) > 0);
        // Run again: the directory is complete, nothing is computed.
        counted.store(0, Ordering::Relaxed);
        let again = embed_embedded(&job(&model, &set, reverse, &out), &count).unwrap();
        assert_eq!(again, m);
        assert_eq!(counted.load(Ordering::Relaxed), 0, "{what}: recomputed");
    }
}

#[test]
fn partitions_compute_the_target_logits_as_single_process_exact_inference_does() {
    let cases: [(usize, Method, &[&str], bool); 3] = [
        (
            2,
            Method::Metis,
            &["training.layers=3", "training.fanouts=[5,5,5]"],
            false,
        ),
        // A classifier of its own after the last layer.
        (
            3,
            Method::Random,
            &["training.model=\"hgt\"", "training.layers=2"],
            false,
        ),
        (
            2,
            Method::Random,
            &[
                "training.model=\"rgat\"",
                "training.layers=2",
                "training.task=\"node-regression\"",
            ],
            true,
        ),
    ];
    for (parts, method, extra, reverse) in cases {
        let what = format!("{parts} {method:?} partitions, {extra:?}, reverse {reverse}");
        let dir = partitions(parts, method);
        let set = PartitionSet::open(&dir).unwrap();
        let model = model(&set, extra, reverse);
        let g = graphs::load(
            &common::graph(),
            &LoadOptions {
                mmap_features: true,
                reverse_edges: reverse,
            },
        )
        .unwrap();
        let t = g.target();
        let rows = reference(&model, reverse);
        let all: Vec<u32> = (0..g.node_type(t).count).collect();
        let logits = models::inference::classify_exact(&model, &g, &rows, &all).unwrap();
        let (width, data) = models::inference::host_rows(&logits).unwrap();
        let mut want: Vec<Option<TypeRows>> = vec![None; g.node_types().len()];
        want[t.index()] = Some(TypeRows { width, data });
        let name = format!(
            "logits-{parts}-{method:?}-{}",
            extra.join("-").replace(['"', '='], "")
        );
        let model = saved(&model, &set, reverse, &name);
        let out = common::root().join(format!("predict-{name}"));
        let mut job = job(&model, &set, reverse, &out);
        job.computes = Computes::Logits;
        let m = embed_embedded(&job, &|_| {}).unwrap();
        assert!(m.job.logits, "{what}");
        let diff = max_diff(&out, &m, &want, &set.manifest.node_types);
        assert!(
            diff <= 1e-5,
            "{what}: differs from single-process exact inference by {diff}"
        );
        // An embedding job is another job: its directory is not this one's.
        let mut embed = job;
        embed.computes = Computes::Embeddings;
        let refused = embed_embedded(&embed, &|_| {}).unwrap_err().to_string();
        assert!(
            refused.contains("holds the predictions of another job"),
            "{what}: {refused}"
        );
    }
}

#[test]
fn a_partition_that_crashed_resumes_from_its_last_layer() {
    let dir = partitions(2, Method::Metis);
    let set = PartitionSet::open(&dir).unwrap();
    let model = model(
        &set,
        &["training.layers=4", "training.fanouts=[5,5,5,5]"],
        false,
    );
    let want = reference(&model, false);
    let model = Inference::held(model);
    let out = common::root().join("embed-crash");
    // The nodes of one stage; a crash is injected in the third, once both
    // partitions have saved the second (a partition computes its interior
    // while a slower peer is still on the stage before).
    let stage: u64 = set.owners.iter().map(|o| o.len() as u64).sum();
    let counted = AtomicU64::new(0);
    let crash = |n| {
        if counted.fetch_add(n, Ordering::SeqCst) + n > 2 * stage
            && (0..2).all(|k| out.join(format!("part-{k}/stage-2")).is_dir())
        {
            panic!("injected crash");
        }
    };
    let mut first = job(&model, &set, false, &out);
    first.wait = Duration::from_secs(3);
    let e = embed_embedded(&first, &crash).unwrap_err();
    assert!(e.to_string().contains("panicked"), "{e}");
    assert!(out.join("part-0/stage-2").is_dir() && out.join("part-1/stage-2").is_dir());
    assert!(!out.join("manifest.json").exists());
    // Another job's directory is refused.
    let mut other = job(&model, &set, false, &out);
    other.fingerprint = "another checkpoint".into();
    let refused = embed_embedded(&other, &|_| {}).unwrap_err().to_string();
    assert!(
        refused.contains("another checkpoint or partitioning"),
        "{refused}"
    );
    // The rerun computes only the third stage, and what the crash left undone of it.
    let redone = AtomicU64::new(0);
    let count = |n| {
        redone.fetch_add(n, Ordering::SeqCst);
    };
    let m = embed_embedded(&job(&model, &set, false, &out), &count).unwrap();
    let diff = max_diff(&out, &m, &want, &set.manifest.node_types);
    assert!(
        diff <= 1e-5,
        "resumed: differs from single-process embed by {diff}"
    );
    let r = redone.load(Ordering::SeqCst);
    assert!(
        r > 0 && r <= stage,
        "resumed run computed {r} nodes, a stage is {stage}"
    );
}

#[test]
fn inference_reads_the_trained_rows_and_refuses_a_corrupted_checkpoint() {
    let (trained, g, root, ck) = checkpointed("corrupt");
    // Read back whole (no optimizer state): the trained rows, and no step on them.
    let (found, _) = Pretrained::find(&root).unwrap();
    let mut back = found.model(&g, None).unwrap();
    let mut tables = 0;
    for (a, b) in trained.embeddings.iter().zip(back.embeddings.iter_mut()) {
        assert_eq!(a.is_some(), b.is_some());
        let (Some(a), Some(b)) = (a, b) else {
            continue;
        };
        tables += 1;
        assert_eq!(a.data, b.data, "{}", a.name);
        let e = b
            .adam_rows(
                &[0],
                &vec![1.0; b.dim],
                &models::optim::AdamConfig::with_lr(1e-3),
            )
            .unwrap_err();
        assert!(e.to_string().contains("no optimizer state"), "{e}");
    }
    assert!(tables > 0, "the test graph has featureless types");
    // One byte of the embeddings file changed: refused, named directly or as the newest of a root.
    let file = ck.join("embeddings.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&file, bytes).unwrap();
    let (direct, _) = Pretrained::find(&ck).unwrap();
    let e = direct.for_inference(&g, None).err().unwrap().to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
    let e = Pretrained::find(&root).err().unwrap().to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
}

#[test]
fn inference_reads_the_rows_without_their_adam_state_and_old_checkpoints_still_load() {
    let (trained, g, root, ck) = checkpointed("moments");
    let rows_of = |m: &Model| -> Vec<Vec<f32>> {
        m.embeddings
            .iter()
            .flatten()
            .map(|e| e.data.clone())
            .collect()
    };
    let want = rows_of(&trained);
    assert!(!want.is_empty(), "the test graph has featureless types");

    // A format-2 checkpoint (the tables' Adam state beside their rows in one
    // file) reads as written: rows for inference, rows and moments to resume.
    let old = common::root().join("ck-moments-v2");
    let _ = std::fs::remove_dir_all(&old);
    std::fs::create_dir_all(&old).unwrap();
    let v2 = old.join("epoch-000001");
    std::fs::create_dir_all(&v2).unwrap();
    std::fs::copy(ck.join("params.safetensors"), v2.join("params.safetensors")).unwrap();
    let mut all =
        candle_core::safetensors::load(ck.join("embeddings.safetensors"), &Device::Cpu).unwrap();
    all.extend(
        candle_core::safetensors::load(ck.join("embedding-moments.safetensors"), &Device::Cpu)
            .unwrap(),
    );
    assert!(all.keys().any(|k| k.ends_with(".m")), "{:?}", all.keys());
    candle_core::safetensors::save(&all, v2.join("embeddings.safetensors")).unwrap();
    let mut m = models::checkpoint::read_manifest(&ck).unwrap();
    assert_eq!(m.format, 3);
    m.format = 2;
    m.files.remove("embedding-moments.safetensors");
    for f in ["params.safetensors", "embeddings.safetensors"] {
        m.files
            .insert(f.into(), graphs::fingerprint::file(&v2.join(f)).unwrap());
    }
    use models::checkpoint::Sealed;
    m.seal();
    std::fs::write(v2.join("manifest.json"), serde_json::to_string(&m).unwrap()).unwrap();
    let (found, _) = Pretrained::find(&old).unwrap();
    assert_eq!(rows_of(&found.model(&g, None).unwrap()), want);
    let mut back = Model::new(trained.spec(), &g, DType::F32, &Device::Cpu).unwrap();
    found.load_into(&mut back, g.name(), None).unwrap();
    assert_eq!(rows_of(&back), want);
    for (a, b) in trained
        .embeddings
        .iter()
        .flatten()
        .zip(back.embeddings.iter().flatten())
    {
        assert_eq!((&a.m, &a.v, &a.steps), (&b.m, &b.v, &b.steps), "{}", a.name);
    }

    // The Adam state corrupted: inference does not read it, resuming refuses it.
    let file = ck.join("embedding-moments.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&file, bytes).unwrap();
    let (found, _) = Pretrained::find(&root).unwrap();
    assert_eq!(rows_of(&found.model(&g, None).unwrap()), want);
    let e = models::checkpoint::latest(&root).unwrap_err().to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
    let mut full = Model::new(trained.spec(), &g, DType::F32, &Device::Cpu).unwrap();
    let e = found
        .load_into(&mut full, g.name(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum mismatch"), "{e}");
}

/// A partition keeps only its own feature rows (METIS partitions without
/// their halo's): a block whose sources are all its own is computed from
/// those rows in place, through their places, with the bits of gathering
/// them; a block reaching a row it does not keep is left to gathering.
#[test]
fn a_partition_s_kept_rows_are_read_in_place_with_the_gathered_bits() {
    let set = PartitionSet::open(&partitions(2, Method::Metis)).unwrap();
    assert!(!set.manifest.halo_features);
    let model = model(&set, &["training.layers=2"], false);
    let opts = LoadOptions {
        mmap_features: true,
        reverse_edges: false,
    };
    let g = set.load_part(0, &opts).unwrap();
    let t = g.target();
    let own = |u: usize, v: u32| set.owners[u][v as usize] == 0;
    // Own targets whose in-neighbours are all owned here, and one with an
    // in-neighbour whose feature row lies elsewhere (learnt rows are all here).
    let (mut inner, mut outer) = (Vec::new(), None);
    for v in (0..g.node_types()[t.index()].count).filter(|&v| own(t.index(), v)) {
        let foreign = |featured: bool| {
            g.relations()
                .iter()
                .filter(|r| r.dst == t)
                .filter(|r| !featured || g.node_types()[r.src.index()].features.is_some())
                .any(|r| {
                    r.in_csr()
                        .neighbors(v)
                        .iter()
                        .any(|&u| !own(r.src.index(), u))
                })
        };
        if !foreign(false) {
            inner.push(v);
        } else if foreign(true) {
            outer = outer.or(Some(v));
        }
    }
    assert!(inner.len() >= 10, "{} interior targets", inner.len());
    let block = models::inference::full_block(&g, 0, t, &inner);
    let stored = model
        .stored_rows(&g, &block)
        .expect("kept rows addressable");
    assert!(
        stored.iter().flatten().any(|r| r.slot.is_some()),
        "the features are a partition's kept rows"
    );
    let (_, mut got) = model
        .layer_in_place(&g, 0, &block, &stored)
        .unwrap()
        .expect("every source row kept");
    let h = model.gather_inputs(&g, &block.src).unwrap();
    let want = models::inference::layer_chunk(&model, &g, 0, &block, &h, t).unwrap();
    let bits = |x: candle_core::Tensor| -> Vec<u32> {
        let v: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        v.iter().map(|f| f.to_bits()).collect()
    };
    let (got, want) = (bits(got[t.index()].take().unwrap()), bits(want.unwrap()));
    assert_eq!(got, want);
    assert!(got.iter().any(|&b| b != 0));
    let outer = outer.expect("a target with a neighbour owned elsewhere");
    let block = models::inference::full_block(&g, 0, t, &[outer]);
    let stored = model.stored_rows(&g, &block).unwrap();
    assert!(model
        .layer_in_place(&g, 0, &block, &stored)
        .unwrap()
        .is_none());
}
