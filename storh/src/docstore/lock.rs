//! The process lock and the crash marker: an OS lock (`flock`) on
//! `<collection>/lock` held while the collection is open, and the `state`
//! file that says `dirty` (with the boot id) while it is open and `clean`
//! after a clean close.

use super::files::write_durably;
use super::{io, DocError, Result};
use crate::writer_lock::WriterLock;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

/// What the state file said when the collection was opened, read before
/// this open marks it dirty.
pub(super) struct Marker {
    /// It said `dirty`: the last writer died with the collection open.
    pub(super) crashed: bool,
    /// That crash was followed by a restart of the machine: the boot ids
    /// differ, or either is unknown.
    pub(super) rebooted: bool,
    /// It said `clean rebuild`: the last writer closed with a journal it
    /// had stopped appending to and could not remove.
    pub(super) discard_journal: bool,
    /// This boot of the machine, if known.
    pub(super) boot: Option<String>,
}

/// Takes the collection's lock, held until the returned lock is dropped,
/// and writes who holds it; [`DocError::Locked`], naming the holder, if
/// another open file description holds it already.
pub(super) fn take(dir: &Path) -> Result<WriterLock> {
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
            path: dir.to_path_buf(),
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
    Ok(WriterLock::holding(lock))
}

/// Reads the state file a previous open left (a missing one counts as
/// neither dirty nor clean).
pub(super) fn read_marker(dir: &Path) -> Marker {
    let previous = std::fs::read_to_string(dir.join("state")).unwrap_or_default();
    let mut words = previous.split_whitespace();
    let first = words.next();
    let crashed = first == Some("dirty");
    let second = words.next();
    let boot = boot_id();
    // No boot id on either side: assume the worst.
    let rebooted = crashed && (boot.is_none() || second != boot.as_deref());
    let discard_journal = first == Some("clean") && second == Some("rebuild");
    Marker {
        crashed,
        rebooted,
        discard_journal,
        boot,
    }
}

/// Marks the collection open (`dirty` and this boot's id), durably.
pub(super) fn mark_dirty(dir: &Path, boot: Option<&str>) -> Result<()> {
    let marker = format!("dirty {}\n", boot.unwrap_or("unknown"));
    write_durably(&dir.join("state"), marker.as_bytes())
}

/// Marks the collection closed cleanly, durably; `discard_journal` makes
/// the next open throw the journal away (`clean rebuild`).
pub(super) fn mark_clean(dir: &Path, discard_journal: bool) -> Result<()> {
    let state = if discard_journal {
        "clean rebuild\n"
    } else {
        "clean\n"
    };
    write_durably(&dir.join("state"), state.as_bytes())
}

/// This boot of the machine (Linux), to tell a process crash from a
/// machine crash.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
