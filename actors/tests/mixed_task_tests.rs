//! Node tasks with a task on edges in one list (`training.tasks` holding
//! link prediction or an edge task after a node task): one model learns
//! both, its last layer holding the node tasks' columns and then the
//! decoder's; each task reports its own figures in list order; an epoch is
//! the longer of the two tasks' passes; and what cannot run is refused.

mod common;

use actors::task::edge::EdgeTask;
use actors::{train, Config};
use common::{close, derived, same_losses, Losses};
use graphs::partition::{self, Method};
use graphs::{LoadOptions, NoProgress};

const WRITES: &str = "author__writes__paper";

const BASE: [&str; 5] = [
    "training.epochs=3",
    "training.batch=512",
    "training.hidden=16",
    "training.embed_dim=8",
    "training.dropout=0.0",
];

fn config(extra: &[&str]) -> Config {
    let mut o = vec![format!("training.target_relations={WRITES:?}")];
    o.extend(extra.iter().map(|s| s.to_string()));
    common::config(&BASE, &o)
}

#[test]
fn node_and_edge_classification_learn_together_and_report_each_in_list_order() {
    let list = "training.tasks=[{task = \"node-classification\"}, {task = \"edge-classification\", weight = 2.0}, {task = \"node-regression\", weight = 0.5}]";
    let cfg = config(&[list]);
    let (r, model) = train(&cfg, &mut Losses::default()).unwrap();
    let g = graphs::load(
        &common::graph(),
        &LoadOptions {
            reverse_edges: true,
            ..Default::default()
        },
    )
    .unwrap();
    // One row: the classes, the value, then the decoder's hidden columns.
    let spec = model.spec();
    assert!(spec.is_mixed() && spec.predicts_nodes());
    assert_eq!(spec.outputs(&g), g.num_classes() as usize + 1 + 16);
    let heads = spec.head_columns(&g);
    assert_eq!(heads.len(), 2, "node tasks only: {heads:?}");
    assert_eq!(
        heads[1].1,
        g.num_classes() as usize..g.num_classes() as usize + 1
    );
    // An epoch is the longer of the two passes: here the edges'.
    let (_, splits) = g.target_labels();
    let node_steps = splits.train.len().div_ceil(512) as u64;
    let edge_steps = EdgeTask::prepare(&cfg.training, &g).unwrap().steps();
    assert!(
        edge_steps > node_steps,
        "{edge_steps} edge steps, {node_steps} node steps"
    );
    assert_eq!(r.steps, 3 * edge_steps);
    let majority = {
        let t = g
            .relation(g.relation_id(WRITES).unwrap())
            .targets()
            .unwrap();
        let ones = t.test.labels.iter().filter(|&&l| l == 1).count() as f64;
        let n = t.test.len() as f64;
        (ones / n).max(1.0 - ones / n)
    };
    for e in &r.epochs {
        let names: Vec<&str> = e.tasks.iter().map(|t| t.task.as_str()).collect();
        assert_eq!(
            names,
            [
                "node-classification",
                "edge-classification",
                "node-regression"
            ]
        );
        let [c, edge, v] = [&e.tasks[0], &e.tasks[1], &e.tasks[2]];
        close(
            e.loss,
            c.loss + 2.0 * edge.loss + 0.5 * v.loss,
            "the weighted sum",
        );
        // The top-level figures are the primary task's; each task has its own.
        assert_eq!(c.valid_acc, e.valid_acc);
        assert!(edge.roc_auc.is_some() && edge.macro_f1.is_some());
        assert!(c.roc_auc.is_none() && v.regression.is_some() && edge.regression.is_none());
        assert_ne!(edge.valid_acc, c.valid_acc);
    }
    let (first, last) = (&r.epochs[0], r.epochs.last().unwrap());
    for k in 0..3 {
        assert!(
            last.tasks[k].loss < first.tasks[k].loss,
            "task {k}: {:?}",
            r.epochs
        );
    }
    let edge_acc = last.tasks[1].test_acc.unwrap();
    assert!(
        edge_acc > majority + 0.05,
        "edge test accuracy {edge_acc} vs majority {majority}"
    );
    // The nodes' batches start over within an epoch: the node task learns (and, 27
    // passes over a few hundred nodes in, overfits).
    let (v0, v) = (
        first.tasks[0].valid_acc.unwrap(),
        last.tasks[0].valid_acc.unwrap(),
    );
    assert!(v > v0, "node validation accuracy {v0} -> {v}");

    // Deterministic, as every run.
    let (again, model2) = train(&cfg, &mut Losses::default()).unwrap();
    common::same_model(&model, &model2, "a second run");
    assert_eq!(again.epochs.last().unwrap().tasks, last.tasks);
}

