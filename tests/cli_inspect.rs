//! `hetgnn inspect`.

use crate::util::hetgnn;

#[test]
fn inspect_prints_schema_degrees_and_metagraph() {
    let tmp = tempfile::tempdir().unwrap();
    hetgnn(tmp.path(), &["generate", "--scale", "0.002", "--out", "g"]).ok();
    let out = hetgnn(tmp.path(), &["inspect", "g", "--reverse-edges"])
        .ok()
        .stdout();
    for needle in [
        "target paper  (349 classes)",
        "paper                        1473 nodes  features   128",
        "author                       2269 nodes  featureless",
        "author__writes__paper  14291 edges",
        "in -degree of paper",
        "paper__rev_writes__author  14291 edges  (added reverse)",
        "metagraph",
        "author --writes--> paper  (14291 edges)",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
}

#[test]
fn inspect_refuses_invalid_directories_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    hetgnn(tmp.path(), &["inspect", "nowhere"]).fails_with(
        1,
        &[
            "nowhere is not a valid graph directory",
            "does not exist (expected a graph directory)",
        ],
    );
    // A regular file and a loop of symbolic links are named as such, not as missing.
    std::fs::write(tmp.path().join("afile"), b"x").unwrap();
    std::os::unix::fs::symlink("loop2", tmp.path().join("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", tmp.path().join("loop2")).unwrap();
    hetgnn(tmp.path(), &["inspect", "afile"])
        .fails_with(1, &["is a regular file, not a graph directory"]);
    hetgnn(tmp.path(), &["inspect", "loop1"]).fails_with(1, &["is a loop of symbolic links"]);
    hetgnn(tmp.path(), &["generate", "--scale", "0.001", "--out", "g"]).ok();
    let edges = tmp.path().join("g/edges/paper__cites__paper.npy");
    let bytes = std::fs::read(&edges).unwrap();
    std::fs::write(&edges, &bytes[..bytes.len() / 2]).unwrap();
    hetgnn(tmp.path(), &["inspect", "g"]).fails_with(1, &["paper__cites__paper.npy", "truncated"]);
    std::fs::write(tmp.path().join("g/schema.json"), "{\"name\": 1}").unwrap();
    hetgnn(tmp.path(), &["inspect", "g"]).fails_with(1, &["schema.json", "invalid schema"]);
}
