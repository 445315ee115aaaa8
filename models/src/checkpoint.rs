//! Checkpoints: dense parameters with their Adam moments, learnable embedding
//! tables, their row-wise Adam state, and a manifest with the model spec,
//! training progress and a checksum per file (BLAKE3; SHA-256 in format 2).
//!
//! The tables' rows and their Adam state are separate files: inference reads
//! and verifies the rows alone, a third of the bytes (checkpoints written
//! before hold both in `embeddings.safetensors`, and still load).
//!
//! A checkpoint is written to a temporary directory and renamed into place, so
//! a crash never leaves a half-written one; loading verifies every checksum
//! and the model spec before touching the model.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::model::{Model, ModelSpec};
use crate::optim::Adam;

/// 2: the manifest records the run's fingerprint and is sealed; 3: the
/// tables' Adam state is a file of its own ([`MOMENTS`]), and files are
/// checksummed with BLAKE3. Both are read.
const FORMAT: u32 = 3;
/// The oldest format this build reads.
const OLDEST_FORMAT: u32 = 2;
const PARAMS: &str = "params.safetensors";
const EMBEDDINGS: &str = "embeddings.safetensors";
/// The tables' row-wise Adam state: resuming training reads it, inference does not.
const MOMENTS: &str = "embedding-moments.safetensors";
const MANIFEST: &str = "manifest.json";

/// What a checkpoint records besides tensors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Checkpoint format version.
    pub format: u32,
    /// The model's spec; resuming requires an equal one.
    pub spec: ModelSpec,
    /// Name of the graph trained on.
    pub graph: String,
    /// The graph's content ([`graphs::fingerprint::content`]): resuming and
    /// predicting require an equal one (absent in checkpoints written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_sha256: Option<String>,
    /// Whether reverse relations were added (they have parameters of their own).
    pub reverse_edges: bool,
    /// Sampling fanouts used in training (prediction samples the same way).
    pub fanouts: Vec<usize>,
    /// Epochs completed.
    pub epochs_done: u64,
    /// Training steps completed.
    pub steps: u64,
    /// Checksum of each tensor file ([`checksum`]).
    pub files: BTreeMap<String, String>,
    /// Every setting that shapes the run's trajectory (learning rate, batch,
    /// fanouts, seed, model...) as one fingerprint: resuming requires an equal one.
    pub run: String,
    /// The seal of the rest ([`Sealed`]): a hand-edited manifest is refused, not believed.
    pub seal: String,
}

pub use graphs::seal::{sha256, Sealed};

/// Hex checksum of a checkpoint file as a manifest of `format` records it:
/// BLAKE3 from format 3 (a fourth of SHA-256's time here, and every process
/// that reads a checkpoint verifies it), SHA-256 before.
pub fn checksum(format: u32, bytes: &[u8]) -> String {
    match format {
        ..=2 => sha256(bytes),
        _ => blake3::hash(bytes).to_hex().to_string(),
    }
}

/// [`checksum`] of the file at `path`.
fn file_checksum(format: u32, path: &Path) -> Result<String> {
    match format {
        ..=2 => graphs::fingerprint::file(path),
        _ => graphs::fingerprint::blake3_file(path),
    }
    .map_err(|e| bad(path, e.to_string()))
}

/// What a manifest whose seal does not hold is told.
pub const SEAL_BROKEN: &str = "was changed after it was written (its seal does not match): a checkpoint is read only as written";

impl Sealed for Manifest {
    fn seal_field(&mut self) -> &mut String {
        &mut self.seal
    }
}

/// The dense parameters (`param.<name>`), their Adam moments
/// (`adam.m.<name>`, `adam.v.<name>`) and Adam's step count, as CPU f32 tensors.
pub fn dense_tensors(model: &Model, adam: &Adam) -> Result<HashMap<String, Tensor>> {
    let mut params: HashMap<String, Tensor> = HashMap::new();
    for (n, var) in model.params.iter() {
        params.insert(
            format!("param.{n}"),
            var.as_tensor()
                .to_dtype(DType::F32)?
                .to_device(&Device::Cpu)?,
        );
    }
    for (n, (m, v)) in &adam.moments {
        params.insert(
            format!("adam.m.{n}"),
            m.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
        );
        params.insert(
            format!("adam.v.{n}"),
            v.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
        );
    }
    params.insert(
        "adam.step".into(),
        Tensor::new(&[adam.step as u32], &Device::Cpu)?,
    );
    Ok(params)
}

