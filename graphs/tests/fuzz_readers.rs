//! Fuzzing of the readers of the graph directory format as property tests:
//! arbitrary and mutated `.npy` files (preamble, header, dtype, shape,
//! truncation), arbitrary and mutated `schema.json`, and whole directories
//! with one file mutated. Every input must be read or refused with an error,
//! never a panic; what is read must agree with itself.
//!
//! A bounded number of cases by default; `HETGNN_FUZZ_CASES=200000` runs
//! that many per property:
//! `HETGNN_FUZZ_CASES=200000 cargo test -p graphs --release --test fuzz_readers`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use graphs::npy::{parse_header, DType, NpyFile, MAX_HEADER_LEN};
use graphs::schema::{
    NodeTypeSchema, RelationSchema, MAX_CLASSES, MAX_EDGES, MAX_FEATURE_DIM, MAX_NODES,
};
use graphs::{load, save, LoadOptions, Schema};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

/// Cases per property unless `HETGNN_FUZZ_CASES` says otherwise (scaled by
/// each property's cost so the file runs in a few seconds).
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("HETGNN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig::with_cases(cases)
}

/// Writes `bytes` to `path` by a rename, so a mapping of the previous content
/// (none should be left, but a SIGBUS would end the run) never sees it change.
fn put(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

// ---------------------------------------------------------------- .npy

/// A `.npy` file: preamble, header dict (padded as numpy pads it), data.
fn npy_bytes(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
    let pre = if version == 1 { 10 } else { 12 };
    let mut text = header.to_string();
    while !(pre + text.len() + 1).is_multiple_of(64) {
        text.push(' ');
    }
    text.push('\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend([version, 0]);
    if version == 1 {
        out.extend((text.len() as u16).to_le_bytes());
    } else {
        out.extend((text.len() as u32).to_le_bytes());
    }
    out.extend(text.as_bytes());
    out.extend(data);
    out
}

fn dict(descr: &str, fortran: &str, shape: &str) -> String {
    format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}")
}

fn tuple(shape: &[u64]) -> String {
    match shape {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A valid file: dtype, shape, data of the right length, header version.
#[derive(Clone, Debug)]
struct ValidNpy {
    dtype: DType,
    shape: Vec<u64>,
    version: u8,
    data: Vec<u8>,
}

impl ValidNpy {
    fn header(&self) -> String {
        dict(self.dtype.descr(), "False", &tuple(&self.shape))
    }
    fn bytes(&self) -> Vec<u8> {
        npy_bytes(self.version, &self.header(), &self.data)
    }
}

fn valid_npy() -> impl Strategy<Value = ValidNpy> {
    let dtype = prop_oneof![Just(DType::F32), Just(DType::I64)];
    (
        dtype,
        prop::collection::vec(0u64..5, 0..4),
        prop_oneof![Just(1u8), Just(2u8)],
    )
        .prop_flat_map(|(dtype, shape, version)| {
            let n = shape.iter().product::<u64>() as usize * dtype.size();
            prop::collection::vec(any::<u8>(), n).prop_map(move |data| ValidNpy {
                dtype,
                shape: shape.clone(),
                version,
                data,
            })
        })
}

/// Values a header field may be replaced with: near misses of the real ones.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("'<f4'".to_string()),
        Just("'<i8'".to_string()),
        Just("'>f4'".to_string()),
        Just("'|u1'".to_string()),
        Just("'<f8'".to_string()),
        Just("'<U3'".to_string()),
        Just("True".to_string()),
        Just("False".to_string()),
        Just("Tru".to_string()),
        Just("()".to_string()),
        Just("(3,)".to_string()),
        Just("(18446744073709551615,)".to_string()),
        Just("(18446744073709551616,)".to_string()),
        Just("(4294967296, 4294967296, 4294967296)".to_string()),
        Just("(-1,)".to_string()),
        Just("(1,,2)".to_string()),
        Just("((1, 2),)".to_string()),
        Just("[1, 2]".to_string()),
        Just(format!("({})", vec!["1"; 40].join(", "))),
        Just("'unterminated".to_string()),
        Just("\"<f4\"".to_string()),
        Just("".to_string()),
        "[ -~]{0,12}",
        ".{0,6}",
    ]
}

/// One edit of a file, aimed at what a reader trusts.
#[derive(Clone, Debug)]
enum Edit {
    Set(Index, u8),
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
    Truncate(Index),
    Append(Vec<u8>),
    /// A little-endian u16 or u32 (the header length) written over the bytes at the place.
    U16(Index, u16),
    U32(Index, u32),
    /// The text between two places replaced (a header value, a JSON token).
    Splice(Index, usize, String),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        3 => (any::<Index>(), 1u8..=255).prop_map(|(i, b)| Edit::Flip(i, b)),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..9)).prop_map(|(i, b)| Edit::Insert(i, b)),
        1 => (any::<Index>(), 1usize..16).prop_map(|(i, n)| Edit::Remove(i, n)),
        1 => any::<Index>().prop_map(Edit::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..16).prop_map(Edit::Append),
        1 => (any::<Index>(), prop_oneof![any::<u16>(), Just(u16::MAX), 0u16..200]).prop_map(|(i, v)| Edit::U16(i, v)),
        1 => (any::<Index>(), prop_oneof![any::<u32>(), Just(MAX_HEADER_LEN as u32 + 1), 0u32..200]).prop_map(|(i, v)| Edit::U32(i, v)),
        2 => (any::<Index>(), 0usize..12, header_value()).prop_map(|(i, n, s)| Edit::Splice(i, n, s)),
    ]
}

