//! The daemon end to end, with the real `eventd` and `eventctl` binaries,
//! real ring files, real SQLite shard files and real signals (SIGTERM for a
//! clean stop, SIGKILL for crashes).
#![cfg(not(loom))]

use rand::Rng;
use rusqlite::Connection;
use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// What the store says, checked for the exactly-once invariants:
/// - per ring epoch, every sequence number from 1 to the highest is either
///   one stored event or inside exactly one stored gap;
/// - within each receipt, the shard holds exactly the receipt's range, its
///   events in sequence order (row order follows sequence order).
///
/// Returns every stored message with how often it was stored, and the
/// number of sequence numbers lost in gaps.
fn check_store(data: &Path) -> (HashMap<String, u32>, u64) {
    let mut messages: HashMap<String, u32> = HashMap::new();
    // Per ring, the sequence ranges covered: one per event, one per gap.
    let mut covered = Covered::new();
    let mut lost = 0u64;
    for (path, c) in shards(data) {
        let mut stmt = c
            .prepare(&format!(
                "SELECT ring_epoch, seq, message, {NOT_BOOT_MARKER}, cpu FROM events ORDER BY id"
            ))
            .unwrap();
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, bool>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })
            .unwrap();
        // Per ring epoch of this shard: (seq, row number in id order).
        let mut rows_by_ring: HashMap<i64, Vec<(i64, usize)>> = HashMap::new();
        let mut gaps_by_ring: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
        for (row_number, row) in rows.enumerate() {
            let (epoch, seq, message, sent, cpu) = row.unwrap();
            // eventd's boot markers hold sequence numbers, not messages.
            if sent {
                *messages.entry(message).or_default() += 1;
            }
            covered.entry((epoch, cpu)).or_default().push((seq, seq));
            rows_by_ring
                .entry(epoch)
                .or_default()
                .push((seq, row_number));
        }
        let mut stmt = c
            .prepare("SELECT ring_epoch, from_seq, to_seq, lost, cpu FROM gaps")
            .unwrap();
        for gap in stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })
            .unwrap()
        {
            let (epoch, from, to, n, cpu) = gap.unwrap();
            assert_eq!(n, to - from + 1);
            lost += n as u64;
            covered.entry((epoch, cpu)).or_default().push((from, to));
            gaps_by_ring.entry(epoch).or_default().push((from, to));
        }
        for v in rows_by_ring.values_mut() {
            v.sort_unstable();
        }
        for v in gaps_by_ring.values_mut() {
            v.sort_unstable();
        }
        // Receipts: each names a contiguous range this shard holds whole,
        // and row order within it is sequence order.
        let mut stmt = c
            .prepare("SELECT ring_epoch, first_seq, last_seq FROM receipts")
            .unwrap();
        for receipt in stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
            .unwrap()
        {
            let (epoch, first, last) = receipt.unwrap();
            let rows = rows_by_ring.get(&epoch).map_or(&[][..], |v| v.as_slice());
            let lo = rows.partition_point(|&(seq, _)| seq < first);
            let hi = rows.partition_point(|&(seq, _)| seq <= last);
            let in_rows = &rows[lo..hi];
            assert!(
                in_rows.windows(2).all(|w| w[0].1 < w[1].1),
                "{}: events of receipt {first}..={last} out of sequence order",
                path.display()
            );
            let gaps = gaps_by_ring.get(&epoch).map_or(&[][..], |v| v.as_slice());
            let lo = gaps.partition_point(|&(from, _)| from < first);
            let gap_seqs: i64 = gaps[lo..]
                .iter()
                .take_while(|&&(_, to)| to <= last)
                .map(|&(from, to)| to - from + 1)
                .sum();
            assert_eq!(
                in_rows.len() as i64 + gap_seqs,
                last - first + 1,
                "{}: receipt {first}..={last} does not match the rows",
                path.display()
            );
        }
    }
    // Per ring: 1..=max covered exactly once (ranges neither overlap nor
    // leave a hole).
    assert_covered(&data.display().to_string(), covered);
    (messages, lost)
}

