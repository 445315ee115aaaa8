//! `import tables`: node and edge tables to a graph directory. Node tables
//! are read twice where a transform is fitted (fit, then transform and
//! write), else once, and edge tables once; the
//! result's files are checked against its schema before it is moved into place.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use graphs::format::{paths, AtomicDir};
use graphs::npy::{DType, NpyFile, NpyWriter};
use graphs::schema::{NodeTypeSchema, RelationSchema, Schema};
use graphs::Progress;
use serde::{Deserialize, Serialize};

use crate::config::{expand_files, FileFormat, NodeTable, SplitRule, TablesConfig, UnknownIds};
use crate::edges::EdgeColumns;
use crate::error::{Result, TableError};
use crate::ids::{Added, IdKind, IdMap};
use crate::labels::{LabelCollector, LabelSetRows, Labelled, SetCollector};

use crate::like::{Prior, Seed};
use crate::source::{Cells, Chunk, TableReader};
use crate::transform::{FittedBlock, Fitter};

/// Most ids a node table's row count reserves room for in its map up front.
const MAX_RESERVED_IDS: u64 = 1 << 24;

/// Name of the file, beside `schema.json`, that records how the tables were imported.
pub const TABLES_FILE: &str = "tables.json";

/// Path of the saved original ids of `ntype` in graph directory `dir`.
pub fn ids_path(dir: &Path, ntype: &str) -> PathBuf {
    paths::node_dir(dir, ntype).join("ids.csv")
}

/// Options of [`import_tables`].
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Graph name (default: the configuration's, else the output directory's name).
    pub name: Option<String>,
    /// Replace the output directory if it exists.
    pub overwrite: bool,
    /// An earlier import to continue: its nodes, edges, ids, fitted statistics
    /// and classes are kept, and these tables are added to them.
    pub like: Option<PathBuf>,
}

/// What an import wrote and left out.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImportRecord {
    /// Format version of this record.
    pub version: u32,
    /// The configuration as read.
    pub config: TablesConfig,
    /// Per node type, in schema order.
    pub types: Vec<TypeRecord>,
    /// Edges left out for naming an unknown node, per relation (only with `unknown_ids = "drop"`).
    pub dropped_edges: Vec<(String, u64)>,
    /// The graph this import continued (`--like`), if any.
    #[serde(default)]
    pub like: Option<PathBuf>,
    /// Per relation whose edge classes were names, the names in class order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edge_classes: Vec<(String, Vec<String>)>,
}

/// Largest `tables.json` read.
const MAX_RECORD_BYTES: u64 = 256 << 20;

impl ImportRecord {
    /// The record of graph directory `dir`, or `None` when it was not imported from tables.
    pub fn read(dir: &Path) -> Result<Option<ImportRecord>> {
        let path = dir.join(TABLES_FILE);
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(TableError::io(&path, e)),
        };
        if meta.len() > MAX_RECORD_BYTES {
            return Err(TableError::file(
                &path,
                format!("{} bytes is more than an import record holds", meta.len()),
            ));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| TableError::io(&path, e))?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| TableError::file(&path, format!("not an import record: {e}")))
    }

    /// The original ids of `ntype` (of `count` nodes) in graph directory `dir`.
    pub fn ids(&self, dir: &Path, ntype: &str, count: u64) -> Result<IdMap> {
        let Some(t) = self.types.iter().find(|t| t.ntype == ntype) else {
            return Err(TableError::file(
                &dir.join(TABLES_FILE),
                format!("no record of node type '{ntype}'"),
            ));
        };
        let path = ids_path(dir, ntype);
        let map = IdMap::read_csv(&path, t.id_kind)?;
        if map.len() as u64 != count {
            return Err(TableError::file(
                &path,
                format!("{} ids for the {count} nodes of '{ntype}'", map.len()),
            ));
        }
        Ok(map)
    }
}

/// How one node type was imported.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TypeRecord {
    /// Node type.
    #[serde(rename = "type")]
    pub ntype: String,
    /// Kind of the original ids.
    pub id_kind: IdKind,
    /// The feature blocks with fitted statistics, in column order of `features.npy`.
    pub features: Vec<FittedBlock>,
    /// Class names in class order, when the labels were names.
    pub classes: Vec<String>,
    /// Label names of the label sets in label order, when they were names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub label_names: Vec<String>,
}

/// The links an embedding column makes: its categories as the nodes of a
/// type of their own, and a relation from them to the nodes that have them.
struct CategoryLinks {
    /// The category type, `<type>.<column>`.
    ntype: String,
    /// `[category type, column, type]`.
    relation: [String; 3],
    /// The categories, in id order.
    categories: Vec<String>,
    /// (category, node) per link, in node order.
    pairs: Vec<(u32, u32)>,
}