/// Restores what [`dense_tensors`] wrote (taking it out of `tensors`); checks
/// every name and shape before changing anything. `dir` names the source in errors.
pub fn restore_dense(
    dir: &Path,
    tensors: &mut HashMap<String, Tensor>,
    model: &mut Model,
    adam: &mut Adam,
) -> Result<()> {
    restore_dense_where(dir, tensors, model, adam, |_| true)
}

/// [`restore_dense`] for the parameters `held` accepts (the others keep their values).
pub fn restore_dense_where(
    dir: &Path,
    tensors: &mut HashMap<String, Tensor>,
    model: &mut Model,
    adam: &mut Adam,
    held: impl Fn(&str) -> bool,
) -> Result<()> {
    let device = model.device().clone();
    let dtype = model.dtype();
    let mut take = |name: &str| {
        tensors
            .remove(name)
            .ok_or_else(|| bad(dir, format!("tensor '{name}' is missing")))
    };
    let mut dense = Vec::new();
    for (n, var) in model.params.iter().filter(|(n, _)| held(n)) {
        let t = take(&format!("param.{n}"))?;
        if t.shape() != var.as_tensor().shape() {
            return Err(bad(
                dir,
                format!(
                    "parameter {n} has shape {:?}, the model {:?}",
                    t.dims(),
                    var.as_tensor().dims()
                ),
            ));
        }
        let moments = match (take(&format!("adam.m.{n}")), take(&format!("adam.v.{n}"))) {
            (Ok(m), Ok(v)) => {
                if m.shape() != t.shape() || v.shape() != t.shape() {
                    return Err(bad(
                        dir,
                        format!("Adam moments of {n} do not match its shape"),
                    ));
                }
                Some((
                    m.to_dtype(dtype)?.to_device(&device)?,
                    v.to_dtype(dtype)?.to_device(&device)?,
                ))
            }
            _ => None,
        };
        dense.push((
            n.to_string(),
            t.to_dtype(dtype)?.to_device(&device)?,
            moments,
        ));
    }
    let step = take("adam.step")?
        .to_vec1::<u32>()?
        .first()
        .copied()
        .unwrap_or(0);
    for (n, t, moments) in dense {
        model.params.get(&n).expect("listed above").set(&t)?;
        if let Some(mv) = moments {
            adam.moments.insert(n, mv);
        }
    }
    adam.step = u64::from(step);
    Ok(())
}

/// The model's embedding tables with their row-wise Adam state
/// (`<table>.data`, `.m`, `.v`, `.steps`).
pub fn embedding_tensors(model: &Model) -> Result<HashMap<String, Tensor>> {
    let (mut rows, moments) = embedding_files(model)?;
    rows.extend(moments);
    Ok(rows)
}

/// [`embedding_tensors`] as the two files hold them: the rows (`.data`), and
/// their Adam state (`.m`, `.v`, `.steps`).
type TableFiles = (HashMap<String, Tensor>, HashMap<String, Tensor>);

fn embedding_files(model: &Model) -> Result<TableFiles> {
    let (mut rows, mut moments) = (HashMap::new(), HashMap::new());
    for e in model.embeddings.iter().flatten() {
        let shape = (e.rows, e.dim);
        rows.insert(
            format!("{}.data", e.name),
            Tensor::from_slice(&e.data, shape, &Device::Cpu)?,
        );
        moments.insert(
            format!("{}.m", e.name),
            Tensor::from_slice(&e.m, shape, &Device::Cpu)?,
        );
        moments.insert(
            format!("{}.v", e.name),
            Tensor::from_slice(&e.v, shape, &Device::Cpu)?,
        );
        moments.insert(
            format!("{}.steps", e.name),
            Tensor::from_slice(&e.steps, e.rows, &Device::Cpu)?,
        );
    }
    Ok((rows, moments))
}

/// A table's rows, Adam moments and per-row step counts.
type TableState = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<u32>);

