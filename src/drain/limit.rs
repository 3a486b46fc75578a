//! Fair share: each drain limits every source of events to a budget per
//! window (`RateLimitInterval`, `RateLimitBurst`) before the handoff
//! channel, so one program in a logging loop does not take the writers'
//! whole budget.
//!
//! A source is what the drain can tell apart: in a CPU ring, what the
//! producer wrote (provider and pid); in eventd's own rings (syslog,
//! service output, the kernel), the trusted identity eventd wrote into the
//! event's `fields` (the `unit`, else uid and `comm`). A source's window
//! opens at its first event and holds `burst` events; what comes past that
//! before the window ends is suppressed: the drain stores it as a
//! `suppressed` gap (so every sequence number is still accounted for) and,
//! once the window has ended, writes one report of how many it suppressed
//! ([`Limiter::closed`]), whether the source says anything more or not.
//! Events of level err and more severe are never limited. Overrides
//! ([`SourceLimit`]) give some sources (by provider, unit or uid) another
//! window and burst, or none; the first that matches is chosen when the
//! source's window opens.
//!
//! The state is bounded: at most [`TRACKED_SOURCES_MAX`] sources per drain;
//! past that the oldest window is given up early (its report written) and
//! counted in [`Suppression::evictions`].

use super::rates::{Matches, RateLimits, SourceLimit};
use crate::rings::client::budget::REFUSED_NAME;
use crate::rings::{Event, Level};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The provider and name of a report of suppressed events.
pub const REPORT_PROVIDER: &str = "eventd";
pub const REPORT_NAME: &str = "rate_limit.suppressed";
/// Sources one drain tracks at most.
pub const TRACKED_SOURCES_MAX: usize = 4096;
/// Sources kept in the board of the most suppressed (`eventctl stats`).
const TOP_KEPT: usize = 16;
/// How often, at most, a drain looks for windows that have ended.
const SCAN_EVERY_MS: u64 = 250;
/// Events this severe or more are never limited.
const LIMITED_FROM: Level = Level::Warning;

/// What every drain's limiter reports, for `eventctl stats` and metrics:
/// totals, and the few sources that were suppressed most (never one
/// series per source).
#[derive(Debug, Default)]
pub struct Suppression {
    /// Events suppressed (all drains).
    pub suppressed: AtomicU64,
    /// Windows given up early because a drain tracked too many sources.
    pub evictions: AtomicU64,
    /// Reports written into the rings.
    pub reports: AtomicU64,
    /// Events those reports count (`suppressed` less this is what windows
    /// still open, or reports not written yet, hold).
    pub reported: AtomicU64,
    /// Events producers' own budgets refused, as their reports say.
    pub refused_at_source: AtomicU64,
    /// The sources suppressed most, by their label, with their totals.
    top: Mutex<Vec<(String, u64)>>,
}

impl Suppression {
    /// Adds `count` suppressed events of `label` to the board.
    fn note(&self, label: &str, count: u64) {
        let mut top = self.top.lock().unwrap_or_else(|p| p.into_inner());
        match top.iter_mut().find(|(l, _)| l == label) {
            Some((_, n)) => *n += count,
            None => top.push((label.to_string(), count)),
        }
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(TOP_KEPT);
    }

    /// The `n` sources suppressed most, most first.
    pub fn top(&self, n: usize) -> Vec<(String, u64)> {
        let top = self.top.lock().unwrap_or_else(|p| p.into_inner());
        top.iter().take(n).cloned().collect()
    }
}

/// One source's window.
#[derive(Debug)]
struct Window {
    /// The source, as people read it (also compared on a lookup, so two
    /// sources whose hashes collide are never counted together).
    label: String,
    /// What the report's fields say of the source (a JSON object's keys).
    who: serde_json::Map<String, serde_json::Value>,
    start_ms: u64,
    interval_ms: u64,
    burst: u64,
    passed: u64,
    suppressed: u64,
}

/// A source's suppression, reported when its window ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub label: String,
    pub who: serde_json::Map<String, serde_json::Value>,
    pub suppressed: u64,
    pub interval_ms: u64,
}

impl Report {
    /// The report's message, e.g. "suppressed 12,345 events of provider
    /// flood (pid 42, uid 1000) in 30 s".
    pub fn message(&self) -> String {
        format!(
            "suppressed {} events of {} in {} s",
            thousands(self.suppressed),
            self.label,
            self.interval_ms.div_ceil(1000)
        )
    }

