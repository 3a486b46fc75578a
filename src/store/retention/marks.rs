//! Commit marks: when a shard's rows were committed, by eventd's reckoning
//! of time ([`super::reckoning`]), for retention to judge age by.
//!
//! A mark says "every row of `events`, `gaps` and `receipts` up to these
//! ids was committed by this time". It is an upper bound, so one mark older
//! than the age limit proves every row below its ids old: deleting those
//! rows needs no row's own time, and neither the producer's clock
//! (`events.ts`) nor the wall clock of the moment decides. Ids rise with
//! commits (SQLite gives the highest id plus one, and retention never
//! deletes the highest row), so a mark never covers a row committed after
//! it. A row no mark covers yet is never deleted by age.
//!
//! Who records them, at most one row per minute:
//! - a writer, in the first commit of each minute ([`record_each_minute`]):
//!   one b-tree lookup per commit, one row written per minute (a mark in
//!   every commit writes one more 32 KiB page to the WAL each time, which
//!   an idle daemon committing each event alone pays on every event);
//! - retention, before each trim by age ([`cover`]): the rows committed
//!   since the minute's first commit get a mark at that moment (an upper
//!   bound again, late by at most the retention interval);
//! - retention's own `unexported` gaps and receipt summaries, in the
//!   transaction that stores them.
//!
//! Old marks are folded into one ([`fold`]), so a shard holds one row per
//! minute in which it committed within the age limit, and one more.

use rusqlite::{params, Connection};

/// The nanoseconds one mark row covers.
pub const MARK_NS: i64 = 60_000_000_000;

/// The table (migration 6, `store::schema`), and a mark for each row a
/// file holds already: per commit recorded in `zones` (whose newest event
/// time stands in for its commit time, which older versions did not
/// keep), and one over every row, at the newest time the file records.
/// Times are clamped at 0 so that `minute` is their floor.
pub const CREATE: &str = "CREATE TABLE commit_marks (
        minute INTEGER PRIMARY KEY,       -- committed_at / 60 s
        committed_at INTEGER NOT NULL,    -- eventd's reckoning, ns since the Unix epoch
        events_through INTEGER NOT NULL,  -- every row up to these ids was
        gaps_through INTEGER NOT NULL,    -- committed by committed_at
        receipts_through INTEGER NOT NULL
    );
    INSERT INTO commit_marks (minute, committed_at, events_through, gaps_through, receipts_through)
        SELECT max(ts_max, 0) / 60000000000, max(max(ts_max, 0)), max(id_max), 0, 0
        FROM zones GROUP BY 1;
    INSERT INTO commit_marks (minute, committed_at, events_through, gaps_through, receipts_through)
        SELECT at / 60000000000, at, e, g, r FROM (SELECT
            max(0, ifnull((SELECT max(ts) FROM events), 0),
                ifnull((SELECT max(detected_at) FROM gaps), 0),
                ifnull((SELECT max(committed_at) FROM receipts), 0)) AS at,
            ifnull((SELECT max(id) FROM events), 0) AS e,
            ifnull((SELECT max(id) FROM gaps), 0) AS g,
            ifnull((SELECT max(id) FROM receipts), 0) AS r)
        WHERE e + g + r > 0
        ON CONFLICT (minute) DO UPDATE SET committed_at = max(committed_at, excluded.committed_at),
            events_through = max(events_through, excluded.events_through),
            gaps_through = max(gaps_through, excluded.gaps_through),
            receipts_through = max(receipts_through, excluded.receipts_through);";

const RECORD: &str = "INSERT INTO commit_marks \
     (minute, committed_at, events_through, gaps_through, receipts_through) \
     VALUES (?1 / 60000000000, ?1, ifnull((SELECT max(id) FROM events), 0), \
     ifnull((SELECT max(id) FROM gaps), 0), ifnull((SELECT max(id) FROM receipts), 0)) \
     ON CONFLICT (minute) DO UPDATE SET committed_at = max(committed_at, excluded.committed_at), \
     events_through = max(events_through, excluded.events_through), \
     gaps_through = max(gaps_through, excluded.gaps_through), \
     receipts_through = max(receipts_through, excluded.receipts_through)";

