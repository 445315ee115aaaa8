//! A node-partition directory on disk (see the module above for its layout):
//! its manifest with each partition's figures, and the owner of every node.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Method, MAX_PARTS};
use crate::error::{GraphError, Result};
use crate::graph::HetGraph;
use crate::npy::{DType, NpyFile};
use crate::seal::Sealed;

/// What one partition holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PartInfo {
    /// Core (owned) nodes per type, in type order.
    pub core: Vec<u64>,
    /// Halo nodes per type: not owned, but an end of a stored edge.
    pub halo: Vec<u64>,
    /// Edges stored (original relations).
    pub edges: u64,
    /// Owned train, valid and test nodes.
    pub splits: [u64; 3],
    /// Per trainer of the partition, its train, valid and test nodes.
    #[serde(default)]
    pub trainer_splits: Vec<[u64; 3]>,
}

/// A relation's training edges with a target, in the whole graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainEdges {
    /// With a label (edge classification trains on them).
    pub labelled: u64,
    /// With a value (edge regression trains on them).
    pub valued: u64,
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Layout version.
    pub format: u32,
    /// Name of the partitioned graph.
    pub graph: String,
    /// How owners were chosen.
    pub method: Method,
    /// Seed of the partitioner.
    pub seed: u64,
    /// Number of partitions.
    pub parts: usize,
    /// Trainers per partition (second level; 1 without it).
    #[serde(default = "one")]
    pub trainers: usize,
    /// Node type names, in type order.
    pub node_types: Vec<String>,
    /// Edges (original relations) whose ends have different owners.
    pub edge_cut: u64,
    /// All edges (original relations).
    pub total_edges: u64,
    /// Edges per original relation (canonical name), in the whole graph
    /// (empty in directories written before it was recorded).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub relation_edges: std::collections::BTreeMap<String, u64>,
    /// Per original relation with edge targets (canonical name), its
    /// training edges with a label and with a value in the whole graph (an
    /// edge task's steps are sized by them; empty where no relation has
    /// targets, in streamed partitions and in directories written before).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub edge_train: std::collections::BTreeMap<String, TrainEdges>,
    /// Whether partitions hold their halo nodes' feature rows too.
    #[serde(default)]
    pub halo_features: bool,
    /// The content of the graph partitioned ([`crate::fingerprint::content`];
    /// absent in directories written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_sha256: Option<String>,
    /// Checksum of every file of the directory the manifest covers (relative
    /// path; [`crate::fingerprint::checksum`], SHA-256 in directories written
    /// before 2026-12-06; empty in older ones).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub files: std::collections::BTreeMap<String, String>,
    /// SHA-256 of the manifest's JSON with this field empty: an edited
    /// manifest is refused (a check against edits, not a signature).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub seal: String,
    /// Per partition.
    pub info: Vec<PartInfo>,
}

impl Sealed for Manifest {
    fn seal_field(&mut self) -> &mut String {
        &mut self.seal
    }
}

impl Manifest {
    /// Writes `manifest.json` into partition directory `dir`, covering (by
    /// checksum) every file already there, and sealed.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let mut sealed = self.clone();
        sealed.files = cover(dir)?;
        write_sealed(dir, sealed)
    }

    /// Refuses an edited manifest and shared files (owners, trainers) that
    /// are not the ones it was written with (directories written before
    /// seals are taken as they are). A partition's own files are checked when
    /// it is loaded ([`PartitionSet::load_part`]): a node hashes only its own.
    fn verify(&self, dir: &Path) -> Result<()> {
        let shared = self
            .files
            .iter()
            .filter(|(rel, _)| part_of(rel).is_none())
            .map(|(r, h)| (r.clone(), h.clone()))
            .collect();
        verify_sealed(dir, self.clone(), &shared)
    }

    /// Refuses files of partition `k` that are not the ones it was written with.
    fn verify_part(&self, dir: &Path, k: usize) -> Result<()> {
        if self.seal.is_empty() {
            return Ok(());
        }
        let own = self
            .files
            .iter()
            .filter(|(rel, _)| part_of(rel) == Some(k))
            .map(|(r, h)| (r.clone(), h.clone()))
            .collect();
        verify_files(dir, &own)
    }

    /// Largest over mean of `f` across partitions (1.0 = perfectly balanced).
    pub fn balance(&self, f: impl Fn(&PartInfo) -> u64) -> f64 {
        let v: Vec<u64> = self.info.iter().map(f).collect();
        let total: u64 = v.iter().sum();
        if total == 0 {
            return 1.0;
        }
        *v.iter().max().unwrap_or(&0) as f64 * v.len() as f64 / total as f64
    }
}

