//! One measured point: the real daemon in-process (rings → drains → channels
//! → writers → SQLite) under the load, then the ceiling with the same rows.

use crate::load::{self, Mode, Sizes};
use eventd::channel::Capacity;
use eventd::config::{ConfigFile, Settings};
use eventd::daemon::{Daemon, Tunables};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The settings of one point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Knobs {
    /// StorageShards as configured (0 = one per ring).
    pub storage_shards: i64,
    pub max_batch: u64,
    pub stripe_len: u32,
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
            channel_slots: t.channel.slots,
            channel_bytes: t.channel.bytes,
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
    pub channel_full_stalls: u64,
    pub commits: u64,
    pub batch_items_mean: f64,
    pub batch_items_p50: u64,
    pub batch_items_max: u64,
    pub peak_rss_mib: f64,
    pub descriptors: usize,
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
}

/// Runs one point in a fresh directory under `work`.
pub fn run(
    work: &Path,
    point: &Point<'_>,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Outcome> {
    let &Point {
        label,
        knobs,
        mode,
        sizes,
        duration,
        with_ceiling,
    } = point;
    let dir = tempfile::Builder::new().prefix("point-").tempdir_in(work)?;
    let file = ConfigFile {
        storage_shards: Some(knobs.storage_shards),
        max_batch_size: Some(knobs.max_batch as i64),
        ..ConfigFile::default()
    };
    let mut settings: Settings = file.resolve(dir.path())?;
    settings.max_concurrent_queries = fit_queries(&settings)?;
    let tunables = Tunables {
        stripe_len: NonZeroU32::new(knobs.stripe_len).unwrap_or(NonZeroU32::MIN),
        channel: Capacity {
            slots: knobs.channel_slots,
            bytes: knobs.channel_bytes,
        },
    };
    reset_peak_rss();
    let daemon = Daemon::start(&settings, tunables)?;
    let state = daemon.state.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let producers = load::start(&state.rings, &state.drains, mode, sizes, stop.clone());
    let stored_now = || -> (u64, u64) {
        state.writers.iter().fold((0, 0), |(e, l), w| {
            (
                e + w.events.load(Ordering::Relaxed),
                l + w.lost.load(Ordering::Relaxed),
            )
        })
    };
    while start.elapsed() < duration {
        std::thread::sleep(Duration::from_millis(200));
        let (stored, _) = stored_now();
        let secs = start.elapsed().as_secs_f64();
        progress.set_message(format!(
            "{label}: {secs:.0}/{:.0} s, {:.0} events/s stored",
            duration.as_secs_f64(),
            stored as f64 / secs
        ));
    }
    stop.store(true, Ordering::Relaxed);
    let (mut emitted, mut refused) = (0, 0);
    for p in producers {
        p.handle
            .join()
            .map_err(|_| anyhow::anyhow!("a load thread panicked"))?;
        emitted += p.counts.sequenced.load(Ordering::Relaxed);
        refused += p.counts.refused.load(Ordering::Relaxed);
    }
    let load_secs = start.elapsed().as_secs_f64();
    // Wait until every sequenced event is stored or counted lost.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (stored, lost) = stored_now();
        if stored + lost >= emitted {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{label}: only {stored} stored + {lost} lost of {emitted} emitted after 120 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let drained_secs = start.elapsed().as_secs_f64();
    let descriptors = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let peak_rss_mib = peak_rss_mib();
    let (stored, lost) = stored_now();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    let mut batches = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3)?;
    let mut commits = 0;
    for w in &state.writers {
        let h = w.histograms.lock().unwrap_or_else(|p| p.into_inner());
        latency.add(&h.latency_us)?;
        batches.add(&h.batch_items)?;
        commits += w.commits.load(Ordering::Relaxed);
    }
    let channel_full_stalls = state.channels.iter().map(|c| c.stats().full_stalls).sum();
    let shards = state.shard_paths.len();
    let rings = state.rings.len();
    drop(state);
    daemon.join()?;
    let (rows_in_files, lost_by_reason) = count_files(&settings.store_dir)?;

    let events_per_s = stored as f64 / drained_secs;
    let ceiling_per_s = if with_ceiling {
        progress.set_message(format!(
            "{label}: ceiling, {stored} rows into {shards} databases"
        ));
        let cdir = tempfile::Builder::new()
            .prefix("ceiling-")
            .tempdir_in(work)?;
        crate::ceiling::run(cdir.path(), shards, stored.max(1), knobs.max_batch, sizes)?
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
        latency_us_p50: latency.value_at_quantile(0.5),
        latency_us_p99: latency.value_at_quantile(0.99),
        latency_us_p999: latency.value_at_quantile(0.999),
        latency_us_max: latency.max(),
        channel_full_stalls,
        commits,
        batch_items_mean: batches.mean(),
        batch_items_p50: batches.value_at_quantile(0.5),
        batch_items_max: batches.max(),
        peak_rss_mib,
        descriptors,
    })
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
fn count_files(store: &Path) -> anyhow::Result<(u64, Vec<(String, u64)>)> {
    let mut rows = 0u64;
    let mut reasons: std::collections::BTreeMap<String, u64> = Default::default();
    for path in eventd::store::list_databases(store)? {
        let c = eventd::store::recovery::open_read_only(&path)?;
        rows += c.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))? as u64;
        let mut stmt = c.prepare("SELECT reason, sum(lost) FROM gaps GROUP BY reason")?;
        for r in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
            let (reason, n) = r?;
            *reasons.entry(reason).or_default() += n as u64;
        }
    }
    Ok((rows, reasons.into_iter().collect()))
}

/// Resets the kernel's peak-RSS mark of this process (Linux 4.0+).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
