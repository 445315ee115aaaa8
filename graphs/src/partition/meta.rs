//! Meta-partitioning (Heta §4): partitions by relation rather than by node.
//!
//! 1. The metatree: BFS from the target type over the metagraph to the model's
//!    depth; a vertex of type `t` gets one child per relation into `t` (its
//!    source type), as neighborhood sampling walks it, and a self child of
//!    type `t`: the layers' self-loops read a node's own previous-layer row,
//!    which needs every relation into `t` one layer down.
//! 2. One sub-metatree per child of the root (the root included), weighted by
//!    the node counts of its vertices plus the edge counts of its links.
//! 3. Sub-metatrees go to partitions by longest-processing-time first; with
//!    more partitions than sub-metatrees the heaviest (per replica) are
//!    replicated, and replicas split the target nodes data-parallel.
//! 4. Relations repeated within a partition are kept once.
//!
//! Every partition holds all target nodes and aggregates only over its own
//! relations, so the only boundary nodes are target nodes.

use std::collections::BTreeSet;

use crate::ids::{NodeTypeId, RelationId};
use crate::metagraph::Metagraph;

/// A vertex of the metatree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeVertex {
    /// Its node type.
    pub ntype: NodeTypeId,
    /// Hops from the root (0 for the root).
    pub depth: usize,
    /// Parent vertex (`None` for the root).
    pub parent: Option<usize>,
    /// The relation from this vertex's type into its parent's; `None` for the
    /// root and for self children (the self-loop: the parent node's own row).
    pub via: Option<RelationId>,
}

/// The computation tree of a `depth`-layer model rooted at the target type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metatree {
    /// Vertices in BFS order; vertex 0 is the root.
    pub vertices: Vec<TreeVertex>,
    /// Its depth (model layers).
    pub depth: usize,
}

/// Builds the metatree by BFS from `root` to `depth` hops.
pub fn metatree(m: &Metagraph, root: NodeTypeId, depth: usize) -> Metatree {
    metatree_within(m, root, depth, None)
}

/// Like [`metatree`], following at model layer `l` only the relations in
/// `allowed[l]` (when given): the metatree of metapaths ([`allowed_per_layer`]).
pub fn metatree_within(
    m: &Metagraph,
    root: NodeTypeId,
    depth: usize,
    allowed: Option<&[BTreeSet<RelationId>]>,
) -> Metatree {
    let mut vertices = vec![TreeVertex {
        ntype: root,
        depth: 0,
        parent: None,
        via: None,
    }];
    let mut i = 0;
    while i < vertices.len() {
        let v = vertices[i].clone();
        if v.depth < depth {
            // A child at depth d + 1 feeds model layer depth - d - 1.
            let layer = depth - v.depth - 1;
            for l in m.incoming(v.ntype).filter(|l| {
                allowed.is_none_or(|a| a.get(layer).is_some_and(|s| s.contains(&l.relation)))
            }) {
                vertices.push(TreeVertex {
                    ntype: l.src,
                    depth: v.depth + 1,
                    parent: Some(i),
                    via: Some(l.relation),
                });
            }
            vertices.push(TreeVertex {
                ntype: v.ntype,
                depth: v.depth + 1,
                parent: Some(i),
                via: None,
            });
        }
        i += 1;
    }
    Metatree { vertices, depth }
}

/// Bytes a metatree vertex costs in all (the vertex, its link in a
/// sub-metatree, its share of the assignment): a generous bound.
const METATREE_VERTEX_BYTES: u128 = 256;

/// The number of vertices [`metatree_within`] would build, counted per
/// (depth, node type) without building it: it grows as the relations per
/// type to the power of the depth.
pub fn metatree_size(
    m: &Metagraph,
    root: NodeTypeId,
    depth: usize,
    allowed: Option<&[BTreeSet<RelationId>]>,
) -> u128 {
    let types = m.types.len();
    let mut level = vec![0u128; types];
    level[root.0 as usize] = 1;
    let mut total: u128 = 1;
    for d in 0..depth {
        let layer = depth - d - 1;
        let mut next = vec![0u128; types];
        for (t, &n) in level.iter().enumerate().filter(|(_, &n)| n > 0) {
            for l in m.incoming(NodeTypeId(t as u32)).filter(|l| {
                allowed.is_none_or(|a| a.get(layer).is_some_and(|s| s.contains(&l.relation)))
            }) {
                next[l.src.0 as usize] = next[l.src.0 as usize].saturating_add(n);
            }
            next[t] = next[t].saturating_add(n);
        }
        total = next.iter().fold(total, |a, &n| a.saturating_add(n));
        level = next;
    }
    total
}

