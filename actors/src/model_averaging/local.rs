//! One partition's local training state: its model and Adam state, and the
//! learnable rows of the nodes it holds (owned and halo), each with its own
//! Adam state. A partition samples, computes and updates only on its own
//! graph; nothing here talks to the network.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use graphs::HetGraph;
use models::embedding::EmbeddingTable;
use models::model::{DropoutKey, FeatureGather};
use models::optim::{Adam, AdamConfig};
use models::rgcn::PerType;
use models::Model;

use super::LocalBatch;
use crate::config::TrainingConfig;
use crate::distributed::checkpoint;
use crate::distributed::messages::EpochStats;
use crate::epoch::{lap, sample, Prepared, SamplingPlan, EVAL_BATCH};
use crate::error::{Result, TrainError};
use crate::task::multi::NodeTasks;
use crate::task::node::Scores;

/// The learnable rows of one node type a partition holds, ids ascending.
pub struct LocalRows {
    /// Global ids of the rows held.
    pub ids: Vec<u32>,
    /// Their values and Adam state: row `k` is node `ids[k]`.
    pub table: EmbeddingTable,
    /// Per row, whether this round's steps updated it.
    pub touched: Vec<bool>,
}

impl LocalRows {
    /// Rows `ids` (ascending) as a single process initialises them.
    fn new(seed: u64, name: &str, dim: usize, ids: Vec<u32>) -> LocalRows {
        let table = EmbeddingTable::rows_of(seed, name, dim, &ids);
        LocalRows {
            touched: vec![false; ids.len()],
            ids,
            table,
        }
    }

    /// The local row of node `id`.
    pub fn index(&self, id: u32) -> Option<usize> {
        self.ids.binary_search(&id).ok()
    }

    /// The local rows of nodes `ids`, every one held.
    fn map(&self, ids: &[u32]) -> Result<Vec<u32>> {
        ids.iter()
            .map(|&id| {
                self.index(id).map(|k| k as u32).ok_or_else(|| {
                    TrainError::Protocol(format!(
                        "{}: node {id} is not held by this partition",
                        self.table.name
                    ))
                })
            })
            .collect()
    }

    /// Row `k`'s values.
    pub fn row(&self, k: usize) -> &[f32] {
        &self.table.data[k * self.table.dim..(k + 1) * self.table.dim]
    }

    /// Replaces row `k`'s values (its Adam state stays this partition's).
    pub fn set_row(&mut self, k: usize, values: &[f32]) {
        let d = self.table.dim;
        self.table.data[k * d..(k + 1) * d].copy_from_slice(values);
    }
}

/// One partition's state.
pub struct Local {
    /// The partition.
    pub part: u32,
    /// Its graph (global ids; features of owned and halo nodes).
    pub graph: Arc<HetGraph>,
    /// Its model (dense parameters; no tables: see `rows`).
    pub model: Model,
    /// Its optimiser of the dense parameters.
    pub adam: Adam,
    /// Per node type, the learnable rows held (`None`: not learnable).
    pub rows: Vec<Option<LocalRows>>,
    /// Per node type, whether its rows stay as they started (`training.freeze`).
    frozen: Vec<bool>,
    /// Training, validation and test nodes it owns.
    pub train: Vec<u32>,
    /// See `train`.
    pub valid: Vec<u32>,
    /// See `train`.
    pub test: Vec<u32>,
    /// The dense parameters (name order) as the round began.
    start: Vec<Vec<f32>>,
    gather: FeatureGather,
    device: Device,
}

/// A step's figures.
pub struct StepOut {
    /// The partition's loss.
    pub loss: f64,
    /// Correct training predictions.
    pub correct: u64,
    /// Several tasks: each one's own loss (empty for one task).
    pub each: Vec<f64>,
}

