//! The device cache in all three modes: a cached run computes exactly what an
//! uncached one does (same losses, same model bits), the budget holds, and
//! hit rates agree with a brute-force replay of the training batches.

mod common;

use std::collections::HashSet;

use actors::cache::hotness::presample;
use actors::epoch::SamplingPlan;
use actors::{train, Config, Report};
use common::{derived, Losses};
use graphs::partition::{self, Method};
use graphs::sampler::epoch_batches;
use graphs::{LoadOptions, NoProgress};

const BASE: [&str; 4] = [
    "training.epochs=2",
    "training.batch=256",
    "training.hidden=16",
    "training.embed_dim=8",
];

fn config(extra: &[String]) -> Config {
    common::config(&BASE, extra)
}

/// Budget small enough that every type is cached only in part.
const BUDGET: u64 = 96 * 1024;

fn cached(policy: &str, extra: &[String]) -> Config {
    let mut e = extra.to_vec();
    e.push(format!("training.cache_bytes={BUDGET}"));
    e.push(format!("training.cache_policy={policy:?}"));
    config(&e)
}

/// The cache stayed within budget and measured every type it could cache;
/// `full`: the budget is nearly used and every cacheable type has rows and hits
/// (hotness; miss-penalty may leave rows out whose hits save nothing here).
fn check_budget(r: &Report, devices: u64, full: bool, what: &str) {
    assert!(!r.cache.is_empty(), "{what}: no cache report");
    let bytes: u64 = r.cache.values().map(|c| c.bytes).sum();
    assert!(
        bytes <= BUDGET * devices,
        "{what}: {bytes} bytes cached, budget {}",
        BUDGET * devices
    );
    for (name, c) in &r.cache {
        if c.note.is_none() {
            assert!(
                c.miss_us_per_byte > 0.0 && c.hit_us_per_byte > 0.0,
                "{what}, {name}: not profiled: {c:?}"
            );
            assert!(
                c.hits <= c.lookups && (c.rows == 0 || c.lookups > 0),
                "{what}, {name}: {c:?}"
            );
            if full {
                assert!(
                    c.rows > 0 && c.hits > 0 && c.hits < c.lookups,
                    "{what}, {name}: {c:?}"
                );
            }
        }
    }
    if full {
        assert!(
            bytes > BUDGET * devices / 2,
            "{what}: only {bytes} of {} bytes used",
            BUDGET * devices
        );
    }
}

#[test]
fn single_process_cached_runs_are_bit_identical_to_uncached_ones() {
    let mut want_losses = Losses::default();
    let (want, _) = train(&config(&[]), &mut want_losses).unwrap();
    assert!(want.cache.is_empty());
    for policy in ["miss-penalty", "hotness"] {
        let mut losses = Losses::default();
        let (got, _) = train(&cached(policy, &[]), &mut losses).unwrap();
        assert_eq!(losses.0, want_losses.0, "{policy}: losses");
        assert_eq!(
            got.final_model_sha256, want.final_model_sha256,
            "{policy}: model"
        );
        assert_eq!(
            got.epochs.iter().map(|e| e.test_acc).collect::<Vec<_>>(),
            want.epochs.iter().map(|e| e.test_acc).collect::<Vec<_>>()
        );
        check_budget(&got, 1, policy == "hotness", policy);
        assert!(
            got.cache.values().any(|c| c.learnable) && got.cache.values().any(|c| !c.learnable),
            "{policy}: {:?}",
            got.cache
        );
    }
}

#[test]
fn a_budget_that_holds_every_row_caches_everything_without_presampling_and_changes_nothing() {
    let mut want_losses = Losses::default();
    let (want, _) = train(&config(&[]), &mut want_losses).unwrap();
    // On the CPU, miss-penalty still measures (and caches nothing: a hit costs a miss there).
    let (measured, _) = train(
        &config(&["training.cache_bytes=\"1GiB\"".to_string()]),
        &mut Losses::default(),
    )
    .unwrap();
    assert!(
        measured
            .cache
            .values()
            .all(|c| c.note.is_none() && c.visits > 0),
        "{:?}",
        measured.cache
    );
    let mut losses = Losses::default();
    let (got, _) = train(
        &config(&[
            "training.cache_bytes=\"1GiB\"".to_string(),
            "training.cache_policy=\"hotness\"".to_string(),
        ]),
        &mut losses,
    )
    .unwrap();
    assert_eq!(losses.0, want_losses.0, "losses");
    assert_eq!(got.final_model_sha256, want.final_model_sha256, "model");
    // Evaluation reads the rows from the cache: the same predictions.
    let acc = |r: &Report| {
        r.epochs
            .iter()
            .map(|e| (e.valid_acc, e.test_acc))
            .collect::<Vec<_>>()
    };
    assert_eq!(acc(&got), acc(&want), "valid and test accuracy");
    let g = graphs::load(&common::graph(), &LoadOptions::default()).unwrap();
    assert!(
        got.cache.values().any(|c| c.learnable) && got.cache.values().any(|c| !c.learnable),
        "{:?}",
        got.cache
    );
    for (name, c) in &got.cache {
        let nt = g.node_types().iter().find(|nt| &nt.name == name).unwrap();
        assert_eq!(c.rows, u64::from(nt.count), "{name}: every row");
        assert!(
            c.note.as_deref().is_some_and(|n| n.contains("every row")),
            "{name}: {c:?}"
        );
        assert_eq!(
            (c.visits, c.hits),
            (0, c.lookups),
            "{name}: no pre-sampling, every lookup a hit"
        );
        assert!(c.lookups > 0, "{name}: {c:?}");
    }
}

