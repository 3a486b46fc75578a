//! Retention's operations on one shard database: measuring it, deleting its
//! oldest rows in bounded transactions, compacting old receipts and giving
//! free pages back to the filesystem.
//!
//! The retention coordinator decides what to delete; these functions run on
//! the connection of the database's only writer (R8): the shard writer's own
//! for an active shard, the coordinator's for a historical one.
//!
//! What is deleted, and what never is:
//! - events older than a cutoff ([`Older`]: committed before it by eventd's
//!   reckoning for the age limit, stamped before it for the size limit),
//!   oldest first, at most a given number per transaction, so that the
//!   writer's commits and the queries' reads go on between two
//!   transactions;
//! - gaps older than the cutoff;
//! - receipts of ring epochs whose ring no longer exists, older than the
//!   cutoff;
//! - receipts of live rings are never deleted outright: old ones are
//!   replaced by one summary row that recovery reads exactly as it read the
//!   rows it replaces (see [`compact_receipts`]).

use super::{marks, reckoning};
use crate::store::rows::{Receipt, INSERT_RECEIPT};
use rusqlite::{params, Connection, OptionalExtension, Transaction};

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

/// What one [`trim`] transaction deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    pub events: u64,
    /// Payload bytes of the deleted events (provider, name, message, fields).
    pub event_bytes: u64,
    /// Of `events`, those the export stage had not sent yet (a forced
    /// deletion; each is counted in an `unexported` gap row).
    pub unexported: u64,
    pub gaps: u64,
    pub receipts: u64,
    /// Rows older than the cutoff are left: call again.
    pub more: bool,
}

/// How far the export stage has got in one shard file: every row with an
/// id at or below these is in the cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exported {
    pub events: i64,
    pub gaps: i64,
}

/// What a [`trim`] must leave for the export stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    /// `None`: export is off, every old row may go.
    pub exported: Option<Exported>,
    /// The size limit forces the deletion: old events not exported yet go
    /// too, and their loss is stored as `unexported` gap rows (which the
    /// export stage sends like any gap). Without it, such events stay
    /// until they are exported. Gaps not exported yet always stay.
    pub forced: bool,
}

/// The `reason` of the gap rows a forced deletion of events not exported
/// yet leaves (see [`Keep::forced`]).
pub const UNEXPORTED_REASON: &str = "unexported";

/// Which rows a [`trim`] deletes: those older than a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Older {
    /// Committed before this time by eventd's reckoning ([`marks`]): the
    /// age limit. Neither a producer's clock (`events.ts`) nor a step of
    /// the wall clock decides. Deleted in commit order (by id).
    Committed(i64),
    /// Stamped before this time by their own column (`events.ts`,
    /// `gaps.detected_at`, `receipts.committed_at`): the size limit, which
    /// takes the events with the oldest timestamps first.
    Stamped(i64),
}

/// [`Older`] as each table's condition on `?1`.
struct Rule {
    by_id: bool,
    events: i64,
    gaps: i64,
    receipts: i64,
}

impl Older {
    fn rule(self, tx: &Transaction<'_>) -> rusqlite::Result<Rule> {
        Ok(match self {
            Older::Committed(before_ns) => {
                // Rows committed since the newest mark get one now.
                marks::cover(tx, reckoning::now_ns())?;
                let t = marks::through(tx, before_ns)?;
                Rule {
                    by_id: true,
                    events: t.events,
                    gaps: t.gaps,
                    receipts: t.receipts,
                }
            }
            Older::Stamped(before_ns) => Rule {
                by_id: false,
                events: before_ns,
                gaps: before_ns,
                receipts: before_ns,
            },
        })
    }
}

impl Rule {
    /// The condition on `?1` and the order, for a table whose own time
    /// column is `time`.
    fn sql(&self, time: &'static str) -> (String, &'static str) {
        if self.by_id {
            ("id <= ?1".to_string(), "id")
        } else {
            (format!("{time} < ?1"), time)
        }
    }
}

