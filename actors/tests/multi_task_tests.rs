//! Several node tasks trained at once (`training.tasks`): one listed task is
//! that task alone, bit for bit; two tasks learn both and report each;
//! data-parallel training follows single-process training step by step; and
//! lists or modes that cannot train them are refused with the reason.

mod common;

use actors::{train, Config};
use common::{close, derived, same_losses, Losses};
use graphs::partition::{self, Method};
use graphs::NoProgress;

const BASE: [&str; 5] = [
    "training.epochs=3",
    "training.batch=256",
    "training.hidden=16",
    "training.embed_dim=8",
    "training.dropout=0.0",
];

fn config(extra: &[&str]) -> Config {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    common::config(&BASE, &extra)
}

fn refusal(extra: &[&str]) -> String {
    let mut o: Vec<String> = BASE.iter().map(|s| s.to_string()).collect();
    o.extend(extra.iter().map(|s| s.to_string()));
    Config::parse("", &o).unwrap_err().to_string()
}

#[test]
fn one_listed_task_is_that_task_alone_bit_for_bit() {
    for (task, list) in [
        ("node-classification", "[{task = \"node-classification\"}]"),
        (
            "node-regression",
            "[{task = \"node-regression\", weight = 1.0}]",
        ),
    ] {
        let mut alone = Losses::default();
        let (a, _) = train(&config(&[&format!("training.task=\"{task}\"")]), &mut alone).unwrap();
        let mut listed = Losses::default();
        let (b, _) = train(&config(&[&format!("training.tasks={list}")]), &mut listed).unwrap();
        // `training.task` is the list's first when not given.
        assert_eq!(b.config.training.task.name(), task);
        assert_eq!(alone.0, listed.0, "{task}: step losses");
        assert_eq!(a.final_model_sha256, b.final_model_sha256, "{task}");
        // The one task's own figures are the run's.
        for (x, y) in a.epochs.iter().zip(&b.epochs) {
            assert_eq!(y.tasks.len(), 1);
            assert_eq!(y.tasks[0].task, task);
            close(y.tasks[0].loss, x.loss, "the task's loss");
            assert_eq!(y.tasks[0].regression, x.regression);
        }
    }
}

#[test]
fn two_tasks_learn_both_and_report_each() {
    let mut losses = Losses::default();
    let (r, model) = train(
        &config(&[
            "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\", weight = 0.5}]",
        ]),
        &mut losses,
    )
    .unwrap();
    let g = graphs::load(&common::graph(), &Default::default()).unwrap();
    // One row of outputs: the classes, then the value.
    assert_eq!(
        model.spec().outputs(&g),
        g.num_classes() as usize + 1,
        "outputs side by side"
    );
    let (first, last) = (&r.epochs[0], r.epochs.last().unwrap());
    for e in &r.epochs {
        let [c, v] = [&e.tasks[0], &e.tasks[1]];
        assert_eq!(
            (c.task.as_str(), v.task.as_str()),
            ("node-classification", "node-regression")
        );
        assert_eq!((c.weight, v.weight), (1.0, 0.5));
        // The loss trained on is the weighted sum of the tasks' own.
        close(e.loss, c.loss + 0.5 * v.loss, "weighted sum");
        // The top-level figures are the primary task's.
        assert_eq!(c.valid_acc, e.valid_acc);
        assert_eq!(c.macro_f1, e.macro_f1);
        assert!(c.regression.is_none() && v.valid_acc.is_none());
        assert!(v.regression.is_some());
    }
    // Both learn.
    assert!(last.tasks[0].loss < first.tasks[0].loss, "{:?}", r.epochs);
    assert!(
        last.tasks[1].loss < 0.7 * first.tasks[1].loss,
        "{:?}",
        r.epochs
    );
    // The best epoch is picked by the primary task's metric.
    assert_eq!(r.best.as_ref().unwrap().metric, "accuracy");
}

#[test]
fn three_tasks_with_label_sets_train_and_report_their_metrics() {
    let (r, _) = train(
        &config(&[
            "training.epochs=1",
            "training.tasks=[{task = \"multi-label\"}, {task = \"node-classification\", weight = 0.2}, {task = \"node-regression\", weight = 0.2}]",
        ]),
        &mut Losses::default(),
    )
    .unwrap();
    let e = &r.epochs[0];
    assert_eq!(r.config.training.task.name(), "multi-label");
    assert_eq!(e.tasks.len(), 3);
    assert!(e.tasks[0].micro_f1.is_some() && e.micro_f1 == e.tasks[0].micro_f1);
    assert!(e.tasks[1].valid_acc.is_some() && e.tasks[2].regression.is_some());
    close(
        e.loss,
        e.tasks[0].loss + 0.2 * e.tasks[1].loss + 0.2 * e.tasks[2].loss,
        "weighted sum",
    );
}

