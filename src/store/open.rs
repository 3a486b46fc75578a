//! Opening shard files for writing: creating a new one whole, the cheap
//! check of an existing one, and the historical files retention writes.

use super::files::side_file;
use super::{configure_sqlite, is_damage, schema, StoreError};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

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
/// never did. Its schema is not migrated here: the statements retention
/// runs work on every version (start-up migrates historical files once,
/// [`migrate_historical`]).
pub fn open_historical(path: &Path) -> Result<Connection, StoreError> {
    let conn = open_historical_trusted(path)?;
    if schema_version(&conn, path)? < 1 {
        return Err(StoreError::NotAShard {
            path: path.to_path_buf(),
        });
    }
    Ok(conn)
}

/// A read-write connection to historical file `path`, if it and its `-wal`
/// and `-shm` are trusted (eventd's user's own, no symbolic links).
fn open_historical_trusted(path: &Path) -> Result<Connection, StoreError> {
    configure_sqlite();
    let err = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    // The same trust as for an active shard: a symbolic link or another
    // user's file (or WAL) is never written.
    for file in [
        path.to_path_buf(),
        side_file(path, "-wal"),
        side_file(path, "-shm"),
    ] {
        match std::fs::symlink_metadata(&file) {
            Ok(meta) => {
                if let Some(why) = crate::access::files::untrusted(&meta) {
                    return Err(StoreError::Untrusted { path: file, why });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(StoreError::Dir {
                    path: file,
                    source: e,
                })
            }
        }
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err)?;
    conn.pragma_update(None, "busy_timeout", 5000)
        .map_err(err)?;
    Ok(conn)
}

/// What start-up found of the historical shards (see
/// [`migrate_historical`]).
#[derive(Debug, Default)]
pub struct HistoricalFiles {
    /// Files found damaged now (recorded in the store's health, with their
    /// loss): the file and why.
    pub damaged: Vec<(std::path::PathBuf, String)>,
    /// Files left as they are for another reason (not eventd's, a newer
    /// schema, an I/O error): the file and why.
    pub failed: Vec<(std::path::PathBuf, String)>,
}

/// Checks and migrates every historical shard in `store_dir` (neither
/// active nor known damaged), once at start-up, before any thread writes
/// one: the same cheap check as an active shard's (a file with one of
/// eventd's shard names and no eventd schema, emptied or cut short, is
/// damage), then the schema brought up to date (the export stage needs
/// each file's instance id, and its manifest the event count), then its
/// manifest written. A damaged file is recorded in `health` (marker, log,
/// `eventctl shards`, and its loss); any other problem leaves the file as
/// it is.
pub fn migrate_historical(store_dir: &Path, health: &super::StoreHealth) -> HistoricalFiles {
    let mut found = HistoricalFiles::default();
    let active = health.actives();
    let paths = match super::list_databases(store_dir) {
        Ok(p) => p,
        Err(e) => {
            found.failed.push((store_dir.to_path_buf(), e.to_string()));
            return found;
        }
    };
    for path in paths {
        if active.contains(&path) || health.is_damaged(&path) {
            continue;
        }
        match check_historical(&path, health.mode()) {
            Ok(()) => {}
            Err(StoreError::Damaged { reason, .. }) => {
                health.mark_damaged(
                    super::Damaged {
                        path: path.clone(),
                        reason: reason.clone(),
                        found_at: crate::rings::now_ns(),
                        replaced_by: None,
                    },
                    None,
                );
                found.damaged.push((path, reason));
            }
            Err(e) => found.failed.push((path, e.to_string())),
        }
    }
    found
}

/// The check, migration and manifest of one historical file.
fn check_historical(path: &Path, mode: crate::access::Mode) -> Result<(), StoreError> {
    let mut conn = open_historical_unchecked(path)?;
    let damaged = |reason: String| StoreError::Damaged {
        path: path.to_path_buf(),
        reason,
    };
    let found = schema_version(&conn, path).map_err(|e| match e {
        StoreError::Open { source, .. } if is_damage(&source) => damaged(source.to_string()),
        other => other,
    })?;
    if found == 0 {
        return Err(if super::files::is_shard_file(path) {
            damaged(
                "it has no eventd schema (emptied, truncated, or its first page overwritten); \
                 eventd never makes a shard in place"
                    .to_string(),
            )
        } else {
            StoreError::NotAShard {
                path: path.to_path_buf(),
            }
        });
    }
    check_structure(&conn, path).map_err(damaged)?;
    // Ours and whole: closing may checkpoint again.
    let err = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)
        .map_err(err)?;
    schema::migrate(&mut conn)
        .map_err(err)?
        .map_err(|found| StoreError::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: schema::SCHEMA_VERSION,
        })?;
    super::manifest::refresh(&conn, path, mode);
    Ok(())
}

/// [`open_historical`]'s trust checks and connection, without its schema
/// test, and with no checkpoint on close until the caller knows the file
/// is whole and eventd's (as for an active shard).
fn open_historical_unchecked(path: &Path) -> Result<Connection, StoreError> {
    let conn = open_historical_trusted(path)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .map_err(|source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(conn)
}

/// Opens a shard database read-only (queries and recovery never write).
pub fn open_read_only(path: &Path) -> rusqlite::Result<Connection> {
    super::configure_sqlite();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.pragma_update(None, "busy_timeout", 5000)?;
    // Reading the schema proves this is a database and not some other file.
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?;
    Ok(conn)
}