/// A file whose header fields were replaced (the header still well framed and
/// padded), so the reader gets past the preamble to the dtype and shape checks.
fn with_fields(
    f: &ValidNpy,
    descr: &Option<String>,
    fortran: &Option<String>,
    shape: &Option<String>,
) -> Vec<u8> {
    let descr = descr
        .clone()
        .unwrap_or_else(|| format!("'{}'", f.dtype.descr()));
    let text = format!(
        "{{'descr': {descr}, 'fortran_order': {}, 'shape': {}, }}",
        fortran.as_deref().unwrap_or("False"),
        shape.clone().unwrap_or_else(|| tuple(&f.shape))
    );
    npy_bytes(f.version, &text, &f.data)
}

/// Applies `edits` to the data of a `.npy` file only (past its header), or to all of it.
fn apply_npy(bytes: &mut Vec<u8>, edits: &[Edit], data_only: bool) {
    let start = if data_only {
        parse_header(bytes, Path::new("x.npy")).map_or(0, |h| h.data_offset)
    } else {
        0
    };
    let mut tail = bytes.split_off(start);
    apply(&mut tail, edits);
    bytes.extend(tail);
}

fn apply(bytes: &mut Vec<u8>, edits: &[Edit]) {
    for e in edits {
        let at = |i: &Index, b: &Vec<u8>| if b.is_empty() { 0 } else { i.index(b.len()) };
        let overwrite = |b: &mut Vec<u8>, i: usize, with: &[u8]| {
            let end = (i + with.len()).min(b.len());
            b.splice(i..end, with.iter().copied());
        };
        match e {
            Edit::Set(i, v) if !bytes.is_empty() => {
                let i = at(i, bytes);
                bytes[i] = *v;
            }
            Edit::Flip(i, v) if !bytes.is_empty() => {
                let i = at(i, bytes);
                bytes[i] ^= *v;
            }
            Edit::Insert(i, v) => {
                let i = at(i, bytes);
                bytes.splice(i..i, v.iter().copied());
            }
            Edit::Remove(i, n) if !bytes.is_empty() => {
                let i = at(i, bytes);
                bytes.drain(i..(i + n).min(bytes.len()));
            }
            Edit::Truncate(i) => {
                let i = at(i, bytes);
                bytes.truncate(i);
            }
            Edit::Append(v) => bytes.extend(v),
            Edit::U16(i, v) => {
                let i = at(i, bytes);
                overwrite(bytes, i, &v.to_le_bytes());
            }
            Edit::U32(i, v) => {
                let i = at(i, bytes);
                overwrite(bytes, i, &v.to_le_bytes());
            }
            Edit::Splice(i, n, s) => {
                let i = at(i, bytes);
                let end = (i + n).min(bytes.len());
                bytes.splice(i..end, s.bytes());
            }
            _ => {}
        }
    }
}

