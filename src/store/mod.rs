//! The shard store: schema and migrations, the shard writer (the only code
//! that writes SQLite, R8), receipts and recovery.
//!
//! Shard databases are `shard-NNN.db` files in the store directory. They are
//! created on first use and never deleted or overwritten (R12): a daemon
//! started with fewer shards leaves the others in place, and recovery and
//! queries read every `*.db` file there (R7).

pub mod control;
pub mod handoff;
pub mod health;
pub mod recovery;
pub mod schema;
pub mod tracker;
pub mod trim;
pub mod writer;

pub use handoff::{Handoff, Kind};
pub use health::{Damaged, StoreHealth};
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
    });
}

/// The file of shard `index` in generation `generation`: 1 is
/// `shard-NNN.db`, later ones `shard-NNN-gG.db` (made when the one before
/// was found damaged, which is left in place).
pub fn shard_generation_path(store_dir: &Path, index: usize, generation: u32) -> PathBuf {
    if generation <= 1 {
        store_dir.join(format!("shard-{index:03}.db"))
    } else {
        store_dir.join(format!("shard-{index:03}-g{generation}.db"))
    }
}

/// The shard index and generation a file name names, if it is one of
/// eventd's shard names.
fn shard_name(name: &str) -> Option<(usize, u32)> {
    let rest = name.strip_prefix("shard-")?.strip_suffix(".db")?;
    let (index, generation) = match rest.split_once("-g") {
        Some((i, g)) => (i, g.parse().ok().filter(|g| *g >= 2)?),
        None => (rest, 1),
    };
    let digits_ok = index.len() >= 3 && index.bytes().all(|b| b.is_ascii_digit());
    digits_ok
        .then(|| index.parse().ok())
        .flatten()
        .map(|i| (i, generation))
}

/// The newest generation of shard `index` in the store, if any exists.
fn newest_generation(store_dir: &Path, index: usize) -> Option<u32> {
    let entries = std::fs::read_dir(store_dir).ok()?;
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| shard_name(e.file_name().to_str()?))
        .filter(|(i, _)| *i == index)
        .map(|(_, g)| g)
        .max()
}

/// The file shard `index` writes: its newest generation in the store (the
/// first, `shard-NNN.db`, if there is none yet).
pub fn shard_path(store_dir: &Path, index: usize) -> PathBuf {
    shard_generation_path(
        store_dir,
        index,
        newest_generation(store_dir, index).unwrap_or(1),
    )
}

/// The file shard `index` moves on to when `current` (the file it writes
/// now, which may be gone already) is damaged: the generation after
/// `current`'s and after every generation that still has a file in the
/// store, its database or a `-wal` or `-shm` file left behind. So a name is
/// never used twice: a database made at the name of a removed one whose WAL
/// is still there would take that WAL's pages for its own.
pub fn next_shard_path(store_dir: &Path, index: usize, current: &Path) -> PathBuf {
    let in_store = std::fs::read_dir(store_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let database = name
                .strip_suffix("-wal")
                .or_else(|| name.strip_suffix("-shm"))
                .or_else(|| name.strip_suffix(DAMAGE_SUFFIX))
                .unwrap_or(&name);
            shard_name(database)
        })
        .filter(|(i, _)| *i == index)
        .map(|(_, g)| g);
    let current = current
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(shard_name)
        .map(|(_, g)| g);
    let next = in_store
        .chain(current)
        .max()
        .map_or(1, |g| g.saturating_add(1));
    shard_generation_path(store_dir, index, next.max(2))
}

/// What a damaged shard file's marker is called: `NAME.db` + this.
const DAMAGE_SUFFIX: &str = ".damaged";

/// The file beside a damaged shard file that records why it was given up,
/// so that a later start never writes it again (the damaged file itself is
/// never touched). Not a `*.db`: queries and recovery do not see it.
pub fn damage_marker(path: &Path) -> PathBuf {
    side_file(path, DAMAGE_SUFFIX)
}

/// Why `path` was found damaged before, if its marker says so.
pub fn recorded_damage(path: &Path) -> Option<String> {
    std::fs::read_to_string(damage_marker(path))
        .ok()
        .map(|text| text.trim().to_string())
}

/// Writes `path`'s damage marker (once: an existing one keeps the first
/// reason), with `mode`, as a whole file renamed into place.
pub fn record_damage(path: &Path, reason: &str, mode: crate::access::Mode) -> std::io::Result<()> {
    let marker = damage_marker(path);
    if marker.exists() {
        return Ok(());
    }
    let tmp = side_file(&marker, ".new");
    let _ = std::fs::remove_file(&tmp);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        crate::access::files::set_mode_fd(&f, mode)?;
        writeln!(f, "{reason}")?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &marker)
}

/// Every shard file of the store that a marker records as damaged, with the
/// reason and when the marker was written (ns since the Unix epoch).
pub fn recorded_damages(store_dir: &Path) -> Vec<(PathBuf, String, i64)> {
    let Ok(entries) = std::fs::read_dir(store_dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, String, i64)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let database = name.strip_suffix(DAMAGE_SUFFIX)?;
            let path = store_dir.join(database);
            let reason = recorded_damage(&path)?;
            let at = e
                .metadata()
                .ok()?
                .modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_nanos()
                .min(i64::MAX as u128) as i64;
            Some((path, reason, at))
        })
        .collect();
    found.sort();
    found
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

/// [`open_shard_with`] a mode private to eventd's user: for tests and
/// tools.
pub fn open_shard(path: &Path) -> Result<Connection, StoreError> {
    open_shard_with(path, crate::access::Mode::PRIVATE)
}

