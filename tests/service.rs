//! eventd as a service, with real processes: what `--version` says, where
//! `eventctl` finds the daemon, one log line per configuration error, the
//! query count shrunk to a stock descriptor limit, the sd_notify protocol
//! (READY, STOPPING, a watchdog that stops while a writer is held) and
//! socket activation (LISTEN_FDS, with `systemd-socket-activate` and with a
//! socket held across a restart as systemd holds it).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The abbreviated commit of this checkout, if git can say.
fn git_commit() -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

/// The profile directory these binaries were built in (`debug`,
/// `release`): target/<profile>/deps/service-… is this test.
fn profile_dir_name() -> String {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn version_names_the_commit_and_the_profile() {
    let commit = match std::env::var("EVENTD_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_string()),
    };
    for (exe, name) in [(EVENTD, "eventd"), (EVENTCTL, "eventctl")] {
        let out = Command::new(exe).arg("--version").output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let expected = format!(
            "{name} {} (commit {commit}, profile {})\n",
            env!("CARGO_PKG_VERSION"),
            profile_dir_name()
        );
        assert_eq!(text, expected);
    }
}

/// `eventctl` run in `cwd` with `env`, no `--data-dir`.
fn eventctl_in(cwd: &Path, env: &[(&str, &Path)], args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(EVENTCTL);
    cmd.current_dir(cwd).args(args);
    cmd.env_remove("EVENTD_DATA_DIR")
        .env_remove("EVENTD_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn eventctl_finds_the_data_dir_in_eventd_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("somewhere");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let eventd = Eventd::start(&data, None);
    let emitted = eventctl_in(
        &elsewhere,
        &[("EVENTD_DATA_DIR", &data)],
        &["emit", "--provider", "env", "found through EVENTD_DATA_DIR"],
    );
    assert!(
        emitted.status.success(),
        "{}",
        String::from_utf8_lossy(&emitted.stderr)
    );
    wait_for_events(&data, 1);
    let out = eventctl_in(
        &elsewhere,
        &[("EVENTD_DATA_DIR", &data)],
        &["query", "--provider", "env"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("found through EVENTD_DATA_DIR"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --data-dir still wins over the environment.
    let wrong = dir.path().join("not-a-data-dir");
    let out = Command::new(EVENTCTL)
        .current_dir(&elsewhere)
        .env("EVENTD_DATA_DIR", &wrong)
        .arg("--data-dir")
        .arg(&data)
        .args(["query", "--provider", "env"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("found through EVENTD_DATA_DIR"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without either, the working directory's ./eventd-data is used; here
    // there is none (and no /var/lib/eventd is assumed): the error names it.
    if !Path::new("/var/lib/eventd").exists() {
        let out = eventctl_in(&elsewhere, &[], &["query"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("eventd-data"), "{err}");
    }
    eventd.stop();
}

/// eventd's stderr when it refuses `config_text` (it must exit 1).
fn refusal(config_text: &str) -> (PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), config_text);
    let (cmd, log) = command(&dir.path().join("data"), Some(&config), &[]);
    let (status, text) = exit_at_start(cmd, &log);
    assert_eq!(status.code(), Some(1), "{text}");
    // The directory goes with `dir`; the path is only compared as text.
    (config, text)
}

#[test]
fn a_configuration_error_is_one_log_line() {
    for (text, must_name) in [
        // A TOML syntax error: toml's own text spans several lines.
        ("StorageShards = 2\nMaxBatchSize = \n", "MaxBatchSize"),
        // A value of the wrong type: the key is only in the quoted line.
        ("MaxBatchSize = \"lots\"\n", "MaxBatchSize"),
        ("StorageShard = 4\n", "StorageShard"),
        ("MaxBatchSize = 0\n", "MaxBatchSize"),
    ] {
        let (config, log) = refusal(text);
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one record for {text:?}, got:\n{log}");
        assert!(lines[0].contains("ERROR"), "{log}");
        assert!(lines[0].contains(must_name), "{log}");
        if !text.contains(" = 0") {
            // Parse errors say where: the file, its line and column.
            assert!(
                lines[0].contains(&config.display().to_string()) && lines[0].contains("line "),
                "{log}"
            );
        }
    }
}

/// eventd started by `sh` after `ulimit -n 1024`, as from a stock shell
/// (soft and hard limit 1024), logging JSON.
fn under_ulimit_1024(data: &Path, config: Option<&Path>) -> (Command, PathBuf) {
    let (plain, log) = command(data, config, &["--log-format", "json"]);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -n 1024 && exec \"$0\" \"$@\"")
        .arg(plain.get_program())
        .args(plain.get_args());
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    (cmd, log)
}

/// The JSON log records of `text` whose message contains `what`.
fn records<'a>(text: &'a str, what: &'a str) -> impl Iterator<Item = serde_json::Value> + 'a {
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(move |r| {
            r["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(what))
        })
}

#[test]
fn under_ulimit_1024_the_default_query_count_shrinks_to_fit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (cmd, log) = under_ulimit_1024(&data, None);
    let eventd = Eventd::spawn(cmd, log.clone(), &data);
    let text = read(&log);
    let plan = records(&text, "shards planned")
        .next()
        .unwrap_or_else(|| panic!("no plan line:\n{text}"));
    let (e, c) = (
        plan["fields"]["databases"].as_u64().unwrap(),
        plan["fields"]["rings"].as_u64().unwrap()
            + u64::from(plan["fields"]["syslog_ring"].as_bool().unwrap()),
    );
    assert_eq!(plan["fields"]["descriptor_soft_limit"], 1024, "{text}");
    // One line says what was lowered, to what, and why.
    let lowered: Vec<_> = records(&text, "MaxConcurrentQueries").collect();
    assert_eq!(lowered.len(), 1, "{text}");
    let q = lowered[0]["fields"]["max_concurrent_queries"]
        .as_u64()
        .unwrap();
    assert_eq!(lowered[0]["level"], "WARN", "{text}");
    // The most queries that fit: q does, q + 1 would not, and the
    // default (128) would not either.
    use eventd::routing::descriptor_allowance;
    assert!((1..128).contains(&q), "{q}");
    assert!(descriptor_allowance(q, e, c) <= 1024, "{q} {e} {c}");
    assert!(descriptor_allowance(q + 1, e, c) > 1024, "{q} {e} {c}");
    assert_eq!(
        plan["fields"]["descriptor_allowance"],
        descriptor_allowance(q, e, c)
    );
    // The daemon serves with that count, and says so.
    let stats = eventctl_json(&data, "stats");
    assert_eq!(stats["stats"]["max_concurrent_queries"], q, "{stats}");
    emit_one(&data, "served under ulimit -n 1024");
    wait_for_events(&data, 1);
    let out = eventctl_text(&data, &["query", "--provider", "single"]);
    assert!(out.contains("served under ulimit -n 1024"), "{out}");
    eventd.stop();
}

#[test]
fn under_ulimit_1024_an_explicit_query_count_that_does_not_fit_still_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = config(dir.path(), "MaxConcurrentQueries = 128\n");
    let (cmd, log) = under_ulimit_1024(&data, Some(&config));
    let (status, text) = exit_at_start(cmd, &log);
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.contains("1024") && text.contains("LimitNOFILE") && text.contains("128 concurrent"),
        "{text}"
    );
}

/// A datagram socket standing in for the service manager's NOTIFY_SOCKET.
struct NotifySocket {
    path: PathBuf,
    socket: std::os::unix::net::UnixDatagram,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        NotifySocket { path, socket }
    }

    /// The next message, if one comes within `wait`.
    fn next(&self, wait: Duration) -> Option<String> {
        self.socket.set_read_timeout(Some(wait)).unwrap();
        let mut buf = vec![0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("notify socket: {e}"),
        }
    }

    /// Waits (up to two minutes) for a message with the line `line`;
    /// returns it and every message before it.
    fn wait_for(&self, line: &str, eventd: &mut Eventd) -> (String, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = Vec::new();
        loop {
            if let Some(m) = self.next(Duration::from_millis(200)) {
                if m.lines().any(|l| l == line) {
                    return (m, seen);
                }
                seen.push(m);
            }
            assert!(
                eventd.running(),
                "eventd exited waiting for {line}:\n{}",
                read(&eventd.log)
            );
            assert!(
                Instant::now() < deadline,
                "no {line} in {seen:?}:\n{}",
                read(&eventd.log)
            );
        }
    }

    /// Drops every message already queued.
    fn drain(&self) -> Vec<String> {
        std::iter::from_fn(|| self.next(Duration::from_millis(1))).collect()
    }
}

use std::time::{Duration, Instant};

/// eventd with NOTIFY_SOCKET (and `env`), not waited for.
fn start_notified(data: &Path, notify: &NotifySocket, env: &[(&str, String)]) -> Eventd {
    let (mut cmd, log) = command(data, None, &[]);
    cmd.env("NOTIFY_SOCKET", &notify.path);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Eventd {
        child: cmd.spawn().unwrap(),
        log,
    }
}

#[test]
fn ready_comes_once_every_socket_is_up_and_stopping_at_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let notify = NotifySocket::bind(dir.path());
    let mut eventd = start_notified(&data, &notify, &[]);
    let (ready, before) = notify.wait_for("READY=1", &mut eventd);
    assert!(before.is_empty(), "{before:?}");
    assert!(ready.contains("STATUS=running:"), "{ready}");
    // Everything is up when READY is sent: the pid file says so, the
    // syslog sockets take a message, the query socket answers.
    let pid = read(&data.join("run/eventd.pid"));
    assert!(pid.starts_with(&eventd.child.id().to_string()), "{pid}");
    let syslog = std::os::unix::net::UnixDatagram::unbound().unwrap();
    syslog
        .send_to(
            b"<13>ready-test: up before READY",
            data.join("run/syslog.sock"),
        )
        .unwrap();
    std::os::unix::net::UnixStream::connect(data.join("run/syslog-stream.sock")).unwrap();
    let stats = eventctl_json(&data, "stats");
    assert!(
        stats["stats"]["rings"].as_array().unwrap().len() >= 2,
        "{stats}"
    );
    wait_for_events(&data, 1);
    signal(&eventd.child, libc::SIGTERM);
    let (stopping, _) = notify.wait_for("STOPPING=1", &mut eventd);
    assert!(stopping.contains("STATUS=stopping"), "{stopping}");
    eventd.stop();
}

/// The thread of process `pid` named `name` (its `comm`).
fn thread_named(pid: u32, name: &str) -> i32 {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap();
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            return task.file_name().to_str().unwrap().parse().unwrap();
        }
    }
    panic!("no thread {name} in process {pid}");
}

