//! Link-prediction edges: the seeded train / valid / test split of the target
//! relations, the held-out edges removed from message passing, the edges a
//! batch must not see in its sampled neighbourhoods, and negative
//! destinations.
//!
//! Every choice is a pure function of its key, so any process holding an
//! edge knows its split, and every process draws the same negatives:
//! - an edge `u -> v` of relation `r` is in the split that
//!   `key(split_seed, r, u, v)` falls into (parallel edges share their pair's
//!   split, so a duplicate never leaks a held-out pair into training);
//! - a training edge's step in an epoch is `key(seed, epoch, r, u, v)` modulo
//!   the steps per epoch ([`Batching`]), so the edges a step must not see in
//!   its neighbourhoods are a predicate any sampler can evaluate;
//! - negative `j` of a training edge is `key(seed, epoch, r, u, v, j)` below
//!   the destination type's count (the destination type is the relation's);
//! - evaluation negatives do not depend on the training seed at all (the
//!   OGB convention of a fixed set per evaluation edge), so runs of different
//!   seeds, and other systems given the same files, rank against the same
//!   candidates.

use crate::error::{GraphError, Result};
use crate::graph::HetGraph;
use crate::ids::RelationId;
use crate::rng::{extend_key, key, CounterRng};

#[allow(clippy::unusual_byte_groupings)]
const SPLIT_STREAM: u64 = 0x5B1_17ED6E5;
#[allow(clippy::unusual_byte_groupings)]
const NEGATIVE_STREAM: u64 = 0x4E6_A71BE5;
#[allow(clippy::unusual_byte_groupings)]
const BATCH_STREAM: u64 = 0xBA7C_4ED6E5;
#[allow(clippy::unusual_byte_groupings)]
const EVAL_NEGATIVE_STREAM: u64 = 0xE4A_14E65;

/// Which split an edge is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdgeSplit {
    /// Trained on (and kept for message passing).
    Train,
    /// Validation: held out of the graph.
    Valid,
    /// Test: held out of the graph.
    Test,
}

/// How the edges of the target relations are split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SplitSpec {
    /// Share of edges held out for validation.
    pub valid: f64,
    /// Share of edges held out for testing.
    pub test: f64,
    /// Seed of the split (independent of the training seed).
    pub seed: u64,
}

impl SplitSpec {
    /// The split of edge `u -> v` of the relation keyed `rel_key`.
    pub fn of(&self, rel_key: u64, u: u32, v: u32) -> EdgeSplit {
        let x =
            CounterRng::from_parts(&[self.seed, SPLIT_STREAM, rel_key, u64::from(u), u64::from(v)])
                .next_f64();
        if x < self.valid {
            EdgeSplit::Valid
        } else if x < self.valid + self.test {
            EdgeSplit::Test
        } else {
            EdgeSplit::Train
        }
    }

    /// Checks the shares leave edges to train on.
    pub fn validate(&self) -> Result<()> {
        let ok = |x: f64| x.is_finite() && (0.0..1.0).contains(&x);
        if !ok(self.valid) || !ok(self.test) || self.valid + self.test >= 1.0 {
            return Err(GraphError::InvalidArgument(format!("edge split: valid {} and test {} must be shares in [0, 1) that leave edges to train on", self.valid, self.test)));
        }
        Ok(())
    }
}

/// Edges as parallel lists: relation (index into [`LinkEdges::relations`]), source, destination.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EdgeList {
    /// Index of each edge's relation in [`LinkEdges::relations`].
    pub rel: Vec<u16>,
    /// Source ids.
    pub src: Vec<u32>,
    /// Destination ids.
    pub dst: Vec<u32>,
}

impl EdgeList {
    /// Number of edges.
    pub fn len(&self) -> usize {
        self.src.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }
    fn push(&mut self, rel: u16, u: u32, v: u32) {
        self.rel.push(rel);
        self.src.push(u);
        self.dst.push(v);
    }
    /// The edges at `ids`, in that order.
    pub fn select(&self, ids: &[u32]) -> EdgeList {
        let mut out = EdgeList::default();
        for &i in ids {
            let i = i as usize;
            out.push(self.rel[i], self.src[i], self.dst[i]);
        }
        out
    }
}

/// The target relations' edges, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkEdges {
    /// The target relations (stored ones, not added reverses).
    pub relations: Vec<RelationId>,
    /// Training edges, ordered by relation, then source, then destination.
    pub train: EdgeList,
    /// Validation edges, in the same order.
    pub valid: EdgeList,
    /// Test edges, in the same order.
    pub test: EdgeList,
}

