//! `hetgnn partition` and data-parallel training across node processes.

use std::path::Path;

use crate::util::{hetgnn, report, training_cluster};

fn cluster(dir: &Path, ids: &[&str], extra: &str) {
    training_cluster(
        dir,
        ids,
        extra,
        "mode = \"data-parallel\"\npartitions = \"parts\"\n",
    );
}

#[test]
fn launch_trains_three_nodes_to_the_single_process_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.01", "--out", "g"]).ok();
    let out = hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "3", "--out", "parts"],
    )
    .ok()
    .stdout();
    assert!(
        out.contains("edge cut") && out.contains("balance") && out.contains("replication factor"),
        "{out}"
    );
    let pr = report(&d.join("parts/report.json"));
    assert_eq!(
        (pr["kind"].as_str(), pr["parts"].as_u64()),
        (Some("node-assigning"), Some(3)),
        "{pr}"
    );
    assert!(
        pr["replication_factor"].as_f64().unwrap() > 1.0
            && pr["peak_memory_bytes"].as_u64().unwrap() > 0,
        "{pr}"
    );
    hetgnn(
        d,
        &["certs", "init", "--out", "certs", "--nodes", "n0,n1,n2"],
    )
    .ok();
    cluster(d, &["n0", "n1", "n2"], "");
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "2",
            "--report",
            "single.json",
        ],
    )
    .ok();
    hetgnn(
        d,
        &[
            "launch",
            "--config",
            "cluster.toml",
            "--set",
            "training.epochs=2",
            "--set",
            "training.report=\"dp.json\"",
        ],
    )
    .ok();
    let (single, dp) = (report(&d.join("single.json")), report(&d.join("dp.json")));
    assert_eq!(dp["mode"], "data-parallel");
    assert_eq!(dp["nodes"], 3);
    assert_eq!(dp["steps"], single["steps"]);
    let acc = |r: &serde_json::Value| r["epochs"][1]["test_acc"].as_f64().unwrap();
    assert!(
        (acc(&dp) - acc(&single)).abs() < 0.01,
        "data-parallel {} vs single {}",
        acc(&dp),
        acc(&single)
    );
    for kind in ["sample", "pull", "pull.reply", "push", "grad"] {
        assert!(
            dp["bytes_by_kind"][kind].as_u64().unwrap_or(0) > 0,
            "no {kind} traffic: {}",
            dp["bytes_by_kind"]
        );
    }
}

#[test]
fn a_node_whose_peers_never_come_fails_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "random",
            "--out",
            "parts",
        ],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    cluster(d, &["n0", "n1"], "start_timeout_ms = 1500\n");
    let text = std::fs::read_to_string(d.join("cluster.toml")).unwrap();
    let n1_addr = text
        .lines()
        .filter(|l| l.starts_with("addr"))
        .nth(1)
        .unwrap()
        .split('"')
        .nth(1)
        .unwrap()
        .to_string();
    let run = hetgnn(d, &["node", "--config", "cluster.toml", "--node", "n0"]);
    run.fails_with(1, &["cannot reach n1 at", &n1_addr]);
    // Partitions that do not match the nodes are refused before anything starts.
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "3",
            "--method",
            "random",
            "--out",
            "parts",
            "--force",
        ],
    )
    .ok();
    hetgnn(d, &["node", "--config", "cluster.toml", "--node", "n0"])
        .fails_with(1, &["training.partitions", "3 partitions for 2 nodes"]);
}

#[test]
fn partition_refuses_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "0", "--out", "p"],
    )
    .fails_with(1, &["--parts"]);
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "spectral",
            "--out",
            "p",
        ],
    )
    .fails_with(2, &["spectral"]);
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "missing",
            "--parts",
            "2",
            "--out",
            "p",
        ],
    )
    .fails_with(1, &["missing"]);
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "p"],
    )
    .ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "p"],
    )
    .fails_with(1, &["already exists"]);
}

