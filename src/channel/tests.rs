//! Single-process behaviour of the handoff channel with real threads and
//! futexes. The concurrency proofs are the loom models in `loom-tests/`; the
//! heavy multi-producer runs are in `tests/channel_stress.rs`.

use super::*;
use std::thread;
use std::time::Duration;

fn channel(slots: usize, bytes: u64) -> (Sender<u64>, Receiver<u64>) {
    HandoffChannel::new(Capacity { slots, bytes }).unwrap()
}

fn collect(rx: &mut Receiver<u64>) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    while rx
        .try_recv_batch(usize::MAX, |h, p| out.push((*h, p.to_vec())))
        .is_ok()
    {}
    out
}

#[test]
fn rejects_bad_capacity() {
    assert_eq!(
        HandoffChannel::<u64>::new(Capacity { slots: 3, bytes: 1 }).unwrap_err(),
        CapacityError::Slots(3)
    );
    assert_eq!(
        HandoffChannel::<u64>::new(Capacity { slots: 0, bytes: 1 }).unwrap_err(),
        CapacityError::Slots(0)
    );
    assert_eq!(
        HandoffChannel::<u64>::new(Capacity {
            slots: SLOTS_MAX * 2,
            bytes: 1
        })
        .unwrap_err(),
        CapacityError::Slots(SLOTS_MAX * 2)
    );
    assert_eq!(
        HandoffChannel::<u64>::new(Capacity { slots: 1, bytes: 0 }).unwrap_err(),
        CapacityError::Bytes(0)
    );
    assert_eq!(
        HandoffChannel::<u64>::new(Capacity {
            slots: 1,
            bytes: BYTES_MAX + 1
        })
        .unwrap_err(),
        CapacityError::Bytes(BYTES_MAX + 1)
    );
}

#[test]
fn slot_bound_then_full() {
    let (tx, mut rx) = channel(4, 1 << 20);
    for i in 0..4 {
        tx.try_send(i, &[i as u8]).unwrap();
    }
    assert_eq!(tx.try_send(9, b"x"), Err(TrySendError::Full));
    assert_eq!(tx.stats().occupied_slots, 4);
    let got = collect(&mut rx);
    assert_eq!(got.len(), 4);
    assert_eq!(tx.stats().occupied_slots, 0);
    tx.try_send(9, b"x").unwrap();
}

#[test]
fn byte_bound_then_full() {
    let (tx, mut rx) = channel(64, 10);
    tx.try_send(0, &[0; 6]).unwrap();
    assert_eq!(tx.try_send(1, &[0; 5]), Err(TrySendError::Full));
    tx.try_send(1, &[0; 4]).unwrap();
    assert_eq!(tx.try_send(2, &[]), Ok(()), "empty events only take a slot");
    assert_eq!(tx.stats().occupied_bytes, 10);
    assert_eq!(collect(&mut rx).len(), 3);
    assert_eq!(tx.stats().occupied_bytes, 0);
}

#[test]
fn oversize_event_needs_empty_channel() {
    let (tx, mut rx) = channel(4, 8);
    tx.try_send(0, b"a").unwrap();
    assert_eq!(tx.try_send(1, &[7; 100]), Err(TrySendError::Full));
    assert_eq!(collect(&mut rx).len(), 1);
    tx.try_send(1, &[7; 100]).unwrap();
    assert_eq!(tx.try_send(2, b"b"), Err(TrySendError::Full));
    let got = collect(&mut rx);
    assert_eq!(got, vec![(1, vec![7; 100])]);
}

#[test]
fn blocked_oversize_sender_gets_in_past_small_ones() {
    let (tx, mut rx) = channel(4, 8);
    tx.send(0, b"a").unwrap();
    let big_tx = tx.clone();
    let big = thread::spawn(move || big_tx.send(1, &[7; 100]));
    // Wait until the big sender has announced itself.
    while rx.chan.admission.load(Ordering::Relaxed) & admission::BIG_PENDING == 0 {
        thread::yield_now();
    }
    // A small event would fit both bounds, but is held back for the big one.
    assert_eq!(tx.try_send(2, b"b"), Err(TrySendError::Full));
    let mut order = Vec::new();
    while !order.contains(&1) {
        rx.recv_batch(usize::MAX, |h, _| order.push(*h)).unwrap();
    }
    big.join().unwrap().unwrap();
    assert_eq!(order, vec![0, 1]);
    tx.try_send(2, b"b").unwrap();
}

#[test]
fn too_large_is_refused_without_allocating() {
    let (tx, _rx) = channel(1, 8);
    let huge = u32::MAX as usize + 1;
    assert_eq!(
        tx.try_reserve(huge).err(),
        Some(TrySendError::TooLarge(huge))
    );
    assert_eq!(tx.reserve(huge).err(), Some(SendError::TooLarge(huge)));
}

