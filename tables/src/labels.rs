//! Labels and splits of the target type: class names mapped to class ids,
//! and the labelled nodes divided into train, valid and test by a column,
//! by fractions with a seed, or by time.

use std::collections::HashMap;

use std::path::Path;

use graphs::format::paths;
use graphs::npy::{DType, NpyFile};
use graphs::rng::CounterRng;

use crate::error::TableError;

use crate::config::SplitRule;
use crate::source::Cells;

/// Where a node goes (0: no split).
const NONE: u8 = 0;
const NAMES: [&str; 3] = ["train", "valid", "test"];

/// Class names met row by row (of nodes or edges), each given a provisional
/// index, then mapped to class ids: integer names keep their value (a
/// negative one means unlabelled, as in the graph format), other names are sorted.
#[derive(Debug, Default)]
pub struct ClassNames {
    names: Vec<String>,
    index: HashMap<String, i32>,
    max_classes: u32,
    /// Whether the classes are fixed (an earlier import's): a new one is refused.
    frozen: bool,
    /// Classes declared by the configuration, when more than the labels show.
    min_classes: u32,
}

/// Per provisional index its class id (-1: unlabelled), the number of
/// classes, and the class names in class order (empty for integer classes).
pub type Resolved = (Vec<i64>, u32, Vec<String>);

impl ClassNames {
    /// Names refusing more than `max_classes` classes.
    pub fn new(max_classes: u32) -> ClassNames {
        ClassNames {
            max_classes,
            ..Default::default()
        }
    }

    /// An earlier import's classes, in class order (integers as text), fixed.
    pub fn seeded(max_classes: u32, classes: Vec<String>) -> ClassNames {
        let index = classes
            .iter()
            .enumerate()
            .map(|(k, n)| (n.clone(), k as i32))
            .collect();
        ClassNames {
            names: classes,
            index,
            max_classes: max_classes.max(1),
            frozen: true,
            min_classes: 0,
        }
    }

    /// Declares `n` classes: integer labels then have at least `n` classes
    /// even when the highest ones label nothing.
    pub fn with_classes(mut self, n: Option<u32>) -> ClassNames {
        self.min_classes = n.unwrap_or(0);
        self
    }

    /// The provisional index of the class in cell `i` (-1: none).
    pub fn push(&mut self, cells: &Cells, i: usize) -> Result<i32, String> {
        let v = match cells {
            Cells::Float(v) => match v[i] {
                Some(x) if x.fract() == 0.0 && x.is_finite() => Some((x as i64).to_string()),
                Some(x) => return Err(format!("label {x} is not a class (an integer or a name)")),
                None => None,
            },
            Cells::List(_) => return Err("a list where a class is expected".into()),
            c => c
                .text(i)
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()),
        };
        let Some(name) = v else {
            return Ok(-1);
        };
        if let Some(&k) = self.index.get(&name) {
            return Ok(k);
        }
        if self.frozen {
            return Err(format!(
                "class '{}' is not one of the earlier import's classes ({})",
                name.escape_debug(),
                self.names.join(", ")
            ));
        }
        // A negative integer ("-1") marks an unlabelled row, not a class.
        let classes = self
            .names
            .iter()
            .filter(|n| as_int(n).is_none_or(|v| v >= 0))
            .count();
        if as_int(&name).is_none_or(|v| v >= 0) && classes as u32 >= self.max_classes {
            return Err(format!(
                "more than {} distinct classes (raise `max_classes` up to {})",
                self.max_classes,
                graphs::schema::MAX_CLASSES
            ));
        }
        let k = self.names.len() as i32;
        self.index.insert(name.clone(), k);
        self.names.push(name);
        Ok(k)
    }

    /// The class ids of the provisional indices; errors say what the table or config must change.
    pub fn resolve(&self) -> Result<Resolved, String> {
        let ints: Option<Vec<i64>> = self.names.iter().map(|n| as_int(n)).collect();
        Ok(match ints {
            Some(v) => {
                if let Some(big) = v.iter().find(|&&c| c >= i64::from(self.max_classes)) {
                    return Err(format!(
                        "class {big} is not below max_classes = {} (raise it up to {})",
                        self.max_classes,
                        graphs::schema::MAX_CLASSES
                    ));
                }
                let n = (v.iter().copied().max().map_or(0, |m| m + 1).max(0) as u32)
                    .max(self.min_classes);
                (v.into_iter().map(|c| c.max(-1)).collect(), n, Vec::new())
            }
            None if self.names.len() as u32 > self.max_classes => {
                return Err(format!(
                    "more than {} distinct classes (raise `max_classes` up to {})",
                    self.max_classes,
                    graphs::schema::MAX_CLASSES
                ))
            }
            None => {
                let mut sorted: Vec<(usize, &String)> = self.names.iter().enumerate().collect();
                sorted.sort_by(|a, b| a.1.cmp(b.1));
                let mut map = vec![0i64; self.names.len()];
                for (class, (k, _)) in sorted.iter().enumerate() {
                    map[*k] = class as i64;
                }
                let classes = sorted.into_iter().map(|(_, n)| n.clone()).collect();
                (map, self.names.len() as u32, classes)
            }
        })
    }
}

