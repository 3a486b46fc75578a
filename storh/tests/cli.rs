//! The `storh` binary, run as a user would run it.

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use storh::docstore::Collection;

fn storh(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_storh"))
        .arg("--dir")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = storh(dir, args);
    assert!(
        out.status.success(),
        "storh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids(text: &str) -> Vec<String> {
    lines(text)
        .into_iter()
        .map(|v| v["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn records_indexes_and_stats_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("people");
    let mut made = Vec::new();
    for (name, team) in [
        ("ada", "core"),
        ("bob", "ops"),
        ("cy", "core"),
        ("di", "web"),
    ] {
        let doc = format!("{{\"name\": \"{name}\", // who\n \"team\": \"{team}\"}}");
        made.push(ok(&dir, &["put", &doc]).trim().to_string());
    }
    assert_eq!(
        serde_json::from_str::<Value>(&ok(&dir, &["get", &made[1]])).unwrap(),
        json!({"name": "bob", "team": "ops"})
    );
    // A replacement under a known id.
    ok(
        &dir,
        &["put", "--id", &made[3], r#"{"name": "di", "team": "core"}"#],
    );
    // Pages in id order, by cursor.
    let first = ids(&ok(&dir, &["stream", "--limit", "3"]));
    let rest = ids(&ok(&dir, &["stream", "--after", &first[2]]));
    let mut sorted = made.clone();
    sorted.sort();
    assert_eq!([first, rest].concat(), sorted);
    // The same answer from a scan and from the index.
    let scanned = ids(&ok(&dir, &["find", "team", "core"]));
    ok(&dir, &["index", "create", "team"]);
    assert_eq!(ok(&dir, &["index", "list"]).trim(), "team");
    let indexed = ids(&ok(&dir, &["find", "team", "core"]));
    assert_eq!(scanned, indexed);
    assert_eq!(
        indexed,
        vec![made[0].clone(), made[2].clone(), made[3].clone()]
    );
    assert_eq!(
        ids(&ok(
            &dir,
            &["find", "team", "core", "--after", &made[0], "--limit", "1"]
        )),
        vec![made[2].clone()]
    );
    ok(&dir, &["delete", &made[2]]);
    assert_eq!(storh(&dir, &["get", &made[2]]).status.code(), Some(1));
    let stats: Value = serde_json::from_str(&ok(&dir, &["stats"])).unwrap();
    assert_eq!(stats["kind"], "collection");
    assert_eq!(stats["records"], 3);
    assert_eq!(stats["indexes"]["team"], 3);
    assert_eq!(stats["files"], 3);
    assert_eq!(stats["opened_after_crash"], false);
    ok(&dir, &["index", "drop", "team"]);
    assert_eq!(ok(&dir, &["index", "list"]), "");
    let reindexed = storh(&dir, &["reindex"]);
    assert!(String::from_utf8_lossy(&reindexed.stderr).contains("3 records"));
    assert_eq!(ok(&dir, &["verify"]), "");
}

#[test]
fn verify_names_each_bad_file_and_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut c = Collection::open(dir).unwrap();
    let good = c.insert(&json!({"ok": 1})).unwrap();
    c.close().unwrap();
    let data = dir.join("data");
    let wrong_bucket = data.join("00/018bcfe5-6800-7000-8000-2d5dba6274da.jsonc");
    std::fs::create_dir_all(wrong_bucket.parent().unwrap()).unwrap();
    std::fs::write(&wrong_bucket, "{}").unwrap();
    let bad_json = data.join(&good[24..26]).join(format!(
        "018bcfe5-6800-7000-8000-{}0000000000.jsonc",
        &good[24..26]
    ));
    std::fs::write(&bad_json, "{ \"a\": ").unwrap();
    let bad_name = data.join(&good[24..26]).join("readme.txt");
    std::fs::write(&bad_name, "hello").unwrap();
    let out = storh(dir, &["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let said = |p: &Path| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{}: ", p.display())))
            .unwrap_or_else(|| panic!("{} not named in {stdout}", p.display()))
            .to_string()
    };
    assert!(said(&wrong_bucket).contains("belongs in 2d"), "{stdout}");
    assert!(said(&bad_json).contains("invalid JSONC"), "{stdout}");
    assert!(said(&bad_name).contains("not a .jsonc"), "{stdout}");
    assert_eq!(stdout.lines().count(), 3);
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 good records, 3 problems"));
    // After a reindex the bad record is listed; `stream` names it and goes
    // on with the good one.
    ok(dir, &["reindex"]);
    let out = storh(dir, &["stream"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        ids(&String::from_utf8(out.stdout).unwrap()),
        vec![good.clone()]
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&bad_json.display().to_string()) && err.contains("invalid JSONC"),
        "{err}"
    );
}

#[test]
fn errors_say_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let out = storh(&tmp.path().join("nothing"), &["stats"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no storh collection"), "{err}");
    assert!(!tmp.path().join("nothing").exists(), "a read never creates");
    // A collection another process has open for writing.
    let held = Collection::open(tmp.path().join("held")).unwrap();
    let out = storh(&tmp.path().join("held"), &["stream"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another process") && err.contains("pid"),
        "{err}"
    );
    held.close().unwrap();
    let out = storh(&tmp.path().join("held"), &["put", "{ not json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid JSONC"));
    // An error after opening still closes: the next open sees no crash.
    let out = storh(&tmp.path().join("held"), &["get", "not-an-id"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a canonical UUID"));
    let stats: Value = serde_json::from_str(&ok(&tmp.path().join("held"), &["stats"])).unwrap();
    assert_eq!(stats["opened_after_crash"], false);
    // `put` never turns a queue into a collection.
    let queue = tmp.path().join("queue");
    storh::queue::Queue::open(&queue).unwrap();
    let out = storh(&queue, &["put", "{}"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a collection"));
    assert!(!queue.join("data").exists());
}

#[test]
fn logs_and_queues_are_verified_and_measured() {
    let tmp = tempfile::tempdir().unwrap();
    let log_dir = tmp.path().join("log");
    let mut log = storh::log::SegmentedLog::open(&log_dir, 4096).unwrap();
    for i in 0..100u32 {
        log.append(format!("record {i:04} {}", "x".repeat(100)).as_bytes())
            .unwrap();
    }
    let segments = log.segment_count();
    drop(log);
    assert!(segments > 2);
    let stats: Value = serde_json::from_str(&ok(&log_dir, &["stats"])).unwrap();
    assert_eq!(
        (
            stats["kind"].as_str(),
            stats["segments"].as_u64(),
            stats["records"].as_u64()
        ),
        (Some("log"), Some(segments as u64), Some(100))
    );
    assert_eq!(ok(&log_dir, &["verify"]), "");
    // One flipped byte in the second segment.
    let mut files: Vec<_> = std::fs::read_dir(log_dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut bytes = std::fs::read(&files[1]).unwrap();
    bytes[200] ^= 0x40;
    std::fs::write(&files[1], &bytes).unwrap();
    let out = storh(&log_dir, &["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("{}: offsets ", files[1].display()))
            && first.contains("damaged bytes"),
        "{stdout}"
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    // A segment gone from the middle: the offsets it held are named, at
    // the segment after the gap.
    std::fs::remove_file(&files[2]).unwrap();
    let out = storh(&log_dir, &["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let gap = stdout
        .lines()
        .find(|l| l.starts_with(&format!("{}: offsets ", files[3].display())))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(gap.contains("a segment is missing"), "{gap}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");

    let queue_dir = tmp.path().join("queue");
    let mut q = storh::queue::Queue::open(&queue_dir).unwrap();
    for i in 0..10u32 {
        q.append(format!("event {i}").as_bytes()).unwrap();
    }
    let batch = q.read("mailer", 4).unwrap();
    assert_eq!(batch.events.len(), 4);
    let next = batch.next;
    q.ack("mailer", next).unwrap();
    drop(q);
    let stats: Value = serde_json::from_str(&ok(&queue_dir, &["stats"])).unwrap();
    assert_eq!(stats["kind"], "queue");
    assert_eq!(stats["records"], 10);
    assert_eq!(stats["consumers"]["mailer"], next);
    assert_eq!(ok(&queue_dir, &["verify"]), "");
}