#[test]
fn data_parallel_training_follows_single_process_training_on_two_tasks() {
    let tasks = "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\", weight = 0.5}]";
    let mut single_losses = Losses::default();
    let (single, model) =
        train(&config(&["training.epochs=2", tasks]), &mut single_losses).unwrap();
    for (parts, method) in [(2, Method::Metis), (3, Method::Random)] {
        let dir = derived(&format!("multi-{method}-{parts}"), false, |g, out| {
            let a = partition::assign_two_level(g, parts, 1, method, 0).unwrap();
            partition::write(g, &a, out, false, &mut NoProgress).unwrap();
        });
        let dir = format!("training.partitions={:?}", dir.display().to_string());
        let cfg = config(&[
            "training.epochs=2",
            tasks,
            "training.mode=\"data-parallel\"",
            &dir,
        ]);
        let mut losses = Losses::default();
        let (report, fin) = train(&cfg, &mut losses).unwrap();
        let what = format!("{parts} trainers");
        assert_eq!(
            (report.nodes, report.steps),
            (parts, single.steps),
            "{what}"
        );
        same_losses(&single_losses.0, &losses.0, &what);
        // Two heads' gradients summed in another order leave rows a little
        // further apart than one head's: within 2e-4 (a lost or doubled
        // gradient moves them by ~lr, 1e-2).
        common::same_model_rows_within(&model, &fin, &what, 3e-4, 2e-4);
        // Each task's own figures: its loss, and its evaluation summed over the trainers.
        for (a, b) in single.epochs.iter().zip(&report.epochs) {
            assert_eq!(b.tasks.len(), 2, "{what}");
            for (x, y) in a.tasks.iter().zip(&b.tasks) {
                assert_eq!(x.task, y.task);
                close(x.loss, y.loss, &format!("{what}: {}'s loss", x.task));
                assert_eq!(x.valid_acc.is_some(), y.valid_acc.is_some(), "{what}");
                if let (Some(p), Some(q)) = (x.valid_acc, y.valid_acc) {
                    assert!(
                        (p - q).abs() < 1e-3,
                        "{what}: {} accuracy {p} vs {q}",
                        x.task
                    );
                }
                if let (Some(p), Some(q)) = (x.regression, y.regression) {
                    assert!(
                        (p.test.rmse - q.test.rmse).abs() < 1e-3,
                        "{what}: test RMSE"
                    );
                }
                assert_eq!(x.regression.is_some(), y.regression.is_some(), "{what}");
            }
            assert_eq!(
                b.tasks[0].valid_acc, b.valid_acc,
                "{what}: the primary task's figures"
            );
        }
    }
}

