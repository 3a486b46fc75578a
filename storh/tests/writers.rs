//! One writer per log or queue, across processes: a child process appends
//! without pause and prints each offset once its append has returned
//! (durable); the test, a second process, is refused as a writer (told the
//! child's pid), opens a reader alongside, and after SIGKILLing the child
//! finds every acknowledged record at its offset.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use storh::log::{LogError, SegmentedLog};
use storh::queue::{Queue, QueueError};

const CHILD: &str = "STORH_WRITER_CHILD";
/// Small segments, so the child rolls many while it runs.
const SEGMENT_BYTES: u64 = 4096;
/// Segments of one or two records (`smalllog`): most appends start a new
/// segment, so a kill often lands between a segment's header and its
/// first record.
const TINY_SEGMENT_BYTES: u64 = 100;

fn payload(i: u64) -> Vec<u8> {
    format!("event {i} {}", "p".repeat((i % 50) as usize)).into_bytes()
}

/// One durable append; returns the offset.
type Append = dyn FnMut(&[u8]) -> u64;

/// Run as the child: `log:<dir>`, `smalllog:<dir>` or `queue:<dir>` in the
/// environment.
#[test]
fn child_appender() {
    let Ok(what) = std::env::var(CHILD) else {
        return; // an ordinary test run
    };
    let (kind, dir) = what.split_once(':').expect("kind:dir");
    let mut append: Box<Append> = if kind == "log" || kind == "smalllog" {
        let bytes = if kind == "log" {
            SEGMENT_BYTES
        } else {
            TINY_SEGMENT_BYTES
        };
        let mut log = SegmentedLog::open(dir, bytes).expect("open the log");
        Box::new(move |p| log.append(p).expect("append"))
    } else {
        let mut q = Queue::open(dir).expect("open the queue");
        Box::new(move |p| q.append(p).expect("append"))
    };
    for i in 0.. {
        let offset = append(&payload(i));
        println!("acked {i} {offset}");
    }
}

fn spawn(kind: &str, dir: &Path) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_appender",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{kind}:{}", dir.display()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// Reads the child's acknowledgements until `n` have come (or, with `None`,
/// to the end of its output).
fn acked(out: &mut BufReader<ChildStdout>, into: &mut Vec<(u64, u64)>, n: Option<usize>) {
    let mut line = String::new();
    while n.is_none_or(|n| into.len() < n) {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        // The first one shares its line with the harness's "test
        // child_appender ... ".
        if let Some(rest) = line.find("acked ").map(|at| line[at + 6..].trim()) {
            let (i, offset) = rest.split_once(' ').unwrap();
            into.push((i.parse().unwrap(), offset.parse().unwrap()));
        }
    }
}

/// Asserts that `events` are the acknowledged appends `seen`, in order.
fn same(events: &[(u64, Vec<u8>)], seen: &[(u64, u64)]) {
    assert_eq!(events.len(), seen.len());
    for (e, &(i, offset)) in events.iter().zip(seen) {
        assert_eq!(e.0, offset, "the offset of event {i}");
        assert!(
            e.1 == payload(i),
            "event {i}: {:?}",
            String::from_utf8_lossy(&e.1)
        );
    }
}

#[test]
fn a_second_log_writer_is_refused_while_a_child_appends_and_nothing_acked_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let (mut child, mut out) = spawn("log", &dir);
    let mut seen = Vec::new();
    acked(&mut out, &mut seen, Some(300));
    match SegmentedLog::open(&dir, SEGMENT_BYTES) {
        Err(e @ LogError::Locked { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&format!("pid {}", child.id())), "{text}");
        }
        other => panic!("a second writer was not refused: {:?}", other.err()),
    }
    // A reader alongside sees every record acknowledged before it opened.
    let reader = SegmentedLog::open_read_only(&dir).unwrap();
    for &(i, offset) in &seen {
        assert_eq!(reader.read(offset).unwrap().0, payload(i), "record {i}");
    }
    acked(&mut out, &mut seen, Some(600));
    child.kill().unwrap();
    child.wait().unwrap();
    acked(&mut out, &mut seen, None);
    let log = SegmentedLog::open(&dir, SEGMENT_BYTES).unwrap();
    assert!(log.segment_count() > 5, "the child rolled segments");
    for &(i, offset) in &seen {
        assert_eq!(log.read(offset).unwrap().0, payload(i), "record {i}");
    }
    let v = log.verify().unwrap();
    assert!(v.findings.is_empty(), "{:?}", v.findings);
    assert!(v.records >= seen.len() as u64);
    // The records come back in the order they were appended.
    let order: Vec<u64> = log
        .iter_from(0)
        .map(|r| r.unwrap().0)
        .take(seen.len())
        .collect();
    assert_eq!(order, seen.iter().map(|s| s.1).collect::<Vec<_>>());
}

