//! Helpers shared by the integration tests: a real `eventd` process, real
//! `eventctl` runs, and read-only looks at the shard files.
#![allow(dead_code)] // each test crate uses a different part

use rand::Rng;
use rusqlite::{Connection, OpenFlags};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

pub const EVENTD: &str = env!("CARGO_BIN_EXE_eventd");
pub const EVENTCTL: &str = env!("CARGO_BIN_EXE_eventctl");

/// A running `eventd` with its data directory.
pub struct Eventd {
    pub child: Child,
    pub log: PathBuf,
}

pub fn config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("eventd.toml");
    std::fs::write(&path, text).unwrap();
    path
}

pub fn command(data: &Path, config: Option<&Path>, extra: &[&str]) -> (Command, PathBuf) {
    let log = data.with_extension(format!("log-{}", rand::rng().random::<u32>()));
    let mut cmd = Command::new(EVENTD);
    cmd.arg("--data-dir").arg(data);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.args(extra);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    (cmd, log)
}

impl Eventd {
    /// Starts eventd and waits until it has written its pid (start-up done).
    pub fn start(data: &Path, config: Option<&Path>) -> Eventd {
        Self::start_with(data, config, &[])
    }

    pub fn start_with(data: &Path, config: Option<&Path>, extra: &[&str]) -> Eventd {
        let (cmd, log) = command(data, config, extra);
        Self::spawn(cmd, log, data)
    }

    /// Starts eventd from a command made by [`command`] (and changed by the
    /// caller: a umask, say) and waits until it has written its pid.
    pub fn spawn(mut cmd: Command, log: PathBuf, data: &Path) -> Eventd {
        let mut child = cmd.spawn().unwrap();
        let pid_file = data.join("run/eventd.pid");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if std::fs::read_to_string(&pid_file)
                .is_ok_and(|s| s.split_whitespace().next() == Some(&child.id().to_string()))
            {
                return Eventd { child, log };
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("eventd exited at start-up ({status}):\n{}", read(&log));
            }
            assert!(
                Instant::now() < deadline,
                "eventd did not start:\n{}",
                read(&log)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, and a clean exit is required.
    pub fn stop(mut self) {
        signal(&self.child, libc::SIGTERM);
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "eventd exited {status}:\n{}",
            read(&self.log)
        );
        let log = read(&self.log);
        assert!(log.contains("stopped"), "{log}");
    }

    /// Whether the process is still running (it has not exited on its own).
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn kill(mut self) {
        signal(&self.child, libc::SIGKILL);
        self.child.wait().unwrap();
    }
}

impl Drop for Eventd {
    /// A failed test must not leave a daemon behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs a command made by [`command`] that is expected to exit at start-up;
/// its exit status and log. One that is still running after 30 s is killed
/// and the test fails, with the log.
pub fn exit_at_start(mut cmd: Command, log: &Path) -> (std::process::ExitStatus, String) {
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, read(log));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("eventd did not exit at start-up:\n{}", read(log));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill with the pid of a child we have not reaped yet.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0);
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// An `eventctl emit --stdin` process fed by the test.
pub struct Emitter {
    pub child: Child,
    pub stdin: ChildStdin,
}

impl Emitter {
    pub fn spawn(data: &Path, provider: &str) -> Emitter {
        let mut child = Command::new(EVENTCTL)
            .arg("--data-dir")
            .arg(data)
            .args([
                "emit",
                "--provider",
                provider,
                "--level",
                "notice",
                "--stdin",
            ])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        Emitter { child, stdin }
    }

    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
    }

    pub fn finish(self) {
        let status = self.close();
        assert!(status.success(), "eventctl emit failed: {status}");
    }

    /// Closes the input and waits; a lapping ring may make some lines fail.
    pub fn close(mut self) -> std::process::ExitStatus {
        self.stdin.flush().unwrap();
        drop(self.stdin);
        self.child.wait().unwrap()
    }
}