#[test]
fn two_nodes_under_message_loss_and_duplication_end_with_the_embedded_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.005", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "parts"],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    cluster(d, &["n0", "n1"], "retry_ms = 50\n");
    let mut text = std::fs::read_to_string(d.join("cluster.toml")).unwrap();
    // The nodes also cache feature rows (pulled from each other at start): that changes nothing either.
    text += "epochs = 2\nbatch = 256\nreport = \"chaos.json\"\ncache_bytes = \"256KiB\"\ncache_policy = \"hotness\"\n[chaos]\nseed = 11\ndrop = 0.05\nduplicate = 0.05\n";
    std::fs::write(d.join("cluster.toml"), text).unwrap();
    hetgnn(d, &["launch", "--config", "cluster.toml"]).ok();
    let dp = [
        "--set",
        "training.mode=\"data-parallel\"",
        "--set",
        "training.partitions=\"parts\"",
        "--epochs",
        "2",
        "--batch",
        "256",
        "--report",
        "embedded.json",
    ];
    hetgnn(
        d,
        &["train"]
            .iter()
            .chain(dp.iter())
            .copied()
            .collect::<Vec<_>>(),
    )
    .ok();
    let (chaos, embedded) = (
        report(&d.join("chaos.json")),
        report(&d.join("embedded.json")),
    );
    assert_eq!(
        chaos["final_model_sha256"], embedded["final_model_sha256"],
        "lost and duplicated messages (and the cache) change nothing"
    );
    // ByteGNN's DAG sampling over the same lossy links: the same model, its DAGs reported.
    hetgnn(
        d,
        &[
            "launch",
            "--config",
            "cluster.toml",
            "--force",
            "--set",
            "training.data-parallel.sampling=\"dag\"",
            "--set",
            "training.data-parallel.dag_chunk_rows=64",
            "--set",
            "training.report=\"dag.json\"",
        ],
    )
    .ok();
    let dag = report(&d.join("dag.json"));
    assert_eq!(
        dag["final_model_sha256"], embedded["final_model_sha256"],
        "DAG sampling over lossy links changes nothing"
    );
    assert!(
        dag["epochs"][1]["sampling"]["launches"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{}",
        dag["epochs"][1]
    );
    let paper = &chaos["cache"]["paper"];
    assert!(
        paper["rows"].as_u64().unwrap_or(0) > 0 && paper["hits"].as_u64().unwrap_or(0) > 0,
        "{}",
        chaos["cache"]
    );
    let traffic = chaos["bytes_by_kind"].as_object().unwrap();
    assert!(
        traffic.contains_key("push") && traffic.contains_key("grad"),
        "the run crossed the network: {traffic:?}"
    );
}

#[test]
fn meta_partitioning_reports_relations_and_boundary_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
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
    assert!(
        out.contains("2 meta-partitions for a 2-layer model")
            && out.contains("boundary nodes")
            && out.contains("sub-metatrees via"),
        "{out}"
    );
    let six = hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "6",
            "--method",
            "meta",
            "--out",
            "meta6",
        ],
    )
    .ok()
    .stdout();
    assert!(
        six.contains("replica 2 of 2"),
        "more partitions than sub-metatrees replicate: {six}"
    );
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
            "--trainers",
            "2",
            "--out",
            "m2",
        ],
    )
    .fails_with(1, &["--trainers"]);
    let dp = [
        "train",
        "--set",
        "training.mode=\"data-parallel\"",
        "--set",
        "training.partitions=\"meta\"",
    ];
    hetgnn(d, &dp).fails_with(1, &["raf"]);
}

