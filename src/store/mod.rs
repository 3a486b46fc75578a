//! The shard store: schema and migrations, the shard writer (the only code
//! that writes SQLite, R8), receipts and recovery.
//!
//! Shard databases are `shard-NNN.db` files in the store directory. They are
//! created on first use and never deleted or overwritten (R12): a daemon
//! started with fewer shards leaves the others in place, and recovery and
//! queries read every `*.db` file there (R7).

pub mod active;
mod files;
pub mod health;
pub mod indexes;
pub mod loss;
pub mod manifest;
mod open;
pub mod raw_select;
pub mod recovery;
pub mod retention;
pub mod rows;
pub mod schema;
pub mod writer;
pub mod zones;

pub use active::{open_shards, spawn_writers, ActiveFiles, WriterHandle, Writers};
pub use files::{
    damage_marker, list_database_files, list_databases, next_shard_path, record_damage,
    recorded_damage, recorded_damages, shard_generation_path, shard_path, side_file,
};
pub use health::{Damaged, StoreHealth};
pub use open::{
    check_structure, migrate_historical, open_historical, open_read_only, open_shard,
    open_shard_with, HistoricalFiles,
};
pub use recovery::ReceiptReader;
pub use writer::{ShardWriter, WriterShared, WriterStats};

use std::path::PathBuf;

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
    #[error("shard database {path} is damaged: {reason}; it is left as it is")]
    Damaged { path: PathBuf, reason: String },
    #[error("{path} is not eventd's to write: {why}; it is left as it is")]
    Untrusted { path: PathBuf, why: String },
    #[error("shard database {path}: could not commit {items} items: {source}")]
    Commit {
        path: PathBuf,
        items: usize,
        source: rusqlite::Error,
    },
    #[error(
        "cannot read the receipts in {path}: {source}; they are left out of recovery, so \
         events committed there may be stored a second time (in another file)"
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
        // No bulk page-cache allocation per connection: SQLite otherwise
        // allocates room for 20 pages (640 KiB with 32 KiB pages) in each
        // connection at its first read, used or not: 170 MiB for 256
        // writers before a single event, more with the query pool. Pages
        // are allocated as they are used instead.
        // SAFETY: as above, before initialisation or a harmless MISUSE;
        // the arguments are the (void*, int, int) SQLITE_CONFIG_PAGECACHE
        // expects, a null buffer and zero lines meaning "no bulk memory".
        unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_PAGECACHE,
                std::ptr::null_mut::<std::ffi::c_void>(),
                0i32,
                0i32,
            );
        }
        // No lookaside buffer per connection (SQLite's default is 120 KiB
        // each, 30 MiB for 256 writers, more for the kept query
        // connections): with memory statistics off, plain malloc is cheap.
        // SAFETY: as above; SQLITE_CONFIG_LOOKASIDE takes two ints (slot
        // size, slot count), zero meaning none.
        unsafe {
            rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_LOOKASIDE, 0i32, 0i32);
        }
    });
}

/// Whether a SQLite error says the file itself is damaged (as opposed to
/// full, locked or unreachable): corrupt pages, not a database, or shorter
/// than its pages say.
pub fn is_damage(e: &rusqlite::Error) -> bool {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => {
            matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
            ) || f.extended_code == rusqlite::ffi::SQLITE_IOERR_SHORT_READ
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::files::side_file;
    use super::*;
    use rusqlite::config::DbConfig;
    use rusqlite::Connection;

    /// The bundled SQLite is built without SQLITE_ENABLE_MEMORY_MANAGEMENT
    /// (`.cargo/config.toml`): with it, every connection's page cache is
    /// one process-wide group, and two shard writers evict each other's
    /// b-tree root pages (each insert then reads them again from the file).
    #[test]
    fn each_connection_keeps_its_own_page_cache() {
        let conn = Connection::open_in_memory().unwrap();
        let options: Vec<String> = conn
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            options.iter().any(|o| o.starts_with("THREADSAFE=1")),
            "{options:?}"
        );
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
    }

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
    fn a_generation_gone_but_for_its_wal_or_given_up_is_never_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let first = shard_generation_path(dir.path(), 0, 1);
        assert_eq!(
            next_shard_path(dir.path(), 0, &first),
            shard_generation_path(dir.path(), 0, 2)
        );
        // The second generation's database was removed; its WAL is left.
        let second = shard_generation_path(dir.path(), 0, 2);
        std::fs::write(side_file(&second, "-wal"), b"frames").unwrap();
        assert_eq!(
            next_shard_path(dir.path(), 0, &second),
            shard_generation_path(dir.path(), 0, 3)
        );
        // Nothing of the third is left at all: it was the file given up.
        let third = shard_generation_path(dir.path(), 0, 3);
        assert_eq!(
            next_shard_path(dir.path(), 0, &third),
            shard_generation_path(dir.path(), 0, 4)
        );
        // Other shards' files do not count.
        std::fs::write(shard_generation_path(dir.path(), 1, 9), b"").unwrap();
        assert_eq!(
            next_shard_path(dir.path(), 0, &third),
            shard_generation_path(dir.path(), 0, 4)
        );
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
