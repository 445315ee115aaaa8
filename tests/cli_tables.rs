//! `hetgnn import tables` and `hetgnn export tables`: the worked example, round
//! trips that give back the same graph (and model), and every class of bad
//! table refused with its file, row and column.

use std::path::{Path, PathBuf};

use crate::util::hetgnn;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tables/graph.toml")
}

fn model_hash(stdout: &str) -> String {
    stdout
        .split("model sha256 ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no model hash in:\n{stdout}"))
        .to_string()
}

/// Every file of the graph format in `a` is byte-identical in `b`.
fn same_graph(a: &Path, b: &Path) {
    let schema = graphs::Schema::read(&a.join("schema.json")).unwrap();
    let mut files = vec!["schema.json".to_string()];
    for (t, ts) in &schema.node_types {
        if ts.feature_dim.is_some() {
            files.push(format!("nodes/{t}/features.npy"));
        }
    }
    for f in ["labels", "train", "valid", "test"] {
        files.push(format!("nodes/{}/{f}.npy", schema.target));
    }
    if schema.values {
        files.push(format!("nodes/{}/values.npy", schema.target));
    }
    if schema.label_sets.is_some() {
        files.push(format!("nodes/{}/label_sets.npy", schema.target));
    }
    for r in &schema.relations {
        files.push(format!("edges/{}.npy", r.canonical()));
        let dir = format!("edges/{}", r.canonical());
        if r.num_classes.is_some() {
            files.push(format!("{dir}/labels.npy"));
        }
        if r.values {
            files.push(format!("{dir}/values.npy"));
        }
        if r.has_targets() {
            files.extend(["train", "valid", "test"].map(|s| format!("{dir}/{s}.npy")));
        }
    }
    for f in files {
        let (x, y) = (
            std::fs::read(a.join(&f)).unwrap(),
            std::fs::read(b.join(&f)).unwrap(),
        );
        assert!(
            x == y,
            "{f} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

#[test]
fn the_example_tables_import_and_train() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = example();
    let run = hetgnn(
        tmp.path(),
        &[
            "import",
            "tables",
            "--config",
            cfg.to_str().unwrap(),
            "--out",
            "shop",
        ],
    )
    .ok();
    let out = run.stdout();
    assert!(
        out.contains("1408 nodes, 4499 edges; target account, 3 classes"),
        "{out}"
    );
    assert!(
        out.contains("left out 2 edges of account__pays__merchant"),
        "{out}"
    );
    let g = tmp.path().join("shop");
    let schema = graphs::Schema::read(&g.join("schema.json")).unwrap();
    let dims: Vec<(String, Option<u64>)> = schema
        .node_types
        .iter()
        .map(|(n, t)| (n.clone(), t.feature_dim))
        .collect();
    // age 1 + balance 1 + 5 countries + 5 tags; 6 categories + volume; devices featureless.
    assert_eq!(
        dims,
        [
            ("account".into(), Some(12)),
            ("merchant".into(), Some(7)),
            ("device".into(), None)
        ]
    );
    let ids = std::fs::read_to_string(g.join("nodes/account/ids.csv")).unwrap();
    assert!(ids.starts_with("id\nacct-0000\nacct-0001\n"), "{ids}");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(g.join("tables.json")).unwrap()).unwrap();
    assert_eq!(
        record["types"][0]["classes"],
        serde_json::json!(["high", "low", "medium"])
    );
    assert_eq!(
        record["types"][0]["features"][2]["fitted"]["categories"][0],
        serde_json::json!(["DE", "FR", "GB", "JP", "US"])
    );
    let run = hetgnn(tmp.path(), &["train", "--data", "shop", "--epochs", "3"]).ok();
    assert!(run.stdout().contains("done: 3 epochs"), "{}", run.stdout());
    // A second import of the same tables is byte-identical.
    hetgnn(
        tmp.path(),
        &[
            "import",
            "tables",
            "--config",
            cfg.to_str().unwrap(),
            "--out",
            "again",
        ],
    )
    .ok();
    same_graph(&g, &tmp.path().join("again"));
    assert_eq!(
        std::fs::read(g.join("tables.json")).unwrap(),
        std::fs::read(tmp.path().join("again/tables.json")).unwrap()
    );
}

#[test]
fn a_graph_exported_as_tables_imports_back_to_the_same_graph_and_model() {
    let tmp = tempfile::tempdir().unwrap();
    hetgnn(tmp.path(), &["generate", "--scale", "0.002", "--out", "g"]).ok();
    let train = |dir: &str| {
        model_hash(
            &hetgnn(tmp.path(), &["train", "--data", dir, "--epochs", "1"])
                .ok()
                .stdout(),
        )
    };
    let want = train("g");
    for format in ["parquet", "csv"] {
        let tables = format!("t-{format}");
        hetgnn(
            tmp.path(),
            &[
                "export", "tables", "--data", "g", "--out", &tables, "--format", format,
            ],
        )
        .ok();
        let back = format!("back-{format}");
        hetgnn(
            tmp.path(),
            &[
                "import",
                "tables",
                "--config",
                &format!("{tables}/graph.toml"),
                "--out",
                &back,
            ],
        )
        .ok();
        same_graph(&tmp.path().join("g"), &tmp.path().join(&back));
        assert_eq!(train(&back), want, "{format}");
    }
}

#[test]
fn the_shared_real_graphs_round_trip_through_tables() {
    let Ok(root) = std::env::var("HETGNN_DATASETS") else {
        eprintln!("HETGNN_DATASETS is not set: skipping the real-graph table round trip");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    for name in ["heco-acm", "heco-freebase", "planetoid-cora"] {
        let src = Path::new(&root).join(name);
        for format in ["parquet", "csv"] {
            let tables = format!("{name}-{format}");
            hetgnn(
                tmp.path(),
                &[
                    "export",
                    "tables",
                    "--data",
                    src.to_str().unwrap(),
                    "--out",
                    &tables,
                    "--format",
                    format,
                ],
            )
            .ok();
            let back = format!("{tables}-back");
            hetgnn(
                tmp.path(),
                &[
                    "import",
                    "tables",
                    "--config",
                    &format!("{tables}/graph.toml"),
                    "--out",
                    &back,
                ],
            )
            .ok();
            same_graph(&src, &tmp.path().join(&back));
        }
    }
}

/// Writes `files` and a config, runs the import, and checks it fails naming
/// every needle and leaving no output directory.
fn refused(files: &[(&str, &str)], config: &str, needles: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(tmp.path().join(name), text).unwrap();
    }
    std::fs::write(tmp.path().join("g.toml"), config).unwrap();
    hetgnn(
        tmp.path(),
        &["import", "tables", "--config", "g.toml", "--out", "out"],
    )
    .fails_with(1, needles);
    assert!(
        !tmp.path().join("out").exists(),
        "a failed import left its output"
    );
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "a failed import left {leftovers:?}");
}

