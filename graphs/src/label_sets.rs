//! Multi-label targets: a set of labels per node of the target type,
//! stored as `nodes/<target>/label_sets.npy` (int8 `[count, width]`).

/// Each target node's labels as a 0/1 row of `width` entries; a row of -1
/// is a node without labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelSets {
    width: usize,
    bits: Vec<i8>,
}

impl LabelSets {
    /// Checks `bits` (`count` rows of `width`: each row all 0/1, or all -1) and wraps them.
    pub fn new(
        width: usize,
        count: usize,
        bits: Vec<i8>,
    ) -> Result<LabelSets, crate::error::Invalid> {
        Self::checked(width, count, bits).map_err(crate::error::Invalid)
    }

    fn checked(width: usize, count: usize, bits: Vec<i8>) -> Result<LabelSets, String> {
        if width == 0 {
            return Err("label sets must have at least one label".into());
        }
        if Some(bits.len()) != count.checked_mul(width) {
            return Err(format!(
                "{} label-set entries for {count} nodes of {width} labels",
                bits.len()
            ));
        }
        for (n, row) in bits.chunks_exact(width).enumerate() {
            let none = row[0] == -1;
            if let Some(j) = row
                .iter()
                .position(|&b| !matches!((none, b), (true, -1) | (false, 0 | 1)))
            {
                return Err(format!(
                    "label {j} of node {n} is {}: a row holds 0 or 1 per label, or -1 in every entry for an unlabelled node",
                    row[j]
                ));
            }
        }
        Ok(LabelSets { width, bits })
    }

    /// Labels per node.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Nodes.
    pub fn count(&self) -> usize {
        self.bits.len() / self.width
    }

    /// Node `n`'s row (0/1 per label, or all -1).
    pub fn row(&self, n: usize) -> &[i8] {
        &self.bits[n * self.width..][..self.width]
    }

    /// Whether node `n` has labels (its row is not -1).
    pub fn known(&self, n: usize) -> bool {
        self.bits[n * self.width] >= 0
    }

    /// Every row, node after node.
    pub fn as_slice(&self) -> &[i8] {
        &self.bits
    }
}

#[cfg(test)]
mod tests {
    use super::LabelSets;

    #[test]
    fn rows_are_whole_sets_or_unlabelled() {
        let s = LabelSets::new(3, 3, vec![1, 0, 1, -1, -1, -1, 0, 0, 0]).unwrap();
        assert_eq!((s.width(), s.count()), (3, 3));
        assert_eq!(s.row(0), &[1, 0, 1]);
        assert!(s.known(0) && !s.known(1) && s.known(2));
        let err = LabelSets::new(3, 1, vec![1, -1, 0]).unwrap_err();
        assert!(err.0.contains("label 1 of node 0 is -1"), "{err}");
        assert!(LabelSets::new(2, 1, vec![2, 0]).is_err());
        assert!(LabelSets::new(2, 2, vec![0, 1, 1]).is_err());
        assert!(LabelSets::new(0, 0, vec![]).is_err());
    }
}
