//! Link prediction in data-parallel training: 2 and 3 trainers follow
//! single-process training step by step (the same steps, negatives,
//! excluded edges and samples), and end with its model and metrics.

mod common;

use std::path::PathBuf;

use actors::{train, Config};
use common::{derived, same_losses, same_model, Losses, LINK_BASE};
use graphs::partition::{self, Method};
use graphs::NoProgress;

fn config(extra: &[String]) -> Config {
    common::config(&LINK_BASE, extra)
}

fn partitions(parts: usize, method: Method) -> PathBuf {
    partitions_of(parts, 1, method)
}

fn partitions_of(parts: usize, trainers: usize, method: Method) -> PathBuf {
    derived(
        &format!("link-{method}-{parts}x{trainers}"),
        false,
        |g, out| {
            let a = partition::assign_two_level(g, parts, trainers, method, 0).unwrap();
            partition::write(g, &a, out, false, &mut NoProgress).unwrap();
        },
    )
}

fn data_parallel(pdir: &std::path::Path) -> Config {
    config(&[
        "training.mode=\"data-parallel\"".into(),
        format!("training.partitions={:?}", pdir.display().to_string()),
    ])
}

#[test]
fn two_and_three_trainers_match_single_process_link_prediction() {
    let mut single_losses = Losses::default();
    let (single, model) = train(&config(&[]), &mut single_losses).unwrap();
    let link = single.link.as_ref().unwrap();
    assert!(link.metric.contains("sampled"), "{}", link.metric);
    for (parts, method) in [(2, Method::Metis), (3, Method::Random)] {
        let mut losses = Losses::default();
        let (report, fin) = train(&data_parallel(&partitions(parts, method)), &mut losses).unwrap();
        assert_eq!(
            (report.mode.as_str(), report.nodes, report.steps),
            ("data-parallel", parts, single.steps)
        );
        same_losses(&single_losses.0, &losses.0, &format!("{parts} trainers"));
        same_model(&model, &fin, &format!("{parts} trainers"));
        // Every held-out edge ranked once, by the trainer owning its source.
        for (a, b) in single.epochs.iter().zip(&report.epochs) {
            let (a, b) = (a.link.unwrap(), b.link.unwrap());
            for (x, y) in [
                (a.valid.mrr, b.valid.mrr),
                (a.test.mrr, b.test.mrr),
                (a.test.hits10, b.test.hits10),
                (a.test.hits100, b.test.hits100),
            ] {
                assert!((x - y).abs() < 1e-3, "{parts} trainers: metrics {x} vs {y}");
            }
        }
    }
}

#[test]
fn trainers_of_a_partition_share_its_edges_in_both_sampling_pipelines() {
    let mut single_losses = Losses::default();
    let (single, _) = train(&config(&[]), &mut single_losses).unwrap();
    let pdir = partitions_of(2, 2, Method::Metis);
    for sampling in ["pipeline", "dag"] {
        let mut o = vec![
            "training.mode=\"data-parallel\"".to_string(),
            format!("training.partitions={:?}", pdir.display().to_string()),
        ];
        o.push(format!("training.data-parallel.sampling={sampling:?}"));
        let mut losses = Losses::default();
        let (report, _) = train(&config(&o), &mut losses).unwrap();
        assert_eq!(report.steps, single.steps);
        // Each edge is one trainer's: a partition's edges given to both of its trainers would double the loss.
        same_losses(
            &single_losses.0,
            &losses.0,
            &format!("2 partitions x 2 trainers, {sampling}"),
        );
    }
}

#[test]
fn data_parallel_link_prediction_refuses_old_partitions_and_exact_evaluation() {
    let pdir = derived("link-old-manifest", false, |g, out| {
        let a = partition::assign_two_level(g, 2, 1, Method::Random, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
        let path = out.join("manifest.json");
        let mut m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        m.as_object_mut().unwrap().remove("relation_edges");
        std::fs::write(&path, m.to_string()).unwrap();
    });
    let err = train(&data_parallel(&pdir), &mut ())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("partition the graph again"), "{err}");
    let pdir = partitions(2, Method::Metis);
    let o = [
        "training.mode=\"data-parallel\"".to_string(),
        format!("training.partitions={:?}", pdir.display().to_string()),
        "training.link_eval=\"exact\"".into(),
    ];
    let mut all: Vec<String> = LINK_BASE.iter().map(|s| s.to_string()).collect();
    all.extend(o);
    let err = Config::parse("", &all).err().unwrap().to_string();
    assert!(err.contains("link_eval"), "{err}");
}
