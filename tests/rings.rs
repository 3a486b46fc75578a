//! KMES rings with real files, threads and processes: exact accounting (every
//! sequence number delivered once or inside a reported gap), laps, dead
//! producers, SIGKILL, corrupt files and scribbling.
#![cfg(not(loom))]

use eventd::access::Mode;
use eventd::rings::format::Geometry;
use eventd::rings::{Event, Gap, Level, ReadPosition, Ring, RingItem, RingReader};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn event(message: &str) -> Event<'_> {
    Event {
        ts_ns: eventd::rings::now_ns(),
        pid: std::process::id(),
        tid: 7,
        uid: 1000,
        level: Level::Info,
        provider: "test",
        name: "tick",
        message,
        fields: "",
    }
}

/// Emits events tagged `a:i` for every `i` in `range`, one thread.
fn emit_tagged(ring: &Ring, range: std::ops::Range<u64>) {
    for i in range {
        ring.emit(&event(&format!("a:{i}"))).unwrap();
    }
}

fn ring(dir: &Path, page_size: usize, page_count: usize) -> Arc<Ring> {
    let g = Geometry::new(page_size, page_count).unwrap();
    Arc::new(Ring::create(&dir.join("cpu-000.ring"), g, 0).unwrap())
}

/// What a reader saw: per-sequence outcome, checked for exactness.
#[derive(Default)]
struct Ledger {
    next_seq: u64,
    delivered: u64,
    lost: HashMap<&'static str, u64>,
    /// Per producer tag: the counters seen, in order.
    seen: HashMap<String, Vec<u64>>,
}

impl Ledger {
    fn new() -> Self {
        Ledger {
            next_seq: 1,
            ..Default::default()
        }
    }

    /// Records one item; asserts sequence numbers are contiguous.
    fn take(&mut self, item: RingItem<'_>) {
        match item {
            RingItem::Event { seq, event } => {
                assert_eq!(seq, self.next_seq, "event out of sequence");
                self.next_seq += 1;
                self.delivered += 1;
                assert_eq!(event.provider, "test");
                assert_eq!(event.name, "tick");
                let (tag, n) = event.message.split_once(':').expect("tagged message");
                let n: u64 = n.parse().expect("counter");
                let seen = self.seen.entry(tag.to_string()).or_default();
                if let Some(&last) = seen.last() {
                    assert!(n > last, "{tag}: {n} after {last}");
                }
                seen.push(n);
            }
            RingItem::Gap(Gap {
                from_seq,
                to_seq,
                reason,
            }) => {
                assert_eq!(from_seq, self.next_seq, "gap out of sequence");
                assert!(to_seq >= from_seq);
                *self.lost.entry(reason.name()).or_default() += to_seq - from_seq + 1;
                self.next_seq = to_seq + 1;
            }
        }
    }

    fn lost_total(&self) -> u64 {
        self.lost.values().sum()
    }

    /// Drains everything currently readable.
    fn drain(&mut self, reader: &mut RingReader) {
        while let Some(item) = reader.poll() {
            self.take(item);
        }
    }
}