/// Takes and checks what [`embedding_tensors`] wrote for every table `model` has.
fn take_embeddings(
    dir: &Path,
    tensors: &mut HashMap<String, Tensor>,
    model: &Model,
) -> Result<Vec<TableState>> {
    let mut take = |name: &str| {
        tensors
            .remove(name)
            .ok_or_else(|| bad(dir, format!("tensor '{name}' is missing")))
    };
    let mut tables = Vec::new();
    for e in model.embeddings.iter().flatten() {
        let get = |t: Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
        let data = get(take(&format!("{}.data", e.name))?)?;
        let m = get(take(&format!("{}.m", e.name))?)?;
        let v = get(take(&format!("{}.v", e.name))?)?;
        let steps = take(&format!("{}.steps", e.name))?.to_vec1::<u32>()?;
        if data.len() != e.data.len()
            || m.len() != e.m.len()
            || v.len() != e.v.len()
            || steps.len() != e.rows
        {
            return Err(bad(
                dir,
                format!("embedding table {} does not match the model's size", e.name),
            ));
        }
        tables.push((data, m, v, steps));
    }
    Ok(tables)
}

/// Restores the dense state and the embedding tables (see [`dense_tensors`],
/// [`embedding_tensors`]) from `tensors`; checks everything before changing anything.
pub fn restore_model(
    dir: &Path,
    tensors: &mut HashMap<String, Tensor>,
    model: &mut Model,
    adam: &mut Adam,
) -> Result<()> {
    restore_model_where(dir, tensors, model, adam, |_| true)
}

/// [`restore_model`] for the parameters `held` accepts (and every table the model has).
pub fn restore_model_where(
    dir: &Path,
    tensors: &mut HashMap<String, Tensor>,
    model: &mut Model,
    adam: &mut Adam,
    held: impl Fn(&str) -> bool,
) -> Result<()> {
    let tables = take_embeddings(dir, tensors, model)?;
    restore_dense_where(dir, tensors, model, adam, held)?;
    for (e, (data, m, v, steps)) in model.embeddings.iter_mut().flatten().zip(tables) {
        (e.data, e.m, e.v, e.steps) = (data, m, v, steps);
    }
    Ok(())
}

