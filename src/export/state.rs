//! The export stage's own durable state, `DATA_DIR/export/state.db` (mode
//! 0600, eventd's user only): per shard instance and table, the id through
//! which every row is in the cluster (the cursor), and the batch being sent
//! (the intent). Shards are never written by the export stage (R8); this is
//! its only database.
//!
//! A batch is recorded here, synced, before its first byte is sent, and
//! removed in the same transaction that moves the cursor past it, after the
//! cluster accepted it. So after any crash a batch that may have landed is
//! either behind the cursor (it did) or still recorded (it may have): the
//! worker then asks the cluster which of its rows are there before sending
//! anything (see `worker/protocol.rs`).

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::{Path, PathBuf};

/// The two shard tables the export stage sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Table {
    Events,
    Gaps,
}

impl Table {
    pub const ALL: [Table; 2] = [Table::Events, Table::Gaps];

    /// The table's name, in the shard and in the state database.
    pub fn name(self) -> &'static str {
        match self {
            Table::Events => "events",
            Table::Gaps => "gaps",
        }
    }
}

/// A batch recorded before it is sent: the rows of one shard table with
/// ids in `lo..=hi` (`rows` of them when it was made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intent {
    pub lo: i64,
    pub hi: i64,
    pub rows: u64,
    /// When it was recorded, ns since the Unix epoch.
    pub recorded_at: i64,
}

/// Where one (instance, table) stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    /// Every row with an id at or below this is in the cluster (or was
    /// deleted before it could be sent, and counted).
    pub exported_through: i64,
    pub pending: Option<Intent>,
    /// Rows with ids at or below this (and above the cursor) may be
    /// exported already under the same ids with other contents: the file
    /// was found rolled back under its cursor. 0: none.
    pub rolled_back_through: i64,
}

#[derive(Debug, thiserror::Error)]
#[error("export state {path}: {source}")]
pub struct StateError {
    pub path: PathBuf,
    pub source: rusqlite::Error,
}

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS cursors (
        instance TEXT NOT NULL,           -- the shard file's instance id
        tbl TEXT NOT NULL,                -- events | gaps
        file TEXT NOT NULL,               -- the file's name when last seen
        exported_through INTEGER NOT NULL,
        PRIMARY KEY (instance, tbl)
    );
    CREATE TABLE IF NOT EXISTS pending (
        instance TEXT NOT NULL,
        tbl TEXT NOT NULL,
        lo INTEGER NOT NULL,              -- the batch is ids lo..=hi
        hi INTEGER NOT NULL,
        rows INTEGER NOT NULL,
        recorded_at INTEGER NOT NULL,
        PRIMARY KEY (instance, tbl)
    );
    CREATE TABLE IF NOT EXISTS rolled_back (
        instance TEXT NOT NULL,
        tbl TEXT NOT NULL,
        through INTEGER NOT NULL,         -- the cursor when the file was found behind it
        PRIMARY KEY (instance, tbl)
    );
    CREATE TABLE IF NOT EXISTS counters (
        instance TEXT NOT NULL,           -- what the batches met, since the
        tbl TEXT NOT NULL,                -- file was first exported
        batches_sent INTEGER NOT NULL DEFAULT 0,
        rows_sent INTEGER NOT NULL DEFAULT 0,
        batches_deduplicated INTEGER NOT NULL DEFAULT 0,
        batches_resent INTEGER NOT NULL DEFAULT 0,
        rows_resent INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (instance, tbl)
    );
    CREATE TABLE IF NOT EXISTS recheck (
        one INTEGER PRIMARY KEY CHECK (one = 1),
        before INTEGER NOT NULL           -- rows older than this (ns) are checked by identity
    );";

/// What the batches of one (instance, table) met: kept in the state
/// database with the cursor, so that they count from the file's first
/// export, not from eventd's start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Accepted on their first send.
    pub batches_sent: u64,
    pub rows_sent: u64,
    /// Not confirmed, then found in the cluster whole.
    pub batches_deduplicated: u64,
    /// Found short after a failure; their missing rows sent.
    pub batches_resent: u64,
    pub rows_resent: u64,
}

/// One connection to the state database (each export worker has its own;
/// they write different rows).
pub struct ExportState {
    conn: Connection,
    path: PathBuf,
}

