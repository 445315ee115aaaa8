//! Checks a run's settings against its graph before anything is trained:
//! a run that cannot learn (no training nodes) or cannot fit (widths,
//! batch and fanouts whose step needs more memory than the machine has) is
//! refused with the keys at fault, instead of "training" zero steps or being
//! killed by the kernel midway.

use graphs::HetGraph;

use crate::config::TrainingConfig;
use crate::epoch::memory::{self, MemoryPlan};
use crate::error::{Result, TrainError};

/// Refuses a run of `t` on `g` in one process that cannot train or cannot
/// fit (see [`check_fits`]); returns its memory plan.
pub fn check(t: &TrainingConfig, g: &HetGraph, tables: bool, ahead: usize) -> Result<MemoryPlan> {
    // Edge tasks train on edges (their preparation refuses none).
    if t.task.on_nodes() {
        check_trainable(t, g)?;
    }
    check_fits(t, g, tables, ahead)
}

/// Refuses a graph with no target nodes or no training nodes, or whose
/// split nodes lack what the node task `t` learns (a label, or a value).
pub fn check_trainable(t: &TrainingConfig, g: &HetGraph) -> Result<()> {
    let target = g.node_type(g.target());
    if target.count == 0 {
        return Err(TrainError::Config(format!(
            "the target type '{}' has no nodes: nothing to train",
            target.name
        )));
    }
    let (_, splits) = g.target_labels();
    if splits.train.is_empty() {
        return Err(TrainError::Config(format!(
            "the training split of '{}' is empty (nodes/{}/train.npy): nothing to train",
            target.name, target.name
        )));
    }
    // The primary task needs its target on every split node; a multi-task
    // run's other tasks leave out the nodes without theirs, but each needs
    // some training nodes.
    let key = match t.tasks.is_empty() {
        true => "training.task",
        false => "training.tasks' first task",
    };
    for (k, w) in t.task_list().into_iter().enumerate() {
        let task = crate::task::node::NodeTask::for_task(w.task, t, g)?;
        let (what, file) = task.target_file();
        if k > 0 {
            if !splits.train.iter().any(|&n| task.knows(n)) {
                return Err(TrainError::Config(format!(
                    "no node of the training split of '{}' has a {what} in nodes/{}/{file}.npy): training.tasks' task \"{}\" has nothing to learn from",
                    target.name,
                    target.name,
                    w.task.name()
                )));
            }
            continue;
        }
        for (split, ids) in splits.named() {
            if let Some(n) = ids.iter().find(|&&n| !task.knows(n)) {
                return Err(TrainError::Config(format!(
                    "node {n} of the {split} split of '{}' has no {what} in nodes/{}/{file}.npy): {key} = \"{}\" needs one for every node of every split",
                    target.name,
                    target.name,
                    w.task.name()
                )));
            }
        }
    }
    Ok(())
}

/// Refuses a graph two of whose node types would share a store actor and a
/// checkpoint file in the distributed modes (`Paper` and `paper`, `a.b` and
/// `a_b`: names are lower-cased and `.` becomes `_` there): one store would
/// silently replace the other.
pub fn check_distinct_names(g: &HetGraph) -> Result<()> {
    let mut seen: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
    for nt in g.node_types() {
        let plain = crate::distributed::names::plain(&nt.name);
        if let Some(other) = seen.insert(plain.clone(), &nt.name) {
            return Err(TrainError::Config(format!(
                "node types '{other}' and '{}' both become '{plain}' as actor and file names in the distributed modes; rename one (names there ignore case and read '.' as '_')",
                nt.name
            )));
        }
    }
    Ok(())
}

/// The memory of a run of `t` on `g` in one process (its graph, its model
/// with the learnable rows when `tables`, one trainer's steps with `ahead`
/// batches prepared ahead), refused when over the machine's budget.
pub fn check_fits(
    t: &TrainingConfig,
    g: &HetGraph,
    tables: bool,
    ahead: usize,
) -> Result<MemoryPlan> {
    let mut plan = MemoryPlan::process();
    plan.graph(g).model(t, g, tables).trainer(t, g, ahead, 0);
    plan.check(&format!("this run ({})", memory::settings(t, g)))?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use graphs::{GraphBuilder, HetGraph, Splits};

    fn graph(types: &[&str]) -> HetGraph {
        let mut b = GraphBuilder::new("g", types[0], 2);
        for t in types {
            b = b.node_type(t, 2, None);
        }
        b.labels(
            vec![0, 1],
            Splits {
                train: vec![0],
                valid: vec![1],
                test: vec![],
            },
        )
        .relation(types[1], "to", types[0], vec![0, 1], vec![1, 0])
        .build()
        .unwrap()
    }

    #[test]
    fn node_types_that_would_share_a_store_name_are_refused_naming_both() {
        assert!(super::check_distinct_names(&graph(&["paper", "author", "Author-2"])).is_ok());
        for (a, b) in [("Paper", "paper"), ("a.b", "a_b")] {
            let err = super::check_distinct_names(&graph(&[a, b]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("'{a}'"))
                    && err.contains(&format!("'{b}'"))
                    && err.contains("rename one"),
                "{err}"
            );
        }
    }
}
