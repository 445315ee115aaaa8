//! `--like DIR`: new tables imported the way an earlier import was, on top of
//! its graph. The earlier graph's nodes keep their dense ids (new ids are
//! appended), its fitted statistics and class names are reused without
//! refitting, and its nodes, labels, splits and edges are carried over.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use graphs::format::paths;
use graphs::npy::{DType, NpyFile, NpyWriter};
use graphs::Schema;

use crate::config::{NodeTable, TablesConfig};
use crate::error::{Result, TableError};
use crate::ids::IdMap;
use crate::import::{ImportRecord, TABLES_FILE};
use crate::labels::read_labels;
use crate::transform::FittedBlock;

/// Rows copied at a time.
const COPY_ROWS: usize = 1 << 16;

/// An earlier import: its schema, record and id maps.
#[derive(Debug)]
pub struct Prior {
    /// Its graph directory.
    pub dir: PathBuf,
    /// Its schema.
    pub schema: Schema,
    /// Its import record.
    pub record: ImportRecord,
    maps: HashMap<String, IdMap>,
}

/// What one node type starts from.
#[derive(Debug)]
pub struct Seed {
    /// The earlier ids.
    pub ids: IdMap,
    /// The earlier fitted feature blocks.
    pub blocks: Vec<FittedBlock>,
    /// Class names in class order (integers as text when the classes were integers).
    pub classes: Vec<String>,
    /// The earlier labels (-1: none) and split marks (0 none, 1 train, 2 valid, 3 test), on the target.
    pub labels: Option<(Vec<i64>, Vec<u8>)>,
    /// The earlier label sets, on a multi-label target: label names in label
    /// order (integers as text when the labels were integers), labels per
    /// node, and the rows.
    pub label_sets: Option<(Vec<String>, usize, Vec<i8>)>,
}

impl Prior {
    /// Reads the graph directory `dir`, which must have been imported from tables.
    pub fn load(dir: &Path) -> Result<Prior> {
        let Some(record) = ImportRecord::read(dir)? else {
            return Err(TableError::file(
                dir,
                format!("--like needs a graph imported from tables (it has no {TABLES_FILE})"),
            ));
        };
        let schema = Schema::read(&paths::schema(dir))?;
        let mut maps = HashMap::new();
        for (t, ts) in &schema.node_types {
            maps.insert(t.clone(), record.ids(dir, t, ts.count)?);
        }
        Ok(Prior {
            dir: dir.to_path_buf(),
            schema,
            record,
            maps,
        })
    }

    /// Refuses a configuration that would not import like this graph: a new
    /// node type or relation, another target, or feature blocks or a label
    /// that differ from the earlier ones.
    pub fn check(&self, cfg: &TablesConfig, config: &Path) -> Result<()> {
        let like = self.dir.display();
        let refuse = |p: String| Err(TableError::config(config, format!("{p} (--like {like})")));
        for n in &cfg.nodes {
            let Some(old) = self.table(&n.ntype) else {
                return refuse(format!(
                    "node type '{}' has no table in the graph this import is like",
                    n.ntype
                ));
            };
            if json(&n.features) != json(&old.features) {
                return refuse(format!(
                    "the feature blocks of '{}' differ from the earlier import's: they must be the same columns and transforms",
                    n.ntype
                ));
            }
            if json(&n.label) != json(&old.label) {
                return refuse(format!(
                    "the label of '{}' differs from the earlier import's",
                    n.ntype
                ));
            }
            if json(&n.label_set) != json(&old.label_set) {
                return refuse(format!(
                    "the label set of '{}' differs from the earlier import's",
                    n.ntype
                ));
            }
        }
        if cfg.target() != self.schema.target {
            return refuse(format!(
                "the target is '{}', the earlier import's is '{}'",
                cfg.target(),
                self.schema.target
            ));
        }
        for e in &cfg.edges {
            let [s, r, d] = &e.relation;
            if !self
                .schema
                .relations
                .iter()
                .any(|x| (&x.src, &x.name, &x.dst) == (s, r, d))
            {
                return refuse(format!(
                    "relation {s}__{r}__{d} is not in the graph this import is like"
                ));
            }
        }
        Ok(())
    }

