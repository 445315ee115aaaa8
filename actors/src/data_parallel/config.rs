//! `[training.data-parallel]`: data-parallel training's own settings.

use serde::{Deserialize, Serialize};

use crate::config::{LinkEval, NegativeSampler, Task, TrainingConfig};
use crate::error::{Result, TrainError};
use crate::modes::seam::ModeConfig;

/// Most threads of a sampling worker (`dag_threads`).
pub const MAX_DAG_THREADS: u32 = 1024;
/// Most batches a trainer may have in flight (`dag_max_in_flight`).
pub const MAX_DAG_IN_FLIGHT: u32 = 256;

/// Which seeds of a global batch each data-parallel trainer takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeedAssignment {
    /// The seeds its partition owns (DistDGL: the neighbourhoods start local).
    #[default]
    Owner,
    /// Slice k of the shuffled batch for trainer k, wherever its seeds live
    /// (HopGNN's model-centric baseline): the trainers' work, and so the
    /// model, does not depend on the partitioning at all.
    Random,
}

/// How a data-parallel trainer's batches are sampled and their rows fetched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sampling {
    /// One prefetch thread per trainer samples and gathers each batch end to end (the default).
    #[default]
    Pipeline,
    /// ByteGNN: each batch a DAG of one-hop tasks on the partition's
    /// sampling worker, many batches in flight, launched by measured rates.
    Dag,
}

/// `[training.data-parallel]`
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataParallelConfig {
    /// Which seeds each trainer takes, "owner" (default) or "random".
    pub seed_assignment: SeedAssignment,
    /// "pipeline" (default) or "dag" (ByteGNN's sampling worker).
    pub sampling: Sampling,
    /// `sampling = "dag"`: the sampling worker's threads (default 0: one per core).
    pub dag_threads: u32,
    /// `sampling = "dag"`: most batches sampled at once per trainer (default 8).
    pub dag_max_in_flight: u32,
    /// `sampling = "dag"`: destination rows per one-hop task (default 512).
    pub dag_chunk_rows: u32,
    /// Benchmarks: the trainers drop each batch unused (no forward, no
    /// update, no evaluation), so an epoch measures sampling and fetching
    /// alone (default false).
    pub sampling_sink: bool,
}

impl Default for DataParallelConfig {
    fn default() -> Self {
        DataParallelConfig {
            seed_assignment: SeedAssignment::Owner,
            sampling: Sampling::Pipeline,
            dag_threads: 0,
            dag_max_in_flight: 8,
            dag_chunk_rows: 512,
            sampling_sink: false,
        }
    }
}

impl ModeConfig for DataParallelConfig {
    const FORMER_KEYS: &'static [(&'static str, &'static str)] = &[
        ("seed_assignment", "seed_assignment"),
        ("sampling", "sampling"),
        ("dag_threads", "dag_threads"),
        ("dag_max_in_flight", "dag_max_in_flight"),
        ("dag_chunk_rows", "dag_chunk_rows"),
        ("sampling_sink", "sampling_sink"),
    ];

    fn check(&self, t: &TrainingConfig) -> Result<()> {
        let bad = |m: String| Err(TrainError::Config(m));
        let d = DataParallelConfig::default();
        let dag_defaults = self.dag_threads == d.dag_threads
            && self.dag_max_in_flight == d.dag_max_in_flight
            && self.dag_chunk_rows == d.dag_chunk_rows;
        if self.sampling == Sampling::Pipeline && !dag_defaults {
            return bad("training.data-parallel.dag_threads, dag_max_in_flight and dag_chunk_rows apply to sampling = \"dag\"".into());
        }
        if self.dag_threads > MAX_DAG_THREADS
            || self.dag_max_in_flight == 0
            || self.dag_max_in_flight > MAX_DAG_IN_FLIGHT
            || self.dag_chunk_rows == 0
        {
            return bad(format!("training.data-parallel.dag_threads must be in 0..={MAX_DAG_THREADS} (0: one per core), dag_max_in_flight in 1..={MAX_DAG_IN_FLIGHT}, dag_chunk_rows at least 1"));
        }
        if t.mixed_tasks().is_some() && self.sampling == Sampling::Dag {
            return bad("training.data-parallel.sampling = \"dag\" samples one batch a step; a task list with a task on edges (two batches a step) samples with \"pipeline\"".into());
        }
        if let Some(task) = t.edge_level().filter(|e| e.on_edges()) {
            let name = task.name();
            if t.edge_eval == LinkEval::Exact {
                return bad(format!("training.edge_eval = \"exact\" needs the whole graph in one process: data-parallel training evaluates training.task = \"{name}\" with \"sampled\""));
            }
            if self.seed_assignment != SeedAssignment::Owner {
                return bad(format!("training.data-parallel.seed_assignment: the steps of training.task = \"{name}\" are owned by the partition of each edge's source (\"owner\")"));
            }
            if self.sampling == Sampling::Dag {
                return bad(format!("training.data-parallel.sampling = \"dag\" samples node and link-prediction steps; training.task = \"{name}\" samples with \"pipeline\""));
            }
        }
        if t.edge_level() == Some(Task::LinkPrediction) {
            if t.negative_sampler == NegativeSampler::InBatch {
                return bad("training.negative_sampler = \"in-batch\" needs every positive of a step in one process: single-process training only".into());
            }
            if t.link_eval == LinkEval::Exact {
                return bad("training.link_eval = \"exact\" needs the whole graph in one process: data-parallel training evaluates with \"sampled\"".into());
            }
            if self.seed_assignment != SeedAssignment::Owner {
                return bad("training.data-parallel.seed_assignment: link prediction's steps are owned by the partition of each edge's source (\"owner\")".into());
            }
        }
        Ok(())
    }
}
