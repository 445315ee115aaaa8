//! The columns of one relation's edges as they are imported, beside its ends:
//! a label, a value and a split per edge (the edge tasks' targets), and a
//! weight and a time, in edge order (an earlier graph's edges first).

use std::path::Path;

use graphs::format::paths;
use graphs::schema::RelationSchema;

use crate::config::{EdgeTable, SplitRule};
use crate::error::{Result, TableError};
use crate::labels::{by_fractions, split_tag, ClassNames};
use crate::like::Prior;
use crate::source::Cells;

/// Most classes of an edge label column (the graph format's limit).
const EDGE_MAX_CLASSES: u32 = graphs::schema::MAX_CLASSES;

/// Domain of the random split of edges by fractions (its RNG key's first part).
const EDGE_SPLIT: u64 = 0xed9e5;

/// A split tag waiting for the fractions: the edge has a target.
const PENDING: u8 = 4;

/// What the edges of one relation carry besides their ends, gathered as they are read.
pub(crate) struct EdgeColumns {
    /// Class ids of the earlier graph's edges, then provisional indices into
    /// `classes` of this table's (-1: none).
    labels: Option<Vec<i64>>,
    /// The class names met (seeded with the earlier graph's, then fixed).
    classes: ClassNames,
    /// Edges of the earlier graph (their labels are class ids already).
    before: usize,
    values: Option<Vec<f32>>,
    /// 0 none, 1 train, 2 valid, 3 test; `PENDING` until a split by fractions is drawn.
    split: Vec<u8>,
    /// How this table's edges are split.
    rule: Option<SplitRule>,
    num_classes: Option<u32>,
    /// Whether the edges carry targets (this table's or the earlier graph's).
    on: bool,
    weights: Option<Vec<f32>>,
    times: Option<Vec<i64>>,
}

impl EdgeColumns {
    /// Columns for `table`'s edges, after the earlier graph's edges of `rs`
    /// (with their columns where it had them).
    pub(crate) fn start(
        table: Option<&EdgeTable>,
        prior: Option<&Prior>,
        rs: &RelationSchema,
    ) -> Result<EdgeColumns> {
        let canonical = rs.canonical();
        let before = prior.and_then(|p| {
            p.schema
                .relations
                .iter()
                .find(|r| r.canonical() == canonical)
                .map(|r| (p, r.clone()))
        });
        let on = table.is_some_and(EdgeTable::has_targets)
            || before.as_ref().is_some_and(|(_, r)| r.has_targets());
        let mut t = EdgeColumns {
            labels: None,
            classes: ClassNames::new(EDGE_MAX_CLASSES)
                .with_classes(table.and_then(|e| e.num_classes)),
            before: 0,
            values: None,
            split: Vec::new(),
            rule: table
                .and_then(|e| e.split.as_ref())
                .map(|s| s.rule().expect("checked with the config")),
            num_classes: table.and_then(|e| e.num_classes),
            on,
            weights: None,
            times: None,
        };
        let wants_weights = table.is_some_and(|e| e.weight.is_some())
            || before.as_ref().is_some_and(|(_, r)| r.weights);
        let wants_times = table.is_some_and(|e| e.time.is_some())
            || before.as_ref().is_some_and(|(_, r)| r.times);
        if let Some((p, r)) = &before {
            let n = r.count as usize;
            if table.is_some() && r.times && table.is_some_and(|e| e.time.is_none()) {
                return Err(TableError::file(&p.dir, format!("{canonical}: the graph this import is like has edge times: give the new edges a `time` column too")));
            }
            if !r.times && table.is_some_and(|e| e.time.is_some()) && n > 0 {
                return Err(TableError::file(&p.dir, format!("{canonical}: the graph this import is like has no edge times, so its edges would have none: import the relation afresh with a `time` column")));
            }
            t.weights = match wants_weights {
                true => Some(
                    graphs::format::read_edge_weights(&p.dir, r)?.unwrap_or_else(|| vec![1.0; n]),
                ),
                false => None,
            };
            // Without times, the earlier graph has no edges here (refused above otherwise).
            t.times = match wants_times {
                true => Some(graphs::format::read_edge_times(&p.dir, r)?.unwrap_or_default()),
                false => None,
            };
        } else {
            t.weights = wants_weights.then(Vec::new);
            t.times = wants_times.then(Vec::new);
        }
        if !on {
            return Ok(t);
        }
        let wants_labels = table.is_some_and(|e| e.label.is_some())
            || before
                .as_ref()
                .is_some_and(|(_, r)| r.num_classes.is_some());
        let wants_values = table.is_some_and(|e| e.value.is_some())
            || before.as_ref().is_some_and(|(_, r)| r.values);
        t.labels = wants_labels.then(Vec::new);
        t.values = wants_values.then(Vec::new);
        if let Some((p, r)) = before {
            let n = r.count as usize;
            t.before = n;
            if let Some(k) = r.num_classes {
                // The earlier classes, fixed: by name where they were names.
                let names = p
                    .record
                    .edge_classes
                    .iter()
                    .find(|(rel, _)| *rel == canonical)
                    .map(|(_, n)| n.clone())
                    .unwrap_or_else(|| (0..k).map(|c| c.to_string()).collect());
                t.classes = ClassNames::seeded(EDGE_MAX_CLASSES, names);
            }
            let c = graphs::format::read_edge_columns(&p.dir, &r)?.unwrap_or_default();
            t.split = match r.has_targets() {
                true => crate::export::split_tags(&c.splits, n),
                false => vec![0; n],
            };
            if let Some(l) = &mut t.labels {
                match r.num_classes {
                    Some(k) => {
                        l.extend_from_slice(&c.labels);
                        t.num_classes = Some(t.num_classes.unwrap_or(0).max(k));
                    }
                    None => l.resize(n, -1),
                }
            }
            if let Some(v) = &mut t.values {
                match r.values {
                    true => v.extend_from_slice(&c.values),
                    false => v.resize(n, f32::NAN),
                }
            }
        }
        Ok(t)
    }

