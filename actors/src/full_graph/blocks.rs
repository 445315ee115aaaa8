//! What a full-graph worker computes at each layer, as a pure function of
//! the graph's relations, the owners and the worker: the rows of every node
//! type it owns (its block of rows), and per layer one [`Block`] whose
//! destinations are its own rows of the types that layer computes and whose
//! sources are, per type, its own rows followed by every other worker's
//! block in partition order (worker-major), so that the input of a layer is
//! the concatenation of the blocks as they were broadcast, and the sampled
//! path's layers run on it unchanged (a full neighbourhood is a fanout that
//! takes every neighbour).

use graphs::{Block, BlockRelation, HetGraph, RelationId};

use crate::error::{Result, TrainError};

/// Who holds which rows.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Per partition, per type: the ids it owns, ascending.
    pub rows: Vec<Vec<Vec<u32>>>,
    /// Per type, per node: its position in its owner's block.
    pos: Vec<Vec<u32>>,
    /// Per type, per node: its owner.
    owner: Vec<Vec<u16>>,
}

impl Layout {
    /// The layout of `owners` (per type, per node) over `parts` partitions.
    pub fn new(owners: &[Vec<u16>], parts: u32) -> Result<Layout> {
        let mut rows = vec![vec![Vec::new(); owners.len()]; parts as usize];
        let mut pos = Vec::with_capacity(owners.len());
        for (t, o) in owners.iter().enumerate() {
            let mut at = Vec::with_capacity(o.len());
            for (v, &p) in o.iter().enumerate() {
                let block = rows.get_mut(p as usize).ok_or_else(|| TrainError::Config(format!("node {v} of type {t} is owned by partition {p}, beyond the {parts} partitions")))?;
                at.push(block[t].len() as u32);
                block[t].push(v as u32);
            }
            pos.push(at);
        }
        Ok(Layout {
            rows,
            pos,
            owner: owners.to_vec(),
        })
    }

    /// Partitions.
    pub fn parts(&self) -> u32 {
        self.rows.len() as u32
    }

    /// Rows of type `t` partition `p` owns.
    pub fn count(&self, p: u32, t: usize) -> usize {
        self.rows[p as usize][t].len()
    }

    /// Owner and position in its owner's block of node `v` of type `t`.
    pub fn locate(&self, t: usize, v: u32) -> Option<(u32, u32)> {
        Some((
            u32::from(*self.owner.get(t)?.get(v as usize)?),
            self.pos[t][v as usize],
        ))
    }

    /// The order of the blocks in worker `me`'s sources: its own, then the others by partition.
    pub fn order(&self, me: u32) -> Vec<u32> {
        std::iter::once(me)
            .chain((0..self.parts()).filter(|&q| q != me))
            .collect()
    }
}

/// One layer of a worker's computation.
#[derive(Clone, Debug)]
pub struct LayerPlan {
    /// Destinations: the worker's rows of the types the layer computes;
    /// sources: its own rows then (for [`LayerPlan::shared`] types) every
    /// other worker's block.
    pub block: Block,
    /// Per type: whether every worker's rows of it feed this layer (it is the
    /// source of a relation into a type the layer computes), so that its
    /// blocks are broadcast.
    pub shared: Vec<bool>,
    /// Per type: whether the layer reads its rows at all.
    pub read: Vec<bool>,
    /// Per type, per partition: the range of that partition's rows in `block.src`.
    pub spans: Vec<Vec<std::ops::Range<usize>>>,
}

