//! Reading and writing the graph directory format (FORMAT.md).
//!
//! Reading validates everything before returning: a directory that breaks a
//! rule gives an error naming the file and the problem, and no graph.
//! Writing goes to a temporary sibling directory that is renamed into place
//! only once complete, so a crash never leaves a directory that looks valid.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::csr::Csr;
use crate::edge_targets::{
    check_edge_labels, check_edge_split, check_edge_values, EdgeSet, EdgeTargets,
};
use crate::error::{GraphError, Result};
use crate::features::Features;
use crate::graph::{check_labels, check_split, check_values, HetGraph, Known, NodeType, Splits};
use crate::label_sets::LabelSets;
use crate::npy::{self, DType, NpyFile, NpyWriter};
use crate::schema::{RelationSchema, Schema};

/// How to load a graph directory.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Map feature files instead of reading them into memory (default: true).
    pub mmap_features: bool,
    /// Add `rev_<name>` relations (default: false).
    pub reverse_edges: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            mmap_features: true,
            reverse_edges: false,
        }
    }
}

/// Paths inside a graph directory.
pub mod paths {
    use std::path::{Path, PathBuf};

    /// `schema.json`
    pub fn schema(dir: &Path) -> PathBuf {
        dir.join("schema.json")
    }
    /// `nodes/<ntype>/`
    pub fn node_dir(dir: &Path, ntype: &str) -> PathBuf {
        dir.join("nodes").join(ntype)
    }
    /// `nodes/<ntype>/features.npy`
    pub fn features(dir: &Path, ntype: &str) -> PathBuf {
        node_dir(dir, ntype).join("features.npy")
    }
    /// `nodes/<ntype>/labels.npy`
    pub fn labels(dir: &Path, ntype: &str) -> PathBuf {
        node_dir(dir, ntype).join("labels.npy")
    }
    /// `nodes/<ntype>/values.npy` (regression targets)
    pub fn values(dir: &Path, ntype: &str) -> PathBuf {
        node_dir(dir, ntype).join("values.npy")
    }
    /// `nodes/<ntype>/label_sets.npy` (multi-label targets)
    pub fn label_sets(dir: &Path, ntype: &str) -> PathBuf {
        node_dir(dir, ntype).join("label_sets.npy")
    }
    /// `nodes/<ntype>/<split>.npy`
    pub fn split(dir: &Path, ntype: &str, split: &str) -> PathBuf {
        node_dir(dir, ntype).join(format!("{split}.npy"))
    }
    /// `edges/<src>__<rel>__<dst>.npy`
    pub fn edges(dir: &Path, canonical: &str) -> PathBuf {
        dir.join("edges").join(format!("{canonical}.npy"))
    }
    /// `edges/<src>__<rel>__<dst>/`: the relation's edge targets
    pub fn edge_dir(dir: &Path, canonical: &str) -> PathBuf {
        dir.join("edges").join(canonical)
    }
    /// `edges/<canonical>/labels.npy` (edge classes, aligned with the edge file)
    pub fn edge_labels(dir: &Path, canonical: &str) -> PathBuf {
        edge_dir(dir, canonical).join("labels.npy")
    }
    /// `edges/<canonical>/values.npy` (edge regression targets)
    pub fn edge_values(dir: &Path, canonical: &str) -> PathBuf {
        edge_dir(dir, canonical).join("values.npy")
    }
    /// `edges/<canonical>/weights.npy` (edge weights, aligned with the edge file)
    pub fn edge_weights(dir: &Path, canonical: &str) -> PathBuf {
        edge_dir(dir, canonical).join("weights.npy")
    }
    /// `edges/<canonical>/times.npy` (edge times, aligned with the edge file)
    pub fn edge_times(dir: &Path, canonical: &str) -> PathBuf {
        edge_dir(dir, canonical).join("times.npy")
    }
    /// `edges/<canonical>/<split>.npy` (positions in the edge file)
    pub fn edge_split(dir: &Path, canonical: &str, split: &str) -> PathBuf {
        edge_dir(dir, canonical).join(format!("{split}.npy"))
    }
}

