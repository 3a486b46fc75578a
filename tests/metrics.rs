//! Metrics against counted truth: a known load through the real daemon,
//! then every figure compared with what the test emitted, what the shard
//! files hold and what the query server was asked. Scraped both ways: the
//! loopback HTTP listener and `eventctl stats --prometheus`.
#![cfg(not(loom))]

mod common;

use common::*;
use eventd::rings::{now_ns, online_cpus, Emitter, Event, Level};
use prometheus_parse::{Scrape, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

fn scrape_http(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// name → (label value of `label`, or "" → value), for counters and gauges;
/// histograms as their `_count`.
fn parse(text: &str, label: &str) -> BTreeMap<String, BTreeMap<String, f64>> {
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for s in scrape.samples {
        let key = s.labels.get(label).unwrap_or("").to_string();
        let v = match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            Value::Histogram(b) => b.last().map_or(0.0, |b| b.count),
            Value::Summary(_) => continue,
        };
        out.entry(s.metric).or_default().insert(key, v);
    }
    out
}

/// (upper bound, cumulative count) of histogram `name` for `shard`.
fn buckets(text: &str, name: &str, shard: &str) -> Vec<(f64, f64)> {
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let sample = scrape
        .samples
        .into_iter()
        .find(|s| s.metric == name && s.labels.get("shard") == Some(shard))
        .unwrap_or_else(|| panic!("no {name} for shard {shard}"));
    let Value::Histogram(buckets) = sample.value else {
        panic!("{name} is not a histogram");
    };
    assert!(buckets.len() > 5);
    buckets.iter().map(|b| (b.less_than, b.count)).collect()
}

/// The number of items of each of a shard's commits, from its receipts
/// (one commit time per commit).
fn commit_sizes(c: &rusqlite::Connection) -> Vec<f64> {
    commit_sizes_since(c, 0)
}

/// As [`commit_sizes`], for the commits at or after `since_ns`.
fn commit_sizes_since(c: &rusqlite::Connection, since_ns: i64) -> Vec<f64> {
    let mut stmt = c
        .prepare(
            "SELECT sum(last_seq - first_seq + 1) FROM receipts WHERE committed_at >= ?1 \
             GROUP BY committed_at",
        )
        .unwrap();
    stmt.query_map([since_ns], |r| r.get::<_, i64>(0))
        .unwrap()
        .map(|n| n.unwrap() as f64)
        .collect()
}

/// Each bucket of `eventd_shard_commit_items` for `shard` counts exactly
/// the commits of at most `le` items.
fn assert_item_buckets_match(text: &str, shard: &str, sizes: &[f64]) {
    for (le, count) in buckets(text, "eventd_shard_commit_items", shard) {
        let truth = sizes.iter().filter(|&&n| n <= le).count() as f64;
        assert_eq!(count, truth, "shard {shard}, items <= {le}: {sizes:?}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn queries_running(port: u16) -> f64 {
    parse(&scrape_http(port), "")["eventd_queries_running"][""]
}

/// One of the test's events, stamped now.
fn event<'a>(name: &'a str, message: &'a str, fields: &'a str) -> Event<'a> {
    Event {
        ts_ns: now_ns(),
        pid: 1,
        tid: 1,
        uid: 0,
        level: Level::Notice,
        provider: "metrics-test",
        name,
        message,
        fields,
    }
}

#[test]
fn metrics_match_counted_truth_after_a_known_load() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let cfg = config(
        dir.path(),
        &format!(
            "StorageShards = 3\nMaxConcurrentQueries = 1\nMetricsListen = \"127.0.0.1:{port}\"\n\
             RateLimitBurst = 0\n"
        ),
    );
    let eventd = Eventd::start(&data, Some(&cfg));

    // A known load: a different number of events per ring, messages of
    // varying length, some with fields.
    let cpus = online_cpus();
    let emitter = Emitter::open(data.join("kmes")).unwrap();
    let mut per_cpu: BTreeMap<u32, u64> = BTreeMap::new();
    let mut bytes = 0u64;
    let mut total = 0u64;
    for (k, &cpu) in cpus.iter().enumerate() {
        let n = 700 + 400 * k as u64;
        for i in 0..n {
            let message = "m".repeat(1 + (i as usize * 7) % 300);
            let fields = if i % 3 == 0 {
                format!("{{\"i\":{i}}}")
            } else {
                String::new()
            };
            emitter
                .ring(cpu)
                .unwrap()
                .emit(&event("load", &message, &fields))
                .unwrap();
            bytes += ("metrics-test".len() + "load".len() + message.len() + fields.len()) as u64;
            total += 1;
            if total % 500 == 0 {
                wait_for_events(&data, total);
            }
        }
        per_cpu.insert(cpu, n);
    }
    wait_for_events(&data, total);

    // Known query traffic: the one slot held by a follower makes the next
    // query busy; a malformed request; a peer refused by its credentials.
    let mut follower = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(&data)
        .args(["query", "--follow"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the follower's slot", || queries_running(port) == 1.0);
    let busy = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(&data)
        .args(["query", "--limit", "1"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&busy.stderr).contains("busy"));
    follower.kill().unwrap();
    follower.wait().unwrap();
    wait_until("the slot back", || queries_running(port) == 0.0);
    let socket = data.join("run/query.sock");
    let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    writeln!(s, "not json").unwrap();
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer).unwrap();
    assert!(answer.contains("bad_request"), "{answer}");
    // Requests served: a query, a report, and again, counted one each (the
    // HTTP scrapes that read the figure are not requests).
    let served = || parse(&scrape_http(port), "")["eventd_queries_total"][""];
    let before = served();
    for args in [
        &["query", "--limit", "1"][..],
        &["stats"],
        &["query"],
        &["config"],
    ] {
        let out = Command::new(EVENTCTL)
            .arg("--data-dir")
            .arg(&data)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
    }
    assert_eq!(served() - before, 4.0);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut cmd = Command::new(EVENTCTL);
        cmd.arg("--data-dir").arg(&data).args(["query"]);
        as_nobody(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(String::from_utf8_lossy(&out.stderr).contains("denied"));
    }

    // The truth in the shard files (eventd's boot marker in them too).
    wait_until("the boot marker", || boot_markers(&data).0 == 1);
    let files = shards(&data);
    let file_of =
        |shard: &str| -> &rusqlite::Connection { &files[shard.parse::<usize>().unwrap()].1 };
    let one = |c: &rusqlite::Connection, sql: &str| -> f64 {
        c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap() as f64
    };

    for text in [
        scrape_http(port),
        eventctl_text(&data, &["stats", "--prometheus"]),
    ] {
        let by_cpu = parse(&text, "cpu");
        for (cpu, n) in &per_cpu {
            let cpu = cpu.to_string();
            assert_eq!(by_cpu["eventd_ring_drained_events_total"][&cpu], *n as f64);
            assert_eq!(by_cpu["eventd_ring_lost_events_total"][&cpu], 0.0);
            assert_eq!(
                by_cpu["eventd_ring_committed_through_seq"][&cpu], *n as f64,
                "every sequence committed"
            );
            assert_eq!(by_cpu["eventd_ring_backlog_bytes"][&cpu], 0.0);
        }

        let by_shard = parse(&text, "shard");
        let events = &by_shard["eventd_shard_events_total"];
        assert_eq!(events.len(), 3);
        // And eventd's own boot marker.
        let (markers, marker_bytes) = boot_markers(&data);
        assert_eq!(markers, 1);
        assert_eq!(events.values().sum::<f64>(), (total + markers) as f64);
        let event_bytes = &by_shard["eventd_shard_event_bytes_total"];
        assert_eq!(
            event_bytes.values().sum::<f64>(),
            (bytes + marker_bytes) as f64
        );
        for (shard, n) in events {
            let c = file_of(shard);
            assert_eq!(*n, one(c, "SELECT count(*) FROM events"), "shard {shard}");
            assert_eq!(
                event_bytes[shard],
                one(
                    c,
                    "SELECT coalesce(sum(length(CAST(provider AS BLOB)) \
                     + length(CAST(name AS BLOB)) + length(CAST(message AS BLOB)) \
                     + ifnull(length(CAST(fields AS BLOB)), 0)), 0) FROM events"
                ),
                "shard {shard}"
            );
            // Every commit wrote its receipts with one commit time.
            let commits = one(c, "SELECT count(DISTINCT committed_at) FROM receipts");
            assert_eq!(by_shard["eventd_shard_commits_total"][shard], commits);
            assert_eq!(by_shard["eventd_shard_commit_items"][shard], commits);
            assert_eq!(by_shard["eventd_shard_commit_seconds"][shard], commits);
            assert_eq!(by_shard["eventd_shard_emit_to_commit_seconds"][shard], *n);
            assert_eq!(by_shard["eventd_shard_gap_events_total"][shard], 0.0);
            assert_item_buckets_match(&text, shard, &commit_sizes(c));
            assert_eq!(by_shard["eventd_channel_occupied_slots"][shard], 0.0);
            assert!(by_shard["eventd_channel_capacity_slots"][shard] > 0.0);
        }

        let by_reason = parse(&text, "reason");
        let refused = &by_reason["eventd_queries_refused_total"];
        assert_eq!(refused["busy"], 1.0, "{text}");
        assert_eq!(refused["bad_request"], 1.0);
        assert_eq!(refused["denied"], if root { 1.0 } else { 0.0 });
        assert_eq!(by_reason["eventd_retention_deleted_events_total"][""], 0.0);
    }
    eventd.stop();

    // Losses: while eventd is down, one ring is written three times over.
    // The next daemon drains what is left and counts the rest lost, in its
    // metrics and as gap rows in the shards.
    let cpu = cpus[0];
    let ring_bytes = std::fs::metadata(data.join(format!("kmes/cpu-{cpu:03}.ring")))
        .unwrap()
        .len();
    let message = "x".repeat(300);
    let mut lapped = 0u64;
    while lapped * 300 < 3 * ring_bytes {
        emitter
            .ring(cpu)
            .unwrap()
            .emit(&event("lapped", &message, ""))
            .unwrap();
        lapped += 1;
    }
    let eventd = Eventd::start(&data, Some(&cfg));
    let key = cpu.to_string();
    let ring_figures = || {
        let by_cpu = parse(&scrape_http(port), "cpu");
        (
            by_cpu["eventd_ring_drained_events_total"][&key],
            by_cpu["eventd_ring_lost_events_total"][&key],
        )
    };
    wait_until("the lapped ring accounted for", || {
        let (drained, lost) = ring_figures();
        drained + lost == lapped as f64
    });
    let (drained, lost) = ring_figures();
    assert!(lost > 0.0, "a ring written three times over lost nothing");
    wait_for_events(&data, total + drained as u64);
    let files = shards(&data);
    let sum = |sql: &str| -> f64 {
        files
            .iter()
            .map(|(_, c)| c.query_row(sql, [cpu], |r| r.get::<_, i64>(0)).unwrap() as f64)
            .sum()
    };
    assert_eq!(
        drained,
        sum("SELECT count(*) FROM events WHERE name = 'lapped' AND cpu = ?1")
    );
    assert_eq!(
        lost,
        sum("SELECT ifnull(sum(lost), 0) FROM gaps WHERE cpu = ?1")
    );
    let text = eventctl_text(&data, &["stats", "--prometheus"]);
    let by_shard = parse(&text, "shard");
    assert_eq!(
        by_shard["eventd_shard_gap_events_total"]
            .values()
            .sum::<f64>(),
        lost,
        "{text}"
    );
    eventd.stop();
}

/// The writer runs its checkpoints itself, between batches: after more
/// than ~4 MB of WAL the metric counts them, the WAL has been copied back
/// into the database file, and the WAL file stays within the ~16 MB a
/// writer lets it reach.
#[test]
fn writers_checkpoint_between_batches_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let cfg = config(
        dir.path(),
        &format!("StorageShards = 1\nMetricsListen = \"127.0.0.1:{port}\"\n"),
    );
    let eventd = Eventd::start(&data, Some(&cfg));
    let emitter = Emitter::open(data.join("kmes")).unwrap();
    let cpu = online_cpus()[0];
    let message = "c".repeat(2000);
    let mut total = 0u64;
    // About 16 MB of messages, in steps the writer keeps up with.
    for _ in 0..16 {
        for _ in 0..500 {
            emitter
                .ring(cpu)
                .unwrap()
                .emit(&event("checkpoint", &message, ""))
                .unwrap();
            total += 1;
        }
        wait_for_events(&data, total);
    }
    let metrics = parse(&scrape_http(port), "shard");
    let checkpoints = metrics["eventd_shard_checkpoints_total"]["0"];
    assert!(checkpoints >= 2.0, "{checkpoints} checkpoints");
    assert!(metrics["eventd_shard_checkpoint_seconds_total"]["0"] > 0.0);
    // The stats agree with the metrics. A checkpoint may finish between
    // the two reads (the writer runs one in its first idle moment, which
    // can be right now), so the stats' count lies between two scrapes.
    let stats = eventctl_json(&data, "stats");
    let after = parse(&scrape_http(port), "shard")["eventd_shard_checkpoints_total"]["0"];
    let counted = stats["stats"]["shards"][0]["checkpoints"]
        .as_u64()
        .expect("a checkpoint count in the stats");
    assert!(
        checkpoints as u64 <= counted && counted <= after as u64,
        "stats say {counted} checkpoints, the metrics {checkpoints} before and {after} after"
    );
    let wal = std::fs::metadata(data.join("store/shard-000.db-wal"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(wal < 24 << 20, "WAL of {wal} bytes");
    // What the WAL held is in the database file: far more than one
    // checkpoint's worth of pages.
    let db = std::fs::metadata(data.join("store/shard-000.db"))
        .unwrap()
        .len();
    assert!(db > 8 << 20, "database file of {db} bytes");
    eventd.stop();
}

/// Commits of 257 items, a size an hdrhistogram at two significant figures
/// keeps in one slot with 256: the `le="256"` bucket still counts exactly
/// the commits of at most 256 items. A backlog waiting in a ring when
/// eventd starts is committed in batches of MaxBatchSize, here 257, as a
/// loaded host's writer commits whatever piled up while it was busy.
#[test]
fn item_buckets_are_exact_at_their_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // One source's backlog of 10,280 events: limits off.
    let cfg = config(
        dir.path(),
        "StorageShards = 1\nMaxBatchSize = 257\nRateLimitBurst = 0\n",
    );
    // A first start makes the rings; the backlog is written while eventd
    // is down.
    Eventd::start(&data, Some(&cfg)).stop();
    let emitter = Emitter::open(data.join("kmes")).unwrap();
    let cpu = online_cpus()[0];
    const EVENTS: u64 = 257 * 40;
    for i in 0..EVENTS {
        emitter
            .ring(cpu)
            .unwrap()
            .emit(&event("backlog", &format!("event {i}"), ""))
            .unwrap();
    }
    // The first start committed its boot marker; the metrics are this
    // start's.
    let started = now_ns();
    let eventd = Eventd::start(&data, Some(&cfg));
    wait_for_events(&data, EVENTS);
    wait_until("both boot markers", || boot_markers(&data).0 == 2);
    let text = eventctl_text(&data, &["stats", "--prometheus"]);
    let files = shards(&data);
    let sizes = commit_sizes_since(&files[0].1, started);
    assert_eq!(sizes.iter().sum::<f64>(), (EVENTS + 1) as f64);
    assert!(
        sizes.contains(&257.0),
        "no full batch of 257 out of the backlog: {sizes:?}"
    );
    assert_item_buckets_match(&text, "0", &sizes);
    eventd.stop();
}
