//! Model tests of a KMES ring (the `eventd-producer` crate): reserve, page
//! switch, overwrite, commit, the seqlock-checked copy and the reader's
//! futex sleep, on a ring of two 64-byte pages (one 7-word record each), so three events lap it.
//!
//! Checked in every interleaving: no record fails its checks (nobody
//! scribbles here, so that would be a torn copy), no torn or mixed-up event is delivered
//! (each delivered event is one that was emitted, intact, once, and each
//! producer's events arrive in order), sequence numbers are contiguous, and
//! delivered + counted lost == emitted.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p eventd-loom-tests --release`
#![cfg(loom)]

use eventd_producer::rings::format::Geometry;
use eventd_producer::rings::{Event, Level, LossReason, Ring, RingItem, RingReader};
use eventd_producer::sync::Arc;
use loom::thread;

const MESSAGES: [&str; 3] = ["a0", "a1", "b0"];

fn event(message: &'static str) -> Event<'static> {
    Event {
        ts_ns: 1,
        pid: 2,
        tid: 3,
        uid: 4,
        level: Level::Notice,
        provider: "",
        name: "",
        message,
        fields: "",
    }
}

fn tiny_ring() -> Arc<Ring> {
    Arc::new(Ring::anonymous(Geometry::new(64, 2).unwrap(), 0))
}

/// Reads until `emitted` sequence numbers are accounted for; checks every
/// item and returns (delivered messages, lost count).
fn read_all(reader: &mut RingReader, emitted: u64) -> (Vec<&'static str>, u64) {
    let mut next_seq = 1;
    let mut delivered = Vec::new();
    let mut lost = 0;
    while next_seq <= emitted {
        match reader.poll() {
            Some(RingItem::Event { seq, event }) => {
                assert_eq!(seq, next_seq);
                let known = MESSAGES
                    .iter()
                    .find(|m| **m == event.message)
                    .expect("a message that was emitted");
                assert_eq!((event.ts_ns, event.pid, event.level), (1, 2, Level::Notice));
                assert!(!delivered.contains(known), "delivered twice");
                delivered.push(*known);
                next_seq += 1;
            }
            Some(RingItem::Gap(gap)) => {
                assert_eq!(gap.from_seq, next_seq);
                // Nobody scribbles in these models: a record failing its
                // checks would be a protocol bug (a torn copy).
                assert_ne!(gap.reason, LossReason::Corrupt, "{gap:?}");
                lost += gap.count();
                next_seq = gap.to_seq + 1;
            }
            None => reader.wait(None),
        }
    }
    assert!(reader.poll().is_none(), "nothing beyond what was emitted");
    (delivered, lost)
}

fn in_order(delivered: &[&str], prefix: char) -> bool {
    let mine: Vec<_> = delivered.iter().filter(|m| m.starts_with(prefix)).collect();
    mine.windows(2).all(|w| w[0] < w[1])
}

/// Two producers, one event each, one reader sleeping on the futex: the
/// page switch is raced (each event fills a page) and the ring holds both.
#[test]
fn two_producers_one_reader() {
    loom::model(|| {
        let ring = tiny_ring();
        let producers: Vec<_> = [["a0"], ["b0"]]
            .into_iter()
            .map(|messages| {
                let ring = ring.clone();
                thread::spawn(move || {
                    for m in messages {
                        ring.emit(&event(m)).unwrap();
                    }
                })
            })
            .collect();
        let mut reader = RingReader::new(ring.clone());
        let (delivered, lost) = read_all(&mut reader, 2);
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(
            (delivered.len() as u64, lost),
            (2, 0),
            "a two-page ring holds both"
        );
        assert!(in_order(&delivered, 'a') && in_order(&delivered, 'b'));
    });
}

/// One producer laps the reader (three events into a two-record ring) while
/// the reader copies records out: overwritten records are counted, never
/// delivered torn.
#[test]
fn overwrite_under_a_reading_reader() {
    loom::model(|| {
        let ring = tiny_ring();
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || {
                for m in ["a0", "a1", "b0"] {
                    // `Overwritten` is possible when lapped mid-write; the
                    // reader counts that sequence number as lost.
                    let _ = ring.emit(&event(m));
                }
            })
        };
        let mut reader = RingReader::new(ring.clone());
        let (delivered, lost) = read_all(&mut reader, 3);
        producer.join().unwrap();
        assert_eq!(delivered.len() as u64 + lost, 3);
        assert!(in_order(&delivered, 'a'));
    });
}
