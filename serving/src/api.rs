//! The JSON of the HTTP API: requests, answers and errors, and the mapping of
//! a request's ids (original ids of a graph imported from tables, else the
//! graph's own dense ids) to dense ids.

use serde::{Deserialize, Serialize};
use tables::results::{NodeNames, NodeRef};

use crate::error::{Result, ServeError};

/// A node id as a request gives it: an integer or a string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Id {
    /// An integer id.
    Int(i64),
    /// A string id.
    Text(String),
}

impl Id {
    /// The id as the graph's name maps look it up.
    pub fn node_ref(&self) -> NodeRef<'_> {
        match self {
            Id::Int(v) => NodeRef::Int(*v),
            Id::Text(t) => NodeRef::Text(t),
        }
    }

    /// The id for an error message (text quoted and escaped, so that a
    /// request cannot write terminal escapes into a log).
    pub fn shown(&self) -> String {
        match self {
            Id::Int(v) => v.to_string(),
            Id::Text(t) => format!("{:?}", t.escape_debug().to_string()),
        }
    }
}

/// `POST /v1/predict`: classes of target nodes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictRequest {
    /// The node type; the model's target type when absent (the only one it classifies).
    #[serde(rename = "type", default)]
    pub ntype: Option<String>,
    /// The nodes, in the order answered.
    pub ids: Vec<Id>,
    /// Also answer each class's probability.
    #[serde(default)]
    pub probabilities: bool,
    /// Also answer the embedding the classifier reads.
    #[serde(default)]
    pub embeddings: bool,
    /// Nodes the question adds to the graph (`ids` may name them).
    #[serde(default)]
    pub new_nodes: Vec<NewNode>,
    /// Edges the question adds, between new or stored nodes.
    #[serde(default)]
    pub new_edges: Vec<NewEdge>,
}

/// A node a request adds: answered as if the graph had it, the stored graph unchanged.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewNode {
    /// Its node type (one with features).
    #[serde(rename = "type")]
    pub ntype: String,
    /// Its id within the request: not a node of the graph.
    pub id: Id,
    /// Its feature row, as the graph stores it (transformed).
    #[serde(default)]
    pub features: Option<Vec<f32>>,
    /// Its raw table columns, transformed as the import transformed the
    /// type's (graphs imported from tables).
    #[serde(default)]
    pub columns: Option<serde_json::Map<String, serde_json::Value>>,
}

/// An edge a request adds to a stored relation (its reverse comes with it
/// where the model was trained with reverse edges).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewEdge {
    /// The relation: its canonical name (`src__name__dst`), or its name
    /// where no other relation has it.
    pub relation: String,
    /// The source: a new node or a stored one.
    pub src: Id,
    /// The destination: a new node or a stored one.
    pub dst: Id,
}

/// The answer to a [`PredictRequest`].
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct PredictResponse {
    /// The node type.
    #[serde(rename = "type")]
    pub ntype: String,
    /// The request's ids, in its order.
    pub ids: Vec<Id>,
    /// The predicted class of each node (a regression model: its value; a
    /// multi-label model: its labels).
    pub predictions: Predictions,
    /// The predicted classes' names, when the labels were imported as names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_names: Option<Vec<String>>,
    /// A multi-label model's: each node's predicted labels by name, when the
    /// label sets were imported as names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_names: Option<Vec<Vec<String>>>,
    /// Each node's class probabilities (multi-label: each label's), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probabilities: Option<Vec<Vec<f32>>>,
    /// Each node's embedding, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<Vec<Vec<f32>>>,
}

/// What a model predicts per node: a class, or a value.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Predictions {
    /// Classes (node classification).
    Classes(Vec<u32>),
    /// Values (node regression).
    Values(Vec<f32>),
    /// Each node's predicted labels, in label order (multi-label).
    Labels(Vec<Vec<u32>>),
}

