//! The fields scenario, "a day of events, queried by field": what each
//! query index (`QueryIndexes`) costs at insert and saves at query, both
//! measured in the same run.
//!
//! 1. **Insert cost.** The bare-SQLite ceiling (`ceiling::run_with`) with
//!    no query index, with each candidate alone and with the default set;
//!    then the same variants with this scenario's realistic rows, because
//!    the ceiling's rows have one provider, one name and no fields, which
//!    makes an index on them artificially cheap (every insert lands at the
//!    same end of the b-tree). Then eventd itself flat out with the default
//!    `QueryIndexes` and with none, each beside a ceiling with the same
//!    indexes.
//! 2. **Store.** `--day-events` rows in `--day-shards` shard files without
//!    query indexes, then each candidate index built over the whole store,
//!    one at a time: what a writer's first `indexes::sync` costs on a store
//!    that already holds its rows.
//! 3. **Queries.** The eventd binary on that store, first with the indexes
//!    of [`QUERIED`], then with none: each query of [`queries`] in both
//!    orders, [`RUNS`] times, timed over the query socket to its first and
//!    its 100th result. The events returned with and without indexes must
//!    be the same ones.

use crate::ceiling;
use crate::load::{Mode, Sizes};
use crate::pipeline::{self, Knobs, Outcome, PointIndexes};
use crate::runner::median_midpoint as median;
use crate::system::{Running, SystemKind};
use anyhow::{anyhow, bail, Context};
use eventd::config::ConfigFile;
use eventd::daemon::Tunables;
use eventd::query::{Cursor, EventRow, Filter, Order, Request};
use eventd::store::indexes::{self, QueryIndex};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rusqlite::{params, Connection};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

/// Rows a drain writes to one shard before moving to the next, and rows
/// per transaction here.
const STRIPE: u64 = 4096;
const DAY_NS: i64 = 86_400_000_000_000;
const MINUTE_NS: i64 = 60_000_000_000;
/// CPUs (rings) the rows come from.
const CPUS: u64 = 16;
/// The rare provider and the rare word each come in exactly one row of
/// this many, at different offsets.
const RARE_EVERY: u64 = 100_000;
const RARE_PROVIDER_AT: u64 = RARE_EVERY / 2;
const RARE_WORD_AT: u64 = RARE_EVERY / 4;
const RARE_PROVIDER: &str = "backup";
const RARE_WORD: &str = "checksum-mismatch";
/// The most frequent provider of the Zipf-like distribution.
const COMMON_PROVIDER: &str = "svc-000";
const PROVIDERS: usize = 100;
/// Each provider's event names are these, prefixed with its own name.
const NAMES: &[&str] = &[
    "request",
    "response",
    "connect",
    "disconnect",
    "retry",
    "timeout",
    "flush",
    "reload",
];
/// `fields.unit` takes this many values, uniformly.
const UNITS: u32 = 1000;
const UNIT_QUERIED: &str = "u042";
const UIDS: [u32; 20] = [
    0, 1, 2, 33, 100, 101, 102, 103, 104, 105, 106, 107, 108, 111, 996, 997, 998, 1000, 1001, 1002,
];
/// Message vocabulary, separated by spaces. No word holds a `-`, so only
/// the rare rows contain [`RARE_WORD`].
const WORDS: &str = "connection accepted closed served cache miss hit upstream latency retry \
     scheduled worker queue depth flushed bytes written session token refreshed \
     timeout after ms client handshake completed disk usage above threshold backend \
     healthy degraded reload config applied job finished started user login from \
     port buffer resized snapshot taken compaction pending lease renewed peer \
     unreachable checksum verified block mounted volume sync slow query rebuilt";
/// Message bytes, uniform (also the ceiling's, so both insert alike).
const MESSAGE_BYTES: Sizes = Sizes { min: 60, max: 200 };
const SEED: u64 = 0x00f1_e1d5;
/// Threads that fill and index the shard files (this machine's CPUs).
const THREADS: usize = 2;
/// The indexes whose cost is measured.
const CANDIDATES: &[&str] = &["provider", "name", "pid", "uid", "fields.unit"];
/// The indexes of the query phase's indexed configuration.
const QUERIED: &[&str] = &["provider", "name", "fields.unit"];
/// Runs of each query: the first is reported as cold, the median of the
/// others as warm.
const RUNS: usize = 3;
const LIMIT: usize = 100;

/// One events row; provider and name are indexes into [`Day`]'s lists.
struct Row {
    ts: i64,
    cpu: i64,
    seq: i64,
    ring_epoch: i64,
    pid: u32,
    tid: u32,
    uid: u32,
    level: u8,
    provider: u16,
    name: u16,
    message: String,
    fields: String,
}

/// The deterministic generator of a day of events: row `i` depends only
/// on `i` and the seed (each stripe of rows has its own random stream), so
/// any thread can make any stripe, and a store of N rows is the same
/// whoever builds it.
struct Day {
    events: u64,
    /// The time of row 0; the rows end just before `t0 + DAY_NS`.
    t0: i64,
    /// The common providers, then the rare one.
    providers: Vec<String>,
    /// `NAMES.len()` names per provider, in provider order.
    names: Vec<String>,
    /// Cumulative probabilities of the common providers (weight 1/k^1.1).
    zipf: Vec<f64>,
    /// One ring epoch per CPU.
    epochs: Vec<i64>,
    words: Vec<&'static str>,
}

