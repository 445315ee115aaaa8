//! Import of OGB's raw heterogeneous layout (as ogbn-mag ships it) into the
//! graph directory format:
//!
//! ```text
//! raw/num-node-dict.csv.gz                      header of type names, one row of counts
//! raw/node-feat/<type>/node-feat.csv.gz          one row of floats per node
//! raw/node-label/<type>/node-label.csv.gz        one label per node (the target type)
//! raw/relations/<src>___<rel>___<dst>/edge.csv.gz  "src,dst" per edge
//! split/<name>/<type>/{train,valid,test}.csv.gz  one node id per row
//! ```
//!
//! Files are streamed; the result is validated by loading it before it is
//! moved into place.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use crate::error::{GraphError, Result};
use crate::format::{self, paths, AtomicDir, LoadOptions};
use crate::npy::{DType, NpyWriter};
use crate::progress::Progress;
use crate::schema::{
    check_name, NodeTypeSchema, RelationSchema, Schema, MAX_CLASSES, MAX_FEATURE_DIM, MAX_NODES,
};

/// Options of [`import_ogb`].
#[derive(Clone, Debug, Default)]
pub struct OgbImport {
    /// Graph name (default: the source directory's name).
    pub name: Option<String>,
    /// Which `split/<name>` to use (default: the only one).
    pub split: Option<String>,
    /// Replace `out` if it exists.
    pub overwrite: bool,
}

