//! Bounds on what clients can make the daemon hold, against a real
//! `eventd` over its real sockets: a store with many gaps queried page by
//! page, floods of connections on the query socket and the metrics
//! listener, one uid's share of the query slots and of the syslog stream
//! socket.
//!
//! The clients are the test process itself (and `eventctl` run as another
//! user, for "another user's query"). Connections "from another
//! user" are made by a thread that changed its own credentials with the raw
//! `setresuid`/`setresgid` system calls (which, unlike the libc wrappers,
//! change only the calling thread): the kernel records the connecting
//! thread's credentials for SO_PEERCRED. These tests need root for that and
//! skip those parts otherwise.
#![cfg(not(loom))]

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A figure from `/proc/PID/status` (`VmRSS` in KiB, `Threads`).
fn status(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// The floods hold a few thousand descriptors in this process.
fn raise_descriptor_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit out pointer, then the same struct read back.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(
        lim.rlim_cur >= 8192,
        "descriptor limit {} too low",
        lim.rlim_cur
    );
}

/// Opens `n` connections to `socket` from a thread running as `uid` (gid
/// the same); the connections outlive the thread. Connections that fail
/// are left out.
fn connect_as(uid: u32, socket: &Path, n: usize) -> Vec<UnixStream> {
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        if uid != 0 {
            // SAFETY: raw system calls with plain integer arguments; they
            // change this thread's credentials only.
            unsafe {
                assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
            }
        }
        (0..n)
            .filter_map(|_| UnixStream::connect(&socket).ok())
            .collect()
    })
    .join()
    .unwrap()
}

/// Sends one byte a second on every descriptor in `fds` until `stop`
/// (errors ignored: the daemon closes most of them).
fn trickle(fds: Vec<i32>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            for &fd in &fds {
                // SAFETY: a one-byte buffer; the descriptors stay open until
                // this thread is joined; MSG_DONTWAIT never blocks.
                unsafe {
                    libc::send(
                        fd,
                        b"{".as_ptr().cast(),
                        1,
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                };
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    })
}

/// Whether the peer closed this connection (checked without blocking).
fn closed_by_peer(s: &UnixStream) -> bool {
    let mut fds = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut fds, 1, 0) };
    if n <= 0 {
        return false;
    }
    let mut buf = [0u8; 4096];
    s.set_nonblocking(true).unwrap();
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// One request on the query socket; every answer line, parsed.
fn ask(socket: &Path, request: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    writeln!(s, "{request}").unwrap();
    BufReader::new(s)
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect()
}

/// Opens the data directory's path to other users (the tests' peers).
fn open_up(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

const GAPS: i64 = 300_000;
const GAP_T0: i64 = 1_800_000_000_000_000_000;

/// `GAPS` gap rows in a shard of their own, with distinct keys.
fn write_gaps(store: &Path) {
    std::fs::create_dir_all(store).unwrap();
    let mut conn = eventd::store::open_shard(&store.join("shard-090.db")).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, \
                 detected_at) VALUES (7, ?1, ?2, ?3, 10, 'overwritten', ?4, ?5)",
            )
            .unwrap();
        for i in 0..GAPS {
            // Two gaps per detection time, on different cpus.
            let detected_at = GAP_T0 + (i / 2) * 1000;
            insert
                .execute([i % 2, i * 10, i * 10 + 9, detected_at - 500, detected_at])
                .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// The (detected_at, cpu, from_seq) of gap `i` in the order written.
fn gap_key(i: i64) -> (i64, u64, u64) {
    (GAP_T0 + (i / 2) * 1000, (i % 2) as u64, (i * 10) as u64)
}

fn key_of(g: &serde_json::Value) -> (i64, u64, u64) {
    (
        g["detected_at"].as_i64().unwrap(),
        g["cpu"].as_u64().unwrap(),
        g["from_seq"].as_u64().unwrap(),
    )
}

/// `eventctl query --output json ARGS`: (gap keys, `--cursor` token).
fn gap_page(data: &Path, args: &[&str]) -> (Vec<(i64, u64, u64)>, Option<String>) {
    let out = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(data)
        .args(["query", "--output", "json"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    let gaps = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v.get("gap").map(key_of))
        .collect();
    let token = stderr
        .lines()
        .find_map(|l| l.strip_prefix("next page: --cursor "))
        .map(str::to_string);
    (gaps, token)
}

/// Runs `cmd` to its end under GNU time: its exit status and its own peak
/// resident size (KiB). `wait4` on a child spawned from this process would
/// not do: Linux carries the spawning process's resident size into the
/// child's peak at exec, so the figure would be at least this test
/// process's, which every test running beside this one moves. time forks
/// from a process of about 1 MiB.
fn max_rss_kib(cmd: &mut Command) -> (std::process::ExitStatus, i64) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut timed = Command::new("/usr/bin/time");
    timed
        .args(["-f", "%M", "-o"])
        .arg(out.path())
        .arg(cmd.get_program());
    timed.args(cmd.get_args());
    let exit = timed
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("/usr/bin/time (Debian's package time; scripts/test-all installs it)");
    let said = std::fs::read_to_string(out.path()).unwrap();
    // The last line: time writes "Command exited with non-zero status" first.
    let kib = said
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("/usr/bin/time wrote {said:?}"));
    (exit, kib)
}