#[test]
fn events_come_back_in_order_with_their_content() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 512);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut sent = Vec::new();
    for i in 0..2000u64 {
        let pad = "x".repeat(rng.random_range(0..300));
        sent.push(format!("a:{i}"));
        let fields = format!(r#"{{"i":{i},"pad":"{pad}"}}"#);
        let mut e = event(sent.last().unwrap());
        e.fields = &fields;
        e.level = Level::ALL[(i % 8) as usize];
        ring.emit(&e).unwrap();
    }
    let mut reader = RingReader::new(ring.clone());
    let mut n = 0u64;
    while let Some(item) = reader.poll() {
        let RingItem::Event { seq, event } = item else {
            panic!("unexpected {item:?}")
        };
        assert_eq!(seq, n + 1);
        assert_eq!(event.message, sent[n as usize]);
        assert_eq!(event.level, Level::ALL[(n % 8) as usize]);
        assert!(event.fields.starts_with(&format!(r#"{{"i":{n},"#)));
        assert_eq!(event.pid, std::process::id());
        n += 1;
    }
    assert_eq!(n, 2000);
    assert_eq!(reader.counts(), (2000, 0));
    assert_eq!(reader.position().next_seq, 2001);
}

#[test]
fn lapped_reader_reports_the_exact_gap() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 1024, 4);
    emit_tagged(&ring, 0..1000);
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    ledger.drain(&mut reader);
    assert_eq!(ledger.next_seq, 1001);
    assert_eq!(ledger.delivered + ledger.lost_total(), 1000);
    assert!(ledger.lost["overwritten"] > 900, "{:?}", ledger.lost);
    assert!(ledger.delivered > 10, "the newest pages survive");
    // The survivors are the newest events.
    assert_eq!(*ledger.seen["a"].last().unwrap(), 999);
}

#[test]
fn resume_continues_exactly_where_a_reader_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 16);
    emit_tagged(&ring, 0..100);
    let mut first = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    for _ in 0..40 {
        let item = first.poll().unwrap();
        ledger.take(item);
    }
    let position = first.position();
    drop(first);
    // Round-trip through the two words a receipt stores.
    let position = ReadPosition::from_words(position.position_word(), position.next_seq);
    emit_tagged(&ring, 100..150);
    let mut second = RingReader::resume(ring.clone(), position);
    ledger.drain(&mut second);
    assert_eq!(ledger.delivered, 150);
    assert_eq!(ledger.lost_total(), 0);
}

#[test]
fn resume_after_the_ring_moved_on_reports_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 1024, 4);
    ring.emit(&event("a:0")).unwrap();
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    ledger.drain(&mut reader);
    let position = reader.position();
    emit_tagged(&ring, 1..500);
    let mut resumed = RingReader::resume(ring.clone(), position);
    ledger.drain(&mut resumed);
    assert_eq!(ledger.next_seq, 501);
    assert_eq!(ledger.delivered + ledger.lost_total(), 500);
    assert!(ledger.lost["overwritten"] > 0);
}

#[test]
fn threads_emit_while_reader_sleeps_and_drains() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 256);
    let producers: Vec<_> = (0..4)
        .map(|t| {
            let ring = ring.clone();
            std::thread::spawn(move || {
                for i in 0..50_000u64 {
                    // A producer preempted long enough can be lapped (or,
                    // past the stall bound, abandoned); the reader counts
                    // those, so carry on.
                    let _ = ring.emit(&event(&format!("t{t}:{i}")));
                    if i % 10_000 == 0 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            })
        })
        .collect();
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    loop {
        ledger.drain(&mut reader);
        if producers.iter().all(|p| p.is_finished()) {
            ledger.drain(&mut reader);
            break;
        }
        reader.wait(Some(Duration::from_millis(500)));
    }
    for p in producers {
        p.join().unwrap();
    }
    let emitted = 200_000 - ring.producer_refusals();
    assert_eq!(ledger.delivered + ledger.lost_total(), emitted);
    assert_eq!(ledger.next_seq, emitted + 1);
}

/// Reads until the ledger has accounted for every sequence number below
/// `next_seq` (a dead producer's record holds the reader for the stall
/// bound first); fails after 5 s.
fn drain_to(reader: &mut RingReader, ledger: &mut Ledger, next_seq: u64) {
    let start = Instant::now();
    while ledger.next_seq < next_seq {
        ledger.drain(reader);
        reader.wait(Some(Duration::from_millis(50)));
        assert!(start.elapsed() < Duration::from_secs(5), "reader stuck");
    }
}

/// The ring's file, word by word, as a test reads and scribbles it.
struct RingFile(std::fs::File);

impl RingFile {
    fn open(ring: &Ring) -> RingFile {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(ring.path())
            .unwrap();
        RingFile(file)
    }

    fn word(&self, index: usize) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, index as u64 * 8).unwrap();
        u64::from_le_bytes(b)
    }

    fn set(&self, index: usize, word: u64) {
        use std::os::unix::fs::FileExt;
        self.0
            .write_all_at(&word.to_le_bytes(), index as u64 * 8)
            .unwrap();
    }
}