/// Opens `path` as `dtype`; whatever opens must agree with its own shape.
fn open_checked(path: &Path, dtype: DType, file_len: usize) -> Result<(), TestCaseError> {
    match NpyFile::open(path, dtype) {
        Ok(f) => {
            let elems: u64 = f.shape().iter().product();
            prop_assert_eq!(f.data().len() as u64, elems * dtype.size() as u64);
            prop_assert_eq!(f.len() as u64, elems);
            prop_assert_eq!(f.data_offset() + f.data().len(), file_len);
            match dtype {
                DType::I64 => {
                    let sum = (0..f.len()).fold(0i64, |a, i| a.wrapping_add(f.i64_at(i)));
                    let _ = sum;
                }
                DType::F32 => prop_assert_eq!(f.to_f32_vec().len(), f.len()),
                DType::I8 => prop_assert_eq!(f.to_i8_vec().len(), f.len()),
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn npy_headers_of_arbitrary_bytes_are_refused_or_point_inside_them(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        match parse_header(&bytes, Path::new("x.npy")) {
            Ok(h) => prop_assert!(bytes.starts_with(b"\x93NUMPY") && h.data_offset <= bytes.len()),
            Err(e) => prop_assert!(e.to_string().contains("x.npy")),
        }
        // With a correct preamble, so the bytes reach the dict parser.
        let text = String::from_utf8_lossy(&bytes);
        for v in [1u8, 2] {
            let file = npy_bytes(v, &text, &[]);
            match parse_header(&file, Path::new("x.npy")) {
                Ok(h) => prop_assert!(h.data_offset <= file.len()),
                Err(e) => prop_assert!(e.to_string().contains("x.npy")),
            }
        }
    }

    #[test]
    fn npy_headers_of_near_miss_dicts_parse_or_are_refused(descr in header_value(), fortran in header_value(), shape in header_value(), extra in prop_oneof![Just(String::new()), header_value()], v in 1u8..=2) {
        let mut text = dict(&descr, &fortran, &shape);
        text.push_str(&extra);
        let bytes = npy_bytes(v, &text, &[]);
        if let Ok(h) = parse_header(&bytes, Path::new("x.npy")) {
            prop_assert!(h.data_offset <= bytes.len());
            prop_assert!(h.shape.len() <= 32);
        }
    }
}

proptest! {
    #![proptest_config(config(1500))]

    #[test]
    fn valid_npy_files_open_as_written(f in valid_npy()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npy");
        put(&path, &f.bytes());
        let opened = NpyFile::open(&path, f.dtype).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(opened.shape(), f.shape.as_slice());
        prop_assert_eq!(opened.data(), f.data.as_slice());
        let other = if f.dtype == DType::F32 { DType::I64 } else { DType::F32 };
        prop_assert!(NpyFile::open(&path, other).is_err(), "opened as the other dtype");
    }

    #[test]
    fn mutated_npy_files_open_consistently_or_are_refused(f in valid_npy(), edits in prop::collection::vec(edit(), 0..5), fields in prop::option::weighted(0.5, (prop::option::of(header_value()), prop::option::of(header_value()), prop::option::of(header_value()))), as_f32 in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npy");
        let mut bytes = match &fields {
            Some((d, o, s)) => with_fields(&f, d, o, s),
            None => f.bytes(),
        };
        apply(&mut bytes, &edits);
        put(&path, &bytes);
        open_checked(&path, if as_f32 { DType::F32 } else { DType::I64 }, bytes.len())?;
    }

    #[test]
    fn truncated_npy_files_are_refused(f in valid_npy(), cut in any::<Index>()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npy");
        let bytes = f.bytes();
        let keep = cut.index(bytes.len());
        put(&path, &bytes[..keep]);
        prop_assert!(NpyFile::open(&path, f.dtype).is_err(), "{} of {} bytes opened", keep, bytes.len());
    }
}

// ---------------------------------------------------------------- schema.json

fn type_name() -> impl Strategy<Value = String> {
    prop_oneof![8 => "[a-z][a-z0-9_-]{0,8}", 1 => "[A-Za-z0-9_.-]{1,130}", 1 => ".{0,5}"]
}

/// A schema that passes validation (names, references, counts within limits).
fn valid_schema() -> impl Strategy<Value = Schema> {
    let types = prop::collection::vec(
        (0u64..=MAX_NODES, prop::option::of(1u64..=MAX_FEATURE_DIM)),
        1..5,
    );
    (types, 1u32..=MAX_CLASSES, "[ -~]{0,20}")
        .prop_flat_map(|(types, num_classes, name)| {
            let n = types.len();
            let node_types: Vec<(String, NodeTypeSchema)> = types
                .iter()
                .enumerate()
                .map(|(i, (count, dim))| {
                    (
                        format!("t{i}"),
                        NodeTypeSchema {
                            count: *count,
                            feature_dim: *dim,
                        },
                    )
                })
                .collect();
            let relation = (0..n, "[a-z][a-z0-9]{0,6}", 0..n, 0u64..=MAX_EDGES);
            (
                Just(node_types),
                0..n,
                prop::collection::vec(relation, 0..5),
                Just(num_classes),
                Just(name),
            )
        })
        .prop_map(|(node_types, target, rels, num_classes, name)| {
            let mut relations: Vec<RelationSchema> = Vec::new();
            for (s, rel, d, count) in rels {
                let r = RelationSchema {
                    src: format!("t{s}"),
                    name: rel,
                    dst: format!("t{d}"),
                    count,
                    ..Default::default()
                };
                if !relations.iter().any(|x| x.canonical() == r.canonical()) {
                    relations.push(r);
                }
            }
            Schema {
                name,
                target: format!("t{target}"),
                num_classes,
                node_types,
                relations,
                values: false,
                label_sets: None,
            }
        })
}

/// JSON values of every kind, keyed often by the schema's own field names.
fn json_value() -> impl Strategy<Value = Value> {
    let number = prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        Just(json!(MAX_NODES)),
        Just(json!(MAX_NODES + 1)),
        Just(json!(u32::MAX)),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(json!(1e300)),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number,
        type_name().prop_map(Value::String),
        any::<String>().prop_map(Value::String)
    ];
    let key = prop_oneof![
        Just("name".to_string()),
        Just("target".to_string()),
        Just("num_classes".to_string()),
        Just("node_types".to_string()),
        Just("relations".to_string()),
        Just("count".to_string()),
        Just("feature_dim".to_string()),
        Just("src".to_string()),
        Just("dst".to_string()),
        type_name(),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// One structural edit of a JSON document: a value somewhere replaced, a key dropped or renamed.
#[derive(Clone, Debug)]
enum JsonEdit {
    Replace(Vec<Index>, Value),
    Drop(Vec<Index>),
    Rename(Vec<Index>, String),
}

/// Values a schema's own would be replaced with: other counts, other names.
fn tweak_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (0u64..100).prop_map(Value::from),
        1 => prop_oneof![Just(MAX_NODES), Just(MAX_FEATURE_DIM), Just(MAX_FEATURE_DIM + 1), Just(u64::from(MAX_CLASSES)), Just(u64::from(MAX_CLASSES) + 1), Just(MAX_EDGES), Just(MAX_EDGES + 1)].prop_map(Value::from),
        3 => prop_oneof![Just("t0".to_string()), Just("t1".to_string()), type_name()].prop_map(Value::String),
        1 => Just(Value::Null),
    ]
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    let path = prop::collection::vec(any::<Index>(), 0..4);
    prop_oneof![
        4 => (path.clone(), tweak_value()).prop_map(|(p, v)| JsonEdit::Replace(p, v)),
        2 => (path.clone(), json_value()).prop_map(|(p, v)| JsonEdit::Replace(p, v)),
        1 => path.clone().prop_map(JsonEdit::Drop),
        1 => (path, type_name()).prop_map(|(p, k)| JsonEdit::Rename(p, k)),
    ]
}

/// The container at the end of `path` (each step picks a child by index), and the index of a child in it.
fn walk<'a>(mut v: &'a mut Value, path: &[Index]) -> &'a mut Value {
    for step in path {
        let n = match &*v {
            Value::Array(a) => a.len(),
            Value::Object(o) => o.len(),
            _ => 0,
        };
        if n == 0 {
            break;
        }
        let i = step.index(n);
        let child_is_container = match &*v {
            Value::Array(a) => a[i].is_array() || a[i].is_object(),
            Value::Object(o) => o
                .values()
                .nth(i)
                .is_some_and(|c| c.is_array() || c.is_object()),
            _ => false,
        };
        if !child_is_container {
            break;
        }
        v = match v {
            Value::Array(a) => &mut a[i],
            Value::Object(o) => o.values_mut().nth(i).expect("in range"),
            _ => unreachable!(),
        };
    }
    v
}