#[test]
fn link_prediction_beside_node_classification_ranks_held_out_edges() {
    let cfg = config(&[
        "training.link_eval=\"sampled\"",
        "training.eval_negatives=100",
        "training.tasks=[{task = \"node-classification\"}, {task = \"link-prediction\", weight = 0.5}]",
    ]);
    let (r, model) = train(&cfg, &mut Losses::default()).unwrap();
    assert!(r.link.is_some(), "the link task's edges are reported");
    let mrr = |e: &actors::EpochReport| e.tasks[1].link.expect("ranking figures").valid.mrr;
    let (m0, m) = (mrr(&r.epochs[0]), mrr(r.epochs.last().unwrap()));
    // Among 100 negatives, a random ranking's MRR is about 0.05.
    assert!(m > m0 && m > 0.065, "validation MRR {m0} -> {m}");
    for e in &r.epochs {
        let [c, l] = [&e.tasks[0], &e.tasks[1]];
        assert_eq!(l.task, "link-prediction");
        assert!(l.valid_acc.is_none() && c.link.is_none() && e.link.is_none());
        assert!(c.valid_acc.is_some());
        close(e.loss, c.loss + 0.5 * l.loss, "the weighted sum");
    }
    // The decoder reads the rows' last `hidden` columns, whichever rows it is given.
    let g = graphs::load(&common::graph(), &LoadOptions::default()).unwrap();
    let rows = models::inference::embed_all(&model, &g, 4096, |_, _, _| {}).unwrap();
    let rel = g.relation(g.relation_id(WRITES).unwrap());
    let (st, dt) = (rel.src.index(), rel.dst.index());
    let narrow = models::inference::decoder_type_rows(&model, rows.clone());
    assert_eq!(narrow[st].as_ref().unwrap().width, 16);
    assert_eq!(
        rows[st].as_ref().unwrap().width,
        g.num_classes() as usize + 16
    );
    let (src, dst): (Vec<u32>, Vec<u32>) = (0..50).map(|i| (i, (i * 7) % 40)).unzip();
    let score = |rows: &[Option<models::inference::TypeRows>]| {
        models::link::score_rows(
            &model,
            0,
            rows[st].as_ref().unwrap(),
            rows[dt].as_ref().unwrap(),
            &src,
            &dst,
        )
        .unwrap()
    };
    assert_eq!(score(&rows), score(&narrow));
    // Whole rows of the target nodes, whose first columns are the classes.
    let logits = models::inference::classify_exact(&model, &g, &rows, &[0, 1, 2]).unwrap();
    assert_eq!(logits.dims2().unwrap(), (3, g.num_classes() as usize + 16));
    let heads = model.spec().head_columns(&g);
    assert_eq!(heads.len(), 1);
    assert_eq!(heads[0].1, 0..g.num_classes() as usize);
}

