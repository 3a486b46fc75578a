//! What the reader does about producers that died between reserving and
//! committing: the stall bound, marking a stamped record abandoned, finding
//! the way on past an unstamped one, and giving up the rest of a page.

use super::{Following, LossReason, RingReader, Step, STALL_BOUND_MS};
use crate::rings::event::validate;
use crate::rings::format::*;
use crate::sync::{fence, Ordering};

impl RingReader {
    /// Whether the record the reader waits on has waited past the bound.
    pub(super) fn stalled_out(&mut self) -> bool {
        let now = crate::sync::monotonic_ms();
        let seq = self.next_seq();
        match self.stall {
            Some((s, since)) if s == seq => now.saturating_sub(since) >= STALL_BOUND_MS,
            _ => {
                self.stall = Some((seq, now));
                false
            }
        }
    }

    /// The rest of the page cannot be walked (a record's length is unknown).
    /// Once the page is sealed its count is known: report the rest as lost.
    pub(super) fn skip_rest_of_page(
        &mut self,
        limit: u32,
        sealed: bool,
        reason: LossReason,
    ) -> Step {
        if !sealed {
            if reason == LossReason::Abandoned {
                // A producer died before stamping its record and nobody else
                // is filling the page: close it ourselves (any producer may),
                // so its count becomes final and later records are not held
                // back behind the dead one.
                self.close_page();
            }
            return Step::Idle;
        }
        let rest = u64::from(limit - self.index);
        let gap = self.gap(rest, reason);
        self.next_page(limit);
        Step::Gap(gap)
    }

