//! Faults from outside the daemon, with real `eventd` and `eventctl`
//! processes and real filesystems: a full disk under the rings and under the
//! store, ring files truncated, shrunk, replaced or scribbled while the
//! daemon and its producers run, sparse ring files, and syslog messages
//! against a flood of other producers.
//!
//! A test that needs a small filesystem runs its body in a copy of this test
//! binary started under `unshare --mount` (a private mount namespace, so the
//! tmpfs it mounts is seen by nobody else and goes away with it); see
//! [`with_small_tmpfs`].
//!
//! Every test that stores events checks the store with [`check_sequences`]:
//! for each ring epoch and cpu, every sequence number from 1 to the highest
//! one seen is either exactly one stored event or inside exactly one stored
//! gap.
#![cfg(not(loom))]

mod common;
use common::*;

use rand::Rng;
use rusqlite::{Connection, OpenFlags};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The cpu value eventd stores with the events of its own syslog ring.
const SYSLOG_CPU: i64 = 1 << 20;
/// A ring file of the default size: a 512-byte header and 4 MiB of pages.
const DEFAULT_RING_FILE_BYTES: u64 = 512 + (4 << 20);

// ---------------------------------------------------------------------------
// A small filesystem in a private mount namespace.

/// Set in the copy of the test binary that runs under `unshare`: the
/// directory the test works in (on the ordinary disk).
const TMPFS_CHILD_DIR: &str = "EVENTD_FAULTS_TMPFS_DIR";