struct NodeResult {
    /// Links made by embedding columns.
    links: Vec<CategoryLinks>,
    ids: IdMap,
    width: usize,
    blocks: Vec<FittedBlock>,
    labelled: Option<Labelled>,
    /// Regression targets (NaN: none), when the table has a value column.
    values: Option<Vec<f32>>,
    /// Label sets, when the table has a label set column.
    label_sets: Option<LabelSetRows>,
}

/// Imports the tables described by the configuration file `config` into `out`.
pub fn import_tables(
    config: &Path,
    out: &Path,
    opts: &ImportOptions,
    progress: &mut dyn Progress,
) -> Result<(Schema, ImportRecord)> {
    let cfg = TablesConfig::read(config)?;
    let base = config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Every file is found before anything is written.
    let node_files = cfg
        .nodes
        .iter()
        .map(|n| expand_files(base, &n.files, n.format))
        .collect::<Result<Vec<_>>>()?;
    let edge_files = cfg
        .edges
        .iter()
        .map(|e| expand_files(base, &e.files, e.format))
        .collect::<Result<Vec<_>>>()?;

    let mut prior = match &opts.like {
        Some(d) => {
            let p = Prior::load(d)?;
            p.check(&cfg, config)?;
            Some(p)
        }
        None => None,
    };

    let dir = AtomicDir::create(out, opts.overwrite)?;
    let target = cfg.target().to_string();
    // Node types in order: the earlier graph's, else the node tables' and
    // then the types named only by edges, in order of appearance.
    let mut order: Vec<String> = match &prior {
        Some(p) => p.schema.node_types.iter().map(|(t, _)| t.clone()).collect(),
        None => cfg.nodes.iter().map(|n| n.ntype.clone()).collect(),
    };
    for e in &cfg.edges {
        for t in [&e.relation[0], &e.relation[2]] {
            if !order.contains(t) {
                order.push(t.clone());
            }
        }
    }
    let has_table = |t: &str, prior: &Option<Prior>| {
        cfg.node_table(t).is_some() || prior.as_ref().is_some_and(|p| p.table(t).is_some())
    };
    let mut types: Vec<(String, Option<NodeResult>)> = Vec::new();
    let mut maps: HashMap<String, IdMap> = HashMap::new();
    for t in &order {
        let new = cfg.nodes.iter().position(|n| &n.ntype == t);
        // A type the earlier import had a table for, with no new table: carried over.
        let table = match new {
            Some(k) => Some((cfg.nodes[k].clone(), node_files[k].as_slice())),
            None => prior
                .as_ref()
                .and_then(|p| p.table(t).cloned())
                .map(|tb| (tb, &[][..])),
        };
        let Some((table, files)) = table else {
            let map = prior
                .as_mut()
                .and_then(|p| p.take_map(t))
                .unwrap_or_else(|| IdMap::new(IdKind::Text));
            maps.insert(t.clone(), map);
            types.push((t.clone(), None));
            continue;
        };
        dir.create_dir(&paths::node_dir(dir.path(), t))?;
        let seed = prior.as_mut().map(|p| p.seed(t)).transpose()?;
        let mut r = import_nodes(&table, files, dir.path(), seed, prior.as_ref(), progress)?;
        if let Some(v) = &r.values {
            graphs::npy::write_f32(&paths::values(dir.path(), t), &[v.len() as u64], v)?;
        }
        if let Some(s) = &r.label_sets {
            let shape = [(s.bits.len() / s.width as usize) as u64, u64::from(s.width)];
            graphs::npy::write_i8(&paths::label_sets(dir.path(), t), &shape, &s.bits)?;
        }
        if let Some(l) = &r.labelled {
            graphs::npy::write_i64(
                &paths::labels(dir.path(), t),
                &[l.labels.len() as u64],
                &l.labels,
            )?;
            for (name, ids) in ["train", "valid", "test"].iter().zip(&l.splits) {
                let mut w = NpyWriter::create(
                    &paths::split(dir.path(), t, name),
                    DType::I64,
                    &[ids.len() as u64],
                )?;
                w.write_ids(ids)?;
                w.finish()?;
            }
        }
        maps.insert(
            t.clone(),
            std::mem::replace(&mut r.ids, IdMap::new(IdKind::Int)),
        );
        types.push((t.clone(), Some(r)));
    }

    // Embedding columns' categories: node types of their own, linked to
    // their nodes (an earlier import's keep their ids and links).
    let mut category_edges: HashMap<String, Vec<(u32, u32)>> = HashMap::new();
    let mut category_relations = Vec::new();
    for (_, r) in &mut types {
        for l in r
            .as_mut()
            .map(|r| std::mem::take(&mut r.links))
            .unwrap_or_default()
        {
            let known = prior
                .as_ref()
                .is_some_and(|p| p.schema.type_index(&l.ntype).is_some());
            if !known {
                if maps.contains_key(&l.ntype) {
                    return Err(TableError::config(config, format!(
                        "the embedding column '{}' of '{}' makes the node type '{}', which the tables already have: rename one",
                        l.relation[1], l.relation[2], l.ntype
                    )));
                }
                let mut map = IdMap::new(IdKind::Text);
                let cells = Cells::Text(l.categories.iter().cloned().map(Some).collect());
                for i in 0..l.categories.len() {
                    map.add(&cells, i)
                        .map_err(|p| TableError::config(config, format!("{}: {p}", l.ntype)))?;
                }
                maps.insert(l.ntype.clone(), map);
                category_relations.push(l.relation.clone());
            }
            let canonical = l.relation.join("__");
            category_edges.insert(canonical, l.pairs);
        }
    }
    for rel in &category_relations {
        types.push((rel[0].clone(), None));
        if cfg.edges.iter().any(|e| e.relation == *rel) {
            return Err(TableError::config(config, format!(
                "the embedding column '{}' of '{}' makes the relation {}, which an [[edges]] table has too: rename one",
                rel[1], rel[2], rel.join("__")
            )));
        }
    }

    dir.create_dir(&dir.path().join("edges"))?;
    // Relations in order: the earlier graph's, else the edge tables' and
    // then the embedding columns'.
    let rel_order: Vec<[String; 3]> = match &prior {
        Some(p) => p
            .schema
            .relations
            .iter()
            .map(|r| [r.src.clone(), r.name.clone(), r.dst.clone()])
            .collect(),
        None => cfg
            .edges
            .iter()
            .map(|e| e.relation.clone())
            .chain(category_relations.iter().cloned())
            .collect(),
    };
    let mut relations = Vec::new();
    let mut dropped_edges = Vec::new();
    let mut edge_classes = Vec::new();
    for rel in &rel_order {
        let [s, r, d] = rel;
        let mut rs = RelationSchema {
            src: s.clone(),
            name: r.clone(),
            dst: d.clone(),
            count: 0,
            ..Default::default()
        };
        let from_table = [has_table(s, &prior), has_table(d, &prior)];
        let mut edges = EdgeSpool::create(dir.path(), &rs.canonical())?;
        if let Some(p) = &prior {
            p.copy_edges(&rs.canonical(), |a, b| {
                edges.push(a, b).map_err(|e| TableError::io(&p.dir, e))
            })?;
        }
        let mut dropped = 0u64;
        let entry = cfg
            .edges
            .iter()
            .zip(&edge_files)
            .find(|(e, _)| &e.relation == rel);
        let mut targets =
            EdgeColumns::start(dir.path(), entry.map(|(e, _)| e), prior.as_ref(), &rs)?;
        for (e, files) in entry.into_iter() {
            for (path, format) in files {
                let mut wanted = vec![e.source.as_str(), e.destination.as_str()];
                wanted.extend(e.extra_columns());
                let mut reader = TableReader::open(path, *format, e.delimiter, &wanted)?.ahead();
                progress.start(
                    &format!("{} {}", rs.canonical(), file_name(path)),
                    reader.total_rows().unwrap_or(0),
                );
                while let Some(chunk) = reader.next_chunk()? {
                    let (sc, dc) = (&chunk.columns[0], &chunk.columns[1]);
                    // Ends with a node table are looked up for the whole chunk
                    // first, the two columns on two threads: the lookups wait on
                    // memory, and most of an edge table's time is theirs.
                    let lookup = |k: usize, cells: &Cells, t: &String| -> Vec<Option<u32>> {
                        match from_table[k] {
                            true => (0..chunk.rows).map(|i| maps[t].get(cells, i)).collect(),
                            false => vec![None; chunk.rows],
                        }
                    };
                    let (found_s, found_d) = rayon::join(|| lookup(0, sc, s), || lookup(1, dc, d));
                    for (i, found) in found_s.into_iter().zip(found_d).enumerate() {
                        let found = [found.0, found.1];
                        let row = chunk.first_row + i as u64;
                        let mut ends = [0u32; 2];
                        let mut unknown = false;
                        let both = [(sc, &e.source, s), (dc, &e.destination, d)];
                        // Ends with a node table first: an edge they drop must not
                        // create a node on an end that takes its ids from edges.
                        for (k, (cells, column, t)) in both.into_iter().enumerate() {
                            if cells.is_missing(i) {
                                return Err(TableError::cell(path, row, column, "missing id"));
                            }
                            if !from_table[k] {
                                continue;
                            }
                            match found[k] {
                                Some(id) => ends[k] = id,
                                None if e.unknown_ids == UnknownIds::Drop => unknown = true,
                                None => {
                                    return Err(TableError::cell(path, row, column, format!(
                                        "id '{}' is not in the node table of '{t}' (set unknown_ids = \"drop\" to leave such edges out)",
                                        cells.text(i).unwrap_or_default().escape_debug()
                                    )))
                                }
                            }
                        }
                        for (k, (cells, column, t)) in both.into_iter().enumerate() {
                            if from_table[k] || unknown {
                                continue;
                            }
                            let map = maps.get_mut(t).expect("every edge end has a map");
                            ends[k] = match map
                                .add(cells, i)
                                .map_err(|p| TableError::cell(path, row, column, p))?
                            {
                                Added::New(id) | Added::Known(id) => id,
                            };
                        }
                        if unknown {
                            dropped += 1;
                        } else {
                            edges
                                .push(ends[0], ends[1])
                                .map_err(|e| TableError::io(path, e))?;
                            targets.read(e, &chunk.columns[2..], i, path, row)?;
                        }
                    }
                    progress.advance(chunk.rows as u64);
                }
                progress.finish();
            }
        }
        for (a, b) in category_edges.remove(&rs.canonical()).unwrap_or_default() {
            edges
                .push(a, b)
                .map_err(|e| TableError::io(dir.path(), e))?;
        }
        rs.count = edges.finish(&paths::edges(dir.path(), &rs.canonical()))?;
        if let Some(names) = targets.finish(dir.path(), &mut rs)? {
            edge_classes.push((rs.canonical(), names));
        }
        if dropped > 0 {
            dropped_edges.push((rs.canonical(), dropped));
        }
        relations.push(rs);
    }

    let mut node_types = Vec::new();
    let mut records = Vec::new();
    let mut num_classes = 1;
    let mut has_values = false;
    let mut label_sets = None;
    for (ntype, result) in &types {
        let ids = maps.remove(ntype).expect("a map per type");
        if ids.is_empty() {
            return Err(TableError::config(
                config,
                format!("node type '{ntype}' has no nodes"),
            ));
        }
        if result.is_none() {
            dir.create_dir(&paths::node_dir(dir.path(), ntype))?;
        }
        ids.write_csv(&ids_path(dir.path(), ntype))?;
        if *ntype == target && result.as_ref().is_none_or(|r| r.labelled.is_none()) {
            // Edge tasks only: the target type's nodes carry no label and no split.
            let n = ids.len() as u64;
            graphs::npy::write_i64(
                &paths::labels(dir.path(), ntype),
                &[n],
                &vec![-1; n as usize],
            )?;
            for name in ["train", "valid", "test"] {
                graphs::npy::write_i64(&paths::split(dir.path(), ntype, name), &[0], &[])?;
            }
        }
        let label_names = result
            .as_ref()
            .and_then(|r| r.label_sets.as_ref())
            .map(|s| s.names.clone())
            .unwrap_or_default();
        let (width, blocks, classes) = match result {
            Some(r) => {
                if let Some(l) = &r.labelled {
                    num_classes = l.num_classes;
                    has_values = r.values.is_some();
                    label_sets = r.label_sets.as_ref().map(|s| s.width);
                }
                (
                    r.width,
                    r.blocks.clone(),
                    r.labelled
                        .as_ref()
                        .map(|l| l.classes.clone())
                        .unwrap_or_default(),
                )
            }
            None => (0, Vec::new(), Vec::new()),
        };
        node_types.push((
            ntype.clone(),
            NodeTypeSchema {
                count: ids.len() as u64,
                feature_dim: (width > 0).then_some(width as u64),
            },
        ));
        records.push(TypeRecord {
            ntype: ntype.clone(),
            id_kind: ids.kind(),
            features: blocks,
            classes,
            label_names,
        });
    }
    let name = opts
        .name
        .clone()
        .or_else(|| cfg.name.clone())
        .unwrap_or_else(|| {
            out.file_name()
                .map_or("tables".into(), |n| n.to_string_lossy().into_owned())
        });
    let schema = Schema {
        name,
        target,
        num_classes,
        node_types,
        relations,
        values: has_values,
        label_sets,
    };
    schema
        .validate()
        .map_err(|p| TableError::config(config, format!("the imported graph is invalid: {p}")))?;
    schema.write(&paths::schema(dir.path()))?;
    // The record names every type's table, carried-over ones included, so a
    // later `--like` of this graph knows which types have tables.
    let mut cfg = cfg;
    if let Some(p) = &prior {
        for (t, _) in &p.schema.node_types {
            if cfg.node_table(t).is_none() {
                if let Some(old) = p.table(t) {
                    cfg.nodes.push(old.clone());
                }
            }
        }
    }
    let record = ImportRecord {
        version: 1,
        config: cfg,
        types: records,
        dropped_edges,
        edge_classes,
        like: opts.like.clone(),
    };
    let text = serde_json::to_string_pretty(&record).expect("record serialises");
    let rpath = dir.path().join(TABLES_FILE);
    std::fs::write(&rpath, text + "\n").map_err(|e| TableError::io(&rpath, e))?;
    check_written(dir.path())?;
    dir.commit()?;
    Ok((schema, record))
}

