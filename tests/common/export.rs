//! What the export tests share: a real `eventd` exporting to a test
//! ClickHouse (`cluster.rs`), and the checks that the server holds
//! exactly what the host's shard files hold.
#![allow(dead_code)] // each test crate uses a different part

use crate::cluster::{wait_until as wait_for, Cluster, Options};
use crate::common;
use crate::common::{config, pin, read, Eventd, EVENTCTL};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The HTTP timeout the exporters get: short, so that faults are noticed
/// within the test's patience, and shorter than the ZooKeeper outage.
pub const EXPORT_TIMEOUT_MS: &str = "2000";

/// Whether this machine can run ClickHouse; if not, says why (a panic
/// under `EVENTD_REQUIRE_CLICKHOUSE=1`, which scripts/test-all sets).
pub fn available() -> bool {
    if let Err(why) = Cluster::available() {
        if std::env::var("EVENTD_REQUIRE_CLICKHOUSE").is_ok_and(|v| v == "1") {
            panic!("EVENTD_REQUIRE_CLICKHOUSE=1 but {why}");
        }
        eprintln!("skipped: {why}");
        return false;
    }
    true
}

/// 2 shards × 2 replicas, or None (and why) when this machine cannot run
/// them.
pub fn cluster(opts: Options) -> Option<Cluster> {
    available().then(|| Cluster::start(2, 2, opts))
}

/// One server without ZooKeeper or a cluster, or None (and why).
pub fn single(opts: Options) -> Option<Cluster> {
    available().then(|| Cluster::start_single(opts))
}