    /// The report's fields: the count, the window and the source.
    pub fn fields(&self) -> String {
        let mut f = self.who.clone();
        f.insert("suppressed".into(), self.suppressed.into());
        f.insert("interval_ms".into(), self.interval_ms.into());
        f.insert("source".into(), self.label.clone().into());
        serde_json::Value::Object(f).to_string()
    }
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One drain's limiter.
pub struct Limiter {
    limits: Arc<RateLimits>,
    board: Arc<Suppression>,
    /// Whether the drain reads one of eventd's own rings (trusted keys).
    own: bool,
    windows: HashMap<u64, Window>,
    hasher: std::collections::hash_map::RandomState,
    /// Reports of windows given up early, written with the next ones.
    evicted: Vec<Report>,
    next_scan_ms: u64,
    /// The overrides as of `overrides_generation`.
    overrides: Arc<[SourceLimit]>,
    overrides_generation: u64,
}

impl Limiter {
    pub fn new(limits: Arc<RateLimits>, board: Arc<Suppression>, own: bool) -> Self {
        Limiter {
            limits,
            board,
            own,
            windows: HashMap::new(),
            hasher: Default::default(),
            evicted: Vec::new(),
            next_scan_ms: 0,
            overrides: Arc::new([]),
            overrides_generation: 0,
        }
    }

    /// The limit as producers' budgets follow it ([`Ring::publish_rate_limit`]):
    /// the most lenient one that can apply to a CPU ring's events (the
    /// global limit and every override by provider or uid; none when any
    /// of them is off), so a budget never refuses what the drain would
    /// take.
    ///
    /// [`Ring::publish_rate_limit`]: crate::rings::Ring::publish_rate_limit
    pub fn published(&mut self) -> crate::rings::RateLimitWord {
        self.refresh_overrides();
        let off = crate::rings::RateLimitWord {
            interval_ms: 0,
            burst: 0,
        };
        let Some((mut interval_ms, mut burst)) = self.limits.get() else {
            return off;
        };
        for o in self.overrides.iter() {
            if matches!(o.matches, Matches::Unit(_)) {
                continue;
            }
            let Some((i, b)) = o.limit() else {
                return off;
            };
            interval_ms = interval_ms.min(i);
            burst = burst.max(b);
        }
        crate::rings::RateLimitWord { interval_ms, burst }
    }

    /// Copies the overrides when they changed (one atomic load otherwise).
    fn refresh_overrides(&mut self) {
        if self.limits.generation() != self.overrides_generation {
            (self.overrides_generation, self.overrides) = self.limits.overrides();
        }
    }

    /// The window and burst for `source` (whose event is `event`): the
    /// first override that matches, else the global limit; `None`: never
    /// limited.
    fn limit_for(
        &self,
        event: &Event<'_>,
        source: &Source<'_>,
        global: Option<(u64, u64)>,
    ) -> Option<(u64, u64)> {
        for o in self.overrides.iter() {
            let hit = match &o.matches {
                Matches::Provider(p) => event.provider == p,
                Matches::Unit(u) => matches!(source, Source::Unit { unit } if unit == u),
                Matches::Uid(uid) => event.uid == *uid,
            };
            if hit {
                return o.limit();
            }
        }
        global
    }

