//! The producer's side of its budget ([`crate::rings::budget`]): where
//! it comes from, and the report of what it refused, written into a ring.

use super::Producer;
pub use crate::rings::budget::{Budget, Verdict};
use crate::rings::{Event, Level};
use crate::sync::Ordering;

/// The environment variable that fixes the budget of every producer of a
/// process: `BURST/INTERVAL`, e.g. `10000/30s`, or `off`. Unset, a
/// producer follows the limit the daemon publishes in its rings
/// (`RateLimitBurst` per `RateLimitInterval`).
pub const BUDGET_ENV: &str = "EVENTD_RATE_LIMIT";
/// The name of a producer's report of events it refused.
pub const REFUSED_NAME: &str = "rate_limit.refused";
/// How often a producer that follows the daemon looks at its limit, ns.
pub const LOOK_EVERY_NS: u64 = 1_000_000_000;

impl Budget {
    /// The budget [`BUDGET_ENV`] fixes; else (unset, or unreadable: a
    /// producer never fails over its environment) the daemon's.
    pub fn from_env() -> Budget {
        match std::env::var(BUDGET_ENV).ok().as_deref().map(str::trim) {
            Some("off" | "0") => Budget::new(0, 0),
            Some(v) => match parse(v) {
                Some((interval_ms, burst)) => Budget::new(interval_ms, burst),
                None => Budget::following_daemon(),
            },
            None => Budget::following_daemon(),
        }
    }
}

/// `BURST/INTERVAL` as (interval ms, burst); the interval is a whole
/// number with a unit (`ms`, `s`, `min`/`m`, `h`, `d`), or seconds
/// without one.
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
        "d" => 86_400_000,
        _ => return None,
    };
    Some((count.checked_mul(unit_ms)?, burst))
}

impl Producer {
    /// Fixes this producer's budget: `burst` events per `interval_ms`
    /// (either 0: none), whatever the daemon publishes.
    pub fn with_budget(mut self, interval_ms: u64, burst: u64) -> Producer {
        self.budget = Budget::new(interval_ms, burst);
        self
    }

    /// Events refused by the budget and not reported yet.
    pub fn refused_pending(&self) -> u64 {
        self.budget.pending()
    }

    /// Whether an event of `level` at `ts_ns` (its time, realtime ns) is
    /// within the budget now; writes the report of a window that has just
    /// ended first. A refusal is counted in [`Producer::dropped`] too.
    pub(super) fn within_budget(&self, level: Level, ts_ns: i64) -> bool {
        self.follow_daemon(ts_ns);
        if self.budget.is_off() {
            return true;
        }
        // Windows run on the monotonic clock (a step of the wall clock
        // neither stretches nor cuts one short); read only under a limit.
        let now_ms = crate::sync::monotonic_ms();
        // SAFETY: sched_getcpu takes nothing and only returns a number.
        let cpu = u32::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0);
        let verdict = self.budget.judge(level, now_ms, cpu);
        if let Some((refused, window_ms)) = verdict.report {
            self.report_refused(refused, window_ms);
        }
        if !verdict.pass {
            self.dropped.add();
        }
        verdict.pass
    }

    /// Takes the daemon's limit from the header of this CPU's ring, about
    /// once a second, once the rings are open (before, the first emit
    /// opens them and the next looks). Paced by the events' own times
    /// (`ts_ns`), which every emit reads anyway: a step of the wall clock
    /// either way only brings the next look forward.
    fn follow_daemon(&self, ts_ns: i64) {
        let budget = &self.budget;
        let now_ns = u64::try_from(ts_ns).unwrap_or(0);
        // Relaxed: only says when to look; two threads looking at once
        // both read the same word.
        let last = budget.last_look_ns.load(Ordering::Relaxed);
        if !budget.follows_daemon() || now_ns.abs_diff(last) < LOOK_EVERY_NS {
            return;
        }
        let Some(emitter) = self.emitter.get() else {
            return;
        };
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = u32::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0);
        let Ok(ring) = emitter.ring(cpu) else {
            return;
        };
        budget.last_look_ns.store(now_ns, Ordering::Relaxed);
        match ring.rate_limit() {
            Some(limit) => budget.set(limit.interval_ms, limit.burst),
            // An eventd that publishes no limit: none here either.
            None => budget.set(0, 0),
        }
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
        assert_eq!(parse("100/1d"), Some((86_400_000, 100)));
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
