//! The figures every partitioner reports, whatever its kind, so partitions
//! made by different methods compare line by line: edge cut, replication,
//! nodes held per partition, balance per node type, time and peak memory.
//! `hetgnn partition` writes it as `report.json` beside the manifest.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::meta::MetaManifest;
use super::Manifest;
use crate::error::{GraphError, Result};

/// File name of the report in a partition directory.
pub const REPORT: &str = "report.json";

/// Largest report read back (thousands of partitions fit well within it).
const MAX_REPORT: u64 = 64 << 20;

/// What a partitioning came to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PartitionReport {
    /// The method (`metis`, `random`, `meta`).
    pub method: String,
    /// `node-assigning` or `relation-assigning`.
    pub kind: String,
    /// Number of partitions.
    pub parts: usize,
    /// Edges whose two ends live in different partitions (0 for relation
    /// assignment: a relation's edges stay whole where it is placed).
    pub edge_cut: u64,
    /// All edges (original relations).
    pub total_edges: u64,
    /// Node copies held over all partitions, per node of the graph (1.0: none
    /// held twice). Halo nodes count as copies.
    pub replication_factor: f64,
    /// The replication factor of each node type's nodes alone.
    #[serde(default)]
    pub replication_by_type: BTreeMap<String, f64>,
    /// Per partition, nodes whose results or features other partitions need
    /// (halo nodes; for relation assignment, the target nodes it shares).
    pub boundary_nodes: Vec<u64>,
    /// Per partition, the nodes it holds (owned plus halo), by type.
    pub nodes: Vec<BTreeMap<String, u64>>,
    /// Per partition, the edges it holds.
    pub edges: Vec<u64>,
    /// Largest over mean across partitions (1.0: perfectly balanced) of the
    /// nodes of each type (owned ones, where nodes have owners), and of
    /// `edges`.
    pub balance: BTreeMap<String, f64>,
    /// Largest over mean across partitions of the target type's owned
    /// `train`, `valid` and `test` nodes (node-assigning partitions only:
    /// relation-assigning ones hold every target node; empty in reports
    /// written before it was recorded).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub split_balance: BTreeMap<String, f64>,
    /// Wall seconds, loading the graph included.
    pub seconds: f64,
    /// Peak resident memory of the partitioning process (the high-water
    /// mark: memory-mapped file pages read count too).
    pub peak_memory_bytes: Option<u64>,
    /// Peak anonymous resident memory (heap and stacks, no file pages), sampled.
    #[serde(default)]
    pub peak_anon_bytes: Option<u64>,
}

/// Largest over mean of `v` (1.0 when empty or all zero).
fn max_over_mean(v: &[u64]) -> f64 {
    let total: u64 = v.iter().sum();
    if total == 0 {
        return 1.0;
    }
    *v.iter().max().unwrap_or(&0) as f64 * v.len() as f64 / total as f64
}

