//! The syslog comparison: the same N datagrams, from one blocking sender on
//! a Unix datagram socket, into eventd and into its peers, one after the
//! other in one run:
//!
//! - **eventd**: the binary with embedded defaults but rate limits off (as
//!   the peers run); stored means committed
//!   to its SQLite shards (indexed, queryable; checked with a query).
//! - **rsyslog**: Debian's package, a private configuration with `imuxsock`
//!   on a private socket (rate limiting off) and `omfile`.
//! - **journald**: Debian's `systemd-journald`, standalone in private mount
//!   and network namespaces, with a private configuration (rate limiting
//!   off, volatile storage in a private directory).
//! - **syslog-ng**: Debian's packages unpacked with `dpkg -x` (it conflicts
//!   with rsyslog), an `sql()` destination into SQLite with batched commits.
//!
//! The harness installs what is missing (apt-get), starts each daemon,
//! sends, watches its store until all N are there (or nothing moved for
//! 20 s), and stops it by its PID. The time is from the first send to the
//! N-th stored message (journald: the receive time of its last entry).

use crate::running::Running;
use anyhow::{bail, Context};
use serde::Serialize;
use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Peer {
    Eventd,
    /// Not a daemon: the floor of `syslogfloor` (a reference, never "the
    /// fastest peer").
    Floor,
    Rsyslog,
    Journald,
    SyslogNg,
}

