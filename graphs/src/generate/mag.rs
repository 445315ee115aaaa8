//! A synthetic graph with ogbn-mag's schema and proportions and a planted
//! signal: papers have classes, features are a class centroid plus strong
//! noise, citations stay mostly within a class, and every author, institution
//! and field of study has a dominant class it links to. Papers also carry a
//! regression target: their class's mean value, plus half their first
//! feature, plus a little noise. Neighborhoods thus
//! carry most of the signal, so a relational model clearly beats a
//! features-only one. The `writes` edges carry targets for edge tasks: a
//! class (1 when the author's dominant class is the paper's, else 0) and a
//! value (half the paper's value plus half an author effect plus noise),
//! with a train / valid / test split of their own.
//!
//! Every value is drawn from a counter-based stream keyed by (seed, purpose,
//! index), so output is byte-identical whatever the thread count. Features and
//! edges are generated in chunks and streamed to disk: memory stays around
//! one relation's edge list.

use std::path::Path;

use rayon::prelude::*;

use crate::error::{GraphError, Result};
use crate::format::{paths, AtomicDir};
use crate::npy::{DType, NpyWriter};
use crate::progress::Progress;
use crate::rng::{key, CounterRng};
use crate::schema::{NodeTypeSchema, RelationSchema, Schema, MAX_NODES};

// ogbn-mag's sizes.
const PAPERS: f64 = 736_389.0;
const AUTHORS: f64 = 1_134_649.0;
const INSTITUTIONS: f64 = 8_740.0;
const FIELDS: f64 = 59_965.0;
const AFFILIATED: f64 = 1_043_998.0;
const WRITES: f64 = 7_145_660.0;
const CITES: f64 = 5_416_271.0;
const HAS_TOPIC: f64 = 7_505_078.0;
const CLASSES: u32 = 349;
const FEATURE_DIM: usize = 128;

/// Scale of the class centroid against unit-variance noise per dimension:
/// low enough that features alone classify poorly.
const CENTROID_SCALE: f64 = 0.2;
/// Probability that an edge stays within its source's (dominant) class; the
/// rest go to popular nodes of any class. Tuned on S=0.05 so that neither
/// signal saturates: a features-only MLP reaches about 0.13 test accuracy, an
/// MLP over exact 2-hop neighbor means about 0.9.
const CITE_SAME_CLASS: f64 = 0.55;
const WRITES_SAME_CLASS: f64 = 0.4;
const TOPIC_SAME_CLASS: f64 = 0.3;
const AFFILIATION_SAME_CLASS: f64 = 0.4;
/// Popularity exponent: an index drawn as `n · u^SKEW` gives rank-r nodes a
/// degree ∝ r^-(1-1/SKEW), a power-law degree tail.
const SKEW: f64 = 2.5;
/// ogbn-mag's split proportions (train 85.5%, valid 8.8%, test 5.7%).
const TRAIN_SHARE: f64 = 0.855;
const VALID_SHARE: f64 = 0.088;

/// A prime above every node count allowed here, so `i ↦ i·P mod n` permutes `0..n`.
const PERMUTE_PRIME: u64 = 4_294_967_291;

// Stream ids keep draws for different purposes independent.
const S_CLASS: u64 = 1;
const S_CENTROID: u64 = 2;
const S_FEATURE: u64 = 3;
const S_SPLIT: u64 = 4;
const S_PERM: u64 = 5;
const S_EDGE: u64 = 6;
const S_VALUE: u64 = 7;
const S_EDGE_TARGET: u64 = 8;
const S_LABEL_SET: u64 = 9;

/// The relation whose edges carry targets, and its split shares.
const TARGET_RELATION: &str = "writes";
const EDGE_TRAIN_SHARE: f64 = 0.8;
const EDGE_VALID_SHARE: f64 = 0.1;
/// An edge's value: this share of the paper's value, this of the author's
/// own effect (standard normal), plus noise of this scale.
const EDGE_VALUE_PAPER: f64 = 0.5;
const EDGE_VALUE_AUTHOR: f64 = 0.5;
const EDGE_VALUE_NOISE: f64 = 0.25;

