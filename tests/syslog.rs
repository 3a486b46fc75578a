//! Syslog ingest with real sockets and the real daemon: both RFC formats,
//! kernel credentials, malformed input, both receive paths (io_uring and the
//! recvmmsg fallback, forced on), the stream socket, and `logger`.
#![cfg(not(loom))]

mod common;

use common::*;
use std::io::Write;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use std::process::Command;

/// (provider, name, level, pid, uid, message, fields) of every stored event,
/// oldest first.
type Row = (String, String, i64, i64, i64, String, serde_json::Value);

fn rows(data: &Path) -> Vec<Row> {
    let mut all: Vec<(i64, Row)> = Vec::new();
    for (_, c) in shards(data) {
        let mut stmt = c
            .prepare(&format!(
                "SELECT ts, provider, name, level, pid, uid, message, ifnull(fields, '{{}}') \
                 FROM events WHERE {NOT_BOOT_MARKER}"
            ))
            .unwrap();
        all.extend(
            stmt.query_map([], |r| {
                let fields: String = r.get(7)?;
                Ok((
                    r.get(0)?,
                    (
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        serde_json::from_str(&fields).unwrap(),
                    ),
                ))
            })
            .unwrap()
            .map(|r| r.unwrap()),
        );
    }
    all.sort_by_key(|(ts, _)| *ts);
    all.into_iter().map(|(_, r)| r).collect()
}

fn syslog_stats(data: &Path) -> serde_json::Value {
    eventctl_json(data, "stats")["stats"]["syslog"].clone()
}

fn sender() -> UnixDatagram {
    UnixDatagram::unbound().unwrap()
}

fn me() -> (i64, i64) {
    // SAFETY: getuid has no preconditions.
    (std::process::id() as i64, unsafe { libc::getuid() } as i64)
}

#[test]
fn both_formats_with_kernel_credentials_and_logger() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let socket = data.join("run/syslog.sock");
    let s = sender();
    s.send_to(
        b"<165>1 2026-11-30T10:00:00.5Z web01 nginx 999 ACCESS [req@1 id=\"7\" path=\"/a\\\"b\"] GET /index",
        &socket,
    )
    .unwrap();
    s.send_to(
        b"<38>Nov 30 10:01:02 sshd[1234]: Accepted publickey\n",
        &socket,
    )
    .unwrap();
    // A real program that never heard of eventd.
    let logger = Command::new("logger")
        .arg("--socket")
        .arg(&socket)
        .args(["-t", "backup", "-p", "local3.err", "nightly backup failed"])
        .status();
    let logged = matches!(logger, Ok(status) if status.success());
    wait_for_events(&data, if logged { 3 } else { 2 });

    let got = rows(&data);
    let (pid, uid) = me();
    let nginx = got
        .iter()
        .find(|r| r.0 == "nginx")
        .expect("rfc 5424 stored");
    assert_eq!((nginx.1.as_str(), nginx.2), ("ACCESS", 5));
    assert_eq!((nginx.3, nginx.4), (pid, uid), "kernel credentials");
    assert_eq!(nginx.5, "GET /index");
    let f = &nginx.6;
    assert_eq!(f["procid"], "999", "the claimed pid is kept as a claim");
    assert_eq!(f["facility"], "local4");
    assert_eq!(f["hostname"], "web01");
    assert_eq!(f["timestamp"], "2026-11-30T10:00:00.5Z");
    assert_eq!(f["sd"]["req@1"]["path"], "/a\"b");
    assert_eq!(f["format"], "rfc5424");
    assert_eq!(f["transport"], "dgram");

    let sshd = got.iter().find(|r| r.0 == "sshd").expect("rfc 3164 stored");
    assert_eq!((sshd.1.as_str(), sshd.2, sshd.3), ("auth", 6, pid));
    assert_eq!(sshd.5, "Accepted publickey");
    assert_eq!(sshd.6["procid"], "1234");
    assert_eq!(sshd.6["format"], "rfc3164");

    if logged {
        let backup = got
            .iter()
            .find(|r| r.0 == "backup")
            .expect("logger's message");
        assert_eq!((backup.1.as_str(), backup.2), ("local3", 3));
        assert_eq!(backup.5, "nightly backup failed");
        assert_ne!(backup.3, pid, "logger's own pid, from the kernel");
    } else {
        eprintln!("logger not found: its part was skipped");
    }
    let stats = syslog_stats(&data);
    assert_eq!(stats["path"], "io_uring", "{stats}");
    eventd.stop();
}

