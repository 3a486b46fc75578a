//! libeventd as a C programmer meets it: an installed-style layout
//! (`include/eventd.h`, `lib/libeventd.so`) and nothing else of this
//! checkout. Every C snippet in docs/guide/emitting.md is compiled there with
//! `-leventd` alone and run against a real eventd, and its events are
//! checked in the stored rows; a program asks the library its version.

mod common;

use common::{eventctl_text, provider_rows, wait_for_events, Eventd};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// libeventd built as this test's profile builds it, copied into
/// `root/include` and `root/lib` the way libeventd-dev installs it.
fn installed(root: &Path) -> PathBuf {
    // target/debug/deps/c_library-… → target/debug
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "-p", "libeventd"]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    assert!(
        build.status().unwrap().success(),
        "cargo build -p libeventd"
    );
    std::fs::create_dir_all(root.join("include")).unwrap();
    std::fs::create_dir_all(root.join("lib")).unwrap();
    std::fs::copy(
        repo().join("clients/c/include/eventd.h"),
        root.join("include/eventd.h"),
    )
    .unwrap();
    std::fs::copy(
        profile_dir.join("libeventd.so"),
        root.join("lib/libeventd.so.0"),
    )
    .unwrap();
    std::os::unix::fs::symlink("libeventd.so.0", root.join("lib/libeventd.so")).unwrap();
    std::fs::copy(
        profile_dir.join("libeventd.a"),
        root.join("lib/libeventd.a"),
    )
    .unwrap();
    root.to_path_buf()
}

/// `source` compiled against the layout at `root` with `-leventd` only.
fn build(root: &Path, name: &str, source: &str) -> PathBuf {
    let src = root.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = root.join(name);
    let lib = root.join("lib");
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(&src)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-leventd", "-o"])
        .arg(&exe)
        .output()
        .expect("cc (apt-get install -y gcc)");
    assert!(
        out.status.success(),
        "cc {name}.c:\n{source}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The ```c blocks of a Markdown page.
fn c_snippets(page: &str) -> Vec<String> {
    let mut snippets = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```c") => current = Some(String::new()),
            (Some(_), "```") => snippets.extend(current.take()),
            (Some(text), _) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, _) => {}
        }
    }
    snippets
}

/// Runs `exe` (a program emitting as provider "backup", `what` in a
/// failure's message) against a fresh eventd under `dir`, without a word on
/// stderr; returns that eventd and, once `events` are stored, its
/// "backup" rows, exactly `events` of them.
fn run_backup(dir: &Path, exe: &Path, what: &str, events: u64) -> (Eventd, Vec<serde_json::Value>) {
    let data = dir.join("data");
    let eventd = Eventd::start(&data, None);
    let out = Command::new(exe)
        .env("EVENTD_KMES_DIR", data.join("kmes"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{what}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for_events(&data, events);
    let rows = provider_rows(&data, "backup");
    assert_eq!(rows.len() as u64, events, "{rows:?}");
    (eventd, rows)
}

#[test]
fn docs_c_snippets_build_with_only_the_header_and_run() {
    let page = std::fs::read_to_string(repo().join("docs/guide/emitting.md")).unwrap();
    let snippets = c_snippets(&page);
    assert!(
        !snippets.is_empty(),
        "docs/guide/emitting.md has no C snippet"
    );
    for (i, snippet) in snippets.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let root = installed(&dir.path().join("usr"));
        let exe = build(&root, &format!("snippet{i}"), snippet);
        let (eventd, rows) = run_backup(dir.path(), &exe, &format!("snippet {i}"), 3);
        let nightly = rows.iter().find(|r| r["name"] == "nightly").unwrap();
        assert_eq!(nightly["fields"]["tries"], serde_json::json!(3));
        assert_eq!(nightly["fields"]["target"], "s3");
        let disk = rows.iter().find(|r| r["name"] == "disk").unwrap();
        assert_eq!(disk["fields"]["host"], "db1");
        let order = rows.iter().find(|r| r["name"] == "order").unwrap();
        assert_eq!(
            order["fields"],
            serde_json::json!({"id": 42, "amount": 9.5, "paid": true, "by": "ann"})
        );
        eventd.stop();
    }
}

/// The static archive holds the producer and nothing of the daemon: a
/// hello linked with it (unused sections dropped, as docs/guide/emitting.md
/// says) and stripped is under 1 MB, and its event is stored.
#[test]
fn static_hello_is_small_and_emits() {
    let dir = tempfile::tempdir().unwrap();
    let root = installed(&dir.path().join("usr"));
    let src = root.join("hello.c");
    std::fs::write(
        &src,
        "#include <eventd.h>\n\
         int main(void) { eventd_t *ev; eventd_open(NULL, \"hello\", &ev);\n\
         int rc = eventd_emit(ev, EVENTD_INFO, \"greeting\", \"hello\", NULL);\n\
         eventd_close(ev); return rc; }\n",
    )
    .unwrap();
    let exe = root.join("hello");
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(&src)
        .arg(root.join("lib/libeventd.a"))
        .args(["-lpthread", "-ldl", "-lm", "-Wl,--gc-sections", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(Command::new("strip").arg(&exe).status().unwrap().success());
    let size = std::fs::metadata(&exe).unwrap().len();
    assert!(size < 1 << 20, "stripped static hello is {size} bytes");
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let run = Command::new(&exe)
        .env("EVENTD_KMES_DIR", data.join("kmes"))
        .status()
        .unwrap();
    assert!(run.success(), "hello: {run:?}");
    wait_for_events(&data, 1);
    let rows = eventctl_text(&data, &["query", "--provider", "hello"]);
    assert!(rows.contains("hello"), "{rows}");
    eventd.stop();
}

#[test]
fn version_from_the_installed_library() {
    let dir = tempfile::tempdir().unwrap();
    let root = installed(dir.path());
    let exe = build(
        &root,
        "version",
        "#include <eventd.h>\n#include <stdio.h>\n\
         int main(void) { printf(\"%s\\n\", eventd_version()); return 0; }\n",
    );
    let out = Command::new(exe).output().unwrap();
    assert!(out.status.success());
    let manifest = std::fs::read_to_string(repo().join("clients/c/Cargo.toml")).unwrap();
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .unwrap()
        .trim_matches('"');
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), version);
}

/// The example at the top of eventd.h, as a program's body, built against
/// the installed header and library and run: both of its events stored,
/// the JSON one and the typed one, with the same fields.
#[test]
fn the_headers_example_builds_and_runs() {
    let header = std::fs::read_to_string(repo().join("clients/c/include/eventd.h")).unwrap();
    let body: Vec<&str> = header
        .lines()
        .skip_while(|l| !l.starts_with(" *   "))
        .take_while(|l| l.starts_with(" *   "))
        .map(|l| &l[5..])
        .collect();
    assert!(
        body.iter().any(|l| l.contains("eventd_open")),
        "eventd.h's example: {body:?}"
    );
    let source = format!(
        "#include <eventd.h>\nint main(void) {{\n{}\n    return 0;\n}}\n",
        body.join("\n")
    );
    let dir = tempfile::tempdir().unwrap();
    let root = installed(&dir.path().join("usr"));
    let exe = build(&root, "header-example", &source);
    let (eventd, rows) = run_backup(dir.path(), &exe, &source, 2);
    for row in &rows {
        assert_eq!(row["name"], "nightly");
        assert_eq!(row["level"], 3);
        assert_eq!(row["fields"], serde_json::json!({"tries": 3}));
    }
    eventd.stop();
}
