//! The handoff channel between drain threads and one shard writer (rules R9–R11).
//!
//! A bounded multi-producer, single-consumer queue of variable-size events,
//! bounded twice: by a fixed number of slots (a power of two) and by a fixed
//! budget of payload bytes. Both are set at construction and never change.
//!
//! # The algorithm
//!
//! It is a ring of slots in the manner of Vyukov's bounded queue (each slot has a
//! stamp saying whose turn it is), with admission split off into one packed word:
//!
//! 1. **Admit.** A sender CASes the [admission word](admission) from
//!    `(count, bytes)` to `(count + 1, bytes + len)`, which succeeds only if both
//!    bounds still hold. Nothing has been copied yet; a sender that does not get
//!    in sleeps (or `try_` returns `Full`) — it never drops and the channel never
//!    grows.
//! 2. **Take a ticket.** `tail.fetch_add(1)` gives ticket `t`; slot `t % slots`.
//!    No check of the slot is needed: admission keeps at most `slots` events
//!    between "admitted" and "released", and the receiver frees a slot before it
//!    releases the admission, so ticket `t - slots` has been consumed (see
//!    [`HandoffChannel::publish`] for the argument). The stamp check there asserts it.
//! 3. **Fill and publish.** The sender writes header and payload into the slot's
//!    own buffer (kept from lap to lap: no allocation per event) and swaps the
//!    stamp to `full(t)`.
//! 4. **Consume.** The receiver reads slots in ticket order, hands each event to
//!    the caller by reference, marks the slot `free(t + slots)`, and every few
//!    events subtracts what it consumed from the admission word in one atomic
//!    operation.
//!
//! # Sleeping and waking
//!
//! Both sides spin briefly, then sleep on a futex. Every handshake is between
//! read-modify-writes of one location, so coherence alone orders them and no
//! SeqCst fence is needed:
//! - The receiver sleeps for slot `t` by CASing its stamp from `free(t)` to
//!   `free(t) | WAIT` after reading the `data` futex word. The sender publishes
//!   with a swap; if the old stamp had `WAIT`, it bumps `data` and wakes. Either
//!   the swap reads the receiver's CAS (then the receiver read `data` before the
//!   bump, so its futex wait returns) or the CAS fails because the slot is full.
//! - A sender sleeps for room by setting `WAITERS` in the admission word with a
//!   CAS after reading the `space` futex word. The receiver's release returns the
//!   old word; if `WAITERS` was set it clears it, bumps `space` and wakes all.
//! - Closing sets a flag (senders gone) or the `CLOSED` bit (receiver gone), then
//!   bumps the futex word the other side sleeps on, so sleepers wake at once.
//!
//! Wakes are issued only when a sleeper announced itself: no syscall per event
//! while both sides keep up.
//!
//! # Events larger than the byte budget
//!
//! An event whose payload alone exceeds the byte budget is admitted only into an
//! empty channel. While a blocking sender waits with one, the `BIG_PENDING` bit
//! holds ordinary events back, so the channel empties and the big event gets in;
//! it cannot deadlock and cannot be starved by a stream of small ones.

mod admission;
mod err;
mod monitor;
mod receiver;
mod sender;
mod slot;
#[cfg(all(test, not(loom)))]
mod tests;

pub use err::{CapacityError, RecvError, SendError, TryRecvError, TrySendError};
pub use monitor::{ChannelMonitor, ChannelStats};
pub use receiver::Receiver;
pub use sender::{SendPermit, Sender};

use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Futex, Ordering};
use crossbeam_utils::CachePadded;
use slot::Slot;

/// Largest slot count a channel may have.
pub const SLOTS_MAX: usize = 1 << 20;
/// Largest byte budget a channel may have.
pub const BYTES_MAX: u64 = 1 << 39;
/// Smallest buffer a slot keeps between laps.
const KEEP_BYTES_MIN: usize = 1024;
/// Most events the receiver consumes before it releases their capacity.
const RELEASE_EVERY_MAX: usize = 32;

/// The two bounds of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Slots: a power of two in `1..=SLOTS_MAX`.
    pub slots: usize,
    /// Payload bytes held at once, in `1..=BYTES_MAX` (one larger event may
    /// enter an empty channel).
    pub bytes: u64,
}