/// Weight of a paper's first feature in its value, and the value's own noise
/// (class means are standard normal): neither the neighbourhood nor the
/// features alone predict it.
const VALUE_FEATURE: f64 = 0.5;
const VALUE_NOISE: f64 = 0.25;
/// Labels per paper of the multi-label target: a set per class (each label
/// in it with chance LABEL_IN_SET), each entry flipped with chance LABEL_FLIP.
const LABEL_SETS: u32 = 16;
const LABEL_IN_SET: f64 = 0.2;
const LABEL_FLIP: f64 = 0.03;

const FEATURE_CHUNK: usize = 16_384;
const EDGE_CHUNK: usize = 1 << 16;

/// Node type indices in the schema.
const PAPER: usize = 0;
const AUTHOR: usize = 1;
const INSTITUTION: usize = 2;
const FIELD: usize = 3;

/// The generator's parameters and derived per-node classes.
pub struct MagLike {
    seed: u64,
    scale: f64,
    counts: [u32; 4],
    edges: [u64; 4],
}

/// How to draw the endpoint of a relation.
#[derive(Clone, Copy)]
struct RelationPlan {
    src: usize,
    dst: usize,
    same_class: f64,
    /// Sources drawn by popularity (true) or uniformly (false).
    popular_src: bool,
}

const RELATIONS: [(&str, RelationPlan); 4] = [
    (
        "affiliated_with",
        RelationPlan {
            src: AUTHOR,
            dst: INSTITUTION,
            same_class: AFFILIATION_SAME_CLASS,
            popular_src: false,
        },
    ),
    (
        "writes",
        RelationPlan {
            src: AUTHOR,
            dst: PAPER,
            same_class: WRITES_SAME_CLASS,
            popular_src: true,
        },
    ),
    (
        "cites",
        RelationPlan {
            src: PAPER,
            dst: PAPER,
            same_class: CITE_SAME_CLASS,
            popular_src: true,
        },
    ),
    (
        "has_topic",
        RelationPlan {
            src: PAPER,
            dst: FIELD,
            same_class: TOPIC_SAME_CLASS,
            popular_src: false,
        },
    ),
];
const TYPE_NAMES: [&str; 4] = ["paper", "author", "institution", "field_of_study"];