/// Loads and validates the graph directory `dir`.
pub fn load(dir: &Path, opts: &LoadOptions) -> Result<HetGraph> {
    crate::input::dir(dir, "a graph directory")?;
    let schema = Schema::read(&paths::schema(dir))?;
    let need = schema.load_bytes(opts.reverse_edges, opts.mmap_features);
    crate::memory::check_fits(
        &format!("loading this graph ({})", schema.largest_type()),
        need,
    )
    .map_err(|e| GraphError::schema(&paths::schema(dir), e.0))?;
    let target = schema.type_index(&schema.target).expect("validated schema");
    let mut node_types = Vec::with_capacity(schema.node_types.len());
    for (i, (name, ts)) in schema.node_types.iter().enumerate() {
        let count = ts.count;
        let fpath = paths::features(dir, name);
        let features = match ts.feature_dim {
            Some(dim) => {
                let f = NpyFile::open(&fpath, DType::F32)?;
                f.expect_shape(&[count, dim], "features")?;
                let (rows, dim) = (count as usize, dim as usize);
                let features = if opts.mmap_features {
                    let off = f.data_offset();
                    Features::from_map(rows, dim, f.into_map(), off)
                } else {
                    Features::from_vec(rows, dim, f.to_f32_vec())
                };
                // A NaN or infinity reaches every embedding it touches: training
                // would diverge or learn nothing, and exit 0. Refused here, once.
                if let Some((row, col, v)) = features.first_non_finite() {
                    return Err(GraphError::data(&fpath, format!("row {row} (node {row} of '{name}'), column {col} is {v}: features must be finite numbers")));
                }
                Some(features)
            }
            None if fpath.exists() => {
                return Err(GraphError::data(&fpath, format!("schema says node type '{name}' is featureless (feature_dim null) but this file exists")));
            }
            None => None,
        };
        let vpath = paths::values(dir, name);
        let values = match i == target && schema.values {
            true => Some(read_values(&vpath, count)?),
            false if vpath.exists() => {
                return Err(GraphError::data(&vpath, "schema.json does not list values (\"values\": true) for the target type, or this is not the target type, but this file exists"));
            }
            false => None,
        };
        let spath = paths::label_sets(dir, name);
        let label_sets = match (i == target, schema.label_sets) {
            (true, Some(w)) => Some(read_label_sets(&spath, count, w)?),
            _ if spath.exists() => {
                return Err(GraphError::data(&spath, "schema.json does not give the target type label_sets (labels per node), or this is not the target type, but this file exists"));
            }
            _ => None,
        };
        let (labels, splits) = if i == target {
            read_labels(
                dir,
                name,
                count,
                schema.num_classes,
                values.as_deref(),
                label_sets.as_ref(),
            )
            .map(|(l, s)| (Some(l), Some(s)))?
        } else {
            (None, None)
        };
        node_types.push(NodeType {
            name: name.clone(),
            count: count as u32,
            features,
            labels,
            values,
            label_sets,
            splits,
        });
    }
    let counts: Vec<u64> = schema.node_types.iter().map(|(_, t)| t.count).collect();
    let edges = schema
        .relations
        .par_iter()
        .map(|r| read_edges(dir, &schema, r, &counts))
        .collect::<Result<Vec<_>>>()?;
    let (edges, targets): (Vec<_>, Vec<_>) = edges.into_iter().map(|(a, b, t)| ((a, b), t)).unzip();
    let mut g = HetGraph::from_parts(&schema, node_types, edges);
    for (r, t) in targets.into_iter().enumerate() {
        if let Some(t) = t {
            g.set_edge_targets(crate::ids::RelationId(r as u32), t);
        }
    }
    if opts.reverse_edges {
        g.add_reverse_relations()?;
    }
    Ok(g)
}

/// Reads and checks the regression targets at `path`.
fn read_values(path: &Path, count: u64) -> Result<Vec<f32>> {
    let f = NpyFile::open(path, DType::F32)?;
    f.expect_shape(&[count], "values")?;
    let values = f.to_f32_vec();
    check_values(&values, count as u32).map_err(|p| GraphError::data(path, p))?;
    Ok(values)
}

/// Reads and checks the multi-label targets at `path` (`width` labels per node).
fn read_label_sets(path: &Path, count: u64, width: u32) -> Result<LabelSets> {
    let f = NpyFile::open(path, DType::I8)?;
    f.expect_shape(&[count, u64::from(width)], "label sets")?;
    LabelSets::new(width as usize, count as usize, f.to_i8_vec())
        .map_err(|p| GraphError::data(path, p))
}