fn assert_exactly(messages: &HashMap<String, u32>, expected: impl IntoIterator<Item = String>) {
    let mut want = 0;
    for m in expected {
        want += 1;
        assert_eq!(messages.get(&m), Some(&1), "message {m:?}");
    }
    assert_eq!(messages.len(), want, "unexpected extra messages");
}

#[test]
fn end_to_end_every_event_from_several_processes_stored_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Four shards for two rings: every drain stripes over two shards.
    let cfg = config(dir.path(), "StorageShards = 4\nMaxBatchSize = 500\n");
    let eventd = Eventd::start(&data, Some(&cfg));
    let mut expected = Vec::new();
    let mut emitters: Vec<Emitter> = (0..3)
        .map(|p| Emitter::spawn(&data, &format!("p{p}")))
        .collect();
    for i in 0..5000 {
        for (p, e) in emitters.iter_mut().enumerate() {
            let m = format!("p{p}-{i}");
            e.send(&m);
            expected.push(m);
        }
    }
    for e in emitters {
        e.finish();
    }
    for i in 0..3 {
        let m = format!("single-{i}");
        emit_one(&data, &m);
        expected.push(m);
    }
    wait_for_events(&data, expected.len() as u64);
    eventd.stop();
    // A clean stop checkpoints and removes the WAL of every shard; each
    // keeps its manifest beside it.
    let mut files: Vec<String> = std::fs::read_dir(data.join("store"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let want: Vec<String> = [".eventd.lock"]
        .into_iter()
        .map(String::from)
        .chain((0..4).flat_map(|j| {
            [
                format!("shard-{j:03}.db"),
                format!("shard-{j:03}.db.manifest"),
            ]
        }))
        .collect();
    assert_eq!(files, want);
    let (messages, lost) = check_store(&data);
    assert_eq!(lost, 0);
    assert_exactly(&messages, expected);
    // Structured fields and levels are stored as given.
    let found: i64 = shards(&data)
        .iter()
        .map(|(_, c)| {
            c.query_row(
                "SELECT count(*) FROM events WHERE provider = 'single' AND level = 3 \
                 AND json_extract(fields, '$.k') = 'v'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
        })
        .sum();
    assert_eq!(found, 3);
}

/// Feeds two `eventctl emit --stdin` processes (`pace`: sleep between
/// groups of 100 lines; `lossy`: rings may lap) while killing eventd with SIGKILL
/// `kills` times at random moments and restarting it. Returns the running
/// daemon and every message sent.
fn crash_loop(
    data: &Path,
    cfg: &Path,
    tuning: &[&str],
    kills: usize,
    pace: Duration,
    lossy: bool,
) -> (Eventd, Vec<String>) {
    let mut eventd = Eventd::start_with(data, Some(cfg), tuning);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let feeders: Vec<_> = (0..2)
        .map(|p| {
            let data = data.to_path_buf();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut e = Emitter::spawn(&data, &format!("crash{p}"));
                let mut sent = Vec::new();
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for _ in 0..100 {
                        let m = format!("c{p}-{i}");
                        e.send(&m);
                        sent.push(m);
                        i += 1;
                    }
                    std::thread::sleep(pace);
                }
                // Lines lost to a lapping ring make eventctl exit 1.
                let status = e.close();
                assert!(lossy || status.success(), "eventctl: {status}");
                sent
            })
        })
        .collect();
    let mut rng = rand::rng();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(rng.random_range(50..600)));
        eventd.kill();
        eventd = Eventd::start_with(data, Some(cfg), tuning);
        // How each drain resumed (shown with --nocapture).
        for line in read(&eventd.log)
            .lines()
            .filter(|l| l.contains("resuming at"))
        {
            eprintln!("{}", line.split("] ").nth(1).unwrap_or(line));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = feeders
        .into_iter()
        .flat_map(|f| f.join().unwrap())
        .collect();
    (eventd, sent)
}

