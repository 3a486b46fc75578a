//! The scale scenario: eventd as on a machine with many CPUs. The `eventd`
//! binary is started with the hidden, harness-only `--simulate-cpus N`,
//! which makes it attach the rings of CPUs `0..N` in its KMES directory
//! instead of the online CPUs' (this machine has two); the rings of CPUs
//! that do not exist are written only by this harness's producers. Per
//! point (N rings × StorageShards), with the same measurements as the other
//! scenarios where they apply:
//!
//! - **start-up**: from spawning eventd until its query socket answers;
//! - **threads, RSS and descriptors** of the eventd process, idle after
//!   start and at their peak (sampled every 250 ms), descriptors beside the
//!   R2 allowance it was planned for;
//! - **events/s flat out** (producers on every ring) and the bare-SQLite
//!   ceiling with the same number of databases and rows, in the same run;
//!   **p99 emit→commit** of that phase, from the receipts;
//! - **`--queries` concurrent queries** (default 128, at most what
//!   MaxConcurrentQueries allows here: with this machine's descriptor
//!   limit R2 lowers it at 256 shards) answered while the load goes on: each
//!   client asks, back to back, for the 100 newest events of the last
//!   5 seconds over the query socket; their latency p50/p99, how many were
//!   refused as busy, and the ingest rate meanwhile.
//!
//! The harness raises its descriptor limit as the shipped service unit
//! does (LimitNOFILE=262144) when it may; eventd inherits it.

use crate::ceiling;
use crate::load::{self, Mode, Sizes};
use crate::runner::{self, Chart, Legend, Panel, Series};
use crate::system::{self, Running, SystemKind};
use anyhow::Context;
use eventd::config::ConfigFile;
use eventd::daemon::Tunables;
use eventd::query::filter::{Filter, Order};
use eventd::query::Request;
use hdrhistogram::Histogram;
use plotters::prelude::{BLACK, BLUE, CYAN, GREEN, MAGENTA, RED};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the shipped service unit sets (packaging/eventd.service).
const SERVICE_NOFILE: u64 = 262_144;

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct ScalePoint {
    pub rings: u32,
    /// As configured (0 = one per ring).
    pub storage_shards: i64,
    pub shards: usize,
    pub startup_ms: f64,
    pub threads_idle: u64,
    pub threads_peak: u64,
    pub rss_idle_mib: f64,
    /// Peak while ingesting alone (phase 1).
    pub rss_ingest_mib: f64,
    /// Of which the process's own (anonymous) memory, peak of phase 1:
    /// the rest is the mapped ring files (4 MiB each by default).
    pub anon_ingest_mib: f64,
    /// Peak over the whole point (the queries' connections included).
    pub rss_peak_mib: f64,
    pub fds_idle: usize,
    pub fds_peak: usize,
    /// R2 for the configured MaxConcurrentQueries, these databases and rings.
    pub fd_allowance: u64,
    pub max_concurrent_queries: u64,
    /// Sequenced by the producers (both phases), stored, lost (gaps).
    pub emitted: u64,
    pub stored: u64,
    pub lost: u64,
    /// Rows counted with SQLite in the shard files afterwards.
    pub rows_in_files: u64,
    pub events_per_s: f64,
    pub ceiling_per_s: f64,
    pub ratio_to_ceiling: f64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub commits: u64,
    pub batch_items_mean: f64,
    pub queries: usize,
    pub queries_answered: u64,
    pub queries_busy: u64,
    pub query_us_p50: u64,
    pub query_us_p99: u64,
    pub query_us_max: u64,
    pub events_per_s_under_queries: f64,
}

/// Raises this process's descriptor limit towards the service unit's (the
/// hard limit too, where this process may), for eventd to inherit.
/// Returns the soft limit now in force.
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            let want = libc::rlimit {
                rlim_cur: SERVICE_NOFILE.max(lim.rlim_cur),
                rlim_max: SERVICE_NOFILE.max(lim.rlim_max),
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) != 0 {
                // Not privileged: as far as the hard limit goes.
                lim.rlim_cur = lim.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    }
    eventd::routing::soft_descriptor_limit().unwrap_or(0)
}

/// eventd's process figures from /proc.
struct ProcSample {
    threads: u64,
    rss_mib: f64,
    /// The process's own memory: RSS less mapped files (the rings, the
    /// shards' -shm files, the binary).
    anon_mib: f64,
    fds: usize,
}

