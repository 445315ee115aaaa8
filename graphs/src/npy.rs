//! The `.npy` array format (versions 1.0 and 2.0, little-endian, C order):
//! a strict header parser, a memory-mapped reader and a streaming writer.
//!
//! Limits are checked before anything is allocated: the header is at most
//! [`MAX_HEADER_LEN`] bytes and the data must be exactly as long as the shape
//! says, so a truncated or padded file is refused rather than half-read.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::atomic::AtomicFile;
use crate::mapped::Mapped;

use crate::error::{GraphError, Result};

/// Largest header we accept; numpy's own are under 200 bytes.
pub const MAX_HEADER_LEN: usize = 1 << 16;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The element types the graph format uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// little-endian float32, `<f4`
    F32,
    /// little-endian int64, `<i8`
    I64,
    /// int8, `|i1`
    I8,
}

impl DType {
    /// numpy's `descr` string.
    pub fn descr(self) -> &'static str {
        match self {
            DType::F32 => "<f4",
            DType::I64 => "<i8",
            DType::I8 => "|i1",
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::I64 => 8,
            DType::I8 => 1,
        }
    }
}

/// A parsed header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The `descr` string as written (e.g. `<f4`).
    pub descr: String,
    /// Whether the data is in Fortran order (we refuse it).
    pub fortran_order: bool,
    /// The array shape.
    pub shape: Vec<u64>,
    /// Byte offset of the data.
    pub data_offset: usize,
}

/// Parses the header at the start of `bytes` (the whole file or a prefix of it).
pub fn parse_header(bytes: &[u8], path: &Path) -> Result<Header> {
    if bytes.len() < 10 {
        return Err(GraphError::npy(
            path,
            "truncated: shorter than the 10-byte preamble",
        ));
    }
    if &bytes[..6] != MAGIC {
        return Err(GraphError::npy(path, "not a .npy file (bad magic string)"));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 => {
            if bytes.len() < 12 {
                return Err(GraphError::npy(
                    path,
                    "truncated: shorter than the 12-byte v2 preamble",
                ));
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        _ => {
            return Err(GraphError::npy(
                path,
                format!("unsupported format version {major}.{minor} (need 1.0 or 2.0)"),
            ))
        }
    };
    if len > MAX_HEADER_LEN {
        return Err(GraphError::npy(
            path,
            format!("header of {len} bytes exceeds the {MAX_HEADER_LEN}-byte limit"),
        ));
    }
    let end = start + len;
    if bytes.len() < end {
        return Err(GraphError::npy(path, "truncated inside the header"));
    }
    let text = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| GraphError::npy(path, "header is not ASCII"))?;
    let dict = HeaderDict::parse(text)
        .map_err(|e| GraphError::npy(path, format!("bad header {text:?}: {e}")))?;
    Ok(Header {
        descr: dict.descr,
        fortran_order: dict.fortran_order,
        shape: dict.shape,
        data_offset: end,
    })
}

struct HeaderDict {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

impl HeaderDict {
    /// Parses numpy's Python-literal dict: `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`.
    fn parse(text: &str) -> std::result::Result<Self, String> {
        let mut p = Lexer {
            s: text.trim_end_matches(['\n', ' ', '\0']).as_bytes(),
            i: 0,
        };
        p.expect(b'{')?;
        let (mut descr, mut fortran, mut shape) = (None, None, None);
        loop {
            p.skip_ws();
            if p.eat(b'}') {
                break;
            }
            let k = p.string()?;
            p.expect(b':')?;
            match k.as_str() {
                "descr" if descr.is_none() => descr = Some(p.string()?),
                "fortran_order" if fortran.is_none() => fortran = Some(p.boolean()?),
                "shape" if shape.is_none() => shape = Some(p.tuple()?),
                other => return Err(format!("unexpected or repeated key '{other}'")),
            }
            p.skip_ws();
            if !p.eat(b',') {
                p.expect(b'}')?;
                break;
            }
        }
        p.skip_ws();
        if p.i != p.s.len() {
            return Err("trailing characters after the dict".into());
        }
        Ok(HeaderDict {
            descr: descr.ok_or("missing 'descr'")?,
            fortran_order: fortran.ok_or("missing 'fortran_order'")?,
            shape: shape.ok_or("missing 'shape'")?,
        })
    }
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, self.i))
        }
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        self.skip_ws();
        let q = *self.s.get(self.i).ok_or("unexpected end")?;
        if q != b'\'' && q != b'"' {
            return Err(format!("expected a string at byte {}", self.i));
        }
        let start = self.i + 1;
        let len = self.s[start..]
            .iter()
            .position(|&c| c == q)
            .ok_or("unterminated string")?;
        self.i = start + len + 1;
        Ok(String::from_utf8_lossy(&self.s[start..start + len]).into_owned())
    }
    fn boolean(&mut self) -> std::result::Result<bool, String> {
        self.skip_ws();
        for (word, v) in [("True", true), ("False", false)] {
            if self.s[self.i..].starts_with(word.as_bytes()) {
                self.i += word.len();
                return Ok(v);
            }
        }
        Err(format!("expected True or False at byte {}", self.i))
    }
    fn tuple(&mut self) -> std::result::Result<Vec<u64>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            if self.eat(b')') {
                return Ok(dims);
            }
            self.skip_ws();
            let start = self.i;
            while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                self.i += 1;
            }
            if start == self.i {
                return Err(format!("expected a dimension at byte {start}"));
            }
            let d = std::str::from_utf8(&self.s[start..self.i])
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or("dimension out of range")?;
            dims.push(d);
            if dims.len() > 32 {
                return Err("more than 32 dimensions".into());
            }
            if !self.eat(b',') {
                self.expect(b')')?;
                return Ok(dims);
            }
        }
    }
}

