//! A request's new nodes and edges ([`Additions`]): their request-local ids
//! given dense ids after each type's stored nodes, their features taken as
//! given or transformed from raw columns with the import's fitted
//! transforms, and every name checked, before the engine answers over them.

use std::collections::HashMap;

use graphs::{NodeTypeId, RelationId};
use serde_json::Value;
use tables::source::Cells;

use crate::api::{self, Id, NewEdge, NewNode};
use crate::error::{Result, ServeError};
use crate::trained::Trained;

/// What one request adds to the graph, in dense ids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Additions {
    /// New nodes per type; type `t`'s take ids from its count on.
    pub added: Vec<u32>,
    /// The new nodes' feature rows, per type with features (`added[t] * dim` floats).
    pub features: Vec<Option<Vec<f32>>>,
    /// Edges `(relation, src, dst)` of stored relations.
    pub edges: Vec<(RelationId, u32, u32)>,
}

impl Additions {
    /// Whether nothing is added.
    pub fn is_empty(&self) -> bool {
        self.added.iter().all(|&n| n == 0) && self.edges.is_empty()
    }
}

/// [`Additions`] with the dense ids their request-local names took.
#[derive(Debug, Default)]
pub struct Resolved {
    /// What the request adds.
    pub additions: Additions,
    /// Per type, each new node's request id and dense id.
    names: Vec<HashMap<Id, u32>>,
}

impl Resolved {
    /// The dense ids of `ids` of type `t`: new nodes by their request ids,
    /// the others among the graph's (unknown ones refused).
    pub fn dense(&self, trained: &Trained, t: NodeTypeId, ids: &[Id]) -> Result<Vec<u32>> {
        let new = self.names.get(t.index());
        let is_new = |id: &Id| new.is_some_and(|m| m.contains_key(id));
        let stored: Vec<Id> = ids.iter().filter(|id| !is_new(id)).cloned().collect();
        let g = &trained.graph;
        let found = api::resolve(&trained.names[t.index()], &g.node_type(t).name, &stored)?;
        let mut found = found.into_iter();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            match new.and_then(|m| m.get(id)) {
                Some(&d) => out.push(d),
                // api::resolve answered every stored id or refused.
                None => out.extend(found.next()),
            }
        }
        Ok(out)
    }
}

fn bad(m: String) -> ServeError {
    ServeError::BadRequest(m)
}

