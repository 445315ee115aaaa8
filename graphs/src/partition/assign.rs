//! Owner assignment: which partition owns each node.

use crate::error::{GraphError, Result};
use crate::graph::HetGraph;
use crate::rng::key;

/// Random owners: a pure function of (seed, type, node), about `1/parts` each.
pub fn random(g: &HetGraph, parts: usize, seed: u64) -> Vec<Vec<u16>> {
    g.node_types()
        .iter()
        .enumerate()
        .map(|(t, nt)| (0..nt.count).map(|v| (key(&[seed, t as u64, u64::from(v)]) % parts as u64) as u16).collect())
        .collect()
}

/// METIS k-way edge-cut partitioning of the graph with every relation taken as
/// undirected, balancing (one constraint each) the nodes of every type, the
/// in-edges, and the train, valid and test nodes.
pub fn metis(g: &HetGraph, parts: usize, seed: u64) -> Result<Vec<Vec<u16>>> {
    let types = g.node_types();
    let mut base = Vec::with_capacity(types.len() + 1);
    let mut n = 0usize;
    for nt in types {
        base.push(n);
        n += nt.count as usize;
    }
    base.push(n);
    if n == 0 {
        return Ok(types.iter().map(|_| Vec::new()).collect());
    }
    if parts == 1 {
        return Ok(types.iter().map(|nt| vec![0; nt.count as usize]).collect());
    }
    if n > i32::MAX as usize / 2 {
        return Err(GraphError::InvalidArgument(format!("{n} nodes are too many for METIS's 32-bit ids")));
    }
    // Undirected adjacency over all nodes (type offsets), without self-loops or duplicates.
    let mut deg = vec![0usize; n];
    let mut in_deg = vec![0i32; n];
    for r in g.relations().iter().filter(|r| r.reverse_of.is_none()) {
        let (bs, bd) = (base[r.src.index()], base[r.dst.index()]);
        let csr = r.in_csr();
        for d in 0..csr.num_rows() as u32 {
            for &s in csr.neighbors(d) {
                let (u, v) = (bs + s as usize, bd + d as usize);
                if u != v {
                    deg[u] += 1;
                    deg[v] += 1;
                }
            }
            in_deg[bd + d as usize] += csr.degree(d) as i32;
        }
    }
    let mut xadj = vec![0usize; n + 1];
    for i in 0..n {
        xadj[i + 1] = xadj[i] + deg[i];
    }
    let mut fill = xadj[..n].to_vec();
    let mut adj = vec![0i32; xadj[n]];
    for r in g.relations().iter().filter(|r| r.reverse_of.is_none()) {
        let (bs, bd) = (base[r.src.index()], base[r.dst.index()]);
        let csr = r.in_csr();
        for d in 0..csr.num_rows() as u32 {
            for &s in csr.neighbors(d) {
                let (u, v) = (bs + s as usize, bd + d as usize);
                if u != v {
                    adj[fill[u]] = v as i32;
                    fill[u] += 1;
                    adj[fill[v]] = u as i32;
                    fill[v] += 1;
                }
            }
        }
    }
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
        out_xadj[i + 1] = i32::try_from(w).map_err(|_| GraphError::InvalidArgument("too many edges for METIS's 32-bit ids".into()))?;
    }
    adj.truncate(w);

    // Constraints: one per node type, in-edges, then each non-empty split.
    let target = g.target().index();
    let splits = types[target].splits.clone().unwrap_or_default();
    let mut cons: Vec<Vec<(usize, i32)>> = Vec::new();
    for t in 0..types.len() {
        cons.push((base[t]..base[t + 1]).map(|v| (v, 1)).collect());
    }
    cons.push((0..n).filter(|&v| in_deg[v] > 0).map(|v| (v, in_deg[v])).collect());
    for (_, ids) in splits.named() {
        cons.push(ids.iter().map(|&v| (base[target] + v as usize, 1)).collect());
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
    graph.part_kway(&mut part).map_err(|e| GraphError::InvalidArgument(format!("METIS failed: {e}")))?;
    Ok((0..types.len()).map(|t| part[base[t]..base[t + 1]].iter().map(|&p| p as u16).collect()).collect())
}
