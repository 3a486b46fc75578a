//! The flood half of `eventd-perf limits`: one provider (`flood`) writing
//! flat out through a `Producer` from a thread pinned to every CPU, while
//! a quiet provider (`quiet`) emits its events at a steady rate; with the
//! default limits (the producer's budget follows the limit eventd
//! publishes in its rings) and with them off. Everything is counted in the
//! shard files afterwards: the quiet provider's rows, the flood's rows and
//! the gap rows by reason, and each CPU ring's sequence numbers checked to
//! be all there (an event or inside a gap).

use crate::limitsdaemon::{sum, Daemon};
use crate::load;
use anyhow::{ensure, Context};
use eventd::rings::client::{Dropped, Producer};
use eventd::rings::Level;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The flood's message: a typical log line's size.
const FLOOD_MESSAGE: &str = "request handled in 0.3 ms: status 200, 1 retry, cache miss, \
                             upstream pool 4 of 16, queue depth 0";
/// Rows of the CPU rings only (eventd's own rings have higher numbers).
const CPU_RINGS: &str = "cpu < 1048576";

/// What one emitting thread's calls returned.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Calls {
    pub calls: u64,
    /// Written into a ring (`Producer::emitted`).
    pub written: u64,
    /// Refused by the producer's budget (`Dropped::Limited`).
    pub limited: u64,
    /// The ring was contended or lapped under the event (`Dropped::Busy`).
    pub busy: u64,
    /// Any other reason.
    pub other: u64,
}

impl Calls {
    fn count(&mut self, result: Result<(), Dropped>) {
        self.calls += 1;
        match result {
            Ok(()) => self.written += 1,
            Err(Dropped::Limited) => self.limited += 1,
            Err(Dropped::Busy) => self.busy += 1,
            Err(_) => self.other += 1,
        }
    }

    fn add(&mut self, o: Calls) {
        self.calls += o.calls;
        self.written += o.written;
        self.limited += o.limited;
        self.busy += o.busy;
        self.other += o.other;
    }
}

/// One flood run.
#[derive(Debug, Clone, Serialize)]
pub struct FloodRun {
    pub limits_on: bool,
    pub flood_threads: usize,
    pub seconds: f64,
    pub flood: Calls,
    pub quiet: Calls,
    /// Rows in the shard files.
    pub flood_stored: u64,
    pub quiet_stored: u64,
    /// Gap rows of the CPU rings, by reason (all providers: a gap does not
    /// say whose events it replaced).
    pub suppressed: u64,
    pub overwritten: u64,
    pub other_lost: u64,
    /// `eventctl stats`: `rate_limits.refused_at_source` and `.suppressed`.
    pub refused_at_source: u64,
    pub stats_suppressed: u64,
    /// What the flood's `rate_limit.refused` reports stored say it refused.
    pub refusals_reported: u64,
    /// Every CPU ring's sequence numbers are each an event or in a gap.
    pub sequences_accounted: bool,
}

/// Runs the flood beside the quiet provider against a fresh eventd with the
/// limits on or off.
pub fn run(
    work: &Path,
    eventd: &Path,
    on: bool,
    quiet_events: u64,
    quiet_rate: u64,
) -> anyhow::Result<FloodRun> {
    let daemon = Daemon::start(work, eventd, on, true)?;
    let kmes = daemon.data_dir.join("kmes");
    let flood = Arc::new(Producer::new(&kmes, "flood"));
    let quiet = Producer::new(&kmes, "quiet");
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = eventd::rings::online_cpus();
    let start = Instant::now();
    let flooders: Vec<_> = cpus
        .iter()
        .map(|&cpu| {
            let (flood, stop) = (flood.clone(), stop.clone());
            std::thread::spawn(move || {
                load::pin_to(cpu);
                let mut calls = Calls::default();
                while !stop.load(Ordering::Relaxed) {
                    calls.count(flood.emit(Level::Info, "spam", FLOOD_MESSAGE, ""));
                }
                calls
            })
        })
        .collect();
    let quiet_calls = paced(&quiet, quiet_events, quiet_rate.max(1));
    stop.store(true, Ordering::Relaxed);
    let mut flood_calls = Calls::default();
    for f in flooders {
        flood_calls.add(
            f.join()
                .map_err(|_| anyhow::anyhow!("a flood thread panicked"))?,
        );
    }
    let seconds = start.elapsed().as_secs_f64();
    ensure!(
        flood_calls.written == flood.emitted(),
        "the flood's writes: counted {} here, {} by the producer",
        flood_calls.written,
        flood.emitted()
    );
    // The last reference: the refusals of the window still open are
    // reported into the ring as it goes.
    drop(Arc::into_inner(flood));
    drop(quiet);
    let run = settle_and_count(daemon, on, cpus.len(), seconds, flood_calls, quiet_calls)?;
    eprintln!(
        "flood, limits {}: quiet {} of {}, flood written {} stored {} suppressed {} \
         overwritten {} refused at the source {}",
        if on { "on" } else { "off" },
        run.quiet_stored,
        quiet_events,
        run.flood.written,
        run.flood_stored,
        run.suppressed,
        run.overwritten,
        run.refused_at_source
    );
    Ok(run)
}

