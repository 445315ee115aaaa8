//! Edge tables as edge tasks need them: a graph whose only targets are on
//! edges, edge splits by fractions and by time, and weight and time columns
//! kept beside the edges, through export and `--like` alike.

use std::path::Path;

use graphs::npy::{DType, NpyFile};
use graphs::{NoProgress, Schema};
use tables::{export_tables, import_tables, ImportOptions, TableError};

const USERS: &str = "id\nu1\nu2\nu3\nu4\n";

/// Ratings between users: a class (positive or not), a weight and a time.
const RATINGS: &str = "src,dst,positive,amount,ts
u1,u2,1,2.5,100
u2,u3,0,,200
u3,u4,1,1.0,300
u4,u1,0,4.0,400
u1,u3,1,0.5,500
u2,u4,,3.0,600
u3,u1,0,1.5,700
u4,u2,1,2.0,800
";

fn config(split: &str) -> String {
    format!(
        r#"
[[nodes]]
type = "user"
files = ["users.csv"]
id = "id"

[[edges]]
relation = ["user", "rates", "user"]
files = ["ratings.csv"]
source = "src"
destination = "dst"
label = "positive"
weight = "amount"
time = "ts"
split = {split}
"#
    )
}

fn import(dir: &Path, config: &str, out: &str, like: Option<&str>) -> Result<Schema, TableError> {
    std::fs::write(dir.join("g.toml"), config).unwrap();
    let opts = ImportOptions {
        like: like.map(|l| dir.join(l)),
        ..ImportOptions::default()
    };
    import_tables(&dir.join("g.toml"), &dir.join(out), &opts, &mut NoProgress).map(|(s, _)| s)
}

fn i64s(path: &Path) -> Vec<i64> {
    let f = NpyFile::open(path, DType::I64).unwrap();
    (0..f.len()).map(|i| f.i64_at(i)).collect()
}

fn f32s(path: &Path) -> Vec<f32> {
    NpyFile::open(path, DType::F32).unwrap().to_f32_vec()
}

fn setup() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("users.csv"), USERS).unwrap();
    std::fs::write(tmp.path().join("ratings.csv"), RATINGS).unwrap();
    tmp
}

const REL: &str = "edges/user__rates__user";

#[test]
fn a_graph_with_only_edge_targets_imports_with_weights_times_and_a_time_split() {
    let tmp = setup();
    let split = "{ time_column = \"ts\", train_before = 450, valid_before = 650 }";
    let schema = import(tmp.path(), &config(split), "g", None).unwrap();
    let g = tmp.path().join("g");
    // The target type defaults to the labelled relation's destination; its
    // nodes carry no label and no split.
    assert_eq!(schema.target, "user");
    assert_eq!(i64s(&g.join("nodes/user/labels.npy")), [-1; 4]);
    assert!(i64s(&g.join("nodes/user/train.npy")).is_empty());
    let r = &schema.relations[0];
    assert_eq!((r.num_classes, r.weights, r.times), (Some(2), true, true));
    assert_eq!(
        f32s(&g.join(format!("{REL}/weights.npy"))),
        [2.5, 1.0, 1.0, 4.0, 0.5, 3.0, 1.5, 2.0],
        "an empty weight is 1"
    );
    assert_eq!(
        i64s(&g.join(format!("{REL}/times.npy"))),
        [100, 200, 300, 400, 500, 600, 700, 800]
    );
    // Train before 450, valid before 650, test after; edge 5 has no label.
    assert_eq!(i64s(&g.join(format!("{REL}/train.npy"))), [0, 1, 2, 3]);
    assert_eq!(i64s(&g.join(format!("{REL}/valid.npy"))), [4]);
    assert_eq!(i64s(&g.join(format!("{REL}/test.npy"))), [6, 7]);
    // The graph loads (every file checked against the schema).
    graphs::load(&g, &graphs::LoadOptions::default()).unwrap();

    // Exported and imported back: the same files, byte for byte.
    let exported = export_tables(
        &g,
        &tmp.path().join("t"),
        tables::config::FileFormat::Csv,
        false,
        &mut NoProgress,
    )
    .unwrap();
    let opts = ImportOptions::default();
    import_tables(&exported, &tmp.path().join("back"), &opts, &mut NoProgress).unwrap();
    for f in [
        "schema.json",
        "nodes/user/labels.npy",
        "edges/user__rates__user.npy",
        "edges/user__rates__user/labels.npy",
        "edges/user__rates__user/weights.npy",
        "edges/user__rates__user/times.npy",
        "edges/user__rates__user/train.npy",
        "edges/user__rates__user/valid.npy",
        "edges/user__rates__user/test.npy",
    ] {
        assert_eq!(
            std::fs::read(g.join(f)).unwrap(),
            std::fs::read(tmp.path().join("back").join(f)).unwrap(),
            "{f} differs after export and import"
        );
    }

    // A later import appends edges with their weights and times; the
    // earlier edges keep theirs and their splits.
    std::fs::write(tmp.path().join("users.csv"), "id\nu5\n").unwrap();
    std::fs::write(
        tmp.path().join("ratings.csv"),
        "src,dst,positive,amount,ts\nu5,u1,1,7.0,900\n",
    )
    .unwrap();
    let like = import(tmp.path(), &config(split), "g2", Some("g")).unwrap();
    assert_eq!(like.relations[0].count, 9);
    let g2 = tmp.path().join("g2");
    assert_eq!(f32s(&g2.join(format!("{REL}/weights.npy")))[8], 7.0);
    assert_eq!(i64s(&g2.join(format!("{REL}/times.npy")))[8], 900);
    assert_eq!(i64s(&g2.join(format!("{REL}/test.npy"))), [6, 7, 8]);

    // New edges without a weight column, after edges with weights: weight 1.
    let unweighted = config(split).replace("weight = \"amount\"\n", "");
    std::fs::write(tmp.path().join("users.csv"), "id\nu6\n").unwrap();
    let g3 = import(tmp.path(), &unweighted, "g3", Some("g2")).unwrap();
    let w = f32s(&tmp.path().join("g3").join(format!("{REL}/weights.npy")));
    assert_eq!((g3.relations[0].count, w.len(), w[9]), (10, 10, 1.0));
}

