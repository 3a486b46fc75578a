//! DocStore: one JSONC file per record, `<collection>/data/<bb>/<id>.jsonc`,
//! with `bb` the id's characters 24–25 ([`crate::id::bucket`]).
//!
//! **Writes** are atomic and durable: the record goes to a temporary file in
//! its bucket, is fsynced, renamed over the final name, and the bucket
//! directory is fsynced. A reader sees the old record or the new one.
//!
//! **Crash marker.** Opening is O(1) in the collection's size. The writer
//! holds an OS lock (`flock`) on `<collection>/lock` for as long as the
//! collection is open, and a state file `<collection>/state` says `dirty`
//! while it is open and `clean` after a clean close. Opening a collection
//! whose state says dirty, while nobody holds the lock, means the last
//! writer died: only then are orphaned temporary files removed (a walk of
//! the buckets). A second writer gets an error naming the holder (as the
//! lock file records it); the lock, not that text, decides. A PID check
//! would not do: PIDs are reused, and in containers every run is PID 1.

use crate::id::{self, Id};
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
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
}

type Result<T> = std::result::Result<T, DocError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DocError + '_ {
    move |source| DocError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What opening found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recovery {
    /// The previous writer died while the collection was open.
    pub crashed: bool,
    /// Orphaned temporary files removed.
    pub temp_files_removed: u64,
}

/// An open collection (the only writer while it is open).
pub struct Collection {
    dir: PathBuf,
    lock: File,
    recovery: Recovery,
    /// Every record id, in order: loaded on the first `stream` from the
    /// id journal (`ids.log`), or rebuilt from the files after a crash.
    ids: Option<std::collections::BTreeSet<Id>>,
    /// Appends to `ids.log` (`+id` for a new record, `-id` for a deleted
    /// one).
    journal: Option<File>,
    /// `ids.log` holds every record: false after a crash (or when it is
    /// missing), until it is rebuilt from the files. Appends to an
    /// incomplete journal would make it look whole, so none are made.
    journal_complete: bool,
}

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub path: PathBuf,
    pub reason: String,
}

