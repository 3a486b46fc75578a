use super::*;
use std::io::Write;

/// The offsets and payloads of `n` appended records.
fn fill(log: &mut SegmentedLog, n: u32) -> Vec<(u64, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let p = format!("record {i:03}").into_bytes();
            (log.append(&p).unwrap(), p)
        })
        .collect()
}

/// Leaves `dir` as a writer that died leaves it (the state says dirty).
fn as_if_crashed(dir: &Path) {
    std::fs::write(dir.join("state"), "dirty\n").unwrap();
}

fn intact(log: &SegmentedLog) -> Vec<(u64, Vec<u8>)> {
    log.iter_from(0).filter_map(|r| r.ok()).collect()
}

fn damaged(log: &SegmentedLog) -> Vec<(u64, u64)> {
    log.iter_from(0)
        .filter_map(|r| match r {
            Err(LogError::Damaged { offset, next, .. }) => Some((offset, next)),
            _ => None,
        })
        .collect()
}

fn patch(path: &Path, at: u64, bytes: &[u8]) {
    let mut all = std::fs::read(path).unwrap();
    all[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, all).unwrap();
}

#[test]
fn appends_roll_segments_and_read_back_by_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = SegmentedLog::open(dir.path(), 100).unwrap();
    let written = fill(&mut log, 50);
    assert!(log.segment_count() > 5);
    for seg in std::fs::read_dir(dir.path().join("segments")).unwrap() {
        assert!(seg.unwrap().metadata().unwrap().len() <= 100);
    }
    for (o, p) in &written {
        assert_eq!(&log.read(*o).unwrap().0, p);
    }
    let from_20: Vec<(u64, Vec<u8>)> = log.iter_from(written[20].0).map(|r| r.unwrap()).collect();
    assert_eq!(from_20, written[20..]);
    assert_eq!(intact(&log), written);
    let verified = log.verify().unwrap();
    assert_eq!((verified.records, verified.findings), (50, vec![]));
    assert!(matches!(
        log.read(log.end()),
        Err(LogError::NoRecord { .. })
    ));
    log.close().unwrap();
    // A clean close lets the next writer skip the scan; nothing changes.
    let log = SegmentedLog::open(dir.path(), 100).unwrap();
    assert_eq!(intact(&log), written);
}

#[test]
fn a_torn_tail_is_cut_on_open_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
    let a = log.append(b"kept").unwrap();
    let end = log.end();
    drop(log);
    // An append cut short by a crash.
    let path = segment_path(dir.path(), 0);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(&record::frame(end, b"torn record")[..9])
        .unwrap();
    drop(f);
    as_if_crashed(dir.path());
    // A reader leaves it alone.
    let reader = SegmentedLog::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.end(), end);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), end + 9);
    let mut log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
    assert_eq!(log.truncated_bytes, 9);
    assert_eq!(log.repair().cut, Some((end, end + 9)));
    assert_eq!(log.end(), end);
    assert_eq!(log.read(a).unwrap().0, b"kept");
    let b = log.append(b"after").unwrap();
    assert_eq!(b, end);
    assert_eq!(log.verify().unwrap().records, 2);
}

#[test]
fn a_zero_filled_tail_is_cut_and_is_not_read_as_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
    let written = fill(&mut log, 5);
    let end = log.end();
    drop(log);
    // Space a filesystem allocated past the last write reads as zeros.
    let path = segment_path(dir.path(), 0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(end + 4096)
        .unwrap();
    as_if_crashed(dir.path());
    let reader = SegmentedLog::open_read_only(dir.path()).unwrap();
    let v = reader.verify().unwrap();
    assert_eq!(v.records, 5);
    assert_eq!(v.findings.len(), 1, "{:?}", v.findings);
    assert_eq!(v.findings[0].range, Some((end, end + 4096)));
    assert!(v.findings[0].problem.contains("torn tail"));
    let log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
    assert_eq!(log.truncated_bytes, 4096);
    assert!(log.repair().damaged.is_empty());
    assert_eq!(intact(&log), written);
}

