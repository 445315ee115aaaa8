//! Link prediction as a training task: the target relations' edges split
//! (held-out edges removed from the graph before reverse relations are
//! added), steps of training edges ([`Batching`]: an edge's step is a hash of
//! the edge) with their negatives and the seeds they need (a step's own
//! edges excluded from its neighbourhoods), the loss over a batch, and
//! evaluation by exact inference.
//!
//! Evaluation ranks each validation and test edge against its fixed
//! negatives ([`graphs::link::eval_negatives`]) with every node's embedding
//! computed by exact layer-wise inference over the training graph (full
//! neighbourhoods, no sampling, as DGL's offline inference), so the metric
//! is a pure function of the model.

use std::collections::HashMap;

use candle_core::{DType, Tensor};
use graphs::link::{copy_ranks, train_negative, Batching, EdgeList, LinkEdges, StepEdges};
use graphs::HetGraph;
use models::inference::{embed_all, TypeRows};
use models::link::{LinkLoss, RankSums};
use models::rgcn::PerType;
use models::Model;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::config::{NegativeSampler, TrainingConfig};
use crate::error::{Result, TrainError};

/// Evaluation edges scored per chunk (each against all its negatives).
const EVAL_CHUNK: usize = 256;

/// Destinations per chunk in evaluation's exact inference.
const INFERENCE_CHUNK: usize = 4096;

/// The task's settings and edges, for one graph.
pub struct LinkTask {
    /// The split edges.
    pub edges: LinkEdges,
    negatives: usize,
    sampler: NegativeSampler,
    loss: LinkLoss,
    eval_negatives: usize,
    seed: u64,
    /// Per target relation: its key, source and destination type, destination count.
    rels: Vec<(u64, usize, usize, u32)>,
    /// Which step each training edge falls in.
    batching: Batching,
    /// Each training edge's [`copy_ranks`] rank.
    copies: Vec<u32>,
}

/// A batch of training edges: the seeds whose embeddings it needs, and
/// where each edge's endpoints and negatives sit among them.
#[derive(Clone, Debug)]
pub struct LinkBatch {
    /// The positive edges.
    pub edges: EdgeList,
    /// Seeds per node type (endpoints and negatives, each once).
    pub seeds: Vec<Vec<u32>>,
    /// Per edge, its source's and destination's row among `seeds`.
    src_at: Vec<u32>,
    dst_at: Vec<u32>,
    /// Per edge, `k` rows among `seeds[dst type]`.
    neg_at: Vec<u32>,
    k: usize,
}

/// Validation and test figures after an epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkMetrics {
    /// Mean reciprocal rank.
    pub mrr: f64,
    /// Share of edges ranked first.
    pub hits1: f64,
    /// Share ranked in the first 10.
    pub hits10: f64,
    /// Share ranked in the first 100.
    pub hits100: f64,
}

impl From<&RankSums> for LinkMetrics {
    fn from(r: &RankSums) -> LinkMetrics {
        LinkMetrics {
            mrr: r.mrr(),
            hits1: r.hits(1),
            hits10: r.hits(10),
            hits100: r.hits(100),
        }
    }
}

/// An epoch's link-prediction figures, in the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkEpoch {
    /// On the validation edges.
    pub valid: LinkMetrics,
    /// On the test edges.
    pub test: LinkMetrics,
}

/// The run's link-prediction setting, written down in the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkReport {
    /// The target relations.
    pub relations: Vec<String>,
    /// Training edges.
    pub train_edges: u64,
    /// Validation edges (held out of the graph).
    pub valid_edges: u64,
    /// Test edges (held out of the graph).
    pub test_edges: u64,
    /// How the split was drawn.
    pub split: String,
    /// How the metrics are computed.
    pub metric: String,
}