/// Converts the OGB dataset directory `src` (holding `raw/` and `split/`) to `out`.
pub fn import_ogb(
    src: &Path,
    out: &Path,
    opts: &OgbImport,
    progress: &mut dyn Progress,
) -> Result<Schema> {
    let raw = src.join("raw");
    let dict_path = raw.join("num-node-dict.csv.gz");
    let types = read_node_dict(&dict_path)?;

    let label_root = raw.join("node-label");
    let labelled: Vec<&String> = types
        .iter()
        .map(|(n, _)| n)
        .filter(|n| label_root.join(n).join("node-label.csv.gz").exists())
        .collect();
    let target = match labelled.as_slice() {
        [one] => (*one).clone(),
        [] => {
            return Err(GraphError::Missing {
                path: label_root.join("<type>").join("node-label.csv.gz"),
            })
        }
        many => {
            return Err(GraphError::data(
                &label_root,
                format!(
                    "several types have labels ({}); hetgnn needs exactly one target",
                    many.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ))
        }
    };
    let split_dir = pick_split(&src.join("split"), opts.split.as_deref())?;

    let rel_root = raw.join("relations");
    let mut relations = Vec::new();
    let entries = std::fs::read_dir(&rel_root).map_err(|e| GraphError::io(&rel_root, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| GraphError::io(&rel_root, e))?;
        let dirname = entry.file_name().to_string_lossy().into_owned();
        let parts: Vec<&str> = dirname.split("___").collect();
        let [s, r, d] = parts.as_slice() else {
            return Err(GraphError::data(
                &entry.path(),
                "relation directory name must be <src>___<rel>___<dst>",
            ));
        };
        for (name, what) in [(s, "node type"), (r, "relation"), (d, "node type")] {
            check_name(name, what).map_err(|p| GraphError::data(&entry.path(), p))?;
        }
        relations.push((
            s.to_string(),
            r.to_string(),
            d.to_string(),
            entry.path().join("edge.csv.gz"),
        ));
    }
    relations.sort();

    let dir = AtomicDir::create(out, opts.overwrite)?;
    let mut node_types = Vec::new();
    let mut num_classes = 0;
    for (name, count) in &types {
        dir.create_dir(&paths::node_dir(dir.path(), name))?;
        let feat = raw.join("node-feat").join(name).join("node-feat.csv.gz");
        let feature_dim = if feat.exists() {
            progress.start(&format!("{name} features"), *count);
            let dim = import_features(&feat, *count, &paths::features(dir.path(), name), progress)?;
            progress.finish();
            Some(dim)
        } else {
            None
        };
        if *name == target {
            let lpath = label_root.join(name).join("node-label.csv.gz");
            let labels = read_column(&lpath, |s| {
                if s.eq_ignore_ascii_case("nan") || s.is_empty() {
                    Some(-1)
                } else {
                    s.parse::<f64>()
                        .ok()
                        .filter(|v| v.fract() == 0.0 && *v >= -1.0 && *v < f64::from(MAX_CLASSES))
                        .map(|v| v as i64)
                }
            })?;
            if labels.len() as u64 != *count {
                return Err(GraphError::data(
                    &lpath,
                    format!("{} labels for {count} nodes", labels.len()),
                ));
            }
            num_classes = labels.iter().copied().max().unwrap_or(-1) + 1;
            crate::npy::write_i64(&paths::labels(dir.path(), name), &[*count], &labels)?;
            for s in ["train", "valid", "test"] {
                let spath = split_dir.join(name).join(format!("{s}.csv.gz"));
                let ids = read_column(&spath, |t| t.parse::<i64>().ok())?;
                let mut w = NpyWriter::create(
                    &paths::split(dir.path(), name, s),
                    DType::I64,
                    &[ids.len() as u64],
                )?;
                w.write_i64(&ids)?;
                w.finish()?;
            }
        }
        node_types.push((
            name.clone(),
            NodeTypeSchema {
                count: *count,
                feature_dim,
            },
        ));
    }
    dir.create_dir(&dir.path().join("edges"))?;
    let mut rel_schemas = Vec::new();
    let count_of = |t: &str| types.iter().find(|(n, _)| n == t).map(|(_, c)| *c);
    for (s, r, d, path) in &relations {
        let rs = RelationSchema {
            src: s.clone(),
            name: r.clone(),
            dst: d.clone(),
            count: 0,
            ..Default::default()
        };
        let (Some(ns), Some(nd)) = (count_of(s), count_of(d)) else {
            return Err(GraphError::data(
                path,
                format!("relation {s}___{r}___{d} names a type missing from num-node-dict.csv.gz"),
            ));
        };
        progress.start(&format!("edges {}", rs.canonical()), 0);
        let (srcs, dsts) = read_edges(path, ns, nd)?;
        let mut w = NpyWriter::create(
            &paths::edges(dir.path(), &rs.canonical()),
            DType::I64,
            &[2, srcs.len() as u64],
        )?;
        w.write_i64(&srcs)?;
        w.write_i64(&dsts)?;
        w.finish()?;
        progress.advance(srcs.len() as u64);
        progress.finish();
        rel_schemas.push(RelationSchema {
            count: srcs.len() as u64,
            ..rs
        });
    }
    let name = opts.name.clone().unwrap_or_else(|| {
        src.file_name()
            .map_or("ogb".into(), |n| n.to_string_lossy().into_owned())
    });
    let schema = Schema {
        name,
        target,
        num_classes: num_classes.max(1) as u32,
        node_types,
        relations: rel_schemas,
        values: false,
        label_sets: None,
    };
    schema
        .validate()
        .map_err(|p| GraphError::data(src, format!("imported schema is invalid: {p}")))?;
    schema.write(&paths::schema(dir.path()))?;
    // Validate the whole result (ids in range, splits, shapes) before publishing it.
    format::load(dir.path(), &LoadOptions::default())?;
    dir.commit()?;
    Ok(schema)
}

fn open_gz(path: &Path) -> Result<impl BufRead> {
    let f = crate::input::open(path)?;
    Ok(BufReader::with_capacity(1 << 20, GzDecoder::new(f)))
}

/// Longest line accepted in an OGB CSV: a 1 MiB line holds a row of over
/// 50,000 features, and a line with no end (a decompression bomb of one
/// line) is refused here rather than read into memory whole.
const MAX_LINE_BYTES: u64 = 1 << 20;

/// Calls `f(line_number, line)` for each line (1-based numbers).
fn for_lines(path: &Path, mut f: impl FnMut(usize, &str) -> Result<()>) -> Result<()> {
    for_lines_of(open_gz(path)?, path, MAX_LINE_BYTES, &mut f)
}

/// [`for_lines`] over `r`, refusing a line longer than `max` bytes.
fn for_lines_of(
    mut r: impl BufRead,
    path: &Path,
    max: u64,
    f: &mut impl FnMut(usize, &str) -> Result<()>,
) -> Result<()> {
    let mut line = String::new();
    let mut n = 0;
    loop {
        line.clear();
        let got = (&mut r)
            .take(max + 1)
            .read_line(&mut line)
            .map_err(|e| GraphError::io(path, e))?;
        if got == 0 {
            return Ok(());
        }
        n += 1;
        if got as u64 > max {
            return Err(GraphError::data(
                path,
                format!("line {n} is longer than {max} bytes"),
            ));
        }
        f(n, line.trim_end_matches(['\n', '\r']))?;
    }
}

fn read_node_dict(path: &Path) -> Result<Vec<(String, u64)>> {
    let mut rows = Vec::new();
    for_lines(path, |_, l| {
        if !l.is_empty() {
            rows.push(
                l.split(',')
                    .map(|s| s.trim().to_string())
                    .collect::<Vec<_>>(),
            );
        }
        Ok(())
    })?;
    let [names, counts] = rows.as_slice() else {
        return Err(GraphError::data(
            path,
            format!(
                "expected a header row and a count row, found {} rows",
                rows.len()
            ),
        ));
    };
    if names.len() != counts.len() {
        return Err(GraphError::data(
            path,
            "header and count rows differ in length",
        ));
    }
    names
        .iter()
        .zip(counts)
        .map(|(n, c)| {
            check_name(n, "node type").map_err(|p| GraphError::data(path, p))?;
            match c.parse::<u64>() {
                Ok(v) if v <= MAX_NODES => Ok((n.clone(), v)),
                _ => Err(GraphError::data(
                    path,
                    format!("count '{c}' of type '{n}' is not a valid node count"),
                )),
            }
        })
        .collect()
}

fn pick_split(root: &Path, name: Option<&str>) -> Result<PathBuf> {
    if let Some(n) = name {
        let p = root.join(n);
        return if p.is_dir() {
            Ok(p)
        } else {
            Err(GraphError::Missing { path: p })
        };
    }
    let mut names: Vec<PathBuf> = std::fs::read_dir(root)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                GraphError::Missing {
                    path: root.to_path_buf(),
                }
            } else {
                GraphError::io(root, e)
            }
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    names.sort();
    match names.len() {
        1 => Ok(names.remove(0)),
        0 => Err(GraphError::data(root, "no split directory")),
        _ => Err(GraphError::data(
            root,
            "several splits: choose one with --split NAME",
        )),
    }
}