#[test]
fn crash_sigkill_at_random_moments_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // More shards than rings so stripes of one ring land in different shards
    // that commit independently: the case receipts alone cannot order.
    // Rings of 64 MiB: the feeders write about 40,000 lines a second, and
    // a debug daemon on a loaded machine can take seconds to restart; the
    // test's premise is that the rings never lap (so nothing may be lost).
    // One feeder writes far past a source's share: rate limits off.
    let cfg = config(
        dir.path(),
        "StorageShards = 6\nMaxBatchSize = 300\nRingBytes = 67108864\nRateLimitBurst = 0\n",
    );
    // Short stripes and small channels: at any kill, some shards hold
    // uncommitted stripes between committed ones.
    let tuning = ["--stripe-len", "3", "--channel-slots", "64"];
    let (eventd, expected) = crash_loop(&data, &cfg, &tuning, 12, Duration::from_millis(5), false);
    // Everything still in the rings is drained by the last daemon.
    wait_for_events(&data, expected.len() as u64);
    eventd.stop();
    let (messages, lost) = check_store(&data);
    // The rings never lapped, so nothing may be lost.
    assert_eq!(lost, 0);
    assert_exactly(&messages, expected);
}

#[test]
fn crash_with_lapped_rings_stores_every_sequence_once_or_in_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // 64 KiB rings and fast producers: the rings lap while eventd is
    // down (and while it catches up), so gaps meet committed runs.
    let cfg = config(
        dir.path(),
        "StorageShards = 4\nMaxBatchSize = 200\nRingBytes = 65536\nRateLimitBurst = 0\n",
    );
    let tuning = ["--stripe-len", "5", "--channel-slots", "64"];
    let (eventd, sent) = crash_loop(&data, &cfg, &tuning, 10, Duration::from_millis(1), true);
    // Let the last daemon catch up (no new rows for 4 s: long enough for a
    // checkpoint's syncs on a loaded machine), then stop it.
    let mut last = (u64::MAX, Instant::now());
    while last.1.elapsed() < Duration::from_secs(4) {
        let n = count_events(&data);
        if n != last.0 {
            last = (n, Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eventd.stop();
    let (messages, lost) = check_store(&data);
    eprintln!(
        "sent {}, stored {}, lost {lost}",
        sent.len(),
        messages.len()
    );
    let sent: std::collections::HashSet<String> = sent.into_iter().collect();
    for (m, n) in &messages {
        assert_eq!(*n, 1, "{m:?} stored {n} times");
        assert!(sent.contains(m), "{m:?} was never sent");
    }
    // Every message sent is stored, counted in a gap, or was refused by its
    // ring before it got a sequence number.
    let refused: u64 = std::fs::read_dir(data.join("kmes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ring"))
        .map(|p| {
            eventd::rings::Ring::open(&p, None)
                .unwrap()
                .producer_refusals()
        })
        .sum();
    assert!(messages.len() as u64 + lost + refused >= sent.len() as u64);
    assert!(lost > 0, "64 KiB rings fed this fast were expected to lap");
}

fn count_ext(dir: &Path, ext: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == ext)
        })
        .count()
}

fn file_digest(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn r12_restart_with_fewer_shards_leaves_the_others_untouched_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let four = config(dir.path(), "StorageShards = 4\n");
    let eventd = Eventd::start(&data, Some(&four));
    let mut expected = Vec::new();
    let mut emitters: Vec<Emitter> = (0..2)
        .map(|p| Emitter::spawn(&data, &format!("a{p}")))
        .collect();
    for i in 0..3000 {
        for (p, e) in emitters.iter_mut().enumerate() {
            let m = format!("a{p}-{i}");
            e.send(&m);
            expected.push(m);
        }
    }
    emitters.into_iter().for_each(Emitter::finish);
    wait_for_events(&data, expected.len() as u64);
    eventd.stop();
    let before: Vec<(PathBuf, Vec<u8>)> = (1..4)
        .map(|j| {
            let p = data.join(format!("store/shard-{j:03}.db"));
            let d = file_digest(&p);
            (p, d)
        })
        .collect();

    let one_path = dir.path().join("one.toml");
    std::fs::write(&one_path, "StorageShards = 1\n").unwrap();
    let eventd = Eventd::start(&data, Some(&one_path));
    let mut emitters: Vec<Emitter> = (0..2)
        .map(|p| Emitter::spawn(&data, &format!("b{p}")))
        .collect();
    for i in 0..3000 {
        for (p, e) in emitters.iter_mut().enumerate() {
            let m = format!("b{p}-{i}");
            e.send(&m);
            expected.push(m);
        }
    }
    emitters.into_iter().for_each(Emitter::finish);
    wait_for_events(&data, expected.len() as u64);
    eventd.stop();
    for (path, digest) in before {
        assert!(path.exists(), "{} was removed", path.display());
        assert!(
            file_digest(&path) == digest,
            "{} was modified",
            path.display()
        );
    }
    // Recovery read the old shards' receipts: nothing stored twice.
    let (messages, lost) = check_store(&data);
    assert_eq!(lost, 0);
    assert_exactly(&messages, expected);
}

