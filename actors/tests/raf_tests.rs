//! Relation-aggregation-first training in one process (Heta Prop. 4.1): with
//! the same seed, global batch and samples, RAF on meta-partitions follows
//! single-process training step by step, for R-GCN, R-GAT and HGT with
//! learnable embeddings, on every task of the target nodes.

mod common;

use std::path::PathBuf;

use actors::{train, Config};
use candle_core::DType;
use common::{derived, same_losses, Losses, Notes};
use graphs::partition;
use graphs::NoProgress;
use models::Model;

fn meta(parts: usize, layers: usize) -> PathBuf {
    derived(&format!("meta-{parts}-l{layers}"), true, |g, out| {
        partition::meta::write(g, layers, parts, out, false, &mut NoProgress).unwrap();
    })
}

/// Meta-partitions whose metatree follows three metapaths.
fn meta_paths(parts: usize) -> PathBuf {
    derived(&format!("metapaths-{parts}"), true, |g, out| {
        let paths = partition::meta::parse_metapaths(
            "writes rev_writes\ncites  # one hop\nrev_has_topic, has_topic\n",
            g,
            2,
        )
        .unwrap();
        partition::meta::write_metapaths(
            g,
            &partition::meta::MetaOptions {
                layers: 2,
                parts,
                metapaths: Some(&paths),
                graph_sha256: None,
                overwrite: false,
            },
            out,
            &mut NoProgress,
        )
        .unwrap();
    })
}

const BASE: [&str; 5] = [
    "training.epochs=1",
    "training.batch=256",
    "training.hidden=16",
    "training.embed_dim=8",
    "training.dropout=0.3",
];

fn config(extra: &[String]) -> Config {
    common::config(&BASE, extra)
}

/// Root-mean-square and largest absolute difference.
fn errors(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let sq: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    (
        (sq / a.len().max(1) as f64).sqrt() as f32,
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max),
    )
}

/// Asserts every parameter tensor and embedding table of `got` matches `want`.
///
/// Within 2e-5 of each tensor's scale as a root mean square, no element off
/// by more than 2e-4: workers sum in other orders (their blocks differ, and so
/// does the cheaper of aggregate-first and transform-first), and Adam divides
/// by sqrt(v), so on elements whose gradient is near zero that rounding grows
/// toward lr. (Every step's loss is compared to 1e-5 separately.)
fn same_model(want: &Model, got: &Model, what: &str) {
    for ((name, var), (name2, var2)) in want.params.iter().zip(got.params.iter()) {
        assert_eq!(name, name2);
        let a: Vec<f32> = var
            .as_tensor()
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let b: Vec<f32> = var2
            .as_tensor()
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
        let (rms, worst) = errors(&a, &b);
        assert!(
            rms <= 2e-5 * scale && worst <= 2e-4 * scale,
            "{what}, parameter {name}: rms error {rms}, worst {worst} (scale {scale})"
        );
    }
    let (ta, tb): (Vec<_>, Vec<_>) = (
        want.embeddings.iter().flatten().collect(),
        got.embeddings.iter().flatten().collect(),
    );
    assert_eq!(ta.len(), tb.len());
    assert!(!ta.is_empty(), "the test needs learnable embeddings");
    for (a, b) in ta.iter().zip(&tb) {
        let (rms, worst) = errors(&a.data, &b.data);
        assert!(
            rms <= 2e-5 && worst <= 2e-4,
            "{what}, {}: rms error {rms}, worst {worst}",
            a.name
        );
    }
}

