//! The shard store: schema and migrations, the shard writer (the only code
//! that writes SQLite, R8), receipts and recovery.
//!
//! Shard databases are `shard-NNN.db` files in the store directory. They are
//! created on first use and never deleted or overwritten (R12): a daemon
//! started with fewer shards leaves the others in place, and recovery and
//! queries read every `*.db` file there (R7).

pub mod control;
pub mod handoff;
pub mod recovery;
pub mod schema;
pub mod tracker;
pub mod trim;
pub mod writer;

pub use handoff::{Handoff, Kind};
pub use recovery::{ReceiptReader, RingPlan};
pub use tracker::{CommitTracker, CommittedRuns};
pub use writer::{ShardWriter, WriterShared, WriterStats};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("shard database {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error(
        "shard database {path} has schema version {found}, newer than this \
         eventd's {supported}; it is left untouched"
    )]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("{path} has no eventd schema version: it is not a shard database")]
    NotAShard { path: PathBuf },
    #[error("shard database {path}: could not commit {items} items: {source}")]
    Commit {
        path: PathBuf,
        items: usize,
        source: rusqlite::Error,
    },
    #[error(
        "cannot read the receipts in {path}: {source}; eventd does not start without \
         them, because the events committed there would be stored a second time. \
         Repair the file or move it out of the store directory"
    )]
    Recovery {
        path: PathBuf,
        source: rusqlite::Error,
    },
}

/// Process-wide SQLite settings, applied once before the first connection.
///
/// Memory statistics are turned off: with them on, every allocation of
/// every connection takes one global mutex, which the shard writers then
/// contend on (measured: about 7 % of a writer's time in
/// `pthread_mutex_lock` with two writers).
pub fn configure_sqlite() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_config is documented as callable before
        // sqlite3_initialize; afterwards it returns SQLITE_MISUSE and changes
        // nothing, which is fine (the setting is only an optimisation). The
        // variadic argument is the int that SQLITE_CONFIG_MEMSTATUS expects.
        unsafe {
            rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS, 0i32);
        }
    });
}

/// The file of shard `index`.
pub fn shard_path(store_dir: &Path, index: usize) -> PathBuf {
    store_dir.join(format!("shard-{index:03}.db"))
}

/// Every `*.db` file in the store directory, sorted by name (R7: whatever
/// configuration wrote it).
pub fn list_databases(store_dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let entries = std::fs::read_dir(store_dir).map_err(|source| StoreError::Dir {
        path: store_dir.to_path_buf(),
        source,
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "db") && p.is_file())
        .collect();
    paths.sort();
    Ok(paths)
}

/// Opens shard `path` for writing, creating it if it does not exist, and
/// brings its schema up to date. An existing file is never truncated or
/// replaced (R12): one that is not a readable database is an error naming it.
pub fn open_shard(path: &Path) -> Result<Connection, StoreError> {
    configure_sqlite();
    let err = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err)?;
    // Until the version is known to be ours, closing must not checkpoint:
    // a refused WAL database from a newer eventd (or one killed with
    // frames still in its WAL) keeps both files as they were.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .map_err(err)?;
    // The page size of a new file (`schema::PAGE_BYTES`) must be set before
    // anything reads it, even the version below: the first read fixes the
    // size. On a file with content the pragma writes nothing and changes
    // nothing (only a VACUUM, which eventd never runs, would apply it).
    conn.pragma_update(None, "page_size", schema::PAGE_BYTES)
        .map_err(err)?;
    // The version is checked before anything else is changed (even the
    // journal mode), so a database from a newer eventd stays byte for byte
    // as it was.
    let found = schema_version(&conn, path)?;
    // Ours: closing checkpoints the WAL again.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)
        .map_err(err)?;
    if found == 0 {
        // A new file (or one eventd never migrated): retention can give
        // deleted pages back to the filesystem only if this is set before
        // the first table exists. On a file that already has tables it
        // changes nothing.
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(err)?;
    }
    schema::configure_writer(&conn).map_err(err)?;
    match schema::migrate(&mut conn).map_err(err)? {
        Ok(()) => Ok(conn),
        Err(found) => Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: schema::SCHEMA_VERSION,
        }),
    }
}

