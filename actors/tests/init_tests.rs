//! Pre-train, then fine-tune (`training.init_from`): a node classifier
//! started from a link predictor's checkpoint takes its relational layers and
//! learnable rows, keeps the frozen ones as they were, trains its own output
//! layer, and follows single-process training in data-parallel training.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use actors::{train, Config};
use common::{derived, Losses, Notes};
use graphs::partition::{self, Method};
use graphs::NoProgress;
use models::Model;

const WRITES: &str = "author__writes__paper";

fn config(extra: &[&str]) -> Config {
    let mut base = vec![
        "training.epochs=1",
        "training.batch=256",
        "training.hidden=16",
        "training.embed_dim=8",
        "training.dropout=0.0",
    ];
    base.extend(extra);
    common::config(&base, &[])
}

/// A link predictor trained for one epoch, checkpointed once per test binary.
fn pretrained() -> &'static (PathBuf, Model) {
    static LP: OnceLock<(PathBuf, Model)> = OnceLock::new();
    LP.get_or_init(|| {
        let dir = common::root().join("lp-checkpoints");
        let cfg = config(&[
            "training.task=\"link-prediction\"",
            &format!("training.target_relations={WRITES:?}"),
            &format!("training.checkpoint_dir={:?}", dir.display().to_string()),
        ]);
        let (_, model) = train(&cfg, &mut Losses::default()).unwrap();
        (dir, model)
    })
}

fn init(dir: &Path) -> String {
    format!("training.init_from={:?}", dir.display().to_string())
}

/// Every value of a dense parameter or table, by name.
fn values(m: &Model) -> Vec<(String, Vec<f32>)> {
    let mut out: Vec<(String, Vec<f32>)> = m
        .params
        .iter()
        .map(|(n, v)| {
            let t = v.as_tensor().flatten_all().unwrap();
            (n.to_string(), t.to_vec1::<f32>().unwrap())
        })
        .collect();
    for e in m.embeddings.iter().flatten() {
        out.push((e.name.clone(), e.data.clone()));
    }
    out
}

fn value<'a>(all: &'a [(String, Vec<f32>)], name: &str) -> &'a [f32] {
    &all.iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn a_frozen_start_keeps_the_pretrained_layers_and_rows_and_trains_the_output_layer() {
    let (dir, lp) = pretrained();
    let lp = values(lp);
    let fresh = values(&train(&config(&[]), &mut Losses::default()).unwrap().1);
    let mut notes = Notes::default();
    let cfg = config(&[&init(dir), "training.freeze=\"embed,gnn\""]);
    let (_, tuned) = train(&cfg, &mut notes).unwrap();
    let tuned = values(&tuned);
    assert!(
        notes
            .0
            .iter()
            .any(|n| n.contains("initialised from") && n.contains("output layer starts afresh")),
        "{:?}",
        notes.0
    );
    let (mut kept, mut trained) = (0, 0);
    for (name, got) in &tuned {
        if name.starts_with("layer1.") {
            // This task's output layer (class logits, not the predictor's
            // embeddings) is trained, on the pretrained encoder's rows: unlike
            // a fresh run's (but for relations that do not reach the target type).
            trained += usize::from(got.as_slice() != value(&fresh, name));
        } else {
            // Everything else is the link predictor's, bit for bit, after a whole epoch.
            assert!(got.as_slice() == value(&lp, name), "{name} changed");
            assert!(
                got.as_slice() != value(&fresh, name),
                "{name} is a fresh draw"
            );
            kept += 1;
        }
    }
    assert!(kept > 4 && trained > 0, "{kept} kept, {trained} trained");
}

#[test]
fn an_unfrozen_start_trains_on_from_the_pretrained_values() {
    let (dir, _) = pretrained();
    let mut fresh = Losses::default();
    train(&config(&[]), &mut fresh).unwrap();
    let mut tuned = Losses::default();
    train(&config(&[&init(dir)]), &mut tuned).unwrap();
    // The first step's loss is the pretrained encoder's, not a fresh draw's.
    assert_ne!(fresh.0[0], tuned.0[0]);
    // Twice from the same checkpoint: the same run.
    let mut again = Losses::default();
    train(&config(&[&init(dir)]), &mut again).unwrap();
    assert_eq!(tuned.0, again.0);
}