/// Runs `body(dir, small)`, where `dir` is a fresh directory on the ordinary
/// disk and `small` a tmpfs of `size` bytes (mount's `size=` syntax) mounted
/// inside it.
///
/// The test binary starts itself again, under `unshare --mount
/// --propagation private`, for exactly the test named `test`, with
/// [`TMPFS_CHILD_DIR`] set; that copy mounts the tmpfs, runs the body and
/// exits. This process asserts that the copy ran that one test and passed,
/// and shows its output either way.
fn with_small_tmpfs(test: &str, size: &str, body: impl FnOnce(&Path, &Path)) {
    if let Some(dir) = std::env::var_os(TMPFS_CHILD_DIR) {
        let dir = PathBuf::from(dir);
        let small = dir.join("small");
        std::fs::create_dir(&small).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode=0755"))
            .arg("tmpfs")
            .arg(&small)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs failed: {status}");
        body(&dir, &small);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(TMPFS_CHILD_DIR, dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{test} in its own mount namespace: {}\n--- its stdout ---\n{stdout}\n--- its stderr \
         ---\n{stderr}",
        out.status
    );
    eprint!("{stderr}");
}

// ---------------------------------------------------------------------------
// Producers pinned to a CPU (so the test knows which ring they write into).

/// Makes `cmd` run on `cpu` only: `eventctl emit` writes into the ring of
/// the CPU it runs on.
fn eventctl_emit_on(data: &Path, cpu: usize, provider: &str) -> Command {
    let mut cmd = Command::new(EVENTCTL);
    pin(&mut cmd, cpu);
    cmd.arg("--data-dir")
        .arg(data)
        .args(["emit", "--provider", provider]);
    cmd
}

/// One `eventctl emit` of `message` on `cpu`; its output, whatever it did.
fn emit_on(data: &Path, cpu: usize, message: &str) -> Output {
    eventctl_emit_on(data, cpu, "faults")
        .arg(message)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `eventctl emit --stdin` on `cpu`, fed `lines`; its output.
fn emit_lines_on(data: &Path, cpu: usize, lines: &[String]) -> Output {
    let mut child = eventctl_emit_on(data, cpu, "faults")
        .arg("--stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in lines {
        writeln!(stdin, "{line}").unwrap();
    }
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// Emits on `cpu` once every 100 ms (a new message each time) until an
/// emit succeeds; fails if none did within `within` of `since`. Returns the
/// message that was written and what the failed attempts said.
/// How long a damaged ring may take to take emits again. A wedged ring is
/// given up after two idle health checks (1-2.5 s), and each try is an
/// `eventctl` process started on a CPU that a test beside this one may be
/// flooding, so the bound leaves room for a loaded CI machine; the time it
/// took is printed.
const RECOVERY: Duration = Duration::from_secs(20);

fn emit_until_ok(
    data: &Path,
    cpu: usize,
    tag: &str,
    since: Instant,
    within: Duration,
) -> (String, Vec<String>) {
    let mut failures = Vec::new();
    for attempt in 0.. {
        let message = format!("{tag}-{attempt}");
        let out = emit_on(data, cpu, &message);
        if out.status.success() {
            return (message, failures);
        }
        failures.push(String::from_utf8_lossy(&out.stderr).trim().to_string());
        assert!(
            since.elapsed() < within,
            "no emit on cpu {cpu} succeeded within {within:?}; {} failed, the first and \
             last said:\n{}\n{}",
            failures.len(),
            failures[0],
            failures[failures.len() - 1]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    unreachable!("the loop returns or fails")
}

/// An `eventctl emit --stdin` child on one CPU, fed numbered lines by a
/// thread of the test until it is told to stop (or the child stops
/// reading).
struct Feeder {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
    child: std::process::Child,
}

impl Feeder {
    /// Feeds `tag-N` lines, `lines_per_ms` of them every millisecond or
    /// so.
    fn start(data: &Path, cpu: usize, tag: &str, lines_per_ms: u64) -> Feeder {
        let mut child = eventctl_emit_on(data, cpu, tag)
            .arg("--stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let tag = tag.to_string();
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut sent = 0u64;
            'feed: while !stopped.load(Ordering::Relaxed) {
                for _ in 0..lines_per_ms {
                    // A child that died (the old code: SIGBUS) breaks the
                    // pipe; the test asserts on its status afterwards.
                    if writeln!(stdin, "{tag}-{sent}").is_err() {
                        break 'feed;
                    }
                    sent += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            sent
        });
        Feeder {
            stop,
            thread,
            child,
        }
    }

    /// How the child ended, if it did.
    fn ended(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Stops feeding, closes the child's input and waits for it: the lines
    /// fed, its exit status and what it said.
    fn finish(self) -> (u64, ExitStatus, String) {
        self.stop.store(true, Ordering::Relaxed);
        let sent = self.thread.join().unwrap();
        let out = self.child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
        (sent, out.status, said)
    }
}

// ---------------------------------------------------------------------------
// Ring files, word by word (docs/design/rings.md).

const H_MAGIC: usize = 0;
const H_GEOMETRY: usize = 3;
const H_RESERVE: usize = 16;
const HEADER_WORDS: usize = 64;
const TICKET_MASK: u64 = (1 << 40) - 1;
/// Reserve-word offsets: a page closed to new reservations, and a ring the
/// daemon gave up.
const OFFSET_CLOSED: u64 = 8191;
const OFFSET_RETIRED: u64 = 8190;

/// A ring's reserve word, unpacked (ticket 24..64, offset 11..24, count
/// 1..11, WAIT 0).
#[derive(Debug, Clone, Copy)]
struct Reserve {
    ticket: u64,
    offset: u64,
    count: u64,
    wait: bool,
}

impl Reserve {
    fn unpack(word: u64) -> Reserve {
        Reserve {
            ticket: word >> 24,
            offset: (word >> 11) & 0x1FFF,
            count: (word >> 1) & 0x3FF,
            wait: word & 1 != 0,
        }
    }

    fn pack(self) -> u64 {
        ((self.ticket & TICKET_MASK) << 24)
            | (self.offset << 11)
            | (self.count << 1)
            | u64::from(self.wait)
    }
}

/// A ring file opened for reading and writing words, as a hostile producer
/// would (plain `pread`/`pwrite` on the file the daemon has mapped).
struct RingFile(std::fs::File);

impl RingFile {
    fn open(path: &Path) -> RingFile {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        RingFile(file)
    }

    fn word(&self, index: usize) -> u64 {
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, index as u64 * 8).unwrap();
        u64::from_le_bytes(b)
    }

    fn set(&self, index: usize, word: u64) {
        self.0
            .write_all_at(&word.to_le_bytes(), index as u64 * 8)
            .unwrap();
    }

    /// Word index of the meta word of page `ticket`.
    fn meta_index(&self, ticket: u64) -> usize {
        let geometry = self.word(H_GEOMETRY);
        let (page_size, page_count) = (geometry & 0xFFFF_FFFF, geometry >> 32);
        HEADER_WORDS + ((ticket & (page_count - 1)) * (page_size / 8)) as usize
    }
}

fn ring_path(data: &Path, cpu: usize) -> PathBuf {
    data.join(format!("kmes/cpu-{cpu:03}.ring"))
}

/// Asserts that the file at `path` is a whole ring of the default size: its
/// length and its magic.
fn assert_whole_ring(path: &Path) {
    let meta = std::fs::metadata(path).unwrap();
    assert!(
        meta.len() >= DEFAULT_RING_FILE_BYTES,
        "{}: {} bytes",
        path.display(),
        meta.len()
    );
    let magic = RingFile::open(path).word(H_MAGIC);
    assert_eq!(magic.to_le_bytes(), *b"KMESRNG1", "{}", path.display());
}

// ---------------------------------------------------------------------------
// The daemon's reports and the store.

fn stats(data: &Path) -> serde_json::Value {
    eventctl_json(data, "stats")["stats"].clone()
}

/// `stats.rings[]` of the ring with `cpu`.
fn ring_stats(data: &Path, cpu: usize) -> serde_json::Value {
    let stats = stats(data);
    let rings = stats["rings"].as_array().cloned().unwrap_or_default();
    rings
        .into_iter()
        .find(|r| r["cpu"].as_u64() == Some(cpu as u64))
        .unwrap_or_else(|| panic!("no ring of cpu {cpu} in stats: {stats}"))
}

fn count(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Every shard file in `store`, opened read-only.
fn open_shards(store: &Path) -> Vec<(PathBuf, Connection)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(store)
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

/// The sum over all shards of one integer query.
fn sum_query(store: &Path, sql: &str) -> i64 {
    open_shards(store)
        .iter()
        .map(|(_, c)| c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap())
        .sum()
}

/// The messages of every stored event of `provider`.
fn messages_of(store: &Path, provider: &str) -> Vec<String> {
    let mut all = Vec::new();
    for (_, c) in open_shards(store) {
        let mut stmt = c
            .prepare("SELECT message FROM events WHERE provider = ?1")
            .unwrap();
        all.extend(
            stmt.query_map([provider], |r| r.get::<_, String>(0))
                .unwrap()
                .map(|r| r.unwrap()),
        );
    }
    all
}

fn stored(store: &Path, message: &str) -> bool {
    open_shards(store).iter().any(|(_, c)| {
        c.query_row(
            "SELECT count(*) FROM events WHERE message = ?1",
            [message],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            > 0
    })
}

fn wait_for_message(store: &Path, message: &str) {
    wait_until(&format!("{message:?} in the store"), || {
        stored(store, message)
    });
}

/// What [`check_sequences`] found.
#[derive(Debug, Default)]
struct Sequences {
    /// Highest sequence number covered, per (ring epoch, cpu).
    highest: BTreeMap<(i64, i64), i64>,
    events: u64,
    /// Gap rows and what they lost, per reason.
    gaps: BTreeMap<String, (u64, u64)>,
}

impl Sequences {
    fn epochs_of(&self, cpu: i64) -> usize {
        self.highest.keys().filter(|(_, c)| *c == cpu).count()
    }

    fn lost(&self, reason: &str) -> u64 {
        self.gaps.get(reason).map_or(0, |g| g.1)
    }
}

/// Checks the store's accounting: for each (ring epoch, cpu), every
/// sequence number from 1 to the highest one in an event or a gap is
/// covered exactly once, by one event row or by one gap's `from_seq..=
/// to_seq`. A gap's `lost` is its length, except for `dropped` gaps, which
/// take one sequence number (the report's) and count the messages dropped
/// before they reached the ring.
fn check_sequences(store: &Path) -> Sequences {
    let mut found = Sequences::default();
    let mut covered = common::Covered::new();
    for (path, c) in open_shards(store) {
        let mut stmt = c
            .prepare("SELECT ring_epoch, cpu, seq FROM events")
            .unwrap();
        for row in stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
            .unwrap()
        {
            let (epoch, cpu, seq) = row.unwrap();
            covered.entry((epoch, cpu)).or_default().push((seq, seq));
            found.events += 1;
        }
        let mut stmt = c
            .prepare("SELECT ring_epoch, cpu, from_seq, to_seq, lost, reason FROM gaps")
            .unwrap();
        for row in stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, String>(5)?,
                ))
            })
            .unwrap()
        {
            let (epoch, cpu, from, to, lost, reason) = row.unwrap();
            assert!(
                from >= 1 && to >= from,
                "{}: gap {from}..={to}",
                path.display()
            );
            if reason == "dropped" {
                assert_eq!(from, to, "{}: dropped gap {from}..={to}", path.display());
            } else {
                assert_eq!(lost, to - from + 1, "{}: {reason} gap", path.display());
            }
            covered.entry((epoch, cpu)).or_default().push((from, to));
            let entry = found.gaps.entry(reason).or_default();
            entry.0 += 1;
            entry.1 += lost as u64;
        }
    }
    found.highest = common::assert_covered(&store.display().to_string(), covered);
    found
}

/// Waits at most `timeout` for `child` to exit; kills it and fails if it
/// does not.
fn wait_exit(child: &mut std::process::Child, timeout: Duration, log: &Path) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("eventd still running after {timeout:?}:\n{}", read(log));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_alive(eventd: &mut Eventd) {
    if let Some(status) = eventd.child.try_wait().unwrap() {
        panic!("eventd died ({status}):\n{}", read(&eventd.log));
    }
}

// ---------------------------------------------------------------------------
// 1. A full disk under the rings.

/// With the KMES directory on a 1 MiB tmpfs, no 4 MiB ring can be made:
/// eventd says which file, that it cannot allocate it and why, and exits
/// with status 1. (A ring whose blocks were not allocated would fault,
/// SIGBUS, the first time a page past the disk's room is touched.)
#[test]
fn ring_creation_on_a_full_disk_is_a_clear_error_not_sigbus() {
    with_small_tmpfs(
        "ring_creation_on_a_full_disk_is_a_clear_error_not_sigbus",
        "1M",
        |dir, small| {
            let data = dir.join("data");
            let kmes = small.join("kmes");
            let cfg = config(dir, &format!("KmesDir = \"{}\"\n", kmes.display()));
            let (mut cmd, log) = command(&data, Some(&cfg), &[]);
            let mut child = cmd.spawn().unwrap();
            let status = wait_exit(&mut child, Duration::from_secs(30), &log);
            let log = read(&log);
            assert_eq!(status.signal(), None, "eventd killed by a signal:\n{log}");
            assert_eq!(status.code(), Some(1), "{log}");
            let ring = kmes.join("cpu-000.ring");
            for needle in [
                ring.to_str().unwrap(),
                "cannot allocate",
                "No space left on device",
            ] {
                assert!(log.contains(needle), "{needle:?} not in the log:\n{log}");
            }
            // Neither a half-made ring nor the temporary file it was being
            // built in is left behind (the lock file may be).
            let left: Vec<String> = std::fs::read_dir(&kmes)
                .map(|d| {
                    d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .filter(|name| name.contains("ring"))
                        .collect()
                })
                .unwrap_or_default();
            assert!(left.is_empty(), "left in {}: {left:?}", kmes.display());
            eprintln!(
                "eventd exited {status}; its last line: {}",
                log.lines().last().unwrap_or("")
            );
        },
    );
}

// ---------------------------------------------------------------------------
// 2 and 3. Ring files truncated, shrunk or replaced under the running daemon.

/// Both CPU rings truncated to nothing while two producers write into them
/// (and a third bursts into cpu 0's, faster than its drain reads, so that
/// the ring usually goes with events unread: a `ring_lost` gap): nobody
/// dies of SIGBUS, the daemon gives each ring up and makes it anew, the
/// producers go on in the new rings, and the store accounts for every
/// sequence number of every epoch.
#[test]
fn rings_truncated_under_the_daemon_and_its_producers_are_made_anew() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = data.join("store");
    let mut eventd = Eventd::start(&data, None);
    let mut feeders: Vec<Feeder> = (0..2)
        .map(|cpu| Feeder::start(&data, cpu, &format!("trunc{cpu}"), 5))
        .collect();
    // Both rings hold stored events before they go (each is to show two
    // epochs at the end), however slowly the feeders start.
    let fed_at = Instant::now();
    while (0..2).any(|cpu| messages_of(&store, &format!("trunc{cpu}")).is_empty()) {
        assert!(
            fed_at.elapsed() < Duration::from_secs(60),
            "the feeders' first events were not stored"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A burst on cpu 0 just before the truncation, faster than the drain
    // reads, so that the ring goes while it holds events not read yet.
    let burst = {
        let data = data.clone();
        std::thread::spawn(move || {
            let lines: Vec<String> = (0..100_000).map(|i| format!("burst-{i}")).collect();
            emit_lines_on(&data, 0, &lines)
        })
    };
    std::thread::sleep(Duration::from_millis(400));
    let status = Command::new("truncate")
        .args(["-s", "0"])
        .arg(ring_path(&data, 0))
        .arg(ring_path(&data, 1))
        .status()
        .unwrap();
    assert!(status.success());
    let truncated_at = Instant::now();
    // The feeding goes on for a few seconds after the truncation; whatever
    // dies meanwhile is noted (all of it, for the failure's message).
    let mut dead: Vec<Option<ExitStatus>> = vec![None; 3];
    while truncated_at.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(100));
        for (cpu, f) in feeders.iter_mut().enumerate() {
            dead[cpu] = dead[cpu].or_else(|| f.ended());
        }
        dead[2] = dead[2].or_else(|| eventd.child.try_wait().unwrap());
    }
    let names = ["the producer on cpu 0", "the producer on cpu 1", "eventd"];
    let died: Vec<String> = dead
        .iter()
        .zip(names)
        .filter_map(|(status, name)| Some(format!("{name}: {}", (*status)?)))
        .collect();
    assert!(
        died.is_empty(),
        "died after the truncation: {}\n{}",
        died.join("; "),
        read(&eventd.log)
    );
    for cpu in 0..2 {
        wait_until(&format!("cpu {cpu}'s ring replaced"), || {
            count(&ring_stats(&data, cpu)["replacements"]) >= 1
        });
    }
    let burst = burst.join().unwrap();
    assert_eq!(
        burst.status.signal(),
        None,
        "the burst's producer: {burst:?}"
    );
    let mut fed = Vec::new();
    for (cpu, f) in feeders.into_iter().enumerate() {
        let (sent, status, said) = f.finish();
        // Lines that met a gone ring are reported, not fatal.
        assert_eq!(
            status.signal(),
            None,
            "the producer on cpu {cpu} was killed: {status} {said}"
        );
        assert!(
            status.success() || (status.code() == Some(1) && said.contains("events not written")),
            "the producer on cpu {cpu}: {status} {said}"
        );
        fed.push((sent, status.code(), said));
    }
    // Events emitted after the replacement are stored.
    for cpu in 0..2 {
        let marker = format!("after-truncation-{cpu}");
        let out = emit_on(&data, cpu, &marker);
        assert!(out.status.success(), "{out:?}");
        wait_for_message(&store, &marker);
        assert_whole_ring(&ring_path(&data, cpu));
    }
    assert_alive(&mut eventd);
    let log = read(&eventd.log);
    assert!(log.contains("ring given up"), "{log}");
    assert!(log.contains("its file was truncated under eventd"), "{log}");
    let replacements: Vec<u64> = (0..2)
        .map(|cpu| count(&ring_stats(&data, cpu)["replacements"]))
        .collect();
    eventd.stop();
    let found = check_sequences(&store);
    for cpu in 0..2 {
        assert!(found.epochs_of(cpu) >= 2, "cpu {cpu}: {found:?}");
    }
    let stored_fed: usize = (0..2)
        .map(|cpu| messages_of(&store, &format!("trunc{cpu}")).len())
        .sum();
    eprintln!(
        "fed {fed:?}; stored {stored_fed} of them; burst: {:?}, {} stored; replacements \
         {replacements:?}; {found:?}",
        String::from_utf8_lossy(&burst.stderr).trim(),
        messages_of(&store, "faults").len()
    );
}

/// One ring file shrunk to half its size, another replaced by a file that
/// is no ring (renamed over its name): each drain notices within a couple
/// of seconds and makes a new ring, and emits work again.
#[test]
fn a_ring_shrunk_to_half_or_replaced_by_another_file_is_made_anew() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = data.join("store");
    let mut eventd = Eventd::start(&data, None);
    for cpu in 0..2 {
        let first = format!("before-{cpu}");
        assert!(emit_on(&data, cpu, &first).status.success());
        wait_for_message(&store, &first);
    }
    let status = Command::new("truncate")
        .args(["-s", "2M"])
        .arg(ring_path(&data, 0))
        .status()
        .unwrap();
    assert!(status.success());
    let shrunk_at = Instant::now();
    let other = dir.path().join("other");
    std::fs::write(&other, "not a ring\n".repeat(100_000)).unwrap();
    let status = Command::new("mv")
        .arg(&other)
        .arg(ring_path(&data, 1))
        .status()
        .unwrap();
    assert!(status.success());
    let replaced_at = Instant::now();
    // Both rings are retried at the same time, each until it works again.
    let retry = |cpu: usize, tag: &'static str, since: Instant| {
        let data = data.clone();
        std::thread::spawn(move || {
            let (ok, failures) = emit_until_ok(&data, cpu, tag, since, RECOVERY);
            (ok, failures, since.elapsed())
        })
    };
    let shrunk = retry(0, "after-shrink", shrunk_at);
    let replaced = retry(1, "after-replace", replaced_at);
    // A retry thread's failure is this test's.
    let joined = |t: JoinHandle<_>| t.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
    let (shrunk_ok, shrunk_failures, shrunk_took) = joined(shrunk);
    let (replaced_ok, replaced_failures, replaced_took) = joined(replaced);
    wait_for_message(&store, &shrunk_ok);
    wait_for_message(&store, &replaced_ok);
    for cpu in 0..2 {
        assert!(count(&ring_stats(&data, cpu)["replacements"]) >= 1);
        assert_whole_ring(&ring_path(&data, cpu));
    }
    assert_alive(&mut eventd);
    let log = read(&eventd.log);
    assert!(log.contains("its file was truncated under eventd"), "{log}");
    assert!(log.contains("another file was put at its name"), "{log}");
    eventd.stop();
    let found = check_sequences(&store);
    for cpu in 0..2 {
        assert!(found.epochs_of(cpu) >= 2, "cpu {cpu}: {found:?}");
    }
    eprintln!(
        "shrunk: {} failed emits, ok by {:?} ({:?}); replaced: {} failed, ok by {:?} ({:?})",
        shrunk_failures.len(),
        shrunk_took,
        shrunk_failures.last(),
        replaced_failures.len(),
        replaced_took,
        replaced_failures.last()
    );
}

