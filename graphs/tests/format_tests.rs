//! The graph directory format: round trips and every refused input.

mod common;

use std::path::Path;

use graphs::npy::{self, DType};
use graphs::{load, save, GraphError, LoadOptions};

fn write_tiny() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    save(&common::tiny(), &tmp.path().join("g"), false).unwrap();
    tmp
}

#[test]
fn round_trip_preserves_everything() {
    let g = common::tiny();
    let tmp = write_tiny();
    let dir = tmp.path().join("g");
    for mmap in [true, false] {
        let h = load(
            &dir,
            &LoadOptions {
                mmap_features: mmap,
                reverse_edges: false,
            },
        )
        .unwrap();
        assert_eq!(h.schema(), g.schema());
        assert_eq!(
            h.node_types()[0].features.as_ref().unwrap().is_mapped(),
            mmap
        );
        for (a, b) in g.node_types().iter().zip(h.node_types()) {
            assert_eq!(a.count, b.count);
            assert_eq!(a.labels, b.labels);
            assert_eq!(a.splits, b.splits);
            assert_eq!(
                a.features.as_ref().map(|f| f.to_vec()),
                b.features.as_ref().map(|f| f.to_vec())
            );
        }
        for (a, b) in g.relations().iter().zip(h.relations()) {
            assert_eq!(a.in_csr(), b.in_csr());
            assert_eq!(a.out_csr(), b.out_csr());
            assert_eq!(a.key(), b.key());
        }
    }
    // Saving the loaded graph again gives byte-identical files.
    let h = load(&dir, &LoadOptions::default()).unwrap();
    save(&h, &tmp.path().join("g2"), false).unwrap();
    for f in [
        "schema.json",
        "nodes/paper/features.npy",
        "nodes/paper/labels.npy",
        "nodes/paper/train.npy",
        "edges/paper__cites__paper.npy",
    ] {
        assert_eq!(
            std::fs::read(dir.join(f)).unwrap(),
            std::fs::read(tmp.path().join("g2").join(f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn reverse_relations_mirror_the_originals() {
    let tmp = write_tiny();
    let g = load(
        &tmp.path().join("g"),
        &LoadOptions {
            mmap_features: true,
            reverse_edges: true,
        },
    )
    .unwrap();
    assert_eq!(g.relations().len(), 6);
    let rev = g.relation(g.relation_id("paper__rev_writes__author").unwrap());
    let fwd = g.relation(rev.reverse_of.unwrap());
    assert_eq!(fwd.name, "writes");
    assert_eq!(rev.in_csr(), fwd.out_csr());
    assert_eq!(rev.in_csr().neighbors(3), &[3, 4, 5]);
    // The metagraph lists one link per relation, weighted by edges.
    let mg = g.metagraph();
    assert_eq!(mg.links.len(), 6);
    assert_eq!(mg.incoming(g.type_id("paper").unwrap()).count(), 4); // writes, cites, rev_cites, rev_published_in
    assert_eq!(
        mg.links.iter().find(|l| l.name == "cites").unwrap().weight,
        7
    );
    // The saved schema never includes added reverses.
    assert_eq!(g.schema().relations.len(), 3);
}

#[test]
fn saving_refuses_to_clobber_unless_asked() {
    let tmp = write_tiny();
    let err = save(&common::tiny(), &tmp.path().join("g"), false).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    save(&common::tiny(), &tmp.path().join("g"), true).unwrap();
    // No temporary directories are left behind.
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("g")]);
}

/// Applies `corrupt` to a fresh copy of the tiny graph and returns the load error.
fn broken(corrupt: impl FnOnce(&Path)) -> GraphError {
    let tmp = write_tiny();
    let dir = tmp.path().join("g");
    corrupt(&dir);
    load(&dir, &LoadOptions::default()).expect_err("corrupted directory must be refused")
}

fn assert_err(err: GraphError, file: &str, needle: &str) {
    let msg = err.to_string();
    assert!(msg.contains(file), "error should name {file}: {msg}");
    assert!(msg.contains(needle), "error should say '{needle}': {msg}");
}

fn edit_schema(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("schema.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, v.to_string()).unwrap();
}

#[test]
fn every_format_violation_names_its_file() {
    assert_err(
        broken(|d| std::fs::remove_file(d.join("schema.json")).unwrap()),
        "schema.json",
        "missing",
    );
    assert_err(
        broken(|d| std::fs::write(d.join("schema.json"), "{ not json").unwrap()),
        "schema.json",
        "invalid schema",
    );
    assert_err(
        broken(|d| edit_schema(d, |v| v["target"] = "venue2".into())),
        "schema.json",
        "not a node type",
    );
    assert_err(
        broken(|d| {
            edit_schema(d, |v| {
                let r = v["relations"][0].clone();
                v["relations"].as_array_mut().unwrap().push(r)
            })
        }),
        "schema.json",
        "listed twice",
    );
    assert_err(
        broken(|d| std::fs::remove_file(d.join("nodes/paper/features.npy")).unwrap()),
        "features.npy",
        "missing",
    );
    assert_err(
        broken(|d| std::fs::remove_file(d.join("edges/paper__cites__paper.npy")).unwrap()),
        "paper__cites__paper.npy",
        "missing",
    );
    assert_err(
        broken(|d| std::fs::remove_file(d.join("nodes/paper/test.npy")).unwrap()),
        "test.npy",
        "missing",
    );
    // Wrong dtype: int64 where float32 is required.
    assert_err(
        broken(|d| npy::write_i64(&d.join("nodes/paper/features.npy"), &[6, 3], &[0; 18]).unwrap()),
        "features.npy",
        "dtype <i8 where <f4 is required",
    );
    // Wrong shape.
    assert_err(
        broken(|d| {
            npy::write_f32(&d.join("nodes/paper/features.npy"), &[6, 4], &[0.0; 24]).unwrap()
        }),
        "features.npy",
        "shape [6, 4], expected [6, 3]",
    );
    // Truncated file.
    assert_err(
        broken(|d| {
            let p = d.join("edges/author__writes__paper.npy");
            let bytes = std::fs::read(&p).unwrap();
            std::fs::write(&p, &bytes[..bytes.len() - 5]).unwrap();
        }),
        "author__writes__paper.npy",
        "truncated",
    );
    assert_err(
        broken(|d| std::fs::write(d.join("nodes/paper/labels.npy"), b"\x93NUM").unwrap()),
        "labels.npy",
        "truncated",
    );
    assert_err(
        broken(|d| std::fs::write(d.join("nodes/paper/labels.npy"), vec![7u8; 200]).unwrap()),
        "labels.npy",
        "bad magic",
    );
    // Edge count disagrees with the schema.
    assert_err(
        broken(|d| edit_schema(d, |v| v["relations"][1]["count"] = 8.into())),
        "paper__cites__paper.npy",
        "expected [2, 8]",
    );
    // Node count disagrees with the features.
    assert_err(
        broken(|d| edit_schema(d, |v| v["node_types"]["paper"]["count"] = 7.into())),
        "features.npy",
        "expected [7, 3]",
    );
    // Ids out of range.
    assert_err(
        broken(|d| {
            npy::write_i64(
                &d.join("edges/paper__cites__paper.npy"),
                &[2, 7],
                &[1, 2, 3, 4, 5, 0, 6, 0, 0, 0, 0, 0, 5, 1],
            )
            .unwrap()
        }),
        "paper__cites__paper.npy",
        "source id 6 out of range 0..6",
    );
    assert_err(
        broken(|d| {
            npy::write_i64(
                &d.join("edges/paper__published_in__venue.npy"),
                &[2, 6],
                &[0, 1, 2, 3, 4, 5, 0, 0, 1, 1, -1, 1],
            )
            .unwrap()
        }),
        "paper__published_in__venue.npy",
        "destination id -1 out of range",
    );
    assert_err(
        broken(|d| npy::write_i64(&d.join("nodes/paper/train.npy"), &[2], &[0, 6]).unwrap()),
        "train.npy",
        "out of range",
    );
    assert_err(
        broken(|d| npy::write_i64(&d.join("nodes/paper/train.npy"), &[2], &[0, 0]).unwrap()),
        "train.npy",
        "listed twice",
    );
    assert_err(
        broken(|d| npy::write_i64(&d.join("nodes/paper/valid.npy"), &[1], &[0]).unwrap()),
        "valid.npy",
        "another split",
    );
    assert_err(
        broken(|d| npy::write_i64(&d.join("nodes/paper/valid.npy"), &[1], &[4]).unwrap()),
        "valid.npy",
        "no label",
    );
    assert_err(
        broken(|d| {
            npy::write_i64(&d.join("nodes/paper/labels.npy"), &[6], &[0, 1, 2, 1, 0, 1]).unwrap()
        }),
        "labels.npy",
        "outside -1..2",
    );
    // A featureless type with a feature file.
    assert_err(
        broken(|d| {
            npy::write_f32(&d.join("nodes/venue/features.npy"), &[2, 1], &[0.0, 1.0]).unwrap()
        }),
        "venue/features.npy",
        "featureless",
    );
    // Fortran order.
    assert_err(
        broken(|d| {
            let p = d.join("nodes/paper/features.npy");
            let mut b = std::fs::read(&p).unwrap();
            // Same header length ("True " for "False"): patch the header in place.
            let at = b.windows(5).position(|w| w == b"False").unwrap();
            b[at..at + 5].copy_from_slice(b"True ");
            std::fs::write(&p, b).unwrap();
        }),
        "features.npy",
        "Fortran",
    );
    let missing = load(Path::new("/nonexistent/graph"), &LoadOptions::default()).unwrap_err();
    assert!(missing.to_string().contains("/nonexistent/graph"));
}

#[test]
fn reads_numpy_written_version_2_files() {
    // A version 2.0 header, as numpy writes for very wide headers.
    let tmp = write_tiny();
    let dir = tmp.path().join("g");
    let dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }";
    let mut bytes = b"\x93NUMPY\x02\x00".to_vec();
    let pad = (64 - (12 + dict.len() + 1) % 64) % 64;
    let header = format!("{dict}{}\n", " ".repeat(pad));
    bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in [0i64, 1, 2] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(dir.join("nodes/paper/train.npy"), bytes).unwrap();
    let g = load(&dir, &LoadOptions::default()).unwrap();
    assert_eq!(g.target_labels().1.train, vec![0, 1, 2]);
    let f = npy::NpyFile::open(&dir.join("nodes/paper/train.npy"), DType::I64).unwrap();
    assert_eq!(f.shape(), &[3]);
}

#[test]
fn loads_the_shared_real_datasets() {
    let Ok(root) = std::env::var("HETGNN_DATASETS") else {
        eprintln!("HETGNN_DATASETS is not set: skipping the real-dataset check");
        return;
    };
    for (name, target, classes) in [
        ("heco-acm", "paper", 3),
        ("heco-freebase", "movie", 3),
        ("planetoid-cora", "paper", 7),
    ] {
        let dir = Path::new(&root).join(name);
        let g = load(
            &dir,
            &LoadOptions {
                mmap_features: true,
                reverse_edges: name != "planetoid-cora",
            },
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(g.node_type(g.target()).name, target);
        assert_eq!(g.num_classes(), classes);
        let (labels, splits) = g.target_labels();
        assert!(splits.train.iter().all(|&i| labels[i as usize] >= 0));
        assert!(!splits.test.is_empty());
    }
}

/// The tiny graph with regression targets: node 4 has a value but no label,
/// node 2 a label but no value.
fn with_values() -> tempfile::TempDir {
    let g = common::tiny();
    let (labels, splits) = g.target_labels();
    let mut splits = splits.clone();
    splits.valid.push(4);
    let mut b = graphs::GraphBuilder::new("tiny-values", "paper", 2);
    for t in g.node_types() {
        let f = t
            .features
            .as_ref()
            .map(|f| graphs::Features::from_vec(f.rows(), f.dim(), f.to_vec()));
        b = b.node_type(&t.name, t.count, f);
    }
    b = b
        .labels(labels.to_vec(), splits)
        .values(vec![0.5, -1.0, f32::NAN, 2.0, 3.5, 0.0]);
    for r in g.relations() {
        let csr = r.in_csr();
        let (mut s, mut d) = (Vec::new(), Vec::new());
        for v in 0..csr.num_rows() as u32 {
            for &u in csr.neighbors(v) {
                s.push(u);
                d.push(v);
            }
        }
        let (src, dst) = (&g.node_type(r.src).name, &g.node_type(r.dst).name);
        b = b.relation(src, &r.name, dst, s, d);
    }
    let tmp = tempfile::tempdir().unwrap();
    save(&b.build().unwrap(), &tmp.path().join("g"), false).unwrap();
    tmp
}

#[test]
fn regression_values_round_trip_and_bad_ones_are_refused() {
    let tmp = with_values();
    let dir = tmp.path().join("g");
    let g = load(&dir, &LoadOptions::default()).unwrap();
    let v = g.target_values().unwrap();
    assert_eq!(v.len(), 6);
    assert!(v[2].is_nan() && v[4] == 3.5);
    assert!(g.schema().values);
    // A split node needs a label or a value: node 4 has only a value, and is accepted.
    assert!(g.target_labels().1.valid.contains(&4));
    let text = std::fs::read_to_string(dir.join("schema.json")).unwrap();
    assert!(text.contains("\"values\":true") || text.contains("\"values\": true"));
    // A graph without values does not write the key (older readers keep reading it).
    let plain = write_tiny();
    let text = std::fs::read_to_string(plain.path().join("g/schema.json")).unwrap();
    assert!(!text.contains("values"), "{text}");

    let fresh = || {
        let t = with_values();
        let d = t.path().join("g");
        (t, d)
    };
    let refused = |corrupt: &dyn Fn(&Path)| {
        let (_t, d) = fresh();
        corrupt(&d);
        load(&d, &LoadOptions::default()).expect_err("must be refused")
    };
    let values = |d: &Path| d.join("nodes/paper/values.npy");
    assert_err(
        refused(&|d| npy::write_f32(&values(d), &[5], &[0.0; 5]).unwrap()),
        "values.npy",
        "shape",
    );
    assert_err(
        refused(&|d| {
            npy::write_f32(&values(d), &[6], &[0.0, 1.0, 2.0, f32::INFINITY, 0.0, 0.0]).unwrap()
        }),
        "values.npy",
        "node 3",
    );
    assert_err(
        refused(&|d| npy::write_i64(&values(d), &[6], &[0; 6]).unwrap()),
        "values.npy",
        "dtype",
    );
    assert_err(
        refused(&|d| std::fs::remove_file(values(d)).unwrap()),
        "values.npy",
        "missing",
    );
    // Node 4 (no label) loses its value.
    assert_err(
        refused(&|d| {
            npy::write_f32(&values(d), &[6], &[0.5, -1.0, f32::NAN, 2.0, f32::NAN, 0.0]).unwrap()
        }),
        "valid.npy",
        "neither a label",
    );
    // A values file the schema does not list.
    assert_err(
        refused(&|d| edit_schema(d, |v| v["values"] = serde_json::Value::Bool(false))),
        "values.npy",
        "does not list values",
    );
}

/// The tiny graph with label sets of 3 labels: node 4 has a set but no
/// class label, node 2 a class label but no set.
fn with_label_sets() -> tempfile::TempDir {
    let g = common::tiny();
    let (labels, splits) = g.target_labels();
    let mut splits = splits.clone();
    splits.valid.push(4);
    let mut b = graphs::GraphBuilder::new("tiny-sets", "paper", 2);
    for t in g.node_types() {
        let f = t
            .features
            .as_ref()
            .map(|f| graphs::Features::from_vec(f.rows(), f.dim(), f.to_vec()));
        b = b.node_type(&t.name, t.count, f);
    }
    #[rustfmt::skip]
    let bits = vec![1, 0, 1,  0, 0, 0,  -1, -1, -1,  1, 1, 1,  0, 1, 0,  1, 0, 0];
    b = b.labels(labels.to_vec(), splits).label_sets(3, bits);
    for r in g.relations() {
        let csr = r.in_csr();
        let (mut s, mut d) = (Vec::new(), Vec::new());
        for v in 0..csr.num_rows() as u32 {
            for &u in csr.neighbors(v) {
                s.push(u);
                d.push(v);
            }
        }
        let (src, dst) = (&g.node_type(r.src).name, &g.node_type(r.dst).name);
        b = b.relation(src, &r.name, dst, s, d);
    }
    let tmp = tempfile::tempdir().unwrap();
    save(&b.build().unwrap(), &tmp.path().join("g"), false).unwrap();
    tmp
}

#[test]
fn label_sets_round_trip_and_bad_ones_are_refused() {
    let tmp = with_label_sets();
    let dir = tmp.path().join("g");
    let g = load(&dir, &LoadOptions::default()).unwrap();
    let s = g.target_label_sets().unwrap();
    assert_eq!((s.width(), s.count()), (3, 6));
    assert_eq!(s.row(3), &[1, 1, 1]);
    assert!(!s.known(2) && s.known(4));
    assert_eq!(g.schema().label_sets, Some(3));
    // Node 4 has only a label set, and is accepted in a split.
    assert!(g.target_labels().1.valid.contains(&4));
    let plain = write_tiny();
    let text = std::fs::read_to_string(plain.path().join("g/schema.json")).unwrap();
    assert!(!text.contains("label_sets"), "{text}");

    let refused = |corrupt: &dyn Fn(&Path)| {
        let t = with_label_sets();
        let d = t.path().join("g");
        corrupt(&d);
        load(&d, &LoadOptions::default()).expect_err("must be refused")
    };
    let sets = |d: &Path| d.join("nodes/paper/label_sets.npy");
    assert_err(
        refused(&|d| npy::write_i8(&sets(d), &[6, 2], &[0; 12]).unwrap()),
        "label_sets.npy",
        "shape",
    );
    assert_err(
        refused(&|d| {
            let mut bits = vec![0i8; 18];
            bits[7] = 2;
            npy::write_i8(&sets(d), &[6, 3], &bits).unwrap()
        }),
        "label_sets.npy",
        "label 1 of node 2 is 2",
    );
    assert_err(
        refused(&|d| npy::write_i64(&sets(d), &[6, 3], &[0; 18]).unwrap()),
        "label_sets.npy",
        "dtype",
    );
    assert_err(
        refused(&|d| std::fs::remove_file(sets(d)).unwrap()),
        "label_sets.npy",
        "missing",
    );
    // Node 4 (no class label) loses its set.
    assert_err(
        refused(&|d| {
            let mut bits = vec![0i8; 18];
            bits[12..15].fill(-1);
            npy::write_i8(&sets(d), &[6, 3], &bits).unwrap()
        }),
        "valid.npy",
        "neither a label (-1) nor a label set",
    );
    assert_err(
        refused(&|d| {
            edit_schema(d, |v| {
                v.as_object_mut().unwrap().remove("label_sets");
            })
        }),
        "label_sets.npy",
        "label_sets",
    );
    assert_err(
        refused(&|d| edit_schema(d, |v| v["label_sets"] = serde_json::json!(0))),
        "schema.json",
        "label_sets must be",
    );
}

/// A generated graph: its `writes` edges carry labels, values and splits.
fn with_edge_targets() -> (tempfile::TempDir, std::path::PathBuf) {
    common::mag_like(0.002, 3)
}

#[test]
fn edge_targets_round_trip_and_bad_ones_are_refused() {
    const WRITES: &str = "author__writes__paper";
    let (_tmp, dir) = with_edge_targets();
    let g = load(&dir, &LoadOptions::default()).unwrap();
    let r = g.relation(g.relation_id(WRITES).unwrap());
    let t = r.targets().expect("writes edges have targets");
    assert_eq!(t.num_classes, Some(2));
    assert!(t.has_values);
    let total = t.train.len() + t.valid.len() + t.test.len();
    assert_eq!(total, r.num_edges(), "every generated edge is in a split");
    assert!(t.valid.len() > total / 20 && t.test.len() > total / 20);
    let positives = t.train.labels.iter().filter(|&&l| l == 1).count();
    assert!(
        positives > t.train.len() / 5 && positives < t.train.len() * 4 / 5,
        "{positives} of {}",
        t.train.len()
    );
    assert!(t.train.values.iter().all(|v| v.is_finite()));
    // Other relations have none, and the schema says so.
    assert!(g
        .relations()
        .iter()
        .filter(|r| r.canonical() != WRITES)
        .all(|r| r.targets().is_none()));
    let schema = g.schema();
    let w = schema
        .relations
        .iter()
        .find(|r| r.canonical() == WRITES)
        .unwrap();
    assert_eq!((w.num_classes, w.values), (Some(2), true));

    // Saved (edges rewritten in another order) and loaded again: the same targets.
    let out = _tmp.path().join("saved");
    save(&g, &out, false).unwrap();
    let h = load(&out, &LoadOptions::default()).unwrap();
    assert_eq!(
        h.relation(h.relation_id(WRITES).unwrap()).targets(),
        Some(t)
    );
    assert_eq!(h.schema(), schema);
    // Reverse relations carry none; removing edges drops them.
    let rev = load(
        &dir,
        &LoadOptions {
            reverse_edges: true,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert!(rev
        .relation(rev.relation_id("paper__rev_writes__author").unwrap())
        .targets()
        .is_none());

    let refused = |corrupt: &dyn Fn(&Path)| {
        let (_t, d) = with_edge_targets();
        corrupt(&d);
        load(&d, &LoadOptions::default()).expect_err("must be refused")
    };
    let file = |d: &Path, f: &str| d.join("edges").join(WRITES).join(f);
    let count = r.num_edges() as u64;
    assert_err(
        refused(&|d| {
            npy::write_i64(
                &file(d, "labels.npy"),
                &[count - 1],
                &vec![0; count as usize - 1],
            )
            .unwrap()
        }),
        "labels.npy",
        "shape",
    );
    assert_err(
        refused(&|d| {
            let mut l = vec![0i64; count as usize];
            l[7] = 2;
            npy::write_i64(&file(d, "labels.npy"), &[count], &l).unwrap()
        }),
        "labels.npy",
        "label 2 of edge 7 is outside -1..2",
    );
    assert_err(
        refused(&|d| {
            let mut v = vec![0f32; count as usize];
            v[3] = f32::NEG_INFINITY;
            npy::write_f32(&file(d, "values.npy"), &[count], &v).unwrap()
        }),
        "values.npy",
        "the value of edge 3",
    );
    assert_err(
        refused(&|d| npy::write_i64(&file(d, "test.npy"), &[1], &[count as i64]).unwrap()),
        "test.npy",
        "out of range",
    );
    assert_err(
        refused(&|d| {
            let first = std::fs::read(file(d, "train.npy")).unwrap();
            std::fs::write(file(d, "test.npy"), first).unwrap()
        }),
        "test.npy",
        "also in another split",
    );
    assert_err(
        refused(&|d| {
            // An edge with neither target in a split.
            npy::write_i64(&file(d, "labels.npy"), &[count], &vec![-1; count as usize]).unwrap();
            npy::write_f32(
                &file(d, "values.npy"),
                &[count],
                &vec![f32::NAN; count as usize],
            )
            .unwrap()
        }),
        "train.npy",
        "neither a label (-1) nor a value (NaN)",
    );
    assert_err(
        refused(&|d| std::fs::remove_file(file(d, "valid.npy")).unwrap()),
        "valid.npy",
        "",
    );
    assert_err(
        refused(&|d| {
            edit_schema(d, |v| {
                for r in v["relations"].as_array_mut().unwrap() {
                    r.as_object_mut().unwrap().remove("num_classes");
                }
            })
        }),
        "labels.npy",
        "no num_classes",
    );
    assert_err(
        refused(&|d| {
            edit_schema(d, |v| {
                for r in v["relations"].as_array_mut().unwrap() {
                    let r = r.as_object_mut().unwrap();
                    r.remove("num_classes");
                    r.remove("values");
                }
            })
        }),
        WRITES,
        "edge-column directory exists",
    );
    assert_err(
        refused(&|d| edit_schema(d, |v| v["relations"][1]["num_classes"] = 0.into())),
        "schema.json",
        "num_classes must be in 1..=",
    );
}

#[test]
fn edge_weights_and_times_are_checked_and_refused_when_bad() {
    // The tiny graph: its first relation gets a weight and a time per edge.
    let tmp = write_tiny();
    let dir = tmp.path().join("g");
    let schema = graphs::Schema::read(&dir.join("schema.json")).unwrap();
    let r = schema.relations[0].clone();
    let (canonical, n) = (r.canonical(), r.count);
    let edir = dir.join("edges").join(&canonical);
    let add = |d: &Path, weights: &[f32], times: &[i64]| {
        let edir = d.join("edges").join(&canonical);
        std::fs::create_dir_all(&edir).unwrap();
        npy::write_f32(&edir.join("weights.npy"), &[weights.len() as u64], weights).unwrap();
        npy::write_i64(&edir.join("times.npy"), &[times.len() as u64], times).unwrap();
        edit_schema(d, |v| {
            v["relations"][0]["weights"] = true.into();
            v["relations"][0]["times"] = true.into();
        });
    };
    let weights: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let times: Vec<i64> = (0..n as i64).map(|i| 1_600_000_000 + i).collect();
    add(&dir, &weights, &times);
    load(&dir, &LoadOptions::default()).unwrap();
    let schema = graphs::Schema::read(&dir.join("schema.json")).unwrap();
    assert_eq!(
        graphs::format::read_edge_weights(&dir, &schema.relations[0]).unwrap(),
        Some(weights.clone())
    );
    assert_eq!(
        graphs::format::read_edge_times(&dir, &schema.relations[0]).unwrap(),
        Some(times.clone())
    );
    assert!(edir.exists());

    let mut nan = weights.clone();
    nan[1] = f32::NAN;
    assert_err(
        broken(|d| add(d, &nan, &times)),
        "weights.npy",
        "edge 1: weight NaN is not a finite number",
    );
    assert_err(
        broken(|d| add(d, &weights, &times[1..])),
        "times.npy",
        "edge times",
    );
    // A file the schema does not list is refused, and so is a target file
    // in a directory of weights and times only.
    assert_err(
        broken(|d| {
            add(d, &weights, &times);
            edit_schema(d, |v| v["relations"][0]["times"] = false.into());
        }),
        "times.npy",
        "does not list times",
    );
    assert_err(
        broken(|d| {
            add(d, &weights, &times);
            let edir = d.join("edges").join(&canonical);
            npy::write_i64(&edir.join("train.npy"), &[0], &[]).unwrap();
        }),
        "train.npy",
        "no edge targets",
    );
}
