//! The senders eventd has read `/proc` for, so that a message costs a
//! lookup and not a few file reads.
//!
//! An entry is the process a pid named when eventd read it, told apart
//! from a later process given the same pid by its start time. It is used
//! as it is for [`REFRESH`] after it was read (and only for the uid and gid
//! it was read with); after that the next message from the pid reads
//! `/proc/PID` again: a new start time replaces the entry, the same one
//! refreshes it (a process that called `execve` has a new command and
//! executable), keeping what can no longer be read. A process that has
//! gone when eventd looks keeps its entry for [`KEPT_AFTER_EXIT`] (its
//! last messages are often sent just before it exits); after that, or
//! when eventd never saw it alive, its messages carry what the kernel's
//! credentials say and nothing more.
//!
//! Reuse within [`REFRESH`]: Linux hands pids out in turn (it goes around
//! `kernel.pid_max`, at least 32,768, before it gives a pid out again), so
//! a pid names another process within a second only if that many
//! processes were started in that second. journald caches the same way
//! (refreshes after 1 s, forgets after 5 s).
//!
//! Bounded: at most [`ENTRIES_MAX`] entries; when it is full, entries past
//! [`KEPT_AFTER_EXIT`] go, and if that is not enough, all of them. A miss
//! costs a few small `/proc` reads (`ProcessInfo::read`), made outside the
//! lock.

use super::process::ProcessInfo;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How long an entry is used without reading `/proc` again (ms).
pub const REFRESH: u64 = 1_000;
/// How long an entry outlives its process (ms after it was read).
pub const KEPT_AFTER_EXIT: u64 = 5_000;
/// Entries at most.
pub const ENTRIES_MAX: usize = 4096;

struct Entry {
    info: Arc<ProcessInfo>,
    uid: u32,
    gid: u32,
    read_ms: u64,
}

/// What the cache counts; Relaxed everywhere, monitoring only.
#[derive(Debug, Default)]
pub struct SendersStats {
    /// Lookups answered from an entry without reading `/proc`.
    pub hits: AtomicU64,
    /// Times `/proc/PID` was read.
    pub reads: AtomicU64,
    /// Reads that found another process at the pid than the entry named.
    pub reused: AtomicU64,
    /// Lookups for a process that had gone, with no entry left for it.
    pub gone: AtomicU64,
    /// Times the cache was full and emptied.
    pub flushes: AtomicU64,
}

/// The cache, shared by every listener.
#[derive(Default)]
pub struct Senders {
    entries: Mutex<HashMap<i32, Entry>>,
    pub stats: SendersStats,
}

/// The process at the other end of a connection, as it was when the
/// connection was taken: its start time tells it from a later process given
/// the same pid. The kernel's credentials of a connection name the pid of
/// the process that connected; if that process exits and its pid is given
/// to another (say, a service's), the connection (held open by a child
/// that inherited it) must not be credited with the newcomer's unit, exe
/// and command name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    /// `None`: the sender was already gone when the connection was taken,
    /// so no process facts are ever given for it.
    start_time: Option<u64>,
}

impl Senders {
    /// Pins the sender of a connection just taken (see [`Pinned`]). Only
    /// its start time is read, nothing is cached: a process that connects
    /// between fork and exec (`eventctl run`) is another command a moment
    /// later, with the same start time.
    pub fn pin(&self, pid: i32) -> Pinned {
        let start_time = (pid > 0)
            .then(|| super::process::stat(pid).ok())
            .flatten()
            .map(|s| s.start_time);
        Pinned { start_time }
    }

    /// [`Senders::lookup`] for a pinned connection: `None` once `pid` names
    /// another process than the one that connected.
    pub fn lookup_pinned(
        &self,
        pin: Pinned,
        pid: i32,
        uid: u32,
        gid: u32,
    ) -> Option<Arc<ProcessInfo>> {
        let start = pin.start_time?;
        self.lookup(pid, uid, gid)
            .filter(|info| info.start_time == start)
    }

    /// What eventd knows of the process `pid`, which the kernel says sent a
    /// message with `uid` and `gid`; `None` if it has gone and eventd never
    /// saw it, or if `pid` is no process (0: no credentials).
    pub fn lookup(&self, pid: i32, uid: u32, gid: u32) -> Option<Arc<ProcessInfo>> {
        self.lookup_at(pid, uid, gid, crate::sync::monotonic_ms())
    }

