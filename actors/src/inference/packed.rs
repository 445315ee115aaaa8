//! Stage rows with their zeros left out, as partitions send them to each
//! other. Between relational layers R-GCN and R-GAT apply a ReLU, so most of
//! a stage's floats are often zero (91% of the author rows of mag-like S=0.5
//! after one epoch). Each row is a bitmap of `width` bits (bit `j % 8` of
//! byte `j / 8` set where float `j` is not `+0.0`), then those floats,
//! little-endian. Lossless: `-0.0` and NaNs are kept as they are.

/// Bytes of one row's bitmap.
fn mask_len(width: usize) -> usize {
    width.div_ceil(8)
}

/// `rows` (each `width` floats) packed, where that takes at most three
/// quarters of their dense size; `None` where it does not pay (found as soon
/// as the packed rows outgrow that, not after packing them all).
pub fn pack(rows: &[&[f32]], width: usize) -> Option<Vec<u8>> {
    let dense = rows.len() * width * 4;
    let fits = |len: usize| len * 4 <= dense * 3;
    let mut out = Vec::with_capacity(dense / 4 * 3 + mask_len(width));
    let mut mask = vec![0u8; mask_len(width)];
    for (r, row) in rows.iter().enumerate() {
        debug_assert_eq!(row.len(), width, "a row of another width");
        // Asked rows lie anywhere in the stage: fetch the next ones early.
        if let Some(ahead) = rows.get(r + AHEAD) {
            graphs::prefetch::prefetch(ahead);
        }
        for (m, eight) in mask.iter_mut().zip(row.chunks(8)) {
            *m = eight
                .iter()
                .enumerate()
                .fold(0, |b, (j, x)| b | u8::from(x.to_bits() != 0) << j);
        }
        out.extend_from_slice(&mask);
        for x in row.iter().filter(|x| x.to_bits() != 0) {
            out.extend_from_slice(&x.to_le_bytes());
        }
        if !fits(out.len()) {
            return None;
        }
    }
    Some(out)
}

/// Rows fetched this far ahead of the one being packed.
const AHEAD: usize = 8;

/// Unpacks `data` into `into`, `into.len() / width` rows of `width` floats
/// (every float written), refusing data that is short, long, or marks floats
/// past a row's width.
pub fn unpack(data: &[u8], width: usize, into: &mut [f32]) -> Result<(), String> {
    if width == 0 || !into.len().is_multiple_of(width) {
        return Err(format!("{} floats are not rows of {width}", into.len()));
    }
    let mlen = mask_len(width);
    let mut at = 0;
    for (r, row) in into.chunks_exact_mut(width).enumerate() {
        let mask = data
            .get(at..at + mlen)
            .ok_or_else(|| format!("row {r}: the data ends in its bitmap"))?;
        at += mlen;
        if !width.is_multiple_of(8) && mask[mlen - 1] >> (width % 8) != 0 {
            return Err(format!("row {r}: its bitmap marks floats past {width}"));
        }
        let nonzero: usize = mask.iter().map(|b| b.count_ones() as usize).sum();
        let values = data
            .get(at..at + 4 * nonzero)
            .ok_or_else(|| format!("row {r}: the data ends in its values"))?;
        at += 4 * nonzero;
        row.fill(0.0);
        // Set bits in order, one value each: the bitmap counted them, and
        // none lies past the row (checked above).
        let mut next = values.chunks_exact(4);
        for (c, &byte) in mask.iter().enumerate() {
            let mut bits = byte;
            while bits != 0 {
                let j = c * 8 + bits.trailing_zeros() as usize;
                if let (Some(x), Some(b)) = (row.get_mut(j), next.next()) {
                    *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                bits &= bits - 1;
            }
        }
    }
    if at != data.len() {
        return Err(format!("{} bytes after the last row", data.len() - at));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mostly_zero_rows_round_trip_to_the_bit_and_dense_ones_are_left_dense() {
        for width in [1usize, 7, 8, 9, 64, 70] {
            let rows: Vec<Vec<f32>> = (0..12)
                .map(|r| {
                    (0..width)
                        .map(|j| match (r + j) % 10 {
                            0 => -0.0,
                            1 => f32::NAN,
                            2 => (r * width + j) as f32 * 0.5 - 3.0,
                            _ => 0.0,
                        })
                        .collect()
                })
                .collect();
            let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            let data =
                pack(&refs, width).unwrap_or_else(|| panic!("width {width}: 70% zeros not packed"));
            let mut back = vec![1.0f32; rows.len() * width];
            unpack(&data, width, &mut back).unwrap();
            let want: Vec<u32> = rows.concat().iter().map(|x| x.to_bits()).collect();
            let got: Vec<u32> = back.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "width {width}");
        }
        let dense = [[1.0f32, 2.0, 3.0, 0.0]];
        assert!(pack(&[&dense[0][..]], 4).is_none());
    }

    #[test]
    fn short_long_or_overreaching_data_is_refused() {
        let rows = [[0.0f32, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]];
        let data = pack(&[&rows[0][..]], 10).unwrap();
        let mut into = vec![0.0f32; 10];
        assert!(unpack(&data[..data.len() - 1], 10, &mut into)
            .unwrap_err()
            .contains("ends in its values"));
        assert!(unpack(&data[..1], 10, &mut into)
            .unwrap_err()
            .contains("ends in its bitmap"));
        let mut long = data.clone();
        long.push(0);
        assert!(unpack(&long, 10, &mut into)
            .unwrap_err()
            .contains("after the last row"));
        let mut past = data.clone();
        past[1] |= 0b100;
        assert!(unpack(&past, 10, &mut into)
            .unwrap_err()
            .contains("past 10"));
        assert!(unpack(&data, 3, &mut into).is_err());
        unpack(&data, 10, &mut into).unwrap();
        assert_eq!(into[1], 5.0);
    }
}
