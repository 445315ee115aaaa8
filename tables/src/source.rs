//! Reading tables in chunks of rows: CSV (optionally gzipped) and Parquet,
//! each column converted to one of a few cell kinds. Memory stays bounded by a
//! chunk, whatever the table's size.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
    UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use flate2::read::MultiGzDecoder;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use crate::config::FileFormat;
use crate::error::{Result, TableError};

/// Most rows per chunk.
pub const CHUNK_ROWS: usize = 1 << 16;

/// Most cells per chunk: a wide table (hundreds of feature columns) is read
/// in fewer rows at a time, so a chunk stays within tens of megabytes.
const CHUNK_CELLS: usize = 1 << 20;

/// Rows per chunk for a table read through `columns` columns.
fn chunk_rows(columns: usize) -> usize {
    (CHUNK_CELLS / columns.max(1)).clamp(1024, CHUNK_ROWS)
}

/// Longest CSV record accepted, in bytes: larger is a broken file (an
/// unterminated quote swallowing the rest), refused before it fills memory.
const MAX_RECORD_BYTES: u64 = 16 << 20;

/// Text cells of a chunk in one buffer: a chunk of a CSV table holds
/// millions of cells, and a `String` each would cost an allocation apiece.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Texts {
    text: String,
    /// Per cell, where it ends in `text` (it starts where the one before ends).
    ends: Vec<usize>,
    /// Per cell, whether it is missing (an empty CSV field, a null).
    missing: Vec<bool>,
}

impl Texts {
    /// Empty, with room for `cells` cells.
    pub fn with_capacity(cells: usize) -> Texts {
        Texts {
            text: String::new(),
            ends: Vec::with_capacity(cells),
            missing: Vec::with_capacity(cells),
        }
    }

    /// Number of cells.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are no cells.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Appends a cell (`None`: missing).
    pub fn push(&mut self, cell: Option<&str>) {
        if let Some(t) = cell {
            self.text.push_str(t);
        }
        self.ends.push(self.text.len());
        self.missing.push(cell.is_none());
    }

    /// Cell `i`; `None` when missing.
    pub fn get(&self, i: usize) -> Option<&str> {
        if self.missing[i] {
            return None;
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.text[start..self.ends[i]])
    }

    /// The cells in order.
    pub fn iter(&self) -> impl Iterator<Item = Option<&str>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

impl<S: AsRef<str>> FromIterator<Option<S>> for Texts {
    fn from_iter<I: IntoIterator<Item = Option<S>>>(cells: I) -> Texts {
        let mut t = Texts::default();
        for c in cells {
            t.push(c.as_ref().map(AsRef::as_ref));
        }
        t
    }
}

impl<S: AsRef<str>> From<Vec<Option<S>>> for Texts {
    fn from(cells: Vec<Option<S>>) -> Texts {
        cells.into_iter().collect()
    }
}

/// The cells of one column in a chunk; `None` is a missing value (an empty
/// CSV field or a Parquet null).
#[derive(Clone, Debug)]
pub enum Cells {
    /// Text (every CSV column; Parquet strings and types converted to text).
    Text(Texts),
    /// Integers (Parquet integer and boolean columns).
    Int(Vec<Option<i64>>),
    /// Floating-point numbers (Parquet float columns).
    Float(Vec<Option<f64>>),
    /// Lists of values, as text (Parquet list columns).
    List(Vec<Option<Vec<String>>>),
}

impl Cells {
    /// Number of cells.
    pub fn len(&self) -> usize {
        match self {
            Cells::Text(v) => v.len(),
            Cells::Int(v) => v.len(),
            Cells::Float(v) => v.len(),
            Cells::List(v) => v.len(),
        }
    }

    /// Whether there are no cells.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether cell `i` is missing.
    pub fn is_missing(&self, i: usize) -> bool {
        match self {
            Cells::Text(v) => v.missing[i],
            Cells::Int(v) => v[i].is_none(),
            Cells::Float(v) => v[i].is_none(),
            Cells::List(v) => v[i].is_none(),
        }
    }