impl LinkEdges {
    /// Splits the edges of `relations` (canonical names, `src__name__dst`) of
    /// `g` as `spec` says.
    pub fn split(g: &HetGraph, relations: &[String], spec: &SplitSpec) -> Result<LinkEdges> {
        spec.validate()?;
        if relations.is_empty() {
            return Err(GraphError::InvalidArgument(
                "link prediction needs at least one target relation".into(),
            ));
        }
        if relations.len() > usize::from(u16::MAX) {
            return Err(GraphError::InvalidArgument(format!(
                "{} target relations: at most {}",
                relations.len(),
                u16::MAX
            )));
        }
        let mut ids = Vec::new();
        for name in relations {
            let known = || {
                g.relations()
                    .iter()
                    .filter(|r| r.reverse_of.is_none())
                    .map(|r| r.canonical().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let reverse_of = g
                .relations()
                .iter()
                .filter(|r| r.reverse_of.is_none())
                .find(|r| {
                    format!(
                        "{}__rev_{}__{}",
                        g.node_type(r.dst).name,
                        r.name,
                        g.node_type(r.src).name
                    ) == *name
                });
            if let Some(r) = reverse_of {
                return Err(GraphError::InvalidArgument(format!("target relation '{name}' is the reverse relation added at load: name the stored one ({})", r.canonical())));
            }
            let rid = g.relation_id(name).ok_or_else(|| {
                GraphError::InvalidArgument(format!(
                    "target relation '{name}' is not in graph '{}' (its relations: {})",
                    g.name(),
                    known()
                ))
            })?;
            if g.relation(rid).reverse_of.is_some() {
                return Err(GraphError::InvalidArgument(format!("target relation '{name}' is an added reverse relation: name the stored one ({})", known())));
            }
            if ids.contains(&rid) {
                return Err(GraphError::InvalidArgument(format!(
                    "target relation '{name}' is listed twice"
                )));
            }
            ids.push(rid);
        }
        let mut out = LinkEdges {
            relations: ids.clone(),
            train: EdgeList::default(),
            valid: EdgeList::default(),
            test: EdgeList::default(),
        };
        for (i, &rid) in ids.iter().enumerate() {
            let rel = g.relation(rid);
            let csr = rel.out_csr();
            for u in 0..csr.num_rows() as u32 {
                for &v in csr.neighbors(u) {
                    let list = match spec.of(rel.key(), u, v) {
                        EdgeSplit::Train => &mut out.train,
                        EdgeSplit::Valid => &mut out.valid,
                        EdgeSplit::Test => &mut out.test,
                    };
                    list.push(i as u16, u, v);
                }
            }
        }
        if out.train.is_empty() {
            let names = relations.join(", ");
            return Err(GraphError::InvalidArgument(format!(
                "the target relations ({names}) have no training edges"
            )));
        }
        Ok(out)
    }

    /// Removes the held-out (valid and test) edges of the target relations
    /// from `g`, so that no layer passes messages along them. Must run
    /// before reverse relations are added (they would keep the pairs).
    pub fn hold_out(&self, g: &mut HetGraph, spec: &SplitSpec) -> Result<()> {
        for &rid in &self.relations {
            let k = g.relation(rid).key();
            g.retain_edges(rid, |u, v| spec.of(k, u, v) == EdgeSplit::Train)?;
        }
        Ok(())
    }
}

/// Edges a sampler leaves out of in-neighbourhoods before it draws.
pub trait ExcludeEdges: Sync {
    /// Whether any edge of relation `r` may be excluded (a fast path for the others).
    fn touches(&self, r: RelationId) -> bool;
    /// Whether the `copies` parallel edges `src -> dst` of relation `r` are
    /// excluded (all of them or none: a copy would carry what its pair hides).
    fn excludes(&self, r: RelationId, dst: u32, src: u32, copies: u32) -> bool;
}

/// Each edge's rank among the earlier edges of the list with the same
/// relation and ends: 0 for a pair's first copy, 1 for its second, ... A
/// pair's copies then fall into steps of their own, as any edge does (a
/// step holding every copy of a pair takes one Adam step where separate
/// copies take several: it trains measurably slower where copies are
/// common). The ranks depend only on the copies' order in the list, which
/// a partition's list keeps.
pub fn copy_ranks(rel: &[u16], src: &[u32], dst: &[u32]) -> Vec<u32> {
    let n = src.len().min(rel.len()).min(dst.len());
    let key = |i: usize| (rel[i], src[i], dst[i]);
    let mut out = vec![0u32; n];
    if (1..n).all(|i| key(i - 1) <= key(i)) {
        // Sorted (link prediction's lists): a pair's copies are one run.
        for i in 1..n {
            if key(i) == key(i - 1) {
                out[i] = out[i - 1] + 1;
            }
        }
        return out;
    }
    // A stable sort keeps each pair's copies in list order (no map: 8 bytes
    // an edge at any scale).
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&i| key(i as usize));
    for w in order.windows(2) {
        let (a, b) = (w[0] as usize, w[1] as usize);
        if key(a) == key(b) {
            out[b] = out[a] + 1;
        }
    }
    out
}

/// Nothing excluded.
pub struct NoExclusion;

impl ExcludeEdges for NoExclusion {
    fn touches(&self, _: RelationId) -> bool {
        false
    }
    fn excludes(&self, _: RelationId, _: u32, _: u32, _: u32) -> bool {
        false
    }
}

/// How training edges fall into steps: in epoch `e`, edge `u -> v` of
/// relation `r` belongs to step `key(seed, e, r, u, v) mod buckets`, with
/// `buckets = ceil(expected training edges / batch)` (the target relations'
/// edges in the whole graph times the training share: a figure every
/// partition knows). A step's edges are then a pure
/// function of the edge itself, so a process holding an edge knows its step
/// without the global list of edges (any partition of the graph, any
/// trainer), and so does a sampler asked to leave a step's edges out of its
/// neighbourhoods. Steps hold `batch` edges on average (binomially many).
#[derive(Clone, Debug)]
pub struct Batching {
    seed: u64,
    buckets: u64,
    /// Link prediction's split: a step leaves out its training edges only.
    /// `None` (edge tasks, whose splits are files): every edge of a target
    /// relation that hashes into the step, whatever its split.
    split: Option<SplitSpec>,
    /// Per relation of the graph: the key of the target relation it is (or
    /// reverses: `true`), `None` for the others.
    by_relation: Vec<Option<(u64, bool)>>,
    /// Mean training edges per step.
    nominal: f64,
}

impl Batching {
    /// The batching of `link`'s training edges (of `g`, whose added reverse
    /// relations are recognised) into steps of `batch` edges on average;
    /// `total`: the target relations' edges in the whole graph, every split.
    pub fn new(
        g: &HetGraph,
        link: &LinkEdges,
        split: SplitSpec,
        seed: u64,
        batch: usize,
        total: u64,
    ) -> Batching {
        let train = (total as f64 * (1.0 - split.valid - split.test))
            .round()
            .max(1.0) as u64;
        Batching::of(g, &link.relations, Some(split), seed, batch, train)
    }