/// One child of the root with all its descendants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubMetatree {
    /// The child vertex of the root it starts at.
    pub child: usize,
    /// `(model layer, relation)` of every link, in BFS order (duplicates kept).
    pub links: Vec<(usize, RelationId)>,
    /// Node types of its vertices, the root's included.
    pub types: BTreeSet<NodeTypeId>,
    /// Node counts of its vertices plus edge counts of its links (self
    /// vertices add nothing: their nodes are their parent's).
    pub weight: u64,
    /// Whether it is the root's self sub-metatree: the target nodes' own
    /// previous-layer rows, which the reducer's cross-relation step reads.
    pub self_loop: bool,
    /// Edge count of each link (parallel to `links`).
    pub link_weights: Vec<u64>,
}

impl Metatree {
    /// The sub-metatrees, one per child of the root, in child order.
    pub fn split(&self, m: &Metagraph) -> Vec<SubMetatree> {
        let root = &self.vertices[0];
        let mut subs: Vec<SubMetatree> = Vec::new();
        // The sub-metatree each vertex belongs to (by its ancestor at depth 1).
        let mut owner = vec![usize::MAX; self.vertices.len()];
        for (i, v) in self.vertices.iter().enumerate().skip(1) {
            let Some(p) = v.parent else { continue };
            let s = if p == 0 {
                subs.push(SubMetatree {
                    child: i,
                    links: Vec::new(),
                    types: BTreeSet::from([root.ntype]),
                    weight: m.type_weights[root.ntype.index()],
                    self_loop: v.via.is_none(),
                    link_weights: Vec::new(),
                });
                subs.len() - 1
            } else {
                owner[p]
            };
            owner[i] = s;
            let sub = &mut subs[s];
            let Some(rel) = v.via else { continue };
            // A link at depth d feeds model layer depth - d (hop 1 feeds the last layer).
            let w = m.links[rel.0 as usize].weight;
            sub.links.push((self.depth - v.depth, rel));
            sub.link_weights.push(w);
            sub.types.insert(v.ntype);
            sub.weight += m.type_weights[v.ntype.index()] + w;
        }
        subs
    }
}

/// One meta-partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaPart {
    /// Indices of its sub-metatrees.
    pub subtrees: Vec<usize>,
    /// `(replica, replicas)`: which share of the target nodes it trains when
    /// its (single) sub-metatree is replicated; `(0, 1)` otherwise.
    pub replica: (usize, usize),
    /// Whether it holds the root's self sub-metatree: the partition that
    /// computes the target nodes' own rows and hosts the reducer.
    pub reducer: bool,
    /// Its relations, each once.
    pub relations: BTreeSet<RelationId>,
    /// Relations per model layer (the sampler's filter).
    pub per_layer: Vec<Vec<RelationId>>,
    /// Node types it holds.
    pub types: BTreeSet<NodeTypeId>,
    /// Sum of its sub-metatrees' weights (a shared relation or type counted once).
    pub load: u64,
}

impl MetaPart {
    /// What adding sub-metatree `s` would add to the load: its links and
    /// types this partition does not hold yet.
    fn marginal(&self, m: &Metagraph, s: &SubMetatree) -> u64 {
        let links: u64 = s
            .links
            .iter()
            .zip(&s.link_weights)
            .filter(|((l, r), _)| !self.per_layer[*l].contains(r))
            .map(|(_, w)| w)
            .sum();
        let types: u64 = s
            .types
            .iter()
            .filter(|t| !self.types.contains(t))
            .map(|t| m.type_weights[t.index()])
            .sum();
        links + types
    }

    fn add(&mut self, s: usize, sub: &SubMetatree) {
        self.subtrees.push(s);
        self.reducer |= sub.self_loop;
        for &(layer, rel) in &sub.links {
            self.relations.insert(rel);
            if !self.per_layer[layer].contains(&rel) {
                self.per_layer[layer].push(rel);
            }
        }
        self.types.extend(sub.types.iter().copied());
    }
}

