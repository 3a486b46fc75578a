//! `--follow`: after listing what exists, stream what commits later.
//!
//! At the start the follower notes each shard's highest row id; the listing
//! covers rows up to it, and then each poll reads, per shard, the rows with
//! higher ids (rows are appended with increasing ids and never updated), so
//! every event is sent exactly once even when shards commit out of time
//! order.

use super::filter::Filter;
use crate::store::open_read_only;
use crate::store::rows::{EventRow, EVENT_COLUMNS, EVENT_COLUMN_COUNT};
use rusqlite::{Connection, ToSql};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a follower looks for new rows.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Rows held per poll at most, over all shards (each shard gets an equal
/// share, at least 16; a shard with more waiting is read again at once).
const POLL_ROWS: usize = 4096;
const POLL_ROWS_PER_SHARD_MIN: usize = 16;

pub struct Follower {
    shards: Vec<(PathBuf, Connection, i64)>,
    where_sql: String,
    params: Vec<rusqlite::types::Value>,
}

impl Follower {
    /// Notes every event database's highest id now.
    pub fn snapshot(store_dir: &Path, filter: &Filter) -> std::io::Result<Follower> {
        let sql = filter.sql();
        let mut shards = Vec::new();
        for path in crate::store::list_databases(store_dir).map_err(std::io::Error::other)? {
            let opened = open_read_only(&path)
                .and_then(|c| super::filter::register_functions(&c).map(|()| c));
            let Ok(conn) = opened else {
                continue; // the listing names it in a warning
            };
            let Ok(max) = conn.query_row("SELECT coalesce(max(id), 0) FROM events", [], |r| {
                r.get::<_, i64>(0)
            }) else {
                continue;
            };
            shards.push((path, conn, max));
        }
        Ok(Follower {
            shards,
            where_sql: sql.clause,
            params: sql.params,
        })
    }

    /// Each shard's highest id at the snapshot.
    pub fn bounds(&self) -> HashMap<PathBuf, i64> {
        self.shards
            .iter()
            .map(|(p, _, max)| (p.clone(), *max))
            .collect()
    }

    /// Matching rows committed since the last poll, oldest first, and
    /// whether some shard has more waiting (poll again without pausing).
    pub fn poll(&mut self) -> std::io::Result<(Vec<EventRow>, bool)> {
        let per_shard = (POLL_ROWS / self.shards.len().max(1)).max(POLL_ROWS_PER_SHARD_MIN);
        let mut rows = Vec::new();
        let mut more = false;
        for (path, conn, last) in &mut self.shards {
            let mut params: Vec<&dyn ToSql> = self.params.iter().map(|v| v as &dyn ToSql).collect();
            let after = *last;
            params.push(&after);
            let sql = format!(
                "SELECT {EVENT_COLUMNS}, id FROM events WHERE {} AND id > ?{} ORDER BY id \
                 LIMIT {per_shard}",
                self.where_sql,
                params.len()
            );
            let found = conn.prepare_cached(&sql).and_then(|mut stmt| {
                stmt.query_map(params.as_slice(), |r| {
                    // The row id follows the event's columns.
                    Ok((EventRow::from_row(r)?, r.get::<_, i64>(EVENT_COLUMN_COUNT)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            });
            let found =
                found.map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
            if let Some((_, id)) = found.last() {
                *last = *id;
            }
            more |= found.len() == per_shard;
            rows.extend(found.into_iter().map(|(row, _)| row));
        }
        rows.sort_by_key(EventRow::cursor);
        Ok((rows, more))
    }
}