#[test]
fn r2_a_1024_descriptor_limit_refuses_256_shards_before_creating_any() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "StorageShards = 256\n");
    let (mut cmd, log) = command(&data, Some(&cfg), &[]);
    // SAFETY: setrlimit is async-signal-safe and touches only this child.
    unsafe {
        cmd.pre_exec(|| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = 1024;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = cmd.status().unwrap();
    let log = read(&log);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("LimitNOFILE"), "{log}");
    assert!(log.contains("soft RLIMIT_NOFILE is 1024"), "{log}");
    // 4·128·256 + 4·128 + 3·(256+3) + 2·C + 256 with C rings attached.
    let rings = count_ext(&data.join("kmes"), "ring") as u64;
    let allowance = 4 * 128 * 256 + 4 * 128 + 3 * 259 + 2 * rings + 256;
    assert!(
        log.contains(&format!("about {allowance} file descriptors")),
        "{log}"
    );
    let shard_files = count_ext(&data.join("store"), "db");
    assert_eq!(shard_files, 0, "no shard database may be created");
}

#[test]
fn bad_configuration_stops_start_up_naming_key_value_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (text, wants) in [
        (
            "StorageShards = 300\n",
            vec!["StorageShards = 300", "1..=256"],
        ),
        (
            "MaxBatchSize = 0\n",
            vec!["MaxBatchSize = 0", "1..=1000000"],
        ),
        ("StorageShard = 2\n", vec!["StorageShard", "eventd.toml"]),
    ] {
        let cfg = config(dir.path(), text);
        let (mut cmd, log) = command(&data, Some(&cfg), &[]);
        let status = cmd.status().unwrap();
        let log = read(&log);
        assert_eq!(status.code(), Some(1), "{log}");
        for w in wants {
            assert!(log.contains(w), "{w:?} not in {log}");
        }
    }
    // A missing file is named, and its cause said once.
    let (mut cmd, log) = command(&data, Some(&dir.path().join("absent.toml")), &[]);
    assert_eq!(cmd.status().unwrap().code(), Some(1));
    let log = read(&log);
    assert!(log.contains("absent.toml"), "{log}");
    assert_eq!(log.matches("No such file or directory").count(), 1, "{log}");
    assert!(
        !data.exists(),
        "nothing is created when the configuration is bad"
    );
}

#[test]
fn a_second_daemon_on_the_same_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = Eventd::start(&data, None);
    let (mut cmd, log) = command(&data, None, &[]);
    let status = cmd.status().unwrap();
    let log = read(&log);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("another eventd"), "{log}");
    assert!(log.contains(&format!("pid {}", first.child.id())), "{log}");
    first.stop();
}

#[test]
fn an_unreadable_database_in_the_store_is_reported_and_kept_and_eventd_starts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("store")).unwrap();
    // Another tool's SQLite file without receipts is simply not ours...
    Connection::open(data.join("store/notes.db"))
        .unwrap()
        .execute_batch("CREATE TABLE notes (x)")
        .unwrap();
    // ...and a damaged one: found so at start (it has a shard's name and
    // is no database), said so, left out of recovery, left as it is, and
    // collection goes on.
    std::fs::write(data.join("store/shard-009.db"), b"garbage ".repeat(1000)).unwrap();
    let eventd = Eventd::start(&data, None);
    emit_one(&data, "after the damage");
    wait_until("the event", || {
        eventctl_text(&data, &["query", "--grep", "after the damage"]).contains("after the damage")
    });
    let stats = eventctl_json(&data, "stats");
    let damaged = stats["stats"]["damaged_shard_files"].as_array().unwrap();
    assert!(
        damaged
            .iter()
            .any(|d| d["path"].as_str().unwrap().ends_with("shard-009.db")),
        "{stats}"
    );
    let log = read(&eventd.log);
    assert!(
        log.lines()
            .any(|l| l.contains("shard-009.db") && l.contains("ERROR") && l.contains("damaged")),
        "{log}"
    );
    eventd.stop();
    assert_eq!(
        std::fs::read(data.join("store/shard-009.db")).unwrap(),
        b"garbage ".repeat(1000)
    );
}

