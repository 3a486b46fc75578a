//! The producer's own budget ("at the source too"): a flood that outruns
//! the drain on its CPU laps the ring before eventd can judge it, so a
//! [`Budget`] refuses a provider's events past `burst` per `interval`
//! before they are written, counts each one it refused, and hands the
//! count out once the window has ended, for the caller to write into the
//! ring as one report. Events of level err and more severe always pass.
//!
//! Every thread of a program shares its producer's budget, so the events
//! admitted are not counted one by one in a word they all write (that
//! line would pass between the CPUs on every event: 30-50 ns an event with
//! two threads, perf/runs/notebook.md). Each CPU takes its window's
//! admissions in chunks instead, into a slot of its own, and spends them
//! there; a CPU that finds the window's pool empty takes what other CPUs
//! still hold before it refuses, so the burst is spent whole.
//!
//! Lock-free, on the `sync` shim's atomics (model-checked in
//! `loom-tests/tests/budget.rs`): every event is passed or refused, every
//! refusal is counted exactly once and taken by exactly one report (a
//! swap), and a window admits at most its burst, whatever the
//! interleaving. The burst is approximate at a window's turn (a thread may
//! take from the old window's pool admissions it spends in the new one)
//! and, by at most what one racing CPU is putting in its slot, when the
//! pool runs out; never the counts.

use crate::rings::per_cpu::PerCpu;
use crate::rings::Level;
use crate::sync::{AtomicU64, Ordering};

/// What the budget says of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Write the event (else it was refused, and counted).
    pub pass: bool,
    /// A window has just ended with events refused: write a report of
    /// them first (their number, and how long the window was, ms).
    pub report: Option<(u64, u64)>,
}

/// One provider's budget in this process.
#[derive(Debug)]
pub struct Budget {
    /// `burst` events per `interval` ms, in one word (interval in the high
    /// half, burst in the low half; either 0: no limit), so that a change
    /// ([`Budget::set`]) replaces both at once.
    limit: AtomicU64,
    /// Whether the limit follows what the daemon publishes in its rings
    /// (else it was fixed by the program or its environment).
    follows_daemon: bool,
    /// The event time (realtime ns, as `u64`) of the last look at the
    /// daemon's limit; 0: none yet (read by the client, which the loom
    /// models leave out).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) last_look_ns: AtomicU64,
    /// The current window's start (`sync` clock ms; `u64::MAX`: none yet).
    start_ms: AtomicU64,
    /// The pool: admissions taken from a window (into the CPUs' slots),
    /// as a slot word: the window's tag and the count. A window's first
    /// taker finds an older tag and starts the count again, so there is no
    /// reset for a thread to race with.
    used: AtomicU64,
    /// Events refused and not reported yet.
    pub(crate) refused: AtomicU64,
    /// Each CPU's admissions taken and not spent yet: the window's tag
    /// (the low 32 bits of its start) in the high half, how many are left
    /// in the low half. A word whose tag is not the current window's holds
    /// none.
    slots: PerCpu,
    /// The tag of a window found with nothing left anywhere: its later
    /// refusals do not look through the slots again.
    exhausted: AtomicU64,
    /// How many admissions a CPU takes from the pool at once; `None`: as
    /// [`Budget::chunk`] says for the burst.
    chunk: Option<u64>,
}

/// The most admissions a CPU takes from a window's pool at once (fewer for
/// small bursts, see [`Budget::chunk`]).
const CHUNK_MAX: u64 = 32;

const LEFT_MASK: u64 = 0xffff_ffff;

fn slot_word(tag: u32, left: u64) -> u64 {
    (u64::from(tag) << 32) | left.min(LEFT_MASK)
}

/// What a slot word holds for the window of `tag`.
fn left_for(word: u64, tag: u32) -> u64 {
    if (word >> 32) as u32 == tag {
        word & LEFT_MASK
    } else {
        0
    }
}

fn pack(interval_ms: u64, burst: u64) -> u64 {
    (interval_ms.min(u32::MAX.into()) << 32) | burst.min(u32::MAX.into())
}

impl Budget {
    /// A fixed budget: `burst` events per `interval_ms`; either 0: no limit.
    pub fn new(interval_ms: u64, burst: u64) -> Self {
        Budget {
            limit: AtomicU64::new(pack(interval_ms, burst)),
            follows_daemon: false,
            last_look_ns: AtomicU64::new(0),
            start_ms: AtomicU64::new(u64::MAX),
            used: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            slots: PerCpu::new(),
            exhausted: AtomicU64::new(u64::MAX),
            chunk: None,
        }
    }