fn raf_matches_single(model: &str, layers: usize, parts: &[usize]) {
    let fanouts = ["8", "6", "4"][..layers].join(",");
    let common = [
        format!("training.model={model:?}"),
        format!("training.layers={layers}"),
        format!("training.fanouts={fanouts:?}"),
    ];
    let mut single_losses = Losses::default();
    let (single, want) = train(&config(&common), &mut single_losses).unwrap();
    for &k in parts {
        let pdir = meta(k, layers);
        let mut extra = common.to_vec();
        extra.push("training.mode=\"raf\"".into());
        extra.push(format!(
            "training.partitions={:?}",
            pdir.display().to_string()
        ));
        let mut losses = Losses::default();
        let (report, got) = train(&config(&extra), &mut losses).unwrap();
        assert_eq!(report.mode, "raf");
        assert_eq!(report.nodes, k);
        let what = format!("{model}, {k} workers");
        same_losses(&single_losses.0, &losses.0, &what);
        same_model(&want, &got, &what);
        let (last, w) = (report.epochs.last().unwrap(), single.epochs.last().unwrap());
        assert!(
            (last.test_acc.unwrap() - w.test_acc.unwrap()).abs() < 0.01,
            "{:?} vs {:?}",
            last.test_acc,
            w.test_acc
        );
        let (f, wf) = (last.macro_f1.unwrap(), w.macro_f1.unwrap());
        assert!(
            (f[1] - wf[1]).abs() < 0.02,
            "{what}: macro F1 {f:?} vs {wf:?}"
        );
        // Only partial aggregations, their gradients and shared gradients cross: no features.
        assert!(
            report
                .bytes_by_kind
                .keys()
                .all(|k| !k.starts_with("pull") && !k.starts_with("sample")),
            "{:?}",
            report.bytes_by_kind
        );
    }
}

/// Node regression and two tasks at once (classification and regression,
/// the second weighted 0.5): the reducer's loss is the single process's at
/// every step, and each task's figures are reported as it reports them.
#[test]
fn node_regression_and_two_tasks_match_single_process_training() {
    let two = "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\", weight = 0.5}]";
    for set in ["training.task=\"node-regression\"", two] {
        let mut want = Losses::default();
        let (single, model) = train(&config(&[set.into()]), &mut want).unwrap();
        let parts = format!("training.partitions={:?}", meta(3, 2).display().to_string());
        let extra = [set.into(), "training.mode=\"raf\"".into(), parts];
        let mut got = Losses::default();
        let (report, fin) = train(&config(&extra), &mut got).unwrap();
        assert_eq!(report.mode, "raf");
        same_losses(&want.0, &got.0, set);
        same_model(&model, &fin, set);
        common::same_task_figures(&single, &report, set, 0.01);
    }
}

#[test]
fn rgcn_on_two_and_three_workers_matches_single_process_training() {
    raf_matches_single("rgcn", 2, &[2, 3]);
}

#[test]
fn rgat_on_two_and_three_workers_matches_single_process_training() {
    raf_matches_single("rgat", 2, &[2, 3]);
}

#[test]
fn hgt_on_two_and_three_workers_matches_single_process_training() {
    raf_matches_single("hgt", 2, &[2, 3]);
}

#[test]
fn three_layer_models_match_single_process_training() {
    raf_matches_single("rgcn", 3, &[2, 4]);
    raf_matches_single("hgt", 3, &[3]);
}

#[test]
fn local_embeddings_give_each_worker_its_own_table_and_still_learn() {
    let common = [
        "training.model=\"rgcn\"".to_string(),
        "training.mode=\"raf\"".into(),
        format!("training.partitions={:?}", meta(2, 2).display().to_string()),
    ];
    let (synced, _) = train(&config(&common), &mut ()).unwrap();
    let mut local = common.to_vec();
    local.push("training.raf.embeddings=\"local\"".into());
    let (report, _) = train(&config(&local), &mut ()).unwrap();
    assert_ne!(
        report.final_model_sha256, synced.final_model_sha256,
        "a different model"
    );
    let (a, b) = (
        report.epochs[0].test_acc.unwrap(),
        synced.epochs[0].test_acc.unwrap(),
    );
    assert!(a > 0.5 * b, "local embeddings still learn: {a} vs {b}");
}

#[test]
fn replicated_sub_metatrees_split_the_seeds_and_match_single_process_training() {
    // Four sub-metatrees into paper and the self one: six partitions replicate
    // the heaviest, seven the two heaviest (the self one stays alone).
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(meta(7, 2).join("manifest.json")).unwrap())
            .unwrap();
    let replicated = manifest["info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["replica"][1] == 2)
        .count();
    assert_eq!(replicated, 4, "{manifest}");
    raf_matches_single("rgcn", 2, &[7]);
    raf_matches_single("hgt", 2, &[6]);
}

