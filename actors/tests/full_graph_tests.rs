//! Full-graph training in one process: one worker is sampled training over
//! every neighbour with the whole training set as the batch; several
//! workers broadcasting every block are one worker, on every task of the
//! target nodes; the staleness rules skip what they say; and an interrupted
//! run resumes, cache and all, to the same bits.

mod common;

use std::path::PathBuf;

use actors::{train, Config};
use common::{close, derived, same_losses, same_model_within, Losses, Notes};
use graphs::partition::{self, Method};
use graphs::NoProgress;

fn partitions(parts: usize, method: Method) -> PathBuf {
    derived(&format!("{method}-{parts}"), false, |g, out| {
        let a = partition::assign_two_level(g, parts, 1, method, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    })
}

const BASE: [&str; 4] = [
    "training.epochs=3",
    "training.hidden=16",
    "training.embed_dim=8",
    "training.dropout=0.5",
];

fn full(parts: usize, method: Method, extra: &[&str]) -> Config {
    let mut set = vec![
        "training.mode=\"full-graph\"".to_string(),
        format!(
            "training.partitions={:?}",
            partitions(parts, method).display().to_string()
        ),
    ];
    set.extend(extra.iter().map(|s| s.to_string()));
    common::config(&BASE, &set)
}

#[test]
fn one_worker_is_sampled_training_over_every_neighbour_with_one_batch() {
    // Every training node in one batch, every neighbour sampled: the same
    // rows, the same dropout masks (keyed by node), the same loss.
    let sampled = common::config(
        &BASE,
        &[
            "training.batch=1000000".into(),
            "training.fanouts=[1000000,1000000]".into(),
        ],
    );
    let mut want = Losses::default();
    let (single, model) = train(&sampled, &mut want).unwrap();
    let mut got = Losses::default();
    let (report, fin) = train(&full(1, Method::BlockRow, &[]), &mut got).unwrap();
    assert_eq!(report.mode, "full-graph");
    assert_eq!(report.steps, 3, "one step per epoch");
    same_losses(&want.0, &got.0, "one full-graph worker");
    // Full-graph products have other shapes than the batch's, so the AVX-512
    // gemm kernels block their sums differently, and Adam turns the rounding
    // of near-zero gradients into steps (1.8e-4 at scale 0.23 seen). A lost
    // or doubled gradient still moves a parameter by ~lr = 1e-2, 20x this bound.
    same_model_within(&model, &fin, "one full-graph worker", 2e-3);
    for (a, b) in single.epochs.iter().zip(&report.epochs) {
        close(a.test_acc.unwrap(), b.test_acc.unwrap(), "test accuracy");
        close(
            a.macro_f1.unwrap()[1],
            b.macro_f1.unwrap()[1],
            "test macro F1",
        );
        close(
            a.valid_acc.unwrap(),
            b.valid_acc.unwrap(),
            "validation accuracy",
        );
    }
    let f = report.epochs[0]
        .figures::<actors::full_graph::figures::FullEpoch>("full")
        .expect("full-graph figures");
    assert_eq!(
        (f.forward_bytes, f.backward_bytes),
        (0, 0),
        "one worker broadcasts nothing"
    );
}

#[test]
fn workers_broadcasting_every_block_follow_one_worker() {
    let mut one = Losses::default();
    let (reference, model) = train(&full(1, Method::BlockRow, &[]), &mut one).unwrap();
    let runs: [(usize, Method, &[&str]); 3] = [
        (2, Method::BlockRow, &[]),
        (3, Method::BlockRowRandom, &["training.allreduce=\"ring\""]),
        (3, Method::Metis, &[]),
    ];
    for (parts, method, extra) in runs {
        let what = format!("{parts} workers ({method}) {extra:?}");
        let mut losses = Losses::default();
        let (report, fin) = train(&full(parts, method, extra), &mut losses).unwrap();
        same_losses(&one.0, &losses.0, &what);
        near_model(&model, &fin, &what);
        for (a, b) in reference.epochs.iter().zip(&report.epochs) {
            assert!(
                (a.test_acc.unwrap() - b.test_acc.unwrap()).abs() < 0.01,
                "{what}: test accuracy {:?} vs {:?}",
                a.test_acc,
                b.test_acc
            );
        }
        let (first, second) = (
            report.epochs[0]
                .figures::<actors::full_graph::figures::FullEpoch>("full")
                .unwrap(),
            report.epochs[1]
                .figures::<actors::full_graph::figures::FullEpoch>("full")
                .unwrap(),
        );
        assert!(
            first
                .blocks
                .values()
                .all(|c| c.skipped == 0 && c.grad_skipped == 0),
            "{what}: nothing skipped: {first:?}"
        );
        assert!(
            second.forward_bytes > 0 && second.backward_bytes > 0 && second.eval_bytes > 0,
            "{what}: {second:?}"
        );
        // Constant feature blocks go once, in the first epoch: the baseline does not resend them.
        assert!(
            first.forward_bytes > second.forward_bytes,
            "{what}: {first:?} then {second:?}"
        );
        assert_eq!(
            second.forward_bytes,
            report.epochs[2]
                .figures::<actors::full_graph::figures::FullEpoch>("full")
                .unwrap()
                .forward_bytes,
            "{what}"
        );
        assert!(second.cache_bytes > 0, "{what}");
    }
}

/// Node regression, two tasks at once (classification and regression, the
/// second weighted 0.5) and weighted classes: one worker and 3 workers take the loss of
/// sampled training over every neighbour with one batch at every step, and
/// report each task's figures as it does.
#[test]
fn node_regression_and_two_tasks_follow_one_batch_training() {
    let two = "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\", weight = 0.5}]";
    for (task, set) in [
        ("node regression", "training.task=\"node-regression\""),
        ("two tasks", two),
        ("balanced classes", "training.class_weights=\"balanced\""),
    ] {
        let sampled = common::config(
            &BASE,
            &[
                "training.batch=1000000".into(),
                "training.fanouts=[1000000,1000000]".into(),
                set.into(),
            ],
        );
        let mut want = Losses::default();
        let (single, _) = train(&sampled, &mut want).unwrap();
        for (parts, method) in [(1, Method::BlockRow), (3, Method::Metis)] {
            let what = format!("{task}, {parts} workers ({method})");
            let mut got = Losses::default();
            let (report, _) = train(&full(parts, method, &[set]), &mut got).unwrap();
            same_losses(&want.0, &got.0, &what);
            common::same_task_figures(&single, &report, &what, 0.01);
        }
    }
}

/// Asserts two full-graph runs' models agree within what summing each
/// gradient over thousands of rows in another order leaves after Adam: its
/// first steps are about ±lr for any nonzero gradient element, so an element
/// whose gradient is near zero may move by a fraction of lr (1e-2) in one run
/// and not the other; a lost or doubled gradient moves whole rows by ~lr.
fn near_model(want: &models::Model, got: &models::Model, what: &str) {
    use candle_core::DType;
    let values = |t: &candle_core::Tensor| -> Vec<f32> {
        t.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    for ((name, var), (name2, var2)) in want.params.iter().zip(got.params.iter()) {
        assert_eq!(name, name2);
        let (a, b) = (values(var.as_tensor()), values(var2.as_tensor()));
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let mean =
            a.iter().zip(&b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len().max(1) as f32;
        assert!(
            worst <= 1e-3 && mean <= 1e-4,
            "{what}, parameter {name}: differs by up to {worst} (mean {mean})"
        );
    }
    for (t, e) in want
        .embeddings
        .iter()
        .flatten()
        .zip(got.embeddings.iter().flatten())
    {
        let worst = t
            .data
            .iter()
            .zip(&e.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-3,
            "{what}, {}: rows differ by up to {worst}",
            t.name
        );
    }
}

/// Sums a per-epoch count over a run's blocks of layers above the first.
fn hidden(
    report: &actors::Report,
    epoch: usize,
    f: impl Fn(&actors::full_graph::figures::BlockCounts) -> u64,
) -> u64 {
    report.epochs[epoch]
        .figures::<actors::full_graph::figures::FullEpoch>("full")
        .unwrap()
        .blocks
        .iter()
        .filter(|(k, _)| !k.starts_with("l0."))
        .map(|(_, c)| f(c))
        .sum()
}

#[test]
fn staleness_rules_skip_broadcasts_within_their_bounds() {
    let epochs = "training.epochs=4";
    let (none, _) = train(&full(2, Method::BlockRow, &[epochs]), &mut ()).unwrap();
    let mut fixed_losses = Losses::default();
    let (fixed, _) = train(
        &full(
            2,
            Method::BlockRow,
            &[epochs, "training.full-graph.staleness=\"fixed\""],
        ),
        &mut fixed_losses,
    )
    .unwrap();
    // Fixed, bound 1: every block goes in epochs 0 and 2 and is skipped in 1 and 3.
    for (e, sent) in [(0, true), (1, false), (2, true), (3, false)] {
        let (s, k) = (
            hidden(&fixed, e, |c| c.sent),
            hidden(&fixed, e, |c| c.skipped),
        );
        assert_eq!(
            (s > 0, k > 0),
            (sent, !sent),
            "fixed, epoch {e}: {s} sent, {k} skipped"
        );
    }
    let bytes = |r: &actors::Report| {
        r.epochs
            .iter()
            .map(|e| {
                e.figures::<actors::full_graph::figures::FullEpoch>("full")
                    .unwrap()
                    .forward_bytes
            })
            .sum::<u64>()
    };
    assert!(
        bytes(&fixed) < bytes(&none),
        "{} vs {}",
        bytes(&fixed),
        bytes(&none)
    );
    assert_eq!(
        fixed.epochs[0].loss, none.epochs[0].loss,
        "the first epoch has nothing stale yet"
    );
    assert!(fixed_losses.0.iter().all(|l| l.is_finite()));
    // Adaptive, bound 1: worker 1 refreshes in odd epochs, worker 0 in even ones: every epoch has both.
    let (adaptive, _) = train(
        &full(
            2,
            Method::BlockRow,
            &[epochs, "training.full-graph.staleness=\"adaptive\""],
        ),
        &mut (),
    )
    .unwrap();
    for e in 1..4 {
        assert!(
            hidden(&adaptive, e, |c| c.sent) > 0 && hidden(&adaptive, e, |c| c.skipped) > 0,
            "adaptive, epoch {e}: {:?}",
            adaptive.epochs[e].figures.get("full")
        );
    }
    // Variation: a bound no change reaches skips everything after the first epoch; a tiny one nothing.
    let (lax, _) = train(
        &full(
            2,
            Method::BlockRow,
            &[
                epochs,
                "training.full-graph.staleness=\"variation\"",
                "training.full-graph.staleness_variation=1.0",
                "training.lr=0.0001",
            ],
        ),
        &mut (),
    )
    .unwrap();
    assert_eq!(
        hidden(&lax, 3, |c| c.sent),
        0,
        "{:?}",
        lax.epochs[3].figures.get("full")
    );
    let (strict, _) = train(
        &full(
            2,
            Method::BlockRow,
            &[
                epochs,
                "training.full-graph.staleness=\"variation\"",
                "training.full-graph.staleness_variation=1e-9",
            ],
        ),
        &mut (),
    )
    .unwrap();
    assert_eq!(
        hidden(&strict, 3, |c| c.skipped),
        0,
        "{:?}",
        strict.epochs[3].figures.get("full")
    );
    // Skipping gradients too: fewer backward bytes than sending them for stale blocks.
    let (grads, _) = train(
        &full(
            2,
            Method::BlockRow,
            &[
                epochs,
                "training.full-graph.staleness=\"fixed\"",
                "training.full-graph.skip_gradients=true",
            ],
        ),
        &mut (),
    )
    .unwrap();
    let back = |r: &actors::Report, e: usize| {
        r.epochs[e]
            .figures::<actors::full_graph::figures::FullEpoch>("full")
            .unwrap()
            .backward_bytes
    };
    assert!(
        back(&grads, 1) < back(&fixed, 1),
        "{} vs {}",
        back(&grads, 1),
        back(&fixed, 1)
    );
    assert_eq!(
        back(&grads, 0),
        back(&fixed, 0),
        "nothing is stale in the first epoch"
    );
    assert!(hidden(&grads, 1, |c| c.grad_skipped) > 0);
    // The learnable rows' gradients of stale blocks stay home too (the first layer's blocks).
    let first =
        |r: &actors::Report, e: usize, f: fn(&actors::full_graph::figures::BlockCounts) -> u64| {
            r.epochs[e]
                .figures::<actors::full_graph::figures::FullEpoch>("full")
                .unwrap()
                .blocks
                .iter()
                .filter(|(k, _)| k.starts_with("l0."))
                .map(|(_, c)| f(c))
                .sum::<u64>()
        };
    assert!(first(&fixed, 1, |c| c.grad_sent) > 0 && first(&fixed, 1, |c| c.grad_skipped) == 0);
    assert!(first(&grads, 1, |c| c.grad_skipped) > 0 && first(&grads, 1, |c| c.grad_sent) == 0);
    assert!(first(&grads, 0, |c| c.grad_sent) > 0 && first(&grads, 0, |c| c.grad_skipped) == 0);
}

#[test]
fn an_interrupted_run_resumes_with_its_cache_to_the_same_bits() {
    let root = common::root().join("full-resume");
    for rule in ["variation", "adaptive"] {
        let run = |dir: &PathBuf, epochs: u64| {
            let ck = format!("training.checkpoint_dir={:?}", dir.display().to_string());
            let ep = format!("training.epochs={epochs}");
            let st = format!("training.full-graph.staleness={rule:?}");
            train(
                &full(
                    2,
                    Method::BlockRow,
                    &[
                        &ck,
                        "training.checkpoint_every=1",
                        "training.checkpoint_keep=2",
                        &ep,
                        &st,
                    ],
                ),
                &mut Notes::default(),
            )
            .unwrap()
            .0
        };
        let want = run(&root.join(format!("{rule}-reference")), 5);
        let dir = root.join(format!("{rule}-cut"));
        run(&dir, 3);
        let got = run(&dir, 5);
        assert_eq!(
            got.final_model_sha256, want.final_model_sha256,
            "{rule}: resumed after epoch 3"
        );
        assert_eq!(got.epochs[4].loss, want.epochs[4].loss, "{rule}");
        assert_eq!(
            got.epochs[4]
                .figures::<actors::full_graph::figures::FullEpoch>("full")
                .unwrap()
                .blocks,
            want.epochs[4]
                .figures::<actors::full_graph::figures::FullEpoch>("full")
                .unwrap()
                .blocks,
            "{rule}: the same skips after resuming"
        );
    }
}

#[test]
fn evaluating_every_other_epoch_leaves_the_model_and_the_evaluated_accuracies_as_they_were() {
    let epochs = "training.epochs=5";
    let (every, _) = train(
        &full(
            2,
            Method::BlockRow,
            &[epochs, "training.full-graph.staleness=\"fixed\""],
        ),
        &mut (),
    )
    .unwrap();
    let (sparse, _) = train(
        &full(
            2,
            Method::BlockRow,
            &[
                epochs,
                "training.full-graph.staleness=\"fixed\"",
                "training.eval_every=2",
            ],
        ),
        &mut (),
    )
    .unwrap();
    assert_eq!(
        sparse.final_model_sha256, every.final_model_sha256,
        "evaluation does not change the model"
    );
    // Epochs 1 and 3 (every second) and 4 (the last) are evaluated, with the same accuracies.
    for (e, (a, b)) in every.epochs.iter().zip(&sparse.epochs).enumerate() {
        let evaluated = e == 1 || e == 3 || e == 4;
        assert_eq!(
            (b.valid_acc.is_some(), b.test_acc.is_some()),
            (evaluated, evaluated),
            "epoch {e}"
        );
        if evaluated {
            assert_eq!(
                (a.valid_acc, a.test_acc),
                (b.valid_acc, b.test_acc),
                "epoch {e}"
            );
        }
        assert_eq!(a.loss, b.loss, "epoch {e}");
        // Every epoch keeps its broadcast figures; only the evaluation's bytes are missing where it did not run.
        let (fa, fb) = (
            a.figures::<actors::full_graph::figures::FullEpoch>("full")
                .unwrap(),
            b.figures::<actors::full_graph::figures::FullEpoch>("full")
                .unwrap(),
        );
        assert_eq!(
            (fa.forward_bytes, fa.backward_bytes, &fa.blocks),
            (fb.forward_bytes, fb.backward_bytes, &fb.blocks),
            "epoch {e}"
        );
        assert_eq!(fb.eval_bytes > 0, evaluated, "epoch {e}");
    }
}

/// The error parsing `set` (over the test's base settings) gives.
fn refused(set: &[&str]) -> String {
    let mut o: Vec<String> = BASE.iter().chain(set).map(|s| s.to_string()).collect();
    o.push(format!(
        "training.data={:?}",
        common::graph().display().to_string()
    ));
    Config::parse("", &o).expect_err("refused").to_string()
}

#[test]
fn full_graph_settings_are_checked() {
    let err = refused(&["training.full-graph.staleness=\"fixed\""]);
    assert!(
        err.contains(
            "[training.full-graph] applies to training.mode = \"full-graph\", not \"single\""
        ),
        "{err}"
    );
    let err = refused(&[
        "training.mode=\"full-graph\"",
        "training.full-graph.skip_gradients=true",
    ]);
    assert!(err.contains("needs a staleness rule"), "{err}");
    let err = refused(&[
        "training.mode=\"full-graph\"",
        "training.full-graph.staleness_epochs=0",
    ]);
    assert!(err.contains("staleness_epochs"), "{err}");
    let err = refused(&[
        "training.mode=\"full-graph\"",
        "training.full-graph.staleness_variation=2.0",
    ]);
    assert!(err.contains("staleness_variation"), "{err}");
    let err = refused(&["training.mode=\"full-graph\"", "training.model=\"hgt\""]);
    assert!(err.contains("rgcn and rgat"), "{err}");
    let err = refused(&[
        "training.mode=\"full-graph\"",
        "training.full-graph.staleness=\"sometimes\"",
    ]);
    assert!(err.contains("sometimes"), "{err}");
    let err = train(
        &common::config(&BASE, &["training.mode=\"full-graph\"".into()]),
        &mut (),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("training.partitions"), "{err}");
}
