//! Every statement eventd sends to ClickHouse (`eventctl export sql`: the
//! schemas of both layouts, the inserts with bodies encoded as batches
//! are, the settle, reconcile and running-insert checks, the layout
//! discovery and the fleet queries) runs on:
//!
//! - a current ClickHouse engine, in-process through chdb (PyPI), by
//!   `tests/export_sql.py`, which says what it swaps for the cluster
//!   layout (no cluster or ZooKeeper there);
//! - Debian's clickhouse-server 18.16, a single server, through its HTTP
//!   interface, with only the settings that server knows, as eventd sends
//!   them there (the cluster layout's statements run on 18.16 in
//!   tests/export.rs).
//!
//! chdb's Python comes from `EVENTD_CHDB_PYTHON`, else
//! `target/chdb-venv/bin/python` (scripts/test-all makes it); without it the
//! chdb half is skipped with the reason, unless `EVENTD_REQUIRE_CHDB=1`.

use eventd_cluster as cluster;
mod common;

use cluster::{Cluster, Options};
use common::EVENTCTL;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn catalogue(database: &str) -> Vec<serde_json::Value> {
    let out = Command::new(EVENTCTL)
        .args(["export", "sql", "--database", database])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A Python that imports chdb, or why there is none.
fn chdb_python() -> Result<PathBuf, String> {
    let python = std::env::var_os("EVENTD_CHDB_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/chdb-venv/bin/python")
        });
    let probe = Command::new(&python)
        .args(["-c", "import chdb"])
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !probe.status.success() {
        return Err(format!(
            "{} cannot import chdb: {}",
            python.display(),
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
    }
    Ok(python)
}

#[test]
fn every_statement_runs_on_a_current_clickhouse_through_chdb() {
    let python = match chdb_python() {
        Ok(p) => p,
        Err(why) if std::env::var("EVENTD_REQUIRE_CHDB").is_ok_and(|v| v == "1") => {
            panic!("EVENTD_REQUIRE_CHDB=1 but {why}")
        }
        Err(why) => {
            eprintln!(
                "skipped: {why} (python3 -m venv target/chdb-venv && \
                 target/chdb-venv/bin/pip install chdb)"
            );
            return;
        }
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/export_sql.py");
    for layout in ["single", "cluster"] {
        let dir = tempfile::tempdir().unwrap();
        let database = format!("sql_{layout}");
        let statements = catalogue(&database);
        let wanted = statements
            .iter()
            .filter(|s| s["layout"] == "any" || s["layout"] == layout)
            .count();
        let mut child = Command::new(&python)
            .arg(&script)
            .args(["--layout", layout])
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for s in &statements {
            writeln!(stdin, "{s}").unwrap();
        }
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        eprintln!("{layout}:\n{said}{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{layout}: {said}");
        // Each statement, and the check after the inserts.
        let last = said.lines().last().unwrap_or("");
        assert_eq!(last, format!("{} passed, 0 failed", wanted + 1), "{layout}");
    }
}

#[test]
fn every_single_server_statement_runs_on_18_16() {
    if let Err(why) = Cluster::available() {
        if std::env::var("EVENTD_REQUIRE_CLICKHOUSE").is_ok_and(|v| v == "1") {
            panic!("EVENTD_REQUIRE_CLICKHOUSE=1 but {why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    let c = Cluster::start_single(Options::default());
    let url = c.url(1, 1);
    let version = c.query(&url, "SELECT version()");
    let known = c.query(&url, "SELECT name FROM system.settings");
    let known: Vec<&str> = known.lines().collect();
    // `export init` gives a single server's tables the deduplication
    // window only where MergeTree has it (not 18.16).
    let window = c.count(
        &url,
        "SELECT count() FROM system.merge_tree_settings \
         WHERE name = 'non_replicated_deduplication_window'",
    ) > 0;
    let mut ran = 0;
    for s in catalogue("sql_old") {
        let dedup_schema = s["what"] == "init: single schema, dedup window";
        if s["layout"] == "cluster" || (dedup_schema && !window) {
            continue;
        }
        let sql = s["sql"].as_str().unwrap();
        // What eventd sends this server: the settings it knows (the token
        // is only sent where the server has it), and the HTTP parameters.
        let settings: Vec<(&str, &str)> = s["settings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_str().unwrap(), p[1].as_str().unwrap()))
            .filter(|(k, _)| known.contains(k) || ["query_id", "wait_end_of_query"].contains(k))
            .collect();
        let body = s.get("body").and_then(|b| b.as_str()).map(|hex| {
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect::<Vec<u8>>()
        });
        let answer = c.request(
            &url,
            sql,
            &settings,
            body.as_deref(),
            c.options().http_timeout,
        );
        assert!(
            answer.is_ok(),
            "ClickHouse {}: {} {sql}\n=> {:?}",
            version.trim(),
            s["what"],
            answer.err()
        );
        ran += 1;
    }
    eprintln!("{ran} statements ran on ClickHouse {}", version.trim());
    assert!(ran > 20, "{ran}");
    // The inserts landed where the lookups look.
    let ids = c.query(
        &url,
        "SELECT DISTINCT source_id FROM sql_old.events ORDER BY source_id FORMAT TSV",
    );
    assert_eq!(ids.split_whitespace().collect::<Vec<_>>(), ["100", "101"]);
}