const NODES: &str = "id,x,y,split\na,1,0,train\nb,2,1,valid\nc,3,1,test\n";

fn config(features: &str, edges: &str) -> String {
    format!(
        "[[nodes]]\ntype = \"p\"\nfiles = [\"n.csv\"]\nid = \"id\"\n{features}\n[nodes.label]\ncolumn = \"y\"\n[nodes.split]\ncolumn = \"split\"\n{edges}"
    )
}

const X: &str = "[[nodes.features]]\ncolumns = [\"x\"]\n";
const EDGES: &str = "[[edges]]\nrelation = [\"p\", \"cites\", \"p\"]\nfiles = [\"e.csv\"]\nsource = \"s\"\ndestination = \"d\"\n";

#[test]
fn bad_tables_are_refused_naming_file_row_and_column() {
    // A column the config names is not in the table.
    refused(
        &[("n.csv", NODES)],
        &config("[[nodes.features]]\ncolumns = [\"z\"]\n", ""),
        &[
            "n.csv",
            "column 'z'",
            "no such column (the table has: id, x, y, split)",
        ],
    );
    // Text where a number is expected.
    refused(
        &[(
            "n.csv",
            "id,x,y,split\na,1,0,train\nb,two,1,valid\nc,3,1,test\n",
        )],
        &config(X, ""),
        &["n.csv, row 2, column 'x'", "'two' is not a number"],
    );
    // Non-finite numbers.
    refused(
        &[(
            "n.csv",
            "id,x,y,split\na,1,0,train\nb,2,1,valid\nc,inf,1,test\n",
        )],
        &config(X, ""),
        &["n.csv, row 3, column 'x'", "inf is not a finite number"],
    );
    refused(
        &[(
            "n.csv",
            "id,x,y,split\na,NaN,0,train\nb,2,1,valid\nc,3,1,test\n",
        )],
        &config(
            "[[nodes.features]]\ncolumns = [\"x\"]\ntransform = \"standard\"\n",
            "",
        ),
        &["row 1, column 'x'", "NaN is not a finite number"],
    );
    // A missing value with no declared fill.
    refused(
        &[(
            "n.csv",
            "id,x,y,split\na,1,0,train\nb,,1,valid\nc,3,1,test\n",
        )],
        &config(X, ""),
        &["row 2, column 'x'", "missing value (declare a `fill`"],
    );
    // Duplicate node ids.
    refused(
        &[(
            "n.csv",
            "id,x,y,split\na,1,0,train\nb,2,1,valid\na,3,1,test\n",
        )],
        &config(X, ""),
        &["n.csv, row 3, column 'id'", "duplicate id 'a'"],
    );
    // A label column with too many classes.
    refused(
        &[(
            "n.csv",
            "id,x,y,split\na,1,u,train\nb,2,v,valid\nc,3,w,test\n",
        )],
        &config(X, "").replace("column = \"y\"", "column = \"y\"\nmax_classes = 2"),
        &["row 3, column 'y'", "more than 2 distinct classes"],
    );
    // An empty split.
    refused(
        &[(
            "n.csv",
            "id,x,y,split\na,1,0,train\nb,2,1,train\nc,3,1,test\n",
        )],
        &config(X, ""),
        &["n.csv", "column 'y'", "the valid split is empty"],
    );
    // A split value that is not a split.
    refused(
        &[(
            "n.csv",
            "id,x,y,split\na,1,0,train\nb,2,1,dev\nc,3,1,test\n",
        )],
        &config(X, ""),
        &["row 2, column 'split'", "'dev' is not train, valid or test"],
    );
    // Floating-point ids.
    refused(
        &[("n.csv", NODES)],
        &config(X, "")
            .replace("id = \"id\"", "id = \"x\"")
            .replace("columns = [\"x\"]", "columns = [\"id\"]"),
        &["n.csv, row 1, column 'id'", "'a' is not a number"],
    );
    // An edge naming an unknown node.
    refused(
        &[("n.csv", NODES), ("e.csv", "s,d\na,b\nb,zz\n")],
        &config(X, EDGES),
        &[
            "e.csv, row 2, column 'd'",
            "id 'zz' is not in the node table of 'p'",
            "unknown_ids = \"drop\"",
        ],
    );
    // A ragged CSV row.
    refused(
        &[("n.csv", NODES), ("e.csv", "s,d\na,b\nb,c,a\n")],
        &config(X, EDGES),
        &["e.csv", "3 fields where the header has 2"],
    );
    // A file of unknown format, and a missing file.
    refused(
        &[("n.csv", NODES), ("e.txt", "s,d\n")],
        &config(X, &EDGES.replace("e.csv", "e.txt")),
        &["e.txt", "unknown table format"],
    );
    refused(
        &[("n.csv", NODES)],
        &config(X, EDGES),
        &["e.csv", "No such file"],
    );
    // Configuration mistakes: an unknown key, a numeric fill for a category, two label types.
    refused(
        &[("n.csv", NODES)],
        &config(
            "[[nodes.features]]\ncolumns = [\"x\"]\ntransfrom = \"standard\"\n",
            "",
        ),
        &["g.toml", "unknown field `transfrom`"],
    );
    refused(
        &[("n.csv", NODES)],
        &config(
            "[[nodes.features]]\ncolumns = [\"x\"]\ntransform = \"one-hot\"\nfill = 3\n",
            "",
        ),
        &["g.toml", "must be a category name"],
    );
    refused(
        &[("n.csv", NODES)],
        "[[nodes]]\ntype = \"p\"\nfiles = [\"n.csv\"]\nid = \"id\"\n",
        &["g.toml", "no node table has a [nodes.label]"],
    );
}

