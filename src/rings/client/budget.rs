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

use super::Producer;
use crate::rings::{Event, Level};
use crate::sync::{AtomicU64, Ordering};

/// The environment variable that turns the budget on for every producer
/// of a process: `BURST/INTERVAL`, e.g. `10000/30s` (eventd's defaults).
pub const BUDGET_ENV: &str = "EVENTD_RATE_LIMIT";
/// The name of a producer's report of events it refused.
pub const REFUSED_NAME: &str = "rate_limit.refused";

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
    refused: AtomicU64,
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

impl Budget {
    /// The budget [`BUDGET_ENV`] asks for; off when unset or unreadable
    /// (a producer never fails over its environment).
    pub fn from_env() -> Budget {
        let (interval_ms, burst) = std::env::var(BUDGET_ENV)
            .ok()
            .and_then(|v| parse(&v))
            .unwrap_or((0, 0));
        Budget::new(interval_ms, burst)
    }
}

/// `BURST/INTERVAL` as (interval ms, burst).
pub fn parse(text: &str) -> Option<(u64, u64)> {
    let (burst, interval) = text.trim().split_once('/')?;
    let burst = burst.trim().parse().ok()?;
    let interval = humantime::parse_duration(interval.trim()).ok()?;
    Some((interval.as_millis() as u64, burst))
}

impl Producer {
    /// Replaces this producer's budget: `burst` events per `interval_ms`
    /// (either 0: none).
    pub fn with_budget(mut self, interval_ms: u64, burst: u64) -> Producer {
        self.budget = Budget::new(interval_ms, burst);
        self
    }

    /// Events refused by the budget and not reported yet.
    pub fn refused_pending(&self) -> u64 {
        self.budget.pending()
    }

    /// Whether an event of `level` is within the budget now; writes the
    /// report of a window that has just ended first. A refusal is counted
    /// in [`Producer::dropped`] too.
    pub(super) fn within_budget(&self, level: Level) -> bool {
        if self.budget.is_off() {
            return true;
        }
        let verdict = self.budget.judge(level, crate::sync::monotonic_ms());
        if let Some((refused, window_ms)) = verdict.report {
            self.report_refused(refused, window_ms);
        }
        if !verdict.pass {
            // Relaxed: a statistic.
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        verdict.pass
    }

    /// Writes one report of `refused` events (in a window of `window_ms`)
    /// into the ring; if it cannot be written, the count goes back to the
    /// budget for the next report.
    pub fn report_refused(&self, refused: u64, window_ms: u64) {
        let Some(emitter) = self.open() else {
            self.budget.refused.fetch_add(refused, Ordering::Relaxed);
            return;
        };
        let message = format!(
            "refused {refused} events of provider {} in {} s at the source",
            self.provider,
            window_ms.div_ceil(1000)
        );
        let fields = format!(r#"{{"refused_at_source":{refused},"window_ms":{window_ms}}}"#);
        let ts_ns = crate::rings::now_ns();
        let event = Event {
            ts_ns,
            pid: std::process::id(),
            tid: 0,
            uid: crate::access::own_uid(),
            level: Level::Warning,
            provider: &self.provider,
            name: REFUSED_NAME,
            message: &message,
            fields: &fields,
        };
        if emitter.emit(&event).is_err() {
            self.budget.refused.fetch_add(refused, Ordering::Relaxed);
        }
    }
}

impl Drop for Producer {
    /// The refusals of the window still open are reported as the
    /// producer goes away.
    fn drop(&mut self) {
        let refused = self.budget.take();
        if refused > 0 {
            self.report_refused(refused, 0);
            // Whatever could not be written stays counted in `dropped`.
        }
    }
}