    /// Reads row `i` of a chunk's columns beside the ends (`cols`: those of
    /// [`EdgeTable::extra_columns`], in its order).
    pub(crate) fn read(
        &mut self,
        e: &EdgeTable,
        cols: &[Cells],
        i: usize,
        path: &Path,
        row: u64,
    ) -> Result<()> {
        let mut cols = cols.iter();
        let label_col = take(&mut cols, e.label.as_deref());
        let value_col = take(&mut cols, e.value.as_deref());
        let split_col = take(&mut cols, e.split_column());
        let weight_col = take(&mut cols, e.weight.as_deref());
        let time_col = take(&mut cols, e.time.as_deref());
        match (&mut self.weights, weight_col) {
            (Some(w), Some((name, cells))) => {
                w.push(weight(cells, i).map_err(|p| TableError::cell(path, row, name, p))?)
            }
            // The earlier graph's edges have weights, these none: 1, as an empty cell.
            (Some(w), None) => w.push(1.0),
            (None, _) => {}
        }
        if let (Some(t), Some((name, cells))) = (&mut self.times, time_col) {
            t.push(time(cells, i).map_err(|p| TableError::cell(path, row, name, p))?);
        }
        if !self.on {
            return Ok(());
        }
        let label = match label_col {
            Some((name, cells)) => i64::from(
                self.classes
                    .push(cells, i)
                    .map_err(|p| TableError::cell(path, row, name, p))?,
            ),
            None => -1,
        };
        let value = match value_col {
            Some((name, cells)) => match cells
                .number_f32(i)
                .map_err(|p| TableError::cell(path, row, name, p))?
            {
                Some(v) if v.is_infinite() => {
                    return Err(TableError::cell(
                        path,
                        row,
                        name,
                        "an infinite value (empty or NaN for none)",
                    ))
                }
                Some(v) => v,
                None => f32::NAN,
            },
            None => f32::NAN,
        };
        let known = label >= 0 || !value.is_nan();
        let split = match (&self.rule, split_col) {
            (Some(SplitRule::Column(_)), Some((name, cells))) => {
                let tag = split_tag(cells, i).map_err(|p| TableError::cell(path, row, name, p))?;
                if tag > 0 && !known {
                    let what = e.label.as_deref().or(e.value.as_deref()).unwrap_or("");
                    return Err(TableError::cell(
                        path,
                        row,
                        what,
                        "an edge in a split needs a label or a value",
                    ));
                }
                tag
            }
            (
                Some(SplitRule::Time {
                    train_before,
                    valid_before,
                    ..
                }),
                Some((name, cells)),
            ) if known => match cells
                .number(i)
                .map_err(|p| TableError::cell(path, row, name, p))?
            {
                None => {
                    return Err(TableError::cell(
                        path,
                        row,
                        name,
                        "an edge with a target has no time",
                    ))
                }
                Some(t) if !t.is_finite() => {
                    return Err(TableError::cell(
                        path,
                        row,
                        name,
                        format!("time {t} is not a finite number"),
                    ))
                }
                Some(t) if t < *train_before => 1,
                Some(t) if t < *valid_before => 2,
                Some(_) => 3,
            },
            (Some(SplitRule::Fractions(..)), _) if known => PENDING,
            _ => 0,
        };
        if let Some(l) = &mut self.labels {
            l.push(label);
        }
        if let Some(v) = &mut self.values {
            v.push(value);
        }
        self.split.push(split);
        Ok(())
    }