/// Checks and resolves a request's new nodes (at most `max_nodes`) and new
/// edges (at most `max_edges`) against `trained`'s graph.
pub fn resolve(
    trained: &Trained,
    nodes: &[NewNode],
    edges: &[NewEdge],
    max_nodes: usize,
    max_edges: usize,
) -> Result<Resolved> {
    if nodes.is_empty() && edges.is_empty() {
        return Ok(Resolved::default());
    }
    if nodes.len() > max_nodes {
        return Err(ServeError::TooLarge(format!(
            "{} new nodes in one request; the server takes at most {max_nodes}",
            nodes.len()
        )));
    }
    if edges.len() > max_edges {
        return Err(ServeError::TooLarge(format!(
            "{} new edges in one request; the server takes at most {max_edges}",
            edges.len()
        )));
    }
    let g = &trained.graph;
    let types = g.node_types();
    let mut added = vec![0u32; types.len()];
    let mut features: Vec<Option<Vec<f32>>> = types
        .iter()
        .map(|t| t.features.as_ref().map(|_| Vec::new()))
        .collect();
    let mut names: Vec<HashMap<Id, u32>> = vec![HashMap::new(); types.len()];
    for n in nodes {
        let t = g.type_id(&n.ntype).ok_or_else(|| {
            let known: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
            bad(format!(
                "new node {}: unknown node type {:?}; the graph's types are {}",
                n.id.shown(),
                n.ntype.escape_debug().to_string(),
                known.join(", ")
            ))
        })?;
        let nt = g.node_type(t);
        let Some(f) = &nt.features else {
            return Err(bad(format!(
                "new node {} is of type '{}', which has no features: the model knows those nodes only by the rows it learnt for them, and a new one has none (connect new nodes to stored '{}' nodes instead)",
                n.id.shown(),
                nt.name,
                nt.name
            )));
        };
        if trained.names[t.index()].dense(n.id.node_ref()).is_some() {
            return Err(bad(format!(
                "new node {} is already a node of type '{}': a new node needs an id of its own",
                n.id.shown(),
                nt.name
            )));
        }
        let dense = nt.count.checked_add(added[t.index()]).ok_or_else(|| {
            bad(format!(
                "type '{}' has no 32-bit ids left for new nodes",
                nt.name
            ))
        })?;
        if names[t.index()].insert(n.id.clone(), dense).is_some() {
            return Err(bad(format!(
                "new node {} of type '{}' is listed twice",
                n.id.shown(),
                nt.name
            )));
        }
        added[t.index()] += 1;
        let row = feature_row(trained, &nt.name, f.dim(), n)?;
        if let Some(rows) = features[t.index()].as_mut() {
            rows.extend_from_slice(&row);
        }
    }
    let mut resolved = Vec::with_capacity(edges.len());
    for (i, e) in edges.iter().enumerate() {
        let r = relation(g, &e.relation)?;
        let rel = g.relation(r);
        let end = |id: &Id, t: NodeTypeId, which: &str| -> Result<u32> {
            if let Some(&d) = names[t.index()].get(id) {
                return Ok(d);
            }
            trained.names[t.index()]
                .dense(id.node_ref())
                .ok_or_else(|| {
                    ServeError::UnknownNodes(format!(
                        "new edge {i} ({}): its {which} {} is neither a new node nor a node of type '{}'",
                        rel.canonical(),
                        id.shown(),
                        g.node_type(t).name
                    ))
                })
        };
        resolved.push((
            r,
            end(&e.src, rel.src, "source")?,
            end(&e.dst, rel.dst, "destination")?,
        ));
    }
    Ok(Resolved {
        additions: Additions {
            added,
            features,
            edges: resolved,
        },
        names,
    })
}

