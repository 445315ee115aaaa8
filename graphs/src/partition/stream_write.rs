//! Writing a partition directory without loading the graph: the same files,
//! byte for byte, as [`super::write`] writes from a loaded graph with the
//! same owners, in memory bounded by the owners, one bit per node, and one
//! partition's edges of one relation at a time.
//!
//! Per partition and relation, one pass over that relation's edge file keeps
//! the edges into or out of the partition's core nodes, sorts them as the
//! loaded graph's CSR holds them (by destination, then source) and writes
//! them. Feature files are read row by row (buffered reads, not a memory
//! map) and only core rows are written, into sparse files of the global
//! shape. Labels and splits are rewritten as the loading writer writes them.

use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::set::{owners_path, part_dir, FORMAT};
use super::stream::EdgeStream;
use super::write::WriteOptions;
use super::{Assignment, Manifest, PartInfo};
use crate::error::{GraphError, Result};
use crate::format::{paths, AtomicDir};
use crate::npy::{self, DType, NpyFile, NpyWriter};
use crate::progress::Progress;

/// Writes the graph directory `src` split as `a` says into `out` (atomically), streaming.
pub fn write_streaming(
    src: &Path,
    a: &Assignment,
    out: &Path,
    opts: &WriteOptions,
    progress: &mut dyn Progress,
) -> Result<Manifest> {
    let overwrite = opts.overwrite;
    let s = EdgeStream::open(src)?;
    let (owners, parts) = (&a.owners, a.parts);
    let types = &s.schema.node_types;
    if owners.len() != types.len()
        || owners
            .iter()
            .zip(types)
            .any(|(o, (_, t))| o.len() as u64 != t.count || o.iter().any(|&p| p as usize >= parts))
    {
        return Err(GraphError::InvalidArgument(
            "owners do not match the graph's node types and counts".into(),
        ));
    }
    if a.trainers != 1 {
        return Err(GraphError::InvalidArgument(
            "the streaming writer writes one trainer per partition".into(),
        ));
    }
    let owner = |v: u32| -> u16 {
        let t = s.type_of_node(v);
        owners[t][(u64::from(v) - s.base[t]) as usize]
    };
    let dir = AtomicDir::create(out, overwrite)?;
    dir.create_dir(&dir.path().join("owners"))?;
    for ((name, nt), o) in types.iter().zip(owners) {
        let ids: Vec<i64> = o.iter().map(|&p| i64::from(p)).collect();
        npy::write_i64(&owners_path(dir.path(), name), &[nt.count], &ids)?;
    }
    // One counting pass: the cut, and each partition's edges of each relation
    // (so each partition's edges are gathered into a vector of their exact size).
    let mut edge_cut = 0u64;
    let rels = s.schema.relations.len();
    let mut counts = vec![0usize; parts * rels];
    s.for_each(|c| {
        for (&u, &v) in c.src.iter().zip(c.dst) {
            let (ou, ov) = (owner(u) as usize, owner(v) as usize);
            counts[ou * rels + c.relation] += 1;
            if ov != ou {
                counts[ov * rels + c.relation] += 1;
                edge_cut += 1;
            }
        }
        Ok(())
    })?;
    let total_edges = s.edges();
    let target = s.target()?;
    let splits: Vec<(&str, Vec<u32>)> = ["train", "valid", "test"]
        .iter()
        .map(|&name| Ok((name, s.split(name)?)))
        .collect::<Result<_>>()?;
    let labels = read_i64(&paths::labels(src, &s.schema.target))?;
    let mut info = Vec::with_capacity(parts);
    let mut touched = vec![0u64; (s.nodes() as usize).div_ceil(64)];
    progress.start("writing partitions (streaming)", parts as u64);
    for k in 0..parts as u16 {
        let pdir = part_dir(dir.path(), k as usize);
        std::fs::create_dir_all(pdir.join("edges")).map_err(|e| GraphError::io(&pdir, e))?;
        touched.iter_mut().for_each(|w| *w = 0);
        let mut schema = s.schema.clone().without_edge_targets();
        let mut stored = 0u64;
        for r in 0..s.schema.relations.len() {
            let (ts, td) = s.relation_types(r)?;
            let (bs, bd) = (s.base[ts], s.base[td]);
            // (dst, src) in local ids, sorted as the CSR of a loaded graph holds them.
            let mut kept: Vec<u64> = Vec::with_capacity(counts[k as usize * rels + r]);
            s.for_each_of(r, |c| {
                for (&u, &v) in c.src.iter().zip(c.dst) {
                    if owner(u) == k || owner(v) == k {
                        touched[u as usize / 64] |= 1 << (u % 64);
                        touched[v as usize / 64] |= 1 << (v % 64);
                        kept.push(((u64::from(v) - bd) << 32) | (u64::from(u) - bs));
                    }
                }
                Ok(())
            })?;
            kept.sort_unstable();
            schema.relations[r].count = kept.len() as u64;
            stored += kept.len() as u64;
            let mut w = NpyWriter::create(
                &paths::edges(&pdir, &s.schema.relations[r].canonical()),
                DType::I64,
                &[2, kept.len() as u64],
            )?;
            let ids = |hi: bool| {
                kept.iter()
                    .map(move |&x| if hi { (x >> 32) as u32 } else { x as u32 })
            };
            write_ids_iter(&mut w, ids(false))?;
            write_ids_iter(&mut w, ids(true))?;
            w.finish()?;
            drop(kept);
        }
        let mut p = PartInfo {
            edges: stored,
            ..PartInfo::default()
        };
        for (t, ((name, nt), o)) in types.iter().zip(owners).enumerate() {
            std::fs::create_dir_all(paths::node_dir(&pdir, name))
                .map_err(|e| GraphError::io(&pdir, e))?;
            p.core.push(o.iter().filter(|&&x| x == k).count() as u64);
            let halo = (0..nt.count).filter(|&v| {
                o[v as usize] != k && {
                    let g = (s.base[t] + v) as usize;
                    touched[g / 64] & (1 << (g % 64)) != 0
                }
            });
            p.halo.push(halo.count() as u64);
            if let Some(dim) = nt.feature_dim {
                let halo = |v: u64| {
                    let g = (s.base[t] + v) as usize;
                    opts.halo_features && touched[g / 64] & (1 << (g % 64)) != 0
                };
                copy_core_rows(
                    &paths::features(src, name),
                    &paths::features(&pdir, name),
                    nt.count,
                    dim as usize,
                    |v| o[v as usize] == k || halo(v),
                )?;
            }
        }
        let tname = &s.schema.target;
        if s.schema.values {
            let (from, to) = (paths::values(src, tname), paths::values(&pdir, tname));
            std::fs::copy(&from, &to).map_err(|e| GraphError::io(&from, e))?;
        }
        if s.schema.label_sets.is_some() {
            let (from, to) = (
                paths::label_sets(src, tname),
                paths::label_sets(&pdir, tname),
            );
            std::fs::copy(&from, &to).map_err(|e| GraphError::io(&from, e))?;
        }
        npy::write_i64(
            &paths::labels(&pdir, tname),
            &[labels.len() as u64],
            &labels,
        )?;
        for (i, (name, ids)) in splits.iter().enumerate() {
            let mut w = NpyWriter::create(
                &paths::split(&pdir, tname, name),
                DType::I64,
                &[ids.len() as u64],
            )?;
            w.write_ids(ids)?;
            w.finish()?;
            p.splits[i] = ids
                .iter()
                .filter(|&&v| owners[target][v as usize] == k)
                .count() as u64;
        }
        p.trainer_splits = vec![p.splits];
        schema.write(&paths::schema(&pdir))?;
        info.push(p);
        progress.advance(1);
    }
    progress.finish();
    let ids: Vec<i64> = a.trainer_of.iter().map(|&t| i64::from(t)).collect();
    npy::write_i64(&dir.path().join("trainers.npy"), &[ids.len() as u64], &ids)?;
    let manifest = Manifest {
        format: FORMAT,
        graph: s.schema.name.clone(),
        method: a.method,
        seed: a.seed,
        parts,
        trainers: 1,
        node_types: types.iter().map(|(n, _)| n.clone()).collect(),
        edge_cut,
        total_edges,
        relation_edges: s
            .schema
            .relations
            .iter()
            .map(|r| (r.canonical(), r.count))
            .collect(),
        edge_train: Default::default(),
        halo_features: opts.halo_features,
        graph_sha256: opts.graph_sha256.clone(),
        files: Default::default(),
        seal: String::new(),
        info,
    };
    manifest.write(dir.path())?;
    dir.commit()?;
    Ok(manifest)
}

