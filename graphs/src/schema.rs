//! `schema.json`: the description of a graph directory (see FORMAT.md).

use std::fmt;
use std::path::Path;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{GraphError, Result};

/// The parsed `schema.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schema {
    /// A human-readable name.
    pub name: String,
    /// The node type that carries labels and splits.
    pub target: String,
    /// Number of label classes of the target type.
    pub num_classes: u32,
    /// Node types, in file order (which fixes their ids).
    #[serde(deserialize_with = "unique_ordered", serialize_with = "ordered")]
    pub node_types: Vec<(String, NodeTypeSchema)>,
    /// Relations, in file order.
    pub relations: Vec<RelationSchema>,
    /// Whether the target type has `values.npy`: a regression target per node
    /// (float32, NaN = none). Absent in the file: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub values: bool,
    /// Labels per node of the target type's `label_sets.npy` (multi-label
    /// classification: int8 `[count, label_sets]`, 1 = has the label, a row
    /// of -1 = unlabelled). Absent in the file: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_sets: Option<u32>,
}

/// One node type's entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeTypeSchema {
    /// Number of nodes.
    pub count: u64,
    /// Feature width; `None` for a featureless type.
    pub feature_dim: Option<u64>,
}

/// One relation's entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelationSchema {
    /// Source node type.
    pub src: String,
    /// Relation name.
    pub name: String,
    /// Destination node type.
    pub dst: String,
    /// Number of edges.
    pub count: u64,
    /// Classes of the edge labels in `edges/<canonical>.labels.npy` (edge
    /// classification); absent: the edges have no labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_classes: Option<u32>,
    /// Whether the edges have values in `edges/<canonical>.values.npy` (edge
    /// regression). Absent in the file: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub values: bool,
    /// Whether the edges have weights in `edges/<canonical>/weights.npy`
    /// (float32, aligned with the edge file). Absent in the file: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub weights: bool,
    /// Whether the edges have times in `edges/<canonical>/times.npy`
    /// (int64, aligned with the edge file). Absent in the file: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub times: bool,
}

impl RelationSchema {
    /// The canonical name `src__name__dst`, also the edge file's stem.
    pub fn canonical(&self) -> String {
        format!("{}__{}__{}", self.src, self.name, self.dst)
    }

    /// Whether the edges carry targets (labels or values) and so splits.
    pub fn has_targets(&self) -> bool {
        self.num_classes.is_some() || self.values
    }

    /// Whether the relation has a directory of edge columns (targets, weights or times).
    pub fn has_columns(&self) -> bool {
        self.has_targets() || self.weights || self.times
    }
}

/// Largest node count per type: ids are stored as u32.
pub const MAX_NODES: u64 = u32::MAX as u64 - 1;
/// Most label classes accepted.
pub const MAX_CLASSES: u32 = 1 << 20;
/// Most labels per node of a multi-label target accepted.
pub const MAX_LABEL_SETS: u32 = 1 << 16;
/// Largest feature width accepted.
pub const MAX_FEATURE_DIM: u64 = 1 << 20;
/// Most edges accepted in one relation: 2^40, a thousand times ogbn-papers100M's
/// 1.6 billion, and small enough that byte offsets into its files never overflow.
pub const MAX_EDGES: u64 = 1 << 40;

impl Schema {
    /// Reads and validates `path`.
    pub fn read(path: &Path) -> Result<Schema> {
        let text = crate::input::read_text(path)?;
        let schema: Schema =
            serde_json::from_str(&text).map_err(|e| GraphError::schema(path, e.to_string()))?;
        schema.validate().map_err(|p| GraphError::schema(path, p))?;
        Ok(schema)
    }

