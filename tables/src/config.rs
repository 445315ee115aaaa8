//! The table configuration (`graph.toml`): which files hold each node type and
//! relation, which columns are ids, features, labels and splits. Parsed and
//! checked as a whole before any table is opened.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, TableError};

/// Largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// The whole configuration.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TablesConfig {
    /// Graph name written to `schema.json` (default: the output directory's name).
    pub name: Option<String>,
    /// The node type whose labels are trained on (default: the only one with a label).
    pub target: Option<String>,
    /// Node tables, one entry per node type.
    #[serde(default)]
    pub nodes: Vec<NodeTable>,
    /// Edge tables, one entry per relation.
    #[serde(default)]
    pub edges: Vec<EdgeTable>,
}

/// How a file is read.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FileFormat {
    /// Comma-separated values with a header row, optionally gzipped (`.csv.gz`).
    Csv,
    /// Apache Parquet, any compression the reader supports.
    Parquet,
}

/// The tables of one node type.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeTable {
    /// Node type name.
    #[serde(rename = "type")]
    pub ntype: String,
    /// Files or directories (every table file inside, in name order), relative
    /// to the configuration file.
    pub files: Vec<PathBuf>,
    /// File format (default: from the extension).
    pub format: Option<FileFormat>,
    /// CSV field delimiter (default `,`).
    pub delimiter: Option<char>,
    /// The id column.
    pub id: String,
    /// Feature blocks, concatenated in this order.
    #[serde(default)]
    pub features: Vec<FeatureSpec>,
    /// The label column, on the target type.
    pub label: Option<LabelSpec>,
    /// How the labelled nodes are split into train, valid and test.
    pub split: Option<SplitSpec>,
    /// The regression target column, on the target type (`[nodes.value]`).
    pub value: Option<ValueSpec>,
    /// The multi-label target column, on the target type (`[nodes.label_set]`).
    pub label_set: Option<LabelSetSpec>,
}

impl NodeTable {
    /// Whether the table gives its nodes targets (a label, a value or a label set).
    pub fn has_targets(&self) -> bool {
        self.label.is_some() || self.value.is_some() || self.label_set.is_some()
    }
}

/// The multi-label target column: a set of labels per node, as a Parquet
/// list or delimited text (`0;3;7`, `fraud;spam`); empty: none.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LabelSetSpec {
    /// Column holding the labels.
    pub column: String,
    /// Separator of a text cell (default `;`).
    pub separator: Option<char>,
    /// Most distinct labels accepted (default 1000).
    pub max_labels: Option<u32>,
    /// Number of labels, for integer labels whose highest labels no node has
    /// (default: the highest label + 1).
    pub num_labels: Option<u32>,
    /// A text cell meaning "no label at all" (a known node with an empty
    /// set; an empty cell is a node without targets). Absent: none.
    pub empty: Option<String>,
}

/// The regression target column: a number per node (empty or NaN: none).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ValueSpec {
    /// Column holding the value.
    pub column: String,
}

/// The tables of one relation.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeTable {
    /// `[source type, relation name, destination type]`.
    pub relation: [String; 3],
    /// Files or directories, relative to the configuration file.
    pub files: Vec<PathBuf>,
    /// File format (default: from the extension).
    pub format: Option<FileFormat>,
    /// CSV field delimiter (default `,`).
    pub delimiter: Option<char>,
    /// The column of source node ids.
    pub source: String,
    /// The column of destination node ids.
    pub destination: String,
    /// What to do with an edge naming a node absent from its type's node table.
    #[serde(default)]
    pub unknown_ids: UnknownIds,
    /// Edge classification: the column of each edge's class, an integer
    /// from 0 or a name (names are sorted into classes; empty: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The number of edge classes (default: the largest label + 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_classes: Option<u32>,
    /// Edge regression: the column of each edge's value (empty or NaN: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// With `label` or `value`: how the edges with a target are split. A
    /// column name (`split = "split"`: `train`, `valid` or `test` per edge,
    /// empty: in no split), or a table as `[nodes.split]` takes
    /// (`split = { fractions = [0.8, 0.1, 0.1], seed = 0 }`, or
    /// `split = { time_column = "ts", train_before = .., valid_before = .. }`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<EdgeSplit>,
    /// A column of edge weights (finite numbers; empty: 1), kept as
    /// `edges/<relation>/weights.npy` for the tasks that read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<String>,
    /// A column of edge times (integers, e.g. seconds since 1970), kept as
    /// `edges/<relation>/times.npy`; a time split may read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
}

