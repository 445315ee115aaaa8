//! Writing tables (CSV or Parquet) column batch by column batch: exported
//! graphs and results under the original ids.

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use graphs::atomic::AtomicFile;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::config::FileFormat;
use crate::error::{Result, TableError};

/// The type of a written column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    /// Strings.
    Text,
    /// 64-bit integers.
    Int,
    /// 32-bit floats.
    Float32,
}

/// The values of one column in a batch; `None` writes a null (an empty CSV field).
#[derive(Clone, Debug)]
pub enum ColumnData {
    /// Strings.
    Text(Vec<Option<String>>),
    /// Integers.
    Int(Vec<Option<i64>>),
    /// Floats (never null).
    Float32(Vec<f32>),
}

impl ColumnData {
    fn len(&self) -> usize {
        match self {
            ColumnData::Text(v) => v.len(),
            ColumnData::Int(v) => v.len(),
            ColumnData::Float32(v) => v.len(),
        }
    }

    fn cell(&self, i: usize) -> String {
        match self {
            ColumnData::Text(v) => v[i].clone().unwrap_or_default(),
            ColumnData::Int(v) => v[i].map(|x| x.to_string()).unwrap_or_default(),
            // Rust prints the shortest text that reads back as the same f32.
            ColumnData::Float32(v) => v[i].to_string(),
        }
    }

    fn array(self) -> ArrayRef {
        match self {
            ColumnData::Text(v) => Arc::new(StringArray::from(v)),
            ColumnData::Int(v) => Arc::new(Int64Array::from(v)),
            ColumnData::Float32(v) => Arc::new(Float32Array::from(v)),
        }
    }
}

/// Writes a table to a CSV or Parquet (Snappy) file.
pub struct TableWriter {
    path: PathBuf,
    types: Vec<ColumnType>,
    inner: Inner,
}

enum Inner {
    Csv(csv::Writer<BufWriter<AtomicFile>>),
    Parquet(ArrowWriter<AtomicFile>, Arc<ArrowSchema>),
}

impl TableWriter {
    /// Starts `path` (written whole by [`TableWriter::finish`], see
    /// [`graphs::atomic`]) with the named, typed columns.
    pub fn create(
        path: &Path,
        format: FileFormat,
        columns: &[(String, ColumnType)],
    ) -> Result<TableWriter> {
        let file = AtomicFile::create(path)?;
        let inner = match format {
            FileFormat::Csv => {
                let mut w = csv::Writer::from_writer(BufWriter::with_capacity(1 << 20, file));
                w.write_record(columns.iter().map(|(n, _)| n))
                    .map_err(|e| csv_io(path, e))?;
                Inner::Csv(w)
            }
            FileFormat::Parquet => {
                let fields: Vec<Field> = columns
                    .iter()
                    .map(|(n, t)| {
                        let ty = match t {
                            ColumnType::Text => DataType::Utf8,
                            ColumnType::Int => DataType::Int64,
                            ColumnType::Float32 => DataType::Float32,
                        };
                        Field::new(n, ty, *t != ColumnType::Float32)
                    })
                    .collect();
                let schema = Arc::new(ArrowSchema::new(fields));
                // Dictionaries suit repeated values (class names); float
                // features rarely repeat, and a reader holds a column's
                // dictionary page for the whole row group: a wide feature
                // table would cost a page per column in the reader's memory.
                let props = columns
                    .iter()
                    .filter(|(_, t)| *t == ColumnType::Float32)
                    .fold(
                        WriterProperties::builder().set_compression(Compression::SNAPPY),
                        |b, (n, _)| {
                            b.set_column_dictionary_enabled(ColumnPath::from(n.as_str()), false)
                        },
                    )
                    .build();
                let w = ArrowWriter::try_new(file, schema.clone(), Some(props))
                    .map_err(|e| TableError::file(path, e.to_string()))?;
                Inner::Parquet(w, schema)
            }
        };
        Ok(TableWriter {
            path: path.to_path_buf(),
            types: columns.iter().map(|(_, t)| *t).collect(),
            inner,
        })
    }

    /// Appends rows: one entry per column, all of one length and of the declared types.
    pub fn write(&mut self, columns: Vec<ColumnData>) -> Result<()> {
        let rows = columns.first().map_or(0, ColumnData::len);
        let typed = columns.len() == self.types.len()
            && columns.iter().zip(&self.types).all(|(c, t)| {
                c.len() == rows
                    && matches!(
                        (c, t),
                        (ColumnData::Text(_), ColumnType::Text)
                            | (ColumnData::Int(_), ColumnType::Int)
                            | (ColumnData::Float32(_), ColumnType::Float32)
                    )
            });
        assert!(
            typed,
            "columns written to {} do not match its declared columns",
            self.path.display()
        );
        match &mut self.inner {
            Inner::Csv(w) => {
                let mut rec: Vec<String> = Vec::with_capacity(columns.len());
                for i in 0..rows {
                    rec.clear();
                    rec.extend(columns.iter().map(|c| c.cell(i)));
                    w.write_record(&rec).map_err(|e| csv_io(&self.path, e))?;
                }
                Ok(())
            }
            Inner::Parquet(w, schema) => {
                let arrays: Vec<ArrayRef> = columns.into_iter().map(ColumnData::array).collect();
                let batch = RecordBatch::try_new(schema.clone(), arrays)
                    .map_err(|e| TableError::file(&self.path, e.to_string()))?;
                w.write(&batch)
                    .map_err(|e| TableError::file(&self.path, e.to_string()))
            }
        }
    }

    /// Moves the complete file into place.
    pub fn finish(self) -> Result<()> {
        match self.inner {
            Inner::Csv(w) => w
                .into_inner()
                .map_err(|e| TableError::io(&self.path, e.into_error()))?
                .into_inner()
                .map_err(|e| TableError::io(&self.path, e.into_error()))?,
            Inner::Parquet(w, _) => w
                .into_inner()
                .map_err(|e| TableError::file(&self.path, e.to_string()))?,
        }
        .commit()?;
        Ok(())
    }
}

fn csv_io(path: &Path, e: csv::Error) -> TableError {
    TableError::io(path, std::io::Error::other(e.to_string()))
}
