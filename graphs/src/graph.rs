//! The in-memory heterogeneous graph: node types with optional features, labels
//! and splits, and relations stored as CSR in both directions.

use std::sync::Arc;

use crate::csr::Csr;
use crate::edge_targets::EdgeTargets;
use crate::error::{GraphError, Result};
use crate::features::Features;
use crate::ids::{NodeTypeId, RelationId};
use crate::label_sets::LabelSets;
use crate::metagraph::Metagraph;
use crate::rng::hash_str;
use crate::schema::{NodeTypeSchema, RelationSchema, Schema, MAX_NODES};

/// Node ids of the train, validation and test splits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Splits {
    /// Training nodes.
    pub train: Vec<u32>,
    /// Validation nodes.
    pub valid: Vec<u32>,
    /// Test nodes.
    pub test: Vec<u32>,
}

impl Splits {
    /// The three splits with their names.
    pub fn named(&self) -> [(&'static str, &[u32]); 3] {
        [
            ("train", &self.train),
            ("valid", &self.valid),
            ("test", &self.test),
        ]
    }
}

/// One node type.
#[derive(Debug)]
pub struct NodeType {
    /// Type name.
    pub name: String,
    /// Number of nodes; ids are `0..count`.
    pub count: u32,
    /// Features, or `None` for a featureless type (models give it a learnable embedding).
    pub features: Option<Features>,
    /// Labels (target type only); -1 = unlabelled.
    pub labels: Option<Vec<i64>>,
    /// Regression targets (target type only, where the graph has them); NaN = none.
    pub values: Option<Vec<f32>>,
    /// Multi-label targets (target type only, where the graph has them).
    pub label_sets: Option<LabelSets>,
    /// Splits (target type only).
    pub splits: Option<Splits>,
}

/// One relation `src --name--> dst`.
#[derive(Clone, Debug)]
pub struct Relation {
    /// Relation name (`rev_<name>` for an added reverse).
    pub name: String,
    /// Source node type.
    pub src: NodeTypeId,
    /// Destination node type.
    pub dst: NodeTypeId,
    /// For an added reverse relation, the relation it reverses.
    pub reverse_of: Option<RelationId>,
    canonical: String,
    key: u64,
    by_dst: Arc<Csr>,
    by_src: Arc<Csr>,
    /// What edge tasks learn of this relation's edges (stored relations only).
    targets: Option<Arc<EdgeTargets>>,
}

impl Relation {
    /// The labels, values and splits of the edges, where the graph has them.
    pub fn targets(&self) -> Option<&EdgeTargets> {
        self.targets.as_deref()
    }
    /// `src__name__dst`.
    pub fn canonical(&self) -> &str {
        &self.canonical
    }
    /// A stable key derived from the canonical name (used by the sampler's RNG,
    /// so sampling does not depend on relation order or on which relations a
    /// process holds).
    pub fn key(&self) -> u64 {
        self.key
    }
    /// In-neighbors: rows are destination nodes, entries are source nodes.
    pub fn in_csr(&self) -> &Csr {
        &self.by_dst
    }
    /// Out-neighbors: rows are source nodes, entries are destination nodes.
    pub fn out_csr(&self) -> &Csr {
        &self.by_src
    }
    /// Number of edges.
    pub fn num_edges(&self) -> usize {
        self.by_dst.num_edges()
    }
}

/// A heterogeneous graph.
#[derive(Debug)]
pub struct HetGraph {
    name: String,
    target: NodeTypeId,
    num_classes: u32,
    node_types: Vec<NodeType>,
    relations: Vec<Relation>,
    in_relations: Vec<Vec<RelationId>>,
}

impl HetGraph {
    /// Graph name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The labelled node type.
    pub fn target(&self) -> NodeTypeId {
        self.target
    }
    /// Number of label classes.
    pub fn num_classes(&self) -> u32 {
        self.num_classes
    }
    /// All node types, indexed by [`NodeTypeId`].
    pub fn node_types(&self) -> &[NodeType] {
        &self.node_types
    }

    /// Keeps only the feature rows of type `t` that `keep` accepts (the
    /// others read as zeros: [`Features::keep_rows`]); no-op for a
    /// featureless type.
    pub(crate) fn keep_rows(&mut self, t: usize, keep: impl Fn(usize) -> bool) {
        if let Some(f) = self
            .node_types
            .get_mut(t)
            .and_then(|nt| nt.features.as_mut())
        {
            f.keep_rows(keep);
        }
    }

