//! Queries over a real socket with the real binaries: results compared with
//! one reference database holding the same rows; access, limits, follow.
#![cfg(not(loom))]

use rusqlite::{Connection, OpenFlags};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{as_nobody, boot_markers, wait_for_events, wait_until, Eventd, EVENTCTL};

fn eventctl(data: &Path) -> Command {
    let mut c = Command::new(EVENTCTL);
    c.arg("--data-dir").arg(data);
    c
}

/// Emits `lines` through one `eventctl emit --stdin` process.
fn emit(data: &Path, provider: &str, level: &str, field: Option<&str>, lines: &[String]) {
    let mut cmd = eventctl(data);
    cmd.args(["emit", "--stdin", "--provider", provider, "--level", level]);
    if let Some(f) = field {
        cmd.args(["--field", f]);
    }
    let mut child = cmd.stdin(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for l in lines {
        writeln!(stdin, "{l}").unwrap();
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// One database with every row of every shard: the reference.
fn reference(data: &Path, dir: &Path) -> Connection {
    let path = dir.join("reference.db");
    let _ = std::fs::remove_file(&path);
    let c = Connection::open(&path).unwrap();
    c.execute_batch(
        "CREATE TABLE events (ts, cpu, seq, ring_epoch, pid, tid, uid, level, provider, \
         name, message, fields)",
    )
    .unwrap();
    for e in std::fs::read_dir(data.join("store")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "db") {
            c.execute("ATTACH DATABASE ?1 AS s", [p.to_str().unwrap()])
                .unwrap();
            c.execute_batch(
                "INSERT INTO events SELECT ts, cpu, seq, ring_epoch, pid, tid, uid, level, \
                 provider, name, message, fields FROM s.events; DETACH DATABASE s;",
            )
            .unwrap();
        }
    }
    c
}

/// (ts, cpu, seq, message) of the reference rows matching `where_sql`.
fn expected(r: &Connection, where_sql: &str, desc: bool, limit: Option<usize>) -> Vec<String> {
    let dir = if desc { "DESC" } else { "ASC" };
    let sql = format!(
        "SELECT ts, cpu, seq, message FROM events WHERE {where_sql} \
         ORDER BY ts {dir}, cpu {dir}, seq {dir}, ring_epoch {dir} LIMIT {}",
        limit.map_or(-1, |l| l as i64)
    );
    let mut stmt = r.prepare(&sql).unwrap();
    stmt.query_map([], |row| {
        Ok(format!(
            "{} {} {} {}",
            row.get::<_, i64>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, i64>(2)?,
            row.get::<_, String>(3)?
        ))
    })
    .unwrap()
    .map(|r| r.unwrap())
    .collect()
}

/// What `eventctl query --output json ARGS` prints, in the same form.
fn queried(data: &Path, args: &[&str]) -> Vec<String> {
    let out = eventctl(data)
        .args(["query", "--output", "json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.get("ts")?;
            Some(format!(
                "{} {} {} {}",
                v["ts"],
                v["cpu"],
                v["seq"],
                v["message"].as_str().unwrap()
            ))
        })
        .collect()
}

fn config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn queries_match_one_reference_database_for_every_filter_and_order() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Four shards first, then two: shards 2 and 3 become historical.
    let four = config(dir.path(), "four.toml", "StorageShards = 4\n");
    let d = Eventd::start(&data, Some(&four));
    let batch = |p: &str, n: usize| -> Vec<String> { (0..n).map(|i| format!("{p}-{i}")).collect() };
    emit(
        &data,
        "alpha",
        "err",
        Some("unit=a"),
        &batch("alpha disk", 300),
    );
    emit(
        &data,
        "beta",
        "warning",
        Some("unit=b"),
        &batch("beta net", 300),
    );
    wait_for_events(&data, 600);
    d.stop();
    // Then every filter that can have a query index has one: the answers
    // must not change (the historical shards get theirs from retention).
    let two = config(
        dir.path(),
        "two.toml",
        "StorageShards = 2\nQueryIndexes = [\"provider\", \"name\", \"pid\", \
         \"uid\", \"cpu\", \"fields.unit\"]\n",
    );
    let d = Eventd::start(&data, Some(&two));
    emit(&data, "gamma", "info", None, &batch("gamma disk", 300));
    emit(
        &data,
        "alpha",
        "debug",
        Some("unit=c"),
        &batch("alpha late", 100),
    );
    wait_for_events(&data, 1000);
    let r = reference(&data, dir.path());
    let ts_at = |q: f64| -> i64 {
        r.query_row(
            &format!(
                "SELECT ts FROM events ORDER BY ts LIMIT 1 OFFSET {}",
                (1000.0 * q) as i64
            ),
            [],
            |row| row.get(0),
        )
        .unwrap()
    };
    let (t1, t2) = (ts_at(0.3), ts_at(0.7));
    let rfc = |ts: i64| {
        humantime::format_rfc3339_nanos(std::time::UNIX_EPOCH + Duration::from_nanos(ts as u64))
            .to_string()
    };
    let pid: i64 = r
        .query_row(
            "SELECT pid FROM events WHERE provider = 'beta' LIMIT 1",
            [],
            |row| row.get(0),
        )
        .unwrap();
    // The emitters ran wherever the scheduler put them: take a cpu seen.
    let cpu: i64 = r
        .query_row(
            "SELECT cpu FROM events ORDER BY ts DESC LIMIT 1",
            [],
            |row| row.get(0),
        )
        .unwrap();
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec![], "1".into()),
        (vec!["--since".into(), rfc(t1)], format!("ts >= {t1}")),
        (vec!["--until".into(), rfc(t2)], format!("ts < {t2}")),
        (
            vec!["--cpu".into(), cpu.to_string()],
            format!("cpu = {cpu}"),
        ),
        (
            vec!["--level".into(), "warning".into()],
            "level <= 4".into(),
        ),
        (
            vec!["--provider".into(), "alpha".into()],
            "provider = 'alpha'".into(),
        ),
        (
            vec!["--name".into(), "message".into()],
            "name = 'message'".into(),
        ),
        (
            vec!["--pid".into(), pid.to_string()],
            format!("pid = {pid}"),
        ),
        (vec!["--uid".into(), "0".into()], "uid = 0".into()),
        (
            vec!["--grep".into(), "disk".into()],
            "instr(message, 'disk') > 0".into(),
        ),
        (
            vec!["--field".into(), "unit=b".into()],
            "json_extract(fields, '$.unit') = 'b'".into(),
        ),
        (
            vec![
                "--provider".into(),
                "alpha".into(),
                "--level".into(),
                "err".into(),
            ],
            "provider = 'alpha' AND level <= 3".into(),
        ),
    ];
    for (args, where_sql) in &cases {
        for reverse in [false, true] {
            let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
            if reverse {
                a.push("--reverse");
            }
            let want = expected(&r, where_sql, reverse, None);
            assert!(!want.is_empty(), "{where_sql} matches nothing");
            assert_eq!(queried(&data, &a), want, "{a:?}");
        }
    }
    // Pages: --limit, then --cursor continues exactly where it stopped.
    for reverse in [false, true] {
        let mut a = vec!["--limit", "137"];
        if reverse {
            a.push("--reverse");
        }
        let out = eventctl(&data)
            .args(["query", "--output", "json"])
            .args(&a)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let token = stderr
            .lines()
            .find_map(|l| l.strip_prefix("next page: --cursor "))
            .unwrap_or_else(|| panic!("no cursor in {stderr}"))
            .to_string();
        let first = queried(&data, &a);
        let mut b = a.clone();
        b.extend(["--cursor", &token]);
        let second = queried(&data, &b);
        let all = expected(&r, "1", reverse, None);
        assert_eq!(first, all[..137]);
        assert_eq!(second, all[137..274]);
    }
    // Every file, active or historical, has exactly the listed indexes;
    // with none listed, eventd's own go and nothing else does.
    let indexes = |j: usize| -> Vec<String> {
        let path = data.join(format!("store/shard-{j:03}.db"));
        let conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        eventd::store::indexes::present(&conn).unwrap()
    };
    let listed = [
        "events_by_cpu",
        "events_by_field_756e6974",
        "events_by_name",
        "events_by_pid",
        "events_by_provider",
        "events_by_uid",
    ];
    wait_until("the query indexes in every file", || {
        (0..4).all(|j| indexes(j) == listed)
    });
    d.stop();
    let none = config(
        dir.path(),
        "none.toml",
        "StorageShards = 2\nQueryIndexes = []\n",
    );
    let d = Eventd::start(&data, Some(&none));
    wait_until("no query index left", || {
        (0..4).all(|j| indexes(j).is_empty())
    });
    assert_eq!(
        queried(&data, &["--provider", "alpha"]),
        expected(&r, "provider = 'alpha'", false, None)
    );

    // Offline reads the same files without the daemon.
    d.stop();
    let offline: Vec<String> = queried(&data, &["--offline", "--provider", "gamma"]);
    assert_eq!(offline, expected(&r, "provider = 'gamma'", false, None));

    // Gaps meeting the window are reported beside the events (a historical
    // shard's, here, written the way the daemon writes them).
    let mid = (t1 + t2) / 2;
    Connection::open(data.join("store/shard-003.db"))
        .unwrap()
        .execute(
            "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, \
             detected_at) VALUES (1, 5, 10, 21, 12, 'overwritten', ?1, ?2)",
            [mid, mid + 1000],
        )
        .unwrap();
    let window = [
        "query",
        "--offline",
        "--since",
        &rfc(t1),
        "--until",
        &rfc(t2),
    ];
    let out = eventctl(&data).args(window).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("12 events lost on cpu 5 (overwritten"),
        "{text}"
    );
    let before = ["query", "--offline", "--until", &rfc(t1)];
    let out = eventctl(&data).args(before).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("events lost"));

    // A shard that cannot be read is named; the others still answer.
    std::fs::write(data.join("store/shard-099.db"), b"garbage ".repeat(512)).unwrap();
    let out = eventctl(&data)
        .args([
            "query",
            "--offline",
            "--output",
            "json",
            "--provider",
            "gamma",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning") && err.contains("shard-099.db"),
        "{err}"
    );
    let events = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with("{\"gap\""))
        .count();
    assert_eq!(events, 300);
}