/// Records, inside the transaction that stored them, that every row stored
/// so far was committed by `now_ns` (eventd's reckoning). Three lookups of
/// a b-tree's last row and one upsert.
pub fn record(conn: &Connection, now_ns: i64) -> rusqlite::Result<()> {
    conn.prepare_cached(RECORD)?.execute([now_ns.max(0)])?;
    Ok(())
}

/// [`record`], unless the newest mark is of this minute already: what a
/// writer calls in each commit, after storing its rows.
pub fn record_each_minute(conn: &Connection, now_ns: i64) -> rusqlite::Result<()> {
    let newest: Option<i64> = conn
        .prepare_cached("SELECT max(minute) FROM commit_marks")?
        .query_row([], |r| r.get(0))?;
    if newest == Some(now_ns.max(0) / MARK_NS) {
        return Ok(());
    }
    record(conn, now_ns)
}

/// [`record`], if some row has an id above the newest mark's.
pub fn cover(conn: &Connection, now_ns: i64) -> rusqlite::Result<()> {
    let uncovered: bool = conn
        .prepare_cached(
            "SELECT ifnull((SELECT max(id) FROM events), 0) > ifnull(e, 0) \
             OR ifnull((SELECT max(id) FROM gaps), 0) > ifnull(g, 0) \
             OR ifnull((SELECT max(id) FROM receipts), 0) > ifnull(r, 0) \
             FROM (SELECT NULL) LEFT JOIN (SELECT events_through AS e, gaps_through AS g, \
             receipts_through AS r FROM commit_marks ORDER BY minute DESC LIMIT 1)",
        )?
        .query_row([], |r| r.get(0))?;
    if uncovered {
        record(conn, now_ns)?;
    }
    Ok(())
}

/// Ids at or below which every row was committed before a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Through {
    pub events: i64,
    pub gaps: i64,
    pub receipts: i64,
}

/// The old marks: `minute` bounds them first (`committed_at` is never
/// below its minute's start), so only they are read.
const OLD: &str = "FROM commit_marks WHERE minute <= ?1 / 60000000000 AND committed_at < ?1";

/// The rows committed before `before_ns` (eventd's reckoning): the highest
/// ids of the marks older than that (0: none).
pub fn through(conn: &Connection, before_ns: i64) -> rusqlite::Result<Through> {
    conn.query_row(
        &format!(
            "SELECT ifnull(max(events_through), 0), ifnull(max(gaps_through), 0), \
             ifnull(max(receipts_through), 0) {OLD}"
        ),
        [before_ns],
        |r| {
            Ok(Through {
                events: r.get(0)?,
                gaps: r.get(1)?,
                receipts: r.get(2)?,
            })
        },
    )
}