/// `POST /v1/embed`: embeddings of nodes of one type.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedRequest {
    /// The node type; the model's target type when absent.
    #[serde(rename = "type", default)]
    pub ntype: Option<String>,
    /// The nodes, in the order answered.
    pub ids: Vec<Id>,
    /// Nodes the question adds to the graph (`ids` may name them).
    #[serde(default)]
    pub new_nodes: Vec<NewNode>,
    /// Edges the question adds, between new or stored nodes.
    #[serde(default)]
    pub new_edges: Vec<NewEdge>,
}

/// The answer to an [`EmbedRequest`].
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct EmbedResponse {
    /// The node type.
    #[serde(rename = "type")]
    pub ntype: String,
    /// The request's ids, in its order.
    pub ids: Vec<Id>,
    /// Each node's embedding.
    pub embeddings: Vec<Vec<f32>>,
}

/// `POST /v1/score_edges`: classes or values of edges, for an edge model.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreEdgesRequest {
    /// The target relation (canonical name); the model's first when absent.
    #[serde(default)]
    pub relation: Option<String>,
    /// Each edge's source, in the order answered.
    pub src: Vec<Id>,
    /// Each edge's destination (as many as `src`).
    pub dst: Vec<Id>,
    /// Also answer each class's probability.
    #[serde(default)]
    pub probabilities: bool,
    /// Nodes the question adds to the graph (`src` and `dst` may name them).
    #[serde(default)]
    pub new_nodes: Vec<NewNode>,
    /// Edges the question adds (not the edges scored, unless listed here too).
    #[serde(default)]
    pub new_edges: Vec<NewEdge>,
}

/// The answer to a [`ScoreEdgesRequest`].
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ScoreEdgesResponse {
    /// The relation scored.
    pub relation: String,
    /// The request's sources, in its order.
    pub src: Vec<Id>,
    /// The request's destinations.
    pub dst: Vec<Id>,
    /// Each edge's class (edge classification), value (edge regression) or
    /// score (link prediction: the decoder's logit).
    pub predictions: Predictions,
    /// Each edge's class name, when the edge classes were imported as names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_names: Option<Vec<String>>,
    /// Each edge's class probabilities (link prediction: `[p]`, the
    /// score's sigmoid), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probabilities: Option<Vec<Vec<f32>>>,
}

/// An error's body: `{"error": "..."}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong and what to do.
    pub error: String,
}

/// How many unknown ids an error names before summarising the rest.
const NAMED_UNKNOWN: usize = 5;

/// The dense ids of `ids` among `names`' nodes of type `ntype`; unknown ids
/// are refused, the first few named.
pub fn resolve(names: &NodeNames, ntype: &str, ids: &[Id]) -> Result<Vec<u32>> {
    let mut dense = Vec::with_capacity(ids.len());
    let mut unknown = Vec::new();
    let mut missing = 0usize;
    for id in ids {
        match names.dense(id.node_ref()) {
            Some(d) => dense.push(d),
            None => {
                missing += 1;
                if unknown.len() < NAMED_UNKNOWN {
                    unknown.push(id.shown());
                }
            }
        }
    }
    if missing == 0 {
        return Ok(dense);
    }
    let more = missing - unknown.len();
    let hint = if names.original() {
        ""
    } else {
        " (this graph has no original ids: give dense ids 0..count)"
    };
    Err(ServeError::UnknownNodes(format!(
        "{missing} id(s) are not nodes of type '{ntype}': {}{}{hint}",
        unknown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_integers_or_strings() {
        let r: PredictRequest = serde_json::from_str(r#"{"ids": [3, "a7"]}"#).unwrap();
        assert_eq!(r.ids, vec![Id::Int(3), Id::Text("a7".into())]);
        assert!(!r.probabilities && r.ntype.is_none());
        assert!(serde_json::from_str::<PredictRequest>(r#"{"ids": [1.5]}"#).is_err());
        assert!(serde_json::from_str::<PredictRequest>(r#"{"ids": [1], "probs": true}"#).is_err());
        assert!(serde_json::from_str::<EmbedRequest>(r#"{"type": "a"}"#).is_err());
    }
}
