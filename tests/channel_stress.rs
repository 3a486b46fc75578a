//! Real threads, real futexes, millions of events of random sizes through the
//! handoff channel. The receiver checks per-producer order, content, no loss
//! and no duplicate; an independent witness checks that neither bound was ever
//! exceeded.

use eventd::channel::{Capacity, HandoffChannel, Receiver, RecvError, Sender};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

/// Header: (producer, sequence within that producer).
type Tag = (u32, u64);

fn pattern(producer: u32, seq: u64, i: usize) -> u8 {
    (seq as u8).wrapping_add(i as u8) ^ (producer as u8).wrapping_mul(31)
}

/// Occupancy as seen from outside the channel: raised by a sender after it is
/// admitted and before it publishes, lowered by the receiver when it takes the
/// event (before the channel gives the room back). So the witness never
/// counts more than the channel really holds, and a witness over a bound means
/// the channel broke it.
#[derive(Default)]
struct Witness {
    slots: AtomicU64,
    bytes: AtomicU64,
    slots_max: AtomicU64,
    bytes_max: AtomicU64,
}

impl Witness {
    fn enter(&self, len: u64, capacity: Capacity) {
        let slots = self.slots.fetch_add(1, Ordering::SeqCst) + 1;
        let bytes = self.bytes.fetch_add(len, Ordering::SeqCst) + len;
        assert!(slots <= capacity.slots as u64, "{slots} events held");
        if len > capacity.bytes {
            assert_eq!(slots, 1, "an oversize event shared the channel");
        } else {
            assert!(bytes <= capacity.bytes, "{bytes} bytes held");
        }
        self.slots_max.fetch_max(slots, Ordering::Relaxed);
        self.bytes_max.fetch_max(bytes, Ordering::Relaxed);
    }

    fn leave(&self, len: u64) {
        self.bytes.fetch_sub(len, Ordering::SeqCst);
        self.slots.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Run {
    producers: u32,
    events_per_producer: u64,
    capacity: Capacity,
    size_max: usize,
    /// One event in this many is larger than the byte budget.
    oversize_every: u64,
    batch_max: usize,
}

fn produce(tx: Sender<Tag>, producer: u32, run: &Run, witness: &Witness) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(producer) * 7919 + 1);
    for seq in 0..run.events_per_producer {
        let len = if run.oversize_every > 0 && rng.random_ratio(1, run.oversize_every as u32) {
            run.capacity.bytes as usize + 1 + rng.random_range(0..64)
        } else {
            rng.random_range(0..=run.size_max)
        };
        let permit = tx.reserve(len).expect("receiver alive");
        permit
            .commit_with(|buf| {
                witness.enter(len as u64, run.capacity);
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = pattern(producer, seq, i);
                }
                Ok::<_, ()>((producer, seq))
            })
            .unwrap();
    }
}

fn consume(mut rx: Receiver<Tag>, run: &Run, witness: &Witness) -> Vec<u64> {
    let mut next = vec![0u64; run.producers as usize];
    loop {
        let result = rx.recv_batch(run.batch_max, |&(producer, seq), payload| {
            witness.leave(payload.len() as u64);
            let expected = &mut next[producer as usize];
            assert_eq!(seq, *expected, "producer {producer}: lost or duplicated");
            *expected += 1;
            for (i, &b) in payload.iter().enumerate() {
                assert_eq!(b, pattern(producer, seq, i), "payload of {producer}/{seq}");
            }
        });
        if let Err(RecvError) = result {
            break;
        }
    }
    let stats = rx.stats();
    assert_eq!(stats.occupied_slots, 0);
    assert_eq!(stats.occupied_bytes, 0);
    next
}

fn stress(run: Run) -> Arc<Witness> {
    let run = Arc::new(run);
    let witness = Arc::new(Witness::default());
    let (tx, rx) = HandoffChannel::<Tag>::new(run.capacity).unwrap();
    let producers: Vec<_> = (0..run.producers)
        .map(|p| {
            let (tx, run, witness) = (tx.clone(), run.clone(), witness.clone());
            thread::spawn(move || produce(tx, p, &run, &witness))
        })
        .collect();
    drop(tx);
    let got = consume(rx, &run, &witness);
    for producer in producers {
        producer.join().unwrap();
    }
    assert_eq!(got, vec![run.events_per_producer; run.producers as usize]);
    witness
}

#[test]
fn millions_of_random_size_events_four_producers() {
    stress(Run {
        producers: 4,
        events_per_producer: 500_000,
        capacity: Capacity {
            slots: 1024,
            bytes: 64 * 1024,
        },
        size_max: 256,
        oversize_every: 0,
        batch_max: usize::MAX,
    });
}

#[test]
fn slot_bound_holds_under_contention() {
    let witness = stress(Run {
        producers: 4,
        events_per_producer: 100_000,
        capacity: Capacity {
            slots: 2,
            bytes: 1 << 20,
        },
        size_max: 64,
        oversize_every: 0,
        batch_max: 3,
    });
    assert_eq!(
        witness.slots_max.load(Ordering::Relaxed),
        2,
        "bound reached"
    );
}

#[test]
fn byte_bound_holds_with_oversize_events() {
    let witness = stress(Run {
        producers: 4,
        events_per_producer: 100_000,
        capacity: Capacity {
            slots: 64,
            bytes: 300,
        },
        size_max: 200,
        oversize_every: 1000,
        batch_max: usize::MAX,
    });
    assert!(
        witness.bytes_max.load(Ordering::Relaxed) > 300,
        "oversize events went through"
    );
}