fn read_labels(
    dir: &Path,
    ntype: &str,
    count: u64,
    num_classes: u32,
    values: Option<&[f32]>,
    sets: Option<&LabelSets>,
) -> Result<(Vec<i64>, Splits)> {
    let lpath = paths::labels(dir, ntype);
    let f = NpyFile::open(&lpath, DType::I64)?;
    f.expect_shape(&[count], "labels")?;
    let labels: Vec<i64> = (0..f.len()).map(|i| f.i64_at(i)).collect();
    check_labels(&labels, num_classes).map_err(|p| GraphError::data(&lpath, p))?;
    let mut seen = vec![0u8; count as usize];
    let mut splits = Splits::default();
    for (tag, (name, slot)) in [
        ("train", &mut splits.train),
        ("valid", &mut splits.valid),
        ("test", &mut splits.test),
    ]
    .into_iter()
    .enumerate()
    {
        let spath = paths::split(dir, ntype, name);
        let f = NpyFile::open(&spath, DType::I64)?;
        if f.shape().len() != 1 {
            return Err(GraphError::data(
                &spath,
                format!("split must be 1-dimensional, shape is {:?}", f.shape()),
            ));
        }
        let mut ids = Vec::with_capacity(f.len());
        for i in 0..f.len() {
            let v = f.i64_at(i);
            if v < 0 || v as u64 >= count {
                return Err(GraphError::data(
                    &spath,
                    format!("node id {v} out of range 0..{count}"),
                ));
            }
            ids.push(v as u32);
        }
        let known = Known {
            labels: &labels,
            values,
            sets,
        };
        check_split(&ids, &mut seen, tag as u8 + 1, &known)
            .map_err(|p| GraphError::data(&spath, p))?;
        *slot = ids;
    }
    Ok((labels, splits))
}

fn read_edges(
    dir: &Path,
    schema: &Schema,
    r: &RelationSchema,
    counts: &[u64],
) -> Result<(Csr, Csr, Option<EdgeTargets>)> {
    let path = paths::edges(dir, &r.canonical());
    let f = NpyFile::open(&path, DType::I64)?;
    f.expect_shape(&[2, r.count], "edges (schema count)")?;
    let ns = counts[schema.type_index(&r.src).expect("validated")];
    let nd = counts[schema.type_index(&r.dst).expect("validated")];
    let e = r.count as usize;
    let convert = |row: usize, bound: u64, end: &str| -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(e);
        for i in 0..e {
            let v = f.i64_at(row * e + i);
            if v < 0 || v as u64 >= bound {
                return Err(GraphError::data(
                    &path,
                    format!("edge {i}: {end} id {v} out of range 0..{bound}"),
                ));
            }
            out.push(v as u32);
        }
        Ok(out)
    };
    let src = convert(0, ns, "source")?;
    let dst = convert(1, nd, "destination")?;
    let targets = read_edge_targets(dir, r, &src, &dst)?;
    // No task reads weights or times yet: they are checked, not kept (times
    // need only their shape, so they are not read).
    read_edge_weights(dir, r)?;
    let times = paths::edge_times(dir, &r.canonical());
    edge_column(&times, r.times, "times", DType::I64, r.count)?;
    Ok((
        Csr::from_edges(nd as usize, &dst, &src),
        Csr::from_edges(ns as usize, &src, &dst),
        targets,
    ))
}

/// A relation's edge targets as stored: columns aligned with its edge file
/// (empty when absent) and each split's positions in it, in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EdgeColumns {
    /// Class per edge, -1 = none.
    pub labels: Vec<i64>,
    /// Value per edge, NaN = none.
    pub values: Vec<f32>,
    /// Positions of the train, valid and test edges.
    pub splits: [Vec<u64>; 3],
}

