//! Results under the original ids: which nodes a table names, and the id
//! column of a result table. A graph imported from tables keeps its original
//! ids (`nodes/<type>/ids.csv`); any other graph's nodes are named by their
//! dense ids.

use std::path::Path;

use crate::config::{format_of, FileFormat};
use crate::error::{Result, TableError};
use crate::ids::{IdKind, IdMap};
use crate::import::ImportRecord;
use crate::source::TableReader;
use crate::write::{ColumnData, ColumnType};

/// How results are written, from the output file's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultFormat {
    /// A bare `.npy` array in node order (no ids).
    Npy,
    /// A table with an id column.
    Table(FileFormat),
}

/// The format of a result file named `path`: `.npy`, `.csv` or `.parquet`.
pub fn result_format(path: &Path) -> crate::error::Result<ResultFormat> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let refuse = |problem: &str| crate::error::TableError::OutputName {
        path: path.to_path_buf(),
        problem: problem.into(),
    };
    if name.ends_with(".npy") {
        return Ok(ResultFormat::Npy);
    }
    if name.ends_with(".gz") || name.ends_with(".tsv") {
        return Err(refuse(
            "results are written as .csv, .parquet or .npy (not gzipped, not tab-separated)",
        ));
    }
    format_of(path).map(ResultFormat::Table).ok_or_else(|| {
        refuse("name the output .npy, .csv or .parquet (the extension picks the format)")
    })
}

/// One node named by a caller (a request's id): an integer or a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRef<'a> {
    /// An integer id (an original integer id, or a dense id).
    Int(i64),
    /// A string id.
    Text(&'a str),
}

/// The names of one node type's nodes.
#[derive(Debug)]
pub struct NodeNames {
    count: u32,
    map: Option<IdMap>,
    classes: Vec<String>,
    labels: Vec<String>,
}

impl NodeNames {
    /// The names of `ntype`'s `count` nodes in graph directory `graph`.
    pub fn load(graph: &Path, ntype: &str, count: u32) -> Result<NodeNames> {
        let Some(record) = ImportRecord::read(graph)? else {
            return Ok(NodeNames {
                count,
                map: None,
                classes: Vec::new(),
                labels: Vec::new(),
            });
        };
        let map = record.ids(graph, ntype, u64::from(count))?;
        let rec = record.types.iter().find(|t| t.ntype == ntype);
        Ok(NodeNames {
            count,
            map: Some(map),
            classes: rec.map(|t| t.classes.clone()).unwrap_or_default(),
            labels: rec.map(|t| t.label_names.clone()).unwrap_or_default(),
        })
    }

    /// Whether the nodes have original ids (else they are named by dense ids).
    pub fn original(&self) -> bool {
        self.map.is_some()
    }

    /// Class names in class order, when the labels were names.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Label names of the label sets in label order, when they were names.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The type of the id column.
    pub fn column_type(&self) -> ColumnType {
        match &self.map {
            Some(m) if m.kind() == IdKind::Text => ColumnType::Text,
            _ => ColumnType::Int,
        }
    }

    /// The id column for dense ids `nodes`.
    pub fn column(&self, nodes: &[u32]) -> ColumnData {
        match &self.map {
            None => ColumnData::Int(nodes.iter().map(|&n| Some(i64::from(n))).collect()),
            Some(m) if m.kind() == IdKind::Int => ColumnData::Int(
                nodes
                    .iter()
                    .map(|&n| m.original(n).and_then(|s| s.parse().ok()))
                    .collect(),
            ),
            Some(m) => ColumnData::Text(nodes.iter().map(|&n| m.original(n)).collect()),
        }
    }

    /// The dense id of the node `id` names, if the type has it: an original id
    /// of an imported graph (an integer given for string ids is read as its
    /// decimal text), else a dense id `0..count`.
    pub fn dense(&self, id: NodeRef) -> Option<u32> {
        match (&self.map, id) {
            (None, NodeRef::Int(v)) => u32::try_from(v).ok().filter(|&d| d < self.count),
            (None, NodeRef::Text(_)) => None,
            (Some(m), NodeRef::Int(v)) => m.lookup_int(v),
            (Some(m), NodeRef::Text(t)) => m.lookup_text(t),
        }
    }

    /// The dense ids of the nodes listed in column `column` of the table `path`,
    /// in table order; an id the graph does not hold is refused with its row.
    pub fn read(&self, path: &Path, column: &str) -> Result<Vec<u32>> {
        let format = format_of(path).ok_or_else(|| {
            TableError::file(
                path,
                "unknown table format: name it .csv, .csv.gz or .parquet",
            )
        })?;
        let mut reader = TableReader::open(path, format, None, &[column])?;
        let mut out = Vec::new();
        while let Some(chunk) = reader.next_chunk()? {
            let cells = &chunk.columns[0];
            for i in 0..chunk.rows {
                let row = chunk.first_row + i as u64;
                let id = match &self.map {
                    Some(m) => m.get(cells, i),
                    None => cells
                        .text(i)
                        .and_then(|t| t.trim().parse::<u32>().ok())
                        .filter(|&d| d < self.count),
                };
                match id {
                    Some(d) => out.push(d),
                    None if cells.is_missing(i) => {
                        return Err(TableError::cell(path, row, column, "missing id"))
                    }
                    None => {
                        return Err(TableError::cell(
                            path,
                            row,
                            column,
                            format!(
                                "'{}' is not a node of this type{}",
                                cells.text(i).unwrap_or_default().escape_debug(),
                                if self.map.is_some() {
                                    ""
                                } else {
                                    " (the graph has no original ids: give dense ids 0..count)"
                                }
                            ),
                        ))
                    }
                }
            }
        }
        if out.is_empty() {
            return Err(TableError::file(path, "the table lists no nodes"));
        }
        Ok(out)
    }
}