// ---------------------------------------------------------------------------
// 4. Scribbled rings.

/// What a hostile producer writes into cpu 0's ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scribble {
    /// The reserve word names a closed page (a far-off ticket) whose meta
    /// word does not hold it: no producer can open the next page.
    ClosedReserveWord,
    /// The meta word of the page after the producers' current one: once
    /// that page is full, no producer can open the next one.
    NextPageMeta,
    /// The header's magic: new producers cannot open the ring.
    Magic,
    /// The reserve word's offset set to RETIRED, the daemon's own mark of
    /// a ring it gave up.
    Retired,
}

/// Scribbles `kind` into cpu 0's ring of a running daemon; then an emit on
/// cpu 0 once every 100 ms must succeed within 5 s and be stored, the log
/// and stats must say what happened, and after a restart emits must still
/// work.
fn a_scribbled_ring_does_not_stay_unusable(kind: Scribble) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = data.join("store");
    let mut eventd = Eventd::start(&data, None);
    assert!(emit_on(&data, 0, "warm-up").status.success());
    wait_for_message(&store, "warm-up");
    let ring = RingFile::open(&ring_path(&data, 0));
    let scribbled_at = Instant::now();
    let reserve = Reserve::unpack(ring.word(H_RESERVE));
    match kind {
        Scribble::ClosedReserveWord => {
            let far = rand::rng().random_range(1_000..1_000_000);
            let scribbled = Reserve {
                ticket: (reserve.ticket + far) & TICKET_MASK,
                offset: OFFSET_CLOSED,
                ..reserve
            };
            ring.set(H_RESERVE, scribbled.pack());
        }
        Scribble::NextPageMeta => {
            ring.set(ring.meta_index(reserve.ticket + 1), 0x5A5A_5A5A_5A5A_5A5A);
            // Fill the current page (about 220 of these records fit one
            // 16 KiB page), so that producers need the next one.
            let fill: Vec<String> = (0..1000).map(|i| format!("fill-{i:05}")).collect();
            let out = emit_lines_on(&data, 0, &fill);
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && said.contains("contended"),
                "the full page did not wedge the ring: {out:?}"
            );
        }
        Scribble::Magic => ring.set(H_MAGIC, u64::from_le_bytes(*b"SCRIBBLE")),
        Scribble::Retired => {
            let scribbled = Reserve {
                offset: OFFSET_RETIRED,
                ..reserve
            };
            ring.set(H_RESERVE, scribbled.pack());
        }
    }
    let first = emit_on(&data, 0, "right-after");
    let first_said = String::from_utf8_lossy(&first.stderr).trim().to_string();
    if matches!(kind, Scribble::ClosedReserveWord | Scribble::NextPageMeta) {
        assert!(
            !first.status.success() && first_said.contains("contended"),
            "{first:?}"
        );
    }
    let (message, failures) = emit_until_ok(&data, 0, "retry", scribbled_at, RECOVERY);
    let took = scribbled_at.elapsed();
    wait_for_message(&store, &message);
    assert_alive(&mut eventd);
    let log = read(&eventd.log);
    let ring0 = ring_stats(&data, 0);
    let (replacements, repairs) = (
        count(&ring0["replacements"]),
        count(&ring0["header_repairs"]),
    );
    match kind {
        Scribble::ClosedReserveWord | Scribble::NextPageMeta => {
            assert!(log.contains("ring given up"), "{log}");
            assert!(log.contains("producers cannot reserve in it"), "{log}");
            assert!(replacements >= 1, "{ring0}");
        }
        Scribble::Magic => {
            assert!(log.contains("ring header was scribbled"), "{log}");
            assert!(repairs >= 1, "{ring0}");
            assert_eq!(replacements, 0, "mended in place: {ring0}");
        }
        Scribble::Retired => {
            // The reader takes the mark off (it closes the page instead),
            // so the ring goes on without being replaced.
            assert_eq!(replacements, 0, "{ring0}");
        }
    }
    eventd.stop();
    let eventd = Eventd::start(&data, None);
    let (after, _) = emit_until_ok(&data, 0, "after-restart", Instant::now(), RECOVERY);
    wait_for_message(&store, &after);
    eventd.stop();
    let found = check_sequences(&store);
    eprintln!(
        "{kind:?}: first emit said {first_said:?}; {} failed retries (last: {:?}); ok after \
         {took:?}; replacements {replacements}, header repairs {repairs}; gaps {:?}",
        failures.len(),
        failures.last(),
        found.gaps
    );
}