impl Local {
    /// Partition `part` of `graph` (whose nodes `owners` places), as
    /// initialised for training, or as `start` (a fine-tuned run's) says.
    pub fn new(
        t: &TrainingConfig,
        part: u32,
        graph: Arc<HetGraph>,
        owners: &[Vec<u16>],
        start: Option<&crate::pretrained::init::Start>,
    ) -> Result<Local> {
        let device = crate::device::open(&t.device)?;
        let mut model = Model::without_tables(&t.model_spec(), &graph, DType::F32, &device)?;
        let learnable = Model::learnable_types(t.model, &graph);
        let held = held_nodes(&graph, owners, part);
        let mut rows: Vec<Option<LocalRows>> = graph
            .node_types()
            .iter()
            .enumerate()
            .zip(held)
            .map(|((ty, nt), ids)| {
                learnable[ty].then(|| {
                    LocalRows::new(t.seed, &format!("embed.{}", nt.name), t.embed_dim, ids)
                })
            })
            .collect();
        let mut adam = Adam::new(AdamConfig::with_lr(t.lr));
        let mut frozen = vec![false; rows.len()];
        if let Some(st) = start {
            st.copy_params(&mut model)?;
            adam.frozen = st.sel.frozen_params();
            for (ty, r) in rows.iter_mut().enumerate() {
                if let Some(r) = r {
                    if let Some(values) = st.rows(ty, &r.ids) {
                        r.table.data = values;
                    }
                }
                frozen[ty] = st.sel.frozen_table(ty);
            }
        }
        let (_, splits) = graph.target_labels();
        let target = graph.target().index();
        let own = |ids: &[u32]| {
            ids.iter()
                .copied()
                .filter(|&v| u32::from(owners[target][v as usize]) == part)
                .collect::<Vec<u32>>()
        };
        let (train, valid, test) = (own(&splits.train), own(&splits.valid), own(&splits.test));
        let gather = model.feature_gather();
        let mut local = Local {
            part,
            graph,
            model,
            adam,
            rows,
            frozen,
            train,
            valid,
            test,
            start: Vec::new(),
            gather,
            device,
        };
        local.begin_round()?;
        Ok(local)
    }

    /// Its weight in the average: the training nodes it owns (CATGNN's alpha).
    pub fn weight(&self) -> u64 {
        self.train.len() as u64
    }

    /// Seeds per step: `batch`, or its share of it (the partition's share
    /// of the `total` training nodes, rounded up; all of it for one partition).
    pub fn batch(&self, batch: usize, rule: LocalBatch, total: usize) -> usize {
        match rule {
            LocalBatch::Whole => batch,
            LocalBatch::Share => ((batch as u128 * self.train.len() as u128)
                .div_ceil(total.max(1) as u128) as usize)
                .max(1),
        }
    }

    /// What its prefetch thread reads.
    pub fn feed(&self, t: &TrainingConfig) -> Feed {
        Feed {
            graph: self.graph.clone(),
            gather: self.gather.clone(),
            uses_neighbors: self.model.uses_neighbors(),
            plan: SamplingPlan::of(t),
        }
    }

    /// The inputs of a batch: its feature rows and its learnable rows (as
    /// fresh tensors whose gradients feed the sparse Adam), with the local
    /// rows of the latter per type.
    fn inputs(&self, src: &[Vec<u32>], mut inputs: PerType) -> Result<(PerType, Vec<Vec<u32>>)> {
        let mut at = vec![Vec::new(); src.len()];
        let target = self.graph.target().index();
        for (ty, ids) in src.iter().enumerate() {
            let wanted = self.model.uses_neighbors() || ty == target;
            if ids.is_empty() || !wanted || inputs[ty].is_some() {
                continue;
            }
            let rows = self.rows[ty].as_ref().ok_or_else(|| {
                TrainError::Internal(format!(
                    "node type {ty} has neither features nor learnable rows"
                ))
            })?;
            at[ty] = rows.map(ids)?;
            inputs[ty] = Some(
                rows.table
                    .gather_var(&at[ty], self.model.dtype(), &self.device)?,
            );
        }
        Ok((inputs, at))
    }

