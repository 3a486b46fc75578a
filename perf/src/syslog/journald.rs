//! journald as a peer: Debian's `systemd-journald`, standalone in private
//! namespaces, its entries counted with `journalctl`.

use super::process::{apt_install, run_cmd, sigterm, start_logged};
use crate::running::Running;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

pub(crate) struct Journald {
    pub(super) child: Child,
    pub(super) dir: PathBuf,
}

impl Journald {
    /// journald alone in private namespaces, its files under `dir`.
    pub(crate) fn start(dir: &Path) -> anyhow::Result<Journald> {
        start_journald(dir)
    }

    /// journald's own process (unshare's child), which `nsenter` can
    /// enter.
    pub(crate) fn daemon_pid(&self) -> Option<i32> {
        let pid = self.child.id();
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()?
            .split_whitespace()
            .find_map(|c| c.parse().ok())
    }

    pub(crate) fn stop_now(&mut self) -> anyhow::Result<()> {
        Running::stop(self)
    }

    /// The process whose tree's CPU time is journald's.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The number in the last entry of `identifier` in the journal under
/// `dir` (`captured 00001234 ...`), or 0.
pub(crate) fn journal_last(dir: &Path, identifier: &str) -> anyhow::Result<u64> {
    let out = run_cmd(
        Command::new("journalctl")
            .arg("-D")
            .arg(journal_dir(dir)?)
            .args(["-n", "1", "-o", "cat", "-q"])
            .arg(format!("SYSLOG_IDENTIFIER={identifier}")),
    )?;
    Ok(out
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

/// Entries of `identifier` in the journal under `dir`.
pub(crate) fn journal_lines(dir: &Path, identifier: &str) -> anyhow::Result<u64> {
    let out = run_cmd(
        Command::new("journalctl")
            .arg("-D")
            .arg(journal_dir(dir)?)
            .args(["-o", "cat", "-q"])
            .arg(format!("SYSLOG_IDENTIFIER={identifier}")),
    )?;
    Ok(out.lines().count() as u64)
}

pub(super) fn start_journald(dir: &Path) -> anyhow::Result<Journald> {
    let binary = Path::new("/lib/systemd/systemd-journald");
    if !binary.exists() {
        apt_install(&["systemd"])?;
    }
    for d in ["run", "log", "etc"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    std::fs::write(
        dir.join("etc/journald.conf"),
        "[Journal]\nStorage=volatile\nRateLimitIntervalSec=0\nRateLimitBurst=0\n\
         RuntimeMaxUse=4G\nRuntimeMaxFileSize=1G\nForwardToSyslog=no\nForwardToWall=no\n\
         ForwardToConsole=no\nForwardToKMsg=no\nCompress=no\nSeal=no\n",
    )?;
    // Its own /run/systemd, /run/log and configuration, in a private mount
    // namespace; its sockets and files are this run's directories.
    let script = format!(
        "set -e\n\
         mkdir -p /run/systemd /run/log\n\
         mount -t tmpfs tmpfs /run/systemd\n\
         mkdir -p /run/systemd/journal\n\
         mount --bind {d}/run /run/systemd/journal\n\
         mount --bind {d}/log /run/log\n\
         mount --bind {d}/etc/journald.conf /etc/systemd/journald.conf\n\
         exec {b}\n",
        d = dir.display(),
        b = binary.display()
    );
    let log = dir.join("journald.log");
    let child = start_logged(
        Command::new("unshare").args([
            "--mount",
            "--net",
            "--fork",
            "--kill-child",
            "sh",
            "-c",
            &script,
        ]),
        &log,
        "systemd-journald in private namespaces",
        &[dir.join("run/dev-log")],
    )?;
    Ok(Journald {
        child,
        dir: dir.to_path_buf(),
    })
}

/// The journal directory journald made under `dir`.
fn journal_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let root = dir.join("log/journal");
    let entry = std::fs::read_dir(&root)
        .with_context(|| format!("reading {}", root.display()))?
        .next()
        .context("no journal directory yet")??;
    Ok(entry.path())
}

/// The bench's messages in the journal under `dir`.
pub(super) fn journal_count(dir: &Path) -> anyhow::Result<u64> {
    let out = run_cmd(
        Command::new("journalctl")
            .arg("-D")
            .arg(journal_dir(dir)?)
            .args(["-o", "cat", "-q", "SYSLOG_IDENTIFIER=bench"]),
    )?;
    Ok(out.lines().filter(|l| l.starts_with("message ")).count() as u64)
}

impl Journald {
    /// The number of the last message in the journal.
    fn last(&mut self) -> anyhow::Result<Option<u64>> {
        let Ok(dir) = journal_dir(&self.dir) else {
            return Ok(None);
        };
        let out = run_cmd(
            Command::new("journalctl")
                .arg("-D")
                .arg(&dir)
                .args(["-n", "1", "-o", "json", "-q"]),
        )?;
        let Some(line) = out.lines().last() else {
            return Ok(None);
        };
        let v: serde_json::Value = serde_json::from_str(line)?;
        let message = v["MESSAGE"].as_str().unwrap_or("");
        Ok(message
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse::<u64>().ok()))
    }
}

impl Running for Journald {
    fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("run/dev-log")
    }

    fn stored(&mut self) -> anyhow::Result<u64> {
        // One sender, in order: the last entry's number says how many.
        Ok(self.last()?.map_or(0, |n| n + 1))
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        // unshare ignores SIGTERM while it waits for its child: journald
        // itself (unshare's child) is told to stop, and unshare follows.
        let pid = self.child.id();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
        {
            // SAFETY: kill has no memory effects; the pid is journald's,
            // whose parent (our child, not yet reaped) keeps it from reuse.
            unsafe { libc::kill(child, libc::SIGTERM) };
        }
        sigterm(&mut self.child)
    }
}

// ---- syslog-ng ----