#[test]
fn dead_producer_reservation_is_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 8);
    ring.emit(&event("a:0")).unwrap();
    // A producer that reserved and died: state stamped RESERVED, never
    // committed. Then one that died before even stamping its state.
    ring.reserve_and_die_for_tests(10, true);
    ring.emit(&event("a:1")).unwrap();
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    drain_to(&mut reader, &mut ledger, 4);
    assert_eq!(ledger.delivered, 2);
    assert_eq!(ledger.lost["abandoned"], 1);
    // A reservation without even a state word: its length is unknown, but
    // the record after it names the next sequence in its state word, so
    // the reader finds it and loses only the dead one.
    ring.reserve_and_die_for_tests(10, false);
    ring.emit(&event("a:2")).unwrap();
    drain_to(&mut reader, &mut ledger, 6);
    assert_eq!(ledger.lost["abandoned"], 2);
    assert_eq!(ledger.seen["a"], vec![0, 1, 2]);
    // The same with nothing after it: with no more traffic to fill the
    // page, the reader closes the page itself after the bound and reports
    // the rest of it (the dead record) as lost.
    ring.reserve_and_die_for_tests(10, false);
    drain_to(&mut reader, &mut ledger, 7);
    assert_eq!(ledger.lost["abandoned"], 3);
    // The ring goes on in the next page.
    ring.emit(&event("a:3")).unwrap();
    ledger.drain(&mut reader);
    assert_eq!(ledger.delivered, 4);
    assert_eq!(ledger.seen["a"], vec![0, 1, 2, 3]);
}

/// Producers killed together leave adjacent dead reservations: the reader
/// loses only those and goes on with the next committed record.
#[test]
fn adjacent_dead_producers_lose_only_their_own_records() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 8);
    ring.emit(&event("a:0")).unwrap();
    // Two that died before stamping, then one that stamped and died.
    ring.reserve_and_die_for_tests(10, false);
    ring.reserve_and_die_for_tests(12, false);
    ring.reserve_and_die_for_tests(9, true);
    ring.emit(&event("a:1")).unwrap();
    ring.emit(&event("a:2")).unwrap();
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    drain_to(&mut reader, &mut ledger, 7);
    assert_eq!(ledger.seen["a"], vec![0, 1, 2], "{:?}", ledger.lost);
    assert_eq!(ledger.lost["abandoned"], 3);
    assert_eq!(ledger.lost.len(), 1, "{:?}", ledger.lost);
    // The stamped one was ended as abandoned, so had its producer only been
    // slow, its commit would now fail instead of reporting success.
    {
        use eventd::rings::format::{RecordState, RECORD_HEADER_WORDS, STATE_ABANDONED};
        let g = ring.geometry();
        let file = RingFile::open(&ring);
        let first = RecordState::unpack(file.word(g.data_index(0, 0)));
        let stamped_at = first.words + 2 * RECORD_HEADER_WORDS as u32 + 10 + 12;
        let stamped = RecordState::unpack(file.word(g.data_index(0, stamped_at)));
        assert_eq!((stamped.seq_low, stamped.state), (4, STATE_ABANDONED));
    }
    // The page goes on being read.
    ring.emit(&event("a:3")).unwrap();
    ledger.drain(&mut reader);
    assert_eq!(ledger.seen["a"], vec![0, 1, 2, 3]);
}