fn apply_json(doc: &mut Value, edits: &[JsonEdit]) {
    for e in edits {
        let (path, pick) = match e {
            JsonEdit::Replace(p, _) | JsonEdit::Drop(p) | JsonEdit::Rename(p, _) => {
                (&p[..p.len().saturating_sub(1)], p.last())
            }
        };
        let v = walk(doc, path);
        let n = match &*v {
            Value::Array(a) => a.len(),
            Value::Object(o) => o.len(),
            _ => 0,
        };
        let i = match pick {
            Some(p) if n > 0 => p.index(n),
            _ => 0,
        };
        match (e, v) {
            (JsonEdit::Replace(_, new), Value::Array(a)) if n > 0 => a[i] = new.clone(),
            (JsonEdit::Replace(_, new), Value::Object(o)) if n > 0 => {
                *o.values_mut().nth(i).expect("in range") = new.clone()
            }
            (JsonEdit::Replace(_, new), v) => *v = new.clone(),
            (JsonEdit::Drop(_), Value::Array(a)) if n > 0 => {
                a.remove(i);
            }
            (JsonEdit::Drop(_), Value::Object(o)) if n > 0 => {
                let key = o.keys().nth(i).cloned().expect("in range");
                o.shift_remove(&key);
            }
            (JsonEdit::Rename(_, k), Value::Object(o)) if n > 0 => {
                let key = o.keys().nth(i).cloned().expect("in range");
                if let Some(val) = o.shift_remove(&key) {
                    o.insert(k.clone(), val);
                }
            }
            _ => {}
        }
    }
}

