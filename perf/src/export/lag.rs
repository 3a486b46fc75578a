//! Export lag at half the ingest rate: the oldest stored event ClickHouse has
//! not confirmed, sampled.

use super::ch::Ch;
use super::export_run::{export_point, exported};
use super::store::{store_files, StoreFile};
use super::{BATCH_DEFAULT, PATIENCE};
use crate::load::{Mode, Sizes};
use crate::pipeline::{self, Knobs};
use crate::runner;
use crate::system::{Producers, Running};
use anyhow::Context;
use eventd::export::format::Format;
use eventd::export::source::ShardSource;
use eventd::export::state::Table;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Lag samples, µs.
fn lag_histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3)?)
}

/// The export lag right now, ns: the age of the oldest event stored and not
/// confirmed by ClickHouse, over every file (0 when none waits). From the
/// exporter's cursors (its state database, moved only after ClickHouse
/// accepted a batch) and the event after each cursor in its shard file.
fn cursor_lag_ns(state: &rusqlite::Connection, sources: &[ShardSource]) -> anyhow::Result<i64> {
    let now = eventd::rings::now_ns();
    let mut lag = 0;
    for s in sources {
        let through: i64 = state
            .query_row(
                "SELECT exported_through FROM cursors WHERE instance = ?1 AND tbl = 'events'",
                [&s.instance],
                |r| r.get(0),
            )
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(0),
                e => Err(e),
            })?;
        if let Some(ts) = s.first_time_after(Table::Events, through, 1)? {
            lag = lag.max(now - ts);
        }
    }
    Ok(lag)
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct LagFigures {
    pub(super) rate: u64,
    pub(super) secs: f64,
    pub(super) emitted: u64,
    pub(super) lost: u64,
    pub(super) samples: u64,
    pub(super) cursor_lag_ms_p50: f64,
    pub(super) cursor_lag_ms_p99: f64,
    pub(super) cursor_lag_ms_max: f64,
    pub(super) status_lag_ms_p50: f64,
    pub(super) status_lag_ms_p99: f64,
    pub(super) status_lag_ms_max: f64,
    /// From the end of the load until every stored row was exported.
    pub(super) catch_up_secs: f64,
    pub(super) stored: u64,
    pub(super) rows_in_clickhouse: u64,
}

