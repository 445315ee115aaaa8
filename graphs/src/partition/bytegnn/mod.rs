//! ByteGNN's GNN-aware block partitioning (ByteGNN §4.2.3, Algorithm 2).
//!
//! Mini-batch training reads only the K-hop in-neighbourhoods of the
//! labelled nodes, so the partitions are built from those neighbourhoods
//! rather than from all of the graph's edges:
//!
//! 1. **Blocks.** A multi-source BFS starts from every labelled node (a
//!    train, valid or test node of the target type; the *centres*) at once
//!    and walks `hops` levels in the sampler's direction: from a node to its
//!    in-neighbours over every relation into its type, and, with `reverse`
//!    (training's default `reverse_edges = true`), over the reverse of every
//!    relation out of it too, as the `rev_` relations added at load would.
//!    A node joins the block that reaches it first; centres keep their own
//!    block. When several blocks reach a node at the same level, it joins
//!    the one with the smallest seeded hash of (block, node), so that
//!    high-degree nodes are not all claimed by the lowest centre ids.
//! 2. **Clusters** (an addition, `clusters > 0`). Size-constrained label
//!    propagation groups neighbouring blocks: in block order, each block
//!    joins the cluster it shares the most edges with, as long as that
//!    cluster stays within `1 / (clusters × parts)` of the blocks and of
//!    their nodes (at most 8 sweeps, fewer once one moves under 1% of the
//!    blocks). Placing clusters keeps neighbouring
//!    blocks together, which a greedy over tiny blocks does not (below).
//! 3. **Placement** (Algorithm 2, fixed as below). The groups (clusters, or
//!    blocks when `clusters = 0`) go, in order, to the partition with the
//!    highest `CE[j] × BS[j]`: `CE[j]` the edges (of every stored relation,
//!    in either direction) between the group and the nodes partition `j`
//!    holds, `BS[j]` how much room `j` has left. A cluster no partition has
//!    room for is placed block by block.
//!    With `place = metis` (an addition, the default), METIS places the
//!    blocks instead: see `quotient.rs`.
//! 4. **Refinement** (an addition, `passes` sweeps, each ending the
//!    refinement early once nothing moves): every block in turn, in block
//!    order, leaves its partition and goes to the one it shares the most
//!    edges with among those with room (ties: back where it was).
//! 5. **The rest** (an addition). Nodes no BFS reached (unlabelled and more
//!    than `hops` away, or reachable only against the sampler's direction)
//!    are placed in BFS order outward from the placed ones: each goes to the
//!    partition holding most of its placed neighbours among those holding
//!    fewer than the cap of its type (below), ties to the one holding fewest
//!    of its type, then the lowest index; a component with nothing placed
//!    starts on the partition holding the fewest of its first node's type.
//! 6. **Node refinement** (an addition, up to `passes` sweeps, ending early
//!    once nothing moves): every node in turn, in type then id order, goes
//!    to the partition holding most of its neighbours when that is strictly
//!    more than its own holds and the destination stays within the caps of
//!    its type and of its splits (and of the sampler's in-edges with
//!    `type_weight > 0`); ties to the partition holding fewest of its type,
//!    then the lowest index. Each move lowers the edge cut.
//! 7. **Following the samples** (an addition, up to `passes` rounds, ending
//!    early once nothing moves; off with every `seed_weights` at 0): what a
//!    trainer pulls is the part of its seeds' *sampled* neighbourhoods
//!    other partitions hold, which the cut only approximates. Each round
//!    moves every node that is not a seed to the partition whose seeds
//!    read it most (in expected reads under `fanouts`, seeds weighted by
//!    split), then every seed to the partition holding most of what it
//!    reads, within the caps: see `sampled.rs`.
//!
//! The paper's Algorithm 2 does not work as written; the fixes chosen here:
//! - **`CE[j] / |P_j|` divides by zero** while partition `j` is empty (the
//!   first `k` blocks), and once it is not, it prefers a small partition
//!   sharing one edge with the block over a large one sharing many.
//!   `CE[j]` is used raw, and the balance is left to `BS[j]` and the caps.
//!   When no partition shares an edge with the group (the first one, one in
//!   a component of its own), every score is 0 and the group goes to the
//!   partition with the most room, then the lowest index, so such groups
//!   spread instead of piling onto partition 0.
//! - **`BS[j] = 1 − α·train/C − β·val/C − γ·test/C` turns negative** once
//!   partition `j` passes the mean (α + β + γ = 1), and then more shared
//!   edges *lower* the score. Here `BS[j] = max(0, 1 − b · fill_j / 1.05)`,
//!   `fill_j` being partition `j`'s weighted fill after taking the group
//!   (1.0 = the mean) and `b` the `balance_weight` (1: the paper's
//!   strength), so it is positive up to 5% over the mean; and each split is
//!   also a hard cap: a partition takes a group only while its train, valid
//!   and test counts stay within `max(⌈C⌉, ⌊1.05 · C⌋)` (`C`: the split's
//!   mean per partition). A block holds exactly one labelled node, so some
//!   partition always has room for a block and the splits end balanced
//!   within 1.05 (within one node of the mean where `C` is tiny). α, β and
//!   γ are the splits' shares of the labelled nodes, weights "according to
//!   the scale" as the paper suggests; the labelled part of `fill_j` is then
//!   simply the partition's share of all labelled nodes.
//! - **The sort key `max(|train|, |val|, |test|)` is always 1** for a block:
//!   a block holds one labelled node, its centre. Blocks are ordered by
//!   size instead (nodes plus the sampler's in-edges at them), largest
//!   first as the paper intends, ties by a seeded hash of the centre, then
//!   its id. The paper's key is kept for clusters, where it means
//!   something: the most labelled nodes of one split first, then the most
//!   nodes, then the first block's place in block order.
//!
//! Heterogeneous graphs (optional): with `type_weight = w > 0`, `fill_j` is
//! `(1 − w)` × the labelled fill plus `w` × the mean fill over the nodes of
//! every type and the sampler's in-edges, and these terms are caps too
//! (`max(⌈mean⌉, ⌊1.05 · mean⌋)`): a group goes where they hold if any
//! partition can take it, else where they are exceeded least. Blocks heavy
//! in one type (a hub's) then spread. The caps of step 5 are these caps of
//! each node type, whatever `w`.
//!
//! `within = (owners, k)` runs the same algorithm on partition `k`'s nodes
//! alone (BFS, edges, counts and caps restricted to them); the other nodes
//! get 0.
//!
//! Deterministic: one thread, and every order fixed (centre ids, the block
//! order, seeded hashes), so the same graph, options and seed give the same
//! owners on any machine with any number of threads. Memory beside the
//! graph, whose CSR is only read, is METIS's over the block graph (a
//! vertex per labelled node) with the default placement; with the greedy
//! one it is O(nodes + blocks + parts): per node a block id and an owner
//! (and a BFS level while blocks grow, at most 52 bytes during step 7), per
//! reached node its place in its block's member list, per block its order
//! and cluster. Time: a few sweeps over the edges (the BFS, each
//! clustering sweep, the placement, each refinement pass), plus `parts`
//! per group placed, plus `parts × hops` sweeps per round of step 7.

