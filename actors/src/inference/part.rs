//! One partition's share of distributed inference: its own nodes' rows,
//! stage by stage, from the previous stage's rows of its own nodes and of
//! its halo (the in-neighbours other partitions own), pulled from their
//! owners. Each stage is saved before it is published, so a restarted
//! partition resumes from its newest one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use futures_util::{stream, StreamExt};
use graphs::{HetGraph, NodeTypeId};
use models::inference::{full_block, host_rows, layer_chunk, TypeRows};
use models::rgcn::PerType;
use models::Model;
use runtime::{ActorRef, Node};

use super::files::{Out, PartDone};
use super::messages::{StagePull, StageRows, MAX_IDS};
use super::rows::{floats, Published, Stage};
use crate::error::{Result, TrainError};

/// Node ids one pull asks for (a few MiB of rows at the usual widths).
const PULL_IDS: usize = 8192;
/// Pulls in flight at once per partition.
const PULLS_IN_FLIGHT: usize = 8;
/// Widest row accepted from a peer.
const MAX_WIDTH: u32 = 1 << 16;

/// What every partition of a job shares.
pub(super) struct Shared<'a> {
    pub job: u64,
    pub model: &'a Model,
    pub owners: &'a [Vec<u16>],
    pub names: &'a [String],
    pub layers: u32,
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