impl Peer {
    pub fn name(self) -> &'static str {
        match self {
            Peer::Eventd => "eventd",
            Peer::Floor => "floor",
            Peer::Rsyslog => "rsyslog",
            Peer::Journald => "journald",
            Peer::SyslogNg => "syslog-ng",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PeerRun {
    pub peer: Peer,
    pub version: String,
    pub stores_into: &'static str,
    pub sent: u64,
    pub stored: u64,
    pub lost: u64,
    pub seconds: f64,
    pub stored_per_s: f64,
    pub send_seconds: f64,
    /// CPU seconds per million messages stored, of the peer's process and
    /// its descendants, from the first send until all were stored (their
    /// own accounting in /proc: user + system); `None` for the floor,
    /// which runs in the harness.
    pub cpu_s_per_million: Option<f64>,
    /// The same, eventd's threads grouped by stage (thread name without
    /// its number: syslog-dgram, drain, writer, ...).
    pub cpu_by_stage: Vec<(String, f64)>,
}

/// CPU time (ns) of the process `pid` and of all its descendants.
pub(crate) fn tree_cpu_ns(pid: u32) -> u64 {
    let own = crate::system::stat_cpu_ns(&format!("/proc/{pid}/stat")).unwrap_or(0);
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.filter_map(|t| t.ok()).collect::<Vec<_>>())
        .unwrap_or_default();
    let children: Vec<u32> = tasks
        .iter()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    own + children.into_iter().map(tree_cpu_ns).sum::<u64>()
}

/// CPU time (ns) of the live threads of `pid` by name, digits and a
/// trailing '-' dropped (`writer-001` counts as `writer`).
pub(crate) fn threads_cpu_ns(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut by = std::collections::BTreeMap::new();
    for (name, ns) in crate::system::threads_cpu(&format!("/proc/{pid}")) {
        let stage = name
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .trim_end_matches('-')
            .to_string();
        *by.entry(stage).or_insert(0) += ns;
    }
    by
}

/// CPU figures of one measured run: the whole tree, and eventd's stages.
struct CpuUse {
    total_ns: Option<u64>,
    stages: std::collections::BTreeMap<String, u64>,
}

fn cpu_now(pid: Option<u32>) -> CpuUse {
    CpuUse {
        total_ns: pid.map(tree_cpu_ns),
        stages: pid.map(threads_cpu_ns).unwrap_or_default(),
    }
}

/// Message bytes, as in the measured anchors (~92 B).
const MESSAGE_BYTES: usize = 92;
/// No progress for this long: the peer is done, whatever it stored.
const QUIET: Duration = Duration::from_secs(20);

/// Message `i`: RFC 3164 local form, as glibc's syslog(3) writes it.
fn message(i: u64) -> Vec<u8> {
    let mut m = format!("<13>Nov 30 10:01:02 bench[4242]: message {i:07} ").into_bytes();
    while m.len() < MESSAGE_BYTES {
        m.push(b'a' + (m.len() % 26) as u8);
    }
    m
}

pub(crate) fn sigterm(child: &mut Child) -> anyhow::Result<()> {
    // SAFETY: kill with the pid of a child not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Starts a daemon with its stdout discarded and its stderr in `log`, and
/// waits for each of its `sockets` to appear; `what` names it in errors.
fn start_logged(
    cmd: &mut Command,
    log: &Path,
    what: &str,
    sockets: &[PathBuf],
) -> anyhow::Result<Child> {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    for socket in sockets {
        wait_for_socket(socket, &mut child, log)?;
    }
    Ok(child)
}

fn wait_for_socket(path: &Path, child: &mut Child, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if let Some(status) = child.try_wait()? {
            bail!(
                "exited at start ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!("{} did not appear", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn run_cmd(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    eprintln!("installing {}", packages.join(" "));
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .map(|_| ())
}

// ---- eventd ----

struct Eventd {
    child: Child,
    data: PathBuf,
    /// Events committed before the bench sent anything (eventd's boot
    /// marker).
    before: u64,
}

fn start_eventd(binary: &Path, dir: &Path, config: Option<&Path>) -> anyhow::Result<Eventd> {
    let data = dir.join("data");
    let log = dir.join("eventd.log");
    let mut cmd = Command::new(binary);
    // The peers run with their rate limits off (the bench is one sender):
    // so does eventd, unless the caller gives its own configuration.
    let unlimited = dir.join("eventd.toml");
    let config = match config {
        Some(c) => c,
        None => {
            std::fs::write(&unlimited, "RateLimitBurst = 0\n")?;
            &unlimited
        }
    };
    cmd.arg("--config").arg(config);
    let child = start_logged(
        cmd.arg("--data-dir").arg(&data),
        &log,
        &binary.display().to_string(),
        &[data.join("run/query.sock"), data.join("run/syslog.sock")],
    )?;
    let mut eventd = Eventd {
        child,
        data,
        before: 0,
    };
    // Its boot marker, committed before the bench starts counting.
    let deadline = Instant::now() + Duration::from_secs(30);
    while eventd.stored()? == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    eventd.before = eventd.stored()?;
    Ok(eventd)
}

impl Running for Eventd {
    fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn socket(&self) -> PathBuf {
        self.data.join("run/syslog.sock")
    }

    fn stored(&mut self) -> anyhow::Result<u64> {
        // The writers' committed counts, from the daemon.
        let mut total = 0;
        eventd::query::client::call(
            &self.data.join("run/query.sock"),
            &eventd::query::Request::Stats,
            |v| {
                total = v["stats"]["shards"]
                    .as_array()
                    .map_or(0, |a| a.iter().filter_map(|s| s["events"].as_u64()).sum());
                Ok(true)
            },
        )?;
        Ok(total.saturating_sub(self.before))
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        sigterm(&mut self.child)
    }
}

/// Every row in the shard files, and whether a query finds one message.
fn check_eventd(data: &Path, eventctl: &Path, n: u64) -> anyhow::Result<(u64, bool)> {
    let mut rows = 0u64;
    for path in eventd::store::list_databases(&data.join("store"))? {
        let c = rusqlite::Connection::open(&path)?;
        rows += c.query_row(
            "SELECT count(*) FROM events WHERE provider = 'bench'",
            [],
            |r| r.get::<_, i64>(0),
        )? as u64;
    }
    let probe = format!("message {:07} ", n / 2);
    let out = run_cmd(Command::new(eventctl).arg("--data-dir").arg(data).args([
        "query",
        "--offline",
        "--output",
        "json",
        "--grep",
        &probe,
    ]))?;
    Ok((
        rows,
        out.lines().count() == 1 && out.contains(probe.trim_end()),
    ))
}

// ---- rsyslog ----

struct Rsyslog {
    child: Child,
    dir: PathBuf,
    file: Option<std::fs::File>,
    lines: u64,
    /// The end of the file read last, after its last newline.
    partial: Vec<u8>,
}

fn start_rsyslog(dir: &Path) -> anyhow::Result<Rsyslog> {
    if Command::new("rsyslogd").arg("-v").output().is_err() {
        apt_install(&["rsyslog"])?;
    }
    let conf = dir.join("rsyslog.conf");
    std::fs::write(
        &conf,
        format!(
            "global(workDirectory=\"{d}\" maxMessageSize=\"64k\")\n\
             module(load=\"imuxsock\" SysSock.Use=\"off\")\n\
             input(type=\"imuxsock\" Socket=\"{d}/log.sock\" RateLimit.Interval=\"0\")\n\
             *.* action(type=\"omfile\" file=\"{d}/messages\")\n",
            d = dir.display()
        ),
    )?;
    let log = dir.join("rsyslogd.log");
    let child = start_logged(
        Command::new("rsyslogd")
            .arg("-n")
            .arg("-f")
            .arg(&conf)
            .arg("-i")
            .arg(dir.join("rsyslogd.pid")),
        &log,
        "rsyslogd",
        &[dir.join("log.sock")],
    )?;
    Ok(Rsyslog {
        child,
        dir: dir.to_path_buf(),
        file: None,
        lines: 0,
        partial: Vec::new(),
    })
}

impl Running for Rsyslog {
    fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("log.sock")
    }

    fn stored(&mut self) -> anyhow::Result<u64> {
        if self.file.is_none() {
            self.file = std::fs::File::open(self.dir.join("messages")).ok();
        }
        if let Some(f) = &mut self.file {
            // Counts the bench's lines written since the last look (not
            // rsyslog's own start-up line).
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                self.partial.extend_from_slice(&buf[..n]);
                let complete = self
                    .partial
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                self.lines += self.partial[..complete]
                    .split(|&b| b == b'\n')
                    .filter(|l| l.windows(12).any(|w| w == b"bench[4242]:"))
                    .count() as u64;
                self.partial.drain(..complete);
            }
        }
        Ok(self.lines)
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        sigterm(&mut self.child)
    }
}

// ---- journald ----

pub(crate) struct Journald {
    child: Child,
    dir: PathBuf,
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

fn start_journald(dir: &Path) -> anyhow::Result<Journald> {
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
fn journal_count(dir: &Path) -> anyhow::Result<u64> {
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

struct SyslogNg {
    child: Child,
    dir: PathBuf,
    root: PathBuf,
}

/// Unpacks syslog-ng and the libraries the host lacks into `root` (once).
fn unpack_syslog_ng(root: &Path) -> anyhow::Result<PathBuf> {
    let binary = root.join("usr/sbin/syslog-ng");
    if binary.exists() {
        return Ok(binary);
    }
    // The SQL driver is an ordinary library package, installable beside
    // rsyslog; only syslog-ng itself conflicts and is unpacked.
    if !Path::new("/usr/lib/x86_64-linux-gnu/dbd/libdbdsqlite3.so").exists() {
        apt_install(&["libdbi1", "libdbd-sqlite3"])?;
    }
    let debs = root.join("debs");
    std::fs::create_dir_all(&debs)?;
    let wanted = [
        "syslog-ng-core",
        "syslog-ng-mod-sql",
        "libivykis0",
        "libnet1",
        "libwrap0",
        "libpcre3",
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|p| {
            p.starts_with("syslog-ng")
                || !Command::new("dpkg")
                    .args(["-s", p])
                    .output()
                    .is_ok_and(|o| o.status.success())
        })
        .collect();
    run_cmd(
        Command::new("apt-get")
            .arg("download")
            .args(&missing)
            .current_dir(&debs),
    )?;
    for entry in std::fs::read_dir(&debs)? {
        let deb = entry?.path();
        run_cmd(Command::new("dpkg").arg("-x").arg(&deb).arg(root))?;
    }
    if !binary.exists() {
        bail!("syslog-ng not found in the unpacked packages");
    }
    Ok(binary)
}

fn start_syslog_ng(dir: &Path, root: &Path) -> anyhow::Result<SyslogNg> {
    let binary = unpack_syslog_ng(root)?;
    let conf = dir.join("syslog-ng.conf");
    std::fs::write(
        &conf,
        format!(
            "@version: 3.38\n\
             options {{ threaded(yes); log-fifo-size(2000000); stats-freq(0); }};\n\
             source s {{ unix-dgram(\"{d}/log.sock\" so-rcvbuf(8388608)); }};\n\
             destination db {{ sql(type(sqlite3) database(\"{d}/logs.db\") host(\"\") port(\"\")\n\
               username(\"\") password(\"\") table(\"messages\")\n\
               columns(\"datetime\", \"host\", \"program\", \"pid\", \"message\")\n\
               values(\"${{R_DATE}}\", \"${{HOST}}\", \"${{PROGRAM}}\", \"${{PID}}\", \"${{MSGONLY}}\")\n\
               indexes(\"datetime\") flags(explicit-commits) batch-lines(1000) batch-timeout(100)\n\
               log-fifo-size(2000000)); }};\n\
             log {{ source(s); destination(db); }};\n",
            d = dir.display()
        ),
    )?;
    let lib = |p: &str| root.join(p).display().to_string();
    let log = dir.join("syslog-ng.log");
    let mut cmd = Command::new(&binary);
    cmd.arg("-F")
        .arg("-f")
        .arg(&conf)
        .arg(format!("--module-path={}", lib("usr/lib/syslog-ng/3.38")))
        .arg("-p")
        .arg(dir.join("syslog-ng.pid"))
        .arg("-R")
        .arg(dir.join("syslog-ng.persist"))
        .arg("-c")
        .arg(dir.join("syslog-ng.ctl"))
        .arg("--no-caps")
        .env(
            "LD_LIBRARY_PATH",
            format!(
                "{}:{}:{}",
                lib("usr/lib/x86_64-linux-gnu"),
                lib("usr/lib/syslog-ng"),
                lib("lib/x86_64-linux-gnu")
            ),
        );
    let child = start_logged(&mut cmd, &log, "syslog-ng", &[dir.join("log.sock")])?;
    Ok(SyslogNg {
        child,
        dir: dir.to_path_buf(),
        root: root.to_path_buf(),
    })
}

impl SyslogNg {
    fn env(&self, cmd: &mut Command) {
        let lib = |p: &str| self.root.join(p).display().to_string();
        cmd.env(
            "LD_LIBRARY_PATH",
            format!(
                "{}:{}:{}",
                lib("usr/lib/x86_64-linux-gnu"),
                lib("usr/lib/syslog-ng"),
                lib("lib/x86_64-linux-gnu")
            ),
        );
    }
}

impl Running for SyslogNg {
    fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("log.sock")
    }

    fn stored(&mut self) -> anyhow::Result<u64> {
        // Its own count of rows written: reading the database while it
        // runs would take SQLite locks from under it (its driver does not
        // wait for them, and a refused commit suspends the destination).
        let mut cmd = Command::new(self.root.join("usr/sbin/syslog-ng-ctl"));
        cmd.arg("stats")
            .arg("-c")
            .arg(self.dir.join("syslog-ng.ctl"));
        self.env(&mut cmd);
        let out = run_cmd(&mut cmd)?;
        Ok(out
            .lines()
            .filter(|l| l.starts_with("dst.sql;") && l.contains(";a;written;"))
            .filter_map(|l| l.rsplit(';').next()?.trim().parse::<u64>().ok())
            .sum())
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        sigterm(&mut self.child)
    }
}

/// The rows syslog-ng's database holds (after it stopped).
fn syslog_ng_rows(dir: &Path) -> anyhow::Result<u64> {
    let c = rusqlite::Connection::open(dir.join("logs.db"))?;
    Ok(c.query_row("SELECT count(*) FROM messages", [], |r| r.get::<_, i64>(0))? as u64)
}

fn version(peer: Peer, eventd: &Path, root: &Path) -> String {
    let first_line = |cmd: &mut Command| {
        cmd.output()
            .ok()
            .map(|o| {
                let text = if o.stdout.is_empty() {
                    o.stderr
                } else {
                    o.stdout
                };
                String::from_utf8_lossy(&text)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string()
            })
            .unwrap_or_default()
    };
    match peer {
        Peer::Eventd => first_line(Command::new(eventd).arg("--version")),
        Peer::Floor => "this harness".to_string(),
        Peer::Rsyslog => first_line(Command::new("rsyslogd").arg("-v"))
            .split(" compiled")
            .next()
            .unwrap_or("")
            .trim()
            .to_string(),
        Peer::Journald => first_line(Command::new("journalctl").arg("--version")),
        Peer::SyslogNg => first_line(
            Command::new(root.join("usr/sbin/syslog-ng"))
                .arg("--version")
                .env(
                    "LD_LIBRARY_PATH",
                    format!(
                        "{}:{}:{}",
                        root.join("usr/lib/x86_64-linux-gnu").display(),
                        root.join("usr/lib/syslog-ng").display(),
                        root.join("lib/x86_64-linux-gnu").display()
                    ),
                ),
        ),
    }
}

/// Sends N messages to `running`'s socket and watches its store: the time
/// is from the first send to the first look that finds all N stored (every
/// 50 ms, the same way for every peer).
/// What [`measure`] found: stored, seconds, the sender's seconds, CPU
/// seconds per million (the tree), and per stage.
struct Measured {
    stored: u64,
    seconds: f64,
    send_seconds: f64,
    cpu_s_per_million: Option<f64>,
    stages: Vec<(String, f64)>,
}

fn measure(peer: Peer, running: &mut dyn Running, n: u64) -> anyhow::Result<Measured> {
    let socket = running.socket();
    let before = cpu_now(running.pid());
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || -> anyhow::Result<f64> {
        let s = UnixDatagram::unbound()?;
        s.connect(&socket)
            .with_context(|| format!("connecting to {}", socket.display()))?;
        let start = Instant::now();
        let _ = started_tx.send(start);
        for i in 0..n {
            s.send(&message(i))?;
        }
        Ok(start.elapsed().as_secs_f64())
    });
    let mut last = (0u64, Instant::now());
    let (stored, reached) = loop {
        std::thread::sleep(Duration::from_millis(50));
        let stored = running.stored()?;
        if stored >= n {
            break (stored, Instant::now());
        }
        if stored != last.0 {
            last = (stored, Instant::now());
        } else if last.1.elapsed() > QUIET && sender.is_finished() {
            eprintln!("{}: stored nothing new for {QUIET:?}", peer.name());
            break (stored, last.1);
        }
    };
    let after = cpu_now(running.pid());
    let send_seconds = sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))??;
    let start = started_rx.recv().context("the sender did not start")?;
    let seconds = reached.saturating_duration_since(start).as_secs_f64();
    let per_million = |ns: u64| ns as f64 / 1e9 / (stored.max(1) as f64 / 1e6);
    let total = after
        .total_ns
        .zip(before.total_ns)
        .map(|(a, b)| per_million(a.saturating_sub(b)));
    let stages = after
        .stages
        .iter()
        .map(|(stage, ns)| {
            let was = before.stages.get(stage).copied().unwrap_or(0);
            (stage.clone(), per_million(ns.saturating_sub(was)))
        })
        .filter(|(_, s)| *s > 0.0)
        .collect();
    Ok(Measured {
        stored,
        seconds: seconds.max(1e-6),
        send_seconds,
        cpu_s_per_million: total,
        stages,
    })
}

// Longer than the ~70 lines a function should be: each peer started, measured,
// checked and stopped in turn, the same steps for every peer.
/// `eventd_config`: a configuration file for eventd (default: the
/// embedded defaults with `RateLimitBurst = 0`).
pub fn run(
    peers: &[Peer],
    n: u64,
    work: &Path,
    eventd_binary: &Path,
    eventd_config: Option<&Path>,
) -> anyhow::Result<Vec<PeerRun>> {
    // The daemons get absolute paths (rsyslogd changes to /).
    let work = &std::fs::canonicalize(work).with_context(|| format!("{}", work.display()))?;
    let eventctl = eventd_binary.with_file_name("eventctl");
    let root = work.join("syslog-ng-root");
    let mut runs = Vec::new();
    for &peer in peers {
        let dir = work.join(format!("syslog-{}", peer.name()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        eprintln!("{}: starting", peer.name());
        let (mut running, stores_into): (Box<dyn Running>, &'static str) = match peer {
            Peer::Eventd => (
                Box::new(start_eventd(eventd_binary, &dir, eventd_config)?),
                "SQLite shards (indexed, queryable)",
            ),
            Peer::Floor => (
                Box::new(crate::syslogfloor::Floor::start(&dir)?),
                "SQLite, a receiving and a writing thread, nothing else (the floor)",
            ),
            Peer::Rsyslog => (Box::new(start_rsyslog(&dir)?), "flat file (omfile)"),
            Peer::Journald => (Box::new(start_journald(&dir)?), "journal files"),
            Peer::SyslogNg => (
                Box::new(start_syslog_ng(&dir, &root)?),
                "SQLite (sql(), 1000-row batches)",
            ),
        };
        let measured = measure(peer, running.as_mut(), n);
        let stopped = running.stop();
        let Measured {
            mut stored,
            seconds,
            send_seconds,
            cpu_s_per_million,
            stages,
        } = measured?;
        stopped?;
        match peer {
            Peer::Eventd => {
                let data = dir.join("data");
                let (rows, found) = check_eventd(&data, &eventctl, n)?;
                if !found {
                    bail!("eventd: a query did not find message {}", n / 2);
                }
                stored = rows;
            }
            Peer::Journald => stored = journal_count(&dir)?,
            Peer::SyslogNg => stored = syslog_ng_rows(&dir)?,
            Peer::Floor => {
                let c = rusqlite::Connection::open(eventd::store::shard_path(&dir, 0))?;
                stored =
                    c.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))? as u64;
            }
            Peer::Rsyslog => {}
        }
        let run = PeerRun {
            peer,
            version: version(peer, eventd_binary, &root),
            stores_into,
            sent: n,
            stored: stored.min(n),
            lost: n.saturating_sub(stored),
            seconds,
            stored_per_s: stored.min(n) as f64 / seconds,
            send_seconds,
            cpu_s_per_million,
            cpu_by_stage: if peer == Peer::Eventd {
                stages
            } else {
                Vec::new()
            },
        };
        eprintln!(
            "{}: {} of {} stored in {:.2} s ({:.0}/s), {} lost, {} CPU s per million{}",
            peer.name(),
            run.stored,
            n,
            run.seconds,
            run.stored_per_s,
            run.lost,
            run.cpu_s_per_million
                .map_or("n/a".to_string(), |c| format!("{c:.2}")),
            stages_text(&run.cpu_by_stage)
        );
        runs.push(run);
    }
    Ok(runs)
}

/// ` (syslog-dgram 1.20, drain 0.80, ...)`, or nothing.
pub fn stages_text(stages: &[(String, f64)]) -> String {
    if stages.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = stages.iter().map(|(s, c)| format!("{s} {c:.2}")).collect();
    format!(" ({})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_numbered_and_sized() {
        let m = message(41);
        assert_eq!(m.len(), MESSAGE_BYTES);
        let text = String::from_utf8(m).unwrap();
        assert!(text.starts_with("<13>Nov 30 10:01:02 bench[4242]: message 0000041 "));
        let parsed = eventd::syslog::parse::parse(text.as_bytes());
        assert_eq!(parsed.app_name.as_deref(), Some("bench"));
        assert_eq!(parsed.message.split_whitespace().nth(1), Some("0000041"));
    }
}