    /// Closes the reader's page to new reservations if it is still the one
    /// being filled.
    pub(super) fn close_page(&self) {
        let reserve = self.ring.mem.word(H_RESERVE);
        // Acquire: as in `page_limit`.
        let current = reserve.load(Ordering::Acquire);
        let w = Reserve::unpack(current);
        if w.ticket != self.ticket || w.closed() {
            return;
        }
        let closed = Reserve {
            offset: Reserve::CLOSED,
            ..w
        };
        // AcqRel: the same transition a producer makes when a record does not
        // fit; a failure means the word moved on and the next step re-reads.
        let _ =
            reserve.compare_exchange(current, closed.pack(), Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Ends the stamped reservation at `base` (state word `state_word`) as
    /// abandoned, so its producer's commit fails; false if the word changed
    /// first (its producer committed).
    pub(super) fn abandon(&self, base: usize, state_word: u64) -> bool {
        let abandoned = RecordState {
            state: STATE_ABANDONED,
            ..RecordState::unpack(state_word)
        }
        .pack();
        // Relaxed on success: the record is given up, nothing of it is read.
        // Acquire on failure: the producer committed just now, and its body
        // is read next.
        self.ring
            .mem
            .word(base + R_STATE)
            .compare_exchange(state_word, abandoned, Ordering::Relaxed, Ordering::Acquire)
            .is_ok()
    }

    /// How many sequence numbers after the next one `seq_low` (a state
    /// word's low bits) names: 0 for the next one itself.
    pub(super) fn seq_distance(&self, seq_low: u64) -> u64 {
        seq_low.wrapping_sub(self.next_seq() & SEQ_LOW_MASK) & SEQ_LOW_MASK
    }

    /// The record to resume at after an unstamped one (whose length is
    /// unknown): the first committed record in the page that names one of
    /// the next `remaining` sequence numbers after it and passes its
    /// checksum; the one nearest in sequence wins. Usually that is the very
    /// next number; it is a later one when the producers of the records in
    /// between died too (killed together). Older laps hold lower numbers,
    /// and a word inside a stale record that only looks like such a state
    /// word fails the checksum, so the scan goes on past it. A next record
    /// still being written is not taken: the scan runs again at the next
    /// step. The found record is then read like any other (its re-reads
    /// and checksum again).
    ///
    /// A farther record (producers in between that have not committed)
    /// is taken only after it has been the way on for the stall bound, so
    /// the records in between get the same time as the dead one. Then,
    /// with the page checked to be still ours, records in between that were
    /// stamped RESERVED are marked ABANDONED, as a stalled reservation is,
    /// so a producer that was only slow fails its commit rather than
    /// believing its event stored. One that commits as this happens makes
    /// the reader look again, and one that committed just before is found
    /// by a last look and resumed at instead.
    pub(super) fn find_following_record(&mut self, remaining: u32) -> Following {
        let g = self.ring.geometry;
        let data_words = g.data_words();
        let first = self.offset + RECORD_HEADER_WORDS as u32;
        let Some(last) = data_words.checked_sub(RECORD_HEADER_WORDS as u32) else {
            return Following::None;
        };
        // Acquire: the meta word this scan starts under, re-checked below.
        let meta_before = self
            .ring
            .mem
            .word(g.meta_index(self.ticket))
            .load(Ordering::Acquire);
        let best = self.nearest_committed(first, last + 1, u64::from(remaining) + 1);
        let Some((found, skipped)) = best else {
            return Following::None;
        };
        if skipped > 1 {
            // Records between were reserved before the found one was
            // committed, perhaps only just: they get the same bound as the
            // dead one, counted from when the reader first saw this way on.
            let now = crate::sync::monotonic_ms();
            let target = self.next_seq().saturating_add(skipped);
            match self.jump {
                Some((t, since)) if t == target => {
                    if now.saturating_sub(since) < STALL_BOUND_MS {
                        return Following::NotYet;
                    }
                }
                _ => {
                    self.jump = Some((target, now));
                    return Following::NotYet;
                }
            }
        }
        // The page must still be ours before anything in it is changed.
        // Acquire fence: as in `copy_record`, a scan that read a later lap's
        // words sees that lap's meta word here.
        fence(Ordering::Acquire);
        let meta_now = self
            .ring
            .mem
            .word(g.meta_index(self.ticket))
            .load(Ordering::Relaxed);
        if meta_now != meta_before {
            return Following::NotYet;
        }
        // The records between (sequence distances 1..skipped) lie before
        // `found`: stamped ones among them are ended as abandoned.
        for offset in first..found {
            let base = g.data_index(self.ticket, offset);
            let word = self.ring.mem.word(base + R_STATE).load(Ordering::Relaxed);
            let state = RecordState::unpack(word);
            let d = self.seq_distance(state.seq_low);
            if state.state != STATE_RESERVED || d == 0 || d >= skipped {
                continue;
            }
            // A failure means its producer committed just now (or the word
            // was not a state word after all and changed): look again.
            if !self.abandon(base, word) {
                return Following::NotYet;
            }
        }
        // One in between may have committed after the scan and before its
        // word was looked at above (committed stays committed, abandoned
        // can no longer commit): resume at it if so.
        if let Some((offset, d)) = self.nearest_committed(first, found, skipped) {
            return Following::At { offset, skipped: d };
        }
        Following::At {
            offset: found,
            skipped,
        }
    }

    /// The committed, checksum-valid record at an offset in `from..to` whose
    /// sequence is nearest after the next one, closer than `below`: its
    /// offset and sequence distance.
    pub(super) fn nearest_committed(
        &mut self,
        from: u32,
        to: u32,
        below: u64,
    ) -> Option<(u32, u64)> {
        let g = self.ring.geometry;
        let data_words = g.data_words();
        let mut best: Option<(u32, u64)> = None;
        for offset in from..to {
            let base = g.data_index(self.ticket, offset);
            // Acquire: pairs with the producer's Release commit, so the
            // copy below sees the body that was committed.
            let word = self.ring.mem.word(base + R_STATE).load(Ordering::Acquire);
            let state = RecordState::unpack(word);
            let d = self.seq_distance(state.seq_low);
            if d == 0
                || d >= best.map_or(below, |(_, b)| b)
                || state.state != STATE_COMMITTED
                || (state.words as usize) < RECORD_HEADER_WORDS
                || offset + state.words > data_words
            {
                continue;
            }
            self.buf.clear();
            self.buf.resize(state.words as usize, 0);
            self.ring.mem.copy_words(base, &mut self.buf);
            if self.buf[R_STATE] == word && validate(&self.buf).is_ok() {
                best = Some((offset, d));
                if d == 1 {
                    break;
                }
            }
        }
        best
    }
}