#[test]
fn damage_in_the_middle_keeps_every_record_after_it_at_its_offset() {
    for (what, damage) in [
        ("zeros", vec![0u8; 20]),
        ("garbage", b"\x13\x99garbage-garbage\xa7\x5c\x0d".to_vec()),
        ("a flipped bit", vec![]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
        let written = fill(&mut log, 10);
        let end = log.end();
        drop(log);
        let path = segment_path(dir.path(), 0);
        // Over record 3 and into record 4 (each is 22 bytes).
        if damage.is_empty() {
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[written[3].0 as usize + 5] ^= 0x04; // its length
            std::fs::write(&path, bytes).unwrap();
        } else {
            patch(&path, written[3].0 + 4, &damage);
        }
        as_if_crashed(dir.path());
        let mut log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
        let lost = if damage.len() > 18 { 5 } else { 4 };
        let range = (written[3].0, written[lost].0);
        assert_eq!(log.truncated_bytes, 0, "{what}: nothing cut");
        assert_eq!(log.repair().damaged, vec![range], "{what}");
        assert_eq!(log.end(), end, "{what}: offsets unchanged");
        let kept: Vec<_> = written
            .iter()
            .enumerate()
            .filter(|(i, _)| !(3..lost).contains(i))
            .map(|(_, r)| r.clone())
            .collect();
        assert_eq!(intact(&log), kept, "{what}");
        assert_eq!(damaged(&log), vec![range], "{what}");
        match log.read(written[3].0) {
            Err(LogError::Damaged { next, .. }) => assert_eq!(next, range.1, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
        let v = log.verify().unwrap();
        assert_eq!(v.records, kept.len() as u64, "{what}");
        assert_eq!(v.findings.len(), 1, "{what}: {:?}", v.findings);
        assert_eq!(
            (v.findings[0].path.clone(), v.findings[0].range),
            (path, Some(range))
        );
        // Appends go on after the last intact record.
        assert_eq!(log.append(b"new").unwrap(), end, "{what}");
    }
}

#[test]
fn damage_in_an_older_segment_and_a_missing_segment_are_found_and_stepped_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = SegmentedLog::open(dir.path(), 100).unwrap();
    let written = fill(&mut log, 30);
    let (bases, _) = list_segments(dir.path()).unwrap();
    assert!(bases.len() >= 6);
    drop(log);
    // A flipped byte in the second segment's first record, and the fourth
    // segment gone.
    let second = segment_path(dir.path(), bases[1]);
    let mut bytes = std::fs::read(&second).unwrap();
    bytes[FILE_HEADER_BYTES as usize + 14] ^= 1;
    std::fs::write(&second, &bytes).unwrap();
    let fourth = segment_path(dir.path(), bases[3]);
    std::fs::remove_file(&fourth).unwrap();
    std::fs::write(dir.path().join("segments/notes.txt"), "hello").unwrap();
    let log = SegmentedLog::open(dir.path(), 100).unwrap();
    assert_eq!(std::fs::read(&second).unwrap(), bytes, "never repaired");
    let v = log.verify().unwrap();
    let found = |path: &Path| {
        v.findings
            .iter()
            .find(|f| f.path == path)
            .unwrap_or_else(|| panic!("{} not named: {:?}", path.display(), v.findings))
            .clone()
    };
    let first_of_second = bases[1] + FILE_HEADER_BYTES;
    let d = found(&second);
    assert_eq!(d.range.map(|r| r.0), Some(first_of_second));
    let fifth = segment_path(dir.path(), bases[4]);
    let missing = found(&fifth);
    assert_eq!(missing.range, Some((bases[3], bases[4])));
    assert!(missing.problem.contains("missing"), "{missing:?}");
    found(&dir.path().join("segments/notes.txt"));
    assert_eq!(v.findings.len(), 3, "{:?}", v.findings);
    // Every record outside the damage and the missing segment is read.
    let got = intact(&log);
    let want: Vec<_> = written
        .iter()
        .filter(|(o, _)| *o != first_of_second && !(bases[3]..bases[4]).contains(o))
        .cloned()
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.len() as u64, v.records);
}

#[test]
fn a_record_larger_than_a_segment_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = SegmentedLog::open(dir.path(), 100).unwrap();
    log.append(b"small").unwrap();
    let end = log.end();
    let fits = 100 - FILE_HEADER_BYTES - record::FRAME_HEADER_BYTES;
    match log.append(&vec![b'x'; fits as usize + 1]) {
        Err(e @ LogError::TooLarge { .. }) => {
            assert!(
                e.to_string()
                    .contains("does not fit a segment of 100 bytes"),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(log.end(), end);
    let at = log.append(&vec![b'x'; fits as usize]).unwrap();
    assert_eq!(log.read(at).unwrap().0.len() as u64, fits);
    for seg in std::fs::read_dir(dir.path().join("segments")).unwrap() {
        assert!(seg.unwrap().metadata().unwrap().len() <= 100);
    }
    assert!(matches!(
        SegmentedLog::open(dir.path().join("other"), 20),
        Err(LogError::SegmentTooSmall(20))
    ));
}

#[test]
fn a_second_writer_is_refused_and_a_reader_opens_alongside() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
    let written = fill(&mut log, 3);
    match SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT) {
        Err(e @ LogError::Locked { .. }) => {
            assert!(
                e.to_string()
                    .contains(&format!("pid {}", std::process::id())),
                "{e}"
            );
        }
        other => panic!("{:?}", other.err()),
    }
    let mut reader = SegmentedLog::open_read_only(dir.path()).unwrap();
    assert_eq!(intact(&reader), written);
    assert!(matches!(reader.append(b"no"), Err(LogError::ReadOnly)));
    log.close().unwrap();
    assert!(SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).is_ok());
    assert!(SegmentedLog::open_read_only(dir.path().join("nothing")).is_err());
    assert!(
        !dir.path().join("nothing").exists(),
        "a reader creates nothing"
    );
}

