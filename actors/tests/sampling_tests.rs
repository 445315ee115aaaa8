//! ByteGNN's DAG sampling (`training.sampling = "dag"`): whatever the chunk
//! size, threads and DAGs in flight, a data-parallel run ends with the same
//! model bits as the default pipeline (samples are pure functions of their
//! keys), for node classification, link prediction and with a device cache;
//! its report says what the DAGs did; bad settings are refused.

mod common;

use std::path::PathBuf;

use actors::{train, Config};
use common::{derived, Losses};
use graphs::partition::{self, Method};
use graphs::NoProgress;

const BASE: [&str; 4] = [
    "training.epochs=2",
    "training.batch=256",
    "training.hidden=16",
    "training.embed_dim=8",
];

fn partitions(parts: usize, method: Method) -> PathBuf {
    derived(&format!("{method}-{parts}"), false, |g, out| {
        let a = partition::assign_two_level(g, parts, 1, method, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    })
}

fn data_parallel(pdir: &std::path::Path, base: &[&str], extra: &[&str]) -> Config {
    let mut e = vec![
        "training.mode=\"data-parallel\"".to_string(),
        format!("training.partitions={:?}", pdir.display().to_string()),
    ];
    e.extend(extra.iter().map(|s| s.to_string()));
    common::config(base, &e)
}

/// Trains the pipeline run and each DAG variant of it; every one must end
/// with the pipeline's losses and model bits.
fn same_as_pipeline(pdir: &std::path::Path, base: &[&str], extra: &[&str], variants: &[&[&str]]) {
    let mut want = Losses::default();
    let (reference, _) = train(&data_parallel(pdir, base, extra), &mut want).unwrap();
    assert!(reference
        .epochs
        .iter()
        .all(|e| !e.figures.contains_key("sampling")));
    for v in variants {
        let mut all: Vec<&str> = extra.to_vec();
        all.push("training.data-parallel.sampling=\"dag\"");
        all.extend_from_slice(v);
        let mut got = Losses::default();
        let (report, _) = train(&data_parallel(pdir, base, &all), &mut got).unwrap();
        assert_eq!(got.0, want.0, "{v:?}: losses");
        assert_eq!(
            report.final_model_sha256, reference.final_model_sha256,
            "{v:?}"
        );
        for e in &report.epochs {
            let s = e
                .figures::<actors::data_parallel::sampling::pipeline::DagFigures>("sampling")
                .unwrap_or_else(|| panic!("{v:?}: no sampling figures"));
            assert!(s.launches > 0 && s.in_flight_max >= 1, "{v:?}: {s:?}");
            for op in ["seed", "pick", "assemble", "finish"] {
                assert!(
                    s.op_seconds.contains_key(op),
                    "{v:?}: no time for {op}: {s:?}"
                );
            }
            assert!(
                e.time.wait_s >= 0.0 && e.time.wait_s <= e.time.seconds + 1e-6,
                "{v:?}: waited {} of {}",
                e.time.wait_s,
                e.time.seconds
            );
            assert!(
                (0.0..=1.0).contains(&e.cpu_util),
                "{v:?}: cpu {}",
                e.cpu_util
            );
        }
    }
}

#[test]
fn dag_sampling_trains_the_pipeline_s_model() {
    let variants: [&[&str]; 3] = [
        &[],
        // Many small chunks on one thread, one DAG at a time.
        &[
            "training.data-parallel.dag_chunk_rows=7",
            "training.data-parallel.dag_threads=1",
            "training.data-parallel.dag_max_in_flight=1",
        ],
        // Several threads, many DAGs racing.
        &[
            "training.data-parallel.dag_chunk_rows=33",
            "training.data-parallel.dag_threads=3",
            "training.data-parallel.dag_max_in_flight=16",
        ],
    ];
    same_as_pipeline(&partitions(2, Method::Metis), &BASE, &[], &variants);
    same_as_pipeline(
        &partitions(3, Method::Random),
        &BASE,
        &["training.allreduce=\"ring\""],
        &variants[1..2],
    );
}

#[test]
fn dag_sampling_with_a_device_cache_and_for_link_prediction() {
    let cached = [
        "training.cache_bytes=98304",
        "training.cache_policy=\"miss-penalty\"",
    ];
    same_as_pipeline(
        &partitions(2, Method::Metis),
        &BASE,
        &cached,
        &[&["training.data-parallel.dag_chunk_rows=16"]],
    );
    let link = common::LINK_BASE;
    let pdir = derived("link-metis-2", false, |g, out| {
        let a = partition::assign_two_level(g, 2, 1, Method::Metis, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    });
    same_as_pipeline(
        &pdir,
        &link,
        &[],
        &[&[
            "training.data-parallel.dag_chunk_rows=9",
            "training.data-parallel.dag_threads=2",
        ]],
    );
}

#[test]
fn a_sampling_sink_samples_every_batch_and_trains_nothing() {
    let pdir = partitions(2, Method::Metis);
    let (trained, _) = train(
        &data_parallel(&pdir, &BASE, &["training.data-parallel.sampling=\"dag\""]),
        &mut (),
    )
    .unwrap();
    let (sink, _) = train(
        &data_parallel(
            &pdir,
            &BASE,
            &[
                "training.data-parallel.sampling=\"dag\"",
                "training.data-parallel.sampling_sink=true",
            ],
        ),
        &mut (),
    )
    .unwrap();
    assert_eq!(sink.steps, trained.steps);
    let steps_per_epoch = sink.steps / sink.epochs.len() as u64;
    for (e, t) in sink.epochs.iter().zip(&trained.epochs) {
        assert_eq!((e.loss, e.test_acc, e.time.compute_s), (0.0, None, 0.0));
        let s = e
            .figures::<actors::data_parallel::sampling::pipeline::DagFigures>("sampling")
            .unwrap();
        // Both trainers launched one DAG per step in which they have seeds.
        assert!(
            s.launches <= 2 * steps_per_epoch && s.launches >= steps_per_epoch,
            "{s:?}"
        );
        assert_eq!(
            e.figures::<actors::data_parallel::sampling::pipeline::DagFigures>("sampling")
                .unwrap()
                .launches,
            t.figures::<actors::data_parallel::sampling::pipeline::DagFigures>("sampling")
                .unwrap()
                .launches
        );
    }
    assert_ne!(sink.final_model_sha256, trained.final_model_sha256);
    let err = Config::parse(
        "",
        &["training.data-parallel.sampling_sink=true".to_string()],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("[training.data-parallel] applies to training.mode = \"data-parallel\""),
        "{err}"
    );
}

#[test]
fn dag_settings_are_refused_where_they_do_not_apply() {
    let pdir = partitions(2, Method::Metis);
    let parse = |o: &[&str]| {
        let mut all: Vec<String> = BASE.iter().map(|s| s.to_string()).collect();
        all.extend(o.iter().map(|s| s.to_string()));
        Config::parse("", &all)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let err = parse(&["training.data-parallel.sampling=\"dag\""]);
    assert!(
        err.contains("applies to training.mode = \"data-parallel\", not \"single\""),
        "{err}"
    );
    let p = format!("training.partitions={:?}", pdir.display().to_string());
    let dp = "training.mode=\"data-parallel\"";
    let err = parse(&[dp, &p, "training.data-parallel.dag_threads=2"]);
    assert!(err.contains("apply to sampling = \"dag\""), "{err}");
    for bad in [
        "training.data-parallel.dag_max_in_flight=0",
        "training.data-parallel.dag_chunk_rows=0",
        "training.data-parallel.dag_threads=5000",
        "training.data-parallel.dag_max_in_flight=100000",
    ] {
        let err = parse(&[dp, &p, "training.data-parallel.sampling=\"dag\"", bad]);
        assert!(err.contains("dag_max_in_flight in 1..="), "{bad}: {err}");
    }
    let err = parse(&[dp, &p, "training.data-parallel.sampling=\"fast\""]);
    assert!(err.contains("sampling"), "{err}");
}
