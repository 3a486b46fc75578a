//! The drain thread: one per attached ring. It reads events and gaps from
//! its ring and hands them, in stripes (R5), to the channels of the shards it
//! owns. It never touches SQLite (R8).
//!
//! Back-pressure (R9): before an event's bytes are copied into a channel the
//! drain reserves room for them, waiting while the channel is full. While it
//! waits it reads nothing more from the ring, so the backlog stays in the
//! ring (and, if the ring laps, becomes an exact gap), never in eventd's
//! memory.

use crate::channel::{SendError, Sender};
use crate::rings::{Gap, LossReason, ReadPosition, RingItem, RingReader};
use crate::routing::StripeRouter;
use crate::store::handoff::{payload_len, write_payload, Handoff};
use crate::store::CommittedRuns;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest sleep of an idle drain before it looks at the stop flag again.
/// Producers wake it at once; this only bounds shutdown time.
const IDLE_WAIT: Duration = Duration::from_millis(250);
/// When a steady stream runs dry (at least [`STEADY_EVENTS`] events since
/// the drain last slept on the ring), the drain first naps this long, up
/// to [`NAPS_BEFORE_WAIT`] times, without asking producers to wake it:
/// under a steady stream each producer then emits with no system call at
/// all (a wake costs the producer a `futex` call and both sides a context
/// switch), for about 0.1 ms more latency (the nap plus the kernel's
/// default 50 µs timer slack). A sparse ring goes straight to the wait
/// with the producers' wake-up, so it costs no extra wakeups (LTTng's
/// consumers poll on a timer for the same reason).
const IDLE_NAP: Duration = Duration::from_micros(50);
const NAPS_BEFORE_WAIT: u32 = 20;
const STEADY_EVENTS: u32 = 64;

/// Counters for `eventctl stats`; Relaxed, monitoring only.
#[derive(Debug, Default)]
pub struct DrainStats {
    pub events: AtomicU64,
    pub lost: AtomicU64,
    /// Events read again after a restart that were already committed.
    pub skipped: AtomicU64,
}

/// The drain of one ring.
pub struct DrainThread {
    /// Ring ordinal (R4) and logical CPU id.
    pub ordinal: u32,
    pub cpu: u32,
    epoch: u64,
    reader: RingReader,
    router: StripeRouter,
    /// Indexed by shard; `Some` for the shards this drain owns.
    senders: Vec<Option<Sender<Handoff>>>,
    /// Committed runs above the resume point (after a crash).
    skip: CommittedRuns,
    /// Sequence numbers the previous run passed over as lost but whose gap
    /// was not committed; stored first.
    pending_gap: Option<Gap>,
    stop: Arc<AtomicBool>,
    last_ts_ns: i64,
    stats: Arc<DrainStats>,
}

/// Why a drain stopped early.
#[derive(Debug, thiserror::Error)]
#[error("drain of cpu {cpu}: the writer of shard {shard} is gone")]
pub struct DrainError {
    pub cpu: u32,
    pub shard: usize,
}

impl DrainThread {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ordinal: u32,
        reader: RingReader,
        router: StripeRouter,
        senders: Vec<Option<Sender<Handoff>>>,
        plan: &crate::store::RingPlan,
        stop: Arc<AtomicBool>,
        stats: Arc<DrainStats>,
    ) -> Self {
        let ring = reader.ring();
        let (cpu, epoch) = (ring.cpu(), ring.epoch());
        // Between the committed prefix and the resume position lie sequence
        // numbers an earlier run already found lost; those not committed
        // (as a gap) anywhere are stored as a gap again.
        let pending_gap = (plan.resume.next_seq > plan.committed_through + 1).then(|| Gap {
            from_seq: plan.committed_through + 1,
            to_seq: plan.resume.next_seq - 1,
            reason: LossReason::Overwritten,
        });
        DrainThread {
            ordinal,
            cpu,
            epoch,
            reader,
            router,
            senders,
            skip: plan.committed_runs(),
            pending_gap,
            stop,
            last_ts_ns: 0,
            stats,
        }
    }

    /// Drains until the stop flag is set, then returns (dropping its senders,
    /// which lets the writers finish).
    pub fn run(mut self) -> Result<(), DrainError> {
        if let Some(gap) = self.pending_gap.take() {
            let at = self.reader.position();
            self.send_gap(gap, at)?;
        }
        // Events since the drain last waited, and naps since the last one.
        let (mut streak, mut naps) = (0u32, 0u32);
        // Relaxed: the flag only asks the loop to end; nothing is published
        // through it.
        while !self.stop.load(Ordering::Relaxed) {
            let Some((item, after)) = self.reader.poll_with_position() else {
                if streak >= STEADY_EVENTS && naps < NAPS_BEFORE_WAIT {
                    naps += 1;
                    std::thread::sleep(IDLE_NAP);
                } else {
                    streak = 0;
                    self.reader.wait(Some(IDLE_WAIT));
                }
                continue;
            };
            streak = streak.saturating_add(1);
            naps = 0;
            match item {
                RingItem::Event { seq, event } => {
                    if !self.skip.is_empty() && self.skip.contains(seq) {
                        self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let shard = self.router.next_shard();
                    let header = Handoff::event(self.ordinal, self.cpu, self.epoch, seq, &event)
                        .after(after);
                    let sender = owned(&self.senders, shard);
                    // Reserve first (waits while the channel is full, R9),
                    // then copy the record's strings straight into the slot.
                    let permit = sender
                        .reserve(payload_len(&event))
                        .map_err(|e| gone(self.cpu, e, shard))?;
                    let filled = permit.commit_with(|buf| {
                        write_payload(&event, buf);
                        Ok::<_, Infallible>(header)
                    });
                    // Infallible: the closure above cannot fail.
                    let Ok(()) = filled;
                    self.last_ts_ns = event.ts_ns;
                    self.stats.events.fetch_add(1, Ordering::Relaxed);
                }
                RingItem::Gap(gap) => self.send_gap(gap, after)?,
            }
        }
        Ok(())
    }

    /// Hands over the parts of `gap` not committed yet, each resuming at
    /// `after` (the reader's position past the whole gap).
    fn send_gap(&mut self, gap: Gap, after: ReadPosition) -> Result<(), DrainError> {
        let pieces = if self.skip.is_empty() {
            vec![(gap.from_seq, gap.to_seq)]
        } else {
            self.skip.uncommitted(gap.from_seq, gap.to_seq)
        };
        for (from_seq, to_seq) in pieces {
            let piece = Gap {
                from_seq,
                to_seq,
                reason: gap.reason,
            };
            let shard = self.router.next_shard();
            let header = Handoff::gap(self.ordinal, self.cpu, self.epoch, piece, self.last_ts_ns)
                .after(after);
            owned(&self.senders, shard)
                .send(header, &[])
                .map_err(|e| gone(self.cpu, e, shard))?;
            self.stats
                .lost
                .fetch_add(piece.to_seq - piece.from_seq + 1, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn gone(cpu: u32, e: SendError, shard: usize) -> DrainError {
    // TooLarge cannot happen: a ring record is at most one page.
    debug_assert_eq!(e, SendError::Disconnected);
    DrainError { cpu, shard }
}

fn owned(senders: &[Option<Sender<Handoff>>], shard: usize) -> &Sender<Handoff> {
    // The router only returns shards from this drain's assignment, and the
    // daemon builds `senders` with a sender for each of them.
    senders[shard]
        .as_ref()
        .expect("the router only yields owned shards")
}
