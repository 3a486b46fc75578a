//! The shard writer: one thread per shard, the only writer of its database
//! (R8).
//!
//! It takes items from its handoff channel into a batch and commits when the
//! batch reaches MaxBatchSize or the channel runs dry (group commit: batches
//! grow under load, an idle daemon commits each event at once). The batch is
//! copied out of the channel first, so the channel's room goes back to the
//! drains before the commit starts, and a transaction can hold many more
//! events than the channel (R11). Every commit stores the events, the gaps
//! and one receipt per contiguous run of each ring's sequence numbers in the
//! same transaction (R6). A failed commit (full disk, say) is rolled back and
//! retried with the same batch; meanwhile the channel fills and the drains
//! pause, and the rings absorb the backlog.

mod checkpoint;
mod commit;
mod damage;
mod stats;

pub use stats::{WriterHistograms, WriterStats};

use super::health::StoreHealth;
use super::retention::{self, WriterControl};
use super::StoreError;
use crate::channel::{Receiver, TryRecvError};
use crate::drain::{CommitTracker, Handoff, Kind};
use checkpoint::Checkpoints;
pub use commit::BatchPool;
use commit::{Batch, Run};
use damage::FileWatch;
use rusqlite::Connection;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What every shard writer shares with the daemon.
#[derive(Clone)]
pub struct WriterShared {
    /// MaxBatchSize; read before each batch, so a change applies to the next
    /// commit (R11) and never touches the channel.
    pub max_batch: Arc<AtomicU64>,
    /// Commit trackers, indexed by ring ordinal.
    pub trackers: Arc<[CommitTracker]>,
    /// Set at shutdown: a failing commit is then given up after a few tries.
    pub stopping: Arc<AtomicBool>,
    /// Writers whose last commit failed (each counts itself once, until a
    /// commit succeeds): the syslog listener does not wait for room in its
    /// ring while this is not zero.
    pub failing: Arc<AtomicU64>,
    /// Damaged files and the file each shard writes (see [`StoreHealth`]).
    pub health: Arc<StoreHealth>,
    /// Where new generations of a shard are made, and their mode.
    pub store_dir: PathBuf,
    pub mode: crate::access::Mode,
    /// Batch buffers, shared by all writers.
    pub batches: Arc<BatchPool>,
    /// `QueryIndexes`: each writer gives its file these before its first
    /// batch (and a new generation when it moves on to one).
    pub query_indexes: Arc<[crate::store::indexes::QueryIndex]>,
}

pub struct ShardWriter {
    /// Shard index (its files are `shard-NNN[-gG].db`).
    index: usize,
    path: PathBuf,
    conn: Connection,
    /// The file's identity and the least length it may have now (see
    /// `check_file`).
    file: FileWatch,
    rx: Receiver<Handoff>,
    shared: WriterShared,
    stats: Arc<WriterStats>,
    batch: Batch,
    runs: Vec<Run>,
    /// Retention's requests (see [`super::retention`]).
    control: Arc<WriterControl>,
    /// This writer's own checkpoints (`checkpoint.rs`).
    checkpoints: Checkpoints,
}

/// Commit attempts made at shutdown before giving a failing batch up (its
/// events stay in the rings, uncommitted, and are drained at the next start).
const SHUTDOWN_ATTEMPTS: u32 = 5;
/// A batch of 2 up to this many items waits [`LINGER`] for more before it
/// is committed (chosen with the syslog scenario of the load harness, see
/// perf/runs/notebook.md#syslog-beside-rsyslog-journald-and-syslog-ng).
const LINGER_BELOW_ITEMS: usize = 1024;
const LINGER: Duration = Duration::from_millis(1);
/// Pauses of [`LINGER`] a batch may wait through. One: with eight (while
/// each brought more) the half-rate p50 emit-to-commit went from about 2
/// to 9 ms for no measured gain in rate (`eventd-perf baseline`, `scale`).
const LINGER_STEPS: u32 = 1;
const RETRY_DELAY_MAX: Duration = Duration::from_secs(5);
/// New files one batch may move on to (each after its commit found the
/// file damaged); beyond, the batch is retried as a failing commit.
const MOVES_PER_BATCH_MAX: u32 = 3;

impl ShardWriter {
    pub fn new(
        index: usize,
        path: PathBuf,
        conn: Connection,
        rx: Receiver<Handoff>,
        shared: WriterShared,
        stats: Arc<WriterStats>,
        control: Arc<WriterControl>,
    ) -> Self {
        let mut rx = rx;
        // The writer copies a batch out, then commits for a long while: room
        // goes back once per batch (and whenever the channel is empty), not
        // every 32 events, which would wake the drains dozens of times per
        // commit.
        rx.set_release_every(rx.capacity().slots);
        *stats.path.lock().unwrap_or_else(|p| p.into_inner()) = path.clone();
        let checkpoints = Checkpoints::take_over(&conn);
        ShardWriter {
            index,
            file: FileWatch::of(&path),
            path,
            conn,
            rx,
            shared,
            stats,
            batch: Batch::default(),
            runs: Vec::new(),
            control,
            checkpoints,
        }
    }

