//! The Python paths (perf/clients/bench.py), with the native package
//! installed into a venv the way a user installs it.

use super::cost::{medians, Cost, BUSY_BEFORE_MS};
use super::daemon::Daemon;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A Python with the native package (`import eventd`) installed from this
/// checkout the way a user installs it: a venv, `pip install
/// ./clients/python` (maturin from the configured package index). The venv
/// is reused while it imports eventd and the package's sources (and the
/// producer's) are those it was built from; else the package is built
/// again. None, said on stderr with pip's words, when it cannot be built.
pub(super) fn python_with_package(work: &Path) -> Option<PathBuf> {
    let venv = std::env::var_os("EVENTD_PERF_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| work.join("py-venv"));
    let python = venv.join("bin/python");
    let imports = |python: &Path| {
        Command::new(python)
            .args(["-c", "import eventd._native"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let stamp = venv.join("eventd-sources");
    let sources = sources_stamp(&repo);
    if imports(&python) && std::fs::read_to_string(&stamp).ok() == Some(sources.clone()) {
        return Some(python);
    }
    eprintln!(
        "clients: installing the eventd Python package into {} (pip install ./clients/python; \
         maturin builds it, a few minutes the first time)",
        venv.display()
    );
    let installed = (|| -> anyhow::Result<()> {
        if !python.is_file() {
            crate::syslog::run_cmd(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        }
        crate::syslog::run_cmd(
            Command::new(venv.join("bin/pip"))
                .args([
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--force-reinstall",
                    "--no-deps",
                ])
                .arg(repo.join("clients/python")),
        )?;
        std::fs::write(&stamp, &sources)?;
        Ok(())
    })();
    match installed {
        Ok(()) if imports(&python) => Some(python),
        Ok(()) => {
            eprintln!("clients: the installed package does not import; the native Python paths are left out");
            None
        }
        Err(e) => {
            eprintln!(
                "clients: the eventd Python package could not be installed ({e:#}); the native \
                 Python paths (py_emit, py_handler) are left out, the ctypes ones measured with \
                 python3"
            );
            None
        }
    }
}

/// What the package is built from, as far as a rebuild is concerned: the
/// number of source files under clients/python and producer/src and the
/// newest modification time among them.
fn sources_stamp(repo: &Path) -> String {
    fn walk(dir: &Path, count: &mut u64, newest: &mut u128) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if matches!(name.to_str(), Some("target" | "__pycache__" | "build")) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                walk(&path, count, newest);
            } else {
                *count += 1;
                let mtime = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                *newest = (*newest).max(mtime.map_or(0, |d| d.as_nanos()));
            }
        }
    }
    let (mut count, mut newest) = (0, 0);
    for dir in ["clients/python", "producer/src"] {
        walk(&repo.join(dir), &mut count, &mut newest);
    }
    format!("{count} files, newest {newest}\n")
}

pub(super) struct PyCosts {
    pub(super) ctypes_handler: Cost,
    pub(super) syslog: Cost,
    pub(super) floor: Cost,
    pub(super) ctypes_call: Cost,
    /// The native package's paths, when it is installed.
    pub(super) emit: Option<Cost>,
    pub(super) native_handler: Option<Cost>,
}

pub(super) fn python_bench(
    python: &Path,
    lib: &Path,
    daemon: &Daemon,
    n: u64,
) -> anyhow::Result<PyCosts> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/bench.py");
    let names = [
        "ctypes_handler",
        "syslog",
        "floor",
        "ctypes_call",
        "emit",
        "native_handler",
    ];
    let got = medians(&names, || {
        daemon.settle();
        crate::syslog::run_cmd(
            Command::new(python)
                .arg(&script)
                .arg(daemon.kmes())
                .arg(daemon.syslog_socket())
                .arg(n.to_string())
                .arg(BUSY_BEFORE_MS.to_string())
                .env("EVENTD_LIB", lib.join("libeventd.so")),
        )
    })?;
    let each =
        |i: usize| got[i].with_context(|| format!("no {} from {}", names[i], script.display()));
    Ok(PyCosts {
        ctypes_handler: each(0)?,
        syslog: each(1)?,
        floor: each(2)?,
        ctypes_call: each(3)?,
        emit: got[4],
        native_handler: got[5],
    })
}
