//! The shard database schema: an append-only list of migrations tracked by
//! SQLite's `user_version`, and the pragmas each connection runs with.
//!
//! Column names are plain (`events.ts`, `cpu`, `seq`, `level`, ...) so that
//! `sqlite3` users can read a shard directly; docs/design/storage.md describes every
//! table.

use rusqlite::Connection;

/// Migration `i` brings a database from `user_version` i to i + 1. Entries
/// are never edited or removed once released; new ones are appended.
const MIGRATIONS: &[&str] = &[
    // 1: events, gaps and receipts.
    "CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        ts INTEGER NOT NULL,          -- nanoseconds since the Unix epoch
        cpu INTEGER NOT NULL,         -- logical CPU id of the ring
        seq INTEGER NOT NULL,         -- sequence number in the ring
        ring_epoch INTEGER NOT NULL,  -- ring lifetime id (see gaps, receipts)
        pid INTEGER NOT NULL,
        tid INTEGER NOT NULL,
        uid INTEGER NOT NULL,
        level INTEGER NOT NULL,       -- syslog: 0 emerg .. 7 debug
        provider TEXT NOT NULL,
        name TEXT NOT NULL,
        message TEXT NOT NULL,
        fields TEXT                   -- JSON object, or NULL
    );
    CREATE INDEX events_ts ON events (ts);
    CREATE TABLE gaps (
        id INTEGER PRIMARY KEY,
        ring_epoch INTEGER NOT NULL,
        cpu INTEGER NOT NULL,
        from_seq INTEGER NOT NULL,
        to_seq INTEGER NOT NULL,
        lost INTEGER NOT NULL,        -- to_seq - from_seq + 1
        reason TEXT NOT NULL,         -- overwritten, abandoned, corrupt
        ts_before INTEGER NOT NULL,   -- last event seen before the gap (0 = none)
        detected_at INTEGER NOT NULL  -- when the drain found it
    );
    CREATE INDEX gaps_detected_at ON gaps (detected_at);
    CREATE TABLE receipts (
        id INTEGER PRIMARY KEY,
        ring_epoch INTEGER NOT NULL,
        cpu INTEGER NOT NULL,
        first_seq INTEGER NOT NULL,   -- this run covers first_seq..=last_seq
        last_seq INTEGER NOT NULL,
        position INTEGER NOT NULL,    -- reader position after last_seq
        next_seq INTEGER NOT NULL,
        committed_through INTEGER NOT NULL, -- every seq <= this was committed somewhere
        committed_at INTEGER NOT NULL
    );
    CREATE INDEX receipts_ring ON receipts (ring_epoch, last_seq);",
    // 2: recovery looks up the highest watermark of a ring epoch.
    "CREATE INDEX receipts_through ON receipts (ring_epoch, committed_through);",
    // 3: retention finds old receipts by commit time.
    "CREATE INDEX receipts_committed_at ON receipts (committed_at);",
    // 4: the file's identity, which stays with its rows wherever the file
    // goes: the export stage keys its cursors by it (a file of the same
    // name made again later is another instance).
    // WITHOUT ROWID: one b-tree, one page (a rowid table with a text key
    // takes two, 64 KiB of 32 KiB pages in every shard).
    "CREATE TABLE shard_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO shard_meta (key, value) VALUES ('instance', lower(hex(randomblob(8))));",
    // 5: each commit's time span, for queries to pass over the files that
    // cannot hold their next results (see `zones`; never edited there).
    super::zones::CREATE_ZONES,
    // 6: when rows were committed, by eventd's reckoning of time, for
    // retention to judge age by (see `retention::marks`; never edited there).
    super::retention::marks::CREATE,
    // 7: how many events of each ring the file holds, and their highest
    // sequence number, kept in the transactions that insert and delete
    // them, so the file's manifest (see `manifest`) can say it without
    // counting: what a damaged file held is then known.
    // `last_at`: the time of the last commit that stored events of the ring,
    // which tells recovery which ring was at a CPU's name before the one
    // there now (see `recovery`).
    "CREATE TABLE ring_counts (
        ring_epoch INTEGER NOT NULL,
        cpu INTEGER NOT NULL,
        events INTEGER NOT NULL,
        max_seq INTEGER NOT NULL,
        last_at INTEGER NOT NULL,
        PRIMARY KEY (ring_epoch, cpu)
    ) WITHOUT ROWID;
    INSERT INTO ring_counts SELECT ring_epoch, cpu, count(*), max(seq), 0 FROM events
        GROUP BY ring_epoch, cpu;
    UPDATE ring_counts SET last_at = ifnull((SELECT max(committed_at) FROM receipts r
        WHERE r.ring_epoch = ring_counts.ring_epoch AND r.cpu = ring_counts.cpu), 0);",
];

