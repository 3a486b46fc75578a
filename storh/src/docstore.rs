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

use crate::id::{self, Id};
use crate::index::{self, IndexKey, IndexState};
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::ops::Bound;
use std::os::fd::AsRawFd;
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
    lock: File,
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
}

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub path: PathBuf,
    pub reason: String,
}

/// One result of [`Collection::range`]: the key it was found under (an
/// array field can list a record under several), its id and the record.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub key: Value,
    pub id: Id,
    pub doc: Value,
}

/// One page of [`Collection::stream_page`].
#[derive(Debug, Clone, Default)]
pub struct StreamPage {
    pub records: Vec<(Id, Value)>,
    /// Records that could not be read, with the reason.
    pub bad: Vec<Finding>,
    /// The cursor for the next page; `None` when this page was empty.
    pub last: Option<Id>,
}

/// Counts from the indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub records: u64,
    /// Each indexed field and its number of entries.
    pub indexes: Vec<(String, u64)>,
}

const TEMP_SUFFIX: &str = ".tmp";

/// This boot of the machine (Linux), to tell a process crash from a
/// machine crash.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Whether the file ends with a newline (read from its last byte only).
fn ends_with_newline(path: &Path) -> bool {
    let Ok(mut f) = File::open(path) else {
        return false;
    };
    let mut last = [0u8; 1];
    f.seek(std::io::SeekFrom::End(-1)).is_ok()
        && f.read_exact(&mut last).is_ok()
        && last[0] == b'\n'
}

