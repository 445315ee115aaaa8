//! Opening the files a user names, one way for every reader: only regular
//! files (a FIFO or a device would block or never end), missing files named
//! as missing, and small structured files (schemas, manifests, configs) read
//! with a size cap checked before anything is allocated.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{GraphError, Result};

/// Cap on a JSON or TOML file that describes data (schema, manifest, config, report).
pub const MAX_TEXT_BYTES: u64 = 64 << 20;

/// Opens `path` for reading if it is a regular file (after symlinks).
pub fn open(path: &Path) -> Result<File> {
    // Opening a FIFO for reading blocks until a writer comes: O_NONBLOCK makes
    // the open return at once, and the fstat below refuses it (it has no
    // effect on reads of regular files).
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => GraphError::Missing {
            path: path.to_path_buf(),
        },
        _ if e.raw_os_error() == Some(libc::ELOOP) => {
            GraphError::data(path, "is a loop of symbolic links, not a file")
        }
        _ => GraphError::io(path, e),
    })?;
    let meta = file.metadata().map_err(|e| GraphError::io(path, e))?;
    if !meta.is_file() {
        return Err(GraphError::data(
            path,
            format!("is {}, not a regular file", kind_of(&meta)),
        ));
    }
    Ok(file)
}

/// Reads all of `path`, a regular file of at most `limit` bytes.
pub fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let file = open(path)?;
    let len = file.metadata().map_err(|e| GraphError::io(path, e))?.len();
    if len > limit {
        return Err(GraphError::data(
            path,
            format!("is {len} bytes; files of this kind are at most {limit} bytes"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // The file may grow after the stat: read at most one byte past the limit to tell.
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| GraphError::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(GraphError::data(
            path,
            format!("grew past {limit} bytes while being read"),
        ));
    }
    Ok(bytes)
}

/// Reads `path` as UTF-8 text of at most [`MAX_TEXT_BYTES`].
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = read_capped(path, MAX_TEXT_BYTES)?;
    String::from_utf8(bytes).map_err(|e| {
        GraphError::data(
            path,
            format!("is not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// A path the configuration (TOML, UTF-8) can hold, or an error naming the flag.
pub fn utf8_path(flag: &str, path: &Path) -> Result<String> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| GraphError::InvalidArgument(format!("{flag} {}: not valid UTF-8; hetgnn's configuration holds UTF-8 paths only (rename it, or link to it from a UTF-8 path)", path.display())))
}

/// Checks that `path` is a directory (after symlinks) before files are read
/// from it, saying what it is otherwise (`what`: "a graph directory", ...):
/// a regular file or a symlink loop named as such, not as a missing file.
pub fn dir(path: &Path, what: &str) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(m) => Err(GraphError::data(
            path,
            format!(
                "is {}, not {what}",
                if m.is_file() {
                    "a regular file"
                } else {
                    kind_of(&m)
                }
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(GraphError::data(
            path,
            format!("does not exist (expected {what})"),
        )),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(GraphError::data(
            path,
            format!("is a loop of symbolic links, not {what}"),
        )),
        Err(e) => Err(GraphError::io(path, e)),
    }
}

fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_regular_file_and_caps_size() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Returns at once (a blocking open would hang the test) with the kind named.
        assert!(open(&fifo).unwrap_err().to_string().contains("a FIFO"));
        assert!(open(d.path())
            .unwrap_err()
            .to_string()
            .contains("a directory"));
        assert!(open(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string()
            .contains("a device"));
        assert!(matches!(
            open(&d.path().join("none")),
            Err(GraphError::Missing { .. })
        ));
        let link = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_text(&link)
            .unwrap_err()
            .to_string()
            .contains("a device"));
        let big = d.path().join("big.json");
        std::fs::write(&big, vec![b' '; 100]).unwrap();
        assert!(read_capped(&big, 99)
            .unwrap_err()
            .to_string()
            .contains("at most 99 bytes"));
        assert_eq!(read_capped(&big, 100).unwrap().len(), 100);
        std::fs::write(&big, [0xff, 0xfe]).unwrap();
        assert!(read_text(&big)
            .unwrap_err()
            .to_string()
            .contains("not UTF-8"));
    }
}