/// Events of one ring (epoch and cpu) a file holds, and the highest
/// sequence number of them it ever held (`ring_counts`, migration 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingCount {
    pub ring_epoch: u64,
    pub cpu: u32,
    pub events: u64,
    pub max_seq: u64,
}

/// Adds `delta` events of ring (`ring_epoch`, `cpu`) up to `max_seq`,
/// committed at `at` (ns), in the caller's transaction. Deletions give a
/// negative `delta` and `at` 0 (the last commit time stays).
pub fn count_ring_events(
    conn: &Connection,
    ring_epoch: u64,
    cpu: u32,
    delta: i64,
    max_seq: u64,
    at: i64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO ring_counts (ring_epoch, cpu, events, max_seq, last_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (ring_epoch, cpu) DO UPDATE SET events = events + excluded.events, \
         max_seq = max(max_seq, excluded.max_seq), last_at = max(last_at, excluded.last_at)",
    )?
    .execute(rusqlite::params![
        ring_epoch as i64,
        cpu,
        delta,
        max_seq as i64,
        at
    ])?;
    Ok(())
}

/// Every ring's count in the file; `None` if its schema keeps none yet.
pub fn ring_counts(conn: &Connection) -> rusqlite::Result<Option<Vec<RingCount>>> {
    let has: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'ring_counts'",
        [],
        |r| r.get(0),
    )?;
    if !has {
        return Ok(None);
    }
    let mut stmt = conn.prepare("SELECT ring_epoch, cpu, events, max_seq FROM ring_counts")?;
    let rows = stmt.query_map([], |r| {
        Ok(RingCount {
            ring_epoch: r.get::<_, i64>(0)? as u64,
            cpu: r.get(1)?,
            events: r.get::<_, i64>(2)?.max(0) as u64,
            max_seq: r.get::<_, i64>(3)?.max(0) as u64,
        })
    })?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map(Some)
}

/// The key of [`MIGRATIONS`]' `shard_meta` row that holds the file's
/// instance id (16 hex digits, random, made once).
pub const INSTANCE_KEY: &str = "instance";

/// The instance id of the shard `conn` reads; `None` for a file whose
/// schema predates it (version 3 or older, not yet migrated).
pub fn instance(conn: &Connection) -> rusqlite::Result<Option<String>> {
    use rusqlite::OptionalExtension;
    let has_table: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'shard_meta'",
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(None);
    }
    conn.query_row(
        "SELECT value FROM shard_meta WHERE key = ?1",
        [INSTANCE_KEY],
        |r| r.get(0),
    )
    .optional()
}

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings `conn` up to [`SCHEMA_VERSION`], each step in its own
/// transaction. A database from a newer eventd is refused, not touched.
pub fn migrate(conn: &mut Connection) -> rusqlite::Result<Result<(), i64>> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Ok(Err(version));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i as i64 + 1)?;
        tx.commit()?;
    }
    Ok(Ok(()))
}

/// The page size of new shard databases. Rows of a few hundred bytes fill
/// a 4 KiB page (SQLite's default) with about fifteen, so inserts spend
/// much of their time on per-page work (splitting and balancing b-tree
/// pages, WAL frames and their checksums, page-cache lookups); with 32 KiB
/// pages the bare insert ceiling was 1.4-1.6x as fast (
/// docs/performance.md#sqlite-settings). Existing files keep the size they were made with.
pub const PAGE_BYTES: i64 = 32 << 10;

/// WAL bytes between two checkpoints: 1000 pages of 4 KiB (SQLite's
/// default), whatever the page size.
const CHECKPOINT_BYTES: i64 = 1000 * 4096;

/// The WAL file's size once it starts over after a complete checkpoint:
/// twice the most it reaches while checkpoints keep up (the writer's own
/// checkpoint runs right after the commit that takes it past four times
/// [`CHECKPOINT_BYTES`]). A reader that holds one snapshot for long (an
/// export thread at niceness 19 descheduled in the middle of a batch on a
/// busy CPU) stops checkpoints from copying everything back, and the WAL
/// grows meanwhile: 437 MB a file in a 10 s flat-out point with export on
/// (perf/runs/notebook.md#the-cluster-on-a-cpu-of-its-own---cluster-cpus-0-2026-12-03).
/// Without a limit SQLite keeps the file that
/// large after it starts over; with it, the first commit after the restart
/// cuts the file back.
pub const WAL_LIMIT_BYTES: i64 = 8 * CHECKPOINT_BYTES;

