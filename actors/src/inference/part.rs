//! One partition's share of distributed inference: its own nodes' rows,
//! stage by stage, from the previous stage's rows of its own nodes and of
//! its halo (the in-neighbours other partitions own), pulled from their
//! owners. Each stage a peer reads is saved as it is published, so a
//! restarted partition resumes from its newest one (the last stage is the
//! partition's output).

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use futures_util::{stream, StreamExt};
use graphs::{HetGraph, NodeTypeId};
use models::inference::{gather_held, host_rows, layer_chunk, FullBlocks, TypeRows};
use models::model::RowsInPlace;
use models::rgcn::PerType;
use runtime::{ActorRef, Node, SharedBytes};

use super::files::Out;
use super::messages::PartDone;
use super::messages::{StagePull, StageRows, MAX_IDS};
use super::rows::{Published, Stage};
use crate::error::{Result, TrainError};
use crate::pretrained::Inference;

/// Node ids one pull asks for (a few MiB of rows at the usual widths).
const PULL_IDS: usize = 8192;
/// Most pulls in flight at once per partition: an owner that shares its CPU
/// with its own computing answers in bursts (32 rather than 8: a 4-machine
/// `embed` 6.9-7.6 s rather than 7.6-8.0 s, interleaved runs).
const PULLS_IN_FLIGHT: usize = 32;
/// Most bytes of dense rows those pulls may bring at once.
const PULL_BYTES_IN_FLIGHT: usize = 64 << 20;
/// Widest row accepted from a peer.
const MAX_WIDTH: u32 = 1 << 16;

/// What every partition of a job shares.
pub(super) struct Shared<'a> {
    pub job: u64,
    pub model: &'a Inference,
    /// The partitions hold their halo's feature rows (`--halo-features`).
    pub halo_features: bool,
    pub owners: &'a [Vec<u16>],
    pub names: &'a [String],
    pub layers: u32,
    /// The job computes the target nodes' logits (its last stage only of
    /// the target type, then the classifier where the model has one).
    pub logits: bool,
    pub chunk: usize,
    pub out: &'a Out,
    /// One pull.
    pub ask: Duration,
    /// How long a peer may take to publish a stage (or to come back).
    pub wait: Duration,
    /// Called with the number of nodes just computed.
    pub progress: &'a (dyn Fn(u64) + Sync),
}

/// One partition of a job, where it runs.
pub(super) struct Part<'a> {
    pub shared: &'a Shared<'a>,
    pub k: u32,
    pub graph: &'a HetGraph,
    pub own: &'a [Vec<u32>],
    pub published: &'a Published,
    pub node: &'a Node,
    pub handle: &'a tokio::runtime::Handle,
}

/// The nodes partition `k` owns, per type, ascending.
pub(super) fn own_nodes(owners: &[Vec<u16>], k: u32) -> Vec<Vec<u32>> {
    owners
        .iter()
        .map(|o| {
            (0..o.len() as u32)
                .filter(|&v| u32::from(o[v as usize]) == k)
                .collect()
        })
        .collect()
}

/// The nodes one stage computes and the halo it reads.
struct Plan {
    /// In-neighbours of `nodes` that other partitions own, per type ([`halo`]).
    halo: Vec<Vec<u32>>,
    /// Each type's row index of every node held here: own nodes, then the halo.
    at: Vec<Vec<u32>>,
    /// The own nodes computed, per type, ascending.
    nodes: Vec<Vec<u32>>,
    /// `nodes` whose in-neighbours are all owned here, and the others.
    inner: Vec<Vec<u32>>,
    outer: Vec<Vec<u32>>,
}

impl Plan {
    /// The plan computing `nodes` (some of `own`, the partition's nodes).
    fn of(g: &HetGraph, owners: &[Vec<u16>], own: &[Vec<u32>], nodes: &[Vec<u32>], k: u32) -> Plan {
        let halo = halo(g, owners, nodes, k);
        let at = owners
            .iter()
            .enumerate()
            .map(|(t, o)| {
                let mut at = vec![u32::MAX; o.len()];
                for (i, &v) in own[t].iter().chain(&halo[t]).enumerate() {
                    at[v as usize] = i as u32;
                }
                at
            })
            .collect();
        let (inner, outer) = interior(g, owners, nodes, k);
        Plan {
            halo,
            at,
            nodes: nodes.to_vec(),
            inner,
            outer,
        }
    }
}

