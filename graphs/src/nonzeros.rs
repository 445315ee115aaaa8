//! The non-zeros of a mostly-zero feature matrix, row by row.
//!
//! Bag-of-words features (heco-acm's 1902 columns are 4-7% non-zero, Cora's
//! 1.3%) are read a few entries per row: a model's first layer multiplies by
//! the non-zeros only. Kept once per feature table ([`crate::Features::nonzeros`]),
//! a mini-batch's rows are picked from here instead of copying and scanning
//! the dense rows every step.

use rayon::prelude::*;

/// Narrower matrices stay dense: a dense product is cheap and the scan would not pay.
pub const MIN_WIDTH: usize = 256;
/// Largest share of non-zero entries taken as sparse: above it a dense
/// product's throughput beats skipping zeros.
pub const MAX_DENSITY: f64 = 0.125;
/// Rows looked at before a full scan, to turn dense matrices away cheaply.
const SAMPLE_ROWS: usize = 64;
/// Rows per parallel chunk of a scan.
const CHUNK_ROWS: usize = 256;

/// The non-zero entries of a `[rows, cols]` matrix, by row, columns ascending.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowNonzeros {
    cols: usize,
    /// Row `r`'s entries are `row_at[r]..row_at[r + 1]` of `col` / `val`.
    row_at: Vec<usize>,
    col: Vec<u32>,
    val: Vec<f32>,
}

impl RowNonzeros {
    /// The non-zeros of row-major `x` (`cols` wide), or `None` when more than
    /// `max_density` of its entries are non-zero. `-0.0` counts as zero.
    pub fn scan(x: &[f32], cols: usize, max_density: f64) -> Option<RowNonzeros> {
        if cols == 0 || !x.len().is_multiple_of(cols) || u32::try_from(cols).is_err() {
            return None;
        }
        let budget = (max_density * x.len() as f64) as usize;
        let sample = &x[..SAMPLE_ROWS.min(x.len() / cols) * cols];
        if sample.iter().filter(|v| **v != 0.0).count() as f64
            > 2.0 * max_density * sample.len() as f64
        {
            return None;
        }
        // Chunks of rows in parallel, then joined in row order.
        let chunks: Vec<(Vec<usize>, Vec<u32>, Vec<f32>)> = x
            .par_chunks(cols * CHUNK_ROWS)
            .map(|chunk| {
                let mut ends = Vec::with_capacity(chunk.len() / cols);
                let (mut cs, mut vs) = (Vec::new(), Vec::new());
                for row in chunk.chunks(cols) {
                    // Most blocks of 16 are all zeros (±0): an OR of their bits says so without branching per entry.
                    for (b, block) in row.chunks(16).enumerate() {
                        if block.iter().fold(0u32, |acc, v| acc | (v.to_bits() << 1)) == 0 {
                            continue;
                        }
                        for (c, &v) in block.iter().enumerate() {
                            if v != 0.0 {
                                cs.push((b * 16 + c) as u32);
                                vs.push(v);
                            }
                        }
                    }
                    ends.push(cs.len());
                }
                (ends, cs, vs)
            })
            .collect();
        let nnz: usize = chunks.iter().map(|c| c.1.len()).sum();
        if nnz > budget {
            return None;
        }
        let mut row_at = Vec::with_capacity(x.len() / cols + 1);
        row_at.push(0);
        let (mut col, mut val) = (Vec::with_capacity(nnz), Vec::with_capacity(nnz));
        for (ends, cs, vs) in chunks {
            let base = col.len();
            row_at.extend(ends.into_iter().map(|e| base + e));
            col.extend(cs);
            val.extend(vs);
        }
        Some(RowNonzeros {
            cols,
            row_at,
            col,
            val,
        })
    }

    /// Rows `ids` of `self`, in that order (repeats allowed).
    ///
    /// # Panics
    /// If an id is not below [`RowNonzeros::rows`].
    pub fn pick(&self, ids: &[u32]) -> RowNonzeros {
        let nnz = ids
            .iter()
            .map(|&i| self.row_at[i as usize + 1] - self.row_at[i as usize])
            .sum();
        let mut row_at = Vec::with_capacity(ids.len() + 1);
        row_at.push(0);
        let (mut col, mut val) = (Vec::with_capacity(nnz), Vec::with_capacity(nnz));
        for &i in ids {
            let span = self.row_at[i as usize]..self.row_at[i as usize + 1];
            col.extend_from_slice(&self.col[span.clone()]);
            val.extend_from_slice(&self.val[span]);
            row_at.push(col.len());
        }
        RowNonzeros {
            cols: self.cols,
            row_at,
            col,
            val,
        }
    }