/// A validated, memory-mapped `.npy` file.
pub struct NpyFile {
    path: PathBuf,
    map: Mapped,
    header: Header,
    dtype: DType,
}

impl std::fmt::Debug for NpyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NpyFile")
            .field("path", &self.path)
            .field("header", &self.header)
            .finish()
    }
}

impl NpyFile {
    /// Opens `path`, checks it holds `dtype` in C order and that the data length
    /// matches the shape exactly.
    pub fn open(path: &Path, dtype: DType) -> Result<NpyFile> {
        let file = crate::input::open(path)?;
        let len = file.metadata().map_err(|e| GraphError::io(path, e))?.len();
        if len < 10 {
            return Err(GraphError::npy(
                path,
                format!("truncated: only {len} bytes"),
            ));
        }
        // The graph directory is treated as immutable while loaded (written
        // once, to a temporary name, then renamed); a change under a run is named by `Mapped`.
        let map = Mapped::map(&file, path)?;
        let header = parse_header(&map, path)?;
        if header.fortran_order {
            return Err(GraphError::npy(
                path,
                "Fortran order is not supported (need C order)",
            ));
        }
        if header.descr != dtype.descr() {
            return Err(GraphError::npy(
                path,
                format!("dtype {} where {} is required", header.descr, dtype.descr()),
            ));
        }
        let elems = header
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| GraphError::npy(path, "shape overflows"))?;
        let want = elems
            .checked_mul(dtype.size() as u64)
            .and_then(|b| b.checked_add(header.data_offset as u64))
            .ok_or_else(|| GraphError::npy(path, "shape overflows"))?;
        if len < want {
            return Err(GraphError::npy(
                path,
                format!(
                    "truncated: shape {:?} needs {want} bytes, file has {len}",
                    header.shape
                ),
            ));
        }
        if len > want {
            return Err(GraphError::npy(
                path,
                format!(
                    "{} trailing bytes after the data of shape {:?}",
                    len - want,
                    header.shape
                ),
            ));
        }
        Ok(NpyFile {
            path: path.to_path_buf(),
            map,
            header,
            dtype,
        })
    }

    /// The array shape.
    pub fn shape(&self) -> &[u64] {
        &self.header.shape
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        (self.map.len() - self.header.data_offset) / self.dtype.size()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw little-endian data bytes.
    pub fn data(&self) -> &[u8] {
        &self.map[self.header.data_offset..]
    }

    /// Byte offset of the data within the mapping.
    pub fn data_offset(&self) -> usize {
        self.header.data_offset
    }

    /// Gives up the mapping (for zero-copy features).
    pub fn into_map(self) -> Mapped {
        self.map
    }

    /// Checks the shape equals `want`, naming `what` in the error.
    pub fn expect_shape(&self, want: &[u64], what: &str) -> Result<()> {
        if self.header.shape != want {
            return Err(GraphError::data(
                &self.path,
                format!("{what}: shape {:?}, expected {want:?}", self.header.shape),
            ));
        }
        Ok(())
    }

    /// The `i`-th int64 element; the file must have been opened as [`DType::I64`].
    #[inline]
    pub fn i64_at(&self, i: usize) -> i64 {
        debug_assert_eq!(self.dtype, DType::I64);
        let o = self.header.data_offset + i * 8;
        i64::from_le_bytes(self.map[o..o + 8].try_into().expect("8 bytes"))
    }

    /// All elements as `i8` (copying); the file must have been opened as [`DType::I8`].
    pub fn to_i8_vec(&self) -> Vec<i8> {
        debug_assert_eq!(self.dtype, DType::I8);
        bytemuck::cast_slice(self.data()).to_vec()
    }

    /// All elements as `f32` (copying).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        debug_assert_eq!(self.dtype, DType::F32);
        self.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect()
    }
}

