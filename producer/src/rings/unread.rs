//! What a ring that is given up still held unread: the number its
//! `ring_lost` gap records.
//!
//! Counted after the ring was retired ([`Ring::retire`]), so the front is
//! frozen: the front page's count is the reserve word's, every reservation
//! made before the mark included. Each earlier page's count is the
//! difference of its successor's first sequence and its own (invariant 3 of
//! docs/design/rings.md). A scribbled meta word can make that difference wrong, so
//! each page is also walked record by record (a record's state word holds
//! its length and sequence number) and the larger of the two is taken; the
//! count says whether the two agreed everywhere.

use super::format::*;
use super::{ReadPosition, Ring};
use crate::sync::Ordering;

/// Events a ring held past a reader's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unread {
    pub records: u64,
    /// Whether every page's words agreed with its records (else `records`
    /// is the best count the words allow, and the log says "at least").
    pub exact: bool,
}

impl Ring {
    /// The events this ring holds past `from` (a reader's position) that no
    /// reader will deliver, counting those already overwritten. Meant for a
    /// ring that is retired (its front frozen); on a live ring it is a
    /// snapshot. Bounded: one pass over at most every page.
    pub fn unread(&self, from: ReadPosition) -> Unread {
        if self.mem.faulted() {
            return Unread {
                records: 0,
                exact: false,
            };
        }
        let g = self.geometry;
        // Acquire: pairs with the producers' Release CASes, so the meta
        // words of every page the front passed are seen as published.
        let front = Reserve::unpack(self.mem.word(H_RESERVE).load(Ordering::Acquire));
        let pages = g.page_count as i64;
        let ahead = ticket_distance(front.ticket, from.ticket);
        let mut count = Unread {
            records: 0,
            exact: ahead >= 0 && front.count <= RECORDS_PER_PAGE_MAX,
        };
        if ahead < 0 {
            return count;
        }
        let (mut ticket, mut skip) = (from.ticket, u64::from(from.index));
        if ahead >= pages {
            // Lapped: the pages before the oldest intact one were overwritten;
            // their records are the difference of first sequences.
            ticket = front.ticket.wrapping_sub(g.page_count as u64 - 1) & TICKET_MASK;
            skip = 0;
            match self.first_seq(ticket, from.next_seq) {
                Some(first) if first >= from.next_seq => count.records += first - from.next_seq,
                _ => count.exact = false,
            }
        }
        loop {
            let held = if ticket == front.ticket {
                u64::from(front.count.min(RECORDS_PER_PAGE_MAX))
            } else {
                let (held, agreed) = self.closed_page_records(ticket);
                count.exact &= agreed;
                held
            };
            count.exact &= held >= skip;
            count.records += held.saturating_sub(skip);
            skip = 0;
            if ticket == front.ticket {
                return count;
            }
            ticket = (ticket + 1) & TICKET_MASK;
        }
    }

    /// Records in closed page `ticket`, and whether its words and its
    /// records agreed on that.
    fn closed_page_records(&self, ticket: u64) -> (u64, bool) {
        let next = (ticket + 1) & TICKET_MASK;
        let by_meta = match (self.meta(ticket), self.meta(next)) {
            (Some(this), Some(after)) => {
                let held = after.first_seq_low.wrapping_sub(this.first_seq_low) & SEQ_LOW_MASK;
                (held <= u64::from(RECORDS_PER_PAGE_MAX)).then_some(held)
            }
            _ => None,
        };
        let walked = self.walk_records(ticket);
        match by_meta {
            Some(held) => (held.max(walked), held == walked),
            None => (walked, false),
        }
    }

    /// The meta word of page `ticket`, if it holds that page.
    fn meta(&self, ticket: u64) -> Option<Meta> {
        // Acquire: as in `unread`.
        let meta = Meta::unpack(
            self.mem
                .word(self.geometry.meta_index(ticket))
                .load(Ordering::Acquire),
        );
        meta.holds(ticket).then_some(meta)
    }

    /// The full first sequence of page `ticket` (its low bits resolved near
    /// `reference`), if its meta word holds it.
    fn first_seq(&self, ticket: u64, reference: u64) -> Option<u64> {
        seq_from_low(self.meta(ticket)?.first_seq_low, reference)
    }

    /// Records of this lap at the start of page `ticket`: from the first
    /// (which must carry the page's first sequence number, if its meta word
    /// holds the page), each next one where the last one's length says, as
    /// long as their sequence numbers follow on (a record of an older lap
    /// left behind the last one carries an older number). A record whose
    /// producer died before it wrote the state word ends the walk early.
    fn walk_records(&self, ticket: u64) -> u64 {
        let g = self.geometry;
        let (mut offset, mut walked) = (0u32, 0u64);
        let mut expected = self.meta(ticket).map(|m| m.first_seq_low);
        while offset as usize + RECORD_HEADER_WORDS <= g.data_words() as usize
            && walked < u64::from(RECORDS_PER_PAGE_MAX)
        {
            // Relaxed: the ring is retired; the words only count records.
            let state = RecordState::unpack(
                self.mem
                    .word(g.data_index(ticket, offset) + R_STATE)
                    .load(Ordering::Relaxed),
            );
            let follows = expected.is_none_or(|seq| state.seq_low == seq);
            let whole = matches!(
                state.state,
                STATE_RESERVED | STATE_COMMITTED | STATE_ABANDONED
            ) && state.words as usize >= RECORD_HEADER_WORDS
                && offset + state.words <= g.data_words();
            if !follows || !whole {
                break;
            }
            expected = Some((state.seq_low + 1) & SEQ_LOW_MASK);
            offset += state.words;
            walked += 1;
        }
        walked
    }
}
