//! The export stage against a real ClickHouse cluster: Debian's
//! `clickhouse-server` 18.16 as 2 shards × 2 replicas with a private
//! ZooKeeper (cluster/src/lib.rs), and real `eventd` processes with
//! different `HostName`s exporting into it.
//!
//! Every test ends the same way: once each host's store is exported, the
//! cluster holds exactly that host's events and gaps, on every replica of
//! the shard the host hashes to: the same multiset of (ring_epoch, cpu,
//! seq) as the local shards, so zero duplicates and zero missing.
//!
//! Skipped (with the `apt-get install` line) where ClickHouse or ZooKeeper
//! is missing, unless `EVENTD_REQUIRE_CLICKHOUSE=1` (scripts/test-all sets
//! it). The tests of this file run one at a time: each starts its own
//! cluster of four servers, and two cores hold one such cluster well.

use eventd_cluster as cluster;
mod common;
#[path = "common/export.rs"]
mod export_common;

use cluster::{wait_until as wait_for, Options};
use common::{config, read, Eventd, EVENTCTL};
use export_common::*;
use rand::Rng;
use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One cluster at a time (see the module docs).
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn fleet_of_four_hosts_exports_exactly_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = cluster(Options::default()) else {
        return;
    };
    let db = "fleet";
    init_schema(&c, db);
    let dir = tempfile::tempdir().unwrap();
    let urls = c.urls();
    let mut hosts: Vec<Host> = (0..4)
        .map(|i| {
            Host::new(
                dir.path(),
                &format!("fleet-{i}"),
                &urls[i % urls.len()],
                db,
                700,
            )
        })
        .collect();
    for h in &mut hosts {
        h.start();
    }
    // All four emit at once, three rounds each; hosts 0 and 1 also lap a
    // ring in every round, so gaps are exported beside events.
    let threads: Vec<_> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let (data, pid) = (h.data.clone(), h.pid());
            std::thread::spawn(move || {
                for round in 0..3 {
                    emit(&data, i % 2, &format!("h{i}r{round}"), 1500);
                    if i < 2 {
                        lap(pid, &data, (i + round) % 2, &format!("lap{i}r{round}"));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut total_gaps = 0;
    for h in &hosts {
        wait_exported(h, Duration::from_secs(120));
        // Every event emitted is stored or counted lost (checked inside):
        // a lap overwrites events, and so does a drain that falls behind
        // (a 64 KiB ring holds about 500 of them; on a loaded machine one
        // host stored 1,362 of its 4,500 and counted the rest in 3 gaps).
        let (events, gaps) = assert_exactly_once(&c, db, h);
        assert!(events > 0, "{}: no event stored", h.name);
        total_gaps += gaps;
    }
    assert!(total_gaps > 0, "the lapped rings left no gap");

    // The fleet query answers for each host what its own store holds.
    for h in &hosts {
        let out = Command::new(EVENTCTL)
            .args(["query", "--cluster", &urls[3], "--database", db])
            .args(["--host", &h.name, "--output", "json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (mut events, mut gaps) = (0, 0);
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if v.get("gap").is_some() {
                assert_eq!(v["host"], h.name.as_str());
                gaps += 1;
            } else if v.get("seq").is_some() {
                assert_eq!(v["host"], h.name.as_str(), "{line}");
                events += 1;
            }
        }
        let (want_events, want_gaps) = local(&h.data);
        assert_eq!(events, want_events.len(), "{}: fleet query events", h.name);
        assert_eq!(gaps, want_gaps.len(), "{}: fleet query gaps", h.name);
    }
    for h in &mut hosts {
        h.stop();
    }
}

#[test]
fn eventd_killed_at_random_moments_during_export() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = cluster(Options::default()) else {
        return;
    };
    let db = "killed";
    init_schema(&c, db);
    let dir = tempfile::tempdir().unwrap();
    // Small batches: many intents recorded, sent and advanced per second,
    // so the kills land between every pair of steps.
    let mut hosts: Vec<Host> = (0..2)
        .map(|i| Host::new(dir.path(), &format!("killed-{i}"), &c.url(1 + i, 1), db, 37))
        .collect();
    for h in &mut hosts {
        h.start();
    }
    let mut rng = rand::rng();
    const KILLS: usize = 12;
    for k in 0..KILLS {
        let h = &mut hosts[k % 2];
        let data = h.data.clone();
        let emitter = std::thread::spawn(move || emit(&data, k % 2, &format!("k{k}"), 2500));
        std::thread::sleep(Duration::from_millis(rng.random_range(100..1500)));
        h.kill9();
        emitter.join().unwrap();
        h.start();
    }
    let mut settled = 0;
    for h in &hosts {
        let status = wait_exported(h, Duration::from_secs(180));
        let (events, _) = assert_exactly_once(&c, db, h);
        // What the restarts found: a batch whose send a kill cut short,
        // found landed or sent again (its missing rows only).
        let (landed, resent) = (
            h.logged("is in the cluster: not resent"),
            h.logged("resending the rows the cluster does not hold"),
        );
        eprintln!(
            "{}: {events} events; after the kills {landed} batches were found landed and \
             {resent} sent again; since the last start: sent {}",
            h.name,
            sum_status(&status, "batches_sent"),
        );
        settled += landed + resent;
        assert!(events > 0, "{}: {events} events", h.name);
    }
    // Twelve kills in the middle of a steady export of small batches: some
    // of them cut a batch between its intent and its cursor.
    assert!(settled > 0, "no kill interrupted a batch");
    for h in &mut hosts {
        h.stop();
    }
}

#[test]
fn replica_killed_and_restarted() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut c) = cluster(Options::default()) else {
        return;
    };
    let db = "replica";
    init_schema(&c, db);
    let dir = tempfile::tempdir().unwrap();
    // The host's rows go to shard 1; it talks to a server of shard 2.
    let name = host_on_shard(&c, 1, "replica-");
    let mut host = Host::new(dir.path(), &name, &c.url(2, 1), db, 500);
    host.start();
    emit(&host.data, 0, "before", 2000);
    wait_exported(&host, Duration::from_secs(60));
    let data = host.data.clone();
    let emitter = std::thread::spawn(move || {
        for round in 0..6 {
            emit(&data, round % 2, &format!("during{round}"), 1000);
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    c.kill(1, 1);
    std::thread::sleep(Duration::from_secs(4));
    c.restart(1, 1);
    emitter.join().unwrap();
    emit(&host.data, 1, "after", 1000);
    assert!(c.wait_all_writable(Duration::from_secs(60)));
    wait_exported(&host, Duration::from_secs(120));
    let (events, _) = assert_exactly_once(&c, db, &host);
    assert!(events > 0, "{events} events");
    host.stop();
}

/// A replica of the other shard is down: this host's rows all go to shard
/// 1, so its sends, settles after kill -9 and its reconcile after a
/// restart ask only shard 1's replicas, and it keeps exporting.
#[test]
fn a_host_keeps_exporting_while_a_replica_of_another_shard_is_down() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut c) = cluster(Options::default()) else {
        return;
    };
    let db = "elsewhere";
    init_schema(&c, db);
    let dir = tempfile::tempdir().unwrap();
    let name = host_on_shard(&c, 1, "home-");
    let mut host = Host::new(dir.path(), &name, &c.url(1, 1), db, 37);
    host.start();
    emit(&host.data, 0, "before", 1000);
    wait_exported(&host, Duration::from_secs(60));
    c.kill(2, 1);
    // A restart (each file reconciled first), then kills in the middle of
    // batches (each pending batch settled).
    host.stop();
    host.start();
    let mut rng = rand::rng();
    for k in 0..4 {
        let data = host.data.clone();
        let emitter = std::thread::spawn(move || emit(&data, k % 2, &format!("k{k}"), 1500));
        std::thread::sleep(Duration::from_millis(rng.random_range(200..1200)));
        host.kill9();
        emitter.join().unwrap();
        host.start();
    }
    emit(&host.data, 1, "after", 1000);
    let status = wait_exported(&host, Duration::from_secs(120));
    assert_eq!(status["cluster"]["shard"], 1, "{status}");
    assert_eq!(status["cluster"]["shard_replicas"], 2, "{status}");
    c.restart(2, 1);
    let (events, _) = assert_exactly_once(&c, db, &host);
    assert!(events > 0, "{events} events");
    host.stop();
}

#[test]
fn zookeeper_stopped_longer_than_the_http_timeout() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut c) = cluster(Options::default()) else {
        return;
    };
    let db = "zk";
    init_schema(&c, db);
    let dir = tempfile::tempdir().unwrap();
    let mut hosts: Vec<Host> = (0..2)
        .map(|i| Host::new(dir.path(), &format!("zk-{i}"), &c.url(1 + i, 2), db, 300))
        .collect();
    for h in &mut hosts {
        h.start();
        emit(&h.data, 0, "before", 1000);
    }
    c.stop_zookeeper();
    // Four times the exporters' HTTP timeout without ZooKeeper, emitting.
    let timeout = Duration::from_millis(EXPORT_TIMEOUT_MS.parse().unwrap());
    let outage = Instant::now();
    for (i, h) in hosts.iter().enumerate() {
        emit(&h.data, 1, &format!("outage{i}"), 1500);
    }
    let failing = wait_for(Duration::from_secs(30), || {
        hosts.iter().all(|h| {
            h.status()
                .and_then(|s| s["shards"].as_array().cloned())
                .is_some_and(|s| s.iter().any(|s| s["failures"].as_u64() > Some(0)))
        })
    });
    assert!(failing, "the exporters did not notice ZooKeeper was gone");
    if let Some(rest) = (4 * timeout).checked_sub(outage.elapsed()) {
        std::thread::sleep(rest);
    }
    c.start_zookeeper();
    for (i, h) in hosts.iter().enumerate() {
        emit(&h.data, 0, &format!("after{i}"), 1000);
    }
    assert!(c.wait_all_writable(Duration::from_secs(90)));
    for h in &hosts {
        wait_exported(h, Duration::from_secs(120));
        let (events, _) = assert_exactly_once(&c, db, h);
        assert!(events > 0, "{}: {events} events", h.name);
        // Reads worked without ZooKeeper, so every retry found rows missing
        // and tried to resend them: the log says so once per file and
        // outage, and at its end how many tries it took.
        let outages = h.logged("export: sending again");
        let resending = h.logged("resending the rows the cluster does not hold");
        let not_sent = h.logged("export: batch not sent");
        let tries: Vec<u64> = h
            .logs
            .iter()
            .flat_map(|l| {
                read(l)
                    .lines()
                    .filter(|line| line.contains("export: sending again"))
                    .filter_map(|line| {
                        let rest = line.split("failed_tries=").nth(1)?;
                        rest.split(' ').next()?.parse().ok()
                    })
                    .collect::<Vec<u64>>()
            })
            .collect();
        eprintln!(
            "{}: {outages} outages ended, tries {tries:?}; {resending} resending lines, \
             {not_sent} not-sent lines",
            h.name
        );
        assert!(outages >= 1, "{}: no outage ended", h.name);
        assert!(tries.iter().any(|&t| t > 1), "{}: {tries:?}", h.name);
        assert!(resending <= outages, "{}: {resending} > {outages}", h.name);
        // An error is said once per file and outage: no line (without its
        // time and backoff) more often than the outages that ended.
        let mut said: BTreeMap<String, usize> = BTreeMap::new();
        for l in &h.logs {
            for line in read(l)
                .lines()
                .filter(|l| l.contains("export: batch not sent"))
            {
                let key = line.split_once(' ').map_or(line, |(_, rest)| rest);
                let key = key.split(" retry_in=").next().unwrap_or(key);
                *said.entry(key.to_string()).or_default() += 1;
            }
        }
        for (line, n) in &said {
            assert!(*n <= outages, "{}: said {n} times: {line}", h.name);
        }
    }
    for h in &mut hosts {
        h.stop();
    }
}

