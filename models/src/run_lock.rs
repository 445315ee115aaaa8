//! One run per checkpoint directory: a run holds an exclusive lock on the
//! directory's `.lock` file for as long as it trains, so that a second run
//! started on the same directory is refused (naming the holder) instead of
//! interleaving its epochs with the first one's. The kernel drops the lock
//! when the holder exits, however it exits: a crashed run never leaves the
//! directory locked.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};

/// The lock file's name inside a checkpoint directory.
pub const LOCK_FILE: &str = ".lock";

/// Most bytes of the holder's description read back.
const MAX_HOLDER: u64 = 4096;

/// A checkpoint directory held by this process until dropped.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    dir: PathBuf,
}

impl RunLock {
    /// The directory held.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Takes `dir` (created if missing) for this run, or refuses with
/// [`ModelError::InUse`] naming the process that holds it.
pub fn lock(dir: &Path) -> Result<RunLock> {
    let io = |e: std::io::Error| ModelError::Io {
        path: dir.display().to_string(),
        source: e,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = (&file).take(MAX_HOLDER).read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(ModelError::InUse {
                path: dir.display().to_string(),
                holder: if holder.is_empty() {
                    "another run".into()
                } else {
                    holder.escape_debug().to_string()
                },
            });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let args: Vec<String> = std::env::args().collect();
    let me = format!(
        "process {} (`{}`, since unix time {since})",
        std::process::id(),
        args.join(" ")
    );
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(me.as_bytes()))
        .map_err(io)?;
    Ok(RunLock {
        _file: file,
        dir: dir.to_path_buf(),
    })
}

/// [`lock`] for a run that may keep no checkpoints (`None`: nothing to hold).
pub fn hold(dir: Option<&Path>) -> Result<Option<RunLock>> {
    dir.map(lock).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_run_is_refused_naming_the_first_until_it_ends() {
        let d = tempfile::tempdir().unwrap();
        let ck = d.path().join("ck");
        let held = lock(&ck).unwrap();
        assert_eq!(held.dir(), ck);
        let e = lock(&ck).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, ModelError::InUse { .. }), "{e:?}");
        assert!(
            text.contains(&format!("process {}", std::process::id()))
                && text.contains("choose another"),
            "{text}"
        );
        drop(held);
        lock(&ck).unwrap();
    }
}
