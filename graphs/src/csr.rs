//! Compressed sparse rows: the adjacency of one relation in one direction.

/// Row `r`'s neighbors are `indices[offsets[r]..offsets[r+1]]`, sorted ascending
/// (a canonical order, so sampling does not depend on the edge order on disk).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Csr {
    offsets: Vec<u64>,
    indices: Vec<u32>,
}

impl Csr {
    /// Builds from parallel `rows`/`cols` edge lists; `rows[i] < num_rows` is the caller's invariant.
    pub fn from_edges(num_rows: usize, rows: &[u32], cols: &[u32]) -> Csr {
        assert_eq!(rows.len(), cols.len());
        let mut offsets = vec![0u64; num_rows + 1];
        for &r in rows {
            offsets[r as usize + 1] += 1;
        }
        for i in 0..num_rows {
            offsets[i + 1] += offsets[i];
        }
        let mut fill: Vec<u64> = offsets[..num_rows].to_vec();
        let mut indices = vec![0u32; rows.len()];
        for (&r, &c) in rows.iter().zip(cols) {
            let slot = &mut fill[r as usize];
            indices[*slot as usize] = c;
            *slot += 1;
        }
        for r in 0..num_rows {
            indices[offsets[r] as usize..offsets[r + 1] as usize].sort_unstable();
        }
        Csr { offsets, indices }
    }

    /// Bytes of its two arrays.
    pub fn heap_bytes(&self) -> u64 {
        (self.offsets.len() * 8 + self.indices.len() * 4) as u64
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Number of stored edges.
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }

    /// Neighbors of row `r`, sorted.
    #[inline]
    pub fn neighbors(&self, r: u32) -> &[u32] {
        let r = r as usize;
        &self.indices[self.offsets[r] as usize..self.offsets[r + 1] as usize]
    }

    /// Degree of row `r`.
    #[inline]
    pub fn degree(&self, r: u32) -> usize {
        let r = r as usize;
        (self.offsets[r + 1] - self.offsets[r]) as usize
    }

    /// The offsets array (`num_rows + 1` entries).
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// The concatenated neighbor lists.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_sorted_rows() {
        let csr = Csr::from_edges(3, &[2, 0, 2, 2, 0], &[5, 1, 3, 4, 0]);
        assert_eq!(csr.neighbors(0), &[0, 1]);
        assert_eq!(csr.neighbors(1), &[] as &[u32]);
        assert_eq!(csr.neighbors(2), &[3, 4, 5]);
        assert_eq!(csr.degree(2), 3);
        assert_eq!(csr.num_edges(), 5);
    }
}
