//! Every command's outputs are checked before any work starts: an existing
//! output is replaced only with `--force`, a file output must not name a
//! directory, no output may be, hold or sit inside an input of the same
//! command (`--force` or not), nor be a hard link to one of its files, so that
//! no command can overwrite what it reads; and every output's location must
//! be writable, so that a run does not learn it only once its work is done.
//! (The files themselves are written whole or not at all: [`graphs::atomic`].)

use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};

/// What an output path must be.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A file written whole (a report, a `.npy`, a PNG).
    File,
    /// A directory written whole (replaced as a unit).
    Dir,
    /// A directory that a run adds to (checkpoints): it may exist.
    AddTo,
}

/// One output of a command: its flag, path and kind.
pub struct Output<'a> {
    pub flag: &'a str,
    pub path: &'a Path,
    pub kind: Kind,
}

/// Checks `outputs` against each other and against `inputs` (flag, path).
pub fn check(outputs: &[Output], force: bool, inputs: &[(&str, &Path)]) -> anyhow::Result<()> {
    for (i, o) in outputs.iter().enumerate() {
        let out = absolute(o.path)?;
        for (flag, input) in inputs {
            let inp = absolute(input)?;
            if out.starts_with(&inp) || inp.starts_with(&out) {
                let how = if out == inp {
                    "is"
                } else if out.starts_with(&inp) {
                    "is inside"
                } else {
                    "holds"
                };
                bail!("{} {} {how} the input {flag} {}: writing it would overwrite what this command reads; choose another path", o.flag, o.path.display(), input.display());
            }
        }
        writable(o, &out)?;
        if let Ok(meta) = std::fs::metadata(o.path) {
            if o.kind == Kind::File {
                if let Some((flag, file)) = linked_input(&meta, inputs) {
                    bail!("{} {} is a hard link to {file} of the input {flag}: writing it would overwrite what this command reads; choose another path", o.flag, o.path.display(), file = file.display());
                }
            }
            match o.kind {
                Kind::File if meta.is_dir() => bail!(
                    "{} {}: is a directory; give a file name",
                    o.flag,
                    o.path.display()
                ),
                Kind::Dir | Kind::AddTo if !meta.is_dir() => bail!(
                    "{} {}: exists and is not a directory",
                    o.flag,
                    o.path.display()
                ),
                Kind::Dir if !force && !is_empty_dir(o.path) => bail!(
                    "{} {}: already exists; pass --force to replace it",
                    o.flag,
                    o.path.display()
                ),
                Kind::File if !force => bail!(
                    "{} {}: already exists; pass --force to replace it",
                    o.flag,
                    o.path.display()
                ),
                _ => {}
            }
        }
        for other in &outputs[i + 1..] {
            let b = absolute(other.path)?;
            if out.starts_with(&b) || b.starts_with(&out) {
                bail!(
                    "{} {} and {} {} overlap; give them separate paths",
                    o.flag,
                    o.path.display(),
                    other.flag,
                    other.path.display()
                );
            }
        }
    }
    Ok(())
}

/// Refuses an output whose nearest existing ancestor directory cannot take a
/// new file (read-only, full of inodes, not a directory), by creating and
/// removing a probe file there.
fn writable(o: &Output, full: &Path) -> anyhow::Result<()> {
    let start = match o.kind {
        Kind::File => full.parent().map(Path::to_path_buf),
        Kind::Dir | Kind::AddTo => Some(full.to_path_buf()),
    };
    let mut dir = start.as_deref();
    while let Some(d) = dir {
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => {
                return tempfile::Builder::new()
                    .prefix(".hetgnn-write-probe.")
                    .tempfile_in(d)
                    .map(drop)
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "{} {}: cannot write in {}: {e}; choose a writable location",
                            o.flag,
                            o.path.display(),
                            d.display()
                        )
                    });
            }
            Ok(_) => bail!(
                "{} {}: {} is not a directory",
                o.flag,
                o.path.display(),
                d.display()
            ),
            Err(_) => dir = d.parent(),
        }
    }
    Ok(())
}

