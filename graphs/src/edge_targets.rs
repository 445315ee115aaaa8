//! What edge tasks learn: the labels (classes) and values (regression
//! targets) of a relation's edges, and which edges are in the train,
//! validation and test splits.
//!
//! On disk they are columns aligned with the relation's edge file
//! (`edges/<canonical>.labels.npy`, `.values.npy`) and lists of positions in
//! it (`.train.npy`, `.valid.npy`, `.test.npy`). In memory only the split
//! edges are kept, each split in a canonical order (destination, source,
//! then label and value), so that what a task trains on does not depend on
//! the order of the edge file.

/// One split's edges with their targets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EdgeSet {
    /// Source ids.
    pub src: Vec<u32>,
    /// Destination ids.
    pub dst: Vec<u32>,
    /// Class per edge, `-1` = none (empty when the relation has no labels).
    pub labels: Vec<i64>,
    /// Value per edge, NaN = none (empty when the relation has no values).
    pub values: Vec<f32>,
}

impl EdgeSet {
    /// Number of edges.
    pub fn len(&self) -> usize {
        self.src.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// The edges at `positions` of the relation's columns (`src`, `dst`,
    /// `labels`, `values`: empty when absent), in canonical order.
    pub(crate) fn gather(
        positions: &[u64],
        src: &[u32],
        dst: &[u32],
        labels: &[i64],
        values: &[f32],
    ) -> EdgeSet {
        let mut order: Vec<usize> = positions.iter().map(|&p| p as usize).collect();
        let label = |i: usize| labels.get(i).copied().unwrap_or(-1);
        let value = |i: usize| values.get(i).map_or(0, |v| v.to_bits());
        order.sort_by_key(|&i| (dst[i], src[i], label(i), value(i)));
        EdgeSet {
            src: order.iter().map(|&i| src[i]).collect(),
            dst: order.iter().map(|&i| dst[i]).collect(),
            labels: match labels.is_empty() {
                true => Vec::new(),
                false => order.iter().map(|&i| labels[i]).collect(),
            },
            values: match values.is_empty() {
                true => Vec::new(),
                false => order.iter().map(|&i| values[i]).collect(),
            },
        }
    }

    /// The edges at `ids` (indices into this set), in that order.
    pub fn select(&self, ids: &[u32]) -> EdgeSet {
        let pick = |i: &u32| *i as usize;
        EdgeSet {
            src: ids.iter().map(|i| self.src[pick(i)]).collect(),
            dst: ids.iter().map(|i| self.dst[pick(i)]).collect(),
            labels: match self.labels.is_empty() {
                true => Vec::new(),
                false => ids.iter().map(|i| self.labels[pick(i)]).collect(),
            },
            values: match self.values.is_empty() {
                true => Vec::new(),
                false => ids.iter().map(|i| self.values[pick(i)]).collect(),
            },
        }
    }
}

/// A relation's edge targets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EdgeTargets {
    /// Classes of the labels (`None`: the relation has no edge labels).
    pub num_classes: Option<u32>,
    /// Whether the edges carry values.
    pub has_values: bool,
    /// Training edges.
    pub train: EdgeSet,
    /// Validation edges.
    pub valid: EdgeSet,
    /// Test edges.
    pub test: EdgeSet,
}

impl EdgeTargets {
    /// The three splits with their names.
    pub fn named(&self) -> [(&'static str, &EdgeSet); 3] {
        [
            ("train", &self.train),
            ("valid", &self.valid),
            ("test", &self.test),
        ]
    }
}

/// Checks one split of a relation of `count` edges: positions in range,
/// unique, not in an earlier split (`seen` holds each position's split tag),
/// each labelled or valued.
pub(crate) fn check_edge_split(
    positions: &[u64],
    seen: &mut [u8],
    tag: u8,
    labels: &[i64],
    values: &[f32],
) -> std::result::Result<(), String> {
    let count = seen.len();
    for &p in positions {
        let Some(slot) = seen.get_mut(p as usize) else {
            return Err(format!("edge position {p} is out of range 0..{count}"));
        };
        if *slot == tag {
            return Err(format!("edge {p} is listed twice"));
        }
        if *slot != 0 {
            return Err(format!("edge {p} is also in another split"));
        }
        *slot = tag;
        let i = p as usize;
        let labelled = labels.get(i).is_some_and(|&l| l >= 0);
        let valued = values.get(i).is_some_and(|v| !v.is_nan());
        if !labelled && !valued {
            return Err(match (labels.is_empty(), values.is_empty()) {
                (false, true) => format!("edge {p} has no label (-1)"),
                (true, false) => format!("edge {p} has no value (NaN)"),
                _ => format!("edge {p} has neither a label (-1) nor a value (NaN)"),
            });
        }
    }
    Ok(())
}

/// Checks edge labels are in `-1..num_classes`.
pub(crate) fn check_edge_labels(
    labels: &[i64],
    num_classes: u32,
) -> std::result::Result<(), String> {
    match labels
        .iter()
        .position(|&l| l < -1 || l >= i64::from(num_classes))
    {
        Some(i) => Err(format!(
            "label {} of edge {i} is outside -1..{num_classes}",
            labels[i]
        )),
        None => Ok(()),
    }
}

/// Checks edge values are finite or NaN (none).
pub(crate) fn check_edge_values(values: &[f32]) -> std::result::Result<(), String> {
    match values.iter().position(|v| v.is_infinite()) {
        Some(i) => Err(format!(
            "the value of edge {i} is {}: values must be finite (NaN for none)",
            values[i]
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_orders_canonically_whatever_the_file_order() {
        let (src, dst) = (vec![3, 1, 2, 0], vec![1, 1, 0, 1]);
        let labels = vec![1, 0, -1, 1];
        let a = EdgeSet::gather(&[0, 1, 3], &src, &dst, &labels, &[]);
        let b = EdgeSet::gather(&[3, 0, 1], &src, &dst, &labels, &[]);
        assert_eq!(a, b);
        assert_eq!(a.dst, vec![1, 1, 1]);
        assert_eq!(a.src, vec![0, 1, 3]);
        assert_eq!(a.labels, vec![1, 0, 1]);
        assert!(a.values.is_empty());
    }

    #[test]
    fn a_split_edge_needs_a_target_and_one_split() {
        let mut seen = vec![0u8; 3];
        assert!(check_edge_split(&[0], &mut seen, 1, &[1, -1, 0], &[]).is_ok());
        let e = check_edge_split(&[1], &mut seen, 2, &[1, -1, 0], &[]).unwrap_err();
        assert!(e.contains("edge 1 has no label"), "{e}");
        let e = check_edge_split(&[0], &mut seen, 2, &[1, -1, 0], &[]).unwrap_err();
        assert!(e.contains("another split"), "{e}");
        let e = check_edge_split(&[2, 2], &mut seen, 3, &[1, -1, 0], &[]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = check_edge_split(&[7], &mut seen, 3, &[1, -1, 0], &[]).unwrap_err();
        assert!(e.contains("out of range 0..3"), "{e}");
        let mut seen = vec![0u8; 2];
        let e = check_edge_split(&[1], &mut seen, 1, &[], &[0.5, f32::NAN]).unwrap_err();
        assert!(e.contains("no value"), "{e}");
        assert!(check_edge_labels(&[0, 2], 2).is_err());
        assert!(check_edge_values(&[f32::INFINITY]).is_err());
    }
}