/// Assigns sub-metatrees to `parts` partitions by LPT, replicating when there
/// are fewer sub-metatrees than partitions. The root's self sub-metatree
/// shares most of its relations with the sub-metatrees of relations from the
/// target type into itself, so it joins the partition it adds least to (or
/// gets one of its own when there are more partitions than other sub-metatrees).
pub fn assign(m: &Metagraph, subs: &[SubMetatree], parts: usize, layers: usize) -> Vec<MetaPart> {
    let empty = |replica| MetaPart {
        subtrees: Vec::new(),
        replica,
        reducer: false,
        relations: BTreeSet::new(),
        per_layer: vec![Vec::new(); layers],
        types: BTreeSet::new(),
        load: 0,
    };
    let rel_subs: Vec<usize> = (0..subs.len()).filter(|&s| !subs[s].self_loop).collect();
    let self_sub = (0..subs.len()).find(|&s| subs[s].self_loop);
    let mut out: Vec<MetaPart> = Vec::new();
    if rel_subs.is_empty() || parts == 0 {
        return out;
    }
    let n = rel_subs.len();
    // With a partition to spare, the self sub-metatree gets its own (so the
    // reducer's partition is never a replica).
    let alone = self_sub.is_some() && parts > n;
    let rel_parts = if alone { parts - 1 } else { parts };
    if rel_parts <= n {
        let mut order = rel_subs.clone();
        order.sort_by(|&a, &b| subs[b].weight.cmp(&subs[a].weight).then(a.cmp(&b)));
        out = (0..rel_parts).map(|_| empty((0, 1))).collect();
        for s in order {
            let k = (0..rel_parts)
                .min_by_key(|&k| (out[k].load, k))
                .expect("parts > 0");
            out[k].load += out[k].marginal(m, &subs[s]);
            out[k].add(s, &subs[s]);
        }
    } else {
        // Give the next replica to the sub-metatree with the most weight per replica.
        let mut replicas = vec![1usize; n];
        for _ in n..rel_parts {
            let i = (0..n)
                .max_by(|&a, &b| {
                    (subs[rel_subs[a]].weight * replicas[b] as u64)
                        .cmp(&(subs[rel_subs[b]].weight * replicas[a] as u64))
                        .then(b.cmp(&a))
                })
                .expect("subs non-empty");
            replicas[i] += 1;
        }
        for (i, &r) in replicas.iter().enumerate() {
            let s = rel_subs[i];
            for j in 0..r {
                let mut p = empty((j, r));
                p.load = subs[s].weight;
                p.add(s, &subs[s]);
                out.push(p);
            }
        }
    }
    if let Some(s) = self_sub {
        let k = if alone {
            out.push(empty((0, 1)));
            out.len() - 1
        } else {
            (0..out.len())
                .min_by_key(|&k| (out[k].load + out[k].marginal(m, &subs[s]), k))
                .expect("parts > 0")
        };
        out[k].load += out[k].marginal(m, &subs[s]);
        out[k].add(s, &subs[s]);
    }
    for p in &mut out {
        p.subtrees.sort_unstable();
        for l in &mut p.per_layer {
            l.sort_unstable();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metagraph::MetaLink;

    /// ogbn-mag's metagraph with reverse relations: P=0, A=1, I=2, F=3.
    fn mag() -> Metagraph {
        let link = |i: u32, name: &str, src: u32, dst: u32, weight: u64| MetaLink {
            relation: RelationId(i),
            name: name.into(),
            src: NodeTypeId(src),
            dst: NodeTypeId(dst),
            weight,
        };
        Metagraph {
            types: vec![
                "paper".into(),
                "author".into(),
                "institution".into(),
                "field".into(),
            ],
            type_weights: vec![736, 1134, 9, 60],
            links: vec![
                link(0, "writes", 1, 0, 7145),
                link(1, "affiliated_with", 1, 2, 1043),
                link(2, "cites", 0, 0, 5416),
                link(3, "has_topic", 0, 3, 7505),
                link(4, "rev_writes", 0, 1, 7145),
                link(5, "rev_affiliated_with", 2, 1, 1043),
                link(6, "rev_cites", 0, 0, 5416),
                link(7, "rev_has_topic", 3, 0, 7505),
            ],
        }
    }

    #[test]
    fn the_mag_metatree_has_a_sub_metatree_per_relation_into_the_target() {
        let m = mag();
        let t = metatree(&m, NodeTypeId(0), 2);
        // Into paper: writes (A), cites (P), rev_cites (P), rev_has_topic (F), and the self-loop.
        let subs = t.split(&m);
        assert_eq!(subs.len(), 5);
        let via: Vec<Option<RelationId>> = subs.iter().map(|s| t.vertices[s.child].via).collect();
        assert_eq!(
            via,
            vec![
                Some(RelationId(0)),
                Some(RelationId(2)),
                Some(RelationId(6)),
                Some(RelationId(7)),
                None
            ]
        );
        assert_eq!(
            subs.iter().map(|s| s.self_loop).collect::<Vec<_>>(),
            vec![false, false, false, false, true]
        );
        // The author branch: writes at layer 1, then into author (rev_writes, rev_affiliated_with) at layer 0.
        assert_eq!(
            subs[0].links,
            vec![(1, RelationId(0)), (0, RelationId(4)), (0, RelationId(5))]
        );
        // The self branch: every relation into paper at layer 0 (the seeds' own previous-layer rows).
        assert_eq!(
            subs[4].links,
            vec![
                (0, RelationId(0)),
                (0, RelationId(2)),
                (0, RelationId(6)),
                (0, RelationId(7))
            ]
        );
        // Three layers: an author at depth 1 has a self child whose children are the relations into author at layer 0.
        let t3 = metatree(&m, NodeTypeId(0), 3);
        assert_eq!(
            metatree_size(&m, NodeTypeId(0), 3, None),
            t3.vertices.len() as u128
        );
        assert_eq!(
            metatree_size(&m, NodeTypeId(0), 2, None),
            metatree(&m, NodeTypeId(0), 2).vertices.len() as u128
        );
        let s3 = t3.split(&m);
        assert!(
            s3[0].links.contains(&(0, RelationId(4))) && s3[0].links.contains(&(1, RelationId(4))),
            "{:?}",
            s3[0].links
        );
        assert_eq!(
            subs[0].types,
            BTreeSet::from([NodeTypeId(0), NodeTypeId(1), NodeTypeId(2)])
        );
        assert_eq!(
            subs[0].weight,
            736 + (1134 + 7145) + (736 + 7145) + (9 + 1043)
        );
        assert!(t.vertices.iter().all(|v| v.depth <= 2));
    }

    #[test]
    fn lpt_balances_and_deduplicates_and_replicates_past_the_sub_metatree_count() {
        let m = mag();
        let t = metatree(&m, NodeTypeId(0), 2);
        let subs = t.split(&m);
        let parts = assign(&m, &subs, 2, 2);
        assert_eq!(parts.len(), 2);
        let mut all: Vec<usize> = parts.iter().flat_map(|p| p.subtrees.clone()).collect();
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3, 4], "every sub-metatree placed once");
        // The self sub-metatree joins a partition holding a paper branch (it adds no relation there).
        let r: Vec<&MetaPart> = parts.iter().filter(|p| p.reducer).collect();
        assert_eq!(r.len(), 1);
        assert!(
            r[0].subtrees.contains(&1) || r[0].subtrees.contains(&2),
            "{:?}",
            r[0].subtrees
        );
        // LPT bound: the largest load is at most the optimum + the largest item; here also at most 4/3 of the mean.
        let total: u64 = subs.iter().filter(|s| !s.self_loop).map(|s| s.weight).sum();
        let max = parts.iter().map(|p| p.load).max().unwrap();
        assert!(
            max as f64 <= total as f64 / 2.0 * 4.0 / 3.0,
            "{max} of {total}"
        );
        for p in &parts {
            // Every partition holds the target type, and each relation once per layer.
            assert!(p.types.contains(&NodeTypeId(0)));
            for l in &p.per_layer {
                let set: BTreeSet<_> = l.iter().collect();
                assert_eq!(set.len(), l.len());
            }
        }
        // Six partitions for four sub-metatrees: the two heaviest get a second replica.
        // Five partitions: each sub-metatree alone, the self one included.
        let five = assign(&m, &subs, 5, 2);
        assert_eq!(five.len(), 5);
        assert!(
            five[4].reducer
                && five[4].subtrees == vec![4]
                && five[..4]
                    .iter()
                    .all(|p| !p.reducer && p.subtrees.len() == 1)
        );
        // Seven: the self sub-metatree alone, and the two heaviest others get a second replica.
        let seven = assign(&m, &subs, 7, 2);
        assert_eq!(seven.len(), 7);
        assert!(
            seven[6].reducer
                && seven[6].subtrees == vec![4]
                && seven[..6].iter().all(|p| !p.reducer)
        );
        let mut by_weight: Vec<usize> = (0..4).collect();
        by_weight.sort_by_key(|&s| std::cmp::Reverse(subs[s].weight));
        for &s in &by_weight[..2] {
            let reps: Vec<_> = seven
                .iter()
                .filter(|p| p.subtrees.first() == Some(&s))
                .map(|p| p.replica)
                .collect();
            assert_eq!(reps, vec![(0, 2), (1, 2)]);
        }
        assert!(assign(&m, &subs, 0, 2).is_empty());
    }
}