    /// One node type.
    pub fn node_type(&self, t: NodeTypeId) -> &NodeType {
        &self.node_types[t.index()]
    }
    /// Id of the node type called `name`.
    pub fn type_id(&self, name: &str) -> Option<NodeTypeId> {
        self.node_types
            .iter()
            .position(|t| t.name == name)
            .map(|i| NodeTypeId(i as u32))
    }
    /// All relations, indexed by [`RelationId`].
    pub fn relations(&self) -> &[Relation] {
        &self.relations
    }
    /// One relation.
    pub fn relation(&self, r: RelationId) -> &Relation {
        &self.relations[r.index()]
    }
    /// Id of the relation whose canonical name is `canonical` (`src__name__dst`).
    pub fn relation_id(&self, canonical: &str) -> Option<RelationId> {
        self.relations
            .iter()
            .position(|r| r.canonical == canonical)
            .map(|i| RelationId(i as u32))
    }
    /// Relations whose destination is `t`, in id order.
    pub fn in_relations(&self, t: NodeTypeId) -> &[RelationId] {
        &self.in_relations[t.index()]
    }
    /// Labels and splits of the target type.
    pub fn target_labels(&self) -> (&[i64], &Splits) {
        let t = self.node_type(self.target);
        (
            t.labels
                .as_deref()
                .expect("the target type always has labels"),
            t.splits
                .as_ref()
                .expect("the target type always has splits"),
        )
    }
    /// The target type's regression targets (NaN = none), where the graph has them.
    pub fn target_values(&self) -> Option<&[f32]> {
        self.node_type(self.target).values.as_deref()
    }
    /// The target type's multi-label targets, where the graph has them.
    pub fn target_label_sets(&self) -> Option<&LabelSets> {
        self.node_type(self.target).label_sets.as_ref()
    }
    /// Bytes this graph holds in memory, an upper bound: every relation's
    /// two CSRs counted (a reverse shares its original's), features as if
    /// every mapped page were read, with their non-zero index where one may
    /// be built, labels, values, splits and edge targets.
    pub fn heap_bytes(&self) -> u64 {
        let mut bytes = 0u64;
        for t in &self.node_types {
            if let Some(f) = &t.features {
                let values = (f.rows() * f.dim() * 4) as u64;
                let sparse = if f.dim() >= crate::nonzeros::MIN_WIDTH {
                    // A row index of (column u32, value f32) pairs at most MAX_DENSITY full.
                    (values as f64 * crate::nonzeros::MAX_DENSITY * 2.0) as u64
                        + (f.rows() as u64 + 1) * 8
                } else {
                    0
                };
                bytes += values + sparse;
            }
            bytes += t.labels.as_ref().map_or(0, |l| l.len() as u64 * 8);
            bytes += t.values.as_ref().map_or(0, |v| v.len() as u64 * 4);
            bytes += t
                .label_sets
                .as_ref()
                .map_or(0, |l| l.as_slice().len() as u64);
            bytes += t.splits.as_ref().map_or(0, |s| {
                (s.train.len() + s.valid.len() + s.test.len()) as u64 * 4
            });
        }
        for r in self.relations.iter().filter(|r| r.reverse_of.is_none()) {
            bytes += r.by_dst.heap_bytes() + r.by_src.heap_bytes();
            if let Some(tg) = &r.targets {
                // Both ends, a label and a value per split edge.
                bytes += tg
                    .named()
                    .iter()
                    .map(|(_, e)| e.len() as u64 * 20)
                    .sum::<u64>();
            }
        }
        bytes
    }

    /// Whether reverse relations have been added.
    pub fn has_reverse_relations(&self) -> bool {
        self.relations.iter().any(|r| r.reverse_of.is_some())
    }

    /// Adds `rev_<name>` (dst → src) for every stored relation, sharing the
    /// CSR arrays of the original. Calling it twice changes nothing.
    pub fn add_reverse_relations(&mut self) -> Result<()> {
        if self.has_reverse_relations() {
            return Ok(());
        }
        let mut added = Vec::new();
        for (i, r) in self.relations.iter().enumerate() {
            let name = format!("rev_{}", r.name);
            let canonical = format!(
                "{}__{}__{}",
                self.node_types[r.dst.index()].name,
                name,
                self.node_types[r.src.index()].name
            );
            if self.relations.iter().any(|o| o.canonical == canonical) {
                return Err(GraphError::InvalidArgument(format!(
                    "cannot add reverse relations: '{canonical}' already exists in the graph"
                )));
            }
            added.push(Relation {
                key: hash_str(&canonical),
                canonical,
                name,
                src: r.dst,
                dst: r.src,
                reverse_of: Some(RelationId(i as u32)),
                by_dst: Arc::clone(&r.by_src),
                by_src: Arc::clone(&r.by_dst),
                targets: None,
            });
        }
        self.relations.extend(added);
        self.in_relations = index_in_relations(self.node_types.len(), &self.relations);
        Ok(())
    }