fn npy_i64(path: &Path) -> Vec<i64> {
    let f = graphs::npy::NpyFile::open(path, graphs::npy::DType::I64).unwrap();
    (0..f.len()).map(|i| f.i64_at(i)).collect()
}

fn csv_rows(path: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

#[test]
fn predict_and_embed_write_tables_under_the_original_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = example();
    hetgnn(
        tmp.path(),
        &[
            "import",
            "tables",
            "--config",
            cfg.to_str().unwrap(),
            "--out",
            "shop",
        ],
    )
    .ok();
    hetgnn(
        tmp.path(),
        &[
            "train",
            "--data",
            "shop",
            "--epochs",
            "2",
            "--checkpoint",
            "ck",
        ],
    )
    .ok();
    let predict = |extra: &[&str]| {
        let mut args = vec![
            "predict",
            "--checkpoint",
            "ck",
            "--data",
            "shop",
            "--batch",
            "64",
        ];
        args.extend_from_slice(extra);
        hetgnn(tmp.path(), &args)
    };
    predict(&["--out", "p.npy"]).ok();
    predict(&["--out", "p.csv", "--embeddings", "e.csv"]).ok();
    predict(&["--out", "p.parquet"]).ok();
    let classes = npy_i64(&tmp.path().join("p.npy"));
    let rows = csv_rows(&tmp.path().join("p.csv"));
    assert_eq!(rows[0], ["id", "class", "class_name"]);
    let ids: Vec<String> = std::fs::read_to_string(tmp.path().join("shop/nodes/account/ids.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect();
    assert_eq!(rows.len(), classes.len() + 1);
    let names = ["high", "low", "medium"];
    for (i, r) in rows[1..].iter().enumerate() {
        assert_eq!(r[0], ids[i]);
        assert_eq!(r[1], classes[i].to_string());
        assert_eq!(r[2], names[classes[i] as usize]);
    }
    // A subset named by original ids, in its own order, gets the same answers.
    std::fs::write(
        tmp.path().join("want.csv"),
        "account_id,other\nacct-0899,x\nacct-0003,y\nacct-0100,z\n",
    )
    .unwrap();
    predict(&[
        "--out",
        "sub.csv",
        "--ids",
        "want.csv",
        "--ids-column",
        "account_id",
    ])
    .ok();
    let sub = csv_rows(&tmp.path().join("sub.csv"));
    let full = |id: &str| rows.iter().find(|r| r[0] == id).unwrap().clone();
    assert_eq!(
        sub[1..],
        [full("acct-0899"), full("acct-0003"), full("acct-0100")]
    );
    std::fs::write(tmp.path().join("bad.csv"), "id\nacct-0001\nacct-9999\n").unwrap();
    predict(&["--out", "bad.csv.out.csv", "--ids", "bad.csv"]).fails_with(
        1,
        &[
            "bad.csv, row 2, column 'id'",
            "'acct-9999' is not a node of this type",
        ],
    );
    predict(&["--out", "p.txt"]).fails_with(1, &["name the output .npy, .csv or .parquet"]);
    // `embed` as tables: the same numbers as the .npy files, under the original ids.
    hetgnn(
        tmp.path(),
        &[
            "embed",
            "--checkpoint",
            "ck",
            "--data",
            "shop",
            "--out",
            "emb-npy",
        ],
    )
    .ok();
    hetgnn(
        tmp.path(),
        &[
            "embed",
            "--checkpoint",
            "ck",
            "--data",
            "shop",
            "--out",
            "emb-csv",
            "--format",
            "csv",
        ],
    )
    .ok();
    hetgnn(
        tmp.path(),
        &[
            "embed",
            "--checkpoint",
            "ck",
            "--data",
            "shop",
            "--out",
            "emb-pq",
            "--format",
            "parquet",
        ],
    )
    .ok();
    let f = graphs::npy::NpyFile::open(
        &tmp.path().join("emb-npy/device.npy"),
        graphs::npy::DType::F32,
    )
    .unwrap();
    let want = f.to_f32_vec();
    let width = f.shape()[1] as usize;
    let rows = csv_rows(&tmp.path().join("emb-csv/device.csv"));
    assert_eq!(rows[1][0], "dev-180");
    for (i, r) in rows[1..].iter().enumerate() {
        let got: Vec<f32> = r[1..].iter().map(|v| v.parse().unwrap()).collect();
        assert_eq!(got, want[i * width..(i + 1) * width], "row {i}");
    }
    assert!(tmp.path().join("emb-pq/account.parquet").exists());
}

/// The example's account and edge tables, pointed at other files: the same
/// feature blocks, label and split, so it imports like the example.
fn like_config(accounts: &str) -> String {
    let example = std::fs::read_to_string(example()).unwrap();
    let merchants = example.find("[[nodes]]\ntype = \"merchant\"").unwrap();
    let edges = example.find("# Gzipped CSV").unwrap();
    let mut cfg = format!("{}{}", &example[..merchants], &example[edges..]);
    for (from, to) in [
        ("accounts.csv", accounts),
        ("transactions.csv.gz", "new_tx.csv"),
        ("devices.csv", "new_devices.csv"),
    ] {
        cfg = cfg.replace(from, to);
    }
    cfg
}

#[test]
fn an_import_like_an_earlier_one_keeps_its_nodes_and_statistics_and_appends() {
    let tmp = tempfile::tempdir().unwrap();
    let ex = example();
    hetgnn(
        tmp.path(),
        &[
            "import",
            "tables",
            "--config",
            ex.to_str().unwrap(),
            "--out",
            "shop",
        ],
    )
    .ok();
    let write = |name: &str, text: &str| std::fs::write(tmp.path().join(name), text).unwrap();
    write("new_accounts.csv", "account_id,age,balance,country,tags,signup_year,risk\nacct-new-1,18,,DE,vip,2024,high\nacct-new-2,99,5.0,XX,,2024,\n");
    write(
        "new_tx.csv",
        "account,merchant,amount\nacct-new-1,m000,3.0\nacct-0001,m001,4.0\n",
    );
    write(
        "new_devices.csv",
        "account,device\nacct-new-2,dev-new\nacct-new-1,dev-180\n",
    );
    write("new.toml", &like_config("new_accounts.csv"));
    let run = hetgnn(
        tmp.path(),
        &[
            "import", "tables", "--config", "new.toml", "--like", "shop", "--out", "shop2",
        ],
    )
    .ok();
    assert!(
        run.stdout().contains("1411 nodes, 4503 edges"),
        "{}",
        run.stdout()
    );
    let (a, b) = (tmp.path().join("shop"), tmp.path().join("shop2"));
    let read = |p: &Path| std::fs::read(p).unwrap();
    // Old rows and ids unchanged, new ones appended.
    let fa = graphs::npy::NpyFile::open(
        &a.join("nodes/account/features.npy"),
        graphs::npy::DType::F32,
    )
    .unwrap()
    .to_f32_vec();
    let fb = graphs::npy::NpyFile::open(
        &b.join("nodes/account/features.npy"),
        graphs::npy::DType::F32,
    )
    .unwrap()
    .to_f32_vec();
    assert_eq!(fb.len(), fa.len() + 2 * 12);
    assert_eq!(fb[..fa.len()], fa[..]);
    // acct-new-1: age 18 is the earlier minimum (min-max 0); DE is the first country;
    // the unseen country XX of acct-new-2 is all zeros.
    let new1 = &fb[fa.len()..fa.len() + 12];
    let new2 = &fb[fa.len() + 12..];
    assert_eq!(new1[0], 0.0);
    assert_eq!(new1[2..7], [1.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(new2[2..7], [0.0; 5]);
    let ids_b = String::from_utf8(read(&b.join("nodes/account/ids.csv"))).unwrap();
    assert!(ids_b.starts_with(&String::from_utf8(read(&a.join("nodes/account/ids.csv"))).unwrap()));
    assert!(ids_b.ends_with("acct-new-1\nacct-new-2\n"), "{ids_b}");
    assert!(String::from_utf8(read(&b.join("nodes/device/ids.csv")))
        .unwrap()
        .ends_with("dev-new\n"));
    assert_eq!(
        read(&b.join("nodes/merchant/features.npy")),
        read(&a.join("nodes/merchant/features.npy"))
    );
    // The new labelled account (2024) is in test; the earlier splits are kept.
    let test_a = npy_i64(&a.join("nodes/account/test.npy"));
    let test_b = npy_i64(&b.join("nodes/account/test.npy"));
    assert_eq!(test_b, [test_a.clone(), vec![900]].concat());
    assert_eq!(npy_i64(&b.join("nodes/account/labels.npy"))[900..], [0, -1]);
    assert_eq!(
        npy_i64(&a.join("nodes/account/train.npy")),
        npy_i64(&b.join("nodes/account/train.npy"))
    );
    hetgnn(tmp.path(), &["train", "--data", "shop2", "--epochs", "1"]).ok();
    // A like of a like still knows the carried-over merchant table.
    write(
        "new_accounts.csv",
        "account_id,age,balance,country,tags,signup_year,risk\nacct-new-3,30,1.0,FR,,2019,low\n",
    );
    write(
        "new_tx.csv",
        "account,merchant,amount\nacct-new-3,m002,1.0\n",
    );
    write("new_devices.csv", "account,device\nacct-new-3,dev-001\n");
    hetgnn(
        tmp.path(),
        &[
            "import", "tables", "--config", "new.toml", "--like", "shop2", "--out", "shop3",
        ],
    )
    .ok();
    let c = tmp.path().join("shop3");
    assert_eq!(
        read(&c.join("nodes/merchant/features.npy")),
        read(&a.join("nodes/merchant/features.npy"))
    );
    std::fs::remove_dir_all(&c).unwrap();
    write("new.toml", &like_config("new_accounts.csv"));

    // A class the earlier import did not have, an account it already has, other transforms.
    let refuse = |accounts: &str, cfg: String, needles: &[&str]| {
        write("new_accounts.csv", accounts);
        write("new.toml", &cfg);
        hetgnn(
            tmp.path(),
            &[
                "import", "tables", "--config", "new.toml", "--like", "shop", "--out", "shop3",
            ],
        )
        .fails_with(1, needles);
        assert!(!tmp.path().join("shop3").exists());
    };
    let header = "account_id,age,balance,country,tags,signup_year,risk\n";
    refuse(
        &format!("{header}acct-new-1,18,,DE,vip,2024,extreme\n"),
        like_config("new_accounts.csv"),
        &[
            "row 1, column 'risk'",
            "class 'extreme' is not one of the earlier import's classes (high, low, medium)",
        ],
    );
    refuse(
        &format!("{header}acct-0005,18,,DE,vip,2024,high\n"),
        like_config("new_accounts.csv"),
        &[
            "row 1, column 'account_id'",
            "'acct-0005' is already node 5 of 'account'",
        ],
    );
    refuse(
        &format!("{header}acct-new-1,18,,DE,vip,2024,high\n"),
        like_config("new_accounts.csv").replace("\"min-max\"", "\"standard\""),
        &["new.toml", "the feature blocks of 'account' differ"],
    );
}

#[test]
fn an_edge_left_out_creates_no_node_on_an_end_without_a_table() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("n.csv"), NODES).unwrap();
    std::fs::write(tmp.path().join("e.csv"), "s,d\na, x\nzz,y\nb,x\n").unwrap();
    let edges = "[[edges]]\nrelation = [\"p\", \"tags\", \"q\"]\nfiles = [\"e.csv\"]\nsource = \"s\"\ndestination = \"d\"\nunknown_ids = \"drop\"\n";
    std::fs::write(tmp.path().join("g.toml"), config(X, edges)).unwrap();
    let run = hetgnn(
        tmp.path(),
        &["import", "tables", "--config", "g.toml", "--out", "g"],
    )
    .ok();
    assert!(
        run.stdout().contains("left out 1 edges of p__tags__q"),
        "{}",
        run.stdout()
    );
    // "y" came only from the dropped edge; " x" is trimmed to "x".
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("g/nodes/q/ids.csv")).unwrap(),
        "id\nx\n"
    );
}

