//! Node tasks trained together on the target type: each reads its columns
//! of a target node's output row ([`models::ModelSpec::head_columns`]) and
//! the model learns the sum of their weighted losses. A single task is the
//! one-part case, computed exactly as that task alone.
//!
//! The primary task's target is on every split node; another task's may be
//! missing on some (a node with a label but no value): such a node is left
//! out of that task's loss and evaluation. A task's loss is its mean over
//! the batch's nodes that have its target, so that a trainer holding part
//! of the batch adds its sum divided by the whole batch's count of them.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use candle_core::Tensor;
use graphs::HetGraph;

use crate::config::{Task, TrainingConfig};
use crate::distributed::messages::EpochStats;
use crate::error::Result;
use crate::task::node::{NodeTask, Scores};

/// One task of a run, its weight and its output columns.
#[derive(Clone, Debug)]
pub struct Part<'g> {
    /// The task.
    pub task: Task,
    /// Its loss's weight.
    pub weight: f64,
    /// Its columns of a target node's output row.
    pub columns: Range<usize>,
    /// Its targets, loss and metrics.
    pub node: NodeTask<'g>,
}

/// The node tasks a run learns (one, or `training.tasks`).
#[derive(Clone, Debug)]
pub struct NodeTasks<'g> {
    parts: Vec<Part<'g>>,
    /// Whether `training.tasks` lists them (figures per task are reported).
    multi: bool,
}

/// A task's losses on a batch: the sum trained on, and each task's (multi-task only).
pub struct Losses {
    /// What the model is trained on.
    pub total: Tensor,
    /// Each task's own loss, unweighted (empty for a single task).
    pub each: Vec<Tensor>,
}

