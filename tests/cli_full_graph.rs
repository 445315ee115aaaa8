//! `mode = "full-graph"` over QUIC: node processes train the model one
//! process trains, with the blocks and their gradients crossing the wire,
//! and a node killed and restarted under lost and duplicated messages,
//! its staleness cache restored from the checkpoint, changes nothing.

use crate::util::{hetgnn, report};

const FULL: &str =
    "mode = \"full-graph\"\npartitions = \"parts\"\nhidden = 16\nfull-graph.staleness = \"fixed\"\n";

#[test]
fn node_processes_train_the_embedded_full_graph_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.003", "--out", "g"]).ok();
    let out = hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "3",
            "--method",
            "block-row",
            "--out",
            "parts",
        ],
    )
    .ok()
    .stdout();
    assert!(
        out.contains("block-row") && out.contains("balance"),
        "{out}"
    );
    hetgnn(
        d,
        &["certs", "init", "--out", "certs", "--nodes", "n0,n1,n2"],
    )
    .ok();
    crate::util::training_cluster(
        d,
        &["n0", "n1", "n2"],
        "",
        &format!("{FULL}epochs = 3\nreport = \"nodes.json\"\n"),
    );
    hetgnn(d, &["launch", "--config", "cluster.toml"]).ok();
    std::fs::write(
        d.join("embedded.toml"),
        format!("[training]\n{FULL}epochs = 3\nreport = \"embedded.json\"\n"),
    )
    .unwrap();
    hetgnn(d, &["train", "--config", "embedded.toml"]).ok();
    let (nodes, embedded) = (
        report(&d.join("nodes.json")),
        report(&d.join("embedded.json")),
    );
    assert_eq!(nodes["mode"], "full-graph");
    assert_eq!(
        nodes["final_model_sha256"], embedded["final_model_sha256"],
        "over QUIC as in one process"
    );
    let per_step = &nodes["bytes_per_step"];
    for kind in ["broadcast", "grad-block", "grad"] {
        assert!(
            per_step[kind].as_f64().unwrap_or(0.0) > 0.0,
            "no {kind} bytes: {per_step}"
        );
    }
    let full = &nodes["epochs"][1]["full"];
    assert!(
        full["blocks"]
            .as_object()
            .unwrap()
            .values()
            .any(|c| c["skipped"].as_u64().unwrap() > 0),
        "fixed staleness skips in epoch 1: {full}"
    );
    // An epoch rule's skip is known to every worker: it costs no message at all.
    crate::util::training_cluster(
        d,
        &["n0", "n1", "n2"],
        "",
        &format!(
            "{}epochs = 3\nreport = \"none.json\"\n",
            FULL.replace("\"fixed\"", "\"none\"")
        ),
    );
    hetgnn(d, &["launch", "--config", "cluster.toml"]).ok();
    let none = report(&d.join("none.json"));
    let skipped: u64 = nodes["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["full"]["blocks"].as_object().unwrap().values())
        .map(|c| c["skipped"].as_u64().unwrap())
        .sum();
    let sent = |r: &serde_json::Value| r["messages_by_kind"]["broadcast"].as_u64().unwrap_or(0);
    assert!(skipped > 0);
    assert_eq!(
        sent(&none) - sent(&nodes),
        2 * skipped,
        "each skipped block saves a message to each of the 2 other workers"
    );
}

#[test]
fn a_killed_full_graph_node_restarted_under_lost_messages_ends_with_the_embedded_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.003", "--out", "g"]).ok();
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "block-row",
            "--out",
            "parts",
        ],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    let full = format!("{FULL}epochs = 6\n").replace("\"fixed\"", "\"variation\"");
    let training = format!("{full}checkpoint_dir = \"ck\"\ncheckpoint_every = 2\nreport = \"run.json\"\n[chaos]\nseed = 7\ndrop = 0.03\nduplicate = 0.03\n");
    crate::util::training_cluster(
        d,
        &["n0", "n1"],
        "retry_ms = 50\nrejoin_timeout_ms = 60000\n",
        &training,
    );
    let logs = crate::util::kill_once_after_checkpoint(d, &["n0", "n1"], "n1", "ck/step-000000002");
    std::fs::write(
        d.join("embedded.toml"),
        format!("[training]\n{full}report = \"embedded.json\"\n"),
    )
    .unwrap();
    hetgnn(d, &["train", "--config", "embedded.toml"]).ok();
    let (run, embedded) = (
        report(&d.join("run.json")),
        report(&d.join("embedded.json")),
    );
    assert_eq!(
        run["final_model_sha256"], embedded["final_model_sha256"],
        "the redone epochs recompute what was lost:\n{logs}"
    );
    assert!(
        run["failures"][0]["resumed_from_step"]
            .as_u64()
            .is_some_and(|s| s >= 2 && s % 2 == 0),
        "{}",
        run["failures"]
    );
    assert_eq!(
        run["epochs"][5]["full"]["blocks"], embedded["epochs"][5]["full"]["blocks"],
        "the same skips after resuming"
    );
}