impl Collection {
    /// Opens (creating if needed) the collection in `dir` for writing.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Collection> {
        let dir = dir.into();
        std::fs::create_dir_all(dir.join("data")).map_err(io(&dir))?;
        let lock_path = dir.join("lock");
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        // SAFETY: flock on a descriptor we own; no memory involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            return Err(DocError::Locked {
                path: dir,
                holder: if holder.trim().is_empty() {
                    "unknown holder".to_string()
                } else {
                    holder.trim().to_string()
                },
            });
        }
        // Who holds it, for the error another opener gets (informational).
        lock.set_len(0).map_err(io(&lock_path))?;
        let holder = format!(
            "pid {} since {:?}",
            std::process::id(),
            std::time::SystemTime::now()
        );
        lock.write_all(holder.as_bytes()).map_err(io(&lock_path))?;
        let fields = read_fields(&dir)?;
        let state_path = dir.join("state");
        let previous = std::fs::read_to_string(&state_path).unwrap_or_default();
        let mut words = previous.split_whitespace();
        let first = words.next();
        let crashed = first == Some("dirty");
        let second = words.next();
        let boot = boot_id();
        // No boot id on either side: assume the worst.
        let rebooted = crashed && (boot.is_none() || second != boot.as_deref());
        let discard = first == Some("clean") && second == Some("rebuild");
        let mut recovery = Recovery {
            crashed,
            rebooted,
            ..Recovery::default()
        };
        if crashed {
            recovery.temp_files_removed =
                remove_temp_files(&dir.join("data"))? + remove_temps_in(&dir)?;
        }
        let marker = format!("dirty {}\n", boot.as_deref().unwrap_or("unknown"));
        write_durably(&state_path, marker.as_bytes())?;
        let journal_path = dir.join(index::JOURNAL);
        if discard || (crashed && (rebooted || !ends_with_newline(&journal_path))) {
            // Lines may be missing (a machine crash) or torn: rebuilt from
            // the files when the indexes are first needed (opening stays
            // O(1)).
            match std::fs::remove_file(&journal_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&journal_path)(e)),
            }
        }
        let fresh = std::fs::read_dir(dir.join("data"))
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        if fresh && !journal_path.exists() {
            write_durably(&journal_path, index::header(&fields).as_bytes())?;
        }
        let journal_usable = journal_path.exists();
        Ok(Collection {
            dir,
            lock,
            recovery,
            fields,
            index: None,
            journal: None,
            journal_usable,
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

    /// The file of record `id` (whether or not it exists).
    pub fn path_of(&self, id: &str) -> Result<PathBuf> {
        let bucket = id::bucket(id).ok_or_else(|| DocError::BadId { id: id.to_string() })?;
        Ok(self
            .dir
            .join("data")
            .join(bucket)
            .join(format!("{id}.jsonc")))
    }

    /// Stores `value` under a new id; returns the id.
    pub fn insert(&mut self, value: &Value) -> Result<Id> {
        let id = id::new_id();
        self.put(&id, value)?;
        Ok(id)
    }

    /// Stores `value` under `id`, replacing what was there.
    pub fn put(&mut self, id: &str, value: &Value) -> Result<()> {
        let path = self.path_of(id)?;
        let text = serde_json::to_vec_pretty(value).map_err(|e| DocError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        self.journal_append(&index::intent_line(id))?;
        let written = write_durably(&path, &text)
            .and_then(|()| self.journal_append(&index::put_lines(&self.fields, id, value)));
        if let Err(e) = written {
            // The file may or may not have changed: the index follows it.
            self.recheck([id]);
            return Err(e);
        }
        if let Some(state) = &mut self.index {
            state.set_record(id, Some(Some(value)));
        }
        Ok(())
    }

    /// After a failed write: makes the loaded index say what the files of
    /// `ids` say now (the journal's unfinished intents do the same for the
    /// next load).
    fn recheck<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>) {
        if self.index.is_none() {
            return;
        }
        for id in ids {
            // Unreadable: leave the entry; the intent re-checks it later.
            if let Ok(record) = self.read_record(id) {
                if let Some(state) = &mut self.index {
                    state.set_record(id, record.as_ref().map(Option::as_ref));
                }
            }
        }
    }

    /// Stores each of `docs` under a new id, durably and each atomically,
    /// with two filesystem syncs for the whole batch instead of two fsyncs
    /// per record: every temporary file is written, `syncfs` makes them
    /// durable, they are renamed into place, and `syncfs` again makes the
    /// renames durable. For bulk loads (`syncfs` flushes the whole
    /// filesystem the collection lives on). Returns the ids, in order. On
    /// an error none of the batch is kept (files already renamed into
    /// place are removed again), so the batch can be retried.
    pub fn insert_many(&mut self, docs: &[Value]) -> Result<Vec<Id>> {
        let ids: Vec<Id> = docs.iter().map(|_| id::new_id()).collect();
        let mut staged = Vec::with_capacity(docs.len());
        for (id, doc) in ids.iter().zip(docs) {
            let path = self.path_of(id)?;
            let text = serde_json::to_vec_pretty(doc).map_err(|e| DocError::Json {
                path: path.clone(),
                message: e.to_string(),
            })?;
            staged.push((path, text));
        }
        let intents: String = ids.iter().map(|id| index::intent_line(id)).collect();
        self.journal_append(&intents)?;
        let mut renamed = 0;
        let landed = self.land_batch(&staged, &mut renamed).and_then(|()| {
            let mut commits = String::new();
            for (id, doc) in ids.iter().zip(docs) {
                commits.push_str(&index::put_lines(&self.fields, id, doc));
            }
            self.journal_append(&commits)
        });
        if let Err(e) = landed {
            for (path, _) in &staged[..renamed] {
                let _ = std::fs::remove_file(path);
            }
            self.recheck(ids.iter().map(String::as_str));
            return Err(e);
        }
        if let Some(state) = &mut self.index {
            for (id, doc) in ids.iter().zip(docs) {
                state.set_record(id, Some(Some(doc)));
            }
        }
        Ok(ids)
    }

    /// Writes the batch's files: temporaries, `syncfs`, renames, `syncfs`.
    /// `renamed` counts the files renamed into place; on an error the
    /// temporaries not renamed are removed.
    fn land_batch(&self, staged: &[(PathBuf, Vec<u8>)], renamed: &mut usize) -> Result<()> {
        let mut temps = Vec::with_capacity(staged.len());
        let written = (|| {
            let mut buckets = std::collections::BTreeSet::new();
            for (path, text) in staged {
                let dir = path.parent().unwrap_or(&self.dir);
                if buckets.insert(dir.to_path_buf()) {
                    std::fs::create_dir_all(dir).map_err(io(dir))?;
                }
                let temp = temp_path(path);
                temps.push(temp.clone());
                std::fs::write(&temp, text).map_err(io(&temp))?;
            }
            let data = self.dir.join("data");
            let handle = File::open(&data).map_err(io(&data))?;
            // Every temporary file's bytes are on disk before any is
            // renamed into place, so no record is ever seen half written.
            syncfs(&handle, &data)?;
            for (temp, (path, _)) in temps.iter().zip(staged) {
                std::fs::rename(temp, path).map_err(io(path))?;
                *renamed += 1;
            }
            // And the renames, with any new bucket directory (directory
            // entries are filesystem metadata): one call for them all.
            syncfs(&handle, &data)
        })();
        if written.is_err() {
            for temp in &temps[*renamed..] {
                let _ = std::fs::remove_file(temp);
            }
        }
        written
    }

    /// Changes record `id` in place with `change`; false (and nothing
    /// written) if there is no such record.
    pub fn update(&mut self, id: &str, change: impl FnOnce(&mut Value)) -> Result<bool> {
        let Some(mut doc) = self.get(id)? else {
            return Ok(false);
        };
        change(&mut doc);
        self.put(id, &doc)?;
        Ok(true)
    }

    /// The record `id`, if it exists. Comments in the file are accepted.
    pub fn get(&self, id: &str) -> Result<Option<Value>> {
        let path = self.path_of(id)?;
        match std::fs::read(&path) {
            Ok(bytes) => parse_jsonc(&path, &bytes).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Removes record `id`; false if there was none.
    pub fn delete(&mut self, id: &str) -> Result<bool> {
        let path = self.path_of(id)?;
        self.journal_append(&index::intent_line(id))?;
        let removed = match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(path.parent().unwrap_or(&self.dir)).map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path)(e)),
        };
        let existed = match removed.and_then(|existed| {
            self.journal_append(&index::delete_lines(id))
                .map(|()| existed)
        }) {
            Ok(existed) => existed,
            Err(e) => {
                self.recheck([id]);
                return Err(e);
            }
        };
        if let Some(state) = &mut self.index {
            state.set_record(id, None);
        }
        Ok(existed)
    }

    fn journal_append(&mut self, lines: &str) -> Result<()> {
        if !self.journal_usable {
            // Rebuilt from the files (which this write reaches) when the
            // indexes are first needed.
            return Ok(());
        }
        let path = self.dir.join(index::JOURNAL);
        if self.journal.is_none() {
            let file = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io(&path))?;
            self.journal = Some(file);
        }
        if let Some(j) = &mut self.journal {
            // One write per call, so a killed writer leaves whole lines.
            if let Err(e) = j.write_all(lines.as_bytes()) {
                // Part of the lines may have landed, and later writes
                // would not: the journal no longer holds every write.
                self.abandon_journal();
                return Err(io(&path)(e));
            }
        }
        Ok(())
    }

    /// Stops journaling after a failed append: the journal is removed so
    /// the next load rebuilds from the files; if even that fails, `close`
    /// leaves a state that makes the next open discard it. The loaded
    /// indexes stay: the callers re-check what they were writing.
    fn abandon_journal(&mut self) {
        self.journal = None;
        self.journal_usable = false;
        let _ = std::fs::remove_file(self.dir.join(index::JOURNAL));
    }

    /// The indexes, loaded on first use.
    fn index(&mut self) -> Result<&IndexState> {
        if self.index.is_none() {
            let state = self.load_index()?;
            self.index = Some(state);
        }
        Ok(self.index.get_or_insert_with(IndexState::default))
    }

    /// Reads the journal, re-checking the writes it shows unfinished; or,
    /// if it is missing or cannot be trusted, rebuilds from the files.
    fn load_index(&mut self) -> Result<IndexState> {
        let path = self.dir.join(index::JOURNAL);
        let why = if !self.journal_usable {
            "the index journal is missing or was discarded after a crash".to_string()
        } else {
            match std::fs::read_to_string(&path) {
                Ok(text) => match IndexState::replay(&text, &self.fields) {
                    Ok(replayed) => {
                        let mut state = replayed.state;
                        for id in &replayed.unfinished {
                            let record = self.read_record(id)?;
                            state.set_record(id, record.as_ref().map(Option::as_ref));
                        }
                        self.recovery.rechecked += replayed.unfinished.len() as u64;
                        if !replayed.unfinished.is_empty()
                            || replayed.lines > 2 * state.live_lines() + 1024
                        {
                            self.write_journal(&state)?;
                        }
                        return Ok(state);
                    }
                    Err(why) => format!("{}: {why}", path.display()),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    format!("{}: missing", path.display())
                }
                Err(e) => return Err(io(&path)(e)),
            }
        };
        self.recovery.rebuilt_because = Some(why);
        self.rebuild(|_| {})
    }

    /// What the file of `id` holds: `None` if there is none, `Some(None)`
    /// if it does not parse.
    fn read_record(&self, id: &str) -> Result<Option<Option<Value>>> {
        let path = self.path_of(id)?;
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(parse_jsonc(&path, &bytes).ok())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Builds every index from the files (reading each one) and writes
    /// the journal afresh. `progress` gets the number of files done.
    fn rebuild(&mut self, mut progress: impl FnMut(u64)) -> Result<IndexState> {
        let mut state = IndexState::new(&self.fields);
        let mut done = 0;
        let mut failed = None;
        walk(&self.dir.join("data"), |path, name, bucket| {
            done += 1;
            progress(done);
            let Some(id) = name.strip_suffix(".jsonc") else {
                return;
            };
            if id::bucket(id) != Some(bucket) || failed.is_some() {
                // Misplaced files are not records (`verify` names them).
                return;
            }
            match std::fs::read(path) {
                Ok(bytes) => {
                    let doc = parse_jsonc(path, &bytes).ok();
                    state.set_record(id, Some(doc.as_ref()));
                }
                // Deleted while we walked: not a record.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => failed = Some(io(path)(e)),
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        self.write_journal(&state)?;
        Ok(state)
    }

    fn write_journal(&mut self, state: &IndexState) -> Result<()> {
        // Whatever happens below, appends must not go to a replaced file.
        self.journal = None;
        write_durably(&self.dir.join(index::JOURNAL), state.snapshot().as_bytes())?;
        self.journal_usable = true;
        Ok(())
    }

    /// Up to `limit` records in id order, after `after` (a cursor: the last
    /// id of the previous page; `None` for the first page). Pages are
    /// served from the id index, never by walking the buckets.
    pub fn stream(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<(Id, Value)>> {
        let page = self.list_ids(after, limit)?;
        let mut out = Vec::with_capacity(page.len());
        for id in page {
            if let Some(v) = self.get(&id)? {
                out.push((id, v));
            }
        }
        Ok(out)
    }

    /// Like [`stream`](Self::stream), but a record whose file cannot be
    /// read or parsed does not stop the walk: it is reported in the page's
    /// `bad` list (path and reason) and the page goes on. `last` is the
    /// cursor for the next page (the last id looked at).
    pub fn stream_page(&mut self, after: Option<&str>, limit: usize) -> Result<StreamPage> {
        let ids = self.list_ids(after, limit)?;
        let mut page = StreamPage {
            last: ids.last().cloned(),
            ..StreamPage::default()
        };
        for id in ids {
            match self.get(&id) {
                Ok(Some(v)) => page.records.push((id, v)),
                Ok(None) => {}
                Err(e) => page.bad.push(Finding {
                    path: self.path_of(&id)?,
                    reason: match e {
                        DocError::Json { message, .. } => format!("invalid JSONC: {message}"),
                        other => other.to_string(),
                    },
                }),
            }
        }
        Ok(page)
    }

    /// Up to `limit` record ids in order after `after`, from the id index
    /// (no file is read).
    pub fn list_ids(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<Id>> {
        let start = match after {
            Some(a) => Bound::Excluded(cursor_num(a)?),
            None => Bound::Unbounded,
        };
        Ok(self
            .index()?
            .ids()
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|&n| id::from_u128(n))
            .collect())
    }

    /// Declares a secondary index on `field` (a dot path; an array field
    /// indexes each scalar element) and builds it, reading every record.
    /// False if it existed already.
    pub fn create_index(&mut self, field: &str) -> Result<bool> {
        self.create_index_with(field, |_| {})
    }

    /// [`create_index`](Self::create_index), reporting files read.
    pub fn create_index_with(&mut self, field: &str, progress: impl FnMut(u64)) -> Result<bool> {
        if !index::valid_field(field) {
            return Err(DocError::BadField {
                field: field.to_string(),
            });
        }
        if self.fields.iter().any(|f| f == field) {
            return Ok(false);
        }
        self.fields.push(field.to_string());
        // The journal's header still names the old fields: should we die
        // before the rebuild below finishes, the next load sees the
        // mismatch and rebuilds.
        write_fields(&self.dir, &self.fields)?;
        self.index = None;
        let state = self.rebuild(progress)?;
        self.index = Some(state);
        Ok(true)
    }

    /// Drops the index on `field`; false if there was none.
    pub fn drop_index(&mut self, field: &str) -> Result<bool> {
        if !self.fields.iter().any(|f| f == field) {
            return Ok(false);
        }
        self.fields.retain(|f| f != field);
        write_fields(&self.dir, &self.fields)?;
        // The remaining entries are re-derived from the files.
        self.index = None;
        let state = self.rebuild(|_| {})?;
        self.index = Some(state);
        Ok(true)
    }

    fn indexed(
        &mut self,
        field: &str,
    ) -> Result<&std::collections::BTreeSet<(IndexKey, index::IdNum)>> {
        let state = self.index()?;
        state.entries(field).ok_or_else(|| DocError::NotIndexed {
            field: field.to_string(),
            indexed: state.fields().to_vec(),
        })
    }

    /// Record `id` with its text id, if its file still has `key` under
    /// `field`: the file decides, an index entry never overrides what the
    /// record says now.
    fn checked(
        &self,
        field: &str,
        key: &IndexKey,
        id: index::IdNum,
    ) -> Result<Option<(Id, Value)>> {
        let id = id::from_u128(id);
        Ok(self
            .get(&id)?
            .filter(|doc| index::keys_of(doc, field).contains(key))
            .map(|doc| (id, doc)))
    }

    /// Up to `limit` records whose `field` equals `value` (or, for an
    /// array field, contains it), in id order after the id cursor `after`.
    /// Served from the index on `field` if there is one; otherwise every
    /// record is read (a scan). Numbers compare as f64 (`2` finds `2.0`).
    pub fn find(
        &mut self,
        field: &str,
        value: &Value,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(Id, Value)>> {
        let key = IndexKey::of(value).ok_or_else(|| DocError::NotAKey {
            value: value.to_string(),
        })?;
        let indexed = self.fields.iter().any(|f| f == field);
        let mut out = Vec::new();
        let mut cursor = after.map(cursor_num).transpose()?;
        while out.len() < limit {
            // Candidates in id order: the index's entries for the key, or
            // every id.
            let batch: Vec<index::IdNum> = if indexed {
                let lower = match cursor {
                    Some(c) => Bound::Excluded((key.clone(), c)),
                    None => Bound::Included((key.clone(), 0)),
                };
                self.indexed(field)?
                    .range((lower, Bound::Unbounded))
                    .take_while(|(k, _)| *k == key)
                    .take(limit.max(16))
                    .map(|&(_, id)| id)
                    .collect()
            } else {
                let lower = match cursor {
                    Some(c) => Bound::Excluded(c),
                    None => Bound::Unbounded,
                };
                self.index()?
                    .ids()
                    .range((lower, Bound::Unbounded))
                    .take(limit.max(16))
                    .copied()
                    .collect()
            };
            let Some(&last) = batch.last() else {
                break;
            };
            for id in batch {
                if let Some(hit) = self.checked(field, &key, id)? {
                    out.push(hit);
                    if out.len() == limit {
                        break;
                    }
                }
            }
            cursor = Some(last);
        }
        Ok(out)
    }

    /// Up to `limit` records with a key of `field` between `lower` and
    /// `upper`, in key order then id order, after the cursor `after` (the
    /// key and id of the last hit of the previous page). Needs an index on
    /// `field`.
    pub fn range(
        &mut self,
        field: &str,
        lower: Bound<&Value>,
        upper: Bound<&Value>,
        after: Option<(&Value, &str)>,
        limit: usize,
    ) -> Result<Vec<Hit>> {
        let as_key = |v: &Value| {
            IndexKey::of(v).ok_or_else(|| DocError::NotAKey {
                value: v.to_string(),
            })
        };
        // (key, 0) sorts before every entry of that key, (key, MAX) after
        // (ids are hex digits and dashes).
        let mut start = match lower {
            Bound::Included(v) => Bound::Included((as_key(v)?, 0)),
            Bound::Excluded(v) => Bound::Excluded((as_key(v)?, u128::MAX)),
            Bound::Unbounded => Bound::Unbounded,
        };
        if let Some((k, id)) = after {
            let cursor = (as_key(k)?, cursor_num(id)?);
            let past = match &start {
                Bound::Included(s) | Bound::Excluded(s) => cursor >= *s,
                Bound::Unbounded => true,
            };
            if past {
                start = Bound::Excluded(cursor);
            }
        }
        let end = match upper {
            Bound::Included(v) => Bound::Included((as_key(v)?, u128::MAX)),
            Bound::Excluded(v) => Bound::Excluded((as_key(v)?, 0)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        while out.len() < limit && nonempty(&start, &end) {
            let batch: Vec<(IndexKey, index::IdNum)> = self
                .indexed(field)?
                .range((start.clone(), end.clone()))
                .take(limit.max(16))
                .cloned()
                .collect();
            let Some(last) = batch.last().cloned() else {
                break;
            };
            for (key, id) in batch {
                if let Some((id, doc)) = self.checked(field, &key, id)? {
                    out.push(Hit {
                        key: key.to_value(),
                        id,
                        doc,
                    });
                    if out.len() == limit {
                        break;
                    }
                }
            }
            start = Bound::Excluded(last);
        }
        Ok(out)
    }

    /// Records and index entries, from the indexes.
    pub fn stats(&mut self) -> Result<Stats> {
        let fields = self.fields.clone();
        let state = self.index()?;
        Ok(Stats {
            records: state.ids().len() as u64,
            indexes: fields
                .iter()
                .map(|f| (f.clone(), state.entries(f).map_or(0, |e| e.len() as u64)))
                .collect(),
        })
    }

    /// Rebuilds every index from the files (reading each one); returns
    /// the number of records.
    pub fn reindex(&mut self) -> Result<u64> {
        self.reindex_with(|_| {})
    }

    /// [`reindex`](Self::reindex), reporting files read.
    pub fn reindex_with(&mut self, progress: impl FnMut(u64)) -> Result<u64> {
        self.index = None;
        let state = self.rebuild(progress)?;
        let n = state.ids().len() as u64;
        self.index = Some(state);
        Ok(n)
    }

    /// Checks every file: a record must be valid JSONC, named `<id>.jsonc`
    /// with a canonical id, in the bucket its id names. Returns what is
    /// wrong, with the path and the reason; `ok` counts the good records.
    pub fn verify(&self) -> Result<(u64, Vec<Finding>)> {
        self.verify_with(|_| {})
    }

    /// [`verify`](Self::verify), reporting files checked.
    pub fn verify_with(&self, mut progress: impl FnMut(u64)) -> Result<(u64, Vec<Finding>)> {
        let mut ok = 0;
        let mut done = 0;
        let mut findings = Vec::new();
        walk(&self.dir.join("data"), |path, name, bucket| {
            done += 1;
            progress(done);
            let finding = |reason: String| Finding {
                path: path.to_path_buf(),
                reason,
            };
            if name.ends_with(TEMP_SUFFIX) {
                findings.push(finding(
                    "temporary file left by an interrupted write".into(),
                ));
                return;
            }
            let Some(id) = name.strip_suffix(".jsonc") else {
                findings.push(finding("not a .jsonc record file".into()));
                return;
            };
            let Some(right) = id::bucket(id) else {
                findings.push(finding(format!("{id:?} is not a canonical UUID")));
                return;
            };
            if right != bucket {
                findings.push(finding(format!(
                    "in bucket {bucket}, but its id belongs in {right}"
                )));
                return;
            }
            match std::fs::read(path)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    parse_jsonc(path, &b).map_err(|e| match e {
                        // The finding names the path already.
                        DocError::Json { message, .. } => message,
                        other => other.to_string(),
                    })
                }) {
                Ok(_) => ok += 1,
                Err(e) => findings.push(finding(format!("invalid JSONC: {e}"))),
            }
        })?;
        Ok((ok, findings))
    }

    /// Marks the collection clean and releases the lock. The journal is
    /// fsynced first, whoever wrote it (a crashed writer's last lines may
    /// still be only in the page cache): a clean state promises it is
    /// whole.
    pub fn close(self) -> Result<()> {
        let path = self.dir.join(index::JOURNAL);
        let state = if self.journal_usable {
            match File::open(&path) {
                Ok(j) => j.sync_all().map_err(io(&path))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path)(e)),
            }
            "clean\n"
        } else if path.exists() {
            // A journal we stopped appending to and could not remove.
            "clean rebuild\n"
        } else {
            "clean\n"
        };
        write_durably(&self.dir.join("state"), state.as_bytes())?;
        drop(self.lock);
        Ok(())
    }
}

/// A cursor id as the indexes hold it.
fn cursor_num(id: &str) -> Result<index::IdNum> {
    id::to_u128(id).ok_or_else(|| DocError::BadId { id: id.to_string() })
}

/// Whether `start..end` holds anything (and `BTreeSet::range` accepts it:
/// it panics on a start past the end, or equal ones both excluded).
fn nonempty<T: Ord>(start: &Bound<T>, end: &Bound<T>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s <= e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Included(e) | Bound::Excluded(e)) => s < e,
        _ => true,
    }
}

/// How a collection's files lie in its buckets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    /// Bucket directories present (at most 256).
    pub buckets: u64,
    /// Files in them, of any kind.
    pub files: u64,
    /// Fewest and most files in one bucket.
    pub min_per_bucket: u64,
    pub max_per_bucket: u64,
    /// Bytes in those files.
    pub bytes: u64,
}

