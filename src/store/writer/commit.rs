//! One commit: the batch copied out of the channel, its events and gaps
//! inserted, one receipt per contiguous run of each ring's sequence
//! numbers, all in one transaction (R6); then the commit is published to the
//! ring trackers and the counters.

use super::ShardWriter;
use crate::drain::{split_payload, CommitTracker, Handoff, Kind};
use crate::rings::LossReason;
use crate::store::rows::{NewEvent, NewGap, Receipt, INSERT_EVENT, INSERT_GAP, INSERT_RECEIPT};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Items copied out of the channel, waiting for the next commit.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) headers: Vec<Handoff>,
    /// Payload of item i is `bytes[ends[i-1]..ends[i]]`.
    pub(super) ends: Vec<usize>,
    pub(super) bytes: Vec<u8>,
}

impl Batch {
    pub(super) fn push(&mut self, h: &Handoff, payload: &[u8]) {
        self.headers.push(*h);
        self.bytes.extend_from_slice(payload);
        self.ends.push(self.bytes.len());
    }

    pub(super) fn len(&self) -> usize {
        self.headers.len()
    }

    pub(super) fn clear(&mut self) {
        self.headers.clear();
        self.ends.clear();
        self.bytes.clear();
    }

    /// Room held, in bytes.
    pub(super) fn footprint(&self) -> usize {
        self.bytes.capacity()
            + self.ends.capacity() * std::mem::size_of::<usize>()
            + self.headers.capacity() * std::mem::size_of::<Handoff>()
    }

    pub(super) fn payload(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }
}

/// Batch buffers the writers share: a writer takes one when a batch starts
/// and gives it back after the commit, so that memory follows the writers
/// busy at once, not the shard count. (A batch of 4096 events holds about
/// 1 MiB; kept by each of 256 writers, mostly idle between their stripes,
/// that was a quarter of a GiB.) At most [`BatchPool::KEEP`] idle buffers
/// are kept.
#[derive(Default)]
pub struct BatchPool {
    idle: std::sync::Mutex<Vec<Batch>>,
}

impl BatchPool {
    /// Idle buffers kept: more than the writers a few drains keep busy.
    const KEEP: usize = 8;

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Batch>> {
        // Each change under the lock is one push or pop.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty batch, with room from an earlier one if any is idle.
    pub(super) fn take(&self) -> Batch {
        self.lock().pop().unwrap_or_default()
    }

    /// Gives `batch`'s room back (dropped if enough are kept).
    pub(super) fn give(&self, mut batch: Batch) {
        if batch.footprint() == 0 {
            return;
        }
        batch.clear();
        let mut idle = self.lock();
        if idle.len() < Self::KEEP {
            idle.push(batch);
        }
    }

    /// Bytes the idle buffers hold.
    #[cfg(test)]
    fn idle_bytes(&self) -> usize {
        self.lock().iter().map(Batch::footprint).sum()
    }
}

/// One receipt being built: a contiguous run of one ring's sequences.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    /// Ordinal of the ring (which tracker it reports to); not stored.
    pub(super) ring: u32,
    /// The receipt row, its watermark filled in just before it is stored.
    pub(super) receipt: Receipt,
}

impl ShardWriter {
    /// One transaction: events, gaps, receipts ([`ShardWriter::insert_items`],
    /// [`ShardWriter::insert_receipts`]); once it is durable, the commit is
    /// published ([`ShardWriter::publish`]).
    /// Damaged files' losses waiting to be stored (`store::loss`) go into
    /// the same transaction.
    pub(super) fn commit(&mut self) -> rusqlite::Result<()> {
        let losses = self.shared.health.take_losses();
        match self.commit_with(&losses) {
            Ok(()) => {
                let health = &self.shared.health;
                health.stored(losses);
                let trackers = &self.shared.trackers;
                health.check_awaiting(|epoch| {
                    trackers
                        .iter()
                        .map(|t| t.watermark(epoch))
                        .max()
                        .unwrap_or(0)
                });
                Ok(())
            }
            Err(e) => {
                self.shared.health.give_back(losses);
                Err(e)
            }
        }
    }