/// A thread held stopped by ptrace (the rest of its process runs on), as
/// a thread hung in the kernel would be; let go when dropped.
struct HeldThread(i32);

impl HeldThread {
    fn hold(tid: i32) -> HeldThread {
        // SAFETY: ptrace requests on a thread id of our own child; no
        // memory of ours is passed.
        unsafe {
            assert_eq!(
                libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0),
                0,
                "PTRACE_SEIZE: {}",
                std::io::Error::last_os_error()
            );
            assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0), 0);
            let mut status = 0;
            assert_eq!(libc::waitpid(tid, &mut status, libc::__WALL), tid);
            assert!(libc::WIFSTOPPED(status), "{status:#x}");
        }
        HeldThread(tid)
    }
}

impl Drop for HeldThread {
    fn drop(&mut self) {
        // SAFETY: as in hold; the thread is in a ptrace stop.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, self.0, 0, 0) };
    }
}

#[test]
fn the_watchdog_pings_while_idle_and_not_while_a_writer_with_work_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let notify = NotifySocket::bind(dir.path());
    // A 2 s timeout: checks every 0.5 s, a stall is judged over 1 s.
    let mut eventd = start_notified(&data, &notify, &[("WATCHDOG_USEC", "2000000".into())]);
    notify.wait_for("READY=1", &mut eventd);
    // Idle, it keeps pinging: an idle daemon is healthy.
    for _ in 0..4 {
        notify.wait_for("WATCHDOG=1", &mut eventd);
    }
    // Shard 0's writer is stopped, then given work: events from CPU 0 go
    // to shard 0 (R4).
    let pid = eventd.child.id();
    let held = HeldThread::hold(thread_named(pid, "writer-000"));
    let mut emit = Command::new(EVENTCTL);
    emit.arg("--data-dir").arg(&data).args([
        "emit",
        "--provider",
        "held",
        "while writer-000 is held",
    ]);
    assert!(pin(&mut emit, 0).status().unwrap().success());
    wait_until("the watchdog to name the held writer", || {
        read(&eventd.log).contains("made no progress")
    });
    let log = read(&eventd.log);
    let line = log
        .lines()
        .find(|l| l.contains("made no progress"))
        .unwrap();
    assert!(line.contains("writer of shard 0"), "{line}");
    // The decision was logged after the last ping was sent: none may come
    // while the writer is held.
    notify.drain();
    let mut during = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Some(m) = notify.next(Duration::from_millis(100)) {
            during.push(m);
        }
    }
    assert!(
        !during.iter().any(|m| m.contains("WATCHDOG=1")),
        "pinged while a writer was held: {during:?}"
    );
    drop(held);
    notify.wait_for("WATCHDOG=1", &mut eventd);
    wait_for_events(&data, 1);
    assert!(read(&eventd.log).contains("makes progress again"));
    eventd.stop();
}

