//! `hetgnn embed --partitions` and `hetgnn predict --partitions`: every
//! partition in one process, and one node of a topology per process, equal
//! to single-process `embed` and exact `predict`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use graphs::npy::{DType, NpyFile};

use crate::util::{hetgnn, nodes_toml, Logged};

/// A graph, a model trained on it, its single-process embeddings and 2 partitions.
fn setup(d: &Path) {
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    trained(d, 3, "ck", "single");
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "parts"],
    )
    .ok();
}

/// Trains a `layers`-layer model on `g` for one epoch into checkpoint `ck`
/// and writes its single-process embeddings to `single`.
fn trained(d: &Path, layers: usize, ck: &str, single: &str) {
    let (layers, fanouts) = (layers.to_string(), vec!["5"; layers].join(","));
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "1",
            "--hidden",
            "16",
            "--layers",
            &layers,
            "--fanouts",
            &fanouts,
            "--checkpoint",
            ck,
        ],
    )
    .ok();
    hetgnn(
        d,
        &["embed", "--checkpoint", ck, "--data", "g", "--out", single],
    )
    .ok();
}

/// Certificates and `cluster.toml` for nodes n0 and n1 on loopback.
fn two_nodes(d: &Path) {
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    let topology = format!(
        "[cluster]\ncerts_dir = \"certs\"\nheartbeat_ms = 100\nfailure_timeout_ms = 2000\n{}",
        nodes_toml(&["n0", "n1"])
    );
    std::fs::write(d.join("cluster.toml"), topology).unwrap();
}

/// The largest difference between the partitioned output at `out` and the
/// single-process one, checking every node is written exactly once.
fn max_diff(d: &Path, out: &str) -> f32 {
    max_diff_from(d, out, "single")
}