#[test]
fn clickhouse_server_stopped_then_continued() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let opts = Options {
        remote_timeout: Some(Duration::from_secs(3)),
        ..Options::default()
    };
    let Some(mut c) = cluster(opts) else {
        return;
    };
    let db = "stopped";
    init_schema(&c, db);
    let dir = tempfile::tempdir().unwrap();
    let name = host_on_shard(&c, 1, "stopped-");
    // It talks to s1r1 and its rows belong to shard 1.
    let mut host = Host::new(dir.path(), &name, &c.url(1, 1), db, 400);
    host.start();
    emit(&host.data, 0, "before", 1000);
    // First the server the exporter talks to, then the other replica of
    // its shard, each stopped for three times the HTTP timeout while
    // events keep coming.
    for (s, r) in [(1, 1), (1, 2)] {
        c.sigstop(s, r);
        let stopped = Instant::now();
        emit(&host.data, r % 2, &format!("stopped{r}"), 1500);
        let timeout = Duration::from_millis(EXPORT_TIMEOUT_MS.parse().unwrap());
        if let Some(rest) = (3 * timeout).checked_sub(stopped.elapsed()) {
            std::thread::sleep(rest);
        }
        c.sigcont(s, r);
        emit(&host.data, 0, &format!("continued{r}"), 500);
    }
    assert!(c.wait_all_writable(Duration::from_secs(60)));
    wait_exported(&host, Duration::from_secs(120));
    let (events, _) = assert_exactly_once(&c, db, &host);
    assert!(events > 0, "{events} events");
    host.stop();
}

