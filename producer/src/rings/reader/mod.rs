//! The reader side of a ring: one per ring, used by its drain thread.
//!
//! [`RingReader::poll`] returns the next event in sequence order, a [`Gap`]
//! saying exactly which sequence numbers were lost and why, or nothing yet.
//! [`RingReader::wait`] sleeps until producers wake it.
//!
//! # Reading a record that may be overwritten
//!
//! The reader never parses in place. It checks the record's state word
//! (`COMMITTED`, the sequence it expects, a length inside the page), copies the
//! whole record out with atomic loads, issues an Acquire fence and re-reads the
//! page's meta word and the state word. Producers that reuse a page change its
//! meta word *before* writing into it (and Release-fence between), so if
//! anything copied came from a newer lap the re-read shows it: the copy is
//! dropped and the reader resynchronises. The copy is then decoded and its
//! checksum checked, which catches what a slow or hostile writer scribbled.
//!
//! # Losses
//!
//! - **Overwritten**: the page under the reader was reused. The reader moves to
//!   the oldest page still intact, whose meta word says its first sequence, so
//!   the gap is exact.
//! - **Abandoned**: a record reserved and not committed within
//!   [`STALL_BOUND_MS`] (its producer died). The reader marks it abandoned so a
//!   producer that was only slow cannot commit it later, and steps over it. If
//!   even its length was never written, the reader looks further in the page
//!   for a committed record naming the next sequence that passes its
//!   checksum, and loses just the dead one; with no such record, the rest of
//!   the page is skipped once the page is sealed (its successor's first
//!   sequence gives the count).
//! - **Corrupt**: a record whose header or checksum is wrong, or whose
//!   typed fields do not parse.
//!
//! # Scribbled page words
//!
//! A page's meta word and the reserve word are the only words whose values
//! the reader builds on rather than checks record by record. When they say
//! something impossible while the producers' front shows that the page
//! cannot have been reused (a meta word that names another page or another
//! first sequence, a next page whose first sequence leaves records of this
//! one out), the reader does not guess: it stops there and reports a
//! [`Scribble`], and the drain gives the ring up and counts what it held
//! (see `drain::health`). Guessing is how sequence numbers end up stored
//! twice or events skipped without a gap.
//!
//! Every loop is bounded: a scribbled ring yields losses and `None`s, never a
//! hang, a panic or an allocation beyond one page.

mod dead;
mod items;
mod wait;

pub use items::{Gap, LossReason, ReadPosition, RingItem, Scribble};

use super::event::{validate, RecordFault, RecordLayout};
use super::format::*;
use super::json::Fields;
use super::typed::to_json;
use super::Ring;
use crate::sync::{fence, Arc, Ordering};
use std::time::Duration;

/// How long a reserved record may stay uncommitted before the reader decides
/// its producer died.
pub const STALL_BOUND_MS: u64 = 200;
/// How long the reader naps while it waits for a stalled record.
const STALL_NAP: Duration = Duration::from_millis(2);
/// Longest sleep in `wait`, whatever the caller asked: honest producers
/// always wake the reader; this bounds what a scribbled WAIT bit can do.
const SLEEP_CAP: Duration = Duration::from_secs(5);
/// Steps one `poll` takes before it yields `None`.
const POLL_STEPS_MAX: u32 = 64;
/// A resynchronisation never jumps further than this (a larger jump means a
/// scribbled meta word, not a real loss).
const GAP_PLAUSIBLE_MAX: u64 = 1 << 39;

/// Where the reader resumes after a record whose producer died unstamped.
enum Following {
    /// The record at `offset` is the next one readable; `skipped` sequence
    /// numbers before it are lost.
    At { offset: u32, skipped: u64 },
    /// A record in between is being committed right now: look again.
    NotYet,
    /// Nothing readable follows (yet).
    None,
}

/// What a step of `poll` found.
enum Step {
    /// A valid event, copied into `buf`.
    Event {
        seq: u64,
        layout: RecordLayout,
    },
    Gap(Gap),
    /// Moved on (next page, resync without loss); keep going.
    Continue,
    /// Nothing to read now.
    Idle,
}