#[test]
fn malformed_datagrams_are_kept_or_counted_and_the_listener_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let socket = data.join("run/syslog.sock");
    let s = sender();
    let oversized = format!("<13>big: {}", "x".repeat(40_000));
    let inputs: Vec<&[u8]> = vec![
        b"",
        b"\n",
        b"<13>1 2026-11-30T10:00:00Z host",
        b"<13>app: caf\xE9 \xFF",
        b"<999>bogus priority",
        b"no priority at all",
        oversized.as_bytes(),
        b"<14>fine[1]: still listening",
    ];
    for input in &inputs {
        s.send_to(input, &socket).unwrap();
    }
    wait_for_events(&data, 6);
    let got = rows(&data);
    assert_eq!(got.len(), 6, "{got:?}");
    let last = got
        .iter()
        .find(|r| r.0 == "fine")
        .expect("stored after the bad ones");
    assert_eq!(last.5, "still listening");

    let truncated_header = got
        .iter()
        .find(|r| {
            r.6["problems"]
                .to_string()
                .contains("truncated RFC 5424 header")
        })
        .expect("truncated header stored");
    assert_eq!(truncated_header.6["hostname"], "host");
    let latin1 = got.iter().find(|r| r.0 == "app").expect("non-UTF-8 stored");
    assert_eq!(latin1.5, "caf\u{FFFD} \u{FFFD}");
    assert_eq!(latin1.6["raw_base64"], "PDEzPmFwcDogY2Fm6SD/");
    let bogus = got
        .iter()
        .find(|r| r.5.contains("bogus priority"))
        .expect("bogus priority stored");
    assert_eq!(
        (bogus.2, bogus.1.as_str()),
        (5, "user"),
        "user.notice by default"
    );
    let big = got.iter().find(|r| r.0 == "big").expect("oversized stored");
    assert_eq!(big.6["truncated_from"], oversized.len());
    assert!(big.5.len() < 16 << 10 && big.5.starts_with("xxx"));

    let stats = syslog_stats(&data);
    assert_eq!(stats["received"], 8, "{stats}");
    assert_eq!(stats["stored"], 6, "{stats}");
    assert_eq!(stats["rejected_empty"], 2, "{stats}");
    assert_eq!(stats["malformed"], 4, "{stats}");
    assert_eq!(stats["truncated"], 1, "{stats}");
    eventd.stop();
}

/// Sends `n` messages as fast as the socket takes them; returns them.
fn burst(socket: &Path, tag: &str, n: usize) -> Vec<String> {
    let s = sender();
    s.connect(socket).unwrap();
    let messages: Vec<String> = (0..n).map(|i| format!("{tag} message {i:06}")).collect();
    for m in &messages {
        s.send(format!("<13>{tag}: {m}").as_bytes()).unwrap();
    }
    messages
}

fn receive_paths_store_every_message(receive: &str) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // One source sends twice the default burst: limits off.
    let cfg = config(
        dir.path(),
        &format!("SyslogReceive = \"{receive}\"\nRateLimitBurst = 0\n"),
    );
    let eventd = Eventd::start(&data, Some(&cfg));
    let sent = burst(&data.join("run/syslog.sock"), "burst", 20_000);
    wait_for_events(&data, sent.len() as u64);
    let mut stored: Vec<String> = rows(&data).into_iter().map(|r| r.5).collect();
    stored.sort();
    assert_eq!(stored, sent, "every message exactly once");
    let stats = syslog_stats(&data);
    assert_eq!(stats["path"], receive, "{stats}");
    let calls = stats["receive_calls"].as_u64().unwrap();
    assert!(
        calls > 0 && calls <= stats["received"].as_u64().unwrap(),
        "{stats}"
    );
    eprintln!(
        "{receive}: {} messages in {calls} receive calls",
        stats["received"]
    );
    eventd.stop();
}