// ------------------------------------------------------ socket activation

/// `systemd-socket-activate` (Debian's systemd package), if installed.
fn socket_activate() -> Option<PathBuf> {
    let path = PathBuf::from("/usr/bin/systemd-socket-activate");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: no systemd-socket-activate (apt-get install systemd)");
        None
    }
}

/// eventd under `systemd-socket-activate ACTIVATE_ARGS`, which binds the
/// sockets, waits for the first message or connection and only then
/// starts eventd with them (LISTEN_FDS, LISTEN_FDNAMES).
fn activated_by_systemd(tool: &Path, data: &Path, activate_args: &[&str]) -> (Command, PathBuf) {
    let (plain, log) = command(data, None, &[]);
    let mut cmd = Command::new(tool);
    cmd.args(activate_args)
        .arg(plain.get_program())
        .args(plain.get_args());
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    (cmd, log)
}

/// The messages of provider (syslog tag) `tag` in the store.
fn stored(data: &Path, tag: &str) -> Vec<String> {
    let mut out = Vec::new();
    if !data.join("store").is_dir() {
        return out; // eventd has not started yet
    }
    for (_, c) in shards(data) {
        let mut stmt = c
            .prepare("SELECT message FROM events WHERE provider = ?1 ORDER BY ts")
            .unwrap();
        let rows = stmt.query_map([tag], |r| r.get::<_, String>(0)).unwrap();
        out.extend(rows.map(Result::unwrap));
    }
    out.sort();
    out
}