#[test]
fn edge_classes_named_by_strings_are_sorted_recorded_and_kept_by_a_later_import() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(tmp.path().join(name), text).unwrap();
    write("n.csv", NODES);
    write(
        "e.csv",
        "s,d,kind,split\na,b,legit,train\nb,c,fraud,valid\nc,a,,\na,c,legit,test\n",
    );
    let edges = format!("{EDGES}label = \"kind\"\nsplit = \"split\"\n");
    write("g.toml", &config(X, &edges));
    let import = |cfg: &str, out: &str, like: Option<&str>| {
        let mut args = vec!["import", "tables", "--config", cfg, "--out", out];
        args.extend(like.iter().flat_map(|l| ["--like", *l]));
        hetgnn(tmp.path(), &args)
    };
    import("g.toml", "g", None).ok();
    let g = tmp.path().join("g");
    let labels = |dir: &Path| npy_i64(&dir.join("edges/p__cites__p/labels.npy"));
    // Names are sorted into classes: fraud 0, legit 1; an empty cell is no class.
    assert_eq!(labels(&g), [1, 0, -1, 1]);
    let schema = std::fs::read_to_string(g.join("schema.json")).unwrap();
    assert!(schema.contains("\"num_classes\": 2"), "{schema}");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(g.join("tables.json")).unwrap()).unwrap();
    assert_eq!(
        record["edge_classes"],
        serde_json::json!([["p__cites__p", ["fraud", "legit"]]])
    );
    // A later import keeps the classes by name, and refuses a new one.
    write("n2.csv", "id,x,y,split\nd,4,,\n");
    let later = |file: &str| {
        config(X, &edges)
            .replace("e.csv", file)
            .replace("n.csv", "n2.csv")
    };
    write("more.csv", "s,d,kind,split\nb,a,fraud,train\n");
    write("more.toml", &later("more.csv"));
    import("more.toml", "g2", Some("g")).ok();
    assert_eq!(labels(&tmp.path().join("g2")), [1, 0, -1, 1, 0]);
    write("bad.csv", "s,d,kind,split\nb,a,chargeback,train\n");
    write("bad.toml", &later("bad.csv"));
    import("bad.toml", "g3", Some("g")).fails_with(
        1,
        &[
            "bad.csv",
            "row 1",
            "kind",
            "class 'chargeback' is not one of the earlier import's classes (fraud, legit)",
        ],
    );
}

