//! Runs the harness's `scale` scenario on a few simulated rings (the eventd
//! binary with `--simulate-cpus`) and checks what it measured.

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
fn scale_scenario_attaches_every_simulated_ring_and_accounts_for_every_event() {
    let eventd = eventd_binary();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_eventd-perf"))
        .args([
            "scale",
            "--scale-rings",
            "5",
            "--scale-shards",
            "0,3",
            "--duration",
            "1",
            "--queries",
            "3",
            "--eventd",
        ])
        .arg(&eventd)
        .arg("--results")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("scale.json")).unwrap()).unwrap();
    let points = report["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (p, shards) in points.iter().zip([5, 3]) {
        let n = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} in {p}"));
        // Five rings on a machine with fewer CPUs: every one attached.
        assert_eq!(n("rings"), 5, "{p}");
        assert_eq!(n("shards"), shards, "{p}");
        assert!(n("emitted") > 0, "{p}");
        assert_eq!(n("emitted"), n("stored") + n("lost"), "{p}");
        assert_eq!(n("rows_in_files"), n("stored"), "{p}");
        // One drain per ring and one writer per shard at least.
        assert!(n("threads_idle") >= 5 + shards, "{p}");
        assert!(
            n("fds_peak") as f64 <= p["fd_allowance"].as_f64().unwrap(),
            "{p}"
        );
        assert!(n("queries_answered") > 0 && n("query_us_p99") > 0, "{p}");
        assert!(p["ceiling_per_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["rss_peak_mib"].as_f64().unwrap() > 0.0, "{p}");
    }
    let svg = std::fs::read_to_string(dir.path().join("scale.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("rings"), "chart");
}
