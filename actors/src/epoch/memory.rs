//! What a run will hold in memory, part by part: checked against the
//! machine's budget before anything is allocated, and reported beside the
//! measured peak so that the estimate stays an upper bound (tests compare
//! the two for every mode).

use std::fmt;

use graphs::memory::human;
use graphs::HetGraph;

use crate::config::{Task, TrainingConfig};
use crate::error::{Result, TrainError};

/// What a process holds whatever it trains: code and its pages, thread
/// stacks, the allocator's and the async runtime's own (measured: 110-180
/// MiB for a run of a few kilobytes of weights).
pub const RUNTIME_BYTES: u128 = 192 << 20;

/// What each node of a cluster adds in its process: its actor system and
/// arbiters' threads, transport buffers and queues.
pub const NODE_BYTES: u128 = 48 << 20;

/// Copies of a step's pulled input rows a distributed trainer's step holds
/// beyond the step's own (the decoded rows are its input): the store's
/// encoded reply, the gradients on their way back encoded, and the store's
/// sum of them until every trainer has pushed.
pub const TRANSPORT_COPIES: u128 = 3;

/// A run's memory, part by part (parts of one name add up).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    parts: Vec<(&'static str, u128)>,
}

impl MemoryPlan {
    /// A plan holding only the process's [`RUNTIME_BYTES`].
    pub fn process() -> MemoryPlan {
        let mut plan = MemoryPlan::default();
        plan.add("runtime", RUNTIME_BYTES);
        plan
    }

    /// Adds `bytes` to the part `what`.
    pub fn add(&mut self, what: &'static str, bytes: u128) -> &mut MemoryPlan {
        match self.parts.iter_mut().find(|(w, _)| *w == what) {
            Some((_, b)) => *b = b.saturating_add(bytes),
            None => self.parts.push((what, bytes)),
        }
        self
    }

    /// Every part's bytes, summed.
    pub fn total(&self) -> u128 {
        self.parts
            .iter()
            .fold(0u128, |sum, (_, b)| sum.saturating_add(*b))
    }

    /// The bytes of part `what` (0 when absent).
    pub fn part(&self, what: &str) -> u128 {
        self.parts
            .iter()
            .find(|(w, _)| *w == what)
            .map_or(0, |(_, b)| *b)
    }

    /// Refuses the plan when its total is over the machine's budget
    /// (`what`: the settings it follows from, for the message).
    pub fn check(&self, what: &str) -> Result<()> {
        graphs::memory::check_fits(&format!("{what} [{self}]"), self.total())
            .map_err(|e| TrainError::Config(e.0))
    }

    /// Adds one model's dense weights (`g` the graph it reads) and, with
    /// `tables`, the learnable rows of `g`.
    pub fn model(&mut self, t: &TrainingConfig, g: &HetGraph, tables: bool) -> &mut MemoryPlan {
        let spec = t.model_spec();
        self.add("weights and optimizer", spec.dense_bytes(g));
        if tables {
            self.tables(t, g, None);
        }
        self
    }

    /// Adds one trainer's work on `g`: its step (or, when larger, an
    /// evaluation batch's forward pass) and `ahead` batches prepared ahead
    /// of it (their feature rows: learnable rows are read when a batch is
    /// used), and `in_transit` copies of its input rows on their way between
    /// actors (see [`TRANSPORT_COPIES`]).
    pub fn trainer(
        &mut self,
        t: &TrainingConfig,
        g: &HetGraph,
        ahead: usize,
        in_transit: u128,
    ) -> &mut MemoryPlan {
        let spec = t.model_spec();
        let step = spec.step_memory(g, &t.fanouts, seeds(t));
        // An evaluation batch keeps no gradients: half a step's terms, on more seeds.
        let eval = spec
            .step_memory(g, &t.fanouts, crate::epoch::EVAL_BATCH)
            .activations
            / 2;
        let peak = step.activations.max(eval);
        self.add("training step", peak);
        // The allocator keeps a step's freed buffers for the next one
        // (measured: a quarter of a step's terms in resident pages).
        self.add("allocator's kept pages", peak / 4);
        self.add(
            "batches prepared ahead",
            step.features.saturating_mul(ahead as u128),
        );
        if in_transit > 0 {
            self.add("rows in transit", step.inputs.saturating_mul(in_transit));
        }
        self
    }

    /// Adds the learnable rows of `g`'s types, `rows` of each where given
    /// (else all), with their optimizer state.
    pub fn tables(
        &mut self,
        t: &TrainingConfig,
        g: &HetGraph,
        rows: Option<&[u64]>,
    ) -> &mut MemoryPlan {
        let bytes = t.model_spec().table_bytes_of(g, rows);
        self.add("learnable rows and optimizer", bytes)
    }

    /// Adds a loaded graph.
    pub fn graph(&mut self, g: &HetGraph) -> &mut MemoryPlan {
        self.add("graph", u128::from(g.heap_bytes()))
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, (what, b)) in self.parts.iter().enumerate() {
            if k > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{what} {}", human(*b))?;
        }
        Ok(())
    }
}

/// The seeds one step embeds: a link-prediction batch embeds both
/// endpoints of each edge and its negatives, an edge batch both endpoints;
/// a task list with a task on edges, its batch beside the nodes'.
fn seeds(t: &TrainingConfig) -> usize {
    let of = |task: Task| match task {
        Task::NodeClassification | Task::NodeRegression | Task::MultiLabel => t.batch,
        Task::LinkPrediction => t.batch.saturating_mul(2 + t.negatives),
        Task::EdgeClassification | Task::EdgeRegression => t.batch.saturating_mul(2),
    };
    match t.mixed_tasks() {
        Some(at) => t.batch.saturating_add(of(t.tasks[at].task)),
        None => of(t.task),
    }
}

/// The settings a plan follows from, for messages.
pub fn settings(t: &TrainingConfig, g: &HetGraph) -> String {
    format!(
        "training.batch {}, training.fanouts {:?}, training.hidden {}, training.embed_dim {}, training.layers {}; {} classes",
        t.batch,
        t.fanouts,
        t.hidden,
        t.embed_dim,
        t.layers,
        g.num_classes()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_one_name_add_up_and_the_total_is_their_sum() {
        let mut p = MemoryPlan::process();
        p.add("graph", 10)
            .add("graph", 5)
            .add("training step", 1 << 20);
        assert_eq!(p.part("graph"), 15);
        assert_eq!(p.total(), RUNTIME_BYTES + 15 + (1 << 20));
        let shown = p.to_string();
        assert!(
            shown.starts_with("runtime 192.0 MiB, graph 15 B, training step 1.0 MiB"),
            "{shown}"
        );
        p.add("huge", u128::MAX);
        assert_eq!(p.total(), u128::MAX, "saturates");
    }
}
