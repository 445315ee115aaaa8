//! `hetgnn train --task link-prediction` end to end, and what it refuses.

use crate::util::{hetgnn, report};

const LP: [&str; 4] = [
    "--task",
    "link-prediction",
    "--target-relations",
    "author__writes__paper",
];

#[test]
fn link_prediction_trains_reports_and_embeds() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    let args = |extra: &[&'static str]| -> Vec<&'static str> {
        [
            &[
                "train", "--data", "g", "--epochs", "4", "--batch", "256", "--hidden", "32",
            ][..],
            &LP[..],
            extra,
        ]
        .concat()
    };
    let out = hetgnn(d, &args(&["--report", "a.json", "--checkpoint", "ck"])).ok();
    assert!(
        out.stdout().contains("valid MRR") && out.stdout().contains("final test MRR"),
        "{}",
        out.stdout()
    );
    let r = report(&d.join("a.json"));
    let link = &r["link"];
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("g/schema.json")).unwrap()).unwrap();
    let writes = schema["relations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "writes")
        .unwrap()["count"]
        .as_u64()
        .unwrap();
    let (train, valid, test) = (
        link["train_edges"].as_u64().unwrap(),
        link["valid_edges"].as_u64().unwrap(),
        link["test_edges"].as_u64().unwrap(),
    );
    assert_eq!(
        train + valid + test,
        writes,
        "the split covers every edge once"
    );
    assert!(valid > 0 && test > 0 && train > 8 * (valid + test));
    assert!(
        link["split"]
            .as_str()
            .unwrap()
            .contains("edge_split_seed 0")
            && link["metric"]
                .as_str()
                .unwrap()
                .contains("1000 fixed negatives")
    );
    let epochs = r["epochs"].as_array().unwrap();
    assert_eq!(r["steps"].as_u64().unwrap(), 4 * train.div_ceil(256));
    let loss = |e: &serde_json::Value| e["loss"].as_f64().unwrap();
    assert!(
        loss(&epochs[3]) < loss(&epochs[0]),
        "the loss falls: {} then {}",
        loss(&epochs[0]),
        loss(&epochs[3])
    );
    for e in epochs {
        for split in ["valid", "test"] {
            let m = &e["link"][split];
            let (mrr, h1, h10, h100) = (
                m["mrr"].as_f64().unwrap(),
                m["hits1"].as_f64().unwrap(),
                m["hits10"].as_f64().unwrap(),
                m["hits100"].as_f64().unwrap(),
            );
            assert!(
                0.0 < mrr && mrr <= 1.0 && h1 <= h10 && h10 <= h100 && h100 <= 1.0,
                "{m}"
            );
        }
    }
    // Ranking 1 positive among 1000 uniform negatives by chance gives an MRR near 0.0075.
    let mrr = epochs[3]["link"]["test"]["mrr"].as_f64().unwrap();
    assert!(mrr > 0.03, "test MRR {mrr} is no better than chance");
    hetgnn(d, &["plot", "a.json", "--out", "curves.png"]).ok();
    assert_eq!(
        &std::fs::read(d.join("curves.png")).unwrap()[..4],
        b"\x89PNG"
    );

    // Deterministic; another decoder and loss train another model.
    hetgnn(d, &args(&["--report", "b.json"])).ok();
    assert_eq!(
        r["final_model_sha256"],
        report(&d.join("b.json"))["final_model_sha256"]
    );
    hetgnn(
        d,
        &args(&[
            "--report",
            "c.json",
            "--decoder",
            "distmult",
            "--set",
            "training.link_loss=\"contrastive\"",
            "--set",
            "training.negative_sampler=\"in-batch\"",
        ]),
    )
    .ok();
    let c = report(&d.join("c.json"));
    assert_ne!(r["final_model_sha256"], c["final_model_sha256"]);
    assert!(c["epochs"][3]["link"]["test"]["mrr"].as_f64().unwrap() > 0.0);

    // Resuming needs the same link settings; embed writes the last layer's rows (hidden wide).
    hetgnn(
        d,
        &args(&["--checkpoint", "ck", "--resume", "--negatives", "3"]),
    )
    .fails_with(1, &["ck"]);
    hetgnn(
        d,
        &["embed", "--checkpoint", "ck", "--data", "g", "--out", "emb"],
    )
    .ok();
    let f = graphs::npy::NpyFile::open(&d.join("emb/author.npy"), graphs::npy::DType::F32).unwrap();
    assert_eq!(f.shape()[1], 32);
    hetgnn(
        d,
        &[
            "predict",
            "--checkpoint",
            "ck",
            "--data",
            "g",
            "--out",
            "p.npy",
        ],
    )
    .fails_with(1, &["link prediction", "hetgnn embed"]);

    // Pre-trained, then fine-tuned: a node classifier from the predictor's
    // layers and rows, frozen, whose checkpoint predicts classes.
    let tune = [
        "train",
        "--data",
        "g",
        "--epochs",
        "1",
        "--batch",
        "256",
        "--hidden",
        "32",
        "--init-from",
        "ck",
        "--freeze",
        "embed,gnn",
        "--checkpoint",
        "ft",
    ];
    let out = hetgnn(d, &tune).ok();
    assert!(
        out.stderr().contains("initialised from") && out.stderr().contains("frozen"),
        "{}",
        out.stderr()
    );
    hetgnn(
        d,
        &[
            "predict",
            "--checkpoint",
            "ft",
            "--data",
            "g",
            "--out",
            "p.npy",
        ],
    )
    .ok();
    hetgnn(
        d,
        &[&tune[..7], &["--init-from", "ck", "--hidden", "16"]].concat(),
    )
    .fails_with(1, &["training.init_from", "training.hidden = 32"]);
}