/// Past a dead unstamped record, a farther record is not jumped to at once:
/// a stamped record in between (a producer that is only slow) gets the
/// stall bound too, and is read if it commits within it.
#[test]
fn a_slow_producer_between_a_dead_one_and_the_next_record_gets_its_time() {
    use eventd::rings::format::{RecordState, RECORD_HEADER_WORDS, STATE_RESERVED};
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 8);
    ring.emit(&event("a:0")).unwrap();
    ring.reserve_and_die_for_tests(10, false);
    ring.emit(&event("a:1")).unwrap();
    ring.emit(&event("a:2")).unwrap();
    // a:1 (seq 3) is made to look written but not yet committed.
    let g = ring.geometry();
    let file = RingFile::open(&ring);
    let first = RecordState::unpack(file.word(g.data_index(0, 0)));
    let slow = g.data_index(0, first.words + RECORD_HEADER_WORDS as u32 + 10);
    let committed = file.word(slow);
    let reserved = RecordState {
        state: STATE_RESERVED,
        ..RecordState::unpack(committed)
    };
    assert_eq!(reserved.seq_low, 3);
    file.set(slow, reserved.pack());
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    ledger.drain(&mut reader);
    // Past the dead record's bound: the way on is a:2, two numbers on, so
    // the reader waits again rather than giving a:1 up.
    std::thread::sleep(Duration::from_millis(300));
    ledger.drain(&mut reader);
    assert_eq!(ledger.seen["a"], vec![0]);
    assert_eq!(
        RecordState::unpack(file.word(slow)),
        reserved,
        "given up at once"
    );
    // Its producer commits: only the dead record is lost.
    file.set(slow, committed);
    drain_to(&mut reader, &mut ledger, 5);
    assert_eq!(ledger.seen["a"], vec![0, 1, 2], "{:?}", ledger.lost);
    assert_eq!(ledger.lost["abandoned"], 1);
}

/// A page's count only grows. A reserve word rolled back to a lower count
/// under a reader that has seen the higher one (a scribble: no producer
/// lowers it) stops the reader with a scribble once it has read what it
/// knew was there, rather than holding it at the lower count while new
/// records pass over the ones it has not read.
#[test]
fn a_page_count_rolled_back_under_the_reader_is_a_scribble() {
    use eventd::rings::format::{Reserve, H_RESERVE};
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 8);
    for i in 0..3 {
        ring.emit(&event(&format!("a:{i}"))).unwrap();
    }
    let mut reader = RingReader::new(ring.clone());
    assert!(matches!(
        reader.poll(),
        Some(RingItem::Event { seq: 1, .. })
    ));
    let file = RingFile::open(&ring);
    let w = Reserve::unpack(file.word(H_RESERVE));
    assert_eq!(w.count, 3);
    file.set(H_RESERVE, Reserve { count: 1, ..w }.pack());
    let mut seqs = vec![1];
    while let Some(item) = reader.poll() {
        match item {
            RingItem::Event { seq, .. } => seqs.push(seq),
            RingItem::Gap(g) => panic!("{g:?}"),
        }
    }
    assert_eq!(seqs, [1, 2, 3]);
    let scribble = reader
        .scribble()
        .expect("the rolled-back count is not reported");
    assert!(scribble.what.contains("fewer records"), "{scribble:?}");
}

/// A word inside a dead, unstamped record that looks like the next
/// record's state word (as a stale record's pid/tid word can) is passed
/// over: the reader finds the real next record by its checksum.
#[test]
fn a_look_alike_state_word_in_a_dead_record_is_passed_over() {
    use eventd::rings::format::{RecordState, STATE_COMMITTED};
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 8);
    ring.emit(&event("a:0")).unwrap();
    let g = ring.geometry();
    let file = RingFile::open(&ring);
    // Where the dead record will start: right after a:0 (seq 1).
    let first = RecordState::unpack(file.word(g.data_index(0, 0)));
    assert_eq!(first.seq_low, 1);
    let dead_at = first.words;
    ring.reserve_and_die_for_tests(10, false);
    // Inside the dead record, a committed-looking state word naming seq 3
    // (the next record's number) with a plausible length.
    let fake = RecordState {
        seq_low: 3,
        words: 8,
        state: STATE_COMMITTED,
    }
    .pack();
    file.set(g.data_index(0, dead_at + 6), fake);
    ring.emit(&event("a:1")).unwrap();
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    drain_to(&mut reader, &mut ledger, 4);
    assert_eq!(ledger.seen["a"], vec![0, 1], "{:?}", ledger.lost);
    assert_eq!(ledger.lost["abandoned"], 1);
    assert_eq!(ledger.lost.get("corrupt"), None);
}

