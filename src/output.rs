//! Every command's outputs are checked before any work starts: an existing
//! output is replaced only with `--force`, a file output must not name a
//! directory, and no output may be, hold or sit inside an input of the same
//! command (`--force` or not), so that no command can overwrite what it reads.

use std::path::{Component, Path, PathBuf};

use anyhow::bail;

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
        if let Ok(meta) = std::fs::metadata(o.path) {
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
}
