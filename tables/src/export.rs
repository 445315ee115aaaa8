//! `export tables`: a graph directory written as node and edge tables with
//! string ids (`<type>-<n>`), with the `graph.toml` that imports them back
//! into the same graph. Gives users a worked sample of the table layout, and
//! the tests and benchmarks their round trips.

use std::path::{Path, PathBuf};

use graphs::format::{paths, AtomicDir};
use graphs::npy::{DType, NpyFile};
use graphs::{Progress, Schema};

use crate::config::{
    EdgeSplit, EdgeTable, FeatureSpec, FileFormat, LabelSetSpec, LabelSpec, NodeTable, SplitSpec,
    TablesConfig, Transform, UnknownIds, ValueSpec,
};
use crate::error::{Result, TableError};
use crate::labels::{read_labels, split_name};
use crate::source::CHUNK_ROWS;
use crate::write::{ColumnData, ColumnType, TableWriter};

/// The configuration file written by [`export_tables`].
pub const CONFIG_FILE: &str = "graph.toml";

/// Writes the graph directory `graph` as tables under `out` (`nodes/<type>`,
/// `edges/<relation>`, and `graph.toml`); returns the configuration's path.
pub fn export_tables(
    graph: &Path,
    out: &Path,
    format: FileFormat,
    overwrite: bool,
    progress: &mut dyn Progress,
) -> Result<PathBuf> {
    // Validates the whole directory first: an export of a broken graph is refused.
    graphs::load(graph, &graphs::LoadOptions::default())?;
    let schema = Schema::read(&paths::schema(graph))?;
    let dir = AtomicDir::create(out, overwrite)?;
    dir.create_dir(&dir.path().join("nodes"))?;
    dir.create_dir(&dir.path().join("edges"))?;
    let ext = match format {
        FileFormat::Csv => "csv",
        FileFormat::Parquet => "parquet",
    };
    let mut nodes = Vec::new();
    for (t, ts) in &schema.node_types {
        let file = PathBuf::from("nodes").join(format!("{t}.{ext}"));
        let target = *t == schema.target;
        let dim = ts.feature_dim.unwrap_or(0) as usize;
        let features = match ts.feature_dim {
            Some(_) => Some(NpyFile::open(&paths::features(graph, t), DType::F32)?),
            None => None,
        };
        let (labels, split) = if target {
            read_labels(graph, t, ts.count)?
        } else {
            (Vec::new(), Vec::new())
        };
        // A graph for edge tasks only has a target type without labels or splits.
        let node_targets = target
            && (split.iter().any(|&m| m != 0)
                || labels.iter().any(|&l| l >= 0)
                || schema.values
                || schema.label_sets.is_some());
        let values = match target && schema.values {
            true => Some(NpyFile::open(&paths::values(graph, t), DType::F32)?.to_f32_vec()),
            false => None,
        };
        let width = schema.label_sets.filter(|_| target).unwrap_or(0) as usize;
        let sets = match width {
            0 => None,
            _ => Some(NpyFile::open(&paths::label_sets(graph, t), DType::I8)?.to_i8_vec()),
        };
        let mut columns = vec![("id".to_string(), ColumnType::Text)];
        columns.extend((0..dim).map(|j| (format!("f{j}"), ColumnType::Float32)));
        if node_targets {
            columns.push(("label".to_string(), ColumnType::Int));
            columns.push(("split".to_string(), ColumnType::Text));
        }
        if values.is_some() {
            columns.push(("value".to_string(), ColumnType::Float32));
        }
        if sets.is_some() {
            columns.push(("label_set".to_string(), ColumnType::Text));
        }
        let mut w = TableWriter::create(&dir.path().join(&file), format, &columns)?;
        progress.start(&format!("{t} table"), ts.count);
        let bytes: &[u8] = features.as_ref().map_or(&[], |f| f.data());
        let mut start = 0u64;
        while start < ts.count {
            let end = (start + CHUNK_ROWS as u64).min(ts.count);
            let rows = start as usize..end as usize;
            let mut cols = vec![ColumnData::Text(
                rows.clone().map(|i| Some(format!("{t}-{i}"))).collect(),
            )];
            let f: Vec<f32> = bytes[rows.start * dim * 4..rows.end * dim * 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            for j in 0..dim {
                cols.push(ColumnData::Float32(
                    f.iter().skip(j).step_by(dim).copied().collect(),
                ));
            }
            if node_targets {
                cols.push(ColumnData::Int(
                    labels[rows.clone()]
                        .iter()
                        .map(|&l| (l >= 0).then_some(l))
                        .collect(),
                ));
                cols.push(ColumnData::Text(
                    split[rows.clone()]
                        .iter()
                        .map(|&m| (m != 0).then(|| split_name(m).to_string()))
                        .collect(),
                ));
            }
            if let Some(v) = &values {
                cols.push(ColumnData::Float32(v[rows.clone()].to_vec()));
            }
            if let Some(bits) = &sets {
                cols.push(ColumnData::Text(
                    bits[rows.start * width..rows.end * width]
                        .chunks_exact(width)
                        .map(set_cell)
                        .collect(),
                ));
            }
            w.write(cols)?;
            progress.advance(end - start);
            start = end;
        }
        w.finish()?;
        progress.finish();
        nodes.push(NodeTable {
            ntype: t.clone(),
            files: vec![file],
            format: None,
            delimiter: None,
            id: "id".into(),
            features: (dim > 0)
                .then(|| FeatureSpec {
                    columns: (0..dim).map(|j| format!("f{j}")).collect(),
                    transform: Transform::None,
                    fill: None,
                    boundaries: None,
                    separator: None,
                    max_categories: None,
                })
                .into_iter()
                .collect(),
            // A target without class labels (all -1: a multi-label or
            // regression graph) is imported back without a label column.
            label: (node_targets && labels.iter().any(|&l| l >= 0)).then(|| LabelSpec {
                column: "label".into(),
                max_classes: Some(schema.num_classes),
                num_classes: Some(schema.num_classes),
            }),
            split: node_targets.then(|| SplitSpec {
                column: Some("split".into()),
                fractions: None,
                seed: None,
                time_column: None,
                train_before: None,
                valid_before: None,
            }),
            value: values.is_some().then(|| ValueSpec {
                column: "value".into(),
            }),
            label_set: sets.is_some().then(|| LabelSetSpec {
                column: "label_set".into(),
                separator: None,
                max_labels: Some(width as u32),
                num_labels: Some(width as u32),
                empty: Some(EMPTY_SET.into()),
            }),
        });
    }
    let mut edges = Vec::new();
    for r in &schema.relations {
        let canonical = r.canonical();
        let file = PathBuf::from("edges").join(format!("{canonical}.{ext}"));
        let f = NpyFile::open(&paths::edges(graph, &canonical), DType::I64)?;
        let e = r.count as usize;
        let targets = edge_targets(graph, r)?;
        let weights = graphs::format::read_edge_weights(graph, r)?;
        let times = graphs::format::read_edge_times(graph, r)?;
        let mut columns = vec![
            ("src".to_string(), ColumnType::Text),
            ("dst".to_string(), ColumnType::Text),
        ];
        if let Some(t) = &targets {
            if t.labels.is_some() {
                columns.push(("label".into(), ColumnType::Int));
            }
            if t.values.is_some() {
                columns.push(("value".into(), ColumnType::Float32));
            }
            columns.push(("split".into(), ColumnType::Text));
        }
        if weights.is_some() {
            columns.push(("weight".into(), ColumnType::Float32));
        }
        if times.is_some() {
            columns.push(("time".into(), ColumnType::Int));
        }
        let mut w = TableWriter::create(&dir.path().join(&file), format, &columns)?;
        progress.start(&format!("{canonical} table"), r.count);
        let mut start = 0;
        while start < e {
            let end = (start + CHUNK_ROWS).min(e);
            let src = (start..end).map(|i| Some(format!("{}-{}", r.src, f.i64_at(i))));
            let dst = (start..end).map(|i| Some(format!("{}-{}", r.dst, f.i64_at(e + i))));
            let mut data = vec![
                ColumnData::Text(src.collect()),
                ColumnData::Text(dst.collect()),
            ];
            if let Some(t) = &targets {
                if let Some(l) = &t.labels {
                    data.push(ColumnData::Int(
                        l[start..end]
                            .iter()
                            .map(|&x| (x >= 0).then_some(x))
                            .collect(),
                    ));
                }
                if let Some(v) = &t.values {
                    data.push(ColumnData::Float32(v[start..end].to_vec()));
                }
                let names = ["", "train", "valid", "test"];
                data.push(ColumnData::Text(
                    t.split[start..end]
                        .iter()
                        .map(|&k| (k > 0).then(|| names[k as usize].to_string()))
                        .collect(),
                ));
            }
            if let Some(x) = &weights {
                data.push(ColumnData::Float32(x[start..end].to_vec()));
            }
            if let Some(x) = &times {
                data.push(ColumnData::Int(
                    x[start..end].iter().map(|&t| Some(t)).collect(),
                ));
            }
            w.write(data)?;
            progress.advance((end - start) as u64);
            start = end;
        }
        w.finish()?;
        progress.finish();
        edges.push(EdgeTable {
            relation: [r.src.clone(), r.name.clone(), r.dst.clone()],
            files: vec![file],
            format: None,
            delimiter: None,
            source: "src".into(),
            destination: "dst".into(),
            unknown_ids: UnknownIds::Refuse,
            label: r.num_classes.map(|_| "label".into()),
            num_classes: r.num_classes,
            value: r.values.then(|| "value".into()),
            split: r.has_targets().then(|| EdgeSplit::Column("split".into())),
            weight: r.weights.then(|| "weight".into()),
            time: r.times.then(|| "time".into()),
        });
    }
    let cfg = TablesConfig {
        name: Some(schema.name.clone()),
        target: Some(schema.target.clone()),
        nodes,
        edges,
    };
    let text = toml::to_string(&cfg)
        .map_err(|e| TableError::file(out, format!("writing {CONFIG_FILE}: {e}")))?;
    let cpath = dir.path().join(CONFIG_FILE);
    let header = format!("# Tables exported from {} by `hetgnn export tables`.\n# Import with: hetgnn import tables --config {CONFIG_FILE} --out DIR\n\n", schema.name);
    std::fs::write(&cpath, header + &text).map_err(|e| TableError::io(&cpath, e))?;
    dir.commit()?;
    Ok(out.join(CONFIG_FILE))
}

/// A relation's edge targets, read whole: labels, values, a split tag per
/// edge (0 none, 1 train, 2 valid, 3 test).
struct Targets {
    labels: Option<Vec<i64>>,
    values: Option<Vec<f32>>,
    split: Vec<u8>,
}

/// The edge targets of `r` in `graph` (`None`: it has none).
fn edge_targets(graph: &Path, r: &graphs::schema::RelationSchema) -> Result<Option<Targets>> {
    let Some(c) = graphs::format::read_edge_columns(graph, r)? else {
        return Ok(None);
    };
    Ok(Some(Targets {
        split: split_tags(&c.splits, r.count as usize),
        labels: r.num_classes.map(|_| c.labels),
        values: r.values.then_some(c.values),
    }))
}

/// Each of `n` edges' split tag (0 none, 1 train, 2 valid, 3 test) from the splits' positions.
pub(crate) fn split_tags(splits: &[Vec<u64>; 3], n: usize) -> Vec<u8> {
    let mut tags = vec![0u8; n];
    for (tag, positions) in splits.iter().enumerate() {
        for &p in positions {
            tags[p as usize] = tag as u8 + 1;
        }
    }
    tags
}

/// A node's label-set cell: its labels joined by `;`, `EMPTY_SET` for none
/// at all, missing for an unlabelled node.
fn set_cell(row: &[i8]) -> Option<String> {
    if row.first().is_some_and(|&b| b < 0) {
        return None;
    }
    let labels: Vec<String> = (0..row.len())
        .filter(|&j| row[j] == 1)
        .map(|j| j.to_string())
        .collect();
    Some(match labels.is_empty() {
        true => EMPTY_SET.to_string(),
        false => labels.join(";"),
    })
}

/// The text an exported label-set cell holds for an empty set.
const EMPTY_SET: &str = "none";