/// Partition `k`'s halo per type: the in-neighbours of its nodes that others
/// own, ordered by owner, then id (so each owner's share is one range).
fn halo(g: &HetGraph, owners: &[Vec<u16>], own: &[Vec<u32>], k: u32) -> Vec<Vec<u32>> {
    let mut seen: Vec<Vec<bool>> = owners.iter().map(|o| vec![false; o.len()]).collect();
    for rel in g.relations() {
        let (s, d) = (rel.src.index(), rel.dst.index());
        for &v in &own[d] {
            for &u in rel.in_csr().neighbors(v) {
                if u32::from(owners[s][u as usize]) != k {
                    seen[s][u as usize] = true;
                }
            }
        }
    }
    seen.iter()
        .enumerate()
        .map(|(t, hit)| {
            let mut ids: Vec<u32> = (0..hit.len() as u32).filter(|&v| hit[v as usize]).collect();
            ids.sort_by_key(|&v| (owners[t][v as usize], v));
            ids
        })
        .collect()
}

/// Partition `k`'s own nodes split per type into the interior (every
/// in-neighbour owned here) and the boundary, each ascending.
fn interior(
    g: &HetGraph,
    owners: &[Vec<u16>],
    own: &[Vec<u32>],
    k: u32,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let mut boundary: Vec<Vec<bool>> = owners.iter().map(|o| vec![false; o.len()]).collect();
    for rel in g.relations() {
        let (s, d) = (rel.src.index(), rel.dst.index());
        for &v in &own[d] {
            if rel
                .in_csr()
                .neighbors(v)
                .iter()
                .any(|&u| u32::from(owners[s][u as usize]) != k)
            {
                boundary[d][v as usize] = true;
            }
        }
    }
    own.iter()
        .zip(&boundary)
        .map(|(ids, b)| ids.iter().partition(|&&v| !b[v as usize]))
        .unzip()
}

