//! The day-long store, filled without query indexes, and each candidate index
//! built over it.

use super::data::{Day, Rows};
use super::options::{Args, CANDIDATES};
use super::shards::{dir_bytes, fill, on_shards, parse_all};
use anyhow::Context;
use eventd::store::indexes::{self, QueryIndex};
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Clone, Serialize)]
pub(super) struct StoreFigures {
    pub(super) events: u64,
    pub(super) shards: usize,
    pub(super) fill_secs: f64,
    pub(super) rows_per_s: f64,
    pub(super) bytes: u64,
}

/// Phase 2a: the day's rows into the shard files of `store`, without
/// query indexes.
pub(super) fn fill_store(
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
pub(super) struct IndexBuild {
    pub(super) index: String,
    pub(super) secs: f64,
    pub(super) secs_per_million_rows: f64,
    pub(super) bytes_added: u64,
}

/// Phase 2b: each candidate built over every shard, one after the other,
/// the way a writer's first `sync` builds a newly configured one (the
/// ones built before stay, as they would).
pub(super) fn build_indexes(
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