/// Labels and split marks collected row by row.
#[derive(Debug, Default)]
pub struct LabelCollector {
    /// Per node: index into the class names, or -1 when unlabelled.
    raw: Vec<i32>,
    classes: ClassNames,
    /// Per node: 0 none, 1 train, 2 valid, 3 test (column and time rules).
    marks: Vec<u8>,
    /// Nodes carried over from an earlier import: their splits are kept.
    keep: usize,
}

/// The labels of every node and the three splits, ascending.
#[derive(Debug)]
pub struct Labelled {
    /// Class per node, -1 when unlabelled.
    pub labels: Vec<i64>,
    /// Number of classes.
    pub num_classes: u32,
    /// Class names, in class order, when the labels were names (else empty).
    pub classes: Vec<String>,
    /// Train, valid and test node ids.
    pub splits: [Vec<u32>; 3],
}

impl LabelCollector {
    /// A collector refusing more than `max_classes` classes.
    pub fn new(max_classes: u32) -> LabelCollector {
        LabelCollector {
            classes: ClassNames::new(max_classes),
            ..Default::default()
        }
    }

    /// A collector continuing an earlier import: its classes (in class order),
    /// and its nodes' labels and split marks, which are kept.
    pub fn seeded(
        max_classes: u32,
        classes: Vec<String>,
        labels: &[i64],
        marks: Vec<u8>,
    ) -> LabelCollector {
        LabelCollector {
            raw: labels
                .iter()
                .map(|&l| if l < 0 { -1 } else { l as i32 })
                .collect(),
            classes: ClassNames::seeded(max_classes, classes),
            keep: marks.len(),
            marks,
        }
    }

    /// Declares `n` classes: integer labels then have at least `n` classes
    /// even when the highest ones label no node.
    pub fn with_classes(mut self, n: Option<u32>) -> LabelCollector {
        self.classes = self.classes.with_classes(n);
        self
    }

    /// Takes the label of the next node from cell `i`.
    pub fn push_label(&mut self, cells: &Cells, i: usize) -> Result<(), String> {
        let id = self.classes.push(cells, i)?;
        self.raw.push(id);
        Ok(())
    }

    /// Takes the split of the next node from cell `i` of a split column.
    pub fn push_split_name(&mut self, cells: &Cells, i: usize) -> Result<(), String> {
        let mark = match cells.text(i).map(|t| t.trim().to_ascii_lowercase()) {
            None => NONE,
            Some(t) => match t.as_str() {
                "" | "none" => NONE,
                "train" => 1,
                "valid" | "val" | "validation" => 2,
                "test" => 3,
                _ => {
                    return Err(format!(
                        "split '{}' is not train, valid or test (or empty)",
                        t.escape_debug()
                    ))
                }
            },
        };
        if mark != NONE && self.raw.last().is_some_and(|&l| l < 0) {
            return Err(format!(
                "the node is in the {} split but has no label",
                NAMES[mark as usize - 1]
            ));
        }
        self.marks.push(mark);
        Ok(())
    }