impl Part<'_> {
    /// Computes (or resumes) the partition's stages and writes its embeddings.
    pub fn run(&self) -> Result<PartDone> {
        let s = self.shared;
        let (k, out, layers) = (self.k, s.out, s.layers);
        let resumed = out.latest_stage(k, layers);
        // Partitions holding their halo's feature rows read every input row
        // where it is stored, as the single process does: stage 0 is neither
        // copied nor pulled by a peer.
        let direct = s.halo_features;
        let mut prev: Arc<Stage> = match resumed {
            None => {
                let inputs = Arc::new(self.stage_zero(direct)?);
                self.published.publish(0, inputs.clone());
                inputs
            }
            Some(at) => {
                // Peers still computing stage `at` need this partition's stage `at - 1`.
                let before = if at == 1 {
                    self.stage_zero(direct)?
                } else {
                    out.load_stage(k, at - 1, s.names, self.own)?
                };
                self.published.publish(at - 1, Arc::new(before));
                let rows = Arc::new(out.load_stage(k, at, s.names, self.own)?);
                self.published.publish(at, rows.clone());
                tracing::info!("partition {k}: resumed at stage {at} of {layers}");
                rows
            }
        };
        // The last stage is saved as the partition's output (no peer reads
        // it): written, it leaves stage `layers - 1` the newest saved.
        let last_saved = resumed.unwrap_or(0) + 1 >= layers;
        if let Some(done) = out.part_done(k)?.filter(|_| last_saved) {
            self.published.finish(done.clone());
            return Ok(done);
        }
        let every = Plan::of(self.graph, s.owners, self.own, self.own, k);
        // A logits job's last layer (where it classifies) computes the target type only.
        let embedding = models::inference::embedding_layers(&s.model.model)?;
        let target = self.graph.target().index();
        let last = (s.logits && (embedding as u32) < layers).then(|| {
            let mut only: Vec<Vec<u32>> = vec![Vec::new(); self.own.len()];
            only[target] = self.own[target].clone();
            Plan::of(self.graph, s.owners, self.own, &only, k)
        });
        for stage in resumed.unwrap_or(0)..layers {
            let plan = match &last {
                Some(p) if stage + 1 == layers => p,
                _ => &every,
            };
            if direct && stage == 0 {
                let t0 = std::time::Instant::now();
                let mut next = Placed::new(&plan.nodes);
                self.compute(stage, &Source::Inputs, &plan.nodes, &mut next)?;
                let next = next.finish(s.names)?;
                tracing::info!(
                    "partition {k}: layer 1 of {layers} in {:.2}s (every input row read here)",
                    t0.elapsed().as_secs_f64()
                );
                prev = self.finish_stage(stage, layers, next)?;
                continue;
            }
            let Plan {
                halo,
                at,
                nodes,
                inner,
                outer,
            } = plan;
            let halo_nodes: usize = halo.iter().map(Vec::len).sum();
            // The halo's rows land after room for the own rows, which are
            // copied in front once the interior is done: one matrix per type,
            // read in place (`at` is each node's row in it).
            let front: Vec<usize> = prev
                .iter()
                .zip(self.own)
                .map(|(r, own)| r.as_ref().map_or(0, |_| own.len()))
                .collect();
            let mut next = Placed::new(nodes);
            let t0 = std::time::Instant::now();
            // The interior needs no halo row: it is computed while the halo's rows come.
            let (pulled, first) = std::thread::scope(|scope| {
                let pulling = scope.spawn(|| {
                    let rows = if stage == 0 {
                        self.halo_inputs(halo, &front)
                    } else {
                        self.pull(stage, halo, &vec![true; halo.len()], &front)
                    };
                    (rows, t0.elapsed())
                });
                let own = in_place(prev.iter().map(Option::as_ref), at);
                let first = self.compute(stage, &Source::Rows(&own), inner, &mut next);
                (pulling.join(), first.map(|()| t0.elapsed()))
            });
            let (pulled, pulling) =
                pulled.map_err(|_| TrainError::Internal("the pulling thread panicked".into()))?;
            let (mut pulled, interior) = (pulled?, first?);
            let t1 = std::time::Instant::now();
            join(stage, &prev, &mut pulled, self.own, s.names)?;
            let held = pulled
                .iter()
                .zip(prev.iter())
                .map(|(p, m)| p.as_ref().or(m.as_ref()));
            self.compute(stage, &Source::Rows(&in_place(held, at)), outer, &mut next)?;
            let next = next.finish(s.names)?;
            tracing::info!(
                "partition {k}: layer {} of {layers} in {:.2}s (pulling {halo_nodes} halo rows {:.2}s while computing the interior {:.2}s; then the boundary {:.2}s)",
                stage + 1,
                t0.elapsed().as_secs_f64(),
                pulling.as_secs_f64(),
                interior.as_secs_f64(),
                t1.elapsed().as_secs_f64(),
            );
            prev = self.finish_stage(stage, layers, next)?;
        }
        let rows = match s.logits {
            true => self.logits(&prev, target)?,
            false => Arc::unwrap_or_clone(prev),
        };
        let tw = std::time::Instant::now();
        let done = out.write_part(k, s.names, self.own, &rows)?;
        tracing::debug!(
            "partition {k}: rows written in {:.2}s",
            tw.elapsed().as_secs_f64()
        );
        self.published.finish(done.clone());
        Ok(done)
    }

    /// Publishes stage `stage + 1` (`next`) for peers and saves it, but the
    /// last one, which no peer reads and the partition's output saves.
    /// Peers may read it before it is saved: a partition that crashes before
    /// then computes it again, to the same rows.
    fn finish_stage(&self, stage: u32, layers: u32, next: Stage) -> Result<Arc<Stage>> {
        let next = Arc::new(next);
        if stage + 1 < layers {
            self.published.publish(stage + 1, next.clone());
            let t = std::time::Instant::now();
            self.shared
                .out
                .save_stage(self.k, stage + 1, self.shared.names, &next)?;
            tracing::debug!(
                "partition {}: stage {} saved in {:.2}s",
                self.k,
                stage + 1,
                t.elapsed().as_secs_f64()
            );
        }
        Ok(next)
    }

    /// Stage 0 as published: the own nodes' input rows, or nothing where
    /// every partition reads its inputs where they are stored (`direct`).
    fn stage_zero(&self, direct: bool) -> Result<Stage> {
        match direct {
            true => Ok(vec![None; self.own.len()]),
            false => self.inputs(),
        }
    }

    /// A logits job's output from its last stage: the target type's rows
    /// (through the classifier where the model has one), no other type's.
    fn logits(&self, last: &Stage, target: usize) -> Result<Stage> {
        let model = &self.shared.model.model;
        let mut out: Stage = vec![None; last.len()];
        let Some(rows) = last.get(target).cloned().flatten() else {
            return Err(TrainError::Internal(
                "the last layer computed no rows of the target type".into(),
            ));
        };
        out[target] = Some(match models::inference::head_rows(model, &rows)? {
            Some(logits) => logits,
            None => rows,
        });
        Ok(out)
    }

    /// Stage 0: the model's input rows of the partition's own nodes.
    fn inputs(&self) -> Result<Stage> {
        let (trained, g) = (self.shared.model, self.graph);
        let mut rows: Stage = vec![None; self.own.len()];
        for (t, (ids, out)) in self.own.iter().zip(rows.iter_mut()).enumerate() {
            for chunk in ids.chunks(self.shared.chunk) {
                let Some(x) = trained.inputs(g, t, chunk)? else {
                    break;
                };
                append(out, &x, ids.len())?;
            }
        }
        Ok(rows)
    }

    /// Stage 0 of the halo: learnable rows from the checkpoint and, where the
    /// partition holds them, feature rows, read here; the rest pulled.
    fn halo_inputs(&self, halo: &[Vec<u32>], front: &[usize]) -> Result<Vec<Option<TypeRows>>> {
        let (trained, g) = (self.shared.model, self.graph);
        let local: Vec<bool> = g
            .node_types()
            .iter()
            .map(|nt| nt.features.is_none() || self.shared.halo_features)
            .collect();
        let pull: Vec<bool> = local.iter().map(|l| !l).collect();
        let mut rows = self.pull(0, halo, &pull, front)?;
        for (t, ids) in halo.iter().enumerate() {
            if !local[t] {
                continue;
            }
            let mut at = front[t];
            for chunk in ids.chunks(self.shared.chunk) {
                let Some(x) = trained.inputs(g, t, chunk)? else {
                    break;
                };
                let (width, values) = host_rows(&x)?;
                let r = rows[t].get_or_insert_with(|| TypeRows {
                    width,
                    data: vec![0.0; (front[t] + ids.len()) * width],
                });
                let into = r.data.get_mut(at * width..(at + chunk.len()) * width);
                match into {
                    Some(into) if r.width == width && values.len() == into.len() => {
                        into.copy_from_slice(&values)
                    }
                    _ => {
                        return Err(TrainError::Internal(format!(
                            "type {}: {} input rows of {width} floats do not fit the halo's {} rows of {}",
                            self.shared.names[t],
                            chunk.len(),
                            ids.len(),
                            r.width
                        )))
                    }
                }
                at += chunk.len();
            }
        }
        Ok(rows)
    }

    /// Stage `stage + 1` of the own nodes `nodes` (per type, ascending) from
    /// stage `stage`'s rows `source`, placed `into` the stage.
    fn compute(
        &self,
        stage: u32,
        source: &Source,
        nodes: &[Vec<u32>],
        into: &mut Placed,
    ) -> Result<()> {
        let (model, g) = (&self.shared.model.model, self.graph);
        let mut blocks = FullBlocks::new(g);
        for (t, ids) in nodes.iter().enumerate() {
            let mut counted = 0;
            for chunk in ids.chunks(self.shared.chunk) {
                let block = blocks.block(g, stage as usize, NodeTypeId(t as u32), chunk);
                // Rows are read where they lie where the layer can (as the
                // single process does: the same bits), else gathered.
                let stored = match source {
                    Source::Inputs => self.shared.model.stored_rows(g, &block),
                    Source::Rows(rows) => Some(rows.to_vec()),
                };
                let x = match stored {
                    Some(rows) => model.layer_in_place(g, stage as usize, &block, &rows)?,
                    None => None,
                };
                let x = match x {
                    Some((_, mut h)) => h[t].take(),
                    None => {
                        let h: PerType = match source {
                            Source::Inputs => block
                                .src
                                .iter()
                                .enumerate()
                                .map(|(u, ids)| self.shared.model.inputs(g, u, ids))
                                .collect::<Result<_>>()?,
                            Source::Rows(rows) => gather_held(rows, &block.src, model)
                                .map_err(|e| {
                                    TrainError::Internal(format!(
                                        "partition {}, stage {stage} (its own rows and its halo's): {e}",
                                        self.k
                                    ))
                                })?,
                        };
                        layer_chunk(model, g, stage as usize, &block, &h, NodeTypeId(t as u32))?
                    }
                };
                match x {
                    Some(x) => into.place(t, chunk, &x)?,
                    None => break,
                }
                (self.shared.progress)(chunk.len() as u64);
                counted += chunk.len();
            }
            // A type with no rows at this layer is done with it too (progress
            // counts each own node once per layer computed).
            if counted < ids.len() {
                (self.shared.progress)((ids.len() - counted) as u64);
            }
        }
        Ok(())
    }

    /// The halo's rows of `stage` of the types `which` marks, per type in
    /// halo order (`None`: no rows, or not asked).
    fn pull(
        &self,
        stage: u32,
        halo: &[Vec<u32>],
        which: &[bool],
        front: &[usize],
    ) -> Result<Vec<Option<TypeRows>>> {
        let s = self.shared;
        // No row is wider than the widest input or layer output: a peer's
        // claim of more is refused before its rows are allocated.
        let widest = self
            .graph
            .node_types()
            .iter()
            .filter_map(|nt| nt.features.as_ref().map(|f| f.dim()))
            .chain([
                s.model.model.spec().embed_dim,
                s.model.model.spec().hidden,
                s.model.model.num_classes(),
            ])
            .max()
            .unwrap_or(0);
        // Stage 0's rows are inputs; later ones a layer's hidden rows.
        let row_floats = match stage {
            0 => widest,
            _ => s.model.model.spec().hidden,
        };
        let in_flight =
            (PULL_BYTES_IN_FLIGHT / (PULL_IDS * row_floats * 4).max(1)).clamp(1, PULLS_IN_FLIGHT);
        let mut asks = Vec::new();
        for (t, ids) in halo.iter().enumerate().filter(|&(t, _)| which[t]) {
            let mut from = 0;
            while from < ids.len() {
                let owner = s.owners[t][ids[from] as usize];
                let end = ids[from..]
                    .iter()
                    .position(|&v| s.owners[t][v as usize] != owner)
                    .map_or(ids.len(), |n| from + n);
                for (c, chunk) in ids[from..end].chunks(PULL_IDS.min(MAX_IDS)).enumerate() {
                    let actor = self
                        .node
                        .actor(&super::names::rows(u32::from(owner)))
                        .map_err(TrainError::internal)?;
                    let msg = StagePull {
                        job: s.job,
                        stage,
                        ntype: t as u32,
                        ids: chunk.to_vec(),
                    };
                    asks.push((t, from + c * PULL_IDS, actor, msg));
                }
                from = end;
            }
        }
        let deadline = Instant::now() + s.wait;
        let ask = s.ask;
        let mut rows: Vec<Option<TypeRows>> = vec![None; halo.len()];
        let mut absent = vec![false; halo.len()];
        // Each answer is copied out as it comes, so that its buffer is free for the next.
        self.handle.block_on(async {
            let mut answers = stream::iter(asks)
                .map(|(t, at, actor, msg)| async move {
                    let n = msg.ids.len();
                    (t, at, n, ask_rows(&actor, msg, ask, deadline).await)
                })
                .buffer_unordered(in_flight);
            while let Some((t, at, n, answer)) = answers.next().await {
                let Some((width, data)) = answer? else {
                    absent[t] = true;
                    continue;
                };
                if width > widest {
                    return Err(TrainError::Protocol(format!(
                        "stage {stage} of type {}: rows of {width} floats from partition {}, wider than any of this model's ({widest})",
                        s.names[t],
                        s.owners[t][halo[t][at] as usize]
                    )));
                }
                let r = rows[t].get_or_insert_with(|| TypeRows {
                    width,
                    data: vec![0.0; (front[t] + halo[t].len()) * width],
                });
                if r.width != width {
                    return Err(TrainError::Protocol(format!(
                        "stage {stage} of type {}: rows of {width} and {} floats",
                        s.names[t], r.width
                    )));
                }
                let row = front[t] + at;
                let into = &mut r.data[row * width..(row + n) * width];
                match data {
                    Payload::Dense(data) => {
                        for (x, b) in into.iter_mut().zip(data.0.chunks_exact(4)) {
                            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        }
                    }
                    Payload::Packed(data) => {
                        super::packed::unpack(&data.0, width, into).map_err(|e| {
                            TrainError::Protocol(format!(
                                "stage {stage} of type {}: packed rows from partition {}: {e}",
                                s.names[t],
                                s.owners[t][halo[t][at] as usize]
                            ))
                        })?
                    }
                }
            }
            Ok(())
        })?;
        for (t, r) in rows.iter().enumerate() {
            if r.is_some() && absent[t] {
                return Err(TrainError::Protocol(format!(
                    "stage {stage} of type {}: some owners have rows, others none",
                    s.names[t]
                )));
            }
        }
        Ok(rows)
    }
}