#[test]
fn a_reader_far_behind_resyncs_instead_of_waiting() {
    // Slot 0 ends up holding a ticket 2^23 pages later: its 24-bit ticket
    // looks "older" than the reader's, but the reserve word says the ring
    // moved on, so the reader resynchronises (reviewer's case A).
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 64, 2);
    // One 7-word record per 64-byte page: each emit opens a page.
    let pages = (1u64 << 23) + 1;
    let mut tiny = event("a:0");
    (tiny.provider, tiny.name) = ("", "");
    for _ in 0..pages {
        ring.emit(&tiny).unwrap();
    }
    let mut reader = RingReader::new(ring.clone());
    match reader.poll() {
        Some(RingItem::Gap(gap)) => {
            assert_eq!(gap.from_seq, 1);
            assert!(gap.count() >= pages - 2, "{gap:?}");
        }
        other => panic!("expected a gap, got {other:?}"),
    }
}

#[test]
fn corrupt_headers_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cpu-000.ring");
    std::fs::write(&path, b"not a ring at all").unwrap();
    let err = Ring::open(&path, Some(0)).err().unwrap().to_string();
    assert!(
        err.contains("cpu-000.ring") && err.contains("bytes"),
        "{err}"
    );
    std::fs::write(&path, vec![0xAB; 4096]).unwrap();
    let err = Ring::open(&path, Some(0)).err().unwrap().to_string();
    assert!(
        err.contains("cpu-000.ring") && err.contains("bad magic"),
        "{err}"
    );
    // A good ring, then a truncated copy of it.
    let good = dir.path().join("cpu-001.ring");
    Ring::create(&good, Geometry::new(1024, 4).unwrap(), 1).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cpu-002.ring");
    std::fs::write(&cut, &bytes[..bytes.len() - 8]).unwrap();
    let err = Ring::open(&cut, None).err().unwrap().to_string();
    assert!(
        err.contains("cpu-002.ring") && err.contains("promises"),
        "{err}"
    );
    let err = Ring::open(&good, Some(5)).err().unwrap().to_string();
    assert!(err.contains("says cpu 1"), "{err}");
}

#[test]
fn attach_replaces_a_corrupt_ring_keeping_it_aside_and_dense_ordinals() {
    let dir = tempfile::tempdir().unwrap();
    let kmes = eventd::rings::KmesDir::new(dir.path().join("kmes"));
    std::fs::create_dir_all(kmes.path()).unwrap();
    std::fs::write(kmes.ring_path(1), vec![0u8; 4096]).unwrap();
    let attached = kmes
        .attach_all(&[3, 0, 1, 2], 64 * 1024, Mode::PRIVATE)
        .unwrap();
    let cpus: Vec<_> = attached.rings.iter().map(|r| (r.ordinal, r.cpu)).collect();
    assert_eq!(cpus, vec![(0, 0), (1, 1), (2, 2), (3, 3)]);
    assert!(attached.failures.is_empty());
    // The bad file is moved aside, not destroyed, and the log is told why.
    assert_eq!(attached.repairs.len(), 1);
    assert_eq!(attached.repairs[0].0, 1);
    assert!(
        attached.repairs[0].1.contains("bad magic"),
        "{:?}",
        attached.repairs
    );
    let aside = kmes.path().join("cpu-001.ring.bad");
    assert_eq!(std::fs::read(&aside).unwrap(), vec![0u8; 4096]);
    // Attaching again opens the same rings (same epochs), creates nothing.
    let again = kmes
        .attach_all(&[0, 1, 2, 3], 64 * 1024, Mode::PRIVATE)
        .unwrap();
    for (a, b) in attached.rings.iter().zip(&again.rings) {
        assert_eq!(a.ring.epoch(), b.ring.epoch());
    }
}

#[test]
fn emitter_refuses_a_missing_directory_or_ring() {
    let dir = tempfile::tempdir().unwrap();
    let err = eventd::rings::Emitter::open(dir.path().join("nope"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("nope"), "{err}");
    let emitter = eventd::rings::Emitter::open(dir.path()).unwrap();
    let err = emitter.emit(&event("a:0")).unwrap_err().to_string();
    assert!(err.contains("no ring for cpu"), "{err}");
}

/// Mappings of `path` in this process.
fn mappings_of(path: &Path) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let name = path.to_str().unwrap();
    maps.lines().filter(|l| l.ends_with(name)).count()
}

