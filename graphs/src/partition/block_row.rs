//! Block-row partitions for full-graph training (SANCUS): the rows of every
//! node type cut into `parts` contiguous ranges of an order, as equal as
//! counts allow (sizes differ by at most one), so every worker computes the
//! same number of rows of each type per layer. The order is METIS's
//! (`block-row`: nodes sorted by their METIS part, then id, so that a block
//! is a METIS part rebalanced to the exact share) or a seeded shuffle
//! (`block-row-random`). Blocks are contiguous in that order; the
//! partition files keep global ids, so a worker's block is the ascending
//! list of the ids it owns.

use super::NodePartitioner;
use crate::error::Result;
use crate::graph::HetGraph;
use crate::rng::key;

/// The order whose ranges become the blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Nodes sorted by METIS part, then id.
    Metis,
    /// A seeded shuffle of each type's nodes.
    Random,
}

/// Block-row partitioning in an [`Order`].
pub struct BlockRow(pub Order);

impl NodePartitioner for BlockRow {
    fn name(&self) -> &'static str {
        match self.0 {
            Order::Metis => "block-row",
            Order::Random => "block-row-random",
        }
    }

    /// Only `within`'s nodes are cut (into `parts` blocks); the others get 0.
    fn assign(
        &self,
        g: &HetGraph,
        parts: usize,
        seed: u64,
        within: Option<(&[Vec<u16>], u16)>,
    ) -> Result<Vec<Vec<u16>>> {
        let metis = match self.0 {
            Order::Metis => Some(super::metis::Metis.assign(g, parts, seed, within)?),
            Order::Random => None,
        };
        let mut owners = Vec::with_capacity(g.node_types().len());
        for (t, nt) in g.node_types().iter().enumerate() {
            let mut order: Vec<u32> = (0..nt.count)
                .filter(|&v| within.is_none_or(|(o, k)| o[t][v as usize] == k))
                .collect();
            match &metis {
                Some(m) => order.sort_by_key(|&v| (m[t][v as usize], v)),
                None => order.sort_by_key(|&v| (key(&[seed, 0xB10C, t as u64, u64::from(v)]), v)),
            }
            owners.push(blocks(nt.count as usize, &order, parts));
        }
        Ok(owners)
    }
}

/// Owner of every node of a type with `count` nodes: position `i` of `order`
/// goes to block `i * parts / order.len()` (sizes differ by at most one).
fn blocks(count: usize, order: &[u32], parts: usize) -> Vec<u16> {
    let mut owner = vec![0u16; count];
    let n = order.len().max(1);
    for (i, &v) in order.iter().enumerate() {
        owner[v as usize] = (i * parts / n) as u16;
    }
    owner
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Features, GraphBuilder, Splits};

    fn graph() -> HetGraph {
        let (p, a) = (40u32, 13u32);
        let cites_src: Vec<u32> = (0..120).map(|i| (i * 7) % p).collect();
        let cites_dst: Vec<u32> = (0..120).map(|i| (i * 11 + 3) % p).collect();
        let writes_src: Vec<u32> = (0..60).map(|i| i % a).collect();
        let writes_dst: Vec<u32> = (0..60).map(|i| (i * 5) % p).collect();
        GraphBuilder::new("g", "paper", 2)
            .node_type(
                "paper",
                p,
                Some(Features::from_vec(p as usize, 1, vec![0.0; p as usize])),
            )
            .node_type("author", a, None)
            .labels(
                (0..p).map(|i| i64::from(i % 2)).collect(),
                Splits {
                    train: (0..20).collect(),
                    valid: (20..30).collect(),
                    test: (30..40).collect(),
                },
            )
            .relation("paper", "cites", "paper", cites_src, cites_dst)
            .relation("author", "writes", "paper", writes_src, writes_dst)
            .build()
            .unwrap()
    }

    #[test]
    fn blocks_are_equal_to_one_row_for_every_type_and_order() {
        let g = graph();
        for order in [Order::Metis, Order::Random] {
            for parts in [1usize, 2, 3, 4] {
                let owners = BlockRow(order).assign(&g, parts, 7, None).unwrap();
                for (t, nt) in g.node_types().iter().enumerate() {
                    let mut sizes = vec![0usize; parts];
                    owners[t].iter().for_each(|&o| sizes[o as usize] += 1);
                    let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                    assert!(
                        hi - lo <= 1,
                        "{order:?} {parts} parts, type {}: sizes {sizes:?}",
                        nt.name
                    );
                    assert_eq!(sizes.iter().sum::<usize>(), nt.count as usize);
                }
            }
        }
    }

    #[test]
    fn the_metis_order_keeps_metis_parts_together_and_random_is_seeded() {
        let g = graph();
        let m = super::super::metis::Metis.assign(&g, 2, 3, None).unwrap();
        let b = BlockRow(Order::Metis).assign(&g, 2, 3, None).unwrap();
        // A block is a METIS part moved by at most the rebalancing: most nodes keep their part.
        let kept = m[0].iter().zip(&b[0]).filter(|(x, y)| x == y).count();
        let moved = m[0].iter().filter(|&&x| x == 0).count().abs_diff(20);
        assert_eq!(
            kept,
            40 - moved,
            "only the surplus of the larger METIS part moves"
        );
        let r1 = BlockRow(Order::Random).assign(&g, 3, 1, None).unwrap();
        assert_eq!(r1, BlockRow(Order::Random).assign(&g, 3, 1, None).unwrap());
        assert_ne!(r1, BlockRow(Order::Random).assign(&g, 3, 2, None).unwrap());
    }
}