/// Deletes, in one transaction, at most `max_rows` of the oldest events
/// that are `older`; once none are left, the gaps and the receipts of
/// epochs not in `live_epochs` that are `older` (at most `max_rows` of
/// each; no receipt at all when `live_epochs` is `None`, that is, when the
/// rings that exist are not all known). What `keep` says stays (see
/// [`Keep`]). A trim by commit time first gives the rows no mark covers
/// yet a mark at this moment ([`marks::cover`]); once it has nothing more
/// to delete, the marks older than its time are folded into one
/// ([`marks::fold`]).
///
/// The row with the highest id of `events` and of `gaps` is never deleted:
/// SQLite gives a new row the highest id plus one, so with that row kept
/// an id is never used twice, and a reader that remembers an id (the
/// export stage, a follow) never mistakes a new row for one it has seen.
pub fn trim(
    conn: &mut Connection,
    older: Older,
    max_rows: u64,
    live_epochs: Option<&[u64]>,
    keep: Keep,
) -> rusqlite::Result<Trimmed> {
    let limit = max_rows.max(1) as i64;
    // Exported through: i64::MAX when export is off.
    let (events_through, gaps_through) = keep
        .exported
        .map_or((i64::MAX, i64::MAX), |e| (e.events, e.gaps));
    let events_floor = if keep.forced {
        i64::MAX
    } else {
        events_through
    };
    let tx = conn.transaction()?;
    let rule = older.rule(&tx)?;
    let mut done = Trimmed::default();
    let (old, order) = rule.sql("ts");
    let batch = format!(
        "SELECT * FROM events WHERE {old} AND id <= ?3 \
         AND id < (SELECT max(id) FROM events) ORDER BY {order} LIMIT ?2"
    );
    let args = params![rule.events, limit, events_floor];
    let (events, bytes): (i64, Option<i64>) = tx.query_row(
        &format!(
            "SELECT count(*), sum(length(CAST(provider AS BLOB)) + length(CAST(name AS BLOB)) \
             + length(CAST(message AS BLOB)) + ifnull(length(CAST(fields AS BLOB)), 0)) \
             FROM ({batch})"
        ),
        args,
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if events > 0 {
        if keep.forced && keep.exported.is_some() {
            done.unexported = record_unexported(&tx, &batch, args, events_through)?;
        }
        uncount_rings(&tx, &batch, args)?;
        done.events = tx.execute(
            &format!("DELETE FROM events WHERE id IN (SELECT id FROM ({batch}))"),
            args,
        )? as u64;
        done.event_bytes = bytes.unwrap_or(0) as u64;
        crate::store::zones::trim(&tx)?;
    }
    if done.events as i64 == limit {
        done.more = true;
    } else {
        let (old, order) = rule.sql("detected_at");
        done.gaps = tx.execute(
            &format!(
                "DELETE FROM gaps WHERE id IN (SELECT id FROM gaps WHERE {old} \
                 AND id <= ?3 AND id < (SELECT max(id) FROM gaps) ORDER BY {order} LIMIT ?2)"
            ),
            params![rule.gaps, limit, gaps_through],
        )? as u64;
        if let Some(live) = live_epochs {
            done.receipts = delete_dead_receipts(&tx, &rule, limit, live)? as u64;
        }
        done.more = done.gaps as i64 == limit || done.receipts as i64 == limit;
        if let (Older::Committed(before_ns), false) = (older, done.more) {
            marks::fold(&tx, before_ns)?;
        }
    }
    tx.commit()?;
    Ok(done)
}

/// Stores one `unexported` gap row per ring epoch and cpu for the events of
/// `batch` with ids above `through` (about to be deleted unexported): their
/// count as `lost`, their lowest and highest sequence numbers, the oldest
/// timestamp as `ts_before`. Returns how many events that covers.
fn record_unexported(
    tx: &Transaction<'_>,
    batch: &str,
    args: &[&dyn rusqlite::ToSql],
    through: i64,
) -> rusqlite::Result<u64> {
    let now = crate::rings::now_ns();
    let lost: i64 = tx.query_row(
        &format!("SELECT count(*) FROM ({batch}) WHERE id > {through}"),
        args,
        |r| r.get(0),
    )?;
    if lost > 0 {
        tx.execute(
            &format!(
                "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, \
                 detected_at) SELECT ring_epoch, cpu, min(seq), max(seq), count(*), \
                 '{UNEXPORTED_REASON}', min(ts), {now} FROM ({batch}) WHERE id > {through} \
                 GROUP BY ring_epoch, cpu"
            ),
            args,
        )?;
        // The new gap rows are committed now.
        marks::record(tx, reckoning::now_ns())?;
    }
    Ok(lost as u64)
}

/// Takes the events of `batch`, about to be deleted, off the file's ring
/// counts (`store::schema::ring_counts`), in the same transaction.
fn uncount_rings(
    tx: &Transaction<'_>,
    batch: &str,
    args: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare(&format!(
        "SELECT ring_epoch, cpu, count(*) FROM ({batch}) GROUP BY ring_epoch, cpu"
    ))?;
    let rings = stmt
        .query_map(args, |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, u32>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (ring_epoch, cpu, n) in rings {
        crate::store::schema::count_ring_events(tx, ring_epoch, cpu, -n, 0, 0)?;
    }
    Ok(())
}

fn delete_dead_receipts(
    tx: &Transaction<'_>,
    rule: &Rule,
    limit: i64,
    live_epochs: &[u64],
) -> rusqlite::Result<usize> {
    // Epochs are stored as the i64 with the same bits.
    let live: Vec<i64> = live_epochs.iter().map(|&e| e as i64).collect();
    let live = serde_json::to_string(&live).unwrap_or_else(|_| "[]".to_string());
    let (old, order) = rule.sql("committed_at");
    tx.execute(
        &format!(
            "DELETE FROM receipts WHERE id IN (SELECT id FROM receipts \
             WHERE {old} AND ring_epoch NOT IN (SELECT value FROM json_each(?3)) \
             ORDER BY {order} LIMIT ?2)"
        ),
        params![rule.receipts, limit, live],
    )
}

/// Replaces up to `max_rows` receipts of live ring `epoch` (those ending
/// first) by a single summary row, when at least `min_rows` qualify. A
/// receipt qualifies when its id is at most `old_through` (the commit
/// marks say which receipts were committed minutes ago, by eventd's
/// reckoning: [`marks::through`]) and it ends below `W`, the highest
/// watermark among this database's receipts up to `old_through`. Returns
/// how many rows were removed (the summary not counted).
///
/// Why recovery reads the same thing afterwards (`store::recovery`):
/// - With watermarks, it takes the highest `committed_through` (the summary
///   keeps the highest it replaces, so the maximum is unchanged) and reads
///   the receipts with `last_seq` at or above it, none of which were
///   replaced (all of them end below this database's `W`, which is at most
///   the global one).
/// - Merging every receipt (after a power cut), the summary covers from the
///   first replaced sequence to the last: every sequence in between is at or
///   below `W`, so committed in some database, and its run is either in a
///   summary or still a row. The merged coverage is the same. The summary
///   keeps the resume position of the run it ends with.
///
/// `W` must count only commits that survive a power cut. It is taken from
/// receipts committed minutes ago (by eventd's reckoning, which a step of
/// the wall clock does not move), so the commits it counts returned minutes
/// ago and their WAL frames have reached the disk; a younger watermark
/// could count another shard's commit that a power cut then takes back,
/// and the summary would hide that hole.
pub fn compact_receipts(
    conn: &mut Connection,
    epoch: u64,
    old_through: i64,
    min_rows: u64,
    max_rows: u64,
) -> rusqlite::Result<u64> {
    let epoch = epoch as i64;
    let tx = conn.transaction()?;
    let watermark: Option<i64> = tx.query_row(
        "SELECT max(committed_through) FROM receipts WHERE ring_epoch = ?1 AND id <= ?2",
        params![epoch, old_through],
        |r| r.get(0),
    )?;
    let Some(watermark) = watermark else {
        return Ok(0);
    };
    let batch = "SELECT * FROM receipts WHERE ring_epoch = ?1 AND last_seq < ?2 \
                 AND id <= ?3 ORDER BY last_seq LIMIT ?4";
    let args = params![epoch, watermark, old_through, max_rows.max(2) as i64];
    type Summary = (i64, Option<i64>, Option<i64>, Option<i64>, Option<i64>);
    let (rows, cpu, first, last, through): Summary = tx.query_row(
        &format!(
            "SELECT count(*), min(cpu), min(first_seq), max(last_seq), max(committed_through) \
             FROM ({batch})"
        ),
        args,
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
    )?;
    let (Some(cpu), Some(first), Some(last), Some(through)) = (cpu, first, last, through) else {
        return Ok(0);
    };
    if (rows as u64) < min_rows.max(2) {
        return Ok(0);
    }
    let (position, next_seq, committed_at): (i64, i64, i64) = tx.query_row(
        &format!(
            "SELECT position, next_seq, committed_at FROM ({batch}) ORDER BY last_seq DESC LIMIT 1"
        ),
        args,
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let removed = tx.execute(
        &format!("DELETE FROM receipts WHERE id IN (SELECT id FROM ({batch}))"),
        args,
    )?;
    let summary = Receipt {
        ring_epoch: epoch as u64,
        cpu: cpu as u32,
        first_seq: first as u64,
        last_seq: last as u64,
        position: position as u64,
        next_seq: next_seq as u64,
        committed_through: through as u64,
        committed_at,
    };
    let mut insert = tx.prepare_cached(INSERT_RECEIPT)?;
    summary.insert(&mut insert)?;
    drop(insert);
    // The summary row is committed now.
    marks::record(&tx, reckoning::now_ns())?;
    tx.commit()?;
    Ok(removed as u64)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{open_shard, shard_path};

    fn insert_event(conn: &Connection, ts: i64, epoch: u64, seq: u64) {
        conn.execute(
            crate::store::rows::INSERT_EVENT,
            params![
                ts,
                0,
                seq as i64,
                epoch as i64,
                1,
                1,
                0,
                6,
                "p",
                "n",
                "hello",
                None::<String>
            ],
        )
        .unwrap();
    }

    fn insert_receipt(conn: &Connection, epoch: u64, first: u64, last: u64, through: u64, at: i64) {
        let receipt = Receipt {
            ring_epoch: epoch,
            cpu: 0,
            first_seq: first,
            last_seq: last,
            position: last * 10,
            next_seq: last + 1,
            committed_through: through,
            committed_at: at,
        };
        receipt
            .insert(&mut conn.prepare(INSERT_RECEIPT).unwrap())
            .unwrap();
        // Committed at "time" `at`, a minute apart each, by the marks.
        marks::record(conn, at * marks::MARK_NS).unwrap();
    }

    /// The receipts committed before "time" `at` (see `insert_receipt`).
    fn receipts_before(conn: &Connection, at: i64) -> i64 {
        marks::through(conn, at * marks::MARK_NS).unwrap().receipts
    }

    fn count(conn: &Connection, sql: &str) -> i64 {
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn trim_deletes_oldest_first_in_bounded_batches_and_never_newer_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open_shard(&shard_path(dir.path(), 0)).unwrap();
        for i in 0..100 {
            // Inserted out of order: deletion follows ts, not id.
            insert_event(&conn, (i * 37) % 100, 1, i as u64 + 1);
        }
        let first = trim(
            &mut conn,
            Older::Stamped(50),
            20,
            Some(&[1]),
            Keep::default(),
        )
        .unwrap();
        assert_eq!(
            (first.events, first.event_bytes, first.more),
            (20, 20 * 7, true)
        );
        assert_eq!(count(&conn, "SELECT min(ts) FROM events"), 20);
        let mut sizes = vec![first.events];
        loop {
            let t = trim(
                &mut conn,
                Older::Stamped(50),
                20,
                Some(&[1]),
                Keep::default(),
            )
            .unwrap();
            sizes.push(t.events);
            if !t.more {
                break;
            }
        }
        assert_eq!(sizes, [20, 20, 10], "50 events in batches of 20");
        assert_eq!(count(&conn, "SELECT count(*) FROM events"), 50);
        assert_eq!(count(&conn, "SELECT min(ts) FROM events"), 50);
    }

    #[test]
    fn measure_and_cutoff_after() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_shard(&shard_path(dir.path(), 0)).unwrap();
        let empty = measure(&conn).unwrap();
        assert_eq!(
            (empty.oldest_ts, empty.newest_ts, empty.events_estimate),
            (None, None, 0)
        );
        assert!(empty.incremental_vacuum, "new shards can give pages back");
        assert_eq!(cutoff_after(&conn, 3).unwrap(), None);
        for seq in 1..=30 {
            // Ten events at ts 5, then 6, 7, ...
            insert_event(&conn, if seq <= 10 { 5 } else { seq as i64 - 5 }, 1, seq);
        }
        let u = measure(&conn).unwrap();
        assert_eq!(
            (u.oldest_ts, u.newest_ts, u.events_estimate),
            (Some(5), Some(25), 30)
        );
        assert!(u.used_bytes() > 0 && u.used_bytes() <= u.pages * u.page_size);
        // The 16th oldest is at ts 11: older than it are exactly 15.
        assert_eq!(cutoff_after(&conn, 15).unwrap(), Some(11));
        assert_eq!(
            cutoff_after(&conn, 3).unwrap(),
            Some(5),
            "ties at the oldest"
        );
        assert_eq!(cutoff_after(&conn, 30).unwrap(), None);
    }

    #[test]
    fn gaps_and_dead_receipts_go_after_the_events_and_live_receipts_stay() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open_shard(&shard_path(dir.path(), 0)).unwrap();
        insert_event(&conn, 10, 1, 1);
        // The newest rows (by id) are never deleted: these two stay.
        insert_event(&conn, 5000, 1, 20);
        conn.execute(
            "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, \
             detected_at) VALUES (1, 0, 2, 3, 2, 'overwritten', 10, 20), \
             (1, 0, 9, 9, 1, 'overwritten', 10, 200), (1, 0, 19, 19, 1, 'overwritten', 10, 5000)",
            [],
        )
        .unwrap();
        insert_receipt(&conn, 1, 1, 3, 0, 30); // live epoch
        insert_receipt(&conn, 2, 1, 5, 0, 30); // dead epoch, old
        insert_receipt(&conn, 2, 6, 9, 5, 300); // dead epoch, recent
        let t = trim(
            &mut conn,
            Older::Stamped(100),
            1,
            Some(&[1]),
            Keep::default(),
        )
        .unwrap();
        assert_eq!((t.events, t.gaps, t.receipts), (1, 0, 0), "events first");
        assert!(t.more);
        let t = trim(
            &mut conn,
            Older::Stamped(100),
            10,
            Some(&[1]),
            Keep::default(),
        )
        .unwrap();
        assert_eq!((t.events, t.gaps, t.receipts, t.more), (0, 1, 1, false));
        assert_eq!(count(&conn, "SELECT count(*) FROM gaps"), 2);
        let left: String = conn
            .query_row(
                "SELECT group_concat(ring_epoch || ':' || first_seq, ' ') FROM \
                 (SELECT * FROM receipts ORDER BY id)",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(left, "1:1 2:6");
        // With the rings that exist unknown, no receipt is deleted.
        let t = trim(&mut conn, Older::Stamped(1000), 10, None, Keep::default()).unwrap();
        assert_eq!((t.receipts, t.gaps), (0, 1));
        assert_eq!(count(&conn, "SELECT count(*) FROM receipts"), 2);
    }

    #[test]
    fn trim_by_commit_time_goes_by_the_marks_not_by_the_event_times() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open_shard(&shard_path(dir.path(), 0)).unwrap();
        let minute = marks::MARK_NS;
        // Minute 1: a producer whose clock is years behind; minute 2: one
        // years ahead, and a gap; minute 3: an ordinary event.
        insert_event(&conn, 5, 1, 1);
        insert_event(&conn, 6, 1, 2);
        marks::record(&conn, minute).unwrap();
        insert_event(&conn, i64::MAX / 2, 1, 3);
        conn.execute(
            "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, \
             detected_at) VALUES (1, 0, 4, 4, 1, 'overwritten', 0, 0), \
             (1, 0, 5, 5, 1, 'overwritten', 0, 0)",
            [],
        )
        .unwrap();
        insert_receipt(&conn, 9, 1, 3, 0, 2);
        insert_event(&conn, 3 * minute, 1, 6);
        marks::record(&conn, 3 * minute).unwrap();
        // Nothing was committed before minute 1, whatever `ts` says.
        let t = trim(
            &mut conn,
            Older::Committed(minute),
            10,
            Some(&[1]),
            Keep::default(),
        )
        .unwrap();
        assert_eq!((t.events, t.gaps, t.receipts), (0, 0, 0));
        // Before minute 2: the two of minute 1, by commit order, in
        // batches.
        let t = trim(
            &mut conn,
            Older::Committed(2 * minute),
            1,
            Some(&[1]),
            Keep::default(),
        )
        .unwrap();
        assert_eq!((t.events, t.more), (1, true));
        let t = trim(
            &mut conn,
            Older::Committed(2 * minute),
            1,
            Some(&[1]),
            Keep::default(),
        )
        .unwrap();
        assert_eq!(t.events, 1);
        assert_eq!(count(&conn, "SELECT min(seq) FROM events"), 3);
        // Before minute 3: the event from the future, the older gap (the
        // newest row of a table stays) and the receipt of dead epoch 9.
        let t = trim(
            &mut conn,
            Older::Committed(3 * minute),
            10,
            Some(&[1]),
            Keep::default(),
        )
        .unwrap();
        assert_eq!((t.events, t.gaps, t.receipts, t.more), (1, 1, 1, false));
        assert_eq!(count(&conn, "SELECT count(*) FROM events"), 1);
        // The old marks were folded into one.
        assert_eq!(
            count(
                &conn,
                "SELECT count(*) FROM commit_marks WHERE committed_at < 3 * 60000000000"
            ),
            1
        );
    }

    #[test]
    fn the_newest_row_stays_so_ids_are_never_used_twice() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open_shard(&shard_path(dir.path(), 0)).unwrap();
        // The newest id has the oldest timestamp.
        insert_event(&conn, 50, 1, 1);
        insert_event(&conn, 40, 1, 2);
        insert_event(&conn, 10, 1, 3);
        let t = trim(
            &mut conn,
            Older::Stamped(i64::MAX),
            100,
            Some(&[1]),
            Keep::default(),
        )
        .unwrap();
        assert_eq!(t.events, 2);
        assert_eq!(count(&conn, "SELECT max(id) FROM events"), 3);
        insert_event(&conn, 60, 1, 4);
        assert_eq!(count(&conn, "SELECT max(id) FROM events"), 4, "a new id");
    }

    #[test]
    fn unexported_rows_stay_unless_forced_and_a_forced_deletion_leaves_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open_shard(&shard_path(dir.path(), 0)).unwrap();
        for seq in 1..=10 {
            // ids 1..=10, ts 10..=100; the last stays as the newest.
            insert_event(&conn, seq as i64 * 10, 7, seq);
        }
        conn.execute(
            "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, \
             detected_at) VALUES (7, 0, 50, 50, 1, 'overwritten', 10, 20), \
             (7, 0, 60, 60, 1, 'overwritten', 10, 30), (7, 0, 70, 70, 1, 'overwritten', 10, 900)",
            [],
        )
        .unwrap();
        let exported = Some(Exported { events: 4, gaps: 1 });
        // By age: only what was exported goes (ids 1..=4; gap 1).
        let t = trim(
            &mut conn,
            Older::Stamped(1000),
            100,
            None,
            Keep {
                exported,
                forced: false,
            },
        )
        .unwrap();
        assert_eq!((t.events, t.unexported, t.gaps), (4, 0, 1));
        assert_eq!(count(&conn, "SELECT min(id) FROM events"), 5);
        // Forced (the size limit): the three oldest go (ids 5..=7, none
        // exported yet), and one gap row counts them.
        let t = trim(
            &mut conn,
            Older::Stamped(80),
            100,
            None,
            Keep {
                exported,
                forced: true,
            },
        )
        .unwrap();
        assert_eq!((t.events, t.unexported), (3, 3));
        let gap: (i64, i64, i64, i64, String, i64) = conn
            .query_row(
                "SELECT ring_epoch, from_seq, to_seq, lost, reason, ts_before FROM gaps \
                 WHERE reason = 'unexported'",
                [],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                },
            )
            .unwrap();
        assert_eq!(gap, (7, 5, 7, 3, UNEXPORTED_REASON.to_string(), 50));
        // The unexported gap (id 2) stays even when forced; the new
        // `unexported` gap is the newest row and stays too.
        let t = trim(
            &mut conn,
            Older::Stamped(1000),
            100,
            None,
            Keep {
                exported,
                forced: true,
            },
        )
        .unwrap();
        assert_eq!((t.events, t.unexported, t.gaps), (2, 2, 0));
        assert_eq!(count(&conn, "SELECT count(*) FROM gaps"), 4);
        assert_eq!(
            count(
                &conn,
                "SELECT sum(lost) FROM gaps WHERE reason = 'unexported'"
            ),
            5
        );
        // Without export, every old row goes but the newest (the
        // `unexported` gaps are detected now: they are not old).
        let t = trim(
            &mut conn,
            Older::Stamped(10_000),
            100,
            None,
            Keep::default(),
        )
        .unwrap();
        assert_eq!(t.gaps, 2);
        assert_eq!(count(&conn, "SELECT count(*) FROM events"), 1);
    }

    #[test]
    fn compacted_receipts_give_recovery_the_same_plan() {
        use crate::store::ReceiptReader;
        let dir = tempfile::tempdir().unwrap();
        // Two shards, stripes of 10: A has the odd stripes, B the even ones.
        let paths = [shard_path(dir.path(), 0), shard_path(dir.path(), 1)];
        let mut conns: Vec<Connection> = paths.iter().map(|p| open_shard(p).unwrap()).collect();
        let mut through = 0;
        for stripe in 0..50u64 {
            let (first, last) = (stripe * 10 + 1, stripe * 10 + 10);
            // Stripe 37 is never committed: recovery resumes there. A
            // receipt's commit time is its stripe number.
            if stripe != 37 {
                insert_receipt(
                    &conns[(stripe % 2) as usize],
                    7,
                    first,
                    last,
                    through,
                    stripe as i64,
                );
                if stripe < 37 {
                    through = last;
                }
            }
        }
        let plan = |trust| {
            let (mut r, left_out) = ReceiptReader::open(&paths, trust);
            assert!(left_out.is_empty(), "{left_out:?}");
            let (plan, failed) = r.plan(7);
            assert!(failed.is_empty(), "{failed:?}");
            plan
        };
        let before = (plan(true), plan(false));
        assert_eq!(before.0.committed_through, 370);
        // Receipts committed before "time" 45 and ending below W, in
        // batches of at most 5 rows.
        let mut removed = 0;
        for c in &mut conns {
            let old = receipts_before(c, 45);
            loop {
                let n = compact_receipts(c, 7, old, 2, 5).unwrap();
                assert!(n <= 5);
                if n == 0 {
                    break;
                }
                removed += n;
                assert_eq!((plan(true), plan(false)), before, "after {removed}");
            }
        }
        assert!(removed > 30, "{removed}");
        assert!(count(&conns[0], "SELECT count(*) FROM receipts") < 15);
        // Too few rows to be worth a summary: nothing changes.
        let old = receipts_before(&conns[0], 45);
        assert_eq!(
            compact_receipts(&mut conns[0], 7, old, 1000, 5000).unwrap(),
            0
        );
    }

    #[test]
    fn compaction_never_hides_a_commit_a_power_cut_can_take_back() {
        use crate::store::ReceiptReader;
        let dir = tempfile::tempdir().unwrap();
        let paths = [shard_path(dir.path(), 0), shard_path(dir.path(), 1)];
        let mut a = open_shard(&paths[0]).unwrap();
        let b = open_shard(&paths[1]).unwrap();
        // A commits its stripes at once; B retried its commits and only
        // got them in at time 100, after which A's watermark rose.
        insert_receipt(&a, 7, 1, 10, 0, 1);
        insert_receipt(&a, 7, 21, 30, 10, 2);
        insert_receipt(&a, 7, 41, 50, 10, 3);
        insert_receipt(&b, 7, 11, 20, 10, 100);
        insert_receipt(&b, 7, 31, 40, 30, 101);
        insert_receipt(&b, 7, 51, 60, 50, 102);
        insert_receipt(&a, 7, 61, 70, 60, 200);
        // Compacting what is older than time 50 must not span B's stripes,
        // whose commits are younger than that.
        let old = receipts_before(&a, 50);
        assert_eq!(old, 3);
        compact_receipts(&mut a, 7, old, 2, 100).unwrap();
        // A power cut takes B's recent commits back.
        b.execute("DELETE FROM receipts WHERE committed_at >= 100", [])
            .unwrap();
        let (mut r, left_out) = ReceiptReader::open(&paths, false);
        assert!(left_out.is_empty(), "{left_out:?}");
        let (plan, failed) = r.plan(7);
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(plan.committed_through, 10, "the hole at 11 is found");
        assert_eq!(plan.resume.next_seq, 11);
    }

    #[test]
    fn vacuum_gives_deleted_pages_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = shard_path(dir.path(), 0);
        let mut conn = open_shard(&path).unwrap();
        let page = conn
            .query_row("PRAGMA page_size", [], |r| r.get::<_, i64>(0))
            .unwrap() as u64;
        // As many rows of about 230 bytes as a page has bytes: some 200
        // pages of them, whatever the page size.
        let rows = page;
        let tx = conn.transaction().unwrap();
        for seq in 1..=rows as i64 {
            tx.execute(
                crate::store::rows::INSERT_EVENT,
                params![
                    seq,
                    0,
                    seq,
                    1,
                    1,
                    1,
                    0,
                    6,
                    "p",
                    "n",
                    "x".repeat(200),
                    None::<String>
                ],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        let full = measure(&conn).unwrap();
        while trim(
            &mut conn,
            Older::Stamped(i64::MAX),
            1000,
            Some(&[1]),
            Keep::default(),
        )
        .unwrap()
        .more
        {}
        let emptied = measure(&conn).unwrap();
        assert!(emptied.free_pages > 200, "{emptied:?}");
        assert!(emptied.used_bytes() < full.used_bytes() / 10);
        let freed = vacuum(&conn, 100 * page).unwrap();
        assert_eq!(freed, 100);
        assert_eq!(vacuum(&conn, page / 2).unwrap(), 1, "at least one page");
        while vacuum(&conn, 100 * page).unwrap() > 0 {}
        assert_eq!(measure(&conn).unwrap().free_pages, 0);
    }
}
