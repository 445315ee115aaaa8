//! `hetgnn import ogb` on a small dataset in OGB's raw layout, built here.

use std::io::Write;
use std::path::Path;

use flate2::write::GzEncoder;
use flate2::Compression;

use crate::util::hetgnn;

fn gz(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut e = GzEncoder::new(std::fs::File::create(path).unwrap(), Compression::fast());
    e.write_all(text.as_bytes()).unwrap();
    e.finish().unwrap();
}

/// ogbn-mag's layout: 5 papers (2-d features, labels 0..3), 3 authors, 2 fields.
fn ogb_dataset(root: &Path) {
    let raw = root.join("raw");
    gz(
        &raw.join("num-node-dict.csv.gz"),
        "author,field_of_study,paper\n3,2,5\n",
    );
    gz(
        &raw.join("node-feat/paper/node-feat.csv.gz"),
        "0.5,-1.0\n1.5,2.0\n-0.25,0\n3,4\n1e-3,7.5\n",
    );
    gz(
        &raw.join("node-label/paper/node-label.csv.gz"),
        "0\n2\n1\n2\n0\n",
    );
    gz(
        &raw.join("relations/author___writes___paper/edge.csv.gz"),
        "0,0\n0,1\n1,2\n2,3\n2,4\n",
    );
    gz(
        &raw.join("relations/paper___cites___paper/edge.csv.gz"),
        "1,0\n2,0\n4,3\n",
    );
    gz(
        &raw.join("relations/paper___has_topic___field_of_study/edge.csv.gz"),
        "0,1\n1,1\n2,0\n3,0\n4,1\n",
    );
    gz(&root.join("split/time/paper/train.csv.gz"), "0\n1\n2\n");
    gz(&root.join("split/time/paper/valid.csv.gz"), "3\n");
    gz(&root.join("split/time/paper/test.csv.gz"), "4\n");
}

#[test]
fn import_ogb_converts_the_raw_layout() {
    let tmp = tempfile::tempdir().unwrap();
    ogb_dataset(&tmp.path().join("ogbn_mag"));
    let run = hetgnn(tmp.path(), &["import", "ogb", "ogbn_mag", "--out", "g"]).ok();
    assert!(
        run.stdout().contains("target paper, 3 classes"),
        "{}",
        run.stdout()
    );
    let g = graphs::load(&tmp.path().join("g"), &graphs::LoadOptions::default()).unwrap();
    assert_eq!(g.name(), "ogbn_mag");
    let names: Vec<&str> = g.node_types().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["author", "field_of_study", "paper"]);
    let paper = g.node_type(g.target());
    assert_eq!(paper.name, "paper");
    assert_eq!(paper.features.as_ref().unwrap().row(4), &[1e-3, 7.5]);
    assert_eq!(paper.features.as_ref().unwrap().row(2), &[-0.25, 0.0]);
    let (labels, splits) = g.target_labels();
    assert_eq!(labels, &[0, 2, 1, 2, 0]);
    assert_eq!(
        (
            splits.train.as_slice(),
            splits.valid.as_slice(),
            splits.test.as_slice()
        ),
        (&[0, 1, 2][..], &[3][..], &[4][..])
    );
    let writes = g.relation(g.relation_id("author__writes__paper").unwrap());
    assert_eq!(writes.out_csr().neighbors(2), &[3, 4]);
    let cites = g.relation(g.relation_id("paper__cites__paper").unwrap());
    assert_eq!(cites.in_csr().neighbors(0), &[1, 2]);
    assert!(g.node_type(g.type_id("author").unwrap()).features.is_none());
}

#[test]
fn import_ogb_refuses_bad_input_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("ds");
    ogb_dataset(&src);
    gz(
        &src.join("raw/relations/paper___cites___paper/edge.csv.gz"),
        "1,0\n9,0\n",
    );
    hetgnn(tmp.path(), &["import", "ogb", "ds", "--out", "g"]).fails_with(
        1,
        &[
            "paper___cites___paper/edge.csv.gz",
            "line 2: source id 9 out of range 0..5",
        ],
    );
    assert!(!tmp.path().join("g").exists());
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "no temporary directory left: {names:?}");

    ogb_dataset(&src);
    gz(
        &src.join("raw/node-feat/paper/node-feat.csv.gz"),
        "0.5,-1.0\n1.5\n",
    );
    hetgnn(tmp.path(), &["import", "ogb", "ds", "--out", "g"]).fails_with(
        1,
        &[
            "node-feat.csv.gz",
            "line 2: 1 values where earlier rows have 2",
        ],
    );

    ogb_dataset(&src);
    std::fs::remove_file(src.join("split/time/paper/valid.csv.gz")).unwrap();
    hetgnn(tmp.path(), &["import", "ogb", "ds", "--out", "g"])
        .fails_with(1, &["valid.csv.gz", "missing"]);

    hetgnn(tmp.path(), &["import", "ogb", "nowhere", "--out", "g"])
        .fails_with(1, &["num-node-dict.csv.gz", "missing"]);
}
