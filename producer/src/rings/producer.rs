//! The producer side of a ring: lock-free reservation, page switch,
//! overwrite-oldest, commit and the reader wake-up.
//!
//! # Reserving
//!
//! All producers of a ring (threads and processes) CAS one word, the
//! [`Reserve`] word `(ticket, offset, count, WAIT)`. A record that fits the rest
//! of page `ticket` moves `offset` and `count` on; its sequence number is the
//! page's first sequence plus its index. A record that does not fit closes the
//! page (offset `CLOSED`); then any producer — not only the one that closed it —
//! opens the next page:
//!
//! 1. read the closed page's meta word (first sequence) and compute the next
//!    page's first sequence: `first + count`;
//! 2. CAS the next slot's meta word from its old ticket (`next - pages`) to
//!    `(next, first')` — this is the overwrite of the oldest page; every helper
//!    computes the same value, so whoever wins, the result is the same;
//! 3. CAS the reserve word from `(ticket, CLOSED, count)` to `(next, 0, 0)`.
//!
//! A producer that dies anywhere in there leaves nothing half-done that the
//! next producer cannot finish. A producer never waits: every loop is bounded,
//! and when the bound is hit the event is refused with [`EmitError::Busy`].
//!
//! # Writing and committing
//!
//! The record's state word is written `RESERVED` (with its length) right after
//! the reservation, so the reader can step over the record if its producer dies
//! before committing. Then the body and a checksum, then the state goes to
//! `COMMITTED` with a Release CAS. A producer slow enough to be lapped may
//! scribble on the page's new contents; the checksum and the reader's re-check
//! of the meta word turn that into a counted loss, never a torn event.
//!
//! # Waking the reader
//!
//! A reader with nothing to read sets `WAIT` in the reserve word (with a CAS on
//! the exact value it checked) and sleeps on the ring's futex. The next
//! reservation sees `WAIT` in the value it replaced and clears it in the same
//! CAS; after committing, that producer bumps the futex word and wakes the
//! reader. So one event per sleep pays for the wake (a `futex` call), not
//! every event until the reader runs again: with eventd stopped, or slow to
//! be scheduled, producers keep emitting without a system call. A producer
//! that dies between its reservation and its wake leaves the reader asleep
//! until its timeout (the drain's is 250 ms, the cap 5 s): later events wait
//! that long to be read, and none is lost.

use super::event::{EncodeError, Event};
use super::format::*;
use super::typed::{stage, TypedFields, FLAG_TYPED_FIELDS, STAGE_WORDS};
use super::Ring;
use crate::sync::{fence, AtomicU64, Ordering};
use std::mem::MaybeUninit;

/// The words of a record being written, from R_TS on: each goes into the
/// ring as it comes and into the checksum.
struct Body<'a> {
    /// The record's words in the ring, all of its reservation.
    record: &'a [AtomicU64],
    /// The record's next word (R_TS ≤ next ≤ record.len()).
    next: usize,
    check: Checksum,
}

impl Body<'_> {
    #[inline(always)]
    fn put(&mut self, w: u64) {
        // A body never writes past its reservation: a word beyond it would
        // land in another record.
        let Some(cell) = self.record.get(self.next) else {
            debug_assert!(false, "record body longer than reserved");
            return;
        };
        // Relaxed: published by the Release CAS to COMMITTED.
        cell.store(w, Ordering::Relaxed);
        self.check.add(w);
        self.next += 1;
    }

    /// [`Body::put`] of each of `words`, with the checksum and position in
    /// locals (registers) for the whole run rather than in `self`.
    #[inline(always)]
    fn put_all(&mut self, words: &[u64]) {
        let rest = self.record.get(self.next..).unwrap_or_default();
        // As in `put`: never past the reservation (`zip` stops at its end).
        debug_assert!(
            words.len() <= rest.len(),
            "record body longer than reserved"
        );
        let mut check = self.check;
        for (cell, &w) in rest.iter().zip(words) {
            // Relaxed: published by the Release CAS to COMMITTED.
            cell.store(w, Ordering::Relaxed);
            check.add(w);
        }
        self.check = check;
        self.next += words.len().min(rest.len());
    }
}

/// Reservation attempts before a producer gives up on a contended or
/// corrupted ring.
const RESERVE_ATTEMPTS_MAX: u32 = 1000;