/// Reads `text` as `schema.json`; whatever is read is valid and round-trips.
fn read_checked(dir: &Path, text: &[u8]) -> Result<(), TestCaseError> {
    let path = dir.join("schema.json");
    put(&path, text);
    match Schema::read(&path) {
        Ok(s) => {
            prop_assert_eq!(s.validate(), Ok(()));
            s.write(&path)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                Schema::read(&path).map_err(|e| TestCaseError::fail(e.to_string()))?,
                s
            );
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1500))]

    #[test]
    fn valid_schemas_round_trip(s in valid_schema()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("schema.json");
        s.write(&path).unwrap();
        prop_assert_eq!(Schema::read(&path).map_err(|e| TestCaseError::fail(e.to_string()))?, s);
    }

    #[test]
    fn arbitrary_json_is_read_or_refused(v in json_value()) {
        let dir = tempfile::tempdir().unwrap();
        read_checked(dir.path(), v.to_string().as_bytes())?;
    }

    #[test]
    fn arbitrary_bytes_are_refused_as_schemas(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let dir = tempfile::tempdir().unwrap();
        read_checked(dir.path(), &bytes)?;
    }

    #[test]
    fn mutated_schemas_are_read_valid_or_refused(s in valid_schema(), edits in prop::collection::vec(json_edit(), 0..4), bytes in prop::option::weighted(0.3, prop::collection::vec(edit(), 1..3)), dup in prop::option::weighted(0.2, any::<Index>())) {
        let dir = tempfile::tempdir().unwrap();
        let mut doc = serde_json::to_value(&s).unwrap();
        apply_json(&mut doc, &edits);
        let mut text = serde_json::to_string_pretty(&doc).unwrap();
        // A key repeated (JSON allows it; the reader must refuse or pick one consistently).
        if let Some(i) = dup {
            let keys = ["\"name\"", "\"target\"", "\"count\"", "\"t0\"", "\"num_classes\""];
            let key = keys[i.index(keys.len())];
            if let Some(at) = text.find(key) {
                let line_end = text[at..].find('\n').map_or(text.len(), |e| at + e);
                let entry = text[at..line_end].trim_end_matches(',').to_string();
                text.insert_str(at, &format!("{entry},\n"));
            }
        }
        let mut raw = text.into_bytes();
        apply(&mut raw, bytes.as_deref().unwrap_or_default());
        read_checked(dir.path(), &raw)?;
    }

    #[test]
    fn deeply_nested_json_is_refused(depth in 1usize..20_000, object in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let (open, close) = if object { ("{\"node_types\":", "}") } else { ("[", "]") };
        let text = format!("{}0{}", open.repeat(depth), close.repeat(depth));
        read_checked(dir.path(), text.as_bytes())?;
    }
}