    /// Writes the columns beside the relation's edges and records them in
    /// `rs`; returns the class names, when the classes were names.
    pub(crate) fn finish(
        mut self,
        dir: &Path,
        rs: &mut RelationSchema,
    ) -> Result<Option<Vec<String>>> {
        let canonical = rs.canonical();
        let edir = paths::edge_dir(dir, &canonical);
        let n = rs.count;
        if self.on || self.weights.is_some() || self.times.is_some() {
            std::fs::create_dir_all(&edir).map_err(|e| TableError::io(&edir, e))?;
        }
        if let Some(w) = &self.weights {
            rs.weights = true;
            graphs::npy::write_f32(&paths::edge_weights(dir, &canonical), &[n], w)?;
        }
        if let Some(t) = &self.times {
            rs.times = true;
            graphs::npy::write_i64(&paths::edge_times(dir, &canonical), &[n], t)?;
        }
        if !self.on {
            return Ok(None);
        }
        let mut names = None;
        if let Some(l) = &mut self.labels {
            let (map, resolved, classes) = self
                .classes
                .resolve()
                .map_err(|p| TableError::file(&edir, format!("{canonical}: {p}")))?;
            for x in l[self.before..].iter_mut().filter(|x| **x >= 0) {
                *x = map[*x as usize];
            }
            names = (!classes.is_empty()).then_some(classes);
            let classes = self.num_classes.unwrap_or(resolved);
            if let Some(&bad) = l.iter().find(|&&x| x >= i64::from(classes)) {
                return Err(TableError::file(
                    &edir,
                    format!("{canonical}: edge label {bad} is not below num_classes {classes}"),
                ));
            }
            rs.num_classes = Some(classes.max(1));
            graphs::npy::write_i64(&paths::edge_labels(dir, &canonical), &[n], l)?;
        }
        if let Some(v) = &self.values {
            rs.values = true;
            graphs::npy::write_f32(&paths::edge_values(dir, &canonical), &[n], v)?;
        }
        if let Some(SplitRule::Fractions(f, seed)) = &self.rule {
            // Only this table's edges with a target are drawn; earlier ones keep their split.
            let pending: Vec<u64> = (0..self.split.len() as u64)
                .filter(|&i| self.split[i as usize] == PENDING)
                .collect();
            for (k, part) in by_fractions(pending, f, EDGE_SPLIT, *seed)
                .iter()
                .enumerate()
            {
                for &i in part {
                    self.split[i as usize] = k as u8 + 1;
                }
            }
            for s in self.split.iter_mut().filter(|s| **s == PENDING) {
                *s = 0;
            }
        }
        for (tag, name) in ["train", "valid", "test"].iter().enumerate() {
            let at: Vec<i64> = (0..self.split.len())
                .filter(|&i| self.split[i] == tag as u8 + 1)
                .map(|i| i as i64)
                .collect();
            graphs::npy::write_i64(
                &paths::edge_split(dir, &canonical, name),
                &[at.len() as u64],
                &at,
            )?;
        }
        Ok(names)
    }
}

/// The next column of a chunk's, when the table has the column `name`.
fn take<'a, 'b>(
    cols: &mut std::slice::Iter<'b, Cells>,
    name: Option<&'a str>,
) -> Option<(&'a str, &'b Cells)> {
    name.map(|n| (n, cols.next().expect("every column asked for is read")))
}

/// Cell `i` of a weight column: a finite number; empty: 1.
fn weight(cells: &Cells, i: usize) -> std::result::Result<f32, String> {
    match cells.number_f32(i)? {
        None => Ok(1.0),
        Some(w) if w.is_finite() => Ok(w),
        Some(w) => Err(format!("weight {w} is not a finite number")),
    }
}

/// Cell `i` of a time column: an integer (seconds or milliseconds since an epoch, say).
fn time(cells: &Cells, i: usize) -> std::result::Result<i64, String> {
    // 2^63 as f64: the first value beyond i64.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if let Cells::Int(v) = cells {
        return v[i]
            .ok_or_else(|| "missing time (every edge of a relation with times needs one)".into());
    }
    if let Some(s) = cells.text(i).filter(|_| matches!(cells, Cells::Text(_))) {
        if let Ok(t) = s.trim().parse::<i64>() {
            return Ok(t);
        }
    }
    match cells.number(i)? {
        None => Err("missing time (every edge of a relation with times needs one)".into()),
        Some(t) if t.is_finite() && t.fract() == 0.0 && t.abs() < LIMIT => Ok(t as i64),
        Some(t) => Err(format!(
            "time {t} is not an integer (write times as whole seconds or milliseconds)"
        )),
    }
}
