//! The output directory of a distributed `embed`:
//!
//! ```text
//! OUT/job.json            what is being computed (a resumed run must match it)
//! OUT/part-K/stage-S/     partition K's rows of stage S (its resume point; every
//!                         stage but the last, which its embeddings hold)
//! OUT/part-K/<type>.npy   partition K's embeddings, float32 [own nodes, width]
//!                         (a `predict` job: the target type's logits only)
//! OUT/part-K/<type>.ids.npy  their global node ids, int64, ascending
//! OUT/part-K/done.json    partition K has written its embeddings
//! OUT/manifest.json       every partition has: the types, widths and counts
//! ```

use super::messages::PartDone;
use std::path::{Path, PathBuf};

use graphs::npy::{DType as NpyType, NpyFile};
use models::inference::TypeRows;
use serde::{Deserialize, Serialize};

use super::rows::Stage;
use crate::error::{Result, TrainError};

/// `format` of [`JobRecord`] and [`Manifest`].
pub const FORMAT: &str = "hetgnn-embeddings/1";

/// What a job computes: a run resuming in the same directory must match it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// [`FORMAT`].
    pub format: String,
    /// The caller's fingerprint of the model and the partitions.
    pub job: String,
    /// Partitions.
    pub parts: u32,
    /// Stages computed after the inputs (relational layers run).
    pub layers: u32,
    /// The job computes the target nodes' logits (`predict`), not every
    /// node's embeddings (`embed`).
    #[serde(default)]
    pub logits: bool,
}

/// One node type's embeddings, in [`Manifest::types`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeEntry {
    /// The node type.
    pub name: String,
    /// Floats per node.
    pub width: usize,
    /// Nodes of the type per partition (rows of `part-K/<name>.npy`).
    pub nodes: Vec<u64>,
}

/// `OUT/manifest.json`, written once every partition has its embeddings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// The job.
    pub job: JobRecord,
    /// The types with embeddings (a type the model reads no rows of has none).
    pub types: Vec<TypeEntry>,
}

/// The output directory of one job.
pub struct Out {
    root: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(TrainError::internal)?;
    // Nodes sharing one directory each write job.json: their partials must not meet.
    let tmp = path.with_extension(format!("json.partial-{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", path.display())))
}

impl Out {
    /// Opens `root` for `job`: creates it, or resumes a run of the same job
    /// there; another job's directory is refused unless `force` (replaced).
    pub fn open(root: &Path, job: &JobRecord, force: bool) -> Result<Out> {
        let out = Out {
            root: root.to_path_buf(),
        };
        let record = root.join("job.json");
        let another = |j: JobRecord| {
            let (theirs, other) = match j.logits {
                true => ("predictions", "embed"),
                false => ("embeddings", "predict"),
            };
            TrainError::Config(format!(
                "{} holds the {theirs} of another job (another checkpoint or partitioning, or {other} where this is not); give another --out, or --force to replace it",
                root.display()
            ))
        };
        if root.exists() {
            let theirs: Option<JobRecord> = if force { None } else { read_json(&record)? };
            match theirs {
                Some(j) if &j == job => return Ok(out),
                Some(j) => return Err(another(j)),
                None if force => std::fs::remove_dir_all(root).map_err(io(root))?,
                None => {
                    // A peer's node may be creating the directory now: its
                    // record, or the file it is renamed from, is all there is.
                    let foreign = std::fs::read_dir(root)
                        .map_err(io(root))?
                        .filter_map(std::result::Result::ok)
                        .any(|e| {
                            let name = e.file_name();
                            let name = name.to_string_lossy();
                            name != "job.json" && !name.starts_with("job.json.partial-")
                        });
                    if foreign {
                        return Err(TrainError::Config(format!(
                            "{} already exists and is not an embedding job's directory (use --force to replace it)",
                            root.display()
                        )));
                    }
                    match read_json::<JobRecord>(&record)? {
                        Some(j) if &j == job => return Ok(out),
                        Some(j) => return Err(another(j)),
                        None => {}
                    }
                }
            }
        }
        std::fs::create_dir_all(root).map_err(io(root))?;
        write_json(&record, job)?;
        Ok(out)
    }

    /// The job's manifest, when every partition is done.
    pub fn manifest(&self) -> Result<Option<Manifest>> {
        read_json(&self.root.join("manifest.json"))
    }

    /// Writes the manifest: the job is complete.
    pub fn complete(&self, m: &Manifest) -> Result<()> {
        write_json(&self.root.join("manifest.json"), m)
    }

