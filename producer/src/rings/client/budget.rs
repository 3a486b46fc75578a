//! The producer's side of its budget ([`crate::rings::budget`]): where
//! it comes from, and the report of what it refused, written into a ring.

use super::Producer;
pub use crate::rings::budget::{Budget, Verdict};
use crate::rings::{Event, Level};
use crate::sync::Ordering;

/// The environment variable that turns the budget on for every producer
/// of a process: `BURST/INTERVAL`, e.g. `10000/30s` (eventd's defaults).
pub const BUDGET_ENV: &str = "EVENTD_RATE_LIMIT";
/// The name of a producer's report of events it refused.
pub const REFUSED_NAME: &str = "rate_limit.refused";

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

/// `BURST/INTERVAL` as (interval ms, burst); the interval is a whole
/// number with a unit (`ms`, `s`, `min`/`m`, `h`), or seconds without one.
pub fn parse(text: &str) -> Option<(u64, u64)> {
    let (burst, interval) = text.trim().split_once('/')?;
    let burst = burst.trim().parse().ok()?;
    let interval = interval.trim();
    let digits = interval
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(interval.len());
    let (count, unit) = interval.split_at(digits);
    let count: u64 = count.parse().ok()?;
    let unit_ms = match unit.trim() {
        "ms" => 1,
        "" | "s" | "sec" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    Some((count.checked_mul(unit_ms)?, burst))
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

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn budget_text_reads_burst_and_interval() {
        assert_eq!(parse("10000/30s"), Some((30_000, 10_000)));
        assert_eq!(parse(" 5 / 250ms "), Some((250, 5)));
        assert_eq!(parse("100/2min"), Some((120_000, 100)));
        assert_eq!(parse("100/1h"), Some((3_600_000, 100)));
        assert_eq!(parse("100/7"), Some((7_000, 100)));
        assert_eq!(parse("0/30s"), Some((30_000, 0)));
        for bad in [
            "",
            "100",
            "x/30s",
            "100/30 parsecs",
            "100/s",
            "100/99999999999999999h",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