    /// Checkpoints now if one is due: `idle` after a look found the
    /// channel empty, otherwise only if the WAL is overdue. The file is
    /// looked at first: a cut since the last look is found before the
    /// checkpoint writes pages past it (and the file's new length is known
    /// to be SQLite's own after it).
    fn checkpoint_if_due(&mut self, idle: bool) {
        let c = &mut self.checkpoints;
        if !(c.overdue() || (idle && c.due())) {
            return;
        }
        self.file.look_now();
        if self.check_file() {
            // A new file, with its own WAL and checkpoints.
            return;
        }
        let started = std::time::Instant::now();
        let whole = self.checkpoints.run(&self.conn, &self.path);
        self.file.checkpointed(&self.conn, whole);
        self.stats.record_checkpoint(started.elapsed());
        crate::store::manifest::refresh(&self.conn, &self.path, self.shared.mode);
    }

    /// Gives the file the `QueryIndexes` (see `store::indexes`). A file
    /// that cannot get them (a full disk, say) is written on without them:
    /// queries stay right, only slower; the log says why.
    pub(super) fn sync_indexes(&mut self) {
        let wanted = self.shared.query_indexes.clone();
        if let Err(e) = crate::store::indexes::sync(&self.conn, &wanted, &self.path) {
            tracing::error!(shard = %self.path.display(), error = %e,
                "query indexes not built; this file is queried without them");
        }
    }

    /// Loads the file's time map for queries (see `store::zones`), and
    /// rewrites its `zones` table compactly if it grew long. A file whose
    /// map cannot be read is read whole by every query.
    pub(super) fn register_zones(&mut self) {
        use crate::store::zones;
        let loaded = zones::load(&self.conn, &self.path);
        if let Ok(l) = &loaded {
            if let Err(e) = zones::compact(&mut self.conn, l) {
                tracing::warn!(shard = %self.path.display(), error = %e,
                    "zones table not compacted; it is read as it is");
            }
        }
        let loaded = loaded
            .map_err(|e| {
                tracing::error!(shard = %self.path.display(), error = %e,
                    "time map not read; queries read this file whole");
            })
            .ok();
        self.shared.health.zones().register(&self.path, loaded);
    }

