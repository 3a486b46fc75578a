//! The Python package as a Python user gets it: a fresh venv,
//! `pip install ./clients/python` (maturin builds the native extension;
//! pip fetches maturin from the package index), then a script that uses
//! `eventd.emit` with typed fields and `eventd.Handler` from `logging`
//! against a real eventd. The stored rows keep the fields' JSON types, and
//! the handler's counts outlive close().

mod common;

use common::{provider_rows, wait_for_events, Eventd};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A venv under `dir` with the package installed from this checkout.
fn venv_with_package(dir: &Path) -> PathBuf {
    let venv = dir.join("venv");
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 (apt-get install -y python3 python3-venv)");
    assert!(made.success(), "python3 -m venv");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .arg(repo.join("clients/python"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pip install ./clients/python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    venv.join("bin/python")
}

const SCRIPT: &str = r#"
import logging, os, sys
import eventd

eventd.configure(provider="py-emit")
assert eventd.emit("paid", level=eventd.NOTICE, order=42, amount=63.5, rush=True, who="ann",
                   top=2**64 - 1, big=2**70, neg=-5, items=[1, 2])

# Wrong calls raise as a Python function's would; nothing is written.
import enum
class Stage(enum.IntEnum):
    PACKED = 3
class Tag(str):
    pass
# CPython 3.8 and 3.9 call emit with a tuple and a dict: the same checks
# through that path, which _emit_tuple_dict takes on any CPython.
for emit in [eventd.emit, eventd._native._emit_tuple_dict]:
    for call in [lambda: emit(), lambda: emit(7), lambda: emit("a", 1, 2),
                 lambda: emit("a", message="b"), lambda: emit("a", level="x")]:
        try:
            call()
            raise SystemExit("no TypeError")
        except TypeError as e:
            print("TypeError:", e)
    # Subclasses keep their base type; keywords may name the arguments.
    assert emit(message="packed", level=eventd.INFO, stage=Stage.PACKED, tag=Tag("red"),
                ok=True)
assert eventd._native._emit_tuple_dict("paid", 5, order=42, amount=63.5, rush=True, who="ann",
                                       top=2**64 - 1, big=2**70, neg=-5, items=[1, 2])

handler = eventd.Handler(provider="py-logging")
log = logging.getLogger("shop.orders")
log.addHandler(handler)
log.setLevel(logging.INFO)
log.warning("order %s is late", 7, extra={"order": 7, "late": False})
log.info("plain", extra={"n": 1, "who": "bo"})
try:
    1 / 0
except ZeroDivisionError:
    log.exception("failed", extra={"order": 8})
log.info("%d items", "not a number")  # cannot be formatted: dropped
pid = os.fork()
if pid == 0:
    log.info("from the child", extra={"child": True})
    os._exit(0)
os.waitpid(pid, 0)
handler.close()
log.error("after close")
print("closed: emitted", handler.emitted, "dropped", handler.dropped)

# A record's level is logging's, whatever its number: a custom TRACE of 5
# is debug, not syslog's notice. The ring directory may be a path object.
import pathlib
low = logging.getLogger("shop.low")
low.setLevel(1)
low.propagate = False
low.addHandler(eventd.Handler(provider="py-levels",
                              kmes_dir=pathlib.Path(os.environ["EVENTD_KMES_DIR"])))
for n in (1, 5, 9, 15, 25, 35, 45, 55):
    low.log(n, "level %d", n)
try:
    raise KeyError("k")
except KeyError:
    # The traceback takes the place of an extra of the same name.
    low.log(5, "traced", exc_info=True, extra={"exception": "mine", "n": 1})

# Under `python -c` there is no script: the provider is "python", not "-c".
eventd.configure()
assert eventd.emit("no script")
"#;

/// Runs `script` with `python -c` in a fresh venv that installed the
/// package, against a fresh eventd: the directory that holds it all,
/// eventd's data directory, that eventd and the script's stdout. The
/// script must succeed.
fn run_in_venv(script: &str) -> (tempfile::TempDir, PathBuf, Eventd, String) {
    let dir = tempfile::tempdir().unwrap();
    let python = venv_with_package(dir.path());
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let out = Command::new(&python)
        .args(["-c", script])
        .env("EVENTD_KMES_DIR", data.join("kmes"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (dir, data, eventd, stdout)
}

#[test]
fn pip_installed_package_emits_typed_fields() {
    let (_dir, data, eventd, stdout) = run_in_venv(SCRIPT);
    // The parent wrote three records; the one that does not format and
    // the one after close are dropped.
    assert!(stdout.contains("closed: emitted 3 dropped 2"), "{stdout}");
    for error in [
        "emit() missing 1 required positional argument: 'message'",
        "emit() argument 'message' must be str, not int",
        "emit() takes at most 2 positional arguments (3 given)",
        "emit() got multiple values for argument 'message'",
        "emit() argument 'level' must be int, not str",
    ] {
        // Once from each convention.
        let said = stdout.matches(&format!("TypeError: {error}\n")).count();
        assert_eq!(said, 2, "{error}: {stdout}");
    }
    wait_for_events(&data, 8);
    let emitted = provider_rows(&data, "py-emit");
    assert_eq!(emitted.len(), 4, "{emitted:?}");
    // Both conventions store the same events.
    for (i, paid) in [(0, &emitted[0]), (3, &emitted[3])] {
        assert_eq!(paid["message"], "paid", "{i}");
        assert_eq!(paid["level"], 5, "notice");
        assert_eq!(
            paid["fields"],
            json!({"order": 42, "amount": 63.5, "rush": true, "who": "ann",
                   "top": u64::MAX, "big": "1180591620717411303424", "neg": -5,
                   "items": "[1, 2]"})
        );
    }
    for packed in &emitted[1..3] {
        assert_eq!(packed["message"], "packed");
        assert_eq!(
            packed["fields"],
            json!({"stage": 3, "tag": "red", "ok": true})
        );
    }
    let logged = provider_rows(&data, "py-logging");
    assert_eq!(logged.len(), 4, "{logged:?}");
    let plain = logged.iter().find(|r| r["message"] == "plain").unwrap();
    assert_eq!(plain["level"], 6, "info");
    assert_eq!(plain["fields"], json!({"n": 1, "who": "bo"}));
    let failed = logged.iter().find(|r| r["message"] == "failed").unwrap();
    assert_eq!(failed["level"], 3, "err");
    assert_eq!(failed["fields"]["order"], 8);
    let trace = failed["fields"]["exception"].as_str().unwrap();
    assert!(trace.contains("ZeroDivisionError"), "{trace}");
    let late = logged
        .iter()
        .find(|r| r["message"] == "order 7 is late")
        .unwrap();
    assert_eq!(late["name"], "shop.orders");
    assert_eq!(late["level"], 4, "warning");
    assert_eq!(late["fields"], json!({"order": 7, "late": false}));
    let child = logged
        .iter()
        .find(|r| r["message"] == "from the child")
        .unwrap();
    assert_eq!(child["fields"], json!({"child": true}));
    assert_ne!(child["pid"], late["pid"], "the child's own pid");
    wait_for_events(&data, 18);
    let unnamed = provider_rows(&data, "python");
    assert_eq!(unnamed.len(), 1, "{unnamed:?}");
    assert_eq!(unnamed[0]["message"], "no script");
    let levels = provider_rows(&data, "py-levels");
    let level_of = |message: &str| {
        let row = levels.iter().find(|r| r["message"] == message);
        row.unwrap_or_else(|| panic!("{message}: {levels:?}"))["level"].clone()
    };
    for (levelno, severity) in [
        (1, 7),
        (5, 7),
        (9, 7),
        (15, 7),
        (25, 6),
        (35, 4),
        (45, 3),
        (55, 2),
    ] {
        assert_eq!(level_of(&format!("level {levelno}")), severity, "{levelno}");
    }
    let traced = levels.iter().find(|r| r["message"] == "traced").unwrap();
    assert_eq!(traced["level"], 7);
    assert_eq!(traced["fields"]["n"], 1);
    let trace = traced["fields"]["exception"].as_str().unwrap();
    assert!(trace.contains("KeyError"), "{trace}");
    eventd.stop();
}

/// The Python snippet of docs/guide/emitting.md that uses the package,
/// run as it stands in a venv that installed it: its two events stored.
#[test]
fn the_guides_python_snippet_runs() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(repo.join("docs/guide/emitting.md")).unwrap();
    let snippet = page
        .split("```python\n")
        .skip(1)
        .filter_map(|block| block.split("\n```").next())
        .find(|block| block.contains("import eventd\n") || block.contains("import eventd "))
        .expect("docs/guide/emitting.md has a snippet that imports eventd");
    let (_dir, data, eventd, _) = run_in_venv(snippet);
    wait_for_events(&data, 2);
    let stored = provider_rows(&data, "shop");
    assert_eq!(stored.len(), 2, "{stored:?}");
    let fields = json!({"order": 42, "amount": 63.0, "rush": true});
    let taken = stored.iter().find(|r| r["message"] == "order taken");
    let taken = taken.unwrap_or_else(|| panic!("{stored:?}"));
    assert_eq!((&taken["level"], &taken["fields"]), (&json!(6), &fields));
    let late = stored.iter().find(|r| r["message"] == "order 42 is late");
    let late = late.unwrap_or_else(|| panic!("{stored:?}"));
    assert_eq!(late["name"], "shop.orders");
    assert_eq!((&late["level"], &late["fields"]), (&json!(4), &fields));
    eventd.stop();
}