impl Part<'_> {
    /// Computes (or resumes) the partition's stages and writes its embeddings.
    pub fn run(&self) -> Result<PartDone> {
        let s = self.shared;
        let (k, out, layers) = (self.k, s.out, s.layers);
        let resumed = out.latest_stage(k, layers);
        let mut prev: Arc<Stage> = match resumed {
            None => {
                let inputs = Arc::new(self.inputs()?);
                self.published.publish(0, inputs.clone());
                inputs
            }
            Some(at) => {
                // Peers still computing stage `at` need this partition's stage `at - 1`.
                let before = if at == 1 {
                    self.inputs()?
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
        if let Some(done) = out
            .part_done(k)?
            .filter(|_| resumed == Some(layers) || layers == 0)
        {
            self.published.finish(done.clone());
            return Ok(done);
        }
        let halo = halo(self.graph, s.owners, self.own, k);
        // Each type's row index of every node held here: own nodes, then the halo.
        let at: Vec<Vec<u32>> = s
            .owners
            .iter()
            .enumerate()
            .map(|(t, o)| {
                let mut at = vec![u32::MAX; o.len()];
                for (i, &v) in self.own[t].iter().chain(&halo[t]).enumerate() {
                    at[v as usize] = i as u32;
                }
                at
            })
            .collect();
        let halo_nodes: usize = halo.iter().map(Vec::len).sum();
        for stage in resumed.unwrap_or(0)..layers {
            let t0 = std::time::Instant::now();
            let pulled = self.pull(stage, &halo)?;
            let t1 = std::time::Instant::now();
            let next = self.compute(stage, &prev, pulled, &at)?;
            let t2 = std::time::Instant::now();
            out.save_stage(k, stage + 1, s.names, &next)?;
            tracing::info!(
                "partition {k}: layer {} of {layers} in {:.2}s (pulling {halo_nodes} halo rows {:.2}s, computing {:.2}s, saving {:.2}s)",
                stage + 1,
                t0.elapsed().as_secs_f64(),
                (t1 - t0).as_secs_f64(),
                (t2 - t1).as_secs_f64(),
                t2.elapsed().as_secs_f64()
            );
            let next = Arc::new(next);
            self.published.publish(stage + 1, next.clone());
            prev = next;
        }
        let done = out.write_part(k, s.names, self.own, &prev)?;
        self.published.finish(done.clone());
        Ok(done)
    }

    /// Stage 0: the model's input rows of the partition's own nodes.
    fn inputs(&self) -> Result<Stage> {
        let (model, g) = (self.shared.model, self.graph);
        let types = self.own.len();
        let mut rows: Stage = vec![None; types];
        for t in 0..types {
            for chunk in self.own[t].chunks(self.shared.chunk) {
                let mut nodes = vec![Vec::new(); types];
                nodes[t] = chunk.to_vec();
                let Some(x) = model.gather_inputs(g, &nodes)?[t].take() else {
                    break;
                };
                append(&mut rows[t], &x)?;
            }
        }
        Ok(rows)
    }

    /// Stage `stage + 1` of the own nodes from stage `stage`'s rows.
    fn compute(
        &self,
        stage: u32,
        prev: &Stage,
        pulled: Vec<Option<TypeRows>>,
        at: &[Vec<u32>],
    ) -> Result<Stage> {
        let (model, g) = (self.shared.model, self.graph);
        let types = self.own.len();
        // Own rows, then the halo's, per type.
        let mut held: Vec<Option<TypeRows>> = Vec::with_capacity(types);
        for (t, (mine, theirs)) in prev.iter().zip(pulled).enumerate() {
            held.push(match (mine, theirs) {
                (None, None) => None,
                (Some(m), None) => Some(m.clone()),
                (None, Some(h)) if self.own[t].is_empty() => Some(h),
                (Some(m), Some(h)) if m.width == h.width => {
                    let mut data = Vec::with_capacity(m.data.len() + h.data.len());
                    data.extend_from_slice(&m.data);
                    data.extend_from_slice(&h.data);
                    Some(TypeRows {
                        width: m.width,
                        data,
                    })
                }
                _ => {
                    return Err(TrainError::Protocol(format!(
                        "stage {stage} of type {}: the peers' rows disagree with this partition's in width or presence",
                        self.shared.names[t]
                    )))
                }
            });
        }
        let mut next: Stage = vec![None; types];
        for (t, out) in next.iter_mut().enumerate() {
            let mut counted = 0;
            for chunk in self.own[t].chunks(self.shared.chunk) {
                let block = full_block(g, stage as usize, NodeTypeId(t as u32), chunk);
                let h: PerType = block
                    .src
                    .iter()
                    .enumerate()
                    .map(|(u, ids)| match &held[u] {
                        Some(r) if !ids.is_empty() => {
                            let mut buf = Vec::with_capacity(ids.len() * r.width);
                            for &v in ids {
                                let i = at[u][v as usize] as usize;
                                let row = r.data.get(i * r.width..(i + 1) * r.width).ok_or_else(
                                    || {
                                        TrainError::Internal(format!(
                                        "node {v} of type {} is neither owned here nor in the halo",
                                        self.shared.names[u]
                                    ))
                                    },
                                )?;
                                buf.extend_from_slice(row);
                            }
                            Ok(Some(
                                Tensor::from_vec(buf, (ids.len(), r.width), model.device())?
                                    .to_dtype(model.dtype())?,
                            ))
                        }
                        _ => Ok(None),
                    })
                    .collect::<Result<_>>()?;
                match layer_chunk(model, g, stage as usize, &block, &h, NodeTypeId(t as u32))? {
                    Some(x) => append(out, &x)?,
                    None => break,
                }
                (self.shared.progress)(chunk.len() as u64);
                counted += chunk.len();
            }
            // A type with no rows at this layer is done with it too (progress
            // counts each own node once per layer computed).
            if counted < self.own[t].len() {
                (self.shared.progress)((self.own[t].len() - counted) as u64);
            }
        }
        Ok(next)
    }

    /// The halo's rows of `stage`, per type in halo order (`None`: no rows).
    fn pull(&self, stage: u32, halo: &[Vec<u32>]) -> Result<Vec<Option<TypeRows>>> {
        let s = self.shared;
        let mut asks = Vec::new();
        for (t, ids) in halo.iter().enumerate() {
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
        let answers: Vec<(usize, usize, Result<Pulled>)> = self.handle.block_on(
            stream::iter(asks)
                .map(|(t, at, actor, msg)| async move {
                    (t, at, ask_rows(&actor, msg, ask, deadline).await)
                })
                .buffer_unordered(PULLS_IN_FLIGHT)
                .collect(),
        );
        let mut rows: Vec<Option<TypeRows>> = vec![None; halo.len()];
        let mut absent = vec![false; halo.len()];
        for (t, at, answer) in answers {
            match answer? {
                None => absent[t] = true,
                Some((width, data)) => {
                    let r = rows[t].get_or_insert_with(|| TypeRows {
                        width,
                        data: vec![0.0; halo[t].len() * width],
                    });
                    if r.width != width {
                        return Err(TrainError::Protocol(format!(
                            "stage {stage} of type {}: rows of {width} and {} floats",
                            s.names[t], r.width
                        )));
                    }
                    r.data[at * width..at * width + data.len()].copy_from_slice(&data);
                }
            }
        }
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

/// One pull's rows: `(width, values)`, or `None` where the stage has no rows of the type.
type Pulled = Option<(usize, Vec<f32>)>;

/// Appends a chunk's rows to a stage's rows of one type.
fn append(rows: &mut Option<TypeRows>, x: &Tensor) -> Result<()> {
    let (width, values) = host_rows(x)?;
    let r = rows.get_or_insert_with(|| TypeRows {
        width,
        data: Vec::new(),
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
                return Ok(Some((width as usize, floats(&data.0))));
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
