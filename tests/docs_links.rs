//! The documentation's links: every relative link in the README, the
//! changelog, the results index and `docs/` points at a file that exists, and
//! the README stays short.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The repository root (the `hetgnn` package's directory).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The markdown files whose links are checked: three named files and every
/// `*.md` under `docs/`.
fn documents() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "bench/results/README.md"]
        .iter()
        .map(|f| root().join(f))
        .collect();
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `line` without its inline code spans (text between backticks), so that
/// code such as `a[i](x)` is not read as a link.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// The lines of `text` outside fenced code blocks, with their numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((n + 1, line));
        }
    }
    lines
}

/// The targets of the markdown links `[text](target)` in `line`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let opened = rest[..at].contains('[');
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        if opened {
            // A title (`[t](path "title")`) follows the target after a space.
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_string());
        }
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchors for the headings of `text`: lower case, punctuation
/// dropped, spaces as dashes, `-1`, `-2`, ... on repeated headings.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut slug = base.clone();
        let mut n = 0;
        while seen.contains(&slug) {
            n += 1;
            slug = format!("{base}-{n}");
        }
        seen.insert(slug);
    }
    seen
}

/// Moving or renaming a page must not leave a link pointing nowhere: the
/// docs link to each other, to result files and to code, and nothing else
/// would notice.
#[test]
fn documentation_links_resolve() {
    let mut broken = Vec::new();
    let docs = documents();
    assert!(docs.len() > 3, "no markdown files found under docs/");
    for doc in &docs {
        let text = fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        let name = doc
            .strip_prefix(root())
            .unwrap_or(doc)
            .display()
            .to_string();
        let own_anchors = anchors(&text);
        for (n, line) in prose_lines(&text) {
            for target in link_targets(line) {
                let external = ["http://", "https://", "mailto:"];
                if target.is_empty() || external.iter().any(|p| target.starts_with(p)) {
                    continue;
                }
                if let Some(anchor) = target.strip_prefix('#') {
                    if !own_anchors.contains(anchor) {
                        broken.push(format!("{name}:{n}: ({target}): no such heading"));
                    }
                    continue;
                }
                let path = target.split('#').next().unwrap_or("");
                let resolved = doc.parent().unwrap().join(path);
                if !resolved.exists() {
                    broken.push(format!("{name}:{n}: ({target}): {path} does not exist"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken documentation links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The README is for users: what hetgnn is, how to install and run it, one
/// benchmark table, links into docs/. Everything longer belongs in docs/.
#[test]
fn readme_stays_short() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines, at most 400: move detail into docs/"
    );
}