    /// Removes partition `k`'s stages (once no peer can need them).
    pub fn clean(&self, k: u32) -> Result<()> {
        let dir = self.part(k);
        for e in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let p = e.map_err(io(&dir))?.path();
            if p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("stage-"))
            {
                std::fs::remove_dir_all(&p).map_err(io(&p))?;
            }
        }
        Ok(())
    }

    /// Partition `k`'s directory.
    pub fn part(&self, k: u32) -> PathBuf {
        self.root.join(format!("part-{k}"))
    }

    fn stage(&self, k: u32, s: u32) -> PathBuf {
        self.part(k).join(format!("stage-{s}"))
    }

    /// Saves partition `k`'s stage `s` (written aside, then renamed into place).
    pub fn save_stage(&self, k: u32, s: u32, names: &[String], rows: &Stage) -> Result<()> {
        let dest = self.stage(k, s);
        let tmp = self.part(k).join(format!(".stage-{s}.partial"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        for (name, r) in names.iter().zip(rows) {
            if let Some(r) = r {
                let n = r.data.len().checked_div(r.width).unwrap_or(0) as u64;
                graphs::npy::write_f32(
                    &tmp.join(format!("{name}.npy")),
                    &[n, r.width as u64],
                    &r.data,
                )?;
            }
        }
        if dest.exists() {
            std::fs::remove_dir_all(&dest).map_err(io(&dest))?;
        }
        std::fs::rename(&tmp, &dest).map_err(io(&dest))
    }

    /// The newest stage of partition `k` saved, at most `layers`.
    pub fn latest_stage(&self, k: u32, layers: u32) -> Option<u32> {
        (1..=layers).rev().find(|&s| self.stage(k, s).is_dir())
    }

    /// Partition `k`'s saved stage `s`, checked against its `own` node counts.
    pub fn load_stage(&self, k: u32, s: u32, names: &[String], own: &[Vec<u32>]) -> Result<Stage> {
        let dir = self.stage(k, s);
        names
            .iter()
            .zip(own)
            .map(|(name, own)| {
                let path = dir.join(format!("{name}.npy"));
                if !path.exists() {
                    return Ok(None);
                }
                let f = NpyFile::open(&path, NpyType::F32)?;
                let shape = f.shape().to_vec();
                if shape.len() != 2 || shape[0] != own.len() as u64 {
                    return Err(TrainError::Checkpoint(format!(
                        "{}: shape {shape:?}, the partition owns {} nodes of the type",
                        path.display(),
                        own.len()
                    )));
                }
                Ok(Some(TypeRows {
                    width: shape[1] as usize,
                    data: f.to_f32_vec(),
                }))
            })
            .collect()
    }

    /// Writes partition `k`'s embeddings (`rows` of its `own` nodes) and marks it done.
    pub fn write_part(
        &self,
        k: u32,
        names: &[String],
        own: &[Vec<u32>],
        rows: &Stage,
    ) -> Result<PartDone> {
        let dir = self.part(k);
        let mut done = PartDone { types: Vec::new() };
        for ((name, own), r) in names.iter().zip(own).zip(rows) {
            let Some(r) = r else {
                done.types.push(None);
                continue;
            };
            let n = own.len() as u64;
            graphs::npy::write_f32(
                &dir.join(format!("{name}.npy")),
                &[n, r.width as u64],
                &r.data,
            )?;
            let ids: Vec<i64> = own.iter().map(|&v| i64::from(v)).collect();
            graphs::npy::write_i64(&dir.join(format!("{name}.ids.npy")), &[n], &ids)?;
            done.types.push(Some((r.width, n)));
        }
        write_json(&dir.join("done.json"), &done)?;
        Ok(done)
    }

    /// Partition `k`'s `done.json`, once it has written its embeddings.
    pub fn part_done(&self, k: u32) -> Result<Option<PartDone>> {
        read_json(&self.part(k).join("done.json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str) -> JobRecord {
        JobRecord {
            format: FORMAT.into(),
            job: name.into(),
            parts: 2,
            layers: 2,
            logits: false,
        }
    }

    #[test]
    fn a_directory_a_peer_is_creating_is_opened_and_others_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        std::fs::create_dir(&root).unwrap();
        // A peer's node is writing the record: only its temporary file is there.
        std::fs::write(root.join("job.json.partial-4242"), b"{").unwrap();
        Out::open(&root, &job("a"), false).unwrap();
        assert_eq!(
            read_json::<JobRecord>(&root.join("job.json")).unwrap(),
            Some(job("a"))
        );
        // The peer's rename lands: the same job opens, another is refused.
        Out::open(&root, &job("a"), false).unwrap();
        assert!(Out::open(&root, &job("b"), false).is_err());
        // Anything else in the directory is not this job's.
        let other = tmp.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("notes.txt"), b"mine").unwrap();
        let e = match Out::open(&other, &job("a"), false) {
            Ok(_) => panic!("a foreign directory was opened"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("not an embedding job's directory"), "{e}");
    }
}