/// A TCP relay in front of one server that can lose the answer to one
/// insert: it lets the request through, reads the server's answer (so the
/// block has landed) and closes the connection instead of passing it on;
/// from then on it refuses everything until `pass` is called. A network
/// that fails at the worst moment, no stand-in for ClickHouse.
struct CutRelay {
    port: u16,
    /// 0 pass, 1 cut the next insert's answer, 2 refuse.
    mode: Arc<AtomicU8>,
    /// The server answered the cut insert with 200.
    landed: Arc<AtomicBool>,
}

impl CutRelay {
    const PASS: u8 = 0;
    const CUT: u8 = 1;
    const REFUSE: u8 = 2;

    fn start(upstream_port: u16) -> CutRelay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(Self::PASS));
        let landed = Arc::new(AtomicBool::new(false));
        let (m, l) = (mode.clone(), landed.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if m.load(Ordering::SeqCst) == Self::REFUSE {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)) else {
                    continue;
                };
                let (m, l) = (m.clone(), l.clone());
                std::thread::spawn(move || Self::relay(client, server, m, l));
            }
        });
        CutRelay { port, mode, landed }
    }

    fn relay(client: TcpStream, server: TcpStream, mode: Arc<AtomicU8>, landed: Arc<AtomicBool>) {
        let cut = Arc::new(AtomicBool::new(false));
        let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let (m, cut_up) = (mode.clone(), cut.clone());
        // Client to server; marks the connection when the insert to cut
        // goes through it.
        let up = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match c_in.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let chunk = &buf[..n];
                if m.load(Ordering::SeqCst) == Self::REFUSE && !cut_up.load(Ordering::SeqCst) {
                    break;
                }
                if m.load(Ordering::SeqCst) == Self::CUT
                    && chunk.starts_with(b"POST")
                    && String::from_utf8_lossy(chunk).contains("query=INSERT")
                {
                    cut_up.store(true, Ordering::SeqCst);
                    m.store(Self::REFUSE, Ordering::SeqCst);
                }
                if s_out.write_all(chunk).is_err() {
                    break;
                }
            }
            let _ = s_out.shutdown(Shutdown::Write);
        });
        let (mut s_in, mut c_out) = (server, client);
        let mut buf = vec![0u8; 64 * 1024];
        let mut answer = Vec::new();
        loop {
            let n = match s_in.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if cut.load(Ordering::SeqCst) {
                // The cut insert's answer: keep it from the client.
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    if answer.starts_with(b"HTTP/1.1 200") {
                        landed.store(true, Ordering::SeqCst);
                    }
                    break;
                }
                continue;
            }
            if mode.load(Ordering::SeqCst) == Self::REFUSE || c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Both);
        let _ = s_in.shutdown(Shutdown::Both);
        let _ = up.join();
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

