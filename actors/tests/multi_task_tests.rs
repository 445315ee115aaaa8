//! Several node tasks trained at once (`training.tasks`): one listed task is
//! that task alone, bit for bit; two tasks learn both and report each; and
//! lists or modes that cannot train them are refused with the reason.

mod common;

use actors::{train, Config};
use common::{close, Losses};

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
fn lists_and_modes_that_cannot_train_together_are_refused() {
    for (extra, want) in [
        (
            vec!["training.tasks=[{task = \"node-classification\"}, {task = \"link-prediction\"}]"],
            "\"link-prediction\" cannot be trained with other tasks yet",
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
                "training.mode=\"data-parallel\"",
                "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\"}]",
            ],
            "training.tasks (several tasks at once) runs in single; mode data-parallel does not support it yet",
        ),
    ] {
        let err = refusal(&extra);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}
