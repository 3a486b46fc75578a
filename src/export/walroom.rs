//! Room for a shard's WAL to start over.
//!
//! A shard's WAL starts over (and is cut back to
//! `schema::WAL_LIMIT_BYTES`) only when a checkpoint has copied all of it
//! back and the writer then begins a commit while no reader holds a
//! snapshot in it. An exporter that reads batch after batch, the next one
//! while the last is being sent, nearly always holds one; behind it the
//! WAL of a busy shard grew to hundreds of MB, and the writer, whose WAL
//! stays past four times its checkpoint threshold, checkpoints (and syncs)
//! after every commit (docs/performance.md#the-wal-behind-a-slow-reader).
//!
//! So the exporter reads a batch in runs of `source::RUN_ROWS` events, a
//! snapshot each, and before each run (and before each batch) it looks at
//! the size of the shard's `-wal` file. Past the limit, the WAL has not
//! started over since it grew there: the exporter reads nothing more from
//! that file until it has, for at most [`HOLD_MAX`] (between batches it
//! goes on with its other files meanwhile). A file that stops
//! growing meanwhile belongs to a writer with nothing to commit, which
//! cannot start the WAL over: after [`STILL`] without growth the exporter
//! reads again, and holds again only once the file grows. A hold that
//! lasted [`HOLD_MAX`] means another reader (a long query) keeps the WAL
//! from starting over, which waiting longer would not change: the
//! exporter then reads without holds for [`RESPITE`], so that such a
//! reader costs the export at most a tenth of its time.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest one hold lasts (another reader, a query, may be what keeps
/// the WAL from starting over).
pub const HOLD_MAX: Duration = Duration::from_secs(1);
/// After a hold that lasted [`HOLD_MAX`], no new one for this long.
pub const RESPITE: Duration = Duration::from_secs(10);
/// A WAL file that has not grown for this long has an idle writer.
pub const STILL: Duration = Duration::from_millis(200);
/// How often a waiting reader looks at the file again.
const POLL: Duration = Duration::from_millis(5);

/// The WAL of one shard file, as the exporter sees it.
#[derive(Debug)]
pub struct WalRoom {
    wal: PathBuf,
    limit: u64,
    state: State,
    /// Holds so far (for the status).
    holds: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Reads go on.
    Open,
    /// No reads since `since`; the file was `len` bytes when last seen
    /// growing, at `grew`.
    Held {
        since: Instant,
        len: u64,
        grew: Instant,
    },
    /// A hold ended without the WAL starting over, with the file at `len`
    /// bytes: no new hold until it grows past that, nor before `until`.
    Waived { len: u64, until: Instant },
}

impl WalRoom {
    /// The WAL of the shard database at `db`, held past `limit` bytes.
    pub fn new(db: &Path, limit: u64) -> WalRoom {
        WalRoom {
            wal: crate::store::side_file(db, "-wal"),
            limit,
            state: State::Open,
            holds: 0,
        }
    }

    /// Whether the exporter may read the shard now.
    pub fn may_read(&mut self, now: Instant) -> bool {
        // A missing or unreadable file: nothing to leave room for.
        let len = std::fs::metadata(&self.wal).map_or(0, |m| m.len());
        self.look(len, now)
    }

    /// Waits until the exporter may read the shard: at once, or after at
    /// most [`HOLD_MAX`] (called between the runs of one batch's read).
    pub fn wait_for_room(&mut self) {
        while !self.may_read(Instant::now()) {
            std::thread::sleep(POLL);
        }
    }

    /// Holds so far.
    pub fn holds(&self) -> u64 {
        self.holds
    }

    /// [`Self::may_read`] with the file's length given.
    fn look(&mut self, len: u64, now: Instant) -> bool {
        if len <= self.limit {
            // Started over (or never grew past the limit).
            self.state = State::Open;
            return true;
        }
        match self.state {
            State::Open => {
                self.hold(len, now);
                false
            }
            State::Waived { len: at, until } if len <= at || now < until => true,
            State::Waived { .. } => {
                self.hold(len, now);
                false
            }
            State::Held {
                since,
                len: last,
                grew,
            } => {
                let grew = if len != last { now } else { grew };
                if now.duration_since(since) >= HOLD_MAX {
                    // Not this exporter's doing: give it up for a while.
                    self.state = State::Waived {
                        len,
                        until: now + RESPITE,
                    };
                    true
                } else if now.duration_since(grew) >= STILL {
                    // An idle writer: hold again once it writes.
                    self.state = State::Waived { len, until: now };
                    true
                } else {
                    self.state = State::Held { since, len, grew };
                    false
                }
            }
        }
    }

