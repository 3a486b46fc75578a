//! Retention with the real daemon: limits by age and by size, on active and
//! historical shards, while queries run, and never an event newer than the
//! limit; steps of the wall clock, made with a C shim over clock_gettime
//! (`Clocks`), never make events committed recently look old.
#![cfg(not(loom))]

mod common;

use common::*;
use eventd::rings::{now_ns, online_cpus, Emitter, Event, Level};
use rusqlite::Connection;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const DAY_NS: i64 = 86_400 * 1_000_000_000;
const PER_PHASE: i64 = 3000;
/// Events just over and just under the age limit, MARGIN_NS from it (the
/// test runs well within that time, so none crosses it meanwhile).
const EDGE: i64 = 500;
const MARGIN_NS: i64 = 180 * 1_000_000_000;

fn count(c: &Connection, sql: &str) -> i64 {
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Bytes in pages in use, over every database (what RetentionMaxBytes bounds).
fn used_bytes(data: &Path) -> u64 {
    shards(data)
        .iter()
        .map(|(_, c)| {
            let pages = count(c, "PRAGMA page_count") - count(c, "PRAGMA freelist_count");
            (pages * count(c, "PRAGMA page_size")) as u64
        })
        .sum()
}

/// Bytes of the pages no deletion frees, over every database: the first
/// page of the file and the root page of each table and index.
fn schema_bytes(data: &Path) -> u64 {
    shards(data)
        .iter()
        .map(|(_, c)| {
            let roots = count(c, "SELECT count(*) FROM sqlite_master WHERE rootpage > 0");
            ((1 + roots) * count(c, "PRAGMA page_size")) as u64
        })
        .sum()
}

fn file_pages(data: &Path) -> i64 {
    shards(data)
        .iter()
        .map(|(_, c)| count(c, "PRAGMA page_count"))
        .sum()
}

fn messages(data: &Path) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for (_, c) in shards(data) {
        let mut stmt = c
            .prepare(&format!(
                "SELECT message FROM events WHERE {NOT_BOOT_MARKER}"
            ))
            .unwrap();
        all.extend(
            stmt.query_map([], |r| r.get::<_, String>(0))
                .unwrap()
                .map(|m| m.unwrap()[..10].trim_end().to_string()),
        );
    }
    all
}

/// Emits `count` events of one phase with timestamps `base + i ms`;
/// messages are `"{phase}-{i:04}"` padded to 400 bytes, into the rings of
/// every CPU in turn. Waits for each thousand to be stored so that no ring
/// laps.
fn emit_phase(data: &Path, phase: &str, base_ns: i64, count: i64, stored_before: u64) {
    let emitter = Emitter::open(data.join("kmes")).unwrap();
    // Every ring in turn, so that every shard gets some.
    let cpus = online_cpus();
    for i in 0..count {
        let message = format!("{:<400}", format!("{phase}-{i:04}"));
        let event = Event {
            ts_ns: base_ns + i * 1_000_000,
            pid: 1,
            tid: 1,
            uid: 0,
            level: Level::Info,
            provider: "retention-test",
            name: phase,
            message: &message,
            fields: "",
        };
        let cpu = cpus[i as usize % cpus.len()];
        emitter.ring(cpu).unwrap().emit(&event).unwrap();
        if i % 1000 == 999 || i == count - 1 {
            wait_for_events(data, stored_before + i as u64 + 1);
        }
    }
}

/// Events of the present, emitted every few milliseconds while retention
/// works, so that it runs beside a writer that has work.
struct Live {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<i64>,
}

impl Live {
    /// `clock_ns` is where eventd's wall clock stands against this
    /// process's: live events carry the time eventd reads.
    fn start(data: &Path, clock_ns: i64) -> Live {
        let stop = Arc::new(AtomicBool::new(false));
        let emitter = Emitter::open(data.join("kmes")).unwrap();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let cpus = online_cpus();
            let mut sent = 0;
            while !flag.load(Ordering::Relaxed) {
                let message = format!("live-{sent:05}");
                let event = Event {
                    ts_ns: now_ns() + clock_ns,
                    pid: 1,
                    tid: 1,
                    uid: 0,
                    level: Level::Info,
                    provider: "retention-test",
                    name: "live",
                    message: &message,
                    fields: "",
                };
                let cpu = cpus[sent as usize % cpus.len()];
                emitter.ring(cpu).unwrap().emit(&event).unwrap();
                sent += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            sent
        });
        Live { stop, thread }
    }

    fn finish(self) -> i64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// The wall clock (CLOCK_REALTIME) and the boot clock (CLOCK_BOOTTIME) of
