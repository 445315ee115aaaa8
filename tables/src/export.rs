//! `export tables`: a graph directory written as node and edge tables with
//! string ids (`<type>-<n>`), with the `graph.toml` that imports them back
//! into the same graph. Gives users a worked sample of the table layout, and
//! the tests and benchmarks their round trips.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use graphs::format::{paths, AtomicDir};
use graphs::npy::{DType, NpyFile};
use graphs::{Progress, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::config::{
    EdgeTable, FeatureSpec, FileFormat, LabelSpec, NodeTable, SplitSpec, TablesConfig, Transform,
    UnknownIds,
};
use crate::error::{Result, TableError};
use crate::source::CHUNK_ROWS;

/// The configuration file written by [`export_tables`].
pub const CONFIG_FILE: &str = "graph.toml";

/// Writes the graph directory `graph` as tables under `out` (`nodes/<type>`,
/// `edges/<relation>`, and `graph.toml`); returns the configuration's path.
pub fn export_tables(
    graph: &Path,
    out: &Path,
    format: FileFormat,
    overwrite: bool,
    progress: &mut dyn Progress,
) -> Result<PathBuf> {
    // Validates the whole directory first: an export of a broken graph is refused.
    graphs::load(graph, &graphs::LoadOptions::default())?;
    let schema = Schema::read(&paths::schema(graph))?;
    let dir = AtomicDir::create(out, overwrite)?;
    dir.create_dir(&dir.path().join("nodes"))?;
    dir.create_dir(&dir.path().join("edges"))?;
    let ext = match format {
        FileFormat::Csv => "csv",
        FileFormat::Parquet => "parquet",
    };
    let mut nodes = Vec::new();
    for (t, ts) in &schema.node_types {
        let file = PathBuf::from("nodes").join(format!("{t}.{ext}"));
        let target = *t == schema.target;
        let dim = ts.feature_dim.unwrap_or(0) as usize;
        let features = match ts.feature_dim {
            Some(_) => Some(NpyFile::open(&paths::features(graph, t), DType::F32)?),
            None => None,
        };
        let (labels, split) = if target {
            read_labels(graph, t, ts.count)?
        } else {
            (Vec::new(), Vec::new())
        };
        let mut columns = vec!["id".to_string()];
        columns.extend((0..dim).map(|j| format!("f{j}")));
        if target {
            columns.extend(["label".to_string(), "split".to_string()]);
        }
        let mut w = TableWriter::create(&dir.path().join(&file), format, &columns, dim, target)?;
        progress.start(&format!("{t} table"), ts.count);
        let bytes: &[u8] = features.as_ref().map_or(&[], |f| f.data());
        let mut start = 0u64;
        while start < ts.count {
            let end = (start + CHUNK_ROWS as u64).min(ts.count);
            let rows = start as usize..end as usize;
            let ids: Vec<String> = rows.clone().map(|i| format!("{t}-{i}")).collect();
            let f: Vec<f32> = bytes[rows.start * dim * 4..rows.end * dim * 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let (l, s) = if target {
                (&labels[rows.clone()], &split[rows.clone()])
            } else {
                (&[][..], &[][..])
            };
            w.write_nodes(&ids, &f, l, s)?;
            progress.advance(end - start);
            start = end;
        }
        w.finish()?;
        progress.finish();
        nodes.push(NodeTable {
            ntype: t.clone(),
            files: vec![file],
            format: None,
            delimiter: None,
            id: "id".into(),
            features: (dim > 0)
                .then(|| FeatureSpec {
                    columns: (0..dim).map(|j| format!("f{j}")).collect(),
                    transform: Transform::None,
                    fill: None,
                    boundaries: None,
                    separator: None,
                    max_categories: None,
                })
                .into_iter()
                .collect(),
            label: target.then(|| LabelSpec {
                column: "label".into(),
                max_classes: Some(schema.num_classes),
            }),
            split: target.then(|| SplitSpec {
                column: Some("split".into()),
                fractions: None,
                seed: None,
                time_column: None,
                train_before: None,
                valid_before: None,
            }),
        });
    }
    let mut edges = Vec::new();
    for r in &schema.relations {
        let canonical = r.canonical();
        let file = PathBuf::from("edges").join(format!("{canonical}.{ext}"));
        let f = NpyFile::open(&paths::edges(graph, &canonical), DType::I64)?;
        let e = r.count as usize;
        let mut w = TableWriter::create(
            &dir.path().join(&file),
            format,
            &["src".into(), "dst".into()],
            0,
            false,
        )?;
        progress.start(&format!("{canonical} table"), r.count);
        let mut start = 0;
        while start < e {
            let end = (start + CHUNK_ROWS).min(e);
            let src: Vec<String> = (start..end)
                .map(|i| format!("{}-{}", r.src, f.i64_at(i)))
                .collect();
            let dst: Vec<String> = (start..end)
                .map(|i| format!("{}-{}", r.dst, f.i64_at(e + i)))
                .collect();
            w.write_edges(&src, &dst)?;
            progress.advance((end - start) as u64);
            start = end;
        }
        w.finish()?;
        progress.finish();
        edges.push(EdgeTable {
            relation: [r.src.clone(), r.name.clone(), r.dst.clone()],
            files: vec![file],
            format: None,
            delimiter: None,
            source: "src".into(),
            destination: "dst".into(),
            unknown_ids: UnknownIds::Refuse,
        });
    }
    let cfg = TablesConfig {
        name: Some(schema.name.clone()),
        target: Some(schema.target.clone()),
        nodes,
        edges,
    };
    let text = toml::to_string(&cfg)
        .map_err(|e| TableError::file(out, format!("writing {CONFIG_FILE}: {e}")))?;
    let cpath = dir.path().join(CONFIG_FILE);
    let header = format!("# Tables exported from {} by `hetgnn export tables`.\n# Import with: hetgnn import tables --config {CONFIG_FILE} --out DIR\n\n", schema.name);
    std::fs::write(&cpath, header + &text).map_err(|e| TableError::io(&cpath, e))?;
    dir.commit()?;
    Ok(out.join(CONFIG_FILE))
}

/// Labels and split names per node of the target type.
fn read_labels(graph: &Path, t: &str, count: u64) -> Result<(Vec<i64>, Vec<&'static str>)> {
    let f = NpyFile::open(&paths::labels(graph, t), DType::I64)?;
    let labels: Vec<i64> = (0..f.len()).map(|i| f.i64_at(i)).collect();
    let mut split = vec![""; count as usize];
    for name in ["train", "valid", "test"] {
        let s = NpyFile::open(&paths::split(graph, t, name), DType::I64)?;
        for i in 0..s.len() {
            split[s.i64_at(i) as usize] = name;
        }
    }
    Ok((labels, split))
}

/// Writes rows to a CSV or Parquet file.
enum TableWriter {
    Csv(csv::Writer<BufWriter<File>>, PathBuf),
    Parquet(ArrowWriter<File>, Arc<ArrowSchema>, PathBuf),
}

impl TableWriter {
    fn create(
        path: &Path,
        format: FileFormat,
        columns: &[String],
        dim: usize,
        target: bool,
    ) -> Result<TableWriter> {
        let file = File::create(path).map_err(|e| TableError::io(path, e))?;
        Ok(match format {
            FileFormat::Csv => {
                let mut w = csv::Writer::from_writer(BufWriter::with_capacity(1 << 20, file));
                w.write_record(columns).map_err(|e| csv_io(path, e))?;
                TableWriter::Csv(w, path.to_path_buf())
            }
            FileFormat::Parquet => {
                let mut fields = Vec::new();
                for (j, c) in columns.iter().enumerate() {
                    let ty = if j == 0 || c == "src" || c == "dst" || c == "split" {
                        DataType::Utf8
                    } else if target && j == dim + 1 {
                        DataType::Int64
                    } else {
                        DataType::Float32
                    };
                    fields.push(Field::new(c, ty, true));
                }
                let schema = Arc::new(ArrowSchema::new(fields));
                let props = WriterProperties::builder()
                    .set_compression(Compression::SNAPPY)
                    .build();
                let w = ArrowWriter::try_new(file, schema.clone(), Some(props))
                    .map_err(|e| TableError::file(path, e.to_string()))?;
                TableWriter::Parquet(w, schema, path.to_path_buf())
            }
        })
    }

    fn write_nodes(
        &mut self,
        ids: &[String],
        feats: &[f32],
        labels: &[i64],
        split: &[&str],
    ) -> Result<()> {
        let dim = if ids.is_empty() {
            0
        } else {
            feats.len() / ids.len()
        };
        match self {
            TableWriter::Csv(w, path) => {
                let mut rec: Vec<String> = Vec::with_capacity(dim + 3);
                for (i, id) in ids.iter().enumerate() {
                    rec.clear();
                    rec.push(id.clone());
                    rec.extend(feats[i * dim..(i + 1) * dim].iter().map(|v| v.to_string()));
                    if !labels.is_empty() {
                        rec.push(if labels[i] < 0 {
                            String::new()
                        } else {
                            labels[i].to_string()
                        });
                        rec.push(split[i].to_string());
                    }
                    w.write_record(&rec).map_err(|e| csv_io(path, e))?;
                }
                Ok(())
            }
            TableWriter::Parquet(w, schema, path) => {
                let mut cols: Vec<ArrayRef> = vec![Arc::new(StringArray::from_iter_values(ids))];
                for j in 0..dim {
                    cols.push(Arc::new(Float32Array::from_iter_values(
                        (0..ids.len()).map(|i| feats[i * dim + j]),
                    )));
                }
                if !labels.is_empty() {
                    cols.push(Arc::new(Int64Array::from_iter(
                        labels.iter().map(|&l| (l >= 0).then_some(l)),
                    )));
                    cols.push(Arc::new(StringArray::from_iter(
                        split.iter().map(|s| (!s.is_empty()).then_some(*s)),
                    )));
                }
                let batch = RecordBatch::try_new(schema.clone(), cols)
                    .map_err(|e| TableError::file(path, e.to_string()))?;
                w.write(&batch)
                    .map_err(|e| TableError::file(path, e.to_string()))
            }
        }
    }

    fn write_edges(&mut self, src: &[String], dst: &[String]) -> Result<()> {
        match self {
            TableWriter::Csv(w, path) => {
                for (s, d) in src.iter().zip(dst) {
                    w.write_record([s, d]).map_err(|e| csv_io(path, e))?;
                }
                Ok(())
            }
            TableWriter::Parquet(w, schema, path) => {
                let cols: Vec<ArrayRef> = vec![
                    Arc::new(StringArray::from_iter_values(src)),
                    Arc::new(StringArray::from_iter_values(dst)),
                ];
                let batch = RecordBatch::try_new(schema.clone(), cols)
                    .map_err(|e| TableError::file(path, e.to_string()))?;
                w.write(&batch)
                    .map_err(|e| TableError::file(path, e.to_string()))
            }
        }
    }

    fn finish(self) -> Result<()> {
        match self {
            TableWriter::Csv(mut w, path) => w.flush().map_err(|e| TableError::io(&path, e)),
            TableWriter::Parquet(w, _, path) => w
                .close()
                .map(|_| ())
                .map_err(|e| TableError::file(&path, e.to_string())),
        }
    }
}

fn csv_io(path: &Path, e: csv::Error) -> TableError {
    TableError::io(path, std::io::Error::other(e.to_string()))
}
