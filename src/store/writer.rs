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

use super::control::{self, WriterControl};
use super::handoff::{split_payload, Handoff, Kind};
use super::health::StoreHealth;
use super::tracker::CommitTracker;
use super::StoreError;
use crate::channel::{Receiver, TryRecvError};
use crate::rings::LossReason;
use hdrhistogram::Histogram;
use rusqlite::{params, Connection};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Counters a writer keeps for `eventctl stats` and the load harness.
/// Relaxed everywhere: monitoring only.
#[derive(Debug, Default)]
pub struct WriterStats {
    pub events: AtomicU64,
    /// Bytes of the committed events' provider, name, message and fields
    /// columns, as stored.
    pub event_bytes: AtomicU64,
    /// Sequence numbers stored as gaps.
    pub lost: AtomicU64,
    pub commits: AtomicU64,
    pub batch_max: AtomicU64,
    pub commit_errors: AtomicU64,
    pub last_error: Mutex<Option<String>>,
    /// The file the writer writes now (a new generation after damage).
    pub path: Mutex<PathBuf>,
    /// Files of this shard given up as damaged.
    pub damaged_files: AtomicU64,
    /// Emit-to-commit latency of every event (µs) and items per commit.
    pub histograms: Mutex<WriterHistograms>,
}

/// Distributions a writer records once per commit.
#[derive(Debug)]
pub struct WriterHistograms {
    /// From the event's timestamp to its commit returning, in µs.
    pub latency_us: Histogram<u64>,
    /// Items (events and gaps) per commit.
    pub batch_items: Histogram<u64>,
    /// How long each commit's transaction took, in µs.
    pub commit_us: Histogram<u64>,
}

impl Default for WriterHistograms {
    fn default() -> Self {
        // Bounds are constants within hdrhistogram's limits (low >= 1,
        // high >= 2 * low, sigfig <= 5), so construction cannot fail.
        WriterHistograms {
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("valid constant bounds"),
            batch_items: Histogram::new_with_bounds(1, 10_000_000, 3)
                .expect("valid constant bounds"),
            commit_us: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("valid constant bounds"),
        }
    }
}

/// Items copied out of the channel, waiting for the next commit.
#[derive(Default)]
struct Batch {
    headers: Vec<Handoff>,
    /// Payload of item i is `bytes[ends[i-1]..ends[i]]`.
    ends: Vec<usize>,
    bytes: Vec<u8>,
}

impl Batch {
    fn push(&mut self, h: &Handoff, payload: &[u8]) {
        self.headers.push(*h);
        self.bytes.extend_from_slice(payload);
        self.ends.push(self.bytes.len());
    }

    fn len(&self) -> usize {
        self.headers.len()
    }

    fn clear(&mut self) {
        self.headers.clear();
        self.ends.clear();
        self.bytes.clear();
    }

    fn payload(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }
}

/// One receipt being built: a contiguous run of one ring's sequences.
#[derive(Debug, Clone, Copy)]
struct Run {
    ring: u32,
    cpu: u32,
    epoch: u64,
    first: u64,
    last: u64,
    position: u64,
    next_seq: u64,
}

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
    /// Retention's requests (see [`super::control`]).
    control: Arc<WriterControl>,
}

/// The statement that stores one event (the load harness's ceiling runs the
/// same one).
pub const INSERT_EVENT: &str = "INSERT INTO events (ts, cpu, seq, ring_epoch, pid, tid, uid, \
     level, provider, name, message, fields) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";

/// Commit attempts made at shutdown before giving a failing batch up (its
/// events stay in the rings, uncommitted, and are drained at the next start).
const SHUTDOWN_ATTEMPTS: u32 = 5;
/// A batch of 2 up to this many items waits [`LINGER`] for more before it
/// is committed (chosen with the syslog scenario of the load harness, see
/// docs/performance.md).
const LINGER_BELOW_ITEMS: usize = 1024;
const LINGER: Duration = Duration::from_millis(1);
const RETRY_DELAY_MAX: Duration = Duration::from_secs(5);
/// New files one batch may move on to (each after its commit found the
/// file damaged); beyond, the batch is retried as a failing commit.
const MOVES_PER_BATCH_MAX: u32 = 3;

/// What a writer knows of its file, to notice it removed, replaced or cut.
struct FileWatch {
    identity: Option<(u64, u64)>,
    /// When the file was last looked at.
    checked: std::time::Instant,
}

