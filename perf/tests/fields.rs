//! Runs the harness's `fields` scenario at a tiny size (a small store, a
//! short eventd point) and checks that it measured every phase and that
//! the query indexes changed no query's answer.

use std::path::PathBuf;
use std::process::Command;

/// The eventd binary of this build (built here: this package's tests do
/// not build another package's binaries).
fn eventd_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = Command::new(cargo)
        .args(["build", "-p", "eventd", "--bin", "eventd"])
        .status()
        .expect("running cargo build for eventd");
    assert!(status.success(), "building eventd");
    PathBuf::from(env!("CARGO_BIN_EXE_eventd-perf")).with_file_name("eventd")
}

/// The value of `key` in the summary line `key=value key=value ...`.
fn value<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("{key} missing from {line:?}"))
}

#[test]
fn fields_scenario_finds_the_rare_rows_and_indexes_change_no_answer() {
    let eventd = eventd_binary();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = Command::new(env!("CARGO_BIN_EXE_eventd-perf"))
        .args([
            "fields",
            "--day-events",
            "200000",
            "--day-shards",
            "4",
            "--insert-rows",
            "50000",
            "--duration",
            "1",
            "--eventd",
        ])
        .arg(&eventd)
        .arg("--results")
        .arg(dir.path())
        .output()
        .expect("running eventd-perf");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().expect("a summary line");
    assert_eq!(value(last, "mismatched_queries"), "0", "{last}");
    // 200,000 rows hold exactly two of each rare row.
    for key in ["rare_provider", "grep"] {
        let found = value(last, &format!("{key}_found"));
        assert_eq!(found, value(last, &format!("{key}_expected")), "{last}");
        assert!(found.parse::<u64>().expect("a count") > 0, "{last}");
    }
    let n = |key: &str| -> f64 { value(last, key).parse().expect("a number") };
    assert!(n("rare_provider_first_ms") > 0.0, "{last}");
    assert!(n("daemon_ratio_to_ceiling") > 0.0, "{last}");
    assert!(n("insert_ratio_default_to_none") > 0.0, "{last}");

    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("fields.json")).expect("fields.json written"),
    )
    .expect("fields.json is JSON");
    // Every variant: none, five candidates (provider, name, pid, uid,
    // fields.unit), the default set.
    assert_eq!(report["insert_costs"].as_array().map(Vec::len), Some(7));
    assert_eq!(report["index_builds"].as_array().map(Vec::len), Some(5));
    // Two eventd points, each accounting for every event it was given.
    let daemon = report["daemon"].as_array().expect("daemon points");
    assert_eq!(daemon.len(), 2);
    for p in daemon {
        let n = |k: &str| {
            p["outcome"][k]
                .as_u64()
                .unwrap_or_else(|| panic!("{k} in {p}"))
        };
        assert!(n("stored") > 0, "{p}");
        assert_eq!(n("emitted"), n("stored") + n("lost"), "{p}");
        assert!(p["outcome"]["ceiling_per_s"].as_f64() > Some(0.0), "{p}");
    }
    // Six queries × two orders × two configurations, all answered alike.
    let queries = report["queries"].as_array().expect("queries");
    assert_eq!(queries.len(), 24);
    for q in queries {
        assert_eq!(q["identical_across_configs"], true, "{q}");
    }
}
