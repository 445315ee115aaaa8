//! Categorical columns as indices into learnable embeddings: each category
//! becomes a featureless node (a learnable row) linked to the nodes that have
//! it, and a later import links new nodes to the same categories.

use std::path::Path;

use graphs::npy::{DType, NpyFile};
use graphs::{NoProgress, Schema};
use tables::{import_tables, ImportOptions, TableError};

const ACCOUNTS: &str = "id,age,country,tags,risk,split
a1,30,DE,x;y,low,train
a2,40,FR,,high,train
a3,50,DE,y;y;z,low,valid
a4,60,US,z,high,test
";

const CONFIG: &str = r#"
[[nodes]]
type = "account"
files = ["accounts.csv"]
id = "id"
[[nodes.features]]
columns = ["age"]
transform = "standard"
[[nodes.features]]
columns = ["country"]
transform = "embedding"
[[nodes.features]]
columns = ["tags"]
transform = "embedding"
separator = ";"
fill = ""
[nodes.label]
column = "risk"
[nodes.split]
column = "split"
"#;

fn import(dir: &Path, accounts: &str, out: &str, like: Option<&str>) -> Result<Schema, TableError> {
    std::fs::write(dir.join("accounts.csv"), accounts).unwrap();
    std::fs::write(dir.join("g.toml"), CONFIG).unwrap();
    let opts = ImportOptions {
        like: like.map(|l| dir.join(l)),
        ..ImportOptions::default()
    };
    import_tables(&dir.join("g.toml"), &dir.join(out), &opts, &mut NoProgress).map(|(s, _)| s)
}

/// The (category, node) pairs of relation `canonical`.
fn links(g: &Path, canonical: &str) -> Vec<(i64, i64)> {
    let f = NpyFile::open(&g.join(format!("edges/{canonical}.npy")), DType::I64).unwrap();
    let n = f.len() / 2;
    (0..n).map(|i| (f.i64_at(i), f.i64_at(n + i))).collect()
}

#[test]
fn an_embedding_column_makes_a_category_type_linked_to_its_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let schema = import(tmp.path(), ACCOUNTS, "g", None).unwrap();
    let g = tmp.path().join("g");
    let types: Vec<(&str, u64, Option<u64>)> = schema
        .node_types
        .iter()
        .map(|(n, t)| (n.as_str(), t.count, t.feature_dim))
        .collect();
    // Embedding columns add no feature column; their categories are featureless nodes.
    assert_eq!(
        types,
        [
            ("account", 4, Some(1)),
            ("account.country", 3, None),
            ("account.tags", 3, None)
        ]
    );
    assert_eq!(
        std::fs::read_to_string(g.join("nodes/account.country/ids.csv")).unwrap(),
        "id\nDE\nFR\nUS\n"
    );
    // DE 0, FR 1, US 2; a tag listed twice links once, an empty cell none.
    assert_eq!(
        links(&g, "account.country__country__account"),
        [(0, 0), (1, 1), (0, 2), (2, 3)]
    );
    assert_eq!(
        links(&g, "account.tags__tags__account"),
        [(0, 0), (1, 0), (1, 2), (2, 2), (2, 3)]
    );
    graphs::load(&g, &graphs::LoadOptions::default()).unwrap();

    // A later import links new nodes to the categories the first one saw;
    // an unseen category links nothing (as one-hot gives it all zeros).
    let more = "id,age,country,tags,risk,split\na5,35,FR,w;x,low,train\na6,45,JP,,high,test\n";
    let like = import(tmp.path(), more, "g2", Some("g")).unwrap();
    let g2 = tmp.path().join("g2");
    assert_eq!(like.node_types[1].1.count, 3);
    assert_eq!(
        links(&g2, "account.country__country__account"),
        [(0, 0), (1, 1), (0, 2), (2, 3), (1, 4)]
    );
    assert_eq!(
        links(&g2, "account.tags__tags__account"),
        [(0, 0), (1, 0), (1, 2), (2, 2), (2, 3), (0, 4)]
    );
    graphs::load(&g2, &graphs::LoadOptions::default()).unwrap();
}

#[test]
fn an_embedding_column_clashing_with_a_type_or_too_many_categories_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("accounts.csv"), ACCOUNTS).unwrap();
    std::fs::write(tmp.path().join("c.csv"), "id\nDE\n").unwrap();
    let clash = format!(
        "{CONFIG}[[nodes]]\ntype = \"account.country\"\nfiles = [\"c.csv\"]\nid = \"id\"\n"
    );
    let refusal = |config: &str| {
        std::fs::write(tmp.path().join("g.toml"), config).unwrap();
        let (cfg, out) = (tmp.path().join("g.toml"), tmp.path().join("g"));
        let opts = ImportOptions::default();
        let err = import_tables(&cfg, &out, &opts, &mut NoProgress).unwrap_err();
        err.to_string()
    };
    let err = refusal(&clash);
    assert!(
        err.contains("makes the node type 'account.country', which the tables already have"),
        "{err}"
    );
    let capped = CONFIG.replace(
        "transform = \"embedding\"\n[[nodes.features]]",
        "transform = \"embedding\"\nmax_categories = 2\n[[nodes.features]]",
    );
    let err = refusal(&capped);
    assert!(
        err.contains("row 4")
            && err.contains("country")
            && err.contains("more than 2 distinct categories"),
        "{err}"
    );
    assert!(!tmp.path().join("g").exists());
}