/// Where a stage's computation reads its source rows.
enum Source<'a> {
    /// The previous stage's rows held here, per type ([`in_place`]).
    Rows(&'a [Option<RowsInPlace<'a>>]),
    /// The model's input rows, read where they are stored (stage 0 on
    /// partitions holding their halo's features).
    Inputs,
}

/// A stage's rows held here as the layers read them: type `t`'s node `v`
/// at row `at[t][v]` of `held[t]`.
fn in_place<'a>(
    held: impl IntoIterator<Item = Option<&'a TypeRows>>,
    at: &'a [Vec<u32>],
) -> Vec<Option<RowsInPlace<'a>>> {
    held.into_iter()
        .zip(at)
        .map(|(r, at)| {
            r.map(|r| RowsInPlace {
                values: &r.data,
                width: r.width,
                slot: Some(at),
            })
        })
        .collect()
}

/// Copies the own rows (`prev`) into the room `pulled` left for them in
/// front of the halo's: per type, then, the stage's rows held here are
/// `pulled`'s where it has some, else the own rows alone.
fn join(
    stage: u32,
    prev: &Stage,
    pulled: &mut [Option<TypeRows>],
    own: &[Vec<u32>],
    names: &[String],
) -> Result<()> {
    for (t, (mine, theirs)) in prev.iter().zip(pulled.iter_mut()).enumerate() {
        match (mine, theirs) {
            (_, None) => {}
            (None, Some(_)) if own[t].is_empty() => {}
            (Some(m), Some(h))
                if m.width == h.width
                    && m.data.len() == own[t].len() * m.width
                    && m.data.len() <= h.data.len() =>
            {
                h.data[..m.data.len()].copy_from_slice(&m.data);
            }
            _ => {
                return Err(TrainError::Protocol(format!(
                    "stage {stage} of type {}: the peers' rows disagree with this partition's in width or presence",
                    names[t]
                )))
            }
        }
    }
    Ok(())
}