fn io(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn bad(path: &Path, problem: impl Into<String>) -> ModelError {
    ModelError::Checkpoint {
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

/// Refuses a graph whose content differs from the one the checkpoint in
/// `dir` was written for (`written`; either side unknown: nothing to compare).
pub fn check_graph_content(
    dir: &Path,
    written: Option<&str>,
    given: Option<&str>,
    how: &str,
) -> Result<()> {
    use graphs::fingerprint::short;
    match (written, given) {
        (Some(w), Some(g)) if w != g => Err(bad(
            dir,
            format!(
                "written for a graph whose content is sha256 {}…, but the graph {how} has content {}… (same name, other files: a relation, labels or features changed); use the graph it was trained on",
                short(w),
                short(g)
            ),
        )),
        _ => Ok(()),
    }
}

/// Where a run stands, recorded with its tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// Name of the graph trained on.
    pub graph: String,
    /// The graph's content, when known ([`graphs::fingerprint::content`]).
    pub graph_sha256: Option<String>,
    /// Whether reverse relations were added.
    pub reverse_edges: bool,
    /// Sampling fanouts.
    pub fanouts: Vec<usize>,
    /// Epochs completed.
    pub epochs_done: u64,
    /// Steps completed.
    pub steps: u64,
    /// The run's fingerprint (see [`Manifest::run`]).
    pub run: String,
}

/// Writes a checkpoint of `model` and `adam` under `root` as `epoch-NNNNNN`,
/// keeping the newest `keep` checkpoints. Returns its directory.
pub fn save(
    root: &Path,
    model: &Model,
    adam: &Adam,
    info: &RunInfo,
    keep: usize,
) -> Result<PathBuf> {
    let epochs_done = info.epochs_done;
    std::fs::create_dir_all(root).map_err(|e| io(root, e))?;
    let name = format!("epoch-{epochs_done:06}");
    let tmp = root.join(format!(".{name}.partial-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;

    let params = dense_tensors(model, adam)?;
    let (rows, moments) = embedding_files(model)?;
    let mut files = BTreeMap::new();
    for (file, tensors) in [(PARAMS, &params), (EMBEDDINGS, &rows), (MOMENTS, &moments)] {
        let path = tmp.join(file);
        // Named: a full disk must say which file it could not write.
        candle_core::safetensors::save(tensors, &path)
            .map_err(|e| bad(&path, format!("writing: {e}")))?;
        files.insert(file.to_string(), file_checksum(FORMAT, &path)?);
    }
    let mut manifest = Manifest {
        format: FORMAT,
        spec: model.spec().clone(),
        graph: info.graph.clone(),
        graph_sha256: info.graph_sha256.clone(),
        reverse_edges: info.reverse_edges,
        fanouts: info.fanouts.clone(),
        epochs_done,
        steps: info.steps,
        files,
        run: info.run.clone(),
        seal: String::new(),
    };
    manifest.seal();
    let mpath = tmp.join(MANIFEST);
    std::fs::write(
        &mpath,
        serde_json::to_string_pretty(&manifest).expect("manifest serialises"),
    )
    .map_err(|e| io(&mpath, e))?;
    let dest = root.join(&name);
    if dest.exists() {
        std::fs::remove_dir_all(&dest).map_err(|e| io(&dest, e))?;
    }
    std::fs::rename(&tmp, &dest).map_err(|e| io(&dest, e))?;
    // Prune the oldest, never the one just written.
    let others: Vec<PathBuf> = list(root)?.into_iter().filter(|p| *p != dest).collect();
    for old in others
        .iter()
        .take((others.len() + 1).saturating_sub(keep.max(1)))
    {
        std::fs::remove_dir_all(old).map_err(|e| io(old, e))?;
    }
    Ok(dest)
}

/// Checkpoint directories under `root`, oldest first.
pub fn list(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = match std::fs::read_dir(root) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("epoch-"))
            .map(|e| e.path())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(root, e)),
    };
    out.sort();
    Ok(out)
}

/// A checkpoint's tensor files: `(file name, bytes)`.
pub type Files = Vec<(String, Vec<u8>)>;

/// Reads and verifies a checkpoint's manifest and files (checksums).
pub fn verify(dir: &Path) -> Result<(Manifest, Files)> {
    let manifest = read_manifest(dir)?;
    let mut files = Vec::new();
    for (file, want) in &manifest.files {
        let path = dir.join(file);
        let bytes =
            graphs::input::read_capped(&path, u64::MAX).map_err(|e| bad(&path, e.to_string()))?;
        if checksum(manifest.format, &bytes) != *want {
            return Err(bad(&path, "checksum mismatch (corrupted or truncated)"));
        }
        files.push((file.clone(), bytes));
    }
    Ok((manifest, files))
}

/// [`verify`] without keeping the files: each is hashed as it is read.
pub fn verify_in_place(dir: &Path) -> Result<Manifest> {
    verify_files(dir, |_| true)
}

/// [`verify_in_place`] for the files inference reads: not the tables' Adam state.
pub fn verify_for_inference(dir: &Path) -> Result<Manifest> {
    verify_files(dir, |file| file != MOMENTS)
}

fn verify_files(dir: &Path, read: impl Fn(&str) -> bool) -> Result<Manifest> {
    let manifest = read_manifest(dir)?;
    for (file, want) in manifest.files.iter().filter(|(f, _)| read(f)) {
        let path = dir.join(file);
        if file_checksum(manifest.format, &path)? != *want {
            return Err(bad(&path, "checksum mismatch (corrupted or truncated)"));
        }
    }
    Ok(manifest)
}

/// Reads and checks a checkpoint's manifest alone (format, seal, the files
/// it names), for what it says of the model; the files' checksums are
/// verified when they are loaded ([`load`]), so they are read once.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let mpath = dir.join(MANIFEST);
    let text = graphs::input::read_text(&mpath).map_err(|e| bad(&mpath, e.to_string()))?;
    let mut manifest: Manifest = serde_json::from_str(&text)
        .map_err(|e| bad(&mpath, format!("unreadable manifest: {e}")))?;
    if !(OLDEST_FORMAT..=FORMAT).contains(&manifest.format) {
        return Err(bad(
            &mpath,
            format!(
                "format {} (this build reads {OLDEST_FORMAT} to {FORMAT})",
                manifest.format
            ),
        ));
    }
    if !manifest.seal_holds() {
        return Err(bad(&mpath, SEAL_BROKEN));
    }
    if manifest
        .files
        .keys()
        .any(|f| f != PARAMS && f != EMBEDDINGS && f != MOMENTS)
    {
        return Err(bad(
            &mpath,
            "manifest names files other than the checkpoint's own",
        ));
    }
    Ok(manifest)
}

/// The newest checkpoint under `root` that verifies, with the problems of any
/// newer ones skipped.
pub fn latest(root: &Path) -> Result<Option<(PathBuf, Vec<String>)>> {
    newest(root, verify_in_place)
}