    /// [`Budget::new`] whose CPUs take `chunk` admissions at once (the
    /// models use small bursts with chunks above one).
    #[doc(hidden)]
    pub fn with_chunk(interval_ms: u64, burst: u64, chunk: u64) -> Self {
        Budget {
            chunk: Some(chunk.max(1)),
            ..Budget::new(interval_ms, burst)
        }
    }

    /// A budget that follows the daemon's limit ([`Budget::set`] from what
    /// the rings publish); no limit until one is seen.
    pub fn following_daemon() -> Self {
        Budget {
            follows_daemon: true,
            ..Budget::new(0, 0)
        }
    }

    pub fn follows_daemon(&self) -> bool {
        self.follows_daemon
    }

    /// Replaces the limit; windows opened from now on use it.
    pub fn set(&self, interval_ms: u64, burst: u64) {
        // Relaxed: the word is read on its own; a judge that still sees
        // the old limit only counts one event against it.
        self.limit
            .store(pack(interval_ms, burst), Ordering::Relaxed);
    }

    /// The limit now: (interval ms, burst); `None`: no limit.
    pub fn limit(&self) -> Option<(u64, u64)> {
        // Relaxed: see `set`.
        let w = self.limit.load(Ordering::Relaxed);
        let (interval_ms, burst) = (w >> 32, w & 0xffff_ffff);
        (interval_ms > 0 && burst > 0).then_some((interval_ms, burst))
    }

    pub fn is_off(&self) -> bool {
        self.limit().is_none()
    }

    /// Judges one event of `level` at `now_ms` on CPU `cpu` (where the
    /// thread runs: any value is correct, the CPU's own keeps its slot
    /// from being shared).
    pub fn judge(&self, level: Level, now_ms: u64, cpu: u32) -> Verdict {
        let mut verdict = Verdict {
            pass: true,
            report: None,
        };
        let Some((interval_ms, burst)) = self.limit().filter(|_| level >= Level::Warning) else {
            return verdict;
        };
        // Relaxed: the start only chooses who opens the next window; the
        // CAS below makes that one thread, and the counters are exact on
        // their own (each a single read-modify-write).
        let mut start = self.start_ms.load(Ordering::Relaxed);
        if start == u64::MAX || now_ms >= start.saturating_add(interval_ms) {
            match self.start_ms.compare_exchange(
                start,
                now_ms,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let refused = self.refused.swap(0, Ordering::Relaxed);
                    if refused > 0 {
                        verdict.report = Some((refused, now_ms.saturating_sub(start)));
                    }
                    start = now_ms;
                }
                // Another thread opened the window (never back to none).
                Err(current) => start = current,
            }
        }
        // The low half: windows start at least a millisecond apart, so
        // two tags meet only 2^32 ms (49 days) apart.
        let tag = start as u32;
        let slot = self.slots.of(cpu);
        if self.spend(slot, tag)
            || self.take_from_pool(slot, tag, burst)
            || self.take_from_others(slot, tag)
        {
            return verdict;
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        verdict.pass = false;
        verdict
    }

    /// How many admissions a CPU takes from the pool at once: few enough
    /// that a small burst is not all in one CPU's hand.
    fn chunk(&self, burst: u64) -> u64 {
        self.chunk
            .unwrap_or_else(|| (burst / 16).clamp(1, CHUNK_MAX))
    }

