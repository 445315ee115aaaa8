//! Checkpoints of distributed runs, taken every `checkpoint_every` steps and
//! at the end: `<checkpoint_dir>/step-NNNNNNNNN/` holds the dense parameters
//! with their Adam state (`dense.safetensors`, written by trainer 0: every
//! replica holds the same bits), one file per embedding store with its own
//! rows and their Adam state (`embed.<type>.<part>.safetensors`), and the
//! coordinator's `manifest.json` with a SHA-256 per file.
//!
//! Writers fill `.step-N.partial/`, each file written under a temporary name
//! and renamed; the coordinator writes the manifest once every file is
//! reported and renames the directory into place, so a crash never leaves a
//! checkpoint that looks complete. Loading verifies checksums; a corrupted or
//! truncated checkpoint is skipped for the one before it.
//!
//! The directory must be shared by the nodes (one machine, or a network file
//! system): a node restarted anywhere must read what the others wrote.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use models::checkpoint::{sha256, Sealed};
use models::optim::Adam;
use models::{Model, ModelSpec};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::report::EpochReport;

/// 2: the manifest is sealed.
const FORMAT: u32 = 2;
/// The file trainer 0 writes.
pub const DENSE: &str = "dense.safetensors";
const MANIFEST: &str = "manifest.json";
const PREFIX: &str = "step-";
/// Largest manifest read (a manifest lists a few files and epochs).
const MAX_MANIFEST: u64 = 16 << 20;

pub use super::messages::Progress;

/// What a checkpoint records besides tensors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Checkpoint format version.
    pub format: u32,
    /// Identifies the run (model, data, partitions and every setting that
    /// shapes the model's bits): resuming requires an equal one.
    pub run: String,
    /// The training mode that wrote it ("data-parallel", "raf", ...).
    pub mode: String,
    /// The model's spec (for people and `predict`).
    pub spec: ModelSpec,
    /// Sampling fanouts of training (`predict` samples the same way).
    pub fanouts: Vec<usize>,
    /// The content of the graph the partitions were cut from
    /// ([`graphs::fingerprint::content`]; absent when unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_sha256: Option<String>,
    /// Whether reverse relations were added (they have parameters of their own).
    pub reverse_edges: bool,
    /// Steps done: training resumes at this global step.
    pub seq: u64,
    /// Epochs finished before `seq`, as reported.
    pub epochs: Vec<EpochReport>,
    /// Trainer 0's figures of the unfinished epoch.
    pub progress: Progress,
    /// SHA-256 of each tensor file.
    pub files: BTreeMap<String, String>,
    /// The seal of the rest (`models::checkpoint::Sealed`): a hand-edited manifest is refused.
    pub seal: String,
}

impl Sealed for Manifest {
    fn seal_field(&mut self) -> &mut String {
        &mut self.seal
    }
}

impl Manifest {
    /// A manifest of the current format for a run of `mode` configured by `t`.
    pub fn new(
        run: String,
        mode: &str,
        t: &crate::config::TrainingConfig,
        seq: u64,
        epochs: Vec<EpochReport>,
        progress: Progress,
        files: BTreeMap<String, String>,
    ) -> Manifest {
        Manifest {
            format: FORMAT,
            run,
            mode: mode.to_string(),
            spec: t.model_spec(),
            fanouts: t.fanouts.clone(),
            graph_sha256: None,
            reverse_edges: t.reverse_edges,
            seq,
            epochs,
            progress,
            files,
            seal: String::new(),
        }
    }
}