mod blocks;
mod nodes;
mod place;
mod quotient;
mod sampled;

use super::{NodePartitioner, MAX_PARTS};
use crate::error::{GraphError, Result};
use crate::graph::HetGraph;

use blocks::State;

/// ByteGNN's block partitioner and its options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ByteGnn {
    /// Levels of the BFS that grows the blocks: the model's depth (default 2).
    pub hops: usize,
    /// Walk every relation backwards too, as the sampler does once `rev_`
    /// relations are added at load (training's `reverse_edges`; default true).
    pub reverse: bool,
    /// Weight in `0..=1` of the per-type node and edge terms of the balance
    /// score, which also become caps (default 0: the train/valid/test terms
    /// alone, as in the paper).
    pub type_weight: f64,
    /// Strength in `0..=1` of the balance score `BS` (default 1: it reaches
    /// 0 at 1.05 × the mean, the paper's strength; lower values leave the
    /// balance to the caps and weigh cross edges more; 0: cross edges only).
    pub balance_weight: f64,
    /// Clusters per partition-worth of blocks (default 32; 0: place blocks
    /// one by one, as the paper does).
    pub clusters: usize,
    /// Refinement sweeps over the blocks after placement, and then over the
    /// nodes once every node is placed (default 10 each; 0: none, as in the
    /// paper); each refinement stops once a sweep moves nothing.
    pub passes: usize,
    /// How step 3 places the blocks (default: METIS over the block graph;
    /// greedily, as in the paper, in less memory).
    pub place: Placement,
    /// The sampler's fanouts per hop, seeds outward, for step 7 (default:
    /// training's 25, 20; hops past the list take its last).
    pub fanouts: Fanouts,
    /// Weights of train, valid and test nodes as seeds in step 7 (default
    /// 1, 0.1, 0.1: training reads the train split every epoch; all 0: no
    /// step 7, as in the paper).
    pub seed_weights: [f64; 3],
}

