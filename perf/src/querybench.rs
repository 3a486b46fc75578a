//! The query bench: the same events stored in one database, in 16 shards
//! and in 256 shards; a time-range query through eventd's fan-out reader,
//! timed to its first result and to its 100th, with the files' time maps
//! (as the daemon's query server reads) and without them (as `eventctl`
//! reads a store directly).

use crate::runner;
use eventd::query::fanout::ConnectionPool;
use eventd::query::{FanOut, Filter, Order};
use eventd::store::zones::ZoneMaps;
use rusqlite::params;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub struct QueryPoint {
    pub databases: usize,
    pub events: u64,
    pub order: Order,
    /// With the files' time maps (the query server's way).
    pub maps: bool,
    /// The first run: every shard opened (what a query costs right after
    /// the daemon starts, or without the server's connection pool); with
    /// maps, the maps are read into memory by it.
    pub cold_hundred_results_us: u64,
    /// Medians of the repeats (connections kept by the pool, as the query
    /// server does).
    pub first_result_us: u64,
    pub hundred_results_us: u64,
    /// Databases the last repeat opened.
    pub opened: usize,
}

/// The daemon's stripe length (`Tunables::stripe_len`).
const STRIPE: u64 = 4096;
const NS_PER_EVENT: i64 = 1000;

/// Stores `events` rows striped over `databases` fresh shard files in `dir`
/// (the way drains stripe them), one transaction and zone row per stripe,
/// as a writer stores what a drain hands it.
fn fill(dir: &Path, databases: usize, events: u64, t0: i64) -> anyhow::Result<()> {
    let message = "m".repeat(100);
    let stripes = events.div_ceil(STRIPE);
    for j in 0..databases {
        let mut conn = eventd::store::open_shard(&eventd::store::shard_path(dir, j))?;
        for k in (j as u64..stripes).step_by(databases) {
            let chunk: Vec<u64> = (k * STRIPE..((k + 1) * STRIPE).min(events)).collect();
            let tx = conn.transaction()?;
            {
                let mut insert = tx.prepare_cached(eventd::store::rows::INSERT_EVENT)?;
                for &i in &chunk {
                    insert.execute(params![
                        t0 + i as i64 * NS_PER_EVENT,
                        (i % 2) as i64,
                        i as i64 + 1,
                        7i64,
                        1000u32,
                        1000u32,
                        0u32,
                        6u8,
                        "bench",
                        "event",
                        &message,
                        None::<&str>,
                    ])?;
                }
            }
            let ts = |i: u64| t0 + i as i64 * NS_PER_EVENT;
            eventd::store::zones::record(
                &tx,
                ts(chunk[0]),
                ts(chunk[chunk.len() - 1]),
                tx.last_insert_rowid(),
            )?;
            tx.commit()?;
        }
    }
    Ok(())
}

/// Times one query: to the first event and to the 100th.
fn time_query(
    store: &Path,
    filter: &Filter,
    pool: &std::sync::Arc<ConnectionPool>,
    zones: Option<&ZoneMaps>,
) -> anyhow::Result<(Duration, Duration, usize)> {
    let start = Instant::now();
    let mut fan = FanOut::open_pooled(store, filter.clone(), None, Some(pool.clone()), zones)?;
    let mut first = None;
    let mut n = 0;
    while let Some(_row) = fan.next_event() {
        n += 1;
        if first.is_none() {
            first = Some(start.elapsed());
        }
        if n == 100 {
            break;
        }
    }
    anyhow::ensure!(n == 100, "the query returned {n} events, not 100");
    Ok((first.unwrap_or_default(), start.elapsed(), fan.opened()))
}

pub fn run(work: &Path, events: u64, repeats: usize) -> anyhow::Result<Vec<QueryPoint>> {
    let t0 = 1_700_000_000_000_000_000i64;
    let mut points = Vec::new();
    for databases in [1usize, 16, 256] {
        let dir = tempfile::Builder::new().prefix("query-").tempdir_in(work)?;
        let started = Instant::now();
        fill(dir.path(), databases, events, t0)?;
        eprintln!(
            "query bench: {events} events into {databases} databases in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let span = events as i64 * NS_PER_EVENT;
        for order in [Order::OldestFirst, Order::NewestFirst] {
            let filter = Filter {
                since_ns: Some(t0 + span * 2 / 5),
                until_ns: Some(t0 + span * 3 / 5),
                order,
                limit: Some(100),
                ..Filter::default()
            };
            for maps in [false, true] {
                let pool = std::sync::Arc::new(ConnectionPool::new(4));
                let zones = ZoneMaps::default();
                let zones = maps.then_some(&zones);
                let (_, cold, _) = time_query(dir.path(), &filter, &pool, zones)?;
                // The warm runs, back to back on the same pool.
                let warm = runner::interleave(&[()], repeats, runner::Order::Same, |_, _| {
                    time_query(dir.path(), &filter, &pool, zones)
                })?;
                let warm: Vec<(Duration, Duration, usize)> = warm.into_iter().flatten().collect();
                let us = |d: Duration| d.as_micros() as f64;
                let firsts: Vec<f64> = warm.iter().map(|r| us(r.0)).collect();
                let hundreds: Vec<f64> = warm.iter().map(|r| us(r.1)).collect();
                // What the last warm run opened.
                let opened = warm.last().map_or(0, |r| r.2);
                points.push(QueryPoint {
                    databases,
                    events,
                    order,
                    maps,
                    cold_hundred_results_us: cold.as_micros() as u64,
                    first_result_us: runner::median(&firsts) as u64,
                    hundred_results_us: runner::median(&hundreds) as u64,
                    opened,
                });
            }
        }
    }
    Ok(points)
}
