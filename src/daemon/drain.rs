//! The drain thread: one per attached ring. It reads events and gaps from
//! its ring and hands them, in stripes (R5), to the channels of the shards it
//! owns. It never touches SQLite (R8).
//!
//! Back-pressure (R9): before an event's bytes are copied into a channel the
//! drain reserves room for them, waiting while the channel is full. While it
//! waits it reads nothing more from the ring, so the backlog stays in the
//! ring (and, if the ring laps, becomes an exact gap), never in eventd's
//! memory.
//!
//! Health (every [`HEALTH_INTERVAL`] while the ring is idle, and every
//! [`HEALTH_EVERY_EVENTS`] events while it is busy): the ring's file must
//! still be the one mapped and whole, its header must still say what it said
//! at creation (a scribbled header is written back, so producers can open
//! the ring), and producers must be able to reserve (refusals with no
//! reservation moving mean a scribble wedged the reserve or meta words). A
//! ring found truncated, removed, replaced or wedged is given up: producers
//! are told (the RETIRED mark), a new ring with a new epoch is made in its
//! place, and what the old one held unread is recorded as a `ring_lost` gap
//! (as far as its words still tell). So a ring never stays unusable.

use crate::access::Mode;
use crate::channel::{SendError, Sender};
use crate::rings::format::Geometry;
use crate::rings::{
    CurrentRing, FileState, Gap, LossReason, ReadPosition, Ring, RingItem, RingReader,
};
use crate::routing::StripeRouter;
use crate::store::handoff::{payload_len, write_payload, Handoff};
use crate::store::{CommitTracker, CommittedRuns};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// How often an idle drain checks its ring's health, and after how many
/// events a busy one does.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
const HEALTH_EVERY_EVENTS: u32 = 1 << 14;
/// A reader that found nothing to read at this many health checks in a
/// row while the producers' front is two pages or more ahead is stuck (on
/// words a scribble left): the ring is replaced.
const STUCK_CHECKS: u32 = 3;
/// Replacements of one ring are this far apart at least, so a producer
/// that truncates its ring over and over costs one new ring a second.
const REPLACE_INTERVAL: Duration = Duration::from_secs(1);
/// Producer refusals are logged at most this often per ring.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

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
}

/// How a drain makes a new ring in place of one it gives up.
#[derive(Debug, Clone)]
pub struct RingMaker {
    pub path: PathBuf,
    pub geometry: Geometry,
    pub cpu: u32,
    pub mode: Mode,
}

/// Why a ring is given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trouble {
    File(FileState),
    Wedged,
    Stuck,
}

impl Trouble {
    fn describe(self) -> &'static str {
        match self {
            Trouble::File(FileState::Removed) => "its file was removed",
            Trouble::File(FileState::Replaced) => "another file was put at its name",
            Trouble::File(FileState::Shrunk) => "its file was truncated under eventd",
            Trouble::File(FileState::Intact) => "its file is intact",
            Trouble::Wedged => {
                "producers cannot reserve in it (its reserve or page words were scribbled)"
            }
            Trouble::Stuck => "its reader cannot move on (its page words were scribbled)",
        }
    }
}

/// What the last health check saw.
struct Health {
    at: Instant,
    refusals: u64,
    reserve_word: u64,
    position: ReadPosition,
    /// Consecutive checks that found the reader idle behind the front.
    stuck: u32,
    /// The last sequence producers had reserved, when the words said.
    front_last_seq: u64,
    last_replaced: Option<Instant>,
    last_refusal_log: Option<Instant>,
}

/// The drain of one ring.
pub struct DrainThread {
    /// Ring ordinal (R4) and logical CPU id.
    pub ordinal: u32,
    pub cpu: u32,
    epoch: u64,
    reader: RingReader,
    /// The reader's ring (a handle of its own, to look at while an item
    /// borrows the reader).
    ring: Arc<Ring>,
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
    /// Where the daemon's other parts find this ring (replaced with it).
    current: Arc<CurrentRing>,
    trackers: Arc<[CommitTracker]>,
    maker: RingMaker,
    health: Health,
    /// For eventd's own syslog ring: the count of messages dropped before
    /// they reached it, reported into it when it has room.
    drops: Option<Arc<crate::syslog::Drops>>,
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
    pub drops: Option<Arc<crate::syslog::Drops>>,
}