#[test]
fn unusable_ring_files_are_moved_aside_and_made_anew() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("kmes")).unwrap();
    let cpus = eventd::rings::online_cpus();
    for cpu in &cpus {
        std::fs::write(data.join(format!("kmes/cpu-{cpu:03}.ring")), b"not a ring").unwrap();
    }
    let cfg = config(dir.path(), "StorageShards = 4\n");
    let eventd = Eventd::start(&data, Some(&cfg));
    let log = read(&eventd.log);
    for cpu in &cpus {
        let name = format!("cpu-{cpu:03}.ring");
        assert!(log.contains(&name) && log.contains("moved aside"), "{log}");
        // The bad file is kept for whoever wants to look at it.
        let aside = data.join(format!("kmes/{name}.bad"));
        assert_eq!(std::fs::read(&aside).unwrap(), b"not a ring");
    }
    emit_one(&data, "into a new ring");
    wait_for_events(&data, 1);
    eventd.stop();
}

#[test]
fn r8_two_daemons_cannot_share_a_store_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("shared-store");
    let cfg = config(
        dir.path(),
        &format!("StoreDir = {:?}\n", store.display().to_string()),
    );
    let first = Eventd::start(&dir.path().join("a"), Some(&cfg));
    let (mut cmd, log) = command(&dir.path().join("b"), Some(&cfg), &[]);
    let status = cmd.status().unwrap();
    let log = read(&log);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("another eventd") && log.contains("shared-store"),
        "{log}"
    );
    first.stop();
}

/// Items per commit of the receipts committed at or after `since_ns`.
fn commit_sizes_since(data: &Path, since_ns: i64) -> Vec<i64> {
    let mut sizes = Vec::new();
    for (_, c) in shards(data) {
        let mut stmt = c
            .prepare(
                "SELECT sum(last_seq - first_seq + 1) FROM receipts WHERE committed_at >= ?1 \
                 GROUP BY committed_at",
            )
            .unwrap();
        sizes.extend(
            stmt.query_map([since_ns], |r| r.get::<_, i64>(0))
                .unwrap()
                .map(|r| r.unwrap()),
        );
    }
    sizes
}

