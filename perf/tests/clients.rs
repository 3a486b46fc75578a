//! Runs the harness's `clients` scenario with few events and checks its
//! last line names every path with a positive figure (no timing is judged),
//! the LTTng-UST peer's among them (a private session daemon; LTTng comes
//! from Debian's lttng-tools and liblttng-ust-dev, which scripts/test-all
//! installs). It also checks the instructions per event callgrind counted
//! (valgrind, which scripts/test-all installs too): a count for each path,
//! LTTng's among them, the raw emit's below the layer's, and the goals
//! read in them printed.
//! The Python package is installed once (minutes) into the venv the
//! harness keeps by default, perf/results/work/py-venv, and reused from
//! there by this test and by runs of `eventd-perf clients`.

use std::process::Command;

const KEYS: [&str; 23] = [
    "raw",
    "layer",
    "fmt_file",
    "syslog",
    "c",
    "c_kv",
    "c_kv_snprintf",
    "c_snprintf",
    "c_fields",
    "c_syslog",
    "py",
    "py_syslog",
    "py_floor",
    "py_ctypes_call",
    "layer_floor",
    "tracing_syslog",
    "producer",
    "producer_2t",
    "producer_budget",
    "producer_budget_2t",
    "py_emit",
    "py_handler",
    "lttng",
];

#[test]
fn clients_scenario_prints_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results/work/py-venv");
    let out = Command::new(env!("CARGO_BIN_EXE_eventd-perf"))
        .args(["clients", "--messages", "1000", "--results"])
        .arg(dir.path())
        .env("EVENTD_PERF_VENV", &venv)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap();
    let mut words = last.split(' ');
    assert_eq!(words.next(), Some("clients"), "{last}");
    assert_eq!(words.next(), Some("cpu_ns"), "{last}");
    let mut seen = Vec::new();
    for word in words {
        let (key, value) = word
            .split_once('=')
            .unwrap_or_else(|| panic!("{word} in {last}"));
        let ns: f64 = value.parse().unwrap_or_else(|_| panic!("{word} in {last}"));
        assert!(ns > 0.0, "{word} in {last}");
        seen.push(key);
    }
    assert_eq!(seen, KEYS, "{last}");
    // Instructions per event: every path counted, each a plausible count.
    let count = |row: &str| -> f64 {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(row))
            .unwrap_or_else(|| panic!("no {row:?} in {stdout}"));
        let n: f64 = line[line.find(row).unwrap() + row.len()..]
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("no count in {line:?}"));
        assert!((50.0..100_000.0).contains(&n), "{line}");
        n
    };
    let raw = count("Rust: raw Emitter::emit, 3 typed fields");
    let layer = count("Rust: tracing::info! through eventd's layer");
    count("C: eventd_emit_kv (values text already)");
    count("C: eventd_emit_fields (typed)");
    count("LTTng-UST tracepoint, the same event");
    // The layer writes through the producer the raw emit is part of.
    assert!(layer > raw, "layer {layer}, raw {raw}");
    for goal in [
        "Rust raw emit / LTTng-UST <= 1x",
        "tracing layer / LTTng-UST <= 1.5x",
    ] {
        assert!(stdout.contains(goal), "{goal} in {stdout}");
    }
    // Each path is printed beside its anchor.
    for anchor in [
        "LTTng-UST tracepoint ~100 ns",
        "LTTng-UST tracepoint, this run",
        "NanoLog",
        "spdlog",
        "6.6 us",
        "ctypes call ~0.4 us",
    ] {
        assert!(stdout.contains(anchor), "{anchor} in {stdout}");
    }
}
