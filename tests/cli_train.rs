//! `hetgnn train`, `plot` and `predict` end to end.

use crate::util::{hetgnn, hetgnn_env};

#[test]
fn default_train_generates_once_and_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let env = [("HETGNN_CACHE", cache.to_str().unwrap())];
    let run = hetgnn_env(
        tmp.path(),
        &["train", "--epochs", "1", "--report", "out/run.json"],
        &env,
    )
    .ok();
    assert!(
        run.stderr().contains("generating the default graph"),
        "{}",
        run.stderr()
    );
    assert!(run.stdout().contains("epoch   0  loss"), "{}", run.stdout());
    assert!(cache
        .join(format!(
            "mag-like-v{}-s0.01-seed0/schema.json",
            graphs::generate::VERSION
        ))
        .exists());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("out/run.json")).unwrap())
            .unwrap();
    for key in [
        "config",
        "mode",
        "nodes",
        "steps",
        "epochs",
        "bytes_by_kind",
        "messages_by_kind",
        "cache",
        "failures",
        "final_model_sha256",
        "peak_memory_bytes",
    ] {
        assert!(report.get(key).is_some(), "report lacks {key}");
    }
    assert_eq!(report["mode"], "single");
    assert_eq!(report["steps"], 7);
    let e = &report["epochs"][0];
    for key in [
        "loss",
        "train_acc",
        "valid_acc",
        "test_acc",
        "seconds",
        "sample_s",
        "gather_s",
        "compute_s",
        "comm_s",
        "update_s",
    ] {
        assert!(e[key].is_number(), "epoch lacks {key}");
    }
    // The second run reuses the cached graph; a mode key of [training]
    // itself, as before 0.5, is read with a warning naming its new place.
    let again = hetgnn_env(
        tmp.path(),
        &[
            "train",
            "--epochs",
            "1",
            "--model",
            "mlp",
            "--set",
            "training.prefetch_threads=1",
        ],
        &env,
    )
    .ok();
    assert!(
        again.stderr().contains("using the default graph"),
        "{}",
        again.stderr()
    );
    assert!(
        again
            .stderr()
            .contains("warning: training.prefetch_threads is deprecated: write `prefetch_threads` under [training.single]"),
        "{}",
        again.stderr()
    );

    hetgnn(tmp.path(), &["plot", "out/run.json", "--out", "curves.png"]).ok();
    let png = std::fs::read(tmp.path().join("curves.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn eval_every_skips_evaluations_in_the_log_the_report_and_the_plot() {
    let tmp = tempfile::tempdir().unwrap();
    hetgnn(tmp.path(), &["generate", "--scale", "0.002", "--out", "g"]).ok();
    let run = hetgnn(
        tmp.path(),
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "3",
            "--batch",
            "256",
            "--hidden",
            "16",
            "--eval-every",
            "2",
            "--report",
            "r.json",
        ],
    )
    .ok();
    let out = run.stdout();
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("epoch")).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].contains("valid -  test -"),
        "epoch 0 is not evaluated: {}",
        lines[0]
    );
    assert!(
        !lines[1].contains("valid -") && !lines[2].contains("valid -"),
        "{out}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("r.json")).unwrap()).unwrap();
    assert!(
        report["epochs"][0]["valid_acc"].is_null() && report["epochs"][0]["test_acc"].is_null()
    );
    assert!(
        report["epochs"][1]["test_acc"].is_number() && report["epochs"][2]["test_acc"].is_number()
    );
    hetgnn(tmp.path(), &["plot", "r.json", "--out", "curves.png"]).ok();
    hetgnn(tmp.path(), &["train", "--data", "g", "--eval-every", "0"])
        .fails_with(1, &["eval_every must be at least 1"]);
}

#[test]
fn config_file_checkpoint_resume_and_predict() {
    let tmp = tempfile::tempdir().unwrap();
    hetgnn(tmp.path(), &["generate", "--scale", "0.002", "--out", "g"]).ok();
    std::fs::write(
        tmp.path().join("run.toml"),
        "[training]\ndata = \"g\"\nepochs = 1\nbatch = 256\nhidden = 16\n",
    )
    .unwrap();
    hetgnn(
        tmp.path(),
        &["train", "--config", "run.toml", "--checkpoint", "ck"],
    )
    .ok();
    let resumed = hetgnn(
        tmp.path(),
        &[
            "train",
            "--config",
            "run.toml",
            "--checkpoint",
            "ck",
            "--resume",
            "--set",
            "training.epochs=2",
        ],
    )
    .ok();
    assert!(
        resumed.stderr().contains("resumed from"),
        "{}",
        resumed.stderr()
    );
    assert!(
        resumed.stdout().contains("epoch   1") && !resumed.stdout().contains("epoch   0"),
        "{}",
        resumed.stdout()
    );
    hetgnn(
        tmp.path(),
        &[
            "predict",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "p.npy",
            "--embeddings",
            "e.npy",
        ],
    )
    .ok();
    let p = graphs::npy::NpyFile::open(&tmp.path().join("p.npy"), graphs::npy::DType::I64).unwrap();
    assert_eq!(p.shape(), &[1473]);
    assert!((0..p.len()).all(|i| (0..349).contains(&p.i64_at(i))));
    let e = graphs::npy::NpyFile::open(&tmp.path().join("e.npy"), graphs::npy::DType::F32).unwrap();
    assert_eq!(e.shape(), &[1473, 16]);
    // A checkpoint of another model is refused.
    hetgnn(
        tmp.path(),
        &[
            "train",
            "--config",
            "run.toml",
            "--checkpoint",
            "ck",
            "--resume",
            "--hidden",
            "32",
            "--epochs",
            "3",
        ],
    )
    .fails_with(1, &["written for another model"]);
}