const TEMP_SUFFIX: &str = ".tmp";

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
        let state_path = dir.join("state");
        let crashed = std::fs::read_to_string(&state_path).is_ok_and(|s| s.trim() == "dirty");
        let mut recovery = Recovery {
            crashed,
            temp_files_removed: 0,
        };
        if crashed {
            recovery.temp_files_removed = remove_temp_files(&dir.join("data"))?;
        }
        write_durably(&state_path, b"dirty\n")?;
        let journal_path = dir.join("ids.log");
        if crashed {
            // The journal may lack the last write or name a record whose
            // file never landed: it is rebuilt from the files when first
            // needed (opening stays O(1)).
            let _ = std::fs::remove_file(&journal_path);
        }
        let fresh = std::fs::read_dir(dir.join("data"))
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        if fresh && !journal_path.exists() {
            write_durably(&journal_path, b"")?;
        }
        let journal_complete = journal_path.exists();
        Ok(Collection {
            dir,
            lock,
            recovery,
            ids: None,
            journal: None,
            journal_complete,
        })
    }

    /// What opening found and did.
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    pub fn dir(&self) -> &Path {
        &self.dir
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
        let existed = path.exists();
        write_durably(&path, &text)?;
        if !existed {
            self.journal_append('+', id)?;
        }
        Ok(())
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
        match std::fs::remove_file(&path) {
            Ok(()) => {
                sync_dir(path.parent().unwrap_or(&self.dir))?;
                self.journal_append('-', id)?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn journal_append(&mut self, op: char, id: &str) -> Result<()> {
        if let Some(ids) = &mut self.ids {
            if op == '+' {
                ids.insert(id.to_string());
            } else {
                ids.remove(id);
            }
        }
        if !self.journal_complete {
            // Rebuilt from the files (which this write already reached)
            // when first needed.
            return Ok(());
        }
        let path = self.dir.join("ids.log");
        if self.journal.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(io(&path))?;
            self.journal = Some(file);
        }
        if let Some(j) = &mut self.journal {
            // Not fsynced: after a crash the journal is rebuilt anyway.
            writeln!(j, "{op}{id}").map_err(io(&path))?;
        }
        Ok(())
    }

    /// The id index: from the journal, or (missing after a crash, or
    /// never written) from a walk of the buckets, which then rewrites it.
    fn ids(&mut self) -> Result<&std::collections::BTreeSet<Id>> {
        if self.ids.is_none() && !self.journal_complete {
            let ids = self.rebuild_journal()?;
            self.ids = Some(ids);
        }
        if self.ids.is_none() {
            let path = self.dir.join("ids.log");
            let ids = match std::fs::read_to_string(&path) {
                Ok(text) => {
                    let mut ids = std::collections::BTreeSet::new();
                    for line in text.lines() {
                        match line.split_at_checked(1) {
                            Some(("+", id)) if id::is_canonical(id) => {
                                ids.insert(id.to_string());
                            }
                            Some(("-", id)) => {
                                ids.remove(id);
                            }
                            _ => {}
                        }
                    }
                    ids
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.rebuild_journal()?,
                Err(e) => return Err(io(&path)(e)),
            };
            self.ids = Some(ids);
        }
        Ok(self.ids.get_or_insert_with(Default::default))
    }

    /// Walks every bucket and writes the id journal afresh.
    fn rebuild_journal(&mut self) -> Result<std::collections::BTreeSet<Id>> {
        let mut ids = std::collections::BTreeSet::new();
        walk(&self.dir.join("data"), |_path, name, _bucket| {
            if let Some(id) = name.strip_suffix(".jsonc") {
                if id::bucket(id).is_some() {
                    ids.insert(id.to_string());
                }
            }
        })?;
        let text: String = ids.iter().map(|id| format!("+{id}\n")).collect();
        write_durably(&self.dir.join("ids.log"), text.as_bytes())?;
        self.journal = None;
        self.journal_complete = true;
        Ok(ids)
    }

    /// Up to `limit` records in id order, after `after` (a cursor: the last
    /// id of the previous page; `None` for the first page). Pages are
    /// served from the id index, never by walking the buckets.
    pub fn stream(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<(Id, Value)>> {
        use std::ops::Bound;
        let start = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Unbounded,
        };
        let page: Vec<Id> = self
            .ids()?
            .range((start, Bound::Unbounded))
            .take(limit)
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(page.len());
        for id in page {
            if let Some(v) = self.get(&id)? {
                out.push((id, v));
            }
        }
        Ok(out)
    }

    /// Rebuilds the id index from the files (a walk of every bucket).
    pub fn reindex(&mut self) -> Result<u64> {
        let ids = self.rebuild_journal()?;
        let n = ids.len() as u64;
        self.ids = Some(ids);
        Ok(n)
    }

    /// Checks every file: a record must be valid JSONC, named `<id>.jsonc`
    /// with a canonical id, in the bucket its id names. Returns what is
    /// wrong, with the path and the reason; `ok` counts the good records.
    pub fn verify(&self) -> Result<(u64, Vec<Finding>)> {
        let mut ok = 0;
        let mut findings = Vec::new();
        walk(&self.dir.join("data"), |path, name, bucket| {
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
                .and_then(|b| parse_jsonc(path, &b).map_err(|e| e.to_string()))
            {
                Ok(_) => ok += 1,
                Err(e) => findings.push(finding(format!("invalid JSONC: {e}"))),
            }
        })?;
        Ok((ok, findings))
    }

    /// Marks the collection clean and releases the lock.
    pub fn close(self) -> Result<()> {
        write_durably(&self.dir.join("state"), b"clean\n")?;
        drop(self.lock);
        Ok(())
    }
}

/// Parses JSON with `//` and `/* */` comments.
pub fn parse_jsonc(path: &Path, bytes: &[u8]) -> Result<Value> {
    serde_json::from_reader(json_comments::StripComments::new(bytes)).map_err(|e| DocError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Writes `bytes` to `path` atomically and durably: a temporary file in
/// the same directory, fsync, rename, fsync of the directory.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}{TEMP_SUFFIX}", std::process::id()));
    let mut file = File::create(&temp).map_err(io(&temp))?;
    file.write_all(bytes).map_err(io(&temp))?;
    file.sync_all().map_err(io(&temp))?;
    drop(file);
    std::fs::rename(&temp, path).map_err(io(path))?;
    sync_dir(dir)
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
        if !bucket.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&bucket).map_err(io(&bucket))? {
            let path = entry.map_err(io(&bucket))?.path();
            if path.to_string_lossy().ends_with(TEMP_SUFFIX) {
                std::fs::remove_file(&path).map_err(io(&path))?;
                removed += 1;
            }
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
                temp_files_removed: 1
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
}
