//! One export run: eventd with `ExportUrl` set on a filled store, timed until
//! every file is exported.

use super::ch::Ch;
use super::store::{Filled, StoreFile};
use super::{HOST, PATIENCE};
use crate::pipeline::{self, ExportPoint, Knobs};
use crate::system::Running;
use anyhow::{bail, Context};
use eventd::export::format::Format;
use eventd::export::state::Table;
use eventd::export::ExportReport;
use serde::Serialize;
use std::time::{Duration, Instant};

/// What a timed run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct RunFigures {
    pub(super) rows: u64,
    pub(super) secs: f64,
    pub(super) rows_per_s: f64,
    /// ClickHouse servers and ZooKeeper, ns per row.
    pub(super) server_cpu_ns_per_row: f64,
    /// The export run: eventd's export threads; the bare run: this
    /// process's sending threads.
    pub(super) client_cpu_ns_per_row: f64,
    /// The export run with `--system binary`: the whole eventd process.
    pub(super) process_cpu_ns_per_row: Option<f64>,
    /// The export run: from eventd's start until the first batch was
    /// confirmed.
    pub(super) first_batch_secs: Option<f64>,
    /// The export run: rows/s from the first confirmed batch to the last
    /// full one (without the start-up and without the wait of each file's
    /// last, partial batch for the exporter's flush interval); `None`
    /// with fewer than two batches per file.
    pub(super) steady_rows_per_s: Option<f64>,
    /// The export run: how many of the files each export worker has
    /// (the workers' own assignment, `export::worker::owner`).
    pub(super) files_per_worker: Vec<usize>,
    /// The export run: seconds from eventd's start to each file's last
    /// row confirmed, in file order.
    pub(super) file_done_secs: Vec<f64>,
    pub(super) batches: u64,
    /// Rows ClickHouse holds afterwards (events + gaps).
    pub(super) rows_in_clickhouse: u64,
}

pub(super) fn export_point(
    url: &str,
    db: &str,
    batch: u64,
    format: Format,
    nice: i32,
) -> ExportPoint {
    ExportPoint {
        host: HOST.to_string(),
        settings: eventd::export::ExportSettings {
            url: url.to_string(),
            database: db.to_string(),
            batch_rows: batch,
            nice,
            user: None,
            password_file: None,
            tls: Default::default(),
        },
        format,
    }
}

/// Rows of `files` the report shows exported (each file's cursors, capped
/// at what the file held when filled), and whether that is all of them.
pub(super) fn exported(report: &ExportReport, files: &[StoreFile]) -> (u64, bool) {
    let mut rows = 0;
    let mut all = true;
    for f in files {
        match report.shards.iter().find(|s| s.instance == f.instance) {
            Some(s) => {
                rows += s.events.exported_through.min(f.events).max(0) as u64
                    + s.gaps.exported_through.min(f.gaps).max(0) as u64;
                all &= s.events.exported_through >= f.events && s.gaps.exported_through >= f.gaps;
            }
            None => all = false,
        }
    }
    (rows, all)
}