    /// Cell `i` as a number: `Ok(None)` when missing, `Err` with the offending
    /// text when it is not a number.
    pub(crate) fn number(&self, i: usize) -> std::result::Result<Option<f64>, String> {
        match self {
            Cells::Int(v) => Ok(v[i].map(|x| x as f64)),
            Cells::Float(v) => Ok(v[i]),
            Cells::Text(v) => match v.get(i) {
                None => Ok(None),
                Some(s) => s
                    .trim()
                    .parse::<f64>()
                    .map(Some)
                    .map_err(|_| format!("'{}' is not a number", s.escape_debug())),
            },
            Cells::List(_) => Err("a list where a number is expected".into()),
        }
    }

    /// Cell `i` as a 32-bit float, parsed from text directly (parsing to f64
    /// first and rounding again could differ in the last bit).
    pub(crate) fn number_f32(&self, i: usize) -> std::result::Result<Option<f32>, String> {
        match self {
            Cells::Text(v) => match v.get(i) {
                None => Ok(None),
                Some(s) => {
                    let x = s
                        .trim()
                        .parse::<f32>()
                        .map_err(|_| format!("'{}' is not a number", s.escape_debug()))?;
                    if x.is_infinite() && s.trim().parse::<f64>().is_ok_and(f64::is_finite) {
                        return Err(format!(
                            "'{}' is beyond the float32 range",
                            s.escape_debug()
                        ));
                    }
                    Ok(Some(x))
                }
            },
            _ => self.number(i).map(|x| x.map(|v| v as f32)),
        }
    }

