//! What a ring reader hands out and keeps: events and exact gaps
//! ([`RingItem`], [`Gap`], [`LossReason`]), where it stands
//! ([`ReadPosition`]), and the impossible page word that stops it
//! ([`Scribble`]).

use super::super::event::Event;
use super::super::format::*;

/// Why events were lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// Producers overwrote them before the reader got there.
    Overwritten,
    /// Reserved but never committed (the producer died).
    Abandoned,
    /// The record failed validation.
    Corrupt,
    /// The ring itself was lost (its file truncated, replaced or wedged by
    /// a scribble) and the daemon made a new one: what it held unread went
    /// with it. Never returned by the reader; the drain records it.
    RingLost,
    /// Messages eventd received but could not put into a ring (the store
    /// could not commit and the ring was full): counted, then recorded as
    /// one gap row whose `lost` is their number. Never returned by the
    /// reader; the syslog drain records it.
    Dropped,
    /// Kernel log records the kernel overwrote in its buffer before eventd
    /// read them: one gap row whose `lost` is their exact number (the jump
    /// in the kernel's sequence numbers). Never returned by the reader;
    /// the kernel ring's drain records it.
    KernelOverwritten,
    /// Events past their source's rate limit (`RateLimitBurst` per
    /// `RateLimitInterval`), left out by the drain before the handoff.
    /// Never returned by the reader; the drain records it.
    Suppressed,
}

impl LossReason {
    pub fn name(self) -> &'static str {
        match self {
            LossReason::Overwritten => "overwritten",
            LossReason::Abandoned => "abandoned",
            LossReason::Corrupt => "corrupt",
            LossReason::RingLost => "ring_lost",
            LossReason::Dropped => "dropped",
            LossReason::KernelOverwritten => "kernel_overwritten",
            LossReason::Suppressed => "suppressed",
        }
    }
}

/// Sequence numbers `from_seq..=to_seq` of this ring were lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    pub from_seq: u64,
    pub to_seq: u64,
    pub reason: LossReason,
}

impl Gap {
    pub fn count(&self) -> u64 {
        self.to_seq - self.from_seq + 1
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingItem<'a> {
    Event { seq: u64, event: Event<'a> },
    Gap(Gap),
}

/// Where a reader is: page ticket, word offset and record index inside it,
/// and the sequence number it expects next. Stored with receipts so a
/// restarted daemon resumes exactly here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPosition {
    pub ticket: u64,
    pub offset: u32,
    pub index: u32,
    pub next_seq: u64,
}

impl ReadPosition {
    /// The start of a new ring.
    pub const START: ReadPosition = ReadPosition {
        ticket: 0,
        offset: 0,
        index: 0,
        next_seq: 1,
    };

    /// The position packed in one word (the reserve word's layout).
    pub fn position_word(&self) -> u64 {
        Reserve {
            ticket: self.ticket,
            offset: self.offset.min(Reserve::CLOSED - 1),
            count: self.index.min(RECORDS_PER_PAGE_MAX),
            wait: false,
        }
        .pack()
    }

    pub fn from_words(position: u64, next_seq: u64) -> Self {
        let r = Reserve::unpack(position);
        ReadPosition {
            ticket: r.ticket,
            offset: r.offset,
            index: r.count,
            next_seq,
        }
    }
}

/// A page word the reader found impossible (see the module docs): the
/// ring's words can no longer be trusted past the reader's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scribble {
    /// The page whose meta word is wrong: its ticket, its slot (the page's
    /// index in the file) and the meta word as found.
    pub ticket: u64,
    pub slot: u64,
    pub meta_word: u64,
    /// What is wrong with it, in words.
    pub what: &'static str,
}