pub struct RingReader {
    ring: Arc<Ring>,
    ticket: u64,
    offset: u32,
    index: u32,
    /// Full sequence number of the first record of page `ticket`.
    first_seq: u64,
    /// Copy of the record being read; one page at most.
    buf: Vec<u64>,
    /// The JSON text of that record's typed fields, if it has them.
    typed_json: Fields,
    /// The record the reader waits on and since when (ms, `sync` clock).
    stall: Option<(u64, u64)>,
    /// Past an unstamped dead record, the farther record the reader would
    /// resume at (full sequence) and since when: see `find_following_record`.
    jump: Option<(u64, u64)>,
    delivered: u64,
    lost: u64,
    /// The first impossible page word found; the reader reads no further.
    scribble: Option<Scribble>,
    /// A second reader beside the ring's drain ([`RingReader::looking`]):
    /// it never publishes its position.
    looks_only: bool,
    /// What `page_limit` last said, for page `.0`: records reserved in it
    /// (`.1`) and whether it is closed (`.2`). Until the reader has read
    /// that many, or has had to stop, it need not ask again (a page's
    /// count only grows, and a closed page's never changes), so it loads
    /// the reserve word, which every producer's reservation writes, once
    /// per run of records rather than once per record: each load takes
    /// that cache line from the producers' CPU, and their next reservation
    /// waits to take it back.
    known_limit: Option<(u64, u32, bool)>,
    /// Set when the reader had to stop: `known_limit` is asked again (and
    /// still held against what the page says next).
    limit_stale: bool,
}

impl RingReader {
    /// A reader at the start of the ring (sequence 1); anything already
    /// overwritten is reported as a gap on the first poll.
    pub fn new(ring: Arc<Ring>) -> Self {
        Self::resume(ring, ReadPosition::START)
    }

    /// A reader that continues at `position` (from a receipt). If the ring
    /// moved past it meanwhile, the first poll reports the gap.
    pub fn resume(ring: Arc<Ring>, position: ReadPosition) -> Self {
        let data_words = ring.geometry.data_words();
        // A position from a receipt is our own data, but check it anyway: an
        // impossible one starts over at the oldest page (reported as a gap).
        let sane = position.offset <= data_words
            && position.index <= RECORDS_PER_PAGE_MAX
            && position.next_seq > u64::from(position.index);
        let position = if sane {
            position
        } else {
            ReadPosition {
                ticket: position.ticket,
                offset: data_words,
                index: 0,
                next_seq: position.next_seq.max(1),
            }
        };
        let capacity = ring.geometry.data_words() as usize;
        RingReader {
            ring,
            ticket: position.ticket & TICKET_MASK,
            offset: position.offset,
            index: position.index,
            first_seq: position.next_seq - u64::from(position.index),
            buf: Vec::with_capacity(capacity),
            typed_json: Fields::default(),
            stall: None,
            jump: None,
            delivered: 0,
            lost: 0,
            scribble: None,
            looks_only: false,
            known_limit: None,
            limit_stale: false,
        }
    }

    /// A reader that only looks at what the ring holds, from `position`,
    /// beside the ring's drain: it publishes no position (producers judge
    /// the room left by the drain's). Before its producers start only: it
    /// still marks records whose producer died, as any reader does.
    pub fn looking(ring: Arc<Ring>, position: ReadPosition) -> Self {
        RingReader {
            looks_only: true,
            ..Self::resume(ring, position)
        }
    }