    /// Keeps only the edges `u -> v` of stored relation `r` for which
    /// `keep(u, v)` holds (link prediction's held-out edges leave the graph
    /// this way). Refused once reverse relations exist: they share the arrays.
    pub fn retain_edges(&mut self, r: RelationId, keep: impl Fn(u32, u32) -> bool) -> Result<()> {
        if self.has_reverse_relations() {
            return Err(GraphError::InvalidArgument(
                "edges can only be removed before reverse relations are added".into(),
            ));
        }
        let rel = self
            .relations
            .get_mut(r.index())
            .ok_or_else(|| GraphError::InvalidArgument(format!("no relation {}", r.0)))?;
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        let by_src = &rel.by_src;
        for u in 0..by_src.num_rows() as u32 {
            for &v in by_src.neighbors(u) {
                if keep(u, v) {
                    src.push(u);
                    dst.push(v);
                }
            }
        }
        let (ns, nd) = (by_src.num_rows(), rel.by_dst.num_rows());
        rel.by_dst = Arc::new(Csr::from_edges(nd, &dst, &src));
        rel.by_src = Arc::new(Csr::from_edges(ns, &src, &dst));
        // Its split edges may be gone: the graph is no longer the stored one.
        rel.targets = None;
        Ok(())
    }

    /// Gives stored relation `r` its edge targets (checked by the caller).
    pub(crate) fn set_edge_targets(&mut self, r: RelationId, t: EdgeTargets) {
        self.relations[r.index()].targets = Some(Arc::new(t));
    }

    /// Node types as vertices, relations as links weighted by edge count.
    pub fn metagraph(&self) -> Metagraph {
        Metagraph::new(self)
    }

    /// The schema of the stored graph (added reverse relations excluded).
    pub fn schema(&self) -> Schema {
        Schema {
            name: self.name.clone(),
            target: self.node_types[self.target.index()].name.clone(),
            num_classes: self.num_classes,
            node_types: self
                .node_types
                .iter()
                .map(|t| {
                    let schema = NodeTypeSchema {
                        count: t.count.into(),
                        feature_dim: t.features.as_ref().map(|f| f.dim() as u64),
                    };
                    (t.name.clone(), schema)
                })
                .collect(),
            relations: self
                .relations
                .iter()
                .filter(|r| r.reverse_of.is_none())
                .map(|r| RelationSchema {
                    src: self.node_types[r.src.index()].name.clone(),
                    name: r.name.clone(),
                    dst: self.node_types[r.dst.index()].name.clone(),
                    count: r.num_edges() as u64,
                    num_classes: r.targets.as_ref().and_then(|t| t.num_classes),
                    values: r.targets.as_ref().is_some_and(|t| t.has_values),
                    ..Default::default()
                })
                .collect(),
            values: self.node_types[self.target.index()].values.is_some(),
            label_sets: self.node_types[self.target.index()]
                .label_sets
                .as_ref()
                .map(|l| l.width() as u32),
        }
    }

