//! Edge classification and edge regression on the generator's labelled
//! `writes` edges: they learn the planted targets, runs are reproducible,
//! a step never sees its own edges, and runs that cannot train are refused.

mod common;

use actors::task::edge::EdgeTask;
use actors::{train, Config};
use common::{derived, Losses};
use graphs::link::NoExclusion;
use graphs::partition::{self, Method};
use graphs::{LoadOptions, NoProgress, Sampler};

const WRITES: &str = "author__writes__paper";

fn config(task: &str, extra: &[&str]) -> Config {
    let mut base = vec![
        "training.epochs=4".to_string(),
        "training.batch=512".into(),
        "training.hidden=32".into(),
        "training.embed_dim=16".into(),
        "training.dropout=0.0".into(),
        format!("training.task={task:?}"),
        format!("training.target_relations={WRITES:?}"),
    ];
    base.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = base.iter().map(String::as_str).collect();
    common::config(&refs, &[])
}

/// The share of the larger class among the test edges: what always
/// guessing it scores.
fn majority_share() -> f64 {
    let g = graphs::load(&common::graph(), &LoadOptions::default()).unwrap();
    let t = g
        .relation(g.relation_id(WRITES).unwrap())
        .targets()
        .unwrap();
    let ones = t.test.labels.iter().filter(|&&l| l == 1).count() as f64;
    let n = t.test.len() as f64;
    (ones / n).max(1.0 - ones / n)
}

#[test]
fn edge_classification_learns_the_planted_labels_and_repeats_bit_for_bit() {
    let cfg = config("edge-classification", &[]);
    let (report, model) = train(&cfg, &mut Losses::default()).unwrap();
    let last = report.epochs.last().unwrap();
    let (acc, [_, auc]) = (last.test_acc.unwrap(), last.roc_auc.unwrap());
    let floor = majority_share();
    assert!(
        acc > floor + 0.05,
        "test accuracy {acc} vs majority {floor}"
    );
    assert!(auc > 0.75, "test ROC-AUC {auc}");
    let [_, f1] = last.macro_f1.unwrap();
    assert!(f1 > 0.65, "test macro F1 {f1}");
    let r = report.edge.as_ref().unwrap();
    assert_eq!(r.relations, vec![WRITES.to_string()]);
    assert!(r.train_edges > 5 * r.valid_edges && r.valid_edges > 0 && r.test_edges > 0);
    // The loss falls.
    assert!(last.loss < report.epochs[0].loss);

    let (again, model2) = train(&cfg, &mut Losses::default()).unwrap();
    common::same_model(&model, &model2, "a second run");
    assert_eq!(again.epochs.last().unwrap().roc_auc, last.roc_auc);

    // The bilinear decoder is another model, and learns too.
    let cfg = config(
        "edge-classification",
        &["training.edge_decoder=\"distmult\""],
    );
    let (report, _) = train(&cfg, &mut Losses::default()).unwrap();
    let [_, auc] = report.epochs.last().unwrap().roc_auc.unwrap();
    assert!(auc > 0.75, "distmult test ROC-AUC {auc}");
}

#[test]
fn edge_regression_fits_the_planted_values() {
    for loss in ["mse", "huber"] {
        let cfg = config(
            "edge-regression",
            &[&format!("training.regression_loss={loss:?}")],
        );
        let (report, _) = train(&cfg, &mut Losses::default()).unwrap();
        let r = report.epochs.last().unwrap().regression.unwrap();
        assert!(r.test.r2 > 0.3, "{loss}: test R^2 {}", r.test.r2);
        assert!(r.test.rmse > 0.0 && r.test.mae <= r.test.rmse);
        // No class metrics for values.
        assert!(report.epochs.last().unwrap().roc_auc.is_none());
        // The best epoch is the one of least validation RMSE, with its test RMSE.
        let best = report.best.as_ref().unwrap();
        let least = report
            .epochs
            .iter()
            .min_by(|a, b| {
                let (a, b) = (
                    a.regression.unwrap().valid.rmse,
                    b.regression.unwrap().valid.rmse,
                );
                a.total_cmp(&b)
            })
            .unwrap();
        assert_eq!(best.metric, "rmse");
        assert_eq!(best.epoch, least.epoch);
        assert_eq!(best.test, least.regression.unwrap().test.rmse);
    }
}

