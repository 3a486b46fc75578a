//! `eventd-perf limits`: what the fair-share rate limits
//! (docs/guide/rate-limits.md) cost and what they buy, against the eventd binary,
//! each figure beside its counterpart with the limits off
//! (`RateLimitBurst = 0`):
//!
//! - **no flood**: `--limits-events` events over `--limits-sources`
//!   providers, each provider well under the burst, written flat out into
//!   the CPU rings by one thread per ring (each ring kept at most half
//!   full, as in every scenario); events/s from the first write to the
//!   last commit. The runs alternate on/off (`--repeat` rounds, the order
//!   swapped each round) and the medians are compared. Each run checks
//!   that the limits suppressed nothing (`eventctl stats`) and that every
//!   event is in the shard files.
//! - **flood**: one provider flooding through `Producer` from a pinned
//!   thread on every CPU while a quiet provider emits `--quiet-events` at
//!   `--quiet-rate`/s (see [`crate::limitsflood`]).

use crate::limitsdaemon::{sum, Daemon};
use crate::limitsflood::{self, FloodRun};
use crate::load::{self, Sizes};
use crate::runner;
use anyhow::{bail, ensure, Context};
use eventd::config::rate::{RATE_LIMIT_BURST_DEFAULT, RATE_LIMIT_INTERVAL_DEFAULT};
use eventd::rings::{EmitError, Event, Level, Ring};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The provider names of the no-flood runs start with this.
const SOURCE_PREFIX: &str = "source-";
/// Sources whose events in a run stay at or under this share of the
/// burst: a provider's events may all go through one ring (one drain's
/// window), so the margin is kept against the whole burst.
const SOURCE_SHARE_MAX: u64 = RATE_LIMIT_BURST_DEFAULT / 2;

/// One run without a flood.
#[derive(Debug, Clone, Serialize)]
pub struct IngestRun {
    pub limits_on: bool,
    pub round: usize,
    pub events: u64,
    pub sources: u64,
    /// From the first write until every event was committed or counted
    /// lost.
    pub seconds: f64,
    pub events_per_s: f64,
    /// The run's events in the shard files (by provider).
    pub stored: u64,
    /// Sequence numbers lost (gap rows), by reason.
    pub lost_by_reason: Vec<(String, u64)>,
    /// Writes retried because the ring was contended.
    pub retried: u64,
    /// `eventctl stats`: `rate_limits.suppressed` and `.evictions`.
    pub suppressed: u64,
    pub evictions: u64,
    /// `QueryIndexes` was eventd's default (else empty).
    pub query_indexes: bool,
}

/// The whole scenario's report.
#[derive(Serialize)]
struct Report<'a> {
    defaults: (String, u64),
    no_flood: NoFlood<'a>,
    flood: Flood<'a>,
}

#[derive(Serialize)]
struct NoFlood<'a> {
    events: u64,
    sources: u64,
    rounds: usize,
    on_events_per_s: f64,
    off_events_per_s: f64,
    ratio: f64,
    /// Each round's run with the limits on over its run with them off.
    round_ratios: Vec<f64>,
    /// Every run: suppressed nothing and stored every event.
    verified: bool,
    runs: &'a [IngestRun],
}

#[derive(Serialize)]
struct Flood<'a> {
    quiet_events: u64,
    quiet_rate: u64,
    on: &'a FloodRun,
    off: &'a FloodRun,
}

/// The limits scenario's options.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: crate::cli::Common,
    #[command(flatten)]
    binary: crate::cli::Binary,
    #[command(flatten)]
    bytes: crate::cli::EventBytes,
    /// Events of each run without a flood.
    #[arg(long, default_value_t = 2_000_000)]
    limits_events: u64,
    /// Providers those events are spread over (each must stay at or under
    /// half the default burst).
    #[arg(long, default_value_t = 400)]
    limits_sources: u64,
    /// The runs without a flood with `QueryIndexes = []` (on and off
    /// alike): each provider's place in the default `(provider, ts)` index
    /// then no longer bounds the insert rate.
    #[arg(long)]
    without_query_indexes: bool,
    /// Events of the quiet provider beside the flood.
    #[arg(long, default_value_t = 1000)]
    quiet_events: u64,
    /// The quiet provider's events per second.
    #[arg(long, default_value_t = 200)]
    quiet_rate: u64,
}