/// What is shared between the senders and the receiver.
pub struct HandoffChannel<H> {
    /// `(count, bytes)` and flags; see [`admission`].
    admission: CachePadded<AtomicU64>,
    /// Next ticket. Only senders touch it.
    tail: CachePadded<AtomicU64>,
    /// Senders sleeping for room wait on this word; the receiver bumps it.
    space: CachePadded<Futex>,
    /// The receiver sleeping for data waits on this word; senders bump it.
    data: CachePadded<Futex>,
    senders: AtomicUsize,
    senders_gone: AtomicBool,
    full_stalls: AtomicU64,
    receiver_sleeps: AtomicU64,
    capacity: Capacity,
    /// A slot whose buffer grew beyond this is given back to the allocator.
    keep_bytes: usize,
    /// The receiver releases capacity after at most this many events.
    release_every: usize,
    slots: Box<[Slot<H>]>,
}

// SAFETY: the slots' cells are accessed under the stamp protocol: a sender
// writes slot `t % n` only between taking ticket `t` and publishing `full(t)`,
// and the receiver reads it only between seeing `full(t)` and storing
// `free(t + n)`; those intervals never overlap (see `publish`). Headers and
// payloads cross threads, hence `H: Send`.
unsafe impl<H: Send> Sync for HandoffChannel<H> {}
// SAFETY: as above; the channel owns its headers and buffers.
unsafe impl<H: Send> Send for HandoffChannel<H> {}

impl<H: Copy + Send> HandoffChannel<H> {
    /// Builds a channel and returns its first sender and its receiver.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(capacity: Capacity) -> Result<(Sender<H>, Receiver<H>), CapacityError> {
        if !capacity.slots.is_power_of_two() || capacity.slots > SLOTS_MAX {
            return Err(CapacityError::Slots(capacity.slots));
        }
        if capacity.bytes == 0 || capacity.bytes > BYTES_MAX {
            return Err(CapacityError::Bytes(capacity.bytes));
        }
        let per_slot =
            usize::try_from(capacity.bytes / capacity.slots as u64).unwrap_or(usize::MAX);
        let chan = Arc::new(HandoffChannel {
            admission: CachePadded::new(AtomicU64::new(0)),
            tail: CachePadded::new(AtomicU64::new(0)),
            space: CachePadded::new(Futex::new(0)),
            data: CachePadded::new(Futex::new(0)),
            senders: AtomicUsize::new(1),
            senders_gone: AtomicBool::new(false),
            full_stalls: AtomicU64::new(0),
            receiver_sleeps: AtomicU64::new(0),
            capacity,
            keep_bytes: per_slot.saturating_mul(2).max(KEEP_BYTES_MIN),
            release_every: (capacity.slots / 8).clamp(1, RELEASE_EVERY_MAX),
            slots: (0..capacity.slots as u64).map(Slot::new).collect(),
        });
        let receiver = Receiver {
            chan: chan.clone(),
            head: 0,
            unreleased_count: 0,
            unreleased_bytes: 0,
            release_every: chan.release_every,
        };
        Ok((Sender { chan }, receiver))
    }
}

impl<H> HandoffChannel<H> {
    /// The slot ticket `ticket` uses.
    #[inline(always)]
    fn slot(&self, ticket: u64) -> &Slot<H> {
        // `slots` is a power of two, so the mask keeps the index in range.
        let index = (ticket as usize) & (self.capacity.slots - 1);
        debug_assert!(index < self.slots.len());
        &self.slots[index]
    }

    fn stats(&self) -> ChannelStats {
        // Relaxed: a monitoring snapshot; no data is read on the strength of it.
        let word = self.admission.load(Ordering::Relaxed);
        ChannelStats {
            capacity: self.capacity,
            occupied_slots: admission::count(word),
            occupied_bytes: admission::bytes(word),
            full_stalls: self.full_stalls.load(Ordering::Relaxed),
            receiver_sleeps: self.receiver_sleeps.load(Ordering::Relaxed),
        }
    }