/// What `manifest.json` of a meta-partition directory says.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaManifest {
    /// Layout version.
    pub format: u32,
    /// Always "meta".
    pub method: String,
    /// Name of the partitioned graph.
    pub graph: String,
    /// Model depth the metatree was built for.
    pub layers: usize,
    /// Whether reverse relations were part of the metagraph.
    pub reverse_edges: bool,
    /// The metapaths the metatree was built from (empty: BFS over every relation).
    #[serde(default)]
    pub metapaths: Vec<Vec<String>>,
    /// Number of partitions.
    pub parts: usize,
    /// The content of the graph partitioned ([`crate::fingerprint::content`];
    /// absent where not given and in directories written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_sha256: Option<String>,
    /// Checksum of every file of the directory the manifest covers (relative
    /// path; [`crate::fingerprint::checksum`], SHA-256 in directories written
    /// before 2026-12-06; empty in older ones).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub files: std::collections::BTreeMap<String, String>,
    /// SHA-256 of the manifest's JSON with this field empty: an edited
    /// manifest is refused (a check against edits, not a signature).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub seal: String,
    /// Per partition.
    pub info: Vec<MetaPartInfo>,
}

impl crate::seal::Sealed for MetaManifest {
    fn seal_field(&mut self) -> &mut String {
        &mut self.seal
    }
}