fn npy_i8(path: &Path) -> Vec<i8> {
    let f = graphs::npy::NpyFile::open(path, graphs::npy::DType::I8).unwrap();
    f.to_i8_vec()
}

#[test]
fn label_sets_import_from_a_column_without_class_labels_and_a_later_import_keeps_their_names() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(tmp.path().join(name), text).unwrap();
    // Names sorted into labels (bio 0, chem 1, phys 2); "-" is an empty set,
    // an empty cell a node without targets (e, in no split).
    write(
        "n.csv",
        "id,x,topics,split\na,1,chem;bio,train\nb,2,phys,train\nc,3,-,valid\nd,4,bio ; phys,test\ne,5,,\n",
    );
    write("e.csv", "s,d\na,b\nb,c\nc,d\nd,a\ne,a\n");
    let nodes = "[[nodes]]\ntype = \"p\"\nfiles = [\"n.csv\"]\nid = \"id\"\n[[nodes.features]]\ncolumns = [\"x\"]\n";
    let cfg = |file: &str, extra: &str| {
        format!("{}[nodes.label_set]\ncolumn = \"topics\"\nempty = \"-\"\n{extra}[nodes.split]\ncolumn = \"split\"\n{EDGES}", nodes.replace("n.csv", file))
    };
    write("g.toml", &cfg("n.csv", ""));
    let import = |cfg: &str, out: &str, like: Option<&str>| {
        let mut args = vec!["import", "tables", "--config", cfg, "--out", out];
        args.extend(like.iter().flat_map(|l| ["--like", *l]));
        hetgnn(tmp.path(), &args)
    };
    import("g.toml", "g", None).ok();
    let g = tmp.path().join("g");
    #[rustfmt::skip]
    let want = [1, 1, 0,  0, 0, 1,  0, 0, 0,  1, 0, 1,  -1, -1, -1];
    assert_eq!(npy_i8(&g.join("nodes/p/label_sets.npy")), want);
    // No class labels: every node -1, one placeholder class; the splits are the set nodes'.
    assert_eq!(npy_i64(&g.join("nodes/p/labels.npy")), [-1; 5]);
    assert_eq!(npy_i64(&g.join("nodes/p/train.npy")), [0, 1]);
    let schema = graphs::Schema::read(&g.join("schema.json")).unwrap();
    assert_eq!((schema.label_sets, schema.num_classes), (Some(3), 1));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(g.join("tables.json")).unwrap()).unwrap();
    assert_eq!(
        record["types"][0]["label_names"],
        serde_json::json!(["bio", "chem", "phys"])
    );
    // The graph trains for multi-label, and node classification says what is missing.
    hetgnn(
        tmp.path(),
        &[
            "train",
            "--data",
            "g",
            "--task",
            "multi-label",
            "--epochs",
            "1",
        ],
    )
    .ok();
    hetgnn(tmp.path(), &["train", "--data", "g", "--epochs", "1"])
        .fails_with(1, &["node 0 of the train split", "has no label (-1"]);

    // A later import keeps the labels by name and appends, and refuses a new one.
    write("n2.csv", "id,x,topics,split\nf,6,phys;chem,train\n");
    write("more.toml", &cfg("n2.csv", "").replace("e.csv", "e2.csv"));
    write("e2.csv", "s,d\nf,a\n");
    import("more.toml", "g2", Some("g")).ok();
    let mut more = want.to_vec();
    more.extend([0, 1, 1]);
    assert_eq!(npy_i8(&tmp.path().join("g2/nodes/p/label_sets.npy")), more);
    write("n3.csv", "id,x,topics,split\nf,6,math,train\n");
    write("bad.toml", &cfg("n3.csv", "").replace("e.csv", "e2.csv"));
    import("bad.toml", "g3", Some("g")).fails_with(
        1,
        &[
            "n3.csv",
            "row 1",
            "topics",
            "class 'math' is not one of the earlier import's classes",
        ],
    );

    // Bad cells and settings are refused, naming the file, row and column.
    write("neg.csv", "id,x,topics,split\na,1,-1,train\n");
    write("neg.toml", &cfg("neg.csv", ""));
    import("neg.toml", "g4", None).fails_with(
        1,
        &["neg.csv", "row 1", "topics", "label -1 is not a label"],
    );
    write("many.toml", &cfg("n.csv", "max_labels = 2\n"));
    import("many.toml", "g5", None)
        .fails_with(1, &["n.csv", "topics", "more than 2 distinct classes"]);
    write(
        "nosplit.toml",
        &cfg("n.csv", "").replace("[nodes.split]\ncolumn = \"split\"\n", ""),
    );
    import("nosplit.toml", "g6", None).fails_with(1, &["label set needs a [nodes.split]"]);
}