/// The manifest's file name in a partition directory.
const MANIFEST_FILE: &str = "manifest.json";

/// The checksum of every file of partition directory `dir` but its manifest.
pub(crate) fn cover(dir: &Path) -> Result<std::collections::BTreeMap<String, String>> {
    Ok(crate::fingerprint::checksums(dir)?
        .into_iter()
        .filter(|(rel, _)| rel != MANIFEST_FILE)
        .collect())
}

/// Seals `manifest` and writes it as `dir/manifest.json`.
pub(crate) fn write_sealed<M: Sealed + serde::Serialize>(
    dir: &Path,
    mut manifest: M,
) -> Result<()> {
    manifest.seal();
    let text = serde_json::to_string_pretty(&manifest)
        .map_err(|e| GraphError::InvalidArgument(e.to_string()))?;
    crate::atomic::write(&dir.join(MANIFEST_FILE), text)
}

/// Refuses a `manifest` of `dir` edited after it was sealed, and files that
/// are not the ones it covers (`files`); an unsealed manifest (written
/// before seals) is taken as it is.
pub(crate) fn verify_sealed<M: Sealed>(
    dir: &Path,
    mut manifest: M,
    files: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    if manifest.seal_field().is_empty() {
        return Ok(());
    }
    let mpath = dir.join(MANIFEST_FILE);
    if !manifest.seal_holds() {
        return Err(GraphError::data(&mpath, "was edited after `hetgnn partition` wrote it (its seal does not match its content): partition the graph again"));
    }
    verify_files(dir, files)
}

/// The partition a covered file belongs to (`part<k>/...`), if any.
fn part_of(rel: &str) -> Option<usize> {
    let (first, _) = rel.split_once('/')?;
    first.strip_prefix("part")?.parse().ok()
}

/// Refuses any of `files` (relative path, checksum) of `dir` whose content differs.
fn verify_files(dir: &Path, files: &std::collections::BTreeMap<String, String>) -> Result<()> {
    use rayon::prelude::*;
    files.par_iter().try_for_each(|(rel, want)| {
        let path = dir.join(rel);
        if !crate::fingerprint::matches(&path, want)? {
            return Err(GraphError::data(&path, "differs from the file this partitioning wrote (copied from another partitioning?): partition the graph again"));
        }
        Ok(())
    })
}

/// Refuses partitions in `dir` cut from a graph of content `want` when
/// the graph directory `data` has other content.
pub(crate) fn check_source(dir: &Path, want: Option<&str>, data: Option<&Path>) -> Result<()> {
    let (Some(data), Some(want)) = (data, want) else {
        return Ok(());
    };
    let got = crate::fingerprint::content(data)?;
    if got == want {
        return Ok(());
    }
    use crate::fingerprint::short;
    Err(GraphError::data(
        dir,
        format!(
            "was cut from a graph whose content is sha256 {}…, but the graph given ({}) has content {}…: partition that graph, or leave out training.data",
            short(want),
            data.display(),
            short(&got)
        ),
    ))
}

/// Layout version of `manifest.json`.
pub(crate) const FORMAT: u32 = 1;

fn one() -> usize {
    1
}

/// An opened partition directory: the manifest and every node's owner.
pub struct PartitionSet {
    dir: PathBuf,
    /// The manifest.
    pub manifest: Manifest,
    /// Owner partition per type, per node.
    pub owners: Vec<Vec<u16>>,
    /// Per target node, its trainer within its partition (empty: all 0).
    pub trainer_of: Vec<u16>,
}

impl PartitionSet {
    /// [`PartitionSet::open`], and when a graph directory `data` is named too,
    /// refuses partitions cut from a graph of other content (a run would
    /// train on the partitions' graph while naming `data`).
    pub fn open_for(dir: &Path, data: Option<&Path>) -> Result<PartitionSet> {
        let set = PartitionSet::open(dir)?;
        check_source(dir, set.manifest.graph_sha256.as_deref(), data)?;
        Ok(set)
    }

