//! What the serving tests share: a small trained model, and answers compared to 1e-5.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use actors::{train, Config};
use serving::{Classified, Want};

/// A mag-like graph and a model trained on it for one epoch (`extra`
/// settings), checkpointed.
pub fn trained(tmp: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    let data = tmp.join("g");
    graphs::generate::generate(
        graphs::generate::Like::Mag,
        0.002,
        0,
        &data,
        false,
        &mut graphs::NoProgress,
    )
    .unwrap();
    let ck = tmp.join("ck");
    let overrides: Vec<String> = [
        format!("training.data={:?}", data.display().to_string()),
        format!("training.checkpoint_dir={:?}", ck.display().to_string()),
        "training.epochs=1".into(),
        "training.batch=256".into(),
        "training.hidden=16".into(),
        "training.embed_dim=8".into(),
    ]
    .into_iter()
    .chain(extra.iter().map(|s| s.to_string()))
    .collect();
    train(&Config::parse("", &overrides).unwrap(), &mut ()).unwrap();
    (data, ck)
}

/// Every output: classes, probabilities and embeddings.
pub const ALL: Want = Want {
    probabilities: true,
    embeddings: true,
};

/// Asserts `got` answers as `want` does: the same classes, values and
/// probabilities and embeddings within 1e-5.
pub fn same(want: &Classified, got: &Classified, what: &str) {
    assert_eq!(want.classes, got.classes, "{what}: classes");
    assert_eq!(
        want.values.is_some(),
        got.values.is_some(),
        "{what}: values"
    );
    for (a, b) in want
        .values
        .iter()
        .flatten()
        .zip(got.values.iter().flatten())
    {
        assert!((a - b).abs() <= 1e-5, "{what}: value {a} vs {b}");
    }
    for (w, g, part) in [
        (&want.probabilities, &got.probabilities, "probabilities"),
        (&want.embeddings, &got.embeddings, "embeddings"),
    ] {
        assert_eq!(w.is_some(), g.is_some(), "{what}: {part}");
        let (Some(w), Some(g)) = (w, g) else {
            continue;
        };
        assert_eq!(w.width, g.width, "{what}: {part}");
        assert_eq!(w.data.len(), g.data.len(), "{what}: {part}");
        let worst = w
            .data
            .iter()
            .zip(&g.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-5, "{what}: {part} differ by {worst}");
    }
}