    /// Takes the split of the next node from cell `i` of a time column.
    pub fn push_split_time(
        &mut self,
        cells: &Cells,
        i: usize,
        train_before: f64,
        valid_before: f64,
    ) -> Result<(), String> {
        let labelled = self.raw.last().is_some_and(|&l| l >= 0);
        let mark = match cells.number(i)? {
            _ if !labelled => NONE,
            None => return Err("a labelled node has no time".into()),
            Some(t) if !t.is_finite() => return Err(format!("time {t} is not a finite number")),
            Some(t) if t < train_before => 1,
            Some(t) if t < valid_before => 2,
            Some(_) => 3,
        };
        self.marks.push(mark);
        Ok(())
    }

    /// The labels and splits; errors say what the table or config must change.
    pub fn finish(self, rule: &SplitRule) -> Result<Labelled, String> {
        // Integer classes (also written "3.0") keep their value as class id, a
        // negative one meaning unlabelled, as in the graph format; other names
        // are sorted.
        let (map, num_classes, classes) = self.classes.resolve()?;
        if num_classes == 0 {
            return Err("no node has a label".into());
        }
        let labels: Vec<i64> = self
            .raw
            .iter()
            .map(|&r| if r < 0 { -1 } else { map[r as usize] })
            .collect();
        let mut splits: [Vec<u32>; 3] = Default::default();
        match rule {
            SplitRule::Fractions(f, seed) => {
                // Carried-over nodes keep their splits; new labelled ones are shuffled.
                for (node, &m) in self.marks.iter().enumerate().take(self.keep) {
                    if m != NONE {
                        splits[m as usize - 1].push(node as u32);
                    }
                }
                let mut ids: Vec<u32> = (self.keep as u32..labels.len() as u32)
                    .filter(|&i| labels[i as usize] >= 0)
                    .collect();
                let mut rng = CounterRng::from_parts(&[0x7ab1e5, *seed]);
                for i in (1..ids.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    ids.swap(i, j);
                }
                let n = ids.len() as f64;
                let (a, b) = (
                    (f[0] * n).round() as usize,
                    ((f[0] + f[1]) * n).round() as usize,
                );
                let c = ((f[0] + f[1] + f[2]) * n).round() as usize;
                for (k, range) in [(0, 0..a), (1, a..b), (2, b..c.min(ids.len()))] {
                    splits[k].extend_from_slice(&ids[range]);
                    splits[k].sort_unstable();
                }
            }
            _ => {
                for (node, &m) in self.marks.iter().enumerate() {
                    if m == NONE {
                        continue;
                    }
                    if labels[node] < 0 {
                        return Err(format!(
                            "node {} (row {}) is in the {} split but has no label",
                            node,
                            node + 1,
                            NAMES[m as usize - 1]
                        ));
                    }
                    splits[m as usize - 1].push(node as u32);
                }
            }
        }
        for (k, s) in splits.iter().enumerate() {
            if s.is_empty() {
                return Err(format!(
                    "the {} split is empty: every split needs at least one labelled node",
                    NAMES[k]
                ));
            }
        }
        Ok(Labelled {
            labels,
            num_classes,
            classes,
            splits,
        })
    }
}

/// The labels of target type `ntype` (of `count` nodes) in graph directory
/// `dir`, and each node's split mark (0 none, 1 train, 2 valid, 3 test).
pub fn read_labels(dir: &Path, ntype: &str, count: u64) -> crate::Result<(Vec<i64>, Vec<u8>)> {
    let f = NpyFile::open(&paths::labels(dir, ntype), DType::I64)?;
    f.expect_shape(&[count], "labels")?;
    let labels: Vec<i64> = (0..f.len()).map(|i| f.i64_at(i)).collect();
    let mut marks = vec![NONE; count as usize];
    for (k, s) in NAMES.into_iter().enumerate() {
        let f = NpyFile::open(&paths::split(dir, ntype, s), DType::I64)?;
        for i in 0..f.len() {
            let v = f.i64_at(i);
            let slot = usize::try_from(v)
                .ok()
                .and_then(|v| marks.get_mut(v))
                .ok_or_else(|| {
                    TableError::file(f.path(), format!("node id {v} out of range 0..{count}"))
                })?;
            *slot = k as u8 + 1;
        }
    }
    Ok((labels, marks))
}