fn wait_for_stored(data: &Path, tag: &str, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    wait_until(&format!("{n} messages of {tag}"), || {
        got = stored(data, tag);
        got.len() >= n
    });
    got
}

#[test]
fn systemd_socket_activate_passes_a_datagram_socket() {
    let Some(tool) = socket_activate() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let dev_log = dir.path().join("dev-log");
    let dev_log_arg = format!("--listen={}", dev_log.display());
    let (mut cmd, log) = activated_by_systemd(
        &tool,
        &data,
        &["--datagram", &dev_log_arg, "--fdname=dev-log"],
    );
    let child = cmd.spawn().unwrap();
    wait_until("systemd-socket-activate to bind", || dev_log.exists());
    // Sent before eventd runs: it waits in the socket, and starts eventd.
    let sender = std::os::unix::net::UnixDatagram::unbound().unwrap();
    sender
        .send_to(b"<11>activated: sent before eventd ran", &dev_log)
        .unwrap();
    let got = wait_for_stored(&data, "activated", 1);
    assert_eq!(got, ["sent before eventd ran"]);
    sender
        .send_to(b"<11>activated: sent while it runs", &dev_log)
        .unwrap();
    wait_for_stored(&data, "activated", 2);
    let text = read(&log);
    assert!(
        text.contains("syslog datagram socket passed by the service manager")
            && text.contains("dev-log"),
        "{text}"
    );
    // Its own sockets are still made where the settings say.
    assert!(data.join("run/syslog.sock").exists());
    let eventd = Eventd { child, log };
    eventd.stop();
}