/// One meta-partition's report.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaPartInfo {
    /// Sub-metatrees (by the relation from the root's child into the target).
    pub subtrees: Vec<String>,
    /// `[replica, replicas]` of the target nodes it trains.
    pub replica: [usize; 2],
    /// Whether it holds the root's self sub-metatree (and hosts the reducer).
    #[serde(default)]
    pub reducer: bool,
    /// Canonical names of its relations (each once).
    pub relations: Vec<String>,
    /// Relations per model layer.
    pub per_layer: Vec<Vec<String>>,
    /// Nodes per type it holds (all nodes of each type it touches).
    pub nodes: std::collections::BTreeMap<String, u64>,
    /// Edges per relation it holds.
    pub edges: std::collections::BTreeMap<String, u64>,
    /// Nodes whose results combine with other partitions' (target nodes only).
    pub boundary_nodes: u64,
    /// Sum of its sub-metatrees' weights.
    pub load: u64,
}

/// Reads metapaths: one per line, relation names (canonical `src__name__dst`,
/// or the plain name where it is unique) separated by spaces or commas, from
/// the target type outward; `#` starts a comment. Each path's first relation
/// leads into the target type and each next one into the previous one's
/// source type; a path has at most `layers` relations.
pub fn parse_metapaths(
    text: &str,
    g: &crate::HetGraph,
    layers: usize,
) -> crate::Result<Vec<Vec<RelationId>>> {
    use crate::error::GraphError;
    let bad = |line: usize, why: String| {
        GraphError::InvalidArgument(format!("metapaths line {line}: {why}"))
    };
    let mut paths = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let body = line.split('#').next().unwrap_or("");
        let names: Vec<&str> = body
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .collect();
        if names.is_empty() {
            continue;
        }
        if names.len() > layers {
            return Err(bad(
                line_no,
                format!("{} relations for a {layers}-layer model", names.len()),
            ));
        }
        let mut path = Vec::new();
        let mut into = g.target();
        for name in names {
            let r = match g.relation_id(name) {
                Some(r) => r,
                None => {
                    let matches: Vec<RelationId> = (0..g.relations().len() as u32)
                        .map(RelationId)
                        .filter(|&r| g.relation(r).name == name)
                        .collect();
                    match matches.as_slice() {
                        [r] => *r,
                        [] => return Err(bad(line_no, format!("no relation named {name}"))),
                        _ => {
                            return Err(bad(
                                line_no,
                                format!("{name} names several relations: use src__{name}__dst"),
                            ))
                        }
                    }
                }
            };
            let rel = g.relation(r);
            if rel.dst != into {
                return Err(bad(
                    line_no,
                    format!(
                        "{} leads into {}, not {}",
                        rel.canonical(),
                        g.node_type(rel.dst).name,
                        g.node_type(into).name
                    ),
                ));
            }
            into = rel.src;
            path.push(r);
        }
        paths.push(path);
    }
    if paths.is_empty() {
        return Err(GraphError::InvalidArgument(
            "metapaths: no path given".into(),
        ));
    }
    Ok(paths)
}