/// Checks the written directory before it is published: the schema reads
/// back and every file has the dtype and shape it declares. Ids are in range
/// and splits consistent by construction, so this does not load the graph
/// (which would hold every edge in memory twice).
fn check_written(dir: &Path) -> Result<()> {
    let schema = Schema::read(&paths::schema(dir))?;
    for (t, ts) in &schema.node_types {
        if let Some(dim) = ts.feature_dim {
            NpyFile::open(&paths::features(dir, t), DType::F32)?
                .expect_shape(&[ts.count, dim], "features")?;
        }
    }
    let t = &schema.target;
    let count = schema.node_types[schema.type_index(t).expect("validated")]
        .1
        .count;
    NpyFile::open(&paths::labels(dir, t), DType::I64)?.expect_shape(&[count], "labels")?;
    for s in ["train", "valid", "test"] {
        let f = NpyFile::open(&paths::split(dir, t, s), DType::I64)?;
        let n = f.len() as u64;
        f.expect_shape(&[n], "split")?;
    }
    for r in &schema.relations {
        NpyFile::open(&paths::edges(dir, &r.canonical()), DType::I64)?
            .expect_shape(&[2, r.count], "edges")?;
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Reads a node type's tables: ids, fitted features, labels and splits on a
/// first pass, transformed features on a second (on the first when nothing is
/// fitted).
fn import_nodes(
    table: &NodeTable,
    files: &[(PathBuf, FileFormat)],
    out: &Path,
    seed: Option<Seed>,
    prior: Option<&Prior>,
    progress: &mut dyn Progress,
) -> Result<NodeResult> {
    let t = &table.ntype;
    // Continuing an earlier import: its statistics are reused, not refitted.
    let mut fitters: Vec<Fitter> = match &seed {
        Some(_) => Vec::new(),
        None => table.features.iter().map(Fitter::new).collect(),
    };
    let rule = table
        .split
        .as_ref()
        .map(|s| s.rule().expect("checked with the config"));
    let old_count = seed.as_ref().map_or(0, |s| s.ids.len());
    let new_sets = || {
        table.label_set.as_ref().map(|l| {
            SetCollector::new(
                l.max_labels.unwrap_or(1000),
                l.num_labels,
                l.separator.unwrap_or(';'),
                l.empty.clone(),
            )
        })
    };
    let mut sets = new_sets();
    let (mut ids, seed_blocks, mut labels) = match seed {
        Some(s) => {
            let labels = match (&table.label, s.labels) {
                (Some(l), Some((old, marks))) => Some(LabelCollector::seeded(
                    l.max_classes.unwrap_or(1000),
                    s.classes,
                    &old,
                    marks,
                )),
                (None, Some((_, marks))) if table.has_targets() => {
                    Some(LabelCollector::seeded_without_classes(marks))
                }
                _ => None,
            };
            sets = match (sets, s.label_sets) {
                (Some(c), Some((names, width, bits))) => Some(c.seeded(names, width, &bits)),
                (Some(_), None) => {
                    return Err(TableError::file(
                        out,
                        format!("node type '{t}': the graph this import is like has no label sets"),
                    ))
                }
                (None, _) => None,
            };
            (Some(s.ids), Some(s.blocks), labels)
        }
        None => (
            None,
            None,
            match &table.label {
                Some(l) => Some(
                    LabelCollector::new(l.max_classes.unwrap_or(1000)).with_classes(l.num_classes),
                ),
                None if table.has_targets() => Some(LabelCollector::without_classes()),
                None => None,
            },
        ),
    };

    // Blocks known before reading (nothing to fit, or an earlier import's
    // statistics): features are written on the one pass, not a second.
    let early: Option<Vec<FittedBlock>> = match seed_blocks {
        Some(b) => Some(b),
        None if fitters.iter().all(|f| !f.needs_data()) => Some(
            std::mem::take(&mut fitters)
                .into_iter()
                .map(Fitter::finish)
                .collect(),
        ),
        None => None,
    };
    let first = files
        .first()
        .map_or_else(|| out.to_path_buf(), |f| f.0.clone());
    let mut features = match &early {
        Some(blocks) => FeatureRows::start(t, blocks, &first, out, prior, old_count, None)?,
        None => None,
    };

    // Pass 1: ids, statistics, labels, splits (and features, as just said).
    let mut columns: Vec<&str> = vec![&table.id];
    let fit_at: Vec<Option<usize>> = fitters
        .iter()
        .zip(table.features.iter())
        .map(|(f, spec)| {
            f.needs_data().then(|| {
                let at = columns.len();
                columns.extend(spec.columns.iter().map(String::as_str));
                at
            })
        })
        .collect();
    let label_at = table.label.as_ref().map(|l| {
        columns.push(&l.column);
        columns.len() - 1
    });
    let value_at = table.value.as_ref().map(|v| {
        columns.push(&v.column);
        columns.len() - 1
    });
    let set_at = table.label_set.as_ref().map(|l| {
        columns.push(&l.column);
        columns.len() - 1
    });
    // An import like an earlier graph keeps its nodes' values (none where it had none).
    let mut values: Option<Vec<f32>> = match (&table.value, prior) {
        (None, _) => None,
        (Some(_), Some(p)) if p.schema.values && p.schema.target == *t => {
            let f = NpyFile::open(&paths::values(&p.dir, t), DType::F32)?;
            f.expect_shape(&[old_count as u64], "values")?;
            Some(f.to_f32_vec())
        }
        (Some(_), _) => Some(vec![f32::NAN; old_count]),
    };
    let split_at = match &rule {
        Some(SplitRule::Column(c)) | Some(SplitRule::Time { column: c, .. }) => {
            columns.push(c);
            Some(columns.len() - 1)
        }
        _ => None,
    };
    let features_at = columns.len();
    if features.is_some() {
        columns.extend(
            table
                .features
                .iter()
                .flat_map(|s| s.columns.iter().map(String::as_str)),
        );
    }
    for (path, format) in files {
        let mut reader = TableReader::open(path, *format, table.delimiter, &columns)?.ahead();
        progress.start(
            &format!("{t} {}", file_name(path)),
            reader.total_rows().unwrap_or(0),
        );
        // Rows counted up front (Parquet) size the map once: growing it
        // holds the old table and the new, twice as large, at once. A
        // file's claim is trusted up to a bound (beyond, the map grows).
        let mut room = reader.total_rows().map(|n| n.min(MAX_RESERVED_IDS));
        while let Some(chunk) = reader.next_chunk()? {
            let idc = &chunk.columns[0];
            let map = match &mut ids {
                Some(m) => m,
                None => ids.insert(IdMap::new(
                    IdMap::kind_of(idc).map_err(|p| column_error(path, None, &table.id, p))?,
                )),
            };
            if let Some(n) = room.take() {
                map.reserve(n as usize);
            }
            for i in 0..chunk.rows {
                let row = chunk.first_row + i as u64;
                if idc.is_missing(i) {
                    return Err(TableError::cell(path, row, &table.id, "missing id"));
                }
                match map
                    .add(idc, i)
                    .map_err(|p| TableError::cell(path, row, &table.id, p))?
                {
                    Added::New(_) => {}
                    Added::Known(d) => {
                        let id = idc.text(i).unwrap_or_default();
                        let problem = if (d as usize) < old_count {
                            format!("'{}' is already node {d} of '{t}' in the graph this import is like", id.escape_debug())
                        } else {
                            format!(
                                "duplicate id '{}' (first seen as node {d} of '{t}')",
                                id.escape_debug()
                            )
                        };
                        return Err(TableError::cell(path, row, &table.id, problem));
                    }
                }
                for ((f, spec), at) in fitters.iter_mut().zip(&table.features).zip(&fit_at) {
                    if let Some(at) = at {
                        let cells: Vec<&Cells> = chunk.columns[*at..*at + spec.columns.len()]
                            .iter()
                            .collect();
                        f.observe(&cells, i)
                            .map_err(|(c, p)| TableError::cell(path, row, &spec.columns[c], p))?;
                    }
                }
                match (&mut labels, label_at) {
                    (Some(l), Some(at)) => l
                        .push_label(&chunk.columns[at], i)
                        .map_err(|p| TableError::cell(path, row, columns[at], p))?,
                    (Some(l), None) => l.push_unlabelled(),
                    (None, _) => {}
                }
                if let (Some(c), Some(at)) = (&mut sets, set_at) {
                    let known = c
                        .push(&chunk.columns[at], i)
                        .map_err(|p| TableError::cell(path, row, columns[at], p))?;
                    if let (true, Some(l)) = (known, &mut labels) {
                        l.mark_known();
                    }
                }
                if let (Some(v), Some(at)) = (&mut values, value_at) {
                    let x = chunk.columns[at]
                        .number_f32(i)
                        .map_err(|p| TableError::cell(path, row, columns[at], p))?;
                    if x.is_some_and(f32::is_infinite) {
                        return Err(TableError::cell(
                            path,
                            row,
                            columns[at],
                            "an infinite value (empty or NaN for none)",
                        ));
                    }
                    v.push(x.unwrap_or(f32::NAN));
                    if let (Some(_), Some(l)) = (x, &mut labels) {
                        l.mark_known();
                    }
                }
                if let (Some(l), Some(at)) = (&mut labels, split_at) {
                    let cells = &chunk.columns[at];
                    match &rule {
                        Some(SplitRule::Time {
                            train_before,
                            valid_before,
                            ..
                        }) => l.push_split_time(cells, i, *train_before, *valid_before),
                        _ => l.push_split_name(cells, i),
                    }
                    .map_err(|p| TableError::cell(path, row, columns[at], p))?;
                }
            }
            if let Some(f) = &mut features {
                f.chunk(path, &chunk, features_at)?;
            }
            progress.advance(chunk.rows as u64);
        }
        progress.finish();
    }
    let ids = ids.ok_or_else(|| {
        TableError::file(&first, format!("node type '{t}': the tables hold no rows"))
    })?;
    let count = ids.len() as u64;
    let one_pass = features.map(FeatureRows::finish).transpose()?;
    let blocks: Vec<FittedBlock> = match early {
        Some(b) => b,
        None => fitters.into_iter().map(Fitter::finish).collect(),
    };
    let width = checked_width(t, &blocks, &first)?;
    // The column an error of the labels or splits names: the label's, else the target's.
    let target_column = [
        table.label.as_ref().map(|l| &l.column),
        table.value.as_ref().map(|v| &v.column),
        table.label_set.as_ref().map(|l| &l.column),
    ]
    .into_iter()
    .flatten()
    .next()
    .cloned()
    .unwrap_or_default();
    let labelled = match (labels, &rule) {
        (Some(l), Some(rule)) => Some(
            l.finish(rule)
                .map_err(|p| column_error(&first, None, &target_column, p))?,
        ),
        _ => None,
    };
    let label_sets = match sets {
        Some(c) => {
            let column = &table.label_set.as_ref().expect("a label set column").column;
            Some(
                c.finish()
                    .map_err(|p| column_error(&first, None, column, p))?,
            )
        }
        None => None,
    };

    // Pass 2: transformed features and links, where statistics were fitted on pass 1.
    let links = match one_pass {
        Some(links) => links,
        None => {
            let columns: Vec<&str> = table
                .features
                .iter()
                .flat_map(|s| s.columns.iter().map(String::as_str))
                .collect();
            match FeatureRows::start(t, &blocks, &first, out, prior, old_count, Some(count))? {
                None => Vec::new(),
                Some(mut rows) => {
                    for (path, format) in files {
                        let mut reader =
                            TableReader::open(path, *format, table.delimiter, &columns)?.ahead();
                        progress.start(
                            &format!("{t} features {}", file_name(path)),
                            reader.total_rows().unwrap_or(0),
                        );
                        while let Some(chunk) = reader.next_chunk()? {
                            rows.chunk(path, &chunk, 0)?;
                            progress.advance(chunk.rows as u64);
                        }
                        progress.finish();
                    }
                    rows.finish()?
                }
            }
        }
    };
    Ok(NodeResult {
        links,
        ids,
        width,
        blocks,
        labelled,
        values,
        label_sets,
    })
}

/// The width of a type's feature rows after `blocks`, refused past the format's bound.
fn checked_width(t: &str, blocks: &[FittedBlock], first: &Path) -> Result<usize> {
    let width: usize = blocks.iter().map(FittedBlock::width).sum();
    if width as u64 > graphs::schema::MAX_FEATURE_DIM {
        return Err(TableError::file(
            first,
            format!(
                "node type '{t}': {width} feature columns after the transforms, more than {}",
                graphs::schema::MAX_FEATURE_DIM
            ),
        ));
    }
    Ok(width)
}

/// A node type's transformed feature rows and embedding links, made chunk
/// by chunk: the rows go to `features.npy` as they come.
struct FeatureRows<'b> {
    blocks: &'b [FittedBlock],
    out: Option<NpyWriter>,
    /// Links of the embedding columns, one entry per column.
    links: Vec<CategoryLinks>,
    /// Per block, its first entry in `links`.
    link_at: Vec<usize>,
    /// The next row's node.
    node: u32,
    row: Vec<f32>,
    row_links: Vec<(usize, u32)>,
    buf: Vec<f32>,
}

impl<'b> FeatureRows<'b> {
    /// Starts the rows of type `t` after `old_count` nodes an earlier import
    /// wrote (copied from `prior`); `rows` is the count of all of them where it
    /// is known, else the file's header is fixed at the end. `None`: the
    /// blocks give neither features nor links.
    fn start(
        t: &str,
        blocks: &'b [FittedBlock],
        first: &Path,
        dir: &Path,
        prior: Option<&Prior>,
        old_count: usize,
        rows: Option<u64>,
    ) -> Result<Option<FeatureRows<'b>>> {
        let width = checked_width(t, blocks, first)?;
        let mut links = Vec::new();
        let mut link_at = Vec::new();
        for b in blocks {
            link_at.push(links.len());
            for (c, cats) in b.embedding_categories().into_iter().flatten().enumerate() {
                let ntype = format!("{t}.{}", b.columns[c]);
                links.push(CategoryLinks {
                    relation: [ntype.clone(), b.columns[c].clone(), t.to_string()],
                    ntype,
                    categories: cats.clone(),
                    pairs: Vec::new(),
                });
            }
        }
        if width == 0 && links.is_empty() {
            return Ok(None);
        }
        let path = paths::features(dir, t);
        let mut out = match (width, rows) {
            (0, _) => None,
            (w, Some(n)) => Some(NpyWriter::create(&path, DType::F32, &[n, w as u64])?),
            (w, None) => Some(NpyWriter::create_rows(&path, DType::F32, w as u64)?),
        };
        if let (Some(p), Some(w)) = (prior, &mut out) {
            p.copy_features(t, w)?;
        }
        Ok(Some(FeatureRows {
            blocks,
            out,
            links,
            link_at,
            node: old_count as u32,
            row: Vec::with_capacity(width),
            row_links: Vec::new(),
            buf: Vec::new(),
        }))
    }

    /// Transforms the rows of `chunk` (of `path`), whose feature columns start at `at`.
    fn chunk(&mut self, path: &Path, chunk: &Chunk, at: usize) -> Result<()> {
        self.buf.clear();
        for i in 0..chunk.rows {
            self.row.clear();
            let mut at = at;
            for (bi, b) in self.blocks.iter().enumerate() {
                let cells: Vec<&Cells> = chunk.columns[at..at + b.columns.len()].iter().collect();
                let bad = |(c, p): (usize, String)| {
                    TableError::cell(path, chunk.first_row + i as u64, &b.columns[c], p)
                };
                b.apply(&cells, i, &mut self.row).map_err(bad)?;
                self.row_links.clear();
                b.links(&cells, i, &mut self.row_links).map_err(bad)?;
                for &(c, k) in &self.row_links {
                    self.links[self.link_at[bi] + c].pairs.push((k, self.node));
                }
                at += b.columns.len();
            }
            self.node += 1;
            self.buf.extend_from_slice(&self.row);
            // Wide outputs (one-hot of many categories) are written as they
            // grow, so the buffer stays near a million values.
            if let Some(w) = self.out.as_mut().filter(|_| self.buf.len() >= 1 << 20) {
                w.write_f32(&self.buf)?;
                self.buf.clear();
            }
        }
        if let Some(w) = &mut self.out {
            w.write_f32(&self.buf)?;
        }
        self.buf.clear();
        Ok(())
    }

    /// Closes `features.npy`; the links made.
    fn finish(self) -> Result<Vec<CategoryLinks>> {
        if let Some(w) = self.out {
            w.finish()?;
        }
        Ok(self.links)
    }
}