/// Writes one `.npy` file element by element; the shape is fixed up front and
/// [`NpyWriter::finish`] refuses to close a file with missing elements (or,
/// from [`NpyWriter::create_rows`] and [`NpyWriter::create_len`], the first
/// axis is counted at the end).
pub struct NpyWriter {
    path: PathBuf,
    out: BufWriter<AtomicFile>,
    dtype: DType,
    remaining: u64,
    /// Rows counted as they come: the shape of a row (empty: one element) and
    /// the elements written.
    growing: Option<(Vec<u64>, u64)>,
}

/// The header of an array of `dtype` and `shape`, padded with spaces and a
/// newline so the data starts on a 64-byte boundary and the header takes at
/// least `min_len` bytes.
fn header(dtype: DType, shape: &[u64], min_len: usize) -> Vec<u8> {
    let shape_txt = match shape {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        dtype.descr(),
        shape_txt
    );
    let unpadded = (10 + dict.len() + 1).max(min_len);
    let total = unpadded.div_ceil(64) * 64;
    let mut header = dict.into_bytes();
    header.resize(total - 10 - 1, b' ');
    header.push(b'\n');
    let mut pre = MAGIC.to_vec();
    pre.extend_from_slice(&[1, 0]);
    pre.extend_from_slice(&(header.len() as u16).to_le_bytes());
    pre.extend_from_slice(&header);
    pre
}

impl NpyWriter {
    /// Starts `path` (written whole by [`NpyWriter::finish`], see [`crate::atomic`])
    /// with the header for `dtype` and `shape`.
    pub fn create(path: &Path, dtype: DType, shape: &[u64]) -> Result<NpyWriter> {
        let mut w = NpyWriter::start(path, &header(dtype, shape, 0), dtype)?;
        w.remaining = shape.iter().product();
        Ok(w)
    }

    /// Starts a `[rows, dim]` file whose row count is known only when it is
    /// finished: a stream of unknown length (a CSV table) is written in one
    /// pass. The header is written for the largest count and rewritten at the end.
    pub fn create_rows(path: &Path, dtype: DType, dim: u64) -> Result<NpyWriter> {
        if dim == 0 {
            return Err(GraphError::npy(
                path,
                "rows of no element cannot be counted",
            ));
        }
        NpyWriter::create_growing(path, dtype, vec![dim])
    }

    /// Starts a one-dimensional file whose length is known only when it is
    /// finished (a column of a table streamed in one pass).
    pub fn create_len(path: &Path, dtype: DType) -> Result<NpyWriter> {
        NpyWriter::create_growing(path, dtype, Vec::new())
    }