    /// Reserves room for one event of `len` bytes and returns its ticket.
    fn admit(&self, len: u32, block: bool) -> Result<u64, TrySendError> {
        // Relaxed: only a first guess for the CAS, which re-validates it.
        let mut word = self.admission.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            match admission::decide(word, len, self.capacity) {
                admission::Decision::Admit(next) => {
                    // Acquire on success: synchronises with the receiver's
                    // Release when it freed capacity, so the slot our ticket
                    // lands on has been read and freed before we write it.
                    match self.admission.compare_exchange_weak(
                        word,
                        next,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => break,
                        Err(actual) => word = actual,
                    }
                }
                admission::Decision::Closed => return Err(TrySendError::Disconnected),
                admission::Decision::Full if !block => return Err(TrySendError::Full),
                admission::Decision::Full => {
                    if spins == 0 {
                        // Relaxed: a statistic.
                        self.full_stalls.fetch_add(1, Ordering::Relaxed);
                    }
                    if crate::sync::SPIN_BEFORE_SLEEP && spins < SPIN_ROUNDS {
                        spin(spins);
                        spins += 1;
                        word = self.admission.load(Ordering::Relaxed);
                        continue;
                    }
                    spins = SPIN_ROUNDS;
                    word = self.sleep_for_space(len);
                }
            }
        }
        // AcqRel: the chain of ticket RMWs carries every earlier sender's
        // admission to us (part of the argument in `publish`).
        Ok(self.tail.fetch_add(1, Ordering::AcqRel))
    }

    /// Announces this sender as a sleeper and sleeps until the receiver frees
    /// capacity (or goes away). Returns a fresh admission word to retry with.
    #[cold]
    fn sleep_for_space(&self, len: u32) -> u64 {
        // The epoch is read *before* the word we decide on: a release that the
        // decision misses bumps the epoch after this read, so the wait returns.
        // Acquire pairs with the receiver's Release bump.
        let epoch = self.space.word().load(Ordering::Acquire);
        let word = self.admission.load(Ordering::Acquire);
        if !matches!(
            admission::decide(word, len, self.capacity),
            admission::Decision::Full
        ) {
            return word;
        }
        let flags = admission::sleep_flags(len, self.capacity);
        if word & flags != flags {
            // AcqRel: Release so the receiver's release RMW, which reads this
            // value or a later one, orders our epoch read before its bump.
            if let Err(actual) = self.admission.compare_exchange(
                word,
                word | flags,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                return actual;
            }
        }
        self.space.wait(epoch);
        self.admission.load(Ordering::Acquire)
    }

    /// Writes header and payload into the slot of `ticket`. `fill` gets the
    /// slot's buffer and returns the header, or `None` to cancel the event.
    #[inline(always)]
    fn fill(&self, ticket: u64, len: u32, fill: impl FnOnce(&mut Vec<u8>) -> Option<H>) {
        let slot = self.slot(ticket);
        slot.payload.with_mut(|payload| {
            // SAFETY: we hold ticket `ticket`, whose slot is free and not yet
            // published: no other thread touches its cells (see `publish`).
            let payload = unsafe { &mut *payload };
            let header = fill(payload);
            // SAFETY: as above.
            slot.header
                .with_mut(|cell| unsafe { *cell = (header, len) });
        });
    }

    /// Publishes the slot of `ticket` and wakes the receiver if it sleeps on it.
    ///
    /// Why the slot is free: the admission count never exceeds `slots`, and the
    /// receiver frees a slot (stamp `free(t + slots)`) before the Release RMW
    /// that gives back its admission. When ticket `t` is taken, tickets `0..=t`
    /// have all been admitted, and the latest of those admissions could only
    /// succeed if ticket `t - slots` had been released before it — otherwise
    /// `slots + 1` events would have been admitted and unreleased at once. That
    /// admission acquired the release, and the ticket chain (AcqRel) carries it
    /// to us, so the receiver's reads of the slot happen before our writes.
    #[inline(always)]
    fn publish(&self, ticket: u64) {
        let slot = self.slot(ticket);
        // Release: makes the header and payload visible to the receiver that
        // Acquire-loads `full(ticket)`. Acquire: if the receiver set WAIT, its
        // read of the `data` epoch happened before our bump below.
        let old = slot.stamp.swap(slot::full(ticket), Ordering::AcqRel);
        assert!(
            old & !slot::WAIT == slot::free(ticket),
            "handoff channel invariant broken: slot of ticket {ticket} had stamp {old:#x}"
        );
        if old & slot::WAIT != 0 {
            // Release: pairs with the receiver's Acquire read of the epoch.
            self.data.word().fetch_add(1, Ordering::Release);
            self.data.wake_one();
        }
    }
}

/// Spin-then-yield rounds a thread makes before it sleeps on a futex.
const SPIN_ROUNDS: u32 = 10;
/// The receiver skips the shortest spins: polling a slot the sender is still
/// writing pulls its cache line back and forth once per event, which measured
/// three to five times slower (docs/performance.md#handoff-channel) than letting a few events
/// gather first.
const RX_SPIN_FIRST: u32 = 5;

/// One round of the pre-sleep backoff: exponentially longer busy-waits, then
/// yields (the thread we wait for may be preempted on this very CPU).
#[inline]
fn spin(round: u32) {
    if round < 6 {
        for _ in 0..(1u32 << round) {
            crate::sync::spin_loop();
        }
    } else {
        crate::sync::yield_now();
    }
}

fn payload_len(len: usize) -> Option<u32> {
    u32::try_from(len).ok()
}
