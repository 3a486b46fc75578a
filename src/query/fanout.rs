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

use super::filter::{Filter, Order};
use crate::store::rows::{Cursor, EventRow, GapCursor, GapRow, EVENT_COLUMNS, GAP_COLUMNS};
use crate::store::zones::{FileId, Plan, TimeMap, ZoneMaps};
use rusqlite::OpenFlags;
use rusqlite::{Connection, ToSql};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows fetched from one shard at a time, at most. The first page of each
/// shard is small ([`FIRST_PAGE_ROWS`]) and pages double from there: a
/// query that wants 100 rows of 16 shards mostly needs each shard's first
/// row only (stripes keep runs of events in one shard).
pub const PAGE_ROWS: usize = 256;
pub const FIRST_PAGE_ROWS: usize = 2;

/// One shard's rows of one listing (events or gaps), read a page at a time.
struct Lane<R, K> {
    /// Rows fetched and not yet returned: at most one page ([`PAGE_ROWS`]).
    rows: VecDeque<R>,
    /// Key of the last row fetched (the next page starts after it).
    last: Option<K>,
    /// Rows the next page asks for.
    page: usize,
    exhausted: bool,
}

impl<R, K> Lane<R, K> {
    fn new(after: Option<K>) -> Self {
        Lane {
            rows: VecDeque::new(),
            last: after,
            page: FIRST_PAGE_ROWS,
            exhausted: false,
        }
    }

    /// Takes a fetched page: `asked` rows were asked for, so fewer means
    /// the shard has no more.
    fn take_page(&mut self, rows: Vec<R>, asked: usize, key: impl Fn(&R) -> K) {
        debug_assert!(rows.len() <= asked && asked <= PAGE_ROWS);
        if rows.len() < asked {
            self.exhausted = true;
        }
        self.last = rows.last().map(key).or(self.last.take());
        self.rows.extend(rows);
        self.page = (self.page * 2).min(PAGE_ROWS);
    }
}

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

/// A file the query has not opened yet (see [`FanOut::pending`]).
struct Pending {
    path: PathBuf,
    file: Option<FileId>,
    id_max: Option<i64>,
    /// The time of its next event at the soonest, in the listing's order.
    at: i64,
    /// Whether it has gap rows.
    gaps: bool,
}

/// A shard's head row in a merge heap, ordered so that the heap's top is
/// the next row to return.
struct Head<K> {
    key: K,
    shard: usize,
    newest_first: bool,
}