#[test]
fn metapath_models_train_the_same_on_one_two_and_three_workers() {
    let run = |parts: usize| {
        let extra = [
            "training.model=\"hgt\"".to_string(),
            "training.mode=\"raf\"".into(),
            format!(
                "training.partitions={:?}",
                meta_paths(parts).display().to_string()
            ),
        ];
        let mut losses = Losses::default();
        let (report, model) = train(&config(&extra), &mut losses).unwrap();
        (report, model, losses.0)
    };
    let (one, want, want_losses) = run(1);
    let mut full = Losses::default();
    train(&config(&["training.model=\"hgt\"".to_string()]), &mut full).unwrap();
    assert!(
        want_losses
            .iter()
            .zip(&full.0)
            .any(|(a, b)| (a - b).abs() > 1e-3),
        "the metapaths restrict the model"
    );
    for k in [2, 3] {
        let (report, got, losses) = run(k);
        assert_eq!(report.nodes, k);
        let what = format!("metapaths, {k} workers");
        same_losses(&want_losses, &losses, &what);
        same_model(&want, &got, &what);
        assert!(
            (report.epochs[0].test_acc.unwrap() - one.epochs[0].test_acc.unwrap()).abs() < 0.01
        );
    }
}

#[test]
fn interrupted_raf_runs_resume_from_their_checkpoints_to_the_same_bits() {
    let root = common::root().join("raf-resume");
    let cfg = |dir: &std::path::Path, epochs: u64| {
        config(&[
            "training.mode=\"raf\"".into(),
            format!("training.partitions={:?}", meta(3, 2).display().to_string()),
            format!("training.checkpoint_dir={:?}", dir.display().to_string()),
            "training.checkpoint_every=3".into(),
            "training.checkpoint_keep=2".into(),
            "training.model=\"rgat\"".into(),
            format!("training.epochs={epochs}"),
        ])
    };
    let (want, _) = train(&cfg(&root.join("reference"), 2), &mut ()).unwrap();
    let per_epoch = want.steps / 2;
    assert!(
        per_epoch > 3,
        "the test wants a checkpoint inside an epoch ({per_epoch} steps per epoch)"
    );
    let list = |d: &std::path::Path| actors::distributed::checkpoint::list(d).unwrap();
    // The last checkpoint, assembled from the workers' files, is the final model.
    let last = list(&root.join("reference")).pop().unwrap();
    assert_eq!(common::assembled_hash(&last), want.final_model_sha256);
    let seq = |d: &PathBuf| actors::distributed::checkpoint::manifest(d).unwrap().seq;

    // Extended by an epoch: resumes at the end of the first.
    let dir = root.join("extended");
    train(&cfg(&dir, 1), &mut ()).unwrap();
    let mut notes = Notes::default();
    let (got, _) = train(&cfg(&dir, 2), &mut notes).unwrap();
    assert!(
        notes
            .0
            .iter()
            .any(|n| n.contains(&format!("resuming from the checkpoint at step {per_epoch}"))),
        "{:?}",
        notes.0
    );
    assert_eq!(
        got.final_model_sha256, want.final_model_sha256,
        "resumed at an epoch boundary"
    );
    // The model's steps, those before the checkpoint included (as in one process).
    assert_eq!(
        (got.steps, got.resumed_from_step),
        (2 * per_epoch, Some(per_epoch))
    );
    assert_eq!(
        got.epochs[0].loss, want.epochs[0].loss,
        "the first epoch's figures come from the checkpoint"
    );

    // Mid-epoch, after the newest checkpoint is truncated: the one before it is used.
    let dir = root.join("mid");
    train(&cfg(&dir, 1), &mut ()).unwrap();
    let kept = list(&dir);
    let file = kept[1].join("worker-1.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    let mid = seq(&kept[0]);
    assert!(mid % per_epoch != 0, "step {mid} is inside an epoch");
    let mut notes = Notes::default();
    let (got, _) = train(&cfg(&dir, 2), &mut notes).unwrap();
    assert!(
        notes
            .0
            .iter()
            .any(|n| n.contains("skipped checkpoint") && n.contains("checksum")),
        "{:?}",
        notes.0
    );
    assert_eq!(
        (got.steps, got.resumed_from_step),
        (2 * per_epoch, Some(mid))
    );
    assert_eq!(
        got.final_model_sha256, want.final_model_sha256,
        "resumed mid-epoch at step {mid}"
    );
    assert_eq!(
        got.epochs[0].loss, want.epochs[0].loss,
        "the epoch's loss counts the steps before the checkpoint"
    );
}
