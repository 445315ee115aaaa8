//! `hetgnn predict --partitions`: every target node's prediction by exact
//! inference across partitions, each computing the target nodes it owns (in
//! this process, or one node of a topology per process), written per
//! partition as `predict --out x.npy` writes them.

use std::path::Path;

use anyhow::{bail, Context};
use graphs::npy::{DType as NpyType, NpyFile};
use serving::engine::{answers, head_task};
use serving::{Rows, Want};

use crate::embed::Partitioned;
use crate::predict::{InferenceArg, PredictArgs};

/// Runs `predict` over the partition directory `parts`.
pub fn run(a: &PredictArgs, parts: &Path) -> anyhow::Result<()> {
    if a.inference == Some(InferenceArg::Sampled) {
        bail!("--partitions predicts by exact inference (full neighbourhoods): drop --inference sampled, or predict in one process without --partitions");
    }
    if a.relation.is_some() {
        bail!("--relation applies to --edges, which --partitions does not score: edge and link models score edge lists in one process");
    }
    let job = Partitioned {
        checkpoint: &a.checkpoint,
        partitions: parts,
        data: a.data.as_deref(),
        config: a.config.as_deref(),
        node: a.node.as_deref(),
        out: &a.out,
        batch: a.batch,
        force: a.force,
        wait: a.wait,
        task: a.task.as_deref(),
    };
    let ran = job
        .run(actors::inference::Computes::Logits)
        .context("predicting over the partitions")?;
    let Some(head) = ran.head.clone() else {
        bail!("the job computed no logits");
    };
    let mut written = 0u64;
    for &k in &ran.here {
        let dir = a.out.join(format!("part-{k}"));
        written += write_part(&dir, &ran.target, head.clone())
            .with_context(|| format!("writing the predictions of {}", dir.display()))?;
    }
    let task = head_task(head.0);
    match ran.manifest {
        Some(_) => sayln!(
            "wrote {task} predictions for {written} {} nodes in {} partitions to {}/part-*/predictions.npy in {:.1}s (checkpoint {}; {} layer(s), full neighbourhoods)",
            ran.target,
            ran.parts,
            a.out.display(),
            ran.took,
            ran.checkpoint.display(),
            ran.layers
        ),
        None => sayln!(
            "wrote this node's {task} predictions ({written} {} nodes) to {} in {:.1}s; the first node writes the manifest",
            ran.target,
            a.out.display(),
            ran.took
        ),
    }
    Ok(())
}

/// Partition directory `dir`'s `predictions.npy` from its target logits
/// `<target>.npy` by `head`; returns the nodes written.
fn write_part(
    dir: &Path,
    target: &str,
    head: (models::model::Head, std::ops::Range<usize>),
) -> anyhow::Result<u64> {
    let logits = NpyFile::open(&dir.join(format!("{target}.npy")), NpyType::F32)?;
    let shape = logits.shape().to_vec();
    if shape.len() != 2 || (shape[1] as usize) < head.1.end {
        bail!(
            "{target}.npy: shape {shape:?}, the model's outputs need {} columns",
            head.1.end
        );
    }
    let (n, width) = (shape[0], shape[1] as usize);
    let rows = Rows {
        width,
        data: logits.to_f32_vec(),
    };
    let labels = head.1.len();
    let c = answers(head, &rows, None, Want::default());
    let tmp = dir.join(".predictions.npy.partial");
    if let Some(values) = c.values {
        graphs::npy::write_f32(&tmp, &[n], &values)?;
    } else if let Some(sets) = c.labels {
        let bits = crate::predict::label_bits(&sets, labels);
        graphs::npy::write_i8(&tmp, &[n, labels as u64], &bits)?;
    } else {
        let classes: Vec<i64> = c.classes.iter().map(|&k| i64::from(k)).collect();
        graphs::npy::write_i64(&tmp, &[n], &classes)?;
    }
    let dest = dir.join("predictions.npy");
    std::fs::rename(&tmp, &dest).with_context(|| format!("moving into {}", dest.display()))?;
    Ok(n)
}
