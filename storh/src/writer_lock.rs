//! The writer's lock and crash marker of a segmented log or a queue, as the
//! DocStore has for a collection: an OS lock (`flock`) on `<dir>/lock`,
//! held for as long as the writer is open, and `<dir>/state`, which says
//! `dirty` while a writer is open and `clean <end>` after it closed, with
//! the offset where the log or queue ended.
//!
//! A writer that finds `clean <end>` and a last file that ends exactly
//! there skips the recovery scan of that file; anything else (`dirty`, no
//! state, another length) makes it scan. The lock decides who may write;
//! the holder's pid in the lock file is only there for the error another
//! writer gets. Readers take no lock and never write.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

/// A held writer lock (released when dropped).
#[derive(Debug)]
pub(crate) struct WriterLock {
    file: File,
}

impl WriterLock {
    /// Wraps `file`, on which this process has just taken an exclusive
    /// `flock`.
    pub(crate) fn holding(file: File) -> WriterLock {
        WriterLock { file }
    }
}

impl Drop for WriterLock {
    /// Unlocks before the descriptor closes. Closing alone is not enough
    /// when the program forks: a child forked while the lock was held has a
    /// copy of the descriptor until its exec (or its exit), and the lock
    /// lives as long as any copy, so another process opening the directory
    /// right after this close would be refused. An explicit unlock releases
    /// the lock for every copy at once.
    fn drop(&mut self) {
        // SAFETY: flock on a descriptor this lock owns; no memory involved.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Why the lock was not taken.
#[derive(Debug)]
pub(crate) enum LockError {
    Io(std::io::Error),
    /// Another open file description holds it; who, as its lock file says.
    Held(String),
}

/// Takes the writer lock of `dir`.
pub(crate) fn take(dir: &Path) -> Result<WriterLock, LockError> {
    let path = dir.join("lock");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(LockError::Io)?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        return Err(LockError::Held(if holder.is_empty() {
            "holder unknown".to_string()
        } else {
            holder.to_string()
        }));
    }
    file.set_len(0).map_err(LockError::Io)?;
    write!(file, "pid {}", std::process::id()).map_err(LockError::Io)?;
    Ok(WriterLock::holding(file))
}

/// What the state file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Closed cleanly, ending at this offset.
    Clean(u64),
    /// A writer had it open (and, since the lock was free, died), or there
    /// is no state file (made before there was one).
    Unknown,
}

pub(crate) fn read_state(dir: &Path) -> State {
    let text = std::fs::read_to_string(dir.join("state")).unwrap_or_default();
    let mut words = text.split_whitespace();
    match (words.next(), words.next().and_then(|w| w.parse().ok())) {
        (Some("clean"), Some(end)) => State::Clean(end),
        _ => State::Unknown,
    }
}

pub(crate) fn mark_dirty(dir: &Path) -> std::io::Result<()> {
    write_durably(dir, b"dirty\n")
}

pub(crate) fn mark_clean(dir: &Path, end: u64) -> std::io::Result<()> {
    write_durably(dir, format!("clean {end}\n").as_bytes())
}

/// Replaces `<dir>/state` atomically and durably.
fn write_durably(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temp = dir.join("state.tmp");
    let mut f = File::create(&temp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&temp, dir.join("state"))?;
    sync_dir(dir)
}

pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of the lock's descriptor (what a child forked while the lock
    /// was held has until its exec) does not keep the lock once the holder
    /// drops it.
    #[test]
    fn a_dropped_lock_is_free_while_a_copy_of_its_descriptor_lives() {
        let dir = tempfile::tempdir().unwrap();
        let lock = take(dir.path()).unwrap();
        // SAFETY: dup of a descriptor the lock owns; the copy is closed below.
        let copy = unsafe { libc::dup(lock.file.as_raw_fd()) };
        assert!(copy >= 0);
        assert!(matches!(take(dir.path()), Err(LockError::Held(_))));
        drop(lock);
        let again = take(dir.path());
        // SAFETY: closes the copy made above, which nothing else uses.
        unsafe { libc::close(copy) };
        assert!(again.is_ok(), "{again:?}");
    }
}
