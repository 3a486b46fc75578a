use super::*;
use crate::record;

fn as_if_crashed(dir: &Path) {
    std::fs::write(dir.join("state"), "dirty\n").unwrap();
}

fn payloads(events: &Events) -> Vec<&[u8]> {
    events.iter().map(|(_, p)| p.as_slice()).collect()
}

#[test]
fn consumers_read_ack_and_keep_their_position_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut q = Queue::open(dir.path()).unwrap();
    assert!(q.is_empty());
    for i in 0..10 {
        q.append(format!("event {i}").as_bytes()).unwrap();
    }
    let first = q.read("mailer", 4).unwrap();
    assert_eq!(first.events.len(), 4);
    assert_eq!(first.events[0].1, b"event 0");
    // Not acknowledged: read again.
    assert_eq!(q.read("mailer", 4).unwrap(), first);
    q.ack("mailer", first.next).unwrap();
    q.close().unwrap();
    let q = Queue::open(dir.path()).unwrap();
    let rest = q.read("mailer", 100).unwrap();
    assert_eq!(rest.events.len(), 6);
    assert_eq!(rest.events[0].1, b"event 4");
    assert_eq!(rest.next, q.len());
    // Another consumer starts at the beginning.
    assert_eq!(q.read("audit", 1).unwrap().events[0].1, b"event 0");
    assert!(matches!(q.read("../x", 1), Err(QueueError::BadName(_))));
    let v = q.verify().unwrap();
    assert_eq!((v.records, v.findings), (10, vec![]));
}

#[test]
fn a_torn_tail_is_cut_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut q = Queue::open(dir.path()).unwrap();
    q.append(b"whole").unwrap();
    let len = q.len();
    drop(q);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("queue.log"))
        .unwrap();
    f.write_all(&record::frame(len, b"half written")[..11])
        .unwrap();
    drop(f);
    as_if_crashed(dir.path());
    let mut q = Queue::open(dir.path()).unwrap();
    assert_eq!((q.truncated_bytes, q.len()), (11, len));
    q.append(b"next").unwrap();
    let batch = q.read("c", 10).unwrap();
    assert_eq!(payloads(&batch.events), [&b"whole"[..], b"next"]);
}

#[test]
fn consumers_before_and_beyond_a_damaged_range_keep_valid_positions() {
    let dir = tempfile::tempdir().unwrap();
    let mut q = Queue::open(dir.path()).unwrap();
    let offsets: Vec<u64> = (0..10)
        .map(|i| q.append(format!("event {i}").as_bytes()).unwrap())
        .collect();
    let ahead = q.read("ahead", 6).unwrap();
    q.ack("ahead", ahead.next).unwrap();
    // "inside" acknowledged up to event 3, which is then damaged.
    q.ack("inside", offsets[3]).unwrap();
    drop(q);
    // Zeros over event 3.
    let path = dir.path().join("queue.log");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[offsets[3] as usize..offsets[4] as usize].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    as_if_crashed(dir.path());
    let q = Queue::open(dir.path()).unwrap();
    assert_eq!(q.truncated_bytes, 0);
    assert_eq!(q.repair().damaged, vec![(offsets[3], offsets[4])]);
    // Beyond the damage: exactly the events after its position.
    let a = q.read("ahead", 100).unwrap();
    assert!(a.damaged.is_empty());
    assert_eq!(
        a.events.iter().map(|e| e.0).collect::<Vec<_>>(),
        offsets[6..]
    );
    // From the start: every intact event, at its offset, and the range.
    let all = q.read("fresh", 100).unwrap();
    let want: Vec<u64> = offsets
        .iter()
        .copied()
        .filter(|&o| o != offsets[3])
        .collect();
    assert_eq!(all.events.iter().map(|e| e.0).collect::<Vec<_>>(), want);
    assert_eq!(all.damaged, vec![(offsets[3], offsets[4])]);
    // At the damage itself: stepped over to the next event.
    let inside = q.read("inside", 1).unwrap();
    assert_eq!(inside.events, vec![(offsets[4], b"event 4".to_vec())]);
    assert_eq!(inside.damaged, vec![(offsets[3], offsets[4])]);
    let v = q.verify().unwrap();
    assert_eq!(v.records, 9);
    let ranges: Vec<_> = v.findings.iter().map(|f| f.range).collect();
    assert_eq!(
        ranges,
        vec![Some((offsets[3], offsets[4])), None],
        "{:?}",
        v.findings
    );
    assert!(v.findings[1].path.ends_with("consumers/inside"));
}

#[test]
fn a_queue_of_the_old_format_keeps_its_positions_and_takes_new_events() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("consumers")).unwrap();
    let mut old = Vec::new();
    for p in [&b"old 0"[..], b"old 1", b"old 2"] {
        old.extend_from_slice(&record::legacy_frame(p));
    }
    std::fs::write(dir.path().join("queue.log"), &old).unwrap();
    // A consumer of the old queue, past "old 0".
    let second = record::legacy_frame(b"old 0").len();
    std::fs::write(dir.path().join("consumers/c"), format!("{second}\n")).unwrap();
    let mut q = Queue::open(dir.path()).unwrap();
    q.append(b"new 3").unwrap();
    let batch = q.read("c", 10).unwrap();
    assert_eq!(payloads(&batch.events), [&b"old 1"[..], b"old 2", b"new 3"]);
    assert!(batch.damaged.is_empty());
    let v = q.verify().unwrap();
    assert_eq!((v.records, v.findings), (4, vec![]));
}

#[test]
fn a_second_writer_is_refused_and_a_reader_never_changes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut q = Queue::open(dir.path()).unwrap();
    q.append(b"one").unwrap();
    let err = Queue::open(dir.path()).err().map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains(&format!("pid {}", std::process::id()))),
        "{err:?}"
    );
    let mut reader = Queue::open_read_only(dir.path()).unwrap();
    assert_eq!(payloads(&reader.read("c", 10).unwrap().events), [b"one"]);
    assert!(matches!(reader.append(b"x"), Err(QueueError::ReadOnly)));
    assert!(matches!(
        q.append(&vec![0u8; PAYLOAD_BYTES_MAX as usize + 1]),
        Err(QueueError::TooLarge { .. })
    ));
}