    /// Assembles a graph from validated parts (used by the loader and the builder).
    pub(crate) fn from_parts(
        schema: &Schema,
        node_types: Vec<NodeType>,
        edges: Vec<(Csr, Csr)>,
    ) -> HetGraph {
        let type_id =
            |name: &str| NodeTypeId(schema.type_index(name).expect("validated schema") as u32);
        let relations: Vec<Relation> = schema
            .relations
            .iter()
            .zip(edges)
            .map(|(r, (by_dst, by_src))| Relation {
                name: r.name.clone(),
                src: type_id(&r.src),
                dst: type_id(&r.dst),
                reverse_of: None,
                key: hash_str(&r.canonical()),
                canonical: r.canonical(),
                by_dst: Arc::new(by_dst),
                by_src: Arc::new(by_src),
                targets: None,
            })
            .collect();
        let in_relations = index_in_relations(node_types.len(), &relations);
        HetGraph {
            name: schema.name.clone(),
            target: type_id(&schema.target),
            num_classes: schema.num_classes,
            node_types,
            relations,
            in_relations,
        }
    }
}

fn index_in_relations(num_types: usize, relations: &[Relation]) -> Vec<Vec<RelationId>> {
    let mut v = vec![Vec::new(); num_types];
    for (i, r) in relations.iter().enumerate() {
        v[r.dst.index()].push(RelationId(i as u32));
    }
    v
}

/// Checks labels are in `-1..num_classes`; returns the problem otherwise.
pub(crate) fn check_labels(labels: &[i64], num_classes: u32) -> std::result::Result<(), String> {
    match labels
        .iter()
        .position(|&l| l < -1 || l >= i64::from(num_classes))
    {
        Some(i) => Err(format!(
            "label {} of node {i} is outside -1..{num_classes}",
            labels[i]
        )),
        None => Ok(()),
    }
}

/// Checks regression targets: one per node, NaN (none) or finite.
pub(crate) fn check_values(values: &[f32], count: u32) -> std::result::Result<(), String> {
    if values.len() != count as usize {
        return Err(format!("{} values for {count} target nodes", values.len()));
    }
    match values.iter().position(|v| v.is_infinite()) {
        Some(i) => Err(format!(
            "the value of node {i} is {}: values must be finite (NaN for none)",
            values[i]
        )),
        None => Ok(()),
    }
}

/// What a node of a split must have: a label, or where the graph has them, a
/// value or a label set.
pub(crate) struct Known<'a> {
    /// Class labels (-1: none).
    pub labels: &'a [i64],
    /// Regression targets (NaN: none).
    pub values: Option<&'a [f32]>,
    /// Multi-label targets.
    pub sets: Option<&'a LabelSets>,
}

impl Known<'_> {
    fn has(&self, i: usize) -> bool {
        self.labels[i] >= 0
            || self.values.is_some_and(|v| !v[i].is_nan())
            || self.sets.is_some_and(|s| s.known(i))
    }

    fn lacks(&self, id: u32) -> String {
        let mut what = vec!["a label (-1)"];
        if self.values.is_some() {
            what.push("a value (NaN)");
        }
        if self.sets.is_some() {
            what.push("a label set (a row of -1)");
        }
        match what.len() {
            1 => format!("node {id} has no label (-1)"),
            2 => format!("node {id} has neither {} nor {}", what[0], what[1]),
            _ => format!("node {id} has none of {}", what.join(", ")),
        }
    }
}

/// Checks one split: ids in range, unique, not in an earlier split, and
/// labelled or, where the graph has regression or multi-label targets,
/// valued or with a label set.
pub(crate) fn check_split(
    ids: &[u32],
    seen: &mut [u8],
    tag: u8,
    known: &Known,
) -> std::result::Result<(), String> {
    for &id in ids {
        let Some(slot) = seen.get_mut(id as usize) else {
            return Err(format!(
                "node id {id} is out of range 0..{}",
                known.labels.len()
            ));
        };
        if *slot == tag {
            return Err(format!("node {id} is listed twice"));
        }
        if *slot != 0 {
            return Err(format!("node {id} is also in another split"));
        }
        *slot = tag;
        if !known.has(id as usize) {
            return Err(known.lacks(id));
        }
    }
    Ok(())
}

/// Builds a [`HetGraph`] in memory, with the same validation as the loader.
#[derive(Default)]
pub struct GraphBuilder {
    schema: Option<Schema>,
    types: Vec<NodeType>,
    edges: Vec<(Vec<u32>, Vec<u32>)>,
    bits: Option<Vec<i8>>,
}

impl GraphBuilder {
    /// Starts a graph whose labelled type will be `target`.
    pub fn new(name: &str, target: &str, num_classes: u32) -> GraphBuilder {
        GraphBuilder {
            schema: Some(Schema {
                name: name.into(),
                target: target.into(),
                num_classes,
                node_types: Vec::new(),
                relations: Vec::new(),
                values: false,
                label_sets: None,
            }),
            types: Vec::new(),
            edges: Vec::new(),
            bits: None,
        }
    }

    fn schema(&mut self) -> &mut Schema {
        self.schema.as_mut().expect("builder used after build")
    }

    /// Adds a node type; `features` must have `count` rows.
    pub fn node_type(mut self, name: &str, count: u32, features: Option<Features>) -> Self {
        let feature_dim = features.as_ref().map(|f| f.dim() as u64);
        self.schema().node_types.push((
            name.into(),
            NodeTypeSchema {
                count: count.into(),
                feature_dim,
            },
        ));
        self.types.push(NodeType {
            name: name.into(),
            count,
            features,
            labels: None,
            values: None,
            label_sets: None,
            splits: None,
        });
        self
    }