fn io(path: &Path, source: std::io::Error) -> TrainError {
    TrainError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn bad(path: &Path, problem: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint(format!("{}: {problem}", path.display()))
}

/// A run's fingerprint: every training setting that shapes the model's bits
/// (model, graph, sampling, batches, optimiser), then `extra` (the mode's own:
/// partitioning, all-reduce order, ...). Checkpoints are resumed only by an equal run.
pub fn fingerprint(t: &crate::config::TrainingConfig, graph: &str, extra: &[&[u8]]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    // A run of one task keeps the fingerprint it had before multi-task
    // heads existed, so its checkpoints still resume.
    let spec = format!("{:?}", t.model_spec()).replace(", task_heads: []", "");
    h.update(
        format!(
            "{spec}|{graph}|{}|{:?}|{}|{}|{}",
            t.reverse_edges, t.fanouts, t.batch, t.lr, t.seed
        )
        .as_bytes(),
    );
    for e in extra {
        h.update((e.len() as u64).to_le_bytes());
        h.update(e);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The directory of the complete checkpoint at step `seq`.
pub fn dir(root: &Path, seq: u64) -> PathBuf {
    root.join(format!("{PREFIX}{seq:09}"))
}

/// Where the files of the checkpoint at step `seq` are written before it is complete.
pub fn partial_dir(root: &Path, seq: u64) -> PathBuf {
    root.join(format!(".{PREFIX}{seq:09}.partial"))
}

/// File name of an embedding store's rows (`store` as in `names::store`).
pub fn shard_file(ty: &str, part: u32) -> String {
    format!("embed.{}.{part}.safetensors", super::names::plain(ty))
}

/// Writes `tensors` as `file` into `dir` (temporary name, then rename);
/// returns the file's name and SHA-256.
pub fn write_tensors(
    dir: &Path,
    file: &str,
    tensors: &HashMap<String, Tensor>,
) -> Result<(String, String)> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let tmp = dir.join(format!(".{file}.tmp-{}", std::process::id()));
    // Named: a full disk must say which file it could not write.
    candle_core::safetensors::save(tensors, &tmp)
        .map_err(|e| bad(&tmp, format!("writing: {e}")))?;
    let bytes = std::fs::read(&tmp).map_err(|e| io(&tmp, e))?;
    let dest = dir.join(file);
    std::fs::rename(&tmp, &dest).map_err(|e| io(&dest, e))?;
    Ok((file.to_string(), sha256(&bytes)))
}

/// Writes the dense parameters and their Adam state into the partial checkpoint at `seq`.
pub fn write_dense(root: &Path, seq: u64, model: &Model, adam: &Adam) -> Result<(String, String)> {
    write_tensors(
        &partial_dir(root, seq),
        DENSE,
        &models::checkpoint::dense_tensors(model, adam)?,
    )
}

/// Completes the checkpoint at `manifest.seq`: writes the manifest, renames the
/// directory into place and removes all but the newest `keep` checkpoints
/// (and partial ones of earlier steps, left by failed attempts).
pub fn finalize(root: &Path, manifest: &Manifest, keep: usize) -> Result<PathBuf> {
    let partial = partial_dir(root, manifest.seq);
    for file in manifest.files.keys() {
        let p = partial.join(file);
        if !p.is_file() {
            return Err(bad(&p, "reported written but missing"));
        }
    }
    let mut sealed = manifest.clone();
    sealed.seal();
    let text = serde_json::to_string_pretty(&sealed).map_err(|e| bad(&partial, e))?;
    let mpath = partial.join(MANIFEST);
    std::fs::write(&mpath, text).map_err(|e| io(&mpath, e))?;
    let dest = dir(root, manifest.seq);
    if dest.exists() {
        std::fs::remove_dir_all(&dest).map_err(|e| io(&dest, e))?;
    }
    std::fs::rename(&partial, &dest).map_err(|e| io(&dest, e))?;
    // Newer ones belong to a timeline that rolled back past them (one was
    // unusable): they go, then all but the newest `keep`.
    let mut complete = Vec::new();
    for d in list(root)? {
        if d.file_name()
            .and_then(|n| {
                n.to_string_lossy()
                    .strip_prefix(PREFIX)
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .is_some_and(|s| s > manifest.seq)
        {
            std::fs::remove_dir_all(&d).map_err(|e| io(&d, e))?;
        } else {
            complete.push(d);
        }
    }
    for old in complete
        .iter()
        .take(complete.len().saturating_sub(keep.max(1)))
    {
        std::fs::remove_dir_all(old).map_err(|e| io(old, e))?;
    }
    for entry in std::fs::read_dir(root).map_err(|e| io(root, e))?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let seq = name
            .strip_prefix(&format!(".{PREFIX}"))
            .and_then(|r| r.strip_suffix(".partial"))
            .and_then(|n| n.parse::<u64>().ok());
        if seq.is_some_and(|s| s < manifest.seq) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(dest)
}

/// Complete checkpoint directories under `root`, oldest first.
pub fn list(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = match std::fs::read_dir(root) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
            .map(|e| e.path())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(root, e)),
    };
    out.sort();
    Ok(out)
}

/// Reads a checkpoint's manifest (not its files).
pub fn manifest(dir: &Path) -> Result<Manifest> {
    let mpath = dir.join(MANIFEST);
    let text = graphs::input::read_capped(&mpath, MAX_MANIFEST)?;
    let text =
        String::from_utf8(text).map_err(|_| bad(&mpath, "unreadable manifest: not UTF-8"))?;
    let m: Manifest = serde_json::from_str(&text)
        .map_err(|e| bad(&mpath, format!("unreadable manifest: {e}")))?;
    if m.format != FORMAT {
        return Err(bad(
            &mpath,
            format!("format {} (this build reads {FORMAT})", m.format),
        ));
    }
    if m.files.keys().any(|f| !valid_file_name(f)) {
        return Err(bad(&mpath, "names a file outside the checkpoint"));
    }
    let mut m = m;
    if !m.seal_holds() {
        return Err(bad(&mpath, models::checkpoint::SEAL_BROKEN));
    }
    if dir.file_name().map(|n| n.to_string_lossy().to_string())
        != Some(format!("{PREFIX}{:09}", m.seq))
    {
        return Err(bad(
            &mpath,
            format!("records step {} but sits in {}", m.seq, dir.display()),
        ));
    }
    Ok(m)
}

/// Whether `name` can be a checkpoint's tensor file: a plain name inside its directory.
pub fn valid_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.contains(['/', '\\'])
        && !name.starts_with('.')
        && name.ends_with(".safetensors")
}

/// Reads `file` of the checkpoint in `dir` and checks it against the manifest's checksum.
pub fn read_verified(dir: &Path, m: &Manifest, file: &str) -> Result<Vec<u8>> {
    let want = m
        .files
        .get(file)
        .ok_or_else(|| bad(dir, format!("the manifest lists no {file}")))?;
    let path = dir.join(file);
    let bytes = graphs::input::read_capped(&path, u64::MAX)?;
    if sha256(&bytes) != *want {
        return Err(bad(&path, "checksum mismatch (corrupted or truncated)"));
    }
    Ok(bytes)
}

/// The tensors of `file` in the checkpoint `dir`, checksum verified.
pub fn load_tensors(dir: &Path, m: &Manifest, file: &str) -> Result<HashMap<String, Tensor>> {
    let bytes = read_verified(dir, m, file)?;
    Ok(candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)?)
}

