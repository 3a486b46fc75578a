//! Runs the harness's `quick` scenario (the real pipeline and the ceiling)
//! and checks its accounting and its outputs.

use std::process::Command;

#[test]
fn quick_scenario_accounts_for_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_eventd-perf"))
        .args(["quick", "--duration", "2", "--results"])
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
    let fields: Vec<&str> = last.split(' ').collect();
    let keys: Vec<&str> = fields
        .iter()
        .map(|f| f.split('=').next().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["ratio_to_ceiling", "events_per_s", "lost", "p99_us"],
        "{last}"
    );

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("quick.json")).unwrap()).unwrap();
    let points = report["points"].as_array().unwrap();
    assert_eq!(points.len(), 1);
    for p in points {
        let n = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} in {p}"));
        assert!(n("emitted") > 0, "{p}");
        // Every sequenced event was stored or counted lost, and the shard
        // files hold exactly the stored ones.
        assert_eq!(n("emitted"), n("stored") + n("lost"), "{p}");
        assert_eq!(n("rows_in_files"), n("stored"), "{p}");
        let by_reason: u64 = p["lost_by_reason"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[1].as_u64().unwrap())
            .sum();
        assert_eq!(by_reason, n("lost"), "{p}");
        assert!(p["ceiling_per_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(n("commits") > 0 && n("latency_us_p99") > 0, "{p}");
    }
    let svg = std::fs::read_to_string(dir.path().join("quick.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("ceiling"), "chart");
}