pub fn emit_one(data: &Path, message: &str) {
    let status = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(data)
        .args([
            "emit",
            "--provider",
            "single",
            "--level",
            "err",
            "--field",
            "k=v",
        ])
        .arg(message)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Every `*.db` in the store, opened read-only.
pub fn shards(data: &Path) -> Vec<(PathBuf, Connection)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(data.join("store"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "db"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let c = Connection::open_with_flags(&p, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
            c.busy_timeout(Duration::from_secs(5)).unwrap();
            (p, c)
        })
        .collect()
}

/// eventd's own boot marker (one event at each start: provider `eventd`,
/// name `boot`), which counts of what a test emitted leave out.
pub const NOT_BOOT_MARKER: &str = "NOT (provider = 'eventd' AND name = 'boot')";

/// eventd's boot markers in the store: how many, and their payload bytes
/// (provider, name, message and fields), as the shard metrics count them.
pub fn boot_markers(data: &Path) -> (u64, u64) {
    shards(data)
        .iter()
        .map(|(_, c)| {
            c.query_row(
                "SELECT count(*), coalesce(sum(length(CAST(provider AS BLOB)) \
                 + length(CAST(name AS BLOB)) + length(CAST(message AS BLOB)) \
                 + ifnull(length(CAST(fields AS BLOB)), 0)), 0) FROM events \
                 WHERE provider = 'eventd' AND name = 'boot'",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
            .unwrap()
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// Events in the store, boot markers left out.
pub fn count_events(data: &Path) -> u64 {
    shards(data)
        .iter()
        .map(|(_, c)| {
            c.query_row(
                &format!("SELECT count(*) FROM events WHERE {NOT_BOOT_MARKER}"),
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap() as u64
        })
        .sum()
}

/// Waits until the store holds `n` events.
pub fn wait_for_events(data: &Path, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let have = count_events(data);
        if have >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "store holds {have} of {n} events"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `eventctl --data-dir DATA ARGS...` printed; it must succeed.
pub fn eventctl_text(data: &Path, args: &[&str]) -> String {
    let out = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The events `provider` stored, as `eventctl query --provider PROVIDER
/// --output json` prints them (its lines that are events, with a `seq`).
pub fn provider_rows(data: &Path, provider: &str) -> Vec<serde_json::Value> {
    let out = eventctl_text(data, &["query", "--provider", provider, "--output", "json"]);
    out.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("seq").is_some())
        .collect()
}

pub fn eventctl_json(data: &Path, cmd: &str) -> serde_json::Value {
    serde_json::from_str(&eventctl_text(data, &[cmd])).unwrap()
}

pub fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Makes `cmd` run as uid and gid 65534 (nobody), with no supplementary
/// groups: a local user eventd grants nothing. Only root can switch;
/// callers check `geteuid() == 0`.
pub fn as_nobody(cmd: &mut Command) -> &mut Command {
    as_user(cmd, 65534, &[])
}

/// Makes `cmd` run as `uid` (primary group `uid` too) with exactly the
/// supplementary `groups`: a member of those groups and nothing else,
/// whatever /etc/group says. Root only.
pub fn as_user<'c>(cmd: &'c mut Command, uid: u32, groups: &[u32]) -> &'c mut Command {
    use std::os::unix::process::CommandExt;
    let groups = groups.to_vec();
    // SAFETY: setgroups/setgid/setuid in the child before exec only; the
    // vector was allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Makes `cmd` run on `cpu` only (so it emits into that CPU's ring).
pub fn pin(cmd: &mut Command, cpu: usize) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only sched_setaffinity on the child itself, between fork and
    // exec; the CPU set lives on the closure's stack.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Sequence ranges held per ring (epoch, cpu): one `(seq, seq)` per event
/// stored, one `(from, to)` per gap.
pub type Covered = BTreeMap<(i64, i64), Vec<(i64, i64)>>;

/// Checks that each ring's ranges cover its sequence numbers from 1 to the
/// highest exactly once (`what` names the store in the message); returns
/// the highest per ring.
pub fn assert_covered(what: &str, covered: Covered) -> BTreeMap<(i64, i64), i64> {
    check_covered(what, covered).unwrap_or_else(|e| panic!("{e}"))
}

/// [`assert_covered`] that says what is wrong instead of failing (for a
/// store a drain may still be writing).
pub fn check_covered(what: &str, covered: Covered) -> Result<BTreeMap<(i64, i64), i64>, String> {
    let mut highest = BTreeMap::new();
    for ((epoch, cpu), mut ranges) in covered {
        ranges.sort_unstable();
        let mut next = 1;
        for (from, to) in ranges {
            if from < next {
                return Err(format!(
                    "{what}: ring {epoch:x} cpu {cpu}: sequence {from} held twice"
                ));
            }
            if from > next {
                return Err(format!(
                    "{what}: ring {epoch:x} cpu {cpu}: sequences {next}..{from} neither stored nor in a gap"
                ));
            }
            next = to + 1;
        }
        highest.insert((epoch, cpu), next - 1);
    }
    Ok(highest)
}