impl MagLike {
    /// Checks `scale` and derives the counts (each at least 1).
    pub fn new(scale: f64, seed: u64) -> Result<MagLike> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(GraphError::InvalidArgument(format!(
                "scale must be a positive number, got {scale}"
            )));
        }
        let n = |c: f64| (c * scale).round().max(1.0);
        let node_counts = [n(PAPERS), n(AUTHORS), n(INSTITUTIONS), n(FIELDS)];
        // Below the permutation prime, so `popular` stays a bijection.
        let limit = (MAX_NODES).min(PERMUTE_PRIME - 1);
        if node_counts.iter().any(|&c| c > limit as f64) {
            return Err(GraphError::InvalidArgument(format!(
                "scale {scale} gives more than {limit} nodes of a type"
            )));
        }
        let counts = node_counts.map(|c| c as u32);
        let edges = [
            n(AFFILIATED) as u64,
            n(WRITES) as u64,
            n(CITES) as u64,
            n(HAS_TOPIC) as u64,
        ];
        Ok(MagLike {
            seed,
            scale,
            counts,
            edges,
        })
    }

    /// An upper bound of the generator's peak memory: per node its class and
    /// class membership, per paper its value and first feature, and the
    /// largest relation's source and destination ids with the generator's
    /// working copies, over a fixed base (threads, buffers). Measured peaks
    /// (VmHWM): 53 MiB at scale 0.05 and 90 MiB at 0.2, against 79 and
    /// 125 MiB here.
    pub fn memory_bytes(&self) -> u128 {
        let nodes: u128 = self.counts.iter().map(|&c| u128::from(c)).sum();
        let largest = self.edges.iter().copied().max().unwrap_or(0);
        (64 << 20) + 16 * nodes + 8 * u128::from(self.counts[PAPER]) + 32 * u128::from(largest)
    }

    /// The bytes the graph takes on disk: the papers' features, labels,
    /// values and splits, every relation's ids, and the target relation's
    /// labels, values and splits.
    pub fn disk_bytes(&self) -> u128 {
        let papers = u128::from(self.counts[PAPER]);
        let edges: u128 = self.edges.iter().map(|&e| u128::from(e)).sum();
        let target = RELATIONS
            .iter()
            .zip(self.edges)
            .find(|((name, _), _)| *name == TARGET_RELATION)
            .map_or(0, |(_, e)| u128::from(e));
        papers * (FEATURE_DIM as u128 * 4 + 20 + u128::from(LABEL_SETS)) + 16 * edges + 20 * target
    }

    /// The schema of the graph this generator writes.
    pub fn schema(&self) -> Schema {
        Schema {
            name: format!("mag-synthetic-s{}-seed{}", self.scale, self.seed),
            target: "paper".into(),
            num_classes: CLASSES,
            node_types: TYPE_NAMES
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let feature_dim = (i == PAPER).then_some(FEATURE_DIM as u64);
                    (
                        name.to_string(),
                        NodeTypeSchema {
                            count: self.counts[i].into(),
                            feature_dim,
                        },
                    )
                })
                .collect(),
            relations: RELATIONS
                .iter()
                .zip(self.edges)
                .map(|((name, p), count)| RelationSchema {
                    src: TYPE_NAMES[p.src].into(),
                    name: name.to_string(),
                    dst: TYPE_NAMES[p.dst].into(),
                    count,
                    num_classes: (*name == TARGET_RELATION).then_some(2),
                    values: *name == TARGET_RELATION,
                    ..Default::default()
                })
                .collect(),
            values: true,
            label_sets: Some(LABEL_SETS),
        }
    }

    fn class_of(&self, ntype: usize, id: u32) -> u32 {
        CounterRng::from_parts(&[self.seed, S_CLASS, ntype as u64, u64::from(id)])
            .below(u64::from(CLASSES)) as u32
    }

    /// Writes the graph to `out` (atomically) and returns its schema.
    pub fn write(
        &self,
        out: &Path,
        overwrite: bool,
        progress: &mut dyn Progress,
    ) -> Result<Schema> {
        let schema = self.schema();
        let dir = AtomicDir::create(out, overwrite)?;
        for name in TYPE_NAMES {
            dir.create_dir(&paths::node_dir(dir.path(), name))?;
        }
        dir.create_dir(&dir.path().join("edges"))?;

        let classes: Vec<Vec<u32>> = (0..4)
            .map(|t| {
                (0..self.counts[t])
                    .into_par_iter()
                    .map(|i| self.class_of(t, i))
                    .collect()
            })
            .collect();
        // Members of each class per type, sorted by id: the popular ones of a
        // class are its first members.
        let members: Vec<Vec<Vec<u32>>> = classes
            .iter()
            .map(|cs| {
                let mut m = vec![Vec::new(); CLASSES as usize];
                for (i, &c) in cs.iter().enumerate() {
                    m[c as usize].push(i as u32);
                }
                m
            })
            .collect();

        let paper_values = self.write_papers(dir.path(), &classes[PAPER], progress)?;
        for (i, (name, plan)) in RELATIONS.iter().enumerate() {
            let canonical = format!(
                "{}__{}__{}",
                TYPE_NAMES[plan.src], name, TYPE_NAMES[plan.dst]
            );
            progress.start(&format!("edges {canonical}"), self.edges[i]);
            let path = paths::edges(dir.path(), &canonical);
            let (src, dst) = self.relation_edges(
                i as u64,
                plan,
                self.edges[i] as usize,
                &classes,
                &members[plan.dst],
                progress,
            );
            let mut w = NpyWriter::create(&path, DType::I64, &[2, self.edges[i]])?;
            w.write_ids(&src)?;
            w.write_ids(&dst)?;
            w.finish()?;
            if *name == TARGET_RELATION {
                self.write_edge_targets(
                    dir.path(),
                    &canonical,
                    &src,
                    &dst,
                    &classes,
                    &paper_values,
                )?;
            }
            progress.finish();
        }
        schema.write(&paths::schema(dir.path()))?;
        dir.commit()?;
        Ok(schema)
    }

    /// Writes the papers' features, labels, values and splits; returns the values.
    fn write_papers(
        &self,
        dir: &Path,
        classes: &[u32],
        progress: &mut dyn Progress,
    ) -> Result<Vec<f32>> {
        let n = self.counts[PAPER] as usize;
        let centroids: Vec<f64> = (0..CLASSES as u64)
            .flat_map(|c| {
                let mut r = CounterRng::from_parts(&[self.seed, S_CENTROID, c]);
                (0..FEATURE_DIM).map(move |_| r.normal() * CENTROID_SCALE)
            })
            .collect();
        progress.start("paper features", n as u64);
        let mut w = NpyWriter::create(
            &paths::features(dir, "paper"),
            DType::F32,
            &[n as u64, FEATURE_DIM as u64],
        )?;
        let mut buf = vec![0f32; FEATURE_CHUNK * FEATURE_DIM];
        let mut first: Vec<f32> = Vec::with_capacity(n);
        for start in (0..n).step_by(FEATURE_CHUNK) {
            let rows = FEATURE_CHUNK.min(n - start);
            buf[..rows * FEATURE_DIM]
                .par_chunks_mut(FEATURE_DIM)
                .enumerate()
                .for_each(|(i, row)| {
                    let p = start + i;
                    let c = &centroids[classes[p] as usize * FEATURE_DIM..][..FEATURE_DIM];
                    let mut r = CounterRng::from_parts(&[self.seed, S_FEATURE, p as u64]);
                    for (x, m) in row.iter_mut().zip(c) {
                        *x = (m + r.normal()) as f32;
                    }
                });
            w.write_f32(&buf[..rows * FEATURE_DIM])?;
            first.extend(buf[..rows * FEATURE_DIM].iter().step_by(FEATURE_DIM));
            progress.advance(rows as u64);
        }
        w.finish()?;
        progress.finish();

        let labels: Vec<i64> = classes.iter().map(|&c| i64::from(c)).collect();
        crate::npy::write_i64(&paths::labels(dir, "paper"), &[n as u64], &labels)?;
        let means: Vec<f64> = (0..u64::from(CLASSES))
            .map(|c| CounterRng::from_parts(&[self.seed, S_VALUE, 0, c]).normal())
            .collect();
        let values: Vec<f32> = (0..n)
            .map(|p| {
                let e = CounterRng::from_parts(&[self.seed, S_VALUE, 1, p as u64]).normal();
                let v = means[classes[p] as usize]
                    + VALUE_FEATURE * f64::from(first[p])
                    + VALUE_NOISE * e;
                v as f32
            })
            .collect();
        crate::npy::write_f32(&paths::values(dir, "paper"), &[n as u64], &values)?;
        self.write_label_sets(dir, classes)?;
        let mut splits: [Vec<u32>; 3] = Default::default();
        for p in 0..n as u32 {
            let u = CounterRng::from_parts(&[self.seed, S_SPLIT, u64::from(p)]).next_f64();
            let s = if u < TRAIN_SHARE {
                0
            } else if u < TRAIN_SHARE + VALID_SHARE {
                1
            } else {
                2
            };
            splits[s].push(p);
        }
        for (name, ids) in ["train", "valid", "test"].iter().zip(&splits) {
            let mut w = NpyWriter::create(
                &paths::split(dir, "paper", name),
                DType::I64,
                &[ids.len() as u64],
            )?;
            w.write_ids(ids)?;
            w.finish()?;
        }
        Ok(values)
    }

    /// Writes the papers' label sets: their class's set, each entry flipped
    /// now and then, so that they follow the class (and so the graph) but
    /// are not a function of it.
    fn write_label_sets(&self, dir: &Path, classes: &[u32]) -> Result<()> {
        let l = LABEL_SETS as usize;
        let sets: Vec<bool> = (0..u64::from(CLASSES))
            .flat_map(|c| {
                let mut r = CounterRng::from_parts(&[self.seed, S_LABEL_SET, 0, c]);
                (0..l).map(move |_| r.next_f64() < LABEL_IN_SET)
            })
            .collect();
        let bits: Vec<i8> = classes
            .par_iter()
            .enumerate()
            .flat_map_iter(|(p, &c)| {
                let mut r = CounterRng::from_parts(&[self.seed, S_LABEL_SET, 1, p as u64]);
                let set = &sets[c as usize * l..][..l];
                set.iter()
                    .map(move |&b| i8::from(b != (r.next_f64() < LABEL_FLIP)))
            })
            .collect();
        crate::npy::write_i8(
            &paths::label_sets(dir, "paper"),
            &[classes.len() as u64, u64::from(LABEL_SETS)],
            &bits,
        )
    }

    /// Writes the targets of the `writes` edges `src -> dst` (authors to papers).
    fn write_edge_targets(
        &self,
        dir: &Path,
        canonical: &str,
        src: &[u32],
        dst: &[u32],
        classes: &[Vec<u32>],
        paper_values: &[f32],
    ) -> Result<()> {
        let edir = paths::edge_dir(dir, canonical);
        std::fs::create_dir_all(&edir).map_err(|e| GraphError::io(&edir, e))?;
        let n = src.len();
        let labels: Vec<i64> = (0..n)
            .into_par_iter()
            .map(|e| i64::from(classes[AUTHOR][src[e] as usize] == classes[PAPER][dst[e] as usize]))
            .collect();
        let values: Vec<f32> = (0..n)
            .into_par_iter()
            .map(|e| {
                let a = CounterRng::from_parts(&[self.seed, S_EDGE_TARGET, 0, u64::from(src[e])])
                    .normal();
                let noise =
                    CounterRng::from_parts(&[self.seed, S_EDGE_TARGET, 1, e as u64]).normal();
                (EDGE_VALUE_PAPER * f64::from(paper_values[dst[e] as usize])
                    + EDGE_VALUE_AUTHOR * a
                    + EDGE_VALUE_NOISE * noise) as f32
            })
            .collect();
        crate::npy::write_i64(&paths::edge_labels(dir, canonical), &[n as u64], &labels)?;
        crate::npy::write_f32(&paths::edge_values(dir, canonical), &[n as u64], &values)?;
        let mut splits: [Vec<i64>; 3] = Default::default();
        for e in 0..n {
            let u = CounterRng::from_parts(&[self.seed, S_EDGE_TARGET, 2, e as u64]).next_f64();
            let s = if u < EDGE_TRAIN_SHARE {
                0
            } else if u < EDGE_TRAIN_SHARE + EDGE_VALID_SHARE {
                1
            } else {
                2
            };
            splits[s].push(e as i64);
        }
        for (name, positions) in ["train", "valid", "test"].iter().zip(&splits) {
            crate::npy::write_i64(
                &paths::edge_split(dir, canonical, name),
                &[positions.len() as u64],
                positions,
            )?;
        }
        Ok(())
    }

    /// Draws a popularity-skewed index in `0..n`, spread over ids by a fixed permutation.
    fn popular(&self, r: &mut CounterRng, ntype: usize) -> u32 {
        let n = u64::from(self.counts[ntype]);
        let rank = ((n as f64) * r.next_f64().powf(SKEW)) as u64 % n;
        let offset = key(&[self.seed, S_PERM, ntype as u64]) % n;
        ((u128::from(rank) * u128::from(PERMUTE_PRIME) + u128::from(offset)) % u128::from(n)) as u32
    }

    fn relation_edges(
        &self,
        rel: u64,
        plan: &RelationPlan,
        count: usize,
        classes: &[Vec<u32>],
        dst_members: &[Vec<u32>],
        progress: &mut dyn Progress,
    ) -> (Vec<u32>, Vec<u32>) {
        let mut src = vec![0u32; count];
        let mut dst = vec![0u32; count];
        let n_src = u64::from(self.counts[plan.src]);
        for start in (0..count).step_by(EDGE_CHUNK * 16) {
            let end = (start + EDGE_CHUNK * 16).min(count);
            src[start..end]
                .par_chunks_mut(EDGE_CHUNK)
                .zip(dst[start..end].par_chunks_mut(EDGE_CHUNK))
                .enumerate()
                .for_each(|(c, (s_chunk, d_chunk))| {
                    for (k, (s, d)) in s_chunk.iter_mut().zip(d_chunk.iter_mut()).enumerate() {
                        let e = (start + c * EDGE_CHUNK + k) as u64;
                        let mut r = CounterRng::from_parts(&[self.seed, S_EDGE, rel, e]);
                        let from = if plan.popular_src {
                            self.popular(&mut r, plan.src)
                        } else {
                            r.below(n_src) as u32
                        };
                        let class = classes[plan.src][from as usize] as usize;
                        let mut to =
                            if r.next_f64() < plan.same_class && !dst_members[class].is_empty() {
                                let m = &dst_members[class];
                                m[((m.len() as f64) * r.next_f64().powf(SKEW)) as usize % m.len()]
                            } else {
                                self.popular(&mut r, plan.dst)
                            };
                        if plan.src == plan.dst && to == from && self.counts[plan.dst] > 1 {
                            to = (to + 1) % self.counts[plan.dst]; // no self-citations
                        }
                        *s = from;
                        *d = to;
                    }
                });
            progress.advance((end - start) as u64);
        }
        (src, dst)
    }
}