pub(crate) fn main(args: &Args) -> anyhow::Result<String> {
    let work = args.common.output.work()?;
    run(args, &args.binary.path()?, args.bytes.sizes()?, &work)
}

/// Runs both parts; prints the tables, writes `limits.json`; returns the
/// summary line.
pub fn run(args: &Args, eventd: &Path, sizes: Sizes, work: &Path) -> anyhow::Result<String> {
    let (events, sources) = (args.limits_events, args.limits_sources);
    ensure!(
        events > 0 && sources > 0,
        "--limits-events and --limits-sources must be > 0"
    );
    let share = events.div_ceil(sources);
    if share > SOURCE_SHARE_MAX {
        bail!(
            "{events} events over {sources} sources is {share} per source: more than \
             {SOURCE_SHARE_MAX} could be suppressed; give more --limits-sources"
        );
    }
    let runs = no_flood(args, eventd, sizes, work)?;
    let median = |on: bool| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|r| r.limits_on == on)
            .map(|r| r.events_per_s)
            .collect();
        crate::runner::median(&v)
    };
    let (on_rate, off_rate) = (median(true), median(false));
    let verified = runs
        .iter()
        .all(|r| r.suppressed == 0 && r.stored == r.events);
    let flood_on = limitsflood::run(work, eventd, true, args.quiet_events, args.quiet_rate)?;
    let flood_off = limitsflood::run(work, eventd, false, args.quiet_events, args.quiet_rate)?;
    let report = Report {
        defaults: (
            format!("{}s", RATE_LIMIT_INTERVAL_DEFAULT.as_secs()),
            RATE_LIMIT_BURST_DEFAULT,
        ),
        no_flood: NoFlood {
            events,
            sources,
            rounds: args.common.repeat.max(1),
            on_events_per_s: on_rate,
            off_events_per_s: off_rate,
            ratio: on_rate / off_rate,
            round_ratios: round_ratios(&runs),
            verified,
            runs: &runs,
        },
        flood: Flood {
            quiet_events: args.quiet_events,
            quiet_rate: args.quiet_rate,
            on: &flood_on,
            off: &flood_off,
        },
    };
    print_tables(&report, sizes);
    let json = crate::runner::write_report(&args.common.output.results, "limits", &report)?;
    println!("\nreport: {}", json.display());
    Ok(format!(
        "limits ingest_on_per_s={on_rate:.0} ingest_off_per_s={off_rate:.0} ratio={:.3} \
         verified={verified} quiet_on={} quiet_off={} quiet_of={}",
        on_rate / off_rate,
        flood_on.quiet_stored,
        flood_off.quiet_stored,
        args.quiet_events
    ))
}

/// The runs without a flood, on and off alternated (`--repeat` rounds).
fn no_flood(
    args: &Args,
    eventd: &Path,
    sizes: Sizes,
    work: &Path,
) -> anyhow::Result<Vec<IngestRun>> {
    let mut runs = Vec::new();
    // On and off swapped each round, so a drift of the shared machine
    // falls on both.
    let order = runner::Order::Alternate;
    runner::interleave(&[true, false], args.common.repeat, order, |round, &on| {
        let r = ingest(work, eventd, on, round, args, sizes)?;
        eprintln!(
            "no flood, limits {} (round {round}): {:.0} events/s, stored {} of {}, \
             suppressed {}",
            on_off(on),
            r.events_per_s,
            r.stored,
            r.events,
            r.suppressed
        );
        runs.push(r);
        Ok(())
    })?;
    Ok(runs)
}

