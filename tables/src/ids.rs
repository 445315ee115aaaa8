//! Original node ids (integers or strings) mapped to dense ids `0..count`, in
//! the order first seen; saved beside the graph so results can name nodes by
//! their original ids.

use std::hash::BuildHasherDefault;
use std::io::{BufReader, BufWriter};
use std::path::Path;

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

use compact_str::CompactString;
use rustc_hash::FxHasher;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TableError};
use crate::source::Cells;

/// Keys numbered in the order first seen. A lookup reads the hash table
/// alone (its bucket holds key and number): an index set would read an
/// index slot and then the entry, one more cache miss per lookup, and
/// lookups are most of an edge table's import time. The keys in number
/// order are kept only where numbers are turned back into keys (a map read
/// back for results): an import only writes its map, and a second copy of
/// every key would double its memory.
#[derive(Debug)]
struct Set<K> {
    index: HashMap<K, u32, BuildHasherDefault<FxHasher>>,
    order: Option<Vec<K>>,
}

impl<K> Default for Set<K> {
    fn default() -> Self {
        Set {
            index: HashMap::default(),
            order: None,
        }
    }
}

impl<K: Hash + Eq + Clone> Set<K> {
    /// An empty set that also keeps its keys in number order.
    fn with_order() -> Self {
        Set {
            index: HashMap::default(),
            order: Some(Vec::new()),
        }
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    fn reserve(&mut self, n: usize) {
        self.index.reserve(n);
        if let Some(order) = &mut self.order {
            order.reserve(n);
        }
    }

    /// The key's number, and whether it is new.
    fn insert_full(&mut self, k: K) -> (usize, bool) {
        if let Some(&d) = self.index.get(&k) {
            return (d as usize, false);
        }
        // Numbers past u32 are refused by the caller before they are stored.
        let d = self.index.len();
        match &mut self.order {
            Some(order) => {
                self.index.insert(k.clone(), d as u32);
                order.push(k);
            }
            None => {
                self.index.insert(k, d as u32);
            }
        }
        (d, true)
    }

    fn get_index_of<Q: Hash + Eq + ?Sized>(&self, q: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
    {
        self.index.get(q).map(|&d| d as usize)
    }

    /// The key numbered `d`: by the kept order, else by a scan of the table
    /// (maps without the order are written, not read by number).
    fn get_index(&self, d: usize) -> Option<&K> {
        match &self.order {
            Some(order) => order.get(d),
            None => self
                .index
                .iter()
                .find(|&(_, &n)| n as usize == d)
                .map(|(k, _)| k),
        }
    }

    /// The keys in number order.
    fn in_order(&self) -> Vec<&K> {
        if let Some(order) = &self.order {
            return order.iter().collect();
        }
        let mut out: Vec<Option<&K>> = vec![None; self.index.len()];
        for (k, &d) in &self.index {
            out[d as usize] = Some(k);
        }
        out.into_iter()
            .map(|k| k.expect("numbers are 0..len, each given once"))
            .collect()
    }
}

/// Whether a type's original ids are integers or strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdKind {
    /// 64-bit integers (a Parquet integer column).
    Int,
    /// Strings (text columns, and every CSV column).
    Text,
}

/// A dense numbering of original ids.
#[derive(Debug)]
pub struct IdMap(Ids);

#[derive(Debug)]
enum Ids {
    /// Integer ids.
    Int(Set<i64>),
    /// String ids (inline up to 24 bytes: a lookup compares without a pointer chase).
    Text(Set<CompactString>),
}

/// What happened when an id was added.
#[derive(Debug, PartialEq, Eq)]
pub enum Added {
    /// A new id, given this dense id.
    New(u32),
    /// The id was already present, with this dense id.
    Known(u32),
}

impl IdMap {
    /// An empty map for ids of `kind`.
    pub fn new(kind: IdKind) -> IdMap {
        match kind {
            IdKind::Int => IdMap(Ids::Int(Set::default())),
            IdKind::Text => IdMap(Ids::Text(Set::default())),
        }
    }

    /// The kind of the id column `cells` (an integer column gives integer ids).
    pub(crate) fn kind_of(cells: &Cells) -> std::result::Result<IdKind, String> {
        match cells {
            Cells::Int(_) => Ok(IdKind::Int),
            Cells::Text(_) => Ok(IdKind::Text),
            Cells::Float(_) => {
                Err("ids must be integers or strings, not floating-point numbers".into())
            }
            Cells::List(_) => Err("ids must be integers or strings, not lists".into()),
        }
    }

    /// The kind of ids held.
    pub fn kind(&self) -> IdKind {
        match &self.0 {
            Ids::Int(_) => IdKind::Int,
            Ids::Text(_) => IdKind::Text,
        }
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        match &self.0 {
            Ids::Int(s) => s.len(),
            Ids::Text(s) => s.len(),
        }
    }