    /// Cell `i` as text (numbers in their shortest form); `None` when missing.
    pub fn text(&self, i: usize) -> Option<String> {
        match self {
            Cells::Text(v) => v.get(i).map(str::to_string),
            Cells::Int(v) => v[i].map(|x| x.to_string()),
            Cells::Float(v) => v[i].map(|x| x.to_string()),
            Cells::List(v) => v[i].as_ref().map(|l| l.join(";")),
        }
    }
}

/// A chunk of rows: the requested columns, in the order requested.
#[derive(Debug)]
pub struct Chunk {
    /// 1-based number of the chunk's first data row in its file.
    pub first_row: u64,
    /// Rows in the chunk.
    pub rows: usize,
    /// One entry per requested column.
    pub columns: Vec<Cells>,
}

/// Reads one table file chunk by chunk.
pub struct TableReader {
    path: PathBuf,
    chunk_rows: usize,
    next_row: u64,
    total: Option<u64>,
    inner: Inner,
}

enum Inner {
    Csv {
        reader: csv::Reader<Box<dyn Read + Send>>,
        index: Vec<usize>,
        record: csv::ByteRecord,
    },
    Parquet {
        reader: ParquetRecordBatchReader,
        names: Vec<String>,
    },
}

impl TableReader {
    /// Opens `path`, checking that every column in `columns` exists.
    pub fn open(
        path: &Path,
        format: FileFormat,
        delimiter: Option<char>,
        columns: &[&str],
    ) -> Result<TableReader> {
        let file = File::open(path).map_err(|e| TableError::io(path, e))?;
        let (inner, total) = match format {
            FileFormat::Csv => {
                let gz = path.to_string_lossy().to_ascii_lowercase().ends_with(".gz");
                let raw: Box<dyn Read + Send> = if gz {
                    Box::new(MultiGzDecoder::new(BufReader::with_capacity(1 << 20, file)))
                } else {
                    Box::new(file)
                };
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().to_ascii_lowercase())
                    .unwrap_or_default();
                let delim = delimiter.unwrap_or_else(|| {
                    if name.ends_with(".tsv") || name.ends_with(".tsv.gz") {
                        '\t'
                    } else {
                        ','
                    }
                });
                if !delim.is_ascii() {
                    return Err(TableError::file(
                        path,
                        format!("delimiter '{delim}' is not one ASCII character"),
                    ));
                }
                let mut reader = csv::ReaderBuilder::new()
                    .delimiter(delim as u8)
                    .has_headers(true)
                    // "a1, DE" means "a1" and "DE", as a spreadsheet user expects.
                    .trim(csv::Trim::All)
                    .buffer_capacity(1 << 20)
                    .from_reader(raw);
                let headers = reader.headers().map_err(|e| csv_error(path, e))?.clone();
                let names: Vec<&str> = headers.iter().map(|h| h.trim()).collect();
                let index = columns
                    .iter()
                    .map(|c| {
                        names
                            .iter()
                            .position(|n| n == c)
                            .ok_or_else(|| missing_column(path, c, &names))
                    })
                    .collect::<Result<Vec<_>>>()?;
                (
                    Inner::Csv {
                        reader,
                        index,
                        record: csv::ByteRecord::new(),
                    },
                    None,
                )
            }
            FileFormat::Parquet => {
                let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| {
                    TableError::file(path, format!("not a readable Parquet file: {e}"))
                })?;
                let schema = builder.schema().clone();
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                let mut roots = Vec::new();
                for c in columns {
                    let i = names
                        .iter()
                        .position(|n| n == c)
                        .ok_or_else(|| missing_column(path, c, &names))?;
                    roots.push(i);
                }
                let total = builder.metadata().file_metadata().num_rows().max(0) as u64;
                let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
                let reader = builder
                    .with_projection(mask)
                    .with_batch_size(chunk_rows(columns.len()))
                    .build()
                    .map_err(|e| {
                        TableError::file(path, format!("not a readable Parquet file: {e}"))
                    })?;
                (
                    Inner::Parquet {
                        reader,
                        names: columns.iter().map(|c| c.to_string()).collect(),
                    },
                    Some(total),
                )
            }
        };
        Ok(TableReader {
            path: path.to_path_buf(),
            chunk_rows: chunk_rows(columns.len()),
            next_row: 1,
            total,
            inner,
        })
    }

    /// Rows in the file, where the format says without reading it (Parquet).
    pub fn total_rows(&self) -> Option<u64> {
        self.total
    }

    /// The next chunk, or `None` at the end of the file.
    pub fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        let first_row = self.next_row;
        let path = &self.path;
        let max_rows = self.chunk_rows;
        let chunk = match &mut self.inner {
            Inner::Csv {
                reader,
                index,
                record,
            } => {
                let mut cols: Vec<Texts> =
                    index.iter().map(|_| Texts::with_capacity(1024)).collect();
                let mut rows = 0;
                while rows < max_rows {
                    let more = reader
                        .read_byte_record(record)
                        .map_err(|e| csv_error(path, e))?;
                    if !more {
                        break;
                    }
                    let row = first_row + rows as u64;
                    if record.as_slice().len() as u64 > MAX_RECORD_BYTES {
                        return Err(TableError::Table {
                            file: path.clone(),
                            row: Some(row),
                            column: None,
                            problem: format!("record longer than {MAX_RECORD_BYTES} bytes"),
                        });
                    }
                    // One check of the record, not one per field (of hundreds).
                    let not_text = || TableError::Table {
                        file: path.clone(),
                        row: Some(row),
                        column: None,
                        problem: "not UTF-8 text".into(),
                    };
                    let all = std::str::from_utf8(record.as_slice()).map_err(|_| not_text())?;
                    for (col, &i) in cols.iter_mut().zip(index.iter()) {
                        let text = match record.range(i) {
                            Some(r) => all.get(r).ok_or_else(not_text)?,
                            None => "",
                        };
                        col.push((!text.is_empty()).then_some(text));
                    }
                    rows += 1;
                }
                if rows == 0 {
                    return Ok(None);
                }
                Chunk {
                    first_row,
                    rows,
                    columns: cols.into_iter().map(Cells::Text).collect(),
                }
            }
            Inner::Parquet { reader, names } => {
                let Some(batch) = reader.next() else {
                    return Ok(None);
                };
                let batch: RecordBatch =
                    batch.map_err(|e| TableError::file(path, format!("reading row group: {e}")))?;
                let mut columns = Vec::with_capacity(names.len());
                for name in names.iter() {
                    let array = batch.column_by_name(name).ok_or_else(|| {
                        TableError::file(path, format!("column '{name}' vanished from a row group"))
                    })?;
                    columns.push(convert(array).map_err(|p| TableError::Table {
                        file: path.clone(),
                        row: None,
                        column: Some(name.clone()),
                        problem: p,
                    })?);
                }
                Chunk {
                    first_row,
                    rows: batch.num_rows(),
                    columns,
                }
            }
        };
        self.next_row += chunk.rows as u64;
        Ok(Some(chunk))
    }
}

