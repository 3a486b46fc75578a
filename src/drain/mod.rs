//! The drain stage: one thread per drained ring. It reads events and gaps
//! from its ring and hands them, in stripes (R5), to the channels of the
//! shards it owns, as [`Handoff`] items ([`handoff`]); it never touches
//! SQLite (R8). Beside it live what it starts from ([`RingPlan`], made by
//! recovery from the receipts), what it shares with the writers that commit
//! its items ([`CommitTracker`]: which sequence runs are committed), and its
//! look at its ring's health ([`health`]), which replaces an unusable ring.
//!
//! Back-pressure (R9): before an event's bytes are copied into a channel the
//! drain reserves room for them, waiting while the channel is full. While it
//! waits it reads nothing more from the ring, so the backlog stays in the
//! ring (and, if the ring laps, becomes an exact gap), never in eventd's
//! memory.

mod handoff;
mod health;
pub mod limit;
mod orphans;
mod plan;
mod rates;
pub mod spawn;
mod tracker;

pub use handoff::{payload_len, split_payload, write_payload, Handoff, Kind};
pub use health::{RingMaker, HEALTH_INTERVAL};
pub use limit::Suppression;
pub use rates::{Matches, RateLimits, SourceLimit};

use health::{Health, HEALTH_EVERY_EVENTS};
use orphans::Orphans;
pub use plan::RingPlan;
pub use spawn::{spawn_drains, DrainSpec, Drains};
pub use tracker::{CommitTracker, CommittedRuns};

use crate::channel::{SendError, Sender};
use crate::rings::drops::{DropReport, Drops};
use crate::rings::orphan::{OrphanReport, ORPHAN_PROVIDER};
use crate::rings::{CurrentRing, Event, Gap, LossReason, ReadPosition, Ring, RingItem, RingReader};
use crate::routing::StripeRouter;
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
    /// Times the ring was given up and made anew (truncated, removed,
    /// replaced or wedged).
    pub replacements: AtomicU64,
    /// Header words written back after a scribble.
    pub header_repairs: AtomicU64,
    /// Events past their source's rate limit, stored as `suppressed` gaps.
    pub suppressed: AtomicU64,
}

/// The drain of one ring.
pub struct DrainThread {
    reader: RingReader,
    /// The reader's ring (a handle of its own, to look at while an item
    /// borrows the reader).
    ring: Arc<Ring>,
    /// Where items go: routing, channels, counters.
    out: Outbound,
    /// Sequence numbers the previous run passed over as lost but whose gap
    /// was not committed; stored first.
    pending_gap: Option<Gap>,
    stop: Arc<AtomicBool>,
    /// Where the daemon's other parts find this ring (replaced with it).
    current: Arc<CurrentRing>,
    trackers: Arc<[CommitTracker]>,
    maker: RingMaker,
    health: Health,
}

/// The side of a drain that faces the shard writers: it turns what the
/// reader found into [`Handoff`] items and sends them along the stripes.
/// (Apart from the reader, so that an item borrowed from the reader's copy
/// can be handed on.)
struct Outbound {
    /// Ring ordinal (R4), logical CPU id and current epoch of the ring.
    ordinal: u32,
    cpu: u32,
    epoch: u64,
    router: StripeRouter,
    /// Indexed by shard; `Some` for the shards this drain owns.
    senders: Vec<Option<Sender<Handoff>>>,
    /// Committed runs above the resume point (after a crash).
    skip: CommittedRuns,
    /// Timestamp of the last event handed on (a gap's `ts_before`).
    last_ts_ns: i64,
    stats: Arc<DrainStats>,
    /// For eventd's own syslog ring: the count of messages dropped before
    /// they reached it, reported into it when it has room.
    drops: Option<Arc<Drops>>,
    /// Earlier rings of this CPU, for producers' reports of them.
    orphans: Orphans,
    /// Each source's share ([`limit`]), and the run of events it
    /// suppressed that is not handed on yet (one gap for the whole run).
    limiter: limit::Limiter,
    suppressed: Option<(Gap, ReadPosition)>,
}

/// Why a drain stopped early.
#[derive(Debug, thiserror::Error)]
#[error("drain of cpu {cpu}: the writer of shard {shard} is gone")]
pub struct DrainError {
    pub cpu: u32,
    pub shard: usize,
}

/// What a drain is given besides its reader and routing.
pub struct DrainParts {
    pub senders: Vec<Option<Sender<Handoff>>>,
    pub stop: Arc<AtomicBool>,
    pub stats: Arc<DrainStats>,
    pub current: Arc<CurrentRing>,
    pub trackers: Arc<[CommitTracker]>,
    pub maker: RingMaker,
    pub drops: Option<Arc<Drops>>,
    pub limiter: limit::Limiter,
}