impl<K: Ord> PartialEq for Head<K> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.shard == other.shard
    }
}
impl<K: Ord> Eq for Head<K> {}
impl<K: Ord> PartialOrd for Head<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<K: Ord> Ord for Head<K> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let by_key = if self.newest_first {
            self.key.cmp(&other.key)
        } else {
            other.key.cmp(&self.key)
        };
        by_key.then(other.shard.cmp(&self.shard))
    }
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
    fn take(&self, path: &Path, id: Option<FileId>) -> Option<Connection> {
        let id = id?;
        let mut idle = self.lock();
        let list = idle.get_mut(path)?;
        list.retain(|(kept, _)| *kept == id);
        list.pop().map(|(_, conn)| conn)
    }

    fn give_back(&self, path: PathBuf, id: Option<FileId>, conn: Connection) {
        let Some(id) = id else { return };
        let mut idle = self.lock();
        let list = idle.entry(path).or_default();
        if list.len() < self.per_database {
            list.push((id, conn));
        }
    }

    /// Forgets connections to files no longer in the store.
    fn retain(&self, paths: &[PathBuf]) {
        let present: std::collections::HashSet<&PathBuf> = paths.iter().collect();
        self.lock().retain(|p, _| present.contains(p));
    }

    /// Idle connections kept now.
    pub fn idle(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
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

    /// Like [`open`](Self::open), taking connections from `pool` and giving
    /// them back when the query is dropped. With `zones` (the daemon's time
    /// maps), a file is opened only once the merge reaches the earliest
    /// time it may hold an event at (files it knows nothing of are opened
    /// at once, and their maps read into it).
    pub fn open_pooled(
        store_dir: &Path,
        filter: Filter,
        bounds: Option<&HashMap<PathBuf, i64>>,
        pool: Option<Arc<ConnectionPool>>,
        zones: Option<&ZoneMaps>,
    ) -> std::io::Result<FanOut> {
        let (paths, ids): (Vec<PathBuf>, Vec<Option<FileId>>) =
            crate::store::list_database_files(store_dir)
                .map_err(std::io::Error::other)?
                .into_iter()
                .map(|(p, id)| (p, Some(id)))
                .unzip();
        if let Some(pool) = &pool {
            pool.retain(&paths);
        }
        let sql = filter.sql();
        let mut fan = FanOut {
            shards: Vec::new(),
            heap: BinaryHeap::new(),
            gap_heap: BinaryHeap::new(),
            gaps_started: false,
            filter,
            where_sql: sql.clause,
            params: sql.params,
            returned: 0,
            gaps_returned: 0,
            pool,
            pending: Vec::new(),
            gaps_pending: Vec::new(),
            listed: paths.len(),
            warnings: Vec::new(),
            damaged: Vec::new(),
        };
        let plans = match zones {
            Some(z) => {
                let files: Vec<(&Path, Option<FileId>)> = paths
                    .iter()
                    .map(PathBuf::as_path)
                    .zip(ids.iter().copied())
                    .collect();
                z.plan(&files, |m| next_in(&fan.filter, m))
            }
            None => vec![Plan::Unknown; paths.len()],
        };
        for ((path, file), plan) in paths.into_iter().zip(ids).zip(plans) {
            let id_max = bounds.map(|b| b.get(&path).copied().unwrap_or(0));
            match plan {
                Plan::Unknown => {
                    let Some(i) = fan.attach(path, file, id_max, true, true) else {
                        continue;
                    };
                    if let Some(z) = zones {
                        let s = &fan.shards[i];
                        if !z.knows(&s.path, s.file) {
                            match crate::store::zones::load(&s.conn, &s.path) {
                                Ok(loaded) => z.learn(&s.path, loaded),
                                Err(_) => z.unreadable(&s.path),
                            }
                        }
                    }
                }
                // Nothing in it the query can list.
                Plan::Known {
                    next: None,
                    gaps: false,
                } => {}
                Plan::Known { next, gaps } => {
                    let p = Pending {
                        path,
                        file,
                        id_max,
                        at: next.unwrap_or_default(),
                        gaps,
                    };
                    match next {
                        Some(_) => fan.pending.push(p),
                        None => fan.gaps_pending.push(p),
                    }
                }
            }
        }
        // The soonest last.
        match fan.filter.order {
            Order::OldestFirst => fan.pending.sort_by_key(|p| std::cmp::Reverse(p.at)),
            Order::NewestFirst => fan.pending.sort_by_key(|p| p.at),
        }
        for i in 0..fan.shards.len() {
            fan.refill(i);
        }
        Ok(fan)
    }

    /// Opens `path` for the query (a connection from the pool if one is
    /// kept): its index among the shards, or `None` if it cannot be read
    /// (named in the warnings) or is not an event database. `events` and
    /// `gaps` say which listings it takes part in.
    fn attach(
        &mut self,
        path: PathBuf,
        file: Option<FileId>,
        id_max: Option<i64>,
        events: bool,
        gaps: bool,
    ) -> Option<usize> {
        // A kept connection was checked when it was opened.
        let kept = self.pool.as_ref().and_then(|p| p.take(&path, file));
        let conn = match kept.map_or_else(|| open_event_database(&path), |c| Ok(Some(c))) {
            Ok(Some(conn)) => conn,
            Ok(None) => return None,
            Err(e) => {
                if crate::store::is_damage(&e) {
                    self.damaged.push((path.clone(), e.to_string()));
                }
                self.warnings
                    .push(format!("{}: not read: {e}", path.display()));
                return None;
            }
        };
        let mut stream = ShardStream {
            id_max,
            file,
            path,
            conn,
            events: Lane::new(self.filter.after),
            gaps: Lane::new(self.filter.gaps_after),
        };
        stream.events.exhausted = !events;
        stream.gaps.exhausted = !gaps;
        self.shards.push(stream);
        Some(self.shards.len() - 1)
    }

    /// Opens the pending files whose next event may come before (or with)
    /// the merge's next row: after this, no file left unopened can hold a
    /// row that belongs before the heap's top.
    fn open_due(&mut self) {
        while let Some(p) = self.pending.last() {
            let due = match self.heap.peek() {
                None => true,
                Some(top) => match self.filter.order {
                    Order::OldestFirst => p.at <= top.key.ts,
                    Order::NewestFirst => p.at >= top.key.ts,
                },
            };
            if !due {
                break;
            }
            let Some(p) = self.pending.pop() else { break };
            self.open_pending(p);
        }
    }

    fn open_pending(&mut self, p: Pending) {
        if let Some(i) = self.attach(p.path, p.file, p.id_max, true, p.gaps) {
            self.refill(i);
            if self.gaps_started {
                self.refill_gaps(i);
            }
        }
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
    /// first with [`Order::NewestFirst`]), after `gaps_after`; `None` at
    /// the end or at the limit. Gaps are merged across shards like events:
    /// one page per shard in memory at most.
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

    /// Puts shard `i`'s next event in the heap, fetching a page if needed.
    fn refill(&mut self, i: usize) {
        let lane = &self.shards[i].events;
        if lane.rows.is_empty() && !lane.exhausted {
            if let Err(e) = self.fetch_page(i) {
                let s = &mut self.shards[i];
                s.events.exhausted = true;
                if crate::store::is_damage(&e) {
                    self.damaged.push((s.path.clone(), e.to_string()));
                }
                self.warnings
                    .push(format!("{}: stopped answering: {e}", s.path.display()));
            }
        }
        let newest_first = self.filter.order == Order::NewestFirst;
        if let Some(row) = self.shards[i].events.rows.front() {
            self.heap.push(Head {
                key: row.cursor(),
                shard: i,
                newest_first,
            });
        }
    }

    /// Puts shard `i`'s next gap in the gap heap, fetching a page if needed.
    fn refill_gaps(&mut self, i: usize) {
        let lane = &self.shards[i].gaps;
        if lane.rows.is_empty() && !lane.exhausted {
            if let Err(e) = self.fetch_gap_page(i) {
                let s = &mut self.shards[i];
                s.gaps.exhausted = true;
                if crate::store::is_damage(&e) {
                    self.damaged.push((s.path.clone(), e.to_string()));
                }
                self.warnings
                    .push(format!("{}: gaps not read: {e}", s.path.display()));
            }
        }
        let newest_first = self.filter.order == Order::NewestFirst;
        if let Some(row) = self.shards[i].gaps.rows.front() {
            self.gap_heap.push(Head {
                key: row.cursor(),
                shard: i,
                newest_first,
            });
        }
    }

    /// Rows the next page of a lane asks for: its page size, but never more
    /// than the query still wants (at least 1).
    fn page_rows(&self, page: usize, returned: u64) -> usize {
        let left = self
            .filter
            .limit
            .map_or(u64::MAX, |l| l.saturating_sub(returned));
        (page as u64).min(left.max(1)) as usize
    }

    /// The statement and parameters of shard `i`'s next page of `rows`
    /// events.
    fn events_page_sql(&self, i: usize, rows: usize) -> (String, Vec<rusqlite::types::Value>) {
        use rusqlite::types::Value;
        let (cmp, dir) = match self.filter.order {
            Order::OldestFirst => (">", "ASC"),
            Order::NewestFirst => ("<", "DESC"),
        };
        let s = &self.shards[i];
        let mut params = self.params.clone();
        let bound = match s.id_max {
            Some(m) => {
                params.push(Value::Integer(m));
                format!(" AND id <= ?{}", params.len())
            }
            None => String::new(),
        };
        let keyset = match &s.events.last {
            Some(c) => {
                let n = params.len();
                params.extend(
                    [c.ts, i64::from(c.cpu), c.seq as i64, c.ring_epoch].map(Value::Integer),
                );
                // The plain `ts` bound lets SQLite range-scan the ts index;
                // the row value then picks up exactly after the cursor.
                format!(
                    " AND ts {cmp}= ?{a} AND (ts, cpu, seq, ring_epoch) {cmp} (?{a}, ?{}, ?{}, ?{})",
                    n + 2,
                    n + 3,
                    n + 4,
                    a = n + 1
                )
            }
            None if self.filter.since_ns.is_none() && self.filter.until_ns.is_none() => {
                // With no bound on `ts` at all, SQLite's planner reads the
                // whole table and sorts what matches (it cannot know the
                // limit is small): a first page over 6 million rows took
                // 20-30 s for a common provider or `--level err`. A bound
                // every row meets makes it walk an index in time order
                // (`events_ts`, or a query index on (key, ts)) and stop at
                // the limit.
                params.push(Value::Integer(i64::MIN));
                format!(" AND ts >= ?{}", params.len())
            }
            None => String::new(),
        };
        params.push(Value::Integer(rows as i64));
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE {}{bound}{keyset} \
             ORDER BY ts {dir}, cpu {dir}, seq {dir}, ring_epoch {dir} LIMIT ?{}",
            self.where_sql,
            params.len()
        );
        (sql, params)
    }

    fn fetch_page(&mut self, i: usize) -> rusqlite::Result<()> {
        let page = self.page_rows(self.shards[i].events.page, self.returned);
        let (sql, params) = self.events_page_sql(i, page);
        let s = &mut self.shards[i];
        let mut stmt = s.conn.prepare_cached(&sql)?;
        let rows = stmt
            .query_map(
                rusqlite::params_from_iter(params.iter()),
                EventRow::from_row,
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        s.events.take_page(rows, page, EventRow::cursor);
        Ok(())
    }

    /// The next page of shard `i`'s gaps: those detected at or after
    /// `since_ns` whose last event before them is before `until_ns` (their
    /// span meets the window), keyset-paged on the `gaps_detected_at`
    /// index in `(detected_at, cpu, from_seq, ring_epoch)` order.
    fn fetch_gap_page(&mut self, i: usize) -> rusqlite::Result<()> {
        let (cmp, dir) = match self.filter.order {
            Order::OldestFirst => (">", "ASC"),
            Order::NewestFirst => ("<", "DESC"),
        };
        let page = self.page_rows(self.shards[i].gaps.page, self.gaps_returned);
        let s = &mut self.shards[i];
        let since = self.filter.since_ns.unwrap_or(i64::MIN);
        let until = self.filter.until_ns.unwrap_or(i64::MAX);
        let cpu = self.filter.cpu.map(i64::from);
        let limit = page as i64;
        let mut params: Vec<&dyn ToSql> = vec![&since, &until, &cpu, &limit];
        let after;
        let keyset = match &s.gaps.last {
            Some(g) => {
                after = [
                    g.detected_at,
                    i64::from(g.cpu),
                    g.from_seq as i64,
                    g.ring_epoch,
                ];
                for v in &after {
                    params.push(v);
                }
                // As for events: the plain bound for the index, the row
                // value for the exact place.
                format!(
                    " AND detected_at {cmp}= ?5 \
                     AND (detected_at, cpu, from_seq, ring_epoch) {cmp} (?5, ?6, ?7, ?8)"
                )
            }
            None => String::new(),
        };
        let sql = format!(
            "SELECT {GAP_COLUMNS} FROM gaps WHERE detected_at >= ?1 AND ts_before < ?2 \
             AND (?3 IS NULL OR cpu = ?3){keyset} \
             ORDER BY detected_at {dir}, cpu {dir}, from_seq {dir}, ring_epoch {dir} LIMIT ?4"
        );
        let mut stmt = s.conn.prepare_cached(&sql)?;
        let rows = stmt
            .query_map(params.as_slice(), GapRow::from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        s.gaps.take_page(rows, page, GapRow::cursor);
        Ok(())
    }
}

/// The time at which a file with map `m` may hold its first event for
/// `filter` (its window, and the cursor it continues after), in the
/// listing's order; `None` if it holds none the query can list.
fn next_in(filter: &Filter, m: &TimeMap) -> Option<i64> {
    let after = filter.after.map(|c| c.ts);
    match filter.order {
        Order::OldestFirst => {
            let from = filter
                .since_ns
                .unwrap_or(i64::MIN)
                .max(after.unwrap_or(i64::MIN));
            m.first_at_or_after(from)
                .filter(|&t| filter.until_ns.is_none_or(|u| t < u))
        }
        Order::NewestFirst => {
            let to = filter
                .until_ns
                .map_or(i64::MAX, |u| u.saturating_sub(1))
                .min(after.unwrap_or(i64::MAX));
            m.last_at_or_before(to)
                .filter(|&t| filter.since_ns.is_none_or(|s| t >= s))
        }
    }
}

/// Page cache of each query connection (KiB): 8 pages of 32 KiB.
const QUERY_CACHE_KIB: i64 = 256;

/// Opens a shard read-only for a query; `None` if the file is a database
/// without an events table (not an event database: nothing to say). The
/// table check is the one statement, and it also proves the file is a
/// database.
fn open_event_database(path: &Path) -> rusqlite::Result<Option<Connection>> {
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
    super::filter::register_functions(&conn)?;
    let has: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'events'",
        [],
        |r| r.get(0),
    )?;
    Ok((has > 0).then_some(conn))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard_with(dir: &Path, name: &str, message: &str) -> PathBuf {
        let path = dir.join(name);
        let conn = crate::store::open_shard(&path).unwrap();
        conn.execute(
            crate::store::rows::INSERT_EVENT,
            rusqlite::params![
                1i64,
                0,
                1i64,
                7i64,
                1,
                1,
                0,
                6,
                "p",
                "n",
                message,
                None::<&str>
            ],
        )
        .unwrap();
        path
    }

    /// SQLite's plan for shard 0's next page of `fan`, one line.
    fn plan(fan: &FanOut) -> String {
        let (sql, params) = fan.events_page_sql(0, 2);
        let conn = &fan.shards[0].conn;
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let lines: Vec<String> = stmt
            .query_map(rusqlite::params_from_iter(params.iter()), |r| r.get(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        lines.join("; ")
    }

    #[test]
    fn every_first_page_walks_an_index_in_time_order_and_never_sorts_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = shard_with(dir.path(), "shard-000.db", "m");
        let conn = crate::store::open_shard(&path).unwrap();
        crate::store::indexes::sync(
            &conn,
            &[
                crate::store::indexes::QueryIndex::Column("provider"),
                crate::store::indexes::QueryIndex::Field("unit".into()),
            ],
            &path,
        )
        .unwrap();
        // One an operator made: `--level` must not read it (a range of
        // levels comes out of it unordered, and is sorted whole).
        conn.execute_batch("CREATE INDEX by_hand_level ON events (level, ts)")
            .unwrap();
        // Rows, so that SQLite's estimates are not those of an empty table.
        for i in 0..2000i64 {
            conn.execute(
                crate::store::rows::INSERT_EVENT,
                rusqlite::params![
                    i,
                    i % 4,
                    i,
                    7i64,
                    1,
                    1,
                    0,
                    i % 8,
                    "p",
                    "n",
                    "m",
                    None::<&str>
                ],
            )
            .unwrap();
        }
        let cases: Vec<(Filter, &str)> = vec![
            (Filter::default(), "events_ts"),
            (
                Filter {
                    name: Some("n".into()),
                    ..Filter::default()
                },
                "events_ts",
            ),
            (
                Filter {
                    level: Some(3),
                    ..Filter::default()
                },
                "events_ts",
            ),
            (
                Filter {
                    text: Some("disk".into()),
                    ..Filter::default()
                },
                "events_ts",
            ),
            (
                Filter {
                    provider: Some("p".into()),
                    ..Filter::default()
                },
                "events_by_provider",
            ),
            (
                Filter {
                    fields: vec![("unit".into(), "sda".into())],
                    ..Filter::default()
                },
                "events_by_field_756e6974",
            ),
            (
                Filter {
                    provider: Some("p".into()),
                    since_ns: Some(5),
                    until_ns: Some(9),
                    ..Filter::default()
                },
                "events_by_provider",
            ),
        ];
        for (filter, index) in cases {
            for order in [Order::OldestFirst, Order::NewestFirst] {
                let f = Filter {
                    order,
                    ..filter.clone()
                };
                let fan = FanOut::open(dir.path(), f.clone(), None).unwrap();
                let plan = plan(&fan);
                assert!(
                    plan.contains(&format!("USING INDEX {index} ")),
                    "{f:?}: {plan}"
                );
                assert!(!plan.contains("SCAN events"), "{f:?}: {plan}");
                assert!(!plan.contains("FOR ORDER BY"), "{f:?}: {plan}");
            }
        }
    }

    fn messages(dir: &Path, pool: &Arc<ConnectionPool>) -> Vec<String> {
        let mut fan =
            FanOut::open_pooled(dir, Filter::default(), None, Some(pool.clone()), None).unwrap();
        std::iter::from_fn(|| fan.next_event().map(|e| e.message)).collect()
    }

    #[test]
    fn pooled_connections_are_reused_but_never_for_a_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let path = shard_with(dir.path(), "shard-000.db", "old");
        let pool = Arc::new(ConnectionPool::new(2));
        assert_eq!(messages(dir.path(), &pool), ["old"]);
        assert_eq!(pool.idle(), 1);
        // Replace the file under the same name (a restore, say).
        let fresh = shard_with(other.path(), "shard-000.db", "new");
        std::fs::rename(&fresh, &path).unwrap();
        assert_eq!(messages(dir.path(), &pool), ["new"]);
        assert_eq!(pool.idle(), 1);
    }

    /// Shards written the way stripes write them (runs of each "cpu"'s
    /// events, one commit and zone row per run, equal timestamps across
    /// shards, gaps in a few), read with and without their time maps: every
    /// query, in both orders, with windows, cursors, limits and a filter,
    /// lists the same events and gaps; and the newest page opens only the
    /// files that hold it.
    #[test]
    fn time_maps_leave_files_unopened_but_change_no_answer() {
        use rand::{Rng, SeedableRng};
        let dir = tempfile::tempdir().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let shards = 12usize;
        let mut conns: Vec<Connection> = (0..shards)
            .map(|j| crate::store::open_shard(&crate::store::shard_path(dir.path(), j)).unwrap())
            .collect();
        let mut all_ts = Vec::new();
        let mut seq = [0i64; 2];
        let mut t = 1_000i64;
        for run in 0..150usize {
            let j = (run * 7 + run / 12) % (shards - 1); // the last shard stays empty
            let cpu = run % 2;
            let tx = conns[j].transaction().unwrap();
            let (mut lo, mut hi) = (i64::MAX, i64::MIN);
            for _ in 0..rng.random_range(1..40) {
                // Often the same time as the event before (another shard's).
                t += rng.random_range(0..3);
                seq[cpu] += 1;
                let provider = if rng.random_range(0..10) == 0 {
                    "rare"
                } else {
                    "p"
                };
                tx.execute(
                    crate::store::rows::INSERT_EVENT,
                    rusqlite::params![
                        t,
                        cpu as i64,
                        seq[cpu],
                        7i64,
                        1,
                        1,
                        0,
                        6,
                        provider,
                        "n",
                        "m",
                        None::<&str>
                    ],
                )
                .unwrap();
                (lo, hi) = (lo.min(t), hi.max(t));
                all_ts.push(t);
            }
            crate::store::zones::record(&tx, lo, hi, tx.last_insert_rowid()).unwrap();
            if run % 37 == 0 {
                let gap = crate::store::rows::NewGap {
                    ring_epoch: 7,
                    cpu: cpu as u32,
                    from_seq: seq[cpu] as u64 + 1,
                    to_seq: seq[cpu] as u64 + 1,
                    lost: 1,
                    reason: "overwritten",
                    ts_before: t,
                    detected_at: t,
                };
                gap.insert(&mut tx.prepare(crate::store::rows::INSERT_GAP).unwrap())
                    .unwrap();
                seq[cpu] += 1;
            }
            tx.commit().unwrap();
            // Often the next run (in another file) starts at the same time.
            if rng.random_range(0..3) > 0 {
                t += rng.random_range(1..200);
            }
        }
        // Every file's map as its writer would load it, but one: a query
        // reads that one's.
        let zones = ZoneMaps::default();
        for (j, conn) in conns.iter().enumerate().skip(1) {
            let path = crate::store::shard_path(dir.path(), j);
            zones.register(&path, Some(crate::store::zones::load(conn, &path).unwrap()));
        }
        let (t_min, t_max) = (all_ts[0], *all_ts.last().unwrap());
        let collect = |f: &Filter, zones: Option<&ZoneMaps>| {
            let mut fan = FanOut::open_pooled(dir.path(), f.clone(), None, None, zones).unwrap();
            let events: Vec<Cursor> =
                std::iter::from_fn(|| fan.next_event().map(|e| e.cursor())).collect();
            let opened = fan.opened();
            let gaps: Vec<GapCursor> =
                std::iter::from_fn(|| fan.next_gap().map(|g| g.cursor())).collect();
            (events, gaps, opened)
        };
        for k in 0..250 {
            let window = |rng: &mut rand::rngs::StdRng| {
                (rng.random_range(0..3) > 0).then(|| rng.random_range(t_min - 5..t_max + 5))
            };
            let mut f = Filter {
                order: if k % 2 == 0 {
                    Order::OldestFirst
                } else {
                    Order::NewestFirst
                },
                since_ns: window(&mut rng),
                until_ns: window(&mut rng),
                limit: (rng.random_range(0..4) > 0).then(|| rng.random_range(1..60)),
                provider: (rng.random_range(0..5) == 0).then(|| "rare".to_string()),
                ..Filter::default()
            };
            let (plain, plain_gaps, _) = collect(&f, None);
            let (mapped, mapped_gaps, _) = collect(&f, Some(&zones));
            assert!(
                mapped == plain,
                "{f:?}: {mapped:?}\nbut read whole: {plain:?}"
            );
            assert!(mapped_gaps == plain_gaps, "{f:?}: gaps differ");
            // The next page, after the last event.
            if let Some(last) = plain.last() {
                f.after = Some(*last);
                let (plain, _, _) = collect(&f, None);
                let (mapped, _, _) = collect(&f, Some(&zones));
                assert!(
                    mapped == plain,
                    "{f:?}: {mapped:?}\nbut read whole: {plain:?}"
                );
            }
        }
        // The 20 newest events are in the newest runs' files; the file with
        // no map is opened too (and its map learnt for the next query).
        // (Counted before the gaps: those are read from every file that
        // has any.)
        let newest = Filter {
            order: Order::NewestFirst,
            limit: Some(20),
            ..Filter::default()
        };
        let (_, _, first) = collect(&newest, Some(&zones));
        let (_, _, again) = collect(&newest, Some(&zones));
        assert!(first <= 4, "{first} of {shards} files opened");
        assert!(again < first || again <= 3, "{again} then");
        let (_, _, all) = collect(&newest, None);
        assert_eq!(all, shards);
    }

    /// Pages of `limit` gaps, each continuing after the last one's cursor,
    /// over shards whose gaps interleave: every gap once, in order.
    #[test]
    fn gaps_page_through_every_shard_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut want = Vec::new();
        for shard in 0..3i64 {
            let conn =
                crate::store::open_shard(&dir.path().join(format!("shard-00{shard}.db"))).unwrap();
            for k in 0..40i64 {
                // Equal detection times across shards and cpus: the rest of
                // the key decides.
                let (detected_at, cpu, from_seq) = (k / 4, (k + shard) % 3, 10 * k + shard);
                let gap = crate::store::rows::NewGap {
                    ring_epoch: 1,
                    cpu: cpu as u32,
                    from_seq: from_seq as u64,
                    to_seq: from_seq as u64,
                    lost: 1,
                    reason: "overwritten",
                    ts_before: 0,
                    detected_at,
                };
                let mut insert = conn.prepare(crate::store::rows::INSERT_GAP).unwrap();
                gap.insert(&mut insert).unwrap();
                want.push((detected_at, cpu as u32, from_seq as u64));
            }
        }
        want.sort();
        for order in [Order::OldestFirst, Order::NewestFirst] {
            let mut expected = want.clone();
            if order == Order::NewestFirst {
                expected.reverse();
            }
            let mut seen = Vec::new();
            let mut after = None;
            loop {
                let filter = Filter {
                    order,
                    limit: Some(7),
                    gaps_after: after,
                    ..Filter::default()
                };
                let mut fan = FanOut::open(dir.path(), filter, None).unwrap();
                let page: Vec<GapRow> = std::iter::from_fn(|| fan.next_gap()).collect();
                assert!(page.len() <= 7);
                seen.extend(page.iter().map(|g| (g.detected_at, g.cpu, g.from_seq)));
                match page.last() {
                    Some(g) if page.len() == 7 => after = Some(g.cursor()),
                    _ => break,
                }
            }
            assert_eq!(seen, expected, "{order:?}");
        }
    }
}