/// The database's `user_version`, refused if a newer eventd wrote it.
fn schema_version(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    if found > schema::SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: schema::SCHEMA_VERSION,
        });
    }
    Ok(found)
}

/// Opens an existing shard database that has no writer (a historical
/// shard) for the retention coordinator, which becomes its only writer:
/// read-write, never created, refused if a newer eventd wrote it or eventd
/// never did. Its schema is not migrated: the statements retention runs
/// work on every version.
pub fn open_historical(path: &Path) -> Result<Connection, StoreError> {
    configure_sqlite();
    let err = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err)?;
    if schema_version(&conn, path)? < 1 {
        return Err(StoreError::NotAShard {
            path: path.to_path_buf(),
        });
    }
    conn.pragma_update(None, "busy_timeout", 5000)
        .map_err(err)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r12_an_existing_file_that_is_not_a_database_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = shard_path(dir.path(), 7);
        std::fs::write(&path, b"not a database, and it must survive".repeat(200)).unwrap();
        let e = open_shard(&path).unwrap_err().to_string();
        assert!(e.contains("shard-007.db"), "{e}");
        let kept = std::fs::read(&path).unwrap();
        assert!(kept.starts_with(b"not a database"));
    }

    #[test]
    fn r12_a_newer_schema_is_refused_byte_for_byte_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = shard_path(dir.path(), 1);
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
                .unwrap();
            conn.pragma_update(None, "user_version", schema::SCHEMA_VERSION + 1)
                .unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let e = open_shard(&path).unwrap_err().to_string();
        assert!(e.contains("shard-001.db") && e.contains("newer"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn r12_a_newer_wal_database_keeps_its_file_and_its_wal_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = shard_path(dir.path(), 2);
        let wal = dir.path().join("shard-002.db-wal");
        {
            // As a newer eventd killed with commits still in its WAL.
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "journal_mode", "WAL").unwrap();
            conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
                .unwrap();
            conn.pragma_update(None, "user_version", schema::SCHEMA_VERSION + 1)
                .unwrap();
            conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
                .unwrap();
        }
        let before = (std::fs::read(&path).unwrap(), std::fs::read(&wal).unwrap());
        assert!(!before.1.is_empty(), "the WAL holds the commits");
        let e = open_shard(&path).unwrap_err().to_string();
        assert!(e.contains("shard-002.db") && e.contains("newer"), "{e}");
        let after = (std::fs::read(&path).unwrap(), std::fs::read(&wal).unwrap());
        assert!(after == before, "the database or its WAL changed");
    }

    #[test]
    fn r12_reopening_keeps_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = shard_path(dir.path(), 0);
        let conn = open_shard(&path).unwrap();
        conn.execute(
            "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, detected_at) \
             VALUES (1, 0, 1, 1, 1, 'overwritten', 0, 0)",
            [],
        )
        .unwrap();
        drop(conn);
        let conn = open_shard(&path).unwrap();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM gaps", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
        assert_eq!(list_databases(dir.path()).unwrap(), vec![path]);
    }

    #[test]
    fn new_shards_get_large_pages_and_old_ones_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let settings = |conn: &Connection| -> (i64, i64) {
            let get = |p: &str| {
                conn.query_row(&format!("PRAGMA {p}"), [], |r| r.get::<_, i64>(0))
                    .unwrap()
            };
            (get("page_size"), get("wal_autocheckpoint"))
        };
        let new = open_shard(&shard_path(dir.path(), 0)).unwrap();
        assert_eq!(
            settings(&new),
            (schema::PAGE_BYTES, 4_096_000 / schema::PAGE_BYTES)
        );

        // A shard an earlier eventd made with SQLite's default pages.
        let old_path = shard_path(dir.path(), 1);
        {
            let mut conn = Connection::open(&old_path).unwrap();
            conn.pragma_update(None, "journal_mode", "WAL").unwrap();
            schema::migrate(&mut conn).unwrap().unwrap();
            conn.execute(
                "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, \
                 detected_at) VALUES (1, 0, 1, 1, 1, 'overwritten', 0, 0)",
                [],
            )
            .unwrap();
        }
        let old = open_shard(&old_path).unwrap();
        assert_eq!(settings(&old), (4096, 1000));
        let n: i64 = old
            .query_row("SELECT count(*) FROM gaps", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    }
}