impl PartitionReport {
    /// The report of a node-assigning partitioning (`counts`: nodes per type of the graph).
    pub fn of_nodes(m: &Manifest, counts: &[u64]) -> PartitionReport {
        let total_nodes: u64 = counts.iter().sum();
        let held: u64 = m
            .info
            .iter()
            .map(|p| p.core.iter().sum::<u64>() + p.halo.iter().sum::<u64>())
            .sum();
        let mut balance: BTreeMap<String, f64> = m
            .node_types
            .iter()
            .enumerate()
            .map(|(t, name)| {
                (
                    name.clone(),
                    m.balance(|p| p.core.get(t).copied().unwrap_or(0)),
                )
            })
            .collect();
        balance.insert("edges".into(), m.balance(|p| p.edges));
        let replication_by_type = m
            .node_types
            .iter()
            .enumerate()
            .map(|(t, name)| {
                let held: u64 = m
                    .info
                    .iter()
                    .map(|p| {
                        p.core.get(t).copied().unwrap_or(0) + p.halo.get(t).copied().unwrap_or(0)
                    })
                    .sum();
                (
                    name.clone(),
                    held as f64 / counts.get(t).copied().unwrap_or(0).max(1) as f64,
                )
            })
            .collect();
        PartitionReport {
            method: m.method.to_string(),
            kind: "node-assigning".into(),
            parts: m.parts,
            edge_cut: m.edge_cut,
            total_edges: m.total_edges,
            replication_factor: held as f64 / total_nodes.max(1) as f64,
            replication_by_type,
            boundary_nodes: m.info.iter().map(|p| p.halo.iter().sum()).collect(),
            nodes: m
                .info
                .iter()
                .map(|p| {
                    m.node_types
                        .iter()
                        .enumerate()
                        .map(|(t, name)| {
                            (
                                name.clone(),
                                p.core.get(t).copied().unwrap_or(0)
                                    + p.halo.get(t).copied().unwrap_or(0),
                            )
                        })
                        .collect()
                })
                .collect(),
            edges: m.info.iter().map(|p| p.edges).collect(),
            balance,
            split_balance: ["train", "valid", "test"]
                .iter()
                .enumerate()
                .map(|(s, name)| (name.to_string(), m.balance(|p| p.splits[s])))
                .collect(),
            seconds: 0.0,
            peak_memory_bytes: None,
            peak_anon_bytes: None,
        }
    }

    /// The report of a relation-assigning partitioning (`counts`: nodes per
    /// type name; `total_edges`: edges of the relations it could place).
    pub fn of_relations(
        m: &MetaManifest,
        counts: &BTreeMap<String, u64>,
        total_edges: u64,
    ) -> PartitionReport {
        let total_nodes: u64 = counts.values().sum();
        let held: u64 = m.info.iter().map(|p| p.nodes.values().sum::<u64>()).sum();
        let edges: Vec<u64> = m.info.iter().map(|p| p.edges.values().sum()).collect();
        let mut balance: BTreeMap<String, f64> = counts
            .keys()
            .map(|name| {
                (
                    name.clone(),
                    max_over_mean(
                        &m.info
                            .iter()
                            .map(|p| p.nodes.get(name).copied().unwrap_or(0))
                            .collect::<Vec<_>>(),
                    ),
                )
            })
            .collect();
        balance.insert("edges".into(), max_over_mean(&edges));
        PartitionReport {
            method: m.method.clone(),
            kind: "relation-assigning".into(),
            parts: m.parts,
            edge_cut: 0,
            total_edges,
            replication_factor: held as f64 / total_nodes.max(1) as f64,
            replication_by_type: counts
                .iter()
                .map(|(name, &c)| {
                    (
                        name.clone(),
                        m.info
                            .iter()
                            .map(|p| p.nodes.get(name).copied().unwrap_or(0))
                            .sum::<u64>() as f64
                            / c.max(1) as f64,
                    )
                })
                .collect(),
            boundary_nodes: m.info.iter().map(|p| p.boundary_nodes).collect(),
            nodes: m.info.iter().map(|p| p.nodes.clone()).collect(),
            edges,
            balance,
            split_balance: BTreeMap::new(),
            seconds: 0.0,
            peak_memory_bytes: None,
            peak_anon_bytes: None,
        }
    }

    /// Writes the report into partition directory `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(REPORT);
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| GraphError::data(&path, e.to_string()))?;
        crate::atomic::write(&path, text + "\n")
    }

    /// Reads the report of partition directory `dir`.
    pub fn read(dir: &Path) -> Result<PartitionReport> {
        let path = dir.join(REPORT);
        let meta = std::fs::metadata(&path).map_err(|e| GraphError::io(&path, e))?;
        if !meta.is_file() || meta.len() > MAX_REPORT {
            return Err(GraphError::data(
                &path,
                format!("not a report: a regular file of at most {MAX_REPORT} bytes is expected"),
            ));
        }
        let text = crate::input::read_text(&path)?;
        serde_json::from_str(&text).map_err(|e| GraphError::data(&path, e.to_string()))
    }
}