    pub fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }

    /// Where the reader is now: after the last item `poll` returned.
    pub fn position(&self) -> ReadPosition {
        ReadPosition {
            ticket: self.ticket,
            offset: self.offset,
            index: self.index,
            next_seq: self.next_seq(),
        }
    }

    /// The impossible page word that stopped the reader, if one did: the
    /// reader stays where it is (every later `poll` finds nothing) until
    /// the drain replaces the ring.
    pub fn scribble(&self) -> Option<Scribble> {
        self.scribble
    }

    /// Events delivered and lost so far by this reader.
    pub fn counts(&self) -> (u64, u64) {
        (self.delivered, self.lost)
    }

    fn next_seq(&self) -> u64 {
        self.first_seq.saturating_add(u64::from(self.index))
    }

    /// The next event or gap, or `None` when there is nothing to read now.
    pub fn poll(&mut self) -> Option<RingItem<'_>> {
        self.poll_with_position().map(|(item, _)| item)
    }

    /// Like [`poll`](Self::poll), with the reader's position just after the
    /// item (what a receipt stores to resume after it).
    pub fn poll_with_position(&mut self) -> Option<(RingItem<'_>, ReadPosition)> {
        for _ in 0..POLL_STEPS_MAX {
            match self.step() {
                Step::Continue => continue,
                Step::Idle => {
                    // The next poll asks the reserve word again: whatever
                    // held the reader up (the producers' front, a record
                    // being committed, a dead one the page must close
                    // behind) may have moved by then.
                    self.limit_stale = true;
                    break;
                }
                Step::Gap(gap) => {
                    self.lost = self.lost.saturating_add(gap.count());
                    return Some((RingItem::Gap(gap), self.position()));
                }
                Step::Event { seq, layout } => {
                    self.delivered += 1;
                    let after = self.position();
                    return Some((
                        RingItem::Event {
                            seq,
                            event: layout.view_with(&self.buf, self.typed_json.text()),
                        },
                        after,
                    ));
                }
            }
        }
        self.publish_position();
        None
    }

    /// One step of reading.
    fn step(&mut self) -> Step {
        if self.scribble.is_some() {
            return Step::Idle;
        }
        let g = self.ring.geometry;
        let mem = &self.ring.mem;
        // Acquire: pairs with the opener's Release CAS of this meta word.
        let meta_word = mem.word(g.meta_index(self.ticket)).load(Ordering::Acquire);
        let meta = Meta::unpack(meta_word);
        if !meta.holds(self.ticket) {
            // The 24-bit ticket in the meta word cannot tell "not opened yet"
            // from "reused long ago"; the 40-bit front in the reserve word can.
            // Acquire: as in `page_limit`.
            let front = Reserve::unpack(mem.word(H_RESERVE).load(Ordering::Acquire)).ticket;
            let ahead = ticket_distance(front, self.ticket);
            // The page may have been opened between the two loads: the
            // reserve word names it only after its meta word holds it
            // (invariant 2), so a meta word loaded after that Acquire load
            // must hold it, unless a lap came round or it was scribbled.
            // Acquire: as above.
            let again = Meta::unpack(mem.word(g.meta_index(self.ticket)).load(Ordering::Acquire));
            if again.holds(self.ticket) {
                return Step::Continue;
            }
            if ahead >= 0 && !self.may_be_reused(ahead) {
                // The reserve word names this page or a later one, so its
                // meta word was set, and no lap has come round since.
                return self.inconsistent(self.ticket, "it names another page");
            }
            return if ahead > 0 || meta.holds_later_than(self.ticket) {
                self.resync()
            } else {
                // Not opened yet: we are at the producers' front.
                Step::Idle
            };
        }
        if meta.first_seq_low != self.first_seq & SEQ_LOW_MASK {
            // The page holds our ticket but another first sequence: the meta
            // word was scribbled, or (after 2^24 / page_count laps while
            // eventd was stopped) the page was reused; `inconsistent` tells.
            return self.inconsistent(
                self.ticket,
                "its first sequence number is not the one the page before it ends at",
            );
        }
        let known = self
            .known_limit
            .filter(|&(ticket, _, _)| ticket == self.ticket)
            .map(|(_, limit, sealed)| (limit, sealed));
        let (limit, sealed) = match known {
            Some((limit, sealed)) if !self.limit_stale && (sealed || self.index < limit) => {
                (limit, sealed)
            }
            _ => {
                let Some((limit, sealed)) = self.page_limit(meta) else {
                    return self.inconsistent(
                        (self.ticket + 1) & TICKET_MASK,
                        "it does not follow the page before it",
                    );
                };
                if known.is_some_and(|(before, _)| limit < before) {
                    // A page's count only grows: the words were rolled back.
                    return self.inconsistent(
                        (self.ticket + 1) & TICKET_MASK,
                        "it says the page before it holds fewer records than it said before",
                    );
                }
                self.known_limit = Some((self.ticket, limit, sealed));
                self.limit_stale = false;
                (limit, sealed)
            }
        };
        if self.index > limit {
            // The words say the page holds fewer records than we already read
            // from it: scribbled. Never step back over sequence numbers.
            return self.inconsistent(
                (self.ticket + 1) & TICKET_MASK,
                "it says the page before it holds fewer records than were read from it",
            );
        }
        if self.index == limit {
            if sealed {
                if self.record_follows() {
                    return self.inconsistent(
                        (self.ticket + 1) & TICKET_MASK,
                        "its first sequence number leaves records of the page before it out",
                    );
                }
                self.next_page(limit);
                return Step::Continue;
            }
            return Step::Idle;
        }
        self.read_record(meta_word, limit, sealed)
    }

    /// Whether the page `ahead` tickets behind the producers' front may
    /// have been reused (or be in the middle of it): the page after the
    /// front's is the next to go, and an opener sets its meta word before
    /// the reserve word says so.
    fn may_be_reused(&self, ahead: i64) -> bool {
        ahead > self.ring.geometry.page_count as i64 - 2
    }

    /// The words of page `ticket` disagree with what the reader knows:
    /// unless a lap may have come round since (then it resynchronises as
    /// after any overwrite), they were scribbled, and the reader stops here
    /// (see the module docs).
    fn inconsistent(&mut self, ticket: u64, what: &'static str) -> Step {
        let g = self.ring.geometry;
        let mem = &self.ring.mem;
        // Acquire: as in `page_limit`.
        let front = Reserve::unpack(mem.word(H_RESERVE).load(Ordering::Acquire)).ticket;
        let ahead = ticket_distance(front, self.ticket);
        if ahead < 0 || self.may_be_reused(ahead) {
            return self.resync();
        }
        self.scribble = Some(Scribble {
            ticket,
            slot: ticket & (g.page_count as u64 - 1),
            // Relaxed: reported as found; nothing is read through it.
            meta_word: mem.word(g.meta_index(ticket)).load(Ordering::Relaxed),
            what,
        });
        Step::Idle
    }

    /// At the end of a sealed page as its successor's first sequence says:
    /// whether a record with the next sequence number is there all the
    /// same (a record of this lap: an older lap's records there carry
    /// older numbers), which means that first sequence was scribbled.
    fn record_follows(&self) -> bool {
        let g = self.ring.geometry;
        if self.offset + RECORD_HEADER_WORDS as u32 > g.data_words() {
            return false;
        }
        // Relaxed: a look for a contradiction; nothing is read through it.
        let state = RecordState::unpack(
            self.ring
                .mem
                .word(g.data_index(self.ticket, self.offset) + R_STATE)
                .load(Ordering::Relaxed),
        );
        state.seq_low == self.next_seq() & SEQ_LOW_MASK
            && matches!(
                state.state,
                STATE_RESERVED | STATE_COMMITTED | STATE_ABANDONED
            )
            && state.words as usize >= RECORD_HEADER_WORDS
    }

    /// Records reserved in the reader's page, and whether the page is closed
    /// (no more will be). `None` if the page was lapped or the words disagree.
    fn page_limit(&self, meta: Meta) -> Option<(u32, bool)> {
        let g = self.ring.geometry;
        let mem = &self.ring.mem;
        // Acquire: the reserve word names pages whose metas were published
        // before it.
        // A RETIRED mark keeps the front page's ticket and count: the
        // records reserved before it are read as on any open page. (Either
        // a producer found the ring's file gone from under it, and the
        // drain's health check sees the same and replaces the ring, or the
        // mark is a scribble on a ring still in use, which the health check
        // undoes: `unretire`.)
        let w = Reserve::unpack(mem.word(H_RESERVE).load(Ordering::Acquire));
        let ahead = ticket_distance(w.ticket, self.ticket);
        if ahead == 0 {
            return Some((w.count.min(RECORDS_PER_PAGE_MAX), w.closed()));
        }
        if ahead < 0 {
            // The producers' front is behind us: only a scribbled word or a
            // wrong resume position does that. Wait for it to move on.
            return Some((0, false));
        }
        let next = (self.ticket + 1) & TICKET_MASK;
        let next_meta = Meta::unpack(mem.word(g.meta_index(next)).load(Ordering::Acquire));
        if !next_meta.holds(next) {
            return None;
        }
        let count = next_meta.first_seq_low.wrapping_sub(meta.first_seq_low) & SEQ_LOW_MASK;
        if count > u64::from(RECORDS_PER_PAGE_MAX) {
            return None;
        }
        Some((count as u32, true))
    }

    /// Undoes a RETIRED mark found on this ring while its file is still
    /// the one at the ring's name (so no producer had a reason to set it:
    /// a scribble, which would turn every producer away): the page it
    /// names is closed instead, so producers open the next one. Returns
    /// whether there was a mark to undo.
    pub fn unretire(&self) -> bool {
        // Relaxed: compared by the CAS below.
        let word = self.ring.mem.word(H_RESERVE).load(Ordering::Relaxed);
        let w = Reserve::unpack(word);
        if w.offset != Reserve::RETIRED {
            return false;
        }
        let closed = Reserve {
            offset: Reserve::CLOSED,
            count: w.count.min(RECORDS_PER_PAGE_MAX),
            ..w
        };
        // AcqRel, as producers' CASes on this word; a failure means the word
        // moved on, and the next step looks again.
        let _ = self.ring.mem.word(H_RESERVE).compare_exchange(
            word,
            closed.pack(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        true
    }

    fn next_page(&mut self, count: u32) {
        // Saturating: only scribbled words could get near the top.
        self.first_seq = self.first_seq.saturating_add(u64::from(count));
        self.ticket = (self.ticket + 1) & TICKET_MASK;
        self.offset = 0;
        self.index = 0;
        self.clear_waits();
        // Producers and monitors see progress page by page, not only when
        // the reader idles. (Left out of loom models: monitoring only.)
        if !cfg!(loom) {
            self.publish_position();
        }
    }

    /// Steps over one record of `words` words, reporting it lost.
    fn skip_record(&mut self, words: u32, reason: LossReason) -> Step {
        let gap = self.gap(1, reason);
        self.advance(words);
        Step::Gap(gap)
    }

    fn advance(&mut self, words: u32) {
        self.offset += words;
        self.index += 1;
        self.clear_waits();
    }

    fn gap(&self, count: u64, reason: LossReason) -> Gap {
        let from_seq = self.next_seq();
        Gap {
            from_seq,
            to_seq: from_seq.saturating_add(count - 1),
            reason,
        }
    }

    /// Forgets what the reader was waiting on (it moved).
    fn clear_waits(&mut self) {
        self.stall = None;
        self.jump = None;
    }

    fn read_record(&mut self, meta_word: u64, limit: u32, sealed: bool) -> Step {
        let g = self.ring.geometry;
        let data_words = g.data_words();
        if self.offset + RECORD_HEADER_WORDS as u32 > data_words {
            // The index says more records, the page has no room: scribbled.
            return self.skip_rest_of_page(limit, sealed, LossReason::Corrupt);
        }
        let base = g.data_index(self.ticket, self.offset);
        // Acquire: pairs with the producer's Release commit.
        let state_word = self.ring.mem.word(base + R_STATE).load(Ordering::Acquire);
        let state = RecordState::unpack(state_word);
        if state.seq_low != self.next_seq() & SEQ_LOW_MASK {
            // Reserved but not yet stamped, its producer died before
            // stamping it, or scribbled: wait, then look for the record
            // after it, and give up on the page only if there is none.
            if !self.stalled_out() {
                return Step::Idle;
            }
            if self.index + 1 < limit {
                match self.find_following_record(limit - self.index - 1) {
                    Following::At { offset, skipped } => {
                        let gap = self.gap(skipped, LossReason::Abandoned);
                        self.offset = offset;
                        // `skipped` is at most the page's remaining count.
                        self.index += skipped as u32;
                        self.clear_waits();
                        return Step::Gap(gap);
                    }
                    Following::NotYet => return Step::Idle,
                    Following::None => {}
                }
            }
            return self.skip_rest_of_page(limit, sealed, LossReason::Abandoned);
        }
        let words = state.words;
        if (words as usize) < RECORD_HEADER_WORDS || self.offset + words > data_words {
            return self.skip_rest_of_page(limit, sealed, LossReason::Corrupt);
        }
        match state.state {
            STATE_COMMITTED => self.copy_record(meta_word, state_word, base, words),
            STATE_RESERVED => {
                if !self.stalled_out() {
                    return Step::Idle;
                }
                if self.abandon(base, state_word) {
                    self.skip_record(words, LossReason::Abandoned)
                } else {
                    Step::Continue
                }
            }
            STATE_ABANDONED => self.skip_record(words, LossReason::Abandoned),
            _ => self.skip_rest_of_page(limit, sealed, LossReason::Corrupt),
        }
    }

    fn copy_record(&mut self, meta_word: u64, state_word: u64, base: usize, words: u32) -> Step {
        let mem = &self.ring.mem;
        self.buf.clear();
        self.buf.resize(words as usize, 0);
        mem.copy_words(base, &mut self.buf);
        // Acquire fence: if the copy read any word written by a producer of a
        // later lap, that producer's Release fence (after it saw the page's
        // new meta word) synchronises with this one, so the re-reads below
        // see the new meta word or a changed state word.
        fence(Ordering::Acquire);
        let meta_now = mem
            .word(self.ring.geometry.meta_index(self.ticket))
            .load(Ordering::Relaxed);
        let state_now = mem.word(base + R_STATE).load(Ordering::Relaxed);
        if meta_now != meta_word || state_now != state_word || self.buf[R_STATE] != state_word {
            return self.resync();
        }
        let seq = self.next_seq();
        let valid = validate(&self.buf).and_then(|layout| {
            if layout.typed() {
                // Checked by `validate`; a failure here is corrupt too.
                to_json(layout.typed_fields(&self.buf), &mut self.typed_json)
                    .map_err(|_| RecordFault::Fields)?;
            }
            Ok(layout)
        });
        match valid {
            Ok(layout) => {
                self.advance(words);
                Step::Event { seq, layout }
            }
            Err(_) => self.skip_record(words, LossReason::Corrupt),
        }
    }

    /// The reader's page was reused (or its words disagree): move to the
    /// oldest page that is still intact and report what was skipped.
    fn resync(&mut self) -> Step {
        let g = self.ring.geometry;
        let mem = &self.ring.mem;
        let expected = self.next_seq();
        let front = Reserve::unpack(mem.word(H_RESERVE).load(Ordering::Acquire)).ticket;
        // The slot after the front is the next to be reused; start one later
        // still to keep clear of producers racing ahead.
        let oldest = front.wrapping_sub(g.page_count as u64 - 2) & TICKET_MASK;
        let after_ours = (self.ticket + 1) & TICKET_MASK;
        let target = if ticket_distance(oldest, after_ours) > 0 {
            oldest
        } else {
            after_ours
        };
        let meta = Meta::unpack(mem.word(g.meta_index(target)).load(Ordering::Acquire));
        if !meta.holds(target) {
            return Step::Idle;
        }
        let Some(first_seq) = seq_from_low(meta.first_seq_low, expected) else {
            return Step::Idle;
        };
        let lost = first_seq - expected;
        // No page holds more than RECORDS_PER_PAGE_MAX records, so a larger
        // jump than the pages skipped allow comes from a scribbled meta word.
        let pages = ticket_distance(target, self.ticket).max(1) as u64;
        if lost >= GAP_PLAUSIBLE_MAX || lost > pages.saturating_mul(u64::from(RECORDS_PER_PAGE_MAX))
        {
            return Step::Idle;
        }
        let gap = (lost > 0).then(|| self.gap(lost, LossReason::Overwritten));
        self.ticket = target;
        self.offset = 0;
        self.index = 0;
        self.first_seq = first_seq;
        self.clear_waits();
        match gap {
            Some(gap) => Step::Gap(gap),
            None => Step::Continue,
        }
    }

    fn publish_position(&self) {
        if self.looks_only {
            return;
        }
        let p = self.position();
        // Relaxed: monitoring only; receipts are the recovery authority.
        let mem = &self.ring.mem;
        mem.word(H_READ_POS)
            .store(p.position_word(), Ordering::Relaxed);
        mem.word(H_READ_SEQ).store(p.next_seq, Ordering::Relaxed);
    }
}