/// How the edges of a relation are split: a column of split names, or a rule.
#[derive(Clone, Debug)]
pub enum EdgeSplit {
    /// A column of `train` / `valid` / `test` (empty: none).
    Column(String),
    /// Fractions with a seed, or a time column with two bounds.
    Rule(SplitSpec),
}

impl EdgeSplit {
    /// The rule this split names (a column, fractions or a time column).
    pub(crate) fn rule(&self) -> std::result::Result<SplitRule, String> {
        match self {
            EdgeSplit::Column(c) => Ok(SplitRule::Column(c.clone())),
            EdgeSplit::Rule(s) => s.rule(),
        }
    }
}

impl Serialize for EdgeSplit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            EdgeSplit::Column(c) => s.serialize_str(c),
            EdgeSplit::Rule(r) => r.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for EdgeSplit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        // By hand rather than `untagged`, so a bad key in the table form is
        // named instead of "did not match any variant".
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = EdgeSplit;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a split column's name, or a table of fractions or a time column")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<EdgeSplit, E> {
                Ok(EdgeSplit::Column(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> std::result::Result<EdgeSplit, A::Error> {
                SplitSpec::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(EdgeSplit::Rule)
            }
        }
        d.deserialize_any(V)
    }
}

impl EdgeTable {
    /// Whether the table gives its edges targets (a label or a value).
    pub fn has_targets(&self) -> bool {
        self.label.is_some() || self.value.is_some()
    }

    /// The column the split reads: its names, or a time split's times.
    pub fn split_column(&self) -> Option<&str> {
        match self.split.as_ref()? {
            EdgeSplit::Column(c) => Some(c),
            EdgeSplit::Rule(s) => s.time_column.as_deref(),
        }
    }

    /// The columns read beside the two ends, in this order: label, value,
    /// split, weight, time (those the table has).
    pub fn extra_columns(&self) -> Vec<&str> {
        [
            self.label.as_deref(),
            self.value.as_deref(),
            self.split_column(),
            self.weight.as_deref(),
            self.time.as_deref(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Policy for edges that name unknown node ids.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UnknownIds {
    /// Refuse the import, naming the file, row and id.
    #[default]
    Refuse,
    /// Leave the edge out and count it.
    Drop,
}

/// One block of features: columns and the transform applied to each.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSpec {
    /// Source columns, each transformed the same way and concatenated.
    pub columns: Vec<String>,
    /// The transform (default `none`).
    #[serde(default)]
    pub transform: Transform,
    /// Value for a missing cell (a number, or a category name); absent: refuse missing cells.
    pub fill: Option<Fill>,
    /// Bucket boundaries, ascending (`bucketize`).
    pub boundaries: Option<Vec<f64>>,
    /// Separator of a multi-valued text cell (`multi-hot`; default `;`).
    pub separator: Option<String>,
    /// Most distinct categories accepted per column (`one-hot`, `multi-hot`:
    /// default 1000; `embedding`: default 1,000,000).
    pub max_categories: Option<usize>,
}

/// A fill value for missing cells.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Fill {
    /// A number, for numeric transforms.
    Number(f64),
    /// A category name, for categorical transforms.
    Text(String),
}

/// Feature transforms.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Transform {
    /// The number as it is.
    #[default]
    None,
    /// Scaled to [0, 1] by the fitted minimum and maximum.
    MinMax,
    /// Standardised by the fitted mean and standard deviation.
    Standard,
    /// Mapped through the fitted quantiles onto a standard normal.
    RankGauss,
    /// One-hot of the bucket the number falls in (`boundaries`).
    Bucketize,
    /// One-hot of the category (the distinct values, in sorted order).
    OneHot,
    /// Multi-hot of the categories in a list cell (Parquet list or delimited text).
    MultiHot,
    /// An index into a learnable embedding: each category becomes a node of
    /// a featureless type `<type>.<column>` (a learnable row each) linked to
    /// the nodes that have it by the relation `<type>.<column>__<column>__<type>`.
    /// A list cell (Parquet list, or text with `separator`) links several.
    Embedding,
}

impl Transform {
    /// Whether the transform reads numbers (else categories).
    pub fn numeric(self) -> bool {
        matches!(
            self,
            Transform::None
                | Transform::MinMax
                | Transform::Standard
                | Transform::RankGauss
                | Transform::Bucketize
        )
    }
}

/// The label column.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LabelSpec {
    /// Column holding the class (integers from 0, or names); empty cells are unlabelled.
    pub column: String,
    /// Most classes accepted (default 1000).
    pub max_classes: Option<u32>,
    /// Number of classes, for integer labels whose highest classes label no
    /// node (default: the highest label + 1).
    pub num_classes: Option<u32>,
}