/// A writer looks at its file at most this often (a `stat` and a read of
/// the 100-byte header through SQLite's own descriptor, a few µs).
const FILE_CHECK_INTERVAL: Duration = Duration::from_millis(100);

impl FileWatch {
    fn of(path: &std::path::Path) -> FileWatch {
        use std::os::unix::fs::MetadataExt;
        FileWatch {
            identity: std::fs::symlink_metadata(path)
                .ok()
                .map(|m| (m.dev(), m.ino())),
            checked: std::time::Instant::now(),
        }
    }

    /// What happened to the file, if anything that means damage: removed,
    /// replaced, or shorter than its header's page count (a truncation; the
    /// writer's own checkpoints and vacuums keep the file at least that
    /// long, and they run on this thread, never during this check).
    fn changed(&mut self, conn: &Connection, path: &std::path::Path) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        if self.checked.elapsed() < FILE_CHECK_INTERVAL {
            return None;
        }
        self.checked = std::time::Instant::now();
        let identity = self.identity?;
        let m = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) => return Some(format!("the file is gone ({e})")),
        };
        if (m.dev(), m.ino()) != identity {
            return Some("another file was put at its name".to_string());
        }
        let (len, header) = read_header(conn)?;
        if len < 100 {
            return Some(format!("the file was cut to {len} bytes"));
        }
        if &header[..16] != b"SQLite format 3\0" {
            return Some("its header is no longer a database header".to_string());
        }
        let page = match u16::from_be_bytes([header[16], header[17]]) {
            1 => 65536,
            n => u64::from(n),
        };
        let pages = u64::from(u32::from_be_bytes([
            header[28], header[29], header[30], header[31],
        ]));
        // The page count is valid when the "version valid for" word equals
        // the change counter (SQLite's rule).
        let valid = header[92..96] == header[24..28];
        if valid && len < pages.saturating_mul(page) {
            return Some(format!(
                "the file was cut to {len} bytes; its header counts {pages} pages of {page} bytes"
            ));
        }
        None
    }
}