/// The answer to an insert is lost after the block landed, and the retry
/// comes after other hosts' inserts have pushed that block out of the
/// deduplication window (3 blocks here): ClickHouse would take the resend
/// as new rows. The exporter must find the rows already there instead.
#[test]
fn retry_outside_the_deduplication_window_does_not_duplicate() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let opts = Options {
        dedup_window: Some(3),
        cleanup_delay_period: Some(1),
        ..Options::default()
    };
    let Some(c) = cluster(opts) else {
        return;
    };
    let db = "window";
    init_schema(&c, db);
    let dir = tempfile::tempdir().unwrap();
    let relay = CutRelay::start(url_port(&c.url(1, 1)));
    let (a_name, b_name) = (host_on_shard(&c, 1, "cut-"), host_on_shard(&c, 1, "busy-"));
    let mut a = Host::new(dir.path(), &a_name, &relay.url(), db, 100_000);
    let mut b = Host::new(dir.path(), &b_name, &c.url(1, 2), db, 50);
    a.start();
    b.start();
    emit(&a.data, 0, "first", 500);
    wait_exported(&a, Duration::from_secs(60));

    // One batch of A lands and A never hears of it.
    relay.set(CutRelay::CUT);
    emit(&a.data, 1, "cut", 500);
    assert!(
        wait_for(Duration::from_secs(30), || relay
            .landed
            .load(Ordering::SeqCst)),
        "no insert went through the relay:\n{}",
        a.log()
    );
    // Meanwhile B inserts into the same shard's tables, far more blocks
    // than the window keeps, and the cleanup forgets the old ones.
    emit(&b.data, 0, "busy", 1500);
    wait_exported(&b, Duration::from_secs(60));
    let blocks_path = format!("/clickhouse/tables/1/{db}/events/blocks");
    let forgot = wait_for(Duration::from_secs(30), || {
        let kept = c.count(
            &c.url(1, 1),
            &format!("SELECT count() FROM system.zookeeper WHERE path = '{blocks_path}'"),
        );
        kept <= 3
    });
    assert!(
        forgot,
        "the cleanup did not trim the block ids to the window"
    );
    let status_before = a.status().unwrap();
    assert_eq!(
        sum_status(&status_before, "batches_deduplicated"),
        0,
        "{status_before}"
    );

    relay.set(CutRelay::PASS);
    let status = wait_exported(&a, Duration::from_secs(90));
    assert!(
        sum_status(&status, "batches_deduplicated") >= 1,
        "the lost answer's batch was not settled as landed: {status}"
    );
    assert_eq!(sum_status(&status, "rows_resent"), 0, "{status}");
    assert_exactly_once(&c, db, &a);
    assert_exactly_once(&c, db, &b);
    a.stop();
    b.stop();
}