/// Most entries looked at for hard links in one input (a graph has a few per
/// type and relation; the bound keeps a mistaken `--data /` from walking a disk).
const MAX_WALK: usize = 100_000;

/// The input file, if any, that is the same file (device and inode) as `out`.
fn linked_input<'a>(
    out: &std::fs::Metadata,
    inputs: &[(&'a str, &Path)],
) -> Option<(&'a str, PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let id = (out.dev(), out.ino());
    for (flag, input) in inputs {
        let mut stack = vec![input.to_path_buf()];
        let mut seen = 0;
        while let Some(p) = stack.pop() {
            seen += 1;
            if seen > MAX_WALK {
                break;
            }
            let Ok(meta) = std::fs::metadata(&p) else {
                continue;
            };
            if meta.is_file() && (meta.dev(), meta.ino()) == id {
                return Some((flag, p));
            }
            // Symlinked directories are not followed (no loops).
            let real_dir = std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir());
            if real_dir {
                if let Ok(entries) = std::fs::read_dir(&p) {
                    stack.extend(entries.flatten().map(|e| e.path()));
                }
            }
        }
    }
    None
}

fn is_empty_dir(path: &Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
}

/// `path` made absolute with symlinks resolved as far as it exists, and
/// `.`/`..` folded lexically beyond that (an output need not exist yet).
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir()?;
    let full = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    let mut existing = full.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            let mut out = real;
            for c in rest.iter().rev() {
                push(&mut out, *c);
            }
            return Ok(out);
        }
        match (existing.parent(), existing.components().next_back()) {
            (Some(parent), Some(last)) => {
                rest.push(last);
                existing = parent;
            }
            _ => {
                let mut out = PathBuf::new();
                for c in full.components() {
                    push(&mut out, c);
                }
                return Ok(out);
            }
        }
    }
}