    /// The batching of the training edges of an edge task on `relations`
    /// (stored relations of `g`, whose added reverses are recognised):
    /// `train` edges in all, `batch` per step on average. A step leaves out
    /// of its neighbourhoods every edge of those relations (and reverse)
    /// hashed into it: its own training edges, and a share `1 / steps` of
    /// the others, so that the test needs no list of edges.
    pub fn for_edges(
        g: &HetGraph,
        relations: &[RelationId],
        seed: u64,
        batch: usize,
        train: u64,
    ) -> Batching {
        Batching::of(g, relations, None, seed, batch, train.max(1))
    }

    fn of(
        g: &HetGraph,
        relations: &[RelationId],
        split: Option<SplitSpec>,
        seed: u64,
        batch: usize,
        train: u64,
    ) -> Batching {
        let buckets = train.div_ceil(batch.max(1) as u64).max(1);
        let mut by_relation = vec![None; g.relations().len()];
        for &r in relations {
            let key = g.relation(r).key();
            by_relation[r.index()] = Some((key, false));
            for (i, x) in g.relations().iter().enumerate() {
                if x.reverse_of == Some(r) {
                    by_relation[i] = Some((key, true));
                }
            }
        }
        Batching {
            seed,
            buckets,
            split,
            by_relation,
            nominal: train as f64 / buckets as f64,
        }
    }

    /// Steps per epoch.
    pub fn steps(&self) -> u64 {
        self.buckets
    }

    /// Mean training edges per step (what a step's loss is divided by, so
    /// that trainers holding parts of a step can scale their shares alone).
    pub fn nominal(&self) -> f64 {
        self.nominal
    }

    /// The step of training edge `u -> v` of the relation keyed `rel_key` in
    /// `epoch`, the `copy`-th training edge with those ends (see [`copy_ranks`]).
    pub fn step_of(&self, epoch: u64, rel_key: u64, u: u32, v: u32, copy: u32) -> u64 {
        self.step_in(self.prefix(epoch, rel_key), u, v, copy)
    }