impl DrainThread {
    pub fn new(
        ordinal: u32,
        reader: RingReader,
        router: StripeRouter,
        plan: &RingPlan,
        parts: DrainParts,
    ) -> Self {
        let ring = reader.ring().clone();
        let health = Health::of(&ring, &reader);
        DrainThread {
            out: Outbound {
                ordinal,
                cpu: ring.cpu(),
                epoch: ring.epoch(),
                router,
                senders: parts.senders,
                skip: plan.committed_runs(),
                last_ts_ns: 0,
                stats: parts.stats,
                drops: parts.drops,
                orphans: Orphans::new(plan),
                limiter: parts.limiter,
                suppressed: None,
            },
            ring,
            reader,
            pending_gap: plan.resume_gap(),
            stop: parts.stop,
            current: parts.current,
            trackers: parts.trackers,
            maker: parts.maker,
            health,
        }
    }

    /// Drains until the stop flag is set, then returns (dropping its senders,
    /// which lets the writers finish).
    pub fn run(mut self) -> Result<(), DrainError> {
        if let Some(gap) = self.pending_gap.take() {
            self.out.send_gap(gap, self.reader.position())?;
        }
        self.ring.publish_rate_limit(self.out.limiter.published());
        // Events since the drain last waited, and naps since the last one;
        // events since the last health check.
        let (mut streak, mut naps, mut since_check) = (0u32, 0u32, 0u32);
        // Relaxed: the flag only asks the loop to end; nothing is published
        // through it.
        while !self.stop.load(Ordering::Relaxed) {
            if since_check >= HEALTH_EVERY_EVENTS {
                since_check = 0;
                // The run of suppressed events first: it is of this epoch.
                self.out.flush_suppressed()?;
                self.check_health(false)?;
                self.out.report_suppressed(&self.ring);
            }
            let Some((item, after)) = self.reader.poll_with_position() else {
                self.out.flush_suppressed()?;
                self.out.report_suppressed(&self.ring);
                self.check_scribble()?;
                if self.health.due() {
                    since_check = 0;
                    self.check_health(true)?;
                    self.out.report_drops(&self.ring);
                }
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
            since_check = since_check.saturating_add(1);
            naps = 0;
            if self.ring.faulted() {
                // The file shrank while the item was read: it may come from
                // the zeroed stand-in memory, so it is not trusted. An
                // event's sequence number is recorded as lost with the
                // ring (a gap read from zeros could claim anything, and is
                // dropped); then the ring is replaced.
                if let RingItem::Event { seq, .. } = item {
                    let lost = Gap {
                        from_seq: seq,
                        to_seq: seq,
                        reason: LossReason::RingLost,
                    };
                    self.out.send_gap(lost, after)?;
                }
                self.check_health(false)?;
                continue;
            }
            match item {
                RingItem::Event { seq, event } => self.out.hand_on(seq, &event, after)?,
                RingItem::Gap(gap) => self.out.send_gap(gap, after)?,
            }
        }
        self.out.flush_suppressed()
    }
}

impl Outbound {
    /// Hands event `seq` to the next shard of the stripe: skipped if a
    /// previous run committed it already; a report of dropped messages or
    /// overwritten kernel records becomes a `dropped` or
    /// `kernel_overwritten` gap (a report is one only in eventd's own
    /// rings, which no producer can open, so their records are eventd's;
    /// anywhere else such an event is an ordinary one).
    fn hand_on(
        &mut self,
        seq: u64,
        event: &Event<'_>,
        after: ReadPosition,
    ) -> Result<(), DrainError> {
        // A producer's report of a ring replaced under it (see
        // `rings::orphan`): the old ring's losses go first, as gaps of its
        // epoch, then the report is stored as the event it also is. Read
        // again after a crash, it adds only the gaps not committed then
        // (the old ring's receipts say which). Not on the syslog ring,
        // which no producer writes.
        let own = crate::rings::is_own_ring(self.cpu);
        if !own && event.provider == ORPHAN_PROVIDER {
            if let Some(report) = OrphanReport::parse(event).filter(|r| r.cpu == self.cpu) {
                for gap in self.orphans.gaps(&report, self.epoch) {
                    self.send_old_gap(report.epoch, gap)?;
                }
            }
        }
        if !self.skip.is_empty() && self.skip.contains(seq) {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let shard = self.router.next_shard();
        let report = if own { DropReport::parse(event) } else { None };
        if let Some(report) = report {
            self.flush_suppressed()?;
            let header =
                Handoff::dropped(self.ordinal, self.cpu, self.epoch, seq, report).after(after);
            send(&self.senders, shard, self.cpu, header)?;
            self.stats.lost.fetch_add(report.count, Ordering::Relaxed);
            return Ok(());
        }
        if !self.limiter.admit(event, crate::sync::monotonic_ms()) {
            return self.suppress(seq, after);
        }
        self.flush_suppressed()?;
        let header = Handoff::event(self.ordinal, self.cpu, self.epoch, seq, event).after(after);
        let sender = owned(&self.senders, shard);
        // Reserve first (waits while the channel is full, R9), then copy the
        // record's strings straight into the slot.
        let permit = sender
            .reserve(payload_len(event))
            .map_err(|e| gone(self.cpu, e, shard))?;
        let filled = permit.commit_with(|buf| {
            write_payload(event, buf);
            Ok::<_, Infallible>(header)
        });
        // Infallible: the closure above cannot fail.
        let Ok(()) = filled;
        self.last_ts_ns = event.ts_ns;
        self.stats.events.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Hands over the parts of `gap` not committed yet, each resuming at
    /// `after` (the reader's position past the whole gap).
    fn send_gap(&mut self, gap: Gap, after: ReadPosition) -> Result<(), DrainError> {
        self.flush_suppressed()?;
        self.send_gap_now(gap, after)
    }

    /// Adds event `seq` (read up to `after`) to the run of suppressed
    /// events, handing on the run before if `seq` does not follow it.
    fn suppress(&mut self, seq: u64, after: ReadPosition) -> Result<(), DrainError> {
        self.stats.suppressed.fetch_add(1, Ordering::Relaxed);
        match &mut self.suppressed {
            Some((gap, at)) if gap.to_seq.checked_add(1) == Some(seq) => {
                gap.to_seq = seq;
                *at = after;
                Ok(())
            }
            _ => {
                self.flush_suppressed()?;
                let gap = Gap {
                    from_seq: seq,
                    to_seq: seq,
                    reason: LossReason::Suppressed,
                };
                self.suppressed = Some((gap, after));
                Ok(())
            }
        }
    }

    /// Hands on the run of suppressed events, if any, as one gap (before
    /// anything after it, so receipts stay in sequence order).
    fn flush_suppressed(&mut self) -> Result<(), DrainError> {
        match self.suppressed.take() {
            Some((gap, after)) => self.send_gap_now(gap, after),
            None => Ok(()),
        }
    }

    /// Writes a report of each source whose window has ended with events
    /// suppressed into `ring` (the ring this drain reads, which stores it
    /// like any event); one the ring refuses now is tried again later.
    fn report_suppressed(&mut self, ring: &Ring) {
        // The limit producers' own budgets follow (a reload, or a ring
        // made anew, is published here).
        ring.publish_rate_limit(self.limiter.published());
        for report in self.limiter.closed(crate::sync::monotonic_ms()) {
            let (message, fields) = (report.message(), report.fields());
            let event = Event {
                ts_ns: crate::rings::now_ns(),
                pid: std::process::id(),
                tid: 0,
                uid: crate::access::own_uid(),
                level: crate::rings::Level::Warning,
                provider: limit::REPORT_PROVIDER,
                name: limit::REPORT_NAME,
                message: &message,
                fields: &fields,
            };
            match ring.emit(&event) {
                // Relaxed: a statistic.
                Ok(()) => self.limiter.written(&report),
                Err(_) => self.limiter.retry(report),
            }
        }
    }

    /// Hands over the parts of `gap` not committed yet (see `send_gap`).
    fn send_gap_now(&mut self, gap: Gap, after: ReadPosition) -> Result<(), DrainError> {
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
            send(&self.senders, shard, self.cpu, header)?;
            if piece.reason != LossReason::Suppressed {
                // Relaxed: a statistic (suppressed events count apart).
                self.stats.lost.fetch_add(piece.count(), Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Hands over `gap` of ring epoch `epoch`, an earlier ring of this CPU
    /// that nothing reads any more (its receipt's position is only the
    /// sequence after the gap: no reader resumes there).
    fn send_old_gap(&mut self, epoch: u64, gap: Gap) -> Result<(), DrainError> {
        self.flush_suppressed()?;
        let shard = self.router.next_shard();
        let after = ReadPosition {
            next_seq: gap.to_seq.saturating_add(1),
            ..ReadPosition::START
        };
        let header = Handoff::gap(self.ordinal, self.cpu, epoch, gap, self.last_ts_ns).after(after);
        send(&self.senders, shard, self.cpu, header)?;
        self.stats.lost.fetch_add(gap.count(), Ordering::Relaxed);
        Ok(())
    }

    /// Writes a report of the messages dropped since the last one into the
    /// syslog ring `ring` (only the syslog drain has `drops`), now that the
    /// ring is idle: it has room, and the report reaches a shard like any
    /// event.
    fn report_drops(&self, ring: &Ring) {
        if let Some(drops) = &self.drops {
            drops.report_into(ring);
        }
    }
}

/// Sends a header-only item (a gap) to `shard`.
fn send(
    senders: &[Option<Sender<Handoff>>],
    shard: usize,
    cpu: u32,
    header: Handoff,
) -> Result<(), DrainError> {
    owned(senders, shard)
        .send(header, &[])
        .map_err(|e| gone(cpu, e, shard))
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