/// Reads and checks the edge-target files of `r` in `dir`; `None` where the
/// schema gives it none (and refused where such files exist anyway).
pub fn read_edge_columns(dir: &Path, r: &RelationSchema) -> Result<Option<EdgeColumns>> {
    let canonical = r.canonical();
    let edir = paths::edge_dir(dir, &canonical);
    if !r.has_targets() {
        if edir.exists() && !r.has_columns() {
            return Err(GraphError::data(&edir, "schema.json gives this relation no num_classes, \"values\", \"weights\" or \"times\", but its edge-column directory exists"));
        }
        // A directory of weights or times only: no target file may hide in it.
        let stray = ["labels", "values", "train", "valid", "test"]
            .map(|f| edir.join(format!("{f}.npy")))
            .into_iter()
            .find(|p| p.exists());
        if let Some(p) = stray {
            return Err(GraphError::data(&p, "schema.json gives this relation no edge targets (num_classes or \"values\": true), but this file exists"));
        }
        return Ok(None);
    }
    let count = r.count;
    let lpath = paths::edge_labels(dir, &canonical);
    let labels: Vec<i64> = match r.num_classes {
        Some(classes) => {
            let f = NpyFile::open(&lpath, DType::I64)?;
            f.expect_shape(&[count], "edge labels")?;
            let labels: Vec<i64> = (0..f.len()).map(|i| f.i64_at(i)).collect();
            check_edge_labels(&labels, classes).map_err(|p| GraphError::data(&lpath, p))?;
            labels
        }
        None if lpath.exists() => {
            return Err(GraphError::data(
                &lpath,
                "schema.json gives this relation no num_classes, but this file exists",
            ));
        }
        None => Vec::new(),
    };
    let vpath = paths::edge_values(dir, &canonical);
    let values: Vec<f32> = match r.values {
        true => {
            let f = NpyFile::open(&vpath, DType::F32)?;
            f.expect_shape(&[count], "edge values")?;
            let values = f.to_f32_vec();
            check_edge_values(&values).map_err(|p| GraphError::data(&vpath, p))?;
            values
        }
        false if vpath.exists() => {
            return Err(GraphError::data(&vpath, "schema.json does not list values (\"values\": true) for this relation, but this file exists"));
        }
        false => Vec::new(),
    };
    let mut seen = vec![0u8; count as usize];
    let mut splits: [Vec<u64>; 3] = Default::default();
    for (tag, (name, slot)) in ["train", "valid", "test"]
        .iter()
        .zip(&mut splits)
        .enumerate()
    {
        let spath = paths::edge_split(dir, &canonical, name);
        let f = NpyFile::open(&spath, DType::I64)?;
        if f.shape().len() != 1 {
            return Err(GraphError::data(
                &spath,
                format!("split must be 1-dimensional, shape is {:?}", f.shape()),
            ));
        }
        let mut positions = Vec::with_capacity(f.len());
        for i in 0..f.len() {
            let v = f.i64_at(i);
            if v < 0 || v as u64 >= count {
                return Err(GraphError::data(
                    &spath,
                    format!("edge position {v} out of range 0..{count}"),
                ));
            }
            positions.push(v as u64);
        }
        check_edge_split(&positions, &mut seen, tag as u8 + 1, &labels, &values)
            .map_err(|p| GraphError::data(&spath, p))?;
        *slot = positions;
    }
    Ok(Some(EdgeColumns {
        labels,
        values,
        splits,
    }))
}

/// The file of an optional edge column (`key` in the schema, `listed`
/// there), checked to have one `dtype` entry per edge; `None` where it is
/// not listed (and refused where the file exists anyway).
fn edge_column(
    path: &Path,
    listed: bool,
    key: &str,
    dtype: DType,
    count: u64,
) -> Result<Option<NpyFile>> {
    if !listed {
        if path.exists() {
            return Err(GraphError::data(path, format!("schema.json does not list {key} (\"{key}\": true) for this relation, but this file exists")));
        }
        return Ok(None);
    }
    let f = NpyFile::open(path, dtype)?;
    f.expect_shape(&[count], &format!("edge {key}"))?;
    Ok(Some(f))
}

/// Reads and checks the edge weights of `r` in `dir` (finite float32, one
/// per edge); `None` where the schema lists none (refused where the file exists anyway).
pub fn read_edge_weights(dir: &Path, r: &RelationSchema) -> Result<Option<Vec<f32>>> {
    let path = paths::edge_weights(dir, &r.canonical());
    let Some(f) = edge_column(&path, r.weights, "weights", DType::F32, r.count)? else {
        return Ok(None);
    };
    let w = f.to_f32_vec();
    if let Some(i) = w.iter().position(|x| !x.is_finite()) {
        return Err(GraphError::data(
            &path,
            format!("edge {i}: weight {} is not a finite number", w[i]),
        ));
    }
    Ok(Some(w))
}

