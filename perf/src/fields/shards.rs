//! Shard files of the scenario's rows: opened with a set of query indexes,
//! filled in parallel, measured.

use super::data::{Day, Row, Rows};
use super::options::THREADS;
use anyhow::{anyhow, Context};
use eventd::store::indexes::{self, QueryIndex};
use rusqlite::{params, Connection};
use std::path::Path;
use std::time::Instant;

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
pub(super) fn fill(
    dir: &Path,
    shards: usize,
    rows: &Rows<'_>,
    wanted: &[QueryIndex],
) -> anyhow::Result<f64> {
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
pub(super) fn insert(conn: &mut Connection, day: &Day, rows: &[Row]) -> anyhow::Result<()> {
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
pub(super) fn on_shards(
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
pub(super) fn ceiling_sql(wanted: &[QueryIndex]) -> Vec<String> {
    let mut sql: Vec<String> = eventd::config::query_indexes_default()
        .iter()
        .filter(|q| !wanted.contains(q))
        .map(|q| format!("DROP INDEX IF EXISTS {}", q.index_name()))
        .collect();
    sql.extend(wanted.iter().map(QueryIndex::create_sql));
    sql
}

pub(super) fn parse_all(entries: &[&str]) -> anyhow::Result<Vec<QueryIndex>> {
    entries
        .iter()
        .map(|e| QueryIndex::parse(e).map_err(|allowed| anyhow!("{e:?}: expected {allowed}")))
        .collect()
}

pub(super) fn labels(wanted: &[QueryIndex]) -> String {
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
pub(super) fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut bytes = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        bytes += entry?.metadata()?.len();
    }
    Ok(bytes)
}

pub(super) fn work_dir(work: &Path, prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(work)
        .with_context(|| format!("making a directory in {}", work.display()))
}
