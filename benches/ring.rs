//! KMES ring costs: emitting (ns per event, one and two threads on one ring,
//! 32, 128 and 256-byte messages) and reading (events per second drained by
//! one reader). Every measured run checks what it wrote or read.
//!
//! `cargo bench --bench ring`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use eventd::rings::format::{Geometry, PAGE_SIZE_DEFAULT, RING_BYTES_DEFAULT};
use eventd::rings::{EmitError, Event, Level, Ring, RingItem, RingReader};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

fn event(message: &str) -> Event<'_> {
    Event {
        ts_ns: 1_700_000_000_000_000_000,
        pid: 4242,
        tid: 4243,
        uid: 1000,
        level: Level::Info,
        provider: "bench",
        name: "tick",
        message,
        fields: "",
    }
}

fn new_ring(dir: &tempfile::TempDir, name: &str) -> Arc<Ring> {
    let g = Geometry::for_ring_bytes(RING_BYTES_DEFAULT, PAGE_SIZE_DEFAULT).unwrap();
    Arc::new(Ring::create(&dir.path().join(name), g, 0).unwrap())
}

fn emit(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("ring_emit");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(3));
    for size in [32usize, 128, 256] {
        let message = "m".repeat(size);
        for threads in [1u64, 2] {
            let ring = new_ring(&dir, &format!("emit-{size}-{threads}.ring"));
            group.bench_function(format!("{size}B_{threads}t"), |b| {
                b.iter_custom(|iters| {
                    let per = iters / threads + 1;
                    let start = Instant::now();
                    let handles: Vec<_> = (0..threads)
                        .map(|_| {
                            let (ring, message) = (ring.clone(), message.clone());
                            thread::spawn(move || {
                                let e = event(&message);
                                for _ in 0..per {
                                    // With nobody reading, a thread preempted
                                    // mid-write can be lapped by the other
                                    // (`Overwritten`); that is the ring
                                    // working as designed.
                                    match ring.emit(&e) {
                                        Ok(()) | Err(EmitError::Overwritten) => {}
                                        Err(err) => panic!("emit failed: {err}"),
                                    }
                                }
                            })
                        })
                        .collect();
                    for h in handles {
                        h.join().unwrap();
                    }
                    start.elapsed()
                })
            });
            assert_eq!(ring.producer_refusals(), 0);
        }
    }
    group.finish();
}

fn read(c: &mut Criterion) {
    const EVENTS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("ring_read");
    group.throughput(Throughput::Elements(EVENTS));
    for size in [32usize, 128] {
        let ring = new_ring(&dir, &format!("read-{size}.ring"));
        let message = "r".repeat(size);
        let mut reader = RingReader::new(ring.clone());
        group.bench_function(format!("{size}B"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    for _ in 0..EVENTS {
                        ring.emit(&event(&message)).unwrap();
                    }
                    let start = Instant::now();
                    let mut n = 0u64;
                    let mut bytes = 0usize;
                    while let Some(item) = reader.poll() {
                        match item {
                            RingItem::Event { event, .. } => bytes += event.message.len(),
                            RingItem::Gap(gap) => panic!("lost events: {gap:?}"),
                        }
                        n += 1;
                    }
                    total += start.elapsed();
                    assert_eq!((n, bytes), (EVENTS, EVENTS as usize * size));
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, emit, read);
criterion_main!(benches);