/// [`max_diff`] against the single-process output in `single`.
fn max_diff_from(d: &Path, out: &str, single: &str) -> f32 {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join(out).join("manifest.json")).unwrap())
            .unwrap();
    let types = manifest["types"].as_array().unwrap();
    assert_eq!(types.len(), 4, "{manifest}");
    let mut worst = 0f32;
    for t in types {
        let name = t["name"].as_str().unwrap();
        let width = t["width"].as_u64().unwrap() as usize;
        let want = NpyFile::open(&d.join(format!("{single}/{name}.npy")), DType::F32).unwrap();
        let count = want.shape()[0] as usize;
        let want = want.to_f32_vec();
        let mut seen = vec![false; count];
        for (k, n) in t["nodes"].as_array().unwrap().iter().enumerate() {
            let dir = d.join(out).join(format!("part-{k}"));
            let rows = NpyFile::open(&dir.join(format!("{name}.npy")), DType::F32).unwrap();
            let ids = NpyFile::open(&dir.join(format!("{name}.ids.npy")), DType::I64).unwrap();
            let n = n.as_u64().unwrap();
            assert_eq!(rows.shape(), &[n, width as u64]);
            let got = rows.to_f32_vec();
            for i in 0..n as usize {
                let v = ids.i64_at(i) as usize;
                assert!(!seen[v], "{name} node {v} written twice");
                seen[v] = true;
                for j in 0..width {
                    let (a, b) = (got[i * width + j], want[v * width + j]);
                    worst = worst.max((a - b).abs() / b.abs().max(1.0));
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "{name}: every node written");
    }
    worst
}

#[test]
fn partitions_in_one_process_embed_as_single_process_embed() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    setup(d);
    // `embed` or `predict` over the partitions, writing `out`.
    let over = |command: &'static str, out: &str, extra: &[&str]| {
        let mut args = vec![
            command,
            "--checkpoint",
            "ck",
            "--partitions",
            "parts",
            "--out",
            out,
            "--batch",
            "100",
        ];
        args.extend_from_slice(extra);
        hetgnn(d, &args)
    };
    let embed = |out: &str, extra: &[&str]| over("embed", out, extra);
    let said = embed("dist", &["--data", "g"]).ok().stdout();
    assert!(said.contains("in 2 partitions"), "{said}");
    let diff = max_diff(d, "dist");
    assert!(diff <= 1e-5, "differs from single-process embed by {diff}");
    // Layers saved along the way are gone once every partition is done.
    assert!(!d.join("dist/part-0/stage-1").exists());
    // The same job again finds its output complete; another job's is refused.
    embed("dist", &[]).ok();
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
            "parts-random",
        ],
    )
    .ok();
    let other = |force: &[&str]| {
        let mut args = vec![
            "embed",
            "--checkpoint",
            "ck",
            "--partitions",
            "parts-random",
            "--out",
            "dist",
        ];
        args.extend_from_slice(force);
        hetgnn(d, &args)
    };
    other(&[]).fails_with(1, &["another checkpoint or partitioning"]);
    other(&["--force"]).ok();
    let diff = max_diff(d, "dist");
    assert!(diff <= 1e-5, "random partitions: {diff}");
    // Bad input is refused before any work.
    embed("csv", &["--format", "csv"]).fails_with(1, &["--format csv or parquet"]);
    embed("parts/out", &[]).fails_with(1, &["inside the input --partitions"]);
    hetgnn(d, &["embed", "--checkpoint", "ck", "--out", "x"]).fails_with(2, &["--data"]);
    hetgnn(d, &["generate", "--scale", "0.003", "--out", "g2"]).ok();
    embed("wrong", &["--data", "g2"]).fails_with(1, &["was cut from a graph", "g2"]);

    // `predict` over the same partitions: the classes of single-process exact inference.
    let predict = |out: &str, extra: &[&str]| over("predict", out, extra);
    hetgnn(
        d,
        &[
            "predict",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "single.npy",
            "--inference",
            "exact",
        ],
    )
    .ok();
    let said = predict("pred", &[]).ok().stdout();
    assert!(
        said.contains("node-classification predictions for") && said.contains("in 2 partitions"),
        "{said}"
    );
    let want = NpyFile::open(&d.join("single.npy"), DType::I64).unwrap();
    let mut seen = vec![false; want.shape()[0] as usize];
    for k in 0..2 {
        let dir = d.join(format!("pred/part-{k}"));
        let got = NpyFile::open(&dir.join("predictions.npy"), DType::I64).unwrap();
        let ids = NpyFile::open(&dir.join("paper.ids.npy"), DType::I64).unwrap();
        assert_eq!(got.shape(), ids.shape());
        for i in 0..ids.shape()[0] as usize {
            let v = ids.i64_at(i) as usize;
            assert!(!seen[v], "paper {v} predicted twice");
            seen[v] = true;
            assert_eq!(got.i64_at(i), want.i64_at(v), "paper {v}");
        }
    }
    assert!(seen.iter().all(|&s| s), "every paper predicted");
    assert!(d.join("pred/manifest.json").exists());
    // Refusals, before any work: sampled inference, a task the model was not
    // trained for, node lists, an embedding job's directory.
    predict("p2", &["--inference", "sampled"]).fails_with(1, &["exact inference"]);
    predict("p2", &["--task", "node-regression"])
        .fails_with(1, &["not trained for it", "node-classification"]);
    predict("p2", &["--ids", "ids.csv"]).fails_with(2, &["--ids"]);
    predict("dist", &[]).fails_with(1, &["holds the embeddings of another job"]);
}

