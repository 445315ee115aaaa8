//! The configuration reference (docs/guide/configuration.md) lists exactly
//! the keys the code reads: every shared key of `[training]` and every key of
//! each mode's `[training.<mode>]`, no more and no fewer.

use std::collections::{BTreeMap, BTreeSet};

use actors::TrainingConfig;

/// Keys of the reference's tables, by section: "training" for the shared
/// ones, the mode's name for `[training.<mode>]`.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/guide/configuration.md"
    );
    let text = std::fs::read_to_string(path).expect("the configuration reference");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut section: Option<String> = None;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = (h == "`[training]`").then(|| "training".to_string());
        } else if let Some(h) = line.strip_prefix("### ") {
            if section.is_some() {
                section = Some(
                    h.strip_prefix("`[training.")
                        .and_then(|m| m.strip_suffix("]`"))
                        .unwrap_or("training")
                        .to_string(),
                );
            }
        } else if let (Some(s), Some(row)) = (&section, line.strip_prefix("| `")) {
            let key = row.split('`').next().unwrap_or_default();
            out.entry(s.clone()).or_default().insert(key.to_string());
        }
    }
    out
}

fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object().expect("a table").keys().cloned().collect()
}

#[test]
fn the_reference_lists_every_key_the_code_reads() {
    let docs = documented();
    let mut shared = keys(&serde_json::to_value(TrainingConfig::default()).unwrap());
    // Written only when set (a report of one task shows none).
    shared.insert("tasks".to_string());
    assert_eq!(
        docs.get("training"),
        Some(&shared),
        "shared [training] keys: the reference against TrainingConfig"
    );
    let modes = actors::modes::settings_defaults();
    assert_eq!(modes.len(), 6);
    for (name, defaults) in modes {
        assert_eq!(
            docs.get(name),
            Some(&keys(&defaults)),
            "[training.{name}]: the reference against the mode's settings"
        );
    }
    assert_eq!(docs.len(), 7, "no section for a mode that does not exist");
}