    fn commit_with(&mut self, losses: &[crate::store::loss::Loss]) -> rusqlite::Result<()> {
        self.runs.clear();
        let now_ns = crate::rings::now_ns();
        let started = std::time::Instant::now();
        let tx = self.conn.transaction()?;
        let counts = insert_items(&tx, &self.batch, &mut self.runs, now_ns)?;
        for &(ring_epoch, cpu, events, max_seq) in &counts.rings {
            crate::store::schema::count_ring_events(
                &tx,
                ring_epoch,
                cpu,
                events as i64,
                max_seq,
                now_ns,
            )?;
        }
        crate::store::loss::insert(&tx, losses)?;
        if let Some((lo, hi)) = counts.span {
            crate::store::zones::record(&tx, lo, hi, counts.event_id_max)?;
        }
        insert_receipts(&tx, &mut self.runs, &self.shared.trackers, now_ns)?;
        // When these rows were committed (once a minute), on a clock no
        // wall clock step moves: what retention judges age by.
        crate::store::retention::marks::record_each_minute(
            &tx,
            crate::store::retention::reckoning::now_ns(),
        )?;
        // Before the commit: the map may claim more than the file holds
        // (if the commit fails), never less (see `store::zones`).
        self.shared.health.zones().widen(
            &self.path,
            counts.span,
            counts.gaps || !losses.is_empty(),
        );
        tx.commit()?;
        self.publish(counts, started.elapsed());
        Ok(())
    }

    /// After a commit returned: the ring trackers learn which runs are
    /// committed (so later receipts may claim them), and the counters and
    /// histograms take the commit in.
    fn publish(&self, counts: Counts, took: Duration) {
        self.record_commit(took);
        for run in &self.runs {
            let r = &run.receipt;
            self.shared.trackers[run.ring as usize].committed(
                r.ring_epoch,
                r.first_seq,
                r.last_seq,
            );
        }
        let s = &self.stats;
        s.events.fetch_add(counts.events, Ordering::Relaxed);
        s.event_bytes.fetch_add(counts.bytes, Ordering::Relaxed);
        s.lost.fetch_add(counts.lost, Ordering::Relaxed);
        s.commits.fetch_add(1, Ordering::Relaxed);
        s.batch_max
            .fetch_max(self.batch.len() as u64, Ordering::Relaxed);
    }
}

/// What one commit stored.
#[derive(Debug, Default, Clone)]
struct Counts {
    events: u64,
    /// Payload bytes of the events, as stored.
    bytes: u64,
    /// Sequence numbers (or dropped messages) stored as gaps.
    lost: u64,
    /// The least and greatest `ts` of the events (none: no event).
    span: Option<(i64, i64)>,
    /// Whether any gap row was stored.
    gaps: bool,
    /// The id of the last event stored (ids rise).
    event_id_max: i64,
    /// Events stored per ring `(epoch, cpu)`, and the highest sequence
    /// number among them (a batch holds a few rings' events).
    rings: Vec<(u64, u32, u64, u64)>,
}

impl Counts {
    fn count_ring_event(&mut self, ring_epoch: u64, cpu: u32, seq: u64) {
        match self
            .rings
            .iter_mut()
            .find(|r| r.0 == ring_epoch && r.1 == cpu)
        {
            Some(r) => {
                r.2 += 1;
                r.3 = r.3.max(seq);
            }
            None => self.rings.push((ring_epoch, cpu, 1, seq)),
        }
    }
}