/// Per-hop fanouts, seeds outward (at most [`Fanouts::MAX`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fanouts {
    len: u8,
    per_hop: [u32; Fanouts::MAX],
}

impl Fanouts {
    /// Most hops listed.
    pub const MAX: usize = 8;
    /// Training's default fanouts: 25, then 20.
    pub const TRAINING: Fanouts = Fanouts {
        len: 2,
        per_hop: [25, 20, 0, 0, 0, 0, 0, 0],
    };

    /// Fanouts from a list of 1 to [`Fanouts::MAX`] positive values.
    pub fn new(list: &[usize]) -> Result<Fanouts> {
        if list.is_empty()
            || list.len() > Fanouts::MAX
            || list.iter().any(|&f| f == 0 || u32::try_from(f).is_err())
        {
            return Err(GraphError::InvalidArgument(format!(
                "bytegnn: fanouts must be 1 to {} positive values, got {list:?}",
                Fanouts::MAX
            )));
        }
        let mut per_hop = [0u32; Fanouts::MAX];
        list.iter()
            .zip(&mut per_hop)
            .for_each(|(&f, slot)| *slot = f as u32);
        Ok(Fanouts {
            len: list.len() as u8,
            per_hop,
        })
    }

    /// The fanout of hop `h` (0: the seeds' own picks); the last one past the list.
    pub fn at(&self, h: usize) -> u32 {
        self.per_hop[h.min(self.len as usize - 1)]
    }
}

/// How the blocks are placed (step 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Algorithm 2 (fixed), over clusters of blocks when `clusters > 0`.
    Greedy,
    /// METIS over the block graph (blocks as vertices, the edges between
    /// them as weights; one constraint per split and one for the nodes).
    #[default]
    Metis,
}

impl std::str::FromStr for Placement {
    type Err = GraphError;

    fn from_str(s: &str) -> Result<Placement> {
        match s {
            "greedy" => Ok(Placement::Greedy),
            "metis" => Ok(Placement::Metis),
            other => Err(GraphError::InvalidArgument(format!(
                "bytegnn: placement '{other}' is not greedy or metis"
            ))),
        }
    }
}

impl ByteGnn {
    /// The defaults (see the fields).
    pub const DEFAULT: ByteGnn = ByteGnn {
        hops: 2,
        reverse: true,
        type_weight: 0.0,
        balance_weight: 1.0,
        clusters: 32,
        passes: 10,
        place: Placement::Metis,
        fanouts: Fanouts::TRAINING,
        seed_weights: [1.0, 0.1, 0.1],
    };