#[test]
fn systemd_socket_activate_passes_stream_and_query_sockets() {
    let Some(tool) = socket_activate() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let stream = dir.path().join("stream.sock");
    let stream_arg = format!("--listen={}", stream.display());
    let (mut cmd, log) =
        activated_by_systemd(&tool, &data, &[&stream_arg, "--fdname=syslog-stream"]);
    let child = cmd.spawn().unwrap();
    wait_until("systemd-socket-activate to bind", || stream.exists());
    let mut conn = std::os::unix::net::UnixStream::connect(&stream).unwrap();
    use std::io::Write;
    conn.write_all(b"<13>streamed: first line\n<13>streamed: second line\n")
        .unwrap();
    drop(conn);
    let got = wait_for_stored(&data, "streamed", 2);
    assert_eq!(got, ["first line", "second line"]);
    let eventd = Eventd { child, log };
    eventd.stop();

    // The query socket, named "query": eventctl's first connection starts
    // eventd, and is answered.
    let query = data.join("run/query.sock");
    let query_arg = format!("--listen={}", query.display());
    let (mut cmd, log) = activated_by_systemd(&tool, &data, &[&query_arg, "--fdname=query"]);
    let child = cmd.spawn().unwrap();
    wait_until("systemd-socket-activate to bind", || query.exists());
    let out = eventctl_text(&data, &["query", "--provider", "streamed"]);
    assert!(
        out.contains("first line") && out.contains("second line"),
        "{out}"
    );
    let text = read(&log);
    assert!(
        text.contains("query socket passed by the service manager"),
        "{text}"
    );
    let eventd = Eventd { child, log };
    eventd.stop();
    // A passed socket is the manager's: eventd leaves its file.
    assert!(query.exists());
}

/// Starts eventd as a service manager does with sockets it holds: each of
/// `sockets` at descriptor 3, 4, …, with LISTEN_FDS, LISTEN_FDNAMES and
/// LISTEN_PID (set by `sh` to its own pid, which `exec` gives eventd).
fn start_with_sockets(data: &Path, sockets: &[(std::os::fd::RawFd, &str)]) -> Eventd {
    let (cmd, log, high) = command_with_sockets(data, sockets);
    let eventd = Eventd::spawn(cmd, log, data);
    close_all(high);
    eventd
}