impl LinkTask {
    /// Splits the target relations' edges of `g` (loaded without reverse
    /// relations), removes the held-out ones from it, then adds the reverse
    /// relations if `t` asks for them; returns the training graph.
    pub fn prepare(t: &TrainingConfig, g: HetGraph) -> Result<(HetGraph, LinkTask)> {
        // Unknown names are refused by the split.
        let total = t
            .target_relations
            .iter()
            .filter_map(|n| g.relation_id(n))
            .map(|r| g.relation(r).num_edges() as u64)
            .sum();
        LinkTask::prepare_part(t, g, total, |_, _| true)
    }

    /// [`LinkTask::prepare`] for a partition of the graph: `total` is the
    /// target relations' edge count in the whole graph, and the task trains
    /// on the training edges whose source `mine` accepts (its owned nodes).
    pub fn prepare_part(
        t: &TrainingConfig,
        mut g: HetGraph,
        total: u64,
        mine: impl Fn(usize, u32) -> bool,
    ) -> Result<(HetGraph, LinkTask)> {
        let spec = t.split_spec();
        let mut edges = LinkEdges::split(&g, &t.target_relations, &spec)?;
        edges.hold_out(&mut g, &spec)?;
        if t.reverse_edges {
            g.add_reverse_relations()?;
        }
        let rels: Vec<(u64, usize, usize, u32)> = edges
            .relations
            .iter()
            .map(|&r| {
                let rel = g.relation(r);
                (
                    rel.key(),
                    rel.src.index(),
                    rel.dst.index(),
                    g.node_type(rel.dst).count,
                )
            })
            .collect();
        let batching = Batching::new(&g, &edges, spec, t.seed, t.batch, total);
        for list in [&mut edges.train, &mut edges.valid, &mut edges.test] {
            let keep: Vec<u32> = (0..list.len() as u32)
                .filter(|&i| mine(rels[list.rel[i as usize] as usize].1, list.src[i as usize]))
                .collect();
            if keep.len() < list.len() {
                *list = list.select(&keep);
            }
        }
        let copies = copy_ranks(&edges.train.rel, &edges.train.src, &edges.train.dst);
        let task = LinkTask {
            copies,
            edges,
            negatives: t.negatives,
            sampler: t.negative_sampler,
            loss: t.link_loss,
            eval_negatives: t.eval_negatives,
            seed: t.seed,
            rels,
            batching,
        };
        Ok((g, task))
    }

    /// The steps of `epoch`: training edges (indices into the training list) per step.
    pub fn batches(&self, epoch: u64) -> Vec<Vec<u32>> {
        let keys: Vec<u64> = self.rels.iter().map(|r| r.0).collect();
        self.batching
            .batches(epoch, &self.edges.train, &self.copies, &keys)
    }

    /// Steps per epoch.
    pub fn steps(&self) -> u64 {
        self.batching.steps()
    }

