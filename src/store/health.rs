//! Which shard files are damaged, which file each active shard writes
//! now, and what time each file covers (`zones`): shared by the writers
//! (which find damage on commit, or are told of it), the query server
//! (which finds it on read, and warns every query of it), the retention
//! coordinator (which must never write a damaged file, nor take an active
//! shard's new file for a historical one) and `stats`.
//!
//! A damaged file is left in place, byte for byte (R12: never overwritten);
//! its shard's writer moves on to a fresh file, the next generation
//! (`shard-NNN-gG.db`), so collection goes on without loss.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A shard file found damaged.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Damaged {
    pub path: PathBuf,
    pub reason: String,
    /// When it was found (ns since the Unix epoch).
    pub found_at: i64,
    /// The file its shard writes instead, if it was an active shard's.
    pub replaced_by: Option<PathBuf>,
}

#[derive(Debug, Default)]
struct State {
    /// The file each active shard writes now, by shard index.
    active: Vec<PathBuf>,
    damaged: Vec<Damaged>,
    /// Files a reader found corrupt, for their writers to act on.
    suspects: Vec<(PathBuf, String)>,
    /// Damaged files whose losses (see [`super::loss`]) the next commit of
    /// any writer stores: each file and when it was found damaged.
    losses: Vec<(PathBuf, i64)>,
    /// Ring epochs the drains read again at start for damaged files (see
    /// `recovery::plan_rings`), and when that was decided: what a file
    /// found damaged before then lost of them is counted by the drains.
    reread: Vec<u64>,
    reread_at: i64,
    /// Losses stored whose rings the drains still read again: accounted
    /// once the commits reach what the file held (see [`super::loss`]).
    awaiting: Vec<super::loss::Loss>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct StoreHealth {
    state: Mutex<State>,
    /// The mode of the markers it writes beside damaged files (that of the
    /// shard files).
    mode: Option<crate::access::Mode>,
    /// Set while `suspects` is not empty: writers look at it after every
    /// commit, without the lock.
    suspected: AtomicBool,
    /// Set while `losses` is not empty: writers look at it at every
    /// commit, without the lock.
    losses_pending: AtomicBool,
    /// Set while `awaiting` is not empty: as `losses_pending`.
    losses_awaiting: AtomicBool,
    /// What time each file covers (kept here because every stage that
    /// shares this record needs it: writers widen it, retention marks the
    /// gaps it adds, queries read it).
    zones: super::zones::ZoneMaps,
}

/// At most this many damaged files are remembered (the oldest reports go
/// first; the files stay on disk and are reported again at the next start).
const DAMAGED_MAX: usize = 1024;

impl StoreHealth {
    /// A record of a store whose active shards write `active`; damage is
    /// recorded beside each damaged file in a marker of `mode` (see
    /// [`super::record_damage`]), and the markers already in `store_dir`
    /// are read in.
    /// A damaged file whose loss is not stored yet (an earlier eventd
    /// stopped before it could be) has it counted again now.
    pub fn new(active: Vec<PathBuf>, store_dir: &Path, mode: crate::access::Mode) -> Self {
        let damaged: Vec<Damaged> = super::recorded_damages(store_dir)
            .into_iter()
            .map(|(path, reason, found_at)| Damaged {
                path,
                reason,
                found_at,
                replaced_by: None,
            })
            .collect();
        let losses: Vec<(PathBuf, i64)> = damaged
            .iter()
            .filter(|d| !super::loss::recorded(&d.path))
            .map(|d| (d.path.clone(), d.found_at))
            .collect();
        StoreHealth {
            losses_pending: AtomicBool::new(!losses.is_empty()),
            losses_awaiting: AtomicBool::new(false),
            state: Mutex::new(State {
                active,
                damaged,
                losses,
                ..State::default()
            }),
            mode: Some(mode),
            suspected: AtomicBool::new(false),
            zones: Default::default(),
        }
    }

