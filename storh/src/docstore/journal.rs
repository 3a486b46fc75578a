//! The collection's side of the index journal (`index.log`; its format and
//! its replay are in [`crate::index`]): what opening does to it, the
//! appends every write makes, the first load with its re-checks of
//! unfinished writes, rebuilds from the files, and the fsync at close.

use super::crud::parse_jsonc;
use super::files::{walk, write_durably};
use super::lock::Marker;
use super::{io, Collection, Result};
use crate::id;
use crate::index::{self, IndexState};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

/// At open: removes a journal that cannot be trusted (see `marker`), and
/// starts one for a collection with no records yet. Returns whether there
/// is a journal to append to.
pub(super) fn prepare(dir: &Path, fields: &[String], marker: &Marker) -> Result<bool> {
    let journal_path = dir.join(index::JOURNAL);
    if marker.discard_journal
        || (marker.crashed && (marker.rebooted || !ends_with_newline(&journal_path)))
    {
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
        write_durably(&journal_path, index::header(fields).as_bytes())?;
    }
    Ok(journal_path.exists())
}

/// At close: fsyncs the journal if it is in use, whoever wrote it (a
/// crashed writer's last lines may still be only in the page cache), since
/// a clean state promises it is whole. Returns whether the next open must
/// discard it instead.
pub(super) fn settle(dir: &Path, usable: bool) -> Result<bool> {
    let path = dir.join(index::JOURNAL);
    if !usable {
        // A journal we stopped appending to and could not remove.
        return Ok(path.exists());
    }
    match File::open(&path) {
        Ok(j) => j.sync_all().map_err(io(&path))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&path)(e)),
    }
    Ok(false)
}

/// Lines a journal may hold beyond twice what its indexes need before it
/// is rewritten.
const COMPACT_LINES_MIN: u64 = 1024;

/// Whether a journal of `lines` is long enough to be rewritten from
/// `state`: more than twice its snapshot and [`COMPACT_LINES_MIN`] more.
fn too_long(lines: u64, state: &IndexState) -> bool {
    lines > 2 * state.live_lines() + COMPACT_LINES_MIN
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
    /// Appends `lines` to the journal, unless it is not in use.
    pub(super) fn journal_append(&mut self, lines: &str) -> Result<()> {
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
            let written = j.write_all(lines.as_bytes());
            if written.is_ok() {
                self.journal_lines += lines.bytes().filter(|&b| b == b'\n').count() as u64;
            }
            if let Err(e) = written {
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
    pub(super) fn index(&mut self) -> Result<&IndexState> {
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
                        self.journal_lines = replayed.lines;
                        if !replayed.unfinished.is_empty() || too_long(replayed.lines, &state) {
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

    /// Builds every index from the files (reading each one) and writes
    /// the journal afresh. `progress` gets the number of files done.
    pub(super) fn rebuild(&mut self, mut progress: impl FnMut(u64)) -> Result<IndexState> {
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
        let snapshot = state.snapshot();
        write_durably(&self.dir.join(index::JOURNAL), snapshot.as_bytes())?;
        self.journal_usable = true;
        self.journal_lines = snapshot.bytes().filter(|&b| b == b'\n').count() as u64;
        Ok(())
    }

    /// Rewrites the journal from the indexes once it has grown past
    /// [`too_long`], so its size stays within a constant factor of the
    /// indexes' (and the first load after a reopen reads that much, not
    /// every write ever made). Called between writes, when no write is
    /// unfinished, so the snapshot says all the journal would. The indexes
    /// are loaded for it if they are not yet (once per open). A failure is
    /// not the write's: the journal is left as it was, only longer, and
    /// the next write tries again.
    pub(super) fn compact_journal_if_long(&mut self) {
        if !self.journal_usable {
            return;
        }
        if self.index.is_none() {
            if self.journal_lines < COMPACT_LINES_MIN {
                return;
            }
            // Loading compacts a long journal itself.
            let _ = self.index();
            return;
        }
        let Some(state) = self.index.take() else {
            return;
        };
        if too_long(self.journal_lines, &state) {
            let _ = self.write_journal(&state);
        }
        self.index = Some(state);
    }
}
