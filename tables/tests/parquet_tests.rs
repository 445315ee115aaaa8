//! Parquet tables as users write them (pandas, Spark): integer ids, list
//! columns, nulls, dictionary-encoded strings, several files per type.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, DictionaryArray, Float64Array, Int64Array, RecordBatch};
use graphs::NoProgress;
use parquet::arrow::ArrowWriter;
use tables::{import_tables, ImportOptions, TableError};

fn write(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn tags(rows: &[Option<&[&str]>]) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new());
    for r in rows {
        match r {
            Some(items) => {
                for i in *items {
                    b.values().append_value(i);
                }
                b.append(true);
            }
            None => b.append(false),
        }
    }
    Arc::new(b.finish())
}

const CONFIG: &str = r#"
target = "user"
[[nodes]]
type = "user"
files = ["users"]
id = "uid"
[[nodes.features]]
columns = ["score"]
transform = "standard"
fill = 0.0
[[nodes.features]]
columns = ["tags"]
transform = "multi-hot"
fill = ""
[[nodes.features]]
columns = ["kind"]
transform = "one-hot"
[nodes.label]
column = "label"
[nodes.split]
fractions = [0.5, 0.25, 0.25]
seed = 3
[[edges]]
relation = ["user", "follows", "user"]
files = ["follows.parquet"]
source = "a"
destination = "b"
"#;

fn users(dir: &Path) {
    std::fs::create_dir_all(dir.join("users")).unwrap();
    let kind = |v: Vec<&str>| -> ArrayRef {
        Arc::new(v.into_iter().collect::<DictionaryArray<Int32Type>>())
    };
    write(
        &dir.join("users/part-0.parquet"),
        vec![
            (
                "uid",
                Arc::new(Int64Array::from(vec![100, 7, 42])) as ArrayRef,
            ),
            (
                "score",
                Arc::new(Float64Array::from(vec![Some(1.0), None, Some(3.0)])),
            ),
            ("tags", tags(&[Some(&["a", "b"]), None, Some(&["c"])])),
            ("kind", kind(vec!["x", "y", "x"])),
            (
                "label",
                Arc::new(Int64Array::from(vec![Some(0), Some(1), Some(1)])),
            ),
        ],
    );
    write(
        &dir.join("users/part-1.parquet"),
        vec![
            ("uid", Arc::new(Int64Array::from(vec![5])) as ArrayRef),
            ("score", Arc::new(Float64Array::from(vec![Some(5.0)]))),
            ("tags", tags(&[Some(&[])])),
            ("kind", kind(vec!["y"])),
            ("label", Arc::new(Int64Array::from(vec![Some(0)]))),
        ],
    );
}

#[test]
fn integer_ids_lists_nulls_and_dictionaries_are_read_across_files() {
    let tmp = tempfile::tempdir().unwrap();
    users(tmp.path());
    // Edge ids written as text still find integer node ids.
    write(
        &tmp.path().join("follows.parquet"),
        vec![
            (
                "a",
                Arc::new(Int64Array::from(vec![100, 42, 5])) as ArrayRef,
            ),
            (
                "b",
                Arc::new(arrow_array::StringArray::from(vec!["7", "100", "42"])),
            ),
        ],
    );
    let cfg = tmp.path().join("g.toml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let out = tmp.path().join("g");
    let (schema, record) =
        import_tables(&cfg, &out, &ImportOptions::default(), &mut NoProgress).unwrap();
    assert_eq!(schema.node_types[0].1.count, 4);
    // standard 1 + tags a,b,c 3 + kind x,y 2
    assert_eq!(schema.node_types[0].1.feature_dim, Some(6));
    assert_eq!(record.types[0].id_kind, tables::ids::IdKind::Int);
    let ids = std::fs::read_to_string(out.join("nodes/user/ids.csv")).unwrap();
    assert_eq!(ids, "id\n100\n7\n42\n5\n");
    let g = graphs::load(
        &out,
        &graphs::LoadOptions {
            mmap_features: false,
            reverse_edges: false,
        },
    )
    .unwrap();
    let f = g.node_types()[0].features.as_ref().unwrap();
    // Scores 1, fill 0, 3, 5: mean 2.25, population std sqrt(3.6875).
    let sd = 3.6875f64.sqrt();
    let want_score = [
        (1.0 - 2.25) / sd,
        (0.0 - 2.25) / sd,
        (3.0 - 2.25) / sd,
        (5.0 - 2.25) / sd,
    ];
    for (i, w) in want_score.iter().enumerate() {
        assert!((f64::from(f.row(i)[0]) - w).abs() < 1e-6);
    }
    assert_eq!(&f.row(0)[1..], [1.0, 1.0, 0.0, 1.0, 0.0]);
    assert_eq!(&f.row(1)[1..], [0.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(&f.row(2)[1..], [0.0, 0.0, 1.0, 1.0, 0.0]);
    assert_eq!(&f.row(3)[1..], [0.0, 0.0, 0.0, 0.0, 1.0]);
    let splits = g.node_types()[0].splits.as_ref().unwrap();
    assert_eq!(
        splits.train.len() + splits.valid.len() + splits.test.len(),
        4
    );
    let edges = std::fs::read(out.join("edges/user__follows__user.npy")).unwrap();
    let vals: Vec<i64> = edges[edges.len() - 48..]
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(vals, [0, 2, 3, 1, 0, 2]);
}

#[test]
fn a_float_id_column_and_a_missing_id_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    users(tmp.path());
    write(
        &tmp.path().join("follows.parquet"),
        vec![
            (
                "a",
                Arc::new(Int64Array::from(vec![Some(100), None])) as ArrayRef,
            ),
            ("b", Arc::new(Int64Array::from(vec![7, 42]))),
        ],
    );
    let cfg = tmp.path().join("g.toml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let err = import_tables(
        &cfg,
        &tmp.path().join("g"),
        &ImportOptions::default(),
        &mut NoProgress,
    )
    .unwrap_err();
    assert!(
        matches!(&err, TableError::Table { row: Some(2), column: Some(c), .. } if c == "a"),
        "{err}"
    );
    assert!(err.to_string().contains("missing id"), "{err}");
    std::fs::write(
        &cfg,
        CONFIG
            .replace("id = \"uid\"", "id = \"score\"")
            .replace("columns = [\"score\"]", "columns = [\"uid\"]"),
    )
    .unwrap();
    let err = import_tables(
        &cfg,
        &tmp.path().join("g"),
        &ImportOptions::default(),
        &mut NoProgress,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("ids must be integers or strings"),
        "{err}"
    );
    assert!(!tmp.path().join("g").exists());
}
