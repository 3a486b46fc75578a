//! The admission word: one `AtomicU64` that bounds the channel by slots and by
//! bytes with a single compare-and-swap.
//!
//! Layout (bit 63 is the most significant):
//!
//! | bits   | field         | meaning                                                   |
//! |--------|---------------|-----------------------------------------------------------|
//! | 0..40  | `bytes`       | payload bytes admitted and not yet released               |
//! | 40..61 | `count`       | events admitted and not yet released (≤ slot count)       |
//! | 61     | `CLOSED`      | the receiver is gone; every admission fails               |
//! | 62     | `BIG_PENDING` | a blocking sender holds an event larger than the byte budget and waits for an empty channel |
//! | 63     | `WAITERS`     | at least one sender sleeps on the space futex             |
//!
//! Senders add `(1, len)` when admitted; the receiver subtracts what it consumed.
//! Because the receiver only ever subtracts amounts that were added before, the
//! fields never borrow from each other. `count ≤ 2^20` and
//! `bytes < 2^39 + 2^32 < 2^40` (see [`Capacity`]) keep both fields in range.

use super::{Capacity, SLOTS_MAX};

const BYTES_BITS: u32 = 40;
const COUNT_SHIFT: u32 = BYTES_BITS;
const COUNT_BITS: u32 = 21;
const BYTES_MASK: u64 = (1 << BYTES_BITS) - 1;
const COUNT_MASK: u64 = ((1 << COUNT_BITS) - 1) << COUNT_SHIFT;
pub(super) const CLOSED: u64 = 1 << 61;
pub(super) const BIG_PENDING: u64 = 1 << 62;
pub(super) const WAITERS: u64 = 1 << 63;

const _: () = assert!(COUNT_SHIFT + COUNT_BITS == 61);
const _: () = assert!((SLOTS_MAX as u64) < (1 << COUNT_BITS));
const _: () = assert!(super::BYTES_MAX + u32::MAX as u64 <= BYTES_MASK);

/// `(count, bytes)` packed into the word's counter fields.
#[inline(always)]
pub(super) const fn pack(count: u64, bytes: u64) -> u64 {
    (count << COUNT_SHIFT) | bytes
}

#[inline(always)]
pub(super) const fn count(word: u64) -> u64 {
    (word & COUNT_MASK) >> COUNT_SHIFT
}

#[inline(always)]
pub(super) const fn bytes(word: u64) -> u64 {
    word & BYTES_MASK
}

/// What a sender may do with the word it just read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// Store this value (with a CAS from the value read) and proceed.
    Admit(u64),
    /// No room now.
    Full,
    /// The receiver is gone.
    Closed,
}

/// Decides whether an event of `len` payload bytes fits, given the word `word`.
///
/// - Never more than `capacity.slots` events.
/// - Within the byte budget, unless the event alone is larger than the whole
///   budget: such an event is admitted only into an empty channel (so it can
///   always get in eventually and never deadlocks), and while a blocking sender
///   waits with one (`BIG_PENDING`), ordinary events are held back so the channel
///   can empty out for it.
#[inline(always)]
pub(super) fn decide(word: u64, len: u32, capacity: Capacity) -> Decision {
    if word & CLOSED != 0 {
        return Decision::Closed;
    }
    let occupied = count(word);
    debug_assert!(occupied <= capacity.slots as u64);
    if occupied >= capacity.slots as u64 {
        return Decision::Full;
    }
    let len = u64::from(len);
    if len > capacity.bytes {
        if occupied == 0 {
            // The big event takes the empty channel and ends its own wait.
            return Decision::Admit((word + pack(1, len)) & !BIG_PENDING);
        }
        return Decision::Full;
    }
    if word & BIG_PENDING != 0 {
        return Decision::Full;
    }
    if bytes(word) + len <= capacity.bytes {
        Decision::Admit(word + pack(1, len))
    } else {
        Decision::Full
    }
}

/// The flags a blocking sender sets before it sleeps for room.
#[inline(always)]
pub(super) fn sleep_flags(len: u32, capacity: Capacity) -> u64 {
    if u64::from(len) > capacity.bytes {
        WAITERS | BIG_PENDING
    } else {
        WAITERS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Capacity = Capacity {
        slots: 4,
        bytes: 100,
    };

    #[test]
    fn fields_round_trip() {
        let w = pack(3, 77) | WAITERS;
        assert_eq!(count(w), 3);
        assert_eq!(bytes(w), 77);
        assert_eq!(count(pack(SLOTS_MAX as u64, 0)), SLOTS_MAX as u64);
        let big = super::super::BYTES_MAX + u64::from(u32::MAX);
        assert_eq!(bytes(pack(1, big)), big);
    }

    #[test]
    fn slot_bound() {
        assert_eq!(decide(pack(4, 0), 0, CAP), Decision::Full);
        assert_eq!(decide(pack(3, 0), 0, CAP), Decision::Admit(pack(4, 0)));
    }

    #[test]
    fn byte_bound() {
        assert_eq!(decide(pack(1, 60), 40, CAP), Decision::Admit(pack(2, 100)));
        assert_eq!(decide(pack(1, 61), 40, CAP), Decision::Full);
    }

    #[test]
    fn oversize_only_into_empty_channel() {
        assert_eq!(decide(pack(1, 1), 101, CAP), Decision::Full);
        assert_eq!(
            decide(pack(0, 0) | BIG_PENDING | WAITERS, 101, CAP),
            Decision::Admit(pack(1, 101) | WAITERS)
        );
    }

    #[test]
    fn closed_refuses_everything() {
        assert_eq!(decide(pack(0, 0) | CLOSED, 1, CAP), Decision::Closed);
        assert_eq!(decide(pack(0, 0) | CLOSED, 101, CAP), Decision::Closed);
    }

    #[test]
    fn big_pending_holds_back_ordinary_events() {
        assert_eq!(decide(pack(1, 1) | BIG_PENDING, 1, CAP), Decision::Full);
        assert_eq!(decide(pack(0, 0) | BIG_PENDING, 1, CAP), Decision::Full);
        assert_eq!(sleep_flags(101, CAP), WAITERS | BIG_PENDING);
        assert_eq!(sleep_flags(100, CAP), WAITERS);
    }
}