impl TableReader {
    /// The chunks, each read on a thread of its own while the one before is
    /// used: parsing text overlaps with what the caller does with the rows.
    /// At most two chunks wait, so memory stays bounded by a few chunks.
    pub fn ahead(mut self) -> Chunks {
        let (total, path) = (self.total, self.path.clone());
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("table-reader".into())
            .spawn(move || {
                // Ends at the end of the file (the channel closes), after an
                // error, or when the caller hangs up (it stopped on an error of its own).
                while let Some(next) = self.next_chunk().transpose() {
                    let failed = next.is_err();
                    if tx.send(next).is_err() || failed {
                        return;
                    }
                }
            });
        let rx = match spawned {
            Ok(_) => rx,
            Err(e) => {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                let _ = tx.send(Err(TableError::io(&path, e)));
                rx
            }
        };
        Chunks {
            rx: Some(rx),
            total,
        }
    }
}

/// A table's chunks read ahead on their own thread ([`TableReader::ahead`]).
pub struct Chunks {
    rx: Option<std::sync::mpsc::Receiver<Result<Chunk>>>,
    total: Option<u64>,
}

impl Chunks {
    /// Rows in the file, where the format says without reading it (Parquet).
    pub fn total_rows(&self) -> Option<u64> {
        self.total
    }

    /// The next chunk, or `None` at the end of the file.
    pub fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        let Some(rx) = &self.rx else {
            return Ok(None);
        };
        match rx.recv() {
            Ok(Ok(c)) => Ok(Some(c)),
            Ok(Err(e)) => {
                self.rx = None;
                Err(e)
            }
            // The reader closes its channel at the end of the file.
            Err(_) => {
                self.rx = None;
                Ok(None)
            }
        }
    }
}

fn missing_column(path: &Path, column: &str, names: &[&str]) -> TableError {
    TableError::Table {
        file: path.to_path_buf(),
        row: None,
        column: Some(column.to_string()),
        problem: format!("no such column (the table has: {})", names.join(", ")),
    }
}

fn csv_error(path: &Path, e: csv::Error) -> TableError {
    let row = e.position().map(|p| p.record());
    match e.into_kind() {
        csv::ErrorKind::Io(io) => TableError::io(path, io),
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => TableError::Table {
            file: path.to_path_buf(),
            row,
            column: None,
            problem: format!("{len} fields where the header has {expected_len}"),
        },
        other => TableError::Table {
            file: path.to_path_buf(),
            row,
            column: None,
            problem: format!("{other:?}"),
        },
    }
}

macro_rules! ints {
    ($a:expr, $t:ty) => {
        Cells::Int(
            $a.as_primitive::<$t>()
                .iter()
                .map(|v| v.map(|x| x as i64))
                .collect(),
        )
    };
}