impl Collection {
    /// Files in the buckets, counted from the directory listings alone
    /// (no file is opened): a quick total for progress reports.
    pub fn count_files(&self) -> Result<u64> {
        let mut n = 0;
        walk(&self.dir.join("data"), |_, _, _| n += 1)?;
        Ok(n)
    }

    /// Walks the buckets for their sizes, reporting files seen.
    pub fn layout_with(&self, mut progress: impl FnMut(u64)) -> Result<Layout> {
        let mut per_bucket = std::collections::BTreeMap::<String, u64>::new();
        let mut layout = Layout::default();
        walk(&self.dir.join("data"), |path, _, bucket| {
            layout.files += 1;
            progress(layout.files);
            *per_bucket.entry(bucket.to_string()).or_default() += 1;
            layout.bytes += std::fs::symlink_metadata(path).map_or(0, |m| m.len());
        })?;
        layout.buckets = per_bucket.len() as u64;
        layout.min_per_bucket = per_bucket.values().copied().min().unwrap_or(0);
        layout.max_per_bucket = per_bucket.values().copied().max().unwrap_or(0);
        Ok(layout)
    }
}

/// The declared index fields (`indexes.json`, a JSON list of strings).
fn read_fields(dir: &Path) -> Result<Vec<String>> {
    let path = dir.join(index::FIELDS);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&path)(e)),
    };
    let fields: Vec<String> = serde_json::from_str(&text).map_err(|e| DocError::Declared {
        path: path.clone(),
        message: format!("not a JSON list of field names: {e}"),
    })?;
    if let Some(bad) = fields.iter().find(|f| !index::valid_field(f)) {
        return Err(DocError::Declared {
            path,
            message: format!("{bad:?} is not an indexable field"),
        });
    }
    Ok(fields)
}