/// the eventd processes a test starts, moved by the C shim
/// `tests/retention/clock_shim.c`, built here with the system's C compiler
/// and loaded with LD_PRELOAD: every call to clock_gettime in eventd (Rust's
/// SystemTime among them) gets the offsets of the file the test rewrites.
/// The monotonic clock is left alone and runs on.
struct Clocks {
    shim: PathBuf,
    offsets: PathBuf,
}

impl Clocks {
    fn new(dir: &Path) -> Clocks {
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/retention/clock_shim.c");
        let shim = dir.join("clock_shim.so");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
            .arg(&shim)
            .arg(source)
            .arg("-ldl")
            .output()
            .expect("a C compiler (cc) builds the clock shim");
        assert!(
            out.status.success(),
            "cc failed on {source}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let clocks = Clocks {
            shim,
            offsets: dir.join("clock-offsets"),
        };
        clocks.set(0, 0);
        clocks
    }

    /// eventd's wall clock reads `wall_ns` more than the real one, its boot
    /// clock `boot_ns` more (within 10 ms of this call).
    fn set(&self, wall_ns: i64, boot_ns: i64) {
        let tmp = self.offsets.with_extension("new");
        std::fs::write(&tmp, format!("{wall_ns} {boot_ns}\n")).unwrap();
        std::fs::rename(&tmp, &self.offsets).unwrap();
    }

    /// Time passes for eventd: both clocks read `ns` more than the real
    /// ones (as after a suspend, but no step: they move together).
    fn pass_time_to(&self, ns: i64) {
        self.set(ns, ns);
    }

    fn start(&self, data: &Path, config: Option<&Path>, extra: &[&str]) -> Eventd {
        let (mut cmd, log) = command(data, config, extra);
        cmd.env("LD_PRELOAD", &self.shim)
            .env("EVENTD_TEST_CLOCK_OFFSETS", &self.offsets);
        Eventd::spawn(cmd, log, data)
    }
}

/// Retention passes made so far.
fn passes(data: &Path) -> u64 {
    eventctl_json(data, "stats")["stats"]["retention"]["passes"]
        .as_u64()
        .unwrap()
}

/// Waits until `n` more retention passes have run (each started after this
/// call, but the first).
fn wait_passes(data: &Path, n: u64) {
    let seen = passes(data);
    wait_until("retention passes", || passes(data) > seen + n);
}