#[test]
fn starts_that_cannot_hold_are_refused_naming_the_setting() {
    let (dir, _) = pretrained();
    let from = init(dir);
    for (extra, want) in [
        // Another architecture.
        (
            vec![from.as_str(), "training.hidden=32"],
            "training.hidden = 16",
        ),
        (
            vec![from.as_str(), "training.model=\"rgat\""],
            "training.model",
        ),
        // The predictor's dot decoder has no edge classifier's weights to give.
        (
            vec![
                from.as_str(),
                "training.task=\"edge-classification\"",
                "training.target_relations=\"author__writes__paper\"",
                "training.init_parts=\"decoder\"",
            ],
            "leave 'decoder' out of training.init_parts",
        ),
        // A node classifier's last layer writes its outputs: it has no decoder.
        (
            vec![from.as_str(), "training.init_parts=\"gnn,decoder\""],
            "has none",
        ),
        (
            vec![
                from.as_str(),
                "training.init_parts=\"gnn\"",
                "training.freeze=\"embed\"",
            ],
            "only loaded parts can be frozen",
        ),
        (
            vec!["training.freeze=\"gnn\""],
            "apply with training.init_from",
        ),
        (
            vec![from.as_str(), "training.init_parts=\"weights\""],
            "unknown part 'weights'",
        ),
    ] {
        let mut o: Vec<String> = vec![
            "training.epochs=1".into(),
            "training.hidden=16".into(),
            "training.embed_dim=8".into(),
        ];
        o.extend(extra.iter().map(|s| s.to_string()));
        o.push(format!(
            "training.data={:?}",
            common::graph().display().to_string()
        ));
        let err = match Config::parse("", &o) {
            Err(e) => e.to_string(),
            Ok(cfg) => train(&cfg, &mut Losses::default())
                .err()
                .unwrap()
                .to_string(),
        };
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // A mode that cannot start from a checkpoint says which can.
    let err = Config::parse("", &["training.mode=\"raf\"".into(), from.clone()])
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("single, data-parallel, model-averaging, hopgnn and full-graph"),
        "{err}"
    );
}

/// Asserts every table of `got` holds the rows `lp` has under its name.
fn same_rows(got: &Model, lp: &[(String, Vec<f32>)], what: &str) {
    for e in got.embeddings.iter().flatten() {
        assert!(
            e.data.as_slice() == value(lp, &e.name),
            "{what}: {} changed",
            e.name
        );
    }
}