    /// Sets the target type's labels and splits.
    pub fn labels(mut self, labels: Vec<i64>, splits: Splits) -> Self {
        let target = self.schema().target.clone();
        if let Some(t) = self.types.iter_mut().find(|t| t.name == target) {
            t.labels = Some(labels);
            t.splits = Some(splits);
        }
        self
    }

    /// Sets the target type's regression targets (NaN = none).
    pub fn values(mut self, values: Vec<f32>) -> Self {
        let target = self.schema().target.clone();
        self.schema().values = true;
        if let Some(t) = self.types.iter_mut().find(|t| t.name == target) {
            t.values = Some(values);
        }
        self
    }

    /// Sets the target type's multi-label targets: `width` labels per node,
    /// rows of 0/1 (or all -1 for none), node after node.
    pub fn label_sets(mut self, width: u32, bits: Vec<i8>) -> Self {
        self.schema().label_sets = Some(width);
        self.bits = Some(bits);
        self
    }

    /// Adds a relation with edges `src[i] -> dst[i]`.
    pub fn relation(
        mut self,
        src: &str,
        name: &str,
        dst: &str,
        src_ids: Vec<u32>,
        dst_ids: Vec<u32>,
    ) -> Self {
        let count = src_ids.len() as u64;
        self.schema().relations.push(RelationSchema {
            src: src.into(),
            name: name.into(),
            dst: dst.into(),
            count,
            ..Default::default()
        });
        self.edges.push((src_ids, dst_ids));
        self
    }

    /// Validates and builds.
    pub fn build(mut self) -> Result<HetGraph> {
        let schema = self.schema.take().expect("builder used after build");
        schema
            .validate()
            .map_err(|e| GraphError::InvalidArgument(e.0))?;
        let bad = GraphError::InvalidArgument;
        for t in &self.types {
            if u64::from(t.count) > MAX_NODES {
                return Err(bad(format!("node type '{}' has too many nodes", t.name)));
            }
            if let Some(f) = &t.features {
                if f.rows() != t.count as usize {
                    return Err(bad(format!(
                        "node type '{}': {} feature rows for {} nodes",
                        t.name,
                        f.rows(),
                        t.count
                    )));
                }
            }
        }
        let target = schema.type_index(&schema.target).expect("validated");
        let t = &self.types[target];
        let (Some(labels), Some(splits)) = (&t.labels, &t.splits) else {
            return Err(bad(format!(
                "target type '{}' needs labels and splits",
                t.name
            )));
        };
        if labels.len() != t.count as usize {
            return Err(bad(format!(
                "{} labels for {} target nodes",
                labels.len(),
                t.count
            )));
        }
        check_labels(labels, schema.num_classes).map_err(bad)?;
        if let Some(v) = &t.values {
            check_values(v, t.count).map_err(bad)?;
        }
        let sets = match (schema.label_sets, self.bits.take()) {
            (Some(w), Some(bits)) => {
                Some(LabelSets::new(w as usize, t.count as usize, bits).map_err(|e| bad(e.0))?)
            }
            _ => None,
        };
        let known = Known {
            labels,
            values: t.values.as_deref(),
            sets: sets.as_ref(),
        };
        let mut seen = vec![0u8; t.count as usize];
        for (tag, (name, ids)) in splits.named().into_iter().enumerate() {
            check_split(ids, &mut seen, tag as u8 + 1, &known)
                .map_err(|p| bad(format!("{name} split: {p}")))?;
        }
        self.types[target].label_sets = sets;
        let mut csrs = Vec::new();
        for (r, (src, dst)) in schema.relations.iter().zip(&self.edges) {
            if src.len() != dst.len() {
                return Err(bad(format!(
                    "relation '{}': {} sources, {} destinations",
                    r.canonical(),
                    src.len(),
                    dst.len()
                )));
            }
            let (ns, nd) = (
                self.types[schema.type_index(&r.src).expect("validated")].count,
                self.types[schema.type_index(&r.dst).expect("validated")].count,
            );
            if let Some(&v) = src.iter().find(|&&v| v >= ns) {
                return Err(bad(format!(
                    "relation '{}': source id {v} out of range 0..{ns}",
                    r.canonical()
                )));
            }
            if let Some(&v) = dst.iter().find(|&&v| v >= nd) {
                return Err(bad(format!(
                    "relation '{}': destination id {v} out of range 0..{nd}",
                    r.canonical()
                )));
            }
            csrs.push((
                Csr::from_edges(nd as usize, dst, src),
                Csr::from_edges(ns as usize, src, dst),
            ));
        }
        Ok(HetGraph::from_parts(&schema, self.types, csrs))
    }
}