/// How labelled nodes are split.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SplitSpec {
    /// A column of `train` / `valid` (or `val`, `validation`) / `test`; empty: none.
    pub column: Option<String>,
    /// Fractions of the labelled nodes for train, valid and test (sum at most 1).
    pub fractions: Option<[f64; 3]>,
    /// Seed of the random split by fractions (default 0).
    pub seed: Option<u64>,
    /// A numeric time column: train before `train_before`, valid before `valid_before`, test after.
    pub time_column: Option<String>,
    /// End (exclusive) of the training period.
    pub train_before: Option<f64>,
    /// End (exclusive) of the validation period.
    pub valid_before: Option<f64>,
}

/// A split rule, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum SplitRule {
    /// From a column of names.
    Column(String),
    /// Random by fractions with a seed.
    Fractions([f64; 3], u64),
    /// By a time column and two bounds.
    Time {
        /// The column.
        column: String,
        /// Train below this.
        train_before: f64,
        /// Valid below this (and at or above `train_before`).
        valid_before: f64,
    },
}

impl SplitSpec {
    /// The one rule this spec names.
    pub(crate) fn rule(&self) -> std::result::Result<SplitRule, String> {
        match (&self.column, &self.fractions, &self.time_column) {
            (Some(c), None, None) => Ok(SplitRule::Column(c.clone())),
            (None, Some(f), None) => {
                if f.iter().any(|x| !x.is_finite() || *x < 0.0)
                    || f.iter().sum::<f64>() > 1.0 + 1e-9
                {
                    return Err(format!(
                        "split fractions {f:?} must be non-negative and sum to at most 1"
                    ));
                }
                Ok(SplitRule::Fractions(*f, self.seed.unwrap_or(0)))
            }
            (None, None, Some(c)) => match (self.train_before, self.valid_before) {
                (Some(t), Some(v)) if t.is_finite() && v.is_finite() && t <= v => {
                    Ok(SplitRule::Time {
                        column: c.clone(),
                        train_before: t,
                        valid_before: v,
                    })
                }
                _ => Err("a time split needs train_before <= valid_before, both numbers".into()),
            },
            _ => Err("a split takes exactly one of `column`, `fractions` or `time_column`".into()),
        }
    }
}