    /// One training step of `task` on a prepared batch; times go into `st`.
    pub fn step(
        &mut self,
        task: &NodeTasks,
        (epoch, step): (u64, u64),
        p: Prepared,
        st: &mut EpochStats,
    ) -> Result<StepOut> {
        let mb = &p.mb;
        st.time.sample_s += p.sample_s;
        st.time.gather_s += p.gather_s;
        let mut clock = Instant::now();
        let (inputs, at) = self.inputs(&mb.blocks[0].src, p.features)?;
        st.time.gather_s += lap(&mut clock);
        let logits = self.model.forward(
            &self.graph,
            mb,
            inputs.clone(),
            Some(DropoutKey { epoch, step }),
        )?;
        let losses = task.loss(&logits, &mb.seeds)?;
        let grads = losses.total.backward()?;
        st.time.compute_s += lap(&mut clock);
        self.adam.step(&self.model.params, &grads)?;
        for (ty, x) in inputs.iter().enumerate() {
            if self.frozen[ty] {
                continue;
            }
            if let (Some(x), Some(rows)) = (x, self.rows[ty].as_mut()) {
                if let Some(g) = grads.get(x) {
                    rows.table.sparse_adam(&at[ty], g, &self.adam.cfg)?;
                    at[ty].iter().for_each(|&k| rows.touched[k as usize] = true);
                }
            }
        }
        st.time.update_s += lap(&mut clock);
        let scalar = |x: &Tensor| x.to_dtype(DType::F64)?.to_scalar::<f64>();
        Ok(StepOut {
            loss: scalar(&losses.total)?,
            correct: task.correct(&logits, &mb.seeds)?,
            each: losses
                .each
                .iter()
                .map(scalar)
                .collect::<candle_core::Result<_>>()?,
        })
    }

    /// Adds each task's evaluation figures of its model on `nodes` (sampled
    /// within the partition, no dropout) to `scores`.
    pub fn score(
        &self,
        t: &TrainingConfig,
        task: &NodeTasks,
        epoch: u64,
        nodes: &[u32],
        scores: &mut [Scores],
    ) -> Result<()> {
        let mut sampler = SamplingPlan::of(t).eval(&self.graph)?;
        for (step, seeds) in nodes.chunks(EVAL_BATCH).enumerate() {
            let mb = sample(
                &mut sampler,
                self.model.uses_neighbors(),
                epoch,
                step as u64,
                seeds,
            )?;
            let features = self.gather.gather(&self.graph, &mb.blocks[0].src)?;
            let (inputs, _) = self.inputs(&mb.blocks[0].src, features)?;
            let logits = self.model.forward(&self.graph, &mb, inputs, None)?.detach();
            task.score(&logits, seeds, scores)?;
        }
        Ok(())
    }

    /// The dense parameters in name order, flattened.
    pub fn params(&self) -> Result<Vec<Vec<f32>>> {
        self.model
            .params
            .iter()
            .map(|(_, v)| {
                Ok(v.as_tensor()
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?)
            })
            .collect()
    }

