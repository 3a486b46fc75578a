//! The handoff channel beside crossbeam-channel, flume and std's sync_channel,
//! in one run: 1, 2 and 4 producers, one consumer, events of 16 B, 128 B and
//! 1 KiB, 1024 slots everywhere.
//!
//! Each peer is used the way its users must use it: crossbeam, flume and std
//! carry owned messages, so the producer allocates a `Vec<u8>` per event and the
//! consumer frees it; the handoff channel copies the bytes into a slot buffer it
//! keeps, and its consumer takes every ready event per call, as the shard writer
//! does. Every iteration checks the event count and a checksum of all payload
//! bytes before its time counts.
//!
//! `cargo bench --bench channel`; `scripts/bench-table` turns the results into
//! the table in perf/runs/notebook.md#handoff-channel (headline:
//! docs/performance.md#handoff-channel).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use eventd::channel::{Capacity, HandoffChannel};
use std::hint::black_box;
use std::thread;
use std::time::{Duration, Instant};

/// A fixed header beside each payload, the size of what the data path
/// carries: the channel accepts any `Copy` header type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventHeader {
    /// Epoch id of the ring the event came from.
    pub ring_epoch: u64,
    /// Sequence number of the event in its ring.
    pub seq: u64,
    /// Event timestamp, nanoseconds since the Unix epoch.
    pub ts_ns: i64,
    /// Logical CPU id of the ring.
    pub cpu: u32,
    /// What the payload is (event, gap report, control message).
    pub kind: u32,
}

const SLOTS: usize = 1024;
const EVENTS: u64 = 1_000_000;

/// What a run must have delivered: event count and the sum of every payload's
/// first and last byte.
fn expected(producers: u64, size: usize) -> (u64, u64) {
    let per = EVENTS / producers;
    let mut sum = 0;
    for p in 0..producers {
        for i in 0..per {
            let b = byte(p, i) as u64;
            sum += if size == 0 { 0 } else { 2 * b };
        }
    }
    (per * producers, sum)
}

fn byte(producer: u64, i: u64) -> u8 {
    (producer as u8).wrapping_mul(17).wrapping_add(i as u8)
}

fn fill(buf: &mut [u8], producer: u64, i: u64) {
    let b = byte(producer, i);
    if let Some(first) = buf.first_mut() {
        *first = b;
    }
    if let Some(last) = buf.last_mut() {
        *last = b;
    }
}

fn checksum(payload: &[u8]) -> u64 {
    match (payload.first(), payload.last()) {
        (Some(&a), Some(&b)) => a as u64 + b as u64,
        _ => 0,
    }
}

/// Runs `producers` threads sending `EVENTS` in all and a consumer on this
/// thread; returns the elapsed time after checking what arrived.
fn run_handoff(producers: u64, size: usize) -> Duration {
    let (tx, mut rx) = HandoffChannel::<EventHeader>::new(Capacity {
        slots: SLOTS,
        bytes: (SLOTS * 1024) as u64,
    })
    .unwrap();
    let start = Instant::now();
    let handles: Vec<_> = (0..producers)
        .map(|p| {
            let tx = tx.clone();
            thread::spawn(move || {
                let mut payload = vec![0u8; size];
                for i in 0..EVENTS / producers {
                    fill(&mut payload, p, i);
                    let header = EventHeader {
                        seq: i,
                        cpu: p as u32,
                        ..EventHeader::default()
                    };
                    tx.send(header, &payload).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let (mut count, mut sum) = (0u64, 0u64);
    while rx
        .recv_batch(usize::MAX, |h, payload| {
            black_box(h);
            count += 1;
            sum += checksum(payload);
        })
        .is_ok()
    {}
    let elapsed = start.elapsed();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        (count, sum),
        expected(producers, size),
        "handoff lost events"
    );
    elapsed
}

/// The same for a channel of owned `Vec<u8>` messages.
macro_rules! run_owned {
    ($producers:expr, $size:expr, $make:expr, $send:expr, $recv_all:expr) => {{
        let (producers, size) = ($producers, $size);
        let (tx, rx) = $make;
        let start = Instant::now();
        let handles: Vec<_> = (0..producers)
            .map(|p| {
                let tx = tx.clone();
                thread::spawn(move || {
                    for i in 0..EVENTS / producers {
                        let mut payload = vec![0u8; size];
                        fill(&mut payload, p, i);
                        $send(&tx, payload);
                    }
                })
            })
            .collect();
        drop(tx);
        let (mut count, mut sum) = (0u64, 0u64);
        $recv_all(rx, |payload: Vec<u8>| {
            count += 1;
            sum += checksum(&payload);
        });
        let elapsed = start.elapsed();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!((count, sum), expected(producers, size), "peer lost events");
        elapsed
    }};
}

fn run_crossbeam(producers: u64, size: usize) -> Duration {
    run_owned!(
        producers,
        size,
        crossbeam_channel::bounded::<Vec<u8>>(SLOTS),
        |tx: &crossbeam_channel::Sender<Vec<u8>>, m| tx.send(m).unwrap(),
        |rx: crossbeam_channel::Receiver<Vec<u8>>, mut f: _| rx.iter().for_each(&mut f)
    )
}

fn run_flume(producers: u64, size: usize) -> Duration {
    run_owned!(
        producers,
        size,
        flume::bounded::<Vec<u8>>(SLOTS),
        |tx: &flume::Sender<Vec<u8>>, m| tx.send(m).unwrap(),
        |rx: flume::Receiver<Vec<u8>>, mut f: _| rx.iter().for_each(&mut f)
    )
}

fn run_std(producers: u64, size: usize) -> Duration {
    run_owned!(
        producers,
        size,
        std::sync::mpsc::sync_channel::<Vec<u8>>(SLOTS),
        |tx: &std::sync::mpsc::SyncSender<Vec<u8>>, m| tx.send(m).unwrap(),
        |rx: std::sync::mpsc::Receiver<Vec<u8>>, mut f: _| rx.iter().for_each(&mut f)
    )
}

fn channels(c: &mut Criterion) {
    type Runner = fn(u64, usize) -> Duration;
    let peers: [(&str, Runner); 4] = [
        ("handoff", run_handoff),
        ("crossbeam", run_crossbeam),
        ("flume", run_flume),
        ("std_sync", run_std),
    ];
    for size in [16usize, 128, 1024] {
        for producers in [1u64, 2, 4] {
            let mut group = c.benchmark_group(format!("mpsc_{size}B_P{producers}"));
            group.throughput(Throughput::Elements(EVENTS / producers * producers));
            group.sample_size(10);
            group.warm_up_time(Duration::from_millis(500));
            group.measurement_time(Duration::from_secs(2));
            for (name, run) in peers {
                group.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter_custom(|iters| (0..iters).map(|_| run(producers, size)).sum())
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, channels);
criterion_main!(benches);