#[test]
fn a_dropped_emitter_unmaps_the_rings_its_thread_emitted_into() {
    let dir = tempfile::tempdir().unwrap();
    let kmes = eventd::rings::KmesDir::new(dir.path().join("kmes"));
    let cpus = eventd::rings::online_cpus();
    let _attached = kmes.attach_all(&cpus, 64 * 1024, Mode::PRIVATE).unwrap();
    let rings: Vec<_> = cpus.iter().map(|&c| kmes.ring_path(c)).collect();
    let count = || rings.iter().map(|r| mappings_of(r)).sum::<usize>();
    let before = count();
    let emitter = eventd::rings::Emitter::open(kmes.path()).unwrap();
    emitter.emit(&event("cached:0")).unwrap();
    // The ring this thread emitted into is mapped once more, and kept in
    // the thread's cache for the next emit.
    assert_eq!(count(), before + 1);
    drop(emitter);
    assert_eq!(
        count(),
        before,
        "the thread's cache still maps a dropped emitter's ring"
    );
}

// ---- processes -------------------------------------------------------------

const CHILD_ENV: &str = "EVENTD_RING_CHILD";

/// Not a test of its own: the body of a child process (see `spawn_child`).
/// Emits `count` events tagged `tag:n` into the ring, or forever if 0.
#[test]
fn ring_child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split(',');
    let path = parts.next().unwrap();
    let tag = parts.next().unwrap();
    let count: u64 = parts.next().unwrap().parse().unwrap();
    let ring = Ring::open(Path::new(path), None).unwrap();
    let mut i = 0u64;
    while count == 0 || i < count {
        let message = format!("{tag}:{i}");
        // A full-enough ring may refuse under heavy contention; count on.
        let _ = ring.emit(&event(&message));
        i += 1;
    }
}

fn spawn_child(ring: &Path, tag: &str, count: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ring_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{},{tag},{count}", ring.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn drain_until(reader: &mut RingReader, ledger: &mut Ledger, mut done: impl FnMut() -> bool) {
    loop {
        ledger.drain(reader);
        if done() {
            // Anything committed before `done` turned true is readable now.
            ledger.drain(reader);
            return;
        }
        reader.wait(Some(Duration::from_millis(20)));
    }
}

#[test]
fn processes_emit_into_one_ring_with_exact_accounting() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 64);
    let mut children: Vec<_> = (0..3)
        .map(|c| spawn_child(ring.path(), &format!("p{c}"), 30_000))
        .collect();
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    drain_until(&mut reader, &mut ledger, || {
        children.iter_mut().all(|c| c.try_wait().unwrap().is_some())
    });
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let emitted = 90_000 - ring.producer_refusals();
    assert_eq!(ledger.delivered + ledger.lost_total(), emitted);
    assert_eq!(ledger.next_seq, emitted + 1);
    for c in 0..3 {
        let seen = ledger.seen.get(&format!("p{c}")).map_or(0, |s| s.len());
        assert!(seen > 0, "p{c} got events through");
    }
}

#[test]
fn slow_reader_is_lapped_and_still_exact() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 1024, 8);
    let mut children: Vec<_> = (0..2)
        .map(|c| spawn_child(ring.path(), &format!("s{c}"), 20_000))
        .collect();
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    let mut polls = 0u32;
    loop {
        if let Some(item) = reader.poll() {
            ledger.take(item);
            polls += 1;
            if polls % 50 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        }
        if children.iter_mut().all(|c| c.try_wait().unwrap().is_some()) {
            ledger.drain(&mut reader);
            break;
        }
        reader.wait(Some(Duration::from_millis(5)));
    }
    let emitted = 40_000 - ring.producer_refusals();
    assert_eq!(ledger.delivered + ledger.lost_total(), emitted);
    assert!(
        ledger.lost.get("overwritten").copied().unwrap_or(0) > 0,
        "laps happened"
    );
}