#[test]
fn spring_partitions_stream_the_edges_and_train_data_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    let out = hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "spring",
            "--out",
            "sp",
        ],
    )
    .ok()
    .stdout();
    assert!(
        out.contains("spring (node-assigning)") && out.contains("replication factor"),
        "{out}"
    );
    let pr = report(&d.join("sp/report.json"));
    assert_eq!(
        (pr["method"].as_str(), pr["parts"].as_u64()),
        (Some("spring"), Some(2)),
        "{pr}"
    );
    hetgnn(
        d,
        &[
            "train",
            "--mode",
            "data-parallel",
            "--partitions",
            "sp",
            "--epochs",
            "1",
            "--report",
            "dp.json",
        ],
    )
    .ok();
    assert_eq!(report(&d.join("dp.json"))["mode"], "data-parallel");
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "spring",
            "--spring-balance",
            "types",
            "--out",
            "x",
        ],
    )
    .fails_with(1, &["--spring-balance", "types"]);
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "65",
            "--method",
            "hdrf",
            "--out",
            "x",
        ],
    )
    .fails_with(1, &["1..=64", "vertex-cut"]);
    // With seeds dealt by batch position rather than owner, the model does not
    // depend on the partitioning: SPRING (streamed, refined or not), METIS and
    // random partitions end with one hash, which checks every writer.
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "spring",
            "--spring-refine",
            "1",
            "--out",
            "sr",
        ],
    )
    .ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "metis"],
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
            "random",
            "--out",
            "rnd",
        ],
    )
    .ok();
    let run = |parts: &str, assignment: &str| {
        let r = format!("{parts}-{assignment}.json");
        hetgnn(
            d,
            &[
                "train",
                "--mode",
                "data-parallel",
                "--partitions",
                parts,
                "--epochs",
                "1",
                "--hidden",
                "16",
                "--set",
                &format!("training.data-parallel.seed_assignment=\"{assignment}\""),
                "--report",
                &r,
            ],
        )
        .ok();
        report(&d.join(&r))
    };
    let hash = |r: &serde_json::Value| r["final_model_sha256"].as_str().unwrap().to_string();
    let h = hash(&run("sp", "random"));
    let runs: Vec<serde_json::Value> = ["sr", "metis", "rnd"]
        .iter()
        .map(|parts| run(parts, "random"))
        .collect();
    for (parts, r) in ["sr", "metis", "rnd"].iter().zip(&runs) {
        assert_eq!(hash(r), h, "{parts}");
    }
    // The same samples, but METIS keeps more of a batch's inputs at home than a random partitioning.
    let rows = |r: &serde_json::Value| {
        r["epochs"][0]["remote_rows_per_step"]
            .as_f64()
            .unwrap_or(0.0)
    };
    let (metis, rnd) = (rows(&runs[1]), rows(&runs[2]));
    assert!(
        0.0 < metis && metis < rnd,
        "remote rows per step: METIS {metis}, random {rnd}"
    );
    assert_ne!(
        hash(&run("sp", "owner")),
        hash(&run("metis", "owner")),
        "seeds by owner: the sums' order follows the partitioning"
    );
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--set",
            "training.data-parallel.seed_assignment=\"random\"",
        ],
    )
    .fails_with(
        1,
        &["[training.data-parallel] applies to training.mode = \"data-parallel\""],
    );
}

#[test]
fn bytegnn_partitions_take_the_samplers_fanouts_and_seed_weights_and_refuse_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    let part = |extra: &[&str]| {
        let mut args = vec![
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--method",
            "bytegnn",
            "--out",
            "bg",
            "--force",
        ];
        args.extend_from_slice(extra);
        hetgnn(d, &args)
    };
    part(&[
        "--bytegnn-fanouts",
        "10,5",
        "--bytegnn-seed-weights",
        "1,0,0",
    ])
    .ok();
    let pr = report(&d.join("bg/report.json"));
    assert_eq!(pr["method"].as_str(), Some("bytegnn"), "{pr}");
    assert!(
        pr["split_balance"]
            .as_object()
            .unwrap()
            .values()
            .all(|b| b.as_f64().unwrap() <= 1.05),
        "{pr}"
    );
    part(&["--bytegnn-seed-weights", "1,0"])
        .fails_with(1, &["--bytegnn-seed-weights", "three values"]);
    part(&["--bytegnn-seed-weights", "1,-1,0"]).fails_with(1, &["seed weights"]);
    part(&["--bytegnn-fanouts", "25,0"]).fails_with(1, &["--bytegnn-fanouts", "positive"]);
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--bytegnn-fanouts",
            "10",
            "--out",
            "x",
        ],
    )
    .fails_with(1, &["--bytegnn-fanouts applies to --method bytegnn"]);
    hetgnn(
        d,
        &[
            "partition",
            "--data",
            "g",
            "--parts",
            "2",
            "--bytegnn-seed-weights",
            "1,0,0",
            "--out",
            "x",
        ],
    )
    .fails_with(1, &["--bytegnn-seed-weights applies to --method bytegnn"]);
}
