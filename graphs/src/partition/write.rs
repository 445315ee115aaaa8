//! Writing a partition directory from a graph and its owners.

use std::path::Path;

use super::set::TrainEdges;
use super::set::{owners_path, part_dir, FORMAT};
use super::{Assignment, Manifest, PartInfo};
use crate::error::{GraphError, Result};
use crate::format::AtomicDir;
use crate::graph::HetGraph;
use crate::npy;
use crate::progress::Progress;

/// How a partition directory is written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Replace the output directory if it exists.
    pub overwrite: bool,
    /// Keep the feature rows of halo nodes too (a partition then computes its
    /// halo's first layer itself: model averaging trains on local data only).
    pub halo_features: bool,
    /// The content of the graph partitioned ([`crate::fingerprint::content`]),
    /// recorded so that training refuses partitions of another graph.
    pub graph_sha256: Option<String>,
}

/// Writes `g` split as `a` says into `out` (atomically) and returns the manifest.
pub fn write(
    g: &HetGraph,
    a: &Assignment,
    out: &Path,
    overwrite: bool,
    progress: &mut dyn Progress,
) -> Result<Manifest> {
    write_with(
        g,
        a,
        out,
        &WriteOptions {
            overwrite,
            ..WriteOptions::default()
        },
        progress,
    )
}

/// [`write()`] with every option.
pub fn write_with(
    g: &HetGraph,
    a: &Assignment,
    out: &Path,
    opts: &WriteOptions,
    progress: &mut dyn Progress,
) -> Result<Manifest> {
    let overwrite = opts.overwrite;
    let (owners, parts) = (&a.owners, a.parts);
    if g.has_reverse_relations() {
        return Err(GraphError::InvalidArgument(
            "partition a graph loaded without reverse relations (they are added at load time)"
                .into(),
        ));
    }
    let types = g.node_types();
    if owners.len() != types.len()
        || owners
            .iter()
            .zip(types)
            .any(|(o, t)| o.len() != t.count as usize || o.iter().any(|&p| p as usize >= parts))
    {
        return Err(GraphError::InvalidArgument(
            "owners do not match the graph's node types and counts".into(),
        ));
    }
    let target = g.target().index();
    if a.trainer_of.len() != types[target].count as usize
        || a.trainer_of.iter().any(|&t| t as usize >= a.trainers)
    {
        return Err(GraphError::InvalidArgument(
            "trainer assignment does not match the target type".into(),
        ));
    }
    let dir = AtomicDir::create(out, overwrite)?;
    dir.create_dir(&dir.path().join("owners"))?;
    for (t, nt) in types.iter().enumerate() {
        let ids: Vec<i64> = owners[t].iter().map(|&p| i64::from(p)).collect();
        npy::write_i64(&owners_path(dir.path(), &nt.name), &[nt.count.into()], &ids)?;
    }
    let mut edge_cut = 0u64;
    let mut total_edges = 0u64;
    for r in g.relations() {
        let csr = r.in_csr();
        for d in 0..csr.num_rows() as u32 {
            let od = owners[r.dst.index()][d as usize];
            edge_cut += csr
                .neighbors(d)
                .iter()
                .filter(|&&s| owners[r.src.index()][s as usize] != od)
                .count() as u64;
        }
        total_edges += r.num_edges() as u64;
    }
    let mut info = Vec::with_capacity(parts);
    progress.start("writing partitions", parts as u64);
    for k in 0..parts {
        let mut p = write_part(
            g,
            owners,
            k as u16,
            &part_dir(dir.path(), k),
            opts.halo_features,
        )?;
        if let Some(splits) = &types[target].splits {
            p.trainer_splits = (0..a.trainers)
                .map(|t| {
                    let count = |ids: &[u32]| {
                        ids.iter()
                            .filter(|&&v| {
                                owners[target][v as usize] as usize == k
                                    && a.trainer_of[v as usize] as usize == t
                            })
                            .count() as u64
                    };
                    [
                        count(&splits.train),
                        count(&splits.valid),
                        count(&splits.test),
                    ]
                })
                .collect();
        }
        info.push(p);
        progress.advance(1);
    }
    progress.finish();
    let ids: Vec<i64> = a.trainer_of.iter().map(|&t| i64::from(t)).collect();
    npy::write_i64(&dir.path().join("trainers.npy"), &[ids.len() as u64], &ids)?;
    let manifest = Manifest {
        format: FORMAT,
        graph: g.name().to_string(),
        method: a.method,
        seed: a.seed,
        parts,
        trainers: a.trainers,
        node_types: types.iter().map(|t| t.name.clone()).collect(),
        edge_cut,
        total_edges,
        relation_edges: g
            .relations()
            .iter()
            .filter(|r| r.reverse_of.is_none())
            .map(|r| (r.canonical().to_string(), r.num_edges() as u64))
            .collect(),
        edge_train: g
            .relations()
            .iter()
            .filter_map(|r| {
                let t = &r.targets()?.train;
                let counts = TrainEdges {
                    labelled: t.labels.iter().filter(|&&l| l >= 0).count() as u64,
                    valued: t.values.iter().filter(|v| !v.is_nan()).count() as u64,
                };
                Some((r.canonical().to_string(), counts))
            })
            .collect(),
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

fn write_part(
    g: &HetGraph,
    owners: &[Vec<u16>],
    k: u16,
    dir: &Path,
    halo_features: bool,
) -> Result<PartInfo> {
    let types = g.node_types();
    // Edges are written before features, so the halo is known when the rows are.
    let touched: Vec<Vec<std::cell::Cell<bool>>> = types
        .iter()
        .map(|t| (0..t.count).map(|_| std::cell::Cell::new(false)).collect())
        .collect();
    // Every edge into or out of a core node, so core neighborhoods are whole in both directions.
    let keep_edge = |ri: usize, s: u32, d: u32| {
        let r = &g.relations()[ri];
        let keep = owners[r.dst.index()][d as usize] == k || owners[r.src.index()][s as usize] == k;
        if keep {
            touched[r.src.index()][s as usize].set(true);
            touched[r.dst.index()][d as usize].set(true);
        }
        keep
    };
    let keep_row = |t: usize, v: u32| {
        owners[t][v as usize] == k || (halo_features && touched[t][v as usize].get())
    };
    let edges = super::graph_dir::write(g, dir, keep_edge, keep_row)?;
    let mut info = PartInfo {
        edges,
        ..PartInfo::default()
    };
    for (t, nt) in types.iter().enumerate() {
        let own = &owners[t];
        info.core
            .push(own.iter().filter(|&&p| p == k).count() as u64);
        info.halo.push(
            touched[t]
                .iter()
                .zip(own)
                .filter(|(hit, &p)| hit.get() && p != k)
                .count() as u64,
        );
        if let Some(splits) = &nt.splits {
            for (i, (_, ids)) in splits.named().into_iter().enumerate() {
                info.splits[i] = ids.iter().filter(|&&v| own[v as usize] == k).count() as u64;
            }
        }
    }
    Ok(info)
}