impl Day {
    /// A day of `events` rows ending at `end_ns`.
    fn new(events: u64, end_ns: i64) -> Day {
        let providers: Vec<String> = (0..PROVIDERS)
            .map(|k| format!("svc-{k:03}"))
            .chain([RARE_PROVIDER.to_string()])
            .collect();
        let names = providers
            .iter()
            .flat_map(|p| NAMES.iter().map(move |n| format!("{p}.{n}")))
            .collect();
        let weights: Vec<f64> = (1..=PROVIDERS)
            .map(|k| 1.0 / (k as f64).powf(1.1))
            .collect();
        let total: f64 = weights.iter().sum();
        let zipf = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w / total;
                Some(*acc)
            })
            .collect();
        let mut rng = SmallRng::seed_from_u64(SEED);
        Day {
            events: events.max(1),
            t0: end_ns - DAY_NS,
            providers,
            names,
            zipf,
            epochs: (0..CPUS).map(|_| rng.random()).collect(),
            words: WORDS.split_whitespace().collect(),
        }
    }

    fn stripes(&self) -> u64 {
        self.events.div_ceil(STRIPE)
    }

    /// Evenly spread over the day, in increasing order.
    fn ts(&self, i: u64) -> i64 {
        self.t0 + (i128::from(i) * i128::from(DAY_NS) / i128::from(self.events)) as i64
    }

    /// Rows of stripe `k`.
    fn stripe(&self, k: u64) -> Vec<Row> {
        let mut rng = SmallRng::seed_from_u64(SEED ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        (k * STRIPE..((k + 1) * STRIPE).min(self.events))
            .map(|i| self.row(i, &mut rng))
            .collect()
    }

    fn row(&self, i: u64, rng: &mut SmallRng) -> Row {
        let cpu = i % CPUS;
        let provider = if i % RARE_EVERY == RARE_PROVIDER_AT {
            PROVIDERS
        } else {
            let u: f64 = rng.random();
            self.zipf.partition_point(|&c| c < u).min(PROVIDERS - 1)
        };
        let level = level(rng.random_range(0..1000));
        let request = rng.random_range(100_000..1_000_000u32);
        let unit = rng.random_range(0..UNITS);
        let pid = 300 + provider as u32 * 17 + rng.random_range(0..4);
        Row {
            ts: self.ts(i),
            cpu: cpu as i64,
            seq: (i / CPUS + 1) as i64,
            ring_epoch: self.epochs[cpu as usize],
            pid,
            tid: pid + rng.random_range(0..16),
            uid: UIDS[rng.random_range(0..UIDS.len())],
            level,
            provider: provider as u16,
            name: (provider * NAMES.len() + rng.random_range(0..NAMES.len())) as u16,
            message: message(rng, &self.words, request, i % RARE_EVERY == RARE_WORD_AT),
            fields: format!(
                r#"{{"unit":"u{unit:03}","req":{request},"ok":{}}}"#,
                level > 3
            ),
        }
    }

    /// Rows at offset `at` of every [`RARE_EVERY`]: how many rare rows
    /// the day holds.
    fn rare_rows(&self, at: u64) -> u64 {
        if self.events > at {
            (self.events - at - 1) / RARE_EVERY + 1
        } else {
            0
        }
    }
}

/// A syslog level from a number in 0..1000: info 80 %, debug 12 %,
/// notice 4 %, warning 2 %, err 1.9 %, crit 0.1 %.
fn level(per_mille: u32) -> u8 {
    match per_mille {
        0..800 => 6,
        800..920 => 7,
        920..960 => 5,
        960..980 => 4,
        980..999 => 3,
        _ => 2,
    }
}

/// 60 to 200 bytes of words after a request number; the rare rows start
/// with [`RARE_WORD`] (before any cut, so it is never cut).
fn message(rng: &mut SmallRng, words: &[&str], request: u32, rare: bool) -> String {
    let len = rng.random_range(MESSAGE_BYTES.min..=MESSAGE_BYTES.max);
    let mut m = if rare {
        format!("{RARE_WORD} on block {request}: ")
    } else {
        format!("request {request}: ")
    };
    while m.len() < len {
        m.push_str(words[rng.random_range(0..words.len())]);
        m.push(' ');
    }
    m.truncate(len);
    m
}

/// Where the rows of a fill come from: made stripe by stripe as they are
/// inserted, or made before the clock started (`built`).
struct Rows<'a> {
    day: &'a Day,
    built: Option<&'a [Vec<Row>]>,
}

impl Rows<'_> {
    fn with_stripe<R>(&self, k: u64, f: impl FnOnce(&[Row]) -> R) -> R {
        match self.built {
            Some(built) => f(&built[k as usize]),
            None => f(&self.day.stripe(k)),
        }
    }
}

/// Opens (making it if need be) shard `j` of `dir` and gives it exactly
/// the query indexes `wanted`.
fn open_with(dir: &Path, j: usize, wanted: &[QueryIndex]) -> anyhow::Result<Connection> {
    let path = eventd::store::shard_path(dir, j);
    let conn =
        eventd::store::open_shard(&path).with_context(|| format!("opening {}", path.display()))?;
    indexes::sync(&conn, wanted, &path)
        .with_context(|| format!("query indexes of {}", path.display()))?;
    Ok(conn)
}