#[test]
fn a_two_task_data_parallel_run_resumed_mid_epoch_ends_as_an_uninterrupted_one() {
    let parts = derived("multi-metis-2", false, |g, out| {
        let a = partition::assign_two_level(g, 2, 1, Method::Metis, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    });
    let cfg = |dir: &std::path::Path, epochs: u64| {
        config(&[
            "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\", weight = 0.5}]",
            "training.mode=\"data-parallel\"",
            &format!("training.partitions={:?}", parts.display().to_string()),
            &format!("training.checkpoint_dir={:?}", dir.display().to_string()),
            "training.checkpoint_every=2",
            "training.checkpoint_keep=2",
            &format!("training.epochs={epochs}"),
        ])
    };
    let root = common::root().join("multi-task-resume");
    let (want, _) = train(&cfg(&root.join("reference"), 2), &mut ()).unwrap();
    let per_epoch = want.steps / 2;
    // One epoch, its end-of-epoch checkpoint dropped: the newest left lies inside it.
    let dir = root.join("mid");
    train(&cfg(&dir, 1), &mut ()).unwrap();
    let kept = actors::distributed::checkpoint::list(&dir).unwrap();
    std::fs::remove_dir_all(kept.last().unwrap()).unwrap();
    let mid = actors::distributed::checkpoint::manifest(&kept[0])
        .unwrap()
        .seq;
    assert!(
        !mid.is_multiple_of(per_epoch),
        "step {mid} is inside an epoch of {per_epoch} steps"
    );
    let (got, _) = train(&cfg(&dir, 2), &mut ()).unwrap();
    assert_eq!(
        got.final_model_sha256, want.final_model_sha256,
        "resumed mid-epoch at step {mid}"
    );
    // Each task's loss of the interrupted epoch counts the steps before the checkpoint.
    for (a, b) in want.epochs.iter().zip(&got.epochs) {
        assert_eq!(b.tasks.len(), 2);
        for (x, y) in a.tasks.iter().zip(&b.tasks) {
            assert_eq!(x.task, y.task);
            assert_eq!(x.loss, y.loss, "epoch {}: {}'s loss", a.epoch, x.task);
            assert_eq!(x.regression, y.regression, "epoch {}: {}", a.epoch, x.task);
        }
    }
}

/// The test graph with the paper values of every third node (and, with
/// `none`, of every node) missing (NaN).
fn partial_values(none: bool) -> std::path::PathBuf {
    let name = if none { "no-values" } else { "partial-values" };
    derived(name, false, |g, out| {
        graphs::save(g, out, false).unwrap();
        let values: Vec<f32> = g
            .target_values()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(n, &v)| if none || n % 3 == 0 { f32::NAN } else { v })
            .collect();
        let path = out.join("nodes/paper/values.npy");
        graphs::npy::write_f32(&path, &[values.len() as u64], &values).unwrap();
    })
}

#[test]
fn a_task_missing_on_some_nodes_leaves_them_out_and_data_parallel_follows() {
    let data = partial_values(false);
    let on = |extra: &[&str]| {
        let mut o: Vec<String> = BASE.iter().map(|s| s.to_string()).collect();
        o.push(format!("training.data={:?}", data.display().to_string()));
        o.push("training.epochs=2".into());
        o.extend(extra.iter().map(|s| s.to_string()));
        Config::parse("", &o)
    };
    let tasks = "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\", weight = 0.5}]";
    let mut single_losses = Losses::default();
    let (single, model) = train(&on(&[tasks]).unwrap(), &mut single_losses).unwrap();
    // A node without a value would make the loss and the RMSE NaN.
    for e in &single.epochs {
        let reg = &e.tasks[1];
        assert!(e.loss.is_finite() && reg.loss.is_finite(), "{e:?}");
        let r = reg.regression.unwrap();
        assert!(r.valid.rmse.is_finite() && r.test.rmse.is_finite(), "{r:?}");
        // Classification counts every node: its accuracy is the run's.
        assert_eq!(e.tasks[0].valid_acc, e.valid_acc);
    }
    let last = single.epochs.last().unwrap();
    assert!(
        last.tasks[1].loss < single.epochs[0].tasks[1].loss,
        "{:?}",
        single.epochs
    );
    // Data-parallel trainers add up to the same losses.
    let g = graphs::load(&data, &Default::default()).unwrap();
    let parts = common::root().join("partial-values-metis-2");
    if !parts.exists() {
        let a = partition::assign_two_level(&g, 2, 1, Method::Metis, 0).unwrap();
        partition::write(&g, &a, &parts, false, &mut NoProgress).unwrap();
    }
    let dir = format!("training.partitions={:?}", parts.display().to_string());
    let mut losses = Losses::default();
    let (dp, fin) = train(
        &on(&[tasks, "training.mode=\"data-parallel\"", &dir]).unwrap(),
        &mut losses,
    )
    .unwrap();
    same_losses(&single_losses.0, &losses.0, "2 trainers");
    common::same_model_rows_within(&model, &fin, "2 trainers", 3e-4, 2e-4);
    for (a, b) in single.epochs.iter().zip(&dp.epochs) {
        close(a.tasks[1].loss, b.tasks[1].loss, "the regression's loss");
        let (x, y) = (
            a.tasks[1].regression.unwrap(),
            b.tasks[1].regression.unwrap(),
        );
        assert!((x.test.rmse - y.test.rmse).abs() < 1e-3, "{x:?} vs {y:?}");
    }
    // The primary task needs its target everywhere; another task, some training nodes.
    let err =
        on(&["training.tasks=[{task = \"node-regression\"}, {task = \"node-classification\"}]"])
            .and_then(|c| train(&c, &mut Losses::default()).map(|_| ()))
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("has no value (NaN in nodes/paper/values.npy)")
            && err.contains(
                "training.tasks' first task = \"node-regression\" needs one for every node"
            ),
        "{err}"
    );
    let none = partial_values(true);
    let mut o: Vec<String> = BASE.iter().map(|s| s.to_string()).collect();
    o.push(format!("training.data={:?}", none.display().to_string()));
    o.push(tasks.into());
    let err = train(&Config::parse("", &o).unwrap(), &mut Losses::default())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"node-regression\" has nothing to learn from"),
        "{err}"
    );
}