/// Many gaps: `--limit 1` pages hold one gap each and continue, the
/// daemon's memory stays flat over several such queries, paging visits
/// every gap once in order (both orders), and `--offline` is as small.
#[test]
fn gaps_are_paged_with_their_own_cursor_and_memory_stays_flat() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_gaps(&data.join("store"));
    let d = Eventd::start(&data, None);
    let pid = d.child.id();
    let socket = data.join("run/query.sock");
    let rss_start = status(pid, "VmRSS");

    // Four `--limit 1` queries, as in the report: the resident size barely
    // moves, and each page holds one gap.
    let mut rss_max = rss_start;
    let mut pages = Vec::new();
    for _ in 0..4 {
        pages.push(gap_page(&data, &["--limit", "1"]));
        rss_max = rss_max.max(status(pid, "VmRSS"));
    }
    let growth_kib = rss_max - rss_start;
    eprintln!(
        "gaps: eventd VmRSS {rss_start} KiB at start, {rss_max} KiB at most over four \
         --limit 1 queries of {GAPS} gaps (+{growth_kib} KiB)"
    );
    // Loading the 300,000 rows takes far more than this (80 bytes a row
    // in a Vec, plus its reason string: above 30 MiB); paging holds a few
    // rows and the read connections' page caches (2 MiB each at most).
    assert!(
        growth_kib < 16 << 10,
        "eventd grew by {growth_kib} KiB for four one-gap pages"
    );
    for (gaps, token) in pages {
        assert_eq!(gaps, [gap_key(0)]);
        assert!(token.is_some_and(|t| t.contains(':')));
    }

    // `--limit 1` pages continue where the last one stopped, in both orders.
    for reverse in [false, true] {
        let mut args = vec!["--limit".to_string(), "1".to_string()];
        if reverse {
            args.push("--reverse".into());
        }
        let mut seen = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..5 {
            let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
            if let Some(t) = &token {
                a.extend(["--cursor", t]);
            }
            let (gaps, next) = gap_page(&data, &a);
            assert_eq!(gaps.len(), 1, "{a:?}");
            seen.extend(gaps);
            token = next;
            assert!(token.is_some());
        }
        let want: Vec<_> = if reverse {
            (GAPS - 5..GAPS).rev().map(gap_key).collect()
        } else {
            (0..5).map(gap_key).collect()
        };
        assert_eq!(seen, want, "reverse {reverse}");
    }
    // An events-only token of earlier versions still parses (gaps from the
    // first).
    let (gaps, _) = gap_page(&data, &["--limit", "1", "--cursor", "1.0.0.0"]);
    assert_eq!(gaps, [gap_key(0)]);

    // The whole listing, a page at a time through the protocol: every gap
    // exactly once, in order, each page continuing from `gap_cursor`.
    for order in ["oldest_first", "newest_first"] {
        let started = Instant::now();
        let mut after: Option<serde_json::Value> = None;
        let mut next = if order == "oldest_first" { 0 } else { GAPS - 1 };
        let mut pages = 0;
        loop {
            let mut filter = serde_json::json!({ "limit": 5000, "order": order });
            if let Some(a) = &after {
                filter["gaps_after"] = a.clone();
            }
            let answer = ask(
                &socket,
                &serde_json::json!({ "op": "query", "filter": filter }),
            );
            let end = answer.last().unwrap()["end"].clone();
            let gaps: Vec<_> = answer.iter().filter_map(|v| v.get("gap")).collect();
            assert_eq!(end["gaps"].as_u64().unwrap(), gaps.len() as u64);
            assert!(gaps.len() <= 5000);
            for g in &gaps {
                assert_eq!(key_of(g), gap_key(next), "{order}, page {pages}");
                next += if order == "oldest_first" { 1 } else { -1 };
            }
            pages += 1;
            // The token is `detected_at.cpu.from_seq.ring_epoch`.
            let token = end["gap_cursor"].as_str().unwrap();
            let n: Vec<i64> = token.split('.').map(|p| p.parse().unwrap()).collect();
            after = Some(serde_json::json!({
                "detected_at": n[0], "cpu": n[1], "from_seq": n[2], "ring_epoch": n[3]
            }));
            if gaps.is_empty() {
                break;
            }
        }
        let want = if order == "oldest_first" { GAPS } else { -1 };
        assert_eq!(next, want, "{order}: not every gap was listed");
        rss_max = rss_max.max(status(pid, "VmRSS"));
        eprintln!(
            "gaps: {order}: {GAPS} gaps in {pages} pages of 5000 in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let growth_kib = rss_max - rss_start;
    eprintln!("gaps: eventd VmRSS at most {rss_max} KiB after listing every gap twice (+{growth_kib} KiB)");
    assert!(growth_kib < 16 << 10, "eventd grew by {growth_kib} KiB");
    d.stop();

    // Offline runs the same reader in eventctl: one page of gaps costs it
    // no more than a page of none (gaps are detected in 2027; none since
    // 2100).
    let offline_peak = |extra: &[&str]| {
        let mut cmd = Command::new(EVENTCTL);
        cmd.arg("--data-dir")
            .arg(&data)
            .args(["query", "--offline", "--limit", "1", "--output", "json"])
            .args(extra);
        let (exit, rss_kib) = max_rss_kib(&mut cmd);
        assert!(exit.success());
        rss_kib
    };
    let none_kib = offline_peak(&["--since", "2100-01-01T00:00:00Z"]);
    let one_kib = offline_peak(&[]);
    eprintln!(
        "gaps: eventctl --offline --limit 1 peaked at {one_kib} KiB ({none_kib} KiB for a \
         page without gaps)"
    );
    assert!(
        one_kib - none_kib < 8 << 10,
        "eventctl --offline peaked at {one_kib} KiB against {none_kib} KiB"
    );
    let (gaps, token) = gap_page(&data, &["--offline", "--limit", "1"]);
    assert_eq!(gaps, [gap_key(0)]);
    let token = token.unwrap();
    let (gaps, _) = gap_page(&data, &["--offline", "--limit", "1", "--cursor", &token]);
    assert_eq!(gaps, [gap_key(1)]);
}

/// 2,000 connections on the query socket, half from a user who may not
/// read events and half from one who may, half of each trickling a byte a
/// second: no thread is added, memory stays bounded, root's query is
/// answered meanwhile, a trickler is cut off at the request deadline, and
/// once the flood is gone queries run again.
#[test]
fn a_connection_flood_on_the_query_socket_is_bounded() {
    if !root() {
        eprintln!("not root: the flood needs a second user; skipped");
        return;
    }
    raise_descriptor_limit();
    let dir = tempfile::tempdir().unwrap();
    open_up(dir.path());
    let data = dir.path().join("data");
    // The permitted half is another user (a member of the query group):
    // root's own connections are held to the total only.
    let permitted_uid = NOBODY - 1;
    let cfg = config(
        dir.path(),
        &format!("MaxConcurrentQueries = 8\nQueryGroup = \"{permitted_uid}\"\n"),
    );
    let d = Eventd::start(&data, Some(&cfg));
    let pid = d.child.id();
    let socket = data.join("run/query.sock");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    // Settle, then the daemon's own threads and memory.
    let out = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(&data)
        .args(["query", "--limit", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let (threads_start, rss_start) = (status(pid, "Threads"), status(pid, "VmRSS"));

    // A permitted client that trickles a request that never ends.
    let mut slow = UnixStream::connect(&socket).unwrap();
    let slow_since = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let slow_trickle = trickle(vec![slow.as_raw_fd()], stop.clone());

    let denied = connect_as(NOBODY, &socket, 1000);
    let permitted = connect_as(permitted_uid, &socket, 1000);
    assert_eq!((denied.len(), permitted.len()), (1000, 1000));
    let tricklers: Vec<i32> = denied
        .iter()
        .chain(&permitted)
        .step_by(2)
        .map(AsRawFd::as_raw_fd)
        .collect();
    let flood_trickle = trickle(tricklers, stop.clone());

    // While they are held: the threads and the resident size.
    let (mut threads_max, mut rss_max) = (0, 0);
    for _ in 0..10 {
        threads_max = threads_max.max(status(pid, "Threads"));
        rss_max = rss_max.max(status(pid, "VmRSS"));
        std::thread::sleep(Duration::from_millis(200));
    }
    // A legitimate query: answered, never a hang.
    let started = Instant::now();
    let mut q = UnixStream::connect(&socket).unwrap();
    q.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = writeln!(q, r#"{{"op":"query","filter":{{"limit":1}}}}"#);
    // Its last line (before it, eventd's boot marker, the one event).
    let mut reader = BufReader::new(&q);
    let mut line = String::new();
    let v: serde_json::Value = loop {
        line.clear();
        reader
            .read_line(&mut line)
            .expect("no answer within 5 s: the query hung");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v.get("event").is_none() {
            break v;
        }
    };
    let answered_in = started.elapsed();
    eprintln!(
        "query flood: threads {threads_start} before, {threads_max} at most while 2000 \
         connections were held; VmRSS {rss_start} KiB before, {rss_max} KiB at most; a \
         query was answered in {} ms: {}",
        answered_in.as_millis(),
        line.trim()
    );
    assert!(v.get("end").is_some(), "{line}");
    // Bounds in this file leave room for a loaded CI machine (a test beside
    // this one holds thousands of sockets too); what they catch is a query
    // or scrape held up for as long as the flood lasts.
    assert!(answered_in < Duration::from_secs(10), "{answered_in:?}");
    // No thread for a connection before its request is in; one more for
    // slack.
    assert!(
        threads_max <= threads_start + 1,
        "{threads_max} threads (from {threads_start})"
    );
    assert!(
        rss_max < rss_start + (16 << 10),
        "VmRSS {rss_max} KiB (from {rss_start} KiB)"
    );

    // The trickler is cut off at the request deadline (10 s after connecting).
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut answer = String::new();
    BufReader::new(&slow).read_line(&mut answer).unwrap();
    let cut_after = slow_since.elapsed();
    eprintln!(
        "query flood: the trickling client was cut off after {:.1} s: {}",
        cut_after.as_secs_f64(),
        answer.trim()
    );
    assert!(
        answer.contains("bad_request") && answer.contains("10 s"),
        "{answer}"
    );
    assert!(
        cut_after >= Duration::from_millis(9500) && cut_after < Duration::from_secs(20),
        "{cut_after:?}"
    );
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);

    // The refused user got its answer, not a reset.
    let mut line = String::new();
    BufReader::new(&denied[1]).read_line(&mut line).unwrap();
    assert!(line.contains("denied"), "{line}");

    stop.store(true, Ordering::Relaxed);
    slow_trickle.join().unwrap();
    flood_trickle.join().unwrap();
    drop(denied);
    drop(permitted);
    // Once the flood is gone, queries run again.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let answer = ask(
            &socket,
            &serde_json::json!({"op":"query","filter":{"limit":1}}),
        );
        if answer.last().is_some_and(|v| v.get("end").is_some()) {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {answer:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let stats = eventctl_json(&data, "stats");
    let q = &stats["stats"]["queries"];
    eprintln!("query flood: {q}");
    assert!(q["refused_denied"].as_u64().unwrap() >= 1000, "{q}");
    assert!(q["refused_busy"].as_u64().unwrap() >= 900, "{q}");
    d.stop();
}

/// A permitted user who floods the query socket, and one who only wants an
/// answer (both are let in by `QueryGroup = "*"`).
const FLOODER: u32 = NOBODY;
const NEIGHBOUR: u32 = NOBODY - 1;

/// `eventctl query --limit 1` run as `uid` (root when 0): whether it ended
/// with the end of its results, and what it said on stderr.
fn query_as(data: &Path, uid: u32) -> (bool, String) {
    let mut cmd = Command::new(EVENTCTL);
    cmd.arg("--data-dir")
        .arg(data)
        .args(["query", "--limit", "1", "--output", "json"]);
    if uid != 0 {
        as_user(&mut cmd, uid, &[]);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Keeps `n` connections to `socket` open from a thread running as `uid`,
/// opening a new one for each the daemon closes (looked at four times a
/// second), until `stop`; `up` is set once the first `n` are open. The
/// connections open at the stop, and how many were opened in all.
fn hold_open_as(
    uid: u32,
    socket: &Path,
    n: usize,
    up: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<UnixStream>, u64)> {
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: raw system calls with plain integer arguments; they
        // change this thread's credentials only.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
        }
        let mut held: Vec<UnixStream> = (0..n)
            .map(|_| UnixStream::connect(&socket).unwrap())
            .collect();
        let mut opened = n as u64;
        up.store(true, Ordering::Relaxed);
        while !stop.load(Ordering::Relaxed) {
            for s in held.iter_mut() {
                if closed_by_peer(s) {
                    if let Ok(new) = UnixStream::connect(&socket) {
                        *s = new;
                        opened += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        (held, opened)
    })
}

/// What the daemon wrote on `s` before closing it, once it has closed it
/// (`None` while it is open); `got` keeps what was read so far.
fn answer_once_closed(s: &UnixStream, got: &mut Vec<u8>) -> Option<String> {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(_) => return Some(String::from_utf8_lossy(got).into_owned()),
        }
    }
}

/// Waits (a minute at most) until the daemon has closed every one of
/// `streams`: the answer each got.
fn answers_once_all_closed(streams: &[UnixStream]) -> Vec<String> {
    let mut got = vec![Vec::new(); streams.len()];
    let mut answers: Vec<Option<String>> = vec![None; streams.len()];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for (i, s) in streams.iter().enumerate() {
            if answers[i].is_none() {
                answers[i] = answer_once_closed(s, &mut got[i]);
            }
        }
        let open = answers.iter().filter(|a| a.is_none()).count();
        if open == 0 {
            return answers.into_iter().flatten().collect();
        }
        assert!(
            Instant::now() < deadline,
            "{open} of {} connections still open a minute later",
            streams.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One uid holding 2,000 connections that never send a request, opening a
/// new one as fast as the daemon closes one, keeps nobody else from
/// querying: another uid's and root's `eventctl query` are answered
/// meanwhile, the flood gets no thread, and every one of its connections
/// is closed (at once, beyond the uid's share of connections waiting for
/// their request; the others at the request deadline).
#[test]
fn silent_connections_from_one_uid_lock_nobody_out() {
    if !root() {
        eprintln!("not root: the flood needs a second user; skipped");
        return;
    }
    raise_descriptor_limit();
    let dir = tempfile::tempdir().unwrap();
    open_up(dir.path());
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "MaxConcurrentQueries = 8\nQueryGroup = \"*\"\n");
    let d = Eventd::start(&data, Some(&cfg));
    let pid = d.child.id();
    let socket = data.join("run/query.sock");
    let (ok, err) = query_as(&data, NEIGHBOUR);
    assert!(ok, "before the flood: {err}");
    let (threads_start, rss_start) = (status(pid, "Threads"), status(pid, "VmRSS"));

    let (up, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let flood = hold_open_as(FLOODER, &socket, 2000, up.clone(), stop.clone());
    wait_until("the flood's 2000 connections", || {
        up.load(Ordering::Relaxed)
    });
    let (mut threads_max, mut rss_max) = (0, 0);
    let sample = |threads_max: &mut u64, rss_max: &mut u64| {
        *threads_max = (*threads_max).max(status(pid, "Threads"));
        *rss_max = (*rss_max).max(status(pid, "VmRSS"));
    };
    for _ in 0..10 {
        sample(&mut threads_max, &mut rss_max);
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "silent flood: while uid {FLOODER} held 2000 connections: threads \
         {threads_start} before, {threads_max} at most; VmRSS {rss_start} KiB before, \
         {rss_max} KiB at most"
    );
    // While the flood goes on: another uid and root are answered, each time.
    for round in 0..3 {
        for uid in [NEIGHBOUR, 0] {
            let (ok, err) = query_as(&data, uid);
            assert!(ok, "uid {uid}, round {round}, during the flood: {err}");
        }
        sample(&mut threads_max, &mut rss_max);
    }
    stop.store(true, Ordering::Relaxed);
    let (held, opened) = flood.join().unwrap();

    // Every connection of the flood is closed by the daemon, with an
    // answer saying why.
    let answers = answers_once_all_closed(&held);
    let mut at_deadline = 0;
    for a in &answers {
        let v: serde_json::Value =
            serde_json::from_str(a.trim()).unwrap_or_else(|e| panic!("answer {a:?}: {e}"));
        match v["error"]["code"].as_str() {
            Some("busy") => assert!(
                a.contains(&format!("uid {FLOODER}")),
                "a cut connection's answer: {a}"
            ),
            Some("bad_request") => {
                assert!(a.contains("10 s"), "{a}");
                at_deadline += 1;
            }
            _ => panic!("a flood connection was answered {a}"),
        }
    }
    let stats = eventctl_json(&data, "stats");
    let q = &stats["stats"]["queries"];
    eprintln!(
        "silent flood: uid {FLOODER} opened {opened} connections (2000 at a time); \
         threads {threads_start} before, {threads_max} at most; VmRSS {rss_start} KiB \
         before, {rss_max} KiB at most; uid {NEIGHBOUR} and root answered 3 times each; \
         of the last 2000, {at_deadline} were cut at the request deadline, the rest at \
         once; {q}"
    );
    assert!(at_deadline >= 1, "none was left to the deadline");
    // No thread for a connection that has not sent its request; one more
    // for slack (a query of another uid may still be ending).
    assert!(
        threads_max <= threads_start + 1,
        "{threads_max} threads (from {threads_start})"
    );
    assert!(
        rss_max < rss_start + (16 << 10),
        "VmRSS {rss_max} KiB (from {rss_start} KiB)"
    );
    d.stop();
}

/// Opens `n` connections to `socket` from a thread running as `uid`, each
/// sending `request` as soon as it is made (as a client does); nothing is
/// read.
fn requests_as(uid: u32, socket: &Path, n: usize, request: &serde_json::Value) -> Vec<UnixStream> {
    let (socket, request) = (socket.to_path_buf(), request.to_string());
    std::thread::spawn(move || {
        // SAFETY: raw system calls with plain integer arguments; they
        // change this thread's credentials only.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
        }
        (0..n)
            .map(|_| {
                let mut s = UnixStream::connect(&socket).unwrap();
                writeln!(s, "{request}").unwrap();
                s
            })
            .collect()
    })
    .join()
    .unwrap()
}

/// One uid starting as many `--follow` queries as MaxConcurrentQueries,
/// all matching nothing, gets its share of the slots and a `busy` saying
/// so for the rest; another uid and root are still answered; more uids
/// filling the slots leave one for root.
#[test]
fn follows_from_one_uid_leave_slots_for_others() {
    if !root() {
        eprintln!("not root: the share is per uid and needs other users; skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    open_up(dir.path());
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "MaxConcurrentQueries = 8\nQueryGroup = \"*\"\n");
    let d = Eventd::start(&data, Some(&cfg));
    let socket = data.join("run/query.sock");
    let follow = serde_json::json!({
        "op": "query", "follow": true, "filter": { "provider": "matches-nothing" }
    });
    let running = || eventctl_json(&data, "stats")["stats"]["queries"]["running"].clone();
    let refused = || eventctl_json(&data, "stats")["stats"]["queries"]["refused_busy"].clone();

    let follows = requests_as(FLOODER, &socket, 8, &follow);
    // Every follow is running or was refused.
    wait_until("the 8 follows running or refused", || {
        running().as_u64().unwrap() + refused().as_u64().unwrap() == 8
    });
    // Another uid and root are answered.
    for uid in [NEIGHBOUR, 0] {
        let (ok, err) = query_as(&data, uid);
        assert!(ok, "uid {uid}, with uid {FLOODER}'s 8 follows: {err}");
    }
    // The flooder holds its share (MaxConcurrentQueries / 4), and was told
    // why the rest were refused.
    assert_eq!(running(), 2);
    let answers: Vec<String> = follows
        .iter()
        .filter_map(|s| answer_once_closed(s, &mut Vec::new()))
        .collect();
    assert_eq!(answers.len(), 6, "{answers:?}");
    for a in &answers {
        assert!(
            a.contains("busy") && a.contains(&format!("uid {FLOODER} holds its share")),
            "{a}"
        );
    }
    eprintln!(
        "follow flood: uid {FLOODER} runs 2 of its 8 follows; the others: {}",
        answers[0].trim()
    );

    // Three more uids take their shares: 7 slots held, the last kept for
    // root (and eventd's own user, root here too).
    let mut others = Vec::new();
    for uid in [NEIGHBOUR, NEIGHBOUR - 1, NEIGHBOUR - 2] {
        others.extend(requests_as(uid, &socket, 2, &follow));
    }
    wait_until("7 slots held and one refused", || {
        running() == 7 && refused().as_u64().unwrap() == 7
    });
    let kept: Vec<String> = others
        .iter()
        .filter_map(|s| answer_once_closed(s, &mut Vec::new()))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].contains("kept for root"), "{}", kept[0]);
    let (ok, err) = query_as(&data, 0);
    assert!(ok, "root, with 7 of 8 slots held by others: {err}");
    eprintln!(
        "follow flood: the eighth follow of another uid: {}",
        kept[0].trim()
    );

    // The slots come back when the follows go.
    drop(follows);
    drop(others);
    wait_until("every slot back", || running() == 0);
    d.stop();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A scrape: the status line and the body, or the error that ended it.
fn scrape(port: u16, timeout: Duration) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

/// 2,000 connections on the metrics listener, half silent and half
/// trickling a request a byte a second: its threads do not grow, scrapes
/// never hang, and once the flood's connections are closed or timed out a
/// scrape is answered.
#[test]
fn a_connection_flood_on_the_metrics_listener_is_bounded() {
    raise_descriptor_limit();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let cfg = config(
        dir.path(),
        &format!("MetricsListen = \"127.0.0.1:{port}\"\n"),
    );
    let d = Eventd::start(&data, Some(&cfg));
    let pid = d.child.id();
    let (line, body) = scrape(port, Duration::from_secs(5)).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    assert!(body.contains("eventd_queries_running"));
    let (threads_start, rss_start) = (status(pid, "Threads"), status(pid, "VmRSS"));

    let flood: Vec<TcpStream> = (0..2000)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    let flooded = Instant::now();
    assert!(flood.len() >= 1900, "{} connections", flood.len());
    let stop = Arc::new(AtomicBool::new(false));
    let tricklers = flood.iter().step_by(2).map(AsRawFd::as_raw_fd).collect();
    let trickler = trickle(tricklers, stop.clone());
    let (mut threads_max, mut rss_max) = (0, 0);
    let mut during = Vec::new();
    for _ in 0..3 {
        threads_max = threads_max.max(status(pid, "Threads"));
        rss_max = rss_max.max(status(pid, "VmRSS"));
        // A scrape now is answered or closed, within the deadline.
        let started = Instant::now();
        let result = scrape(port, Duration::from_secs(20));
        let took = started.elapsed();
        assert!(took < Duration::from_secs(15), "a scrape took {took:?}");
        during.push(match result {
            Ok((line, _)) => format!("{line} in {} ms", took.as_millis()),
            Err(e) => format!("{e} in {} ms", took.as_millis()),
        });
        threads_max = threads_max.max(status(pid, "Threads"));
    }
    eprintln!(
        "metrics flood: {} connections; threads {threads_start} before, {threads_max} at \
         most; VmRSS {rss_start} KiB before, {rss_max} KiB at most; scrapes during: {during:?}",
        flood.len()
    );
    assert!(
        threads_max <= threads_start,
        "{threads_max} threads (from {threads_start})"
    );
    assert!(
        rss_max < rss_start + (16 << 10),
        "VmRSS {rss_max} KiB (from {rss_start} KiB)"
    );
    // With the flood still open: the connections it got queued time out
    // (5 s from their accept), the others were closed at once, and a
    // scrape is answered again.
    let mut answered_after = None;
    while answered_after.is_none() {
        if let Ok((line, body)) = scrape(port, Duration::from_secs(7)) {
            if line.starts_with("HTTP/1.1 200") && body.contains("eventd_queries_running") {
                answered_after = Some(flooded.elapsed());
            }
        }
        assert!(
            flooded.elapsed() < Duration::from_secs(30),
            "no scrape answered while the flood was held"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "metrics flood: a scrape answered {} ms after the flood connected, flood still open",
        answered_after.unwrap_or_default().as_millis()
    );
    stop.store(true, Ordering::Relaxed);
    trickler.join().unwrap();
    drop(flood);
    let started = Instant::now();
    loop {
        if let Ok((line, body)) = scrape(port, Duration::from_secs(7)) {
            if line.starts_with("HTTP/1.1 200") && body.contains("eventd_queries_running") {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no scrape answered after the flood"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "metrics flood: a scrape answered {} ms after the flood was closed",
        started.elapsed().as_millis()
    );
    d.stop();
}

/// One uid opening 300 stream connections holds 32; the rest are closed at
/// accept and counted; another uid still connects and its messages are
/// stored.
#[test]
fn one_uid_gets_its_share_of_the_syslog_stream_socket() {
    if !root() {
        eprintln!("not root: the share is per uid and needs other users; skipped");
        return;
    }
    raise_descriptor_limit();
    let dir = tempfile::tempdir().unwrap();
    open_up(dir.path());
    let data = dir.path().join("data");
    let d = Eventd::start(&data, None);
    let socket = data.join("run/syslog-stream.sock");

    let greedy = connect_as(NOBODY, &socket, 300);
    assert_eq!(greedy.len(), 300);
    // The accept thread closes what is over the share as it goes.
    let held = || greedy.iter().filter(|s| !closed_by_peer(s)).count();
    let deadline = Instant::now() + Duration::from_secs(20);
    while held() > 32 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let held = held();
    eprintln!("syslog share: uid {NOBODY} opened 300 stream connections, holds {held}");
    assert_eq!(held, 32);
    let stats = eventctl_json(&data, "stats");
    assert_eq!(
        stats["stats"]["syslog"]["rejected_connections_share"], 268,
        "{stats}"
    );

    // Another uid connects, and its messages are stored.
    let mut other = connect_as(NOBODY - 1, &socket, 1);
    let mut s = other.pop().unwrap();
    for i in 0..3 {
        writeln!(s, "<13>sharetest: message {i} from another uid").unwrap();
    }
    drop(s);
    wait_for_events(&data, 3);
    let out = eventctl_text(
        &data,
        &["query", "--provider", "sharetest", "--output", "json"],
    );
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["uid"], NOBODY - 1);
        assert_eq!(
            r["message"].as_str().unwrap(),
            format!("message {i} from another uid")
        );
    }
    let metrics = eventctl_text(&data, &["stats", "--prometheus"]);
    assert!(
        metrics.contains("eventd_syslog_rejected_total{reason=\"connection_share\"} 268"),
        "{metrics}"
    );
    drop(greedy);
    d.stop();
}