    /// Runs until every drain has dropped its sender and the channel is
    /// empty, then closes the database (checkpointing the WAL).
    pub fn run(mut self) -> Result<(), StoreError> {
        self.sync_indexes();
        self.register_zones();
        crate::store::manifest::refresh(&self.conn, &self.path, self.shared.mode);
        self.store_losses();
        loop {
            // A checkpoint waits for a moment with nothing to take: a
            // drain filling this channel is not held up by its syncs.
            self.checkpoint_if_due(self.rx.stats().occupied_slots == 0);
            // The last batch's room went back to the pool: none is held
            // while waiting. A buffer is taken when the first item comes.
            let pool = &self.shared.batches;
            pool.give(std::mem::take(&mut self.batch));
            let batch = &mut self.batch;
            let first = |h: &Handoff, p: &[u8]| {
                if batch.footprint() == 0 {
                    *batch = pool.take();
                }
                accept(batch, h, p)
            };
            // Wait for one item, then read MaxBatchSize: a change made while
            // the writer waited applies to this very batch (R11).
            if self.rx.recv_batch(1, first).is_err() {
                break; // every sender is gone and nothing is left
            }
            let batch = &mut self.batch;
            let max = self.shared.max_batch.load(Ordering::Relaxed).max(1) as usize;
            let drain = |rx: &mut Receiver<Handoff>, batch: &mut Batch| {
                while batch.len() < max {
                    match rx.try_recv_batch(max - batch.len(), |h, p| accept(batch, h, p)) {
                        Ok(_) => {}
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                }
            };
            drain(&mut self.rx, batch);
            // More is on its way when a drain keeps the channel full (it
            // may be waiting for room: yield, and take what it brings at
            // once, for as long as each look brings half a channel), or
            // when a steady stream keeps it just short of full (pause
            // once for more): a commit costs about as much as a few
            // hundred rows (its pages go through the WAL and the
            // checkpoint), so a batch gathers more first. A lone event (an
            // idle daemon) is committed at once.
            let slots = self.rx.capacity().slots;
            let mut got = batch.len();
            let mut paused = 0;
            while (2..max).contains(&batch.len()) && paused < LINGER_STEPS {
                self.rx.release_consumed();
                if got >= slots / 2 {
                    std::thread::yield_now();
                } else if batch.len() < LINGER_BELOW_ITEMS {
                    std::thread::sleep(LINGER);
                    paused += 1;
                } else {
                    break;
                }
                let before = batch.len();
                drain(&mut self.rx, batch);
                got = batch.len() - before;
                if got == 0 {
                    break;
                }
            }
            // Room goes back before the commit, not after it.
            self.rx.release_consumed();
            // Damage found since the last commit (a reader's report, the
            // file changed) sends this batch to a new file already.
            self.check_file();
            if !self.batch.headers.is_empty() {
                self.commit_with_retry()?;
                self.checkpoint_if_due(false);
            }
            // Retention's request, if one waits: looked for after every
            // commit (one uncontended lock), since a channel kept full by
            // the drains may not have had room for its wakeup item.
            self.serve_control();
        }
        crate::store::manifest::refresh(&self.conn, &self.path, self.shared.mode);
        Ok(())
    }

    /// Stores the damaged files' losses waiting (`store::loss`) at once,
    /// in a commit of their own, so that an idle store shows them too. A
    /// failure leaves them for the next commit.
    fn store_losses(&mut self) {
        let losses = self.shared.health.take_losses();
        if losses.is_empty() {
            return;
        }
        // Before the commit, as in `commit`: the file's map says it has
        // gap rows.
        self.shared.health.zones().widen(&self.path, None, true);
        let stored = self.conn.transaction().and_then(|tx| {
            crate::store::loss::insert(&tx, &losses)?;
            tx.commit()
        });
        match stored {
            Ok(()) => self.shared.health.stored(losses),
            Err(e) => {
                tracing::warn!(shard = %self.path.display(), error = %e,
                    "damaged files' losses not stored yet; the next commit tries again");
                self.shared.health.give_back(losses);
            }
        }
    }

    /// Runs retention's waiting request (if it was not withdrawn) between
    /// two commits, and leaves the answer.
    fn serve_control(&mut self) {
        retention::after_commit(
            &mut self.conn,
            &self.control,
            &self.path,
            self.shared.health.zones(),
        );
    }

    fn commit_with_retry(&mut self) -> Result<(), StoreError> {
        let mut delay = Duration::from_millis(10);
        let mut attempts = 0;
        let mut moves = 0;
        let started = std::time::Instant::now();
        loop {
            match self.commit() {
                Ok(()) => {
                    if attempts > 0 {
                        self.recovered(attempts, started.elapsed());
                    }
                    return Ok(());
                }
                Err(source) if super::is_damage(&source) && moves < MOVES_PER_BATCH_MAX => {
                    // The file is damaged: the same batch goes into a new
                    // one, at once.
                    moves += 1;
                    let why = format!("a commit found it damaged: {source}");
                    if self.move_on(&why).is_err() {
                        // No new file either (a full disk): retried below
                        // as any failing commit.
                        moves = MOVES_PER_BATCH_MAX;
                    }
                }
                Err(source) => {
                    if attempts == 0 {
                        // Relaxed: a hint for the syslog listener.
                        self.shared.failing.fetch_add(1, Ordering::Relaxed);
                    }
                    attempts += 1;
                    self.stats.commit_errors.fetch_add(1, Ordering::Relaxed);
                    let message = format!(
                        "shard database {}: commit of {} items failed: {source}",
                        self.path.display(),
                        self.batch.len()
                    );
                    *self
                        .stats
                        .last_error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(message.clone());
                    if self.shared.stopping.load(Ordering::Relaxed) && attempts >= SHUTDOWN_ATTEMPTS
                    {
                        self.shared.failing.fetch_sub(1, Ordering::Relaxed);
                        return Err(StoreError::Commit {
                            path: self.path.clone(),
                            items: self.batch.len(),
                            source,
                        });
                    }
                    tracing::error!(
                        shard = %self.path.display(),
                        items = self.batch.len(),
                        error = %source,
                        retry_in = ?delay,
                        "commit failed; retrying with the same batch"
                    );
                    // Retention may be waiting for this writer (and on a
                    // full disk, deleting is what makes room).
                    self.serve_control();
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(RETRY_DELAY_MAX);
                }
            }
        }
    }

    /// A commit succeeded after `attempts` failed ones: says so, clears the
    /// error shown in `stats`, and stops counting this writer as failing.
    fn recovered(&mut self, attempts: u32, took: Duration) {
        self.shared.failing.fetch_sub(1, Ordering::Relaxed);
        *self
            .stats
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        tracing::warn!(
            shard = %self.path.display(),
            failed_attempts = attempts,
            after = ?took,
            "commits succeed again"
        );
    }
}

/// Puts a received item in the batch; retention's wakeup item only ends
/// the wait (its request is looked for after the commit).
fn accept(batch: &mut Batch, h: &Handoff, payload: &[u8]) {
    match h.kind {
        Kind::Control => {}
        Kind::Event | Kind::Gap(_) => batch.push(h, payload),
    }
}

#[cfg(test)]
mod tests {
    use super::commit::{add_to_runs, stored_fields};
    use super::*;
    use crate::rings::LossReason;

