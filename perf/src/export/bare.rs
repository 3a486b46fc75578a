//! ClickHouse's bare insert of the exporter's own batches: the ceiling each
//! export run is judged against.

use super::ch::Ch;
use super::encoding;
use super::export_run::RunFigures;
use super::store::{Filled, StoreFile};
use crate::system::stat_cpu_ns;
use eventd::export::clickhouse::{ident, Client};
use eventd::export::format::{Format, EVENT_COLUMNS, GAP_COLUMNS};
use eventd::export::source::ShardSource;
use eventd::export::state::Table;
use std::time::Instant;

/// The insert of one batch, as `src/export/cluster.rs` makes it.
fn insert_statement(db: &str, table: Table, format: Format) -> String {
    let columns = match table {
        Table::Events => EVENT_COLUMNS,
        Table::Gaps => GAP_COLUMNS,
    };
    format!(
        "INSERT INTO {}.{} ({columns}) FORMAT {}",
        ident(db),
        table.name(),
        format.name()
    )
}

/// One batch body, ready to send.
pub(super) struct Body {
    table: Table,
    bytes: Vec<u8>,
}

/// Every file's batches: the rows after each cursor, `batch` at most,
/// encoded for `host` and the file's instance, as the exporter cuts them.
/// Timed: the read and encode cost of the rows on one thread.
pub(super) fn encode_all(
    files: &[StoreFile],
    format: Format,
    batch: u64,
) -> anyhow::Result<(Vec<Vec<Body>>, f64)> {
    let start = Instant::now();
    let mut all = Vec::new();
    for f in files {
        let mut bodies = Vec::new();
        for_each_batch(f, format, batch, |table, body| {
            bodies.push(Body {
                table,
                bytes: body.to_vec(),
            });
            Ok(())
        })?;
        all.push(bodies);
    }
    Ok((all, start.elapsed().as_secs_f64()))
}

/// Reads `file`'s rows table by table, `batch` at most at a time, as the
/// exporter cuts them, and hands each batch's encoded body to `each`.
fn for_each_batch(
    file: &StoreFile,
    format: Format,
    batch: u64,
    mut each: impl FnMut(Table, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let source = ShardSource::open(&file.path)?;
    for table in Table::ALL {
        let mut after = 0;
        loop {
            let rows = source.after(table, after, batch, encoding(format))?;
            let Some(last) = rows.last_id() else {
                break;
            };
            after = last;
            each(table, rows.body())?;
        }
    }
    Ok(())
}

/// What one thread of the bare loop sends.
enum BareWork<'a> {
    /// Batches encoded before the clock started.
    Encoded(Vec<&'a Body>),
    /// Files to read and encode batch by batch, in the loop.
    Files(Vec<&'a StoreFile>),
}

/// One insert, with the settings `src/export/cluster.rs` gives the
/// exporter's.
fn send(
    client: &Client,
    (db, single): (&str, bool),
    table: Table,
    format: Format,
    body: &[u8],
    query_id: &str,
) -> anyhow::Result<()> {
    let timeout = eventd::export::ExportTunables::default().timeout;
    let timeout = timeout.as_secs().max(1).to_string();
    // The exporter's settings: the Distributed ones only for a cluster.
    let mut settings = vec![("max_insert_block_size", "1048576"), ("query_id", query_id)];
    if !single {
        settings.push(("insert_distributed_sync", "1"));
        settings.push(("insert_distributed_timeout", &timeout));
    }
    client.insert(&insert_statement(db, table, format), body, &settings)?;
    Ok(())
}

/// One thread of the bare loop; returns its CPU time, ns.
fn bare_thread(
    client: &Client,
    (db, single): (&str, bool),
    format: Format,
    batch: u64,
    work: BareWork<'_>,
) -> anyhow::Result<u64> {
    let mut n = 0;
    let mut query_id = || {
        n += 1;
        format!("perf-bare:{db}:{:?}:{n}", std::thread::current().id())
    };
    match work {
        BareWork::Encoded(bodies) => {
            for b in bodies {
                send(client, (db, single), b.table, format, &b.bytes, &query_id())?;
            }
        }
        BareWork::Files(files) => {
            for f in files {
                for_each_batch(f, format, batch, |table, body| {
                    send(client, (db, single), table, format, body, &query_id())
                })?;
            }
        }
    }
    // This thread's CPU, read before it ends and leaves /proc/self/task.
    Ok(stat_cpu_ns("/proc/thread-self/stat").unwrap_or(0))
}

/// The bare loop: the rows POSTed as fast as ClickHouse takes them, one
/// thread per file (at most as many as the export workers), into a new
/// database. `encoded`: batches made before the clock starts (ClickHouse
/// alone); `None`: each thread reads and encodes its files' batches in
/// the loop (the exporter's work without its protocol).
pub(super) fn bare(
    ch: &mut Ch,
    filled: &Filled,
    format: Format,
    batch: u64,
    encoded: Option<&[Vec<Body>]>,
) -> anyhow::Result<RunFigures> {
    let db = ch.fresh_database("bare")?;
    ch.wait_quiet();
    let threads = filled.files.len().clamp(1, eventd::export::WORKERS_MAX);
    let mut work: Vec<BareWork<'_>> = (0..threads)
        .map(|_| match encoded {
            Some(_) => BareWork::Encoded(Vec::new()),
            None => BareWork::Files(Vec::new()),
        })
        .collect();
    for (i, file) in filled.files.iter().enumerate() {
        match (&mut work[i % threads], encoded) {
            (BareWork::Encoded(list), Some(bodies)) => list.extend(bodies[i].iter()),
            (BareWork::Files(list), None) => list.push(file),
            _ => unreachable!("made alike above"),
        }
    }
    let server0 = ch.cpu_ns();
    let start = Instant::now();
    let client_ns = std::thread::scope(|scope| -> anyhow::Result<u64> {
        let handles: Vec<_> = work
            .into_iter()
            .enumerate()
            .map(|(t, w)| {
                let (client, db, single) = (&ch.client, &db, ch.cluster.is_single());
                std::thread::Builder::new()
                    .name(format!("bare-{t}"))
                    .spawn_scoped(scope, move || {
                        bare_thread(client, (db, single), format, batch, w)
                    })
            })
            .collect::<Result<_, _>>()?;
        let mut total = 0;
        for h in handles {
            total += h
                .join()
                .map_err(|_| anyhow::anyhow!("a bare insert thread panicked"))??;
        }
        Ok(total)
    })?;
    let secs = start.elapsed().as_secs_f64();
    let server_ns = ch.cpu_ns() - server0;
    let rows = filled.rows();
    let landed = ch.wait_count(&db, Table::Events, filled.events)?
        + ch.wait_count(&db, Table::Gaps, filled.gaps)?;
    ch.drop_database(&db)?;
    Ok(RunFigures {
        rows,
        secs,
        rows_per_s: rows as f64 / secs,
        server_cpu_ns_per_row: server_ns as f64 / rows as f64,
        client_cpu_ns_per_row: client_ns as f64 / rows as f64,
        process_cpu_ns_per_row: None,
        first_batch_secs: None,
        steady_rows_per_s: None,
        files_per_worker: Vec::new(),
        file_done_secs: Vec::new(),
        batches: 0,
        rows_in_clickhouse: landed,
    })
}
