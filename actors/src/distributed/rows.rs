//! Rows of `f32` on the wire: dense (`rows × width` little-endian values,
//! exactly that many bytes) or, where shorter, their non-zeros: `rows + 1`
//! u32 row offsets, then per non-zero its u32 column and its f32 value.
//! Bag-of-words features (heco-acm's 1902 columns are 4-7% non-zero) travel
//! about ten times smaller. A non-zero is any value whose bits are not all
//! zero (-0.0 included), so the receiver gets the same bits either way.
//! The sparse form is always shorter than the dense one, so a payload's
//! length says which it is.

/// `values` (`width`-wide rows) as their non-zeros, or `None` where that is
/// not shorter than the dense bytes.
pub fn encode_sparse(values: &[f32], width: usize) -> Option<Vec<u8>> {
    if width == 0 || !values.len().is_multiple_of(width) {
        return None;
    }
    sparse_rows(&values.chunks(width).collect::<Vec<_>>())
}

/// The rows (each as wide as the dense form implies) as the shorter of the two forms.
pub fn encode_rows(rows: &[&[f32]]) -> Vec<u8> {
    sparse_rows(rows).unwrap_or_else(|| {
        let mut out = Vec::with_capacity(4 * rows.iter().map(|r| r.len()).sum::<usize>());
        for r in rows {
            out.extend_from_slice(bytemuck::cast_slice(r));
        }
        out
    })
}

