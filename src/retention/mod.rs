//! The retention coordinator: keeps the store within RetentionMaxAge and
//! RetentionMaxBytes.
//!
//! One thread makes a pass every interval (and reads the limits afresh each
//! time, so a reload applies at the next pass):
//! 1. **Age.** Every database loses its events committed before now − max
//!    age, oldest first, at most [`BATCH_ROWS`] per transaction. No event
//!    committed since is touched. "Now" and the commit times are eventd's
//!    own reckoning of time (the commit marks, see
//!    [`store::retention::marks`](crate::store::retention::marks)), which a
//!    step of the wall clock does not move, and a producer's clock
//!    (`events.ts`) does not decide. A pass that finds the wall clock
//!    stepped since the last one ([`clock`]) says so in the log and does
//!    nothing.
//! 2. **Size.** While the pages in use over all databases exceed max bytes,
//!    the oldest events of the whole store go first: each database says
//!    which timestamp bounds its oldest batch, the smallest of those is the
//!    cutoff for every database, and the store is measured again.
//! 3. **Receipts.** Old receipts of live rings are compacted into summary
//!    rows (never deleted: recovery needs them, see
//!    [`store::retention::trim::compact_receipts`](crate::store::retention::trim::compact_receipts));
//!    receipts of ring epochs that no longer exist go with the events of
//!    their time.
//! 4. **Space.** Databases that lost rows give free pages back to the
//!    filesystem with an incremental vacuum, a bounded number of pages per
//!    transaction.
//!
//! Who writes (R8): an active shard's deletions run on its writer thread,
//! between two of its commits ([`store::retention`](crate::store::retention)); a
//! historical shard (no writer) is trimmed through the coordinator's own
//! connection, its only writer. Database files are never deleted (R12).

pub mod clock;

use crate::channel::Sender;
use crate::config::live::LiveConfig;
use crate::drain::Handoff;
use crate::store;
use crate::store::retention::control::{self, CallError, Reply, Request, WriterControl};
use crate::store::retention::reckoning;
use crate::store::retention::trim::{Older, ShardUsage, Trimmed};
use crate::store::retention::{ExportFloors, Keep};
use rusqlite::Connection;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Rows deleted per transaction: small enough that a writer's commits and
/// the queries' reads go on between two of them (a few milliseconds each).
pub const BATCH_ROWS: u64 = 5000;
/// Bytes of free pages given back to the filesystem per transaction.
const VACUUM_BYTES: u64 = 8 << 20;
/// Receipts of live rings become summaries only when at least this many
/// can be replaced, and only once they are this old (so that after a power
/// cut the WAL that held them has long reached the disk).
const COMPACT_MIN_ROWS: u64 = 1024;
const COMPACT_AGE: Duration = Duration::from_secs(300);
/// How long one call to a writer may take before the pass skips that shard.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Size rounds per pass: each one deletes at least one batch, so a store
/// far over its limit converges over a few passes without one pass
/// holding on for long.
const SIZE_ROUNDS_MAX: u32 = 10_000;

/// What the coordinator has done, for `eventctl stats` and the metrics.
/// Relaxed everywhere: monitoring only.
#[derive(Debug, Default)]
pub struct RetentionStats {
    pub passes: AtomicU64,
    pub events_deleted: AtomicU64,
    /// Payload bytes (provider, name, message, fields) of deleted events.
    pub event_bytes_deleted: AtomicU64,
    /// Of `events_deleted`, those the size limit forced out before the
    /// export stage had sent them (each counted in an `unexported` gap).
    pub events_deleted_unexported: AtomicU64,
    pub gaps_deleted: AtomicU64,
    pub receipts_deleted: AtomicU64,
    pub receipts_compacted: AtomicU64,
    pub pages_vacuumed: AtomicU64,
    /// Bytes in pages in use over every database, as of the last pass that
    /// measured them (passes with a size limit).
    pub store_used_bytes: AtomicU64,
    pub errors: AtomicU64,
    pub last_error: Mutex<Option<String>>,
}