    /// The part of [`Batching::step_of`]'s key that all edges of a relation share in an epoch.
    fn prefix(&self, epoch: u64, rel_key: u64) -> u64 {
        key(&[self.seed, BATCH_STREAM, epoch, rel_key])
    }

    /// [`Batching::step_of`] from the relation's [`Batching::prefix`]. The
    /// first copy of a pair hashes its ends alone, so a graph without
    /// parallel edges batches as it did before copies were told apart.
    #[inline]
    fn step_in(&self, prefix: u64, u: u32, v: u32, copy: u32) -> u64 {
        let h = match copy {
            0 => extend_key(prefix, &[u64::from(u), u64::from(v)]),
            k => extend_key(prefix, &[u64::from(u), u64::from(v), u64::from(k)]),
        };
        h % self.buckets
    }

    /// Every step's edges (indices into `train`, in its order) for `epoch`;
    /// `keys[i]` is the key of target relation `i`, `copies` the list's
    /// [`copy_ranks`].
    pub fn batches(
        &self,
        epoch: u64,
        train: &EdgeList,
        copies: &[u32],
        keys: &[u64],
    ) -> Vec<Vec<u32>> {
        let mut out = vec![Vec::new(); self.buckets as usize];
        let prefixes: Vec<u64> = keys.iter().map(|&k| self.prefix(epoch, k)).collect();
        for i in 0..train.len() {
            let p = prefixes[train.rel[i] as usize];
            let b = self.step_in(p, train.src[i], train.dst[i], copies[i]);
            out[b as usize].push(i as u32);
        }
        out
    }

    /// The training edges of step `step` of `epoch`, and their reverses, as
    /// edges to leave out of every neighbourhood of that step.
    pub fn exclusion(&self, epoch: u64, step: u64) -> StepEdges<'_> {
        let prefixes = self
            .by_relation
            .iter()
            .map(|r| r.map(|(key, _)| self.prefix(epoch, key)))
            .collect();
        StepEdges {
            b: self,
            step,
            prefixes,
        }
    }
}

/// One step's training edges, as [`ExcludeEdges`].
pub struct StepEdges<'a> {
    b: &'a Batching,
    step: u64,
    /// Per relation of the graph, its target relation's [`Batching::prefix`]
    /// in this epoch (the test runs on every candidate neighbour).
    prefixes: Vec<Option<u64>>,
}

impl ExcludeEdges for StepEdges<'_> {
    fn touches(&self, r: RelationId) -> bool {
        self.b
            .by_relation
            .get(r.index())
            .is_some_and(Option::is_some)
    }
    fn excludes(&self, r: RelationId, dst: u32, src: u32, copies: u32) -> bool {
        let (Some(Some((key, reversed))), Some(Some(prefix))) = (
            self.b.by_relation.get(r.index()),
            self.prefixes.get(r.index()),
        ) else {
            return false;
        };
        let (u, v) = if *reversed { (dst, src) } else { (src, dst) };
        // The step test first: it fails for all but one edge in `steps`, the
        // split test for few. Copies beyond the training ones only leave a
        // pair out of a few more steps.
        (0..copies.max(1)).any(|k| self.b.step_in(*prefix, u, v, k) == self.step)
            && self
                .b
                .split
                .is_none_or(|s| s.of(*key, u, v) == EdgeSplit::Train)
    }
}

/// Negative `j` (of `k`) of training edge `u -> v` of the relation keyed
/// `rel_key` in `epoch`: uniform over the `count` destination-type nodes.
pub fn train_negative(
    seed: u64,
    epoch: u64,
    rel_key: u64,
    u: u32,
    v: u32,
    j: u64,
    count: u32,
) -> u32 {
    CounterRng::from_parts(&[
        seed,
        NEGATIVE_STREAM,
        epoch,
        rel_key,
        u64::from(u),
        u64::from(v),
        j,
    ])
    .below(u64::from(count)) as u32
}

/// The fixed evaluation negatives of edge `u -> v` of the relation keyed
/// `rel_key`: `k` destinations uniform over `count` (the training seed plays no part).
pub fn eval_negatives(
    rel_key: u64,
    u: u32,
    v: u32,
    k: usize,
    count: u32,
) -> impl Iterator<Item = u32> {
    let mut rng = CounterRng::new(key(&[
        EVAL_NEGATIVE_STREAM,
        rel_key,
        u64::from(u),
        u64::from(v),
    ]));
    (0..k).map(move |_| rng.below(u64::from(count)) as u32)
}