#[test]
fn sigkilled_producers_lose_only_their_own_events() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 4096, 256);
    let mut reader = RingReader::new(ring.clone());
    let mut ledger = Ledger::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for round in 0..6 {
        let mut victims: Vec<_> = (0..2)
            .map(|c| spawn_child(ring.path(), &format!("k{round}{c}"), 0))
            .collect();
        let until = Instant::now() + Duration::from_millis(rng.random_range(30..120));
        while Instant::now() < until {
            ledger.drain(&mut reader);
            reader.wait(Some(Duration::from_millis(5)));
        }
        for v in &mut victims {
            v.kill().unwrap(); // SIGKILL
            v.wait().unwrap();
        }
    }
    // A last, well-behaved producer: all of its events must arrive.
    let mut last = spawn_child(ring.path(), "final", 5_000);
    drain_until(&mut reader, &mut ledger, || {
        last.try_wait().unwrap().is_some()
    });
    let start = Instant::now();
    // A victim killed mid-record leaves a reservation the reader gives up on
    // after the stall bound; keep reading until the final events are in.
    while ledger.seen.get("final").map_or(0, |s| s.len()) < 5_000 {
        ledger.drain(&mut reader);
        reader.wait(Some(Duration::from_millis(20)));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "final events missing: {} of 5000 seen, lost {:?}, {} refusals, first seen {:?}",
            ledger.seen.get("final").map_or(0, |s| s.len()),
            ledger.lost,
            ring.producer_refusals(),
            ledger.seen.get("final").and_then(|s| s.first()),
        );
    }
    assert_eq!(ledger.seen["final"], (0..5_000).collect::<Vec<_>>());
    assert_eq!(ledger.delivered + ledger.lost_total(), ledger.next_seq - 1);
    eprintln!(
        "after 12 SIGKILLed producers: {:?} lost, {} delivered",
        ledger.lost, ledger.delivered
    );
}

// ---- scribbling -------------------------------------------------------------

/// Writes random words into the ring's header and pages while producers emit
/// and a reader reads: the reader must never panic, hang or deliver an event
/// that fails its own checks. `EVENTD_RING_FUZZ_SECS` lengthens the run.
#[test]
fn scribbled_ring_never_breaks_the_reader() {
    let secs: u64 = std::env::var("EVENTD_RING_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path(), 512, 8);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (ring, stop) = (ring.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = ring.emit(&event(&format!("f:{i}")));
                i += 1;
            }
        })
    };
    let scribbler = {
        let (path, stop) = (ring.path().to_path_buf(), stop.clone());
        std::thread::spawn(move || {
            use std::os::unix::fs::FileExt;
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            let len = file.metadata().unwrap().len();
            let mut rng = rand::rngs::StdRng::seed_from_u64(99);
            while !stop.load(Ordering::Relaxed) {
                let at = rng.random_range(0..len / 8) * 8;
                let value: u64 = match rng.random_range(0..4) {
                    0 => rng.random(),
                    1 => rng.random_range(0..64),
                    2 => u64::MAX,
                    _ => 0,
                };
                file.write_all_at(&value.to_le_bytes(), at).unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let mut reader = RingReader::new(ring.clone());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut events, mut gaps) = (0u64, 0u64);
    while Instant::now() < deadline {
        let t = Instant::now();
        match reader.poll() {
            Some(RingItem::Event { event, .. }) => {
                events += 1;
                assert!(event.message.len() < 512);
            }
            Some(RingItem::Gap(g)) => {
                gaps += 1;
                assert!(g.to_seq >= g.from_seq);
            }
            None => reader.wait(Some(Duration::from_millis(1))),
        }
        // Generous: the thread may be preempted by the tests beside it; a
        // poll that spins on what it reads never returns at all.
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "one poll took {:?}",
            t.elapsed()
        );
    }
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    scribbler.join().unwrap();
    eprintln!("scribbled ring: {events} events, {gaps} gaps in {secs} s");
    assert!(events > 0);
}