#[test]
fn the_io_uring_path_stores_every_message() {
    receive_paths_store_every_message("io_uring");
}

#[test]
fn the_io_uring_ring_defers_its_work_to_the_receiving_thread_where_the_kernel_can() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "SyslogReceive = \"io_uring\"\n");
    let eventd = Eventd::start(&data, Some(&cfg));
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let expected = match version {
        v if v >= (6, 1) => "deferred",
        v if v >= (5, 19) => "cooperative",
        _ => "default",
    };
    wait_until("the receive mode in the log", || {
        std::fs::read_to_string(&eventd.log)
            .unwrap()
            .contains("task_running")
    });
    let log = std::fs::read_to_string(&eventd.log).unwrap();
    assert!(
        log.contains(&format!("task_running=\"{expected}\"")),
        "kernel {version:?}: {log}"
    );
    eventd.stop();
}

#[test]
fn the_io_uring_receive_keeps_delivering_across_quiet_periods_and_stop_and_continue() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(
        dir.path(),
        "SyslogReceive = \"io_uring\"\nRateLimitBurst = 0\n",
    );
    let eventd = Eventd::start(&data, Some(&cfg));
    let socket = data.join("run/syslog.sock");
    let mut sent = Vec::new();
    for round in 0..3 {
        // Longer than the receiver's two check periods (1 s each) with
        // nothing to read, and eventd stopped and continued while idle.
        for _ in 0..5 {
            signal(&eventd.child, libc::SIGSTOP);
            std::thread::sleep(std::time::Duration::from_millis(20));
            signal(&eventd.child, libc::SIGCONT);
        }
        std::thread::sleep(std::time::Duration::from_millis(2200));
        sent.extend(burst(&socket, &format!("idle{round}"), 2000));
        // Datagrams queued while eventd is stopped (the sender blocks once
        // the socket's queue is full, until eventd continues).
        signal(&eventd.child, libc::SIGSTOP);
        let pid = eventd.child.id() as i32;
        let resume = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            // SAFETY: kill with the pid of the test's unreaped child.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        });
        sent.extend(burst(&socket, &format!("stopped{round}"), 2000));
        resume.join().unwrap();
    }
    wait_for_events(&data, sent.len() as u64);
    let mut stored: Vec<String> = rows(&data).into_iter().map(|r| r.5).collect();
    stored.sort();
    sent.sort();
    assert_eq!(stored, sent, "every message exactly once");
    let stats = syslog_stats(&data);
    assert_eq!(stats["path"], "io_uring", "{stats}");
    assert_eq!(
        stats["receive_errors"], 0,
        "never taken for stalled: {stats}"
    );
    let log = std::fs::read_to_string(&eventd.log).unwrap();
    assert!(!log.contains("delivered nothing"), "{log}");
    eventd.stop();
}

#[test]
fn the_recvmmsg_fallback_forced_on_stores_every_message() {
    receive_paths_store_every_message("recvmmsg");
}

#[test]
fn the_stream_socket_takes_both_framings_and_long_messages() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let mut s = UnixStream::connect(data.join("run/syslog-stream.sock")).unwrap();
    let long = format!("<13>long: {}", "y".repeat(12_000));
    let counted = "<13>1 - - counted - - - two\nlines";
    write!(
        s,
        "<14>line[5]: one per line\n{} {counted}\n{long}\n",
        counted.len()
    )
    .unwrap();
    drop(s);
    wait_for_events(&data, 3);
    let got = rows(&data);
    let (pid, _) = me();
    let line = got.iter().find(|r| r.0 == "line").unwrap();
    assert_eq!((line.5.as_str(), line.3), ("one per line", pid));
    assert_eq!(line.6["transport"], "stream");
    let c = got.iter().find(|r| r.0 == "counted").unwrap();
    assert_eq!(c.5, "two\nlines");
    let l = got.iter().find(|r| r.0 == "long").unwrap();
    assert_eq!(l.5.len(), 12_000, "a long message whole");
    eventd.stop();
}