fn sample(pid: u32) -> ProcSample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| system::status_field(&status, name);
    ProcSample {
        threads: field("Threads:") as u64,
        rss_mib: field("VmRSS:") / 1024.0,
        anon_mib: field("RssAnon:") / 1024.0,
        fds: system::count_fds(&format!("/proc/{pid}/fd")),
    }
}

/// The peaks of [`sample`] while a phase runs.
#[derive(Default)]
struct Peaks {
    threads: u64,
    rss_mib: f64,
    anon_mib: f64,
    fds: usize,
}

impl Peaks {
    fn add(&mut self, s: &ProcSample) {
        self.threads = self.threads.max(s.threads);
        self.rss_mib = self.rss_mib.max(s.rss_mib);
        self.anon_mib = self.anon_mib.max(s.anon_mib);
        self.fds = self.fds.max(s.fds);
    }
}

/// The 128 query clients: each asks for the newest 100 events of the last
/// 5 s, back to back, until stopped.
struct QueryLoad {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    latency: Arc<Mutex<Histogram<u64>>>,
    answered: Arc<AtomicU64>,
    busy: Arc<AtomicU64>,
}

impl QueryLoad {
    fn start(socket: &Path, clients: usize) -> anyhow::Result<QueryLoad> {
        let stop = Arc::new(AtomicBool::new(false));
        let latency = Arc::new(Mutex::new(Histogram::new_with_bounds(1, 600_000_000, 3)?));
        let answered = Arc::new(AtomicU64::new(0));
        let busy = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::with_capacity(clients);
        for i in 0..clients {
            let (stop, latency, answered, busy) = (
                stop.clone(),
                latency.clone(),
                answered.clone(),
                busy.clone(),
            );
            let socket = socket.to_path_buf();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("query-{i}"))
                    .stack_size(256 << 10)
                    .spawn(move || {
                        let mut mine = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)
                            .expect("valid histogram bounds");
                        while !stop.load(Ordering::Relaxed) {
                            let request = Request::Query {
                                filter: Filter {
                                    since_ns: Some(eventd::rings::now_ns() - 5_000_000_000),
                                    order: Order::NewestFirst,
                                    limit: Some(100),
                                    ..Filter::default()
                                },
                                follow: false,
                            };
                            let t = Instant::now();
                            let mut refused = false;
                            let done = eventd::query::client::call(&socket, &request, |v| {
                                refused |= v.get("error").is_some();
                                Ok(true)
                            });
                            if done.is_err() || refused {
                                busy.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(Duration::from_millis(20));
                                continue;
                            }
                            mine.saturating_record(t.elapsed().as_micros() as u64);
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Ok(mut h) = latency.lock() {
                            let _ = h.add(&mine);
                        }
                    })?,
            );
        }
        Ok(QueryLoad {
            stop,
            threads,
            latency,
            answered,
            busy,
        })
    }

    fn stop(self) -> (Histogram<u64>, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let h = self
            .latency
            .lock()
            .map(|h| h.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        (
            h,
            self.answered.load(Ordering::Relaxed),
            self.busy.load(Ordering::Relaxed),
        )
    }
}

/// How many of the rings' events are stored and lost so far.
fn stored(running: &Running) -> anyhow::Result<(u64, u64)> {
    running.progress()
}

