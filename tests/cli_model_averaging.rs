//! Model-averaging training (CATGNN) embedded and across node processes.

use std::path::Path;

use crate::util::{hetgnn, kill_once_after_checkpoint, report, training_cluster};

fn cluster(dir: &Path, ids: &[&str], extra: &str, training: &str) {
    training_cluster(
        dir,
        ids,
        extra,
        &format!("mode = \"model-averaging\"\n{training}"),
    );
}

/// `hetgnn train` in model-averaging mode on `parts` with `more` flags.
fn averaging<'a>(parts: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    ["train", "--mode", "model-averaging", "--partitions", parts]
        .iter()
        .chain(more)
        .copied()
        .collect()
}

#[test]
fn one_partition_is_single_process_training_and_the_worker_count_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.005", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "1", "--out", "p1"],
    )
    .ok();
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "4",
            "--method",
            "spring",
            "--halo-features",
            "--out",
            "p4",
        ],
    )
    .ok();
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
    hetgnn(
        d,
        &averaging(
            "p1",
            &["--epochs", "2", "--batch", "256", "--report", "one.json"],
        ),
    )
    .ok();
    let (single, one) = (report(&d.join("single.json")), report(&d.join("one.json")));
    assert_eq!(one["mode"], "model-averaging");
    assert_eq!(
        one["final_model_sha256"], single["final_model_sha256"],
        "one partition trains exactly as a single process"
    );
    assert_eq!(one["epochs"][1]["loss"], single["epochs"][1]["loss"]);
    // Evaluated alike: the same macro F1, as one process counts it.
    assert!(
        one["epochs"][1]["macro_f1"].is_array(),
        "{}",
        one["epochs"][1]
    );
    assert_eq!(
        one["epochs"][1]["macro_f1"],
        single["epochs"][1]["macro_f1"]
    );
    // Four partitions over 4, 2 and 1 workers (dealt round-robin): the same averages, bit for bit.
    let mut hashes = Vec::new();
    for w in ["4", "2", "1"] {
        let out = format!("w{w}.json");
        hetgnn(
            d,
            &averaging(
                "p4",
                &[
                    "--workers",
                    w,
                    "--epochs",
                    "3",
                    "--batch",
                    "256",
                    "--sync-every",
                    "2",
                    "--report",
                    &out,
                ],
            ),
        )
        .ok();
        let r = report(&d.join(&out));
        assert_eq!(r["epochs"].as_array().unwrap().len(), 3);
        assert_eq!(
            r["epochs"][2]["workers"].as_array().unwrap().len(),
            w.parse::<usize>().unwrap(),
            "one figure per worker: {}",
            r["epochs"][2]
        );
        hashes.push(r["final_model_sha256"].as_str().unwrap().to_string());
    }
    assert!(hashes.windows(2).all(|h| h[0] == h[1]), "{hashes:?}");
    assert_ne!(
        hashes[0],
        single["final_model_sha256"].as_str().unwrap(),
        "four partitions train other models"
    );
    // Each partition takes its share of the batch (about the global steps each), or the whole batch.
    hetgnn(
        d,
        &averaging(
            "p4",
            &[
                "--epochs",
                "1",
                "--batch",
                "256",
                "--set",
                "training.model-averaging.local_batch=\"whole\"",
                "--report",
                "whole.json",
            ],
        ),
    )
    .ok();
    hetgnn(
        d,
        &averaging(
            "p4",
            &["--epochs", "1", "--batch", "256", "--report", "share.json"],
        ),
    )
    .ok();
    let steps = |f: &str| report(&d.join(f))["steps"].as_u64().unwrap();
    let global = single["steps"].as_u64().unwrap() / 2;
    assert!(
        steps("whole.json") <= global + 4 && steps("share.json") >= 4 * global - 4,
        "whole {}, share {}, global {global}",
        steps("whole.json"),
        steps("share.json")
    );
}

