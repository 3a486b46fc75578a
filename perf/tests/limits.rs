//! Runs the harness's `limits` scenario with small sizes against the eventd
//! binary and checks its accounting (never its timings): without a flood
//! the default limits suppress nothing and every event is stored; under a
//! flood the quiet provider keeps every event with the defaults, the
//! flood's refusals at the source are all reported, and every CPU ring's
//! sequence numbers are accounted for.

use std::path::PathBuf;
use std::process::Command;

/// The eventd binary of this build (built here: this package's tests do
/// not build another package's binaries).
fn eventd_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = Command::new(cargo)
        .args(["build", "-p", "eventd", "--bin", "eventd"])
        .status()
        .unwrap();
    assert!(status.success(), "building eventd");
    PathBuf::from(env!("CARGO_BIN_EXE_eventd-perf")).with_file_name("eventd")
}

#[test]
fn limits_scenario_suppresses_nothing_without_a_flood_and_keeps_the_quiet_provider_whole() {
    let eventd = eventd_binary();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_eventd-perf"))
        .args([
            "limits",
            "--limits-events",
            "60000",
            "--limits-sources",
            "40",
            "--quiet-events",
            "1000",
            "--quiet-rate",
            "500",
            "--repeat",
            "2",
            "--eventd",
        ])
        .arg(&eventd)
        .arg("--results")
        .arg(dir.path())
        .env_remove("EVENTD_RATE_LIMIT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap();
    assert!(last.starts_with("limits ingest_on_per_s="), "{last}");
    assert!(last.contains(" verified=true "), "{last}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("limits.json")).unwrap()).unwrap();

    let no_flood = &report["no_flood"];
    let runs = no_flood["runs"].as_array().unwrap();
    // Two rounds, each one run with the limits on and one off.
    assert_eq!(runs.len(), 4, "{no_flood}");
    assert_eq!(
        runs.iter()
            .filter(|r| r["limits_on"].as_bool().unwrap())
            .count(),
        2
    );
    for r in runs {
        let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
        assert_eq!(n("events"), 60_000, "{r}");
        // 1,500 events per source, far under the burst: nothing suppressed,
        // no window given up, and every event in the shard files.
        assert_eq!(n("suppressed"), 0, "{r}");
        assert_eq!(n("evictions"), 0, "{r}");
        assert_eq!(n("stored"), 60_000, "{r}");
        assert!(r["events_per_s"].as_f64().unwrap() > 0.0, "{r}");
        let lost: u64 = r["lost_by_reason"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x[1].as_u64().unwrap())
            .sum();
        assert_eq!(lost, 0, "{r}");
    }
    assert_eq!(no_flood["verified"], true);
    assert_eq!(no_flood["round_ratios"].as_array().unwrap().len(), 2);

    let flood = &report["flood"];
    for run in [&flood["on"], &flood["off"]] {
        let n = |k: &str| run[k].as_u64().unwrap_or_else(|| panic!("{k} in {run}"));
        assert_eq!(run["sequences_accounted"], true, "{run}");
        // The quiet provider made every call, each counted once.
        assert_eq!(run["quiet"]["calls"].as_u64(), Some(1000), "{run}");
        assert!(n("quiet_stored") <= run["quiet"]["written"].as_u64().unwrap());
        // What the producer refused is what its reports say and what
        // eventd counted from them.
        let limited = run["flood"]["limited"].as_u64().unwrap();
        assert_eq!(n("refusals_reported"), limited, "{run}");
        assert_eq!(n("refused_at_source"), limited, "{run}");
    }
    let on = &flood["on"];
    let n = |k: &str| on[k].as_u64().unwrap_or_else(|| panic!("{k} in {on}"));
    // With the defaults the flood is refused at its source: the quiet
    // provider keeps all of its events and nothing the flood wrote is lost.
    assert_eq!(n("quiet_stored"), 1000, "{on}");
    assert!(on["flood"]["limited"].as_u64().unwrap() > 0, "{on}");
    assert_eq!(
        n("flood_stored") + n("suppressed"),
        on["flood"]["written"].as_u64().unwrap(),
        "{on}"
    );
    assert_eq!(n("overwritten"), 0, "{on}");
    // With the limits off nothing is refused or suppressed.
    let off = &flood["off"];
    assert_eq!(off["flood"]["limited"].as_u64(), Some(0), "{off}");
    assert_eq!(off["suppressed"].as_u64(), Some(0), "{off}");
}