/// Model averaging's partitions with their halo's features, as it needs them.
fn halo_partitions(parts: usize) -> String {
    let dir = derived(&format!("multi-halo-{parts}"), false, |g, out| {
        let a = partition::assign_two_level(g, parts, 1, Method::Metis, 0).unwrap();
        let opts = partition::WriteOptions {
            halo_features: true,
            ..partition::WriteOptions::default()
        };
        partition::write_with(g, &a, out, &opts, &mut NoProgress).unwrap();
    });
    format!("training.partitions={:?}", dir.display().to_string())
}

/// Model averaging trains every node task, and several at once: on one
/// partition it is the single process bit for bit (each task's loss and
/// figures included); on two, each partition's model learns both tasks and
/// the report has each one's figures.
#[test]
fn model_averaging_trains_node_tasks_as_the_single_process_does_on_one_partition() {
    let two = "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\", weight = 0.5}]";
    let mode = "training.mode=\"model-averaging\"";
    for set in ["training.task=\"node-regression\"", two] {
        let (single, _) = train(&config(&[set]), &mut ()).unwrap();
        let one = halo_partitions(1);
        let (report, _) = train(&config(&[set, mode, &one]), &mut ()).unwrap();
        assert_eq!(report.mode, "model-averaging", "{set}");
        assert_eq!(
            report.final_model_sha256, single.final_model_sha256,
            "{set}"
        );
        for (a, b) in single.epochs.iter().zip(&report.epochs) {
            assert_eq!(a.loss, b.loss, "{set}");
            assert_eq!(a.regression, b.regression, "{set}");
            assert_eq!(a.tasks.len(), b.tasks.len(), "{set}");
            for (x, y) in a.tasks.iter().zip(&b.tasks) {
                assert_eq!(
                    (&x.task, x.loss, x.test_acc, x.regression),
                    (&y.task, y.loss, y.test_acc, y.regression),
                    "{set}"
                );
            }
        }
    }
    let halves = halo_partitions(2);
    let (report, _) = train(&config(&[two, mode, &halves]), &mut ()).unwrap();
    let (first, last) = (&report.epochs[0], report.epochs.last().unwrap());
    assert_eq!(last.tasks.len(), 2);
    for k in 0..2 {
        assert!(
            last.tasks[k].loss < first.tasks[k].loss,
            "{:?}",
            report.epochs
        );
    }
    assert!(last.tasks[0].test_acc.is_some(), "{:?}", last.tasks);
    let rmse = last.tasks[1].regression.unwrap().test.rmse;
    assert!(rmse.is_finite() && rmse > 0.0, "{rmse}");
}

#[test]
fn lists_and_modes_that_cannot_train_together_are_refused() {
    for (extra, want) in [
        (
            vec!["training.tasks=[{task = \"node-classification\"}, {task = \"link-prediction\"}]"],
            "training.task = \"link-prediction\" needs training.target_relations",
        ),
        (
            vec!["training.tasks=[{task = \"node-regression\"}, {task = \"node-regression\"}]"],
            "lists \"node-regression\" twice",
        ),
        (
            vec!["training.tasks=[{task = \"node-regression\", weight = 0.0}]"],
            "every weight is 0",
        ),
        (
            vec!["training.tasks=[{task = \"node-regression\", weight = -1.0}]"],
            "must be a finite number of at least 0",
        ),
        (
            vec![
                "training.task=\"multi-label\"",
                "training.tasks=[{task = \"node-regression\"}]",
            ],
            "the first task is the primary one",
        ),
        (
            vec!["training.tasks=[{task = \"node-regression\", wieght = 2.0}]"],
            "unknown field `wieght`",
        ),
        (
            vec![
                "training.mode=\"raf\"",
                "training.tasks=[{task = \"node-classification\"}, {task = \"link-prediction\"}]",
            ],
            "training.tasks lists \"link-prediction\" beside node tasks, which runs in single and data-parallel; mode raf trains node tasks together",
        ),
    ] {
        let err = refusal(&extra);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}