/// An event was not written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EmitError {
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("ring is contended or inconsistent; event not written")]
    Busy,
    #[error("ring page was reused while the event was being written; event lost")]
    Overwritten,
    /// The ring's file was truncated under this process (its mapping now
    /// holds nothing), or the daemon replaced the ring with a new one: open
    /// the ring file again ([`Emitter`](super::Emitter) does).
    #[error("the ring was truncated or replaced; event not written")]
    Gone,
}

/// Why a reservation failed.
enum Refused {
    /// The bounded retries ran out (contention or scribbled words).
    Busy,
    /// The daemon retired the ring.
    Retired,
}

/// Where a reservation landed.
struct Reservation {
    ticket: u64,
    offset: u32,
    index: u32,
    wake_reader: bool,
}

impl Ring {
    /// Writes one event into this ring. Never blocks.
    pub fn emit(&self, event: &Event<'_>) -> Result<(), EmitError> {
        let words = event.record_words(self.geometry)?;
        self.emit_record(words, |body| {
            body.put_all(&event.header_words());
            event.for_each_payload_word(|w| body.put(w));
        })
    }

    /// Writes one event with typed `fields` (see [`super::typed`]) in
    /// place of `event.fields`, which is not written. The fast path: the
    /// payload is staged in a buffer on the stack (the heap only for one
    /// larger than [`STAGE_WORDS`] words), with no allocation and no
    /// formatting.
    pub fn emit_typed<F: TypedFields + ?Sized>(
        &self,
        event: &Event<'_>,
        fields: &F,
    ) -> Result<(), EmitError> {
        let fields_len = fields.encoded_len();
        let words = event.record_words_with(fields_len, self.geometry)?;
        let header = event.header_words_with(fields_len, FLAG_TYPED_FIELDS);
        let payload_words = words as usize - RECORD_HEADER_WORDS;
        let write = |payload: &[u64]| {
            self.emit_record(words, |body| {
                body.put_all(&header);
                body.put_all(payload);
            })
        };
        let texts = [event.provider, event.name, event.message];
        let too_large = || EncodeError::TooLarge {
            len: texts.iter().map(|t| t.len()).sum::<usize>() + fields_len,
            max: payload_words * 8,
        };
        if payload_words <= STAGE_WORDS {
            // Left uninitialised: `stage` writes every word it returns.
            let mut stack = [MaybeUninit::<u64>::uninit(); STAGE_WORDS];
            write(
                stage(texts, fields, fields_len, &mut stack[..payload_words])
                    .ok_or_else(too_large)?,
            )
        } else {
            let mut heap = vec![MaybeUninit::<u64>::uninit(); payload_words];
            write(stage(texts, fields, fields_len, &mut heap).ok_or_else(too_large)?)
        }
    }

