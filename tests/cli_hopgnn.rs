//! `mode = "hopgnn"` over QUIC: node processes train the model one process
//! trains, the models' migrations cross the wire, and a node killed and
//! restarted under lost and duplicated messages changes nothing.

use crate::util::{hetgnn, report};

const HOP: &str =
    "mode = \"hopgnn\"\npartitions = \"parts\"\nepochs = 2\nbatch = 512\nhidden = 16\n";

#[test]
fn three_node_processes_train_the_embedded_hopgnn_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.003", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "3", "--out", "parts"],
    )
    .ok();
    hetgnn(
        d,
        &["certs", "init", "--out", "certs", "--nodes", "n0,n1,n2"],
    )
    .ok();
    crate::util::training_cluster(
        d,
        &["n0", "n1", "n2"],
        "",
        &format!("{HOP}report = \"nodes.json\"\n"),
    );
    hetgnn(d, &["launch", "--config", "cluster.toml"]).ok();
    std::fs::write(
        d.join("embedded.toml"),
        format!("[training]\n{HOP}report = \"embedded.json\"\n"),
    )
    .unwrap();
    hetgnn(d, &["train", "--config", "embedded.toml"]).ok();
    let (nodes, embedded) = (
        report(&d.join("nodes.json")),
        report(&d.join("embedded.json")),
    );
    assert_eq!(nodes["mode"], "hopgnn");
    assert_eq!(
        nodes["final_model_sha256"], embedded["final_model_sha256"],
        "over QUIC as in one process"
    );
    let per_step = &nodes["bytes_per_step"];
    for kind in ["migrate", "pull", "sample", "grad"] {
        assert!(
            per_step[kind].as_f64().unwrap_or(0.0) > 0.0,
            "no {kind} bytes: {per_step}"
        );
    }
    let hop = &nodes["epochs"][1]["hop"];
    assert_eq!(hop["time_steps"], 3, "{hop}");
    assert!(
        hop["rows_pulled_per_step"].as_f64().unwrap()
            < hop["rows_pulled_per_step_without_pregathering"]
                .as_f64()
                .unwrap(),
        "{hop}"
    );
}

#[test]
fn a_killed_hopgnn_node_restarted_under_lost_messages_ends_with_the_embedded_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.003", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "parts"],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    let hop =
        format!("{HOP}epochs = 3\nhopgnn.migrate = \"gradient\"\n").replace("epochs = 2\n", "");
    let training = format!("{hop}checkpoint_dir = \"ck\"\ncheckpoint_every = 4\nreport = \"run.json\"\n[chaos]\nseed = 7\ndrop = 0.03\nduplicate = 0.03\n");
    crate::util::training_cluster(
        d,
        &["n0", "n1"],
        "retry_ms = 50\nrejoin_timeout_ms = 60000\n",
        &training,
    );
    let logs = crate::util::kill_once_after_checkpoint(d, &["n0", "n1"], "n1", "ck/step-000000004");
    std::fs::write(
        d.join("embedded.toml"),
        format!("[training]\n{hop}report = \"embedded.json\"\n"),
    )
    .unwrap();
    hetgnn(d, &["train", "--config", "embedded.toml"]).ok();
    let (run, embedded) = (
        report(&d.join("run.json")),
        report(&d.join("embedded.json")),
    );
    assert_eq!(
        run["final_model_sha256"], embedded["final_model_sha256"],
        "the redone steps recompute what was lost:\n{logs}"
    );
    assert!(
        run["failures"][0]["resumed_from_step"]
            .as_u64()
            .is_some_and(|s| s >= 4 && s % 4 == 0),
        "{}",
        run["failures"]
    );
    assert_eq!(
        run["epochs"][2]["test_acc"],
        embedded["epochs"][2]["test_acc"]
    );
}
