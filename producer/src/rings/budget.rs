//! The producer's own budget ("at the source too"): a flood that outruns
//! the drain on its CPU laps the ring before eventd can judge it, so a
//! [`Budget`] refuses a provider's events past `burst` per `interval`
//! before they are written, counts each one it refused, and hands the
//! count out once the window has ended, for the caller to write into the
//! ring as one report. Events of level err and more severe always pass.
//!
//! Lock-free, on the `sync` shim's atomics (model-checked in
//! `loom-tests/tests/budget.rs`): every refusal is counted exactly once,
//! taken by exactly one report (a swap), whatever the interleaving. The
//! burst itself is approximate at a window's turn (a thread may count
//! against the old window an event the new one admits), never the count.

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
    /// The event time (realtime ms) of the last look at the daemon's
    /// limit; 0: none yet (read by the client, which the loom models leave
    /// out).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) last_look_ms: AtomicU64,
    /// The current window's start (`sync` clock ms; `u64::MAX`: none yet).
    start_ms: AtomicU64,
    /// Events admitted in the current window.
    used: AtomicU64,
    /// Events refused and not reported yet.
    pub(crate) refused: AtomicU64,
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
            last_look_ms: AtomicU64::new(0),
            start_ms: AtomicU64::new(u64::MAX),
            used: AtomicU64::new(0),
            refused: AtomicU64::new(0),
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

    /// Judges one event of `level` at `now_ms`.
    pub fn judge(&self, level: Level, now_ms: u64) -> Verdict {
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
        let start = self.start_ms.load(Ordering::Relaxed);
        if start == u64::MAX || now_ms >= start.saturating_add(interval_ms) {
            let won = self
                .start_ms
                .compare_exchange(start, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
            if won {
                self.used.store(0, Ordering::Relaxed);
                let refused = self.refused.swap(0, Ordering::Relaxed);
                if refused > 0 {
                    verdict.report = Some((refused, now_ms.saturating_sub(start)));
                }
            }
        }
        if self.used.fetch_add(1, Ordering::Relaxed) >= burst {
            self.refused.fetch_add(1, Ordering::Relaxed);
            verdict.pass = false;
        }
        verdict
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