impl TablesConfig {
    /// Reads and checks `path`.
    pub fn read(path: &Path) -> Result<TablesConfig> {
        let meta = std::fs::metadata(path).map_err(|e| TableError::io(path, e))?;
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(TableError::config(
                path,
                format!(
                    "{} bytes is more than a configuration holds ({MAX_CONFIG_BYTES})",
                    meta.len()
                ),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| TableError::io(path, e))?;
        let cfg: TablesConfig =
            toml::from_str(&text).map_err(|e| TableError::config(path, e.to_string()))?;
        cfg.check().map_err(|p| TableError::config(path, p))?;
        Ok(cfg)
    }

    /// Checks the configuration's consistency without opening a table.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if self.nodes.is_empty() && self.edges.is_empty() {
            return Err("no [[nodes]] or [[edges]] tables".into());
        }
        let mut types = BTreeSet::new();
        for n in &self.nodes {
            graphs::schema::check_name(&n.ntype, "node type")?;
            if !types.insert(n.ntype.as_str()) {
                return Err(format!(
                    "node type '{}' has two [[nodes]] entries: list its files in one",
                    n.ntype
                ));
            }
            let at = format!("[[nodes]] '{}'", n.ntype);
            if n.files.is_empty() {
                return Err(format!("{at}: no files"));
            }
            for f in &n.features {
                check_feature(f).map_err(|p| format!("{at}: {p}"))?;
            }
            if let Some(s) = &n.split {
                if !n.has_targets() {
                    return Err(format!(
                        "{at}: a split needs a [nodes.label], [nodes.value] or [nodes.label_set]"
                    ));
                }
                s.rule().map_err(|p| format!("{at}: {p}"))?;
            }
            if n.has_targets() && n.split.is_none() {
                return Err(format!(
                    "{at}: a label, value or label set needs a [nodes.split]"
                ));
            }
            if let Some(l) = &n.label_set {
                if l.max_labels == Some(0) || l.max_labels > Some(graphs::schema::MAX_LABEL_SETS) {
                    return Err(format!(
                        "{at}: max_labels must be in 1..={}",
                        graphs::schema::MAX_LABEL_SETS
                    ));
                }
                if let Some(k) = l.num_labels {
                    if k == 0 || k > l.max_labels.unwrap_or(1000) {
                        return Err(format!("{at}: num_labels {k} must be in 1..=max_labels"));
                    }
                }
                if l.empty.as_deref().is_some_and(|e| e.trim().is_empty()) {
                    return Err(format!("{at}: `empty` must be a non-empty text (an empty cell is a node without targets)"));
                }
            }
            if let Some(l) = &n.label {
                if l.max_classes == Some(0) {
                    return Err(format!("{at}: max_classes must be at least 1"));
                }
                if let Some(n) = l.num_classes {
                    if n == 0 || n > l.max_classes.unwrap_or(1000) {
                        return Err(format!("{at}: num_classes {n} must be in 1..=max_classes"));
                    }
                }
            }
        }
        let labelled: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.has_targets())
            .map(|n| n.ntype.as_str())
            .collect();
        let edge_targets = self.edges.iter().any(EdgeTable::has_targets);
        match (&self.target, labelled.as_slice()) {
            // A graph for edge tasks only: the format still names a target
            // type, whose nodes then carry no labels and no splits.
            (Some(t), []) if edge_targets => {
                let known = self.node_table(t).is_some()
                    || self
                        .edges
                        .iter()
                        .any(|e| e.relation[0] == *t || e.relation[2] == *t);
                if !known {
                    return Err(format!(
                        "target '{t}' is neither a [[nodes]] type nor an end of an [[edges]] relation"
                    ));
                }
            }
            (None, []) if edge_targets => {}
            (_, []) => return Err(
                "no node table has a [nodes.label] (or a [nodes.value] or [nodes.label_set]) and no edge table a label or value column: hetgnn trains on the targets of one node type or of relations' edges"
                    .into(),
            ),
            (Some(t), l) if !l.contains(&t.as_str()) => {
                return Err(format!(
                    "target '{t}' has no [nodes.label], [nodes.value] or [nodes.label_set] (with targets: {})",
                    l.join(", ")
                ))
            }
            (Some(_), _) | (None, [_]) => {}
            (None, l) => {
                return Err(format!(
                    "several node types have labels ({}): name the one to train on with `target`",
                    l.join(", ")
                ))
            }
        }
        if labelled.len() > 1 {
            return Err(format!(
                "labels on several node types ({}): the graph format holds the labels of one target type",
                labelled.join(", ")
            ));
        }
        let mut rels = BTreeSet::new();
        for e in &self.edges {
            let [s, r, d] = &e.relation;
            graphs::schema::check_name(s, "node type")?;
            graphs::schema::check_name(r, "relation")?;
            graphs::schema::check_name(d, "node type")?;
            if !rels.insert(e.relation.clone()) {
                return Err(format!(
                    "relation {s}__{r}__{d} has two [[edges]] entries: list its files in one"
                ));
            }
            if e.files.is_empty() {
                return Err(format!("[[edges]] {s}__{r}__{d}: no files"));
            }
            match (e.has_targets(), &e.split) {
                (true, None) => {
                    return Err(format!("[[edges]] {s}__{r}__{d}: a label or value column needs a split (a column of train, valid, test, or a table of fractions or a time column)"))
                }
                (false, Some(_)) => {
                    return Err(format!("[[edges]] {s}__{r}__{d}: a split needs a label or value column"))
                }
                (true, Some(split)) => {
                    split
                        .rule()
                        .map_err(|p| format!("[[edges]] {s}__{r}__{d}: {p}"))?;
                }
                _ => {}
            }
            if e.num_classes.is_some() && e.label.is_none() {
                return Err(format!(
                    "[[edges]] {s}__{r}__{d}: num_classes needs a label column"
                ));
            }
            if let Some(n) = e.num_classes {
                if n == 0 || n > graphs::schema::MAX_CLASSES {
                    return Err(format!(
                        "[[edges]] {s}__{r}__{d}: num_classes {n} must be in 1..={}",
                        graphs::schema::MAX_CLASSES
                    ));
                }
            }
        }
        Ok(())
    }

    /// The node table of `ntype`, if it has one.
    pub fn node_table(&self, ntype: &str) -> Option<&NodeTable> {
        self.nodes.iter().find(|n| n.ntype == ntype)
    }

    /// The target type (checked to exist when the configuration is read): the
    /// named one, else the one with node targets, else (a graph for edge
    /// tasks only) the destination type of the first relation with targets.
    pub fn target(&self) -> &str {
        if let Some(t) = &self.target {
            return t;
        }
        self.nodes
            .iter()
            .find(|n| n.has_targets())
            .map(|n| n.ntype.as_str())
            .or_else(|| {
                self.edges
                    .iter()
                    .find(|e| e.has_targets())
                    .map(|e| e.relation[2].as_str())
            })
            .unwrap_or_default()
    }

    /// Whether the target type's nodes carry targets (else only edges do).
    pub fn node_targets(&self) -> bool {
        self.nodes.iter().any(NodeTable::has_targets)
    }
}