/// The `end` line of a query asked over the socket.
fn end_line(data: &Path, filter: serde_json::Value) -> serde_json::Value {
    let request: eventd::query::protocol::Request = serde_json::from_value(
        serde_json::json!({ "op": "query", "filter": filter, "follow": false }),
    )
    .unwrap();
    let mut end = None;
    eventd::query::client::call(&data.join("run/query.sock"), &request, |v| {
        if let Some(e) = v.get("end") {
            end = Some(e.clone());
        }
        Ok(true)
    })
    .unwrap();
    end.expect("no end line")
}

/// A store made by this daemon: what its writers committed since it
/// started is found (their time maps grow with every commit), and a query
/// for the newest events opens only the files that hold them (each CPU's
/// events are in one stripe, so in one of the eight files).
#[test]
fn queries_open_only_the_files_whose_time_maps_hold_what_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "eight.toml", "StorageShards = 8\n");
    let d = Eventd::start(&data, Some(&cfg));
    let lines: Vec<String> = (0..200).map(|i| format!("mapped-{i}")).collect();
    emit(&data, "maps", "info", None, &lines);
    wait_for_events(&data, 200);
    // (eventd's boot marker left out: it is not in the CPU rings' stripes.)
    let all = queried(&data, &["--provider", "maps"]);
    assert_eq!(all.len(), 200, "{all:?}");
    let end = end_line(
        &data,
        serde_json::json!({ "order": "newest_first", "limit": 10 }),
    );
    assert_eq!(end["count"], 10, "{end}");
    assert_eq!(end["files"]["listed"], 8, "{end}");
    let read = end["files"]["read"].as_u64().unwrap();
    assert!((1..=2).contains(&read), "{end}");
    // A window before every event: no file holds any of it.
    let end = end_line(&data, serde_json::json!({ "until_ns": 1000 }));
    assert_eq!(end["count"], 0, "{end}");
    assert_eq!(end["files"]["read"], 0, "{end}");
    d.stop();
}