/// Appends `ids` widened to int64, a block at a time.
fn write_ids_iter(w: &mut NpyWriter, ids: impl Iterator<Item = u32>) -> Result<()> {
    let mut buf: Vec<u32> = Vec::with_capacity(1 << 16);
    for v in ids {
        buf.push(v);
        if buf.len() == buf.capacity() {
            w.write_ids(&buf)?;
            buf.clear();
        }
    }
    w.write_ids(&buf)
}

/// A whole int64 file (absent: empty).
fn read_i64(path: &Path) -> Result<Vec<i64>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let f = NpyFile::open(path, DType::I64)?;
    Ok((0..f.len()).map(|i| f.i64_at(i)).collect())
}

/// Copies the rows `keep` accepts of the `[count, dim]` float32 file `from`
/// into a sparse file of the same shape at `to`, reading `from` sequentially.
fn copy_core_rows(
    from: &Path,
    to: &Path,
    count: u64,
    dim: usize,
    keep: impl Fn(u64) -> bool,
) -> Result<()> {
    let offset = super::stream::checked_offset(from, DType::F32, &[count, dim as u64])?;
    let mut f = crate::input::open(from)?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| GraphError::io(from, e))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut w = NpyWriter::create(to, DType::F32, &[count, dim as u64])?.into_sparse(dim)?;
    let mut raw = vec![0u8; dim * 4];
    let mut row = vec![0f32; dim];
    for v in 0..count {
        if !keep(v) {
            r.seek_relative(raw.len() as i64)
                .map_err(|e| GraphError::io(from, e))?;
            continue;
        }
        r.read_exact(&mut raw)
            .map_err(|e| GraphError::io(from, e))?;
        for (x, b) in row.iter_mut().zip(raw.chunks_exact(4)) {
            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        w.put(v, &row)?;
    }
    w.finish()
}