/// eventd started on the filled store with export on (a new database, no
/// export state), timed until its status shows every row exported.
pub(super) fn export_run(
    ch: &mut Ch,
    setup: &pipeline::Setup,
    filled: &Filled,
    (format, batch, nice): (Format, u64, i32),
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<RunFigures> {
    let db = ch.fresh_database("export")?;
    let state = filled.dir.path().join("export");
    if state.exists() {
        std::fs::remove_dir_all(&state)?;
    }
    let point = export_point(&ch.url, &db, batch, format, nice);
    let (settings, tunables) =
        pipeline::configure(filled.dir.path(), Knobs::defaults(), Some(&point))?;
    ch.wait_quiet();
    let server0 = ch.cpu_ns();
    let start = Instant::now();
    let running = Running::start(&setup.system, &setup.eventd, &settings, tunables)?;
    let watched = watch(&running, filled, start, (format, batch), progress)?;
    let secs = start.elapsed().as_secs_f64();
    let (threads_ns, process_ns) = running.export_cpu_ns();
    let server_ns = ch.cpu_ns() - server0;
    running.stop()?;
    let rows = filled.rows();
    let landed = ch.wait_count(&db, Table::Events, filled.events)?
        + ch.wait_count(&db, Table::Gaps, filled.gaps)?;
    ch.drop_database(&db)?;
    let per_row = |ns: u64| ns as f64 / rows as f64;
    Ok(RunFigures {
        rows,
        secs,
        rows_per_s: rows as f64 / secs,
        server_cpu_ns_per_row: per_row(server_ns),
        client_cpu_ns_per_row: per_row(threads_ns),
        process_cpu_ns_per_row: process_ns.map(per_row),
        first_batch_secs: watched.first_batch,
        steady_rows_per_s: steady_rate(&watched.timeline, &filled.files, batch),
        files_per_worker: files_per_worker(&filled.files),
        file_done_secs: watched
            .file_done
            .iter()
            .map(|d| d.unwrap_or(secs))
            .collect(),
        batches: (watched.report.shards)
            .iter()
            .map(|s| s.events.batches_sent + s.gaps.batches_sent)
            .sum(),
        rows_in_clickhouse: landed,
    })
}

/// What the polling of one export run saw.
struct Watched {
    /// The export status that showed every row exported.
    report: ExportReport,
    /// Seconds from the start to the first confirmed batch.
    first_batch: Option<f64>,
    /// Seconds from the start to each file's last row confirmed.
    file_done: Vec<Option<f64>>,
    /// Seconds and rows exported at each poll.
    timeline: Vec<(f64, u64)>,
}

/// Polls eventd's export status every 20 ms until every file's rows are
/// exported (at most [`PATIENCE`]).
fn watch(
    running: &Running,
    filled: &Filled,
    start: Instant,
    (format, batch): (Format, u64),
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Watched> {
    let mut first_batch = None;
    let mut file_done: Vec<Option<f64>> = vec![None; filled.files.len()];
    let mut timeline: Vec<(f64, u64)> = Vec::new();
    let report = loop {
        let report = running.export_report()?.context("export is off")?;
        let (rows, done) = exported(&report, &filled.files);
        let secs = start.elapsed().as_secs_f64();
        if rows > 0 && first_batch.is_none() {
            first_batch = Some(secs);
        }
        timeline.push((secs, rows));
        for (f, done) in filled.files.iter().zip(file_done.iter_mut()) {
            let whole = std::slice::from_ref(f);
            if done.is_none() && exported(&report, whole).1 {
                *done = Some(secs);
            }
        }
        if done {
            break report;
        }
        if start.elapsed() > PATIENCE {
            bail!(
                "{} {batch}: {rows} of {} rows exported after {secs:.0} s: {}",
                format.name(),
                filled.rows(),
                serde_json::to_string(&report)?
            );
        }
        progress.set_message(format!(
            "export {} {batch}: {rows}/{} rows, {:.0} rows/s",
            format.name(),
            filled.rows(),
            rows as f64 / secs
        ));
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Watched {
        report,
        first_batch,
        file_done,
        timeline,
    })
}

/// How many of the files each export worker has (the workers' own
/// assignment).
fn files_per_worker(files: &[StoreFile]) -> Vec<usize> {
    let workers = files.len().clamp(1, eventd::export::WORKERS_MAX);
    let mut n = vec![0; workers];
    for f in files {
        let name = eventd::export::worker::file_name(&f.path);
        n[eventd::export::worker::owner(&name, workers)] += 1;
    }
    n
}

/// The export rate between the first confirmed batch and the moment
/// only partial batches were left (`timeline`: seconds and rows exported).
fn steady_rate(timeline: &[(f64, u64)], files: &[StoreFile], batch: u64) -> Option<f64> {
    let batch = batch.max(1);
    let tails: u64 = files
        .iter()
        .map(|f| f.events as u64 % batch + f.gaps as u64 % batch)
        .sum();
    let total: u64 = files.iter().map(|f| (f.events + f.gaps) as u64).sum();
    let &(t1, r1) = timeline.iter().find(|(_, r)| *r > 0)?;
    let &(t2, r2) = timeline.iter().find(|(_, r)| *r >= total - tails)?;
    (r2 > r1 && t2 > t1).then(|| (r2 - r1) as f64 / (t2 - t1))
}