/// All writers' page caches together, at most (KiB), once there are more
/// than 4 of them (chosen with `eventd-perf scale`: at 256 shards, 64 MiB
/// in all ingested as fast as 128 MiB within this machine's noise, 796k
/// vs 741k events/s, and keeps the daemon's own memory under 256 MiB).
pub const WRITER_CACHE_TOTAL_KIB: i64 = 64 << 10;
/// Each writer's page cache, KiB: between these.
const WRITER_CACHE_KIB_RANGE: (i64, i64) = (256, 16 << 10);
/// The page cache of writer connections opened from now on (KiB).
static WRITER_CACHE_KIB: std::sync::atomic::AtomicI64 =
    std::sync::atomic::AtomicI64::new(WRITER_CACHE_KIB_RANGE.1);

/// Sizes the page cache of the writer connections opened from now on for
/// `writers` of them (the daemon calls it with its active shard count
/// before opening them; the load harness's ceiling with its database
/// count). Relaxed: read by the connections opened after this call, on
/// threads started after it.
pub fn size_writer_caches(writers: usize) {
    let (lo, hi) = WRITER_CACHE_KIB_RANGE;
    let each = (WRITER_CACHE_TOTAL_KIB / writers.max(1) as i64).clamp(lo, hi);
    WRITER_CACHE_KIB.store(each, std::sync::atomic::Ordering::Relaxed);
}

