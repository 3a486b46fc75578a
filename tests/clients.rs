//! Real client programs emitting into a real eventd: a Rust program using
//! `tracing` (spans, typed fields) and `log` through eventd-tracing, a C
//! program built with `cc` against libeventd (several threads), and a
//! Python script using `logging` through eventd_logging. Each checks the
//! rows through the query path (`eventctl query --output json`): count,
//! level, provider, name and fields with their JSON types. And each keeps
//! running when there are no rings, and says what it dropped.

mod common;

use common::{wait_for_events, Eventd, EVENTCTL};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `eventctl query --provider P --output json` returns: the events,
/// each with its fields.
fn query(data: &Path, provider: &str) -> Vec<(Value, Value)> {
    let out = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(data)
        .args(["query", "--provider", provider, "--output", "json"])
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
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("seq").is_some())
        .map(|v| {
            // `fields` is an object in eventctl's JSON.
            let fields = v["fields"].clone();
            (v, fields)
        })
        .collect()
}

/// "emitted N dropped M" from a client's output.
fn counts(stdout: &[u8]) -> (u64, u64) {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .find_map(|l| l.find("emitted ").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("no counts in {text:?}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[1].parse().unwrap(), words[3].parse().unwrap())
}

/// The counts a client printed after closing its handle: "closed: emitted
/// N dropped M".
fn counts_after_close(stdout: &[u8]) -> (u64, u64) {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("closed: "))
        .unwrap_or_else(|| panic!("no counts after close in {text:?}"));
    counts(line.as_bytes())
}

// ------------------------------------------------------------ typed fields

/// An emit with typed fields (the fast path: binary entries in the ring)
/// is stored with the same JSON object, types kept, as a formatted one.
#[test]
fn typed_emits_are_stored_with_typed_fields() {
    use eventd::rings::client::Producer;
    use eventd::rings::{Encoder, Field, Level, Value as V};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _eventd = Eventd::start(&data, None);
    let producer = Producer::new(data.join("kmes"), "typed-client");
    let items = [
        Field::new("order", V::U64(u64::MAX)),
        Field::new("delta", V::I64(-7)),
        Field::new("amount", V::F64(9.5)),
        Field::new("paid", V::Bool(true)),
        Field::new("who", V::Str("ann \"the\" admin")),
        Field::new("ratio", V::F64(f64::INFINITY)),
    ];
    let mut encoder = Encoder::default();
    encoder.i64("n", 3);
    encoder.str("n", "repeated: kept the first time");
    let mut waited = 0;
    // The first emit may find no ring yet while eventd makes them.
    while producer
        .emit_items(Level::Warning, "items", "from a slice", &items)
        .is_err()
    {
        waited += 1;
        assert!(waited < 500, "the rings never opened");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    producer
        .emit_typed(
            Level::Info,
            "encoded",
            "from an encoder",
            &encoder.encoded(),
        )
        .unwrap();
    producer
        .emit_items(Level::Debug, "none", "no fields", &[])
        .unwrap();
    wait_for_events(&data, 3);
    let mut rows = query(&data, "typed-client");
    rows.sort_by_key(|(v, _)| v["name"].as_str().unwrap().to_string());
    let got: Vec<(&str, u64, &Value)> = rows
        .iter()
        .map(|(v, f)| (v["name"].as_str().unwrap(), v["level"].as_u64().unwrap(), f))
        .collect();
    assert_eq!(got.len(), 3, "{rows:?}");
    assert_eq!((got[0].0, got[0].1), ("encoded", 6));
    assert_eq!(got[0].2, &serde_json::json!({"n": 3}));
    assert_eq!((got[1].0, got[1].1), ("items", 4));
    assert_eq!(
        got[1].2,
        &serde_json::json!({
            "order": u64::MAX,
            "delta": -7,
            "amount": 9.5,
            "paid": true,
            "who": "ann \"the\" admin",
            "ratio": "inf",
        })
    );
    assert!(got[1].2["order"].is_u64() && got[1].2["amount"].is_f64());
    assert_eq!(got[2].0, "none");
    // As for an event emitted with no fields text.
    assert!(
        got[2].2.is_null() || got[2].2 == &serde_json::json!({}),
        "{:?}",
        got[2].2
    );
}

// ------------------------------------------------------------------ Rust

const CHILD: &str = "EVENTD_CLIENTS_TEST_CHILD";
const RUST_THREADS: u64 = 4;
const RUST_EVENTS: u64 = 250;
/// Every event the Rust child emits: the threads', three around a span
/// whose field comes late, and one `log` record.
const RUST_TOTAL: u64 = RUST_THREADS * RUST_EVENTS + 4;

/// The Rust client: this test binary run again with `CHILD` set, so it is
/// a program of its own that installs the subscriber and logger as a
/// service would. A no-op in the normal run.
#[test]
fn rust_client_child() {
    let Ok(kmes) = std::env::var(CHILD) else {
        return;
    };
    use tracing_subscriber::prelude::*;
    let producer = eventd_tracing::EventdLayer::builder()
        .kmes_dir(&kmes)
        .provider("rust-client")
        .producer();
    let layer = eventd_tracing::EventdLayer::with_producer(producer.clone());
    // Not `.init()`: that would also make tracing the `log` backend.
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    eventd_tracing::EventdLogger::with_producer(producer.clone(), log::LevelFilter::Trace)
        .install(log::LevelFilter::Info)
        .unwrap();
    // Before any span has a field, then in a span whose only field is
    // recorded after it was made.
    tracing::info!(target: "outside", "before any span field");
    let late = tracing::info_span!("late", late = tracing::field::Empty);
    late.in_scope(|| tracing::info!(target: "late", "not recorded yet"));
    late.record("late", 5u64);
    late.in_scope(|| tracing::info!(target: "late", "recorded"));
    let threads: Vec<_> = (0..RUST_THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let request = tracing::info_span!("request", user = "ann", attempt = t);
                let _entered = request.enter();
                for i in 0..RUST_EVENTS {
                    let inner = tracing::debug_span!("step", i, attempt = "shadowed");
                    let _e = inner.enter();
                    if i % 5 == 0 {
                        tracing::warn!(target: "billing", amount = 2.5, paid = false, "slow payment {i}");
                    } else {
                        tracing::info!(count = i, delta = -(i as i64), thread = t, "step done");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    log::error!(target: "legacy", order = 7, ok = true, who = "bob"; "log record {}", 1);
    log::debug!("filtered out by the max level");
    println!(
        "emitted {} dropped {}",
        producer.emitted(),
        producer.dropped()
    );
}

fn run_rust_child(kmes: &Path) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "rust_client_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, kmes)
        .output()
        .unwrap()
}

#[test]
fn rust_tracing_layer_and_log_backend() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let out = run_rust_child(&data.join("kmes"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total = RUST_TOTAL;
    assert_eq!(
        counts(&out.stdout),
        (total, 0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for_events(&data, total);
    let rows = query(&data, "rust-client");
    assert_eq!(rows.len() as u64, total);
    let mut warns = 0;
    for (v, f) in &rows {
        assert!(
            v["pid"].as_u64().unwrap() > 0 && v["tid"].as_u64().unwrap() > 0,
            "{v}"
        );
        match v["name"].as_str().unwrap() {
            "billing" => {
                warns += 1;
                assert_eq!(v["level"], 4, "{v}");
                assert!(v["message"].as_str().unwrap().starts_with("slow payment "));
                assert_eq!(f["amount"], 2.5);
                assert_eq!(f["paid"], false);
                // The span fields: the inner span's i (a number), the
                // outer span's user; attempt from the innermost span.
                assert!(f["i"].is_u64(), "{f}");
                assert_eq!(f["user"], "ann");
                assert_eq!(f["attempt"], "shadowed");
            }
            "outside" => assert_eq!(f, &serde_json::json!({}), "{v}"),
            "late" if v["message"] == "recorded" => {
                assert_eq!(f, &serde_json::json!({"late": 5}), "{v}")
            }
            "late" => assert_eq!(f, &serde_json::json!({}), "{v}"),
            "legacy" => {
                assert_eq!(v["level"], 3);
                assert_eq!(v["message"], "log record 1");
                assert_eq!(
                    f,
                    &serde_json::json!({"order": 7, "ok": true, "who": "bob"})
                );
            }
            name => {
                assert_eq!(name, "clients", "the target of tracing::info! here: {v}");
                assert_eq!(v["level"], 6);
                assert_eq!(v["message"], "step done");
                // The event's own fields win over the spans' (none here
                // clash), numbers stay numbers, negatives too.
                let count = f["count"].as_i64().unwrap();
                assert_eq!(f["delta"].as_i64().unwrap(), -count);
                assert!(f["thread"].is_u64());
                assert_eq!(f["i"], f["count"]);
                assert_eq!(f["user"], "ann");
            }
        }
    }
    assert_eq!(warns, RUST_THREADS * RUST_EVENTS / 5);
    // What docs/guide/emitting.md shows, in the same forms.
    let shown = |args: &[&str]| -> String {
        let out = Command::new(EVENTCTL)
            .arg("--data-dir")
            .arg(&data)
            .args(["query", "-t", "rust-client", "--name", "billing"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let short = shown(&["-n", "1"]);
    let (time, rest) = short.split_at("Dec 04 17:44:16".len());
    assert_eq!(
        time.split(' ').map(str::len).collect::<Vec<_>>(),
        [3, 2, 8],
        "{short}"
    );
    let (_host, line) = rest.trim_start().split_once(' ').unwrap();
    assert!(line.starts_with("rust-client["), "{short}");
    assert!(line.contains("]: slow payment "), "{short}");
    let json: Value = serde_json::from_str(&shown(&["-n", "1", "-o", "json"])).unwrap();
    assert_eq!(json["name"], "billing");
    assert_eq!(json["fields"]["amount"], 2.5);
    assert_eq!(json["fields"]["paid"], false);
    assert_eq!(json["fields"]["attempt"], "shadowed");
    assert!(json["hostname"].is_string(), "{json}");
    let unpaid = shown(&["--field", "amount=2.5"]);
    assert_eq!(unpaid.lines().count(), warns as usize, "{unpaid}");
    eventd.stop();
}

// ------------------------------------------------------------------- C

/// libeventd built (as the test profile builds) and its directory.
fn libeventd() -> PathBuf {
    // target/debug/deps/clients-… → target/debug
    let profile_dir = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "-p", "libeventd"]);
    if release {
        build.arg("--release");
    }
    let status = build.status().unwrap();
    assert!(status.success(), "cargo build -p libeventd failed");
    assert!(profile_dir.join("libeventd.so").is_file());
    profile_dir
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// clients/c/examples/threads.c built with `cc` against libeventd.
fn c_program(dir: &Path) -> (PathBuf, PathBuf) {
    let lib = libeventd();
    let exe = dir.join("threads");
    let out = Command::new("cc")
        .arg(repo().join("clients/c/examples/threads.c"))
        .arg("-I")
        .arg(repo().join("clients/c/include"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-leventd", "-lpthread", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .output()
        .expect("cc (apt-get install -y gcc)");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (exe, lib)
}

#[test]
fn c_program_with_threads() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, _) = c_program(dir.path());
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    const THREADS: u64 = 4;
    const EACH: u64 = 500;
    let out = Command::new(&exe)
        .arg(data.join("kmes"))
        .args([THREADS.to_string(), EACH.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(counts(&out.stdout), (THREADS * EACH, 0));
    wait_for_events(&data, THREADS * EACH);
    let rows = query(&data, "c-threads");
    assert_eq!(rows.len() as u64, THREADS * EACH);
    let mut seen = std::collections::BTreeSet::new();
    for (v, f) in &rows {
        assert_eq!(v["name"], "worker");
        let i = if f["even"] == true {
            // Through eventd_emit: the caller's JSON, types kept.
            assert!(f["ratio"].is_f64(), "{f}");
            f["i"].as_u64().unwrap()
        } else {
            // Through eventd_emit_kv: strings.
            assert_eq!(f["even"], "no");
            f["i"].as_str().unwrap().parse().unwrap()
        };
        let t = f["thread"]
            .as_u64()
            .or_else(|| f["thread"].as_str().and_then(|s| s.parse().ok()))
            .unwrap();
        assert_eq!(v["message"], format!("thread {t} event {i}"));
        assert_eq!(v["level"], if i % 10 == 0 { 3 } else { 6 });
        assert!(seen.insert((t, i)), "({t}, {i}) twice");
    }
    eventd.stop();

    // With eventd stopped the rings are still there: events wait in them
    // and are stored at the next start.
    let out = Command::new(&exe)
        .arg(data.join("kmes"))
        .args(["2", "100"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(counts(&out.stdout), (200, 0));
    let eventd = Eventd::start(&data, None);
    wait_for_events(&data, THREADS * EACH + 200);
    eventd.stop();
}

#[test]
fn cpp_can_include_the_header() {
    let Ok(out) = Command::new("c++")
        .args(["-x", "c++", "-fsyntax-only", "-Wall", "-Werror", "-I"])
        .arg(repo().join("clients/c/include"))
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .unwrap()
                .write_all(
                    b"#include <eventd.h>\nint main() { eventd_t *e = nullptr; \
                      if (eventd_open(nullptr, \"cpp\", &e) == EVENTD_OK) eventd_close(e); \
                      return eventd_strerror(EVENTD_E_BUSY)[0] ? 0 : 1; }\n",
                )
                .unwrap();
            c.wait_with_output().unwrap()
        })
    else {
        eprintln!("skipped: no c++ compiler");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// --------------------------------------------------------------- Python

fn python(script: &Path, kmes: &Path, count: u64, lib: &Path) -> std::process::Output {
    Command::new("python3")
        .arg(script)
        .arg(kmes)
        .arg(count.to_string())
        .env("EVENTD_LIB", lib.join("libeventd.so"))
        .output()
        .expect("python3 (apt-get install -y python3)")
}

#[test]
fn python_logging_handler() {
    let lib = libeventd();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    const COUNT: u64 = 300;
    let script = repo().join("clients/python/examples/orders.py");
    let out = python(&script, &data.join("kmes"), COUNT, &lib);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(counts(&out.stdout), (COUNT + 1, 0));
    wait_for_events(&data, COUNT + 1);
    let rows = query(&data, "py-orders");
    assert_eq!(rows.len() as u64, COUNT + 1);
    for (v, f) in &rows {
        assert_eq!(v["name"], "shop.orders");
        let order = f["order"].as_i64().unwrap();
        match v["level"].as_u64().unwrap() {
            4 => {
                assert_eq!(v["message"], format!("order {order} is late"));
                assert_eq!(f["amount"].as_f64().unwrap(), order as f64 * 1.5);
                assert_eq!(f["rush"], order % 2 == 0);
            }
            6 => {
                assert_eq!(v["message"], format!("order {order} taken"));
                assert_eq!(f["customer"], format!("c{}", order % 7));
            }
            3 => {
                assert_eq!(order, -1);
                assert_eq!(v["message"], "ledger failed");
                assert!(f["exception"]
                    .as_str()
                    .unwrap()
                    .contains("ZeroDivisionError"));
            }
            l => panic!("level {l}: {v}"),
        }
    }
    eventd.stop();
}

/// `emitted` and `dropped` are still there after `close()` (they once
/// raised TypeError: the handler kept its closing counts in an attribute
/// `logging.Handler.close` overwrites), and a record logged to the closed
/// handler is dropped and counted, not emitted.
#[test]
fn python_handler_counts_after_close() {
    let lib = libeventd();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    const COUNT: u64 = 20;
    let script = repo().join("clients/python/examples/orders.py");
    let out = python(&script, &data.join("kmes"), COUNT, &lib);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(counts(&out.stdout), (COUNT + 1, 0));
    assert_eq!(counts_after_close(&out.stdout), (COUNT + 1, 1));
    wait_for_events(&data, COUNT + 1);
    let rows = query(&data, "py-orders");
    assert_eq!(rows.len() as u64, COUNT + 1);
    assert!(rows.iter().all(|(v, _)| v["message"] != "after close"));
    eventd.stop();
}

// ------------------------------------------------------ without eventd

/// No ring directory at all (eventd never ran with this data directory):
/// every client runs to its end, drops and counts, and says so once.
#[test]
fn clients_without_rings_keep_running_and_count_what_they_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let kmes = dir.path().join("never-made/kmes");

    let out = run_rust_child(&kmes);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(counts(&out.stdout), (0, RUST_TOTAL));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("cannot open the rings").count(),
        1,
        "{stderr}"
    );

    let (exe, lib) = c_program(dir.path());
    let out = Command::new(&exe)
        .arg(&kmes)
        .args(["3", "200"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(counts(&out.stdout), (0, 600));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("cannot open the rings").count(),
        1,
        "{stderr}"
    );

    let script = repo().join("clients/python/examples/orders.py");
    let out = python(&script, &kmes, 50, &lib);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(counts(&out.stdout), (0, 51));
    assert_eq!(counts_after_close(&out.stdout), (0, 52));

    // And without the library, the Python handler still does not fail.
    let out = Command::new("python3")
        .arg(&script)
        .arg(&kmes)
        .arg("5")
        .env("EVENTD_LIB", dir.path().join("absent.so"))
        .env("LD_LIBRARY_PATH", "")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(counts(&out.stdout), (0, 6));
    assert_eq!(counts_after_close(&out.stdout), (0, 7));
}