/// Waits until `emitted` events are stored or counted lost.
fn drained(running: &Running, emitted: u64, what: &str) -> anyhow::Result<(u64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (s, l) = stored(running)?;
        if s + l >= emitted {
            return Ok((s, l));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: only {s} stored + {l} lost of {emitted} after 300 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

// Longer than the ~70 lines a function should be: the phases of one point
// in the order they run (start, idle sample, load, queries, stop, ceiling),
// sharing the process samples and timings.
/// Runs one point in a fresh directory under `work`.
fn point(
    work: &Path,
    eventd: &Path,
    (rings, storage_shards): (u32, i64),
    clients: usize,
    duration: Duration,
    sizes: Sizes,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<ScalePoint> {
    let label = format!("N={rings} StorageShards={storage_shards}");
    let dir = tempfile::Builder::new().prefix("scale-").tempdir_in(work)?;
    let file = ConfigFile {
        storage_shards: Some(storage_shards),
        // Ceilings are measured unlimited: one source emits everything.
        rate_limit_burst: Some(0),
        // No syslog or service-output sockets, so no boot marker: the store holds exactly
        // what the producers emitted (see `pipeline::configure`).
        syslog_socket: Some(std::path::PathBuf::new()),
        syslog_stream_socket: Some(std::path::PathBuf::new()),
        stdout_socket: Some(std::path::PathBuf::new()),
        ..ConfigFile::default()
    };
    let mut settings = file.resolve(dir.path())?;
    let shards = eventd::routing::shard_count(settings.storage_shards, rings as usize)?;
    let limit = eventd::routing::soft_descriptor_limit()?;
    let mut q = settings.max_concurrent_queries;
    while q > 1 && eventd::routing::descriptor_allowance(q, shards as u64, u64::from(rings)) > limit
    {
        q -= 1;
    }
    settings.max_concurrent_queries = q;
    let allowance = eventd::routing::descriptor_allowance(q, shards as u64, u64::from(rings));
    let tunables = Tunables {
        simulated_cpus: Some(rings),
        ..Tunables::default()
    };
    progress.set_message(format!("{label}: starting"));
    let t0 = Instant::now();
    let running = Running::start(&SystemKind::Binary, eventd, &settings, tunables)?;
    let socket = settings.data_dir.join("run/query.sock");
    while eventd::query::client::call(&socket, &Request::Stats, |_| Ok(false)).is_err() {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(120),
            "{label}: eventd did not answer"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let startup_ms = t0.elapsed().as_secs_f64() * 1e3;
    let pid = running.pid().context("the binary has a pid")?;
    std::thread::sleep(Duration::from_millis(300));
    let idle = sample(pid);
    let mut peaks = Peaks::default();
    peaks.add(&idle);
    let ring_handles = running.rings()?;
    anyhow::ensure!(
        ring_handles.len() == rings as usize,
        "{label}: eventd attached {} rings, not {rings}",
        ring_handles.len()
    );
    let producer_threads = ring_handles.len().min(eventd::rings::online_cpus().len());

    // Phase 1: flat out, alone.
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let producers = load::start_spread(
        &ring_handles,
        producer_threads,
        Mode::FlatOut,
        sizes,
        stop.clone(),
    );
    while start.elapsed() < duration {
        std::thread::sleep(Duration::from_millis(250));
        peaks.add(&sample(pid));
        progress.set_message(format!(
            "{label}: load {:.0}/{:.0} s",
            start.elapsed().as_secs_f64(),
            duration.as_secs_f64()
        ));
    }
    let emitted = system::stop_threads(stop, producers)?;
    let (stored1, lost1) = drained(&running, emitted, &label)?;
    peaks.add(&sample(pid));
    let (rss_ingest_mib, anon_ingest_mib) = (peaks.rss_mib, peaks.anon_mib);
    let drained_secs = start.elapsed().as_secs_f64();
    let phase1_end_ns = eventd::rings::now_ns();

    // Phase 2: the same load with the query clients.
    progress.set_message(format!("{label}: {clients} concurrent queries"));
    let stop = Arc::new(AtomicBool::new(false));
    let start2 = Instant::now();
    let producers = load::start_spread(
        &ring_handles,
        producer_threads,
        Mode::FlatOut,
        sizes,
        stop.clone(),
    );
    // As many clients as may query at once: more would only be told
    // "busy" (and retry), which measures the refusals, not the queries.
    let clients = clients.min(q as usize).max(1);
    let queries = QueryLoad::start(&socket, clients)?;
    while start2.elapsed() < duration {
        std::thread::sleep(Duration::from_millis(250));
        peaks.add(&sample(pid));
    }
    let (query_us, answered, busy) = queries.stop();
    let emitted2 = system::stop_threads(stop, producers)?;
    let (stored2, lost2) = drained(&running, emitted + emitted2, &label)?;
    let secs2 = start2.elapsed().as_secs_f64();
    drop(ring_handles);

    let finished = running.finish_until(Some(phase1_end_ns))?;
    let rows_in_files = crate::pipeline::count_files(&settings.store_dir)?.0;
    progress.set_message(format!(
        "{label}: ceiling, {stored1} rows into {shards} databases"
    ));
    let cdir = tempfile::Builder::new()
        .prefix("ceiling-")
        .tempdir_in(work)?;
    let ceiling_per_s = ceiling::run(
        cdir.path(),
        shards,
        stored1.max(1),
        settings.max_batch_size,
        sizes,
    )?;
    let events_per_s = stored1 as f64 / drained_secs;
    Ok(ScalePoint {
        rings,
        storage_shards,
        shards,
        startup_ms,
        threads_idle: idle.threads,
        threads_peak: peaks.threads,
        rss_idle_mib: idle.rss_mib,
        rss_ingest_mib,
        anon_ingest_mib,
        rss_peak_mib: finished.peak_rss_mib.max(peaks.rss_mib),
        fds_idle: idle.fds,
        fds_peak: peaks.fds.max(finished.descriptors),
        fd_allowance: allowance,
        max_concurrent_queries: q,
        events_per_s,
        ceiling_per_s,
        ratio_to_ceiling: events_per_s / ceiling_per_s,
        emitted: emitted + emitted2,
        stored: stored2,
        lost: lost2.max(lost1),
        rows_in_files,
        latency_us_p50: runner::percentile(&finished.latency_us, 0.5),
        latency_us_p99: runner::percentile(&finished.latency_us, 0.99),
        commits: finished.commits,
        batch_items_mean: finished.batch_items.mean(),
        queries: clients,
        queries_answered: answered,
        queries_busy: busy,
        query_us_p50: runner::percentile(&query_us, 0.5),
        query_us_p99: runner::percentile(&query_us, 0.99),
        query_us_max: query_us.max(),
        events_per_s_under_queries: (stored2 - stored1) as f64 / secs2,
    })
}

/// The scale scenario's options.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: crate::cli::Common,
    #[command(flatten)]
    binary: crate::cli::Binary,
    /// Seconds of load per point (default 10).
    #[arg(long)]
    duration: Option<f64>,
    #[command(flatten)]
    bytes: crate::cli::EventBytes,
    /// Rings attached (simulated CPUs), in order.
    #[arg(long, value_delimiter = ',', default_value = "2,16,64,256")]
    scale_rings: Vec<u32>,
    /// StorageShards values run at each ring count.
    #[arg(long, value_delimiter = ',', default_value = "0,256")]
    scale_shards: Vec<i64>,
    /// Concurrent query clients.
    #[arg(long, default_value_t = 128)]
    queries: usize,
}

pub(crate) fn main(args: &Args) -> anyhow::Result<String> {
    let work = args.common.output.work()?;
    run(args, &args.binary.path()?, args.bytes.sizes()?, &work)
}

/// The whole scenario; returns the machine-readable summary line.
pub(crate) fn run(args: &Args, eventd: &Path, sizes: Sizes, work: &Path) -> anyhow::Result<String> {
    let limit = raise_nofile();
    let duration = Duration::from_secs_f64(args.duration.unwrap_or(10.0));
    let progress = indicatif::ProgressBar::new_spinner();
    progress.enable_steady_tick(Duration::from_millis(200));
    progress.suspend(|| eprintln!("descriptor limit for eventd: {limit}"));
    // With `--repeat`, every point again in each round: the ceiling over
    // 256 databases moved by up to 1.8x between runs here, so ratios are
    // judged by their median over rounds.
    let grid: Vec<(u32, i64)> = (args.scale_rings.iter())
        .flat_map(|&rings| args.scale_shards.iter().map(move |&shards| (rings, shards)))
        .collect();
    let mut points = Vec::new();
    let order = runner::Order::Same;
    let samples = runner::interleave(&grid, args.common.repeat, order, |_, &scale| {
        let p = point(
            work,
            eventd,
            scale,
            args.queries,
            duration,
            sizes,
            &progress,
        )?;
        progress.suspend(|| eprintln!("{}", line(&p)));
        points.push(p.clone());
        Ok(p)
    })?;
    progress.finish_and_clear();
    println!("{}", table(&points));
    let medians: Vec<ScalePoint> = samples
        .into_iter()
        .filter_map(|same| {
            if args.common.repeat > 1 {
                let mut ratios: Vec<f64> = same.iter().map(|p| p.ratio_to_ceiling).collect();
                ratios.sort_by(f64::total_cmp);
                println!(
                    "rings {} StorageShards {}: ratio to the ceiling by round, sorted {:.2?}, median {:.2}",
                    same[0].rings,
                    same[0].storage_shards,
                    ratios,
                    runner::median(&ratios)
                );
            }
            runner::median_by(same, |p| p.ratio_to_ceiling)
        })
        .collect();
    let results = &args.common.output.results;
    let body = serde_json::json!({ "descriptor_limit": limit, "points": points });
    let json = runner::write_report(results, "scale", &body)?;
    let svg = results.join("scale.svg");
    chart(&medians).write_svg(&svg)?;
    println!("report: {} and {}", json.display(), svg.display());
    let last = medians.last().context("no point was measured")?;
    Ok(format!(
        "scale_rings={} ratio_to_ceiling={:.2} rss_peak_mib={:.0} query_p99_us={} events_per_s={:.0}",
        last.rings, last.ratio_to_ceiling, last.rss_peak_mib, last.query_us_p99, last.events_per_s
    ))
}

fn line(p: &ScalePoint) -> String {
    format!(
        "N={} StorageShards={} ({} shards): start {:.0} ms, threads {}/{}, RSS {:.0}/{:.0} (own {:.0})/{:.0} MiB, \
         fds {}/{} of {} allowed; {:.0} events/s vs ceiling {:.0} ({:.2}), p99 {} µs, batch {:.0}; \
         {} queries: {} answered, {} busy, p99 {} µs, ingest meanwhile {:.0}/s",
        p.rings,
        p.storage_shards,
        p.shards,
        p.startup_ms,
        p.threads_idle,
        p.threads_peak,
        p.rss_idle_mib,
        p.rss_ingest_mib,
        p.anon_ingest_mib,
        p.rss_peak_mib,
        p.fds_idle,
        p.fds_peak,
        p.fd_allowance,
        p.events_per_s,
        p.ceiling_per_s,
        p.ratio_to_ceiling,
        p.latency_us_p99,
        p.batch_items_mean,
        p.queries,
        p.queries_answered,
        p.queries_busy,
        p.query_us_p99,
        p.events_per_s_under_queries
    )
}

fn table(points: &[ScalePoint]) -> String {
    let mut out = String::from(
        "| rings | StorageShards | shards | start-up ms | threads idle/peak | RSS MiB idle/ingest (own)/peak \
         | fds idle/peak | R2 allowance (Q) | events/s | ceiling/s | ratio | p99 emit→commit ms \
         | batch mean | queries p50/p99 ms | answered / busy | events/s under queries |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in points {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {}/{} | {:.0}/{:.0} ({:.0})/{:.0} | {}/{} | {} ({}) | {:.0} | {:.0} | {:.2} \
             | {:.1} | {:.0} | {:.1}/{:.1} | {} / {} | {:.0} |\n",
            p.rings,
            p.storage_shards,
            p.shards,
            p.startup_ms,
            p.threads_idle,
            p.threads_peak,
            p.rss_idle_mib,
            p.rss_ingest_mib,
            p.anon_ingest_mib,
            p.rss_peak_mib,
            p.fds_idle,
            p.fds_peak,
            p.fd_allowance,
            p.max_concurrent_queries,
            p.events_per_s,
            p.ceiling_per_s,
            p.ratio_to_ceiling,
            p.latency_us_p99 as f64 / 1e3,
            p.batch_items_mean,
            p.query_us_p50 as f64 / 1e3,
            p.query_us_p99 as f64 / 1e3,
            p.queries_answered,
            p.queries_busy,
            p.events_per_s_under_queries,
        ));
    }
    out
}

/// Events/s (eventd solid, the ceiling dashed) and eventd's peak RSS by
/// ring count, a line per StorageShards setting.
fn chart(points: &[ScalePoint]) -> Chart {
    let mut rings: Vec<u32> = points.iter().map(|p| p.rings).collect();
    rings.sort_unstable();
    rings.dedup();
    let mut settings: Vec<i64> = points.iter().map(|p| p.storage_shards).collect();
    settings.sort_unstable();
    settings.dedup();
    let x_of = |n: u32| rings.iter().position(|&r| r == n).unwrap_or(0) as f64;
    let colours = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    let of = |s: i64, f: fn(&ScalePoint) -> f64| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter(|p| p.storage_shards == s)
            .map(|p| (x_of(p.rings), f(p)))
            .collect()
    };
    let (mut rates, mut rss) = (Vec::new(), Vec::new());
    for (i, &s) in settings.iter().enumerate() {
        let colour = colours[i % colours.len()];
        rates.push(Series {
            label: Some(format!("eventd, StorageShards={s}")),
            colour,
            dashed: false,
            points: of(s, |p| p.events_per_s),
        });
        rates.push(Series {
            label: None,
            colour,
            dashed: true,
            points: of(s, |p| p.ceiling_per_s),
        });
        rss.push(Series {
            label: Some(format!("StorageShards={s}")),
            colour,
            dashed: false,
            points: of(s, |p| p.rss_peak_mib),
        });
    }
    Chart {
        size: (960, 760),
        split: 400,
        x_range: -0.3f64..(rings.len().max(1) as f64 - 0.7),
        x_labels: rings.iter().map(|n| format!("{n} rings")).collect(),
        top: Panel {
            caption: "scale: events/s committed (solid) and ceiling (dashed)".to_string(),
            series: rates,
            thousands: true,
            legend: Some(Legend::LowerLeft),
        },
        bottom: Panel {
            caption: "peak RSS of eventd (MiB)".to_string(),
            series: rss,
            thousands: false,
            legend: Some(Legend::UpperLeft),
        },
    }
}
