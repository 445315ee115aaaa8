//! HopGNN training in one process: every worker holds the same parameters
//! within a step, so whatever the migration, merging and pre-gathering
//! settings, it follows single-process training step by step, on every task
//! of the target nodes; and an interrupted run resumes from its checkpoint to
//! the same bits.

mod common;

use std::path::PathBuf;

use actors::{train, Config};
use common::{close, derived, same_losses, same_model, Losses, Notes};
use graphs::partition::{self, Method};
use graphs::NoProgress;

fn partitions(parts: usize, method: Method) -> PathBuf {
    derived(&format!("{method}-{parts}x1"), false, |g, out| {
        let a = partition::assign_two_level(g, parts, 1, method, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    })
}

const BASE: [&str; 4] = [
    "training.epochs=2",
    "training.batch=256",
    "training.hidden=16",
    "training.embed_dim=8",
];

fn hop(parts: usize, method: Method, extra: &[&str]) -> Config {
    let mut set = vec![
        "training.mode=\"hopgnn\"".to_string(),
        format!(
            "training.partitions={:?}",
            partitions(parts, method).display().to_string()
        ),
    ];
    set.extend(extra.iter().map(|s| s.to_string()));
    common::config(&BASE, &set)
}

#[test]
fn every_migration_merging_and_gathering_setting_follows_single_process_training() {
    let mut single_losses = Losses::default();
    let (single, model) = train(&common::config(&BASE, &[]), &mut single_losses).unwrap();
    let runs: [(usize, Method, &[&str]); 6] = [
        (2, Method::Metis, &[]),
        (3, Method::Metis, &["training.hopgnn.migrate=\"gradient\""]),
        (
            3,
            Method::Random,
            &[
                "training.hopgnn.time_steps=2",
                "training.allreduce=\"ring\"",
            ],
        ),
        (
            3,
            Method::Metis,
            &[
                "training.hopgnn.time_steps=1",
                "training.hopgnn.migrate=\"gradient\"",
            ],
        ),
        (2, Method::Metis, &["training.hopgnn.pregather=false"]),
        (
            3,
            Method::Metis,
            &[
                "training.hopgnn.pregather=false",
                "training.hopgnn.time_steps=2",
            ],
        ),
    ];
    for (parts, method, extra) in runs {
        let what = format!("{parts} workers ({method}) {extra:?}");
        let mut losses = Losses::default();
        let (report, fin) = train(&hop(parts, method, extra), &mut losses).unwrap();
        assert_eq!(report.mode, "hopgnn", "{what}");
        assert_eq!(report.steps, single.steps, "{what}");
        assert_eq!(losses.0.len(), single_losses.0.len(), "{what}");
        for (i, (a, b)) in single_losses.0.iter().zip(&losses.0).enumerate() {
            close(*a, *b, &format!("{what}, loss of step {i}"));
        }
        same_model(&model, &fin, &what);
        let last = report.epochs.last().unwrap();
        let want = single.epochs.last().unwrap();
        assert!(
            (last.test_acc.unwrap() - want.test_acc.unwrap()).abs() < 0.01,
            "{what}: {:?} vs {:?}",
            last.test_acc,
            want.test_acc
        );
        let (f, wf) = (last.macro_f1.unwrap(), want.macro_f1.unwrap());
        assert!(
            (f[1] - wf[1]).abs() < 0.02,
            "{what}: macro F1 {f:?} vs {wf:?}"
        );
        let h = last
            .figures::<actors::hopgnn::figures::HopEpoch>("hop")
            .unwrap_or_else(|| panic!("{what}: no hopgnn figures"));
        let steps = extra
            .iter()
            .find_map(|s| s.strip_prefix("training.hopgnn.time_steps="))
            .map_or(parts as u32, |n| n.parse().unwrap());
        assert_eq!(h.time_steps, steps, "{what}");
        // Without merging every micrograph is trained at home: its seeds are local.
        assert!(
            h.remote_row_rate < 1.0 && !h.locality.is_empty(),
            "{what}: {h:?}"
        );
        // The rows the clients pulled are the rows the plan said it would pull.
        assert_eq!(last.remote_rows_per_step, h.rows_pulled_per_step, "{what}");
        let pregather = !extra.contains(&"training.hopgnn.pregather=false");
        if pregather {
            assert!(
                h.rows_pulled_per_step <= h.rows_pulled_per_step_without_pregathering,
                "{what}: {h:?}"
            );
        } else {
            assert_eq!(
                h.rows_pulled_per_step, h.rows_pulled_per_step_without_pregathering,
                "{what}"
            );
        }
    }
}

/// Node regression alone and two tasks at once (classification and
/// regression, the second weighted 0.5) follow single-process training step
/// by step, each task's loss and figures as the single process reports them.
#[test]
fn node_regression_and_two_tasks_follow_single_process_training() {
    let two = "training.tasks=[{task = \"node-classification\"}, {task = \"node-regression\", weight = 0.5}]";
    for (what, set) in [
        ("node regression", "training.task=\"node-regression\""),
        ("two tasks", two),
    ] {
        let mut want = Losses::default();
        let (single, model) = train(&common::config(&BASE, &[set.into()]), &mut want).unwrap();
        let mut got = Losses::default();
        let cfg = hop(3, Method::Metis, &[set, "training.hopgnn.time_steps=2"]);
        let (report, fin) = train(&cfg, &mut got).unwrap();
        assert_eq!(report.mode, "hopgnn", "{what}");
        same_losses(&want.0, &got.0, what);
        // Regression's gradients summed over workers and time steps in another
        // order: rows within 2e-4 (a lost or doubled one moves them by ~lr).
        common::same_model_rows_within(&model, &fin, what, 3e-4, 2e-4);
        common::same_task_figures(&single, &report, what, 1e-3);
    }
}

#[test]
fn micrographs_at_home_read_more_local_rows_than_merged_ones() {
    let (all, _) = train(&hop(3, Method::Metis, &["training.epochs=1"]), &mut ()).unwrap();
    let (one, _) = train(
        &hop(
            3,
            Method::Metis,
            &["training.epochs=1", "training.hopgnn.time_steps=1"],
        ),
        &mut (),
    )
    .unwrap();
    let (a, o) = (
        all.epochs[0]
            .figures::<actors::hopgnn::figures::HopEpoch>("hop")
            .unwrap(),
        one.epochs[0]
            .figures::<actors::hopgnn::figures::HopEpoch>("hop")
            .unwrap(),
    );
    assert!(
        a.remote_row_rate < o.remote_row_rate,
        "at home {a:?}, merged into one time step {o:?}"
    );
    assert!(
        a.rows_pulled_per_step < o.rows_pulled_per_step,
        "at home {a:?}, merged {o:?}"
    );
    assert!(
        a.rows_pulled_per_step < a.rows_pulled_per_step_without_pregathering,
        "pre-gathering pulls a row once per step: {a:?}"
    );
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
fn hopgnn_settings_are_checked() {
    let err = refused(&["training.hopgnn.migrate=\"gradient\""]);
    assert!(
        err.contains("[training.hopgnn] applies to training.mode = \"hopgnn\", not \"single\""),
        "{err}"
    );
    // The key's former name, in [training] itself, is refused the same way.
    let err = refused(&["training.hop_migrate=\"gradient\""]);
    assert!(
        err.contains("training.hop_migrate applies to training.mode = \"hopgnn\""),
        "{err}"
    );
    let err = refused(&["training.mode=\"hopgnn\"", "training.hopgnn.time_steps=0"]);
    assert!(err.contains("at least 1"), "{err}");
    let err = refused(&[
        "training.mode=\"hopgnn\"",
        "training.hopgnn.time_steps=\"many\"",
    ]);
    assert!(err.contains("\"auto\""), "{err}");
    let err = refused(&["training.hopgnn.time_steps=\"auto\""]);
    assert!(err.contains("[training.hopgnn] applies to"), "{err}");
    let err = refused(&["training.mode=\"hopgnn\"", "training.cache_bytes=\"1MiB\""]);
    assert!(err.contains("device cache"), "{err}");
    let err = train(
        &common::config(&BASE, &["training.mode=\"hopgnn\"".into()]),
        &mut (),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("training.partitions"), "{err}");
}

#[test]
fn an_interrupted_run_resumes_mid_epoch_to_the_same_bits() {
    let root = common::root().join("hop-resume");
    let run = |dir: &PathBuf, epochs: u64| {
        let ck = format!("training.checkpoint_dir={:?}", dir.display().to_string());
        let ep = format!("training.epochs={epochs}");
        train(
            &hop(
                3,
                Method::Metis,
                &[
                    &ck,
                    "training.checkpoint_every=3",
                    "training.checkpoint_keep=2",
                    &ep,
                    "training.hopgnn.time_steps=2",
                ],
            ),
            &mut Notes::default(),
        )
        .unwrap()
        .0
    };
    let want = run(&root.join("reference"), 2);
    let dir = root.join("mid");
    run(&dir, 1);
    let kept = actors::distributed::checkpoint::list(&dir).unwrap();
    std::fs::remove_dir_all(kept.last().unwrap()).unwrap();
    let mid = actors::distributed::checkpoint::manifest(&kept[0])
        .unwrap()
        .seq;
    assert!(
        !mid.is_multiple_of(want.steps / 2),
        "step {mid} is inside an epoch"
    );
    let got = run(&dir, 2);
    assert_eq!(
        got.final_model_sha256, want.final_model_sha256,
        "resumed mid-epoch at step {mid}"
    );
    assert_eq!(got.epochs[0].loss, want.epochs[0].loss);
}

/// Asserts the time steps of `report`'s epochs follow the examination
/// period from `workers` unmerged ones (see `hopgnn::examine`), given the
/// seconds it reports measuring.
fn examined(report: &actors::Report, workers: u32, what: &str) {
    let hop: Vec<_> = report
        .epochs
        .iter()
        .map(|e| {
            e.figures::<actors::hopgnn::figures::HopEpoch>("hop")
                .unwrap_or_else(|| panic!("{what}: no hopgnn figures"))
        })
        .collect();
    assert_eq!(
        (hop[0].time_steps, hop[0].examined_s),
        (workers, None),
        "{what}: the warm-up epoch runs unmerged, unmeasured"
    );
    assert_eq!(
        hop[1].time_steps, workers,
        "{what}: the first measured epoch runs unmerged"
    );
    let mut settled = false;
    for e in 1..hop.len() - 1 {
        let (now, next) = (hop[e].time_steps, hop[e + 1].time_steps);
        match hop[e].examined_s {
            None => {
                assert!(settled || e > 1, "{what}: epoch {e} not measured");
                settled = true;
            }
            Some(t) => {
                assert!(
                    !settled && t > 0.0,
                    "{what}: epoch {e} measured {t} s after settling"
                );
                let faster = e == 1 || t < hop[e - 1].examined_s.unwrap_or(f64::INFINITY);
                let want = if faster {
                    now.saturating_sub(1).max(1)
                } else {
                    now + 1
                };
                assert_eq!(
                    next, want,
                    "{what}: after epoch {e} ({t} s, {now} time steps): {hop:?}"
                );
            }
        }
        if settled {
            assert_eq!(
                next, now,
                "{what}: the time steps changed after settling: {hop:?}"
            );
        }
    }
}

#[test]
fn the_examination_period_merges_while_epochs_get_faster_and_keeps_the_model() {
    let epochs = ["training.epochs=5"];
    let mut single_losses = Losses::default();
    let (_, model) = train(
        &common::config(&BASE, &epochs.map(String::from)),
        &mut single_losses,
    )
    .unwrap();
    let mut losses = Losses::default();
    let (report, fin) = train(
        &hop(
            3,
            Method::Metis,
            &["training.epochs=5", "training.hopgnn.time_steps=\"auto\""],
        ),
        &mut losses,
    )
    .unwrap();
    assert_eq!(losses.0.len(), single_losses.0.len());
    for (i, (a, b)) in single_losses.0.iter().zip(&losses.0).enumerate() {
        close(*a, *b, &format!("auto time steps, loss of step {i}"));
    }
    same_model(&model, &fin, "auto time steps");
    examined(&report, 3, "auto time steps");
    // The second measured epoch always runs with one time step merged.
    assert_eq!(
        report.epochs[2]
            .figures::<actors::hopgnn::figures::HopEpoch>("hop")
            .unwrap()
            .time_steps,
        2
    );
}

#[test]
fn a_resumed_run_goes_on_with_the_examination_its_checkpoint_cut() {
    let dir = common::root().join("hop-resume-auto");
    let _ = std::fs::remove_dir_all(&dir);
    let run = |epochs: u64| {
        let ck = format!("training.checkpoint_dir={:?}", dir.display().to_string());
        let ep = format!("training.epochs={epochs}");
        train(
            &hop(
                3,
                Method::Metis,
                &[
                    &ck,
                    "training.checkpoint_every=3",
                    "training.checkpoint_keep=2",
                    &ep,
                    "training.hopgnn.time_steps=\"auto\"",
                ],
            ),
            &mut Notes::default(),
        )
        .unwrap()
        .0
    };
    let first = run(3);
    let per_epoch = first.steps / 3;
    let kept = actors::distributed::checkpoint::list(&dir).unwrap();
    std::fs::remove_dir_all(kept.last().unwrap()).unwrap();
    let mid = actors::distributed::checkpoint::manifest(&kept[0])
        .unwrap()
        .seq;
    assert_eq!(
        mid / per_epoch,
        2,
        "step {mid} of {per_epoch} per epoch is in the third epoch"
    );
    assert!(
        !mid.is_multiple_of(per_epoch),
        "step {mid} is inside an epoch"
    );
    // Restarted without its examination state, the third epoch would run unmerged (3).
    let got = run(4);
    assert_eq!(
        got.epochs[2]
            .figures::<actors::hopgnn::figures::HopEpoch>("hop")
            .unwrap()
            .time_steps,
        2,
        "resumed at step {mid}"
    );
    assert_eq!(got.epochs[..2], first.epochs[..2]);
    examined(&got, 3, "resumed");
}