    fn create_growing(path: &Path, dtype: DType, row: Vec<u64>) -> Result<NpyWriter> {
        let shape: Vec<u64> = std::iter::once(u64::MAX)
            .chain(row.iter().copied())
            .collect();
        let mut w = NpyWriter::start(path, &header(dtype, &shape, 0), dtype)?;
        w.growing = Some((row, 0));
        Ok(w)
    }

    fn start(path: &Path, header: &[u8], dtype: DType) -> Result<NpyWriter> {
        let file = AtomicFile::create(path)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(header).map_err(|e| GraphError::io(path, e))?;
        Ok(NpyWriter {
            path: path.to_path_buf(),
            out,
            dtype,
            remaining: 0,
            growing: None,
        })
    }

    fn take(&mut self, n: usize) -> Result<()> {
        if let Some((_, written)) = &mut self.growing {
            *written += n as u64;
            return Ok(());
        }
        if n as u64 > self.remaining {
            return Err(GraphError::npy(
                &self.path,
                "more elements written than the shape holds",
            ));
        }
        self.remaining -= n as u64;
        Ok(())
    }

    /// Appends float32 elements.
    pub fn write_f32(&mut self, values: &[f32]) -> Result<()> {
        debug_assert_eq!(self.dtype, DType::F32);
        self.take(values.len())?;
        self.out
            .write_all(bytemuck::cast_slice(values))
            .map_err(|e| GraphError::io(&self.path, e))
    }

    /// Appends int64 elements.
    pub fn write_i64(&mut self, values: &[i64]) -> Result<()> {
        debug_assert_eq!(self.dtype, DType::I64);
        self.take(values.len())?;
        self.out
            .write_all(bytemuck::cast_slice(values))
            .map_err(|e| GraphError::io(&self.path, e))
    }

    /// Appends int8 elements.
    pub fn write_i8(&mut self, values: &[i8]) -> Result<()> {
        debug_assert_eq!(self.dtype, DType::I8);
        self.take(values.len())?;
        self.out
            .write_all(bytemuck::cast_slice(values))
            .map_err(|e| GraphError::io(&self.path, e))
    }

    /// Appends unsigned ids widened to int64.
    pub fn write_ids(&mut self, ids: &[u32]) -> Result<()> {
        let mut buf = Vec::with_capacity(ids.len().min(1 << 16));
        for chunk in ids.chunks(1 << 16) {
            buf.clear();
            buf.extend(chunk.iter().map(|&v| i64::from(v)));
            self.write_i64(&buf)?;
        }
        Ok(())
    }

    /// Writes a `[rows, dim]` float32 file in which only the given rows hold
    /// data: the rest are holes of the (sparse) file and read as zeros. Used by
    /// partitions, whose feature files keep the global shape but only the rows
    /// the partition owns.
    pub fn write_sparse_rows<'a>(
        self,
        dim: usize,
        rows: impl Iterator<Item = (u64, &'a [f32])>,
    ) -> Result<()> {
        let mut w = self.into_sparse(dim)?;
        for (r, values) in rows {
            w.put(r, values)?;
        }
        w.finish()
    }

    /// The file as a sparse `[rows, dim]` float32 array whose rows are put one
    /// by one, in increasing order (see [`NpyWriter::write_sparse_rows`]).
    pub fn into_sparse(self, dim: usize) -> Result<SparseRows> {
        use std::io::Seek;
        debug_assert_eq!(self.dtype, DType::F32);
        let path = self.path.clone();
        let total = self.remaining * 4;
        let mut file = self
            .out
            .into_inner()
            .map_err(|e| GraphError::io(&path, e.into_error()))?;
        let start = file
            .stream_position()
            .map_err(|e| GraphError::io(&path, e))?;
        file.file()
            .set_len(start + total)
            .map_err(|e| GraphError::io(&path, e))?;
        Ok(SparseRows {
            path,
            out: BufWriter::with_capacity(1 << 20, file),
            start,
            total,
            dim,
            next: u64::MAX,
        })
    }

    /// Checks every element was written and moves the file into place.
    pub fn finish(mut self) -> Result<()> {
        if let Some((row, written)) = self.growing.take() {
            return self.finish_rows(&row, written);
        }
        if self.remaining != 0 {
            return Err(GraphError::npy(
                &self.path,
                format!("{} elements missing at close", self.remaining),
            ));
        }
        commit(self.out, &self.path)
    }
}