#[test]
fn permit_fills_in_place_and_cancels_on_drop_or_error() {
    let (tx, mut rx) = channel(4, 64);
    let permit = tx.reserve(3).unwrap();
    assert_eq!(permit.len(), 3);
    permit
        .commit_with(|buf| {
            buf.copy_from_slice(b"abc");
            Ok::<_, ()>(1)
        })
        .unwrap();
    drop(tx.reserve(5).unwrap());
    let err = tx
        .reserve(2)
        .unwrap()
        .commit_with(|_| Err::<u64, _>("lapped"));
    assert_eq!(err, Err("lapped"));
    tx.send(4, b"d").unwrap();
    assert_eq!(tx.stats().occupied_slots, 4);
    assert_eq!(tx.stats().occupied_bytes, 3 + 5 + 2 + 1);
    let got = collect(&mut rx);
    assert_eq!(got, vec![(1, b"abc".to_vec()), (4, b"d".to_vec())]);
    assert_eq!(rx.stats().occupied_bytes, 0);
}

#[test]
fn batch_holds_more_events_than_the_channel() {
    let (tx, mut rx) = channel(2, 64);
    let producer = thread::spawn(move || {
        for i in 0..1000u64 {
            tx.send(i, &i.to_le_bytes()).unwrap();
        }
    });
    let mut next = 0u64;
    while rx
        .recv_batch(usize::MAX, |h, p| {
            assert_eq!(*h, next);
            assert_eq!(p, next.to_le_bytes());
            next += 1;
        })
        .is_ok()
    {}
    producer.join().unwrap();
    assert_eq!(next, 1000);
}

#[test]
fn recv_batch_respects_max() {
    let (tx, mut rx) = channel(8, 64);
    for i in 0..5 {
        tx.send(i, b"").unwrap();
    }
    assert_eq!(rx.recv_batch(2, |_, _| {}), Ok(2));
    assert_eq!(rx.recv_batch(usize::MAX, |_, _| {}), Ok(3));
    assert_eq!(rx.try_recv_batch(8, |_, _| {}), Err(TryRecvError::Empty));
    drop(tx);
    assert_eq!(
        rx.try_recv_batch(8, |_, _| {}),
        Err(TryRecvError::Disconnected)
    );
    assert_eq!(rx.recv_batch(8, |_, _| {}), Err(RecvError));
}

#[test]
fn receiver_drop_wakes_sleeping_sender_at_once() {
    let (tx, rx) = channel(1, 64);
    tx.send(0, b"x").unwrap();
    let sender = thread::spawn(move || tx.send(1, b"y"));
    while rx.stats().full_stalls == 0 {
        thread::yield_now();
    }
    thread::sleep(Duration::from_millis(20)); // let it reach the futex
    drop(rx);
    assert_eq!(sender.join().unwrap(), Err(SendError::Disconnected));
}

#[test]
fn last_sender_drop_wakes_sleeping_receiver() {
    let (tx, mut rx) = channel(4, 64);
    let tx2 = tx.clone();
    let receiver = thread::spawn(move || {
        let mut n = 0;
        while rx.recv_batch(8, |_, _| n += 1).is_ok() {}
        (n, rx.stats().receiver_sleeps)
    });
    // The receiver goes to sleep on the empty channel, takes the one event,
    // and goes to sleep again; only then does the last sender go.
    while tx.stats().receiver_sleeps == 0 {
        thread::yield_now();
    }
    tx.send(1, b"x").unwrap();
    drop(tx);
    while tx2.stats().receiver_sleeps < 2 {
        thread::yield_now();
    }
    thread::sleep(Duration::from_millis(20)); // let it reach the futex
    drop(tx2);
    let (n, sleeps) = receiver.join().unwrap();
    assert_eq!(n, 1);
    assert!(sleeps >= 2, "the receiver slept on the empty channel twice");
}

#[test]
fn huge_buffers_are_not_kept() {
    let (tx, mut rx) = channel(2, 1024);
    tx.send(0, &vec![1u8; 1 << 20]).unwrap();
    assert_eq!(collect(&mut rx).len(), 1);
    let kept: usize = rx
        .chan
        .slots
        .iter()
        // SAFETY: no sender is running; the test owns both ends.
        .map(|s| s.payload.with(|p| unsafe { (*p).capacity() }))
        .sum();
    assert!(kept <= 2 * rx.chan.keep_bytes, "slots keep {kept} bytes");
    // Ordinary events reuse the buffers: capacity stays after consumption.
    tx.send(1, &[2u8; 100]).unwrap();
    assert_eq!(collect(&mut rx).len(), 1);
    // SAFETY: no sender is running; the test owns both ends.
    let reused = rx.chan.slots[1]
        .payload
        .with(|p| unsafe { (*p).capacity() });
    assert!(reused >= 100);
}