#[test]
fn syslog_events_survive_a_crash_like_every_other_event() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let sent = burst(&data.join("run/syslog.sock"), "crash", 5000);
    // Once eventd has put them in its rings (a message still queued in the
    // kernel's socket dies with the process, for any syslog daemon), a
    // SIGKILL loses none of them.
    wait_until("every message in a ring", || {
        syslog_stats(&data)["stored"] == sent.len() as u64
    });
    eventd.kill();
    let eventd = Eventd::start(&data, None);
    wait_for_events(&data, sent.len() as u64);
    let mut stored: Vec<String> = rows(&data).into_iter().map(|r| r.5).collect();
    stored.sort();
    assert_eq!(stored, sent, "each exactly once");
    let gaps: i64 = shards(&data)
        .iter()
        .map(|(_, c)| {
            c.query_row("SELECT count(*) FROM gaps", [], |r| r.get::<_, i64>(0))
                .unwrap()
        })
        .sum();
    assert_eq!(gaps, 0);
    eventd.stop();
}

/// Sends `message` with `fd` attached (SCM_RIGHTS).
fn send_with_fd(socket: &Path, message: &[u8], fd: i32) {
    let s = sender();
    s.connect(socket).unwrap();
    let mut iov = libc::iovec {
        iov_base: message.as_ptr() as *mut _,
        iov_len: message.len(),
    };
    // Room for one cmsghdr and one int, aligned.
    let mut control = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the
    // sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as _;
    // SAFETY: msg_control points at enough room for one header and an int.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), fd);
    }
    use std::os::fd::AsRawFd;
    // SAFETY: a connected socket and a well-formed msghdr.
    let sent = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, 0) };
    assert_eq!(sent, message.len() as isize);
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn descriptors_passed_with_messages_are_closed_not_kept() {
    for receive in ["io_uring", "recvmmsg"] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let cfg = config(dir.path(), &format!("SyslogReceive = \"{receive}\"\n"));
        let eventd = Eventd::start(&data, Some(&cfg));
        let socket = data.join("run/syslog.sock");
        send_with_fd(&socket, b"<13>warmup: first", 0);
        wait_for_events(&data, 1);
        let before = open_fds(eventd.child.id());
        let file = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsRawFd;
        for i in 0..200 {
            send_with_fd(
                &socket,
                format!("<13>fdtest: {i}").as_bytes(),
                file.as_raw_fd(),
            );
        }
        wait_for_events(&data, 201);
        let after = open_fds(eventd.child.id());
        assert!(
            after <= before + 2,
            "{receive}: {before} descriptors before, {after} after"
        );
        eventd.stop();
    }
}

#[test]
fn a_short_line_on_an_open_stream_is_stored_without_waiting_for_more() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let mut s = UnixStream::connect(data.join("run/syslog-stream.sock")).unwrap();
    s.write_all(b"<13>a: x\n").unwrap();
    // The connection stays open: the line is framed by its newline alone.
    wait_for_events(&data, 1);
    assert_eq!(rows(&data)[0].5, "x");
    drop(s);
    eventd.stop();
}

#[test]
fn another_daemons_live_socket_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let theirs = dir.path().join("dev-log");
    let _other = UnixDatagram::bind(&theirs).unwrap();
    let cfg = config(
        dir.path(),
        &format!("SyslogSocket = \"{}\"\n", theirs.display()),
    );
    let (mut cmd, log) = command(&data, Some(&cfg), &[]);
    let status = cmd.status().unwrap();
    assert_eq!(status.code(), Some(1));
    let log = read(&log);
    assert!(
        log.contains("dev-log") && log.contains("another process listens on it"),
        "{log}"
    );
    assert!(theirs.exists(), "their socket is still there");
}