/// A stored relation by canonical name, or by name where only one has it.
fn relation(g: &graphs::HetGraph, name: &str) -> Result<RelationId> {
    let stored = || {
        g.relations()
            .iter()
            .enumerate()
            .filter(|(_, r)| r.reverse_of.is_none())
    };
    let list = || {
        stored()
            .map(|(_, r)| r.canonical().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(r) = g
        .relations()
        .iter()
        .find(|r| r.reverse_of.is_some() && (r.canonical() == name || r.name == name))
    {
        return Err(bad(format!(
            "'{}' is a reverse relation the model adds itself: add the edge to the relation it reverses",
            r.canonical()
        )));
    }
    let hits: Vec<usize> = stored()
        .filter(|(_, r)| r.canonical() == name || r.name == name)
        .map(|(i, _)| i)
        .collect();
    match hits.as_slice() {
        [i] => Ok(RelationId(*i as u32)),
        [] => Err(bad(format!(
            "unknown relation {:?}; the graph's relations are {}",
            name.escape_debug().to_string(),
            list()
        ))),
        _ => Err(bad(format!(
            "several relations are named {:?}: give the canonical name (one of {})",
            name.escape_debug().to_string(),
            list()
        ))),
    }
}

/// A new node's feature row: given, or its raw columns transformed.
fn feature_row(trained: &Trained, ntype: &str, dim: usize, n: &NewNode) -> Result<Vec<f32>> {
    let id = n.id.shown();
    let row = match (&n.features, &n.columns) {
        (Some(f), None) => {
            if f.len() != dim {
                return Err(bad(format!(
                    "new node {id}: {} feature values; type '{ntype}' has {dim}",
                    f.len()
                )));
            }
            f.clone()
        }
        (None, Some(cols)) => transform(trained, ntype, &id, cols)?,
        (Some(_), Some(_)) => {
            return Err(bad(format!(
                "new node {id}: give its `features` or its raw `columns`, not both"
            )))
        }
        (None, None) => {
            return Err(bad(format!(
                "new node {id}: give its `features` ({dim} values) or its raw `columns`"
            )))
        }
    };
    if row.len() != dim {
        return Err(ServeError::Inference(format!(
            "the saved transforms of type '{ntype}' give {} values; the graph has {dim}",
            row.len()
        )));
    }
    if let Some(v) = row.iter().find(|v| !v.is_finite()) {
        return Err(bad(format!(
            "new node {id}: feature value {v} is not a finite number"
        )));
    }
    Ok(row)
}

/// Raw columns through the import's fitted transforms of `ntype`.
fn transform(
    trained: &Trained,
    ntype: &str,
    id: &str,
    cols: &serde_json::Map<String, Value>,
) -> Result<Vec<f32>> {
    let Some(blocks) = trained.transforms.get(ntype) else {
        return Err(bad(format!(
            "new node {id}: this graph was not imported from tables, so it has no saved transforms of type '{ntype}': give its `features` instead of `columns`"
        )));
    };
    let known: Vec<&str> = blocks
        .iter()
        .flat_map(|b| b.columns.iter().map(String::as_str))
        .collect();
    if let Some(c) = cols.keys().find(|c| !known.contains(&c.as_str())) {
        return Err(bad(format!(
            "new node {id}: {:?} is not a feature column of type '{ntype}'; its feature columns are {}",
            c.escape_debug().to_string(),
            known.join(", ")
        )));
    }
    let mut out = Vec::new();
    for b in blocks {
        if b.embedding_categories().is_some() {
            // Its categories are nodes: a new node reaches them by edges, not features.
            if let Some(c) = b.columns.iter().find(|c| cols.contains_key(c.as_str())) {
                return Err(bad(format!(
                    "new node {id}: column {c:?} is an embedding column, whose categories are the nodes of type '{ntype}.{c}': give the new node an edge of relation {ntype}.{c}__{c}__{ntype} from its category (the category's value is its id) in `new_edges` instead"
                )));
            }
            continue;
        }
        let cells = b
            .columns
            .iter()
            .map(|c| {
                cell(cols.get(c)).map_err(|m| bad(format!("new node {id}: column {c:?}: {m}")))
            })
            .collect::<Result<Vec<Cells>>>()?;
        let refs: Vec<&Cells> = cells.iter().collect();
        b.apply(&refs, 0, &mut out)
            .map_err(|(c, m)| bad(format!("new node {id}: column {:?}: {m}", b.columns[c])))?;
    }
    Ok(out)
}

/// One JSON value as a one-row column (absent or null: a missing cell).
fn cell(v: Option<&Value>) -> std::result::Result<Cells, String> {
    Ok(match v {
        None | Some(Value::Null) => Cells::Text(vec![None::<&str>].into()),
        Some(Value::Bool(b)) => Cells::Int(vec![Some(i64::from(*b))]),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => Cells::Int(vec![Some(i)]),
            None => Cells::Float(vec![n.as_f64()]),
        },
        Some(Value::String(s)) => Cells::Text(vec![Some(s.as_str())].into()),
        Some(Value::Array(a)) => Cells::List(vec![Some(
            a.iter()
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect(),
        )]),
        Some(Value::Object(_)) => return Err("an object is not a cell value".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_become_one_row_cells() {
        assert!(cell(None).unwrap().is_missing(0));
        assert!(cell(Some(&Value::Null)).unwrap().is_missing(0));
        assert!(matches!(
            cell(Some(&serde_json::json!(3))).unwrap(),
            Cells::Int(v) if v == vec![Some(3)]
        ));
        assert!(matches!(
            cell(Some(&serde_json::json!(2.5))).unwrap(),
            Cells::Float(v) if v == vec![Some(2.5)]
        ));
        assert!(matches!(
            cell(Some(&serde_json::json!(["a", 1]))).unwrap(),
            Cells::List(v) if v == vec![Some(vec!["a".to_string(), "1".to_string()])]
        ));
        assert!(cell(Some(&serde_json::json!({"a": 1}))).is_err());
    }
}
