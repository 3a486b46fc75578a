//! Keeps the house tidy: no source file over [`FILE_LINES_MAX`] lines and no
//! function over [`FN_LINES_MAX`] lines, but for the exemptions listed here,
//! each with its reason (the reasons live here, not in comments beside the
//! code that nothing checks). An exemption that is no longer needed (the file or
//! function got short, or is gone) fails the test too, so the list cannot
//! rot. A remark beside a function that it is long (the words of
//! [`LONG_REMARK`]) is held to the same: the function under it must be over
//! the limit and exempted. Tests (`#[cfg(test)]` modules and `tests/`) are
//! not held to it, nor is the test cluster they share with the perf harness
//! (`cluster/`, the `eventd-cluster` crate, formerly `tests/common/`).
//!
//! The scan reads rustfmt's layout: a function starts at a line whose first
//! word (after `pub`, `const`, `async`, `unsafe`, `extern "C"`) is `fn`, and
//! ends at the first line after it that is its indentation and `}`. A file
//! named `tests.rs` is a test module and is not held to the limits either.
#![cfg(not(loom))]

use std::path::{Path, PathBuf};

/// Lines a source file may have.
const FILE_LINES_MAX: usize = 700;
/// Lines a function may have, its signature and closing brace included.
const FN_LINES_MAX: usize = 70;

/// Files allowed over [`FILE_LINES_MAX`]: (path from the workspace root,
/// why).
const LONG_FILES: &[(&str, &str)] = &[];

/// Functions allowed over [`FN_LINES_MAX`]: (file, function name, why).
/// Each is one list or one algorithm a reader follows best whole; the perf
/// harness's are to go with its rewrite into one runner.
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[
    ("perf/src/ceiling.rs", "run_with", PERF),
    ("perf/src/clients/mod.rs", "run", PERF),
    ("perf/src/load.rs", "produce", PERF),
    ("perf/src/pipeline.rs", "run_indexed", PERF),
    ("perf/src/scale.rs", "point", PERF),
    ("perf/src/system.rs", "start", PERF),
    (
        "src/config/live.rs",
        "restart_only_changes",
        "one comparison per restart-only key",
    ),
    (
        "src/config/mod.rs",
        "resolve",
        "one field per configuration key",
    ),
    (
        "src/config/export.rs",
        "export_settings",
        "one field per export key",
    ),
    (
        "src/daemon/metrics.rs",
        "export",
        "one metric family per export counter",
    ),
    (
        "src/daemon/metrics.rs",
        "rings",
        "one metric family per ring counter",
    ),
    (
        "src/daemon/metrics.rs",
        "shards",
        "one metric family per shard counter",
    ),
    (
        "src/daemon/metrics.rs",
        "syslog",
        "one metric family per syslog counter",
    ),
    (
        "src/daemon/mod.rs",
        "assemble",
        "start-up's steps in order, one line each",
    ),
    (
        "src/drain/health.rs",
        "replace_ring",
        "retire, replace, count and record: one sequence",
    ),
    (
        "src/export/worker/protocol.rs",
        "step",
        "one batch's intent, send and advance, in the protocol's order",
    ),
    (
        "src/query/fanout/plan.rs",
        "open_pooled",
        "each file's plan (opened now, later or never) in one pass",
    ),
    (
        "producer/src/rings/reader/dead.rs",
        "find_following_record",
        "one search whose bounds read best together",
    ),
    (
        "producer/src/rings/reader/mod.rs",
        "step",
        "every check a page's words get, in the order they are made",
    ),
    (
        "src/store/recovery.rs",
        "plan_rings",
        "each ring's plan, its predecessor and the log line",
    ),
    (
        "src/store/writer/commit.rs",
        "insert_items",
        "one arm per item kind",
    ),
    (
        "src/store/writer/mod.rs",
        "run",
        "the writer's loop: gather, linger, commit, serve retention",
    ),
    (
        "src/syslog/record.rs",
        "build",
        "the fields object built step by step",
    ),
    (
        "src/syslog/recvmmsg.rs",
        "run",
        "the receive loop with its stop and its error handling",
    ),
    (
        "storh/src/cli.rs",
        "execute",
        "one arm per storh subcommand",
    ),
];

const PERF: &str = "the perf harness: to go with its rewrite into one runner (issue 35)";

/// The directories whose Rust sources are held to the limits.
const ROOTS: &[&str] = &[
    "src",
    "producer/src",
    "storh/src",
    "clients/c/src",
    "clients/tracing/src",
    "clients/python/src",
    "perf/src",
    "packaging/gen/src",
];

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|x| x == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            found.push(path);
        }
    }
}

/// Every source file held to the limits, as (path from the workspace
/// root, its lines up to its `#[cfg(test)]` module).
fn sources() -> Vec<(String, Vec<String>)> {
    let root = workspace();
    let mut files = Vec::new();
    for dir in ROOTS {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<String> = text.lines().map(String::from).collect();
            let end = lines
                .windows(2)
                .position(|w| {
                    w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod ")
                })
                .unwrap_or(lines.len());
            let name = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (name, lines[..end].to_vec())
        })
        .collect()
}