    /// Opens and validates `dir` (manifest and owner files).
    pub fn open(dir: &Path) -> Result<PartitionSet> {
        crate::input::dir(dir, "a partition directory")?;
        let mpath = dir.join("manifest.json");
        let text = crate::input::read_text(&mpath)?;
        if serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| v["method"] == "meta") {
            return Err(GraphError::data(&mpath, "meta-partitions (by relation) are for mode = \"raf\"; data-parallel training needs --method metis or random"));
        }
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| GraphError::data(&mpath, e.to_string()))?;
        manifest.verify(dir)?;
        if manifest.format != FORMAT {
            return Err(GraphError::data(
                &mpath,
                format!("format {} is not the supported {FORMAT}", manifest.format),
            ));
        }
        if manifest.parts == 0
            || manifest.parts > MAX_PARTS
            || manifest.info.len() != manifest.parts
        {
            return Err(GraphError::data(
                &mpath,
                format!(
                    "parts = {} but {} partition entries",
                    manifest.parts,
                    manifest.info.len()
                ),
            ));
        }
        let mut owners = Vec::with_capacity(manifest.node_types.len());
        for name in &manifest.node_types {
            let p = owners_path(dir, name);
            let f = NpyFile::open(&p, DType::I64)?;
            if f.shape().len() != 1 {
                return Err(GraphError::data(&p, "owners must be 1-dimensional"));
            }
            let mut o = Vec::with_capacity(f.len());
            for i in 0..f.len() {
                let v = f.i64_at(i);
                if v < 0 || v as usize >= manifest.parts {
                    return Err(GraphError::data(
                        &p,
                        format!("node {i}: owner {v} out of range 0..{}", manifest.parts),
                    ));
                }
                o.push(v as u16);
            }
            owners.push(o);
        }
        let trainers = manifest.trainers;
        if trainers == 0
            || trainers
                .checked_mul(manifest.parts)
                .is_none_or(|n| n > MAX_PARTS)
        {
            return Err(GraphError::data(
                &mpath,
                format!("trainers = {trainers} out of range"),
            ));
        }
        let tpath = dir.join("trainers.npy");
        let mut trainer_of = Vec::new();
        // Directories written before the second level existed have no trainers.npy: one trainer each.
        if trainers > 1 || tpath.exists() {
            let f = NpyFile::open(&tpath, DType::I64)?;
            trainer_of.reserve(f.len());
            for i in 0..f.len() {
                let v = f.i64_at(i);
                if v < 0 || v as usize >= trainers {
                    return Err(GraphError::data(
                        &tpath,
                        format!("node {i}: trainer {v} out of range 0..{trainers}"),
                    ));
                }
                trainer_of.push(v as u16);
            }
        }
        Ok(PartitionSet {
            dir: dir.to_path_buf(),
            manifest,
            owners,
            trainer_of,
        })
    }

    /// Directory of partition `k` (a graph directory).
    pub fn part_dir(&self, k: usize) -> PathBuf {
        part_dir(&self.dir, k)
    }

    /// Loads partition `k`, checking it matches the owners.
    pub fn load_part(&self, k: usize, opts: &crate::LoadOptions) -> Result<HetGraph> {
        if k >= self.manifest.parts {
            return Err(GraphError::InvalidArgument(format!(
                "partition {k} does not exist (0..{})",
                self.manifest.parts
            )));
        }
        self.manifest.verify_part(&self.dir, k)?;
        let dir = self.part_dir(k);
        let mut g = crate::load(&dir, opts)?;
        let counts: Vec<usize> = g.node_types().iter().map(|t| t.count as usize).collect();
        let names: Vec<&str> = g.node_types().iter().map(|t| t.name.as_str()).collect();
        if names
            != self
                .manifest
                .node_types
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
            || counts != self.owners.iter().map(Vec::len).collect::<Vec<_>>()
            || (!self.trainer_of.is_empty() && self.trainer_of.len() != counts[g.target().index()])
        {
            return Err(GraphError::data(
                &dir,
                "node types or counts differ from the manifest's owner files",
            ));
        }
        if !self.manifest.halo_features {
            // The file holds every row at its global place, the others' as
            // zeros; a partition's own rows are spread over nearly every page,
            // so the mapping would stay resident whole. Copy out its own.
            let own = u16::try_from(k).unwrap_or(u16::MAX);
            for (t, owners) in self.owners.iter().enumerate() {
                g.keep_rows(t, |v| owners[v] == own);
            }
        }
        Ok(g)
    }
}

pub(crate) fn owners_path(dir: &Path, ntype: &str) -> PathBuf {
    dir.join("owners").join(format!("{ntype}.npy"))
}

pub(crate) fn part_dir(dir: &Path, k: usize) -> PathBuf {
    dir.join(format!("part{k}"))
}