#[test]
fn a_step_never_samples_its_own_target_edges_nor_their_reverses() {
    let cfg = config("edge-classification", &[]);
    let g = graphs::load(
        &common::graph(),
        &LoadOptions {
            mmap_features: true,
            reverse_edges: true,
        },
    )
    .unwrap();
    let task = EdgeTask::prepare(&cfg.training, &g).unwrap();
    let (rid, rev) = (
        g.relation_id(WRITES).unwrap(),
        g.relation_id("paper__rev_writes__author").unwrap(),
    );
    let (epoch, step) = (1u64, 2u64);
    let ids = &task.batches(epoch)[step as usize];
    assert!(ids.len() > 100, "{} edges in the step", ids.len());
    let batch = task.batch(&g, ids);
    let pairs: std::collections::HashSet<(u32, u32)> = (0..batch.edges.len())
        .map(|i| (batch.edges.set.src[i], batch.edges.set.dst[i]))
        .collect();
    // Fanouts above every degree: full neighbourhoods, minus the step's edges.
    let mut s = Sampler::new(&g, &[1000, 1000], 3).unwrap();
    let mb = s
        .sample_typed(epoch, step, &batch.seeds, &task.exclusion(epoch, step))
        .unwrap();
    let mut seen = 0;
    for block in &mb.blocks {
        for br in &block.relations {
            let rel = g.relation(br.relation);
            for (d, sl) in br.edges() {
                let (dst, src) = (
                    block.dst[rel.dst.index()][d as usize],
                    block.src[rel.src.index()][sl as usize],
                );
                if br.relation == rid {
                    assert!(
                        !pairs.contains(&(src, dst)),
                        "target edge {src} -> {dst} sampled"
                    );
                    seen += 1;
                }
                if br.relation == rev {
                    assert!(
                        !pairs.contains(&(dst, src)),
                        "reverse of target edge {dst} -> {src} sampled"
                    );
                }
            }
        }
    }
    assert!(seen > 0, "other writes edges are still sampled");
    // Without the exclusion, the same sampler draws some of them.
    let full = s
        .sample_typed(epoch, step, &batch.seeds, &NoExclusion)
        .unwrap();
    assert!(full.num_edges() > mb.num_edges());
    // Every training edge falls in exactly one step of an epoch.
    let mut all: Vec<u32> = task.batches(epoch).concat();
    all.sort_unstable();
    assert_eq!(all, (0..task.train.len() as u32).collect::<Vec<_>>());
}

#[test]
fn runs_that_cannot_train_an_edge_task_are_refused() {
    let parse = |o: &[&str]| {
        let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
        Config::parse("", &o).err().map(|e| e.to_string())
    };
    let err = parse(&["training.task=\"edge-classification\""]).unwrap();
    assert!(err.contains("training.target_relations"), "{err}");
    let err = parse(&[
        "training.task=\"edge-regression\"",
        "training.target_relations=\"a__b__c\"",
        "training.model=\"mlp\"",
    ])
    .unwrap();
    assert!(err.contains("relational model"), "{err}");
    let err = parse(&[
        "training.task=\"edge-classification\"",
        "training.target_relations=\"a__b__c\"",
        "training.mode=\"raf\"",
    ])
    .unwrap();
    assert!(
        err.contains("edge-classification")
            && err.contains("single")
            && err.contains("data-parallel"),
        "{err}"
    );
    for (key, want) in [
        ("training.edge_eval=\"exact\"", "edge_eval"),
        ("training.data-parallel.sampling=\"dag\"", "pipeline"),
    ] {
        let err = parse(&[
            "training.task=\"edge-classification\"",
            "training.target_relations=\"a__b__c\"",
            "training.mode=\"data-parallel\"",
            key,
        ])
        .unwrap();
        assert!(err.contains(want), "{err}");
    }
    let err = parse(&["training.edge_decoder=\"bilinear\""]).unwrap();
    assert!(err.contains("edge_decoder"), "{err}");
    // A best-epoch metric the task does not measure.
    let err = parse(&["training.select_metric=\"roc-auc\""]).unwrap();
    assert!(
        err.contains("select_metric") && err.contains("node-classification"),
        "{err}"
    );
    // Every mode measures the macro F1 of node classification.
    let err = parse(&[
        "training.select_metric=\"macro-f1\"",
        "training.mode=\"raf\"",
    ]);
    assert!(err.is_none(), "{err:?}");

    // A relation without edge targets, and one not in the graph.
    for (rel, want) in [
        ("paper__cites__paper", "has no edge labels"),
        ("paper__wrote__author", "is not a relation"),
        (
            "paper__rev_writes__author",
            "name the stored one (author__writes__paper)",
        ),
    ] {
        let mut cfg = config("edge-classification", &[]);
        cfg.training.target_relations = vec![rel.into()];
        let err = train(&cfg, &mut Losses::default())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(rel) && err.contains(want), "{err}");
    }
}