/// The name of the function a line starts, if it starts one.
fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    loop {
        let next = [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
            "extern \"C\" ",
        ]
        .iter()
        .find_map(|p| rest.strip_prefix(p));
        match next {
            Some(r) => rest = r,
            None => break,
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// Every function of `lines` with a body: (name, first line number from 1,
/// length in lines).
fn functions(lines: &[String]) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let indent = &line[..line.len() - line.trim_start().len()];
        let closing = format!("{indent}}}");
        // A declaration without a body (a trait's) ends in `;` before any
        // `{`.
        let mut has_body = false;
        for l in &lines[i..] {
            if l.contains('{') {
                has_body = true;
                break;
            }
            if l.trim_end().ends_with(';') {
                break;
            }
        }
        if !has_body {
            continue;
        }
        if line.trim_end().ends_with('}') {
            continue; // a one-line body
        }
        if let Some(end) = lines[i + 1..].iter().position(|l| l.trim_end() == closing) {
            found.push((name.to_string(), i + 1, end + 2));
        }
    }
    found
}

#[test]
fn no_file_is_longer_than_the_limit_unless_exempted() {
    let sources = sources();
    let mut failures = Vec::new();
    for (path, lines) in &sources {
        let exempt = LONG_FILES.iter().any(|(p, _)| p == path);
        if lines.len() > FILE_LINES_MAX && !exempt {
            failures.push(format!(
                "{path}: {} lines (at most {FILE_LINES_MAX}): split it by concept, or exempt it \
                 in tests/tidy.rs with a reason",
                lines.len()
            ));
        }
    }
    for (path, _) in LONG_FILES {
        match sources.iter().find(|(p, _)| p == path) {
            None => failures.push(format!("{path}: exempted but gone: take it off LONG_FILES")),
            Some((_, lines)) if lines.len() <= FILE_LINES_MAX => failures.push(format!(
                "{path}: exempted but only {} lines now: take it off LONG_FILES",
                lines.len()
            )),
            Some(_) => {}
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn no_function_is_longer_than_the_limit_unless_exempted() {
    let sources = sources();
    let mut failures = Vec::new();
    let mut longest = (0, String::new());
    for (path, lines) in &sources {
        for (name, at, len) in functions(lines) {
            if len > longest.0
                && !LONG_FUNCTIONS
                    .iter()
                    .any(|(p, n, _)| *p == path && *n == name)
            {
                longest = (len, format!("{path}:{at} {name}"));
            }
            let exempt = LONG_FUNCTIONS
                .iter()
                .any(|(p, n, _)| p == path && *n == name);
            if len > FN_LINES_MAX && !exempt {
                failures.push(format!(
                    "{path}:{at}: fn {name} is {len} lines (at most {FN_LINES_MAX}): split it, \
                     or exempt it in tests/tidy.rs with a reason"
                ));
            }
        }
    }
    for (path, name, _) in LONG_FUNCTIONS {
        let long = sources
            .iter()
            .filter(|(p, _)| p == path)
            .flat_map(|(_, lines)| functions(lines))
            .any(|(n, _, len)| n == *name && len > FN_LINES_MAX);
        if !long {
            failures.push(format!(
                "{path}: fn {name} exempted but no longer over {FN_LINES_MAX} lines (or gone): \
                 take it off LONG_FUNCTIONS"
            ));
        }
    }
    eprintln!(
        "longest function held to the limit: {} lines, {}",
        longest.0, longest.1
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// What a comment beside a long function says to own it (the reason itself
/// is in [`LONG_FUNCTIONS`]).
const LONG_REMARK: &str = "longer than the ~70 lines a function should be";

#[test]
fn every_remark_on_a_long_function_sits_on_an_exempted_long_function() {
    // A remark beside the code is checked like an exemption: the function
    // under it must be over the limit and listed, or the remark is stale.
    let mut failures = Vec::new();
    let mut remarks = 0;
    for (path, lines) in &sources() {
        let found = functions(lines);
        for (i, line) in lines.iter().enumerate() {
            let text = line.trim_start();
            if !(text.starts_with("//") && text.to_lowercase().contains(LONG_REMARK)) {
                continue;
            }
            remarks += 1;
            // The function the remark is about: the first line after the
            // comment and attributes above it.
            let under = lines[i + 1..].iter().enumerate().find(|(_, l)| {
                let t = l.trim_start();
                !(t.starts_with("//") || t.starts_with("#["))
            });
            let named = under.and_then(|(k, l)| Some((i + 2 + k, fn_name(l)?)));
            let Some((at, name)) = named else {
                failures.push(format!(
                    "{path}:{}: a remark that a function is long, above no function",
                    i + 1
                ));
                continue;
            };
            let long = found
                .iter()
                .any(|(n, a, len)| n == name && *a == at && *len > FN_LINES_MAX);
            let exempt = LONG_FUNCTIONS
                .iter()
                .any(|(p, n, _)| p == path && *n == name);
            if !long || !exempt {
                failures.push(format!(
                    "{path}:{at}: fn {name} is remarked to be long but is not both over \
                     {FN_LINES_MAX} lines and on LONG_FUNCTIONS: drop the remark or list it"
                ));
            }
        }
    }
    assert!(remarks > 0, "no remark found: has the wording changed?");
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_scan_finds_functions_as_rustfmt_lays_them_out() {
    let text = "\
pub fn short() {
    1;
}
    pub(crate) unsafe fn indented(
        a: u8,
    ) -> u8 {
        a
    }
fn decl(x: u8);
fn one_line() { }
";
    let lines: Vec<String> = text.lines().map(String::from).collect();
    let found = functions(&lines);
    assert_eq!(
        found,
        vec![("short".to_string(), 1, 3), ("indented".to_string(), 4, 5)]
    );
}