/// The paced load with export on, its lag sampled every 100 ms.
pub(super) fn lag_run(
    ch: &mut Ch,
    setup: &pipeline::Setup,
    work: &Path,
    sizes: Sizes,
    (rate, duration, nice): (u64, Duration, i32),
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<LagFigures> {
    let dir = tempfile::Builder::new()
        .prefix("export-lag-")
        .tempdir_in(work)?;
    let db = ch.fresh_database("lag")?;
    let point = export_point(&ch.url, &db, BATCH_DEFAULT, Format::RowBinary, nice);
    let (settings, tunables) = pipeline::configure(dir.path(), Knobs::defaults(), Some(&point))?;
    ch.wait_quiet();
    let running = Running::start(&setup.system, &setup.eventd, &settings, tunables)?;
    let rings = running.rings()?;
    let mut sampler = Sampler::new(dir.path().join("export/state.db"))?;
    let start = Instant::now();
    let producers = Producers::start(setup.producers, &rings, Mode::Rate(rate), sizes)?;
    let mut next = start;
    while start.elapsed() < duration {
        next += Duration::from_millis(100);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        sampler.sample(&running, &settings.store_dir)?;
        progress.set_message(format!(
            "lag at {rate}/s: {:.0}/{:.0} s, p99 {:.0} ms",
            start.elapsed().as_secs_f64(),
            duration.as_secs_f64(),
            runner::percentile(&sampler.by_cursor, 0.99) as f64 / 1000.0
        ));
    }
    let (emitted, _) = producers.stop()?;
    let secs = start.elapsed().as_secs_f64();
    let (stored, lost) = drain(&running, emitted, start)?;
    let files = store_files(&settings.store_dir)?;
    let catch_up_secs = catch_up(&running, &files)?;
    drop(rings);
    running.stop()?;
    let events: u64 = files.iter().map(|f| f.events as u64).sum();
    let Sampler {
        by_cursor,
        by_status,
        ..
    } = sampler;
    let ms = |h: &Histogram<u64>, q: f64| runner::percentile(h, q) as f64 / 1000.0;
    let rows_in_clickhouse = ch.wait_count(&db, Table::Events, events)?;
    ch.drop_database(&db)?;
    Ok(LagFigures {
        rate,
        secs,
        emitted,
        lost,
        samples: by_cursor.len(),
        cursor_lag_ms_p50: ms(&by_cursor, 0.5),
        cursor_lag_ms_p99: ms(&by_cursor, 0.99),
        cursor_lag_ms_max: by_cursor.max() as f64 / 1000.0,
        status_lag_ms_p50: ms(&by_status, 0.5),
        status_lag_ms_p99: ms(&by_status, 0.99),
        status_lag_ms_max: by_status.max() as f64 / 1000.0,
        catch_up_secs,
        stored,
        rows_in_clickhouse,
    })
}

/// The lag samples of the paced load: by the exporter's cursor and by the
/// export status.
struct Sampler {
    state_path: PathBuf,
    /// The exporter's state database, read-only, once it exists.
    state: Option<rusqlite::Connection>,
    sources: Vec<ShardSource>,
    by_cursor: Histogram<u64>,
    by_status: Histogram<u64>,
}

impl Sampler {
    fn new(state_path: PathBuf) -> anyhow::Result<Sampler> {
        Ok(Sampler {
            state_path,
            state: None,
            sources: Vec::new(),
            by_cursor: lag_histogram()?,
            by_status: lag_histogram()?,
        })
    }

    /// One sample of each (the cursor's once the state database exists).
    fn sample(&mut self, running: &Running, store_dir: &Path) -> anyhow::Result<()> {
        if self.state.is_none() && self.state_path.exists() {
            self.state = Some(rusqlite::Connection::open_with_flags(
                &self.state_path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?);
        }
        let paths = eventd::store::list_databases(store_dir)?;
        if self.sources.len() != paths.len() {
            self.sources = paths
                .iter()
                .filter_map(|p| ShardSource::open(p).ok())
                .collect();
        }
        if let Some(state) = &self.state {
            let lag = cursor_lag_ns(state, &self.sources)?;
            self.by_cursor.saturating_record((lag / 1000).max(1) as u64);
        }
        if let Some(report) = running.export_report()? {
            let worst = report
                .shards
                .iter()
                .flat_map(|s| [s.events.lag_seconds, s.gaps.lag_seconds])
                .fold(0f64, f64::max);
            self.by_status
                .saturating_record(((worst * 1e6) as u64).max(1));
        }
        Ok(())
    }
}

/// Waits until eventd has stored or counted lost every event `emitted`.
fn drain(running: &Running, emitted: u64, start: Instant) -> anyhow::Result<(u64, u64)> {
    loop {
        let (stored, lost) = running.progress()?;
        if stored + lost >= emitted {
            return Ok((stored, lost));
        }
        anyhow::ensure!(start.elapsed() < PATIENCE, "the paced load did not drain");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until every row of `files` is exported; returns the seconds it
/// took.
fn catch_up(running: &Running, files: &[StoreFile]) -> anyhow::Result<f64> {
    let ended = Instant::now();
    loop {
        let report = running.export_report()?.context("export is off")?;
        if exported(&report, files).1 {
            return Ok(ended.elapsed().as_secs_f64());
        }
        anyhow::ensure!(ended.elapsed() < PATIENCE, "the export did not catch up");
        std::thread::sleep(Duration::from_millis(20));
    }
}