#[test]
fn a_log_of_the_old_format_opens_and_keeps_its_offsets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("segments")).unwrap();
    let mut old = Vec::new();
    let mut offsets = Vec::new();
    for p in [&b"old 0"[..], b"old 1", b"old 2"] {
        offsets.push(old.len() as u64);
        old.extend_from_slice(&record::legacy_frame(p));
    }
    let old_end = old.len() as u64;
    std::fs::write(segment_path(dir.path(), 0), &old).unwrap();
    let mut log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
    assert_eq!(log.truncated_bytes, 0);
    assert_eq!(log.read(offsets[1]).unwrap().0, b"old 1");
    let new = log.append(b"new").unwrap();
    assert_eq!(new, old_end + FILE_HEADER_BYTES);
    drop(log);
    let log = SegmentedLog::open_read_only(dir.path()).unwrap();
    let all: Vec<u64> = intact(&log).into_iter().map(|(o, _)| o).collect();
    assert_eq!(all, [offsets.clone(), vec![new]].concat());
    let v = log.verify().unwrap();
    assert_eq!((v.records, v.findings), (4, vec![]));
    // A file storh did not write is refused, not cut.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(other.path().join("segments")).unwrap();
    let foreign = segment_path(other.path(), 0);
    std::fs::write(&foreign, "some text that is not a log at all").unwrap();
    assert!(matches!(
        SegmentedLog::open(other.path(), MAX_SEGMENT_BYTES_DEFAULT),
        Err(LogError::Foreign { .. })
    ));
    assert_eq!(std::fs::read(&foreign).unwrap().len(), 34);
}

/// Every way of reading a log that holds no record after `from`: nothing,
/// not damage; and `verify` agrees.
fn holds_nothing_after(log: &SegmentedLog, from: u64) {
    let rest: Vec<String> = log
        .iter_from(from)
        .map(|r| match r {
            Ok((offset, _)) => format!("a record at {offset}"),
            Err(e) => e.to_string(),
        })
        .collect();
    assert!(rest.is_empty(), "{rest:?}");
    assert!(
        matches!(log.read(from), Err(LogError::NoRecord { .. })),
        "{:?}",
        log.read(from)
            .map(|(p, next)| (String::from_utf8_lossy(&p).into_owned(), next))
    );
    let verified = log.verify().unwrap();
    assert_eq!(verified.findings, vec![]);
}

#[test]
fn a_fresh_empty_log_reads_as_empty() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
    holds_nothing_after(&log, 0);
    holds_nothing_after(&log, log.start());
    assert_eq!(log.verify().unwrap().records, 0);
    drop(log);
    let reader = SegmentedLog::open_read_only(dir.path()).unwrap();
    holds_nothing_after(&reader, 0);
}

/// As a writer killed between starting a segment (its header written and
/// synced) and appending to it leaves the log.
#[test]
fn a_last_segment_of_only_its_header_reads_as_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = SegmentedLog::open(dir.path(), 100).unwrap();
    let written = fill(&mut log, 10);
    let end = log.end();
    drop(log);
    std::fs::write(segment_path(dir.path(), end), record::file_header()).unwrap();
    as_if_crashed(dir.path());
    for log in [
        SegmentedLog::open_read_only(dir.path()).unwrap(),
        SegmentedLog::open(dir.path(), 100).unwrap(),
    ] {
        assert_eq!(log.end(), end + FILE_HEADER_BYTES);
        assert_eq!(intact(&log), written);
        assert_eq!(damaged(&log), vec![]);
        holds_nothing_after(&log, end);
        let from_last: Vec<u64> = log.iter_from(written[9].0).map(|r| r.unwrap().0).collect();
        assert_eq!(from_last, vec![written[9].0]);
    }
    // The writer appends after the header, and everything reads back.
    let mut log = SegmentedLog::open(dir.path(), 100).unwrap();
    let next = log.append(b"after the header").unwrap();
    assert_eq!(next, end + FILE_HEADER_BYTES);
    assert_eq!(intact(&log).len(), 11);
    assert_eq!(log.verify().unwrap().findings, vec![]);
}