    /// The edges step `step` of `epoch` leaves out of its neighbourhoods: its
    /// own training edges and their reverses.
    pub fn exclusion(&self, epoch: u64, step: u64) -> StepEdges<'_> {
        self.batching.exclusion(epoch, step)
    }

    /// What the report says of the task.
    pub fn report(&self, g: &HetGraph, t: &TrainingConfig) -> LinkReport {
        LinkReport {
            relations: self.edges.relations.iter().map(|&r| g.relation(r).canonical().to_string()).collect(),
            train_edges: self.edges.train.len() as u64,
            valid_edges: self.edges.valid.len() as u64,
            test_edges: self.edges.test.len() as u64,
            split: format!(
                "seeded by edge_split_seed {}: each pair u -> v of a target relation lands in valid ({}), test ({}) or train by a hash of (seed, relation, u, v); valid and test edges are removed from the graph, reverse relations included",
                t.edge_split_seed, t.edge_split[0], t.edge_split[1]
            ),
            metric: format!(
                "MRR and Hits@1/10/100 of each held-out edge against {} fixed negatives drawn uniformly from the destination type by a hash of the edge (ties count half, as OGB); embeddings by {} on the training graph",
                t.eval_negatives,
                match t.exact_link_eval() {
                    true => "exact full-neighbourhood inference",
                    false => "neighbourhoods sampled with the training fanouts, keyed by node alone",
                }
            ),
        }
    }

    /// The batch of training edges `ids` in `epoch`, with its negatives.
    pub fn batch(&self, g: &HetGraph, epoch: u64, ids: &[u32]) -> LinkBatch {
        let edges = self.edges.train.select(ids);
        let types = g.node_types().len();
        let mut seeds: Vec<Vec<u32>> = vec![Vec::new(); types];
        let mut at: Vec<HashMap<u32, u32>> = vec![HashMap::new(); types];
        let mut slot = |t: usize, v: u32| -> u32 {
            *at[t].entry(v).or_insert_with(|| {
                seeds[t].push(v);
                seeds[t].len() as u32 - 1
            })
        };
        let n = edges.len();
        let k = self.negatives;
        let (mut src_at, mut dst_at, mut neg_at) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n * k),
        );
        // In-batch negatives come from the positives of the same relation, in batch order.
        let mut same: HashMap<u16, Vec<usize>> = HashMap::new();
        for i in 0..n {
            same.entry(edges.rel[i]).or_default().push(i);
        }
        let mut rank = vec![0usize; n];
        for list in same.values() {
            for (j, &i) in list.iter().enumerate() {
                rank[i] = j;
            }
        }
        for i in 0..n {
            let r = edges.rel[i] as usize;
            let (key, st, dt, count) = self.rels[r];
            let (u, v) = (edges.src[i], edges.dst[i]);
            src_at.push(slot(st, u));
            dst_at.push(slot(dt, v));
            let peers = &same[&edges.rel[i]];
            for j in 0..k {
                let neg = match self.sampler {
                    NegativeSampler::InBatch if peers.len() > k => {
                        edges.dst[peers[(rank[i] + 1 + j) % peers.len()]]
                    }
                    // Uniform, and in-batch where the batch has too few peers.
                    _ => train_negative(self.seed, epoch, key, u, v, j as u64, count),
                };
                neg_at.push(slot(dt, neg));
            }
        }
        LinkBatch {
            edges,
            seeds,
            src_at,
            dst_at,
            neg_at,
            k,
        }
    }

    /// The batch's positive scores `[p]` and negative scores `[p, k]`, grouped by
    /// relation, from the last layer's rows of its seeds (`out[t]` aligned with `b.seeds[t]`).
    pub fn scores(&self, model: &Model, out: &PerType, b: &LinkBatch) -> Result<(Tensor, Tensor)> {
        let mut pos = Vec::new();
        let mut neg = Vec::new();
        for (r, &(_, st, dt, _)) in self.rels.iter().enumerate() {
            let idx: Vec<usize> = (0..b.edges.len())
                .filter(|&i| b.edges.rel[i] as usize == r)
                .collect();
            if idx.is_empty() {
                continue;
            }
            let rows = |t: usize| {
                out[t]
                    .as_ref()
                    .ok_or_else(|| TrainError::Config(format!("no output rows for node type {t}")))
            };
            let (hs, hd) = (rows(st)?, rows(dt)?);
            let device = hs.device();
            let pick = |x: &Tensor, at: Vec<u32>| -> Result<Tensor> {
                let n = at.len();
                Ok(x.index_select(&Tensor::from_vec(at, n, device)?, 0)?)
            };
            let s = pick(hs, idx.iter().map(|&i| b.src_at[i]).collect())?;
            let d = pick(hd, idx.iter().map(|&i| b.dst_at[i]).collect())?;
            pos.push(model.score_edges(r, &s, &d)?);
            let s_rep = pick(
                hs,
                idx.iter()
                    .flat_map(|&i| std::iter::repeat_n(b.src_at[i], b.k))
                    .collect(),
            )?;
            let negs = pick(
                hd,
                idx.iter()
                    .flat_map(|&i| b.neg_at[i * b.k..(i + 1) * b.k].iter().copied())
                    .collect(),
            )?;
            neg.push(
                model
                    .score_edges(r, &s_rep, &negs)?
                    .reshape((idx.len(), b.k))?,
            );
        }
        Ok((Tensor::cat(&pos, 0)?, Tensor::cat(&neg, 0)?))
    }

    /// The batch's loss: summed over its scores (cross-entropy) or positives
    /// (contrastive), divided by their number in a step of the mean size (a
    /// step's size varies; a fixed divisor lets trainers holding parts of a
    /// step scale their shares without knowing the others').
    pub fn loss(&self, model: &Model, out: &PerType, b: &LinkBatch) -> Result<Tensor> {
        let (pos, neg) = self.scores(model, out, b)?;
        let p = self.batching.nominal();
        let denominator = match self.loss {
            LinkLoss::CrossEntropy => p * (1 + b.k) as f64,
            LinkLoss::Contrastive => p,
        };
        Ok(models::link::loss(self.loss, &pos, &neg, denominator)?)
    }

    /// Validation and test ranking sums of `model`, every node embedded by
    /// exact inference on `g` (the training graph).
    pub fn evaluate_exact(&self, model: &Model, g: &HetGraph) -> Result<[RankSums; 2]> {
        let rows = embed_all(model, g, INFERENCE_CHUNK, |_, _, _| {})?;
        self.rank_all(model, &models::inference::decoder_type_rows(model, rows))
    }

    /// Validation and test ranking sums of `model`, the nodes they need
    /// embedded by `embed` (per type, nodes of one type at a time: the last
    /// layer's rows of those seeds, sampled with a key that does not depend
    /// on which nodes are embedded together, so every mode gets the same rows).
    pub fn evaluate_sampled(
        &self,
        model: &Model,
        g: &HetGraph,
        embed: impl FnMut(&[Vec<u32>]) -> Result<PerType>,
    ) -> Result<[RankSums; 2]> {
        let rows = embed_nodes(g, self.eval_nodes(g), INFERENCE_CHUNK, embed)?;
        self.rank_all(model, &models::inference::decoder_type_rows(model, rows))
    }

    /// Which step each training edge falls in (what samplers leave out).
    pub fn batching(&self) -> &Batching {
        &self.batching
    }

    /// Per type, the distinct nodes the held-out edges and their negatives need, ascending.
    fn eval_nodes(&self, g: &HetGraph) -> Vec<Vec<u32>> {
        let mut seen: Vec<Vec<bool>> = g
            .node_types()
            .iter()
            .map(|t| vec![false; t.count as usize])
            .collect();
        for edges in [&self.edges.valid, &self.edges.test] {
            for i in 0..edges.len() {
                let (key, st, dt, count) = self.rels[edges.rel[i] as usize];
                seen[st][edges.src[i] as usize] = true;
                seen[dt][edges.dst[i] as usize] = true;
                for n in graphs::link::eval_negatives(
                    key,
                    edges.src[i],
                    edges.dst[i],
                    self.eval_negatives,
                    count,
                ) {
                    seen[dt][n as usize] = true;
                }
            }
        }
        seen.iter()
            .map(|s| (0..s.len() as u32).filter(|&v| s[v as usize]).collect())
            .collect()
    }

    /// Validation and test ranking sums with the rows of every node they need.
    fn rank_all(&self, model: &Model, rows: &[Option<TypeRows>]) -> Result<[RankSums; 2]> {
        Ok([
            self.rank(model, rows, &self.edges.valid)?,
            self.rank(model, rows, &self.edges.test)?,
        ])
    }

    /// Ranks `edges` against their fixed negatives with every node's rows.
    ///
    /// Each edge's query row (its source's row, through the decoder) is
    /// dotted on the host with its destination's row and its negatives'
    /// rows where they lie in `rows`: no `[edges × negatives × width]`
    /// copies. Every score, the positive's included, is the same
    /// fixed-order dot ([`models::link::dot`]), so a negative that is the
    /// destination itself ties with it exactly.
    fn rank(&self, model: &Model, rows: &[Option<TypeRows>], edges: &EdgeList) -> Result<RankSums> {
        let mut sums = RankSums::default();
        let k = self.eval_negatives;
        let table = |t: usize| {
            rows[t]
                .as_ref()
                .ok_or_else(|| TrainError::Config(format!("no embeddings for node type {t}")))
        };
        let ids: Vec<u32> = (0..edges.len() as u32).collect();
        for chunk in ids.chunks(EVAL_CHUNK) {
            for (r, &(key, st, dt, count)) in self.rels.iter().enumerate() {
                let mine: Vec<usize> = chunk
                    .iter()
                    .map(|&i| i as usize)
                    .filter(|&i| edges.rel[i] as usize == r)
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let (src_rows, dst_rows) = (table(st)?, table(dt)?);
                let w = src_rows.width;
                if dst_rows.width != w {
                    return Err(TrainError::Config(format!(
                        "embeddings {w} and {} wide cannot be scored together",
                        dst_rows.width
                    )));
                }
                let mut buf = Vec::with_capacity(mine.len() * w);
                for &i in &mine {
                    let at = edges.src[i] as usize * w;
                    buf.extend_from_slice(&src_rows.data[at..at + w]);
                }
                let s = Tensor::from_vec(buf, (mine.len(), w), model.device())?
                    .to_dtype(model.dtype())?;
                let q: Vec<f32> = model
                    .link_query(r, &s)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1()?;
                let row = |v: u32| &dst_rows.data[v as usize * w..(v as usize + 1) * w];
                let query = |a: usize| &q[a * w..(a + 1) * w];
                let pos: Vec<f32> = mine
                    .iter()
                    .enumerate()
                    .map(|(a, &i)| models::link::dot(query(a), row(edges.dst[i])))
                    .collect();
                let mut neg = vec![0f32; mine.len() * k];
                if k > 0 {
                    neg.par_chunks_mut(k).enumerate().for_each(|(a, n)| {
                        let i = mine[a];
                        for (slot, v) in n.iter_mut().zip(graphs::link::eval_negatives(
                            key,
                            edges.src[i],
                            edges.dst[i],
                            k,
                            count,
                        )) {
                            *slot = models::link::dot(query(a), row(v));
                        }
                    });
                }
                sums.add(&pos, &neg, k)?;
            }
        }
        Ok(sums)
    }
}