#[test]
fn lists_with_a_task_on_edges_that_cannot_run_are_refused() {
    let refusal = |extra: &[&str]| {
        let mut o: Vec<String> = BASE.iter().map(|s| s.to_string()).collect();
        if !extra.contains(&"no relations") {
            o.push(format!("training.target_relations={WRITES:?}"));
        }
        o.extend(
            extra
                .iter()
                .filter(|&&s| s != "no relations")
                .map(|s| s.to_string()),
        );
        Config::parse("", &o).unwrap_err().to_string()
    };
    for (extra, want) in [
        (
            vec!["training.tasks=[{task = \"link-prediction\"}, {task = \"node-classification\"}]"],
            "must be a node task of the target type",
        ),
        (
            vec!["training.tasks=[{task = \"node-classification\"}, {task = \"edge-classification\"}, {task = \"link-prediction\"}]"],
            "at most one task on edges",
        ),
        (
            vec![
                "training.mode=\"hopgnn\"",
                "training.tasks=[{task = \"node-classification\"}, {task = \"edge-regression\"}]",
            ],
            "training.tasks lists \"edge-regression\" beside node tasks, which runs in single and data-parallel; mode hopgnn",
        ),
        (
            vec![
                "no relations",
                "training.tasks=[{task = \"node-classification\"}, {task = \"edge-classification\"}]",
            ],
            "needs training.target_relations",
        ),
        (
            vec![
                "training.cache_bytes=\"1MiB\"",
                "training.tasks=[{task = \"node-classification\"}, {task = \"link-prediction\"}]",
            ],
            "not supported with link prediction",
        ),
    ] {
        let err = refusal(&extra);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}

#[test]
fn data_parallel_training_follows_single_process_training_with_a_task_on_edges() {
    // (list, name, steps compared to 1e-5 on 2 trainers: all, or the first n).
    for (list, name, compared) in [
        (
            "training.tasks=[{task = \"node-classification\"}, {task = \"edge-classification\", weight = 0.5}]",
            "edge-classification",
            None,
        ),
        (
            "training.tasks=[{task = \"node-classification\"}, {task = \"link-prediction\"}]",
            "link-prediction",
            Some(16),
        ),
    ] {
        let base = [
            "training.epochs=2",
            "training.edge_eval=\"sampled\"",
            "training.link_eval=\"sampled\"",
            "training.eval_negatives=50",
            list,
        ];
        let mut single_losses = Losses::default();
        let (single, model) = train(&config(&base), &mut single_losses).unwrap();
        for parts in [1, 2] {
            let dir = derived(&format!("mixed-{name}-metis-{parts}"), false, |g, out| {
                let a = partition::assign_two_level(g, parts, 1, Method::Metis, 0).unwrap();
                partition::write(g, &a, out, false, &mut NoProgress).unwrap();
            });
            let dir = format!("training.partitions={:?}", dir.display().to_string());
            let mut o = base.to_vec();
            o.extend(["training.mode=\"data-parallel\"", &dir]);
            let mut losses = Losses::default();
            let (report, fin) = train(&config(&o), &mut losses).unwrap();
            let what = format!("{name} on {parts} trainers");
            assert_eq!((report.nodes, report.steps), (parts, single.steps), "{what}");
            if parts == 1 {
                // One trainer: the same batches, keys, shares and updates, bit for bit.
                assert_eq!(single_losses.0, losses.0, "{what}");
                common::same_model(&model, &fin, &what);
                for (x, y) in single.epochs.iter().zip(&report.epochs) {
                    assert_eq!((x.loss, &x.tasks), (y.loss, &y.tasks), "{what}");
                    assert_eq!((x.valid_acc, x.test_acc), (y.valid_acc, y.test_acc), "{what}");
                }
                continue;
            }
            // Two trainers sum their gradients in another order than one
            // backward pass: the runs part at rounding (1e-7) and, with link
            // prediction, drift past 1e-5 after ~20 steps. The single process
            // does the same with the link loss's weight times 1 + 1e-7 (to
            // the digit): this training amplifies any 1e-7 difference.
            let n = compared.unwrap_or(single_losses.0.len());
            same_losses(&single_losses.0[..n], &losses.0[..n], &what);
            let (a, b) = (&single.epochs[0], &report.epochs[0]);
            assert_eq!(b.tasks.len(), 2, "{what}");
            for (x, y) in a.tasks.iter().zip(&b.tasks) {
                assert_eq!(x.task, y.task);
                let tol = if compared.is_some() { 1e-2 } else { 1e-3 };
                let near = |p: Option<f64>, q: Option<f64>, m: &str| {
                    assert_eq!(p.is_some(), q.is_some(), "{what}: {m}");
                    if let (Some(p), Some(q)) = (p, q) {
                        assert!((p - q).abs() < tol, "{what}: {} {m} {p} vs {q}", x.task);
                    }
                };
                near(Some(x.loss), Some(y.loss), "loss");
                near(x.valid_acc, y.valid_acc, "validation accuracy");
                near(
                    x.link.map(|l| l.valid.mrr),
                    y.link.map(|l| l.valid.mrr),
                    "validation MRR",
                );
                near(x.roc_auc.map(|r| r[1]), y.roc_auc.map(|r| r[1]), "test ROC-AUC");
            }
        }
    }
}