fn round_ratios(runs: &[IngestRun]) -> Vec<f64> {
    let rate = |round: usize, on: bool| {
        runs.iter()
            .find(|r| r.round == round && r.limits_on == on)
            .map_or(f64::NAN, |r| r.events_per_s)
    };
    let rounds = runs.iter().map(|r| r.round).max().unwrap_or(0);
    (1..=rounds)
        .map(|k| rate(k, true) / rate(k, false))
        .collect()
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// One run without a flood: `events` over `sources` providers, flat out.
fn ingest(
    work: &Path,
    eventd: &Path,
    on: bool,
    round: usize,
    args: &Args,
    sizes: Sizes,
) -> anyhow::Result<IngestRun> {
    let (events, sources) = (args.limits_events, args.limits_sources);
    let daemon = Daemon::start(work, eventd, on, !args.without_query_indexes)?;
    // Asked of eventd, not read from the files: a reader polling the files
    // would hold their WAL back from starting over.
    let done = || -> anyhow::Result<u64> {
        let stats = daemon.stats()?;
        let shards = stats["shards"].as_array().context("stats.shards")?;
        Ok(shards
            .iter()
            .map(|s| s["events"].as_u64().unwrap_or(0) + s["lost"].as_u64().unwrap_or(0))
            .sum())
    };
    // eventd's own events of its start, not the run's.
    let before = done()?;
    let start = Instant::now();
    let writers = start_writers(&daemon.rings, events, sources, sizes);
    let deadline = Instant::now() + Duration::from_secs(600);
    while done()? < before + events {
        ensure!(
            Instant::now() < deadline,
            "no flood: not every event was committed after 600 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut retried = 0;
    for w in writers {
        retried += w
            .join()
            .map_err(|_| anyhow::anyhow!("a ring writer panicked"))??;
    }
    let shards = daemon.shards()?;
    let suppressed = daemon.rate_limit_stat("suppressed")?;
    let evictions = daemon.rate_limit_stat("evictions")?;
    let stored = sum(
        &shards,
        &format!("SELECT count(*) FROM events WHERE provider LIKE '{SOURCE_PREFIX}%'"),
    )?;
    let lost_by_reason = lost_by_reason(&shards)?;
    drop(shards);
    daemon.stop()?;
    Ok(IngestRun {
        limits_on: on,
        round,
        events,
        sources,
        seconds,
        events_per_s: stored as f64 / seconds,
        stored,
        lost_by_reason,
        retried,
        suppressed,
        evictions,
        query_indexes: !args.without_query_indexes,
    })
}

/// One writer thread per ring, `events` over `sources` providers in all:
/// each writer's share of the run's events, provider by provider in turn.
fn start_writers(
    rings: &[Arc<Ring>],
    events: u64,
    sources: u64,
    sizes: Sizes,
) -> Vec<std::thread::JoinHandle<anyhow::Result<u64>>> {
    let providers: Arc<Vec<String>> = Arc::new(
        (0..sources)
            .map(|i| format!("{SOURCE_PREFIX}{i:05}"))
            .collect(),
    );
    let n = rings.len() as u64;
    rings
        .iter()
        .enumerate()
        .map(|(t, ring)| {
            let (ring, providers) = (ring.clone(), providers.clone());
            let t = t as u64;
            // Event k of writer t is the run's event k·n + t.
            let share = events / n + u64::from(t < events % n);
            std::thread::spawn(move || write_ring(&ring, t, n, share, &providers, sizes))
        })
        .collect()
}

/// Sequence numbers lost, by reason, over every shard.
fn lost_by_reason(shards: &[rusqlite::Connection]) -> anyhow::Result<Vec<(String, u64)>> {
    let mut out: std::collections::BTreeMap<String, u64> = Default::default();
    for c in shards {
        let mut st = c.prepare("SELECT reason, sum(lost) FROM gaps GROUP BY reason")?;
        for r in st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
            let (reason, n) = r?;
            *out.entry(reason).or_default() += n.max(0) as u64;
        }
    }
    Ok(out.into_iter().collect())
}

/// Writes `count` events into `ring` (pinned to its CPU), event `k` being
/// the run's event `k·stride + first`, whose provider is that number
/// modulo the providers; a burst at a time, waiting while the ring is half
/// full. Returns the writes retried because the ring was contended.
fn write_ring(
    ring: &Ring,
    first: u64,
    stride: u64,
    count: u64,
    providers: &[String],
    sizes: Sizes,
) -> anyhow::Result<u64> {
    load::pin_to(ring.cpu());
    let mut rng = rand::rngs::SmallRng::seed_from_u64(first);
    let text: String = (0..sizes.max.max(1))
        .map(|_| rng.random_range(b'a'..=b'z') as char)
        .collect();
    let high_water = (ring.geometry().page_count as u64 / 2).max(1);
    let pid = std::process::id();
    let (mut k, mut retried) = (0u64, 0u64);
    while k < count {
        if ring.backlog_pages() >= high_water {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        for _ in 0..256.min(count - k) {
            let len = rng.random_range(sizes.min..=sizes.max);
            let provider = &providers[((k * stride + first) % providers.len() as u64) as usize];
            let event = Event {
                ts_ns: eventd::rings::now_ns(),
                pid,
                tid: 0,
                uid: 0,
                level: Level::Info,
                provider,
                name: "load",
                message: &text[..len],
                fields: "",
            };
            loop {
                match ring.emit(&event) {
                    // Lapped while written: in a gap, counted there.
                    Ok(()) | Err(EmitError::Overwritten) => break,
                    Err(EmitError::Busy) => retried += 1,
                    Err(e) => bail!("ring {}: {e:?}", ring.cpu()),
                }
            }
            k += 1;
        }
    }
    Ok(retried)
}

fn indexes_text(runs: &[IngestRun]) -> &'static str {
    if runs.first().is_some_and(|x| x.query_indexes) {
        "as shipped"
    } else {
        "empty"
    }
}

fn print_tables(r: &Report<'_>, sizes: Sizes) {
    let n = &r.no_flood;
    let (interval, burst) = &r.defaults;
    println!(
        "\n## limits: no flood ({} events over {} providers, {} at most each, message {}-{} \
         bytes; QueryIndexes {}; {} CPUs; median of {} runs each, alternated)\n",
        n.events,
        n.sources,
        n.events.div_ceil(n.sources),
        sizes.min,
        sizes.max,
        indexes_text(n.runs),
        eventd::rings::online_cpus().len(),
        n.rounds
    );
    println!(
        "| | limits on (defaults: {burst} per {interval}) | limits off (RateLimitBurst = 0) |"
    );
    println!("|---|---|---|");
    let runs = |on: bool, f: &dyn Fn(&IngestRun) -> String| -> String {
        n.runs
            .iter()
            .filter(|x| x.limits_on == on)
            .map(f)
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "| events/s committed (median) | {:.0} | {:.0} |",
        n.on_events_per_s, n.off_events_per_s
    );
    let rate = |x: &IngestRun| format!("{:.0}", x.events_per_s);
    println!(
        "| each run | {} | {} |",
        runs(true, &rate),
        runs(false, &rate)
    );
    let stored = |x: &IngestRun| format!("{} of {}", x.stored, x.events);
    println!(
        "| stored | {} | {} |",
        runs(true, &stored),
        runs(false, &stored)
    );
    let supp = |x: &IngestRun| format!("{} ({} evictions)", x.suppressed, x.evictions);
    println!(
        "| suppressed (stats.rate_limits) | {} | {} |",
        runs(true, &supp),
        runs(false, &supp)
    );
    println!(
        "\nratio on/off of the medians: {:.3} (goal ≥ 0.95); each round's: {}; every run \
         suppressed nothing and stored every event: {}",
        n.ratio,
        n.round_ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", "),
        if n.verified { "yes" } else { "NO" }
    );
    limitsflood::print_table(
        r.flood.on,
        r.flood.off,
        r.flood.quiet_events,
        r.flood.quiet_rate,
    );
}