/// A store shard's row ids and their values, row after row.
type ShardRows = (Vec<u32>, Vec<f32>);

/// Fills `model` (built for `m.spec` on the whole graph) from the distributed
/// checkpoint in `dir`: each parameter from the first file holding it
/// (trainer 0's dense file, or the raf workers' in worker order), each
/// embedding table from the stores' shards (rows by id) or from the first
/// worker holding it. Every file's checksum is verified; every value must be
/// found (but, with `partial`, what the writing mode's
/// [`crate::modes::seam::Rules::partial_params`] says, a parameter no partition
/// uses, which keeps its initial value).
pub fn assemble(dir: &Path, m: &Manifest, model: &mut Model, partial: bool) -> Result<()> {
    let mut params: HashMap<String, Tensor> = HashMap::new();
    let mut tables: HashMap<String, Vec<f32>> = HashMap::new();
    // Per embedding table, each shard's (row ids, row values).
    let mut shard_rows: HashMap<String, Vec<ShardRows>> = HashMap::new();
    for file in m.files.keys() {
        let tensors = load_tensors(dir, m, file)?;
        if let Some(ty) = file
            .strip_prefix("embed.")
            .and_then(|r| r.rsplit_once('.'))
            .and_then(|(r, _)| r.rsplit_once('.'))
            .map(|(ty, _)| ty)
        {
            // A store's shard: `embed.<type>.<part>.safetensors`.
            let get = |k: &str| {
                tensors
                    .get(k)
                    .ok_or_else(|| bad(&dir.join(file), format!("tensor '{k}' is missing")))
            };
            let ids: Vec<u32> = get("ids")?.to_vec1()?;
            let data: Vec<f32> = get("data")?.flatten_all()?.to_vec1()?;
            shard_rows
                .entry(ty.to_string())
                .or_default()
                .push((ids, data));
            continue;
        }
        for (name, t) in tensors {
            if let Some(p) = name.strip_prefix("param.") {
                params.entry(p.to_string()).or_insert(t);
            } else if let Some(table) = name.strip_suffix(".data") {
                if !tables.contains_key(table) {
                    tables.insert(table.to_string(), t.flatten_all()?.to_vec1()?);
                }
            }
        }
    }
    let (device, dtype) = (model.device().clone(), model.dtype());
    for (name, var) in model.params.iter() {
        let Some(t) = params.remove(name) else {
            // A parameter no partition uses never changes: where the mode says
            // so, it keeps its initial value.
            if partial {
                continue;
            }
            return Err(bad(dir, format!("no file holds parameter {name}")));
        };
        if t.shape() != var.as_tensor().shape() {
            return Err(bad(
                dir,
                format!(
                    "parameter {name} has shape {:?}, the model {:?}",
                    t.dims(),
                    var.as_tensor().dims()
                ),
            ));
        }
        var.set(&t.to_dtype(dtype)?.to_device(&device)?)?;
    }
    for e in model.embeddings.iter_mut().flatten() {
        let ty = e.name.strip_prefix("embed.").unwrap_or(&e.name);
        let ty_file = super::names::plain(ty);
        if let Some(data) = tables.remove(&e.name) {
            if data.len() != e.data.len() {
                return Err(bad(
                    dir,
                    format!(
                        "table {} has {} values, the model {}",
                        e.name,
                        data.len(),
                        e.data.len()
                    ),
                ));
            }
            e.data = data;
        } else if let Some(shards) = shard_rows.remove(&ty_file) {
            let mut seen = vec![false; e.rows];
            for (ids, data) in shards {
                if data.len() != ids.len() * e.dim {
                    return Err(bad(
                        dir,
                        format!("a shard of {} has rows of another width", e.name),
                    ));
                }
                for (k, &id) in ids.iter().enumerate() {
                    let row = id as usize;
                    if row >= e.rows || seen[row] {
                        return Err(bad(
                            dir,
                            format!("a shard of {} names row {id} out of range or twice", e.name),
                        ));
                    }
                    seen[row] = true;
                    e.data[row * e.dim..(row + 1) * e.dim]
                        .copy_from_slice(&data[k * e.dim..(k + 1) * e.dim]);
                }
            }
            if let Some(missing) = seen.iter().position(|s| !s) {
                return Err(bad(
                    dir,
                    format!("no shard holds row {missing} of {}", e.name),
                ));
            }
        } else {
            return Err(bad(dir, format!("no file holds table {}", e.name)));
        }
    }
    Ok(())
}