impl ExportState {
    /// Opens (creating it, mode 0600) `path`. Synchronous = FULL: an
    /// intent must survive a power cut, or a batch could be sent twice
    /// (one fsync per batch of thousands of rows).
    pub fn open(path: &Path) -> Result<ExportState, StateError> {
        let err = |source| StateError {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.pragma_update(None, "busy_timeout", 10_000)
            .map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        Ok(ExportState {
            conn,
            path: path.to_path_buf(),
        })
    }

    fn err(&self, source: rusqlite::Error) -> StateError {
        StateError {
            path: self.path.clone(),
            source,
        }
    }

    /// Runs `f` in one transaction, committed if it succeeds (rolled back
    /// when the transaction is dropped otherwise).
    fn in_transaction(
        &mut self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>,
    ) -> Result<(), StateError> {
        let path = &self.path;
        let err = |source| StateError {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(err)?;
        f(&tx).map_err(err)?;
        tx.commit().map_err(err)
    }

    /// Where `instance`'s `table` stands (nothing exported, nothing
    /// pending, for an instance never seen).
    pub fn position(&self, instance: &str, table: Table) -> Result<Position, StateError> {
        let through: Option<i64> = self
            .conn
            .query_row(
                "SELECT exported_through FROM cursors WHERE instance = ?1 AND tbl = ?2",
                params![instance, table.name()],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let pending = self
            .conn
            .query_row(
                "SELECT lo, hi, rows, recorded_at FROM pending WHERE instance = ?1 AND tbl = ?2",
                params![instance, table.name()],
                |r| {
                    Ok(Intent {
                        lo: r.get(0)?,
                        hi: r.get(1)?,
                        rows: r.get::<_, i64>(2)? as u64,
                        recorded_at: r.get(3)?,
                    })
                },
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let rolled_back_through: Option<i64> = self
            .conn
            .query_row(
                "SELECT through FROM rolled_back WHERE instance = ?1 AND tbl = ?2",
                params![instance, table.name()],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(Position {
            exported_through: through.unwrap_or(0),
            pending,
            rolled_back_through: rolled_back_through.unwrap_or(0),
        })
    }

    /// The file holds ids only up to `newest`, below its cursor: the cursor
    /// goes back to `newest`, the intent is dropped, and the ids up to the
    /// old cursor are marked as rolled back, in one transaction.
    pub fn rewind(&mut self, instance: &str, table: Table, newest: i64) -> Result<(), StateError> {
        self.in_transaction(|tx| {
            tx.execute(
                "INSERT INTO rolled_back (instance, tbl, through) \
                 SELECT instance, tbl, exported_through FROM cursors \
                 WHERE instance = ?1 AND tbl = ?2 AND exported_through > ?3 \
                 ON CONFLICT (instance, tbl) DO UPDATE SET \
                 through = max(through, excluded.through)",
                params![instance, table.name(), newest],
            )?;
            tx.execute(
                "UPDATE cursors SET exported_through = ?3 WHERE instance = ?1 AND tbl = ?2",
                params![instance, table.name(), newest],
            )?;
            tx.execute(
                "DELETE FROM pending WHERE instance = ?1 AND tbl = ?2",
                params![instance, table.name()],
            )?;
            Ok(())
        })
    }

    /// Rows older than this (ns since the Unix epoch; an event's `ts`, a
    /// gap's `ts_before`) are checked by identity before they are sent,
    /// whichever file holds them: set when a file was found rolled back
    /// (see `rewind_rolled_back` in mod.rs), kept across restarts.
    pub fn recheck_before(&self) -> Result<Option<i64>, StateError> {
        self.conn
            .query_row("SELECT before FROM recheck WHERE one = 1", [], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Moves [`Self::recheck_before`] up to `time` (never back), durably.
    pub fn recheck_from(&self, time: i64) -> Result<(), StateError> {
        self.conn
            .execute(
                "INSERT INTO recheck (one, before) VALUES (1, ?1) \
                 ON CONFLICT (one) DO UPDATE SET before = max(before, excluded.before)",
                params![time],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Records `intent` (replacing any earlier one), durably, before the
    /// batch is sent.
    pub fn record(&self, instance: &str, table: Table, intent: Intent) -> Result<(), StateError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO pending (instance, tbl, lo, hi, rows, recorded_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    instance,
                    table.name(),
                    intent.lo,
                    intent.hi,
                    intent.rows as i64,
                    intent.recorded_at
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// What `instance`'s `table` batches met so far (zeros if never seen).
    pub fn counts(&self, instance: &str, table: Table) -> Result<Counts, StateError> {
        self.conn
            .query_row(
                "SELECT batches_sent, rows_sent, batches_deduplicated, batches_resent, \
                 rows_resent FROM counters WHERE instance = ?1 AND tbl = ?2",
                params![instance, table.name()],
                |r| {
                    Ok(Counts {
                        batches_sent: r.get::<_, i64>(0)? as u64,
                        rows_sent: r.get::<_, i64>(1)? as u64,
                        batches_deduplicated: r.get::<_, i64>(2)? as u64,
                        batches_resent: r.get::<_, i64>(3)? as u64,
                        rows_resent: r.get::<_, i64>(4)? as u64,
                    })
                },
            )
            .optional()
            .map(Option::unwrap_or_default)
            .map_err(|e| self.err(e))
    }

    /// Every row through `through` is in the cluster: moves the cursor
    /// (never back), forgets the intent and adds `counted` to the
    /// counters, in one transaction.
    pub fn advance(
        &mut self,
        instance: &str,
        table: Table,
        file: &str,
        through: i64,
        counted: Counts,
    ) -> Result<(), StateError> {
        self.in_transaction(|tx| {
            if counted != Counts::default() {
                tx.execute(
                    "INSERT INTO counters (instance, tbl, batches_sent, rows_sent, \
                     batches_deduplicated, batches_resent, rows_resent) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (instance, tbl) DO UPDATE SET \
                     batches_sent = batches_sent + excluded.batches_sent, \
                     rows_sent = rows_sent + excluded.rows_sent, \
                     batches_deduplicated = batches_deduplicated + excluded.batches_deduplicated, \
                     batches_resent = batches_resent + excluded.batches_resent, \
                     rows_resent = rows_resent + excluded.rows_resent",
                    params![
                        instance,
                        table.name(),
                        counted.batches_sent as i64,
                        counted.rows_sent as i64,
                        counted.batches_deduplicated as i64,
                        counted.batches_resent as i64,
                        counted.rows_resent as i64
                    ],
                )?;
            }
            tx.execute(
                "INSERT INTO cursors (instance, tbl, file, exported_through) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (instance, tbl) DO UPDATE SET \
                 file = excluded.file, \
                 exported_through = max(exported_through, excluded.exported_through)",
                params![instance, table.name(), file, through],
            )?;
            tx.execute(
                "DELETE FROM pending WHERE instance = ?1 AND tbl = ?2",
                params![instance, table.name()],
            )?;
            Ok(())
        })
    }

    /// Every instance the state knows, with its file name when last seen
    /// and its cursors (for status of files no longer present).
    pub fn known(&self) -> Result<Vec<(String, String, Table, i64)>, StateError> {
        let mut stmt = self
            .conn
            .prepare("SELECT instance, file, tbl, exported_through FROM cursors ORDER BY file, tbl")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| {
                let tbl: String = r.get(2)?;
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    if tbl == "gaps" {
                        Table::Gaps
                    } else {
                        Table::Events
                    },
                    r.get(3)?,
                ))
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_intent_survives_reopening_and_goes_with_the_cursor_move() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let s = ExportState::open(&path).unwrap();
        assert_eq!(
            s.position("a1", Table::Events).unwrap(),
            Position::default()
        );
        let intent = Intent {
            lo: 1,
            hi: 500,
            rows: 500,
            recorded_at: 7,
        };
        s.record("a1", Table::Events, intent).unwrap();
        drop(s);
        let mut s = ExportState::open(&path).unwrap();
        let p = s.position("a1", Table::Events).unwrap();
        assert_eq!(p.pending, Some(intent));
        assert_eq!(s.position("a1", Table::Gaps).unwrap().pending, None);
        let sent = Counts {
            batches_sent: 1,
            rows_sent: 500,
            ..Counts::default()
        };
        s.advance("a1", Table::Events, "shard-000.db", 500, sent)
            .unwrap();
        let p = s.position("a1", Table::Events).unwrap();
        assert_eq!((p.exported_through, p.pending), (500, None));
        // Never back.
        s.advance("a1", Table::Events, "shard-000.db", 20, sent)
            .unwrap();
        drop(s);
        // The counters add up and outlive the connection.
        let s = ExportState::open(&path).unwrap();
        let c = s.counts("a1", Table::Events).unwrap();
        assert_eq!((c.batches_sent, c.rows_sent), (2, 1000));
        assert_eq!(s.counts("a1", Table::Gaps).unwrap(), Counts::default());
        assert_eq!(
            s.position("a1", Table::Events).unwrap().exported_through,
            500
        );
        assert_eq!(
            s.known().unwrap(),
            [(
                "a1".to_string(),
                "shard-000.db".to_string(),
                Table::Events,
                500
            )]
        );
    }
}