/// An active shard as the coordinator reaches it: through its writer.
pub struct ActiveShard {
    pub path: PathBuf,
    pub tx: Sender<Handoff>,
    pub control: Arc<WriterControl>,
}

enum Writer {
    Active {
        tx: Sender<Handoff>,
        control: Arc<WriterControl>,
    },
    /// The coordinator's own connection (opened at the first pass that
    /// needs it); `None` after it failed to open (said once in the log).
    Historical(Option<Connection>),
}

struct Shard {
    path: PathBuf,
    writer: Writer,
    /// Rows were deleted since the last vacuum.
    dirty: bool,
}

pub use crate::threads::Stop;

/// What the coordinator works on.
pub struct Inputs {
    pub store_dir: PathBuf,
    /// The active shards, by index.
    pub active: Vec<ActiveShard>,
    /// The running configuration (its limits are read at every pass).
    pub live: Arc<LiveConfig>,
    pub epochs: EpochSource,
    pub health: Arc<store::StoreHealth>,
    /// How far the export stage has got, when export is on (`None`: off).
    pub export: Option<Arc<ExportFloors>>,
}

/// Tells the epochs of every ring that exists now (`None`: some ring's
/// epoch cannot be read).
pub type EpochSource = Box<dyn Fn() -> Option<Vec<u64>> + Send>;

pub struct RetentionCoordinator {
    store_dir: PathBuf,
    shards: Vec<Shard>,
    live: Arc<LiveConfig>,
    /// Epochs of every ring that exists: their receipts are never deleted.
    /// `None` when some ring's epoch is unknown: then no receipt is. Taken
    /// from `epochs` at the start of every pass (the daemon replaces a ring
    /// it finds unusable, with a new epoch).
    live_epochs: Option<Vec<u64>>,
    epochs: EpochSource,
    /// Damaged files (never written by retention) and the file each active
    /// shard writes now (a writer moves on from a damaged one).
    health: Arc<store::StoreHealth>,
    /// How far the export stage has got (`None`: export is off).
    export: Option<Arc<ExportFloors>>,
    stats: Arc<RetentionStats>,
    stop: Arc<Stop>,
    interval: Duration,
    /// Problems already logged once (by text), so a pass every few seconds
    /// does not repeat them.
    said: std::collections::BTreeSet<String>,
    /// The clocks as the last pass read them, to find steps of the wall
    /// clock.
    clock: clock::ClockWatch,
}

impl RetentionCoordinator {
    pub fn new(
        inputs: Inputs,
        stats: Arc<RetentionStats>,
        stop: Arc<Stop>,
        interval: Duration,
    ) -> Self {
        let Inputs {
            store_dir,
            active,
            live,
            epochs,
            health,
            export,
        } = inputs;
        let shards = active
            .into_iter()
            .map(|a| Shard {
                path: a.path,
                writer: Writer::Active {
                    tx: a.tx,
                    control: a.control,
                },
                dirty: false,
            })
            .collect();
        RetentionCoordinator {
            store_dir,
            shards,
            live,
            live_epochs: None,
            epochs,
            health,
            export,
            stats,
            stop,
            interval,
            said: Default::default(),
            clock: Default::default(),
        }
    }