fn write_fields(dir: &Path, fields: &[String]) -> Result<()> {
    let text = serde_json::to_vec_pretty(fields).unwrap_or_else(|_| b"[]".to_vec());
    write_durably(&dir.join(index::FIELDS), &text)
}

/// Parses JSON with `//` and `/* */` comments.
pub fn parse_jsonc(path: &Path, bytes: &[u8]) -> Result<Value> {
    serde_json::from_reader(json_comments::StripComments::new(bytes)).map_err(|e| DocError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Where a write of `path` stages its bytes: a hidden `.tmp` file beside
/// it, removed as an orphan after a crash.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}{TEMP_SUFFIX}", std::process::id()))
}

/// Writes `bytes` to `path` atomically and durably: a temporary file in
/// the same directory, fsync, rename, fsync of the directory.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        // A new bucket must be durable in its parent, too.
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
    }
    let temp = temp_path(path);
    let staged = (|| {
        let mut file = File::create(&temp).map_err(io(&temp))?;
        file.write_all(bytes).map_err(io(&temp))?;
        file.sync_all().map_err(io(&temp))?;
        drop(file);
        std::fs::rename(&temp, path).map_err(io(path))
    })();
    if staged.is_err() {
        // Not left for `verify` to report until some later crash.
        let _ = std::fs::remove_file(&temp);
    }
    staged?;
    sync_dir(dir)
}