    /// Writes `path` as pretty JSON.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("schema serialises");
        crate::atomic::write(path, text + "\n")
    }

    /// Checks internal consistency; the error says which entry is wrong.
    pub fn validate(&self) -> std::result::Result<(), crate::error::Invalid> {
        self.check().map_err(crate::error::Invalid)
    }

    fn check(&self) -> std::result::Result<(), String> {
        // The name is printed in every run's output: no terminal escapes or line breaks.
        if self.name.len() > 256 || self.name.chars().any(char::is_control) {
            return Err(format!(
                "graph name {:?} must be at most 256 bytes without control characters",
                self.name
            ));
        }
        if self.node_types.is_empty() {
            return Err("no node types".into());
        }
        for (name, t) in &self.node_types {
            check_name(name, "node type")?;
            if t.count > MAX_NODES {
                return Err(format!(
                    "node type '{name}': count {} exceeds the limit {MAX_NODES}",
                    t.count
                ));
            }
            if let Some(d) = t.feature_dim {
                if d == 0 || d > MAX_FEATURE_DIM {
                    return Err(format!("node type '{name}': feature_dim {d} must be in 1..={MAX_FEATURE_DIM} (null for none)"));
                }
            }
        }
        if self.type_index(&self.target).is_none() {
            return Err(format!("target '{}' is not a node type", self.target));
        }
        if self.num_classes == 0 || self.num_classes > MAX_CLASSES {
            return Err(format!("num_classes must be in 1..={MAX_CLASSES}"));
        }
        if let Some(l) = self.label_sets {
            if l == 0 || l > MAX_LABEL_SETS {
                return Err(format!(
                    "label_sets must be in 1..={MAX_LABEL_SETS} (absent for none)"
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for r in &self.relations {
            check_name(&r.name, "relation")?;
            if r.count > MAX_EDGES {
                return Err(format!(
                    "relation '{}': count {} exceeds the limit {MAX_EDGES}",
                    r.canonical(),
                    r.count
                ));
            }
            for end in [&r.src, &r.dst] {
                if self.type_index(end).is_none() {
                    return Err(format!(
                        "relation '{}': '{end}' is not a node type",
                        r.canonical()
                    ));
                }
            }
            if let Some(c) = r.num_classes {
                if c == 0 || c > MAX_CLASSES {
                    return Err(format!(
                        "relation '{}': num_classes must be in 1..={MAX_CLASSES}",
                        r.canonical()
                    ));
                }
            }
            if !seen.insert(r.canonical()) {
                return Err(format!("relation '{}' is listed twice", r.canonical()));
            }
        }
        Ok(())
    }

    /// A lower bound on the bytes loading this graph allocates: each
    /// relation's index by destination (and by source too with reverse
    /// relations), labels and splits, and features unless they are mapped.
    pub fn load_bytes(&self, reverse_edges: bool, mmap_features: bool) -> u128 {
        let count = |t: &str| {
            self.type_index(t)
                .map_or(0, |i| u128::from(self.node_types[i].1.count))
        };
        let mut bytes: u128 = 0;
        for r in &self.relations {
            bytes += (count(&r.dst) + 1) * 8 + u128::from(r.count) * 4;
            if reverse_edges {
                bytes += (count(&r.src) + 1) * 8 + u128::from(r.count) * 4;
            }
            // Split edges: both ends, a label and a value, each split once.
            if r.has_targets() {
                bytes += u128::from(r.count) * 20;
            }
        }
        bytes += count(&self.target) * 16;
        if !mmap_features {
            bytes += self
                .node_types
                .iter()
                .map(|(_, t)| u128::from(t.count) * u128::from(t.feature_dim.unwrap_or(0)) * 4)
                .sum::<u128>();
        }
        bytes
    }

    /// The node type with the most nodes, as `'name' (N nodes)`, for messages.
    pub fn largest_type(&self) -> String {
        self.node_types
            .iter()
            .max_by_key(|(_, t)| t.count)
            .map_or(String::new(), |(n, t)| {
                format!("node type '{n}' declares {} nodes", t.count)
            })
    }

    /// This schema without edge targets (what a streamed partition stores:
    /// its writer never holds an edge's targets).
    pub fn without_edge_targets(mut self) -> Schema {
        for r in &mut self.relations {
            r.num_classes = None;
            r.values = false;
        }
        self
    }

    /// Index of the node type `name`.
    pub fn type_index(&self, name: &str) -> Option<usize> {
        self.node_types.iter().position(|(n, _)| n == name)
    }
}

/// Names become file names: keep them to a safe alphabet, without the `__` separator.
pub fn check_name(name: &str, what: &str) -> std::result::Result<(), crate::error::Invalid> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        && !name.contains("__")
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(crate::error::Invalid(format!("{what} name {name:?} must be 1-128 characters of [A-Za-z0-9_.-], not start with '.', and not contain '__'")))
    }
}

fn ordered<S: Serializer>(
    v: &[(String, NodeTypeSchema)],
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(v.len()))?;
    for (k, t) in v {
        m.serialize_entry(k, t)?;
    }
    m.end()
}

/// A JSON object kept in file order, refusing repeated keys (serde_json would keep the last).
fn unique_ordered<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<(String, NodeTypeSchema)>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<(String, NodeTypeSchema)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object of node types")
        }
        fn visit_map<A: MapAccess<'de>>(
            self,
            mut map: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut out: Vec<(String, NodeTypeSchema)> = Vec::new();
            while let Some((k, v)) = map.next_entry::<String, NodeTypeSchema>()? {
                if out.iter().any(|(n, _)| *n == k) {
                    return Err(serde::de::Error::custom(format!(
                        "node type '{k}' is listed twice"
                    )));
                }
                out.push((k, v));
            }
            Ok(out)
        }
    }
    d.deserialize_map(V)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> std::result::Result<Schema, String> {
        let schema: Schema = serde_json::from_str(s).map_err(|e| e.to_string())?;
        schema.validate().map_err(String::from)?;
        Ok(schema)
    }

    const OK: &str = r#"{"name":"g","target":"paper","num_classes":3,
        "node_types":{"paper":{"count":4,"feature_dim":2},"author":{"count":3,"feature_dim":null}},
        "relations":[{"src":"author","name":"writes","dst":"paper","count":5}]}"#;

    #[test]
    fn parses_in_order_and_round_trips() {
        let s = parse(OK).unwrap();
        assert_eq!(s.node_types[0].0, "paper");
        assert_eq!(s.node_types[1].1.feature_dim, None);
        let back: Schema = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn refuses_inconsistent_schemas() {
        let cases = [
            (OK.replace("\"target\":\"paper\"", "\"target\":\"venue\""), "not a node type"),
            (OK.replace("\"num_classes\":3", "\"num_classes\":0"), "num_classes"),
            (OK.replace("\"src\":\"author\"", "\"src\":\"venue\""), "not a node type"),
            (OK.replace("\"writes\"", "\"wr__ites\""), "must be"),
            (OK.replace("\"feature_dim\":2", "\"feature_dim\":0"), "feature_dim"),
            (OK.replace("\"count\":5}]", "\"count\":5},{\"src\":\"author\",\"name\":\"writes\",\"dst\":\"paper\",\"count\":1}]"), "twice"),
            (OK.replace("\"author\":{\"count\":3", "\"paper\":{\"count\":3"), "twice"),
            (OK.replace("\"name\":\"g\",", "\"name\":\"g\",\"extra\":1,"), "unknown field"),
            (OK.replace("\"count\":4", "\"count\":-4"), "invalid value"),
            (OK.replace("\"count\":5}", "\"count\":1099511627777}"), "exceeds the limit 1099511627776"),
        ];
        for (text, needle) in cases {
            let err = parse(&text).unwrap_err();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }
}