/// Inserts the batch's events and gaps, and gathers its receipt runs.
fn insert_items(
    tx: &rusqlite::Transaction<'_>,
    batch: &Batch,
    runs: &mut Vec<Run>,
    now_ns: i64,
) -> rusqlite::Result<Counts> {
    let mut counts = Counts::default();
    let mut insert_event = tx.prepare_cached(INSERT_EVENT)?;
    let mut insert_gap = tx.prepare_cached(INSERT_GAP)?;
    for (i, h) in batch.headers.iter().enumerate() {
        let parts = match h.kind {
            Kind::Event => split_payload(h, batch.payload(i)),
            Kind::Gap(_) | Kind::Control => None,
        };
        match (h.kind, parts) {
            (Kind::Event, Some([provider, name, message, fields])) => {
                let fields = stored_fields(fields);
                let event = NewEvent {
                    ts: h.ts_ns,
                    cpu: h.cpu,
                    seq: h.first_seq,
                    ring_epoch: h.ring_epoch,
                    pid: h.pid,
                    tid: h.tid,
                    uid: h.uid,
                    level: h.level,
                    provider,
                    name,
                    message,
                    fields: fields.as_deref(),
                };
                event.insert(&mut insert_event)?;
                counts.event_id_max = tx.last_insert_rowid();
                counts.span = Some(match counts.span {
                    Some((lo, hi)) => (lo.min(h.ts_ns), hi.max(h.ts_ns)),
                    None => (h.ts_ns, h.ts_ns),
                });
                counts.events += 1;
                counts.count_ring_event(h.ring_epoch, h.cpu, h.first_seq);
                counts.bytes += event.payload_bytes();
            }
            (kind, _) => {
                // A gap, or (never from our drain) an event whose payload
                // does not split: stored as a corrupt gap so the sequence
                // number stays accounted for.
                let (reason, lost) = match kind {
                    Kind::Gap(reason) => (reason, h.lost),
                    // Control items never enter a batch (`accept`).
                    Kind::Event | Kind::Control => {
                        (LossReason::Corrupt, h.last_seq - h.first_seq + 1)
                    }
                };
                NewGap {
                    ring_epoch: h.ring_epoch,
                    cpu: h.cpu,
                    from_seq: h.first_seq,
                    to_seq: h.last_seq,
                    lost,
                    reason: reason.name(),
                    ts_before: h.ts_ns,
                    detected_at: now_ns,
                }
                .insert(&mut insert_gap)?;
                counts.lost += lost;
                counts.gaps = true;
            }
        }
        add_to_runs(runs, h, now_ns);
    }
    Ok(counts)
}

/// Inserts one receipt per run, each with its ring's watermark as it is
/// now: the watermark only covers commits that already returned, so storing
/// it never claims more than is durable.
fn insert_receipts(
    tx: &rusqlite::Transaction<'_>,
    runs: &mut [Run],
    trackers: &[CommitTracker],
    now_ns: i64,
) -> rusqlite::Result<()> {
    let mut insert_receipt = tx.prepare_cached(INSERT_RECEIPT)?;
    for run in runs.iter_mut() {
        let r = &mut run.receipt;
        r.committed_through = trackers[run.ring as usize].watermark(r.ring_epoch);
        r.committed_at = now_ns;
        r.insert(&mut insert_receipt)?;
    }
    Ok(())
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
                h.record_latency(us.max(1));
            }
        }
        h.record_commit(self.batch.len() as u64, (took.as_micros() as u64).max(1));
    }
}

/// What the `fields` column gets: NULL for none, the text itself when it is
/// a JSON object, else (a producer wrote something else: the ring is
/// untrusted) an object keeping the text, so `json_extract` never fails on
/// a row and nothing is dropped.
pub(super) fn stored_fields(fields: &str) -> Option<std::borrow::Cow<'_, str>> {
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
pub(super) fn add_to_runs(runs: &mut Vec<Run>, h: &Handoff, now_ns: i64) {
    if let Some(run) = runs.iter_mut().rev().find(|r| r.ring == h.ring) {
        let r = &mut run.receipt;
        if r.ring_epoch == h.ring_epoch && r.last_seq.checked_add(1) == Some(h.first_seq) {
            r.last_seq = h.last_seq;
            r.position = h.position;
            r.next_seq = h.next_seq;
            return;
        }
    }
    runs.push(Run {
        ring: h.ring,
        receipt: Receipt {
            ring_epoch: h.ring_epoch,
            cpu: h.cpu,
            first_seq: h.first_seq,
            last_seq: h.last_seq,
            position: h.position,
            next_seq: h.next_seq,
            committed_through: 0,
            committed_at: now_ns,
        },
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_pool_passes_room_on_and_keeps_a_bounded_amount() {
        let pool = BatchPool::default();
        let mut a = pool.take();
        a.push(&Handoff::default(), &[7u8; 100_000]);
        let room = a.footprint();
        pool.give(a);
        // The next writer gets that room, empty.
        let b = pool.take();
        assert_eq!((b.len(), b.footprint()), (0, room));
        assert_eq!(pool.idle_bytes(), 0);
        pool.give(b);
        // More buffers than KEEP: the extra ones are freed, not kept.
        let many: Vec<Batch> = (0..BatchPool::KEEP + 5)
            .map(|_| {
                let mut x = pool.take();
                x.push(&Handoff::default(), &[1u8; 1000]);
                x
            })
            .collect();
        for x in many {
            pool.give(x);
        }
        assert_eq!(pool.lock().len(), BatchPool::KEEP);
        // An empty default batch holds nothing and is not kept.
        pool.lock().clear();
        pool.give(Batch::default());
        assert_eq!(pool.lock().len(), 0);
    }
}