#[test]
fn data_parallel_fine_tuning_follows_single_process_fine_tuning() {
    let (dir, lp) = pretrained();
    let lp = values(lp);
    let base = [init(dir), "training.freeze=\"embed\"".to_string()];
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let mut single_losses = Losses::default();
    let (single, want) = train(&config(&base), &mut single_losses).unwrap();
    let pdir = derived("metis-2x1", false, |g, out| {
        let a = partition::assign_two_level(g, 2, 1, Method::Metis, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    });
    let parts = format!("training.partitions={:?}", pdir.display().to_string());
    for mode in ["data-parallel", "hopgnn"] {
        let what = format!("{mode} fine-tuning");
        let mut dp = base.clone();
        let set = format!("training.mode={mode:?}");
        dp.extend([set.as_str(), parts.as_str()]);
        let mut losses = Losses::default();
        let (report, got) = train(&config(&dp), &mut losses).unwrap();
        assert_eq!((report.mode.as_str(), report.steps), (mode, single.steps));
        let n = single_losses.0.len().min(16);
        common::same_losses(&single_losses.0[..n], &losses.0[..n], &what);
        common::same_model(&want, &got, &what);
        // The stores kept the frozen rows as the predictor left them.
        same_rows(&got, &lp, &what);
    }
}

/// Full-graph training starts from the checkpoint as the single process
/// does: one worker takes the loss of one batch over every neighbour.
#[test]
fn full_graph_fine_tuning_follows_one_batch_fine_tuning() {
    let (dir, lp) = pretrained();
    let lp = values(lp);
    let base = [init(dir), "training.freeze=\"embed\"".to_string()];
    let mut one = base.to_vec();
    one.extend([
        "training.batch=1000000".to_string(),
        "training.fanouts=[1000000,1000000]".into(),
    ]);
    let one: Vec<&str> = one.iter().map(String::as_str).collect();
    let mut want = Losses::default();
    train(&config(&one), &mut want).unwrap();
    let pdir = derived("block-row-1x1", false, |g, out| {
        let a = partition::assign_two_level(g, 1, 1, Method::BlockRow, 0).unwrap();
        partition::write(g, &a, out, false, &mut NoProgress).unwrap();
    });
    let parts = format!("training.partitions={:?}", pdir.display().to_string());
    let mut full: Vec<&str> = base.iter().map(String::as_str).collect();
    full.extend(["training.mode=\"full-graph\"", parts.as_str()]);
    let mut got = Losses::default();
    let (report, model) = train(&config(&full), &mut got).unwrap();
    assert_eq!(report.mode, "full-graph");
    common::same_losses(&want.0, &got.0, "full-graph fine-tuning");
    same_rows(&model, &lp, "full-graph fine-tuning");
}

/// Model averaging on one partition fine-tunes exactly as the single
/// process: the same final model, the frozen rows as the predictor left them.
#[test]
fn model_averaging_fine_tuning_on_one_partition_is_single_process_fine_tuning() {
    let (dir, lp) = pretrained();
    let lp = values(lp);
    let base = [init(dir), "training.freeze=\"embed\"".to_string()];
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let (single, _) = train(&config(&base), &mut Losses::default()).unwrap();
    let pdir = derived("halo-1x1", false, |g, out| {
        let a = partition::assign_two_level(g, 1, 1, Method::Metis, 0).unwrap();
        let opts = partition::WriteOptions {
            halo_features: true,
            ..partition::WriteOptions::default()
        };
        partition::write_with(g, &a, out, &opts, &mut NoProgress).unwrap();
    });
    let parts = format!("training.partitions={:?}", pdir.display().to_string());
    let mut ma = base.clone();
    ma.extend(["training.mode=\"model-averaging\"", parts.as_str()]);
    let (report, model) = train(&config(&ma), &mut Losses::default()).unwrap();
    assert_eq!(report.mode, "model-averaging");
    assert_eq!(report.final_model_sha256, single.final_model_sha256);
    same_rows(&model, &lp, "model-averaging fine-tuning");
}

#[test]
fn an_edge_classifier_takes_the_whole_encoder_of_a_link_predictor() {
    let (dir, lp) = pretrained();
    let lp = values(lp);
    let mut notes = Notes::default();
    let cfg = config(&[
        &init(dir),
        "training.freeze=\"embed,gnn\"",
        "training.task=\"edge-classification\"",
        &format!("training.target_relations={WRITES:?}"),
    ]);
    let (_, tuned) = train(&cfg, &mut notes).unwrap();
    assert!(
        notes.0.iter().any(|n| n.contains("initialised from"))
            && !notes.0.iter().any(|n| n.contains("afresh")),
        "both write embeddings: the last layer is loaded too: {:?}",
        notes.0
    );
    let tuned = values(&tuned);
    let (mut kept, mut decoder) = (0, 0);
    for (name, got) in &tuned {
        match name.starts_with("edge.") {
            true => decoder += 1,
            false => {
                assert!(got.as_slice() == value(&lp, name), "{name} changed");
                kept += 1;
            }
        }
    }
    assert!(kept > 4 && decoder > 0, "{kept} kept, {decoder} decoder");
}

#[test]
fn a_resumed_fine_tuning_keeps_its_frozen_parts_and_ends_as_an_uninterrupted_one() {
    let (dir, lp) = pretrained();
    let lp = values(lp);
    let ck = common::root().join("tuned-checkpoints");
    let at = format!("training.checkpoint_dir={:?}", ck.display().to_string());
    let from = init(dir);
    let run = |epochs: &str, resume: bool| {
        let mut o = vec![
            from.as_str(),
            "training.freeze=\"embed\"",
            at.as_str(),
            epochs,
        ];
        if resume {
            o.push("training.resume=true");
        }
        train(&config(&o), &mut Losses::default()).unwrap()
    };
    let (first, _) = run("training.epochs=1", false);
    let (report, resumed) = run("training.epochs=2", true);
    assert_eq!(report.resumed_from_step, Some(first.steps));
    let resumed = values(&resumed);
    std::fs::remove_dir_all(&ck).unwrap();
    let whole = values(&run("training.epochs=2", false).1);
    assert!(
        resumed == whole,
        "the resumed run differs from the whole one"
    );
    for (name, got) in resumed.iter().filter(|(n, _)| n.starts_with("embed.")) {
        assert!(got.as_slice() == value(&lp, name), "{name} changed");
    }
}