fn check_feature(f: &FeatureSpec) -> std::result::Result<(), String> {
    if f.columns.is_empty() {
        return Err("a feature block needs at least one column".into());
    }
    let t = f.transform;
    match (&f.fill, t.numeric()) {
        (Some(Fill::Number(v)), true) if !v.is_finite() => {
            return Err(format!("fill {v} must be a finite number"))
        }
        (Some(Fill::Text(s)), true) => {
            return Err(format!(
                "fill '{s}' must be a number for a numeric transform"
            ))
        }
        (Some(Fill::Number(v)), false) => {
            return Err(format!(
                "fill {v} must be a category name (a string) for {t:?}"
            ))
        }
        _ => {}
    }
    match (t, &f.boundaries) {
        (Transform::Bucketize, None) => return Err("bucketize needs `boundaries`".into()),
        (Transform::Bucketize, Some(b))
            if b.is_empty()
                || b.iter().any(|x| !x.is_finite())
                || b.windows(2).any(|w| w[0] >= w[1]) =>
        {
            return Err(format!(
                "boundaries {b:?} must be finite and strictly ascending"
            ));
        }
        (Transform::Bucketize, Some(_)) => {}
        (_, Some(_)) => return Err(format!("`boundaries` applies to bucketize, not {t:?}")),
        _ => {}
    }
    if f.separator.is_some() && !matches!(t, Transform::MultiHot | Transform::Embedding) {
        return Err(format!(
            "`separator` applies to multi-hot and embedding, not {t:?}"
        ));
    }
    if t == Transform::Embedding {
        for c in &f.columns {
            graphs::schema::check_name(
                c,
                "an embedding column (it names a node type and a relation)",
            )?;
        }
    }
    if matches!(&f.separator, Some(s) if s.is_empty()) {
        return Err("`separator` must not be empty".into());
    }
    if f.max_categories.is_some() && t.numeric() {
        return Err(format!(
            "`max_categories` applies to one-hot, multi-hot and embedding, not {t:?}"
        ));
    }
    if f.max_categories == Some(0) {
        return Err("max_categories must be at least 1".into());
    }
    Ok(())
}

/// The format of `path` from its extension.
pub fn format_of(path: &Path) -> Option<FileFormat> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    if [".csv", ".csv.gz", ".tsv", ".tsv.gz"]
        .iter()
        .any(|e| name.ends_with(e))
    {
        Some(FileFormat::Csv)
    } else if name.ends_with(".parquet") || name.ends_with(".pq") {
        Some(FileFormat::Parquet)
    } else {
        None
    }
}

/// The files an entry names: each file as given, each directory's table files
/// in name order. Refuses a missing path, an empty directory and a file of
/// unknown format when none is configured.
pub fn expand_files(
    base: &Path,
    entries: &[PathBuf],
    format: Option<FileFormat>,
) -> Result<Vec<(PathBuf, FileFormat)>> {
    let mut out = Vec::new();
    for e in entries {
        let p = base.join(e);
        let meta = std::fs::metadata(&p).map_err(|err| TableError::io(&p, err))?;
        let mut files = Vec::new();
        if meta.is_dir() {
            let rd = std::fs::read_dir(&p).map_err(|err| TableError::io(&p, err))?;
            for entry in rd {
                let f = entry.map_err(|err| TableError::io(&p, err))?.path();
                // Spark and Hadoop leave `_SUCCESS` and `.crc` files beside their parts.
                let hidden = f.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with('_') || n.starts_with('.')
                });
                if f.is_file() && !hidden && (format.is_some() || format_of(&f).is_some()) {
                    files.push(f);
                }
            }
            files.sort();
            if files.is_empty() {
                return Err(TableError::file(
                    &p,
                    "directory holds no .csv, .csv.gz or .parquet files",
                ));
            }
        } else {
            files.push(p);
        }
        for f in files {
            let fmt = format.or_else(|| format_of(&f)).ok_or_else(|| {
                TableError::file(
                    &f,
                    "unknown table format: name it .csv, .csv.gz or .parquet, or set `format`",
                )
            })?;
            out.push((f, fmt));
        }
    }
    Ok(out)
}