    /// The paper's Algorithm 2 with only the fixes it needs (greedy
    /// placement, no clusters, no refinement, no step 7), `hops` and
    /// `reverse` as given.
    pub fn paper(hops: usize, reverse: bool) -> ByteGnn {
        ByteGnn {
            hops,
            reverse,
            clusters: 0,
            passes: 0,
            place: Placement::Greedy,
            seed_weights: [0.0; 3],
            ..ByteGnn::DEFAULT
        }
    }

    /// Checks the options.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.type_weight) {
            return Err(GraphError::InvalidArgument(format!(
                "bytegnn: the type weight must be in 0..=1, got {}",
                self.type_weight
            )));
        }
        if !(0.0..=1.0).contains(&self.balance_weight) {
            return Err(GraphError::InvalidArgument(format!(
                "bytegnn: the balance weight must be in 0..=1, got {}",
                self.balance_weight
            )));
        }
        if self.hops > MAX_HOPS {
            return Err(GraphError::InvalidArgument(format!(
                "bytegnn: {} hops is more than any model's depth (at most {MAX_HOPS})",
                self.hops
            )));
        }
        if self
            .seed_weights
            .iter()
            .any(|w| !(w.is_finite() && *w >= 0.0))
        {
            return Err(GraphError::InvalidArgument(format!(
                "bytegnn: the seed weights must be finite and at least 0, got {:?}",
                self.seed_weights
            )));
        }
        if self.clusters > MAX_PARTS {
            return Err(GraphError::InvalidArgument(format!(
                "bytegnn: at most {MAX_PARTS} clusters per partition, got {}",
                self.clusters
            )));
        }
        Ok(())
    }
}

/// Most BFS levels (a BFS level is kept in a byte per node).
pub const MAX_HOPS: usize = 64;

impl Default for ByteGnn {
    fn default() -> Self {
        ByteGnn::DEFAULT
    }
}

impl NodePartitioner for ByteGnn {
    fn name(&self) -> &'static str {
        "bytegnn"
    }

    /// Nodes outside `within` get sub-partition 0.
    fn assign(
        &self,
        g: &HetGraph,
        parts: usize,
        seed: u64,
        within: Option<(&[Vec<u16>], u16)>,
    ) -> Result<Vec<Vec<u16>>> {
        self.validate()?;
        if parts == 0 || parts > MAX_PARTS {
            return Err(GraphError::InvalidArgument(format!(
                "bytegnn: parts must be in 1..={MAX_PARTS}, got {parts}"
            )));
        }
        if let Some((owners, _)) = within {
            if owners.len() != g.node_types().len()
                || owners
                    .iter()
                    .zip(g.node_types())
                    .any(|(o, t)| o.len() != t.count as usize)
            {
                return Err(GraphError::InvalidArgument("bytegnn: the first level's owners do not match the graph's node types and counts".into()));
            }
        }
        let mut state = State::new(self, g, parts, within)?;
        if parts == 1 {
            return Ok(g
                .node_types()
                .iter()
                .map(|t| vec![0; t.count as usize])
                .collect());
        }
        state.grow_blocks(seed);
        let order = state.block_order(seed);
        if self.place == Placement::Greedy || !state.place_metis(seed)? {
            let groups = if self.clusters > 0 {
                state.clusters(&order)
            } else {
                order.iter().map(|&b| vec![b]).collect()
            };
            state.place(&groups);
        }
        for _ in 0..self.passes {
            if state.refine(&order) == 0 {
                break;
            }
        }
        state.place_rest();
        for _ in 0..self.passes {
            if state.refine_nodes() == 0 {
                break;
            }
        }
        if self.seed_weights.iter().any(|&w| w > 0.0) {
            for _ in 0..self.passes {
                if state.follow_samples() == 0 {
                    break;
                }
            }
        }
        Ok(state.into_owners())
    }
}

#[cfg(test)]
mod tests;