    /// Spends one of the admissions `slot` holds for the window of `tag`.
    fn spend(&self, slot: &AtomicU64, tag: u32) -> bool {
        // Relaxed, here and in every slot operation: each is a single
        // read-modify-write of its word, exact on its own; nothing else is
        // published through a slot.
        let mut word = slot.load(Ordering::Relaxed);
        while left_for(word, tag) > 0 {
            match slot.compare_exchange_weak(word, word - 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
        false
    }

    /// Takes a chunk from the window's pool: spends one, keeps the rest.
    fn take_from_pool(&self, slot: &AtomicU64, tag: u32, burst: u64) -> bool {
        let chunk = self.chunk(burst);
        // Acquire, with the Release below: a thread that sees the pool of
        // a window sees that window's start too (its taker read it before
        // the CAS), so it never takes the pool of the window now open for
        // an older one's (which would clear its count).
        let mut word = self.used.load(Ordering::Acquire);
        loop {
            // The pool of the window now open is the one to take from, also
            // for a thread that saw the one before it start (a turn just
            // now); any other pool (an older window's, or none yet) is
            // empty for this thread's window.
            let pool_tag = (word >> 32) as u32;
            // Relaxed: ordered after the pool's taker's read of the start
            // by the Acquire above.
            let open = self.start_ms.load(Ordering::Relaxed) as u32;
            let tag = if pool_tag != tag && pool_tag == open {
                pool_tag
            } else {
                tag
            };
            let taken = left_for(word, tag);
            if taken >= burst {
                return false;
            }
            let got = chunk.min(burst - taken);
            match self.used.compare_exchange_weak(
                word,
                slot_word(tag, taken + got),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.keep(slot, tag, got - 1);
                    return true;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Takes what another CPU's slot holds for this window (the pool is
    /// empty): spends one, keeps the rest.
    fn take_from_others(&self, slot: &AtomicU64, tag: u32) -> bool {
        if self.exhausted.load(Ordering::Relaxed) == u64::from(tag) {
            return false;
        }
        for other in self.slots.iter() {
            let mut word = other.load(Ordering::Relaxed);
            while left_for(word, tag) > 0 {
                match other.compare_exchange_weak(
                    word,
                    slot_word(tag, 0),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        self.keep(slot, tag, left_for(word, tag) - 1);
                        return true;
                    }
                    Err(now) => word = now,
                }
            }
        }
        // Nothing anywhere: later refusals of this window skip the walk.
        // (A CPU still putting a chunk's rest in its slot spends it there.)
        self.exhausted.store(u64::from(tag), Ordering::Relaxed);
        false
    }

    /// Adds `n` admissions of the window of `tag` to `slot` (dropping what
    /// it held for an older window).
    fn keep(&self, slot: &AtomicU64, tag: u32, n: u64) {
        if n == 0 {
            return;
        }
        let mut word = slot.load(Ordering::Relaxed);
        loop {
            let next = slot_word(tag, left_for(word, tag) + n);
            match slot.compare_exchange_weak(word, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }

    /// Events refused and not reported yet (a statistic).
    pub fn pending(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Takes the refusals not reported yet (when the producer goes away).
    pub fn take(&self) -> u64 {
        self.refused.swap(0, Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Passes of `n` events of one thread on `cpu` at `now_ms`.
    fn passes(budget: &Budget, n: u64, now_ms: u64, cpu: u32) -> u64 {
        (0..n)
            .filter(|_| budget.judge(Level::Info, now_ms, cpu).pass)
            .count() as u64
    }

    #[test]
    fn a_thread_moving_between_cpus_gets_the_whole_burst() {
        // Chunks of 32: each CPU's slot keeps what it took and did not spend.
        let budget = Budget::new(1000, 1000);
        let mut passed = 0;
        for cpu in [0, 1, 2, 0, 70, 3] {
            passed += passes(&budget, 150, 5, cpu);
        }
        assert_eq!(passed, 900);
        // The pool runs dry on CPU 5; what CPUs 0-3 and 70 hold is taken
        // before anything is refused.
        assert_eq!(passes(&budget, 500, 5, 5), 100);
        assert_eq!(budget.pending(), 400);
        // Errors always pass, and are not counted.
        assert!(budget.judge(Level::Err, 5, 5).pass);
        assert_eq!(budget.pending(), 400);
    }

    #[test]
    fn any_clock_reading_gets_the_whole_burst() {
        // Tags are the low 32 bits of the window's start: past 2^31 ms
        // (24.9 days of uptime) and near the wrap too.
        for now_ms in [3_000_000_000, u64::from(u32::MAX) - 1, 1 << 40] {
            let budget = Budget::new(1000, 1000);
            assert_eq!(passes(&budget, 1200, now_ms, 4), 1000, "at {now_ms}");
            assert_eq!(passes(&budget, 1200, now_ms + 1000, 4), 1000, "at {now_ms}");
        }
    }

    #[test]
    fn each_window_admits_its_burst_and_reports_the_last_ones_refusals() {
        let budget = Budget::new(100, 10);
        assert_eq!(passes(&budget, 15, 0, 1), 10);
        // Refusals are reported by the first event of the next window.
        let v = budget.judge(Level::Info, 100, 2);
        assert_eq!((v.pass, v.report), (true, Some((5, 100))));
        assert_eq!(passes(&budget, 20, 150, 3), 9);
        assert_eq!(budget.take(), 11);
        // A lower limit applies from the next window's first chunk on.
        budget.set(100, 3);
        assert_eq!(passes(&budget, 5, 200, 1), 3);
    }
}