/// Emits `n` events named `name` with timestamp `ts_ns` onto every ring in
/// turn, and waits until the store holds `stored_before + n`.
/// Emits `n` events named `name` at `ts_ns` and waits until they are all
/// stored (counted by name: retention may meanwhile delete older events,
/// which a count of the whole store would wait for in vain).
fn emit_at(data: &Path, name: &str, ts_ns: i64, n: u64) {
    let emitter = Emitter::open(data.join("kmes")).unwrap();
    let cpus = online_cpus();
    for i in 0..n {
        let message = format!("{name}-{i:04}");
        let event = Event {
            ts_ns,
            pid: 1,
            tid: 1,
            uid: 0,
            level: Level::Info,
            provider: "retention-test",
            name,
            message: &message,
            fields: "",
        };
        let cpu = cpus[i as usize % cpus.len()];
        emitter.ring(cpu).unwrap().emit(&event).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while named(data, name) < n as i64 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} {name} events stored",
            named(data, name)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn named(data: &Path, name: &str) -> i64 {
    shards(data)
        .iter()
        .map(|(_, c)| {
            c.query_row("SELECT count(*) FROM events WHERE name = ?1", [name], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
        })
        .sum()
}

fn write_config(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Queries in a loop until told to stop; each must succeed.
struct Queries {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Queries {
    fn start(data: &Path) -> Queries {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, done, data) = (stop.clone(), done.clone(), data.to_path_buf());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for order in [&[][..], &["--reverse"][..]] {
                        let out = Command::new(EVENTCTL)
                            .arg("--data-dir")
                            .arg(&data)
                            .args(["query", "--output", "json", "--limit", "300"])
                            .args(order)
                            .output()
                            .unwrap();
                        assert!(
                            out.status.success(),
                            "query failed: {}",
                            String::from_utf8_lossy(&out.stderr)
                        );
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        Queries { stop, done, thread }
    }

    fn ran(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.thread.is_finished() {
            assert!(std::time::Instant::now() < deadline, "a query hung");
            std::thread::sleep(Duration::from_millis(50));
        }
        let ran = self.ran();
        self.thread.join().expect("a concurrent query failed");
        ran
    }
}

#[test]
fn retention_by_age_then_size_on_active_and_historical_shards_while_queries_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A limit no event reaches yet, so that retention passes run (and mark
    // what was committed) between the phases, as they would while that
    // much time passed.
    let cfg = config(
        dir.path(),
        "StorageShards = 4\nRetentionMaxAge = \"400d\"\n",
    );
    // Stripes of 256 (the default is 4096): a few thousand events then
    // reach all four shards, as the test needs.
    let fast = ["--retention-interval-ms", "200", "--stripe-len", "256"];

    // Four shards get old (30 days), just over and just under a day,
    // middle-aged (2 hours) and new events. Each is stored at its time:
    // eventd's clocks (wall and boot) are moved on between the phases as
    // if that time passed, and each event carries the time eventd reads.
    let clocks = Clocks::new(dir.path());
    let eventd = clocks.start(&data, Some(&cfg), &fast);
    let mut stored = 0;
    let end = 30 * DAY_NS;
    for (phase, age, count) in [
        ("old", 30 * DAY_NS, PER_PHASE),
        ("over", DAY_NS + MARGIN_NS, EDGE),
        ("under", DAY_NS - MARGIN_NS, EDGE),
        ("mid", DAY_NS / 12, PER_PHASE),
        ("new", 60_000_000_000, PER_PHASE),
    ] {
        clocks.pass_time_to(end - age);
        emit_phase(&data, phase, now_ns() + end - age, count, stored);
        stored += count as u64;
        wait_passes(&data, 1);
    }
    clocks.pass_time_to(end);
    eventd.stop();

    // Two shards now: shards 2 and 3 are historical, with old events too.
    write_config(&cfg, "StorageShards = 2\n");
    let eventd = clocks.start(&data, Some(&cfg), &fast);
    let old_in = |data: &Path| -> Vec<i64> {
        shards(data)
            .iter()
            .map(|(_, c)| {
                count(
                    c,
                    "SELECT count(*) FROM events WHERE name IN ('old', 'over')",
                )
            })
            .collect()
    };
    let before = old_in(&data);
    assert_eq!(before.len(), 4);
    assert!(before.iter().all(|&n| n > 0), "{before:?}");
    // Every receipt row, as (epoch, cpu, first, last).
    let receipts = |data: &Path| -> BTreeSet<(i64, i64, i64, i64)> {
        let mut all = BTreeSet::new();
        for (_, c) in shards(data) {
            let mut stmt = c
                .prepare("SELECT ring_epoch, cpu, first_seq, last_seq FROM receipts")
                .unwrap();
            all.extend(
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .unwrap()
                    .map(|r| r.unwrap()),
            );
        }
        all
    };
    let receipts_before = receipts(&data);
    let queries = Queries::start(&data);
    let live = Live::start(&data, end);

    // Age: everything older than a day goes, from every shard.
    write_config(&cfg, "StorageShards = 2\nRetentionMaxAge = \"1d\"\n");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while old_in(&data).iter().sum::<i64>() > 0 {
        assert!(std::time::Instant::now() < deadline, "{:?}", old_in(&data));
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = messages(&data);
    for (phase, n) in [("under", EDGE), ("mid", PER_PHASE), ("new", PER_PHASE)] {
        let kept = left.iter().filter(|m| m.starts_with(phase)).count();
        assert_eq!(kept as i64, n, "{phase} events are newer than the limit");
    }
    for (path, c) in &shards(&data) {
        assert!(
            count(c, "SELECT count(*) FROM events WHERE name = 'mid'") > 0,
            "{}",
            path.display()
        );
    }
    // The rings still exist: their receipts were all kept (the live
    // events add more).
    assert!(receipts(&data).is_superset(&receipts_before));
    // And the first start's boot marker, as old as the oldest events (the
    // second start's stays).
    wait_until("the first boot marker deleted", || {
        boot_markers(&data).0 == 1
    });
    let stats = eventctl_json(&data, "stats")["stats"]["retention"].clone();
    assert_eq!(stats["events_deleted"], PER_PHASE + EDGE + 1, "{stats}");
    let ran_by_age = queries.ran();
    assert!(
        ran_by_age >= 2,
        "queries while deleting by age: {ran_by_age}"
    );

    // Size: the pages that hold rows must shrink to 40 % (besides each
    // table's and index's first page, which no deletion frees: what fits
    // does not hang on how many tables the schema has); the oldest events
    // go first, whatever shard holds them.
    let used = used_bytes(&data);
    let fixed = schema_bytes(&data);
    let limit = fixed + (used - fixed) * 40 / 100;
    assert!(
        limit >= 1 << 20,
        "the store is too small for the test: {used}"
    );
    let pages_before = file_pages(&data);
    write_config(
        &cfg,
        &format!("StorageShards = 2\nRetentionMaxAge = \"1d\"\nRetentionMaxBytes = {limit}\n"),
    );
    wait_until("the store to fit its size limit", || {
        used_bytes(&data) <= limit
    });
    // The events written while retention worked are all there (they are
    // the newest). They stop here, so that what follows sees a store that
    // no longer grows.
    let sent = live.finish();
    assert!(sent > 0);
    let live_rows = || -> i64 {
        shards(&data)
            .iter()
            .map(|(_, c)| count(c, "SELECT count(*) FROM events WHERE name = 'live'"))
            .sum()
    };
    wait_until("every live event stored", || live_rows() >= sent);
    // The pass that got there may still be deleting in other shards: wait
    // for one whole pass after it.
    let passes = |data: &Path| {
        eventctl_json(data, "stats")["stats"]["retention"]["passes"]
            .as_u64()
            .unwrap()
    };
    let seen = passes(&data);
    wait_until("two more passes", || passes(&data) >= seen + 2);
    let mut left = messages(&data);
    left.retain(|m| !m.starts_with("live"));
    let by_age: Vec<String> = [("under", EDGE), ("mid", PER_PHASE), ("new", PER_PHASE)]
        .iter()
        .flat_map(|&(p, n)| (0..n).map(move |i| format!("{p}-{i:04}")))
        .collect();
    let first_kept = by_age
        .iter()
        .position(|m| left.contains(m))
        .expect("some events remain");
    assert!(
        first_kept > 0,
        "nothing was deleted: used {used} before, limit {limit}, now {} ({} left); {}",
        used_bytes(&data),
        left.len(),
        eventctl_json(&data, "stats")["stats"]["retention"]
    );
    for m in &by_age[first_kept..] {
        assert!(
            left.contains(m),
            "{m} is newer than a kept event but was deleted"
        );
    }
    assert_eq!(left.len(), by_age.len() - first_kept);
    // Each round deletes about what is needed, not everything older than
    // some shard's newest event: most of what fits stays.
    assert!(
        left.len() as i64 > PER_PHASE * 2 / 3,
        "only {} of {} kept",
        left.len(),
        2 * PER_PHASE
    );
    assert!(
        left.iter()
            .all(|m| ["under", "mid", "new"].iter().any(|p| m.starts_with(p))),
        "{left:?}"
    );
    // Freed pages went back to the filesystem (the shards created by this
    // eventd can vacuum incrementally).
    wait_until("an incremental vacuum", || file_pages(&data) < pages_before);
    let stats = eventctl_json(&data, "stats")["stats"]["retention"].clone();
    assert_eq!(
        stats["events_deleted"],
        // The first start's boot marker too.
        3 * PER_PHASE + 2 * EDGE - left.len() as i64 + 1,
        "{stats}"
    );
    assert!(stats["pages_vacuumed"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["errors"], 0, "{stats}");

    let ran = queries.finish();
    assert!(
        ran >= ran_by_age + 2,
        "queries while deleting by size: {}",
        ran - ran_by_age
    );
    assert_eq!(live_rows(), sent, "live events were deleted");
    eventd.stop();
    assert!(receipts(&data).is_superset(&receipts_before));
}

/// The wall clock jumps 400 days forward and back while eventd runs with
/// RetentionMaxAge = "30d": nothing it committed a moment ago is deleted,
/// and the log says which way the clock stepped and how far.
#[test]
fn a_wall_clock_step_forward_deletes_nothing_and_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "RetentionMaxAge = \"30d\"\n");
    let clocks = Clocks::new(dir.path());
    let eventd = clocks.start(
        &data,
        Some(&cfg),
        &["--retention-interval-ms", "200", "--stripe-len", "1"],
    );
    emit_at(&data, "before", now_ns(), 200);
    wait_passes(&data, 2);
    assert_eq!(count_events(&data), 200);

    clocks.set(400 * DAY_NS, 0);
    wait_passes(&data, 3);
    assert_eq!(
        count_events(&data),
        200,
        "events committed seconds ago were deleted after a clock step"
    );
    let log = read(&eventd.log);
    assert!(
        log.contains("the wall clock stepped")
            && log.contains("direction=\"forward\" by=400d 0h 0m"),
        "{log}"
    );
    // Events stored while the clock is ahead carry its time; they stay too.
    emit_at(&data, "ahead", now_ns() + 400 * DAY_NS, 50);

    clocks.set(0, 0);
    wait_passes(&data, 3);
    assert_eq!(count_events(&data), 250);
    let log = read(&eventd.log);
    assert!(log.contains("direction=\"back\" by=400d 0h 0m"), "{log}");
    assert_eq!(
        eventctl_json(&data, "stats")["stats"]["retention"]["events_deleted"],
        0
    );
    eventd.stop();
}

/// Events stored while the wall clock is 400 days behind, then the clock
/// is corrected: they stay until they are older than RetentionMaxAge by
/// eventd's own reckoning (its boot clock), and then they go.
#[test]
fn events_logged_while_the_clock_was_behind_stay_until_they_are_really_old() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "RetentionMaxAge = \"30d\"\n");
    let clocks = Clocks::new(dir.path());
    let eventd = clocks.start(
        &data,
        Some(&cfg),
        &["--retention-interval-ms", "200", "--stripe-len", "1"],
    );
    wait_passes(&data, 1);
    clocks.set(-400 * DAY_NS, 0);
    wait_passes(&data, 2);
    // Producers read the same clock as eventd.
    emit_at(&data, "behind", now_ns() - 400 * DAY_NS, 200);

    clocks.set(0, 0);
    wait_passes(&data, 3);
    assert_eq!(
        named(&data, "behind"),
        200,
        "events stored a moment ago were deleted when the clock was corrected"
    );
    let log = read(&eventd.log);
    assert!(
        log.contains("the wall clock stepped")
            && log.contains("direction=\"back\" by=400d 0h 0m")
            && log.contains("direction=\"forward\" by=400d 0h 0m"),
        "{log}"
    );

    // 29 days pass (both clocks move on together): still younger than 30.
    clocks.pass_time_to(29 * DAY_NS);
    wait_passes(&data, 3);
    assert_eq!(named(&data, "behind"), 200);
    // Two more: now they are 31 days old, and they go. Events stored now
    // stay (and are the newest rows of every shard, which retention always
    // keeps: stripes of one event spread them).
    clocks.pass_time_to(31 * DAY_NS);
    emit_at(&data, "fresh", now_ns() + 31 * DAY_NS, 8);
    wait_until("the old events deleted", || named(&data, "behind") == 0);
    wait_passes(&data, 2);
    assert_eq!(named(&data, "fresh"), 8);
    // And the boot marker, stored at the start, 31 days ago.
    assert_eq!(boot_markers(&data).0, 0);
    assert_eq!(
        eventctl_json(&data, "stats")["stats"]["retention"]["events_deleted"],
        201
    );
    eventd.stop();
}

/// eventd is stopped, the wall clock is set 400 days ahead, and eventd
/// starts again in the same boot: its reckoning goes on from the earlier
/// start (the boot clock ran on), so nothing it stored looks old; once
/// 31 days have really passed, the events go.
#[test]
fn a_restart_while_the_wall_clock_is_wrong_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "RetentionMaxAge = \"30d\"\n");
    let clocks = Clocks::new(dir.path());
    let fast = ["--retention-interval-ms", "200", "--stripe-len", "1"];
    let eventd = clocks.start(&data, Some(&cfg), &fast);
    emit_at(&data, "before", now_ns(), 100);
    eventd.stop();

    clocks.set(400 * DAY_NS, 0);
    let eventd = clocks.start(&data, Some(&cfg), &fast);
    wait_passes(&data, 3);
    assert_eq!(
        named(&data, "before"),
        100,
        "events stored before a restart were deleted because the wall clock was wrong"
    );
    let log = read(&eventd.log);
    assert!(
        log.contains("goes on from an earlier start in this boot")
            && log.contains("wall_clock=\"ahead\" by=400d 0h 0m"),
        "{log}"
    );

    clocks.set(431 * DAY_NS, 31 * DAY_NS);
    emit_at(&data, "fresh", now_ns() + 431 * DAY_NS, 8);
    wait_until("the old events deleted", || named(&data, "before") == 0);
    assert_eq!(named(&data, "fresh"), 8);
    eventd.stop();
}
