//! The C paths (perf/clients/bench.c against libeventd).

use super::cost::{medians, Cost, BUSY_BEFORE_MS};
use super::daemon::Daemon;
use anyhow::{bail, Context};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// libeventd next to this program, built if missing.
pub(super) fn libeventd() -> anyhow::Result<PathBuf> {
    let dir = std::env::current_exe()?
        .parent()
        .context("the directory of this program")?
        .to_path_buf();
    if !dir.join("libeventd.so").is_file() {
        let release = dir.file_name().is_some_and(|n| n == "release");
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo.args(["build", "-p", "libeventd"]);
        if release {
            cargo.arg("--release");
        }
        if !cargo.status()?.success() {
            bail!("cargo build -p libeventd failed");
        }
    }
    Ok(dir)
}

pub(super) struct CCosts {
    pub(super) json: Cost,
    /// `eventd_emit_kv` with values already text: the library's cost.
    pub(super) kv: Cost,
    /// `eventd_emit_kv` after two `snprintf`s of the numbers, and those
    /// `snprintf`s alone: the caller's share.
    pub(super) kv_snprintf: Cost,
    pub(super) snprintf: Cost,
    pub(super) fields: Cost,
    pub(super) syslog: Cost,
}

/// Builds the C bench program `source` (a path in the repository, its
/// headers in `include`, also one) into `exe` with `-O2`, linked with
/// `link` (the library options).
pub(super) fn build_c_bench(
    source: &str,
    include: &str,
    exe: &Path,
    link: impl IntoIterator<Item = impl AsRef<OsStr>>,
) -> anyhow::Result<()> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    crate::syslog::run_cmd(
        Command::new("cc")
            .args(["-O2", "-o"])
            .arg(exe)
            .arg(repo.join(source))
            .arg("-I")
            .arg(repo.join(include))
            .args(link),
    )
    .map(drop)
}

/// Builds the C program `source` (a path in the repository) into `exe`
/// against libeventd in `lib`: `eventd.h` from clients/c/include, the
/// library found at run time through the rpath.
pub(super) fn build_with_libeventd(source: &str, exe: &Path, lib: &Path) -> anyhow::Result<()> {
    build_c_bench(
        source,
        "clients/c/include",
        exe,
        [
            OsString::from("-L"),
            lib.into(),
            format!("-Wl,-rpath,{}", lib.display()).into(),
            "-leventd".into(),
        ],
    )
}

pub(super) fn c_bench(work: &Path, lib: &Path, daemon: &Daemon, n: u64) -> anyhow::Result<CCosts> {
    let exe = work.join("clients-bench");
    build_with_libeventd("perf/clients/bench.c", &exe, lib)?;
    let names = [
        "eventd_emit",
        "eventd_emit_kv",
        "eventd_emit_kv_snprintf",
        "snprintf",
        "eventd_emit_fields",
        "syslog",
    ];
    let got = medians(&names, || {
        daemon.settle();
        crate::syslog::run_cmd(
            Command::new(&exe)
                .arg(daemon.kmes())
                .arg(daemon.syslog_socket())
                .arg(n.to_string())
                .arg(BUSY_BEFORE_MS.to_string()),
        )
    })?;
    let each = |i: usize| got[i].with_context(|| format!("no {} from {}", names[i], exe.display()));
    Ok(CCosts {
        json: each(0)?,
        kv: each(1)?,
        kv_snprintf: each(2)?,
        snprintf: each(3)?,
        fields: each(4)?,
        syslog: each(5)?,
    })
}