    /// Per parameter, whether the round changed it (bit for bit), and the values of those that changed.
    pub fn changed(&self) -> Result<(Vec<bool>, Vec<f32>)> {
        let now = self.params()?;
        let changed: Vec<bool> = now
            .iter()
            .zip(&self.start)
            .map(|(a, b)| {
                a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits())
            })
            .collect();
        let values = now
            .into_iter()
            .zip(&changed)
            .filter(|(_, c)| **c)
            .flat_map(|(v, _)| v)
            .collect();
        Ok((changed, values))
    }

    /// Sets the dense parameters (name order, flattened).
    pub fn set_params(&mut self, values: &[Vec<f32>]) -> Result<()> {
        for ((name, var), v) in self.model.params.iter().zip(values) {
            if v.len() != var.elem_count() {
                return Err(TrainError::Protocol(format!(
                    "parameter {name}: {} values for {}",
                    v.len(),
                    var.elem_count()
                )));
            }
            var.set(&Tensor::from_slice(v, var.shape(), var.device())?.to_dtype(var.dtype())?)?;
        }
        Ok(())
    }

    /// A round begins: what changes from here on is measured from now.
    pub fn begin_round(&mut self) -> Result<()> {
        self.start = self.params()?;
        for r in self.rows.iter_mut().flatten() {
            r.touched.iter_mut().for_each(|t| *t = false);
        }
        Ok(())
    }

    /// Writes its files of the checkpoint at `seq` (a round's end): its
    /// dense state and halo rows (`local.<p>`), and its owned rows as
    /// embedding shards (`embed.<type>.<p>`, which assemble a whole model).
    pub fn save(
        &self,
        root: &std::path::Path,
        seq: u64,
        owners: &[Vec<u16>],
    ) -> Result<Vec<(String, String)>> {
        let dir = checkpoint::partial_dir(root, seq);
        let mut local = models::checkpoint::dense_tensors(&self.model, &self.adam)?;
        let mut files = Vec::new();
        for (ty, rows) in self.rows.iter().enumerate() {
            let Some(rows) = rows else { continue };
            let owned = |k: &usize| u32::from(owners[ty][rows.ids[*k] as usize]) == self.part;
            let (mine, halo): (Vec<usize>, Vec<usize>) = (0..rows.ids.len()).partition(owned);
            let name = crate::distributed::names::plain(&self.graph.node_types()[ty].name);
            files.push(checkpoint::write_tensors(
                &dir,
                &checkpoint::shard_file(&self.graph.node_types()[ty].name, self.part),
                &row_tensors(rows, &mine, "")?,
            )?);
            local.extend(row_tensors(rows, &halo, &format!("halo.{name}."))?);
        }
        files.push(checkpoint::write_tensors(
            &dir,
            &local_file(self.part),
            &local,
        )?);
        Ok(files)
    }

    /// Restores what [`Local::save`] wrote into the checkpoint `dir`.
    pub fn restore(&mut self, dir: &std::path::Path, m: &checkpoint::Manifest) -> Result<()> {
        let mut local = checkpoint::load_tensors(dir, m, &local_file(self.part))?;
        models::checkpoint::restore_dense(dir, &mut local, &mut self.model, &mut self.adam)?;
        for ty in 0..self.rows.len() {
            if self.rows[ty].is_none() {
                continue;
            }
            let nt = &self.graph.node_types()[ty].name;
            let mut shard =
                checkpoint::load_tensors(dir, m, &checkpoint::shard_file(nt, self.part))?;
            let halo = format!("halo.{}.", crate::distributed::names::plain(nt));
            let rows = self.rows[ty].as_mut().expect("checked above");
            let mut seen = vec![false; rows.ids.len()];
            restore_rows(rows, &mut seen, &mut shard, "")
                .and_then(|()| restore_rows(rows, &mut seen, &mut local, &halo))
                .map_err(|e| TrainError::Checkpoint(format!("{}: {nt}: {e}", dir.display())))?;
            if let Some(k) = seen.iter().position(|s| !s) {
                return Err(TrainError::Checkpoint(format!(
                    "{}: no file holds row {} of {nt} for partition {}",
                    dir.display(),
                    rows.ids[k],
                    self.part
                )));
            }
        }
        self.begin_round()
    }
}

/// What a partition's prefetch thread reads: the graph and how to gather its features.
pub struct Feed {
    /// The partition's graph.
    pub graph: Arc<HetGraph>,
    /// Its feature rows.
    pub gather: FeatureGather,
    /// Whether the model reads neighbourhoods.
    pub uses_neighbors: bool,
    /// Fanouts and seeds.
    pub plan: SamplingPlan,
}

/// A partition's file of its dense state and halo rows.
fn local_file(part: u32) -> String {
    format!("local.{part}.safetensors")
}

