//! A graph directory known by its content: the SHA-256 of every file in it
//! (by relative path, hidden files excluded), so that a checkpoint or a
//! partitioning made from one graph is refused on another that merely has the
//! same name (a copy with one relation rewritten, an edited label file).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::error::{GraphError, Result};
use crate::seal::hex;

/// Most files hashed in one directory (a graph has a few per type and
/// relation; the bound keeps a mistaken path from walking a disk).
const MAX_FILES: usize = 100_000;

/// Hex SHA-256 over the sorted `relative path, SHA-256 of the file` lines of
/// every regular, non-hidden file under `dir` (symlinks followed to files,
/// not into directories). Files are hashed in parallel.
pub fn content(dir: &Path) -> Result<String> {
    let mut all = Sha256::new();
    for (rel, h) in files(dir)? {
        all.update(rel.as_bytes());
        all.update(b"\0");
        all.update(h.as_bytes());
        all.update(b"\n");
    }
    Ok(hex(&all.finalize()))
}

/// Every regular, non-hidden file under `dir` by relative path (`/`
/// separated), with its hex SHA-256; hashed in parallel.
pub fn files(dir: &Path) -> Result<BTreeMap<String, String>> {
    files_with(dir, file)
}

/// [`files`] with each file's [`checksum`]: what partition manifests record.
pub fn checksums(dir: &Path) -> Result<BTreeMap<String, String>> {
    files_with(dir, checksum)
}

/// Prefix of a [`checksum`]; a manifest's checksum without it is SHA-256
/// (manifests written before 2026-12-06).
const BLAKE3: &str = "blake3:";

/// `blake3:` and the hex BLAKE3 of one file, read in place: a fourth of
/// SHA-256's time here, for checks every node repeats on every start.
pub fn checksum(path: &Path) -> Result<String> {
    Ok(format!("{BLAKE3}{}", blake3_file(path)?))
}

/// Whether the file at `path` has the checksum `want` that a manifest
/// records: a [`checksum`], or the hex SHA-256 of older manifests.
pub fn matches(path: &Path, want: &str) -> Result<bool> {
    match want.strip_prefix(BLAKE3) {
        Some(hex) => Ok(blake3_file(path)? == hex),
        None => Ok(file(path)? == want),
    }
}

/// Hex BLAKE3 of one file, read in place (mapped).
pub fn blake3_file(path: &Path) -> Result<String> {
    let f = crate::input::open(path)?;
    let map = crate::mapped::Mapped::map(&f, path)?;
    Ok(blake3::hash(&map).to_hex().to_string())
}

fn files_with(dir: &Path, hash: fn(&Path) -> Result<String>) -> Result<BTreeMap<String, String>> {
    let mut found = Vec::new();
    walk(dir, Path::new(""), &mut found)?;
    found
        .par_iter()
        .map(|rel| {
            let name = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            hash(&dir.join(rel)).map(|h| (name, h))
        })
        .collect()
}

/// Hex SHA-256 of one file, read in 1 MiB blocks.
pub fn file(path: &Path) -> Result<String> {
    use std::io::Read;
    let mut f = crate::input::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| GraphError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// The first 12 hex digits, for messages.
pub fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(rel);
    let entries = std::fs::read_dir(&dir).map_err(|e| GraphError::io(&dir, e))?;
    for e in entries {
        let e = e.map_err(|e| GraphError::io(&dir, e))?;
        let name = e.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = rel.join(&name);
        let kind = e
            .file_type()
            .map_err(|err| GraphError::io(&e.path(), err))?;
        if kind.is_dir() {
            walk(root, &path, out)?;
        } else if std::fs::metadata(e.path()).is_ok_and(|m| m.is_file()) {
            if out.len() >= MAX_FILES {
                return Err(GraphError::data(
                    root,
                    format!("holds more than {MAX_FILES} files: not a graph directory"),
                ));
            }
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_content_equal_fingerprint_one_byte_changes_it() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        for g in [&a, &b] {
            std::fs::create_dir_all(g.join("edges")).unwrap();
            std::fs::write(g.join("schema.json"), b"{}").unwrap();
            std::fs::write(g.join("edges/r.npy"), b"0123").unwrap();
        }
        // Hidden files (temporaries, locks) do not count.
        std::fs::write(b.join(".lock"), b"x").unwrap();
        assert_eq!(content(&a).unwrap(), content(&b).unwrap());
        std::fs::write(b.join("edges/r.npy"), b"0124").unwrap();
        assert_ne!(content(&a).unwrap(), content(&b).unwrap());
        // A file moved to another name is another graph.
        std::fs::rename(b.join("edges/r.npy"), b.join("edges/s.npy")).unwrap();
        std::fs::write(b.join("edges/s.npy"), b"0123").unwrap();
        assert_ne!(content(&a).unwrap(), content(&b).unwrap());
    }

    #[test]
    fn checksums_are_blake3_and_older_sha256_ones_are_still_checked() {
        let d = tempfile::tempdir().unwrap();
        let (f, empty) = (d.path().join("f.npy"), d.path().join("empty"));
        std::fs::write(&f, b"abc").unwrap();
        std::fs::write(&empty, b"").unwrap();
        // BLAKE3 of "abc" and of nothing (the reference implementation's values).
        let abc = checksum(&f).unwrap();
        assert_eq!(
            abc,
            "blake3:6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
        assert_eq!(
            checksum(&empty).unwrap(),
            "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        let sha = file(&f).unwrap();
        assert!(matches(&f, &abc).unwrap() && matches(&f, &sha).unwrap());
        std::fs::write(&f, b"abd").unwrap();
        assert!(!matches(&f, &abc).unwrap() && !matches(&f, &sha).unwrap());
        assert_eq!(
            checksums(d.path()).unwrap().keys().collect::<Vec<_>>(),
            ["empty", "f.npy"]
        );
    }
}