fn import_features(src: &Path, count: u64, out: &Path, progress: &mut dyn Progress) -> Result<u64> {
    let mut writer: Option<NpyWriter> = None;
    let mut dim = 0usize;
    let mut row = Vec::new();
    let mut rows = 0u64;
    for_lines(src, |n, l| {
        row.clear();
        for v in l.split(',') {
            let x: f32 = v
                .trim()
                .parse()
                .map_err(|_| GraphError::data(src, format!("line {n}: '{v}' is not a number")))?;
            row.push(x);
        }
        if writer.is_none() {
            dim = row.len();
            if dim == 0 || dim as u64 > MAX_FEATURE_DIM {
                return Err(GraphError::data(
                    src,
                    format!("line {n}: feature width {dim} out of range"),
                ));
            }
            writer = Some(NpyWriter::create(out, DType::F32, &[count, dim as u64])?);
        }
        if row.len() != dim {
            return Err(GraphError::data(
                src,
                format!(
                    "line {n}: {} values where earlier rows have {dim}",
                    row.len()
                ),
            ));
        }
        rows += 1;
        if rows > count {
            return Err(GraphError::data(
                src,
                format!("more than the {count} rows num-node-dict declares"),
            ));
        }
        progress.advance(1);
        writer.as_mut().expect("created above").write_f32(&row)
    })?;
    if rows != count {
        return Err(GraphError::data(
            src,
            format!("{rows} rows for {count} nodes"),
        ));
    }
    writer
        .ok_or_else(|| GraphError::data(src, "no rows"))?
        .finish()?;
    Ok(dim as u64)
}

fn read_column(path: &Path, parse: impl Fn(&str) -> Option<i64>) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for_lines(path, |n, l| {
        let v = parse(l.trim()).ok_or_else(|| {
            GraphError::data(path, format!("line {n}: '{l}' is not a valid value"))
        })?;
        out.push(v);
        Ok(())
    })?;
    Ok(out)
}

/// Reads "src,dst" rows, checking ids against the endpoint counts as it goes.
fn read_edges(path: &Path, n_src: u64, n_dst: u64) -> Result<(Vec<i64>, Vec<i64>)> {
    let (mut s, mut d) = (Vec::new(), Vec::new());
    for_lines(path, |n, l| {
        let mut it = l.split(',').map(|t| t.trim().parse::<i64>());
        match (it.next(), it.next(), it.next()) {
            (Some(Ok(a)), Some(Ok(b)), None) => {
                if a < 0 || a as u64 >= n_src {
                    return Err(GraphError::data(
                        path,
                        format!("line {n}: source id {a} out of range 0..{n_src}"),
                    ));
                }
                if b < 0 || b as u64 >= n_dst {
                    return Err(GraphError::data(
                        path,
                        format!("line {n}: destination id {b} out of range 0..{n_dst}"),
                    ));
                }
                s.push(a);
                d.push(b);
                Ok(())
            }
            _ => Err(GraphError::data(
                path,
                format!("line {n}: expected 'src,dst', got '{l}'"),
            )),
        }
    })?;
    Ok((s, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_in_order_and_one_past_the_limit_is_refused_naming_it() {
        let mut seen = Vec::new();
        for_lines_of(
            &b"a,1\nbb,2\r\n\nccc"[..],
            Path::new("x.csv.gz"),
            8,
            &mut |n, l| {
                seen.push((n, l.to_string()));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(
            seen,
            [
                (1, "a,1".to_string()),
                (2, "bb,2".into()),
                (3, "".into()),
                (4, "ccc".into())
            ]
        );
        let long = [&b"ok\n"[..], &[b'7'; 64][..]].concat();
        let err = for_lines_of(&long[..], Path::new("x.csv.gz"), 8, &mut |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("x.csv.gz") && err.contains("line 2 is longer than 8 bytes"),
            "{err}"
        );
    }
}
