//! Tests of retention's operations on one shard database.

use super::*;
use crate::store::retention::marks;
use crate::store::rows::{Receipt, INSERT_RECEIPT};
use crate::store::{open_shard, shard_path};
use rusqlite::{params, Connection};

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
