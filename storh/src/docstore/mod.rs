//! DocStore: one JSONC file per record, `<collection>/data/<bb>/<id>.jsonc`,
//! with `bb` the id's characters 24–25 ([`crate::id::bucket`]).
//!
//! **Writes** are atomic and durable: the record goes to a temporary file in
//! its bucket, is fsynced, renamed over the final name, and the bucket
//! directory is fsynced. A reader sees the old record or the new one.
//!
//! **Indexes.** The id index (for `stream`) and secondary indexes on
//! declared fields (for `find` and `range`) are kept in memory, loaded on
//! first use from a journal that every write appends to; see
//! [`crate::index`] for the journal and how a half-done write is
//! re-checked.
//!
//! **Crash marker.** Opening is O(1) in the collection's size. The writer
//! holds an OS lock (`flock`) on `<collection>/lock` for as long as the
//! collection is open, and a state file `<collection>/state` says `dirty`
//! (with the boot id) while it is open and `clean` after a clean close.
//! Opening a collection whose state says dirty, while nobody holds the
//! lock, means the last writer died: only then are orphaned temporary files
//! removed (a walk of the bucket directories) and the writes it left
//! unfinished re-checked when the indexes load. A second writer gets an
//! error naming the holder (as the lock file records it); the lock, not
//! that text, decides. A PID check would not do: PIDs are reused, and in
//! containers every run is PID 1.
//!
//! # Where things are
//!
//! One file per concept, beside this one (which holds the [`Collection`]
//! type, its errors, `open` and `close`):
//!
//! - `lock`: the OS lock and the crash marker (the `state` file).
//! - `crud`: the records: `insert`, `insert_many`, `put`, `update`, `get`,
//!   `delete`, and reading JSONC.
//! - `journal`: the collection's side of the index journal: appends, the
//!   first load with its re-checks, rebuilds from the files.
//! - `indexes`: declaring and dropping secondary indexes, `reindex`,
//!   `stats`.
//! - `query`: pages in id order (`stream`, `list_ids`) and the index
//!   queries (`find`, `range`).
//! - `verify`: the check of every file.
//! - `files`: bucket paths, atomic durable writes, temporary files, walks
//!   of the buckets and their layout.

mod crud;
mod files;
mod indexes;
mod journal;
mod lock;
mod query;
mod verify;

#[cfg(test)]
mod tests;

pub use crud::{parse_jsonc, RECORD_BYTES_MAX, RECORD_DEPTH_MAX};
pub use files::Layout;
pub use indexes::Stats;
pub use query::{Hit, StreamPage};
pub use verify::Finding;

use crate::index::IndexState;
use std::fs::File;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DocError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("collection {path} is open for writing by another process ({holder})")]
    Locked { path: PathBuf, holder: String },
    #[error("{id:?} is not a canonical UUID (36 lower-case hex characters and dashes)")]
    BadId { id: String },
    #[error("{path}: not valid JSONC: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{field:?} is not an indexable field (a dot path of letters, digits, '_' and '-')")]
    BadField { field: String },
    #[error("no index on {field:?} (indexed: {indexed:?}); create one first")]
    NotIndexed { field: String, indexed: Vec<String> },
    #[error("{value} cannot be looked up: only null, booleans, numbers and strings are keys")]
    NotAKey { value: String },
    #[error("{path}: not written, since it could not be read back: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("{path}: {message}")]
    Declared { path: PathBuf, message: String },
}

type Result<T> = std::result::Result<T, DocError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DocError + '_ {
    move |source| DocError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What opening (and the first load of the indexes) found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recovery {
    /// The previous writer died while the collection was open.
    pub crashed: bool,
    /// Orphaned temporary files removed.
    pub temp_files_removed: u64,
    /// The machine restarted since that crash (another boot id), so the
    /// index journal, never fsynced per write, was not trusted.
    pub rebooted: bool,
    /// Records whose interrupted write was re-checked against their file
    /// when the indexes loaded.
    pub rechecked: u64,
    /// Why the indexes were rebuilt from the files when they loaded.
    pub rebuilt_because: Option<String>,
}

/// An open collection (the only writer while it is open).
pub struct Collection {
    dir: PathBuf,
    lock: crate::writer_lock::WriterLock,
    recovery: Recovery,
    /// Fields with a secondary index (from `indexes.json`).
    fields: Vec<String>,
    /// The indexes, loaded on first use.
    index: Option<IndexState>,
    /// Appends to the journal.
    journal: Option<File>,
    /// The journal holds every write so far: false when it is missing
    /// (discarded after a crash, or never written) until it is rebuilt
    /// from the files; appends to it would make it look whole, so none
    /// are made.
    journal_usable: bool,
    /// Lines in the journal: counted from its load (or its last rewrite)
    /// when the indexes are loaded, else the lines appended since open.
    journal_lines: u64,
}

impl Collection {
    /// Opens (creating if needed) the collection in `dir` for writing.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Collection> {
        let dir = dir.into();
        std::fs::create_dir_all(dir.join("data")).map_err(io(&dir))?;
        let lock = lock::take(&dir)?;
        let fields = indexes::read_fields(&dir)?;
        let marker = lock::read_marker(&dir);
        let mut recovery = Recovery {
            crashed: marker.crashed,
            rebooted: marker.rebooted,
            ..Recovery::default()
        };
        if marker.crashed {
            recovery.temp_files_removed =
                files::remove_temp_files(&dir.join("data"))? + files::remove_temps_in(&dir)?;
        }
        lock::mark_dirty(&dir, marker.boot.as_deref())?;
        let journal_usable = journal::prepare(&dir, &fields, &marker)?;
        Ok(Collection {
            dir,
            lock,
            recovery,
            fields,
            index: None,
            journal: None,
            journal_usable,
            journal_lines: 0,
        })
    }

    /// What opening and the first load of the indexes found and did.
    pub fn recovery(&self) -> Recovery {
        self.recovery.clone()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Fields with a secondary index.
    pub fn indexed_fields(&self) -> &[String] {
        &self.fields
    }

    /// Marks the collection clean and releases the lock. The journal is
    /// fsynced first, whoever wrote it (a crashed writer's last lines may
    /// still be only in the page cache): a clean state promises it is
    /// whole.
    pub fn close(self) -> Result<()> {
        let discard_journal = journal::settle(&self.dir, self.journal_usable)?;
        lock::mark_clean(&self.dir, discard_journal)?;
        drop(self.lock);
        Ok(())
    }
}