fn column_error(path: &Path, row: Option<u64>, column: &str, problem: String) -> TableError {
    TableError::Table {
        file: path.to_path_buf(),
        row,
        column: Some(column.to_string()),
        problem,
    }
}

/// Edge ends spooled to two scratch files while the count is unknown, then
/// written as one `[2, count]` array.
struct EdgeSpool {
    paths: [PathBuf; 2],
    files: [BufWriter<File>; 2],
    count: u64,
}

impl EdgeSpool {
    fn create(dir: &Path, canonical: &str) -> Result<EdgeSpool> {
        let paths = [
            dir.join(format!(".{canonical}.src")),
            dir.join(format!(".{canonical}.dst")),
        ];
        let open = |p: &Path| -> Result<BufWriter<File>> {
            Ok(BufWriter::with_capacity(
                1 << 20,
                File::create(p).map_err(|e| TableError::io(p, e))?,
            ))
        };
        Ok(EdgeSpool {
            files: [open(&paths[0])?, open(&paths[1])?],
            paths,
            count: 0,
        })
    }

    fn push(&mut self, src: u32, dst: u32) -> std::io::Result<()> {
        self.files[0].write_all(&i64::from(src).to_le_bytes())?;
        self.files[1].write_all(&i64::from(dst).to_le_bytes())?;
        self.count += 1;
        Ok(())
    }

