//! Node feature matrices, owned in memory or memory-mapped from a `.npy` file,
//! or only some of their rows kept (a partition's own; the others read as zeros).

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
    /// Only some rows held: `slot[row]` is the row's place in `data`, or
    /// [`Features::ABSENT`]; an absent row reads as `zeros`.
    Kept {
        slot: Vec<u32>,
        data: Vec<f32>,
        zeros: Vec<f32>,
    },
}

impl std::fmt::Debug for Features {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Features")
            .field("rows", &self.rows)
            .field("dim", &self.dim)
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl Features {
    /// The place [`Features::held`] gives a row [`Features::keep_rows`] left out.
    pub const ABSENT: u32 = u32::MAX;

    /// Wraps an owned row-major buffer; `data.len()` must be `rows * dim`.
    pub fn from_vec(rows: usize, dim: usize, data: Vec<f32>) -> Features {
        assert_eq!(
            data.len(),
            rows * dim,
            "feature buffer length must be rows*dim"
        );
        Features {
            rows,
            dim,
            data: Storage::Owned(data),
            nonzeros: OnceLock::new(),
        }
    }

    /// Wraps a mapping whose bytes from `offset` hold `rows * dim` little-endian
    /// floats; copies instead when the offset is not 4-byte aligned.
    pub(crate) fn from_map(rows: usize, dim: usize, map: Mapped, offset: usize) -> Features {
        let bytes = rows * dim * 4;
        assert!(
            offset + bytes <= map.len(),
            "mapping shorter than the feature matrix"
        );
        if offset.is_multiple_of(4) {
            Features {
                rows,
                dim,
                data: Storage::Mapped { map, offset },
                nonzeros: OnceLock::new(),
            }
        } else {
            let data = map[offset..offset + bytes]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect();
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

    /// All rows, concatenated, where they are held so (not after
    /// [`Features::keep_rows`]).
    pub fn contiguous(&self) -> Option<&[f32]> {
        match &self.data {
            Storage::Owned(v) => Some(v),
            Storage::Mapped { map, offset } => Some(bytemuck::cast_slice(
                &map[*offset..*offset + self.rows * self.dim * 4],
            )),
            Storage::Kept { .. } => None,
        }
    }

    /// The rows as they are held and, after [`Features::keep_rows`], each
    /// row's place among them ([`Features::ABSENT`] for a row not kept, which
    /// reads as zeros); `None` where they are all held in order.
    pub fn held(&self) -> (&[f32], Option<&[u32]>) {
        match &self.data {
            Storage::Kept { slot, data, .. } => (data, Some(slot)),
            _ => (self.contiguous().unwrap_or_default(), None),
        }
    }

    /// All rows, concatenated, copied (absent rows as zeros).
    pub fn to_vec(&self) -> Vec<f32> {
        self.block(0, self.rows).into_owned()
    }

    /// Rows `start..end`, concatenated: borrowed where they are contiguous.
    pub fn block(&self, start: usize, end: usize) -> std::borrow::Cow<'_, [f32]> {
        match self.contiguous() {
            Some(all) => std::borrow::Cow::Borrowed(&all[start * self.dim..end * self.dim]),
            None => (start..end).flat_map(|i| self.row(i)).copied().collect(),
        }
    }

    /// The first value that is NaN or infinite, as `(row, column, value)`;
    /// scanned in parallel (a few seconds for tens of GiB from the page cache).
    pub fn first_non_finite(&self) -> Option<(usize, usize, f32)> {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 20;
        let (data, slot) = self.held();
        let at = data
            .par_chunks(CHUNK)
            .enumerate()
            .find_map_first(|(c, chunk)| {
                chunk
                    .iter()
                    .position(|v| !v.is_finite())
                    .map(|i| c * CHUNK + i)
            })?;
        let dim = self.dim.max(1);
        let (held, col) = (at / dim, at % dim);
        // A kept row's own number, found once on this error path.
        let row = slot.map_or(Some(held), |s| s.iter().position(|&p| p as usize == held))?;
        Some((row, col, data[at]))
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        match &self.data {
            Storage::Kept { slot, data, zeros } => match slot[i] {
                Features::ABSENT => zeros,
                p => &data[p as usize * self.dim..(p as usize + 1) * self.dim],
            },
            Storage::Owned(v) => &v[i * self.dim..(i + 1) * self.dim],
            Storage::Mapped { map, offset } => {
                let at = *offset + i * self.dim * 4;
                bytemuck::cast_slice(&map[at..at + self.dim * 4])
            }
        }
    }

    /// Keeps only the rows `keep` accepts, copied out of the mapping or
    /// buffer (which is then released); the others read as zeros. A
    /// partition keeps its own rows this way: its file holds the others as
    /// zeros at their global places, and their pages would otherwise stay
    /// resident. Returns the rows kept.
    pub fn keep_rows(&mut self, keep: impl Fn(usize) -> bool) -> usize {
        let mut slot = vec![Features::ABSENT; self.rows];
        let mut data = Vec::new();
        let mut held = 0u32;
        for (i, s) in slot.iter_mut().enumerate() {
            if keep(i) {
                data.extend_from_slice(self.row(i));
                *s = held;
                held += 1;
            }
        }
        data.shrink_to_fit();
        self.data = Storage::Kept {
            slot,
            data,
            zeros: vec![0.0; self.dim],
        };
        self.nonzeros = OnceLock::new();
        held as usize
    }

    /// The non-zeros by row, when the matrix is at least
    /// [`MIN_WIDTH`] wide and at most
    /// [`MAX_DENSITY`] non-zero; scanned once,
    /// at the first call (in parallel), and kept.
    ///
    /// A table whose non-zeros could take more than a sixteenth of the
    /// memory budget ([`crate::memory::budget_bytes`]) is never scanned:
    /// its batches' rows are then scanned one batch at a time.
    pub fn nonzeros(&self) -> Option<&RowNonzeros> {
        self.nonzeros
            .get_or_init(|| {
                let keep = self.dim >= MIN_WIDTH
                    && affordable(self.rows, self.dim, crate::memory::budget_bytes());
                // Kept rows are few: their batches are scanned one at a time.
                match self.contiguous() {
                    Some(all) if keep => RowNonzeros::scan(all, self.dim, MAX_DENSITY),
                    _ => None,
                }
            })
            .as_ref()
    }
}

/// Whether the non-zeros of a `rows × dim` table, at the largest density
/// kept (8 bytes an entry, plus an offset a row), fit in a sixteenth of `budget`.
fn affordable(rows: usize, dim: usize, budget: Option<u64>) -> bool {
    let worst = (rows as f64) * (dim as f64) * MAX_DENSITY * 8.0 + (rows as f64 + 1.0) * 8.0;
    budget.is_none_or(|b| worst <= b as f64 / 16.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_zeros_are_kept_only_for_wide_sparse_tables_that_fit_the_budget() {
        let (rows, dim) = (50, 300);
        let data: Vec<f32> = (0..rows * dim)
            .map(|i| if i % 37 == 0 { 1.5 } else { 0.0 })
            .collect();
        let f = Features::from_vec(rows, dim, data.clone());
        let nz = f.nonzeros().expect("a wide table 3% non-zero");
        assert_eq!(nz.nnz(), data.iter().filter(|v| **v != 0.0).count());
        assert!(std::ptr::eq(nz, f.nonzeros().unwrap()), "scanned once");
        let narrow = Features::from_vec(rows, 100, vec![0.0; rows * 100]);
        assert!(narrow.nonzeros().is_none());
        // 1 M rows of 1902 columns could hold 1.9 GB of non-zeros: kept on a 64 GiB machine, not on 16 GiB.
        assert!(affordable(1_000_000, 1902, Some(64 << 30)));
        assert!(!affordable(1_000_000, 1902, Some(16 << 30)));
        assert!(affordable(1_000_000, 1902, None));
    }

    #[test]
    fn kept_rows_read_as_before_and_the_others_as_zeros() {
        let (rows, dim) = (10, 3);
        let data: Vec<f32> = (0..rows * dim).map(|i| i as f32 + 1.0).collect();
        let mut f = Features::from_vec(rows, dim, data.clone());
        assert_eq!(f.keep_rows(|i| i % 3 == 1), 3);
        assert!(f.contiguous().is_none() && f.nonzeros().is_none());
        for i in 0..rows {
            let want = if i % 3 == 1 {
                &data[i * dim..(i + 1) * dim]
            } else {
                &[0.0; 3][..]
            };
            assert_eq!(f.row(i), want, "row {i}");
        }
        assert_eq!(&f.block(3, 5)[..], &[0.0, 0.0, 0.0, 13.0, 14.0, 15.0]);
        assert_eq!(f.to_vec().len(), rows * dim);
        assert_eq!(f.first_non_finite(), None);
        let mut bad = data;
        bad[7 * dim + 2] = f32::NAN;
        let mut f = Features::from_vec(rows, dim, bad);
        f.keep_rows(|i| i >= 5);
        let (row, col, v) = f.first_non_finite().expect("a NaN in a kept row");
        assert_eq!((row, col), (7, 2));
        assert!(v.is_nan());
    }
}