    /// The ring epochs the drains read again for the damaged files known
    /// now (recovery's plans).
    pub fn set_reread(&self, epochs: Vec<u64>) {
        let mut s = self.lock();
        s.reread = epochs;
        s.reread_at = crate::rings::now_ns();
    }

    /// The damaged files' losses waiting to be stored, counted now (taken:
    /// the caller stores them, or gives them back with
    /// [`StoreHealth::give_back`]). Reads what is left of each file.
    pub fn take_losses(&self) -> Vec<super::loss::Loss> {
        // Relaxed: a hint that spares the lock; the list is read under it.
        if !self.losses_pending.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let (pending, reread, reread_at) = {
            let mut s = self.lock();
            self.losses_pending.store(false, Ordering::Relaxed);
            (std::mem::take(&mut s.losses), s.reread.clone(), s.reread_at)
        };
        pending
            .into_iter()
            .filter_map(|(path, found_at)| {
                let reread = |epoch| found_at <= reread_at && reread.contains(&epoch);
                super::loss::loss_of(&path, found_at, reread)
            })
            .collect()
    }

    /// Losses a commit could not store, for the next one.
    pub fn give_back(&self, losses: Vec<super::loss::Loss>) {
        if losses.is_empty() {
            return;
        }
        let mut s = self.lock();
        s.losses
            .extend(losses.into_iter().map(|l| (l.path, l.found_at)));
        self.losses_pending.store(true, Ordering::Relaxed);
    }

    /// Losses a commit stored: noted beside each damaged file, or, for a
    /// file whose rings the drains read again, once their commits reach
    /// what it held ([`StoreHealth::check_awaiting`]).
    pub fn stored(&self, losses: Vec<super::loss::Loss>) {
        let (done, waiting): (Vec<_>, Vec<_>) =
            losses.into_iter().partition(|l| l.reread.is_empty());
        self.note_recorded(&done);
        if !waiting.is_empty() {
            self.lock().awaiting.extend(waiting);
            self.losses_awaiting.store(true, Ordering::Relaxed);
        }
    }

    /// Notes each loss whose rings' commits (by `watermark`: every sequence
    /// number of a ring epoch at or below it is committed) have reached
    /// what its file held.
    pub fn check_awaiting(&self, watermark: impl Fn(u64) -> u64) {
        // Relaxed: a hint that spares the lock.
        if !self.losses_awaiting.load(Ordering::Relaxed) {
            return;
        }
        let done: Vec<_> = {
            let mut s = self.lock();
            let (done, waiting) = std::mem::take(&mut s.awaiting)
                .into_iter()
                .partition(|l| l.reread.iter().all(|&(e, max)| watermark(e) >= max));
            s.awaiting = waiting;
            self.losses_awaiting
                .store(!s.awaiting.is_empty(), Ordering::Relaxed);
            done
        };
        self.note_recorded(&done);
    }

    fn note_recorded(&self, losses: &[super::loss::Loss]) {
        if let Some(mode) = self.mode {
            for loss in losses {
                super::loss::mark_recorded(loss, mode);
            }
        }
    }

    /// Queues `path`'s loss for the next commit, unless it is stored or
    /// queued already.
    fn queue_loss(&self, path: &Path, found_at: i64) {
        if super::loss::recorded(path) {
            return;
        }
        let mut s = self.lock();
        if !s.losses.iter().any(|l| l.0 == path) {
            s.losses.push((path.to_path_buf(), found_at));
            self.losses_pending.store(true, Ordering::Relaxed);
        }
    }

    /// The mode of the files beside the shards (markers, manifests).
    pub fn mode(&self) -> crate::access::Mode {
        self.mode.unwrap_or(crate::access::Mode::PRIVATE)
    }

    /// The files' time maps (see [`super::zones`]).
    pub fn zones(&self) -> &super::zones::ZoneMaps {
        &self.zones
    }

