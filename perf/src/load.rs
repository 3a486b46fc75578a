//! The load: one producer thread per attached ring, pinned to that ring's
//! CPU, emitting into it.
//!
//! Two modes:
//! - **flat out**: as fast as the pipeline drains. A producer emits without
//!   pause while its ring's unread backlog (`Ring::backlog_pages`, published
//!   by the drain at each page) is under half the ring, and naps 1 ms when
//!   it is above. This measures the pipeline's sustained rate with
//!   no loss; a producer that ignored the backlog would only measure how fast
//!   the ring overwrites itself.
//! - **rate**: a fixed total rate, spread evenly over the producers, paced in
//!   1 ms ticks (open loop: the producers never look at the backlog).

use eventd::rings::{EmitError, Event, Level, Ring};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Mode {
    FlatOut,
    /// Events per second, all producers together.
    Rate(u64),
}

/// Message sizes: fixed when `min == max`, else uniform in `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Sizes {
    pub min: usize,
    pub max: usize,
}

/// What one producer did.
#[derive(Debug, Default)]
pub struct Counts {
    /// Events that got a sequence number (written, or lost to a lap while
    /// being written: those show up in a gap).
    pub sequenced: AtomicU64,
    /// Refused before getting a sequence number (ring contended).
    pub refused: AtomicU64,
}

pub struct Producer {
    pub handle: std::thread::JoinHandle<()>,
    pub counts: Arc<Counts>,
}

/// Starts one producer thread per ring until `stop` is set.
pub fn start(
    rings: &[Arc<Ring>],
    mode: Mode,
    sizes: Sizes,
    stop: Arc<AtomicBool>,
) -> Vec<Producer> {
    let per_producer = per_producer(mode, rings.len());
    rings
        .iter()
        .enumerate()
        .map(|(i, ring)| {
            let ring = ring.clone();
            let stop = stop.clone();
            let counts = Arc::new(Counts::default());
            let c = counts.clone();
            let handle = std::thread::Builder::new()
                .name(format!("load-{}", ring.cpu()))
                .spawn(move || {
                    pin_to(ring.cpu());
                    produce(&ring, per_producer, sizes, &stop, &c, i as u64);
                })
                .expect("spawning a load thread");
            Producer { handle, counts }
        })
        .collect()
}

/// Each producer's share of a fixed rate; `None` for flat out.
pub fn per_producer(mode: Mode, producers: usize) -> Option<u64> {
    match mode {
        Mode::FlatOut => None,
        Mode::Rate(total) => Some(total.div_ceil(producers.max(1) as u64)),
    }
}

pub fn pin_to(cpu: u32) {
    // SAFETY: cpu_set_t is plain data, zeroed then filled by CPU_SET;
    // sched_setaffinity(0, ..) applies to the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        // Failing to pin (a restricted cpuset) only makes the load less even.
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Emits into `ring` until `stop` is set, keeping `counts` current.
pub fn produce(
    ring: &Ring,
    per_second: Option<u64>,
    sizes: Sizes,
    stop: &AtomicBool,
    counts: &Counts,
    seed: u64,
) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let text: String = (0..sizes.max.max(1))
        .map(|_| rng.random_range(b'a'..=b'z') as char)
        .collect();
    let high_water = (ring.geometry().page_count as u64 / 2).max(1);
    // Once: `process::id` is a system call each time.
    let pid = std::process::id();
    let (mut sequenced, mut refused) = (0u64, 0u64);
    let start = Instant::now();
    let mut tick = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let burst = match per_second {
            None => {
                if ring.backlog_pages() >= high_water {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                256
            }
            Some(rate) => {
                // Events due by the end of this 1 ms tick.
                tick += 1;
                let due = rate * tick / 1000;
                let next = start + Duration::from_millis(tick);
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                due.saturating_sub(sequenced + refused)
            }
        };
        for _ in 0..burst {
            let len = if sizes.min == sizes.max {
                sizes.max
            } else {
                rng.random_range(sizes.min..=sizes.max)
            };
            match ring.emit(&event(&text[..len], eventd::rings::now_ns(), pid)) {
                Ok(()) | Err(EmitError::Overwritten) => sequenced += 1,
                Err(EmitError::Busy | EmitError::Gone) => refused += 1,
                Err(EmitError::Encode(e)) => panic!("the load's events must fit the ring: {e}"),
            }
        }
        counts.sequenced.store(sequenced, Ordering::Relaxed);
        counts.refused.store(refused, Ordering::Relaxed);
    }
    counts.sequenced.store(sequenced, Ordering::Relaxed);
    counts.refused.store(refused, Ordering::Relaxed);
}

fn event(message: &str, ts_ns: i64, pid: u32) -> Event<'_> {
    Event {
        ts_ns,
        pid,
        tid: 0,
        uid: 0,
        level: Level::Info,
        provider: "perf",
        name: "load",
        message,
        fields: "",
    }
}
