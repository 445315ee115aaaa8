//! Writing one partition as a graph directory: the part both partitioners share.

use std::path::Path;

use crate::edge_targets::{EdgeSet, EdgeTargets};
use crate::error::{GraphError, Result};
use crate::format::{paths, write_edge_targets};
use crate::graph::HetGraph;
use crate::npy::{self, DType, NpyWriter};

/// Writes `g` restricted to a partition into `dir`: of each original relation
/// (by index) the edges `keep_edge(relation, src, dst)` accepts; of each
/// featured type the rows `keep_row(type, node)` accepts, the others left as
/// holes of a sparse file of the global shape; labels and splits whole; the
/// edge targets (labels, values, splits) of the stored edges; the schema
/// with the stored edge counts. Returns the edges stored.
pub(super) fn write(
    g: &HetGraph,
    dir: &Path,
    mut keep_edge: impl FnMut(usize, u32, u32) -> bool,
    keep_row: impl Fn(usize, u32) -> bool,
) -> Result<u64> {
    let mut schema = g.schema();
    std::fs::create_dir_all(dir.join("edges")).map_err(|e| GraphError::io(dir, e))?;
    let mut stored = 0u64;
    for (ri, r) in g
        .relations()
        .iter()
        .enumerate()
        .filter(|(_, r)| r.reverse_of.is_none())
    {
        let csr = r.in_csr();
        let (mut srcs, mut dsts) = (Vec::new(), Vec::new());
        for d in 0..csr.num_rows() as u32 {
            for &s in csr.neighbors(d) {
                if keep_edge(ri, s, d) {
                    srcs.push(s);
                    dsts.push(d);
                }
            }
        }
        schema.relations[ri].count = srcs.len() as u64;
        stored += srcs.len() as u64;
        let mut w = NpyWriter::create(
            &paths::edges(dir, r.canonical()),
            DType::I64,
            &[2, srcs.len() as u64],
        )?;
        w.write_ids(&srcs)?;
        w.write_ids(&dsts)?;
        w.finish()?;
        if let Some(t) = r.targets() {
            // A split edge is kept where its pair is (every parallel copy with it).
            let mut stored = |set: &EdgeSet| {
                let ids: Vec<u32> = (0..set.len() as u32)
                    .filter(|&i| keep_edge(ri, set.src[i as usize], set.dst[i as usize]))
                    .collect();
                set.select(&ids)
            };
            let part = EdgeTargets {
                train: stored(&t.train),
                valid: stored(&t.valid),
                test: stored(&t.test),
                num_classes: t.num_classes,
                has_values: t.has_values,
            };
            write_edge_targets(dir, r.canonical(), &part, &srcs, &dsts)?;
        }
    }
    for (t, nt) in g.node_types().iter().enumerate() {
        std::fs::create_dir_all(paths::node_dir(dir, &nt.name))
            .map_err(|e| GraphError::io(dir, e))?;
        if let Some(f) = &nt.features {
            let w = NpyWriter::create(
                &paths::features(dir, &nt.name),
                DType::F32,
                &[nt.count.into(), f.dim() as u64],
            )?;
            let rows = (0..nt.count)
                .filter(|&v| keep_row(t, v))
                .map(|v| (u64::from(v), f.row(v as usize)));
            w.write_sparse_rows(f.dim(), rows)?;
        }
        if let Some(values) = &nt.values {
            npy::write_f32(
                &paths::values(dir, &nt.name),
                &[values.len() as u64],
                values,
            )?;
        }
        if let Some(sets) = &nt.label_sets {
            crate::format::write_label_sets(&paths::label_sets(dir, &nt.name), sets)?;
        }
        if let (Some(labels), Some(splits)) = (&nt.labels, &nt.splits) {
            npy::write_i64(
                &paths::labels(dir, &nt.name),
                &[labels.len() as u64],
                labels,
            )?;
            for (name, ids) in splits.named() {
                let mut w = NpyWriter::create(
                    &paths::split(dir, &nt.name, name),
                    DType::I64,
                    &[ids.len() as u64],
                )?;
                w.write_ids(ids)?;
                w.finish()?;
            }
        }
    }
    schema.write(&paths::schema(dir))?;
    Ok(stored)
}
