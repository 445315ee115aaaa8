//! The columns of one relation's edges as they are imported, beside its ends:
//! a label, a value and a split per edge (the edge tasks' targets), and a
//! weight and a time, in edge order (an earlier graph's edges first).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use graphs::format::paths;
use graphs::npy::{DType, NpyWriter};
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

/// What the edges of one relation carry besides their ends, written beside
/// them as they are read: memory does not grow with the edges, but for the
/// split tags of a split by fractions, drawn at the end.
pub(crate) struct EdgeColumns {
    /// Class ids of the earlier graph's edges, then provisional indices into
    /// `classes` of this table's (-1: none), spooled until the classes are fixed.
    labels: Option<Spool>,
    /// The class names met (seeded with the earlier graph's, then fixed).
    classes: ClassNames,
    /// Edges of the earlier graph (their labels are class ids already).
    before: u64,
    values: Option<NpyWriter>,
    split: Splits,
    /// How this table's edges are split.
    rule: Option<SplitRule>,
    num_classes: Option<u32>,
    /// Whether the edges carry targets (this table's or the earlier graph's).
    on: bool,
    weights: Option<NpyWriter>,
    times: Option<NpyWriter>,
    /// Edges whose columns were written.
    count: u64,
}

/// The split of edges with targets, as it is read.
enum Splits {
    /// Positions written as they come, to the train, valid and test files.
    Written(Box<[NpyWriter; 3]>),
    /// Per edge, 0 none, 1 train, 2 valid, 3 test, or `PENDING` until the
    /// fractions are drawn at the end.
    Tags(Vec<u8>),
}

impl Splits {
    /// Records that edge `at` has split tag `tag`.
    fn push(&mut self, at: u64, tag: u8) -> Result<()> {
        match self {
            Splits::Written(w) => write_tag(w, at, tag),
            Splits::Tags(t) => {
                t.push(tag);
                Ok(())
            }
        }
    }
}

/// The train, valid and test position files of a relation's edges.
fn split_writers(dir: &Path, canonical: &str) -> Result<[NpyWriter; 3]> {
    let w = |name| NpyWriter::create_len(&paths::edge_split(dir, canonical, name), DType::I64);
    Ok([w("train")?, w("valid")?, w("test")?])
}

/// Writes position `at` to the file of split `tag` (none for 0 or a tag still pending).
fn write_tag(w: &mut [NpyWriter; 3], at: u64, tag: u8) -> Result<()> {
    if (1..=3).contains(&tag) {
        w[tag as usize - 1].write_i64(&[at as i64])?;
    }
    Ok(())
}

/// Int64 values written raw to a hidden file of the import and read back once.
struct Spool {
    path: PathBuf,
    out: BufWriter<File>,
}

impl Spool {
    fn create(path: PathBuf) -> Result<Spool> {
        let file = File::create(&path).map_err(|e| TableError::io(&path, e))?;
        Ok(Spool {
            out: BufWriter::with_capacity(1 << 20, file),
            path,
        })
    }

    fn push(&mut self, v: i64) -> Result<()> {
        self.out
            .write_all(&v.to_le_bytes())
            .map_err(|e| TableError::io(&self.path, e))
    }

    /// Calls `f` on the values in order, in chunks, then deletes the file.
    fn drain(self, f: impl FnMut(&mut [i64]) -> Result<()>) -> Result<()> {
        let Spool { path, out } = self;
        out.into_inner()
            .map_err(|e| TableError::io(&path, e.into_error()))?;
        crate::import::drain_i64s(&path, f)
    }
}