fn newest(
    root: &Path,
    verify: fn(&Path) -> Result<Manifest>,
) -> Result<Option<(PathBuf, Vec<String>)>> {
    let mut skipped = Vec::new();
    for dir in list(root)?.into_iter().rev() {
        match verify(&dir) {
            Ok(_) => return Ok(Some((dir, skipped))),
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

/// Finds the checkpoint `path` names: a checkpoint directory itself, or a
/// root holding `epoch-*` directories (the newest whose files inference
/// reads verify: [`verify_for_inference`]; loading it whole with [`load`]
/// still checks its Adam state, and refuses it if that is corrupted).
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if path.join(MANIFEST).exists() {
        return Ok(path.to_path_buf());
    }
    match newest(path, verify_for_inference)? {
        Some((dir, _)) => Ok(dir),
        None => Err(bad(
            path,
            "no checkpoint here (neither a manifest.json nor epoch-* directories)",
        )),
    }
}

/// Refuses a checkpoint `manifest` (of `dir`) written for another model spec,
/// graph, reverse-relation setting or (when given) run than this one's.
fn check_written_for(
    dir: &Path,
    manifest: &Manifest,
    spec: &ModelSpec,
    graph: &str,
    graph_sha256: Option<&str>,
    reverse_edges: bool,
    run: Option<&str>,
) -> Result<()> {
    if manifest.spec != *spec {
        return Err(bad(
            dir,
            format!(
                "written for another model ({:?}); this run has {spec:?}",
                manifest.spec
            ),
        ));
    }
    if manifest.graph != graph {
        return Err(bad(
            dir,
            format!(
                "written for graph '{}', this run trains on '{graph}'",
                manifest.graph
            ),
        ));
    }
    if manifest.reverse_edges != reverse_edges {
        return Err(bad(
            dir,
            format!(
                "written with reverse_edges = {}, this run has {reverse_edges}",
                manifest.reverse_edges
            ),
        ));
    }
    check_graph_content(dir, manifest.graph_sha256.as_deref(), graph_sha256, "given")?;
    if run.is_some_and(|r| r != manifest.run) {
        return Err(bad(dir, "written by a run with other settings (learning rate, batch, fanouts or seed): resuming would mix two runs; resume with the settings it was written with, or start a new --checkpoint directory"));
    }
    Ok(())
}

/// Restores `model` and `adam` from the checkpoint in `dir`, which must have
/// been written for an equal model spec, the graph `graph`, the same
/// reverse-relation setting and (when given) the run fingerprint `run`.
pub fn load(
    dir: &Path,
    model: &mut Model,
    adam: &mut Adam,
    graph: &str,
    graph_sha256: Option<&str>,
    reverse_edges: bool,
    run: Option<&str>,
) -> Result<Manifest> {
    let (manifest, files) = verify(dir)?;
    check_written_for(
        dir,
        &manifest,
        model.spec(),
        graph,
        graph_sha256,
        reverse_edges,
        run,
    )?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (_, bytes) in &files {
        tensors.extend(candle_core::safetensors::load_buffer(bytes, &Device::Cpu)?);
    }
    restore_model(dir, &mut tensors, model, adam)?;
    Ok(manifest)
}

/// Restores the dense parameters of `model` (built without embedding tables)
/// from the checkpoint in `dir`, checked as [`load`] checks it, and maps its
/// learnable rows for inference: no optimizer state is copied, and a process
/// that needs some rows reads only those. `verified`: the checksums of the
/// files it reads were just checked ([`verify_for_inference`]), and are not
/// hashed again.
pub fn load_for_inference(
    dir: &Path,
    model: &mut Model,
    graph: &str,
    graph_sha256: Option<&str>,
    reverse_edges: bool,
    verified: bool,
) -> Result<(Manifest, Tables)> {
    let manifest = read_manifest(dir)?;
    check_written_for(
        dir,
        &manifest,
        model.spec(),
        graph,
        graph_sha256,
        reverse_edges,
        None,
    )?;
    let path = dir.join(PARAMS);
    let bytes =
        graphs::input::read_capped(&path, u64::MAX).map_err(|e| bad(&path, e.to_string()))?;
    if !verified && manifest.files.get(PARAMS) != Some(&checksum(manifest.format, &bytes)) {
        return Err(bad(&path, "checksum mismatch (corrupted or truncated)"));
    }
    let mut tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)?;
    // The moments restored here are dropped with this optimizer.
    let mut adam = Adam::new(crate::optim::AdamConfig::with_lr(1e-3));
    restore_dense(dir, &mut tensors, model, &mut adam)?;
    let tables = Tables::open(dir, &manifest, verified)?;
    Ok((manifest, tables))
}

/// A checkpoint's learnable rows (its tables' `.data`), read in place from
/// its memory-mapped embeddings file once the file's checksum holds.
pub struct Tables {
    map: graphs::mapped::Mapped,
    /// Per table name: the byte offset of its rows in the file, rows, width.
    at: HashMap<String, (usize, usize, usize)>,
    path: PathBuf,
}

impl Tables {
    fn open(dir: &Path, manifest: &Manifest, verified: bool) -> Result<Tables> {
        let path = dir.join(EMBEDDINGS);
        let want = manifest
            .files
            .get(EMBEDDINGS)
            .ok_or_else(|| bad(dir, format!("the manifest lists no {EMBEDDINGS}")))?;
        let file = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
        let map =
            graphs::mapped::Mapped::map(&file, &path).map_err(|e| bad(&path, e.to_string()))?;
        if !verified && checksum(manifest.format, &map) != *want {
            return Err(bad(&path, "checksum mismatch (corrupted or truncated)"));
        }
        let (header, meta) = safetensors::SafeTensors::read_metadata(&map)
            .map_err(|e| bad(&path, format!("unreadable tensors: {e}")))?;
        let start = 8 + header;
        let mut at = HashMap::new();
        for (name, info) in meta.tensors() {
            let Some(table) = name.strip_suffix(".data") else {
                continue;
            };
            let (rows, dim) = match info.shape[..] {
                [rows, dim] if info.dtype == safetensors::Dtype::F32 => (rows, dim),
                _ => {
                    return Err(bad(
                        &path,
                        format!("tensor '{name}' is not a float32 table of rows"),
                    ))
                }
            };
            at.insert(table.to_string(), (start + info.data_offsets.0, rows, dim));
        }
        Ok(Tables { map, at, path })
    }

    /// Table `name`'s `(rows, width)`, when the checkpoint has it.
    pub fn shape(&self, name: &str) -> Option<(usize, usize)> {
        self.at.get(name).map(|&(_, rows, dim)| (rows, dim))
    }

    /// Rows `ids` of table `name`, row-major.
    pub fn rows(&self, name: &str, ids: &[u32]) -> Result<Vec<f32>> {
        let &(offset, rows, dim) = self
            .at
            .get(name)
            .ok_or_else(|| bad(&self.path, format!("no embedding table '{name}'")))?;
        if let Some(&v) = ids.iter().find(|&&v| v as usize >= rows) {
            return Err(bad(
                &self.path,
                format!("row {v} of table '{name}', which has {rows}"),
            ));
        }
        let width = dim * 4;
        let row = |v: u32| &self.map[offset + v as usize * width..][..width];
        let mut out = Vec::with_capacity(ids.len() * dim);
        for (k, &v) in ids.iter().enumerate() {
            // Rows lie anywhere in the file: fetch the next ones early.
            if let Some(&a) = ids.get(k + crate::prefetch::AHEAD) {
                crate::prefetch::prefetch(row(a));
            }
            match bytemuck::try_cast_slice::<u8, f32>(row(v)) {
                // The file's floats are little-endian, as this machine's: copied as they are.
                Ok(floats) if cfg!(target_endian = "little") => out.extend_from_slice(floats),
                _ => out.extend(
                    row(v)
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                ),
            }
        }
        Ok(out)
    }

    /// Every row of table `name`, row-major, read in place from the mapped
    /// file: `None` where the table is absent or its floats cannot be read
    /// where they lie (not 4-byte aligned, or a big-endian machine).
    pub fn in_place(&self, name: &str) -> Option<&[f32]> {
        let &(offset, rows, dim) = self.at.get(name)?;
        let bytes = self.map.get(offset..offset + rows * dim * 4)?;
        match cfg!(target_endian = "little") {
            true => bytemuck::try_cast_slice(bytes).ok(),
            false => None,
        }
    }

    /// Every row of table `name`, row-major.
    pub fn all(&self, name: &str) -> Result<Vec<f32>> {
        use rayon::prelude::*;
        let &(offset, rows, dim) = self
            .at
            .get(name)
            .ok_or_else(|| bad(&self.path, format!("no embedding table '{name}'")))?;
        let bytes = &self.map[offset..offset + rows * dim * 4];
        let mut out = vec![0f32; rows * dim];
        out.par_chunks_mut(1 << 16)
            .zip(bytes.par_chunks(4 << 16))
            .for_each(|(o, b)| {
                for (x, b) in o.iter_mut().zip(b.chunks_exact(4)) {
                    *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            });
        Ok(out)
    }
}
