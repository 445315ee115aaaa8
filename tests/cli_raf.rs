//! Relation-aggregation-first training across node processes.

use std::path::Path;

use crate::util::{hetgnn, kill_once_after_checkpoint, report, training_cluster};

fn cluster(dir: &Path, ids: &[&str], extra: &str, training: &str) {
    training_cluster(
        dir,
        ids,
        extra,
        &format!("mode = \"raf\"\npartitions = \"meta\"\n{training}"),
    );
}

#[test]
fn two_raf_nodes_under_message_loss_end_with_the_embedded_model_and_move_no_features() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.005", "--out", "g"]).ok();
    let out = hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "meta",
            "--out",
            "meta",
        ],
    )
    .ok()
    .stdout();
    assert!(out.contains("the reducer's"), "{out}");
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    // The reducer goes where [placement] says.
    cluster(d, &["n0", "n1"], "retry_ms = 50\n", "epochs = 2\nbatch = 256\nreport = \"chaos.json\"\n[placement]\nreducer = \"n1\"\n[chaos]\nseed = 5\ndrop = 0.05\nduplicate = 0.05\n");
    hetgnn(d, &["launch", "--config", "cluster.toml"]).ok();
    let raf = [
        "train",
        "--data",
        "g",
        "--set",
        "training.mode=\"raf\"",
        "--set",
        "training.partitions=\"meta\"",
        "--epochs",
        "2",
        "--batch",
        "256",
        "--report",
        "embedded.json",
    ];
    hetgnn(d, &raf).ok();
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "2",
            "--batch",
            "256",
            "--report",
            "single.json",
        ],
    )
    .ok();
    let (chaos, embedded, single) = (
        report(&d.join("chaos.json")),
        report(&d.join("embedded.json")),
        report(&d.join("single.json")),
    );
    assert_eq!(chaos["mode"], "raf");
    assert_eq!(
        chaos["final_model_sha256"], embedded["final_model_sha256"],
        "lost and duplicated messages change nothing"
    );
    let acc = |r: &serde_json::Value| r["epochs"][1]["test_acc"].as_f64().unwrap();
    assert!(
        (acc(&chaos) - acc(&single)).abs() < 0.01,
        "raf {} vs single {}",
        acc(&chaos),
        acc(&single)
    );
    let traffic = chaos["bytes_by_kind"].as_object().unwrap();
    assert!(
        traffic.contains_key("partial") && traffic.contains_key("partial.grad"),
        "partials crossed the network: {traffic:?}"
    );
    assert!(
        !traffic
            .keys()
            .any(|k| k.starts_with("pull") || k.starts_with("sample")),
        "no features or sampling crossed: {traffic:?}"
    );
}

#[test]
fn a_killed_raf_worker_restarted_rejoins_from_the_last_checkpoint_and_the_run_ends_with_the_embedded_model(
) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.01", "--out", "g"]).ok();
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "meta",
            "--out",
            "meta",
        ],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    let training = "epochs = 3\nbatch = 256\nmodel = \"rgat\"\ncheckpoint_dir = \"ck\"\ncheckpoint_every = 5\nreport = \"run.json\"\n";
    cluster(d, &["n0", "n1"], "rejoin_timeout_ms = 60000\n", training);
    let logs = kill_once_after_checkpoint(d, &["n0", "n1"], "n1", "ck/step-000000010");
    let raf = [
        "train",
        "--data",
        "g",
        "--set",
        "training.mode=\"raf\"",
        "--set",
        "training.partitions=\"meta\"",
        "--set",
        "training.model=\"rgat\"",
        "--epochs",
        "3",
        "--batch",
        "256",
        "--report",
        "embedded.json",
    ];
    hetgnn(d, &raf).ok();
    let (run, embedded) = (
        report(&d.join("run.json")),
        report(&d.join("embedded.json")),
    );
    assert_eq!(
        run["final_model_sha256"], embedded["final_model_sha256"],
        "the redone steps recompute what was lost:\n{logs}"
    );
    let f = &run["failures"][0];
    assert!(
        f["resumed_from_step"]
            .as_u64()
            .is_some_and(|s| s >= 10 && s % 5 == 0),
        "rolled back to a checkpoint: {}",
        run["failures"]
    );
}

#[test]
fn raf_refuses_edge_cut_partitions_and_a_depth_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "parts"],
    )
    .ok();
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "meta",
            "--layers",
            "3",
            "--out",
            "meta3",
        ],
    )
    .ok();
    let raf = |p: &str| {
        vec![
            "train".to_string(),
            "--mode".into(),
            "raf".into(),
            "--partitions".into(),
            p.to_string(),
        ]
    };
    let run = |args: Vec<String>| hetgnn(d, &args.iter().map(String::as_str).collect::<Vec<_>>());
    run(raf("parts")).fails_with(1, &["meta-partitions", "--method meta"]);
    run(raf("meta3")).fails_with(1, &["training.layers = 2", "3 layers"]);
    let mut mlp = raf("meta3");
    mlp.extend(["--set".into(), "training.model=\"mlp\"".into()]);
    run(mlp).fails_with(1, &["MLP"]);
    run(vec![
        "train".into(),
        "--set".into(),
        "training.mode=\"raf\"".into(),
    ])
    .fails_with(1, &["training.partitions"]);
    // Metapaths: only for meta-partitioning, and a bad one is named with its line.
    std::fs::write(d.join("paths.txt"), "writes rev_writes\nwrote\n").unwrap();
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "metis",
            "--metapaths",
            "paths.txt",
            "--out",
            "x",
        ],
    )
    .fails_with(1, &["--metapaths applies to --method meta"]);
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "meta",
            "--metapaths",
            "paths.txt",
            "--out",
            "x",
        ],
    )
    .fails_with(1, &["line 2", "no relation named wrote"]);
    std::fs::write(d.join("paths.txt"), "writes rev_writes\ncites\n").unwrap();
    let out = hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "meta",
            "--metapaths",
            "paths.txt",
            "--out",
            "mp",
        ],
    )
    .ok()
    .stdout();
    assert!(out.contains("metatree from 2 metapath(s)"), "{out}");
}