/// Converts an Arrow column to cells.
fn convert(array: &ArrayRef) -> std::result::Result<Cells, String> {
    Ok(match array.data_type() {
        DataType::Int8 => ints!(array, Int8Type),
        DataType::Int16 => ints!(array, Int16Type),
        DataType::Int32 => ints!(array, Int32Type),
        DataType::Int64 => ints!(array, Int64Type),
        DataType::UInt8 => ints!(array, UInt8Type),
        DataType::UInt16 => ints!(array, UInt16Type),
        DataType::UInt32 => ints!(array, UInt32Type),
        DataType::UInt64 => {
            let a = array.as_primitive::<UInt64Type>();
            let mut out = Vec::with_capacity(a.len());
            for v in a.iter() {
                out.push(match v {
                    Some(x) => Some(
                        i64::try_from(x)
                            .map_err(|_| format!("{x} is beyond the 64-bit signed range"))?,
                    ),
                    None => None,
                });
            }
            Cells::Int(out)
        }
        DataType::Boolean => Cells::Int(
            array
                .as_boolean()
                .iter()
                .map(|v| v.map(i64::from))
                .collect(),
        ),
        DataType::Float16 => Cells::Float(
            array
                .as_primitive::<Float16Type>()
                .iter()
                .map(|v| v.map(f64::from))
                .collect(),
        ),
        DataType::Float32 => Cells::Float(
            array
                .as_primitive::<Float32Type>()
                .iter()
                .map(|v| v.map(f64::from))
                .collect(),
        ),
        DataType::Float64 => Cells::Float(array.as_primitive::<Float64Type>().iter().collect()),
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _) => {
            let mut out = Vec::with_capacity(array.len());
            for i in 0..array.len() {
                if array.is_null(i) {
                    out.push(None);
                    continue;
                }
                let values: ArrayRef = match array.data_type() {
                    DataType::List(_) => array.as_list::<i32>().value(i),
                    DataType::LargeList(_) => array.as_list::<i64>().value(i),
                    _ => array.as_fixed_size_list().value(i),
                };
                let texts = to_text(&values)?;
                out.push(Some(texts.iter().flatten().map(str::to_string).collect()));
            }
            Cells::List(out)
        }
        _ => Cells::Text(to_text(array)?),
    })
}

/// Any other Arrow column as text (strings, dictionaries, dates, decimals).
fn to_text(array: &ArrayRef) -> std::result::Result<Texts, String> {
    let cast: Arc<dyn Array> = arrow_cast::cast(array, &DataType::Utf8)
        .map_err(|e| format!("type {} cannot be read as text: {e}", array.data_type()))?;
    Ok(cast.as_string::<i32>().iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_cells_keep_their_order_and_their_missing_ones() {
        let t: Texts = vec![Some("a1"), None, Some(""), Some("ß,x"), None].into();
        assert_eq!(t.len(), 5);
        let got: Vec<Option<&str>> = t.iter().collect();
        assert_eq!(got, vec![Some("a1"), None, Some(""), Some("ß,x"), None]);
        let c = Cells::Text(t);
        assert!(c.is_missing(1) && !c.is_missing(2));
        assert_eq!(c.text(3).as_deref(), Some("ß,x"));
        assert_eq!(c.text(0).as_deref(), Some("a1"));
    }

    #[test]
    fn chunks_read_ahead_are_the_chunks_read_in_place_and_stop_at_a_bad_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        let mut text = String::from("id,x\n");
        for i in 0..3000 {
            text.push_str(&format!("n{i},{i}\n"));
        }
        std::fs::write(&path, &text).unwrap();
        let open = || TableReader::open(&path, FileFormat::Csv, None, &["x", "id"]).unwrap();
        let (mut here, mut ahead) = (open(), open().ahead());
        let mut chunks = 0;
        while let Some(a) = here.next_chunk().unwrap() {
            let b = ahead.next_chunk().unwrap().expect("as many chunks");
            assert_eq!((a.first_row, a.rows), (b.first_row, b.rows));
            for i in 0..a.rows {
                assert_eq!(a.columns[1].text(i), b.columns[1].text(i));
                assert_eq!(a.columns[0].number(i), b.columns[0].number(i));
            }
            chunks += 1;
        }
        assert!(chunks >= 1);
        assert!(ahead.next_chunk().unwrap().is_none());
        assert!(
            ahead.next_chunk().unwrap().is_none(),
            "and stays at the end"
        );

        // A short record: the error comes through, naming its row, then nothing.
        text.push_str("n-bad\n");
        std::fs::write(&path, &text).unwrap();
        let mut ahead = open().ahead();
        let err = loop {
            match ahead.next_chunk() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the bad row was not refused"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains("1 fields where the header has 2"), "{err}");
        assert!(ahead.next_chunk().unwrap().is_none());
    }
}