/// The plans of a `layers`-deep model on worker `me`, whose own rows' full
/// in-neighbourhoods `g` holds; the last layer computes the target type.
pub fn plans(g: &HetGraph, layout: &Layout, me: u32, layers: usize) -> Result<Vec<LayerPlan>> {
    let types = g.node_types().len();
    let rels = g.relations();
    // The types each layer computes, from the last layer down.
    let mut computes = vec![vec![false; types]; layers];
    let mut want = vec![false; types];
    want[g.target().index()] = true;
    for l in (0..layers).rev() {
        computes[l] = want.clone();
        let mut below = want.clone();
        for r in rels.iter().filter(|r| want[r.dst.index()]) {
            below[r.src.index()] = true;
        }
        want = below;
    }
    let order = layout.order(me);
    let mut out = Vec::with_capacity(layers);
    for (l, dst_types) in computes.iter().enumerate() {
        let mut shared = vec![false; types];
        for r in rels.iter().filter(|r| dst_types[r.dst.index()]) {
            shared[r.src.index()] = true;
        }
        let read: Vec<bool> = (0..types).map(|t| shared[t] || dst_types[t]).collect();
        let mut src = vec![Vec::new(); types];
        let mut spans = vec![vec![0..0; layout.parts() as usize]; types];
        for t in (0..types).filter(|&t| read[t]) {
            for &q in order.iter().filter(|&&q| q == me || shared[t]) {
                let start = src[t].len();
                src[t].extend_from_slice(&layout.rows[q as usize][t]);
                spans[t][q as usize] = start..src[t].len();
            }
        }
        let dst: Vec<Vec<u32>> = (0..types)
            .map(|t| {
                if dst_types[t] {
                    layout.rows[me as usize][t].clone()
                } else {
                    Vec::new()
                }
            })
            .collect();
        let mut relations = Vec::new();
        for (ri, r) in rels
            .iter()
            .enumerate()
            .filter(|(_, r)| dst_types[r.dst.index()])
        {
            let (s, d) = (r.src.index(), r.dst.index());
            let mut offsets = Vec::with_capacity(dst[d].len() + 1);
            offsets.push(0u32);
            let mut sources = Vec::new();
            for &v in &dst[d] {
                for &u in r.in_csr().neighbors(v) {
                    let (q, at) = layout.locate(s, u).ok_or_else(|| {
                        TrainError::Config(format!(
                            "relation {} reaches node {u} of type {s}, which has no owner",
                            r.canonical()
                        ))
                    })?;
                    sources.push((spans[s][q as usize].start + at as usize) as u32);
                }
                offsets.push(sources.len() as u32);
            }
            relations.push(BlockRelation {
                relation: RelationId(ri as u32),
                offsets,
                sources,
            });
        }
        out.push(LayerPlan {
            block: Block {
                layer: l,
                dst,
                src,
                relations,
            },
            shared,
            read,
            spans,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphs::{Features, GraphBuilder, Splits};

    fn graph() -> HetGraph {
        let (p, a, s) = (30u32, 11u32, 5u32);
        let cites_src: Vec<u32> = (0..90).map(|i| (i * 7) % p).collect();
        let cites_dst: Vec<u32> = (0..90).map(|i| (i * 11 + 3) % p).collect();
        let writes_src: Vec<u32> = (0..45).map(|i| i % a).collect();
        let writes_dst: Vec<u32> = (0..45).map(|i| (i * 5) % p).collect();
        let about_src: Vec<u32> = (0..p).collect();
        let about_dst: Vec<u32> = (0..p).map(|i| i % s).collect();
        GraphBuilder::new("g", "paper", 2)
            .node_type(
                "paper",
                p,
                Some(Features::from_vec(p as usize, 1, vec![0.0; p as usize])),
            )
            .node_type("author", a, None)
            .node_type("subject", s, None)
            .labels(
                (0..p).map(|i| i64::from(i % 2)).collect(),
                Splits {
                    train: (0..20).collect(),
                    valid: vec![],
                    test: vec![],
                },
            )
            .relation("paper", "cites", "paper", cites_src, cites_dst)
            .relation("author", "writes", "paper", writes_src, writes_dst)
            .relation("paper", "about", "subject", about_src, about_dst)
            .build()
            .unwrap()
    }

    fn owners(g: &HetGraph, parts: u16) -> Vec<Vec<u16>> {
        g.node_types()
            .iter()
            .map(|nt| {
                (0..nt.count)
                    .map(|v| ((v * 7 + 3) % u32::from(parts)) as u16)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_destination_reads_its_whole_in_neighbourhood_in_csr_order() {
        let g = graph();
        for parts in [1u16, 2, 3] {
            let layout = Layout::new(&owners(&g, parts), u32::from(parts)).unwrap();
            let mut computed = vec![vec![0usize; 3]; 2];
            for me in 0..u32::from(parts) {
                let ps = plans(&g, &layout, me, 2).unwrap();
                for (l, p) in ps.iter().enumerate() {
                    for (t, ids) in p.block.dst.iter().enumerate() {
                        // Sources start with the destinations (the self-loop reads them there).
                        assert_eq!(&p.block.src[t][..ids.len()], &ids[..]);
                        computed[l][t] += ids.len();
                    }
                    for br in &p.block.relations {
                        let r = g.relation(br.relation);
                        for (i, &v) in p.block.dst[r.dst.index()].iter().enumerate() {
                            let got: Vec<u32> = br.sources
                                [br.offsets[i] as usize..br.offsets[i + 1] as usize]
                                .iter()
                                .map(|&k| p.block.src[r.src.index()][k as usize])
                                .collect();
                            assert_eq!(
                                got,
                                r.in_csr().neighbors(v),
                                "layer {l}, {} into {v}",
                                r.canonical()
                            );
                        }
                    }
                    for (t, spans) in p.spans.iter().enumerate() {
                        for (q, span) in spans.iter().enumerate() {
                            if !span.is_empty() {
                                assert_eq!(&p.block.src[t][span.clone()], &layout.rows[q][t][..]);
                            }
                        }
                    }
                }
            }
            // Layer 1 computes every paper (the target); layer 0 every paper and author (its sources), no subject.
            assert_eq!(computed[1], vec![30, 0, 0], "{parts} parts");
            assert_eq!(computed[0], vec![30, 11, 0], "{parts} parts");
        }
    }

    #[test]
    fn only_relation_sources_are_shared() {
        let g = graph();
        let layout = Layout::new(&owners(&g, 2), 2).unwrap();
        let ps = plans(&g, &layout, 1, 2).unwrap();
        // Into papers: cites (paper), writes (author); subjects feed nothing the target needs.
        assert_eq!(ps[1].shared, vec![true, true, false]);
        assert_eq!(ps[0].shared, vec![true, true, false]);
        assert_eq!(ps[0].read, vec![true, true, false]);
        // Worker 1's own rows come first.
        assert_eq!(ps[1].spans[0][1].start, 0);
        assert_eq!(ps[1].spans[0][0].start, layout.count(1, 0));
        assert!(
            Layout::new(&[vec![0, 3]], 2).is_err(),
            "an owner beyond the partitions"
        );
    }
}
