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
    interval_ms: u64,
    burst: u64,
    /// The current window's start (`sync` clock ms; `u64::MAX`: none yet).
    start_ms: AtomicU64,
    /// Events admitted in the current window.
    used: AtomicU64,
    /// Events refused and not reported yet.
    pub(crate) refused: AtomicU64,
}

impl Budget {
    /// `burst` events per `interval_ms`; either 0: no limit.
    pub fn new(interval_ms: u64, burst: u64) -> Self {
        Budget {
            interval_ms,
            burst,
            start_ms: AtomicU64::new(u64::MAX),
            used: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    pub fn is_off(&self) -> bool {
        self.interval_ms == 0 || self.burst == 0
    }

    /// Judges one event of `level` at `now_ms`.
    pub fn judge(&self, level: Level, now_ms: u64) -> Verdict {
        let mut verdict = Verdict {
            pass: true,
            report: None,
        };
        if self.is_off() || level < Level::Warning {
            return verdict;
        }
        // Relaxed: the start only chooses who opens the next window; the
        // CAS below makes that one thread, and the counters are exact on
        // their own (each a single read-modify-write).
        let start = self.start_ms.load(Ordering::Relaxed);
        if start == u64::MAX || now_ms >= start.saturating_add(self.interval_ms) {
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
        if self.used.fetch_add(1, Ordering::Relaxed) >= self.burst {
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
