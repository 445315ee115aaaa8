//! Multi-label node classification: a set of labels per target node (the
//! generator plants 16 per paper). It learns the planted sets, data-parallel
//! training follows single-process training step by step, and runs that
//! cannot train it are refused with the reason.

mod common;

use std::path::PathBuf;

use actors::{train, Config};
use common::{derived, same_losses, same_model, Losses};
use graphs::partition::{self, Method};
use graphs::NoProgress;

const BASE: [&str; 6] = [
    "training.epochs=3",
    "training.batch=256",
    "training.hidden=16",
    "training.embed_dim=8",
    "training.task=\"multi-label\"",
    "training.dropout=0.0",
];

fn config(extra: &[String]) -> Config {
    common::config(&BASE, extra)
}

fn partitions(parts: usize, method: Method) -> PathBuf {
    derived(&format!("multi-{method}-{parts}"), false, |g, out| {
        let a = partition::assign_two_level(g, parts, 1, method, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    })
}

/// The share of the test nodes' (node, label) entries that are set: the
/// average precision of scores that know nothing.
fn test_positive_rate() -> f64 {
    let g = graphs::load(&common::graph(), &Default::default()).unwrap();
    let sets = g.target_label_sets().unwrap();
    let (_, splits) = g.target_labels();
    let ones: usize = splits
        .test
        .iter()
        .map(|&n| sets.row(n as usize).iter().filter(|&&b| b == 1).count())
        .sum();
    ones as f64 / (splits.test.len() * sets.width()) as f64
}

#[test]
fn multi_label_learns_and_data_parallel_follows_it() {
    // At S=0.003 a class has ~6 papers: learning shows within three epochs
    // at 5x the default rate (docs/guide/tasks.md has larger scales).
    let (fast, _) = train(
        &config(&["training.lr=0.05".into()]),
        &mut Losses::default(),
    )
    .unwrap();
    assert_eq!(fast.config.training.task.name(), "multi-label");
    let last = fast.epochs.last().unwrap();
    let (first_loss, last_loss) = (fast.epochs[0].loss, last.loss);
    assert!(last_loss < 0.8 * first_loss, "{first_loss} -> {last_loss}");
    // Every figure of the task is reported, and the scores rank the labels
    // above chance and better each epoch (all-zero predictions have micro F1 0).
    let [_, first_micro] = fast.epochs[0].micro_f1.expect("micro F1");
    let [_, micro] = last.micro_f1.expect("micro F1");
    let [_, macro_] = last.macro_f1.expect("macro F1 over labels");
    let [_, ap] = last.average_precision.expect("average precision");
    let [_, auc] = last.roc_auc.expect("ROC-AUC");
    let rate = test_positive_rate();
    assert!(
        micro > 1.5 * first_micro && macro_ > 0.0 && macro_ <= 1.0,
        "micro {first_micro} -> {micro}, macro {macro_}"
    );
    assert!(
        ap > 1.3 * rate && auc > 0.6,
        "AP {ap} (chance {rate}), AUC {auc}"
    );
    // The best epoch is chosen by micro F1 unless asked otherwise.
    assert_eq!(fast.best.as_ref().unwrap().metric, "micro-f1");
    // Accuracy is the share of nodes whose every label is right.
    assert!((0.0..=1.0).contains(&last.test_acc.unwrap()));

    let mut single_losses = Losses::default();
    let (single, model) = train(&config(&[]), &mut single_losses).unwrap();
    for (parts, method, mode) in [
        (2, Method::Metis, "data-parallel"),
        (3, Method::Random, "data-parallel"),
        (3, Method::Metis, "hopgnn"),
    ] {
        let cfg = config(&[
            format!("training.mode={mode:?}"),
            format!(
                "training.partitions={:?}",
                partitions(parts, method).display().to_string()
            ),
        ]);
        let mut losses = Losses::default();
        let (report, fin) = train(&cfg, &mut losses).unwrap();
        let what = format!("{mode}, {parts} trainers");
        assert_eq!(
            (report.nodes, report.steps),
            (parts, single.steps),
            "{what}"
        );
        same_losses(&single_losses.0, &losses.0, &what);
        same_model(&model, &fin, &what);
        // Every evaluated node counted once, by the trainer that owns it.
        for (a, b) in single.epochs.iter().zip(&report.epochs) {
            for (x, y, what) in [
                (a.micro_f1, b.micro_f1, "micro F1"),
                (a.macro_f1, b.macro_f1, "macro F1"),
                (a.average_precision, b.average_precision, "AP"),
                (a.roc_auc, b.roc_auc, "ROC-AUC"),
            ] {
                let ([xv, xt], [yv, yt]) = (x.unwrap(), y.unwrap());
                assert!(
                    (xv - yv).abs() < 1e-3 && (xt - yt).abs() < 1e-3,
                    "{mode}, {parts} trainers, {what}: {xv} {xt} vs {yv} {yt}"
                );
            }
        }
    }
}

#[test]
fn weighted_and_focal_multi_label_is_another_loss_that_data_parallel_follows() {
    let base = [
        "training.epochs=1".to_string(),
        "training.class_weights=\"balanced\"".into(),
        "training.focal_gamma=1.0".into(),
    ];
    let mut plain = Losses::default();
    train(&config(&base[..1]), &mut plain).unwrap();
    let mut single = Losses::default();
    let (r, _) = train(&config(&base), &mut single).unwrap();
    assert!(
        (single.0[0] - plain.0[0]).abs() > 1e-3,
        "{} vs {}",
        single.0[0],
        plain.0[0]
    );
    let cfg = config(
        &[
            &base[..],
            &[
                "training.mode=\"data-parallel\"".into(),
                format!(
                    "training.partitions={:?}",
                    partitions(2, Method::Metis).display().to_string()
                ),
            ],
        ]
        .concat(),
    );
    let mut losses = Losses::default();
    let (dr, _) = train(&cfg, &mut losses).unwrap();
    same_losses(&single.0, &losses.0, "2 trainers, weighted");
    let (a, b) = (
        r.epochs[0].micro_f1.unwrap(),
        dr.epochs[0].micro_f1.unwrap(),
    );
    assert!((a[1] - b[1]).abs() < 1e-3, "{a:?} vs {b:?}");
}

#[test]
fn runs_that_cannot_train_multi_label_are_refused() {
    // A metric multi-label does not measure.
    let err = Config::parse(
        "",
        &[
            "training.task=\"multi-label\"".into(),
            "training.select_metric=\"rmse\"".into(),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("rmse") && err.contains("multi-label"), "{err}");
    // Weights for a number of labels the graph does not have.
    let cfg = config(&["training.class_weights=[1.0, 2.0]".into()]);
    let err = train(&cfg, &mut Losses::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("16 labels"), "{err}");
    // A graph without label sets.
    let plain = derived("no-label-sets", false, |g, out| {
        graphs::save(g, out, false).unwrap();
        std::fs::remove_file(out.join("nodes/paper/label_sets.npy")).unwrap();
        let path = out.join("schema.json");
        let mut schema = graphs::Schema::read(&path).unwrap();
        schema.label_sets = None;
        schema.write(&path).unwrap();
    });
    let cfg = config(&[format!("training.data={:?}", plain.display().to_string())]);
    let err = train(&cfg, &mut Losses::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("label_sets.npy"), "{err}");
}