/// One pull's rows: `(width, rows)`, or `None` where the stage has no rows of the type.
type Pulled = Option<(usize, Payload)>;

/// Rows as a peer sent them.
enum Payload {
    /// Little-endian f32 values, checked to be as many as asked.
    Dense(SharedBytes),
    /// [`super::packed`] rows, checked as they are unpacked.
    Packed(SharedBytes),
}

/// A stage's rows as they are computed, each node's at its place in the
/// stage's node order (an interior and a boundary computed apart need no
/// merging copy).
struct Placed<'a> {
    /// The stage's nodes per type, ascending: the order of its rows.
    all: &'a [Vec<u32>],
    rows: Stage,
    /// Rows placed so far per type.
    placed: Vec<usize>,
}

impl<'a> Placed<'a> {
    fn new(all: &'a [Vec<u32>]) -> Placed<'a> {
        Placed {
            all,
            rows: vec![None; all.len()],
            placed: vec![0; all.len()],
        }
    }

    /// Places the rows `x` of type `t`'s nodes `ids` (each one of the stage's).
    fn place(&mut self, t: usize, ids: &[u32], x: &Tensor) -> Result<()> {
        let (width, values) = host_rows(x)?;
        let all = &self.all[t];
        let r = self.rows[t].get_or_insert_with(|| TypeRows {
            width,
            data: vec![0.0; all.len() * width],
        });
        if r.width != width || values.len() != ids.len() * width {
            return Err(TrainError::Internal(format!(
                "a layer wrote rows of {width} and {} floats",
                r.width
            )));
        }
        for (&v, row) in ids.iter().zip(values.chunks_exact(width.max(1))) {
            let at = all
                .binary_search(&v)
                .map_err(|_| TrainError::Internal(format!("node {v} is not one of the stage's")))?;
            r.data[at * width..(at + 1) * width].copy_from_slice(row);
        }
        self.placed[t] += ids.len();
        Ok(())
    }

    /// The stage, once every node of each type with rows has its row.
    fn finish(self, names: &[String]) -> Result<Stage> {
        for (t, r) in self.rows.iter().enumerate() {
            if r.is_some() && self.placed[t] != self.all[t].len() {
                return Err(TrainError::Internal(format!(
                    "type {}: rows for {} of {} nodes (the interior's and the boundary's differ in presence)",
                    names[t],
                    self.placed[t],
                    self.all[t].len()
                )));
            }
        }
        Ok(self.rows)
    }
}

/// Appends a chunk's rows to a stage's rows of one type, which will hold `rows` rows.
fn append(rows: &mut Option<TypeRows>, x: &Tensor, total: usize) -> Result<()> {
    let (width, values) = host_rows(x)?;
    let r = rows.get_or_insert_with(|| TypeRows {
        width,
        data: Vec::with_capacity(total * width),
    });
    if r.width != width {
        return Err(TrainError::Internal(format!(
            "a layer wrote rows of {width} and {} floats",
            r.width
        )));
    }
    r.data.extend_from_slice(&values);
    Ok(())
}

/// One pull, asked again while the owner has not published the stage or
/// does not answer (it may be restarting), until `deadline`.
async fn ask_rows(
    actor: &ActorRef,
    msg: StagePull,
    ask: Duration,
    deadline: Instant,
) -> Result<Pulled> {
    let n = msg.ids.len();
    loop {
        let lost = match actor.ask(msg.clone(), ask).await {
            Ok(Ok(StageRows::Rows { width, data })) => {
                if width == 0 || width > MAX_WIDTH || data.0.len() != n * width as usize * 4 {
                    return Err(TrainError::Protocol(format!(
                        "{} sent {} bytes for {n} rows of {width} floats",
                        actor.name(),
                        data.0.len()
                    )));
                }
                return Ok(Some((width as usize, Payload::Dense(data))));
            }
            Ok(Ok(StageRows::Packed { width, data })) => {
                if width == 0 || width > MAX_WIDTH {
                    return Err(TrainError::Protocol(format!(
                        "{} sent packed rows of {width} floats",
                        actor.name()
                    )));
                }
                return Ok(Some((width as usize, Payload::Packed(data))));
            }
            Ok(Ok(StageRows::Absent)) => return Ok(None),
            Ok(Ok(StageRows::NotYet)) => None,
            Ok(Err(e)) => return Err(e.from_actor(actor.name())),
            Err(e) => Some(e),
        };
        if Instant::now() >= deadline {
            return Err(match lost {
                Some(e) => TrainError::Ask(e),
                None => TrainError::PeerLost(format!(
                    "{} did not compute stage {} in time",
                    actor.name(),
                    msg.stage
                )),
            });
        }
        let pause = if lost.is_some() { 100 } else { 5 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}
