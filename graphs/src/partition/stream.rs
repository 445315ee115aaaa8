//! The edges of a graph directory as a stream, for partitioners that must not
//! hold the graph: each `[2, E]` edge file is read in chunks through two
//! cursors (one on the source row, one on the destination row), never loaded
//! or memory-mapped whole, and every id is checked against its type's count.
//!
//! Order: the relations in `schema.json`'s order, each file's edges in file
//! order. Nodes get global ids: the types in schema order, each type's ids
//! after the previous types' (`base[t] + id`).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{GraphError, Result};
use crate::format::paths;
use crate::npy::{parse_header, DType, NpyFile};
use crate::schema::Schema;

/// Edges per chunk read from each row of a file.
pub const CHUNK: usize = 1 << 16;

/// A graph directory's edges, streamed.
pub struct EdgeStream {
    dir: PathBuf,
    /// The directory's schema.
    pub schema: Schema,
    /// Global id of each type's node 0; the last entry is the node total.
    pub base: Vec<u64>,
    chunk: usize,
}

/// One relation's edges in global ids, a chunk at a time.
pub struct Chunk<'a> {
    /// The relation's index in the schema.
    pub relation: usize,
    /// Global source ids.
    pub src: &'a [u32],
    /// Global destination ids.
    pub dst: &'a [u32],
}

impl EdgeStream {
    /// Opens the stream of `dir`'s edges (its schema only is read now).
    pub fn open(dir: &Path) -> Result<EdgeStream> {
        let schema = Schema::read(&paths::schema(dir))?;
        let mut base = vec![0u64];
        for (_, nt) in &schema.node_types {
            base.push(base[base.len() - 1] + nt.count);
        }
        if base[base.len() - 1] >= u64::from(u32::MAX) {
            return Err(GraphError::schema(
                &paths::schema(dir),
                format!(
                    "{} nodes in all: streaming partitioners number nodes with 32 bits",
                    base[base.len() - 1]
                ),
            ));
        }
        Ok(EdgeStream {
            dir: dir.to_path_buf(),
            schema,
            base,
            chunk: CHUNK,
        })
    }

    /// Reads `n` edges per chunk instead of [`CHUNK`] (tests cross chunk boundaries with it).
    pub fn with_chunk(mut self, n: usize) -> EdgeStream {
        self.chunk = n.max(1);
        self
    }

    /// Nodes in all types.
    pub fn nodes(&self) -> u64 {
        self.base[self.base.len() - 1]
    }

    /// Edges in all relations (as the schema says; each file is checked against it).
    pub fn edges(&self) -> u64 {
        self.schema.relations.iter().map(|r| r.count).sum()
    }