/// Replaces the marks older than `before_ns` by one: the latest of them,
/// raised to the highest ids of all (still older than `before_ns`, so
/// [`through`] says the same).
pub fn fold(conn: &Connection, before_ns: i64) -> rusqlite::Result<()> {
    let (n, minute): (i64, Option<i64>) = conn.query_row(
        &format!("SELECT count(*), max(minute) {OLD}"),
        [before_ns],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let Some(minute) = minute.filter(|_| n > 1) else {
        return Ok(());
    };
    let t = through(conn, before_ns)?;
    let at: i64 = conn.query_row(
        &format!("SELECT max(committed_at) {OLD}"),
        [before_ns],
        |r| r.get(0),
    )?;
    conn.execute(
        &format!("DELETE {OLD} AND minute != ?2"),
        params![before_ns, minute],
    )?;
    conn.execute(
        "UPDATE commit_marks SET committed_at = ?2, events_through = ?3, gaps_through = ?4, \
         receipts_through = ?5 WHERE minute = ?1",
        params![minute, at, t.events, t.gaps, t.receipts],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{open_shard, shard_path};

    const MIN: i64 = MARK_NS;

    fn add_event(conn: &Connection) {
        conn.execute(
            crate::store::rows::INSERT_EVENT,
            params![1, 0, 1, 1, 1, 1, 0, 6, "p", "n", "m", None::<String>],
        )
        .unwrap();
    }

    fn marks(conn: &Connection) -> Vec<(i64, i64, i64)> {
        conn.prepare("SELECT minute, committed_at, events_through FROM commit_marks ORDER BY 1")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_mark_covers_every_row_stored_so_far_and_a_minute_is_one_row() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_shard(&shard_path(dir.path(), 0)).unwrap();
        record(&conn, 5).unwrap();
        assert_eq!(marks(&conn), [(0, 5, 0)], "an empty file: nothing covered");
        add_event(&conn);
        add_event(&conn);
        record(&conn, 10 * MIN + 1).unwrap();
        add_event(&conn);
        record(&conn, 10 * MIN + 7).unwrap();
        add_event(&conn);
        record(&conn, 12 * MIN).unwrap();
        assert_eq!(
            marks(&conn),
            [(0, 5, 0), (10, 10 * MIN + 7, 3), (12, 12 * MIN, 4)]
        );
        // Committed before minute 11: ids up to 3; before 10 min 7 ns: 0.
        assert_eq!(through(&conn, 11 * MIN).unwrap().events, 3);
        assert_eq!(through(&conn, 10 * MIN + 7).unwrap().events, 0);
        assert_eq!(through(&conn, 13 * MIN).unwrap().events, 4);
        assert_eq!(through(&conn, -MIN).unwrap(), Through::default());
    }

    #[test]
    fn a_writer_marks_the_first_commit_of_each_minute_and_retention_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_shard(&shard_path(dir.path(), 0)).unwrap();
        cover(&conn, MIN).unwrap();
        assert_eq!(marks(&conn), [], "nothing to cover");
        add_event(&conn);
        record_each_minute(&conn, 2 * MIN + 1).unwrap();
        add_event(&conn);
        record_each_minute(&conn, 2 * MIN + 9).unwrap();
        assert_eq!(marks(&conn), [(2, 2 * MIN + 1, 1)], "once a minute");
        assert_eq!(through(&conn, 3 * MIN).unwrap().events, 1);
        // The second event gets a mark from retention, at its time.
        cover(&conn, 2 * MIN + 30).unwrap();
        assert_eq!(marks(&conn), [(2, 2 * MIN + 30, 2)]);
        cover(&conn, 2 * MIN + 40).unwrap();
        assert_eq!(marks(&conn), [(2, 2 * MIN + 30, 2)], "all covered");
        add_event(&conn);
        record_each_minute(&conn, 4 * MIN).unwrap();
        assert_eq!(marks(&conn).last(), Some(&(4, 4 * MIN, 3)));
    }

    #[test]
    fn folding_keeps_one_old_mark_that_says_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_shard(&shard_path(dir.path(), 0)).unwrap();
        for minute in 1..=5 {
            add_event(&conn);
            record(&conn, minute * MIN).unwrap();
        }
        let before = through(&conn, 4 * MIN).unwrap();
        fold(&conn, 4 * MIN).unwrap();
        assert_eq!(
            marks(&conn),
            [(3, 3 * MIN, 3), (4, 4 * MIN, 4), (5, 5 * MIN, 5)]
        );
        assert_eq!(through(&conn, 4 * MIN).unwrap(), before);
        // A mark raised out of order (a reckoning that went back across a
        // reboot) still folds to the highest ids.
        conn.execute(
            "UPDATE commit_marks SET events_through = 9 WHERE minute = 4",
            [],
        )
        .unwrap();
        fold(&conn, 6 * MIN).unwrap();
        assert_eq!(marks(&conn), [(5, 5 * MIN, 9)]);
        fold(&conn, 6 * MIN).unwrap();
        assert_eq!(marks(&conn), [(5, 5 * MIN, 9)], "one mark: nothing to fold");
    }
}