    fn lookup_at(&self, pid: i32, uid: u32, gid: u32, now: u64) -> Option<Arc<ProcessInfo>> {
        if pid <= 0 {
            return None;
        }
        let old = {
            let entries = self.lock();
            match entries.get(&pid) {
                Some(e) if e.uid == uid && e.gid == gid => {
                    if now.saturating_sub(e.read_ms) < REFRESH {
                        self.stats.hits.fetch_add(1, Ordering::Relaxed);
                        return Some(e.info.clone());
                    }
                    Some((e.info.clone(), Some(e.read_ms)))
                }
                // Read for other credentials: not kept for these.
                Some(e) => Some((e.info.clone(), None)),
                None => None,
            }
        };
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        match ProcessInfo::read(pid) {
            Ok(fresh) => {
                let info = match &old {
                    Some((old, _)) if old.start_time == fresh.start_time => {
                        fresh.refreshed_from(old)
                    }
                    Some(_) => {
                        self.stats.reused.fetch_add(1, Ordering::Relaxed);
                        fresh
                    }
                    None => fresh,
                };
                let info = Arc::new(info);
                self.insert(pid, uid, gid, info.clone(), now);
                Some(info)
            }
            Err(_) => match old {
                Some((info, Some(read_ms))) if now.saturating_sub(read_ms) < KEPT_AFTER_EXIT => {
                    Some(info)
                }
                _ => {
                    self.stats.gone.fetch_add(1, Ordering::Relaxed);
                    None
                }
            },
        }
    }

    fn insert(&self, pid: i32, uid: u32, gid: u32, info: Arc<ProcessInfo>, now: u64) {
        let mut entries = self.lock();
        if entries.len() >= ENTRIES_MAX && !entries.contains_key(&pid) {
            entries.retain(|_, e| now.saturating_sub(e.read_ms) < KEPT_AFTER_EXIT);
            if entries.len() >= ENTRIES_MAX {
                entries.clear();
                self.stats.flushes.fetch_add(1, Ordering::Relaxed);
            }
        }
        let read_ms = now;
        entries.insert(
            pid,
            Entry {
                info,
                uid,
                gid,
                read_ms,
            },
        );
    }

    /// Entries now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Entry>> {
        // Every update inserts or removes whole entries: a panic elsewhere
        // leaves the map usable.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn ids() -> (u32, u32) {
        // SAFETY: getuid and getgid have no preconditions.
        unsafe { (libc::getuid(), libc::getgid()) }
    }

    #[test]
    fn a_pinned_connection_gets_no_facts_of_another_process_with_its_pid() {
        let senders = Senders::default();
        let (uid, gid) = ids();
        let pid = std::process::id() as i32;
        let pin = senders.pin(pid);
        assert!(pin.start_time.is_some());
        assert!(senders.lookup_pinned(pin, pid, uid, gid).is_some());
        // The same pid with another start time: a later process.
        let other = Pinned {
            start_time: pin.start_time.map(|t| t + 1),
        };
        assert!(senders.lookup_pinned(other, pid, uid, gid).is_none());
        // A sender gone before the connection was taken: never any facts.
        let gone = Pinned { start_time: None };
        assert!(senders.lookup_pinned(gone, pid, uid, gid).is_none());
    }

    #[test]
    fn an_entry_is_used_then_read_again_and_kept_a_while_after_its_process() {
        let senders = Senders::default();
        let (uid, gid) = ids();
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let first = senders.lookup_at(pid, uid, gid, 10_000).unwrap();
        assert_eq!(first.comm.as_deref(), Some("sleep"));
        assert_eq!(senders.stats.reads.load(Ordering::Relaxed), 1);
        // Within REFRESH: no read.
        let again = senders.lookup_at(pid, uid, gid, 10_500).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(senders.stats.hits.load(Ordering::Relaxed), 1);
        // Other credentials for the pid: read again.
        senders.lookup_at(pid, uid + 1, gid, 10_600).unwrap();
        assert_eq!(senders.stats.reads.load(Ordering::Relaxed), 2);
        child.kill().unwrap();
        child.wait().unwrap();
        // Gone: the entry read at 10,600 is kept until 15,600, for the
        // credentials it was read with only.
        assert_eq!(senders.lookup_at(pid, uid, gid, 12_000), None);
        let kept = senders.lookup_at(pid, uid + 1, gid, 12_000).unwrap();
        assert_eq!(kept.comm.as_deref(), Some("sleep"));
        assert_eq!(senders.lookup_at(pid, uid + 1, gid, 16_000), None);
        assert_eq!(senders.stats.gone.load(Ordering::Relaxed), 2);
        assert_eq!(senders.lookup_at(0, uid, gid, 16_000), None);
    }

    #[test]
    fn another_start_time_at_the_pid_replaces_the_entry() {
        let senders = Senders::default();
        let (uid, gid) = ids();
        let me = std::process::id() as i32;
        let stale = Arc::new(ProcessInfo {
            start_time: 1,
            comm: Some("earlier".into()),
            ..ProcessInfo::default()
        });
        senders.insert(me, uid, gid, stale, 0);
        let now = senders.lookup_at(me, uid, gid, REFRESH + 1).unwrap();
        assert_ne!(now.comm.as_deref(), Some("earlier"));
        assert_eq!(senders.stats.reused.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_cache_stays_within_its_bound() {
        let senders = Senders::default();
        let info = Arc::new(ProcessInfo::default());
        for pid in 1..=(ENTRIES_MAX as i32 + 10) {
            senders.insert(pid, 0, 0, info.clone(), 100);
        }
        assert!(senders.len() <= ENTRIES_MAX);
        assert_eq!(senders.stats.flushes.load(Ordering::Relaxed), 1);
    }
}