    /// Reserves `words` words, stamps them, has `body` write every word
    /// from R_TS on (exactly `words - R_TS` of them) and commits.
    #[inline(always)]
    fn emit_record(&self, words: u32, body: impl FnOnce(&mut Body<'_>)) -> Result<(), EmitError> {
        if self.mem.faulted() {
            return Err(EmitError::Gone);
        }
        let r = match self.reserve(words) {
            Ok(r) => r,
            Err(Refused::Busy) => {
                self.count_refusal();
                return Err(EmitError::Busy);
            }
            Err(Refused::Retired) => return Err(EmitError::Gone),
        };
        // Release fence: our writes below are ordered after everything our
        // Acquire reservation saw, including the meta word of this page. A
        // reader that copies any of them and then Acquire-fences sees that
        // meta word or a later one, which is how it notices a page reused
        // under it (the seqlock check in the reader).
        fence(Ordering::Release);
        let Some(state) = self.stamp_reserved(&r, words) else {
            // The page is gone already; the reader counts this sequence
            // number in its gap.
            return Err(EmitError::Overwritten);
        };
        let base = self.geometry.data_index(r.ticket, r.offset);
        let record = self.mem.words(base, words as usize);
        let mut b = Body {
            record,
            next: R_TS,
            check: Checksum::new(state),
        };
        body(&mut b);
        debug_assert_eq!(b.next, words as usize);
        record[R_CHECKSUM].store(b.check.finish(), Ordering::Relaxed);
        let committed = RecordState {
            state: STATE_COMMITTED,
            ..RecordState::unpack(state)
        }
        .pack();
        // Release: the body is visible to a reader that Acquire-loads
        // COMMITTED. A failed CAS means the reader gave up on us (abandoned)
        // or the page was reused; either way the event is counted lost.
        if record[R_STATE]
            .compare_exchange(state, committed, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            return Err(EmitError::Overwritten);
        }
        if self.mem.faulted() {
            // The file shrank while we wrote: the record went into the
            // zeroed stand-in memory, not the ring.
            return Err(EmitError::Gone);
        }
        if r.wake_reader {
            self.wake_reader();
        }
        Ok(())
    }

    /// What a producer killed right after reserving leaves behind: a
    /// reservation of `payload_words` words, its state word stamped RESERVED
    /// (or, if `stamp` is false, not even that), never committed. For tests
    /// of the reader's dead-producer handling.
    #[doc(hidden)]
    pub fn reserve_and_die_for_tests(&self, payload_words: u32, stamp: bool) {
        let words = RECORD_HEADER_WORDS as u32 + payload_words;
        let Ok(r) = self.reserve(words) else { return };
        if stamp {
            let _ = self.stamp_reserved(&r, words);
        }
    }

    /// Stamps the reservation's state word RESERVED with its sequence number
    /// and length, so the reader can step over it should we die. Returns the
    /// state word, or `None` if the page was reused under us already.
    #[inline(always)]
    fn stamp_reserved(&self, r: &Reservation, words: u32) -> Option<u64> {
        let meta = Meta::unpack(
            // Acquire: pairs with the opener's Release CAS (through our
            // reservation), so this is the meta of our page or a later one.
            self.mem
                .word(self.geometry.meta_index(r.ticket))
                .load(Ordering::Acquire),
        );
        if !meta.holds(r.ticket) {
            return None;
        }
        let state = RecordState {
            seq_low: (meta.first_seq_low + u64::from(r.index)) & SEQ_LOW_MASK,
            words,
            state: STATE_RESERVED,
        }
        .pack();
        // Relaxed: the reader only trusts the length after seeing the
        // sequence match, and re-validates everything it copies.
        self.mem
            .word(self.geometry.data_index(r.ticket, r.offset) + R_STATE)
            .store(state, Ordering::Relaxed);
        Some(state)
    }

    /// Wakes the reader if it sleeps (also used by the daemon at shutdown).
    pub fn wake_reader(&self) {
        // Release: a reader that sees the bump also sees our commit.
        self.mem.futex().fetch_add(1, Ordering::Release);
        self.mem.futex_wake();
    }

    /// Counts an event refused before it got a sequence number (so no gap
    /// will ever show it).
    fn count_refusal(&self) {
        // Relaxed: a statistic.
        self.mem
            .word(H_PRODUCER_REFUSED)
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Reserves `words` words; refused after `RESERVE_ATTEMPTS_MAX` tries or
    /// when the ring is retired.
    fn reserve(&self, words: u32) -> Result<Reservation, Refused> {
        let reserve = self.mem.word(H_RESERVE);
        // Relaxed: a first guess, validated by the CAS.
        let mut current = reserve.load(Ordering::Relaxed);
        for _ in 0..RESERVE_ATTEMPTS_MAX {
            let w = Reserve::unpack(current);
            if w.offset == Reserve::RETIRED {
                return Err(Refused::Retired);
            }
            if w.closed() {
                self.open_next(w);
                current = reserve.load(Ordering::Acquire);
                continue;
            }
            let fits =
                w.offset + words <= self.geometry.data_words() && w.count < RECORDS_PER_PAGE_MAX;
            let next = if fits {
                // A reservation takes WAIT with it: this producer wakes the
                // reader, and the ones after it do not (see the module docs).
                Reserve {
                    offset: w.offset + words,
                    count: w.count + 1,
                    wait: false,
                    ..w
                }
            } else {
                Reserve {
                    offset: Reserve::CLOSED,
                    ..w
                }
            };
            if w.offset > self.geometry.data_words() || w.count > RECORDS_PER_PAGE_MAX {
                current = close_scribbled(reserve, current, w);
                continue;
            }
            // AcqRel: Acquire so the page's meta word written by its opener is
            // visible; Release so a reader that set WAIT orders its futex read
            // before our wake (the reader's CAS and ours are on this word).
            match reserve.compare_exchange_weak(
                current,
                next.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) if fits => {
                    return Ok(Reservation {
                        ticket: w.ticket,
                        offset: w.offset,
                        index: w.count,
                        wake_reader: w.wait,
                    })
                }
                Ok(_) => current = next.pack(),
                Err(actual) => current = actual,
            }
        }
        Err(Refused::Busy)
    }

    /// Opens the page after the closed page `closed.ticket` (any producer may,
    /// concurrently; see the module docs). Returns without effect if the ring
    /// moved on meanwhile or its words are inconsistent.
    fn open_next(&self, closed: Reserve) {
        let g = self.geometry;
        let next_ticket = (closed.ticket + 1) & TICKET_MASK;
        // Acquire: pairs with the Release CAS that opened the closed page.
        let current = Meta::unpack(
            self.mem
                .word(g.meta_index(closed.ticket))
                .load(Ordering::Acquire),
        );
        if !current.holds(closed.ticket) {
            return;
        }
        let opened = Meta::new(next_ticket, current.first_seq_low + u64::from(closed.count));
        let slot = self.mem.word(g.meta_index(next_ticket));
        // Acquire: see the previous occupant's meta as written.
        let old = slot.load(Ordering::Acquire);
        if old != opened.pack() {
            let previous = next_ticket.wrapping_sub(g.page_count as u64) & TICKET_MASK;
            if !Meta::unpack(old).holds(previous) {
                // Someone else reused it already for a later ticket (we are
                // stale), or it is scribbled: let the reserve loop reload.
                return;
            }
            // AcqRel: Release publishes the new meta before the reserve word
            // names this page; a losing CAS just means another helper won.
            if let Err(actual) =
                slot.compare_exchange(old, opened.pack(), Ordering::AcqRel, Ordering::Acquire)
            {
                if actual != opened.pack() {
                    return;
                }
            }
        }
        let installed = Reserve {
            ticket: next_ticket,
            offset: 0,
            count: 0,
            wait: closed.wait,
        };
        // AcqRel: Release so a producer reserving in the new page sees its
        // meta; failure means another helper installed it or the word moved.
        let _ = self.mem.word(H_RESERVE).compare_exchange(
            closed.pack(),
            installed.pack(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

/// Closes the page of a scribbled reserve word `w` (read as `current`) so
/// the ring moves on; returns the word as it is now.
fn close_scribbled(reserve: &AtomicU64, current: u64, w: Reserve) -> u64 {
    let closed = Reserve {
        offset: Reserve::CLOSED,
        count: w.count.min(RECORDS_PER_PAGE_MAX),
        ..w
    };
    // AcqRel / Acquire: as the reservation's own CAS.
    match reserve.compare_exchange(current, closed.pack(), Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => closed.pack(),
        Err(actual) => actual,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::rings::{Level, RingItem, RingReader};
    use std::sync::Arc;

    fn event(message: &str) -> Event<'_> {
        Event {
            ts_ns: 1_700_000_000_000_000_000,
            pid: 1,
            tid: 2,
            uid: 3,
            level: Level::Info,
            provider: "wake",
            name: "test",
            message,
            fields: "",
        }
    }

    /// What a reader does before it sleeps: WAIT set in the reserve word.
    fn set_wait(ring: &Ring) {
        ring.mem.word(H_RESERVE).fetch_or(1, Ordering::SeqCst);
        assert!(Reserve::unpack(ring.mem.word(H_RESERVE).load(Ordering::SeqCst)).wait);
    }

    fn wakes(ring: &Ring) -> u32 {
        ring.mem.futex().load(Ordering::SeqCst)
    }

    #[test]
    fn one_event_wakes_a_sleeping_reader_and_the_next_ones_make_no_call() {
        let dir = tempfile::tempdir().unwrap();
        let g = Geometry::new(16 * 1024, 4).unwrap();
        let ring = Arc::new(Ring::create(&dir.path().join("cpu-000.ring"), g, 0).unwrap());
        let before = wakes(&ring);
        ring.emit(&event("no one waits")).unwrap();
        assert_eq!(wakes(&ring), before, "no reader asleep: no wake");
        // A reader that went to sleep and is not running (eventd stopped):
        // the first event wakes it and takes WAIT with it; the rest of the
        // events do not call again.
        set_wait(&ring);
        for i in 0..100 {
            ring.emit(&event(&format!("event {i}"))).unwrap();
        }
        assert_eq!(wakes(&ring), before + 1);
        let w = Reserve::unpack(ring.mem.word(H_RESERVE).load(Ordering::SeqCst));
        assert!(!w.wait, "the waking reservation cleared WAIT");
        // The next sleep is woken again, through a page switch too.
        set_wait(&ring);
        let long = "x".repeat(3000);
        for _ in 0..12 {
            ring.emit(&event(&long)).unwrap();
        }
        assert_eq!(wakes(&ring), before + 2);
        // Every event is there to read.
        let mut reader = RingReader::new(Arc::clone(&ring));
        let mut read = 0;
        while let Some(item) = reader.poll() {
            assert!(matches!(item, RingItem::Event { .. }), "{item:?}");
            read += 1;
        }
        assert_eq!(read, 113);
    }
}
