//! Runs the harness's `export` scenario small (2 shards × 1 replica,
//! 30,000 events, one batch size, 2 s phases) and checks its accounting:
//! every row each run sent is in ClickHouse, and its outputs are there;
//! on two CPUs or more with the cluster on the first and the rest apart.
//! Skipped (with the `apt-get install` line) where ClickHouse or ZooKeeper
//! is missing, unless `EVENTD_REQUIRE_CLICKHOUSE=1` (scripts/test-all sets
//! it).

use eventd_cluster as cluster;

use std::process::Command;

#[test]
fn export_scenario_lands_every_row() {
    if let Err(why) = cluster::Cluster::available() {
        if std::env::var("EVENTD_REQUIRE_CLICKHOUSE").is_ok_and(|v| v == "1") {
            panic!("EVENTD_REQUIRE_CLICKHOUSE=1 but {why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // With two CPUs or more to run on, the cluster gets the first and the
    // rest the others (`--cluster-cpus`), which the harness checks against
    // each process.
    let cpus = allowed_cpus();
    let split = (cpus.len() >= 2).then(|| cpus[0]);
    // The scenario first, then its options (a subcommand's own).
    let out = Command::new(env!("CARGO_BIN_EXE_eventd-perf"))
        .arg("export")
        .args(
            split
                .map(|c| ["--cluster-cpus".to_string(), c.to_string()])
                .into_iter()
                .flatten(),
        )
        .args([
            "--rows",
            "30000",
            "--batch-rows",
            "10000",
            "--duration",
            "2",
            "--lag-secs",
            "2",
            "--replicas",
            "1",
            "--results",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap();
    let fields: Vec<(&str, &str)> = last
        .split(' ')
        .map(|f| f.split_once('=').unwrap_or((f, "")))
        .collect();
    let keys: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "export_rows_per_s",
            "bare_rows_per_s",
            "export_ratio_to_bare",
            "json_to_rowbinary",
            "ingest_on_to_off",
            "ingest_on_to_off_cluster_niced",
            "lag_p99_ms",
            "cpu_ns_per_row",
            "batch_rows_choice",
            "mismatched_rows"
        ],
        "{last}"
    );
    assert_eq!(fields.last(), Some(&("mismatched_rows", "0")), "{last}");

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("export.json")).unwrap()).unwrap();
    if let Some(c) = split {
        assert_eq!(report["cluster_cpus"], serde_json::json!([c]), "{report}");
        let client = report["client_cpus"].as_array().unwrap();
        assert!(
            !client.is_empty() && !client.contains(&serde_json::json!(c)),
            "{report}"
        );
    }
    let pairs = report["pairs"].as_array().unwrap();
    // RowBinary at --batch-rows, JSONEachRow at the default.
    assert_eq!(pairs.len(), 2, "{report}");
    for p in pairs {
        for run in ["export", "bare", "bare_inline"] {
            let r = &p[run];
            assert!(r["rows"].as_u64().unwrap() >= 30_000, "{run}: {r}");
            assert_eq!(r["rows"], r["rows_in_clickhouse"], "{run}: {r}");
            assert!(r["rows_per_s"].as_f64().unwrap() > 0.0, "{run}: {r}");
        }
    }
    let lag = &report["lag"];
    assert_eq!(lag["stored"], lag["rows_in_clickhouse"], "{lag}");
    assert!(lag["samples"].as_u64().unwrap() > 0, "{lag}");
    let ingest = report["ingest"].as_array().unwrap();
    assert_eq!(ingest.len(), 1, "{report}");
    assert!(ingest[0]["off"]["events_per_s"].as_f64().unwrap() > 0.0);
    assert!(ingest[0]["on"]["events_per_s"].as_f64().unwrap() > 0.0);
    assert!(
        ingest[0]["on_cluster_niced"]["events_per_s"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}

/// The CPUs this process may run on, from /proc/self/status (empty if it
/// cannot be read).
fn allowed_cpus() -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|list| eventd::rings::attach::parse_cpu_list(list.trim()))
        .unwrap_or_default()
}