/// Inserts every stripe of `rows` into `shards` shard files in `dir`
/// (stripe k into shard k mod shards, as the drains stripe them), on
/// [`THREADS`] threads that each own some of the shards. The files get the
/// query indexes `wanted` before the clock starts. Returns the seconds the
/// inserts took.
fn fill(dir: &Path, shards: usize, rows: &Rows<'_>, wanted: &[QueryIndex]) -> anyhow::Result<f64> {
    // Page caches as eventd sizes them for this many writers.
    eventd::store::schema::size_writer_caches(shards);
    let mut groups: Vec<Vec<Option<Connection>>> = (0..THREADS)
        .map(|_| (0..shards).map(|_| None).collect())
        .collect();
    for j in 0..shards {
        groups[j % THREADS][j] = Some(open_with(dir, j, wanted)?);
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|conns| s.spawn(move || fill_group(conns, rows)))
            .collect();
        join_all(handles)
    })?;
    Ok(start.elapsed().as_secs_f64())
}

/// One fill thread: the stripes of the shards it has a connection for.
fn fill_group(mut conns: Vec<Option<Connection>>, rows: &Rows<'_>) -> anyhow::Result<()> {
    let shards = conns.len() as u64;
    for k in 0..rows.day.stripes() {
        if let Some(conn) = conns[(k % shards) as usize].as_mut() {
            rows.with_stripe(k, |stripe| insert(conn, rows.day, stripe))?;
        }
    }
    Ok(())
}