    /// Whether `event` passes at `now_ms`; `false`: suppressed (counted in
    /// its source's window).
    pub fn admit(&mut self, event: &Event<'_>, now_ms: u64) -> bool {
        if event.level < LIMITED_FROM {
            return true;
        }
        if !self.own && event.name == REFUSED_NAME {
            // A producer's report of what its budget refused: at most one
            // per provider per window, never limited (like err), and its
            // count goes on the board beside what the drains suppressed.
            self.note_refused(event);
            return true;
        }
        self.refresh_overrides();
        let global = self.limits.get();
        if global.is_none() && self.overrides.is_empty() {
            return true;
        }
        let source = Source::of(event, self.own);
        let key = self.hasher.hash_one(&source);
        if !self.windows.contains_key(&key) {
            let Some((interval_ms, burst)) = self.limit_for(event, &source, global) else {
                // Never limited: not tracked either.
                return true;
            };
            if self.windows.len() >= TRACKED_SOURCES_MAX {
                self.evict_oldest();
            }
            self.windows
                .insert(key, source.window(now_ms, interval_ms, burst));
        }
        let Some(w) = self.windows.get_mut(&key) else {
            // Inserted just above when missing.
            return true;
        };
        if !source.owns(w) {
            // Another source with the same 64-bit hash: let it pass
            // rather than charge it to a stranger.
            return true;
        }
        if w.passed < w.burst {
            w.passed += 1;
            return true;
        }
        w.suppressed += 1;
        // Relaxed: a statistic.
        self.board.suppressed.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Counts a producer's report of events its budget refused.
    fn note_refused(&self, event: &Event<'_>) {
        let refused = serde_json::from_str::<serde_json::Value>(event.fields)
            .ok()
            .and_then(|f| f.get("refused_at_source")?.as_u64());
        let Some(refused) = refused else {
            return;
        };
        // Relaxed: a statistic.
        self.board
            .refused_at_source
            .fetch_add(refused, Ordering::Relaxed);
        self.board
            .note(&Source::of(event, self.own).label(), refused);
    }

    fn evict_oldest(&mut self) {
        let oldest = self.windows.iter().min_by_key(|(_, w)| w.start_ms);
        let Some(key) = oldest.map(|(k, _)| *k) else {
            return;
        };
        if let Some(w) = self.windows.remove(&key) {
            // Relaxed: a statistic.
            self.board.evictions.fetch_add(1, Ordering::Relaxed);
            if w.suppressed > 0 {
                self.evicted.push(report_of(w));
            }
        }
    }

    /// The reports of every window that has ended by `now_ms` with events
    /// suppressed (windows that ended without are forgotten). Looks at most
    /// every [`SCAN_EVERY_MS`].
    pub fn closed(&mut self, now_ms: u64) -> Vec<Report> {
        if now_ms < self.next_scan_ms && self.evicted.is_empty() {
            return Vec::new();
        }
        self.next_scan_ms = now_ms + SCAN_EVERY_MS;
        let mut reports = std::mem::take(&mut self.evicted);
        let ended: Vec<u64> = self
            .windows
            .iter()
            .filter(|(_, w)| now_ms >= w.start_ms.saturating_add(w.interval_ms))
            .map(|(k, _)| *k)
            .collect();
        for key in ended {
            if let Some(w) = self.windows.remove(&key).filter(|w| w.suppressed > 0) {
                reports.push(report_of(w));
            }
        }
        for r in &reports {
            self.board.note(&r.label, r.suppressed);
        }
        reports
    }

    /// Puts back a report that could not be written (its ring was busy),
    /// to be written with the next ones.
    pub fn retry(&mut self, report: Report) {
        self.evicted.push(report);
    }

    pub fn board(&self) -> &Suppression {
        &self.board
    }

    /// Counts `report` as written into a ring.
    pub fn written(&self, report: &Report) {
        // Relaxed: a statistic.
        self.board.reports.fetch_add(1, Ordering::Relaxed);
        // Release: whoever sees this count (Acquire) sees the report
        // counted above too, so `reported == suppressed` means every
        // report is in `reports`.
        self.board
            .reported
            .fetch_add(report.suppressed, Ordering::Release);
    }
}

fn report_of(w: Window) -> Report {
    Report {
        label: w.label,
        who: w.who,
        suppressed: w.suppressed,
        interval_ms: w.interval_ms,
    }
}

/// Who an event comes from, as far as the drain can tell.
#[derive(Debug, Hash)]
enum Source<'a> {
    /// A CPU ring's event: what the producer wrote.
    Producer { provider: &'a str, pid: u32 },
    /// An event of eventd's own rings whose sender runs in a unit.
    Unit { unit: String },
    /// Else: its uid and command.
    Command { uid: u32, comm: String },
}

/// The trusted keys of an own ring's event (top-level `fields` keys only
/// eventd writes, see `crate::trusted`).
#[derive(serde::Deserialize)]
struct Trusted {
    unit: Option<String>,
    comm: Option<String>,
}

impl<'a> Source<'a> {
    fn of(event: &Event<'a>, own: bool) -> Source<'a> {
        if !own {
            return Source::Producer {
                provider: event.provider,
                pid: event.pid,
            };
        }
        let t: Option<Trusted> = serde_json::from_str(event.fields).ok();
        let (unit, comm) = t.map_or((None, None), |t| (t.unit, t.comm));
        match unit {
            Some(unit) => Source::Unit { unit },
            None => Source::Command {
                uid: event.uid,
                comm: comm.unwrap_or_default(),
            },
        }
    }

    /// Whether `w` is this source's window (compared without allocating).
    fn owns(&self, w: &Window) -> bool {
        let at = |k: &str| w.who.get(k);
        match self {
            Source::Producer { provider, pid } => {
                at("limited_provider").and_then(|v| v.as_str()) == Some(provider)
                    && at("limited_pid").and_then(|v| v.as_u64()) == Some(u64::from(*pid))
            }
            Source::Unit { unit } => at("limited_unit").and_then(|v| v.as_str()) == Some(unit),
            Source::Command { uid, comm } => {
                at("limited_uid").and_then(|v| v.as_u64()) == Some(u64::from(*uid))
                    && at("limited_comm").and_then(|v| v.as_str()) == Some(comm)
            }
        }
    }

    fn label(&self) -> String {
        match self {
            Source::Producer { provider, pid } => format!("provider {provider} (pid {pid})"),
            Source::Unit { unit } => format!("unit {unit}"),
            Source::Command { uid, comm } => format!("command {comm:?} (uid {uid})"),
        }
    }

    fn window(&self, now_ms: u64, interval_ms: u64, burst: u64) -> Window {
        let mut who = serde_json::Map::new();
        match self {
            Source::Producer { provider, pid } => {
                who.insert("limited_provider".into(), (*provider).into());
                who.insert("limited_pid".into(), (*pid).into());
            }
            Source::Unit { unit } => {
                who.insert("limited_unit".into(), unit.clone().into());
            }
            Source::Command { uid, comm } => {
                who.insert("limited_uid".into(), (*uid).into());
                who.insert("limited_comm".into(), comm.clone().into());
            }
        }
        Window {
            label: self.label(),
            who,
            start_ms: now_ms,
            interval_ms,
            burst,
            passed: 0,
            suppressed: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(provider: &str, pid: u32, level: Level) -> Event<'_> {
        Event {
            ts_ns: 1,
            pid,
            tid: pid,
            uid: 1000,
            level,
            provider,
            name: "n",
            message: "m",
            fields: "",
        }
    }

    fn limiter(interval_ms: u64, burst: u64) -> Limiter {
        let limits = Arc::new(RateLimits::new(interval_ms, burst));
        Limiter::new(limits, Arc::default(), false)
    }

    #[test]
    fn a_source_past_its_burst_is_suppressed_and_reported_when_its_window_ends() {
        let mut l = limiter(1000, 3);
        let passed = (0..10)
            .filter(|_| l.admit(&event("flood", 7, Level::Info), 0))
            .count();
        assert_eq!(passed, 3);
        // Another source has its own budget.
        assert!(l.admit(&event("quiet", 8, Level::Info), 0));
        assert!(l.closed(999).is_empty(), "the window has not ended");
        let reports = l.closed(1300);
        assert_eq!(reports.len(), 1, "{reports:?}");
        assert_eq!(reports[0].suppressed, 7);
        assert_eq!(
            reports[0].message(),
            "suppressed 7 events of provider flood (pid 7) in 1 s"
        );
        assert_eq!(
            l.board().top(5),
            [("provider flood (pid 7)".to_string(), 7)]
        );
        // A new window, a new budget.
        assert!(l.admit(&event("flood", 7, Level::Info), 1300));
    }

    #[test]
    fn err_and_worse_pass_and_zero_turns_limits_off() {
        let mut l = limiter(1000, 1);
        for _ in 0..100 {
            assert!(l.admit(&event("flood", 7, Level::Err), 0));
        }
        let mut off = limiter(0, 1);
        assert!((0..100).all(|_| off.admit(&event("flood", 7, Level::Debug), 0)));
    }

    #[test]
    fn tracked_sources_are_bounded_and_evictions_counted_and_reported() {
        let mut l = limiter(100_000_000, 1);
        for pid in 0..TRACKED_SOURCES_MAX as u32 {
            l.admit(&event("p", pid, Level::Info), u64::from(pid));
            l.admit(&event("p", pid, Level::Info), u64::from(pid));
        }
        assert!(l.admit(&event("p", 1 << 30, Level::Info), 1 << 20));
        assert_eq!(l.windows.len(), TRACKED_SOURCES_MAX);
        assert_eq!(l.board().evictions.load(Ordering::Relaxed), 1);
        let reports = l.closed(1 << 20);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].label, "provider p (pid 0)");
    }