#[test]
fn a_reserve_word_naming_a_closed_unopenable_page_does_not_wedge_the_ring_for_good() {
    a_scribbled_ring_does_not_stay_unusable(Scribble::ClosedReserveWord);
}

#[test]
fn a_scribbled_meta_word_of_the_next_page_does_not_wedge_the_ring_for_good() {
    a_scribbled_ring_does_not_stay_unusable(Scribble::NextPageMeta);
}

#[test]
fn a_scribbled_magic_does_not_keep_producers_out_for_good() {
    a_scribbled_ring_does_not_stay_unusable(Scribble::Magic);
}

#[test]
fn a_retired_mark_written_by_a_producer_does_not_turn_producers_away_for_good() {
    a_scribbled_ring_does_not_stay_unusable(Scribble::Retired);
}

// ---------------------------------------------------------------------------
// 4b. Scribbled page words, and rings replaced under a producer while eventd
// was stopped: what a producer was told went in is stored or counted.

/// What a feeder's `eventctl emit --stdin` reported at its end: how many of
/// its lines it was told were not written (each refused before it got a
/// sequence number: the ring was gone, retired or busy).
fn not_written(status: ExitStatus, said: &str) -> u64 {
    if status.success() {
        return 0;
    }
    assert_eq!(status.code(), Some(1), "{said}");
    said.split(" of ")
        .next()
        .and_then(|n| n.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {said:?}"))
}

/// Events of `provider` stored, and the events lost on `cpu` as the gap
/// rows count them (every reason, every epoch).
fn stored_and_lost(store: &Path, provider: &str, cpu: i64) -> (u64, u64) {
    let stored = messages_of(store, provider).len() as u64;
    let lost = sum_query(
        store,
        &format!("SELECT coalesce(sum(lost), 0) FROM gaps WHERE cpu = {cpu}"),
    ) as u64;
    (stored, lost)
}

/// The crash-exact promise for one feeder that was the only producer on
/// `cpu`: once it has stopped, every line it was told went in is stored once
/// or counted in a gap (waited for, as the drain catches up), and the
/// sequences of every epoch are covered exactly once. Stops `eventd`.
fn assert_every_line_accounted(
    eventd: Eventd,
    store: &Path,
    feeder: Feeder,
    tag: &str,
    cpu: i64,
) -> Sequences {
    let (sent, status, said) = feeder.finish();
    let refused = not_written(status, &said);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut stored, mut lost) = stored_and_lost(store, tag, cpu);
    while stored + lost < sent - refused && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        (stored, lost) = stored_and_lost(store, tag, cpu);
    }
    eventd.stop();
    let found = check_sequences(store);
    (stored, lost) = stored_and_lost(store, tag, cpu);
    eprintln!(
        "{tag}: fed {sent}, refused {refused} ({said:?}), stored {stored}, lost in gaps {lost}; \
         {found:?}"
    );
    assert_eq!(
        sent - refused,
        stored + lost,
        "{tag}: lines told written ({sent} - {refused}) must be stored ({stored}) or counted \
         ({lost})"
    );
    found
}

