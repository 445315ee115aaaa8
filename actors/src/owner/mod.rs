//! Owner-compute, as the modes that sample mini-batches across partitions
//! share it: each partition's Sampler (the picks of the nodes it owns, with
//! the requester's keys) and FeatureStores (its rows of every node type,
//! learnable rows updated sparsely once every trainer has pushed), their
//! messages, the client side a training thread reads them through, and the
//! dense-gradient all-reduce of a step.

pub mod allreduce;
pub mod client;
pub mod messages;
pub mod priority;
pub mod sampler;
pub mod store;
pub mod worker;

use std::sync::Arc;

/// Per node type, the nodes partition `part` owns (`owners[type][node]`).
pub fn owned_counts(owners: &[Vec<u16>], part: u32) -> Vec<u64> {
    owners
        .iter()
        .map(|o| o.iter().filter(|&&p| u32::from(p) == part).count() as u64)
        .collect()
}

use actix::Actor;
use candle_core::{DType, Device};
use futures_util::future::join_all;
use graphs::HetGraph;
use models::embedding::EmbeddingTable;
use models::optim::{Adam, AdamConfig};
use models::Model;
use runtime::Node;

use crate::config::TrainingConfig;
use crate::distributed::messages::Begin;
use crate::distributed::{checkpoint, Part, System, Timeouts};
use crate::error::{Result, TrainError};
use graphs::link::Batching;
use messages::{Export, Pull, Push, Reset, SampleReq, Save};
use sampler::SamplerActor;
use store::{FeatureStore, Shard, StoreData};

/// Actor names of the owner-compute services.
pub mod names {
    use crate::distributed::names::plain;

    /// Sampler of partition `p`.
    pub fn sampler(p: u32) -> String {
        format!("sampler/{p}")
    }
    /// FeatureStore of node type `ty` in partition `p`.
    pub fn store(ty: &str, p: u32) -> String {
        format!("features/{}/{p}", plain(ty))
    }
}

/// A partition as its sampler and stores serve it.
pub struct Served<'a> {
    /// The partition.
    pub part: u32,
    /// Its graph.
    pub graph: &'a Arc<HetGraph>,
    /// The owner of every node.
    pub owners: &'a Arc<Vec<Vec<u16>>>,
    /// Edge-level tasks (link prediction, edge classification and
    /// regression): how their training edges fall into steps, so that the
    /// sampler leaves a step's edges out of its neighbourhoods.
    pub steps: Option<Batching>,
    /// The trainers whose pushes complete a step.
    pub pushers: u32,
    /// The rows its learnable stores start from instead of drawn ones (a
    /// fine-tuned run's `training.init_from`, a served checkpoint's).
    pub start: Option<&'a dyn StartRows>,
}

/// Rows a partition's learnable stores start from instead of drawn ones.
pub trait StartRows {
    /// Type `ty`'s rows of nodes `ids`, in order (`None`: drawn as a fresh run draws them).
    fn rows(&self, ty: usize, ids: &[u32]) -> Result<Option<Vec<f32>>>;
    /// Whether type `ty`'s rows stay as they start.
    fn frozen(&self, ty: usize) -> bool;
}

impl StartRows for crate::pretrained::init::Start {
    fn rows(&self, ty: usize, ids: &[u32]) -> Result<Option<Vec<f32>>> {
        Ok(crate::pretrained::init::Start::rows(self, ty, ids))
    }
    fn frozen(&self, ty: usize) -> bool {
        self.sel.frozen_table(ty)
    }
}