#[test]
fn model_averaging_refuses_what_it_cannot_train() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "plain"],
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
            "--halo-features",
            "--out",
            "halo",
        ],
    )
    .ok();
    hetgnn(d, &averaging("plain", &["--epochs", "1"])).fails_with(1, &["--halo-features"]);
    hetgnn(d, &averaging("halo", &["--workers", "3"]))
        .fails_with(1, &["3 workers", "2 partitions"]);
    hetgnn(d, &averaging("halo", &["--sync-every", "0"]))
        .fails_with(1, &["training.model-averaging.sync_every"]);
    hetgnn(d, &["train", "--mode", "model-averaging", "--data", "g"])
        .fails_with(1, &["training.partitions"]);
    hetgnn(
        d,
        &["certs", "init", "--out", "certs", "--nodes", "n0,n1,n2"],
    )
    .ok();
    cluster(d, &["n0", "n1", "n2"], "", "partitions = \"halo\"\n");
    hetgnn(d, &["node", "--config", "cluster.toml", "--node", "n0"])
        .fails_with(1, &["3 workers", "2 partitions", "one per node"]);
    cluster(d, &["n0", "n1"], "", "partitions = \"halo\"\nworkers = 1\n");
    hetgnn(d, &["node", "--config", "cluster.toml", "--node", "n0"])
        .fails_with(1, &["1 workers for 2 nodes"]);
}

#[test]
fn two_nodes_under_message_loss_end_with_the_embedded_model_and_exchange_only_models() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.005", "--out", "g"]).ok();
    // Four partitions on two nodes: each node trains two in turn.
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "4",
            "--halo-features",
            "--out",
            "parts",
        ],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    cluster(d, &["n0", "n1"], "retry_ms = 50\n", "partitions = \"parts\"\nepochs = 3\nbatch = 256\nmodel-averaging.sync_every = 2\nreport = \"chaos.json\"\n[chaos]\nseed = 3\ndrop = 0.05\nduplicate = 0.05\n");
    hetgnn(d, &["launch", "--config", "cluster.toml"]).ok();
    hetgnn(
        d,
        &averaging(
            "parts",
            &[
                "--epochs",
                "3",
                "--batch",
                "256",
                "--sync-every",
                "2",
                "--report",
                "embedded.json",
            ],
        ),
    )
    .ok();
    let (chaos, embedded) = (
        report(&d.join("chaos.json")),
        report(&d.join("embedded.json")),
    );
    assert_eq!(
        chaos["final_model_sha256"], embedded["final_model_sha256"],
        "lost and duplicated messages change nothing"
    );
    assert_eq!(
        chaos["epochs"][2]["test_acc"],
        embedded["epochs"][2]["test_acc"]
    );
    let traffic = chaos["bytes_by_kind"].as_object().unwrap();
    assert!(
        traffic.get("average").and_then(|v| v.as_u64()).unwrap_or(0) > 0,
        "the models crossed the network: {traffic:?}"
    );
    assert!(
        !traffic
            .keys()
            .any(|k| k.starts_with("pull") || k.starts_with("sample") || k == "grad"),
        "no features, sampling or gradients crossed: {traffic:?}"
    );
}

#[test]
fn a_killed_worker_restarted_resumes_from_the_last_round_and_the_run_ends_with_the_embedded_model()
{
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
            "--halo-features",
            "--out",
            "parts",
        ],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    // 25 global steps per epoch at this batch: checkpoints at the rounds' ends, steps 50, 100, ...
    let training = "partitions = \"parts\"\nepochs = 12\nbatch = 256\nmodel-averaging.sync_every = 2\ncheckpoint_dir = \"ck\"\nreport = \"run.json\"\n";
    cluster(d, &["n0", "n1"], "rejoin_timeout_ms = 60000\n", training);
    let logs = kill_once_after_checkpoint(d, &["n0", "n1"], "n1", "ck/step-000000050");
    hetgnn(
        d,
        &averaging(
            "parts",
            &[
                "--epochs",
                "12",
                "--batch",
                "256",
                "--sync-every",
                "2",
                "--report",
                "embedded.json",
            ],
        ),
    )
    .ok();
    let (run, embedded) = (
        report(&d.join("run.json")),
        report(&d.join("embedded.json")),
    );
    assert_eq!(
        run["final_model_sha256"], embedded["final_model_sha256"],
        "the redone rounds recompute what was lost:\n{logs}"
    );
    let f = &run["failures"][0];
    assert!(
        f["resumed_from_step"]
            .as_u64()
            .is_some_and(|s| s >= 50 && s % 50 == 0),
        "rolled back to a round's end: {}",
        run["failures"]
    );
    assert_eq!(
        run["epochs"].as_array().unwrap().len(),
        12,
        "every epoch reported once"
    );
}