impl<'g> NodeTasks<'g> {
    /// The node tasks of `t` on `g`, with the columns of the model `t` describes.
    pub fn of(t: &TrainingConfig, g: &'g HetGraph) -> Result<NodeTasks<'g>> {
        let columns = t.model_spec().head_columns(g);
        // A task on edges in the list has no columns of its own here.
        let parts = t
            .task_list()
            .into_iter()
            .filter(|w| w.task.on_nodes())
            .zip(columns)
            .map(|(w, (_, columns))| {
                Ok(Part {
                    task: w.task,
                    weight: w.weight,
                    columns,
                    node: NodeTask::for_task(w.task, t, g)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(NodeTasks {
            parts,
            multi: !t.tasks.is_empty(),
        })
    }

    /// Whether several tasks are trained (`training.tasks`): figures per task.
    pub fn is_multi(&self) -> bool {
        self.multi
    }

    /// The tasks, the primary one first.
    pub fn parts(&self) -> &[Part<'g>] {
        &self.parts
    }

    /// The primary task (`training.task`).
    pub fn primary(&self) -> &NodeTask<'g> {
        &self.parts[0].node
    }

    /// Part `k`'s columns of the outputs `out` (`[nodes, outputs]`).
    fn columns(&self, k: usize, out: &Tensor) -> Result<Tensor> {
        let c = &self.parts[k].columns;
        Ok(match self.multi {
            true => out.narrow(1, c.start, c.len())?,
            false => out.clone(),
        })
    }

    /// The loss of outputs `out` on `seeds`: a single task's own, or the
    /// sum of each task's loss on its columns times its weight.
    pub fn loss(&self, out: &Tensor, seeds: &[u32]) -> Result<Losses> {
        self.loss_of_share(out, seeds, seeds)
    }

    /// The factor that makes [`NodeTasks::loss_of_share`]'s total on `seeds`
    /// seeds of a `batch`-seed batch this trainer's part of the batch's
    /// loss: several tasks' totals are their parts already, one task's is
    /// its mean on the seeds.
    pub fn share_weight(&self, seeds: usize, batch: usize) -> f64 {
        match self.multi {
            true => 1.0,
            false => seeds as f64 / batch.max(1) as f64,
        }
    }

    /// [`NodeTasks::loss`] of a trainer holding `seeds` of the step's
    /// `batch` (several tasks: each task's part of the whole batch's loss,
    /// which the trainers' parts add up to; one task: its mean on `seeds`).
    pub fn loss_of_share(&self, out: &Tensor, seeds: &[u32], batch: &[u32]) -> Result<Losses> {
        if !self.multi {
            return Ok(Losses {
                total: self.primary().loss(out, seeds)?,
                each: Vec::new(),
            });
        }
        let mut total: Option<Tensor> = None;
        let mut each = Vec::with_capacity(self.parts.len());
        for (k, p) in self.parts.iter().enumerate() {
            let Some((rows, known)) = self.known(k, &self.columns(k, out)?, seeds)? else {
                // Nothing of this task here: no loss, and no gradient to its columns.
                let zero = Tensor::zeros((), out.dtype(), out.device())?;
                total.get_or_insert_with(|| zero.clone());
                each.push(zero);
                continue;
            };
            let in_batch = match seeds.len() == batch.len() {
                true => known.len(),
                false => batch.iter().filter(|&&n| p.node.knows(n)).count(),
            };
            let l = p.node.loss(&rows, &known)?;
            let l = match known.len() == in_batch {
                true => l,
                false => l.affine(known.len() as f64 / in_batch.max(1) as f64, 0.0)?,
            };
            let weighted = l.affine(p.weight, 0.0)?;
            total = Some(match total {
                Some(t) => (t + weighted)?,
                None => weighted,
            });
            each.push(l.detach());
        }
        Ok(Losses {
            total: total.expect("a multi-task run lists at least one task"),
            each,
        })
    }

    /// Part `k`'s rows of `rows` (one per seed) and seeds, those whose node
    /// has the task's target (all of them: `rows` itself; none: `None`).
    fn known(&self, k: usize, rows: &Tensor, seeds: &[u32]) -> Result<Option<(Tensor, Vec<u32>)>> {
        let task = &self.parts[k].node;
        if seeds.iter().all(|&n| task.knows(n)) {
            return Ok(Some((rows.clone(), seeds.to_vec())));
        }
        let (at, known): (Vec<u32>, Vec<u32>) = seeds
            .iter()
            .enumerate()
            .filter(|&(_, &n)| task.knows(n))
            .map(|(i, &n)| (i as u32, n))
            .unzip();
        if known.is_empty() {
            return Ok(None);
        }
        let at = Tensor::from_vec(at, known.len(), rows.device())?;
        Ok(Some((rows.contiguous()?.index_select(&at, 0)?, known)))
    }

    /// Correct predictions of the primary task among `seeds`.
    pub fn correct(&self, out: &Tensor, seeds: &[u32]) -> Result<u64> {
        self.primary().correct(&self.columns(0, out)?, seeds)
    }

    /// Adds each task's evaluation figures of `out` on `seeds` to its `scores`.
    pub fn score(&self, out: &Tensor, seeds: &[u32], scores: &mut [Scores]) -> Result<()> {
        for (k, s) in scores.iter_mut().enumerate().take(self.parts.len()) {
            if let Some((rows, known)) = self.known(k, &self.columns(k, out)?, seeds)? {
                self.parts[k].node.score(&rows, &known, s)?;
                s.scored += known.len() as u64;
            }
        }
        Ok(())
    }

    /// Empty figures, one per task.
    pub fn empty_scores(&self) -> Vec<Scores> {
        vec![Scores::default(); self.parts.len()]
    }

    /// Records each task's validation and test figures (from
    /// [`NodeTasks::score`]) in the epoch's account: the primary task's in
    /// `st`, and with several tasks each one's in `st.tasks` too.
    pub fn record(&self, st: &mut EpochStats, valid: Vec<Scores>, test: Vec<Scores>) {
        if self.multi && st.tasks.len() < self.parts.len() {
            st.tasks.resize_with(self.parts.len(), EpochStats::default);
        }
        for (k, (v, t)) in valid.into_iter().zip(test).enumerate() {
            match (self.multi, k) {
                (false, 0) => st.set_scores(v, t),
                (false, _) => {}
                (true, 0) => {
                    st.set_scores(v.clone(), t.clone());
                    st.tasks[0].scored = Some([v.scored, t.scored]);
                    st.tasks[0].set_scores(v, t);
                }
                (true, _) => {
                    st.tasks[k].scored = Some([v.scored, t.scored]);
                    st.tasks[k].set_scores(v, t);
                }
            }
        }
    }
}

/// The dropout key of the edges' batch of step `s` is `s + EDGE_BATCH_KEY`,
/// apart from the nodes' batch's. (Its samples are its own step's, as the
/// task alone draws them: what the owners of other partitions draw too.)
pub const EDGE_BATCH_KEY: u64 = 1 << 48;

/// The task on edges of a task list that also has node tasks: each step
/// trains a batch of its edges beside the step's nodes.
pub struct EdgesBeside {
    /// Its position in `training.tasks`.
    pub at: usize,
    /// Its loss's weight.
    pub weight: f64,
    /// Its steps per epoch (its batches start over when the nodes' are more).
    pub steps: u64,
    /// The batches of the epoch the prefetch threads are in.
    batches: Mutex<Option<EpochBatches>>,
}

/// An epoch and its batches of training edges.
type EpochBatches = (u64, Arc<Vec<Vec<u32>>>);

impl EdgesBeside {
    /// The task on edges of `t`'s list, if it mixes one with node tasks,
    /// taking `steps` steps per epoch.
    pub fn of(t: &TrainingConfig, steps: u64) -> Option<EdgesBeside> {
        t.mixed_tasks().map(|at| EdgesBeside {
            at,
            weight: t.tasks[at].weight,
            steps: steps.max(1),
            batches: Mutex::new(None),
        })
    }

    /// The task's step for step `step` of `epoch` (which its edges'
    /// neighbourhoods leave out and sample with) and its training edges, of
    /// `batches(epoch)` (computed once per epoch).
    pub fn batch(
        &self,
        epoch: u64,
        step: u64,
        batches: impl FnOnce(u64) -> Vec<Vec<u32>>,
    ) -> (u64, Vec<u32>) {
        let k = step % self.steps;
        let all = {
            let mut memo = self.batches.lock().unwrap_or_else(|e| e.into_inner());
            match &*memo {
                Some((e, b)) if *e == epoch => b.clone(),
                _ => {
                    let b = Arc::new(batches(epoch));
                    *memo = Some((epoch, b.clone()));
                    b
                }
            }
        };
        (k, all.get(k as usize).cloned().unwrap_or_default())
    }
}