// ---------------------------------------------------------------- whole directories

/// The files of a small valid graph directory, read once.
fn tiny_files() -> &'static Vec<(PathBuf, Vec<u8>)> {
    static FILES: OnceLock<Vec<(PathBuf, Vec<u8>)>> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let g = dir.path().join("g");
        save(&common::tiny(), &g, false).unwrap();
        common::read_all(&g)
            .into_iter()
            .map(|(p, bytes)| (PathBuf::from(p), bytes))
            .collect()
    })
}

/// Counts a mutated schema may declare here: small (the loader allocates per
/// declared node, as it must) or refused by validation before any loading.
fn small_count() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..64).prop_map(Value::from),
        Just(json!(MAX_NODES + 1)),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(2.5)),
        Just(Value::Null)
    ]
}

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn directories_with_a_mutated_file_load_or_are_refused(which in any::<Index>(), edits in prop::collection::vec(edit(), 1..4), data_only in any::<bool>(), count_at in prop::collection::vec(any::<Index>(), 0..3), count in small_count(), mmap in any::<bool>(), reverse in any::<bool>()) {
        let files = tiny_files();
        let dir = tempfile::tempdir().unwrap();
        for (rel, bytes) in files {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, bytes).unwrap();
        }
        let (rel, bytes) = &files[which.index(files.len())];
        let mut bytes = bytes.clone();
        if rel == Path::new("schema.json") && !count_at.is_empty() {
            // A count or dimension changed in the schema alone, so files and schema disagree.
            let mut doc: Value = serde_json::from_slice(&bytes).unwrap();
            let mut slots: Vec<&mut Value> = Vec::new();
            if let Some(Value::Object(types)) = doc.get_mut("node_types") {
                for t in types.values_mut() {
                    if let Value::Object(t) = t {
                        slots.extend(t.values_mut());
                    }
                }
            }
            let n = slots.len();
            let picks: Vec<usize> = count_at.iter().map(|i| i.index(n)).collect();
            for (k, s) in slots.into_iter().enumerate() {
                if picks.contains(&k) {
                    *s = count.clone();
                }
            }
            bytes = serde_json::to_vec(&doc).unwrap();
        } else {
            apply_npy(&mut bytes, &edits, data_only && rel.extension().is_some_and(|e| e == "npy"));
        }
        put(&dir.path().join(rel), &bytes);
        match load(dir.path(), &LoadOptions { mmap_features: mmap, reverse_edges: reverse }) {
            Ok(g) => prop_assert!(!g.node_types().is_empty()),
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}