/// The main database file's length and first 100 bytes, read through the
/// connection's own file handle: opening and closing another descriptor on
/// the file would drop the POSIX locks SQLite holds on it. `None` if SQLite
/// does not give the handle.
fn read_header(conn: &Connection) -> Option<(u64, [u8; 100])> {
    use rusqlite::ffi;
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: the connection's handle is valid while `conn` lives (the
    // writer's thread is the only user); FILE_POINTER writes one pointer
    // into `file`.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&mut file as *mut *mut ffi::sqlite3_file).cast(),
        )
    };
    if rc != ffi::SQLITE_OK || file.is_null() {
        return None;
    }
    // SAFETY: `file` is the open main database file SQLite just handed us;
    // its methods table is set for an open file.
    let methods = unsafe { (*file).pMethods.as_ref()? };
    let mut len: ffi::sqlite3_int64 = 0;
    // SAFETY: xFileSize of an open file, writing one integer.
    if unsafe { methods.xFileSize?(file, &mut len) } != ffi::SQLITE_OK {
        return None;
    }
    let mut header = [0u8; 100];
    if len >= 100 {
        // SAFETY: xRead of 100 bytes at offset 0 into a 100-byte buffer.
        let rc = unsafe { methods.xRead?(file, header.as_mut_ptr().cast(), 100, 0) };
        if rc != ffi::SQLITE_OK {
            return None;
        }
    }
    Some((len.max(0) as u64, header))
}

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
        }
    }

    /// Runs until every drain has dropped its sender and the channel is
    /// empty, then closes the database (checkpointing the WAL).
    pub fn run(mut self) -> Result<(), StoreError> {
        loop {
            let batch = &mut self.batch;
            batch.clear();
            // Wait for one item, then read MaxBatchSize: a change made while
            // the writer waited applies to this very batch (R11).
            if self.rx.recv_batch(1, |h, p| accept(batch, h, p)).is_err() {
                break; // every sender is gone and nothing is left
            }
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
            if (2..LINGER_BELOW_ITEMS.min(max)).contains(&batch.len()) {
                // A steady stream that keeps the channel just short of
                // full would otherwise be committed a hundred events at a
                // time, and a commit costs about as much as a few hundred
                // rows (its pages go through the WAL and the checkpoint).
                // Lingering gathers more first; a lone event (an idle
                // daemon) is committed at once.
                self.rx.release_consumed();
                std::thread::sleep(LINGER);
                drain(&mut self.rx, batch);
            }
            // Room goes back before the commit, not after it.
            self.rx.release_consumed();
            // Damage found since the last commit (a reader's report, the
            // file changed) sends this batch to a new file already.
            self.check_file();
            if !self.batch.headers.is_empty() {
                self.commit_with_retry()?;
            }
            // Retention's request, if one waits: looked for after every
            // commit (one uncontended lock), since a channel kept full by
            // the drains may not have had room for its wakeup item.
            self.serve_control();
        }
        Ok(())
    }

    /// Before a commit: is the file still whole and ours? A reader that
    /// found it corrupt, or the file removed, replaced or cut shorter than
    /// its header says, all mean later commits would be lost to queries:
    /// the writer moves on to a new file.
    fn check_file(&mut self) {
        let why = match self.shared.health.take_suspect(&self.path) {
            Some(why) => Some(format!("a query found it corrupt: {why}")),
            None => self.file.changed(&self.conn, &self.path),
        };
        if let Some(why) = why {
            if let Err(e) = self.move_on(&why) {
                tracing::error!(
                    shard = %self.path.display(),
                    damage = %why,
                    error = %e,
                    "shard file damaged and no new file can be made; writing on to it"
                );
            }
        }
    }

    /// Gives the current file up as damaged (`why`) and goes on in the
    /// shard's next generation. The damaged file is left as it is: not even
    /// the checkpoint a close makes is written into it.
    fn move_on(&mut self, why: &str) -> Result<(), StoreError> {
        let next = super::next_shard_path(&self.shared.store_dir, self.index, &self.path);
        let conn = super::open_shard_with(&next, self.shared.mode)?;
        let _ = self.conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        );
        drop(std::mem::replace(&mut self.conn, conn));
        let old = std::mem::replace(&mut self.path, next.clone());
        self.file = FileWatch::of(&self.path);
        *self.stats.path.lock().unwrap_or_else(|p| p.into_inner()) = next.clone();
        self.stats.damaged_files.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            shard = %old.display(),
            damage = %why,
            new_file = %next.display(),
            "shard file damaged: left as it is; this shard's events go to a new file"
        );
        self.shared.health.mark_damaged(
            super::Damaged {
                path: old,
                reason: why.to_string(),
                found_at: crate::rings::now_ns(),
                replaced_by: Some(next),
            },
            Some(self.index),
        );
        Ok(())
    }

    /// Runs retention's waiting request (if it was not withdrawn) between
    /// two commits, and leaves the answer.
    fn serve_control(&mut self) {
        if let Some((id, request)) = self.control.take() {
            let result = control::execute(&mut self.conn, &request)
                .map_err(|e| format!("shard database {}: {request:?}: {e}", self.path.display()));
            self.control.answer(id, result);
        }
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

    /// One transaction: events, gaps, receipts. On success, tells the ring
    /// trackers which runs are now committed.
    fn commit(&mut self) -> rusqlite::Result<()> {
        self.runs.clear();
        let now_ns = crate::rings::now_ns();
        let started = std::time::Instant::now();
        let tx = self.conn.transaction()?;
        let (mut events, mut lost, mut bytes) = (0u64, 0u64, 0u64);
        {
            let mut insert_event = tx.prepare_cached(INSERT_EVENT)?;
            let mut insert_gap = tx.prepare_cached(
                "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, \
                 ts_before, detected_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            for (i, h) in self.batch.headers.iter().enumerate() {
                let parts = match h.kind {
                    Kind::Event => split_payload(h, self.batch.payload(i)),
                    Kind::Gap(_) | Kind::Control => None,
                };
                match (h.kind, parts) {
                    (Kind::Event, Some([provider, name, message, fields])) => {
                        let fields = stored_fields(fields);
                        insert_event.execute(params![
                            h.ts_ns,
                            h.cpu,
                            h.first_seq as i64,
                            h.ring_epoch as i64,
                            h.pid,
                            h.tid,
                            h.uid,
                            h.level,
                            provider,
                            name,
                            message,
                            fields,
                        ])?;
                        events += 1;
                        bytes += (provider.len()
                            + name.len()
                            + message.len()
                            + fields.as_ref().map_or(0, |f| f.len()))
                            as u64;
                    }
                    (kind, _) => {
                        // A gap, or (never from our drain) an event whose
                        // payload does not split: stored as a corrupt gap so
                        // the sequence number stays accounted for.
                        let (reason, count) = match kind {
                            Kind::Gap(reason) => (reason, h.lost),
                            // Control items never enter a batch (`accept`).
                            Kind::Event | Kind::Control => {
                                (LossReason::Corrupt, h.last_seq - h.first_seq + 1)
                            }
                        };
                        insert_gap.execute(params![
                            h.ring_epoch as i64,
                            h.cpu,
                            h.first_seq as i64,
                            h.last_seq as i64,
                            count as i64,
                            reason.name(),
                            h.ts_ns,
                            now_ns,
                        ])?;
                        lost += count;
                    }
                }
                add_to_runs(&mut self.runs, h);
            }
            let mut insert_receipt = tx.prepare_cached(
                "INSERT INTO receipts (ring_epoch, cpu, first_seq, last_seq, position, \
                 next_seq, committed_through, committed_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            for run in &self.runs {
                // The watermark only covers commits that already returned,
                // so storing it here never claims more than is durable.
                let through = self.shared.trackers[run.ring as usize].watermark(run.epoch);
                insert_receipt.execute(params![
                    run.epoch as i64,
                    run.cpu,
                    run.first as i64,
                    run.last as i64,
                    run.position as i64,
                    run.next_seq as i64,
                    through as i64,
                    now_ns,
                ])?;
            }
        }
        tx.commit()?;
        self.record_commit(started.elapsed());
        for run in &self.runs {
            self.shared.trackers[run.ring as usize].committed(run.epoch, run.first, run.last);
        }
        let s = &self.stats;
        s.events.fetch_add(events, Ordering::Relaxed);
        s.event_bytes.fetch_add(bytes, Ordering::Relaxed);
        s.lost.fetch_add(lost, Ordering::Relaxed);
        s.commits.fetch_add(1, Ordering::Relaxed);
        s.batch_max
            .fetch_max(self.batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl ShardWriter {
    /// Records the commit's duration and size, and the emit-to-commit
    /// latency of the batch's events.
    fn record_commit(&self, took: Duration) {
        let done_ns = crate::rings::now_ns();
        let mut h = self
            .stats
            .histograms
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for item in &self.batch.headers {
            if item.kind == Kind::Event {
                // A producer clock ahead of ours counts as the minimum.
                let us = done_ns.saturating_sub(item.ts_ns).max(0) as u64 / 1000;
                h.latency_us.saturating_record(us.max(1));
            }
        }
        h.batch_items.saturating_record(self.batch.len() as u64);
        h.commit_us
            .saturating_record((took.as_micros() as u64).max(1));
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

/// What the `fields` column gets: NULL for none, the text itself when it is
/// a JSON object, else (a producer wrote something else: the ring is
/// untrusted) an object keeping the text, so `json_extract` never fails on
/// a row and nothing is dropped.
fn stored_fields(fields: &str) -> Option<std::borrow::Cow<'_, str>> {
    if fields.is_empty() {
        return None;
    }
    let object = fields.trim_start().starts_with('{')
        && serde_json::from_str::<serde::de::IgnoredAny>(fields).is_ok();
    Some(if object {
        std::borrow::Cow::Borrowed(fields)
    } else {
        std::borrow::Cow::Owned(serde_json::json!({ "invalid_fields": fields }).to_string())
    })
}

/// Extends the ring's latest run with `h` if it continues it, else starts a
/// new run. Items of one ring reach a writer in sequence order (one drain per
/// ring, FIFO channel), so a stripe boundary is the only break.
fn add_to_runs(runs: &mut Vec<Run>, h: &Handoff) {
    if let Some(run) = runs.iter_mut().rev().find(|r| r.ring == h.ring) {
        if run.epoch == h.ring_epoch && run.last.checked_add(1) == Some(h.first_seq) {
            run.last = h.last_seq;
            run.position = h.position;
            run.next_seq = h.next_seq;
            return;
        }
    }
    runs.push(Run {
        ring: h.ring,
        cpu: h.cpu,
        epoch: h.ring_epoch,
        first: h.first_seq,
        last: h.last_seq,
        position: h.position,
        next_seq: h.next_seq,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
            add_to_runs(&mut runs, &h);
        }
        let got: Vec<(u32, u64, u64)> = runs.iter().map(|r| (r.ring, r.first, r.last)).collect();
        assert_eq!(got, vec![(0, 1, 9), (1, 5, 6), (0, 20, 20)]);
        assert_eq!(runs[0].next_seq, 10);
    }

    #[test]
    fn retention_is_served_while_drains_keep_the_channel_full() {
        use crate::channel::{Capacity, HandoffChannel};
        use crate::store::control::{Reply, Request};
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