/// A sparse float32 file being written row by row ([`NpyWriter::into_sparse`]).
pub struct SparseRows {
    path: PathBuf,
    out: BufWriter<AtomicFile>,
    start: u64,
    total: u64,
    dim: usize,
    next: u64,
}

impl SparseRows {
    /// Writes row `r`.
    pub fn put(&mut self, r: u64, values: &[f32]) -> Result<()> {
        use std::io::{Seek, SeekFrom};
        let at = self.start + r * self.dim as u64 * 4;
        if values.len() != self.dim || at + values.len() as u64 * 4 > self.start + self.total {
            return Err(GraphError::npy(
                &self.path,
                format!("row {r} does not fit the shape"),
            ));
        }
        if at != self.next {
            self.out
                .seek(SeekFrom::Start(at))
                .map_err(|e| GraphError::io(&self.path, e))?;
        }
        self.out
            .write_all(bytemuck::cast_slice(values))
            .map_err(|e| GraphError::io(&self.path, e))?;
        self.next = at + self.dim as u64 * 4;
        Ok(())
    }

    /// Moves the file into place.
    pub fn finish(self) -> Result<()> {
        commit(self.out, &self.path)
    }
}

impl NpyWriter {
    /// Ends a file of [`NpyWriter::create_rows`] or [`NpyWriter::create_len`]:
    /// whole rows only, and the header rewritten, at its first length, with the count.
    fn finish_rows(mut self, row: &[u64], written: u64) -> Result<()> {
        use std::io::{Seek, SeekFrom};
        let dim: u64 = row.iter().product();
        if !written.is_multiple_of(dim) {
            return Err(GraphError::npy(
                &self.path,
                format!("{written} elements are not whole rows of {dim}"),
            ));
        }
        let shape =
            |n: u64| -> Vec<u64> { std::iter::once(n).chain(row.iter().copied()).collect() };
        let first = header(self.dtype, &shape(u64::MAX), 0).len();
        let fixed = header(self.dtype, &shape(written / dim), first);
        debug_assert_eq!(fixed.len(), first);
        let path = self.path.clone();
        let io = |e| GraphError::io(&path, e);
        self.out.flush().map_err(io)?;
        let file = self.out.get_mut();
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&fixed).map_err(io)?;
        commit(self.out, &self.path)
    }
}

fn commit(out: BufWriter<AtomicFile>, path: &Path) -> Result<()> {
    out.into_inner()
        .map_err(|e| GraphError::io(path, e.into_error()))?
        .commit()
}

/// Writes a whole int64 array.
pub fn write_i64(path: &Path, shape: &[u64], values: &[i64]) -> Result<()> {
    let mut w = NpyWriter::create(path, DType::I64, shape)?;
    w.write_i64(values)?;
    w.finish()
}

/// Writes a whole int8 array.
pub fn write_i8(path: &Path, shape: &[u64], values: &[i8]) -> Result<()> {
    let mut w = NpyWriter::create(path, DType::I8, shape)?;
    w.write_i8(values)?;
    w.finish()
}