/// One stripe in one transaction, with eventd's insert statement.
fn insert(conn: &mut Connection, day: &Day, rows: &[Row]) -> anyhow::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut stmt = tx.prepare_cached(eventd::store::rows::INSERT_EVENT)?;
        for r in rows {
            stmt.execute(params![
                r.ts,
                r.cpu,
                r.seq,
                r.ring_epoch,
                r.pid,
                r.tid,
                r.uid,
                r.level,
                day.providers[usize::from(r.provider)],
                day.names[usize::from(r.name)],
                r.message,
                r.fields,
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

fn join_all(
    handles: Vec<std::thread::ScopedJoinHandle<'_, anyhow::Result<()>>>,
) -> anyhow::Result<()> {
    for h in handles {
        h.join()
            .map_err(|_| anyhow!("a worker thread panicked"))??;
    }
    Ok(())
}

/// Runs `f` on every shard of `store` ([`THREADS`] threads, each opening
/// its own shards); returns the seconds it took.
fn on_shards(
    store: &Path,
    shards: usize,
    f: impl Fn(&Connection, &Path) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || -> anyhow::Result<()> {
                    for j in (t..shards).step_by(THREADS) {
                        let path = eventd::store::shard_path(store, j);
                        let conn = eventd::store::open_shard(&path)
                            .with_context(|| format!("opening {}", path.display()))?;
                        f(&conn, &path).with_context(|| format!("in {}", path.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        join_all(handles)
    })?;
    Ok(start.elapsed().as_secs_f64())
}

/// What `ceiling::run_with` must run on each of its databases, after it
/// made eventd's default query indexes, for them to have exactly `wanted`
/// (eventd's own statements: SQLite uses a field index only for the very
/// expression it was made on).
fn ceiling_sql(wanted: &[QueryIndex]) -> Vec<String> {
    let mut sql: Vec<String> = eventd::config::query_indexes_default()
        .iter()
        .filter(|q| !wanted.contains(q))
        .map(|q| format!("DROP INDEX IF EXISTS {}", q.index_name()))
        .collect();
    sql.extend(wanted.iter().map(QueryIndex::create_sql));
    sql
}

fn parse_all(entries: &[&str]) -> anyhow::Result<Vec<QueryIndex>> {
    entries
        .iter()
        .map(|e| QueryIndex::parse(e).map_err(|allowed| anyhow!("{e:?}: expected {allowed}")))
        .collect()
}

fn labels(wanted: &[QueryIndex]) -> String {
    if wanted.is_empty() {
        return "none".to_string();
    }
    wanted
        .iter()
        .map(QueryIndex::label)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Bytes of the files in `dir`.
fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut bytes = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        bytes += entry?.metadata()?.len();
    }
    Ok(bytes)
}

fn work_dir(work: &Path, prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(work)
        .with_context(|| format!("making a directory in {}", work.display()))
}

/// Rows/s of one index variant in the insert-cost phase.
#[derive(Debug, Clone, Serialize)]
struct InsertCost {
    indexes: String,
    /// `ceiling::run_with`'s rows: one provider, one name, no fields; one
    /// thread per database.
    ceiling_rows_per_s: f64,
    /// This scenario's rows, [`THREADS`] threads.
    realistic_rows_per_s: f64,
    ceiling_to_none: f64,
    realistic_to_none: f64,
}

/// No query index, each candidate alone, the default set.
fn variants() -> anyhow::Result<Vec<(String, Vec<QueryIndex>)>> {
    let mut v = vec![("none".to_string(), Vec::new())];
    for c in CANDIDATES {
        v.push((c.to_string(), parse_all(&[c])?));
    }
    let d = eventd::config::query_indexes_default();
    v.push((format!("default ({})", labels(&d)), d));
    Ok(v)
}

/// Phase 1a: the ceiling's and the realistic rows' insert rate for every
/// variant, interleaved over `--repeat` rounds (medians reported).
fn insert_costs(
    args: &Args,
    work: &Path,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<InsertCost>> {
    let day = Day::new(args.insert_rows, eventd::rings::now_ns());
    progress.set_message(format!("insert cost: making {} rows", day.events));
    // Made before any clock starts, once for every variant.
    let built: Vec<Vec<Row>> = (0..day.stripes()).map(|k| day.stripe(k)).collect();
    let rows = Rows {
        day: &day,
        built: Some(&built),
    };
    let variants = variants()?;
    let mut samples = vec![(Vec::new(), Vec::new()); variants.len()];
    for _ in 0..args.common.repeat.max(1) {
        for ((label, wanted), (c, r)) in variants.iter().zip(&mut samples) {
            progress.set_message(format!("insert cost: {label}"));
            c.push(ceiling_rate(work, args, wanted)?);
            let dir = work_dir(work, "fields-insert-")?;
            r.push(day.events as f64 / fill(dir.path(), args.day_shards, &rows, wanted)?);
            progress.suspend(|| {
                eprintln!(
                    "insert cost, {label}: ceiling {:.0} rows/s, realistic {:.0} rows/s",
                    c.last().copied().unwrap_or(f64::NAN),
                    r.last().copied().unwrap_or(f64::NAN)
                )
            });
        }
    }
    let medians: Vec<(f64, f64)> = samples
        .iter()
        .map(|(c, r)| (median(c), median(r)))
        .collect();
    let (c0, r0) = medians[0];
    Ok(variants
        .into_iter()
        .zip(medians)
        .map(|((indexes, _), (c, r))| InsertCost {
            indexes,
            ceiling_rows_per_s: c,
            realistic_rows_per_s: r,
            ceiling_to_none: c / c0,
            realistic_to_none: r / r0,
        })
        .collect())
}

fn ceiling_rate(work: &Path, args: &Args, wanted: &[QueryIndex]) -> anyhow::Result<f64> {
    let dir = work_dir(work, "fields-ceiling-")?;
    let sql = ceiling_sql(wanted);
    let sql: Vec<&str> = sql.iter().map(String::as_str).collect();
    ceiling::run_with(
        dir.path(),
        args.day_shards,
        args.insert_rows,
        eventd::config::MAX_BATCH_SIZE_DEFAULT,
        MESSAGE_BYTES,
        &sql,
    )
}

/// One flat-out point of eventd with some `QueryIndexes`.
#[derive(Debug, Clone, Serialize)]
struct DaemonPoint {
    indexes: String,
    outcome: Outcome,
}

/// Phase 1b: eventd flat out with the default `QueryIndexes` and with
/// none, each beside a ceiling whose databases have the same indexes.
fn daemon_points(
    args: &Args,
    setup: &pipeline::Setup,
    sizes: Sizes,
    work: &Path,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<DaemonPoint>> {
    let duration = Duration::from_secs_f64(args.duration.unwrap_or(10.0));
    let configs = [eventd::config::query_indexes_default(), Vec::new()];
    let mut points = Vec::new();
    for _ in 0..args.common.repeat.max(1) {
        for wanted in &configs {
            let sql = ceiling_sql(wanted);
            let sql: Vec<&str> = sql.iter().map(String::as_str).collect();
            let label = format!("QueryIndexes {}", labels(wanted));
            let point = pipeline::Point {
                label: &label,
                knobs: Knobs::defaults(),
                mode: Mode::FlatOut,
                sizes,
                duration,
                with_ceiling: true,
                export: None,
            };
            let indexes = PointIndexes {
                wanted,
                ceiling_sql: &sql,
            };
            let o = pipeline::run_indexed(work, setup, &point, Some(indexes), progress)?;
            progress.suspend(|| {
                eprintln!(
                    "{label}: {:.0} events/s, ceiling {:.0}, ratio {:.2}, lost {}",
                    o.events_per_s, o.ceiling_per_s, o.ratio_to_ceiling, o.lost
                )
            });
            points.push(DaemonPoint {
                indexes: labels(wanted),
                outcome: o,
            });
        }
    }
    Ok(points)
}

#[derive(Debug, Clone, Serialize)]
struct StoreFigures {
    events: u64,
    shards: usize,
    fill_secs: f64,
    rows_per_s: f64,
    bytes: u64,
}

/// Phase 2a: the day's rows into the shard files of `store`, without
/// query indexes.
fn fill_store(
    args: &Args,
    store: &Path,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<(Day, StoreFigures)> {
    let day = Day::new(args.day_events, eventd::rings::now_ns());
    progress.set_message(format!(
        "store: {} events into {} shards",
        day.events, args.day_shards
    ));
    std::fs::create_dir_all(store).with_context(|| format!("making {}", store.display()))?;
    let rows = Rows {
        day: &day,
        built: None,
    };
    let fill_secs = fill(store, args.day_shards, &rows, &[])?;
    let figures = StoreFigures {
        events: day.events,
        shards: args.day_shards,
        fill_secs,
        rows_per_s: day.events as f64 / fill_secs,
        bytes: dir_bytes(store)?,
    };
    progress.suspend(|| {
        eprintln!(
            "store: {} events in {:.1} s ({:.0} rows/s, rows made on the fly), {:.1} MiB",
            figures.events,
            fill_secs,
            figures.rows_per_s,
            figures.bytes as f64 / 1048576.0
        )
    });
    Ok((day, figures))
}

#[derive(Debug, Clone, Serialize)]
struct IndexBuild {
    index: String,
    secs: f64,
    secs_per_million_rows: f64,
    bytes_added: u64,
}

/// Phase 2b: each candidate built over every shard, one after the other,
/// the way a writer's first `sync` builds a newly configured one (the
/// ones built before stay, as they would).
fn build_indexes(
    store: &Path,
    shards: usize,
    events: u64,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<IndexBuild>> {
    let mut have: Vec<QueryIndex> = Vec::new();
    let mut builds = Vec::new();
    for q in parse_all(CANDIDATES)? {
        progress.set_message(format!("building index {} over the store", q.label()));
        have.push(q.clone());
        let before = dir_bytes(store)?;
        let secs = on_shards(store, shards, |conn, path| {
            indexes::sync(conn, &have, path)?;
            Ok(())
        })?;
        let b = IndexBuild {
            index: q.label(),
            secs,
            secs_per_million_rows: secs / (events as f64 / 1e6),
            bytes_added: dir_bytes(store)?.saturating_sub(before),
        };
        progress.suspend(|| eprintln!("index {}: built in {:.2} s", b.index, b.secs));
        builds.push(b);
    }
    Ok(builds)
}

/// One query of the query phase.
struct Query {
    key: &'static str,
    /// As `eventctl query` would be given it.
    shown: String,
    filter: Filter,
}

/// The queries, over the whole store except the time window.
fn queries(day: &Day) -> Vec<Query> {
    let mid = day.t0 + DAY_NS / 2;
    let q = |key, shown: String, filter| Query { key, shown, filter };
    vec![
        q(
            "window",
            "--since/--until (10 min, mid-day)".into(),
            Filter {
                since_ns: Some(mid - 5 * MINUTE_NS),
                until_ns: Some(mid + 5 * MINUTE_NS),
                ..Filter::default()
            },
        ),
        q(
            "rare_provider",
            format!("--provider {RARE_PROVIDER}"),
            Filter {
                provider: Some(RARE_PROVIDER.into()),
                ..Filter::default()
            },
        ),
        q(
            "common_provider",
            format!("--provider {COMMON_PROVIDER}"),
            Filter {
                provider: Some(COMMON_PROVIDER.into()),
                ..Filter::default()
            },
        ),
        q(
            "level_err",
            "--level err".into(),
            Filter {
                level: Some(3),
                ..Filter::default()
            },
        ),
        q(
            "grep",
            format!("--grep {RARE_WORD}"),
            Filter {
                text: Some(RARE_WORD.into()),
                ..Filter::default()
            },
        ),
        q(
            "field",
            format!("--field unit={UNIT_QUERIED}"),
            Filter {
                fields: vec![("unit".into(), UNIT_QUERIED.into())],
                ..Filter::default()
            },
        ),
    ]
}

/// One timed query.
struct Run {
    /// `None` when nothing matched.
    first: Option<Duration>,
    /// To the 100th event, or to the end when fewer matched.
    hundredth: Duration,
    keys: Vec<Cursor>,
}

/// Asks the daemon at `socket`, timing the answer lines as they come.
fn time_query(socket: &Path, filter: &Filter) -> anyhow::Result<Run> {
    let request = Request::Query {
        filter: filter.clone(),
        follow: false,
    };
    let (mut first, mut hundredth, mut keys, mut problem) = (None, None, Vec::new(), None);
    let start = Instant::now();
    eventd::query::client::call(socket, &request, |line| {
        if let Some(e) = line.get("event") {
            let row: EventRow = serde_json::from_value(e.clone()).map_err(std::io::Error::other)?;
            keys.push(row.cursor());
            first.get_or_insert_with(|| start.elapsed());
            if keys.len() == LIMIT {
                hundredth = Some(start.elapsed());
            }
        } else if line.get("error").is_some() || line.get("warning").is_some() {
            // A shard not read would make the comparison meaningless.
            problem = Some(line.to_string());
        }
        Ok(true)
    })
    .with_context(|| format!("querying eventd at {}", socket.display()))?;
    let end = start.elapsed();
    if let Some(p) = problem {
        bail!("eventd answered {p}");
    }
    Ok(Run {
        first,
        hundredth: hundredth.unwrap_or(end),
        keys,
    })
}

/// What one query in one order measured in one configuration.
#[derive(Debug, Clone, Serialize)]
struct QueryFigures {
    query: &'static str,
    shown: String,
    order: &'static str,
    config: &'static str,
    indexes: String,
    /// Events returned (at most [`LIMIT`]).
    found: usize,
    /// Medians of the warm runs; `None` when nothing matched.
    first_ms: Option<f64>,
    hundredth_ms: f64,
    cold_first_ms: Option<f64>,
    cold_hundredth_ms: f64,
    /// Every run returned the same events.
    consistent: bool,
    /// The same events as the other configuration (set once both ran).
    identical_across_configs: Option<bool>,
    #[serde(skip)]
    keys: Vec<Cursor>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn order_name(order: Order) -> &'static str {
    match order {
        Order::OldestFirst => "oldest first",
        Order::NewestFirst => "newest first (--reverse)",
    }
}

fn summarise(
    q: &Query,
    order: Order,
    (config, wanted): (&'static str, &[QueryIndex]),
    runs: Vec<Run>,
) -> QueryFigures {
    let warm = &runs[1..];
    let firsts: Vec<f64> = warm.iter().filter_map(|r| r.first.map(ms)).collect();
    let hundredths: Vec<f64> = warm.iter().map(|r| ms(r.hundredth)).collect();
    QueryFigures {
        query: q.key,
        shown: q.shown.clone(),
        order: order_name(order),
        config,
        indexes: labels(wanted),
        found: runs[0].keys.len(),
        first_ms: (!firsts.is_empty()).then(|| median(&firsts)),
        hundredth_ms: median(&hundredths),
        cold_first_ms: runs[0].first.map(ms),
        cold_hundredth_ms: ms(runs[0].hundredth),
        consistent: runs.iter().all(|r| r.keys == runs[0].keys),
        identical_across_configs: None,
        keys: runs.into_iter().next().map(|r| r.keys).unwrap_or_default(),
    }
}

/// Every query in both orders, [`RUNS`] times each, against the daemon
/// at `socket`.
fn time_queries(
    socket: &Path,
    config: (&'static str, &[QueryIndex]),
    day: &Day,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<QueryFigures>> {
    let mut out = Vec::new();
    for q in queries(day) {
        for order in [Order::OldestFirst, Order::NewestFirst] {
            progress.set_message(format!(
                "queries, {}: {}, {}",
                config.0,
                q.shown,
                order_name(order)
            ));
            let filter = Filter {
                order,
                limit: Some(LIMIT as u64),
                ..q.filter.clone()
            };
            let runs = (0..RUNS)
                .map(|_| time_query(socket, &filter))
                .collect::<anyhow::Result<Vec<_>>>()?;
            out.push(summarise(&q, order, config, runs));
        }
    }
    Ok(out)
}

/// Waits until the daemon at `socket` answers.
fn wait_answering(socket: &Path) -> anyhow::Result<()> {
    let start = Instant::now();
    while eventd::query::client::call(socket, &Request::Stats, |_| Ok(false)).is_err() {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(120),
            "eventd did not answer at {} within 120 s",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Starts the eventd binary on the store in `data_dir/store` with
/// `QueryIndexes` matching what the files have (so its writers' `sync`
/// has nothing to do), runs the queries, stops it with SIGTERM.
fn query_daemon(
    eventd: &Path,
    data_dir: &Path,
    shards: usize,
    config: (&'static str, &[QueryIndex]),
    day: &Day,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<QueryFigures>> {
    let file = ConfigFile {
        storage_shards: Some(shards as i64),
        // Ceilings are measured unlimited: one source emits everything.
        rate_limit_burst: Some(0),
        max_concurrent_queries: Some(4),
        query_indexes: Some(config.1.iter().map(QueryIndex::label).collect()),
        ..ConfigFile::default()
    };
    let settings = file.resolve(data_dir)?;
    progress.set_message(format!("queries, {}: starting eventd", config.0));
    let running = Running::start(&SystemKind::Binary, eventd, &settings, Tunables::default())?;
    let socket = settings.run_dir.join("query.sock");
    let timed = wait_answering(&socket).and_then(|()| time_queries(&socket, config, day, progress));
    // Stopped whatever the queries did, so that no eventd outlives the run.
    let stopped = running.stop();
    let timed = timed?;
    stopped.context("stopping eventd after the queries")?;
    Ok(timed)
}

#[derive(Debug, Clone, Serialize)]
struct SyncFigures {
    indexes: String,
    secs: f64,
}

/// Phase 3: the queries with the indexes of [`QUERIED`], then with none
/// (the store's files brought to each set by the harness first, timed).
fn query_phase(
    eventd: &Path,
    data_dir: &Path,
    shards: usize,
    day: &Day,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<(Vec<QueryFigures>, Vec<SyncFigures>)> {
    let configs = [("indexes", parse_all(QUERIED)?), ("none", Vec::new())];
    let store = data_dir.join("store");
    let (mut figures, mut syncs) = (Vec::new(), Vec::new());
    for (name, wanted) in &configs {
        progress.set_message(format!("store to QueryIndexes {}", labels(wanted)));
        let secs = on_shards(&store, shards, |conn, path| {
            indexes::sync(conn, wanted, path)?;
            Ok(())
        })?;
        syncs.push(SyncFigures {
            indexes: labels(wanted),
            secs,
        });
        figures.extend(query_daemon(
            eventd,
            data_dir,
            shards,
            (name, wanted),
            day,
            progress,
        )?);
    }
    Ok((figures, syncs))
}

/// Marks each query × order as identical or not across the two
/// configurations; returns how many were not (or were not the same from
/// one run to the next).
fn compare(figures: &mut [QueryFigures]) -> usize {
    let verdicts: Vec<bool> = figures
        .iter()
        .map(|a| {
            figures
                .iter()
                .filter(|b| b.config != a.config && b.query == a.query && b.order == a.order)
                .all(|b| b.keys == a.keys && a.consistent && b.consistent)
        })
        .collect();
    for (f, same) in figures.iter_mut().zip(&verdicts) {
        f.identical_across_configs = Some(*same);
    }
    figures
        .iter()
        .zip(&verdicts)
        .filter(|(f, same)| f.config == "indexes" && !**same)
        .count()
}

fn print_insert_costs(costs: &[InsertCost], rows: u64, shards: usize) {
    println!(
        "\n### Insert cost: {rows} rows into {shards} fresh databases\n\n\
         | query indexes | ceiling rows/s (constant keys, 1 thread/db) | / none \
         | realistic rows/s ({THREADS} threads) | / none |\n|---|---|---|---|---|"
    );
    for c in costs {
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {:.2} |",
            c.indexes,
            c.ceiling_rows_per_s,
            c.ceiling_to_none,
            c.realistic_rows_per_s,
            c.realistic_to_none
        );
    }
}

fn print_daemon(points: &[DaemonPoint]) {
    println!(
        "\n### eventd flat out, beside a ceiling with the same indexes\n\n\
         | QueryIndexes | shards | events/s | ceiling/s | ratio | lost | p99 µs |\n\
         |---|---|---|---|---|---|---|"
    );
    for p in points {
        let o = &p.outcome;
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {} | {} |",
            p.indexes,
            o.shards,
            o.events_per_s,
            o.ceiling_per_s,
            o.ratio_to_ceiling,
            o.lost,
            o.latency_us_p99
        );
    }
}

fn print_store(store: &StoreFigures, builds: &[IndexBuild], syncs: &[SyncFigures]) {
    println!(
        "\n### Store: {} events in {} shards: {:.1} s, {:.0} rows/s ({THREADS} threads, no \
         query index, rows made on the fly), {:.1} MiB\n\n\
         | index built over the store | s | s per million rows | MiB added |\n|---|---|---|---|",
        store.events,
        store.shards,
        store.fill_secs,
        store.rows_per_s,
        store.bytes as f64 / 1048576.0
    );
    for b in builds {
        println!(
            "| {} | {:.2} | {:.3} | {:.1} |",
            b.index,
            b.secs,
            b.secs_per_million_rows,
            b.bytes_added as f64 / 1048576.0
        );
    }
    for s in syncs {
        println!(
            "\nstore brought to QueryIndexes {} in {:.2} s",
            s.indexes, s.secs
        );
    }
}

fn print_queries(figures: &[QueryFigures]) {
    println!(
        "\n### Queries through eventd (limit {LIMIT}; warm = median of runs 2-{RUNS}, cold = run 1)\n\n\
         | query | order | query indexes | first result ms | {LIMIT}th result ms | cold first / \
         {LIMIT}th ms | found | same without indexes |\n|---|---|---|---|---|---|---|---|"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    for f in figures {
        println!(
            "| {} | {} | {} | {} | {:.1} | {} / {:.1} | {} | {} |",
            f.shown,
            f.order,
            f.indexes,
            opt(f.first_ms),
            f.hundredth_ms,
            opt(f.cold_first_ms),
            f.cold_hundredth_ms,
            f.found,
            match f.identical_across_configs {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "?",
            }
        );
    }
}

/// Everything measured, for the report and the summary line.
struct Measured {
    costs: Vec<InsertCost>,
    daemon: Vec<DaemonPoint>,
    store: StoreFigures,
    builds: Vec<IndexBuild>,
    syncs: Vec<SyncFigures>,
    queries: Vec<QueryFigures>,
    mismatched: usize,
    rare_provider_expected: u64,
    grep_expected: u64,
}

impl Measured {
    /// Both orders of `query` in the indexed configuration.
    fn indexed<'a>(&'a self, query: &'a str) -> impl Iterator<Item = &'a QueryFigures> + 'a {
        self.queries
            .iter()
            .filter(move |f| f.config == "indexes" && f.query == query)
    }

    fn found(&self, query: &str) -> usize {
        self.indexed(query).map(|f| f.found).min().unwrap_or(0)
    }

    /// The worse order's warm time to the first result, with indexes.
    fn first_ms(&self, query: &str) -> f64 {
        self.indexed(query)
            .map(|f| f.first_ms.unwrap_or(f64::NAN))
            .fold(f64::NAN, f64::max)
    }

    fn insert_ratio(&self, pick: fn(&InsertCost) -> f64) -> f64 {
        self.costs
            .iter()
            .find(|c| c.indexes.starts_with("default"))
            .map_or(f64::NAN, pick)
    }

    fn daemon_median(&self, indexes_none: bool, pick: fn(&Outcome) -> f64) -> f64 {
        let v: Vec<f64> = self
            .daemon
            .iter()
            .filter(|p| (p.indexes == "none") == indexes_none)
            .map(|p| pick(&p.outcome))
            .collect();
        median(&v)
    }

    fn summary_line(&self) -> String {
        format!(
            "rare_provider_first_ms={:.1} insert_ratio_default_to_none={:.2} \
             ceiling_ratio_default_to_none={:.2} daemon_ratio_to_ceiling={:.2} \
             daemon_default_to_none={:.2} mismatched_queries={} rare_provider_found={} \
             rare_provider_expected={} grep_found={} grep_expected={}",
            self.first_ms("rare_provider"),
            self.insert_ratio(|c| c.realistic_to_none),
            self.insert_ratio(|c| c.ceiling_to_none),
            self.daemon_median(false, |o| o.ratio_to_ceiling),
            self.daemon_median(false, |o| o.events_per_s)
                / self.daemon_median(true, |o| o.events_per_s),
            self.mismatched,
            self.found("rare_provider"),
            self.rare_provider_expected,
            self.found("grep"),
            self.grep_expected,
        )
    }
}

fn write_json(args: &Args, m: &Measured) -> anyhow::Result<()> {
    let report = serde_json::json!({
        "day_events": args.day_events,
        "day_shards": args.day_shards,
        "insert_rows": args.insert_rows,
        "insert_costs": m.costs,
        "daemon": m.daemon,
        "store": m.store,
        "index_builds": m.builds,
        "syncs": m.syncs,
        "queries": m.queries,
        "mismatched_queries": m.mismatched,
        "rare_provider_expected": m.rare_provider_expected,
        "grep_expected": m.grep_expected,
        "summary": m.summary_line(),
    });
    let path = crate::runner::write_report(&args.common.output.results, "fields", &report)?;
    println!("\nreport: {}", path.display());
    Ok(())
}

fn check_args(args: &Args) -> anyhow::Result<()> {
    let max = eventd::routing::STORAGE_SHARDS_MAX as usize;
    anyhow::ensure!(
        (1..=max).contains(&args.day_shards),
        "--day-shards {}: expected 1..={max}",
        args.day_shards
    );
    anyhow::ensure!(
        args.day_events > 0 && args.insert_rows > 0,
        "--day-events and --insert-rows must be positive"
    );
    Ok(())
}

/// The fields scenario's options.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: crate::cli::Common,
    #[command(flatten)]
    system: crate::cli::System,
    /// Seconds of load of each eventd insert-cost point (default 10).
    #[arg(long)]
    duration: Option<f64>,
    #[command(flatten)]
    bytes: crate::cli::EventBytes,
    /// Events of the day-long store.
    #[arg(long, default_value_t = 100_000_000)]
    day_events: u64,
    /// Shard files of the store (and of the insert-cost databases).
    #[arg(long, default_value_t = 16)]
    day_shards: usize,
    /// Rows of each insert-cost measurement.
    #[arg(long, default_value_t = 4_000_000)]
    insert_rows: u64,
}

pub(crate) fn main(args: &Args) -> anyhow::Result<String> {
    let work = args.common.output.work()?;
    run(args, &args.system.setup()?, args.bytes.sizes()?, &work)
}

/// The whole scenario; returns the machine-readable summary line.
pub(crate) fn run(
    args: &Args,
    setup: &pipeline::Setup,
    sizes: Sizes,
    work: &Path,
) -> anyhow::Result<String> {
    check_args(args)?;
    let progress = indicatif::ProgressBar::new_spinner();
    progress.enable_steady_tick(Duration::from_millis(200));
    let costs = insert_costs(args, work, &progress)?;
    let daemon = daemon_points(args, setup, sizes, work, &progress)?;
    // The store lives where the daemon's data directory expects it.
    let data_dir = work_dir(work, "fields-")?;
    let store = data_dir.path().join("store");
    let (day, store_figures) = fill_store(args, &store, &progress)?;
    let builds = build_indexes(&store, args.day_shards, day.events, &progress)?;
    let (mut queries, syncs) = query_phase(
        &setup.eventd,
        data_dir.path(),
        args.day_shards,
        &day,
        &progress,
    )?;
    progress.finish_and_clear();
    let mismatched = compare(&mut queries);
    let m = Measured {
        costs,
        daemon,
        store: store_figures,
        builds,
        syncs,
        queries,
        mismatched,
        rare_provider_expected: day.rare_rows(RARE_PROVIDER_AT).min(LIMIT as u64),
        grep_expected: day.rare_rows(RARE_WORD_AT).min(LIMIT as u64),
    };
    print_insert_costs(&m.costs, args.insert_rows, args.day_shards);
    print_daemon(&m.daemon);
    print_store(&m.store, &m.builds, &m.syncs);
    print_queries(&m.queries);
    write_json(args, &m)?;
    Ok(m.summary_line())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_deterministic_ordered_and_rare_rows_are_where_counted() {
        let day = Day::new(250_000, 1_700_000_000_000_000_000);
        let a = day.stripe(12);
        let b = day.stripe(12);
        assert_eq!(a.len(), STRIPE as usize);
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| x.message == y.message && x.ts == y.ts));
        assert!(a.windows(2).all(|w| w[0].ts < w[1].ts));
        let all: Vec<Row> = (0..day.stripes()).flat_map(|k| day.stripe(k)).collect();
        let rare = all
            .iter()
            .filter(|r| day.providers[usize::from(r.provider)] == RARE_PROVIDER)
            .count();
        let word = all.iter().filter(|r| r.message.contains(RARE_WORD)).count();
        assert_eq!(rare as u64, day.rare_rows(RARE_PROVIDER_AT));
        assert_eq!(word as u64, day.rare_rows(RARE_WORD_AT));
        assert_eq!(rare, 2);
        let err = all.iter().filter(|r| r.level <= 3).count() as f64 / all.len() as f64;
        assert!((0.015..0.025).contains(&err), "{err}");
        assert!(all.iter().all(|r| (60..=200).contains(&r.message.len())));
    }
}