#[test]
fn train_refuses_bad_input_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    hetgnn(tmp.path(), &["train", "--data", "nowhere"])
        .fails_with(1, &["nowhere", "does not exist"]);
    hetgnn(
        tmp.path(),
        &["train", "--data", "nowhere", "--model", "gat"],
    )
    .fails_with(1, &["unknown variant `gat`"]);
    hetgnn(
        tmp.path(),
        &["train", "--data", "nowhere", "--fanouts", "25"],
    )
    .fails_with(
        1,
        &["training.fanouts lists 1 values but training.layers is 2"],
    );
    hetgnn(tmp.path(), &["train", "--set", "training.epoch=3"])
        .fails_with(1, &["unknown field `epoch`"]);
    hetgnn(tmp.path(), &["train", "--config", "missing.toml"]).fails_with(1, &["missing.toml"]);
    hetgnn(
        tmp.path(),
        &["train", "--data", "nowhere", "--device", "cuda:0"],
    )
    .fails_with(1, &["training.device"]);
    hetgnn(tmp.path(), &["plot", "missing.json"]).fails_with(1, &["missing.json"]);
    hetgnn(
        tmp.path(),
        &[
            "predict",
            "--checkpoint",
            "nock",
            "--data",
            "g",
            "--out",
            "p.npy",
        ],
    )
    .fails_with(1, &["nock"]);
}

#[test]
fn embed_writes_every_type_by_exact_inference() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
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
            "3",
            "--fanouts",
            "5,5,5",
            "--checkpoint",
            "ck",
        ],
    )
    .ok();
    let out = hetgnn(
        d,
        &[
            "embed",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "emb",
            "--batch",
            "100",
        ],
    )
    .ok()
    .stdout();
    assert!(out.contains("2 layer(s), full neighbourhoods"), "{out}");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("g/schema.json")).unwrap()).unwrap();
    for (name, t) in schema["node_types"].as_object().unwrap() {
        let f =
            graphs::npy::NpyFile::open(&d.join(format!("emb/{name}.npy")), graphs::npy::DType::F32)
                .unwrap();
        assert_eq!(f.shape(), &[t["count"].as_u64().unwrap(), 16], "{name}");
        assert!(f.to_f32_vec().iter().all(|v| v.is_finite()));
    }
    // Deterministic for a chunk size; other chunk sizes agree to rounding (matrix products of other shapes).
    hetgnn(
        d,
        &[
            "embed",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "emb2",
            "--batch",
            "100",
        ],
    )
    .ok();
    assert!(
        std::fs::read(d.join("emb/paper.npy")).unwrap()
            == std::fs::read(d.join("emb2/paper.npy")).unwrap(),
        "same chunks, same bytes"
    );
    hetgnn(
        d,
        &[
            "embed",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "emb3",
            "--batch",
            "7",
        ],
    )
    .ok();
    let read = |p: &str| {
        graphs::npy::NpyFile::open(&d.join(p), graphs::npy::DType::F32)
            .unwrap()
            .to_f32_vec()
    };
    let (a, b) = (read("emb/paper.npy"), read("emb3/paper.npy"));
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1.0))
        .fold(0f32, f32::max);
    assert!(worst < 1e-5, "chunks of 7 against 100: {worst}");
    hetgnn(
        d,
        &["embed", "--checkpoint", "ck", "--data", "g", "--out", "emb"],
    )
    .fails_with(1, &["already exists", "--force"]);
    hetgnn(
        d,
        &[
            "embed",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "g/emb",
            "--force",
        ],
    )
    .fails_with(1, &["inside the input --data"]);
    hetgnn(
        d,
        &[
            "train",
            "--data",
            "g",
            "--epochs",
            "1",
            "--model",
            "mlp",
            "--checkpoint",
            "ck-mlp",
        ],
    )
    .ok();
    hetgnn(
        d,
        &[
            "embed",
            "--checkpoint",
            "ck-mlp",
            "--data",
            "g",
            "--out",
            "e3",
        ],
    )
    .fails_with(1, &["relational model"]);
}