impl DrainThread {
    pub fn new(
        ordinal: u32,
        reader: RingReader,
        router: StripeRouter,
        plan: &crate::store::RingPlan,
        parts: DrainParts,
    ) -> Self {
        let ring = reader.ring();
        let (cpu, epoch) = (ring.cpu(), ring.epoch());
        let health = Health {
            at: Instant::now(),
            refusals: ring.producer_refusals(),
            reserve_word: ring.reserve_word(),
            position: reader.position(),
            stuck: 0,
            front_last_seq: 0,
            last_replaced: None,
            last_refusal_log: None,
        };
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
            ring: reader.ring().clone(),
            reader,
            router,
            senders: parts.senders,
            skip: plan.committed_runs(),
            pending_gap,
            stop: parts.stop,
            last_ts_ns: 0,
            stats: parts.stats,
            current: parts.current,
            trackers: parts.trackers,
            maker: parts.maker,
            health,
            drops: parts.drops,
        }
    }

    /// Drains until the stop flag is set, then returns (dropping its senders,
    /// which lets the writers finish).
    pub fn run(mut self) -> Result<(), DrainError> {
        if let Some(gap) = self.pending_gap.take() {
            let at = self.reader.position();
            self.send_gap(gap, at)?;
        }
        // Events since the drain last waited, and naps since the last one;
        // events since the last health check.
        let (mut streak, mut naps, mut since_check) = (0u32, 0u32, 0u32);
        // Relaxed: the flag only asks the loop to end; nothing is published
        // through it.
        while !self.stop.load(Ordering::Relaxed) {
            if since_check >= HEALTH_EVERY_EVENTS {
                since_check = 0;
                self.check_health(false)?;
            }
            let Some((item, after)) = self.reader.poll_with_position() else {
                if self.health.at.elapsed() >= HEALTH_INTERVAL {
                    since_check = 0;
                    self.check_health(true)?;
                    self.report_drops();
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
                    self.send_gap(lost, after)?;
                }
                self.check_health(false)?;
                continue;
            }
            match item {
                RingItem::Event { seq, event } => {
                    // A report of dropped messages is one only in eventd's
                    // own syslog ring (no producer can open it, so its
                    // records are eventd's); anywhere else such an event is
                    // an ordinary one.
                    if !self.skip.is_empty() && self.skip.contains(seq) {
                        self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let shard = self.router.next_shard();
                    let report = match self.drops {
                        Some(_) => crate::syslog::DropReport::parse(&event),
                        None => None,
                    };
                    if let Some(report) = report {
                        let header = Handoff::dropped(
                            self.ordinal,
                            self.cpu,
                            self.epoch,
                            seq,
                            report.count,
                            report.since_ns,
                        )
                        .after(after);
                        send(&self.senders, shard, self.cpu, header)?;
                        self.stats.lost.fetch_add(report.count, Ordering::Relaxed);
                        continue;
                    }
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

    /// Writes a report of the messages dropped since the last one into the
    /// syslog ring (only the syslog drain has `drops`), now that the ring is
    /// idle: it has room, and the report reaches a shard like any event.
    fn report_drops(&mut self) {
        if let Some(drops) = &self.drops {
            drops.report_into(&self.ring);
        }
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
            send(&self.senders, shard, self.cpu, header)?;
            self.stats.lost.fetch_add(piece.count(), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Looks at the ring's file, header and producers (see the module
    /// docs); gives the ring up and makes a new one if it is unusable.
    /// `idle`: the reader just found nothing to read.
    fn check_health(&mut self, idle: bool) -> Result<(), DrainError> {
        let ring = self.ring.clone();
        let mut trouble = match ring.file_state() {
            FileState::Intact => None,
            other => Some(Trouble::File(other)),
        };
        if trouble.is_none() {
            let mended = ring.mend_header();
            if mended > 0 {
                self.stats
                    .header_repairs
                    .fetch_add(mended as u64, Ordering::Relaxed);
                tracing::warn!(
                    ring = %ring.path().display(),
                    words = mended,
                    "ring header was scribbled; written back"
                );
            }
            trouble = self.producers_trouble(&ring, idle);
        }
        let page_first = self.reader.position().next_seq;
        if let Some(last) = ring
            .front_last_seq(
                page_first.saturating_sub(u64::from(crate::rings::format::RECORDS_PER_PAGE_MAX)),
            )
            .filter(|_| !ring.faulted())
        {
            self.health.front_last_seq = last;
        }
        self.health.at = Instant::now();
        self.health.refusals = ring.producer_refusals();
        self.health.reserve_word = ring.reserve_word();
        self.health.position = self.reader.position();
        match trouble {
            Some(t) => self.replace_ring(t),
            None => Ok(()),
        }
    }

    /// Wedged (producers refused while nothing moved) or stuck (the reader
    /// idle behind a front that moved on, check after check); logs
    /// refusals (rate-limited) either way.
    fn producers_trouble(&mut self, ring: &Ring, idle: bool) -> Option<Trouble> {
        let refusals = ring.producer_refusals();
        let refused = refusals.wrapping_sub(self.health.refusals);
        let moved = ring.reserve_word() != self.health.reserve_word;
        if refused > 0 {
            let due = self
                .health
                .last_refusal_log
                .is_none_or(|t| t.elapsed() >= REFUSAL_LOG_INTERVAL);
            if due {
                self.health.last_refusal_log = Some(Instant::now());
                tracing::warn!(
                    cpu = self.cpu,
                    refused,
                    total = refusals,
                    "producers could not write into this ring (events refused, not stored)"
                );
            }
            if !moved {
                return Some(Trouble::Wedged);
            }
        }
        let behind = crate::rings::format::ticket_distance(
            crate::rings::format::Reserve::unpack(ring.reserve_word()).ticket,
            self.reader.position().ticket,
        ) >= 2;
        if idle && behind && self.reader.position() == self.health.position {
            self.health.stuck += 1;
        } else {
            self.health.stuck = 0;
        }
        (self.health.stuck >= STUCK_CHECKS).then_some(Trouble::Stuck)
    }

    /// Gives the ring up (see the module docs): producers are told, a new
    /// ring takes its place, its loss is recorded. If the new ring cannot
    /// be made (a full disk), the old one stays in use and the next check
    /// tries again.
    fn replace_ring(&mut self, why: Trouble) -> Result<(), DrainError> {
        if self
            .health
            .last_replaced
            .is_some_and(|t| t.elapsed() < REPLACE_INTERVAL)
        {
            return Ok(());
        }
        self.health.last_replaced = Some(Instant::now());
        let old = self.ring.clone();
        let m = self.maker.clone();
        let new = match Ring::create_replacing(&m.path, m.geometry, m.cpu, m.mode) {
            Ok(ring) => Arc::new(ring),
            Err(e) => {
                tracing::error!(
                    ring = %m.path.display(),
                    why = why.describe(),
                    error = %e,
                    "ring unusable and a new one cannot be made; trying again shortly"
                );
                return Ok(());
            }
        };
        old.retire();
        let position = self.reader.position();
        let lost_to = self.health.front_last_seq;
        if lost_to >= position.next_seq {
            let gap = Gap {
                from_seq: position.next_seq,
                to_seq: lost_to,
                reason: LossReason::RingLost,
            };
            self.send_gap(gap, position)?;
        }
        tracing::error!(
            ring = %m.path.display(),
            why = why.describe(),
            old_epoch = %format_args!("{:016x}", old.epoch()),
            new_epoch = %format_args!("{:016x}", new.epoch()),
            lost_at_least = lost_to.saturating_sub(position.next_seq.saturating_sub(1)),
            "ring given up and made anew; producers reopen it"
        );
        self.stats.replacements.fetch_add(1, Ordering::Relaxed);
        self.trackers[self.ordinal as usize].begin_epoch(new.epoch());
        self.epoch = new.epoch();
        self.reader = RingReader::new(new.clone());
        self.ring = new.clone();
        self.skip = CommittedRuns::default();
        self.health.refusals = new.producer_refusals();
        self.health.reserve_word = new.reserve_word();
        self.health.position = self.reader.position();
        self.health.front_last_seq = 0;
        self.health.stuck = 0;
        self.current.replace(new);
        Ok(())
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