    fn hold(&mut self, len: u64, now: Instant) {
        self.holds += 1;
        self.state = State::Held {
            since: now,
            len,
            grew: now,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    const MS: Duration = Duration::from_millis(1);

    /// The decisions by file length and time, without a file.
    #[test]
    fn holds_past_the_limit_until_it_starts_over_stops_growing_or_times_out() {
        let t = Instant::now();
        let mut room = WalRoom::new(Path::new("/nonexistent/shard-000.db"), 100);
        assert!(room.look(100, t), "at the limit: read");
        assert!(!room.look(101, t), "past it: hold");
        assert!(!room.look(150, t + 150 * MS), "growing: still held");
        assert!(room.look(50, t + 160 * MS), "started over: read");
        assert_eq!(room.holds(), 1);

        // A writer gone idle: released once the file has not grown for STILL.
        assert!(!room.look(200, t));
        assert!(!room.look(200, t + STILL - MS));
        assert!(room.look(200, t + STILL));
        // ... and not held again until it grows.
        assert!(room.look(200, t + STILL + 10 * MS));
        assert!(!room.look(201, t + STILL + 20 * MS));
        assert_eq!(room.holds(), 3);

        // Something else keeps the WAL from starting over: at most HOLD_MAX,
        // then reads go on without a hold for RESPITE, however it grows.
        let mut room = WalRoom::new(Path::new("/nonexistent/shard-000.db"), 100);
        let mut len = 101;
        let mut now = t;
        while !room.look(len, now) {
            len += 1;
            now += 50 * MS;
            assert!(now <= t + HOLD_MAX, "held past HOLD_MAX");
        }
        assert_eq!(now, t + HOLD_MAX);
        let waived = now;
        while now < waived + RESPITE {
            len += 1000;
            assert!(room.look(len, now), "held again within RESPITE");
            now += 500 * MS;
        }
        assert!(!room.look(len + 1, now), "held again after RESPITE");
        assert!(room.look(100, now + MS), "started over");
        assert_eq!(room.holds(), 2);
    }

    /// A real shard file: a reader that holds its snapshot while the writer
    /// commits grows the WAL past the limit, and the exporter holds; once
    /// the reader is gone the writer's next checkpoint and commit start the
    /// WAL over, and reads go on.
    #[test]
    fn a_wal_grown_behind_a_reader_is_held_for_until_it_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-000.db");
        let writer = Connection::open(&path).unwrap();
        crate::store::schema::configure_writer(&writer).unwrap();
        writer
            .execute_batch("CREATE TABLE t (x BLOB); INSERT INTO t VALUES (zeroblob(1000));")
            .unwrap();
        // The writers' own limit is 32 MB; a smaller one keeps this quick.
        let limit = 1 << 20;
        writer
            .pragma_update(None, "journal_size_limit", limit as i64)
            .unwrap();
        let mut room = WalRoom::new(&path, limit);
        let t = Instant::now();
        assert!(room.may_read(t));

        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        let commit = || {
            writer
                .execute("INSERT INTO t VALUES (zeroblob(100000))", [])
                .unwrap();
            writer
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                .unwrap();
        };
        for _ in 0..30 {
            commit();
        }
        assert!(!room.may_read(t + MS), "3 MB of WAL behind the reader");
        reader.execute_batch("COMMIT").unwrap();
        // The checkpoint after this commit copies everything back; the
        // next commit starts the WAL over and cuts the file back.
        commit();
        commit();
        let wal = std::fs::metadata(dir.path().join("shard-000.db-wal"))
            .unwrap()
            .len();
        assert!(wal <= limit, "WAL of {wal} bytes");
        assert!(room.may_read(t + 2 * MS));
        assert_eq!(room.holds(), 1);
    }
}