    #[test]
    fn own_rings_are_keyed_on_the_trusted_unit_else_uid_and_command() {
        let limits = Arc::new(RateLimits::new(1000, 1));
        let mut l = Limiter::new(limits, Arc::default(), true);
        let mut e = event("anything", 1, Level::Info);
        e.fields = r#"{"comm":"logger","unit":"a.service"}"#;
        assert!(l.admit(&e, 0));
        e.pid = 2;
        assert!(!l.admit(&e, 0), "same unit, another pid");
        e.fields = r#"{"comm":"logger"}"#;
        assert!(l.admit(&e, 0));
        e.uid = 1001;
        assert!(l.admit(&e, 0), "another uid");
        let mut labels: Vec<String> = l.windows.values().map(|w| w.label.clone()).collect();
        labels.sort();
        assert_eq!(
            labels,
            [
                "command \"logger\" (uid 1000)",
                "command \"logger\" (uid 1001)",
                "unit a.service"
            ]
        );
    }

    fn over(matches: Matches, interval_ms: u64, burst: u64) -> SourceLimit {
        SourceLimit {
            matches,
            interval_ms,
            burst,
        }
    }

    #[test]
    fn overrides_give_their_sources_another_burst_and_the_first_match_wins() {
        let limits = Arc::new(RateLimits::new(1000, 2));
        let mut l = Limiter::new(limits.clone(), Arc::default(), false);
        limits.set_overrides(vec![
            over(Matches::Provider("audit".into()), 0, 0),
            over(Matches::Provider("chatty".into()), 1000, 5),
            over(Matches::Uid(1000), 1000, 3),
        ]);
        let passed = |l: &mut Limiter, e: &Event<'_>| (0..10).filter(|_| l.admit(e, 0)).count();
        // Never limited, and not tracked.
        assert_eq!(passed(&mut l, &event("audit", 1, Level::Info)), 10);
        assert!(l.windows.is_empty());
        // The provider's entry comes before the uid's.
        assert_eq!(passed(&mut l, &event("chatty", 2, Level::Info)), 5);
        // uid 1000 (the test events' uid): 3.
        assert_eq!(passed(&mut l, &event("other", 3, Level::Info)), 3);
        let mut e = event("other", 4, Level::Info);
        e.uid = 0;
        assert_eq!(passed(&mut l, &e), 2, "the global limit");
        // The global limit off, an override still limits its sources.
        limits.set(0, 0);
        limits.set_overrides(vec![over(Matches::Provider("chatty".into()), 1000, 1)]);
        assert_eq!(passed(&mut l, &event("chatty", 9, Level::Info)), 1);
        assert_eq!(passed(&mut l, &event("other", 9, Level::Info)), 10);
    }