/// `eventctl export init` into `db`, through one server.
pub fn init_schema(c: &Cluster, db: &str) {
    let out = Command::new(EVENTCTL)
        .args(["export", "init", "--url", &c.url(1, 1), "--database", db])
        .args(["--cluster", c.name()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "export init: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A host name that `cityHash64(host)` sends to `shard` (numbered from 1),
/// asked of the cluster itself.
pub fn host_on_shard(c: &Cluster, shard: usize, prefix: &str) -> String {
    (0..1000)
        .map(|i| format!("{prefix}{i}"))
        .find(|h| {
            let sql = format!("SELECT cityHash64('{h}') % {}", c.shards());
            c.query(&c.url(1, 1), &sql).trim() == (shard - 1).to_string()
        })
        .expect("some name hashes to every shard")
}

/// One eventd with its own data directory, configuration and host name.
pub struct Host {
    pub name: String,
    pub data: PathBuf,
    pub cfg: PathBuf,
    pub eventd: Option<Eventd>,
    /// The log of every start, oldest first.
    pub logs: Vec<PathBuf>,
}

impl Host {
    pub fn new(root: &Path, name: &str, url: &str, db: &str, batch_rows: u64) -> Host {
        Self::with_config(root, name, url, db, batch_rows, "")
    }

    /// [`Host::new`] with more configuration lines (`extra`).
    pub fn with_config(
        root: &Path,
        name: &str,
        url: &str,
        db: &str,
        batch_rows: u64,
        extra: &str,
    ) -> Host {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = config(
            &dir,
            &format!(
                "HostName = \"{name}\"\nExportUrl = \"{url}\"\nExportDatabase = \"{db}\"\n\
                 ExportBatchRows = {batch_rows}\nRingBytes = 65536\nStorageShards = 2\n\
                 SyslogSocket = \"\"\nSyslogStreamSocket = \"\"\n{extra}"
            ),
        );
        Host {
            name: name.to_string(),
            data: dir.join("data"),
            cfg,
            eventd: None,
            logs: Vec::new(),
        }
    }

    pub fn start(&mut self) {
        assert!(self.eventd.is_none());
        let eventd = Eventd::start_with(
            &self.data,
            Some(&self.cfg),
            &["--export-timeout-ms", EXPORT_TIMEOUT_MS],
        );
        self.logs.push(eventd.log.clone());
        self.eventd = Some(eventd);
    }

    /// Lines of every start's log that contain `text`.
    pub fn logged(&self, text: &str) -> usize {
        self.logs
            .iter()
            .map(|l| read(l).lines().filter(|line| line.contains(text)).count())
            .sum()
    }

    pub fn pid(&self) -> i32 {
        self.eventd.as_ref().expect("running").child.id() as i32
    }

    pub fn kill9(&mut self) {
        self.eventd.take().expect("running").kill();
    }

    pub fn stop(&mut self) {
        self.eventd.take().expect("running").stop();
    }

    pub fn log(&self) -> String {
        self.eventd
            .as_ref()
            .map(|e| read(&e.log))
            .unwrap_or_default()
    }

    /// `eventctl export status --output json`, or None while it fails
    /// (eventd restarting).
    pub fn status(&self) -> Option<serde_json::Value> {
        let out = Command::new(EVENTCTL)
            .arg("--data-dir")
            .arg(&self.data)
            .args(["export", "status", "--output", "json"])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }
}

/// Events `eventctl emit` said it wrote, per host data directory: what
/// [`assert_accounted`] holds each host's shard files to.
static WRITTEN: Mutex<BTreeMap<PathBuf, u64>> = Mutex::new(BTreeMap::new());

/// Of `n` lines given to `eventctl emit --stdin`, how many it wrote: all
/// when it succeeded, else `n` less the failures it reported ("F of T
/// events not written"); none when it failed otherwise.
fn written(out: &Output, n: usize) -> u64 {
    if out.status.success() {
        return n as u64;
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failed = stderr
        .split_once(" events not written")
        .and_then(|(head, _)| head.rsplit_once(" of "))
        .and_then(|(failed, _)| failed.rsplit(' ').next()?.parse::<u64>().ok());
    match failed {
        Some(failed) => (n as u64).saturating_sub(failed),
        None => {
            eprintln!("eventctl emit wrote nothing: {stderr}");
            0
        }
    }
}

/// `n` events emitted on `cpu` of the host at `data` by one `eventctl emit
/// --stdin`. Emits into a lapping ring may fail; whatever was stored is
/// what the checks compare, so the outcome is returned, not asserted; the
/// events written are tallied for [`assert_accounted`].
pub fn emit(data: &Path, cpu: usize, tag: &str, n: usize) -> Output {
    let mut child = pin(&mut Command::new(EVENTCTL), cpu)
        .arg("--data-dir")
        .arg(data)
        .args([
            "emit",
            "--provider",
            "export",
            "--level",
            "notice",
            "--stdin",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for i in 0..n {
        writeln!(stdin, "{tag} event {i:06} with some words to fill the ring").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    *WRITTEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(data.to_path_buf())
        .or_default() += written(&out, n);
    out
}

/// The host's shard files account for every event emitted to it: for each
/// ring (epoch, cpu) every sequence number from 1 to the highest is held
/// exactly once, by an event or inside a gap, and the events stored plus
/// those the gaps count lost are at least the events `emit` wrote (a
/// drain that fell behind a small ring loses events, but counts each).
/// Waits up to a minute for the drain to store the last of them (the
/// shards of one ring's events are written apart, so a hole may close
/// late). Returns (events stored, events counted lost).
pub fn assert_accounted(host: &Host) -> (u64, u64) {
    let want = WRITTEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&host.data)
        .copied()
        .unwrap_or(0);
    let mut got = Err(String::new());
    wait_for(Duration::from_secs(60), || {
        got = sequences(&host.name, &host.data);
        got.as_ref()
            .is_ok_and(|(stored, lost)| stored + lost >= want)
    });
    let (stored, lost) = got.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        stored + lost >= want,
        "{}: {stored} events stored and {lost} counted lost of {want} written",
        host.name
    );
    (stored, lost)
}

/// Checks that every ring's sequence numbers are covered exactly once by
/// the events and gaps of the shard files at `data`; returns (events,
/// events lost), or what is wrong. A `dropped` gap takes one sequence
/// number and counts the messages dropped before they reached the ring.
fn sequences(name: &str, data: &Path) -> Result<(u64, u64), String> {
    let (events, gaps) = local(data);
    let mut covered = common::Covered::new();
    for &(epoch, cpu, seq) in &events {
        covered.entry((epoch, cpu)).or_default().push((seq, seq));
    }
    let mut lost = 0;
    for (epoch, cpu, from, to, n, reason) in &gaps {
        let length = if reason == "dropped" { 1 } else { *n };
        if to - from + 1 != length {
            return Err(format!(
                "{name}: {reason} gap {from}..={to} of ring {epoch:x} cpu {cpu} counts {n}"
            ));
        }
        covered
            .entry((*epoch, *cpu))
            .or_default()
            .push((*from, *to));
        lost += *n as u64;
    }
    common::check_covered(name, covered)?;
    Ok((events.len() as u64, lost))
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill with the pid of a child of this test that is not reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// A ring lapped on purpose: eventd stopped while 4000 events go into a
/// 64 KiB ring, so the drain finds most of them overwritten (gaps).
pub fn lap(pid: i32, data: &Path, cpu: usize, tag: &str) {
    signal(pid, libc::SIGSTOP);
    emit(data, cpu, tag, 4000);
    signal(pid, libc::SIGCONT);
}

pub type Key = (i64, i64, i64);
pub type GapKey = (i64, i64, i64, i64, i64, String);

/// What a host's shard files hold: event keys and gaps, sorted.
pub fn local(data: &Path) -> (Vec<Key>, Vec<GapKey>) {
    let mut events = Vec::new();
    let mut gaps = Vec::new();
    for (_, conn) in common::shards(data) {
        let mut s = conn
            .prepare("SELECT ring_epoch, cpu, seq FROM events")
            .unwrap();
        let rows = s
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap();
        events.extend(rows.map(Result::unwrap));
        let mut s = conn
            .prepare("SELECT ring_epoch, cpu, from_seq, to_seq, lost, reason FROM gaps")
            .unwrap();
        let rows = s
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .unwrap();
        gaps.extend(rows.map(Result::unwrap));
    }
    events.sort();
    gaps.sort();
    (events, gaps)
}

/// Newest id of events and of gaps per shard file name.
pub fn newest_ids(data: &Path) -> BTreeMap<String, (i64, i64)> {
    common::shards(data)
        .into_iter()
        .map(|(path, conn)| {
            let max = |table: &str| -> i64 {
                conn.query_row(
                    &format!("SELECT ifnull(max(id), 0) FROM {table}"),
                    [],
                    |r| r.get(0),
                )
                .unwrap()
            };
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, (max("events"), max("gaps")))
        })
        .collect()
}

/// Whether the status says every row of every shard file, up to `newest`,
/// is in the cluster.
pub fn exported(status: &serde_json::Value, newest: &BTreeMap<String, (i64, i64)>) -> bool {
    let Some(shards) = status["shards"].as_array() else {
        return false;
    };
    newest.iter().all(|(file, &(events, gaps))| {
        shards.iter().any(|s| {
            let through = |t: &str| s[t]["exported_through"].as_i64().unwrap_or(-1);
            s["file"]
                .as_str()
                .is_some_and(|f| f == file || f.ends_with(&format!("/{file}")))
                && through("events") >= events
                && through("gaps") >= gaps
                && s["events"].get("pending").is_none()
                && s["gaps"].get("pending").is_none()
        })
    })
}

/// Waits until the host's store is still (its emitters are done and the
/// drains have caught up) and the exporter reports all of it sent.
pub fn wait_exported(host: &Host, within: Duration) -> serde_json::Value {
    let deadline = Instant::now() + within;
    let mut last = None;
    let mut previous = BTreeMap::new();
    loop {
        let newest = newest_ids(&host.data);
        if let Some(status) = host.status() {
            if newest == previous && exported(&status, &newest) {
                return status;
            }
            last = Some(status);
        }
        previous = newest;
        assert!(
            Instant::now() < deadline,
            "{}: not exported within {within:?}; store {previous:?}; status {}\nlog:\n{}",
            host.name,
            last.map(|s| s.to_string()).unwrap_or_default(),
            host.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// TabSeparated rows of one server's answer, parsed by `f`.
pub fn rows<T>(c: &Cluster, url: &str, sql: &str, f: impl Fn(&[&str]) -> T) -> Vec<T> {
    c.query(url, &format!("{sql} FORMAT TabSeparated"))
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| f(&l.split('\t').collect::<Vec<_>>()))
        .collect()
}

pub fn num(s: &str) -> i64 {
    s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

/// What the cluster holds of `host`: every replica of every shard, read
/// from the local tables (no Distributed table in between); a single
/// server's own tables.
pub fn remote(c: &Cluster, db: &str, host: &str) -> Vec<Vec<(Vec<Key>, Vec<GapKey>)>> {
    let local = if c.is_single() { "" } else { "_local" };
    (1..=c.shards())
        .map(|s| {
            (1..=c.replicas())
                .map(|r| {
                    let url = c.url(s, r);
                    let mut events = rows(
                        c,
                        &url,
                        &format!(
                            "SELECT ring_epoch, cpu, seq FROM {db}.events{local} WHERE host = '{host}'"
                        ),
                        |f| (num(f[0]), num(f[1]), num(f[2])),
                    );
                    let mut gaps = rows(
                        c,
                        &url,
                        &format!(
                            "SELECT ring_epoch, cpu, from_seq, to_seq, lost, reason \
                             FROM {db}.gaps{local} WHERE host = '{host}'"
                        ),
                        |f| {
                            (
                                num(f[0]),
                                num(f[1]),
                                num(f[2]),
                                num(f[3]),
                                num(f[4]),
                                f[5].to_string(),
                            )
                        },
                    );
                    events.sort();
                    gaps.sort();
                    (events, gaps)
                })
                .collect()
        })
        .collect()
}

/// How two sorted multisets differ: (only in `want`, only in `have`).
pub fn diff<T: Ord + Clone>(want: &[T], have: &[T]) -> (Vec<T>, Vec<T>) {
    let (mut missing, mut extra) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < want.len() || j < have.len() {
        match (want.get(i), have.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                missing.push(a.clone());
                i += 1;
            }
            (Some(a), None) => {
                missing.push(a.clone());
                i += 1;
            }
            (_, Some(b)) => {
                extra.push(b.clone());
                j += 1;
            }
            (None, None) => unreachable!("the loop condition"),
        }
    }
    (missing, extra)
}

/// The check every test ends with; returns (events, gaps) of the host.
pub fn assert_exactly_once(c: &Cluster, db: &str, host: &Host) -> (usize, usize) {
    assert_accounted(host);
    let (events, gaps) = local(&host.data);
    // Replication is asynchronous: wait until every replica of every shard
    // holds as much as the host has, then compare exactly.
    let mut seen = remote(c, db, &host.name);
    let settled = wait_for(Duration::from_secs(60), || {
        seen = remote(c, db, &host.name);
        seen.iter()
            .all(|shard| shard.iter().all(|r| r == &shard[0]))
            && seen.iter().map(|s| s[0].0.len()).sum::<usize>() >= events.len()
            && seen.iter().map(|s| s[0].1.len()).sum::<usize>() >= gaps.len()
    });
    for (s, shard) in seen.iter().enumerate() {
        for (r, replica) in shard.iter().enumerate() {
            eprintln!(
                "{}: shard {} replica {} holds {} events, {} gaps",
                host.name,
                s + 1,
                r + 1,
                replica.0.len(),
                replica.1.len()
            );
        }
    }
    // Each host hashes to one shard: the others hold nothing of it.
    let holding: Vec<usize> = (0..seen.len())
        .filter(|&s| !seen[s][0].0.is_empty() || !seen[s][0].1.is_empty())
        .collect();
    let want = usize::from(!events.is_empty() || !gaps.is_empty());
    assert_eq!(
        holding.len(),
        want,
        "{}: rows on shards {holding:?} (indexes from 0)",
        host.name
    );
    for (s, shard) in seen.iter().enumerate() {
        for (r, (have_events, have_gaps)) in shard.iter().enumerate() {
            let (want_events, want_gaps) = if holding.first() == Some(&s) {
                (&events[..], &gaps[..])
            } else {
                (&[][..], &[][..])
            };
            let (missing, extra) = diff(want_events, have_events);
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{}: shard {} replica {} misses {} events (first {:?}) and has {} extra or \
                 duplicated (first {:?}); settled {settled}",
                host.name,
                s + 1,
                r + 1,
                missing.len(),
                missing.first(),
                extra.len(),
                extra.first()
            );
            let (missing, extra) = diff(want_gaps, have_gaps);
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{}: gaps missing {missing:?}, extra {extra:?}",
                host.name
            );
        }
    }
    // The same through the Distributed table, as operators ask it.
    let sql = format!(
        "SELECT count(), uniqExact(ring_epoch, cpu, seq) FROM {db}.events WHERE host = '{}'",
        host.name
    );
    let last = c.url(c.shards(), c.replicas());
    let counts = rows(c, &last, &sql, |f| (num(f[0]), num(f[1])));
    assert_eq!(
        counts,
        vec![(events.len() as i64, events.len() as i64)],
        "{}: count and distinct keys",
        host.name
    );
    (events.len(), gaps.len())
}

pub fn sum_status(status: &serde_json::Value, field: &str) -> u64 {
    status["shards"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["events"][field].as_u64().unwrap_or(0) + s["gaps"][field].as_u64().unwrap_or(0))
        .sum()
}