/// Opens shard `path` for writing, creating it if it does not exist, and
/// brings its schema up to date. An existing file is never truncated or
/// replaced (R12): one that is another user's (or a symlink), one that is
/// not a readable database and one that fails the cheap check of
/// [`check_structure`] are errors naming it, and the file stays as it was.
/// A new file is made whole under a temporary name and renamed into place,
/// so a `shard-NNN.db` without eventd's schema (emptied, truncated to zero)
/// is damage, never a new shard. The files get `mode` (their `-wal` and
/// `-shm` follow the database's mode, which SQLite copies).
pub fn open_shard_with(path: &Path, mode: crate::access::Mode) -> Result<Connection, StoreError> {
    use crate::access::files::{check_file, Found};
    configure_sqlite();
    let err = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let dir_err = |source| StoreError::Dir {
        path: path.to_path_buf(),
        source,
    };
    match check_file(path, mode).map_err(dir_err)? {
        Found::Missing => create_shard(path, mode)?,
        Found::Untrusted(why) => {
            return Err(StoreError::Untrusted {
                path: path.to_path_buf(),
                why,
            })
        }
        Found::Trusted => {}
    }
    for side in ["-wal", "-shm"] {
        let file = side_file(path, side);
        if let Found::Untrusted(why) = check_file(&file, mode).map_err(dir_err)? {
            return Err(StoreError::Untrusted { path: file, why });
        }
    }
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err)?;
    // Until the version is known to be ours, closing must not checkpoint:
    // a refused WAL database from a newer eventd (or one killed with
    // frames still in its WAL, or a damaged one) keeps both files as they
    // were.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .map_err(err)?;
    let damaged = |reason: String| StoreError::Damaged {
        path: path.to_path_buf(),
        reason,
    };
    let found = schema_version(&conn, path).map_err(|e| match e {
        StoreError::Open { source, .. } if is_damage(&source) => damaged(source.to_string()),
        other => other,
    })?;
    if found == 0 {
        return Err(damaged(
            "it has no eventd schema (emptied, truncated, or not a shard); eventd never \
             makes a shard in place"
                .to_string(),
        ));
    }
    check_structure(&conn, path).map_err(damaged)?;
    // Ours: closing checkpoints the WAL again.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)
        .map_err(err)?;
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

fn side_file(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes a new shard at `path`: built whole (page size, incremental
/// auto-vacuum, the schema, WAL mode) under `NAME.new`, synced, renamed into
/// place, and the directory synced.
fn create_shard(path: &Path, mode: crate::access::Mode) -> Result<(), StoreError> {
    let tmp = side_file(path, ".new");
    let err = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let io = |source| StoreError::Dir {
        path: path.to_path_buf(),
        source,
    };
    // What a creation cut short left behind.
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let _ = std::fs::remove_file(side_file(&tmp, suffix));
    }
    {
        let mut conn = Connection::open_with_flags(
            &tmp,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(err)?;
        crate::access::files::set_mode_path(&tmp, mode).map_err(io)?;
        // Both must be set before the first table exists: the page size
        // (see `schema::PAGE_BYTES`) and incremental auto-vacuum, so that
        // retention can give deleted pages back to the filesystem.
        conn.pragma_update(None, "page_size", schema::PAGE_BYTES)
            .map_err(err)?;
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(err)?;
        if let Err(found) = schema::migrate(&mut conn).map_err(err)? {
            return Err(StoreError::NewerSchema {
                path: path.to_path_buf(),
                found,
                supported: schema::SCHEMA_VERSION,
            });
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        // Closing the only connection checkpoints the WAL and removes it.
    }
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

/// The cheap check of an existing shard at open: eventd's three tables with
/// the columns recovery and queries use, the last rows of each table and of
/// the time index readable (the right edge of every b-tree a writer
/// appends to), and the file not shorter than its pages when no WAL holds
/// pages beyond it. A few page reads, whatever the file's size: damage
/// elsewhere in the file is found when a reader meets it.
pub fn check_structure(conn: &Connection, path: &Path) -> Result<(), String> {
    let e = |e: rusqlite::Error| e.to_string();
    for (table, columns) in [
        ("events", &["ts", "cpu", "seq", "ring_epoch"][..]),
        ("gaps", &["ring_epoch", "cpu", "from_seq", "to_seq"][..]),
        (
            "receipts",
            &["ring_epoch", "first_seq", "last_seq", "committed_through"][..],
        ),
    ] {
        let mut stmt = conn
            .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .map_err(e)?;
        let have: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .map_err(e)?
            .collect::<Result<_, _>>()
            .map_err(e)?;
        if have.is_empty() {
            return Err(format!("its {table} table is missing"));
        }
        if let Some(c) = columns.iter().find(|c| !have.iter().any(|h| h == *c)) {
            return Err(format!("its {table} table has no {c} column"));
        }
        conn.query_row(&format!("SELECT max(id) FROM {table}"), [], |r| {
            r.get::<_, Option<i64>>(0)
        })
        .map_err(e)?;
    }
    conn.query_row("SELECT max(ts) FROM events", [], |r| {
        r.get::<_, Option<i64>>(0)
    })
    .map_err(e)?;
    let wal = std::fs::metadata(side_file(path, "-wal")).map_or(0, |m| m.len());
    if wal == 0 {
        let page: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(e)?;
        let pages: i64 = conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(e)?;
        let len = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
        if len < (pages.max(0) as u64).saturating_mul(page.max(0) as u64) {
            return Err(format!(
                "the file is {len} bytes, its header counts {pages} pages of {page} bytes"
            ));
        }
    }
    Ok(())
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