impl EdgeColumns {
    /// Columns for `table`'s edges, after the earlier graph's edges of `rs`
    /// (with their columns where it had them), written under `dir`.
    pub(crate) fn start(
        dir: &Path,
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
        let rule = table
            .and_then(|e| e.split.as_ref())
            .map(|s| s.rule().expect("checked with the config"));
        let wants_weights = table.is_some_and(|e| e.weight.is_some())
            || before.as_ref().is_some_and(|(_, r)| r.weights);
        let wants_times = table.is_some_and(|e| e.time.is_some())
            || before.as_ref().is_some_and(|(_, r)| r.times);
        if let Some((p, r)) = &before {
            if table.is_some() && r.times && table.is_some_and(|e| e.time.is_none()) {
                return Err(TableError::file(&p.dir, format!("{canonical}: the graph this import is like has edge times: give the new edges a `time` column too")));
            }
            if !r.times && table.is_some_and(|e| e.time.is_some()) && r.count > 0 {
                return Err(TableError::file(&p.dir, format!("{canonical}: the graph this import is like has no edge times, so its edges would have none: import the relation afresh with a `time` column")));
            }
        }
        let edir = paths::edge_dir(dir, &canonical);
        if on || wants_weights || wants_times {
            std::fs::create_dir_all(&edir).map_err(|e| TableError::io(&edir, e))?;
        }
        let wants_labels = on
            && (table.is_some_and(|e| e.label.is_some())
                || before
                    .as_ref()
                    .is_some_and(|(_, r)| r.num_classes.is_some()));
        let wants_values = on
            && (table.is_some_and(|e| e.value.is_some())
                || before.as_ref().is_some_and(|(_, r)| r.values));
        let create = |wanted: bool, path: PathBuf, dtype: DType| -> Result<Option<NpyWriter>> {
            Ok(match wanted {
                true => Some(NpyWriter::create_len(&path, dtype)?),
                false => None,
            })
        };
        let split = match (on, &rule) {
            (true, Some(SplitRule::Fractions(..))) | (false, _) => Splits::Tags(Vec::new()),
            (true, _) => Splits::Written(Box::new(split_writers(dir, &canonical)?)),
        };
        let mut t = EdgeColumns {
            labels: match wants_labels {
                true => Some(Spool::create(dir.join(format!(".{canonical}.labels")))?),
                false => None,
            },
            classes: ClassNames::new(EDGE_MAX_CLASSES)
                .with_classes(table.and_then(|e| e.num_classes)),
            before: 0,
            values: create(
                wants_values,
                paths::edge_values(dir, &canonical),
                DType::F32,
            )?,
            split,
            rule,
            num_classes: table.and_then(|e| e.num_classes),
            on,
            weights: create(
                wants_weights,
                paths::edge_weights(dir, &canonical),
                DType::F32,
            )?,
            times: create(wants_times, paths::edge_times(dir, &canonical), DType::I64)?,
            count: 0,
        };
        let Some((p, r)) = before else {
            return Ok(t);
        };
        // The earlier graph's edges first, column by column.
        let n = r.count as usize;
        t.before = r.count;
        t.count = r.count;
        if let Some(w) = &mut t.weights {
            match graphs::format::read_edge_weights(&p.dir, &r)? {
                Some(v) => w.write_f32(&v)?,
                None => w.write_f32(&vec![1.0; n])?,
            }
        }
        // Without times, the earlier graph has no edges here (refused above otherwise).
        if let Some(w) = &mut t.times {
            w.write_i64(&graphs::format::read_edge_times(&p.dir, &r)?.unwrap_or_default())?;
        }
        if !on {
            return Ok(t);
        }
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
        let tags = match r.has_targets() {
            true => crate::export::split_tags(&c.splits, n),
            false => vec![0; n],
        };
        for (at, tag) in tags.into_iter().enumerate() {
            t.split.push(at as u64, tag)?;
        }
        if let Some(l) = &mut t.labels {
            match r.num_classes {
                Some(k) => {
                    for &x in &c.labels {
                        l.push(x)?;
                    }
                    t.num_classes = Some(t.num_classes.unwrap_or(0).max(k));
                }
                None => (0..n).try_for_each(|_| l.push(-1))?,
            }
        }
        if let Some(v) = &mut t.values {
            match r.values {
                true => v.write_f32(&c.values)?,
                false => v.write_f32(&vec![f32::NAN; n])?,
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
                w.write_f32(&[weight(cells, i).map_err(|p| TableError::cell(path, row, name, p))?])?
            }
            // The earlier graph's edges have weights, these none: 1, as an empty cell.
            (Some(w), None) => w.write_f32(&[1.0])?,
            (None, _) => {}
        }
        if let (Some(t), Some((name, cells))) = (&mut self.times, time_col) {
            t.write_i64(&[time(cells, i).map_err(|p| TableError::cell(path, row, name, p))?])?;
        }
        let at = self.count;
        self.count += 1;
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
            l.push(label)?;
        }
        if let Some(v) = &mut self.values {
            v.write_f32(&[value])?;
        }
        self.split.push(at, split)?;
        Ok(())
    }

    /// Closes the columns beside the relation's edges and records them in
    /// `rs`; returns the class names, when the classes were names.
    pub(crate) fn finish(self, dir: &Path, rs: &mut RelationSchema) -> Result<Option<Vec<String>>> {
        let canonical = rs.canonical();
        let edir = paths::edge_dir(dir, &canonical);
        let n = rs.count;
        let written = self.on || self.weights.is_some() || self.times.is_some();
        if written && self.count != n {
            return Err(TableError::file(
                &edir,
                format!("{canonical}: columns of {} edges for {n} edges", self.count),
            ));
        }
        if let Some(w) = self.weights {
            rs.weights = true;
            w.finish()?;
        }
        if let Some(t) = self.times {
            rs.times = true;
            t.finish()?;
        }
        if !self.on {
            return Ok(None);
        }
        let mut names = None;
        if let Some(spool) = self.labels {
            let (map, resolved, classes) = self
                .classes
                .resolve()
                .map_err(|p| TableError::file(&edir, format!("{canonical}: {p}")))?;
            names = (!classes.is_empty()).then_some(classes);
            let classes = self.num_classes.unwrap_or(resolved);
            let mut out =
                NpyWriter::create(&paths::edge_labels(dir, &canonical), DType::I64, &[n])?;
            let mut at = 0u64;
            spool.drain(|chunk| {
                for x in chunk.iter_mut() {
                    // The earlier graph's labels are class ids already.
                    if at >= self.before && *x >= 0 {
                        *x = map[*x as usize];
                    }
                    if *x >= i64::from(classes) {
                        return Err(TableError::file(
                            &edir,
                            format!(
                                "{canonical}: edge label {x} is not below num_classes {classes}"
                            ),
                        ));
                    }
                    at += 1;
                }
                out.write_i64(chunk)?;
                Ok(())
            })?;
            out.finish()?;
            rs.num_classes = Some(classes.max(1));
        }
        if let Some(v) = self.values {
            rs.values = true;
            v.finish()?;
        }
        let writers = match self.split {
            Splits::Written(w) => *w,
            Splits::Tags(mut tags) => {
                if let Some(SplitRule::Fractions(f, seed)) = &self.rule {
                    // Only this table's edges with a target are drawn; earlier ones keep their split.
                    let pending: Vec<u64> = (0..tags.len() as u64)
                        .filter(|&i| tags[i as usize] == PENDING)
                        .collect();
                    for (k, part) in by_fractions(pending, f, EDGE_SPLIT, *seed)
                        .iter()
                        .enumerate()
                    {
                        for &i in part {
                            tags[i as usize] = k as u8 + 1;
                        }
                    }
                }
                let mut w = split_writers(dir, &canonical)?;
                for (at, tag) in tags.into_iter().enumerate() {
                    // A tag still pending is an edge the fractions left out.
                    write_tag(&mut w, at as u64, tag)?;
                }
                w
            }
        };
        for w in writers {
            w.finish()?;
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
