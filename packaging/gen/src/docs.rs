//! The docs the eventd package installs under `/usr/share/doc/eventd`:
//! `README.md` and the whole `docs/` tree, laid out as in the repository
//! so that every link between pages still leads to its page. A link to a
//! file the package does not ship (a source file, a script, a perf run) is
//! turned into plain text naming the path in eventd's source tree, so no
//! installed page links to something that is not there.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The pages shipped, relative to the repository: README.md and every
/// Markdown file under docs/.
pub fn shipped(repo: &Path) -> std::io::Result<BTreeSet<PathBuf>> {
    let mut pages = BTreeSet::from([PathBuf::from("README.md")]);
    let mut dirs = vec![PathBuf::from("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(repo.join(&dir))? {
            let entry = entry?;
            let rel = dir.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                dirs.push(rel);
            } else if rel.extension().is_some_and(|e| e == "md") {
                pages.insert(rel);
            }
        }
    }
    Ok(pages)
}

/// Writes the shipped pages of `repo` under `out` (`out/README.md`,
/// `out/docs/...`), their links to unshipped files made plain text.
pub fn stage(repo: &Path, out: &Path) -> std::io::Result<()> {
    let pages = shipped(repo)?;
    for page in &pages {
        let text = std::fs::read_to_string(repo.join(page))?;
        let target = out.join(page);
        if let Some(dir) = target.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(target, unlink(page, &text, &pages))?;
    }
    Ok(())
}

/// `text` (the page at `page`) with every relative link whose file is not
/// among `pages` replaced by its words and the path it pointed to.
pub fn unlink(page: &Path, text: &str, pages: &BTreeSet<PathBuf>) -> String {
    let dir = page.parent().unwrap_or(Path::new(""));
    let mut out = String::with_capacity(text.len());
    let mut fenced = false;
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || line.trim_start().starts_with("```") {
            out.push_str(line);
            continue;
        }
        out.push_str(&unlink_line(line, dir, pages));
    }
    out
}

/// One line of prose: each `[words](target)` whose target is a local
/// file outside `pages` becomes `words (path)`, or just `words` when the
/// words already name the path.
fn unlink_line(line: &str, dir: &Path, pages: &BTreeSet<PathBuf>) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(mid) = rest.find("](") {
        let Some(open) = rest[..mid].rfind('[') else {
            out.push_str(&rest[..mid + 2]);
            rest = &rest[mid + 2..];
            continue;
        };
        let Some(close) = rest[mid + 2..].find(')') else {
            break;
        };
        let words = &rest[open + 1..mid];
        let target = &rest[mid + 2..mid + 2 + close];
        let end = mid + 2 + close + 1;
        match unshipped(target, dir, pages) {
            Some(path) => {
                out.push_str(&rest[..open]);
                out.push_str(words);
                let shown = path.to_string_lossy();
                if !words.contains(shown.as_ref()) {
                    out.push_str(&format!(" (`{shown}` in eventd's source)"));
                }
            }
            None => out.push_str(&rest[..end]),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The repository path `target` (a link on a page in `dir`) leads to, if
/// it is a local file the package does not ship.
fn unshipped(target: &str, dir: &Path, pages: &BTreeSet<PathBuf>) -> Option<PathBuf> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let file = target.split('#').next().unwrap_or("");
    if file.is_empty() {
        return None;
    }
    let mut path = PathBuf::new();
    for part in dir.join(file).components() {
        match part {
            Component::ParentDir => {
                path.pop();
            }
            Component::Normal(p) => path.push(p),
            _ => {}
        }
    }
    (!pages.contains(&path)).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages() -> BTreeSet<PathBuf> {
        ["README.md", "docs/guide/install.md", "docs/design/rings.md"]
            .iter()
            .map(PathBuf::from)
            .collect()
    }

    #[test]
    fn links_to_shipped_pages_stay_and_the_rest_become_text() {
        let page = Path::new("docs/guide/install.md");
        let text = "See [rings](../design/rings.md#format), [the drain](../../src/drain/mod.rs), \
                    [`scripts/package`](../../scripts/package) and [web](https://x.org/a.md).\n\
                    ```\n[kept](../../src/x.rs)\n```\n[top](#top) and [readme](../../README.md)\n";
        let got = unlink(page, text, &pages());
        assert_eq!(
            got,
            "See [rings](../design/rings.md#format), the drain (`src/drain/mod.rs` in eventd's \
             source), `scripts/package` and [web](https://x.org/a.md).\n\
             ```\n[kept](../../src/x.rs)\n```\n[top](#top) and [readme](../../README.md)\n"
        );
    }

    #[test]
    fn the_repositorys_docs_stage_with_every_link_leading_somewhere() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = std::env::temp_dir().join(format!("eventd-gen-docs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        stage(&repo, &out).unwrap();
        let pages = shipped(&repo).unwrap();
        assert!(pages.len() > 20, "{pages:?}");
        let mut broken = Vec::new();
        for page in &pages {
            let text = std::fs::read_to_string(out.join(page)).unwrap();
            let dir = page.parent().unwrap_or(Path::new(""));
            // Staging again changes nothing: no link outside the tree is left.
            assert_eq!(unlink(page, &text, &pages), text, "{}", page.display());
            let prose: String = text
                .lines()
                .scan(false, |fenced, l| {
                    if l.trim_start().starts_with("```") {
                        *fenced = !*fenced;
                        return Some("");
                    }
                    Some(if *fenced { "" } else { l })
                })
                .collect::<Vec<_>>()
                .join("\n");
            for target in prose
                .split("](")
                .skip(1)
                .filter_map(|p| p.split(')').next())
            {
                if let Some(path) = unshipped(target, dir, &pages) {
                    broken.push(format!("{}: {}", page.display(), path.display()));
                }
            }
        }
        std::fs::remove_dir_all(&out).unwrap();
        assert!(broken.is_empty(), "{broken:#?}");
    }
}
