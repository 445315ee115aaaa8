//! HopGNN training in one process: every worker holds the same parameters
//! within a step, so whatever the migration, merging and pre-gathering
//! settings, it follows single-process training step by step; and an
//! interrupted run resumes from its checkpoint to the same bits.

mod common;

use std::path::PathBuf;

use actors::{train, Config};
use common::{close, derived, same_model, Losses, Notes};
use graphs::partition::{self, Method};
use graphs::NoProgress;

fn partitions(parts: usize, method: Method) -> PathBuf {
    derived(&format!("{method}-{parts}x1"), false, |g, out| {
        let a = partition::assign_two_level(g, parts, 1, method, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    })
}

const BASE: [&str; 4] = ["training.epochs=2", "training.batch=256", "training.hidden=16", "training.embed_dim=8"];

fn hop(parts: usize, method: Method, extra: &[&str]) -> Config {
    let mut set = vec!["training.mode=\"hopgnn\"".to_string(), format!("training.partitions={:?}", partitions(parts, method).display().to_string())];
    set.extend(extra.iter().map(|s| s.to_string()));
    common::config(&BASE, &set)
}

#[test]
fn every_migration_merging_and_gathering_setting_follows_single_process_training() {
    let mut single_losses = Losses::default();
    let (single, model) = train(&common::config(&BASE, &[]), &mut single_losses).unwrap();
    let runs: [(usize, Method, &[&str]); 6] = [
        (2, Method::Metis, &[]),
        (3, Method::Metis, &["training.hop_migrate=\"gradient\""]),
        (3, Method::Random, &["training.hop_time_steps=2", "training.allreduce=\"ring\""]),
        (3, Method::Metis, &["training.hop_time_steps=1", "training.hop_migrate=\"gradient\""]),
        (2, Method::Metis, &["training.hop_pregather=false"]),
        (3, Method::Metis, &["training.hop_pregather=false", "training.hop_time_steps=2"]),
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
        assert!((last.test_acc - want.test_acc).abs() < 0.01, "{what}: {} vs {}", last.test_acc, want.test_acc);
        let h = last.hop.as_ref().unwrap_or_else(|| panic!("{what}: no hopgnn figures"));
        let steps = extra.iter().find_map(|s| s.strip_prefix("training.hop_time_steps=")).map_or(parts as u32, |n| n.parse().unwrap());
        assert_eq!(h.time_steps, steps, "{what}");
        // Without merging every micrograph is trained at home: its seeds are local.
        assert!(h.remote_row_rate < 1.0 && !h.locality.is_empty(), "{what}: {h:?}");
        let pregather = !extra.contains(&"training.hop_pregather=false");
        if pregather {
            assert!(h.rows_pulled_per_step <= h.rows_pulled_per_step_without_pregathering, "{what}: {h:?}");
        } else {
            assert_eq!(h.rows_pulled_per_step, h.rows_pulled_per_step_without_pregathering, "{what}");
        }
    }
}

#[test]
fn micrographs_at_home_read_more_local_rows_than_merged_ones() {
    let (all, _) = train(&hop(3, Method::Metis, &["training.epochs=1"]), &mut ()).unwrap();
    let (one, _) = train(&hop(3, Method::Metis, &["training.epochs=1", "training.hop_time_steps=1"]), &mut ()).unwrap();
    let (a, o) = (all.epochs[0].hop.clone().unwrap(), one.epochs[0].hop.clone().unwrap());
    assert!(a.remote_row_rate < o.remote_row_rate, "at home {a:?}, merged into one time step {o:?}");
    assert!(a.rows_pulled_per_step < o.rows_pulled_per_step, "at home {a:?}, merged {o:?}");
    assert!(a.rows_pulled_per_step < a.rows_pulled_per_step_without_pregathering, "pre-gathering pulls a row once per step: {a:?}");
}

/// The error parsing `set` (over the test's base settings) gives.
fn refused(set: &[&str]) -> String {
    let mut o: Vec<String> = BASE.iter().chain(set).map(|s| s.to_string()).collect();
    o.push(format!("training.data={:?}", common::graph().display().to_string()));
    Config::parse("", &o).expect_err("refused").to_string()
}

#[test]
fn hopgnn_settings_are_checked() {
    let err = refused(&["training.hop_migrate=\"gradient\""]);
    assert!(err.contains("hop_migrate") && err.contains("single"), "{err}");
    let err = refused(&["training.mode=\"hopgnn\"", "training.hop_time_steps=0"]);
    assert!(err.contains("at least 1"), "{err}");
    let err = refused(&["training.mode=\"hopgnn\"", "training.hop_time_steps=\"many\""]);
    assert!(err.contains("\"auto\""), "{err}");
    let err = refused(&["training.mode=\"hopgnn\"", "training.hop_time_steps=\"auto\""]);
    assert!(err.contains("not built yet"), "{err}");
    let err = refused(&["training.mode=\"hopgnn\"", "training.cache_bytes=\"1MiB\""]);
    assert!(err.contains("device cache"), "{err}");
    let err = train(&common::config(&BASE, &["training.mode=\"hopgnn\"".into()]), &mut ()).err().unwrap().to_string();
    assert!(err.contains("training.partitions"), "{err}");
}

#[test]
fn an_interrupted_run_resumes_mid_epoch_to_the_same_bits() {
    let root = common::root().join("hop-resume");
    let run = |dir: &PathBuf, epochs: u64| {
        let ck = format!("training.checkpoint_dir={:?}", dir.display().to_string());
        let ep = format!("training.epochs={epochs}");
        train(&hop(3, Method::Metis, &[&ck, "training.checkpoint_every=3", "training.checkpoint_keep=2", &ep, "training.hop_time_steps=2"]), &mut Notes::default()).unwrap().0
    };
    let want = run(&root.join("reference"), 2);
    let dir = root.join("mid");
    run(&dir, 1);
    let kept = actors::distributed::checkpoint::list(&dir).unwrap();
    std::fs::remove_dir_all(kept.last().unwrap()).unwrap();
    let mid = actors::distributed::checkpoint::manifest(&kept[0]).unwrap().seq;
    assert!(mid % (want.steps / 2) != 0, "step {mid} is inside an epoch");
    let got = run(&dir, 2);
    assert_eq!(got.final_model_sha256, want.final_model_sha256, "resumed mid-epoch at step {mid}");
    assert_eq!(got.epochs[0].loss, want.epochs[0].loss);
}