/// Registers partition `s.part`'s sampler and stores on `node`, each on a
/// thread of its own (an actix arbiter): serving a large pull must not hold
/// up a push, a sampling request or the transport, which stays on the node's
/// thread.
pub fn serve(
    node: &Node,
    s: Served,
    t: &TrainingConfig,
    arbiters: &mut Vec<actix::Arbiter>,
) -> Result<()> {
    let Served {
        part,
        graph,
        owners,
        steps,
        pushers,
        start,
    } = s;
    let reg = |e: runtime::WireError| TrainError::Internal(e.to_string());
    let on_own_thread = |arbiters: &mut Vec<actix::Arbiter>| {
        arbiters.push(actix::Arbiter::new());
        arbiters
            .last()
            .map(actix::Arbiter::handle)
            .expect("just pushed")
    };
    let sampler = SamplerActor::new(part as u16, graph.clone(), owners.clone(), steps);
    let addr = SamplerActor::start_in_arbiter(&on_own_thread(arbiters), move |_| sampler);
    node.register(&names::sampler(part), &addr)
        .map_err(reg)?
        .handle::<SampleReq>();
    let learnable = Model::learnable_types(t.model, graph);
    for (ty, nt) in graph.node_types().iter().enumerate() {
        let data = if nt.features.is_some() {
            StoreData::Features {
                graph: graph.clone(),
                ty,
            }
        } else if learnable[ty] {
            let owned: Vec<u32> = (0..nt.count)
                .filter(|&v| owners[ty][v as usize] as u32 == part)
                .collect();
            let name = format!("embed.{}", nt.name);
            let rows = match start {
                Some(st) => st.rows(ty, &owned)?.map(|r| (r, st.frozen(ty))),
                None => None,
            };
            let shard = Shard::new(
                t.seed,
                &name,
                nt.count as usize,
                t.embed_dim,
                owned,
                AdamConfig::with_lr(t.lr),
                pushers as usize,
            );
            StoreData::Embeddings(Box::new(match rows {
                Some((rows, frozen)) => shard.starting_from(rows, frozen),
                None => shard,
            }))
        } else {
            continue;
        };
        let files = t
            .checkpoint_dir
            .clone()
            .map(|root| (root, checkpoint::shard_file(&nt.name, part)));
        let store = FeatureStore::new(part as u16, owners.clone(), ty, data, files);
        let addr = FeatureStore::start_in_arbiter(&on_own_thread(arbiters), move |_| store);
        node.register(&names::store(&nt.name, part), &addr)
            .map_err(reg)?
            .handle::<Pull>()
            .handle::<Push>()
            .handle::<Export>()
            .handle::<Reset>()
            .handle::<Save>();
    }
    Ok(())
}

/// Places one worker per partition with its partition's sampler and stores
/// on the k-th node of `topology` (which loads partition k), the
/// coordinator where `[placement]` puts it, else on the first node; returns
/// the node of each partition. `mode` names the mode in the error for a
/// cluster of another size.
pub fn place_one_per_node(
    topology: &mut runtime::Topology,
    parts: u32,
    node_types: &[String],
    worker: fn(u32) -> String,
    mode: &str,
) -> Result<Vec<String>> {
    let ids: Vec<String> = topology
        .cluster
        .nodes
        .iter()
        .map(|n| n.id.clone())
        .collect();
    if parts as usize != ids.len() {
        return Err(TrainError::Config(format!("training.partitions: {parts} partitions for {} nodes; {mode} runs one partition per node (hetgnn partition --parts {})", ids.len(), ids.len())));
    }
    for (k, id) in ids.iter().enumerate() {
        let k = k as u32;
        let stores = node_types.iter().map(|ty| names::store(ty, k));
        for name in [worker(k), names::sampler(k)].into_iter().chain(stores) {
            topology.placement.insert(name, id.clone());
        }
    }
    let coordinator = crate::distributed::names::COORDINATOR;
    if topology.placed(coordinator).is_none() {
        if let Some(first) = ids.first() {
            topology
                .placement
                .insert(coordinator.to_string(), first.clone());
        }
    }
    Ok(ids)
}

/// A training thread's replica: the dense model on `t.device` without
/// learnable tables (the stores own those), its Adam state and the next step,
/// restored from the checkpoint `from` if any, else started from `start`'s
/// parameters (fine-tuning), whose frozen ones Adam leaves alone either way.
pub fn replica(
    t: &TrainingConfig,
    graph: &HetGraph,
    from: &Option<(std::path::PathBuf, checkpoint::Manifest)>,
    start: Option<&crate::pretrained::init::Start>,
) -> Result<(Model, Adam, u64)> {
    let device = crate::device::open(&t.device)?;
    let mut model = Model::without_tables(&t.model_spec(), graph, DType::F32, &device)?;
    let mut adam = Adam::new(AdamConfig::with_lr(t.lr));
    let mut seq = 0;
    if let Some(st) = start {
        st.copy_params(&mut model)?;
        adam.frozen = st.sel.frozen_params();
    }
    if let Some((dir, m)) = from {
        let mut tensors = checkpoint::load_tensors(dir, m, checkpoint::DENSE)?;
        models::checkpoint::restore_dense(dir, &mut tensors, &mut model, &mut adam)?;
        seq = m.seq;
    }
    Ok((model, adam, seq))
}