    /// Makes a pass every interval until stopped; then drops its senders
    /// (the writers finish once the drains' are gone too).
    pub fn run(mut self) {
        self.index_historical();
        while !self.stop.sleep(self.interval) {
            // A bug in one pass must not end retention for good: the next
            // pass starts from the database files again.
            let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.pass()));
            if pass.is_err() {
                self.failed("a retention pass panicked; trying again at the next".to_string());
            }
        }
    }

    /// One pass over the store with the limits in force now; none if the
    /// wall clock stepped since the last pass (logged, with which way and
    /// how far).
    pub fn pass(&mut self) {
        if let Some(step) = self.clock.look() {
            tracing::warn!(
                direction = step.direction(),
                by = %reckoning::span(step.by()),
                "the wall clock stepped; this retention pass is skipped (age is judged by \
                 eventd's reckoning of time, which the step does not move)"
            );
            return;
        }
        self.live_epochs = (self.epochs)();
        let limits = self.live.state().effective;
        let (max_age, max_bytes) = (limits.retention_max_age, limits.retention_max_bytes);
        if max_age.is_none() && max_bytes.is_none() {
            return;
        }
        self.stats.passes.fetch_add(1, Ordering::Relaxed);
        self.find_historical();
        let now = reckoning::now_ns();
        if let Some(age) = max_age {
            let cutoff = now.saturating_sub(i64::try_from(age.as_nanos()).unwrap_or(i64::MAX));
            for i in 0..self.shards.len() {
                self.trim_to(i, Older::Committed(cutoff), false);
            }
        }
        if let Some(max) = max_bytes {
            self.enforce_size(max);
        }
        let compact_before =
            now.saturating_sub(i64::try_from(COMPACT_AGE.as_nanos()).unwrap_or(i64::MAX));
        for i in 0..self.shards.len() {
            self.compact(i, compact_before);
            self.vacuum(i);
        }
    }

    /// Gives every historical file the `QueryIndexes`, once at start: the
    /// coordinator is their only writer (R8). A file that cannot get them
    /// is queried without them (slower, still right); the log says why.
    /// Connections opened only for this are closed again when no
    /// retention limit will need them.
    fn index_historical(&mut self) {
        let settings = self.live.state().effective;
        let keep_open =
            settings.retention_max_age.is_some() || settings.retention_max_bytes.is_some();
        self.find_historical();
        for i in 0..self.shards.len() {
            if self.stop.is_stopped() {
                return;
            }
            let shard = &mut self.shards[i];
            let Writer::Historical(conn) = &mut shard.writer else {
                continue;
            };
            let opened = match conn.take() {
                Some(c) => Ok(c),
                None => store::open_historical(&shard.path).map_err(|e| e.to_string()),
            };
            let outcome = opened.and_then(|c| {
                let synced = store::indexes::sync(&c, &settings.query_indexes, &shard.path);
                if keep_open {
                    *conn = Some(c);
                }
                synced.map_err(|e| format!("query indexes in {}: {e}", shard.path.display()))
            });
            if let Err(e) = outcome {
                self.failed(e);
            }
        }
    }

    /// Adds databases that appeared in the store directory (left by an
    /// earlier configuration) as historical shards.
    fn find_historical(&mut self) {
        // Active shards first: a writer that moved on from a damaged file
        // writes a new one, which must not be taken for a historical file
        // (that would make two writers).
        let actives = self.health.actives();
        for (shard, path) in self.shards.iter_mut().zip(actives) {
            if matches!(shard.writer, Writer::Active { .. }) {
                shard.path = path;
            }
        }
        // Damaged files are never written, not even to delete rows.
        let health = self.health.clone();
        self.shards
            .retain(|s| matches!(s.writer, Writer::Active { .. }) || !health.is_damaged(&s.path));
        let paths = match store::list_databases(&self.store_dir) {
            Ok(p) => p,
            Err(e) => return self.failed(e.to_string()),
        };
        for path in paths {
            if !self.shards.iter().any(|s| s.path == path) && !self.health.is_damaged(&path) {
                self.shards.push(Shard {
                    path,
                    writer: Writer::Historical(None),
                    dirty: false,
                });
            }
        }
    }

    /// Runs `request` on shard `i`'s only writer. Errors are logged (once
    /// per text) and counted; the pass goes on with the other shards.
    fn call(&mut self, i: usize, request: Request) -> Option<Reply> {
        let stop = self.stop.clone();
        let health = self.health.clone();
        let shard = &mut self.shards[i];
        let result = match &mut shard.writer {
            Writer::Active { tx, control } => control
                .call(tx, request, CALL_TIMEOUT, stop.flag())
                .map_err(|e| match e {
                    CallError::Stopping => None,
                    other => Some(other.to_string()),
                }),
            Writer::Historical(conn) => {
                if conn.is_none() {
                    match store::open_historical(&shard.path) {
                        Ok(c) => *conn = Some(c),
                        Err(e) => {
                            let e = e.to_string();
                            return self.failed_once(e);
                        }
                    }
                }
                match conn.as_mut() {
                    Some(c) => control::execute(c, &request, &shard.path, health.zones())
                        .map_err(|e| Some(e.to_string())),
                    None => Err(None),
                }
            }
        };
        match result {
            Ok(reply) => Some(reply),
            Err(None) => None,
            Err(Some(e)) => {
                let path = self.shards[i].path.display().to_string();
                self.failed(format!("retention in {path}: {e}"));
                None
            }
        }
    }

    fn failed(&mut self, message: String) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        if self.said.insert(message.clone()) {
            tracing::error!(error = %message, "retention step failed");
        }
        *self
            .stats
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(message);
    }

    fn failed_once<T>(&mut self, message: String) -> Option<T> {
        self.failed(message);
        None
    }

    /// Deletes shard `i`'s rows that are `older`, one bounded transaction
    /// per call. Rows the export stage has not sent stay, unless the size
    /// limit `forced` the deletion (see [`Keep`]).
    fn trim_to(&mut self, i: usize, older: Older, forced: bool) {
        while !self.stop.is_stopped() {
            let keep = Keep {
                exported: self.export.as_ref().map(|f| f.get(&self.shards[i].path)),
                forced,
            };
            let request = Request::Trim {
                older,
                max_rows: BATCH_ROWS,
                live_epochs: self.live_epochs.clone(),
                keep,
            };
            let Some(Reply::Trimmed(t)) = self.call(i, request) else {
                return;
            };
            self.count(i, &t);
            if !t.more {
                return;
            }
        }
    }

    fn count(&mut self, i: usize, t: &Trimmed) {
        let s = &self.stats;
        s.events_deleted.fetch_add(t.events, Ordering::Relaxed);
        s.event_bytes_deleted
            .fetch_add(t.event_bytes, Ordering::Relaxed);
        s.gaps_deleted.fetch_add(t.gaps, Ordering::Relaxed);
        s.events_deleted_unexported
            .fetch_add(t.unexported, Ordering::Relaxed);
        s.receipts_deleted.fetch_add(t.receipts, Ordering::Relaxed);
        if t.events + t.gaps + t.receipts > 0 {
            self.shards[i].dirty = true;
        }
    }

    /// Every shard's usage (`None` for a shard that did not answer: it is
    /// left out of this round, and the others are still kept within the
    /// limit); `None` when stopping.
    fn measure_all(&mut self) -> Option<Vec<Option<ShardUsage>>> {
        let mut all = Vec::with_capacity(self.shards.len());
        for i in 0..self.shards.len() {
            all.push(match self.call(i, Request::Measure) {
                Some(Reply::Usage(u)) => Some(u),
                _ => None,
            });
            if self.stop.is_stopped() {
                return None;
            }
        }
        Some(all)
    }

    /// Deletes the store's oldest events until the pages in use fit in
    /// `max_bytes`. Each round estimates how many events must go (from the
    /// average bytes per event), asks every database for the timestamp
    /// past its share of them, and deletes everything older than the
    /// smallest: the oldest events of the whole store, at most a share per
    /// database, so a round does not overshoot.
    fn enforce_size(&mut self, max_bytes: u64) {
        for _ in 0..SIZE_ROUNDS_MAX {
            let Some(usage) = self.measure_all() else {
                return;
            };
            let used: u64 = usage.iter().flatten().map(ShardUsage::used_bytes).sum();
            self.stats.store_used_bytes.store(used, Ordering::Relaxed);
            if used <= max_bytes {
                return;
            }
            let Some(cutoff) = self.size_cutoff(&usage, used - max_bytes) else {
                let message = format!(
                    "RetentionMaxBytes is {max_bytes}, but the store uses {used} bytes with \
                     no events left (receipts, gaps and empty pages of {} databases)",
                    usage.len()
                );
                self.failed(message);
                return;
            };
            for (i, u) in usage.iter().enumerate() {
                if u.and_then(|u| u.oldest_ts).is_some_and(|t| t < cutoff) {
                    self.trim_to(i, Older::Stamped(cutoff), true);
                }
            }
            for i in 0..self.shards.len() {
                self.vacuum(i);
            }
        }
    }

    /// The timestamp before which deleting frees about `excess` bytes, the
    /// oldest first; `None` if no database holds an event.
    fn size_cutoff(&mut self, usage: &[Option<ShardUsage>], excess: u64) -> Option<i64> {
        let holding: Vec<(usize, ShardUsage)> = usage
            .iter()
            .enumerate()
            .filter_map(|(i, u)| u.filter(|u| u.oldest_ts.is_some()).map(|u| (i, u)))
            .collect();
        let oldest = holding.iter().filter_map(|(_, u)| u.oldest_ts).min()?;
        let used: u64 = holding.iter().map(|(_, u)| u.used_bytes()).sum();
        let events: u64 = holding.iter().map(|(_, u)| u.events_estimate).sum();
        let per_event = (used / events.max(1)).max(1);
        let needed = excess.div_ceil(per_event);
        let share = needed.div_ceil(holding.len() as u64).clamp(1, BATCH_ROWS);
        let mut cutoff: Option<i64> = None;
        for &(i, _) in &holding {
            if let Some(Reply::Cutoff(Some(ts))) = self.call(i, Request::CutoffAfter { k: share }) {
                cutoff = Some(cutoff.map_or(ts, |c| c.min(ts)));
            }
        }
        // Every database holds its share or less: the smallest newest
        // timestamp takes at most that many from each.
        let cutoff = cutoff.unwrap_or_else(|| {
            holding
                .iter()
                .filter_map(|(_, u)| u.newest_ts)
                .min()
                .unwrap_or(oldest)
                .saturating_add(1)
        });
        // Events sharing the oldest timestamp go together: progress.
        Some(cutoff.max(oldest.saturating_add(1)))
    }

    /// Compacts shard `i`'s receipts of live rings committed before
    /// `before_ns` (eventd's reckoning), one bounded transaction per call,
    /// until none qualify.
    fn compact(&mut self, i: usize, before_ns: i64) {
        while !self.stop.is_stopped() {
            let Some(epochs) = self.live_epochs.clone() else {
                return;
            };
            let request = Request::Compact {
                epochs,
                committed_before_ns: before_ns,
                min_rows: COMPACT_MIN_ROWS,
                max_rows: BATCH_ROWS,
            };
            match self.call(i, request) {
                Some(Reply::Compacted(n)) if n > 0 => {
                    self.stats
                        .receipts_compacted
                        .fetch_add(n, Ordering::Relaxed);
                    self.shards[i].dirty = true;
                }
                _ => return,
            }
        }
    }

    /// Gives shard `i`'s free pages back, if it lost rows; a shard whose
    /// vacuum failed stays marked and is tried again at the next pass.
    fn vacuum(&mut self, i: usize) {
        if !self.shards[i].dirty {
            return;
        }
        while !self.stop.is_stopped() {
            match self.call(
                i,
                Request::Vacuum {
                    max_bytes: VACUUM_BYTES,
                },
            ) {
                Some(Reply::Vacuumed(0)) => {
                    self.shards[i].dirty = false;
                    return;
                }
                Some(Reply::Vacuumed(n)) => {
                    self.stats.pages_vacuumed.fetch_add(n, Ordering::Relaxed);
                }
                _ => return,
            }
        }
    }
}