/// The relations metapaths allow at each model layer (a path's i-th relation feeds layer `layers - 1 - i`).
pub fn allowed_per_layer(paths: &[Vec<RelationId>], layers: usize) -> Vec<BTreeSet<RelationId>> {
    let mut out = vec![BTreeSet::new(); layers];
    for p in paths {
        for (i, &r) in p.iter().enumerate() {
            if let Some(l) = layers.checked_sub(i + 1) {
                out[l].insert(r);
            }
        }
    }
    out
}

/// Meta-partitions `g` (loaded with the reverse relations the model will use)
/// for a `layers`-deep model into `parts`, writes them to `out` and returns
/// the manifest. Each `part<k>/` is a graph directory holding the original
/// relations behind its relations (a reverse relation is stored as the
/// original, added back at load) and the features of its node types.
pub fn write(
    g: &crate::HetGraph,
    layers: usize,
    parts: usize,
    out: &std::path::Path,
    overwrite: bool,
    progress: &mut dyn crate::Progress,
) -> crate::Result<MetaManifest> {
    let opts = MetaOptions {
        layers,
        parts,
        metapaths: None,
        graph_sha256: None,
        overwrite,
    };
    write_metapaths(g, &opts, out, progress)
}

/// How [`write_metapaths`] cuts and writes.
#[derive(Clone, Copy, Debug)]
pub struct MetaOptions<'a> {
    /// Model depth.
    pub layers: usize,
    /// Partitions.
    pub parts: usize,
    /// The metapaths to build the metatree from ([`parse_metapaths`];
    /// `None`: BFS over every relation).
    pub metapaths: Option<&'a [Vec<RelationId>]>,
    /// The content of the graph's directory, recorded so that training
    /// refuses another graph's.
    pub graph_sha256: Option<&'a str>,
    /// Replace an existing output directory.
    pub overwrite: bool,
}