#[test]
fn r11_r13_configuration_reloads_live_keys_and_defers_restart_only_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The file is a symlink into a directory the watch does not see, so
    // the first change below reaches the daemon only through SIGHUP.
    let behind = dir.path().join("etc");
    std::fs::create_dir(&behind).unwrap();
    let target = config(&behind, "MaxBatchSize = 4096\n");
    let cfg = dir.path().join("eventd.toml");
    std::os::unix::fs::symlink(&target, &cfg).unwrap();
    let eventd = Eventd::start(&data, Some(&cfg));
    let channels = |key: &str| -> Vec<u64> {
        eventctl_json(&data, "stats")["stats"]["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["channel"][key].as_u64().unwrap())
            .collect()
    };
    let slots = channels("slots");

    // An invalid file is kept out, with the reason; SIGHUP reloads.
    std::fs::write(&target, "MaxBatchSize = 0\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let config = eventctl_json(&data, "config");
    assert!(config["config"]["last_reload_error"].is_null(), "{config}");
    signal(&eventd.child, libc::SIGHUP);
    wait_until("the refusal", || {
        eventctl_json(&data, "config")["config"]["last_reload_error"]
            .as_str()
            .is_some_and(|e| e.contains("MaxBatchSize = 0"))
    });
    assert_eq!(
        eventctl_json(&data, "config")["config"]["effective"]["max_batch_size"],
        4096
    );

    // A live key, written the way editors do (new file, renamed over).
    let tmp = dir.path().join("eventd.toml.new");
    std::fs::write(&tmp, "MaxBatchSize = 7\nStorageShards = 3\n").unwrap();
    std::fs::rename(&tmp, &cfg).unwrap();
    wait_until("MaxBatchSize 7", || {
        eventctl_json(&data, "config")["config"]["effective"]["max_batch_size"] == 7
    });
    let config = eventctl_json(&data, "config");
    let deferred = config["config"]["deferred_to_restart"].to_string();
    assert!(
        deferred.contains("StorageShards: running 0, file says 3"),
        "{config}"
    );
    assert_eq!(config["config"]["effective"]["storage_shards"], 0);
    assert!(config["config"]["last_reload_error"].is_null(), "{config}");

    // Commits from now on hold at most 7 items, and the channels the
    // daemon started with (the stats read them through handles taken at
    // start) still carry the events: their receivers keep sleeping and
    // waking as the batches come.
    let since = eventd::rings::now_ns();
    let sleeps_before: u64 = channels("receiver_sleeps").iter().sum();
    let mut e = Emitter::spawn(&data, "live");
    for i in 0..3000 {
        e.send(&format!("live-{i}"));
    }
    e.finish();
    wait_for_events(&data, 3000);
    let sizes = commit_sizes_since(&data, since);
    assert_eq!(sizes.iter().sum::<i64>(), 3000, "{sizes:?}");
    assert_eq!(sizes.iter().max(), Some(&7), "{sizes:?}");
    assert_eq!(channels("slots"), slots);
    // A writer goes back to sleep on its channel only after the commit that
    // made the last events visible, so the count may move a moment later.
    wait_until("a receiver sleep counted on the start-up channels", || {
        channels("receiver_sleeps").iter().sum::<u64>() > sleeps_before
    });

    // Reloading the same file again logs the deferred key no second time.
    signal(&eventd.child, libc::SIGHUP);
    wait_until("the second reload", || {
        std::fs::read_to_string(&eventd.log)
            .unwrap()
            .matches("reloaded")
            .count()
            >= 2
    });
    let log = std::fs::read_to_string(&eventd.log).unwrap();
    assert_eq!(
        log.matches("deferred to the next restart").count(),
        1,
        "{log}"
    );
    eventd.stop();
}

#[test]
fn log_lines_are_structured_and_json_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start_with(&data, None, &["--log-format", "json"]);
    let log_path = eventd.log.clone();
    eventd.stop();
    let log = read(&log_path);
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let recovered: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "ring recovered")
        .collect();
    // One per CPU ring, and one for eventd's own syslog ring.
    let syslog = u64::from(eventd::rings::SYSLOG_RING_CPU);
    let cpus = recovered
        .iter()
        .filter(|l| l["fields"]["cpu"] != syslog)
        .count();
    assert_eq!(cpus, eventd::rings::online_cpus().len(), "{log}");
    assert_eq!(recovered.len(), cpus + 1, "{log}");
    for l in recovered {
        assert_eq!(l["level"], "INFO");
        assert!(
            l["fields"]["cpu"].is_u64() && l["fields"]["resume_seq"] == 1,
            "{l}"
        );
    }
    // The default is text, to stderr, without colours when not a terminal.
    let eventd = Eventd::start(&data, None);
    let log_path = eventd.log.clone();
    eventd.stop();
    let log = read(&log_path);
    assert!(
        log.contains("ring recovered cpu=") && !log.contains('\x1b'),
        "{log}"
    );
}

#[test]
fn a_start_up_failure_after_the_threads_started_stops_them_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The metrics port is taken: the listener is the last thing to start.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = config(
        dir.path(),
        &format!("MetricsListen = \"127.0.0.1:{port}\"\n"),
    );
    let (mut cmd, log) = command(&data, Some(&cfg), &[]);
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "eventd did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
    let log = read(&log);
    assert!(
        log.contains("MetricsListen") && log.contains(&port.to_string()),
        "{log}"
    );
    // Everything was stopped cleanly: the next start finds a clean stop.
    drop(taken);
    let eventd = Eventd::start(&data, None);
    let log_path = eventd.log.clone();
    eventd.stop();
    assert!(!read(&log_path).contains("did not stop cleanly"));
}