/// Partition `p.part`'s learnable stores restore the checkpoint `b` names
/// (or their initial rows) and serve generation `b.gen`.
pub fn reset_stores(p: &Part, t: &TrainingConfig, b: Begin) -> Result<()> {
    let learnable = Model::learnable_types(t.model, p.graph);
    let stores: Vec<String> = p
        .graph
        .node_types()
        .iter()
        .enumerate()
        .filter(|(ty, _)| learnable[*ty])
        .map(|(_, nt)| names::store(&nt.name, p.part))
        .collect();
    let refs = stores
        .iter()
        .map(|n| p.node.actor(n))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| TrainError::Internal(e.to_string()))?;
    let answers = p.handle.block_on(join_all(refs.iter().map(|r| {
        r.ask(
            Reset {
                gen: b.gen,
                from: b.from,
            },
            p.timeouts.ask,
        )
    })));
    for (name, a) in stores.iter().zip(answers) {
        a?.map_err(|e| TrainError::Checkpoint(format!("{name}: {e}")))?;
    }
    Ok(())
}

/// The whole model: `replica`'s dense parameters and every learnable table
/// exported from the stores of the `parts` partitions.
pub fn assemble(
    t: &TrainingConfig,
    system: &System,
    parts: u32,
    replica: &Model,
    g: &HetGraph,
) -> Result<Model> {
    // Tables without Adam moments (they stay in the stores' checkpoints): the
    // whole model is read (its hash, the caller's outputs), never trained on.
    let mut model = Model::without_tables(&t.model_spec(), g, DType::F32, &Device::Cpu)?;
    for (name, var) in model.params.iter() {
        let theirs = replica
            .params
            .get(name)
            .ok_or_else(|| TrainError::Internal(format!("the replica has no parameter {name}")))?;
        var.set(
            &theirs
                .as_tensor()
                .to_device(&Device::Cpu)?
                .to_dtype(DType::F32)?,
        )?;
    }
    let learnable = Model::learnable_types(t.model, g);
    for (ty, nt) in g.node_types().iter().enumerate() {
        if !learnable[ty] {
            continue;
        }
        let slot = model.embeddings.get_mut(ty).ok_or_else(|| {
            TrainError::Internal(format!("the model has no slot for node type {}", nt.name))
        })?;
        let (rows, dim) = (nt.count as usize, t.embed_dim);
        let data = export_table(system, parts, &nt.name, rows, dim)?;
        *slot = Some(EmbeddingTable::frozen(
            &format!("embed.{}", nt.name),
            rows,
            dim,
            data,
        ));
    }
    Ok(model)
}

/// The rows of `name`'s learnable table, whole (`count` rows of `dim`),
/// from the stores of every partition, asked one partition at a time, so
/// that the coordinator's node holds one partition's rows besides the
/// table, not every partition's and a second table (at mag-like S=1,
/// 600 MB more at the end of a run).
fn export_table(
    system: &System,
    parts: u32,
    name: &str,
    count: usize,
    dim: usize,
) -> Result<Vec<f32>> {
    let mut table = vec![0.0f32; count * dim];
    let ask = Timeouts::default().ask;
    // Each row has one owner: a row exported twice, or none, would leave initial values in.
    let mut seen = vec![false; count];
    for p in 0..parts {
        let store = names::store(name, p);
        let r = system
            .node
            .actor(&store)
            .map_err(|e| TrainError::Internal(e.to_string()))?;
        let (ids, data) = system
            .handle
            .block_on(r.ask(Export, ask))?
            .map_err(|e| e.from_actor(store.clone()))?;
        let bytes = &data.0;
        if bytes.len() != ids.len() * dim * 4 {
            return Err(TrainError::Protocol(format!(
                "{store}: {} bytes exported for {} rows of {dim}",
                bytes.len(),
                ids.len()
            )));
        }
        for (&id, src) in ids.iter().zip(bytes.chunks_exact(dim * 4)) {
            if std::mem::replace(
                seen.get_mut(id as usize).ok_or_else(|| {
                    TrainError::Protocol(format!("{store}: exported row {id} out of range"))
                })?,
                true,
            ) {
                return Err(TrainError::Protocol(format!(
                    "{store}: row {id} exported by two stores"
                )));
            }
            // In range: `seen` has a slot per row of the table.
            let at = id as usize * dim;
            for (d, b) in table[at..at + dim].iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(TrainError::Protocol(format!(
            "{name}: row {missing} exported by no partition's store"
        )));
    }
    Ok(table)
}
