//! `hetgnn generate`.

use crate::util::hetgnn;

#[test]
fn generate_writes_a_loadable_mag_like_graph() {
    let tmp = tempfile::tempdir().unwrap();
    let run = hetgnn(
        tmp.path(),
        &[
            "generate", "--like", "mag", "--scale", "0.002", "--seed", "3", "--out", "g",
        ],
    )
    .ok();
    assert!(
        run.stdout().contains("wrote mag-synthetic-s0.002-seed3"),
        "{}",
        run.stdout()
    );
    let g = graphs::load(&tmp.path().join("g"), &graphs::LoadOptions::default()).unwrap();
    assert_eq!(g.node_types().len(), 4);
    assert_eq!(g.relations().len(), 4);
    assert_eq!(g.num_classes(), 349);
}

#[test]
fn generate_refuses_to_overwrite_without_force_and_bad_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    hetgnn(tmp.path(), &["generate", "--scale", "0.001", "--out", "g"]).ok();
    hetgnn(tmp.path(), &["generate", "--scale", "0.001", "--out", "g"])
        .fails_with(1, &["already exists", "--force"]);
    hetgnn(
        tmp.path(),
        &[
            "generate", "--scale", "0.001", "--seed", "2", "--out", "g", "--force",
        ],
    )
    .ok();
    hetgnn(tmp.path(), &["generate", "--scale=-1", "--out", "h"])
        .fails_with(1, &["scale must be a positive number"]);
    hetgnn(tmp.path(), &["generate", "--scale", "0", "--out", "h"])
        .fails_with(1, &["scale must be a positive number"]);
    hetgnn(tmp.path(), &["generate", "--like", "reddit", "--out", "h"])
        .fails_with(2, &["unknown graph kind 'reddit'"]);
    hetgnn(tmp.path(), &["generate", "--scale", "0.001"]).fails_with(2, &["--out"]);
    assert!(!tmp.path().join("h").exists());
}

#[test]
fn certs_init_writes_a_ca_and_node_certificates() {
    let tmp = tempfile::tempdir().unwrap();
    let run = hetgnn(
        tmp.path(),
        &["certs", "init", "--out", "certs", "--nodes", "n0,n1,n2"],
    )
    .ok();
    assert!(run.stdout().contains("n0, n1, n2"), "{}", run.stdout());
    for f in ["ca.pem", "ca.key", "n0.pem", "n0.key", "n1.pem", "n2.key"] {
        let text = std::fs::read_to_string(tmp.path().join("certs").join(f)).unwrap();
        assert!(text.starts_with("-----BEGIN "), "{f}");
    }
    hetgnn(
        tmp.path(),
        &["certs", "init", "--out", "certs", "--nodes", "n0"],
    )
    .fails_with(1, &["already exists", "--force"]);
    hetgnn(
        tmp.path(),
        &["certs", "init", "--out", "c2", "--nodes", "n0,n0"],
    )
    .fails_with(1, &["listed twice"]);
    hetgnn(
        tmp.path(),
        &["certs", "init", "--out", "c2", "--nodes", "Node 1"],
    )
    .fails_with(1, &["Node 1"]);
    assert!(!tmp.path().join("c2").exists());
}