/// Writes a whole float32 array.
pub fn write_f32(path: &Path, shape: &[u64], values: &[f32]) -> Result<()> {
    let mut w = NpyWriter::create(path, DType::F32, shape)?;
    w.write_f32(values)?;
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_numpy_headers() {
        let mk = |dict: &str, major: u8| {
            let mut v = MAGIC.to_vec();
            v.push(major);
            v.push(0);
            if major == 1 {
                v.extend_from_slice(&(dict.len() as u16).to_le_bytes());
            } else {
                v.extend_from_slice(&(dict.len() as u32).to_le_bytes());
            }
            v.extend_from_slice(dict.as_bytes());
            v
        };
        let p = Path::new("x.npy");
        let h = parse_header(
            &mk(
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }  \n",
                1,
            ),
            p,
        )
        .unwrap();
        assert_eq!(h.shape, vec![3, 4]);
        assert_eq!(h.descr, "<f4");
        let h = parse_header(
            &mk(
                "{'descr': '<i8', 'fortran_order': False, 'shape': (7,)}\n",
                2,
            ),
            p,
        )
        .unwrap();
        assert_eq!(h.shape, vec![7]);
        let h = parse_header(
            &mk("{'shape': (), 'fortran_order': True, 'descr': '<i8'}", 1),
            p,
        )
        .unwrap();
        assert!(h.fortran_order);
        assert!(h.shape.is_empty());
        for bad in [
            "{'descr': '<f4', 'shape': (3,)}",
            "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}",
        ] {
            assert!(parse_header(&mk(bad, 1), p).is_err(), "{bad}");
        }
        assert!(parse_header(b"\x93NUMPX\x01\x00\x00\x00", p).is_err());
        assert!(parse_header(&mk("{'descr': '<f4'", 3), p).is_err());
    }

    #[test]
    fn write_then_open_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        write_f32(&p, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, -6.5]).unwrap();
        let f = NpyFile::open(&p, DType::F32).unwrap();
        assert_eq!(f.shape(), &[2, 3]);
        assert_eq!(f.data_offset() % 64, 0);
        assert_eq!(f.to_f32_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5]);
        assert!(matches!(
            NpyFile::open(&p, DType::I64),
            Err(GraphError::Npy { .. })
        ));

        let q = dir.path().join("b.npy");
        write_i64(&q, &[2, 2], &[1, -1, i64::MAX, 0]).unwrap();
        let f = NpyFile::open(&q, DType::I64).unwrap();
        assert_eq!(
            (0..4).map(|i| f.i64_at(i)).collect::<Vec<_>>(),
            vec![1, -1, i64::MAX, 0]
        );
    }

    #[test]
    fn writer_refuses_wrong_element_counts() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        let mut w = NpyWriter::create(&p, DType::I64, &[3]).unwrap();
        w.write_i64(&[1, 2]).unwrap();
        assert!(w.finish().is_err());
        let mut w = NpyWriter::create(&p, DType::I64, &[1]).unwrap();
        assert!(w.write_i64(&[1, 2]).is_err());
    }

    #[test]
    fn rows_counted_at_the_end_give_the_header_of_their_count() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        let mut w = NpyWriter::create_rows(&p, DType::F32, 2).unwrap();
        w.write_f32(&[1.0, 2.0, 3.0]).unwrap();
        w.write_f32(&[4.0, 5.0, 6.0]).unwrap();
        w.finish().unwrap();
        let f = NpyFile::open(&p, DType::F32).unwrap();
        assert_eq!(f.shape(), &[3, 2]);
        assert_eq!(f.data_offset() % 64, 0);
        assert_eq!(f.to_f32_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        // The same bytes as a file whose shape was known up front, but the padding.
        let q = dir.path().join("b.npy");
        write_f32(&q, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let g = NpyFile::open(&q, DType::F32).unwrap();
        assert_eq!(f.data(), g.data());

        let mut w = NpyWriter::create_rows(&p, DType::F32, 2).unwrap();
        w.write_f32(&[1.0, 2.0, 3.0]).unwrap();
        assert!(w.finish().is_err(), "half a row");
        assert!(NpyWriter::create_rows(&p, DType::F32, 0).is_err());

        // One axis, counted at the end.
        let mut w = NpyWriter::create_len(&p, DType::I64).unwrap();
        w.write_i64(&[7, 8]).unwrap();
        w.write_i64(&[9]).unwrap();
        w.finish().unwrap();
        let f = NpyFile::open(&p, DType::I64).unwrap();
        assert_eq!(f.shape(), &[3]);
        assert_eq!(f.data_offset() % 64, 0);
        assert_eq!(
            (0..3).map(|i| f.i64_at(i)).collect::<Vec<_>>(),
            vec![7, 8, 9]
        );
        let w = NpyWriter::create_len(&p, DType::I64).unwrap();
        w.finish().unwrap();
        assert_eq!(NpyFile::open(&p, DType::I64).unwrap().shape(), &[0]);
    }
}