    /// Writes `d`'s marker (see [`super::record_damage`]); says so if it
    /// cannot (the damage is then only known until eventd stops).
    fn record(&self, d: &Damaged) {
        let Some(mode) = self.mode else { return };
        if let Err(e) = super::record_damage(&d.path, &d.reason, mode) {
            tracing::error!(
                database = %d.path.display(),
                error = %e,
                "cannot write the damage marker; a later start may write this file again"
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change under the lock is a whole push, removal or
        // assignment: a poisoned lock still holds consistent lists.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The file active shard `index` writes now.
    pub fn active(&self, index: usize) -> Option<PathBuf> {
        self.lock().active.get(index).cloned()
    }

    /// Every active shard's file now.
    pub fn actives(&self) -> Vec<PathBuf> {
        self.lock().active.clone()
    }

    /// Records a damaged file (and, for an active shard, the file it writes
    /// from now on).
    pub fn mark_damaged(&self, damaged: Damaged, shard: Option<usize>) {
        self.queue_loss(&damaged.path, damaged.found_at);
        let mut s = self.lock();
        if let (Some(j), Some(next)) = (shard, &damaged.replaced_by) {
            if let Some(slot) = s.active.get_mut(j) {
                *slot = next.clone();
            }
        }
        s.suspects.retain(|(p, _)| p != &damaged.path);
        self.suspected
            .store(!s.suspects.is_empty(), Ordering::Relaxed);
        self.record(&damaged);
        match s.damaged.iter_mut().find(|d| d.path == damaged.path) {
            // Known from its marker: now with the file that replaced it.
            Some(known) => {
                if known.replaced_by.is_none() {
                    known.replaced_by = damaged.replaced_by;
                }
            }
            None => {
                if s.damaged.len() >= DAMAGED_MAX {
                    s.damaged.remove(0);
                }
                s.damaged.push(damaged);
            }
        }
    }

    /// The damaged files known now.
    pub fn damaged(&self) -> Vec<Damaged> {
        self.lock().damaged.clone()
    }

    /// Whether `path` is known damaged.
    pub fn is_damaged(&self, path: &Path) -> bool {
        self.lock().damaged.iter().any(|d| d.path == path)
    }

    /// A reader found `path` corrupt (`why`): if it is an active shard's
    /// file, its writer stops writing it after its next commit.
    pub fn report_corrupt(&self, path: &Path, why: &str) {
        let mut s = self.lock();
        if s.damaged.iter().any(|d| d.path == path) || s.suspects.iter().any(|(p, _)| p == path) {
            return;
        }
        if !s.active.iter().any(|p| p == path) {
            // A historical file: no writer to tell; known damaged at once.
            tracing::error!(
                database = %path.display(),
                damage = %why,
                "shard file damaged (found by a query); left as it is"
            );
            if s.damaged.len() >= DAMAGED_MAX {
                s.damaged.remove(0);
            }
            let damaged = Damaged {
                path: path.to_path_buf(),
                reason: format!("a query found it corrupt: {why}"),
                found_at: crate::rings::now_ns(),
                replaced_by: None,
            };
            self.record(&damaged);
            let (path, found_at) = (damaged.path.clone(), damaged.found_at);
            s.damaged.push(damaged);
            drop(s);
            self.queue_loss(&path, found_at);
            return;
        }
        if s.suspects.len() < DAMAGED_MAX {
            s.suspects.push((path.to_path_buf(), why.to_string()));
        }
        // Relaxed: the writer takes the list under the lock; the flag only
        // spares it the lock while there is nothing.
        self.suspected.store(true, Ordering::Relaxed);
    }

    /// Why a reader found `path` corrupt, if it did (taken: asked once).
    pub fn take_suspect(&self, path: &Path) -> Option<String> {
        if !self.suspected.load(Ordering::Relaxed) {
            return None;
        }
        let mut s = self.lock();
        let at = s.suspects.iter().position(|(p, _)| p == path)?;
        let (_, why) = s.suspects.remove(at);
        self.suspected
            .store(!s.suspects.is_empty(), Ordering::Relaxed);
        Some(why)
    }
}
