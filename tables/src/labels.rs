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
    pub(crate) fn push(&mut self, cells: &Cells, i: usize) -> Result<i32, String> {
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
        match v {
            Some(name) => self.add(name),
            None => Ok(-1),
        }
    }

    /// The provisional index of class `name`, added if new.
    fn add(&mut self, name: String) -> Result<i32, String> {
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
    pub(crate) fn resolve(&self) -> Result<Resolved, String> {
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
    /// Per node: whether it has another target (a value or a label set),
    /// which makes it splittable without a class label.
    other: Vec<bool>,
    /// Whether the table has a label column (else every node is unlabelled
    /// and the graph's one class is a placeholder).
    classes_given: bool,
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
            classes_given: true,
            ..Default::default()
        }
    }

    /// A collector for a target type without a label column: its nodes are
    /// split by their other targets (values, label sets).
    pub fn without_classes() -> LabelCollector {
        LabelCollector::default()
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
            // A carried-over node in a split had a target when it was imported.
            other: marks.iter().map(|&m| m != NONE).collect(),
            marks,
            classes_given: true,
        }
    }

    /// A collector continuing an earlier import of a type without a label
    /// column: its nodes' split marks are kept.
    pub fn seeded_without_classes(marks: Vec<u8>) -> LabelCollector {
        LabelCollector {
            raw: vec![-1; marks.len()],
            keep: marks.len(),
            other: marks.iter().map(|&m| m != NONE).collect(),
            marks,
            ..Default::default()
        }
    }

    /// Takes the next node, without a label (a table without a label column).
    pub fn push_unlabelled(&mut self) {
        self.raw.push(-1);
        self.other.push(false);
    }

    /// The last node taken has another target (a value or a label set).
    pub fn mark_known(&mut self) {
        if let Some(o) = self.other.last_mut() {
            *o = true;
        }
    }

    /// Whether the last node taken has a target.
    fn last_known(&self) -> bool {
        self.raw.last().is_some_and(|&l| l >= 0) || self.other.last() == Some(&true)
    }

    /// Declares `n` classes: integer labels then have at least `n` classes
    /// even when the highest ones label no node.
    pub fn with_classes(mut self, n: Option<u32>) -> LabelCollector {
        self.classes = self.classes.with_classes(n);
        self
    }

    /// Takes the label of the next node from cell `i`.
    pub(crate) fn push_label(&mut self, cells: &Cells, i: usize) -> Result<(), String> {
        let id = self.classes.push(cells, i)?;
        self.raw.push(id);
        self.other.push(false);
        Ok(())
    }

    /// Takes the split of the next node from cell `i` of a split column.
    pub(crate) fn push_split_name(&mut self, cells: &Cells, i: usize) -> Result<(), String> {
        let mark = split_tag(cells, i)?;
        if mark != NONE && !self.last_known() {
            return Err(format!(
                "the node is in the {} split but has no {}",
                NAMES[mark as usize - 1],
                self.wanted()
            ));
        }
        self.marks.push(mark);
        Ok(())
    }

    /// Takes the split of the next node from cell `i` of a time column.
    pub(crate) fn push_split_time(
        &mut self,
        cells: &Cells,
        i: usize,
        train_before: f64,
        valid_before: f64,
    ) -> Result<(), String> {
        let mark = match cells.number(i)? {
            _ if !self.last_known() => NONE,
            None => return Err("a labelled node has no time".into()),
            Some(t) if !t.is_finite() => return Err(format!("time {t} is not a finite number")),
            Some(t) if t < train_before => 1,
            Some(t) if t < valid_before => 2,
            Some(_) => 3,
        };
        self.marks.push(mark);
        Ok(())
    }

    /// What a node in a split lacks, for messages.
    fn wanted(&self) -> &'static str {
        match self.classes_given {
            true => "label",
            false => "target (value or label set)",
        }
    }

    /// The labels and splits; errors say what the table or config must change.
    pub(crate) fn finish(self, rule: &SplitRule) -> Result<Labelled, String> {
        // Integer classes (also written "3.0") keep their value as class id, a
        // negative one meaning unlabelled, as in the graph format; other names
        // are sorted.
        let (map, num_classes, classes) = self.classes.resolve()?;
        if num_classes == 0 && self.classes_given {
            return Err("no node has a label".into());
        }
        // Without a label column the graph still has labels.npy (all -1) and,
        // as the format requires, at least one class.
        let num_classes = num_classes.max(1);
        let labels: Vec<i64> = self
            .raw
            .iter()
            .map(|&r| if r < 0 { -1 } else { map[r as usize] })
            .collect();
        let known = |i: usize| labels[i] >= 0 || self.other.get(i) == Some(&true);
        let mut splits: [Vec<u32>; 3] = Default::default();
        match rule {
            SplitRule::Fractions(f, seed) => {
                // Carried-over nodes keep their splits; new labelled ones are shuffled.
                for (node, &m) in self.marks.iter().enumerate().take(self.keep) {
                    if m != NONE {
                        splits[m as usize - 1].push(node as u32);
                    }
                }
                let ids: Vec<u32> = (self.keep as u32..labels.len() as u32)
                    .filter(|&i| known(i as usize))
                    .collect();
                for (k, part) in by_fractions(ids, f, NODE_SPLIT, *seed)
                    .into_iter()
                    .enumerate()
                {
                    splits[k].extend_from_slice(&part);
                    splits[k].sort_unstable();
                }
            }
            _ => {
                for (node, &m) in self.marks.iter().enumerate() {
                    if m == NONE {
                        continue;
                    }
                    if !known(node) {
                        return Err(format!(
                            "node {} (row {}) is in the {} split but has no {}",
                            node,
                            node + 1,
                            NAMES[m as usize - 1],
                            self.wanted()
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

/// Cell `i` of a split column: 0 none (empty, `none`), 1 train, 2 valid
/// (`val`, `validation`), 3 test, in any case.
pub(crate) fn split_tag(cells: &Cells, i: usize) -> Result<u8, String> {
    let Some(t) = cells.text(i).map(|t| t.trim().to_ascii_lowercase()) else {
        return Ok(NONE);
    };
    match t.as_str() {
        "" | "none" => Ok(NONE),
        "train" => Ok(1),
        "valid" | "val" | "validation" => Ok(2),
        "test" => Ok(3),
        _ => Err(format!(
            "split '{}' is not train, valid or test (or empty)",
            t.escape_debug()
        )),
    }
}

/// Domain of the random split of nodes by fractions (its RNG key's first part).
const NODE_SPLIT: u64 = 0x7ab1e5;

/// Shuffles `ids` by `(domain, seed)` and cuts them by the fractions `f`:
/// the train, valid and test parts, in shuffled order.
pub(crate) fn by_fractions<T: Copy>(
    mut ids: Vec<T>,
    f: &[f64; 3],
    domain: u64,
    seed: u64,
) -> [Vec<T>; 3] {
    let mut rng = CounterRng::from_parts(&[domain, seed]);
    for i in (1..ids.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        ids.swap(i, j);
    }
    let n = ids.len() as f64;
    let (a, b) = (
        (f[0] * n).round() as usize,
        ((f[0] + f[1]) * n).round() as usize,
    );
    let c = (((f[0] + f[1] + f[2]) * n).round() as usize).min(ids.len());
    [ids[..a].to_vec(), ids[a..b].to_vec(), ids[b..c].to_vec()]
}

/// Label sets met row by row: each node's labels (names or integers, as
/// [`ClassNames`] maps them) or none.
#[derive(Debug)]
pub struct SetCollector {
    names: ClassNames,
    separator: char,
    empty: Option<String>,
    /// Every node's provisional label indices, one after another.
    flat: Vec<i32>,
    /// Per node: where its labels end in `flat`, or `None` for no set.
    ends: Vec<Option<usize>>,
}

/// Label sets resolved: `width` labels, a row of 0/1 per node (all -1: none).
#[derive(Debug)]
pub struct LabelSetRows {
    /// Labels per node.
    pub width: u32,
    /// `count × width` entries, node after node.
    pub bits: Vec<i8>,
    /// Label names in label order, when the labels were names (else empty).
    pub names: Vec<String>,
}

impl SetCollector {
    /// A collector refusing more than `max_labels` labels; text cells are
    /// split at `separator`, and a cell equal to `empty` is an empty set.
    pub fn new(
        max_labels: u32,
        num_labels: Option<u32>,
        separator: char,
        empty: Option<String>,
    ) -> SetCollector {
        SetCollector {
            names: ClassNames::new(max_labels).with_classes(num_labels),
            separator,
            empty,
            flat: Vec::new(),
            ends: Vec::new(),
        }
    }

    /// A collector continuing an earlier import: its labels (in label
    /// order) and its nodes' rows (`width` entries each), which are kept.
    pub fn seeded(mut self, names: Vec<String>, width: usize, bits: &[i8]) -> SetCollector {
        self.names = ClassNames::seeded(self.names.max_classes, names);
        for row in bits.chunks_exact(width.max(1)) {
            let known = row.first().is_some_and(|&b| b >= 0);
            self.flat
                .extend((0..width as i32).filter(|&j| row[j as usize] == 1));
            self.ends.push(known.then_some(self.flat.len()));
        }
        self
    }

    /// Takes the labels of the next node from cell `i`; returns whether it has a set.
    pub(crate) fn push(&mut self, cells: &Cells, i: usize) -> Result<bool, String> {
        let items: Option<Vec<String>> = match cells {
            Cells::List(v) => v[i].clone(),
            Cells::Float(v) => match v[i] {
                Some(x) if x.fract() == 0.0 && x.is_finite() => Some(vec![(x as i64).to_string()]),
                Some(x) => return Err(format!("label {x} is not a label (an integer or a name)")),
                None => None,
            },
            c => c
                .text(i)
                .map(|t| match self.empty.as_deref() == Some(t.trim()) {
                    true => Vec::new(),
                    false => t.split(self.separator).map(str::to_string).collect(),
                }),
        };
        let Some(items) = items else {
            self.ends.push(None);
            return Ok(false);
        };
        for item in items {
            let name = item.trim();
            if name.is_empty() {
                continue;
            }
            if as_int(name).is_some_and(|v| v < 0) {
                return Err(format!(
                    "label {name} is not a label (integers from 0, or names)"
                ));
            }
            let k = self.names.add(name.to_string())?;
            self.flat.push(k);
        }
        self.ends.push(Some(self.flat.len()));
        Ok(true)
    }

    /// The rows of every node; errors say what the table or config must change.
    pub(crate) fn finish(self) -> Result<LabelSetRows, String> {
        let (map, width, names) = self.names.resolve()?;
        if width == 0 {
            return Err("no node has a label in its set".into());
        }
        let w = width as usize;
        let mut bits = vec![-1i8; self.ends.len() * w];
        let mut start = 0;
        for (n, end) in self.ends.iter().enumerate() {
            let Some(end) = *end else { continue };
            let row = &mut bits[n * w..(n + 1) * w];
            row.fill(0);
            for &k in &self.flat[start..end] {
                row[map[k as usize] as usize] = 1;
            }
            start = end;
        }
        Ok(LabelSetRows { width, bits, names })
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
    fn label_sets_come_from_lists_and_delimited_text() {
        let mut c = SetCollector::new(10, Some(5), '|', Some("none".into()));
        let t = text(&["3|1", "", "none", " 0 | 3 "]);
        assert_eq!(
            (0..4).map(|i| c.push(&t, i).unwrap()).collect::<Vec<_>>(),
            [true, false, true, true]
        );
        let l = Cells::List(vec![Some(vec!["2".into()]), None]);
        assert!(c.push(&l, 0).unwrap() && !c.push(&l, 1).unwrap());
        let got = c.finish().unwrap();
        // Integer labels keep their value; num_labels widens the rows to 5.
        assert_eq!(got.width, 5);
        #[rustfmt::skip]
        assert_eq!(got.bits, [
            0, 1, 0, 1, 0,
            -1, -1, -1, -1, -1,
            0, 0, 0, 0, 0,
            1, 0, 0, 1, 0,
            0, 0, 1, 0, 0,
            -1, -1, -1, -1, -1,
        ]);
        assert!(got.names.is_empty());
        // Names are sorted; a later import keeps them and refuses a new one.
        let mut c = SetCollector::new(10, None, ';', None);
        let t = text(&["spam;eggs", "ham"]);
        for i in 0..2 {
            c.push(&t, i).unwrap();
        }
        let first = c.finish().unwrap();
        assert_eq!(first.names, ["eggs", "ham", "spam"]);
        assert_eq!(first.bits, [1, 0, 1, 0, 1, 0]);
        let mut later = SetCollector::new(10, None, ';', None).seeded(first.names, 3, &first.bits);
        later.push(&text(&["spam"]), 0).unwrap();
        assert!(later
            .push(&text(&["toast"]), 0)
            .unwrap_err()
            .contains("toast"));
        let again = later.finish().unwrap();
        assert_eq!(again.bits, [1, 0, 1, 0, 1, 0, 0, 0, 1]);
        // A negative integer, a fraction and too many labels are refused.
        let mut c = SetCollector::new(2, None, ';', None);
        assert!(c
            .push(&text(&["-1"]), 0)
            .unwrap_err()
            .contains("not a label"));
        assert!(c.push(&Cells::Float(vec![Some(1.5)]), 0).is_err());
        assert!(c
            .push(&text(&["a;b;c"]), 0)
            .unwrap_err()
            .contains("more than 2"));
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