/// Partitions of the test graph into `parts` with `trainers` each.
fn partitions(parts: usize, trainers: usize, method: Method) -> std::path::PathBuf {
    derived(
        &format!("edge-{method}-{parts}x{trainers}"),
        false,
        |g, out| {
            let a = partition::assign_two_level(g, parts, trainers, method, 0).unwrap();
            partition::write(g, &a, out, false, &mut NoProgress).unwrap();
        },
    )
}

#[test]
fn data_parallel_edge_tasks_follow_single_process_training() {
    for (task, parts, trainers, method) in [
        ("edge-classification", 2, 1, Method::Metis),
        ("edge-regression", 2, 2, Method::Random),
    ] {
        let what = format!("{task}, {parts} partitions x {trainers} trainers");
        // Evaluation by sampled neighbourhoods, as data-parallel training's.
        let base = ["training.epochs=1", "training.edge_eval=\"sampled\""];
        let mut single_losses = Losses::default();
        let (single, _) = train(&config(task, &base), &mut single_losses).unwrap();
        let pdir = partitions(parts, trainers, method);
        let mut dp = base.to_vec();
        let (mode, dir) = (
            "training.mode=\"data-parallel\"".to_string(),
            format!("training.partitions={:?}", pdir.display().to_string()),
        );
        dp.extend([mode.as_str(), dir.as_str()]);
        let mut losses = Losses::default();
        let (report, _) = train(&config(task, &dp), &mut losses).unwrap();
        assert_eq!(
            (report.mode.as_str(), report.nodes, report.steps),
            ("data-parallel", parts, single.steps),
            "{what}"
        );
        // The same steps on the same samples: the same losses to 1e-5 at
        // first; later steps drift apart (to ~1e-4 by the epoch's end):
        // Adam amplifies the rounding of gradient elements below its eps
        // (see docs/guide/tasks.md, "Equality across modes").
        let (a, b) = (&single_losses.0, &losses.0);
        assert_eq!(a.len(), b.len(), "{what}: steps");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let tol = if i < 16 { 1e-5 } else { 1e-3 } * x.abs().max(1e-2);
            assert!((x - y).abs() <= tol, "{what}: loss of step {i}: {x} vs {y}");
        }
        // Every validation and test edge scored once, by a trainer of its source's partition.
        let (a, b) = (single.epochs.last().unwrap(), report.epochs.last().unwrap());
        let close = |x: f64, y: f64, m: &str| {
            assert!((x - y).abs() < 0.02, "{what}: {m} {x} vs {y}");
        };
        close(a.train_acc, b.train_acc, "train accuracy");
        match task {
            "edge-classification" => {
                close(a.test_acc.unwrap(), b.test_acc.unwrap(), "test accuracy");
                let (x, y) = (a.roc_auc.unwrap(), b.roc_auc.unwrap());
                close(x[1], y[1], "test ROC-AUC");
                let (x, y) = (a.macro_f1.unwrap(), b.macro_f1.unwrap());
                close(x[1], y[1], "test macro F1");
            }
            _ => {
                let (x, y) = (a.regression.unwrap(), b.regression.unwrap());
                assert!(
                    (x.test.rmse - y.test.rmse).abs() < 0.02 * x.test.rmse,
                    "{what}: test RMSE {} vs {}",
                    x.test.rmse,
                    y.test.rmse
                );
            }
        }
    }
}