fn push(out: &mut PathBuf, c: Component) {
    match c {
        Component::CurDir => {}
        Component::ParentDir => {
            out.pop();
        }
        other => out.push(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out<'a>(flag: &'static str, path: &'a Path, kind: Kind) -> Output<'a> {
        Output { flag, path, kind }
    }

    #[test]
    fn refuses_overlap_existing_and_kind() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("graph");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("labels.npy"), b"x").unwrap();
        let inputs = [("--data", data.as_path())];
        // Inside the input, the input itself, and the input's parent: refused even with --force.
        for p in [
            data.join("labels.npy"),
            data.clone(),
            d.path().to_path_buf(),
            data.join("sub/../labels.npy"),
            data.join("new/x.npy"),
        ] {
            let e = check(&[out("--out", &p, Kind::File)], true, &inputs)
                .unwrap_err()
                .to_string();
            assert!(e.contains("the input --data"), "{p:?}: {e}");
        }
        // A symlink to the input is the input.
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        assert!(check(
            &[out("--out", &link.join("p.npy"), Kind::File)],
            true,
            &inputs
        )
        .is_err());
        // Elsewhere: fine when new, refused when it exists without --force, fine with it.
        let p = d.path().join("preds.npy");
        check(&[out("--out", &p, Kind::File)], false, &inputs).unwrap();
        std::fs::write(&p, b"x").unwrap();
        assert!(check(&[out("--out", &p, Kind::File)], false, &inputs)
            .unwrap_err()
            .to_string()
            .contains("--force"));
        check(&[out("--out", &p, Kind::File)], true, &inputs).unwrap();
        // A directory where a file is wanted, and two outputs on one path.
        assert!(check(&[out("--report", &data, Kind::File)], true, &[])
            .unwrap_err()
            .to_string()
            .contains("is a directory"));
        assert!(check(
            &[
                out("--out", &p, Kind::File),
                out("--embeddings", &p, Kind::File)
            ],
            true,
            &[]
        )
        .unwrap_err()
        .to_string()
        .contains("overlap"));
        // A directory a run adds to may exist.
        check(&[out("--checkpoint", &data, Kind::AddTo)], false, &[]).unwrap();
    }

    #[test]
    fn refuses_a_hard_link_to_an_input_and_an_unwritable_location() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("graph");
        std::fs::create_dir_all(data.join("nodes/paper")).unwrap();
        let labels = data.join("nodes/paper/labels.npy");
        std::fs::write(&labels, b"x").unwrap();
        let linked = d.path().join("out.npy");
        std::fs::hard_link(&labels, &linked).unwrap();
        let inputs = [("--data", data.as_path())];
        let e = check(&[out("--out", &linked, Kind::File)], true, &inputs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hard link") && e.contains("labels.npy"), "{e}");
        // A file where a directory should be on the way to the output.
        let e = check(
            &[out("--report", &labels.join("r.json"), Kind::File)],
            true,
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("is not a directory"), "{e}");
        // Missing parents are fine (they are created), under a writable ancestor.
        check(
            &[out("--report", &d.path().join("a/b/r.json"), Kind::File)],
            false,
            &inputs,
        )
        .unwrap();
        // A read-only file system (bind-mounted read-only needs privileges; a
        // file system that refuses writes is emulated by /proc, which takes none).
        let e = check(
            &[out("--report", Path::new("/proc/r.json"), Kind::File)],
            true,
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cannot write in /proc"), "{e}");
    }
}

/// Outputs of one command that land together or not at all: each is
/// written whole to a hidden staging name beside its destination
/// ([`Staged::path`]), and [`Staged::commit`] renames them all into place
/// once every one is written; dropped uncommitted, it removes what it staged.
pub struct Staged {
    /// (staging path, destination).
    files: Vec<(PathBuf, PathBuf)>,
    committed: bool,
}

impl Staged {
    /// Nothing staged yet.
    pub fn new() -> Staged {
        Staged {
            files: Vec::new(),
            committed: false,
        }
    }

    /// Where to write the output `dest` (same directory and extension, so
    /// that writers inferring a format from it still do).
    pub fn path(&mut self, dest: &Path) -> PathBuf {
        let name = dest
            .file_name()
            .map_or_else(|| std::ffi::OsString::from("output"), |n| n.to_os_string());
        let mut staged = std::ffi::OsString::from(".");
        staged.push(&name);
        staged.push(format!(".staged-{}", std::process::id()));
        if let Some(ext) = dest.extension() {
            staged.push(".");
            staged.push(ext);
        }
        let path = dest.with_file_name(staged);
        self.files.push((path.clone(), dest.to_path_buf()));
        path
    }

    /// Renames every staged output into place.
    pub fn commit(mut self) -> anyhow::Result<()> {
        for (staged, dest) in &self.files {
            std::fs::rename(staged, dest)
                .with_context(|| format!("moving {} into place", dest.display()))?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            for (staged, _) in &self.files {
                let _ = std::fs::remove_file(staged);
            }
        }
    }
}

#[cfg(test)]
mod staged_tests {
    use super::Staged;

    #[test]
    fn staged_outputs_land_together_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.npy"), dir.path().join("b.csv"));
        std::fs::write(&a, "old").unwrap();
        // The second output fails: the first keeps its old content, nothing is left over.
        {
            let mut s = Staged::new();
            let pa = s.path(&a);
            assert_eq!(pa.extension().unwrap(), "npy");
            std::fs::write(&pa, "new").unwrap();
            let _pb = s.path(&b);
        }
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // Both written: both land.
        let mut s = Staged::new();
        std::fs::write(s.path(&a), "new").unwrap();
        std::fs::write(s.path(&b), "x,y").unwrap();
        s.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "new");
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "x,y");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