    fn finish(self, out: &Path) -> Result<u64> {
        let EdgeSpool {
            paths,
            files,
            count,
        } = self;
        for (f, p) in files.into_iter().zip(&paths) {
            f.into_inner()
                .map_err(|e| TableError::io(p, e.into_error()))?;
        }
        let mut w = NpyWriter::create(out, DType::I64, &[2, count])?;
        for p in &paths {
            drain_i64s(p, |vals| w.write_i64(vals).map_err(Into::into))?;
        }
        w.finish()?;
        Ok(count)
    }
}

/// Calls `f` on the little-endian int64 values of the spool file `path`, in
/// order, a chunk at a time, then deletes the file.
pub(crate) fn drain_i64s(path: &Path, mut f: impl FnMut(&mut [i64]) -> Result<()>) -> Result<()> {
    let io = |e| TableError::io(path, e);
    let mut r = File::open(path).map_err(io)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut vals: Vec<i64> = Vec::with_capacity(buf.len() / 8);
    loop {
        let n = read_full(&mut r, &mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        vals.clear();
        vals.extend(
            buf[..n]
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))),
        );
        f(&mut vals)?;
    }
    std::fs::remove_file(path).map_err(io)
}

/// Reads until `buf` is full or the end, so chunks stay multiples of 8 bytes.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
