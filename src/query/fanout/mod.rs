//! The fan-out reader: every `*.db` in the store directory, opened
//! read-only, filtered in SQL, merged into one stream in
//! `(ts, cpu, seq, ring_epoch)` order (R7: whatever configuration wrote a
//! file, it is read).
//!
//! Events and gaps are two listings, each merged the same way and each
//! with its own cursor and limit. Memory stays bounded: each shard is read
//! in pages of at most [`PAGE_ROWS`] rows per listing, by keyset (the next
//! page starts after the last key read), and a heap per listing holds one
//! head row per shard. A query over S shards holds at most
//! `2 × S × PAGE_ROWS` rows, whatever the number of matching rows.
//!
//! With the daemon's time maps (`store::zones`), a shard is opened only when
//! the merge reaches the earliest time it may hold an event at: files whose
//! maps show nothing before the results are complete are never opened.
//!
//! The parts: `plan` decides, file by file, whether a shard is opened now,
//! later or never; `merge` keeps one head row per shard in a heap and
//! reads each shard's next page; `pool` keeps idle connections between
//! queries and opens a shard read-only.

mod merge;
mod plan;
mod pool;

use self::merge::{Head, Lane};
use self::plan::Pending;
use super::filter::Filter;
use crate::store::rows::{Cursor, EventRow, GapCursor, GapRow};
use crate::store::zones::FileId;
use rusqlite::Connection;
use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use self::pool::ConnectionPool;

/// Rows fetched from one shard at a time, at most. The first page of each
/// shard is small ([`FIRST_PAGE_ROWS`]) and pages double from there: a
/// query that wants 100 rows of 16 shards mostly needs each shard's first
/// row only (stripes keep runs of events in one shard).
pub const PAGE_ROWS: usize = 256;
pub const FIRST_PAGE_ROWS: usize = 2;

struct ShardStream {
    path: PathBuf,
    conn: Connection,
    events: Lane<EventRow, Cursor>,
    /// Started by the first [`FanOut::next_gap`]: a query that never asks
    /// for gaps never reads the gaps table.
    gaps: Lane<GapRow, GapCursor>,
    /// Only rows with `id <= id_max` (a follow query's snapshot).
    id_max: Option<i64>,
    /// The file's identity when opened (for the connection pool).
    file: Option<FileId>,
}

/// A running query over every shard.
pub struct FanOut {
    shards: Vec<ShardStream>,
    /// One head event per shard that has one left.
    heap: BinaryHeap<Head<Cursor>>,
    /// One head gap per shard, once gaps were asked for.
    gap_heap: BinaryHeap<Head<GapCursor>>,
    gaps_started: bool,
    filter: Filter,
    where_sql: String,
    params: Vec<rusqlite::types::Value>,
    returned: u64,
    gaps_returned: u64,
    /// Where the connections go back when the query ends.
    pool: Option<Arc<ConnectionPool>>,
    /// Files not opened yet whose time maps say when their next event may
    /// come, the soonest in the listing's order last: each is opened once
    /// the merge reaches that time (see `store::zones`).
    pending: Vec<Pending>,
    /// Files with gaps and no event the query can reach: opened by the
    /// first [`FanOut::next_gap`].
    gaps_pending: Vec<Pending>,
    /// Database files in the store when the query began.
    listed: usize,
    /// Shards that could not be read (named), beside the results.
    pub warnings: Vec<String>,
    /// Of those, the ones whose error says the file itself is damaged
    /// (corrupt pages, not a database, shorter than its pages): the query
    /// server reports them so their writers move on (see
    /// `store::StoreHealth`).
    pub damaged: Vec<(PathBuf, String)>,
}

impl Drop for FanOut {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            for s in self.shards.drain(..) {
                pool.give_back(s.path, s.file, s.conn);
            }
        }
    }
}

impl FanOut {
    /// Opens every `*.db` in `store_dir`. A file that cannot be opened is
    /// named in `warnings`; the others answer. With `bounds`, each shard
    /// only lists rows up to its id there (shards not in it: none).
    pub fn open(
        store_dir: &Path,
        filter: Filter,
        bounds: Option<&HashMap<PathBuf, i64>>,
    ) -> std::io::Result<FanOut> {
        Self::open_pooled(store_dir, filter, bounds, None, None)
    }

    /// Database files in the store when the query began (those it opened,
    /// and those their time maps let it leave alone).
    pub fn shard_count(&self) -> usize {
        self.listed
    }

    /// Databases opened so far.
    pub fn opened(&self) -> usize {
        self.shards.len()
    }

    /// The next event in order, or `None` at the end (or the limit).
    pub fn next_event(&mut self) -> Option<EventRow> {
        if self.filter.limit.is_some_and(|l| self.returned >= l) {
            return None;
        }
        self.open_due();
        let head = self.heap.pop()?;
        let row = self.shards[head.shard].events.rows.pop_front()?;
        self.refill(head.shard);
        self.returned += 1;
        Some(row)
    }

    /// The next gap whose time span meets the query's window (and cpu, if
    /// given), in `(detected_at, cpu, from_seq, ring_epoch)` order (newest
    /// first with
    /// [`Order::NewestFirst`](super::filter::Order::NewestFirst)), after
    /// `gaps_after`; `None` at the end or at the limit. Gaps are merged
    /// across shards like events: one page per shard in memory at most.
    pub fn next_gap(&mut self) -> Option<GapRow> {
        if !self.gaps_started {
            self.gaps_started = true;
            for i in 0..self.shards.len() {
                self.refill_gaps(i);
            }
            // Files with gaps not opened for events yet: opened now, with
            // their events too (a later `next_event` still sees them).
            let (with_gaps, rest): (Vec<Pending>, Vec<Pending>) =
                self.pending.drain(..).partition(|p| p.gaps);
            self.pending = rest;
            for p in with_gaps {
                self.open_pending(p);
            }
            for p in std::mem::take(&mut self.gaps_pending) {
                if let Some(i) = self.attach(p.path, p.file, p.id_max, false, true) {
                    self.refill_gaps(i);
                }
            }
        }
        if self.filter.limit.is_some_and(|l| self.gaps_returned >= l) {
            return None;
        }
        let head = self.gap_heap.pop()?;
        let row = self.shards[head.shard].gaps.rows.pop_front()?;
        self.refill_gaps(head.shard);
        self.gaps_returned += 1;
        Some(row)
    }
}

#[cfg(test)]
mod tests;
