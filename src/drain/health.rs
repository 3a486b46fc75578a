//! A drain's look at its ring's health, and giving an unusable ring up.
//!
//! Every [`HEALTH_INTERVAL`] while the ring is idle, and every
//! [`HEALTH_EVERY_EVENTS`] events while it is busy: the ring's file must
//! still be the one mapped and whole, its header must still say what it
//! said at creation (a scribbled header is written back, so producers can
//! open the ring), a RETIRED mark on it must be undone (with the file still
//! at its name no producer had a reason to set it), and producers must be
//! able to reserve (refusals with no reservation moving mean a scribble
//! wedged the reserve or meta words). The reader, for its part, stops at a
//! page word it finds impossible (a [`Scribble`]) and the drain acts on it
//! at once. A ring found truncated, removed, replaced, wedged, stuck or
//! scribbled is given up: it is retired (producers are turned away and what
//! it holds is frozen), a new ring with a new epoch is made in its place,
//! and what the old one held unread is counted ([`Ring::unread`]) and
//! recorded as a `ring_lost` gap. So a ring never stays unusable, and its
//! loss is counted once.

use super::CommittedRuns;
use super::{DrainError, DrainThread};
use crate::access::Mode;
use crate::rings::format::Geometry;
use crate::rings::{FileState, Gap, LossReason, ReadPosition, Ring, RingReader, Scribble};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often an idle drain checks its ring's health, and after how many
/// events a busy one does.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
pub(super) const HEALTH_EVERY_EVENTS: u32 = 1 << 14;
/// A reader that found nothing to read at this many health checks in a
/// row while the producers' front is two pages or more ahead is stuck (on
/// words a scribble left): the ring is replaced.
const STUCK_CHECKS: u32 = 3;
/// Replacements of one ring are this far apart at least, so a producer
/// that truncates its ring over and over costs one new ring a second.
const REPLACE_INTERVAL: Duration = Duration::from_secs(1);
/// Producer refusals are logged at most this often per ring.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

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
    /// Producers cannot reserve; the page they cannot open, if its meta
    /// word is what stops them.
    Wedged(Option<Scribble>),
    Stuck,
    Scribbled(Scribble),
}

impl Trouble {
    fn describe(self) -> String {
        match self {
            Trouble::File(FileState::Removed) => "its file was removed".into(),
            Trouble::File(FileState::Replaced) => "another file was put at its name".into(),
            Trouble::File(FileState::Shrunk) => "its file was truncated under eventd".into(),
            Trouble::File(FileState::Intact) => "its file is intact".into(),
            Trouble::Wedged(None) => {
                "producers cannot reserve in it (its reserve or page words were scribbled)".into()
            }
            Trouble::Wedged(Some(s)) => format!(
                "producers cannot reserve in it: the meta word of page {} (ticket {}) is \
                 {:#018x}, which {}",
                s.slot, s.ticket, s.meta_word, s.what
            ),
            Trouble::Stuck => "its reader cannot move on (its page words were scribbled)".into(),
            Trouble::Scribbled(s) => format!(
                "the meta word of page {} (ticket {}) was scribbled: it is {:#018x}, and {}",
                s.slot, s.ticket, s.meta_word, s.what
            ),
        }
    }
}

/// What the last health check saw.
pub(super) struct Health {
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

impl Health {
    /// Whether an idle drain's next check is due.
    pub(super) fn due(&self) -> bool {
        self.at.elapsed() >= HEALTH_INTERVAL
    }

