//! One measured point: the real daemon in-process (rings → drains → channels
//! → writers → SQLite) under the load, then the ceiling with the same rows.

use crate::load::{Mode, Sizes};
use crate::runner;
use crate::system::{ProducerKind, Producers, Running, SystemKind};
use eventd::channel::Capacity;
use eventd::config::{ConfigFile, Settings};
use eventd::daemon::Tunables;
use serde::Serialize;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::{Duration, Instant};

/// The settings of one point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Knobs {
    /// StorageShards as configured (0 = one per ring).
    pub storage_shards: i64,
    pub max_batch: u64,
    pub stripe_len: u32,
    /// Channel slots and bytes; 0 = eventd's own sizing for the shard count.
    pub channel_slots: usize,
    pub channel_bytes: u64,
}

impl Knobs {
    /// What eventd ships with.
    pub fn defaults() -> Knobs {
        let t = Tunables::default();
        Knobs {
            storage_shards: 0,
            max_batch: eventd::config::MAX_BATCH_SIZE_DEFAULT,
            stripe_len: t.stripe_len.get(),
            channel_slots: t.channel.map_or(0, |c| c.slots),
            channel_bytes: t.channel.map_or(0, |c| c.bytes),
        }
    }
}

/// Everything measured at one point.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub label: String,
    pub knobs: Knobs,
    pub mode: Mode,
    pub sizes: Sizes,
    pub shards: usize,
    pub rings: usize,
    /// MaxConcurrentQueries used (lowered when the descriptor limit needs it).
    pub max_concurrent_queries: u64,
    pub load_secs: f64,
    /// From the start of the load until every sequenced event was stored or
    /// counted lost.
    pub drained_secs: f64,
    pub emitted: u64,
    pub refused: u64,
    pub stored: u64,
    pub lost: u64,
    pub lost_by_reason: Vec<(String, u64)>,
    /// Rows counted with SQLite in the shard files afterwards.
    pub rows_in_files: u64,
    pub events_per_s: f64,
    pub ceiling_per_s: f64,
    pub ratio_to_ceiling: f64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub latency_us_p999: u64,
    pub latency_us_max: u64,
    /// `None` for the binary (not exposed outside the process).
    pub channel_full_stalls: Option<u64>,
    pub commits: u64,
    pub batch_items_mean: f64,
    pub batch_items_p50: u64,
    pub batch_items_max: u64,
    pub peak_rss_mib: f64,
    /// The largest shard `-wal` file seen during the load (sampled every
    /// 250 ms), and the largest right after the drain (MiB): the writers'
    /// checkpoints keep it near `schema::WAL_LIMIT_BYTES` unless a reader
    /// holds it back.
    pub wal_peak_mib: f64,
    pub wal_end_mib: f64,
    /// With export on: the times the exporter held its reads of a file so
    /// that the file's WAL could start over (`export::walroom`).
    pub export_wal_holds: Option<u64>,
    pub descriptors: usize,
    /// The channel capacity the point ran with.
    pub channel_slots: usize,
    pub channel_bytes: u64,
    pub system: SystemKind,
    pub producers: ProducerKind,
}

/// How the system and the producers run (the same for every point).
pub struct Setup {
    pub system: SystemKind,
    /// The `eventd` binary, for `SystemKind::Binary`.
    pub eventd: std::path::PathBuf,
    pub producers: ProducerKind,
}

/// What to measure at one point.
pub struct Point<'a> {
    pub label: &'a str,
    pub knobs: Knobs,
    pub mode: Mode,
    pub sizes: Sizes,
    pub duration: Duration,
    /// Also run the bare-SQLite ceiling with the same rows.
    pub with_ceiling: bool,
    /// Export into ClickHouse during the point (`None`: ExportUrl unset).
    pub export: Option<&'a ExportPoint>,
}

/// The export keys a point runs with, and the batch format.
#[derive(Debug, Clone)]
pub struct ExportPoint {
    /// `HostName`: the `host` column, which picks the shard.
    pub host: String,
    /// `ExportUrl`, `ExportDatabase`, `ExportBatchRows`.
    pub settings: eventd::export::ExportSettings,
    /// `--export-format`.
    pub format: eventd::export::format::Format,
}

