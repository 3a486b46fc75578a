//! The docs hold together: every page under docs/ is in its index
//! (docs/README.md), every link between pages and every page path
//! citation in the code, tests and packaging points at a file and, with a
//! `#section`, at a heading that exists; and the first-hour guide's shell
//! blocks run, in order, against the binaries built for the tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Files under `dir` (recursively) whose names end with one of `exts`.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | ".git" | "results" | "node_modules"
            ) {
                files(&path, exts, out);
            }
        } else if exts.iter().any(|e| name.ends_with(e)) {
            out.push(path);
        }
    }
}

/// Lines of a Markdown page outside its fenced code blocks.
fn prose(page: &str) -> Vec<&str> {
    let mut fenced = false;
    page.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The anchors GitHub gives a page's headings.
fn anchors(page: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose(page) {
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        let title = title.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// What is wrong with a reference to `path` (and `anchor`), if anything.
fn check(path: &Path, anchor: Option<&str>) -> Option<String> {
    if !path.exists() {
        return Some("no such file".to_string());
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    if path.extension().and_then(|e| e.to_str()) != Some("md") {
        return None;
    }
    let page = std::fs::read_to_string(path).unwrap();
    (!anchors(&page).contains(anchor)).then(|| format!("no section #{anchor}"))
}

/// The Markdown link targets on a page: `](target)`.
fn links(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(page) {
        for part in line.split("](").skip(1) {
            if let Some(end) = part.find(')') {
                out.push(part[..end].to_string());
            }
        }
    }
    out
}

#[test]
fn links_between_pages_lead_somewhere() {
    let root = repo();
    let mut pages = Vec::new();
    files(&root.join("docs"), &[".md"], &mut pages);
    files(&root.join("perf/runs"), &[".md"], &mut pages);
    pages.push(root.join("README.md"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            checked += 1;
            if let Some(why) = check(&path, anchor) {
                broken.push(format!("{}: ({target}): {why}", page.display()));
            }
        }
    }
    assert!(checked > 100, "{checked} links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn citations_of_pages_in_the_code_lead_somewhere() {
    let root = repo();
    let mut sources = Vec::new();
    for dir in [
        "src",
        "producer",
        "clients",
        "perf",
        "tests",
        "benches",
        "packaging",
        "scripts",
        "docs",
        ".cargo",
        "loom-tests",
    ] {
        files(
            &root.join(dir),
            &[
                ".rs", ".md", ".toml", ".sql", ".py", ".c", ".h", ".service", ".socket",
            ],
            &mut sources,
        );
    }
    files(&root.join("packaging/debian"), &[""], &mut sources);
    files(&root.join("scripts"), &[""], &mut sources);
    sources.extend(["Cargo.toml", "README.md"].map(|f| root.join(f)));
    sources.sort();
    sources.dedup();
    let mut broken = Vec::new();
    let mut cited = BTreeSet::new();
    for source in &sources {
        let Ok(text) = std::fs::read_to_string(source) else {
            continue;
        };
        for prefix in ["docs/", "perf/runs/"] {
            for (i, _) in text.match_indices(prefix) {
                // A path from the repository's root, not the tail of a
                // longer one ("../../docs/" in a page is a link, checked
                // above; "foo-docs/" is something else).
                let before = text[..i].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_') {
                    continue;
                }
                let rest = &text[i..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || "/-_.#".contains(c)))
                    .unwrap_or(rest.len());
                let cite = rest[..end].trim_end_matches('.');
                let Some(md) = cite.find(".md") else {
                    continue;
                };
                let (file, anchor) = (&cite[..md + 3], cite[md + 3..].strip_prefix('#'));
                cited.insert(cite.to_string());
                if let Some(why) = check(&root.join(file), anchor) {
                    broken.push(format!("{}: {cite}: {why}", source.display()));
                }
            }
        }
    }
    assert!(cited.len() > 20, "{cited:?}");
    assert!(
        broken.is_empty(),
        "broken citations:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_index_lists_every_page() {
    let docs = repo().join("docs");
    let index = std::fs::read_to_string(docs.join("README.md")).unwrap();
    let listed: BTreeSet<PathBuf> = links(&index)
        .iter()
        .map(|l| docs.join(l.split('#').next().unwrap()))
        .collect();
    let mut pages = Vec::new();
    files(&docs, &[".md"], &mut pages);
    let missing: Vec<_> = pages
        .iter()
        .filter(|p| p.file_name().unwrap() != "README.md" && !listed.contains(*p))
        .collect();
    assert!(pages.len() > 15, "{pages:?}");
    assert!(
        missing.is_empty(),
        "docs/README.md does not list {missing:?}"
    );
}

/// The first-hour guide, as a reader would type it: its shell blocks in
/// order in one shell (the build step aside: the tests' own binaries are
/// first on PATH), in a directory of its own.
#[test]
fn the_first_hour_runs() {
    let page = std::fs::read_to_string(repo().join("docs/guide/first-hour.md")).unwrap();
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in page.lines() {
        match (&mut block, line.trim_end()) {
            (None, "```sh") => block = Some(String::new()),
            (Some(text), "```") => {
                blocks.push(std::mem::take(text));
                block = None;
            }
            (Some(text), l) => {
                text.push_str(l);
                text.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(blocks.len() >= 6, "{blocks:?}");
    assert!(blocks[0].starts_with("cargo build"), "{}", blocks[0]);
    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_eventd")).parent().unwrap();
    let script = format!(
        "set -euo pipefail\n\
         trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n\
         export PATH={}:\"$PATH\"\n{}",
        bin.display(),
        blocks[1..].join("")
    );
    // A bound on a guide that hangs (an `until` whose event never
    // comes), not a measure of anything.
    let out = Command::new("timeout")
        .args(["300", "bash", "-c", &script])
        .current_dir(dir.path())
        .env_remove("EVENTD_DATA_DIR")
        .env_remove("EVENTD_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(dir.path().join("eventd.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{}\neventd.log:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("disk almost full"), "{stdout}");
    assert!(stdout.contains("\"message\""), "{stdout}");
    assert!(stdout.contains("eventd_shard_events_total"), "{stdout}");
}