/// Moves the first sequence number in page `ticket`'s meta word by `delta`,
/// keeping the page number: producers go on stamping records from it.
fn shift_meta_seq(ring: &RingFile, ticket: u64, delta: i64) -> (u64, u64) {
    const SEQ_MASK: u64 = (1 << 40) - 1;
    let index = ring.meta_index(ticket);
    let old = ring.word(index);
    let new = (old & !SEQ_MASK) | (old.wrapping_add_signed(delta) & SEQ_MASK);
    ring.set(index, new);
    (old, new)
}

/// Waits until the feeder's lines are being stored (again): one more than
/// `at_least`.
fn wait_for_more(store: &Path, tag: &str, at_least: usize) {
    wait_until(&format!("more than {at_least} {tag} events stored"), || {
        messages_of(store, tag).len() > at_least
    });
}

/// An 8-byte write into the meta word of the page producers are filling,
/// once while eventd runs and once while it is stopped: the page's first
/// sequence number moved (back by 100, then on by 5,000), so producers
/// stamp records that repeat or skip sequence numbers. eventd must find it
/// (naming the ring and the page), give the ring up, count what it held as
/// a gap, and producers must go on without a restart: every line a producer
/// was told went in is stored or counted, and no sequence number is stored
/// twice.
#[test]
fn a_scribbled_meta_word_is_found_named_and_its_cost_counted() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = data.join("store");
    let eventd = Eventd::start(&data, None);
    let feeder = Feeder::start(&data, 0, "metascribble", 2);
    wait_for_more(&store, "metascribble", 100);
    let ring = RingFile::open(&ring_path(&data, 0));
    let front = Reserve::unpack(ring.word(H_RESERVE)).ticket;
    let (old, new) = shift_meta_seq(&ring, front, -100);
    wait_until("the scribbled ring given up", || {
        read(&eventd.log).contains("was scribbled")
    });
    let log = read(&eventd.log);
    let slot = front & 255;
    assert!(
        log.contains(&format!("page {slot} (ticket {front})")) && log.contains("cpu-000.ring"),
        "the log names the ring and the page ({old:#x} -> {new:#x}):\n{log}"
    );
    let so_far = messages_of(&store, "metascribble").len();
    wait_for_more(&store, "metascribble", so_far);
    // The same while eventd is stopped: the producer goes on writing into
    // the ring, and the restarted daemon finds the scribble there.
    eventd.stop();
    let ring = RingFile::open(&ring_path(&data, 0));
    std::thread::sleep(Duration::from_millis(300));
    let front = Reserve::unpack(ring.word(H_RESERVE)).ticket;
    shift_meta_seq(&ring, front, 5_000);
    std::thread::sleep(Duration::from_millis(300));
    let mut eventd = Eventd::start(&data, None);
    wait_until(
        "the ring scribbled while eventd was stopped given up",
        || read(&eventd.log).contains("was scribbled"),
    );
    let so_far = messages_of(&store, "metascribble").len();
    wait_for_more(&store, "metascribble", so_far);
    assert_alive(&mut eventd);
    let replacements = count(&ring_stats(&data, 0)["replacements"]);
    assert!(replacements >= 1, "{}", ring_stats(&data, 0));
    let found = assert_every_line_accounted(eventd, &store, feeder, "metascribble", 0);
    assert!(found.epochs_of(0) >= 3, "two replacements: {found:?}");
    assert!(found.lost("ring_lost") > 0, "{found:?}");
}