#[test]
fn a_graph_with_only_edge_labels_and_an_embedding_column_imports_and_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // 40 users in 4 countries; a rating is positive when both ends share a
    // country, so the country embedding is what there is to learn.
    let country = |u: usize| ["DE", "FR", "JP", "US"][u % 4];
    let mut users = String::from("id,country\n");
    for u in 0..40 {
        users += &format!("user{u},{}\n", country(u));
    }
    let mut ratings = String::from("src,dst,positive,amount,ts\n");
    for i in 0..400usize {
        let (s, d) = (i % 40, (i * 7 + i / 40) % 40);
        if s != d {
            let positive = u8::from(country(s) == country(d));
            ratings += &format!("user{s},user{d},{positive},{}.5,{}\n", i % 9, 1000 + i);
        }
    }
    std::fs::write(dir.join("users.csv"), users).unwrap();
    std::fs::write(dir.join("ratings.csv"), ratings).unwrap();
    let config = r#"
[[nodes]]
type = "user"
files = ["users.csv"]
id = "id"
[[nodes.features]]
columns = ["country"]
transform = "embedding"

[[edges]]
relation = ["user", "rates", "user"]
files = ["ratings.csv"]
source = "src"
destination = "dst"
label = "positive"
weight = "amount"
time = "ts"
split = { time_column = "ts", train_before = 1300, valid_before = 1350 }
"#;
    std::fs::write(dir.join("g.toml"), config).unwrap();
    let run = hetgnn(
        dir,
        &["import", "tables", "--config", "g.toml", "--out", "g"],
    )
    .ok();
    assert!(run.stdout().contains("target user"), "{}", run.stdout());
    let schema = graphs::Schema::read(&dir.join("g/schema.json")).unwrap();
    let names: Vec<String> = schema.relations.iter().map(|r| r.canonical()).collect();
    assert_eq!(names, ["user__rates__user", "user.country__country__user"]);
    let (name, countries) = &schema.node_types[1];
    assert_eq!(
        (name.as_str(), countries.count, countries.feature_dim),
        ("user.country", 4, None)
    );
    let run = hetgnn(
        dir,
        &[
            "train",
            "--data",
            "g",
            "--task",
            "edge-classification",
            "--target-relations",
            "user__rates__user",
            "--epochs",
            "2",
        ],
    )
    .ok();
    assert!(run.stdout().contains("done: 2 epochs"), "{}", run.stdout());
    // Exported and imported again: the same graph, weights and times included.
    hetgnn(
        dir,
        &[
            "export", "tables", "--data", "g", "--out", "t", "--format", "parquet",
        ],
    )
    .ok();
    hetgnn(
        dir,
        &[
            "import",
            "tables",
            "--config",
            "t/graph.toml",
            "--out",
            "back",
        ],
    )
    .ok();
    same_graph(&dir.join("g"), &dir.join("back"));
    for f in ["weights", "times"] {
        let f = format!("edges/user__rates__user/{f}.npy");
        assert_eq!(
            std::fs::read(dir.join("g").join(&f)).unwrap(),
            std::fs::read(dir.join("back").join(&f)).unwrap(),
            "{f}"
        );
    }
}