    #[test]
    fn unit_overrides_apply_to_sources_keyed_on_that_unit() {
        let limits = Arc::new(RateLimits::new(1000, 1));
        limits.set_overrides(vec![over(Matches::Unit("backup.service".into()), 1000, 4)]);
        let mut l = Limiter::new(limits, Arc::default(), true);
        let mut e = event("tar", 1, Level::Info);
        e.fields = r#"{"comm":"tar","unit":"backup.service"}"#;
        assert_eq!((0..10).filter(|_| l.admit(&e, 0)).count(), 4);
        e.fields = r#"{"comm":"tar","unit":"web.service"}"#;
        assert_eq!((0..10).filter(|_| l.admit(&e, 0)).count(), 1);
    }

    #[test]
    fn producers_are_told_the_most_lenient_limit_that_can_apply_to_them() {
        let limits = Arc::new(RateLimits::new(30_000, 100));
        let mut l = Limiter::new(limits.clone(), Arc::default(), false);
        let word = |l: &mut Limiter| {
            let w = l.published();
            (w.interval_ms, w.burst)
        };
        assert_eq!(word(&mut l), (30_000, 100));
        // A unit's override cannot match a CPU ring's event.
        limits.set_overrides(vec![
            over(Matches::Unit("u.service".into()), 1000, 1_000_000),
            over(Matches::Provider("p".into()), 10_000, 500),
        ]);
        assert_eq!(word(&mut l), (10_000, 500));
        limits.set_overrides(vec![over(Matches::Uid(7), 0, 0)]);
        assert_eq!(word(&mut l), (0, 0), "a source never limited");
        limits.set_overrides(Vec::new());
        limits.set(0, 0);
        assert_eq!(word(&mut l), (0, 0));
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(12_345), "12,345");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }
}