/// `rows` as their non-zeros, or `None` where that is not shorter. Counting
/// stops as soon as the sparse form would not be shorter, and a payload
/// whose first rows are mostly non-zero goes dense uncounted (dense is
/// always a valid form; the rest would have to be mostly zeros for sparse to
/// win), so dense rows cost a glance at their first 256 values, not a pass
/// over half of them.
fn sparse_rows(rows: &[&[f32]]) -> Option<Vec<u8>> {
    let len: usize = rows.iter().map(|r| r.len()).sum();
    // Shorter iff 4(rows + 1) + 8·nnz < 4·len.
    let room = (4 * len).checked_sub(4 * (rows.len() + 1))?;
    let head = rows.iter().flat_map(|r| r.iter()).take(256);
    let (seen, head_nnz) = head.fold((0usize, 0usize), |(n, z), v| {
        (n + 1, z + usize::from(v.to_bits() != 0))
    });
    if seen == 256 && 4 * head_nnz > 3 * seen && len > 4 * seen {
        return None;
    }
    let mut nnz = 0usize;
    for r in rows {
        nnz += r.iter().filter(|v| v.to_bits() != 0).count();
        if 8 * nnz >= room {
            return None;
        }
    }
    let mut out = Vec::with_capacity(4 * (rows.len() + 1) + 8 * nnz);
    let mut at = 0u32;
    out.extend_from_slice(&at.to_le_bytes());
    for row in rows {
        at += row.iter().filter(|v| v.to_bits() != 0).count() as u32;
        out.extend_from_slice(&at.to_le_bytes());
    }
    for row in rows {
        for (c, v) in row.iter().enumerate().filter(|(_, v)| v.to_bits() != 0) {
            out.extend_from_slice(&(c as u32).to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    Some(out)
}

/// Appends one row received as little-endian f32 bytes to `out`: one copy,
/// from wherever the bytes lie (aligned or not) into place.
pub fn append_row(out: &mut Vec<f32>, bytes: &[u8]) {
    let start = out.len();
    out.resize(start + bytes.len() / 4, 0.0);
    bytemuck::cast_slice_mut::<f32, u8>(&mut out[start..])
        .copy_from_slice(&bytes[..bytes.len() / 4 * 4]);
}

/// `values` as the shorter of the two forms.
pub fn encode(values: &[f32], width: usize) -> Vec<u8> {
    encode_sparse(values, width).unwrap_or_else(|| bytemuck::cast_slice(values).to_vec())
}

/// `rows` rows of `width` values received in either form, as dense
/// little-endian f32 bytes: dense ones as they are (no copy), non-zeros laid
/// out dense, checked before anything is allocated.
pub fn dense(
    bytes: runtime::SharedBytes,
    rows: usize,
    width: usize,
) -> crate::error::Result<runtime::SharedBytes> {
    if bytes.0.len() == 4 * rows * width {
        return Ok(bytes);
    }
    let values = decode_sparse(&bytes.0, rows, width)?;
    Ok(runtime::SharedBytes(
        bytemuck::cast_slice(&values).to_vec().into(),
    ))
}

/// `rows` rows of `width` values from their non-zeros.
pub fn decode_sparse(bytes: &[u8], rows: usize, width: usize) -> crate::error::Result<Vec<f32>> {
    let len = rows * width;
    let bad = |why: &str| {
        Err(crate::error::TrainError::Protocol(format!(
            "{} bytes are neither {rows} rows of {width} f32 values nor their non-zeros: {why}",
            bytes.len()
        )))
    };
    let u32_at = |i: usize| {
        u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]) as usize
    };
    let head = 4 * (rows + 1);
    if bytes.len() < head || bytes.len() >= 4 * len.max(1) + 4 {
        return bad("wrong length");
    }
    let nnz = u32_at(4 * rows);
    if u32_at(0) != 0 || nnz > len || bytes.len() != head + 8 * nnz {
        return bad("its offsets do not match its length");
    }
    let mut out = vec![0f32; len];
    for r in 0..rows {
        let (a, b) = (u32_at(4 * r), u32_at(4 * (r + 1)));
        if a > b || b > nnz {
            return bad("its row offsets are not ascending");
        }
        for p in a..b {
            let at = head + 8 * p;
            let c = u32_at(at);
            if c >= width {
                return bad(&format!("column {c} out of range"));
            }
            out[r * width + c] =
                f32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
        }
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Either form back to values, through [`dense`].
    fn decode(bytes: &[u8], rows: usize, width: usize) -> crate::error::Result<Vec<f32>> {
        let d = dense(runtime::SharedBytes(bytes.to_vec().into()), rows, width)?;
        Ok(d.0
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Three 40-wide rows with four non-zeros, -0.0 among them: `(rows, width, values)`.
    pub(crate) fn mostly_zero() -> (usize, usize, Vec<f32>) {
        let (rows, width) = (3, 40);
        let mut x = vec![0f32; rows * width];
        x[5] = 1.5;
        x[width + 39] = -0.0;
        x[2 * width] = f32::MIN_POSITIVE;
        x[2 * width + 7] = 3.0;
        (rows, width, x)
    }

    #[test]
    fn mostly_zero_rows_travel_as_their_non_zeros_with_the_same_bits() {
        let (rows, width, x) = mostly_zero();
        let p = encode(&x, width);
        assert_eq!(
            encode_rows(&x.chunks(width).collect::<Vec<_>>()),
            p,
            "rows one by one encode the same"
        );
        assert_eq!(
            p.len(),
            4 * 4 + 8 * 4,
            "offsets and four non-zeros (-0.0 kept: its bits are not zero)"
        );
        let back = decode(&p, rows, width).unwrap();
        assert_eq!(
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // Dense rows stay dense, and round-trip.
        let dense: Vec<f32> = (0..rows * width).map(|i| i as f32 + 1.0).collect();
        assert!(encode_sparse(&dense, width).is_none());
        assert_eq!(
            encode_rows(&dense.chunks(width).collect::<Vec<_>>()),
            encode(&dense, width)
        );
        assert_eq!(decode(&encode(&dense, width), rows, width).unwrap(), dense);
        assert_eq!(decode(&encode(&[], 4), 0, 4).unwrap(), Vec::<f32>::new());
        // Damaged payloads are refused before use.
        assert!(decode(&p, rows + 1, width).is_err(), "more rows than sent");
        assert!(decode(&p, rows, 7).is_err(), "a column past the width");
        assert!(decode(&p[..p.len() - 1], rows, width).is_err(), "truncated");
        let mut unordered = p.clone();
        unordered[4..8].copy_from_slice(&9u32.to_le_bytes());
        assert!(
            decode(&unordered, rows, width).is_err(),
            "offsets out of order"
        );
        let mut huge = 0u32.to_le_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge, 1, width).is_err(), "a count past the payload");
        assert!(
            decode(&vec![0u8; 4 * rows * width + 4], rows, width).is_err(),
            "longer than dense"
        );
    }

    #[test]
    fn rows_are_appended_from_unaligned_bytes_with_their_bits() {
        let row = [1.5f32, -0.0, f32::MIN_POSITIVE];
        let mut bytes = vec![9u8];
        bytes.extend(row.iter().flat_map(|v| v.to_le_bytes()));
        let mut out = vec![7.0f32];
        append_row(&mut out, &bytes[1..]);
        assert_eq!(
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            [7.0f32, 1.5, -0.0, f32::MIN_POSITIVE]
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn mostly_non_zero_first_rows_go_dense_and_anything_sparse_enough_still_goes_sparse() {
        let width = 64;
        // Dense rows: dense, whatever follows is never looked at.
        let dense: Vec<f32> = (0..width * 40).map(|i| i as f32 + 1.0).collect();
        assert!(encode_sparse(&dense, width).is_none());
        // Mostly-zero rows after a few dense ones: the dense head is too short to decide alone.
        let mut mixed = vec![0f32; width * 400];
        mixed[..2 * width]
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as f32 + 1.0);
        let p = encode(&mixed, width);
        assert!(p.len() < 4 * mixed.len(), "sparse: {} bytes", p.len());
        assert_eq!(decode(&p, 400, width).unwrap(), mixed);
        // A head past the glance that is mostly zero: counted, and sparse.
        let mut sparse = vec![0f32; width * 100];
        sparse.iter_mut().step_by(9).for_each(|v| *v = 2.5);
        let p = encode(&sparse, width);
        assert!(p.len() < 4 * sparse.len());
        assert_eq!(decode(&p, 100, width).unwrap(), sparse);
    }
}