/// The settings and tunables of a point in `dir`: `knobs`, and export on
/// when `export` says so.
pub fn configure(
    dir: &Path,
    knobs: Knobs,
    export: Option<&ExportPoint>,
) -> anyhow::Result<(Settings, Tunables)> {
    let file = ConfigFile {
        storage_shards: Some(knobs.storage_shards),
        // Ceilings are measured unlimited: one source emits everything.
        rate_limit_burst: Some(0),
        // No syslog or service-output sockets: the load comes through the rings, and without
        // a ring of its own eventd stores no boot marker, so the store
        // holds exactly what the producers emitted (the export scenario
        // counts every row in ClickHouse against it).
        syslog_socket: Some(std::path::PathBuf::new()),
        syslog_stream_socket: Some(std::path::PathBuf::new()),
        stdout_socket: Some(std::path::PathBuf::new()),
        max_batch_size: Some(knobs.max_batch as i64),
        ..ConfigFile::default()
    };
    let mut settings: Settings = file.resolve(dir)?;
    settings.max_concurrent_queries = fit_queries(&settings)?;
    let mut tunables = Tunables {
        stripe_len: NonZeroU32::new(knobs.stripe_len).unwrap_or(NonZeroU32::MIN),
        channel: (knobs.channel_slots > 0).then_some(Capacity {
            slots: knobs.channel_slots,
            bytes: knobs.channel_bytes,
        }),
        ..Tunables::default()
    };
    if let Some(e) = export {
        settings.host_name.clone_from(&e.host);
        settings.export = Some(e.settings.clone());
        tunables.export.format = e.format;
    }
    Ok((settings, tunables))
}

/// `QueryIndexes` for a point other than the default, and the SQL that
/// gives the ceiling's databases the same indexes (run on each after
/// `ceiling::run_with` made the default ones), so the two stay comparable.
#[derive(Clone, Copy)]
pub struct PointIndexes<'a> {
    pub wanted: &'a [eventd::store::indexes::QueryIndex],
    pub ceiling_sql: &'a [&'a str],
}

/// Runs one point in a fresh directory under `work`.
pub fn run(
    work: &Path,
    setup: &Setup,
    point: &Point<'_>,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Outcome> {
    run_indexed(work, setup, point, None, progress)
}