fn url_port(url: &str) -> u16 {
    url.trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("http://127.0.0.1:PORT/")
}

/// A shard file goes back under its export cursor (restored from an older
/// copy; a power cut with `synchronous = NORMAL` does the same to the
/// newest commits): the ids it hands out next were already exported with
/// other rows, and the rings commit some lost events again under new ids.
/// The cluster must end with every event the host ever exported or holds
/// now, each once.
#[test]
fn a_shard_file_rolled_back_under_its_cursor_loses_and_duplicates_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = cluster(Options::default()) else {
        return;
    };
    let db = "rolled";
    init_schema(&c, db);
    let dir = tempfile::tempdir().unwrap();
    let mut host = Host::new(dir.path(), "rolled-0", &c.url(1, 1), db, 200);
    let store = host.data.join("store");
    host.start();
    emit(&host.data, 0, "one", 1500);
    wait_exported(&host, Duration::from_secs(60));
    host.stop();
    let copy = dir.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    let sides = ["shard-000.db", "shard-000.db-wal", "shard-000.db-shm"];
    for f in sides {
        if store.join(f).exists() {
            std::fs::copy(store.join(f), copy.join(f)).unwrap();
        }
    }
    host.start();
    emit(&host.data, 0, "two", 1500);
    emit(&host.data, 1, "two", 1500);
    wait_exported(&host, Duration::from_secs(60));
    // More than the ring holds, after "two" is stored: none of "two" is
    // left in ring 0 to be drained again, so the restored file has surely
    // lost events the cluster has (without this, a drain that lagged
    // through "two" stored only its tail, still in the ring, and the
    // restored file lost nothing).
    emit(&host.data, 0, "two-more", 1500);
    wait_exported(&host, Duration::from_secs(60));
    host.stop();
    let (before, _) = local(&host.data);
    for f in sides {
        let _ = std::fs::remove_file(store.join(f));
        if copy.join(f).exists() {
            std::fs::copy(copy.join(f), store.join(f)).unwrap();
        }
    }
    host.start();
    emit(&host.data, 0, "three", 1500);
    emit(&host.data, 1, "three", 1500);
    wait_exported(&host, Duration::from_secs(90));
    // The events table always (gaps only if a ring lapped in between).
    assert!(
        host.logged("holds fewer rows than were exported") >= 1,
        "shard-000 found rolled back:\n{}",
        host.log()
    );
    let (now, _) = local(&host.data);
    let mut want: Vec<Key> = before.iter().chain(&now).copied().collect();
    want.sort();
    want.dedup();
    assert!(
        want.len() > now.len(),
        "the restored file lost events the cluster has"
    );
    let mut seen = remote(&c, db, &host.name);
    let settled = wait_for(Duration::from_secs(60), || {
        seen = remote(&c, db, &host.name);
        seen.iter()
            .all(|shard| shard.iter().all(|r| r == &shard[0]))
    });
    assert!(settled, "replicas disagree");
    let have: Vec<Key> = {
        let mut all: Vec<Key> = seen.iter().flat_map(|s| s[0].0.clone()).collect();
        all.sort();
        all
    };
    let (missing, extra) = diff(&want, &have);
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{} missing (first {:?}), {} extra or duplicated (first {:?}); want {}, have {}",
        missing.len(),
        missing.first(),
        extra.len(),
        extra.first(),
        want.len(),
        have.len()
    );
    host.stop();
}