#[test]
fn link_prediction_refuses_what_it_cannot_do() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    hetgnn(d, &["generate", "--scale", "0.002", "--out", "g"]).ok();
    let train = |extra: &[&str]| {
        hetgnn(
            d,
            &[&["train", "--data", "g", "--epochs", "1"][..], extra].concat(),
        )
    };
    train(&["--task", "link-prediction"]).fails_with(1, &["training.target_relations"]);
    train(&[
        "--task",
        "link-prediction",
        "--target-relations",
        "author__reads__paper",
    ])
    .fails_with(1, &["author__reads__paper", "author__writes__paper"]);
    train(&[
        "--task",
        "link-prediction",
        "--target-relations",
        "paper__rev_writes__author",
    ])
    .fails_with(1, &["reverse"]);
    train(&[&LP[..], &["--model", "mlp"]].concat()).fails_with(1, &["relational model"]);
    train(&[&LP[..], &["--mode", "raf"]].concat())
        .fails_with(1, &["raf", "does not support it yet"]);
    train(
        &[
            &LP[..],
            &[
                "--mode",
                "data-parallel",
                "--set",
                "training.negative_sampler=\"in-batch\"",
            ],
        ]
        .concat(),
    )
    .fails_with(1, &["in-batch"]);
    train(&[&LP[..], &["--negatives", "0"]].concat()).fails_with(1, &["training.negatives"]);
    train(&[&LP[..], &["--set", "training.edge_split=[0.6, 0.5]"]].concat())
        .fails_with(1, &["training.edge_split"]);
    train(&["--target-relations", "author__writes__paper"]).fails_with(1, &["link-prediction"]);
}

#[test]
fn two_node_processes_predict_links_as_one_process_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.003", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "parts"],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    let lp = "task = \"link-prediction\"\ntarget_relations = [\"author__writes__paper\"]\nlink_eval = \"sampled\"\neval_negatives = 100\nepochs = 2\nbatch = 512\nhidden = 16\n";
    crate::util::training_cluster(
        d,
        &["n0", "n1"],
        "",
        &format!("mode = \"data-parallel\"\npartitions = \"parts\"\nreport = \"nodes.json\"\n{lp}"),
    );
    hetgnn(d, &["launch", "--config", "cluster.toml"]).ok();
    std::fs::write(
        d.join("one.toml"),
        format!("[training]\ndata = \"g\"\nreport = \"single.json\"\n{lp}"),
    )
    .unwrap();
    hetgnn(d, &["train", "--config", "one.toml"]).ok();
    std::fs::write(d.join("embedded.toml"), format!("[training]\nmode = \"data-parallel\"\npartitions = \"parts\"\nreport = \"embedded.json\"\n{lp}")).unwrap();
    hetgnn(d, &["train", "--config", "embedded.toml"]).ok();
    let (nodes, single, embedded) = (
        report(&d.join("nodes.json")),
        report(&d.join("single.json")),
        report(&d.join("embedded.json")),
    );
    assert_eq!(nodes["nodes"], 2);
    assert_eq!(
        nodes["final_model_sha256"], embedded["final_model_sha256"],
        "over QUIC as in one process"
    );
    assert!(
        nodes["bytes_by_kind"]["sample"].as_u64().unwrap_or(0) > 0,
        "owners sampled under the step's exclusions: {}",
        nodes["bytes_by_kind"]
    );
    for split in ["valid", "test"] {
        for m in ["mrr", "hits10"] {
            let (a, b) = (
                single["epochs"][1]["link"][split][m].as_f64().unwrap(),
                nodes["epochs"][1]["link"][split][m].as_f64().unwrap(),
            );
            assert!(
                (a - b).abs() < 1e-3,
                "{split} {m}: single {a}, two nodes {b}"
            );
        }
    }
}

#[test]
fn a_killed_node_restarted_under_lost_messages_ends_with_the_embedded_link_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    hetgnn(d, &["generate", "--scale", "0.003", "--out", "g"]).ok();
    hetgnn(
        d,
        &["partition", "--data", "g", "--parts", "2", "--out", "parts"],
    )
    .ok();
    hetgnn(d, &["certs", "init", "--out", "certs", "--nodes", "n0,n1"]).ok();
    let lp =
        "task = \"link-prediction\"\ntarget_relations = [\"author__writes__paper\"]\neval_negatives = 100\nepochs = 3\nbatch = 512\nhidden = 16\nmode = \"data-parallel\"\npartitions = \"parts\"\n";
    let training = format!("{lp}checkpoint_dir = \"ck\"\ncheckpoint_every = 10\nreport = \"run.json\"\n[chaos]\nseed = 5\ndrop = 0.03\nduplicate = 0.03\n");
    crate::util::training_cluster(
        d,
        &["n0", "n1"],
        "retry_ms = 50\nrejoin_timeout_ms = 60000\n",
        &training,
    );
    let logs = crate::util::kill_once_after_checkpoint(d, &["n0", "n1"], "n1", "ck/step-000000010");
    std::fs::write(
        d.join("embedded.toml"),
        format!("[training]\n{lp}report = \"embedded.json\"\n"),
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
            .is_some_and(|s| s >= 10 && s % 10 == 0),
        "{}",
        run["failures"]
    );
    assert_eq!(run["epochs"][2]["link"], embedded["epochs"][2]["link"]);
}