/// How a ring goes from under a producer while eventd is stopped.
#[derive(Debug, Clone, Copy)]
enum Taken {
    /// Its header is scribbled, so the starting daemon moves it aside as
    /// `cpu-000.ring.bad` and makes a new one.
    MovedAside,
    /// The operator empties the KMES directory.
    Removed,
}

/// A producer that runs across a restart of eventd in which its ring was
/// replaced: it must notice, and every line it was told went in is stored or
/// counted, including those it wrote into the old ring after eventd last
/// read it (the producer that notices first reports them).
fn a_producer_across_a_restart_that_replaced_its_ring(taken: Taken) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = data.join("store");
    let tag = format!("{taken:?}").to_lowercase();
    let eventd = Eventd::start(&data, None);
    let feeder = Feeder::start(&data, 0, &tag, 2);
    wait_for_more(&store, &tag, 100);
    eventd.stop();
    // Lines written while eventd is stopped stay in the ring.
    std::thread::sleep(Duration::from_millis(300));
    let path = ring_path(&data, 0);
    match taken {
        Taken::MovedAside => RingFile::open(&path).set(H_MAGIC, u64::from_le_bytes(*b"SCRIBBLE")),
        Taken::Removed => {
            for entry in std::fs::read_dir(data.join("kmes")).unwrap() {
                let p = entry.unwrap().path();
                if p.extension().is_some_and(|x| x == "ring") {
                    std::fs::remove_file(p).unwrap();
                }
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut eventd = Eventd::start(&data, None);
    let so_far = messages_of(&store, &tag).len();
    wait_for_more(&store, &tag, so_far);
    // A second on the new ring, then the producer stops.
    std::thread::sleep(Duration::from_secs(1));
    assert_alive(&mut eventd);
    let log_path = eventd.log.clone();
    let found = assert_every_line_accounted(eventd, &store, feeder, &tag, 0);
    let log = read(&log_path);
    let reports = messages_of(&store, "eventd")
        .into_iter()
        .filter(|m| m.contains("was replaced while producers still wrote into it"))
        .count();
    if matches!(taken, Taken::MovedAside) {
        assert!(path.with_extension("ring.bad").exists());
    }
    assert_eq!(reports, 1, "one report of the old ring:\n{log}");
    assert!(found.epochs_of(0) >= 2, "{found:?}");
    assert!(
        log.contains("a producer reports a ring that was replaced"),
        "{log}"
    );
}

#[test]
fn a_producer_whose_ring_was_moved_aside_while_eventd_was_stopped_loses_nothing_uncounted() {
    a_producer_across_a_restart_that_replaced_its_ring(Taken::MovedAside);
}

#[test]
fn a_producer_whose_ring_was_removed_while_eventd_was_stopped_loses_nothing_uncounted() {
    a_producer_across_a_restart_that_replaced_its_ring(Taken::Removed);
}

// ---------------------------------------------------------------------------
// 5 and 6. Syslog senders against a full store disk and a flood.

/// Fills the filesystem `path` is on by writing zeros into it until no
/// byte more fits; returns the bytes written.
fn fill_disk(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let (mut chunk, mut written) = (zeros.len(), 0u64);
    while chunk >= 512 {
        match file.write(&zeros[..chunk]) {
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => chunk /= 2,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    written
}

/// With the store's disk full, syslog senders are not held: messages that
/// do not fit the syslog ring are dropped at once, counted and, once the
/// disk has room again, recorded as a `dropped` gap; nothing else is lost.
#[test]
fn a_full_store_disk_does_not_hold_syslog_senders() {
    with_small_tmpfs(
        "a_full_store_disk_does_not_hold_syslog_senders",
        "24M",
        |dir, small| {
            let data = dir.join("data");
            let store = small.join("store");
            let cfg = config(
                dir,
                &format!(
                    "StoreDir = \"{}\"\nRingBytes = 262144\nStorageShards = 1\nMaxBatchSize = 64\n",
                    store.display()
                ),
            );
            // Small channels, so that what the daemon holds in memory is
            // far less than what is sent.
            let mut eventd = Eventd::start_with(&data, Some(&cfg), &["--channel-slots", "16"]);
            let filler = small.join("filler");
            let filled = fill_disk(&filler);
            const SENT: usize = 5000;
            let socket = data.join("run/syslog.sock");
            let sender = UnixDatagram::unbound().unwrap();
            sender.connect(&socket).unwrap();
            // SO_SNDTIMEO: a send that waits this long fails instead.
            let timeout = Duration::from_secs(5);
            sender.set_write_timeout(Some(timeout)).unwrap();
            let mut longest = Duration::ZERO;
            for i in 0..SENT {
                let started = Instant::now();
                let result = sender.send(format!("<13>fulldisk: message {i:05}").as_bytes());
                longest = longest.max(started.elapsed());
                // A send that timed out fails the test at once: the next
                // ones would each wait as long.
                if let Err(e) = result {
                    panic!(
                        "send {i} of {SENT} failed after {:?}: {e}",
                        started.elapsed()
                    );
                }
            }
            assert!(longest < timeout / 2, "the longest send took {longest:?}");
            wait_until("messages dropped while commits fail", || {
                let s = stats(&data);
                count(&s["syslog"]["received"]) == SENT as u64
                    && count(&s["syslog"]["dropped"]) > 0
                    && count(&s["failing_writers"]) >= 1
            });
            let failing = stats(&data);
            let last_error = failing["shards"][0]["last_error"].clone();
            assert!(last_error.is_string(), "{failing}");
            let log = read(&eventd.log);
            assert!(log.contains("syslog messages dropped"), "{log}");
            // Room again: the writer's next retry commits.
            std::fs::remove_file(&filler).unwrap();
            let freed_at = Instant::now();
            wait_until("commits succeeding again", || {
                read(&eventd.log).contains("commits succeed again")
            });
            let recovered_in = freed_at.elapsed();
            let s = stats(&data);
            assert_eq!(count(&s["failing_writers"]), 0, "{s}");
            assert!(s["shards"][0]["last_error"].is_null(), "{s}");
            let dropped = count(&s["syslog"]["dropped"]);
            wait_until("the drops reported as a gap", || {
                let reported = sum_query(
                    &store,
                    "SELECT ifnull(sum(lost), 0) FROM gaps WHERE reason = 'dropped'",
                );
                reported as u64 == dropped
            });
            wait_until("every kept message stored", || {
                messages_of(&store, "fulldisk").len() as u64 + dropped == SENT as u64
            });
            let s = stats(&data);
            let y = &s["syslog"];
            assert_eq!(count(&y["dropped"]), dropped, "{s}");
            assert_eq!(count(&y["dropped_not_reported_yet"]), 0, "{s}");
            assert!(count(&y["drop_reports"]) >= 1, "{s}");
            for key in ["rejected_empty", "rejected_too_large", "rejected_stopping"] {
                assert_eq!(count(&y[key]), 0, "{key}: {s}");
            }
            let mut kept = messages_of(&store, "fulldisk");
            kept.sort();
            let before = kept.len();
            kept.dedup();
            assert_eq!(kept.len(), before, "a message stored twice");
            assert_alive(&mut eventd);
            eventd.stop();
            let found = check_sequences(&store);
            assert!(found.epochs_of(SYSLOG_CPU) >= 1, "{found:?}");
            assert_eq!(found.lost("dropped"), dropped, "{found:?}");
            eprintln!(
                "filled {filled} bytes; {SENT} sent, longest send {longest:?}; dropped \
                 {dropped} ({} reports); {} stored; commits again {recovered_in:?} after \
                 the filler went; last error was {last_error}",
                found.gaps.get("dropped").map_or(0, |g| g.0),
                kept.len()
            );
        },
    );
}

/// Two producers flood the CPU rings until they lap; syslog messages sent
/// meanwhile are stored, each once: they go into eventd's own ring, which
/// no producer can write into. None is overwritten: every one is stored or
/// (only if that ring stayed full past the receiver's wait, on a very
/// loaded machine) counted in a `dropped` gap.
#[test]
fn syslog_messages_cannot_be_overwritten_by_other_producers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = data.join("store");
    // The floods must lap the CPU rings: rate limits off.
    let cfg = config(dir.path(), "RingBytes = 65536\nRateLimitBurst = 0\n");
    let mut eventd = Eventd::start(&data, Some(&cfg));
    const FLOOD: usize = 100_000;
    const SYSLOG: usize = 3000;
    let floods: Vec<JoinHandle<Output>> = (0..2)
        .map(|cpu| {
            let data = data.clone();
            std::thread::spawn(move || {
                let lines: Vec<String> = (0..FLOOD).map(|i| format!("flood{cpu}-{i}")).collect();
                emit_lines_on(&data, cpu, &lines)
            })
        })
        .collect();
    let sender = UnixDatagram::unbound().unwrap();
    sender.connect(data.join("run/syslog.sock")).unwrap();
    sender
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut sent = Vec::new();
    for i in 0..SYSLOG {
        let message = format!("syslog {i:05}");
        sender
            .send(format!("<13>floodsys: {message}").as_bytes())
            .unwrap();
        sent.push(message);
        // Spread over the flood (about a second in a debug build) rather
        // than all sent before it is under way.
        if i % 10 == 9 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let sending_took = started.elapsed();
    let flooding_still = floods.iter().filter(|t| !t.is_finished()).count();
    let floods: Vec<Output> = floods.into_iter().map(|t| t.join().unwrap()).collect();
    let flood_took = started.elapsed();
    for out in &floods {
        assert_eq!(out.status.signal(), None, "{out:?}");
    }
    let dropped = || {
        sum_query(
            &store,
            "SELECT coalesce(sum(lost), 0) FROM gaps WHERE reason = 'dropped'",
        ) as usize
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut kept = loop {
        let kept = messages_of(&store, "floodsys");
        if kept.len() + dropped() >= SYSLOG || Instant::now() > deadline {
            break kept;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_alive(&mut eventd);
    let s = stats(&data);
    eventd.stop();
    let found = check_sequences(&store);
    let dropped = found.lost("dropped") as usize;
    kept.sort();
    let stored = kept.len();
    kept.dedup();
    assert_eq!(kept.len(), stored, "a syslog message stored twice");
    assert!(
        kept.iter().all(|k| sent.binary_search(k).is_ok()),
        "a stored syslog message that was not sent"
    );
    assert_eq!(
        stored + dropped,
        SYSLOG,
        "stored {stored} and counted {dropped} dropped of {SYSLOG} syslog messages: the rest \
         were lost uncounted; gaps {:?}; syslog stats {}",
        found.gaps,
        s["syslog"]
    );
    assert!(
        stored > 0,
        "no syslog message stored; syslog stats {}",
        s["syslog"]
    );
    assert!(
        found.lost("overwritten") > 0,
        "the flood did not lap the CPU rings: {found:?}"
    );
    let flooded: usize = (0..2)
        .map(|cpu| {
            sum_query(
                &store,
                &format!("SELECT count(*) FROM events WHERE message LIKE 'flood{cpu}-%'"),
            ) as usize
        })
        .sum();
    eprintln!(
        "syslog: {SYSLOG} sent in {sending_took:?}, {stored} stored, {dropped} dropped; flood: \
         {} lines, {flooded} stored, {} overwritten, in {flood_took:?} ({flooding_still} still \
         flooding when the last syslog message was sent); ring waits {}",
        2 * FLOOD,
        found.lost("overwritten"),
        s["syslog"]["ring_waits"]
    );
}

// ---------------------------------------------------------------------------
// 7. Sparse ring files.

/// A ring file with holes (an older eventd's, or a copy) gets its blocks
/// allocated when the daemon attaches it, so a full disk cannot fault the
/// producers writing into it later.
#[test]
fn sparse_ring_files_get_their_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = data.join("store");
    let eventd = Eventd::start(&data, None);
    assert!(emit_on(&data, 0, "before").status.success());
    wait_for_message(&store, "before");
    eventd.stop();
    let ring = ring_path(&data, 0);
    let copy = ring.with_extension("sparse");
    let status = Command::new("cp")
        .arg("--sparse=always")
        .arg("--preserve=mode,ownership")
        .arg(&ring)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::rename(&copy, &ring).unwrap();
    let meta = std::fs::metadata(&ring).unwrap();
    let sparse_bytes = meta.blocks() * 512;
    assert!(
        sparse_bytes < meta.len(),
        "the copy is not sparse: {sparse_bytes} of {} bytes allocated",
        meta.len()
    );
    let eventd = Eventd::start(&data, None);
    let log = read(&eventd.log);
    assert!(log.contains("not all allocated"), "{log}");
    let meta = std::fs::metadata(&ring).unwrap();
    assert!(
        meta.blocks() * 512 >= meta.len(),
        "{} of {} bytes allocated",
        meta.blocks() * 512,
        meta.len()
    );
    assert!(emit_on(&data, 0, "after").status.success());
    wait_for_message(&store, "after");
    eventd.stop();
    check_sequences(&store);
    eprintln!(
        "allocated {sparse_bytes} of {} bytes before, {} after",
        meta.len(),
        meta.blocks() * 512
    );
}