/// Pragmas of a writer connection, chosen with the load harness
/// (docs/performance.md#sqlite-settings):
/// - WAL lets queries read while the writer commits.
/// - `synchronous = NORMAL` syncs at checkpoints, not at every commit: a
///   killed process loses nothing committed; after a power cut recovery
///   merges every receipt (see `daemon::PreviousRun`).
/// - Checkpoints every ~4 MB of WAL (1000 pages of 4 KiB, SQLite's
///   default; fewer pages when they are larger): a checkpoint runs inside a
///   commit and holds the writer up; at 4096 pages of 4 KiB the p99
///   emit-to-commit latency at half load was two to three times higher, for
///   about 4 % more throughput.
/// - The WAL file is cut back to [`WAL_LIMIT_BYTES`] when it starts over
///   after a reader held it long.
/// - Page cache: 16 MiB per connection (10 % faster inserts than 2 MiB) up
///   to 4 writers, then [`WRITER_CACHE_TOTAL_KIB`] shared out (256 KiB, 8
///   pages, at 256 shards), so that the daemon's memory stays bounded
///   whatever StorageShards says; see [`size_writer_caches`].
pub fn configure_writer(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "busy_timeout", 5000)?;
    conn.pragma_update(
        None,
        "cache_size",
        -WRITER_CACHE_KIB.load(std::sync::atomic::Ordering::Relaxed),
    )?;
    let page: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    conn.pragma_update(
        None,
        "wal_autocheckpoint",
        (CHECKPOINT_BYTES / page.max(512)).max(1),
    )?;
    conn.pragma_update(None, "journal_size_limit", WAL_LIMIT_BYTES)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that holds its snapshot while the writer commits lets the
    /// WAL grow past the limit; once it lets go and a checkpoint copies
    /// everything back, the next commit cuts the file back to the limit.
    #[test]
    fn a_wal_grown_behind_a_reader_is_cut_back_once_it_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.db");
        let w = Connection::open(&path).unwrap();
        w.pragma_update(None, "page_size", PAGE_BYTES).unwrap();
        configure_writer(&w).unwrap();
        w.execute_batch("CREATE TABLE t (b BLOB); INSERT INTO t VALUES (1);")
            .unwrap();
        let r = Connection::open(&path).unwrap();
        r.execute_batch("BEGIN").unwrap();
        let _: i64 = r
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap();
        let wal = dir.path().join("shard.db-wal");
        let wal_len = || std::fs::metadata(&wal).unwrap().len() as i64;
        // 400 KB a row: 1.5 x the limit in all.
        let rows = WAL_LIMIT_BYTES * 3 / 2 / 400_000 + 1;
        for _ in 0..rows {
            w.execute("INSERT INTO t VALUES (zeroblob(400000))", [])
                .unwrap();
        }
        assert!(wal_len() > WAL_LIMIT_BYTES, "{} bytes", wal_len());
        r.execute_batch("COMMIT").unwrap();
        let (log, copied): (i64, i64) = w
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                Ok((row.get(1)?, row.get(2)?))
            })
            .unwrap();
        assert_eq!(log, copied, "the checkpoint copied everything back");
        w.execute("INSERT INTO t VALUES (2)", []).unwrap();
        assert!(wal_len() <= WAL_LIMIT_BYTES, "{} bytes", wal_len());
    }

    #[test]
    fn writer_caches_share_a_bounded_total() {
        let cache = |writers| {
            size_writer_caches(writers);
            let conn = Connection::open_in_memory().unwrap();
            configure_writer(&conn).unwrap();
            let kib: i64 = conn
                .query_row("PRAGMA cache_size", [], |r| r.get(0))
                .unwrap();
            -kib
        };
        assert_eq!(cache(2), 16 << 10);
        assert_eq!(cache(8), 8 << 10);
        assert_eq!(cache(64), 1 << 10);
        assert_eq!(cache(256), 256);
        assert_eq!(cache(100_000), 256);
        // Back to what the other tests of this process expect.
        size_writer_caches(1);
    }

    #[test]
    fn migrating_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap().unwrap();
        migrate(&mut conn).unwrap().unwrap();
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 7);
        let indexes: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        // Five made by name, and shard_meta's primary key.
        assert_eq!(indexes, 5);
    }

    /// A file made before the zones table gets one zone over its events.
    #[test]
    fn migration_5_gives_existing_events_one_zone() {
        let mut conn = Connection::open_in_memory().unwrap();
        for sql in &MIGRATIONS[..4] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 4).unwrap();
        for (i, ts) in [30i64, 10, 20].into_iter().enumerate() {
            conn.execute(
                crate::store::rows::INSERT_EVENT,
                rusqlite::params![
                    ts,
                    0,
                    i as i64,
                    1i64,
                    1,
                    1,
                    0,
                    6,
                    "p",
                    "n",
                    "m",
                    None::<&str>
                ],
            )
            .unwrap();
        }
        migrate(&mut conn).unwrap().unwrap();
        let zones: Vec<(i64, i64, i64)> = conn
            .prepare("SELECT ts_min, ts_max, id_max FROM zones")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(zones, [(10, 30, 3)]);
        // An empty one gets none.
        let mut empty = Connection::open_in_memory().unwrap();
        migrate(&mut empty).unwrap().unwrap();
        let n: i64 = empty
            .query_row("SELECT count(*) FROM zones", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 0);
    }

    /// A file made before the commit marks gets marks over every row it
    /// holds: one per zone (its newest event time) and one over all.
    #[test]
    fn migration_6_marks_the_rows_a_file_holds() {
        let mut conn = Connection::open_in_memory().unwrap();
        for sql in &MIGRATIONS[..5] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 5).unwrap();
        let minute = super::super::retention::marks::MARK_NS;
        conn.execute_batch(&format!(
            "INSERT INTO events (ts, cpu, seq, ring_epoch, pid, tid, uid, level, provider, name, \
             message) VALUES (10, 0, 1, 1, 1, 1, 0, 6, 'p', 'n', 'm'), \
             ({t}, 0, 2, 1, 1, 1, 0, 6, 'p', 'n', 'm'), (-5, 0, 3, 1, 1, 1, 0, 6, 'p', 'n', 'm');
             INSERT INTO zones (ts_min, ts_max, id_max) VALUES (10, 10, 1), (-5, {t}, 3);
             INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, \
             detected_at) VALUES (1, 0, 9, 9, 1, 'overwritten', 0, {d});",
            t = 3 * minute,
            d = 5 * minute + 1
        ))
        .unwrap();
        migrate(&mut conn).unwrap().unwrap();
        let marks: Vec<(i64, i64, i64, i64)> = conn
            .prepare(
                "SELECT minute, committed_at, events_through, gaps_through FROM commit_marks \
                 ORDER BY minute",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            marks,
            [
                (0, 10, 1, 0),
                (3, 3 * minute, 3, 0),
                (5, 5 * minute + 1, 3, 1)
            ]
        );
        // An empty file gets none.
        let mut empty = Connection::open_in_memory().unwrap();
        migrate(&mut empty).unwrap().unwrap();
        let n: i64 = empty
            .query_row("SELECT count(*) FROM commit_marks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 0);
    }

    #[test]
    fn each_database_gets_its_own_instance_id_once() {
        let mut a = Connection::open_in_memory().unwrap();
        let mut b = Connection::open_in_memory().unwrap();
        assert_eq!(instance(&a).unwrap(), None);
        migrate(&mut a).unwrap().unwrap();
        migrate(&mut b).unwrap().unwrap();
        let id = instance(&a).unwrap().unwrap();
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
        assert_ne!(Some(id.clone()), instance(&b).unwrap());
        migrate(&mut a).unwrap().unwrap();
        assert_eq!(instance(&a).unwrap(), Some(id), "migrating again keeps it");
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), Err(SCHEMA_VERSION + 1));
    }
}