/// Reads and checks the edge times of `r` in `dir` (int64, one per edge);
/// `None` where the schema lists none (refused where the file exists anyway).
pub fn read_edge_times(dir: &Path, r: &RelationSchema) -> Result<Option<Vec<i64>>> {
    let path = paths::edge_times(dir, &r.canonical());
    let f = edge_column(&path, r.times, "times", DType::I64, r.count)?;
    Ok(f.map(|f| (0..f.len()).map(|i| f.i64_at(i)).collect()))
}

/// The edge targets of `r` (whose edges are `src -> dst` in file order),
/// where the schema says it has them.
fn read_edge_targets(
    dir: &Path,
    r: &RelationSchema,
    src: &[u32],
    dst: &[u32],
) -> Result<Option<EdgeTargets>> {
    let Some(c) = read_edge_columns(dir, r)? else {
        return Ok(None);
    };
    let [train, valid, test] = c
        .splits
        .map(|p| EdgeSet::gather(&p, src, dst, &c.labels, &c.values));
    Ok(Some(EdgeTargets {
        num_classes: r.num_classes,
        has_values: r.values,
        train,
        valid,
        test,
    }))
}

/// Writes `g` (without added reverse relations) to `dir`, atomically.
/// `overwrite` allows replacing an existing directory.
pub fn save(g: &HetGraph, dir: &Path, overwrite: bool) -> Result<()> {
    let out = AtomicDir::create(dir, overwrite)?;
    let schema = g.schema();
    for t in g.node_types() {
        out.create_dir(&paths::node_dir(out.path(), &t.name))?;
        if let Some(f) = &t.features {
            npy::write_f32(
                &paths::features(out.path(), &t.name),
                &[t.count.into(), f.dim() as u64],
                &f.block(0, f.rows()),
            )?;
        }
        if let Some(values) = &t.values {
            npy::write_f32(
                &paths::values(out.path(), &t.name),
                &[values.len() as u64],
                values,
            )?;
        }
        if let Some(sets) = &t.label_sets {
            write_label_sets(&paths::label_sets(out.path(), &t.name), sets)?;
        }
        if let (Some(labels), Some(splits)) = (&t.labels, &t.splits) {
            npy::write_i64(
                &paths::labels(out.path(), &t.name),
                &[labels.len() as u64],
                labels,
            )?;
            for (name, ids) in splits.named() {
                let mut w = NpyWriter::create(
                    &paths::split(out.path(), &t.name, name),
                    DType::I64,
                    &[ids.len() as u64],
                )?;
                w.write_ids(ids)?;
                w.finish()?;
            }
        }
    }
    out.create_dir(&out.path().join("edges"))?;
    for r in g.relations().iter().filter(|r| r.reverse_of.is_none()) {
        let csr = r.in_csr();
        let mut srcs = Vec::with_capacity(csr.num_edges());
        let mut dsts = Vec::with_capacity(csr.num_edges());
        for d in 0..csr.num_rows() as u32 {
            for &s in csr.neighbors(d) {
                srcs.push(s);
                dsts.push(d);
            }
        }
        let mut w = NpyWriter::create(
            &paths::edges(out.path(), r.canonical()),
            DType::I64,
            &[2, srcs.len() as u64],
        )?;
        w.write_ids(&srcs)?;
        w.write_ids(&dsts)?;
        w.finish()?;
        if let Some(t) = r.targets() {
            write_edge_targets(out.path(), r.canonical(), t, &srcs, &dsts)?;
        }
    }
    schema.write(&paths::schema(out.path()))?;
    out.commit()
}

