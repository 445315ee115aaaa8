//! Streaming vertex-cut baselines for SPRING (CATGNN §3.2): HDRF and DBH place
//! each streamed edge in one partition, replicating its endpoints there; a
//! node's owner is then one of the partitions holding a replica of it, picked
//! by a seeded hash (the paper picks a training node's copy at random; here
//! every node's, so the choice is reproducible). Each partition then holds
//! its owned nodes' whole neighbourhoods (the partition directory's halo:
//! the paper's neighbour completion), so the replication factor of the
//! written partitions is comparable with SPRING's and METIS's.
//!
//! HDRF (Petroni et al.): with partial degrees `δ` counted as the stream goes,
//! `θ(u) = δ(u) / (δ(u) + δ(v))`, an edge goes to the partition maximising
//! `g(u) + g(v) + λ · (max − size) / (ε + max − min)` where `g(x) = 1 + (1 − θ(x))`
//! if `x` has a replica there and 0 otherwise, sizes count edges, `λ = 1`,
//! `ε = 1`. DBH (Xie et al.): an edge goes to the hash of its endpoint of
//! lower degree (degrees from a counting pass). Both need a replica set per
//! node: a 64-bit mask, so at most 64 partitions.

use super::stream::EdgeStream;
use crate::error::{GraphError, Result};
use crate::rng::key;

/// Most partitions a replica mask holds.
pub const MAX_VERTEX_CUT_PARTS: usize = 64;

/// Which vertex-cut rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VertexCut {
    /// High-degree replicated first.
    Hdrf,
    /// Degree-based hashing.
    Dbh,
}

/// The owner of every node, per type, after streaming every edge through `rule`.
pub fn assign(rule: VertexCut, s: &EdgeStream, parts: usize, seed: u64) -> Result<Vec<Vec<u16>>> {
    if parts == 0 || parts > MAX_VERTEX_CUT_PARTS {
        return Err(GraphError::InvalidArgument(format!("--parts must be in 1..={MAX_VERTEX_CUT_PARTS} for the vertex-cut baselines, got {parts}")));
    }
    let n = s.nodes() as usize;
    let mut replicas = vec![0u64; n];
    match rule {
        VertexCut::Dbh => {
            let deg = s.degrees()?;
            s.for_each(|c| {
                for (&u, &v) in c.src.iter().zip(c.dst) {
                    let x = if (deg[u as usize], u) <= (deg[v as usize], v) {
                        u
                    } else {
                        v
                    };
                    let p = key(&[seed, 0xDB4, u64::from(x)]) % parts as u64;
                    replicas[u as usize] |= 1 << p;
                    replicas[v as usize] |= 1 << p;
                }
                Ok(())
            })?;
        }
        VertexCut::Hdrf => {
            let (lambda, eps) = (1.0f64, 1.0f64);
            let mut partial = vec![0u32; n];
            let mut sizes = vec![0u64; parts];
            s.for_each(|c| {
                for (&u, &v) in c.src.iter().zip(c.dst) {
                    partial[u as usize] = partial[u as usize].saturating_add(1);
                    partial[v as usize] = partial[v as usize].saturating_add(1);
                    let (du, dv) = (
                        f64::from(partial[u as usize]),
                        f64::from(partial[v as usize]),
                    );
                    let (tu, tv) = (du / (du + dv), dv / (du + dv));
                    let (max, min) = (
                        sizes.iter().copied().max().unwrap_or(0) as f64,
                        sizes.iter().copied().min().unwrap_or(0) as f64,
                    );
                    let g = |mask: u64, p: usize, theta: f64| {
                        if mask & (1 << p) != 0 {
                            1.0 + (1.0 - theta)
                        } else {
                            0.0
                        }
                    };
                    let score = |p: usize| {
                        g(replicas[u as usize], p, tu)
                            + g(replicas[v as usize], p, tv)
                            + lambda * (max - sizes[p] as f64) / (eps + max - min)
                    };
                    let best = (0..parts)
                        .max_by(|&a, &b| score(a).total_cmp(&score(b)).then(b.cmp(&a)))
                        .expect("parts >= 1");
                    replicas[u as usize] |= 1 << best;
                    replicas[v as usize] |= 1 << best;
                    sizes[best] += 1;
                }
                Ok(())
            })?;
        }
    }
    let owner = |v: usize| -> u16 {
        let mask = replicas[v];
        let h = key(&[seed, 0x0C0E, v as u64]);
        if mask == 0 {
            return (h % parts as u64) as u16;
        }
        // The k-th set bit, k drawn from the node's hash.
        let mut k = h % u64::from(mask.count_ones());
        let mut m = mask;
        loop {
            let p = m.trailing_zeros();
            if k == 0 {
                return p as u16;
            }
            k -= 1;
            m &= m - 1;
        }
    };
    let types = s.base.len() - 1;
    Ok((0..types)
        .map(|t| {
            (s.base[t]..s.base[t + 1])
                .map(|v| owner(v as usize))
                .collect()
        })
        .collect())
}