    /// The earlier node table of `ntype`, if it had one.
    pub fn table(&self, ntype: &str) -> Option<&NodeTable> {
        self.record.config.node_table(ntype)
    }

    /// What `ntype` starts from (its id map is taken out of the prior).
    pub fn seed(&mut self, ntype: &str) -> Result<Seed> {
        let ids = self
            .maps
            .remove(ntype)
            .expect("a map per type of the schema");
        let rec = self
            .record
            .types
            .iter()
            .find(|r| r.ntype == ntype)
            .expect("checked at load");
        let labels = if ntype == self.schema.target {
            Some(read_labels(&self.dir, ntype, ids.len() as u64)?)
        } else {
            None
        };
        let classes = if rec.classes.is_empty() {
            (0..self.schema.num_classes)
                .map(|c| c.to_string())
                .collect()
        } else {
            rec.classes.clone()
        };
        let label_sets = match self.schema.label_sets {
            Some(w) if ntype == self.schema.target => {
                let path = paths::label_sets(&self.dir, ntype);
                let f = NpyFile::open(&path, DType::I8)?;
                f.expect_shape(&[ids.len() as u64, u64::from(w)], "label sets")?;
                let names = match rec.label_names.is_empty() {
                    true => (0..w).map(|c| c.to_string()).collect(),
                    false => rec.label_names.clone(),
                };
                Some((names, w as usize, f.to_i8_vec()))
            }
            _ => None,
        };
        Ok(Seed {
            ids,
            blocks: rec.features.clone(),
            classes,
            labels,
            label_sets,
        })
    }

    /// The id map of a type without a table (its ids come from edges).
    pub fn take_map(&mut self, ntype: &str) -> Option<IdMap> {
        self.maps.remove(ntype)
    }

    /// Writes the earlier feature rows of `ntype` to `w`.
    pub fn copy_features(&self, ntype: &str, w: &mut NpyWriter) -> Result<()> {
        let Some((_, ts)) = self.schema.node_types.iter().find(|(n, _)| n == ntype) else {
            return Ok(());
        };
        let Some(dim) = ts.feature_dim else {
            return Ok(());
        };
        let f = NpyFile::open(&paths::features(&self.dir, ntype), DType::F32)?;
        f.expect_shape(&[ts.count, dim], "features")?;
        let step = COPY_ROWS * dim as usize * 4;
        for bytes in f.data().chunks(step) {
            let rows: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            w.write_f32(&rows)?;
        }
        Ok(())
    }

    /// Calls `push(src, dst)` for every earlier edge of `canonical`, if the relation existed.
    pub fn copy_edges(
        &self,
        canonical: &str,
        mut push: impl FnMut(u32, u32) -> Result<()>,
    ) -> Result<()> {
        let Some(r) = self
            .schema
            .relations
            .iter()
            .find(|r| r.canonical() == canonical)
        else {
            return Ok(());
        };
        let f = NpyFile::open(&paths::edges(&self.dir, canonical), DType::I64)?;
        f.expect_shape(&[2, r.count], "edges")?;
        let e = r.count as usize;
        for i in 0..e {
            let (s, d) = (f.i64_at(i), f.i64_at(e + i));
            let (Ok(s), Ok(d)) = (u32::try_from(s), u32::try_from(d)) else {
                return Err(TableError::file(
                    f.path(),
                    format!("edge {i}: id out of range"),
                ));
            };
            push(s, d)?;
        }
        Ok(())
    }
}

/// A configuration part in its serialised form, for comparing.
fn json(v: &impl serde::Serialize) -> Option<serde_json::Value> {
    serde_json::to_value(v).ok()
}