#[test]
fn a_second_queue_writer_is_refused_while_a_child_appends_and_nothing_acked_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("queue");
    let (mut child, mut out) = spawn("queue", &dir);
    let mut seen = Vec::new();
    acked(&mut out, &mut seen, Some(300));
    match Queue::open(&dir) {
        Err(e @ QueueError::Locked { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&format!("pid {}", child.id())), "{text}");
        }
        other => panic!(
            "a second writer was not refused: {:?}",
            other.err().map(|e| e.to_string())
        ),
    }
    let reader = Queue::open_read_only(&dir).unwrap();
    let batch = reader.read("reader", seen.len()).unwrap();
    same(&batch.events, &seen);
    reader.ack("reader", batch.next).unwrap();
    acked(&mut out, &mut seen, Some(600));
    child.kill().unwrap();
    child.wait().unwrap();
    acked(&mut out, &mut seen, None);
    let q = Queue::open(&dir).unwrap();
    let all = q.read("check", usize::MAX).unwrap();
    assert!(all.damaged.is_empty());
    assert!(all.events.len() >= seen.len());
    same(&all.events[..seen.len()], &seen);
    // The reader's acknowledgement holds: it goes on after what it read.
    let rest = q.read("reader", 1).unwrap();
    assert_eq!(rest.events[0].0, seen[300].1);
}

/// The records of `log` from its start, or the first error met.
fn records(log: &SegmentedLog) -> Result<Vec<(u64, Vec<u8>)>, String> {
    log.iter_from(log.start())
        .map(|r| r.map_err(|e| e.to_string()))
        .collect()
}

/// An appender SIGKILLed again and again, at any point of its appends and
/// of its rolls to a new segment. After every kill, a reader and then the
/// next writer read back exactly what was appended, in order and without
/// damage, and `verify` finds nothing. Some kills leave the last segment
/// holding only its header, or nothing yet (to which the next writer adds
/// the header), which reads once took for damage ("no intact record ...
/// (cut short)"); the rounds go on until a few kills have.
#[test]
fn a_log_appender_killed_again_and_again_leaves_only_whole_records() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let mut before: Vec<(u64, Vec<u8>)> = Vec::new();
    let (mut header_only, mut rounds) = (0, 0);
    while header_only < 3 {
        assert!(
            rounds < 2000,
            "{header_only} of {rounds} kills left a last segment of only its header"
        );
        rounds += 1;
        let (mut child, mut out) = spawn("smalllog", &dir);
        let mut seen = Vec::new();
        acked(&mut out, &mut seen, Some(1 + rounds % 7));
        child.kill().unwrap();
        child.wait().unwrap();
        acked(&mut out, &mut seen, None);
        let last = std::fs::read_dir(dir.join("segments"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .max()
            .unwrap();
        let last_len = std::fs::metadata(&last).unwrap().len();
        if last_len == 0 || last_len == storh::record::FILE_HEADER_BYTES {
            header_only += 1;
        }
        let reader = SegmentedLog::open_read_only(&dir).unwrap();
        let writer = SegmentedLog::open(&dir, TINY_SEGMENT_BYTES).unwrap();
        for (who, log) in [("reader", &reader), ("writer", &writer)] {
            let all = records(log).unwrap_or_else(|e| panic!("round {rounds}, {who}: {e}"));
            assert!(all.starts_with(&before), "round {rounds}, {who}");
            // This round's child counted from 0 again; it may have made
            // one more append durable than it acknowledged.
            let new = &all[before.len()..];
            assert!(new.len() >= seen.len(), "round {rounds}, {who}");
            for (k, (_, p)) in new.iter().enumerate() {
                assert!(*p == payload(k as u64), "round {rounds}, {who}: record {k}");
            }
            for &(i, offset) in &seen {
                assert_eq!(new[i as usize].0, offset, "round {rounds}, {who}");
            }
        }
        let v = writer.verify().unwrap();
        assert!(v.findings.is_empty(), "round {rounds}: {:?}", v.findings);
        before = records(&writer).unwrap();
        assert_eq!(v.records, before.len() as u64);
        drop(reader);
        writer.close().unwrap();
    }
    eprintln!("{rounds} kills, {header_only} of them left a last segment of at most its header");
}