/// The name of split mark `m` (1, 2, 3), or "" for none.
pub fn split_name(m: u8) -> &'static str {
    match m {
        1..=3 => NAMES[m as usize - 1],
        _ => "",
    }
}

/// `name` as an integer class, if it is one ("3", "3.0", "-1").
fn as_int(name: &str) -> Option<i64> {
    name.parse::<i64>().ok().or_else(|| {
        let v: f64 = name.parse().ok()?;
        (v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15).then_some(v as i64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &[&str]) -> Cells {
        Cells::Text(
            v.iter()
                .map(|s| (!s.is_empty()).then(|| s.to_string()))
                .collect(),
        )
    }

    #[test]
    fn integer_classes_keep_their_values_and_names_are_sorted() {
        let mut c = LabelCollector::new(10);
        let l = text(&["3", "", "1"]);
        let s = text(&["train", "", "test"]);
        for i in 0..3 {
            c.push_label(&l, i).unwrap();
            c.push_split_name(&s, i).unwrap();
        }
        c.marks[1] = 0;
        let err = c.finish(&SplitRule::Column("s".into())).unwrap_err();
        assert!(err.contains("valid split is empty"), "{err}");

        let mut c = LabelCollector::new(10);
        let l = text(&["b", "a", "c", "a"]);
        let s = text(&["train", "valid", "test", "val"]);
        for i in 0..4 {
            c.push_label(&l, i).unwrap();
            c.push_split_name(&s, i).unwrap();
        }
        let got = c.finish(&SplitRule::Column("s".into())).unwrap();
        assert_eq!(got.labels, [1, 0, 2, 0]);
        assert_eq!(got.classes, ["a", "b", "c"]);
        assert_eq!(got.splits, [vec![0], vec![1, 3], vec![2]]);
    }

    #[test]
    fn negative_integer_labels_are_unlabelled_and_large_ones_refused() {
        let mut c = LabelCollector::new(20);
        let l = text(&["-1", "10", "2.0", "3"]);
        let s = text(&["", "train", "valid", "test"]);
        for i in 0..4 {
            c.push_label(&l, i).unwrap();
            c.push_split_name(&s, i).unwrap();
        }
        let got = c.finish(&SplitRule::Column("s".into())).unwrap();
        assert_eq!(got.labels, [-1, 10, 2, 3]);
        assert_eq!(got.num_classes, 11);
        let mut c = LabelCollector::new(5);
        c.push_label(&text(&["7"]), 0).unwrap();
        assert!(c
            .finish(&SplitRule::Fractions([1.0, 0.0, 0.0], 0))
            .unwrap_err()
            .contains("class 7 is not below max_classes = 5"));
    }

    #[test]
    fn fractions_split_only_labelled_nodes_the_same_way_for_a_seed() {
        let run = |seed| {
            let mut c = LabelCollector::new(10);
            let l = text(&["0", "1", "", "0", "1", "0", "1", "0", "1", "0", "1"]);
            for i in 0..11 {
                c.push_label(&l, i).unwrap();
            }
            c.finish(&SplitRule::Fractions([0.6, 0.2, 0.2], seed))
                .unwrap()
                .splits
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert_eq!(a.iter().map(Vec::len).collect::<Vec<_>>(), [6, 2, 2]);
        assert!(a.iter().all(|s| !s.contains(&2)));
        assert_ne!(a, run(2));
    }

    #[test]
    fn a_split_without_a_label_and_too_many_classes_are_refused() {
        let mut c = LabelCollector::new(2);
        let l = text(&["x", "y", "z"]);
        c.push_label(&l, 0).unwrap();
        c.push_label(&l, 1).unwrap();
        assert!(c.push_label(&l, 2).unwrap_err().contains("more than 2"));
        let mut c = LabelCollector::new(5);
        c.push_label(&text(&[""]), 0).unwrap();
        let err = c.push_split_name(&text(&["train"]), 0).unwrap_err();
        assert!(err.contains("in the train split but has no label"), "{err}");
        assert!(c
            .finish(&SplitRule::Fractions([1.0, 0.0, 0.0], 0))
            .unwrap_err()
            .contains("no node has a label"));
        assert!(LabelCollector::new(5)
            .push_split_name(&text(&["dev"]), 0)
            .unwrap_err()
            .contains("not train"));
    }
}
