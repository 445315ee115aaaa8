//! METIS k-way edge-cut partitioning of the graph with every relation taken
//! as undirected, balancing (one constraint each) the nodes of every type,
//! the in-edges, and the train, valid and test nodes. Restricted to one
//! partition's nodes, the second level of DistDGLv2's partitioning: one
//! sub-partition per trainer of a machine.

use super::NodePartitioner;
use crate::error::{GraphError, Result};
use crate::graph::HetGraph;

/// METIS, multi-constraint (the default).
pub struct Metis;

impl NodePartitioner for Metis {
    fn name(&self) -> &'static str {
        "metis"
    }

    /// Nodes outside `within` get sub-partition 0.
    fn assign(
        &self,
        g: &HetGraph,
        parts: usize,
        seed: u64,
        within: Option<(&[Vec<u16>], u16)>,
    ) -> Result<Vec<Vec<u16>>> {
        metis(g, parts, seed, within)
    }
}

/// Held while METIS runs: it keeps its random state in globals, so two calls
/// at once (tests, or a library user's threads) would interleave it and lose
/// determinism.
pub(super) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static METIS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    METIS.lock().unwrap_or_else(|p| p.into_inner())
}

fn metis(
    g: &HetGraph,
    parts: usize,
    seed: u64,
    within: Option<(&[Vec<u16>], u16)>,
) -> Result<Vec<Vec<u16>>> {
    let types = g.node_types();
    // Dense vertex ids of the kept nodes, type after type.
    const OUT: u32 = u32::MAX;
    let mut vid: Vec<Vec<u32>> = Vec::with_capacity(types.len());
    let mut base = Vec::with_capacity(types.len() + 1);
    let mut n = 0usize;
    for (t, nt) in types.iter().enumerate() {
        base.push(n);
        let ids: Vec<u32> = (0..nt.count as usize)
            .map(|v| match within {
                Some((owners, k)) if owners[t][v] != k => OUT,
                _ => {
                    n += 1;
                    (n - 1 - base[t]) as u32
                }
            })
            .collect();
        vid.push(ids);
    }
    base.push(n);
    let zeros = || -> Vec<Vec<u16>> { types.iter().map(|nt| vec![0; nt.count as usize]).collect() };
    if n == 0 || parts == 1 {
        return Ok(zeros());
    }
    if n > i32::MAX as usize / 2 {
        return Err(GraphError::InvalidArgument(format!(
            "{n} nodes are too many for METIS's 32-bit ids"
        )));
    }
    let at = |t: usize, v: u32| -> Option<usize> {
        (vid[t][v as usize] != OUT).then(|| base[t] + vid[t][v as usize] as usize)
    };
    // Undirected adjacency over the kept nodes, without self-loops or duplicates.
    let each_edge = |f: &mut dyn FnMut(usize, usize)| {
        for r in g.relations().iter().filter(|r| r.reverse_of.is_none()) {
            let (ts, td) = (r.src.index(), r.dst.index());
            let csr = r.in_csr();
            for d in 0..csr.num_rows() as u32 {
                let Some(v) = at(td, d) else { continue };
                for &s in csr.neighbors(d) {
                    if let Some(u) = at(ts, s).filter(|&u| u != v) {
                        f(u, v);
                    }
                }
            }
        }
    };
    let mut deg = vec![0usize; n];
    each_edge(&mut |u, v| {
        deg[u] += 1;
        deg[v] += 1;
    });
    let mut in_deg = vec![0i32; n];
    for r in g.relations().iter().filter(|r| r.reverse_of.is_none()) {
        let csr = r.in_csr();
        for d in 0..csr.num_rows() as u32 {
            if let Some(v) = at(r.dst.index(), d) {
                in_deg[v] += csr.degree(d) as i32;
            }
        }
    }
    let mut xadj = vec![0usize; n + 1];
    for i in 0..n {
        xadj[i + 1] = xadj[i] + deg[i];
    }
    let mut fill = xadj[..n].to_vec();
    let mut adj = vec![0i32; xadj[n]];
    each_edge(&mut |u, v| {
        adj[fill[u]] = v as i32;
        fill[u] += 1;
        adj[fill[v]] = u as i32;
        fill[v] += 1;
    });
    drop(fill);
    // Sort and deduplicate each row in place, compacting.
    let mut out_xadj = vec![0i32; n + 1];
    let mut w = 0usize;
    for i in 0..n {
        let (lo, hi) = (xadj[i], xadj[i + 1]);
        adj[lo..hi].sort_unstable();
        let mut last = -1;
        for k in lo..hi {
            let v = adj[k];
            if v != last {
                adj[w] = v;
                w += 1;
                last = v;
            }
        }
        out_xadj[i + 1] = i32::try_from(w).map_err(|_| {
            GraphError::InvalidArgument("too many edges for METIS's 32-bit ids".into())
        })?;
    }
    adj.truncate(w);

    // Constraints: one per node type, in-edges, then each non-empty split.
    let target = g.target().index();
    let splits = types[target].splits.clone().unwrap_or_default();
    let mut cons: Vec<Vec<(usize, i32)>> = Vec::new();
    for t in 0..types.len() {
        cons.push((base[t]..base[t + 1]).map(|v| (v, 1)).collect());
    }
    cons.push(
        (0..n)
            .filter(|&v| in_deg[v] > 0)
            .map(|v| (v, in_deg[v]))
            .collect(),
    );
    for (_, ids) in splits.named() {
        cons.push(
            ids.iter()
                .filter_map(|&v| at(target, v))
                .map(|v| (v, 1))
                .collect(),
        );
    }
    cons.retain(|c| !c.is_empty());
    let ncon = cons.len();
    let mut vwgt = vec![0i32; n * ncon];
    for (c, list) in cons.iter().enumerate() {
        for &(v, wt) in list {
            vwgt[v * ncon + c] = wt;
        }
    }
    let mut part = vec![0i32; n];
    let graph = metis::Graph::new(ncon as i32, parts as i32, &out_xadj, &adj)
        .map_err(|e| GraphError::InvalidArgument(format!("METIS refused the graph: {e}")))?
        .set_vwgt(&vwgt)
        .set_option(metis::option::Seed((seed & 0x7fff_ffff) as i32));
    let _one_at_a_time = one_at_a_time();
    graph
        .part_kway(&mut part)
        .map_err(|e| GraphError::InvalidArgument(format!("METIS failed: {e}")))?;
    let mut out = zeros();
    for (t, ids) in vid.iter().enumerate() {
        for (v, &i) in ids.iter().enumerate() {
            if i != OUT {
                out[t][v] = part[base[t] + i as usize] as u16;
            }
        }
    }
    Ok(out)
}