/// The command [`start_with_sockets`] runs, and the copies of the sockets
/// it moves into place (to close once it started).
fn command_with_sockets(
    data: &Path,
    sockets: &[(std::os::fd::RawFd, &str)],
) -> (Command, PathBuf, Vec<i32>) {
    use std::os::unix::process::CommandExt;
    let (plain, log) = command(data, None, &[]);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$ exec \"$0\" \"$@\"")
        .arg(plain.get_program())
        .args(plain.get_args())
        .env("LISTEN_FDS", sockets.len().to_string())
        .env(
            "LISTEN_FDNAMES",
            sockets
                .iter()
                .map(|(_, n)| *n)
                .collect::<Vec<_>>()
                .join(":"),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    // Copies far above 3 first (close-on-exec), so that moving one into
    // place cannot overwrite another.
    let high: Vec<i32> = sockets
        .iter()
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we hold.
        .map(|(fd, _)| unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 100) })
        .collect();
    assert!(high.iter().all(|&fd| fd >= 100));
    let moves = high.clone();
    // SAFETY: only dup2 between fork and exec; the vector was allocated
    // before the fork. dup2's copy is not close-on-exec.
    unsafe {
        cmd.pre_exec(move || {
            for (i, &fd) in moves.iter().enumerate() {
                if libc::dup2(fd, 3 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    (cmd, log, high)
}

fn close_all(fds: Vec<i32>) {
    for fd in fds {
        // SAFETY: our own copies, not used again.
        unsafe { libc::close(fd) };
    }
}

#[test]
fn sockets_held_across_a_restart_keep_what_was_sent_meanwhile() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The test holds the sockets, as systemd holds eventd.socket's.
    let dgram_path = dir.path().join("log.sock");
    let stream_path = dir.path().join("log-stream.sock");
    let dgram = std::os::unix::net::UnixDatagram::bind(&dgram_path).unwrap();
    let held_dgram = dgram.try_clone().unwrap();
    let stream = std::os::unix::net::UnixListener::bind(&stream_path).unwrap();
    let held = [
        (dgram.as_raw_fd(), "syslog"),
        (stream.as_raw_fd(), "syslog-stream"),
    ];
    let inode = |p: &Path| std::fs::metadata(p).unwrap().ino();
    let (dgram_inode, stream_inode) = (inode(&dgram_path), inode(&stream_path));
    let send = move |range: std::ops::Range<u32>| {
        let sender = std::os::unix::net::UnixDatagram::unbound().unwrap();
        for i in range {
            let line = format!("<13>held: message {i:03}");
            sender.send_to(line.as_bytes(), &dgram_path).unwrap();
        }
    };

    let eventd = start_with_sockets(&data, &held);
    send(0..10);
    wait_for_stored(&data, "held", 10);
    eventd.stop();
    // Stopped: the sockets are still there, the same ones, and take what
    // is sent. A datagram socket queues a few messages (max_dgram_qlen),
    // then its senders wait, as they do on /dev/log; a connection waits
    // to be accepted.
    assert_eq!(inode(&dir.path().join("log.sock")), dgram_inode);
    assert_eq!(inode(&stream_path), stream_inode);
    let sender = std::thread::spawn({
        let send = send.clone();
        move || send(10..200)
    });
    let mut conn = std::os::unix::net::UnixStream::connect(&stream_path).unwrap();
    conn.write_all(b"<13>held: message 200 (a connection made while stopped)\n")
        .unwrap();
    drop(conn);
    // Some of them wait in the socket before eventd comes back.
    wait_until("messages queued in the held socket", || {
        queued(&held_dgram) > 0
    });

    let eventd = start_with_sockets(&data, &held);
    sender.join().unwrap();
    let got = wait_for_stored(&data, "held", 201);
    let mut expected: Vec<String> = (0..200).map(|i| format!("message {i:03}")).collect();
    expected.push("message 200 (a connection made while stopped)".to_string());
    expected.sort();
    assert_eq!(got, expected);
    send(201..211);
    wait_for_stored(&data, "held", 211);
    eventd.stop();
    assert_eq!(inode(&dir.path().join("log.sock")), dgram_inode);
}

/// Bytes waiting in a socket's receive queue (FIONREAD: for a datagram
/// socket, the size of the next datagram; 0 when none waits).
fn queued(socket: &std::os::unix::net::UnixDatagram) -> i32 {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(rc, 0);
    n
}

#[test]
fn a_passed_descriptor_eventd_cannot_use_is_refused_by_number_and_name() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (cmd, log, high) = command_with_sockets(&data, &[(tcp.as_raw_fd(), "web")]);
    let (status, text) = exit_at_start(cmd, &log);
    close_all(high);
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.contains("descriptor 3")
            && text.contains("\"web\"")
            && text.contains("not a Unix socket"),
        "{text}"
    );
}

#[test]
fn a_passed_stream_socket_at_the_stdout_socket_path_serves_service_output() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // As the package's eventd.socket holds them: the syslog stream socket
    // and the service output socket in one unit, so under one name.
    std::fs::create_dir_all(data.join("run")).unwrap();
    let stdout_path = data.join("run/stdout.sock");
    let stream_path = data.join("run/syslog-stream.sock");
    let stdout = std::os::unix::net::UnixListener::bind(&stdout_path).unwrap();
    let stream = std::os::unix::net::UnixListener::bind(&stream_path).unwrap();
    let held = [
        (stream.as_raw_fd(), "eventd.socket"),
        (stdout.as_raw_fd(), "eventd.socket"),
    ];
    let inode = |p: &Path| std::fs::metadata(p).unwrap().ino();
    let stdout_inode = inode(&stdout_path);
    let eventd = start_with_sockets(&data, &held);
    let out = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(&data)
        .args(["run", "-t", "passed", "--", "sh", "-c"])
        .arg("echo 'through the passed socket'; exit 2")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}\n{}", read(&eventd.log));
    let got = wait_for_stored(&data, "passed", 2);
    assert_eq!(got, ["exited with status 2", "through the passed socket"]);
    // The other passed stream socket is still a syslog one.
    let mut conn = std::os::unix::net::UnixStream::connect(&stream_path).unwrap();
    conn.write_all(b"<13>streamed: a syslog line\n").unwrap();
    drop(conn);
    assert_eq!(wait_for_stored(&data, "streamed", 1), ["a syslog line"]);
    let text = read(&eventd.log);
    assert!(text.contains("passed by the service manager"), "{text}");
    eventd.stop();
    // The socket is the manager's: eventd neither bound another nor
    // removed it.
    assert_eq!(inode(&stdout_path), stdout_inode);
}