/// The newest checkpoint under `root` whose every file verifies, with what
/// was wrong with newer ones. A checkpoint of another run is an error: the
/// directory belongs to that run.
pub fn latest(root: &Path, run: &str) -> Result<Option<(Manifest, Vec<String>)>> {
    latest_of(root, Some(run))
}

/// The newest checkpoint under `root` whose every file verifies, of whatever
/// run wrote it (for reading a trained model), with what was wrong with newer ones.
pub fn latest_any(root: &Path) -> Result<Option<(Manifest, Vec<String>)>> {
    latest_of(root, None)
}

fn latest_of(root: &Path, run: Option<&str>) -> Result<Option<(Manifest, Vec<String>)>> {
    let mut skipped = Vec::new();
    for d in list(root)?.into_iter().rev() {
        let checked = manifest(&d).and_then(|m| {
            for f in m.files.keys() {
                read_verified(&d, &m, f)?;
            }
            Ok(m)
        });
        match checked {
            Ok(m) if run.is_some_and(|r| m.run != r) => {
                return Err(bad(&d, "written by another run (other model, data, partitions or settings); resume that run as it was configured, or use another checkpoint_dir"))
            }
            Ok(m) => return Ok(Some((m, skipped))),
            Err(e) => skipped.push(e.to_string()),
        }
    }
    if skipped.is_empty() {
        Ok(None)
    } else {
        Err(bad(
            root,
            format!("no usable checkpoint: {}", skipped.join("; ")),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors(v: f32) -> HashMap<String, Tensor> {
        HashMap::from([(
            "x".to_string(),
            Tensor::new(&[v, v + 1.0], &Device::Cpu).unwrap(),
        )])
    }

    fn save(root: &Path, seq: u64, v: f32, keep: usize) -> Manifest {
        let (f, sum) = write_tensors(
            &partial_dir(root, seq),
            "embed.a.0.safetensors",
            &tensors(v),
        )
        .unwrap();
        let m = Manifest::new(
            "r".into(),
            "data-parallel",
            &crate::config::TrainingConfig::default(),
            seq,
            Vec::new(),
            Progress::default(),
            BTreeMap::from([(f, sum)]),
        );
        finalize(root, &m, keep).unwrap();
        m
    }

    #[test]
    fn the_newest_verified_checkpoint_wins_and_old_ones_are_pruned() {
        let root = tempfile::tempdir().unwrap();
        assert!(
            latest(root.path(), "r").unwrap().is_none(),
            "an empty directory has none"
        );
        for (seq, v) in [(5, 1.0), (10, 2.0), (15, 3.0)] {
            save(root.path(), seq, v, 2);
        }
        assert_eq!(
            list(root.path()).unwrap(),
            vec![dir(root.path(), 10), dir(root.path(), 15)],
            "keep = 2"
        );
        let (m, skipped) = latest(root.path(), "r").unwrap().unwrap();
        assert_eq!((m.seq, skipped.len()), (15, 0));
        let t = load_tensors(&dir(root.path(), 15), &m, "embed.a.0.safetensors").unwrap();
        assert_eq!(t["x"].to_vec1::<f32>().unwrap(), vec![3.0, 4.0]);

        // Truncate the newest: its checksum fails and the one before is used.
        let f = dir(root.path(), 15).join("embed.a.0.safetensors");
        let len = std::fs::metadata(&f).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let (m, skipped) = latest(root.path(), "r").unwrap().unwrap();
        assert_eq!(m.seq, 10);
        assert!(skipped[0].contains("checksum"), "{skipped:?}");

        // The next checkpoint written (rolled back to 10) removes the unusable 15.
        save(root.path(), 12, 4.0, 2);
        assert_eq!(
            list(root.path()).unwrap(),
            vec![dir(root.path(), 10), dir(root.path(), 12)]
        );

        // Another run's checkpoints are refused, not mixed in.
        let err = latest(root.path(), "other").unwrap_err().to_string();
        assert!(err.contains("another run"), "{err}");
    }

    #[test]
    fn unfinished_checkpoints_are_invisible_and_cleaned_up() {
        let root = tempfile::tempdir().unwrap();
        write_tensors(
            &partial_dir(root.path(), 3),
            "dense.safetensors",
            &tensors(0.0),
        )
        .unwrap();
        assert!(
            latest(root.path(), "r").unwrap().is_none(),
            "a partial directory is no checkpoint"
        );
        save(root.path(), 4, 1.0, 3);
        assert!(
            !partial_dir(root.path(), 3).exists(),
            "an older partial directory is removed"
        );
        // A manifest naming a file outside the checkpoint is refused.
        let d = dir(root.path(), 4);
        let text = std::fs::read_to_string(d.join(MANIFEST))
            .unwrap()
            .replace("embed.a.0.safetensors", "../x.safetensors");
        std::fs::write(d.join(MANIFEST), &text).unwrap();
        let err = latest(root.path(), "r").unwrap_err().to_string();
        assert!(err.contains("outside"), "{err}");
        // Any other edit of the manifest is refused too (the seal).
        let d = dir(root.path(), 4);
        std::fs::write(
            d.join(MANIFEST),
            text.replace("../x.safetensors", "embed.a.0.safetensors")
                .replace("\"mode\": \"", "\"mode\": \"x"),
        )
        .unwrap();
        let err = manifest(&d).unwrap_err().to_string();
        assert!(err.contains("was changed after it was written"), "{err}");
    }
}