#[test]
fn two_node_processes_embed_as_single_process_embed() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    setup(d);
    two_nodes(d);
    let start = |id: &str| {
        Command::new(env!("CARGO_BIN_EXE_hetgnn"))
            .args([
                "embed",
                "--checkpoint",
                "ck",
                "--partitions",
                "parts",
                "--config",
                "cluster.toml",
                "--node",
                id,
                "--out",
                "mp",
                "--batch",
                "100",
                "--wait",
                "60",
            ])
            .current_dir(d)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut nodes = [start("n0"), start("n1")];
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut codes = [None, None];
    while codes.iter().any(Option::is_none) && Instant::now() < deadline {
        for (n, c) in nodes.iter_mut().zip(codes.iter_mut()) {
            if c.is_none() {
                *c = n.try_wait().unwrap().map(|s| s.code());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut outputs = Vec::new();
    for mut n in nodes {
        let _ = n.kill();
        let o = n.wait_with_output().unwrap();
        outputs.push(format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    assert_eq!(codes, [Some(Some(0)), Some(Some(0))], "{outputs:#?}");
    assert!(outputs[0].contains("in 2 partitions"), "{}", outputs[0]);
    assert!(
        outputs[1].contains("the first node writes the manifest"),
        "{}",
        outputs[1]
    );
    let diff = max_diff(d, "mp");
    assert!(diff <= 1e-5, "differs from single-process embed by {diff}");
    // A node not in the topology is refused.
    hetgnn(
        d,
        &[
            "embed",
            "--checkpoint",
            "ck",
            "--partitions",
            "parts",
            "--config",
            "cluster.toml",
            "--node",
            "n7",
            "--out",
            "mp2",
        ],
    )
    .fails_with(1, &["n7", "not in cluster.nodes"]);
}

/// Whether `dir` exists, polled every millisecond until `deadline`.
fn appears(dir: &Path, deadline: Instant) -> bool {
    while !dir.is_dir() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

#[test]
fn a_killed_node_process_resumes_its_partition_and_the_job_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    setup(d);
    // Four layers: three stages of embeddings, so that a node frozen after its
    // first leaves its peer a stage it cannot finish.
    trained(d, 4, "ck4", "single4");
    // With the halo's feature rows at hand, a partition's first layer needs no peer.
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
            "parts-h",
        ],
    )
    .ok();
    two_nodes(d);
    let start = |id: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hetgnn"));
        cmd.args([
            "embed",
            "--checkpoint",
            "ck4",
            "--partitions",
            "parts-h",
            "--config",
            "cluster.toml",
            "--node",
            id,
            "--out",
            "out",
            "--wait",
            "60",
        ])
        .current_dir(d);
        Logged::spawn(cmd)
    };
    let t0 = Instant::now();
    let within = Duration::from_secs(60);
    let (mut n0, mut n1) = (start("n0"), start("n1"));
    // Freeze n0 once both nodes have met and n0 has saved its first stage:
    // n1 can then save its own first stage but never its last (its third
    // needs n0's second, which needs n1's first).
    n1.wait_line("peer n0 up", t0, within);
    let met = appears(&d.join("out/part-0/stage-1"), t0 + within);
    n0.signal(libc::SIGSTOP);
    let saved = met && appears(&d.join("out/part-1/stage-1"), t0 + within);
    let finished = d.join("out/part-1/stage-3").exists();
    let (_, first) = n1.finish(Duration::ZERO);
    if !saved || finished {
        n0.signal(libc::SIGCONT);
        let (_, zero) = n0.finish(Duration::ZERO);
        panic!("n1 saved a first stage: {saved}, its last: {finished}\n{first}\n---\n{zero}");
    }
    // The same command again, and n0 goes on: n1 resumes, n0 waited for it.
    let mut n1 = start("n1");
    n0.signal(libc::SIGCONT);
    let (code0, out0) = n0.finish(within);
    let (code1, out1) = n1.finish(within);
    assert_eq!((code0, code1), (Some(0), Some(0)), "{out0}\n---\n{out1}");
    assert!(
        out1.contains("partition 1: resumed at stage"),
        "n1 did not resume: {out1}"
    );
    assert!(
        !out1.contains("resumed at stage 3 of 3"),
        "n1 had finished: {out1}"
    );
    let diff = max_diff_from(d, "out", "single4");
    assert!(diff <= 1e-5, "differs from single-process embed by {diff}");
}