    /// What a first check would find of `ring`, read by `reader`.
    pub(super) fn of(ring: &Ring, reader: &RingReader) -> Health {
        Health {
            at: Instant::now(),
            refusals: ring.producer_refusals(),
            reserve_word: ring.reserve_word(),
            position: reader.position(),
            stuck: 0,
            front_last_seq: 0,
            last_replaced: None,
            last_refusal_log: None,
        }
    }
}

impl DrainThread {
    /// Looks at the ring's file, header and producers (see the module
    /// docs); gives the ring up and makes a new one if it is unusable.
    /// `idle`: the reader just found nothing to read.
    pub(super) fn check_health(&mut self, idle: bool) -> Result<(), DrainError> {
        let ring = self.ring.clone();
        let mut trouble = match ring.file_state() {
            FileState::Intact => None,
            other => Some(Trouble::File(other)),
        };
        if trouble.is_none() {
            let mended = ring.mend_header();
            if mended > 0 {
                self.out
                    .stats
                    .header_repairs
                    .fetch_add(mended as u64, Ordering::Relaxed);
                tracing::warn!(
                    ring = %ring.path().display(),
                    words = mended,
                    "ring header was scribbled; written back"
                );
            }
            if self.reader.unretire() {
                self.out
                    .stats
                    .header_repairs
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    ring = %ring.path().display(),
                    "a RETIRED mark on a ring still in use was undone (a scribble: its file is \
                     still at its name); the page it named is closed instead"
                );
            }
            trouble = match self.reader.scribble() {
                Some(s) => Some(Trouble::Scribbled(s)),
                None => self.producers_trouble(&ring, idle),
            };
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
                    cpu = self.out.cpu,
                    refused,
                    total = refusals,
                    "producers could not write into this ring (events refused, not stored)"
                );
            }
            if !moved {
                return Some(Trouble::Wedged(ring.unopenable_page()));
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

    /// Acts on an impossible page word the reader stopped at, if it found
    /// one: the ring is given up at once (at most once a second).
    pub(super) fn check_scribble(&mut self) -> Result<(), DrainError> {
        match self.reader.scribble() {
            Some(s) => self.replace_ring(Trouble::Scribbled(s)),
            None => Ok(()),
        }
    }

    /// Gives the ring up (see the module docs): it is retired, a new ring
    /// takes its place, its loss is counted and recorded. If the new ring
    /// cannot be made (a full disk), the old one stays in use and the next
    /// check tries again.
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
        // Retired before the new ring is at the name: from the mark on, what
        // the old ring holds is frozen, and a producer that opens the name
        // right after gets the new ring.
        let mut retired = false;
        let new = match Ring::create_replacing(&m.path, m.geometry, m.cpu, m.mode, || {
            retired = old.retire();
        }) {
            Ok(ring) => Arc::new(ring),
            Err(e) => {
                if retired {
                    self.reader.unretire();
                }
                tracing::error!(
                    ring = %m.path.display(),
                    why = %why.describe(),
                    error = %e,
                    "ring unusable and a new one cannot be made; trying again shortly"
                );
                return Ok(());
            }
        };
        let position = self.reader.position();
        // What the old ring held past the reader: counted from its frozen
        // words (whoever retired it), or, if its memory is gone (a
        // truncated file), as far as its words said at the last check.
        let (lost, exact) = if old.faulted() {
            let last = self.health.front_last_seq;
            (
                last.saturating_sub(position.next_seq.saturating_sub(1)),
                false,
            )
        } else {
            let unread = old.unread(position);
            (unread.records, unread.exact)
        };
        if lost > 0 {
            let gap = Gap {
                from_seq: position.next_seq,
                to_seq: position.next_seq.saturating_add(lost - 1),
                reason: LossReason::RingLost,
            };
            self.out.send_gap(gap, position)?;
        }
        let through = position.next_seq.saturating_add(lost).saturating_sub(1);
        self.out.orphans.replaced(old.epoch(), through);
        tracing::error!(
            ring = %m.path.display(),
            why = %why.describe(),
            old_epoch = %format_args!("{:016x}", old.epoch()),
            new_epoch = %format_args!("{:016x}", new.epoch()),
            lost,
            exact,
            "ring given up and made anew; producers reopen it; what it held unread is \
             recorded as a ring_lost gap (exact=false: at least that many)"
        );
        self.out.stats.replacements.fetch_add(1, Ordering::Relaxed);
        self.trackers[self.out.ordinal as usize].begin_epoch(new.epoch());
        self.out.epoch = new.epoch();
        self.reader = RingReader::new(new.clone());
        self.ring = new.clone();
        self.out.skip = CommittedRuns::default();
        self.health.refusals = new.producer_refusals();
        self.health.reserve_word = new.reserve_word();
        self.health.position = self.reader.position();
        self.health.front_last_seq = 0;
        self.health.stuck = 0;
        self.current.replace(new);
        Ok(())
    }
}