/// The niceness of each of `pid`'s threads whose name starts with
/// `prefix` (field 19 of /proc/PID/task/TID/stat).
fn thread_nices(pid: u32, prefix: &str) -> Vec<i64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut nices = Vec::new();
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The name in parentheses may hold spaces; the fields after it
        // start at state (field 3), so niceness (19) is the 17th.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            if let Some(n) = rest.split_whitespace().nth(16).and_then(|n| n.parse().ok()) {
                nices.push(n);
            }
        }
    }
    nices
}

/// Whether a thread of this process may lower its niceness (19 to 15), as
/// eventd's export threads do when ExportNice is lowered: probed on a
/// thread of its own.
fn can_lower_niceness() -> bool {
    use eventd::threads::set_own_nice;
    std::thread::spawn(|| set_own_nice(19).is_ok() && set_own_nice(15).is_ok())
        .join()
        .unwrap()
}

/// Export is background work: its threads run at `ExportNice` (19 by
/// default) while eventd leaves the drains and writers at the niceness it
/// was started at (0 normally; more when the suite runs under `nice`), and
/// a reload changes it live. No cluster is needed: the workers start and
/// back off against a port nothing listens on.
#[test]
fn export_threads_run_below_ingestion_and_follow_export_nice() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ExportUrl = \"http://127.0.0.1:{port}/\"\n");
    let cfg = config(dir.path(), &url);
    // eventd inherits this thread's niceness.
    let started_at = i64::from(eventd::threads::own_nice().unwrap());
    let eventd = Eventd::start(&data, Some(&cfg));
    let pid = eventd.child.id();
    let all = |prefix: &str, nice: i64| {
        let n = thread_nices(pid, prefix);
        !n.is_empty() && n.iter().all(|&x| x == nice)
    };
    assert!(
        wait_for(Duration::from_secs(30), || {
            all("export-", eventd::config::EXPORT_NICE_DEFAULT as i64)
        }),
        "export threads: {:?}",
        thread_nices(pid, "export-")
    );
    assert!(
        all("drain-", started_at),
        "drains: {:?}, eventd started at niceness {started_at}",
        thread_nices(pid, "drain-")
    );
    assert!(
        all("writer-", started_at),
        "writers: {:?}, eventd started at niceness {started_at}",
        thread_nices(pid, "writer-")
    );

    // A live change, written the way editors do (new file, renamed over).
    let tmp = dir.path().join("eventd.toml.new");
    // Below the default, which takes CAP_SYS_NICE or RLIMIT_NICE (root in
    // a container may lack it): without it the change is refused with the
    // key and the threads keep theirs.
    std::fs::write(&tmp, format!("{url}ExportNice = 15\n")).unwrap();
    std::fs::rename(&tmp, &cfg).unwrap();
    if !can_lower_niceness() {
        assert!(wait_for(Duration::from_secs(30), || {
            std::fs::read_to_string(&eventd.log)
                .is_ok_and(|l| l.contains("ExportNice = 15") && l.contains("CAP_SYS_NICE"))
        }));
        let nice = eventd::config::EXPORT_NICE_DEFAULT as i64;
        assert!(all("export-", nice), "{:?}", thread_nices(pid, "export-"));
        eventd.stop();
        return;
    }
    assert!(
        wait_for(Duration::from_secs(30), || all("export-", 15)),
        "export threads after the reload: {:?}",
        thread_nices(pid, "export-")
    );
    // Out of range: refused with the key, the running value kept.
    std::fs::write(&tmp, format!("{url}ExportNice = 20\n")).unwrap();
    std::fs::rename(&tmp, &cfg).unwrap();
    assert!(wait_for(Duration::from_secs(30), || {
        common::eventctl_json(&data, "config")["config"]["last_reload_error"]
            .as_str()
            .is_some_and(|e| e.contains("ExportNice = 20") && e.contains("0..=19"))
    }));
    assert!(all("export-", 15), "{:?}", thread_nices(pid, "export-"));
    eventd.stop();
}