    /// The matrix, dense and row-major.
    pub fn to_dense(&self) -> Vec<f32> {
        // Row by row, zeroed then filled while in cache: one pass over the
        // output instead of a zeroing pass and a scattering pass.
        let mut out = Vec::with_capacity(self.rows() * self.cols);
        for r in 0..self.rows() {
            let at = out.len();
            out.resize(at + self.cols, 0f32);
            let (cs, vs) = self.row(r);
            for (&c, &v) in cs.iter().zip(vs) {
                out[at + c as usize] = v;
            }
        }
        out
    }

    /// Row `r`'s columns (ascending) and values.
    pub fn row(&self, r: usize) -> (&[u32], &[f32]) {
        let span = self.row_at[r]..self.row_at[r + 1];
        (&self.col[span.clone()], &self.val[span])
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.row_at.len().saturating_sub(1)
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Non-zero entries.
    pub fn nnz(&self) -> usize {
        self.col.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `[rows, cols]` matrix with about `density` of its entries non-zero (some `-0.0`).
    fn sparse(rows: usize, cols: usize, density: f64, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        (0..rows * cols)
            .map(|_| {
                let r = next();
                if (r % 10_000) as f64 / 10_000.0 < density {
                    (r >> 32) as f32 % 7.0 + 0.5
                } else if r % 3 == 0 {
                    -0.0
                } else {
                    0.0
                }
            })
            .collect()
    }

    #[test]
    fn scan_keeps_every_non_zero_and_rebuilds_the_matrix() {
        let (rows, cols) = (700, 300);
        let x = sparse(rows, cols, 0.05, 1);
        let nz = RowNonzeros::scan(&x, cols, MAX_DENSITY).expect("5% is sparse");
        assert_eq!((nz.rows(), nz.cols()), (rows, cols));
        assert_eq!(nz.nnz(), x.iter().filter(|v| **v != 0.0).count());
        let back = nz.to_dense();
        assert!(
            x.iter().zip(&back).all(|(a, b)| a == b),
            "the dense matrix comes back (±0 equal)"
        );
        let (cs, vs) = nz.row(5);
        assert!(cs.windows(2).all(|w| w[0] < w[1]));
        assert!(cs
            .iter()
            .zip(vs)
            .all(|(&c, &v)| x[5 * cols + c as usize] == v && v != 0.0));
    }

    #[test]
    fn picked_rows_equal_the_scan_of_the_gathered_dense_rows() {
        let (rows, cols) = (400, 260);
        let x = sparse(rows, cols, 0.03, 2);
        let nz = RowNonzeros::scan(&x, cols, MAX_DENSITY).unwrap();
        let ids = [7u32, 399, 0, 7, 123];
        let dense: Vec<f32> = ids
            .iter()
            .flat_map(|&i| {
                x[i as usize * cols..(i as usize + 1) * cols]
                    .iter()
                    .copied()
            })
            .collect();
        assert_eq!(nz.pick(&ids), RowNonzeros::scan(&dense, cols, 1.0).unwrap());
        assert_eq!(nz.pick(&[]).rows(), 0);
    }

    #[test]
    fn dense_and_malformed_inputs_are_turned_away() {
        assert!(RowNonzeros::scan(&sparse(100, 300, 0.5, 3), 300, MAX_DENSITY).is_none());
        // Sparse in the sampled rows, dense after: the full count turns it away.
        let mut mixed = sparse(100, 300, 0.01, 4);
        mixed[SAMPLE_ROWS * 300..].iter_mut().for_each(|v| *v = 1.0);
        assert!(RowNonzeros::scan(&mixed, 300, MAX_DENSITY).is_none());
        assert!(RowNonzeros::scan(&[0.0; 10], 3, MAX_DENSITY).is_none());
        assert!(RowNonzeros::scan(&[0.0; 10], 0, MAX_DENSITY).is_none());
    }
}
