//! The load: one producer thread per attached ring, pinned to that ring's
//! CPU, emitting into it (or, for many simulated rings, a few threads that
//! take the rings in turn).
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
    start_spread(rings, rings.len(), mode, sizes, stop)
}

/// Starts `threads` producer threads (at most one per ring) until `stop` is
/// set; thread `t` takes rings `t`, `t + threads`, ... in turn. One thread
/// per ring is pinned to its ring's CPU; a thread with several rings is
/// pinned to none (the scale scenario's rings outnumber the CPUs).
pub fn start_spread(
    rings: &[Arc<Ring>],
    threads: usize,
    mode: Mode,
    sizes: Sizes,
    stop: Arc<AtomicBool>,
) -> Vec<Producer> {
    let threads = threads.clamp(1, rings.len().max(1));
    let per_thread = per_producer(mode, threads);
    (0..threads)
        .map(|t| {
            let mine: Vec<Arc<Ring>> = rings.iter().skip(t).step_by(threads).cloned().collect();
            let stop = stop.clone();
            let counts = Arc::new(Counts::default());
            let c = counts.clone();
            let handle = std::thread::Builder::new()
                .name(format!("load-{t}"))
                .spawn(move || {
                    if let [ring] = mine.as_slice() {
                        pin_to(ring.cpu());
                    }
                    produce(&mine, per_thread, sizes, &stop, &c, t as u64);
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

/// Pins the calling thread to `cpu`, if this thread may run there at all:
/// under a narrower affinity (the export scenario's `--cluster-cpus`, or
/// `taskset`), a thread whose CPU is outside it stays where it may run
/// (an affinity that cannot be read does not stop the pinning).
pub fn pin_to(cpu: u32) {
    let allowed = allowed_cpus();
    if !allowed.is_empty() && !allowed.contains(&cpu) {
        return;
    }
    // Failing to pin (a restricted cpuset) only makes the load less even.
    let _ = run_on(&[cpu]);
}

/// The CPUs the calling thread may run on (empty if that cannot be read).
pub fn allowed_cpus() -> Vec<u32> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity(0, ..) fills it
    // for the calling thread and CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as u32)
            .filter(|&c| libc::CPU_ISSET(c as usize, &set))
            .collect()
    }
}

/// Lets the calling thread (and the threads and processes it starts from
/// now on, which inherit it) run on `cpus` only.
pub fn run_on(cpus: &[u32]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data, zeroed then filled by CPU_SET with
    // CPUs below CPU_SETSIZE only (checked), as CPU_SET requires;
    // sched_setaffinity(0, ..) applies to the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as u32 {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            libc::CPU_SET(c as usize, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Emits into `rings`, in turn, until `stop` is set, keeping `counts`
/// current. Flat out, a ring whose backlog is over half of it is passed
/// over, and the thread naps 1 ms when every ring is; at a fixed rate
/// (`per_second` for all of them) the events of each 1 ms tick go round
/// the rings.
pub fn produce(
    rings: &[Arc<Ring>],
    per_second: Option<u64>,
    sizes: Sizes,
    stop: &AtomicBool,
    counts: &Counts,
    seed: u64,
) {
    let Some(first) = rings.first() else {
        return;
    };
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let text: String = (0..sizes.max.max(1))
        .map(|_| rng.random_range(b'a'..=b'z') as char)
        .collect();
    let high_water = (first.geometry().page_count as u64 / 2).max(1);
    // Bursts get shorter with more rings so that each is fed evenly.
    let burst_max = (256 / rings.len() as u64).max(32);
    // Once: `process::id` is a system call each time.
    let pid = std::process::id();
    let (mut sequenced, mut refused) = (0u64, 0u64);
    let start = Instant::now();
    let mut tick = 0u64;
    let mut next_ring = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let mut due = match per_second {
            None => u64::MAX,
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
        let mut emitted_any = false;
        // Flat out: one pass over the rings; at a rate: until the tick's
        // events are out.
        let mut passes = rings.len();
        while due > 0 && (per_second.is_some() || passes > 0) {
            passes = passes.saturating_sub(1);
            let ring = &rings[next_ring];
            next_ring = (next_ring + 1) % rings.len();
            if per_second.is_none() && ring.backlog_pages() >= high_water {
                continue;
            }
            let burst = burst_max.min(due);
            due -= burst;
            emitted_any = true;
            for _ in 0..burst {
                let len = if sizes.min == sizes.max {
                    sizes.max
                } else {
                    rng.random_range(sizes.min..=sizes.max)
                };
                match ring.emit(&event(&text[..len], eventd::rings::now_ns(), pid)) {
                    Ok(()) | Err(EmitError::Overwritten) => sequenced += 1,
                    Err(EmitError::Busy | EmitError::Gone) => refused += 1,
                    Err(EmitError::Encode(e)) => {
                        panic!("the load's events must fit the ring: {e}")
                    }
                }
            }
        }
        if per_second.is_none() && !emitted_any {
            std::thread::sleep(Duration::from_millis(1));
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