/// Rows `at` of `rows` (ids, values, Adam state), their names prefixed.
fn row_tensors(rows: &LocalRows, at: &[usize], prefix: &str) -> Result<HashMap<String, Tensor>> {
    let (d, cpu) = (rows.table.dim, &Device::Cpu);
    let t = &rows.table;
    let pick = |v: &[f32]| {
        at.iter()
            .flat_map(|&k| v[k * d..(k + 1) * d].iter().copied())
            .collect::<Vec<f32>>()
    };
    let n = at.len();
    Ok(HashMap::from([
        (
            format!("{prefix}ids"),
            Tensor::from_vec(
                at.iter().map(|&k| rows.ids[k]).collect::<Vec<u32>>(),
                n,
                cpu,
            )?,
        ),
        (
            format!("{prefix}data"),
            Tensor::from_vec(pick(&t.data), (n, d), cpu)?,
        ),
        (
            format!("{prefix}m"),
            Tensor::from_vec(pick(&t.m), (n, d), cpu)?,
        ),
        (
            format!("{prefix}v"),
            Tensor::from_vec(pick(&t.v), (n, d), cpu)?,
        ),
        (
            format!("{prefix}steps"),
            Tensor::from_vec(at.iter().map(|&k| t.steps[k]).collect::<Vec<u32>>(), n, cpu)?,
        ),
    ]))
}

/// Puts the rows `tensors` holds under `prefix` back into `rows`, each held row once.
fn restore_rows(
    rows: &mut LocalRows,
    seen: &mut [bool],
    tensors: &mut HashMap<String, Tensor>,
    prefix: &str,
) -> std::result::Result<(), String> {
    let mut take = |k: &str| {
        tensors
            .remove(&format!("{prefix}{k}"))
            .ok_or_else(|| format!("tensor '{prefix}{k}' is missing"))
    };
    let ids: Vec<u32> = take("ids")?.to_vec1().map_err(|e| e.to_string())?;
    let flat = |t: Tensor| {
        t.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| e.to_string())
    };
    let (data, m, v) = (flat(take("data")?)?, flat(take("m")?)?, flat(take("v")?)?);
    let steps: Vec<u32> = take("steps")?.to_vec1().map_err(|e| e.to_string())?;
    let d = rows.table.dim;
    if [data.len(), m.len(), v.len()]
        .iter()
        .any(|&l| l != ids.len() * d)
        || steps.len() != ids.len()
    {
        return Err(format!("{} ids but rows of other sizes", ids.len()));
    }
    for (i, &id) in ids.iter().enumerate() {
        let k = rows
            .index(id)
            .ok_or_else(|| format!("row {id} is not held by this partition"))?;
        if std::mem::replace(&mut seen[k], true) {
            return Err(format!("row {id} twice"));
        }
        let (src, dst) = (i * d..(i + 1) * d, k * d..(k + 1) * d);
        rows.table.data[dst.clone()].copy_from_slice(&data[src.clone()]);
        rows.table.m[dst.clone()].copy_from_slice(&m[src.clone()]);
        rows.table.v[dst].copy_from_slice(&v[src]);
        rows.table.steps[k] = steps[i];
    }
    Ok(())
}

/// Per node type, the nodes partition `part` holds: those it owns and every
/// end of its edges (its halo), ascending.
pub fn held_nodes(g: &HetGraph, owners: &[Vec<u16>], part: u32) -> Vec<Vec<u32>> {
    let mut held: Vec<Vec<bool>> = owners
        .iter()
        .map(|o| o.iter().map(|&p| u32::from(p) == part).collect())
        .collect();
    for r in g.relations() {
        let csr = r.in_csr();
        let (s, d) = (r.src.index(), r.dst.index());
        for v in 0..csr.num_rows() as u32 {
            let n = csr.neighbors(v);
            if !n.is_empty() {
                held[d][v as usize] = true;
                n.iter().for_each(|&u| held[s][u as usize] = true);
            }
        }
    }
    held.into_iter()
        .map(|h| (0..h.len() as u32).filter(|&v| h[v as usize]).collect())
        .collect()
}
