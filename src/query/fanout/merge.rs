//! The merge: each shard's rows of a listing read a page at a time by
//! keyset ([`Lane`]), and one head row per shard in a heap ([`Head`]) whose
//! top is the next row to return.

use super::{FanOut, FIRST_PAGE_ROWS, PAGE_ROWS};
use crate::query::filter::Order;
use crate::store::rows::{EventRow, GapRow, EVENT_COLUMNS, GAP_COLUMNS};
use rusqlite::ToSql;
use std::collections::VecDeque;

/// One shard's rows of one listing (events or gaps), read a page at a time.
pub(super) struct Lane<R, K> {
    /// Rows fetched and not yet returned: at most one page ([`PAGE_ROWS`]).
    pub(super) rows: VecDeque<R>,
    /// Key of the last row fetched (the next page starts after it).
    pub(super) last: Option<K>,
    /// Rows the next page asks for.
    pub(super) page: usize,
    pub(super) exhausted: bool,
}

impl<R, K> Lane<R, K> {
    pub(super) fn new(after: Option<K>) -> Self {
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

/// A shard's head row in a merge heap, ordered so that the heap's top is
/// the next row to return.
pub(super) struct Head<K> {
    pub(super) key: K,
    pub(super) shard: usize,
    pub(super) newest_first: bool,
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

impl FanOut {
    /// Puts shard `i`'s next event in the heap, fetching a page if needed.
    pub(super) fn refill(&mut self, i: usize) {
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
    pub(super) fn refill_gaps(&mut self, i: usize) {
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
    pub(super) fn events_page_sql(
        &self,
        i: usize,
        rows: usize,
    ) -> (String, Vec<rusqlite::types::Value>) {
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