    /// Makes room for `n` more ids (a table's row count known up front).
    pub fn reserve(&mut self, n: usize) {
        match &mut self.0 {
            Ids::Int(s) => s.reserve(n),
            Ids::Text(s) => s.reserve(n),
        }
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds cell `i` of `cells` (not missing). Errors say what is wrong with the value.
    pub(crate) fn add(&mut self, cells: &Cells, i: usize) -> std::result::Result<Added, String> {
        let (index, new) = match (&mut self.0, cells) {
            (Ids::Int(s), Cells::Int(v)) => s.insert_full(v[i].ok_or("missing id")?),
            (Ids::Text(s), Cells::Text(v)) => {
                let t = v.get(i).ok_or("missing id")?;
                match s.get_index_of(t) {
                    Some(k) => (k, false),
                    None => s.insert_full(t.into()),
                }
            }
            (Ids::Text(s), c) => {
                let t = c.text(i).ok_or("missing id")?;
                match s.get_index_of(t.as_str()) {
                    Some(k) => (k, false),
                    None => s.insert_full(t.into()),
                }
            }
            (Ids::Int(s), c) => {
                let t = c.text(i).ok_or("missing id")?;
                let v: i64 = t.trim().parse().map_err(|_| {
                    format!(
                        "id '{}' is not an integer like this type's other ids",
                        t.escape_debug()
                    )
                })?;
                s.insert_full(v)
            }
        };
        let id = u32::try_from(index)
            .ok()
            .filter(|&d| u64::from(d) < graphs::schema::MAX_NODES)
            .ok_or_else(|| format!("more than {} nodes of one type", graphs::schema::MAX_NODES))?;
        Ok(if new {
            Added::New(id)
        } else {
            Added::Known(id)
        })
    }

    /// The dense id of cell `i`, if known (`None` also for a missing cell).
    pub fn get(&self, cells: &Cells, i: usize) -> Option<u32> {
        let k = match (&self.0, cells) {
            (Ids::Int(s), Cells::Int(v)) => s.get_index_of(&v[i]?),
            (Ids::Text(s), Cells::Text(v)) => s.get_index_of(v.get(i)?),
            (Ids::Text(s), c) => s.get_index_of(c.text(i)?.as_str()),
            (Ids::Int(s), c) => s.get_index_of(&c.text(i)?.trim().parse::<i64>().ok()?),
        };
        k.map(|k| k as u32)
    }

    /// The dense id of integer id `v` (read as text for string ids).
    pub fn lookup_int(&self, v: i64) -> Option<u32> {
        match &self.0 {
            Ids::Int(s) => s.get_index_of(&v).map(|k| k as u32),
            Ids::Text(s) => s.get_index_of(v.to_string().as_str()).map(|k| k as u32),
        }
    }

    /// The dense id of string id `t` (parsed for integer ids).
    pub fn lookup_text(&self, t: &str) -> Option<u32> {
        match &self.0 {
            Ids::Int(s) => s
                .get_index_of(&t.trim().parse::<i64>().ok()?)
                .map(|k| k as u32),
            Ids::Text(s) => s.get_index_of(t).map(|k| k as u32),
        }
    }

    /// The original id of dense id `d`, as text.
    pub fn original(&self, d: u32) -> Option<String> {
        match &self.0 {
            Ids::Int(s) => s.get_index(d as usize).map(|v| v.to_string()),
            Ids::Text(s) => s.get_index(d as usize).map(|v| v.to_string()),
        }
    }

    /// Writes the ids one per row, in dense order, as a one-column CSV with header `id`.
    pub fn write_csv(&self, path: &Path) -> Result<()> {
        let file = graphs::atomic::AtomicFile::create(path)?;
        let mut w = csv::Writer::from_writer(BufWriter::with_capacity(1 << 20, file));
        let err = |e: csv::Error| TableError::io(path, std::io::Error::other(e.to_string()));
        w.write_record(["id"]).map_err(err)?;
        match &self.0 {
            Ids::Int(s) => {
                for v in s.in_order() {
                    w.write_record([v.to_string()]).map_err(err)?;
                }
            }
            Ids::Text(s) => {
                for v in s.in_order() {
                    w.write_record([v.as_str()]).map_err(err)?;
                }
            }
        }
        let file = w
            .into_inner()
            .map_err(|e| TableError::io(path, std::io::Error::other(e.to_string())))?
            .into_inner()
            .map_err(|e| TableError::io(path, e.into_error()))?;
        Ok(file.commit()?)
    }

    /// Reads a map written by [`IdMap::write_csv`].
    pub fn read_csv(path: &Path, kind: IdKind) -> Result<IdMap> {
        let file = std::fs::File::open(path).map_err(|e| TableError::io(path, e))?;
        let mut r = csv::Reader::from_reader(BufReader::with_capacity(1 << 20, file));
        // Read back to turn dense ids into original ones: keep the order.
        let mut map = IdMap(match kind {
            IdKind::Int => Ids::Int(Set::with_order()),
            IdKind::Text => Ids::Text(Set::with_order()),
        });
        let mut rec = csv::StringRecord::new();
        let mut row = 0u64;
        while r
            .read_record(&mut rec)
            .map_err(|e| TableError::file(path, e.to_string()))?
        {
            row += 1;
            let cells = Cells::Text(vec![rec.get(0)].into());
            match map.add(&cells, 0) {
                Ok(Added::New(_)) => {}
                Ok(Added::Known(_)) => {
                    return Err(TableError::cell(path, row, "id", "id listed twice"))
                }
                Err(p) => return Err(TableError::cell(path, row, "id", p)),
            }
        }
        Ok(map)
    }
}

/// Reads the saved ids of a type as text, in dense order (for writing results).
pub fn read_original_ids(path: &Path) -> Result<Vec<String>> {
    let file = std::fs::File::open(path).map_err(|e| TableError::io(path, e))?;
    let mut out = Vec::new();
    let mut r = csv::Reader::from_reader(BufReader::new(file));
    for rec in r.records() {
        let rec = rec.map_err(|e| TableError::file(path, e.to_string()))?;
        out.push(rec.get(0).unwrap_or_default().to_string());
    }
    Ok(out)
}