/// Writes `t` as columns aligned with the edges `srcs -> dsts` (the order
/// just written) and split positions into them. Each split edge takes the
/// first unused position of its pair (parallel edges are interchangeable).
pub(crate) fn write_edge_targets(
    dir: &Path,
    canonical: &str,
    t: &EdgeTargets,
    srcs: &[u32],
    dsts: &[u32],
) -> Result<()> {
    let edir = paths::edge_dir(dir, canonical);
    std::fs::create_dir_all(&edir).map_err(|e| GraphError::io(&edir, e))?;
    let mut free: std::collections::HashMap<(u32, u32), Vec<u64>> =
        std::collections::HashMap::new();
    for i in (0..srcs.len()).rev() {
        free.entry((srcs[i], dsts[i])).or_default().push(i as u64);
    }
    let n = srcs.len();
    let mut labels = vec![-1i64; if t.num_classes.is_some() { n } else { 0 }];
    let mut values = vec![f32::NAN; if t.has_values { n } else { 0 }];
    for (name, set) in t.named() {
        let mut positions = Vec::with_capacity(set.len());
        for i in 0..set.len() {
            let p = free
                .get_mut(&(set.src[i], set.dst[i]))
                .and_then(Vec::pop)
                .ok_or_else(|| {
                    GraphError::InvalidArgument(format!(
                        "{canonical}: {name} edge {} -> {} is not an edge of the relation",
                        set.src[i], set.dst[i]
                    ))
                })?;
            if let Some(&l) = set.labels.get(i) {
                labels[p as usize] = l;
            }
            if let Some(&v) = set.values.get(i) {
                values[p as usize] = v;
            }
            positions.push(p as i64);
        }
        positions.sort_unstable();
        npy::write_i64(
            &paths::edge_split(dir, canonical, name),
            &[positions.len() as u64],
            &positions,
        )?;
    }
    if t.num_classes.is_some() {
        npy::write_i64(&paths::edge_labels(dir, canonical), &[n as u64], &labels)?;
    }
    if t.has_values {
        npy::write_f32(&paths::edge_values(dir, canonical), &[n as u64], &values)?;
    }
    Ok(())
}

/// A directory written under a temporary name and renamed into place by
/// [`AtomicDir::commit`]; dropped uncommitted, it is removed.
pub struct AtomicDir {
    tmp: PathBuf,
    dest: PathBuf,
    overwrite: bool,
    committed: bool,
}

impl AtomicDir {
    /// Prepares to write `dest`. Fails if it exists (and is not empty) unless `overwrite`.
    pub fn create(dest: &Path, overwrite: bool) -> Result<AtomicDir> {
        if dest.exists() && !overwrite {
            let empty = dest.is_dir()
                && std::fs::read_dir(dest)
                    .map(|mut d| d.next().is_none())
                    .unwrap_or(false);
            if !empty {
                return Err(GraphError::InvalidArgument(format!(
                    "{} already exists (use --force to replace it)",
                    dest.display()
                )));
            }
        }
        let name = dest.file_name().ok_or_else(|| {
            GraphError::InvalidArgument(format!("{} is not a directory name", dest.display()))
        })?;
        let parent = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| GraphError::io(parent, e))?;
        let tmp = parent.join(format!(
            ".{}.partial-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| GraphError::io(&tmp, e))?;
        }
        std::fs::create_dir(&tmp).map_err(|e| GraphError::io(&tmp, e))?;
        Ok(AtomicDir {
            tmp,
            dest: dest.to_path_buf(),
            overwrite,
            committed: false,
        })
    }

    /// Where to write meanwhile.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Creates a subdirectory (and its parents).
    pub fn create_dir(&self, p: &Path) -> Result<()> {
        std::fs::create_dir_all(p).map_err(|e| GraphError::io(p, e))
    }

    /// Moves the finished directory into place.
    pub fn commit(mut self) -> Result<()> {
        if self.dest.exists() {
            if !self.overwrite
                && std::fs::read_dir(&self.dest)
                    .map(|mut d| d.next().is_some())
                    .unwrap_or(true)
            {
                return Err(GraphError::InvalidArgument(format!(
                    "{} appeared while writing",
                    self.dest.display()
                )));
            }
            let name = self
                .dest
                .file_name()
                .map_or_else(|| "graph".into(), |n| n.to_string_lossy().into_owned());
            let old = self
                .dest
                .with_file_name(format!(".{name}.old-{}", std::process::id()));
            std::fs::rename(&self.dest, &old).map_err(|e| GraphError::io(&self.dest, e))?;
            std::fs::rename(&self.tmp, &self.dest).map_err(|e| GraphError::io(&self.dest, e))?;
            std::fs::remove_dir_all(&old).map_err(|e| GraphError::io(&old, e))?;
        } else {
            std::fs::rename(&self.tmp, &self.dest).map_err(|e| GraphError::io(&self.dest, e))?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for AtomicDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Writes multi-label targets as `label_sets.npy`.
pub(crate) fn write_label_sets(path: &Path, sets: &LabelSets) -> Result<()> {
    npy::write_i8(
        path,
        &[sets.count() as u64, sets.width() as u64],
        sets.as_slice(),
    )
}
