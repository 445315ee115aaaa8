//! Node feature matrices, owned in memory or memory-mapped from a `.npy` file.

use std::sync::OnceLock;

use crate::mapped::Mapped;
use crate::nonzeros::{RowNonzeros, MAX_DENSITY, MIN_WIDTH};

/// A row-major `[rows, dim]` float32 matrix.
pub struct Features {
    rows: usize,
    dim: usize,
    data: Storage,
    /// The non-zeros by row when the matrix is mostly zeros, scanned at first use.
    nonzeros: OnceLock<Option<RowNonzeros>>,
}

enum Storage {
    Owned(Vec<f32>),
    /// Zero-copy view of a mapped file; `offset` is 4-byte aligned.
    Mapped {
        map: Mapped,
        offset: usize,
    },
}

impl std::fmt::Debug for Features {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Features").field("rows", &self.rows).field("dim", &self.dim).field("mapped", &self.is_mapped()).finish()
    }
}

impl Features {
    /// Wraps an owned row-major buffer; `data.len()` must be `rows * dim`.
    pub fn from_vec(rows: usize, dim: usize, data: Vec<f32>) -> Features {
        assert_eq!(data.len(), rows * dim, "feature buffer length must be rows*dim");
        Features { rows, dim, data: Storage::Owned(data), nonzeros: OnceLock::new() }
    }

    /// Wraps a mapping whose bytes from `offset` hold `rows * dim` little-endian
    /// floats; copies instead when the offset is not 4-byte aligned.
    pub(crate) fn from_map(rows: usize, dim: usize, map: Mapped, offset: usize) -> Features {
        let bytes = rows * dim * 4;
        assert!(offset + bytes <= map.len(), "mapping shorter than the feature matrix");
        if offset.is_multiple_of(4) {
            Features { rows, dim, data: Storage::Mapped { map, offset }, nonzeros: OnceLock::new() }
        } else {
            let data = map[offset..offset + bytes].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
            Features::from_vec(rows, dim, data)
        }
    }

    /// Number of rows (nodes).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Width of a row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Whether the data is a file mapping rather than owned memory.
    pub fn is_mapped(&self) -> bool {
        matches!(self.data, Storage::Mapped { .. })
    }

    /// All rows, concatenated.
    pub fn as_slice(&self) -> &[f32] {
        match &self.data {
            Storage::Owned(v) => v,
            Storage::Mapped { map, offset } => bytemuck::cast_slice(&map[*offset..*offset + self.rows * self.dim * 4]),
        }
    }

    /// The first value that is NaN or infinite, as `(row, column, value)`;
    /// scanned in parallel (a few seconds for tens of GiB from the page cache).
    pub fn first_non_finite(&self) -> Option<(usize, usize, f32)> {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 20;
        let data = self.as_slice();
        let at = data.par_chunks(CHUNK).enumerate().find_map_first(|(c, chunk)| chunk.iter().position(|v| !v.is_finite()).map(|i| c * CHUNK + i))?;
        let dim = self.dim.max(1);
        Some((at / dim, at % dim, data[at]))
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.as_slice()[i * self.dim..(i + 1) * self.dim]
    }

    /// The non-zeros by row, when the matrix is at least
    /// [`MIN_WIDTH`](crate::nonzeros::MIN_WIDTH) wide and at most
    /// [`MAX_DENSITY`](crate::nonzeros::MAX_DENSITY) non-zero; scanned once,
    /// at the first call (in parallel), and kept.
    pub fn nonzeros(&self) -> Option<&RowNonzeros> {
        self.nonzeros.get_or_init(|| if self.dim >= MIN_WIDTH { RowNonzeros::scan(self.as_slice(), self.dim, MAX_DENSITY) } else { None }).as_ref()
    }
}
