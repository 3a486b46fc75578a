//! Model tests of the handoff channel: every interleaving loom can reach within
//! the preemption bound, with futex sleeps emulated by the `sync` shim. A
//! dropped wakeup shows up as a deadlock ("all threads blocked"), a broken
//! slot handoff as a failed assertion or a data race on a slot cell.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p eventd-loom-tests --release`
//! (`.ci/run` does this; see there for the time it takes).
#![cfg(loom)]

use eventd::channel::{Capacity, HandoffChannel, SendError};
use loom::thread;

/// Header of the model events: (producer, index within that producer).
type Tag = (u8, u8);

/// Receives until the end, checking per-producer order and that payloads
/// match their headers; returns how many events each producer got through.
fn drain_all(rx: &mut eventd::channel::Receiver<Tag>, max: usize) -> [usize; 2] {
    let mut next = [0u8; 2];
    while let Ok(n) = rx.recv_batch(max, |&(producer, index), payload| {
        let p = producer as usize;
        assert_eq!(index, next[p], "producer {producer} out of order");
        assert!(
            payload.iter().all(|&b| b == producer + 1),
            "payload mixed up"
        );
        next[p] += 1;
    }) {
        assert!(n >= 1 && n <= max);
    }
    [next[0] as usize, next[1] as usize]
}

fn spawn_producer(
    tx: eventd::channel::Sender<Tag>,
    producer: u8,
    sizes: &'static [usize],
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for (index, &size) in sizes.iter().enumerate() {
            let payload = vec![producer + 1; size];
            tx.send((producer, index as u8), &payload).unwrap();
        }
    })
}

/// Two producers contend for one slot; the consumer must sleep and be woken
/// for every event, and each producer sleeps for room in turn.
#[test]
fn two_producers_one_slot() {
    loom::model(|| {
        let (tx, mut rx) = HandoffChannel::<Tag>::new(Capacity {
            slots: 1,
            bytes: 1024,
        })
        .unwrap();
        let a = spawn_producer(tx.clone(), 0, &[1, 1]);
        let b = spawn_producer(tx, 1, &[1]);
        let got = drain_all(&mut rx, 1);
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(got, [2, 1]);
    });
}

/// Many slots but a byte budget that admits one event at a time: the byte
/// bound alone must block the second producer, and the release must wake it.
#[test]
fn byte_budget_admits_one() {
    loom::model(|| {
        let (tx, mut rx) = HandoffChannel::<Tag>::new(Capacity { slots: 4, bytes: 3 }).unwrap();
        let a = spawn_producer(tx.clone(), 0, &[2, 3]);
        let b = spawn_producer(tx, 1, &[2]);
        let got = drain_all(&mut rx, 4);
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(got, [2, 1]);
    });
}

/// An event larger than the whole byte budget gets in once the channel is
/// empty, even while another producer keeps sending small ones.
#[test]
fn oversize_event_admitted_into_empty_channel() {
    loom::model(|| {
        let (tx, mut rx) = HandoffChannel::<Tag>::new(Capacity { slots: 2, bytes: 2 }).unwrap();
        let big = spawn_producer(tx.clone(), 0, &[5]);
        let small = spawn_producer(tx, 1, &[1, 1]);
        let got = drain_all(&mut rx, 2);
        big.join().unwrap();
        small.join().unwrap();
        assert_eq!(got, [1, 2]);
    });
}

/// The receiver sleeps on an empty channel; the last sender goes away. The
/// receiver must see every event sent before and then the end, never hang.
#[test]
fn senders_gone_wakes_sleeping_receiver() {
    loom::model(|| {
        let (tx, mut rx) = HandoffChannel::<Tag>::new(Capacity {
            slots: 2,
            bytes: 16,
        })
        .unwrap();
        let a = spawn_producer(tx.clone(), 0, &[1]);
        let b = thread::spawn(move || drop(tx));
        let got = drain_all(&mut rx, 2);
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(got, [1, 0]);
    });
}

/// Two producers sleep for room in a full channel; the receiver goes away.
/// Both must get `Disconnected` at once (or have been admitted before).
#[test]
fn receiver_gone_wakes_sleeping_senders() {
    loom::model(|| {
        let (tx, rx) = HandoffChannel::<Tag>::new(Capacity {
            slots: 1,
            bytes: 16,
        })
        .unwrap();
        tx.send((0, 0), &[1]).unwrap();
        let producers: Vec<_> = (0..2u8)
            .map(|p| {
                let tx = tx.clone();
                thread::spawn(move || tx.send((p, 1), &[p + 1]))
            })
            .collect();
        drop(rx);
        for producer in producers {
            assert_eq!(producer.join().unwrap(), Err(SendError::Disconnected));
        }
        assert_eq!(tx.send((0, 2), &[1]), Err(SendError::Disconnected));
    });
}

/// One batch call takes every ready event and gives room back as it goes, so
/// a producer sending more events than the channel holds is never stuck, and
/// a cancelled reservation gives its room back without being delivered.
#[test]
fn batch_consumption_with_cancelled_reservation() {
    loom::model(|| {
        let (tx, mut rx) = HandoffChannel::<Tag>::new(Capacity {
            slots: 2,
            bytes: 16,
        })
        .unwrap();
        let producer = thread::spawn(move || {
            tx.send((0, 0), &[1]).unwrap();
            drop(tx.reserve(1).unwrap()); // cancelled
            tx.reserve(1)
                .unwrap()
                .commit_with(|buf| {
                    buf[0] = 1;
                    Ok::<_, ()>((0, 1))
                })
                .unwrap();
            tx.send((0, 2), &[1]).unwrap();
        });
        let got = drain_all(&mut rx, usize::MAX);
        producer.join().unwrap();
        assert_eq!(got, [3, 0]);
        assert_eq!(rx.stats().occupied_slots, 0);
        assert_eq!(rx.stats().occupied_bytes, 0);
    });
}