    fn item(ring: u32, first: u64, last: u64) -> Handoff {
        Handoff {
            ring,
            ring_epoch: 7,
            first_seq: first,
            last_seq: last,
            next_seq: last + 1,
            ..Handoff::default()
        }
    }

    #[test]
    fn fields_that_are_not_a_json_object_are_kept_inside_one() {
        assert_eq!(stored_fields(""), None);
        assert_eq!(stored_fields(r#"{"a":1}"#).unwrap(), r#"{"a":1}"#);
        for bad in ["not json", "[1,2]", r#"{"a":"#, "12"] {
            let v: serde_json::Value = serde_json::from_str(&stored_fields(bad).unwrap()).unwrap();
            assert_eq!(v["invalid_fields"], bad);
        }
    }

    #[test]
    fn runs_break_at_stripe_boundaries_and_per_ring() {
        let mut runs = Vec::new();
        for h in [
            item(0, 1, 1),
            item(1, 5, 5),
            item(0, 2, 2),
            item(0, 3, 9), // a gap continues the run
            item(0, 20, 20),
            item(1, 6, 6),
        ] {
            add_to_runs(&mut runs, &h, 0);
        }
        let got: Vec<(u32, u64, u64)> = runs
            .iter()
            .map(|r| (r.ring, r.receipt.first_seq, r.receipt.last_seq))
            .collect();
        assert_eq!(got, vec![(0, 1, 9), (1, 5, 6), (0, 20, 20)]);
        assert_eq!(runs[0].receipt.next_seq, 10);
    }

    #[test]
    fn retention_is_served_while_drains_keep_the_channel_full() {
        use crate::channel::{Capacity, HandoffChannel};
        use crate::store::retention::{Reply, Request};
        use std::time::Instant;
        let dir = tempfile::tempdir().unwrap();
        let path = crate::store::shard_path(dir.path(), 0);
        let conn = crate::store::open_shard(&path).unwrap();
        let (tx, rx) = HandoffChannel::<Handoff>::new(Capacity {
            slots: 8,
            bytes: 1 << 16,
        })
        .unwrap();
        let shared = WriterShared {
            max_batch: Arc::new(AtomicU64::new(4096)),
            trackers: (0..2).map(|_| CommitTracker::new(7, 0, &[])).collect(),
            stopping: Arc::new(AtomicBool::new(false)),
            failing: Arc::new(AtomicU64::new(0)),
            health: Arc::new(StoreHealth::default()),
            store_dir: dir.path().to_path_buf(),
            mode: crate::access::Mode::PRIVATE,
            batches: Arc::default(),
            query_indexes: Arc::new([]),
        };
        let control = Arc::new(WriterControl::default());
        let stats = Arc::new(WriterStats::default());
        let writer = ShardWriter::new(0, path, conn, rx, shared, stats, control.clone());
        let writer = std::thread::spawn(move || writer.run());
        // Two drains, one per ring, that refill the channel the moment the
        // writer gives room back (items of one lost sequence number each).
        let stop = Arc::new(AtomicBool::new(false));
        let drains: Vec<_> = (0..2u32)
            .map(|ring| {
                let (tx, stop) = (tx.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut seq = 1;
                    while !stop.load(Ordering::Relaxed) {
                        let h = Handoff {
                            kind: Kind::Gap(LossReason::Overwritten),
                            ..item(ring, seq, seq)
                        };
                        if tx.send(h, &[]).is_err() {
                            break;
                        }
                        seq += 1;
                    }
                })
            })
            .collect();
        // Calls until several found the channel full (no room for their
        // wakeup item): each must still be answered.
        let never = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut calls = 0;
        while control.busy_calls() < 3 {
            assert!(
                Instant::now() < deadline,
                "{calls} calls, {} met a full channel",
                control.busy_calls()
            );
            let reply = control.call(&tx, Request::Measure, Duration::from_secs(20), &never);
            assert!(matches!(reply, Ok(Reply::Usage(_))), "{reply:?}");
            calls += 1;
        }
        stop.store(true, Ordering::Relaxed);
        drop(tx);
        for d in drains {
            d.join().unwrap();
        }
        writer.join().unwrap().unwrap();
    }
}