#[test]
fn edges_split_by_fractions_draw_only_labelled_edges_the_same_way_for_a_seed() {
    let tmp = setup();
    let split = |seed: u64| format!("{{ fractions = [0.5, 0.25, 0.25], seed = {seed} }}");
    let splits = |out: &str| {
        ["train", "valid", "test"]
            .map(|s| i64s(&tmp.path().join(out).join(format!("{REL}/{s}.npy"))))
    };
    import(tmp.path(), &config(&split(7)), "a", None).unwrap();
    import(tmp.path(), &config(&split(7)), "b", None).unwrap();
    let a = splits("a");
    assert_eq!(a, splits("b"), "the same seed draws the same split");
    // 7 labelled edges cut at round(3.5) and round(5.25); edge 5 (no label) in none.
    assert_eq!(a.each_ref().map(Vec::len), [4, 1, 2]);
    let mut all: Vec<i64> = a.concat();
    all.sort_unstable();
    assert_eq!(all, [0, 1, 2, 3, 4, 6, 7]);
    let others: Vec<_> = (0..8)
        .map(|s| {
            import(tmp.path(), &config(&split(s)), &format!("s{s}"), None).unwrap();
            splits(&format!("s{s}"))
        })
        .collect();
    assert!(
        others.iter().any(|s| *s != a),
        "another seed draws another split"
    );
}

#[test]
fn bad_edge_weights_times_and_splits_are_refused_naming_row_and_column() {
    let head = "src,dst,positive,amount,ts,s\n";
    let cases: [(&str, &str, &[&str]); 6] = [
        (
            "u1,u2,1,inf,100,train",
            "\"s\"",
            &["row 1", "amount", "inf is not a finite number"],
        ),
        (
            "u1,u2,1,1,100.5,train",
            "\"s\"",
            &["row 1", "ts", "time 100.5 is not an integer"],
        ),
        (
            "u1,u2,1,1,,train",
            "\"s\"",
            &["row 1", "ts", "missing time"],
        ),
        (
            "u1,u2,1,1,100,dev",
            "\"s\"",
            &["row 1", "s", "split 'dev' is not train, valid or test"],
        ),
        (
            "u1,u2,1,1,100,",
            "{ fractions = [0.9, 0.9, 0.1] }",
            &["fractions", "sum to at most 1"],
        ),
        (
            "u1,u2,1,1,100,",
            "{ time_column = \"ts\", train_before = 1, valid_before = 5, typo = 1 }",
            &["unknown field `typo`"],
        ),
    ];
    for (row, split, needles) in cases {
        let tmp = setup();
        std::fs::write(tmp.path().join("ratings.csv"), format!("{head}{row}\n")).unwrap();
        let err = import(tmp.path(), &config(split), "g", None)
            .expect_err(row)
            .to_string();
        for n in needles {
            assert!(err.contains(n), "{err:?} lacks {n:?}");
        }
        assert!(
            !tmp.path().join("g").exists(),
            "a refused import leaves no graph"
        );
    }
}

#[test]
fn a_graph_without_any_target_is_refused() {
    let tmp = setup();
    let cfg = config("\"s\"")
        .replace("label = \"positive\"\n", "")
        .replace("split = \"s\"\n", "");
    let err = import(tmp.path(), &cfg, "g", None).unwrap_err().to_string();
    assert!(err.contains("no node table has a [nodes.label]"), "{err}");
    assert!(
        err.contains("no edge table a label or value column"),
        "{err}"
    );
}
