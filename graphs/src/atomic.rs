//! Files written whole or not at all. Every output is written to a hidden
//! temporary sibling and renamed over its destination once complete, so that
//! a failed write (a full disk, a crash, an error half-way) never leaves a
//! truncated file under the real name, and a destination that is a hard link
//! to another file (an input) is replaced as a name, its other links left
//! untouched, instead of being rewritten through.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::error::{GraphError, Result};

/// A file being written under a temporary name beside its destination;
/// [`AtomicFile::commit`] moves it into place, dropping it removes it.
pub struct AtomicFile {
    tmp: NamedTempFile,
    dest: PathBuf,
}

impl AtomicFile {
    /// Creates the temporary sibling of `dest` (same directory, so the rename
    /// stays on one file system; same extension, for writers that infer the
    /// format from it), and `dest`'s missing parent directories.
    pub fn create(dest: &Path) -> Result<AtomicFile> {
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = dest
            .file_name()
            .ok_or_else(|| GraphError::data(dest, "names no file"))?
            .to_string_lossy();
        let suffix = dest
            .extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default();
        std::fs::create_dir_all(dir).map_err(|e| GraphError::io(dir, e))?;
        let mut builder = tempfile::Builder::new();
        // As `File::create` would (0666 less the umask), not a temporary file's 0600.
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        let tmp = builder
            .prefix(&format!(".{name}."))
            .suffix(&format!(".tmp{suffix}"))
            .tempfile_in(dir)
            .map_err(|e| GraphError::io(dest, e))?;
        Ok(AtomicFile {
            tmp,
            dest: dest.to_path_buf(),
        })
    }

    /// The temporary file's path (for writers that take a path).
    pub fn temp_path(&self) -> &Path {
        self.tmp.path()
    }

    /// The destination.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// The open temporary file.
    pub fn file(&self) -> &File {
        self.tmp.as_file()
    }

    /// Renames the complete file over the destination.
    pub fn commit(self) -> Result<()> {
        let dest = self.dest;
        self.tmp
            .persist(&dest)
            .map(drop)
            .map_err(|e| GraphError::io(&dest, e.error))
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tmp.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tmp.flush()
    }
}

impl std::io::Seek for AtomicFile {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.tmp.seek(pos)
    }
}

/// Writes `bytes` to `path` whole or not at all.
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes.as_ref())
        .map_err(|e| GraphError::io(path, e))?;
    f.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_a_hard_link_as_a_name_and_leaves_nothing_on_failure() {
        let d = tempfile::tempdir().unwrap();
        let input = d.path().join("labels.npy");
        std::fs::write(&input, b"training labels").unwrap();
        let out = d.path().join("out.npy");
        std::fs::hard_link(&input, &out).unwrap();
        write(&out, b"predictions").unwrap();
        assert_eq!(std::fs::read(&input).unwrap(), b"training labels");
        assert_eq!(std::fs::read(&out).unwrap(), b"predictions");

        // Dropped before commit: the destination keeps its old content and no
        // temporary file is left behind.
        let mut f = AtomicFile::create(&out).unwrap();
        f.write_all(b"half").unwrap();
        assert!(f.temp_path().to_string_lossy().ends_with(".npy"));
        drop(f);
        assert_eq!(std::fs::read(&out).unwrap(), b"predictions");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn missing_parents_are_created_and_a_file_in_the_way_is_named() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("runs/a/report.json");
        write(&out, b"x").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"x");
        let e = write(&out.join("r.json"), b"x").unwrap_err().to_string();
        assert!(e.contains("report.json"), "{e}");
    }
}