/// The last layer's rows of `nodes` (per type, ascending), embedded by
/// `embed` in chunks of `chunk` nodes of one type, in tables of every node
/// of each type (rows of the others left zero).
pub(crate) fn embed_nodes(
    g: &HetGraph,
    nodes: Vec<Vec<u32>>,
    chunk: usize,
    mut embed: impl FnMut(&[Vec<u32>]) -> Result<PerType>,
) -> Result<Vec<Option<TypeRows>>> {
    let types = g.node_types().len();
    let mut rows: Vec<Option<TypeRows>> = vec![None; types];
    for (t, nodes) in nodes.into_iter().enumerate() {
        for piece in nodes.chunks(chunk) {
            let mut seeds = vec![Vec::new(); types];
            seeds[t] = piece.to_vec();
            let out = embed(&seeds)?;
            let x = out
                .get(t)
                .and_then(Option::as_ref)
                .ok_or_else(|| TrainError::Config(format!("no rows for node type {t}")))?;
            let (n, width) = x.dims2()?;
            if n != piece.len() {
                return Err(TrainError::Config(format!(
                    "{n} rows for {} nodes",
                    piece.len()
                )));
            }
            let values = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let slot = rows[t].get_or_insert_with(|| TypeRows {
                width,
                data: vec![0.0; g.node_types()[t].count as usize * width],
            });
            for (i, &v) in piece.iter().enumerate() {
                slot.data[v as usize * width..(v as usize + 1) * width]
                    .copy_from_slice(&values[i * width..(i + 1) * width]);
            }
        }
    }
    Ok(rows)
}