// Longer than the ~70 lines a function should be: the phases of one measured
// point in the order they run (start, load, drain, ceiling, stop); each is a
// few lines and they share the timings.
/// Like [`run`], with `QueryIndexes` (eventd and ceiling) from `indexes`
/// when given.
pub fn run_indexed(
    work: &Path,
    setup: &Setup,
    point: &Point<'_>,
    indexes: Option<PointIndexes<'_>>,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Outcome> {
    let &Point {
        label,
        knobs,
        mode,
        sizes,
        duration,
        with_ceiling,
        export,
    } = point;
    let dir = tempfile::Builder::new().prefix("point-").tempdir_in(work)?;
    let (mut settings, tunables) = configure(dir.path(), knobs, export)?;
    if let Some(ix) = indexes {
        settings.query_indexes = ix.wanted.to_vec();
    }
    reset_peak_rss();
    let running = Running::start(&setup.system, &setup.eventd, &settings, tunables)?;
    let rings = running.rings()?;
    let start = Instant::now();
    let producers = Producers::start(setup.producers, &rings, mode, sizes)?;
    let mut wal_peak = 0u64;
    while start.elapsed() < duration {
        std::thread::sleep(Duration::from_millis(250));
        wal_peak = wal_peak.max(largest_wal(&settings.store_dir));
        let (stored, _) = running.progress()?;
        let secs = start.elapsed().as_secs_f64();
        progress.set_message(format!(
            "{label}: {secs:.0}/{:.0} s, {:.0} events/s stored",
            duration.as_secs_f64(),
            stored as f64 / secs
        ));
    }
    let (emitted, refused) = producers.stop()?;
    let load_secs = start.elapsed().as_secs_f64();
    // Wait until every sequenced event is stored or counted lost.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (stored, lost) = loop {
        let (stored, lost) = running.progress()?;
        if stored + lost >= emitted {
            break (stored, lost);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{label}: only {stored} stored + {lost} lost of {emitted} emitted after 120 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let drained_secs = start.elapsed().as_secs_f64();
    let wal_end = largest_wal(&settings.store_dir);
    let export_wal_holds = running
        .export_report()?
        .map(|r| r.shards.iter().map(|s| s.wal_holds).sum());
    let rings = {
        let n = rings.len();
        drop(rings);
        n
    };
    let finished = running.finish()?;
    let shards = finished.shards;
    let channel = tunables.channel_for(shards);
    let (rows_in_files, lost_by_reason) = count_files(&settings.store_dir)?;

    let events_per_s = stored as f64 / drained_secs;
    let ceiling_per_s = if with_ceiling {
        progress.set_message(format!(
            "{label}: ceiling, {stored} rows into {shards} databases"
        ));
        let cdir = tempfile::Builder::new()
            .prefix("ceiling-")
            .tempdir_in(work)?;
        let adjust = indexes.map_or(&[][..], |ix| ix.ceiling_sql);
        crate::ceiling::run_with(
            cdir.path(),
            shards,
            stored.max(1),
            knobs.max_batch,
            sizes,
            adjust,
        )?
    } else {
        f64::NAN
    };
    Ok(Outcome {
        label: label.to_string(),
        knobs,
        mode,
        sizes,
        shards,
        rings,
        max_concurrent_queries: settings.max_concurrent_queries,
        load_secs,
        drained_secs,
        emitted,
        refused,
        stored,
        lost,
        lost_by_reason,
        rows_in_files,
        events_per_s,
        ceiling_per_s,
        ratio_to_ceiling: events_per_s / ceiling_per_s,
        latency_us_p50: runner::percentile(&finished.latency_us, 0.5),
        latency_us_p99: runner::percentile(&finished.latency_us, 0.99),
        latency_us_p999: runner::percentile(&finished.latency_us, 0.999),
        latency_us_max: finished.latency_us.max(),
        channel_full_stalls: finished.channel_full_stalls,
        commits: finished.commits,
        batch_items_mean: finished.batch_items.mean(),
        batch_items_p50: runner::percentile(&finished.batch_items, 0.5),
        batch_items_max: finished.batch_items.max(),
        peak_rss_mib: finished.peak_rss_mib,
        wal_peak_mib: wal_peak.max(wal_end) as f64 / (1 << 20) as f64,
        wal_end_mib: wal_end as f64 / (1 << 20) as f64,
        export_wal_holds,
        descriptors: finished.descriptors,
        channel_slots: channel.slots,
        channel_bytes: channel.bytes,
        system: setup.system.clone(),
        producers: setup.producers,
    })
}

/// The size of the largest shard's `-wal` file in `store` (bytes; 0 if
/// none).
fn largest_wal(store: &Path) -> u64 {
    eventd::store::list_databases(store)
        .unwrap_or_default()
        .iter()
        .filter_map(|db| std::fs::metadata(eventd::store::side_file(db, "-wal")).ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
}

/// The largest MaxConcurrentQueries (up to the configured one) whose
/// descriptor allowance fits this process's soft limit, so sweeps with many
/// shards still run on machines with a small hard limit.
fn fit_queries(settings: &Settings) -> anyhow::Result<u64> {
    let limit = eventd::routing::soft_descriptor_limit()?;
    let rings = eventd::rings::online_cpus().len() as u64;
    let shards = eventd::routing::shard_count(settings.storage_shards, rings as usize)? as u64;
    let mut q = settings.max_concurrent_queries;
    while q > 1 && eventd::routing::descriptor_allowance(q, shards, rings) > limit {
        q -= 1;
    }
    Ok(q)
}

/// Stored rows and gaps by reason, counted in the shard files with SQLite.
pub(crate) fn count_files(store: &Path) -> anyhow::Result<(u64, Vec<(String, u64)>)> {
    let mut rows = 0u64;
    let mut reasons: std::collections::BTreeMap<String, u64> = Default::default();
    for path in eventd::store::list_databases(store)? {
        let c = eventd::store::open_read_only(&path)?;
        rows += c.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))? as u64;
        let mut stmt = c.prepare("SELECT reason, sum(lost) FROM gaps GROUP BY reason")?;
        for r in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
            let (reason, n) = r?;
            *reasons.entry(reason).or_default() += n as u64;
        }
    }
    Ok((rows, reasons.into_iter().collect()))
}

/// Gives freed heap back to the kernel (the previous point's ceiling rows)
/// and resets the kernel's peak-RSS mark of this process (Linux 4.0+).
fn reset_peak_rss() {
    // SAFETY: malloc_trim only releases free memory of glibc's heap.
    unsafe { libc::malloc_trim(0) };
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}
