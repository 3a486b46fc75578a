//! Retention with the real daemon: limits by age and by size, on active and
//! historical shards, while queries run, and never an event newer than the
//! limit.
#![cfg(not(loom))]

mod common;

use common::*;
use eventd::rings::{now_ns, online_cpus, Emitter, Event, Level};
use rusqlite::Connection;
use std::collections::BTreeSet;
use std::path::Path;
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

fn file_pages(data: &Path) -> i64 {
    shards(data)
        .iter()
        .map(|(_, c)| count(c, "PRAGMA page_count"))
        .sum()
}

fn messages(data: &Path) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for (_, c) in shards(data) {
        let mut stmt = c.prepare("SELECT message FROM events").unwrap();
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
    fn start(data: &Path) -> Live {
        let stop = Arc::new(AtomicBool::new(false));
        let emitter = Emitter::open(data.join("kmes")).unwrap();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let cpus = online_cpus();
            let mut sent = 0;
            while !flag.load(Ordering::Relaxed) {
                let message = format!("live-{sent:05}");
                let event = Event {
                    ts_ns: now_ns(),
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
    let cfg = config(dir.path(), "StorageShards = 4\n");
    // Stripes of 256 (the default is 4096): a few thousand events then
    // reach all four shards, as the test needs.
    let fast = ["--retention-interval-ms", "200", "--stripe-len", "256"];

    // Four shards get old (30 days), just over and just under a day,
    // middle-aged (2 hours) and new events.
    let now = now_ns();
    let eventd = Eventd::start_with(&data, Some(&cfg), &fast);
    let mut stored = 0;
    for (phase, base, count) in [
        ("old", now - 30 * DAY_NS, PER_PHASE),
        ("over", now - DAY_NS - MARGIN_NS, EDGE),
        ("under", now - DAY_NS + MARGIN_NS, EDGE),
        ("mid", now - DAY_NS / 12, PER_PHASE),
        ("new", now - 60_000_000_000, PER_PHASE),
    ] {
        emit_phase(&data, phase, base, count, stored);
        stored += count as u64;
    }
    eventd.stop();

    // Two shards now: shards 2 and 3 are historical, with old events too.
    write_config(&cfg, "StorageShards = 2\n");
    let eventd = Eventd::start_with(&data, Some(&cfg), &fast);
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
    let live = Live::start(&data);

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
    let stats = eventctl_json(&data, "stats")["stats"]["retention"].clone();
    assert_eq!(stats["events_deleted"], PER_PHASE + EDGE, "{stats}");
    let ran_by_age = queries.ran();
    assert!(
        ran_by_age >= 2,
        "queries while deleting by age: {ran_by_age}"
    );

    // Size: the store must shrink to 55 % of its pages in use; the oldest
    // events go first, whatever shard holds them.
    let used = used_bytes(&data);
    let limit = used * 55 / 100;
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
        3 * PER_PHASE + 2 * EDGE - left.len() as i64,
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