/// [`write()`] with the metatree built from `metapaths` ([`parse_metapaths`]):
/// at each layer only the relations some path takes there (and the
/// self-loops' chains through them). Training on these partitions trains
/// that restricted model.
pub fn write_metapaths(
    g: &crate::HetGraph,
    opts: &MetaOptions,
    out: &std::path::Path,
    progress: &mut dyn crate::Progress,
) -> crate::Result<MetaManifest> {
    let MetaOptions {
        layers,
        parts,
        metapaths,
        graph_sha256,
        overwrite,
    } = *opts;
    use crate::error::GraphError;
    use crate::format::AtomicDir;
    if parts == 0 || parts > super::MAX_PARTS {
        return Err(GraphError::InvalidArgument(format!(
            "--parts must be in 1..={}, got {parts}",
            super::MAX_PARTS
        )));
    }
    if layers == 0 {
        return Err(GraphError::InvalidArgument(
            "--layers must be at least 1".into(),
        ));
    }
    let m = g.metagraph();
    let allowed = metapaths.map(|p| allowed_per_layer(p, layers));
    let size = metatree_size(&m, g.target(), layers, allowed.as_deref());
    crate::memory::check_fits(
        &format!("the {layers}-layer metatree ({size} vertices)"),
        size.saturating_mul(METATREE_VERTEX_BYTES),
    )
    .map_err(|e| GraphError::InvalidArgument(format!("--layers {layers}: {e}")))?;
    let tree = metatree_within(&m, g.target(), layers, allowed.as_deref());
    let subs = tree.split(&m);
    if subs.iter().all(|s| s.self_loop) {
        return Err(GraphError::InvalidArgument(
            "no relation leads into the target type: nothing to partition".into(),
        ));
    }
    let assigned = assign(&m, &subs, parts, layers);
    let name = |r: RelationId| g.relation(r).canonical().to_string();
    let original = |r: RelationId| g.relation(r).reverse_of.unwrap_or(r);
    let dir = AtomicDir::create(out, overwrite)?;
    let mut info = Vec::new();
    progress.start("writing meta-partitions", assigned.len() as u64);
    for (k, p) in assigned.iter().enumerate() {
        let pdir = dir.path().join(format!("part{k}"));
        let keep: BTreeSet<RelationId> = p.relations.iter().map(|&r| original(r)).collect();
        let held = |t: usize| p.types.contains(&NodeTypeId(t as u32));
        super::graph_dir::write(
            g,
            &pdir,
            |ri, _, _| keep.contains(&RelationId(ri as u32)),
            |t, _| held(t),
        )?;
        let edges = p
            .relations
            .iter()
            .map(|&r| (name(r), g.relation(r).num_edges() as u64))
            .collect();
        let nodes = g
            .node_types()
            .iter()
            .enumerate()
            .filter(|(t, _)| held(*t))
            .map(|(_, nt)| (nt.name.clone(), u64::from(nt.count)))
            .collect();
        info.push(MetaPartInfo {
            subtrees: p
                .subtrees
                .iter()
                .map(|&s| {
                    tree.vertices[subs[s].child]
                        .via
                        .map_or_else(|| "self".to_string(), name)
                })
                .collect(),
            reducer: p.reducer,
            replica: [p.replica.0, p.replica.1],
            relations: p.relations.iter().map(|&r| name(r)).collect(),
            per_layer: p
                .per_layer
                .iter()
                .map(|l| l.iter().map(|&r| name(r)).collect())
                .collect(),
            nodes,
            edges,
            boundary_nodes: u64::from(g.node_type(g.target()).count),
            load: p.load,
        });
        progress.advance(1);
    }
    progress.finish();
    let metapaths = metapaths
        .map(|ps| {
            ps.iter()
                .map(|p| p.iter().map(|&r| name(r)).collect())
                .collect()
        })
        .unwrap_or_default();
    let manifest = MetaManifest {
        format: 1,
        method: "meta".into(),
        graph: g.name().to_string(),
        layers,
        reverse_edges: g.has_reverse_relations(),
        metapaths,
        parts: assigned.len(),
        graph_sha256: graph_sha256.map(str::to_string),
        files: super::set::cover(dir.path())?,
        seal: String::new(),
        info,
    };
    super::set::write_sealed(dir.path(), manifest.clone())?;
    dir.commit()?;
    Ok(manifest)
}

/// A meta-partition directory opened for training.
#[derive(Clone, Debug)]
pub struct MetaSet {
    /// The directory.
    pub dir: std::path::PathBuf,
    /// Its manifest.
    pub manifest: MetaManifest,
}

impl MetaSet {
    /// [`MetaSet::open`], and when a graph directory `data` is named too,
    /// refuses meta-partitions cut from a graph of other content.
    pub fn open_for(
        dir: &std::path::Path,
        data: Option<&std::path::Path>,
    ) -> crate::Result<MetaSet> {
        let set = MetaSet::open(dir)?;
        super::set::check_source(dir, set.manifest.graph_sha256.as_deref(), data)?;
        Ok(set)
    }