/// Emits `n` events of `producer`, `rate` a second on a fixed schedule.
fn paced(producer: &Producer, n: u64, rate: u64) -> Calls {
    let mut calls = Calls::default();
    let start = Instant::now();
    for i in 0..n {
        let due = start + Duration::from_micros(i * 1_000_000 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        calls.count(producer.emit(Level::Notice, "tick", &format!("quiet event {i}"), ""));
    }
    calls
}

/// Waits until the drains have read and the writers stored everything,
/// counts it, and stops eventd.
fn settle_and_count(
    daemon: Daemon,
    on: bool,
    threads: usize,
    seconds: f64,
    flood: Calls,
    quiet: Calls,
) -> anyhow::Result<FloodRun> {
    let shards = daemon.shards()?;
    // Settled: every ring read, every sequence number stored as an event
    // or a gap, and nothing new for half a second.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = None;
    loop {
        let rows = sum(&shards, "SELECT count(*) FROM events")?
            + sum(&shards, "SELECT count(*) FROM gaps")?;
        let read = daemon.rings.iter().all(|r| r.backlog_pages() == 0);
        if read && accounted(&shards)? && last == Some(rows) {
            break;
        }
        last = Some(rows);
        ensure!(Instant::now() < deadline, "eventd did not settle in 120 s");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The producer's report of its refusals, once the drain has read it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while daemon.rate_limit_stat("refused_at_source")? < flood.limited {
        ensure!(
            Instant::now() < deadline,
            "the flood's refusals were not all reported in 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let count = |sql: &str| sum(&shards, sql);
    let gaps = |reason: &str| {
        count(&format!(
            "SELECT coalesce(sum(lost), 0) FROM gaps WHERE {CPU_RINGS} AND reason = '{reason}'"
        ))
    };
    let run = FloodRun {
        limits_on: on,
        flood_threads: threads,
        seconds,
        flood,
        quiet,
        flood_stored: count(
            "SELECT count(*) FROM events WHERE provider = 'flood' AND name = 'spam'",
        )?,
        quiet_stored: count(
            "SELECT count(*) FROM events WHERE provider = 'quiet' AND name = 'tick'",
        )?,
        suppressed: gaps("suppressed")?,
        overwritten: gaps("overwritten")?,
        other_lost: count(&format!(
            "SELECT coalesce(sum(lost), 0) FROM gaps WHERE {CPU_RINGS} \
             AND reason NOT IN ('suppressed', 'overwritten')"
        ))?,
        refused_at_source: daemon.rate_limit_stat("refused_at_source")?,
        stats_suppressed: daemon.rate_limit_stat("suppressed")?,
        refusals_reported: count(
            "SELECT coalesce(sum(json_extract(fields, '$.refused_at_source')), 0) FROM events \
             WHERE provider = 'flood' AND name = 'rate_limit.refused'",
        )?,
        sequences_accounted: accounted(&shards)?,
    };
    drop(shards);
    daemon.stop().context("stopping eventd after the flood")?;
    Ok(run)
}

/// Whether, for every CPU ring's epoch, the highest sequence number held
/// equals the number of sequence numbers held (as events, or inside gaps):
/// none missing, none twice.
fn accounted(shards: &[rusqlite::Connection]) -> anyhow::Result<bool> {
    let mut per: std::collections::BTreeMap<(i64, i64), (i64, i64)> = Default::default();
    for c in shards {
        let mut st = c.prepare(&format!(
            "SELECT cpu, ring_epoch, max(seq), count(*) FROM events WHERE {CPU_RINGS} \
               GROUP BY cpu, ring_epoch \
             UNION ALL \
             SELECT cpu, ring_epoch, max(to_seq), sum(lost) FROM gaps WHERE {CPU_RINGS} \
               GROUP BY cpu, ring_epoch"
        ))?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?;
        for row in rows {
            let (cpu, epoch, top, n) = row?;
            let e = per.entry((cpu, epoch)).or_default();
            e.0 = e.0.max(top);
            e.1 += n;
        }
    }
    Ok(per.values().all(|(top, held)| top == held))
}

/// The flood's table: each figure with the limits on beside off.
pub fn print_table(on: &FloodRun, off: &FloodRun, quiet_events: u64, quiet_rate: u64) {
    println!(
        "\n## limits: under a flood (provider flood from {} pinned threads flat out for {:.1} s \
         through Producer; provider quiet: {quiet_events} events at {quiet_rate}/s)\n",
        on.flood_threads, on.seconds
    );
    println!("| | limits on (defaults; the producer's budget follows eventd) | limits off (RateLimitBurst = 0) |");
    println!("|---|---|---|");
    let row = |what: &str, f: &dyn Fn(&FloodRun) -> String| {
        println!("| {what} | {} | {} |", f(on), f(off));
    };
    row("quiet: stored", &|r| {
        format!("{} of {quiet_events}", r.quiet_stored)
    });
    row("quiet: not written (ring busy / other)", &|r| {
        format!("{} / {}", r.quiet.busy, r.quiet.other + r.quiet.limited)
    });
    row("flood: emit calls", &|r| r.flood.calls.to_string());
    row("flood: emitted (written into a ring)", &|r| {
        r.flood.written.to_string()
    });
    row("flood: stored", &|r| r.flood_stored.to_string());
    row("flood: suppressed (gaps 'suppressed')", &|r| {
        r.suppressed.to_string()
    });
    row("overwritten (gaps 'overwritten', any provider)", &|r| {
        r.overwritten.to_string()
    });
    row(
        "flood: refused at the source (stats.rate_limits.refused_at_source)",
        &|r| {
            format!(
                "{} ({} counted by the harness)",
                r.refused_at_source, r.flood.limited
            )
        },
    );
    row("flood: not written, ring busy or lapped", &|r| {
        r.flood.busy.to_string()
    });
    row("every CPU ring's sequence numbers accounted for", &|r| {
        if r.sequences_accounted { "yes" } else { "NO" }.to_string()
    });
}