    /// Calls `f` on every chunk of every relation, in stream order.
    pub fn for_each(&self, mut f: impl FnMut(Chunk<'_>) -> Result<()>) -> Result<()> {
        for r in 0..self.schema.relations.len() {
            self.for_each_of(r, &mut f)?;
        }
        Ok(())
    }

    /// Calls `f` on every chunk of relation `r` (its index in the schema), in file order.
    pub fn for_each_of(&self, r: usize, mut f: impl FnMut(Chunk<'_>) -> Result<()>) -> Result<()> {
        let rel =
            self.schema.relations.get(r).ok_or_else(|| {
                GraphError::InvalidArgument(format!("relation {r} does not exist"))
            })?;
        let mut src = Vec::with_capacity(self.chunk);
        let mut dst = Vec::with_capacity(self.chunk);
        let mut raw = vec![0u8; self.chunk * 8];
        let path = paths::edges(&self.dir, &rel.canonical());
        let (ts, td) = (
            self.type_of(&rel.src, &path)?,
            self.type_of(&rel.dst, &path)?,
        );
        let (n_src, n_dst) = (
            self.base[ts + 1] - self.base[ts],
            self.base[td + 1] - self.base[td],
        );
        let e = rel.count;
        let offset = data_offset(&path, e)?;
        let mut rows = [open_at(&path, offset)?, open_at(&path, offset + e * 8)?];
        let mut done = 0u64;
        while done < e {
            let n = (e - done).min(self.chunk as u64) as usize;
            for (row, (out, (count, base))) in [
                (&mut src, (n_src, self.base[ts])),
                (&mut dst, (n_dst, self.base[td])),
            ]
            .into_iter()
            .enumerate()
            {
                let bytes = &mut raw[..n * 8];
                rows[row]
                    .read_exact(bytes)
                    .map_err(|e| GraphError::io(&path, e))?;
                out.clear();
                for (k, b) in bytes.chunks_exact(8).enumerate() {
                    let id = i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                    if id < 0 || id as u64 >= count {
                        let which = if row == 0 { "source" } else { "destination" };
                        return Err(GraphError::data(
                            &path,
                            format!(
                                "edge {}: {which} id {id} out of range 0..{count}",
                                done + k as u64
                            ),
                        ));
                    }
                    out.push((base + id as u64) as u32);
                }
            }
            f(Chunk {
                relation: r,
                src: &src,
                dst: &dst,
            })?;
            done += n as u64;
        }
        Ok(())
    }

    /// The graph directory streamed.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Type index of relation `r`'s source and destination.
    pub fn relation_types(&self, r: usize) -> Result<(usize, usize)> {
        let rel = &self.schema.relations[r];
        let path = paths::edges(&self.dir, &rel.canonical());
        Ok((
            self.type_of(&rel.src, &path)?,
            self.type_of(&rel.dst, &path)?,
        ))
    }

    /// The degree of every node (both directions; a self-loop counts twice).
    pub fn degrees(&self) -> Result<Vec<u32>> {
        let mut deg = vec![0u32; self.nodes() as usize];
        self.for_each(|c| {
            for (&u, &v) in c.src.iter().zip(c.dst) {
                deg[u as usize] = deg[u as usize].saturating_add(1);
                deg[v as usize] = deg[v as usize].saturating_add(1);
            }
            Ok(())
        })?;
        Ok(deg)
    }

    /// The target type's index.
    pub fn target(&self) -> Result<usize> {
        self.schema.type_index(&self.schema.target).ok_or_else(|| {
            GraphError::schema(
                &paths::schema(&self.dir),
                "the target type is not a node type",
            )
        })
    }

    /// The target type's nodes (its own ids) in split `name` (absent: none), checked in range.
    pub fn split(&self, name: &str) -> Result<Vec<u32>> {
        let t = self.target()?;
        let path = paths::split(&self.dir, &self.schema.target, name);
        if !path.exists() {
            return Ok(Vec::new());
        }
        let f = NpyFile::open(&path, DType::I64)?;
        let count = self.base[t + 1] - self.base[t];
        (0..f.len())
            .map(|i| {
                let v = f.i64_at(i);
                if v < 0 || v as u64 >= count {
                    return Err(GraphError::data(
                        &path,
                        format!("node {v} out of range 0..{count}"),
                    ));
                }
                Ok(v as u32)
            })
            .collect()
    }

    /// The global ids of the target type's training nodes.
    pub fn train_nodes(&self) -> Result<Vec<u32>> {
        let base = self.base[self.target()?];
        Ok(self
            .split("train")?
            .into_iter()
            .map(|v| (base + u64::from(v)) as u32)
            .collect())
    }

    /// The type of global node `v`.
    pub fn type_of_node(&self, v: u32) -> usize {
        self.base.partition_point(|&b| b <= u64::from(v)) - 1
    }

    fn type_of(&self, name: &str, path: &Path) -> Result<usize> {
        self.schema
            .type_index(name)
            .ok_or_else(|| GraphError::data(path, format!("unknown node type {name:?}")))
    }
}

/// Checks the header of edge file `path` (int64, `[2, e]`) and returns where its data starts.
fn data_offset(path: &Path, e: u64) -> Result<u64> {
    checked_offset(path, DType::I64, &[2, e])
}

/// Checks that `.npy` file `path` holds `dtype` in C order with exactly
/// `shape` (its length included), reading only its header, and returns where
/// its data starts.
pub(super) fn checked_offset(path: &Path, dtype: DType, shape: &[u64]) -> Result<u64> {
    let mut f = crate::input::open(path)?;
    let len = f.metadata().map_err(|err| GraphError::io(path, err))?.len();
    // A header is at most a few hundred bytes; 64 KiB bounds a hostile one.
    let mut head = vec![0u8; len.min(64 << 10) as usize];
    f.read_exact(&mut head)
        .map_err(|err| GraphError::io(path, err))?;
    let h = parse_header(&head, path)?;
    if h.fortran_order || h.descr != dtype.descr() {
        return Err(GraphError::npy(
            path,
            format!("{} in C order is required", dtype.descr()),
        ));
    }
    if h.shape != shape {
        return Err(GraphError::npy(
            path,
            format!(
                "shape {:?} where {shape:?} (schema.json's) is required",
                h.shape
            ),
        ));
    }
    let want = shape
        .iter()
        .try_fold(dtype.size() as u64, |n, &d| n.checked_mul(d))
        .and_then(|n| n.checked_add(h.data_offset as u64));
    let Some(want) = want else {
        return Err(GraphError::npy(
            path,
            format!("shape {shape:?} is too large to address"),
        ));
    };
    if len != want {
        return Err(GraphError::npy(
            path,
            format!("{len} bytes where shape {shape:?} needs {want}"),
        ));
    }
    Ok(h.data_offset as u64)
}

/// A buffered reader of `path` from byte `at`.
fn open_at(path: &Path, at: u64) -> Result<std::io::BufReader<File>> {
    use std::io::Seek;
    let mut f = crate::input::open(path)?;
    f.seek(std::io::SeekFrom::Start(at))
        .map_err(|e| GraphError::io(path, e))?;
    Ok(std::io::BufReader::with_capacity(1 << 20, f))
}