    /// Reads and checks `dir/manifest.json`.
    pub fn open(dir: &std::path::Path) -> crate::Result<MetaSet> {
        use crate::error::GraphError;
        crate::input::dir(dir, "a partition directory")?;
        let mpath = dir.join("manifest.json");
        let text = crate::input::read_text(&mpath)?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| GraphError::data(&mpath, e.to_string()))?;
        if value["method"] != "meta" {
            return Err(GraphError::data(&mpath, "these are edge-cut partitions (by node): mode = \"raf\" needs meta-partitions (hetgnn partition --method meta)"));
        }
        let manifest: MetaManifest =
            serde_json::from_value(value).map_err(|e| GraphError::data(&mpath, e.to_string()))?;
        super::set::verify_sealed(dir, manifest.clone(), &manifest.files)?;
        if manifest.format != 1 {
            return Err(GraphError::data(
                &mpath,
                format!("format {} is not the supported 1", manifest.format),
            ));
        }
        if manifest.parts == 0
            || manifest.parts > super::MAX_PARTS
            || manifest.info.len() != manifest.parts
        {
            return Err(GraphError::data(
                &mpath,
                format!(
                    "parts = {} but {} partition entries",
                    manifest.parts,
                    manifest.info.len()
                ),
            ));
        }
        if manifest.info.iter().filter(|p| p.reducer).count() != 1 {
            return Err(GraphError::data(&mpath, "no partition (or more than one) holds the self sub-metatree: written by an older hetgnn, run hetgnn partition --method meta again"));
        }
        // Replicas: the reducer's partition is never one, and each replicated
        // sub-metatree has every replica 0..r, all with the same relations.
        for (k, p) in manifest.info.iter().enumerate() {
            let [j, r] = p.replica;
            let bad = r == 0
                || j >= r
                || (p.reducer && r != 1)
                || (r > 1
                    && (0..r).any(|i| {
                        manifest
                            .info
                            .iter()
                            .filter(|q| {
                                q.replica == [i, r]
                                    && q.subtrees == p.subtrees
                                    && q.per_layer == p.per_layer
                            })
                            .count()
                            != 1
                    }));
            if bad {
                return Err(GraphError::data(
                    &mpath,
                    format!("partition {k}: replica {j} of {r} does not fit the others (replicas of a sub-metatree: one each of 0..r, the same relations; never the reducer's)"),
                ));
            }
        }
        if let Some(p) = manifest
            .info
            .iter()
            .find(|p| p.per_layer.len() != manifest.layers)
        {
            return Err(GraphError::data(
                &mpath,
                format!(
                    "a partition lists relations for {} layers, the manifest says {}",
                    p.per_layer.len(),
                    manifest.layers
                ),
            ));
        }
        Ok(MetaSet {
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    /// The partition that hosts the reducer.
    pub fn reducer(&self) -> usize {
        self.manifest
            .info
            .iter()
            .position(|p| p.reducer)
            .unwrap_or(0)
    }

    /// Loads partition `k` (global ids; only its relations have edges).
    pub fn load_part(&self, k: usize, opts: &crate::LoadOptions) -> crate::Result<crate::HetGraph> {
        use crate::error::GraphError;
        if k >= self.manifest.parts {
            return Err(GraphError::InvalidArgument(format!(
                "partition {k} does not exist (0..{})",
                self.manifest.parts
            )));
        }
        if opts.reverse_edges != self.manifest.reverse_edges {
            return Err(GraphError::InvalidArgument(format!("the meta-partitions were built with reverse_edges = {}; train with the same setting (or partition again)", self.manifest.reverse_edges)));
        }
        crate::load(&self.dir.join(format!("part{k}")), opts)
    }

    /// Partition `k`'s relations per model layer, as ids of `g` (any of its partitions).
    pub fn per_layer(&self, k: usize, g: &crate::HetGraph) -> crate::Result<Vec<Vec<RelationId>>> {
        use crate::error::GraphError;
        let info =
            self.manifest.info.get(k).ok_or_else(|| {
                GraphError::InvalidArgument(format!("partition {k} does not exist"))
            })?;
        info.per_layer
            .iter()
            .map(|l| {
                l.iter()
                    .map(|n| {
                        g.relation_id(n).ok_or_else(|| {
                            GraphError::data(
                                &self.dir.join("manifest.json"),
                                format!("partition {k}: unknown relation {n}"),
                            )
                        })
                    })
                    .collect()
            })
            .collect()
    }
}
