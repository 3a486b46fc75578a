//! Connections to shards: opened read-only for a query, and kept idle
//! between queries by the query server.

use crate::store::zones::FileId;
use rusqlite::{Connection, OpenFlags};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Idle read-only connections to shard databases, kept between queries by
/// the query server: opening a connection (and SQLite reading the schema on
/// its first statement) costs far more than the query itself. At most
/// `per_database` idle connections per file (the server uses
/// MaxConcurrentQueries, which the descriptor allowance already budgets).
pub struct ConnectionPool {
    /// Per path: the file's identity `(dev, inode)` when the connection was
    /// opened, and the connection.
    idle: std::sync::Mutex<HashMap<PathBuf, Vec<(FileId, Connection)>>>,
    per_database: usize,
}

impl ConnectionPool {
    pub fn new(per_database: usize) -> Self {
        ConnectionPool {
            idle: std::sync::Mutex::new(HashMap::new()),
            per_database,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Vec<(FileId, Connection)>>> {
        // The map is consistent after every operation; a panic elsewhere
        // while holding the lock leaves nothing half-done.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection to the file now at `path`, if one is kept
    /// (connections to a file since replaced under that name are dropped).
    pub(super) fn take(&self, path: &Path, id: Option<FileId>) -> Option<Connection> {
        let id = id?;
        let mut idle = self.lock();
        let list = idle.get_mut(path)?;
        list.retain(|(kept, _)| *kept == id);
        list.pop().map(|(_, conn)| conn)
    }

    pub(super) fn give_back(&self, path: PathBuf, id: Option<FileId>, conn: Connection) {
        let Some(id) = id else { return };
        let mut idle = self.lock();
        let list = idle.entry(path).or_default();
        if list.len() < self.per_database {
            list.push((id, conn));
        }
    }

    /// Forgets connections to files no longer in the store.
    pub(super) fn retain(&self, paths: &[PathBuf]) {
        let present: std::collections::HashSet<&PathBuf> = paths.iter().collect();
        self.lock().retain(|p, _| present.contains(p));
    }

    /// Idle connections kept now.
    pub fn idle(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}

/// Page cache of each query connection (KiB): 8 pages of 32 KiB.
const QUERY_CACHE_KIB: i64 = 256;

/// Opens a shard read-only for a query; `None` if the file is a database
/// without an events table (not an event database: nothing to say). The
/// table check is the one statement, and it also proves the file is a
/// database.
pub(super) fn open_event_database(path: &Path) -> rusqlite::Result<Option<Connection>> {
    crate::store::configure_sqlite();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    // A query reads a few pages of each shard, or streams through many
    // once: a small cache each, since the server keeps many connections
    // (up to MaxConcurrentQueries per database) and the kernel's page
    // cache holds the files anyway.
    conn.pragma_update(None, "cache_size", -QUERY_CACHE_KIB)?;
    crate::query::filter::register_functions(&conn)?;
    let has: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'events'",
        [],
        |r| r.get(0),
    )?;
    Ok((has > 0).then_some(conn))
}