#[test]
fn hit_rates_match_a_brute_force_replay_of_the_batches() {
    // Hotness allocation depends on visit counts only (no timing), so the
    // cached rows can be recomputed here: each type's most visited rows.
    let extra = ["training.epochs=1".to_string()];
    let cfg = cached("hotness", &extra);
    let (report, _) = train(&cfg, &mut ()).unwrap();
    let t = &cfg.training;
    let g = graphs::load(
        t.data.as_ref().unwrap(),
        &LoadOptions {
            mmap_features: true,
            reverse_edges: t.reverse_edges,
        },
    )
    .unwrap();
    let (_, splits) = g.target_labels();
    let sizes: Vec<usize> = g.node_types().iter().map(|nt| nt.count as usize).collect();
    let plan = SamplingPlan::of(t);
    let mut pre = plan.presample(&g).unwrap();
    let visits = presample(
        &sizes,
        &splits.train,
        t.batch,
        &plan,
        t.cache_presample_epochs,
        |e, s, b| Ok(pre.sample(e, s, b).unwrap().blocks.swap_remove(0).src),
    )
    .unwrap();
    let mut sampler = plan.train(&g).unwrap();
    let batches = epoch_batches(&splits.train, t.batch, plan.train_seed(), 0);
    let inputs: Vec<Vec<Vec<u32>>> = batches
        .iter()
        .enumerate()
        .map(|(s, b)| {
            sampler
                .sample(0, s as u64, b)
                .unwrap()
                .blocks
                .swap_remove(0)
                .src
        })
        .collect();
    for (ty, nt) in g.node_types().iter().enumerate() {
        let c = &report.cache[&nt.name];
        // The top `rows` by visits (ties: lower id), computed independently.
        let counts = visits.of(ty);
        let mut order: Vec<u32> = (0..counts.len() as u32).collect();
        order.sort_by_key(|&v| (std::cmp::Reverse(counts[v as usize]), v));
        let top: HashSet<u32> = order[..c.rows as usize].iter().copied().collect();
        assert!(
            top.iter().all(|&v| counts[v as usize] > 0),
            "{}: an unvisited row is cached",
            nt.name
        );
        let lookups: u64 = inputs.iter().map(|src| src[ty].len() as u64).sum();
        let hits: u64 = inputs
            .iter()
            .map(|src| src[ty].iter().filter(|v| top.contains(v)).count() as u64)
            .sum();
        assert_eq!((c.hits, c.lookups), (hits, lookups), "{}", nt.name);
        assert_eq!(c.visits, visits.total(ty));
    }
}

#[test]
fn data_parallel_trainers_cache_feature_rows_and_match_the_uncached_run() {
    let pdir = derived("metis-2-cache", false, |g, out| {
        let a = partition::assign(g, 2, Method::Metis, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    });
    let extra = [
        "training.mode=\"data-parallel\"".to_string(),
        format!("training.partitions={:?}", pdir.display().to_string()),
    ];
    let mut want_losses = Losses::default();
    let (want, _) = actors::train(&config(&extra), &mut want_losses).unwrap();
    let mut losses = Losses::default();
    let (got, _) = actors::train(&cached("miss-penalty", &extra), &mut losses).unwrap();
    assert_eq!(losses.0, want_losses.0);
    assert_eq!(got.final_model_sha256, want.final_model_sha256);
    check_budget(&got, 2, true, "data-parallel");
    let paper = &got.cache["paper"];
    assert!(
        !paper.learnable && paper.note.is_none() && paper.share > 0.9,
        "{paper:?}"
    );
    assert!(
        got.cache
            .values()
            .filter(|c| c.learnable)
            .all(|c| c.rows == 0 && c.note.is_some()),
        "{:?}",
        got.cache
    );
}

#[test]
fn raf_workers_cache_their_rows_and_match_the_uncached_run() {
    let pdir = derived("meta-2-cache", true, |g, out| {
        partition::meta::write(g, 2, 2, out, false, &mut NoProgress).unwrap();
    });
    let extra = [
        "training.mode=\"raf\"".to_string(),
        format!("training.partitions={:?}", pdir.display().to_string()),
    ];
    let mut want_losses = Losses::default();
    let (want, _) = actors::train(&config(&extra), &mut want_losses).unwrap();
    for policy in ["hotness", "miss-penalty"] {
        let mut losses = Losses::default();
        let (got, _) = actors::train(&cached(policy, &extra), &mut losses).unwrap();
        assert_eq!(losses.0, want_losses.0, "{policy}");
        assert_eq!(got.final_model_sha256, want.final_model_sha256, "{policy}");
        check_budget(&got, 2, policy == "hotness", policy);
        if policy == "hotness" {
            assert!(
                got.cache.values().any(|c| c.learnable && c.rows > 0),
                "{:?}",
                got.cache
            );
        }
    }
}
