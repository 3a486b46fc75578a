//! A shard's space: its size and time span, the cutoff that deletes at
//! most a given number of events, and free pages given back to the
//! filesystem.

use rusqlite::{Connection, OptionalExtension};

/// The size and the time span of one shard database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardUsage {
    pub page_size: u64,
    /// Pages in the database file (as of the last commit, WAL included).
    pub pages: u64,
    /// Pages on the free list: reused by later inserts, and given back to
    /// the filesystem by an incremental vacuum.
    pub free_pages: u64,
    /// Whether `PRAGMA incremental_vacuum` can give free pages back (shards
    /// created by this eventd; older files reuse their free pages instead).
    pub incremental_vacuum: bool,
    /// Timestamps of the oldest and newest event, if there is one.
    pub oldest_ts: Option<i64>,
    pub newest_ts: Option<i64>,
    /// An upper bound of the event count from the row ids (exact while
    /// rows are only deleted oldest first; a count would walk the table).
    pub events_estimate: u64,
}

impl ShardUsage {
    /// Bytes in pages that hold data.
    pub fn used_bytes(&self) -> u64 {
        self.pages.saturating_sub(self.free_pages) * self.page_size
    }
}

/// Measures `conn`'s database: pragmas and index lookups, O(log n).
pub fn measure(conn: &Connection) -> rusqlite::Result<ShardUsage> {
    let pragma = |name: &str| conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0));
    let page_size = pragma("page_size")? as u64;
    let pages = pragma("page_count")? as u64;
    let free_pages = pragma("freelist_count")? as u64;
    let incremental_vacuum = pragma("auto_vacuum")? == 2;
    // One aggregate per statement: SQLite answers a lone min() or max()
    // from one end of an index, but reads the whole index for two (90 ms
    // against 4 ms over 410,000 rows; seconds per pass, on the writer's
    // thread, for a shard of millions).
    let one = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, Option<i64>>(0));
    let oldest_ts = one("SELECT min(ts) FROM events")?;
    let newest_ts = one("SELECT max(ts) FROM events")?;
    let low = one("SELECT min(id) FROM events")?;
    let high = one("SELECT max(id) FROM events")?;
    let events_estimate = match (low, high) {
        (Some(l), Some(h)) => (h - l + 1).max(0) as u64,
        _ => 0,
    };
    Ok(ShardUsage {
        page_size,
        pages,
        free_pages,
        incremental_vacuum,
        oldest_ts,
        newest_ts,
        events_estimate,
    })
}

/// The timestamp of the `k + 1`-th oldest event: deleting the events older
/// than it removes at most `k`. `None` if there are `k` events or fewer.
/// Uses the `events_ts` index: O(k).
pub fn cutoff_after(conn: &Connection, k: u64) -> rusqlite::Result<Option<i64>> {
    conn.query_row(
        "SELECT ts FROM events ORDER BY ts LIMIT 1 OFFSET ?1",
        [k.min(i64::MAX as u64) as i64],
        |r| r.get(0),
    )
    .optional()
}

/// Gives up to `max_bytes` of free pages (at least one page) back to the
/// filesystem (databases created with `auto_vacuum = INCREMENTAL`; a no-op
/// for others). Returns how many pages the file lost.
pub fn vacuum(conn: &Connection, max_bytes: u64) -> rusqlite::Result<u64> {
    let page: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let max_pages = (max_bytes / page.max(512) as u64).max(1);
    let count = || conn.query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0));
    let before = count()?;
    // The pragma frees one page per step: run it to completion.
    let mut stmt = conn.prepare(&format!("PRAGMA incremental_vacuum({max_pages})"))?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    drop(rows);
    drop(stmt);
    let after = count()?;
    Ok(before.saturating_sub(after) as u64)
}
