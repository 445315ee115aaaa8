//! What the distributed-training tests share: one small mag-like graph per
//! test binary, partition directories derived from it once, configs over it,
//! and loss comparisons.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use actors::{Config, TrainObserver};
use graphs::generate::{generate, Like};
use graphs::{HetGraph, LoadOptions, NoProgress};

/// This test binary's scratch directory, removed when the binary exits (a
/// static is never dropped, so a `TempDir`'s own cleanup would never run).
pub fn root() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    extern "C" fn remove() {
        if let Some(d) = DIR.get() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        // SAFETY: `remove` is a plain function that only reads a static.
        unsafe { libc::atexit(remove) };
        dir
    })
}

/// The mag-like graph at scale 0.003, generated once.
pub fn graph() -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap();
    let dir = root().join("mag");
    if !dir.exists() {
        generate(Like::Mag, 0.003, 0, &dir, false, &mut NoProgress).unwrap();
    }
    dir
}

/// `root()/name`, written once by `write(graph, dir)` with the graph loaded
/// with or without reverse relations.
pub fn derived(name: &str, reverse_edges: bool, write: impl FnOnce(&HetGraph, &Path)) -> PathBuf {
    let data = graph();
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap();
    let out = root().join(name);
    if !out.exists() {
        let g = graphs::load(
            &data,
            &LoadOptions {
                mmap_features: true,
                reverse_edges,
            },
        )
        .unwrap();
        write(&g, &out);
    }
    out
}

/// A config training on [`graph`] with `base` then `extra` overrides.
pub fn config(base: &[&str], extra: &[String]) -> Config {
    let mut o: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    o.push(format!("training.data={:?}", graph().display().to_string()));
    o.extend(extra.iter().cloned());
    Config::parse("", &o).unwrap()
}

/// Records the notes a run makes.
#[derive(Default)]
pub struct Notes(pub Vec<String>);

impl TrainObserver for Notes {
    fn note(&mut self, m: &str) {
        self.0.push(m.to_string());
    }
}

/// The hash of the whole model assembled from the distributed checkpoint in `dir`.
pub fn assembled_hash(dir: &Path) -> String {
    let m = actors::distributed::checkpoint::manifest(dir).unwrap();
    let g = graphs::load(
        &graph(),
        &LoadOptions {
            mmap_features: true,
            reverse_edges: m.reverse_edges,
        },
    )
    .unwrap();
    let mut model = models::Model::new(
        &m.spec,
        &g,
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let partial = actors::modes::rules_of(&m.mode).unwrap().partial_params;
    actors::distributed::checkpoint::assemble(dir, &m, &mut model, partial).unwrap();
    actors::report::model_hash(&model).unwrap()
}

/// Records every step's loss.
#[derive(Default)]
pub struct Losses(pub Vec<f64>);

impl TrainObserver for Losses {
    fn step(&mut self, loss: f64) {
        self.0.push(loss);
    }
}

/// Asserts `a` and `b` agree to relative 1e-5.
pub fn close(a: f64, b: f64, what: &str) {
    let tol = 1e-5 * a.abs().max(b.abs()).max(1e-2);
    assert!((a - b).abs() <= tol, "{what}: {a} vs {b}");
}

/// Asserts two runs' step losses agree step by step.
pub fn same_losses(want: &[f64], got: &[f64], what: &str) {
    assert_eq!(want.len(), got.len(), "{what}: steps");
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        close(*a, *b, &format!("{what}, loss of step {i}"));
    }
}

/// Asserts a distributed run's final model is the single-process one: every
/// dense parameter within the tolerance summation order and Adam leave, every
/// embedding row to 1e-5.
pub fn same_model(want: &models::Model, got: &models::Model, what: &str) {
    same_model_within(want, got, what, 3e-4);
}

/// Asserts `got` reports what `want` does per epoch: each task's name, own
/// loss (to 1e-5) and regression figures (test RMSE to 1e-3), and its
/// validation and test accuracies within `acc`.
pub fn same_task_figures(want: &actors::Report, got: &actors::Report, what: &str, acc: f64) {
    for (a, b) in want.epochs.iter().zip(&got.epochs) {
        assert_eq!(a.tasks.len(), b.tasks.len(), "{what}");
        assert_eq!(a.regression.is_some(), b.regression.is_some(), "{what}");
        if let (Some(x), Some(y)) = (a.regression.as_ref(), b.regression.as_ref()) {
            assert!(
                (x.test.rmse - y.test.rmse).abs() < 1e-3,
                "{what}: test RMSE"
            );
        }
        for (x, y) in a.tasks.iter().zip(&b.tasks) {
            assert_eq!(x.task, y.task, "{what}");
            close(x.loss, y.loss, &format!("{what}: {}'s loss", x.task));
            assert_eq!(x.regression.is_some(), y.regression.is_some(), "{what}");
            for (p, q) in [(x.valid_acc, y.valid_acc), (x.test_acc, y.test_acc)] {
                if let (Some(p), Some(q)) = (p, q) {
                    assert!(
                        (p - q).abs() < acc,
                        "{what}: {} accuracy {p} vs {q}",
                        x.task
                    );
                }
            }
        }
    }
}

/// [`same_model`] with dense parameters within `rel` of their scale.
pub fn same_model_within(want: &models::Model, got: &models::Model, what: &str, rel: f32) {
    same_model_rows_within(want, got, what, rel, 1e-5);
}

/// [`same_model_within`] with embedding rows within `rows` (relative, at least 1 absolute scale).
pub fn same_model_rows_within(
    want: &models::Model,
    got: &models::Model,
    what: &str,
    rel: f32,
    row_tol: f32,
) {
    use candle_core::DType;
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
        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        // Summing gradients in another order changes their last bits, and
        // Adam turns a near-zero gradient's noise into a step of up to lr:
        // after these steps that leaves up to ~5e-5 of the parameter's
        // scale. A lost or double-counted gradient moves it by ~lr (1e-2).
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= rel * scale.max(1e-3) + 1e-6,
                "{what}, parameter {name}: {x} vs {y} (scale {scale})"
            );
        }
    }
    let tables: Vec<_> = want.embeddings.iter().flatten().collect();
    let rows: Vec<_> = got.embeddings.iter().flatten().collect();
    assert_eq!(tables.len(), rows.len());
    for (t, e) in tables.iter().zip(rows) {
        assert_eq!(t.name, e.name);
        for (x, y) in t.data.iter().zip(&e.data) {
            assert!(
                (x - y).abs() <= row_tol * x.abs().max(1.0),
                "{what}, {}: {x} vs {y}",
                t.name
            );
        }
    }
}

/// A small link-prediction run on the test graph (author writes paper).
pub const LINK_BASE: [&str; 8] = [
    "training.epochs=2",
    "training.batch=512",
    "training.hidden=16",
    "training.embed_dim=8",
    "training.task=\"link-prediction\"",
    "training.target_relations=\"author__writes__paper\"",
    "training.link_eval=\"sampled\"",
    "training.eval_negatives=100",
];
