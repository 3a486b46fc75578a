//! One slot of the handoff channel and the encoding of its stamp.
//!
//! A slot is reused every lap. Its 32-bit stamp says, for ticket `t` (the
//! sender's position in the channel, `t % slots` picks the slot):
//!
//! | value            | meaning                                                   |
//! |------------------|-----------------------------------------------------------|
//! | `free(t)`        | empty, ticket `t` will fill it                            |
//! | `free(t) \| WAIT` | empty, and the receiver has announced it sleeps for it    |
//! | `full(t)`        | ticket `t` is published; the receiver may read it         |
//!
//! `free(t) = (t mod 2^30) << 2`, `FULL = 0b10`, `WAIT = 0b01`. The truncation
//! to 30 bits is harmless: a slot only ever moves from `free(t)` to `full(t)`
//! to `free(t + slots)`, and nobody compares stamps of different laps.

use crate::sync::{AtomicU32, UnsafeCell};

const FULL: u32 = 0b10;
pub(super) const WAIT: u32 = 0b01;

/// Stamp of a slot that ticket `ticket` will fill.
#[inline(always)]
pub(super) const fn free(ticket: u64) -> u32 {
    // Truncation intended: only the low 30 bits of the ticket are kept.
    (ticket as u32) << 2
}

/// Stamp of a slot that holds ticket `ticket`, ready to read.
#[inline(always)]
pub(super) const fn full(ticket: u64) -> u32 {
    free(ticket) | FULL
}

pub(super) struct Slot<H> {
    pub(super) stamp: AtomicU32,
    /// The header, and the payload length admitted for it. A `None` header
    /// marks a reservation dropped without being committed: the receiver gives
    /// its room back and skips it.
    pub(super) header: UnsafeCell<(Option<H>, u32)>,
    /// Payload bytes. The buffer is kept from lap to lap so steady state does
    /// not allocate; the receiver drops it when it grew beyond the keep limit.
    pub(super) payload: UnsafeCell<Vec<u8>>,
}

impl<H> Slot<H> {
    pub(super) fn new(ticket: u64) -> Self {
        Self {
            stamp: AtomicU32::new(free(ticket)),
            header: UnsafeCell::new((None, 0)),
            payload: UnsafeCell::new(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_of_one_lap_differ() {
        let t = (1u64 << 30) - 1;
        assert_ne!(free(t), full(t));
        assert_ne!(free(t) | WAIT, full(t));
        assert_eq!(free(t + (1 << 30)), free(t), "30-bit truncation");
        assert_ne!(free(t + 1024), free(t));
    }
}