#[test]
fn access_limits_malformed_requests_and_follow() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("data");
    let cfg = config(
        dir.path(),
        "q.toml",
        "MaxConcurrentQueries = 2\nQueryGroup = \"4242\"\n",
    );
    let d = Eventd::start(&data, Some(&cfg));
    let socket = data.join("run/query.sock");
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(std::os::unix::fs::MetadataExt::gid(&meta), 4242);

    // Malformed request: a clear error, then the connection closes.
    let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    s.write_all(b"{\"op\":\"query\",\"filter\":{\"levl\":3}}\n")
        .unwrap();
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer).unwrap();
    assert!(
        answer.contains("bad_request") && answer.contains("levl"),
        "{answer}"
    );
    for (request, names) in [
        (
            r#"{"op":"query","filter":{"fields":[["a\"b","x"]]}}"#,
            "field name",
        ),
        (
            r#"{"op":"query","filter":{"grep":"(unclosed"}}"#,
            "--grep pattern",
        ),
        ("not json at all", "malformed request"),
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        writeln!(s, "{request}").unwrap();
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).unwrap();
        assert!(
            answer.contains("bad_request") && answer.contains(names),
            "{answer}"
        );
    }

    // Follow sees events committed after it started.
    let mut follower = eventctl(&data)
        .args([
            "query",
            "--follow",
            "--output",
            "json",
            "--provider",
            "late",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the follower's slot", || {
        common::eventctl_json(&data, "stats")["stats"]["queries"]["running"] == 1
    });
    emit(
        &data,
        "late",
        "info",
        None,
        &["late-1".into(), "late-2".into(), "late-3".into()],
    );
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let v: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        seen.push(v["message"].as_str().unwrap().to_string());
    }
    assert_eq!(seen, ["late-1", "late-2", "late-3"]);

    // Two queries run (the follower and this one); a third is busy at once.
    let mut second = eventctl(&data)
        .args(["query", "--follow"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("both follow slots taken", || {
        common::eventctl_json(&data, "stats")["stats"]["queries"]["running"] == 2
    });
    let out = eventctl(&data)
        .args(["query", "--limit", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("busy"), "{err}");
    // A client that disconnects frees its slot.
    follower.kill().unwrap();
    follower.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = eventctl(&data)
            .args(["query", "--limit", "1"])
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slot not freed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    second.kill().unwrap();
    second.wait().unwrap();

    // What the daemon knows now.
    let json_of = |cmd: &str| -> serde_json::Value {
        let out = eventctl(&data).arg(cmd).output().unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let stats = json_of("stats");
    let rings = stats["stats"]["rings"].as_array().unwrap();
    assert!(!rings.is_empty());
    // The CPU rings' (the syslog ring holds eventd's boot marker).
    let drained: u64 = rings
        .iter()
        .filter(|r| r["cpu"].as_u64().unwrap() < 1 << 20)
        .map(|r| r["drained_events"].as_u64().unwrap())
        .sum();
    assert_eq!(drained, 3, "{stats}");
    wait_until("the boot marker", || boot_markers(&data).0 == 1);
    let shards = json_of("shards");
    let shards = shards["shards"].as_array().unwrap();
    assert!(shards
        .iter()
        .all(|s| s["active"] == true && s["bytes"].as_u64().unwrap() > 0));
    let events: u64 = shards.iter().map(|s| s["events"].as_u64().unwrap()).sum();
    assert_eq!(events, 3 + 1, "and eventd's boot marker");
    let config = json_of("config");
    assert_eq!(config["config"]["effective"]["max_concurrent_queries"], 2);

    // A reader that goes away before the answer (`eventctl stats | head`
    // with head already gone) ends eventctl quietly.
    for args in [&["stats"][..], &["stats", "--prometheus"], &["config"]] {
        let mut child = eventctl(&data)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.is_empty(), "{args:?}: {err}");
    }

    // A peer that is not root, eventd's user or in the query group is
    // refused by its credentials (the socket is opened up for the test so
    // that the connection itself succeeds).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut cmd = eventctl(&data);
        cmd.args(["query", "--limit", "1"]);
        as_nobody(&mut cmd);
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("denied") && err.contains("uid 65534"), "{err}");
    } else {
        eprintln!("not root: the refused-peer check needs to switch uid; skipped");
    }
    d.stop();
}