/// Flushes the whole filesystem `handle` lives on (Linux `syncfs`).
fn syncfs(handle: &File, path: &Path) -> Result<()> {
    // SAFETY: syncfs on a descriptor we own; no memory involved.
    if unsafe { libc::syncfs(handle.as_raw_fd()) } != 0 {
        return Err(io(path)(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Calls `each(path, file name, bucket name)` for every file in every
/// bucket of `data`.
fn walk(data: &Path, mut each: impl FnMut(&Path, &str, &str)) -> Result<()> {
    for bucket in std::fs::read_dir(data).map_err(io(data))? {
        let bucket = bucket.map_err(io(data))?.path();
        if !bucket.is_dir() {
            continue;
        }
        let bucket_name = bucket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for entry in std::fs::read_dir(&bucket).map_err(io(&bucket))? {
            let path = entry.map_err(io(&bucket))?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            each(&path, &name, &bucket_name);
        }
    }
    Ok(())
}

/// Removes `*.tmp` files in every bucket of `data`; returns how many.
fn remove_temp_files(data: &Path) -> Result<u64> {
    let mut removed = 0;
    for bucket in std::fs::read_dir(data).map_err(io(data))? {
        let bucket = bucket.map_err(io(data))?.path();
        if bucket.is_dir() {
            removed += remove_temps_in(&bucket)?;
        }
    }
    Ok(removed)
}

/// Removes the `*.tmp` files directly in `dir`; returns how many.
fn remove_temps_in(dir: &Path) -> Result<u64> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        if path.is_file() && path.to_string_lossy().ends_with(TEMP_SUFFIX) {
            std::fs::remove_file(&path).map_err(io(&path))?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_live_in_the_bucket_their_id_names() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collection::open(dir.path().join("pages")).unwrap();
        let id = c.insert(&json!({"title": "hello"})).unwrap();
        let file = dir
            .path()
            .join("pages/data")
            .join(&id[24..26])
            .join(format!("{id}.jsonc"));
        assert!(file.is_file(), "{}", file.display());
        assert_eq!(c.get(&id).unwrap(), Some(json!({"title": "hello"})));
        c.put(&id, &json!({"title": "changed"})).unwrap();
        assert_eq!(c.get(&id).unwrap().unwrap()["title"], "changed");
        assert!(c.delete(&id).unwrap());
        assert!(!c.delete(&id).unwrap());
        assert_eq!(c.get(&id).unwrap(), None);
        assert!(matches!(c.get("nope"), Err(DocError::BadId { .. })));
        c.close().unwrap();
    }

    #[test]
    fn comments_in_jsonc_files_are_accepted_on_read() {
        let dir = tempfile::tempdir().unwrap();
        let c = Collection::open(dir.path()).unwrap();
        let id = "018bcfe5-6800-7000-8000-2d5dba6274da";
        let path = c.path_of(id).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            "// a note\n{\n  \"a\": 1, /* inline */\n  \"b\": \"// not a comment\"\n}\n",
        )
        .unwrap();
        assert_eq!(
            c.get(id).unwrap(),
            Some(json!({"a": 1, "b": "// not a comment"}))
        );
        std::fs::write(&path, "{ broken").unwrap();
        let e = c.get(id).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    #[test]
    fn a_second_writer_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = Collection::open(dir.path()).unwrap();
        // flock locks belong to the open file description: a second open
        // in this process is refused like another process would be.
        let e = Collection::open(dir.path()).err().unwrap().to_string();
        assert!(
            e.contains("another process") && e.contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
        first.close().unwrap();
        let again = Collection::open(dir.path()).unwrap();
        assert_eq!(again.recovery(), Recovery::default(), "a clean close");
    }

    #[test]
    fn stream_pages_cross_buckets_as_one_ordered_list() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        let mut ids: Vec<Id> = (0..500)
            .map(|i| c.insert(&json!({ "i": i })).unwrap())
            .collect();
        // An id from elsewhere (older) and a deleted one.
        let foreign = "00000000-0000-7000-8000-000000000001".to_string();
        c.put(&foreign, &json!({"i": -1})).unwrap();
        ids.insert(0, foreign);
        let gone = ids.remove(250);
        assert!(c.delete(&gone).unwrap());
        let buckets: std::collections::BTreeSet<&str> = ids.iter().map(|i| &i[24..26]).collect();
        assert!(buckets.len() > 100, "the records span many buckets");
        let mut seen = Vec::new();
        let mut cursor: Option<Id> = None;
        loop {
            let page = c.stream(cursor.as_deref(), 37).unwrap();
            if page.is_empty() {
                break;
            }
            cursor = Some(page.last().unwrap().0.clone());
            seen.extend(page.into_iter().map(|(id, _)| id));
        }
        assert_eq!(seen, ids, "every record once, in id order");
        // The index survives a clean close and comes back from the journal.
        c.close().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        let first = c.stream(None, 3).unwrap();
        assert_eq!(first[0].1["i"], -1);
        assert_eq!(c.reindex().unwrap(), ids.len() as u64);
    }

    #[test]
    fn verify_names_bad_files_with_their_reason() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        let good = c.insert(&json!({"ok": true})).unwrap();
        let data = dir.path().join("data");
        let wrong_bucket = data
            .join("00")
            .join("018bcfe5-6800-7000-8000-2d5dba6274da.jsonc");
        std::fs::create_dir_all(wrong_bucket.parent().unwrap()).unwrap();
        std::fs::write(&wrong_bucket, "{}").unwrap();
        let bad_json = data
            .join(&good[24..26])
            .join("018bcfe5-6800-7000-8000-".to_string() + &good[24..26] + "0000000000.jsonc");
        std::fs::write(&bad_json, "{ nope").unwrap();
        let bad_name = data.join("ab").join("notes.txt");
        std::fs::create_dir_all(bad_name.parent().unwrap()).unwrap();
        std::fs::write(&bad_name, "x").unwrap();
        let (ok, findings) = c.verify().unwrap();
        assert_eq!(ok, 1);
        let reason = |p: &Path| {
            findings
                .iter()
                .find(|f| f.path == p)
                .map(|f| f.reason.clone())
                .unwrap_or_default()
        };
        assert!(
            reason(&wrong_bucket).contains("belongs in 2d"),
            "{findings:?}"
        );
        assert!(reason(&bad_json).contains("invalid JSONC"), "{findings:?}");
        assert!(reason(&bad_name).contains("not a .jsonc"), "{findings:?}");
        assert_eq!(findings.len(), 3);
    }

    #[test]
    fn a_dirty_state_without_a_holder_means_a_crash_and_temp_files_go() {
        let dir = tempfile::tempdir().unwrap();
        let c = Collection::open(dir.path()).unwrap();
        let id = "018bcfe5-6800-7000-8000-2d5dba6274da";
        let orphan = c
            .path_of(id)
            .unwrap()
            .with_file_name(format!(".{id}.jsonc.999.tmp"));
        std::fs::create_dir_all(orphan.parent().unwrap()).unwrap();
        std::fs::write(&orphan, "{\"half\":").unwrap();
        // Dropped without close: the state stays dirty, the lock goes.
        drop(c);
        let c = Collection::open(dir.path()).unwrap();
        assert_eq!(
            c.recovery(),
            Recovery {
                crashed: true,
                temp_files_removed: 1,
                ..Recovery::default()
            }
        );
        assert!(!orphan.exists());
        // A record written before the crash and one after it are both
        // listed (the journal is rebuilt, not continued).
        let mut c = c;
        let before = c.insert(&json!({"n": 1})).unwrap();
        drop(c); // another crash
        let mut c = Collection::open(dir.path()).unwrap();
        let after = c.insert(&json!({"n": 2})).unwrap();
        let listed: Vec<Id> = c
            .stream(None, 10)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(listed, vec![before, after]);
        c.close().unwrap();
    }

    /// Every id whose record has `key` under `field`, from the files.
    fn brute(c: &Collection, field: &str, value: &Value) -> Vec<Id> {
        let key = IndexKey::of(value).unwrap();
        let mut out = Vec::new();
        walk(&c.dir().join("data"), |path, name, _| {
            if let Some(id) = name.strip_suffix(".jsonc") {
                let doc = parse_jsonc(path, &std::fs::read(path).unwrap()).unwrap();
                if index::keys_of(&doc, field).contains(&key) {
                    out.push(id.to_string());
                }
            }
        })
        .unwrap();
        out.sort();
        out
    }

    /// All pages of `find`, `page` at a time.
    fn find_all(c: &mut Collection, field: &str, value: &Value, page: usize) -> Vec<Id> {
        let mut out: Vec<Id> = Vec::new();
        loop {
            let got = c
                .find(field, value, out.last().map(String::as_str), page)
                .unwrap();
            if got.is_empty() {
                return out;
            }
            assert!(got.len() <= page);
            out.extend(got.into_iter().map(|(id, _)| id));
        }
    }

    fn check_indexes(c: &mut Collection, what: &str) {
        // The entries themselves, not only what queries (which re-check
        // each record) return: as many as the files give, no stale ones.
        let mut files = 0;
        let mut entries = std::collections::BTreeMap::<String, u64>::new();
        walk(&c.dir().join("data"), |path, _, _| {
            files += 1;
            let doc = parse_jsonc(path, &std::fs::read(path).unwrap()).unwrap();
            for f in ["colour", "tags", "n"] {
                *entries.entry(f.to_string()).or_default() += index::keys_of(&doc, f).len() as u64;
            }
        })
        .unwrap();
        let stats = c.stats().unwrap();
        assert_eq!(stats.records, files, "{what}: records");
        for (field, n) in &stats.indexes {
            assert_eq!(*n, entries[field], "{what}: entries of {field}");
        }
        for colour in ["red", "green", "blue", "none"] {
            let v = json!(colour);
            let want = brute(c, "colour", &v);
            assert_eq!(
                find_all(c, "colour", &v, 7),
                want,
                "{what}: colour {colour}"
            );
            // The same query without an index (a scan) agrees.
            assert_eq!(find_all(c, "shade", &v, 5), want, "{what}: scan {colour}");
        }
        for tag in 0..6 {
            let v = json!(tag);
            assert_eq!(
                find_all(c, "tags", &v, 3),
                brute(c, "tags", &v),
                "{what}: tag {tag}"
            );
        }
        // A range over numbers, paged by (key, id), against the files.
        let mut want: Vec<(i64, Id)> = Vec::new();
        walk(&c.dir().join("data"), |path, name, _| {
            let doc = parse_jsonc(path, &std::fs::read(path).unwrap()).unwrap();
            let n = doc["n"].as_i64().unwrap();
            if (10..40).contains(&n) {
                want.push((n, name.trim_end_matches(".jsonc").to_string()));
            }
        })
        .unwrap();
        want.sort();
        let mut got: Vec<(i64, Id)> = Vec::new();
        loop {
            let after = got.last().map(|(n, id)| (json!(n), id.clone()));
            let page = c
                .range(
                    "n",
                    Bound::Included(&json!(10)),
                    Bound::Excluded(&json!(40)),
                    after.as_ref().map(|(n, id)| (n, id.as_str())),
                    6,
                )
                .unwrap();
            if page.is_empty() {
                break;
            }
            got.extend(
                page.into_iter()
                    .map(|h| (h.key.as_f64().unwrap() as i64, h.id)),
            );
        }
        assert_eq!(got, want, "{what}: range");
    }

    #[test]
    fn indexes_stay_right_through_updates_deletes_reopen_and_crash() {
        use rand::{Rng, SeedableRng};
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        let colours = ["red", "green", "blue"];
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let doc = |rng: &mut rand::rngs::StdRng| {
            let colour = colours[rng.random_range(0..3)];
            let tags: Vec<u32> = (0..rng.random_range(0..4))
                .map(|_| rng.random_range(0..6))
                .collect();
            json!({"colour": colour, "shade": colour, "tags": tags, "n": rng.random_range(0..50)})
        };
        let mut ids: Vec<Id> = (0..60).map(|_| c.insert(&doc(&mut rng)).unwrap()).collect();
        // Indexes created over existing records, then kept by every write.
        assert!(c.create_index("colour").unwrap());
        assert!(!c.create_index("colour").unwrap());
        c.create_index("tags").unwrap();
        c.create_index("n").unwrap();
        assert!(matches!(
            c.create_index("a b"),
            Err(DocError::BadField { .. })
        ));
        check_indexes(&mut c, "created");
        for round in 0..200 {
            let i = rng.random_range(0..ids.len());
            match rng.random_range(0..4) {
                0 => ids.push(c.insert(&doc(&mut rng)).unwrap()),
                1 => c.put(&ids[i], &doc(&mut rng)).unwrap(),
                2 => {
                    let colour = colours[rng.random_range(0..3)];
                    assert!(c
                        .update(&ids[i], |d| {
                            d["colour"] = json!(colour);
                            d["shade"] = json!(colour);
                        })
                        .unwrap());
                }
                _ => {
                    let id = ids.swap_remove(i);
                    assert!(c.delete(&id).unwrap());
                    assert!(!c.update(&id, |_| {}).unwrap());
                }
            }
            if round % 50 == 0 {
                check_indexes(&mut c, "writes");
            }
        }
        check_indexes(&mut c, "writes");
        let stats = c.stats().unwrap();
        assert_eq!(stats.records, ids.len() as u64);
        c.close().unwrap();
        // From the journal after a clean close.
        let mut c = Collection::open(dir.path()).unwrap();
        check_indexes(&mut c, "reopened");
        assert_eq!(c.recovery(), Recovery::default());
        for _ in 0..20 {
            c.put(&ids[rng.random_range(0..ids.len())], &doc(&mut rng))
                .unwrap();
        }
        drop(c); // a crash between writes
        let mut c = Collection::open(dir.path()).unwrap();
        check_indexes(&mut c, "after a crash");
        let r = c.recovery();
        assert!(r.crashed && r.rebuilt_because.is_none(), "{r:?}");
        assert_eq!(c.reindex().unwrap(), ids.len() as u64);
        check_indexes(&mut c, "reindexed");
        assert!(c.drop_index("tags").unwrap());
        assert!(matches!(
            c.range("tags", Bound::Unbounded, Bound::Unbounded, None, 1),
            Err(DocError::NotIndexed { .. })
        ));
        check_indexes_without_tags(&mut c);
        c.close().unwrap();
    }

    fn check_indexes_without_tags(c: &mut Collection) {
        for colour in ["red", "green", "blue"] {
            let v = json!(colour);
            assert_eq!(find_all(c, "colour", &v, 4), brute(c, "colour", &v));
        }
        // Unindexed now: answered by a scan, the same.
        let v = json!(3);
        assert_eq!(find_all(c, "tags", &v, 4), brute(c, "tags", &v));
    }

    #[test]
    fn a_write_cut_short_is_rechecked_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        c.create_index("colour").unwrap();
        let a = c.insert(&json!({"colour": "red"})).unwrap();
        let b = c.insert(&json!({"colour": "red"})).unwrap();
        // A writer that died after its intent and its new file, before the
        // lines that finish the write: `a` is blue on disk, red in the
        // journal. And one that died before touching `b`'s file.
        c.journal_append(&index::intent_line(&a)).unwrap();
        std::fs::write(c.path_of(&a).unwrap(), r#"{"colour": "blue"}"#).unwrap();
        c.journal_append(&index::intent_line(&b)).unwrap();
        drop(c);
        let mut c = Collection::open(dir.path()).unwrap();
        assert_eq!(
            find_all(&mut c, "colour", &json!("blue"), 10),
            vec![a.clone()]
        );
        assert_eq!(
            find_all(&mut c, "colour", &json!("red"), 10),
            vec![b.clone()]
        );
        let r = c.recovery();
        assert_eq!((r.crashed, r.rechecked), (true, 2), "{r:?}");
        assert!(r.rebuilt_because.is_none(), "only the two were read: {r:?}");
        // The entries themselves were fixed, not just filtered at query
        // time: the range walks the index alone.
        let keys: Vec<Value> = c
            .range("colour", Bound::Unbounded, Bound::Unbounded, None, 10)
            .unwrap()
            .into_iter()
            .map(|h| h.key)
            .collect();
        assert_eq!(keys, vec![json!("blue"), json!("red")]);
        c.close().unwrap();
        // A torn journal after a crash is not trusted: rebuilt from files.
        let c = Collection::open(dir.path()).unwrap();
        let journal = dir.path().join(index::JOURNAL);
        let mut f = OpenOptions::new().append(true).open(&journal).unwrap();
        f.write_all(format!("?{a}\n*{a}\nk{a} col").as_bytes())
            .unwrap();
        drop(c);
        let mut c = Collection::open(dir.path()).unwrap();
        assert_eq!(find_all(&mut c, "colour", &json!("blue"), 10), vec![a]);
        assert!(c.recovery().rebuilt_because.is_some(), "{:?}", c.recovery());
        // A declared field list that is not one names its file.
        c.close().unwrap();
        std::fs::write(dir.path().join(index::FIELDS), "{").unwrap();
        let e = Collection::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("indexes.json"), "{e}");
    }

    #[test]
    fn a_batch_lands_whole_in_order_and_indexed() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        c.create_index("team").unwrap();
        let docs: Vec<Value> = (0..300)
            .map(|i| json!({"i": i, "team": format!("t{}", i % 3)}))
            .collect();
        let ids = c.insert_many(&docs).unwrap();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, ids, "ids in order within the batch");
        for (id, doc) in ids.iter().zip(&docs) {
            assert_eq!(c.get(id).unwrap().as_ref(), Some(doc));
        }
        let (ok, findings) = c.verify().unwrap();
        assert_eq!((ok, findings.len()), (300, 0), "{findings:?}");
        assert_eq!(find_all(&mut c, "team", &json!("t1"), 40).len(), 100);
        drop(c); // a crash: the journal still says everything
        let mut c = Collection::open(dir.path()).unwrap();
        assert_eq!(c.stats().unwrap().indexes, vec![("team".to_string(), 300)]);
        assert_eq!(c.recovery().rechecked, 0);
        c.close().unwrap();
    }

    #[test]
    fn a_failed_journal_append_costs_the_journal_not_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        c.create_index("colour").unwrap();
        let a = c.insert(&json!({"colour": "red"})).unwrap();
        c.close().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        assert_eq!(
            find_all(&mut c, "colour", &json!("red"), 5),
            vec![a.clone()]
        );
        // Every append to the journal now fails (ENOSPC).
        let journal = dir.path().join(index::JOURNAL);
        std::fs::remove_file(&journal).unwrap();
        std::os::unix::fs::symlink("/dev/full", &journal).unwrap();
        let e = c
            .put(&a, &json!({"colour": "blue"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("index.log"), "{e}");
        // Nothing was written: the record and its index say red.
        assert_eq!(c.get(&a).unwrap(), Some(json!({"colour": "red"})));
        assert_eq!(
            find_all(&mut c, "colour", &json!("red"), 5),
            vec![a.clone()]
        );
        assert!(!journal.exists(), "the broken journal is dropped");
        // Writes go on, the loaded index with them, and the next open
        // rebuilds from the files.
        c.put(&a, &json!({"colour": "blue"})).unwrap();
        let b = c.insert(&json!({"colour": "blue"})).unwrap();
        assert_eq!(
            find_all(&mut c, "colour", &json!("blue"), 5),
            vec![a.clone(), b.clone()]
        );
        c.close().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        assert_eq!(
            find_all(&mut c, "colour", &json!("blue"), 5),
            vec![a.clone(), b]
        );
        assert!(c.recovery().rebuilt_because.is_some());
        // A cursor past the end of a range is an empty page, not a panic.
        let page = c
            .range(
                "colour",
                Bound::Unbounded,
                Bound::Excluded(&json!("blue")),
                Some((&json!("blue"), a.as_str())),
                10,
            )
            .unwrap();
        assert!(page.is_empty());
        c.close().unwrap();
    }

    #[test]
    fn a_bad_file_is_reported_and_the_stream_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collection::open(dir.path()).unwrap();
        let ids: Vec<Id> = (0..5)
            .map(|i| c.insert(&json!({"i": i})).unwrap())
            .collect();
        let broken = c.path_of(&ids[2]).unwrap();
        std::fs::write(&broken, "{ half").unwrap();
        assert!(c.stream(None, 10).is_err(), "stream says what is wrong");
        let first = c.stream_page(None, 3).unwrap();
        assert_eq!(first.records.len(), 2);
        assert_eq!(first.bad.len(), 1);
        assert_eq!(first.bad[0].path, broken);
        assert!(
            first.bad[0].reason.contains("invalid JSONC"),
            "{:?}",
            first.bad
        );
        let rest = c.stream_page(first.last.as_deref(), 3).unwrap();
        let got: Vec<Id> = first
            .records
            .iter()
            .chain(&rest.records)
            .map(|(id, _)| id.clone())
            .collect();
        assert_eq!(
            got,
            vec![
                ids[0].clone(),
                ids[1].clone(),
                ids[3].clone(),
                ids[4].clone()
            ]
        );
        assert!(c
            .stream_page(rest.last.as_deref(), 3)
            .unwrap()
            .last
            .is_none());
        c.close().unwrap();
    }
}
