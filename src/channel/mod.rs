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
mod slot;
#[cfg(all(test, not(loom)))]
mod tests;

use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Futex, Ordering};
use crossbeam_utils::CachePadded;
use slot::Slot;
use std::fmt;

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

/// The fixed header carried beside every payload.
///
/// The channel itself accepts any `Copy` header type; this is the one the data
/// path uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventHeader {
    /// Epoch id of the ring the event came from.
    pub ring_epoch: u64,
    /// Sequence number of the event in its ring.
    pub seq: u64,
    /// Event timestamp, nanoseconds since the Unix epoch.
    pub ts_ns: i64,
    /// Logical CPU id of the ring.
    pub cpu: u32,
    /// What the payload is (event, gap report, control message).
    pub kind: u32,
}

/// A channel could not be built with the given capacity.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapacityError {
    #[error("channel slot count {0} is not a power of two in 1..={SLOTS_MAX}")]
    Slots(usize),
    #[error("channel byte budget {0} is not in 1..={BYTES_MAX}")]
    Bytes(u64),
}

/// A blocking send failed; the caller still holds the event.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    #[error("the receiving shard writer is gone")]
    Disconnected,
    #[error("event payload of {0} bytes exceeds the 4 GiB limit of one event")]
    TooLarge(usize),
}

/// A non-blocking send failed; the caller still holds the event.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrySendError {
    #[error("channel is full")]
    Full,
    #[error("the receiving shard writer is gone")]
    Disconnected,
    #[error("event payload of {0} bytes exceeds the 4 GiB limit of one event")]
    TooLarge(usize),
}

/// Every sender is gone and every event has been received.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("all senders are gone and the channel is drained")]
pub struct RecvError;

/// A non-blocking receive found nothing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TryRecvError {
    #[error("no event is ready")]
    Empty,
    #[error("all senders are gone and the channel is drained")]
    Disconnected,
}

/// A snapshot of a channel's occupancy and stall counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelStats {
    pub capacity: Capacity,
    /// Events admitted and not yet released by the receiver.
    pub occupied_slots: u64,
    /// Payload bytes admitted and not yet released.
    pub occupied_bytes: u64,
    /// Blocking sends that found the channel full and had to wait.
    pub full_stalls: u64,
    /// Times the receiver went to sleep on an empty channel.
    pub receiver_sleeps: u64,
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
/// three to five times slower (docs/performance.md) than letting a few events
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

/// The sending side; clone it for every drain thread that feeds this shard.
pub struct Sender<H> {
    chan: Arc<HandoffChannel<H>>,
}

impl<H: Copy + Send> Sender<H> {
    /// Sends one event, waiting while the channel is full.
    pub fn send(&self, header: H, payload: &[u8]) -> Result<(), SendError> {
        let len = payload_len(payload.len()).ok_or(SendError::TooLarge(payload.len()))?;
        let ticket = self.chan.admit(len, true).map_err(|e| match e {
            TrySendError::Disconnected => SendError::Disconnected,
            // A blocking admission only returns once admitted or closed.
            TrySendError::Full | TrySendError::TooLarge(_) => unreachable!(),
        })?;
        self.write(ticket, len, header, payload);
        Ok(())
    }

    /// Sends one event if there is room now.
    pub fn try_send(&self, header: H, payload: &[u8]) -> Result<(), TrySendError> {
        let len = payload_len(payload.len()).ok_or(TrySendError::TooLarge(payload.len()))?;
        let ticket = self.chan.admit(len, false)?;
        self.write(ticket, len, header, payload);
        Ok(())
    }

    #[inline(always)]
    fn write(&self, ticket: u64, len: u32, header: H, payload: &[u8]) {
        self.chan.fill(ticket, len, |buf| {
            buf.clear();
            buf.extend_from_slice(payload);
            Some(header)
        });
        self.chan.publish(ticket);
    }

    /// Reserves room for an event of `len` bytes, waiting while the channel is
    /// full, before anything is copied. The permit then fills the slot in place.
    pub fn reserve(&self, len: usize) -> Result<SendPermit<'_, H>, SendError> {
        let len32 = payload_len(len).ok_or(SendError::TooLarge(len))?;
        match self.chan.admit(len32, true) {
            Ok(ticket) => Ok(SendPermit {
                chan: &self.chan,
                ticket,
                len: len32,
                published: false,
            }),
            Err(TrySendError::Disconnected) => Err(SendError::Disconnected),
            // A blocking admission only returns once admitted or closed.
            Err(TrySendError::Full | TrySendError::TooLarge(_)) => unreachable!(),
        }
    }

    /// Reserves room for an event of `len` bytes if there is room now.
    pub fn try_reserve(&self, len: usize) -> Result<SendPermit<'_, H>, TrySendError> {
        let len32 = payload_len(len).ok_or(TrySendError::TooLarge(len))?;
        let ticket = self.chan.admit(len32, false)?;
        Ok(SendPermit {
            chan: &self.chan,
            ticket,
            len: len32,
            published: false,
        })
    }

    /// The channel's fixed capacity.
    pub fn capacity(&self) -> Capacity {
        self.chan.capacity
    }

    pub fn stats(&self) -> ChannelStats {
        self.chan.stats()
    }
}

impl<H> Clone for Sender<H> {
    fn clone(&self) -> Self {
        // Relaxed: a new sender is made from a live one, so the count cannot
        // reach zero meanwhile; nothing else is published by the increment.
        self.chan.senders.fetch_add(1, Ordering::Relaxed);
        Sender {
            chan: self.chan.clone(),
        }
    }
}

impl<H> Drop for Sender<H> {
    fn drop(&mut self) {
        // AcqRel: the last sender acquires every other sender's publications
        // (each released them with its own decrement) and passes them on with
        // the Release store below.
        if self.chan.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.chan.senders_gone.store(true, Ordering::Release);
            // Release: a receiver that reads this bump also sees the flag.
            self.chan.data.word().fetch_add(1, Ordering::Release);
            self.chan.data.wake_one();
        }
    }
}

impl<H> fmt::Debug for Sender<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("capacity", &self.chan.capacity)
            .finish_non_exhaustive()
    }
}

/// Room for one event, reserved in both bounds; fill it with
/// [`commit_with`](Self::commit_with). Dropping it unfilled cancels the event:
/// the receiver skips it and gives its room back.
pub struct SendPermit<'a, H> {
    chan: &'a HandoffChannel<H>,
    ticket: u64,
    len: u32,
    published: bool,
}

impl<H> SendPermit<'_, H> {
    /// The payload length reserved.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Fills the reserved payload in place and publishes the event with the
    /// header `fill` returns. If `fill` fails, the event is cancelled and the
    /// error returned.
    pub fn commit_with<E>(mut self, fill: impl FnOnce(&mut [u8]) -> Result<H, E>) -> Result<(), E> {
        let mut outcome = Ok(());
        let len = self.len as usize;
        self.chan.fill(self.ticket, self.len, |buf| {
            buf.clear();
            buf.resize(len, 0);
            match fill(buf) {
                Ok(header) => Some(header),
                Err(e) => {
                    outcome = Err(e);
                    None
                }
            }
        });
        self.published = true;
        self.chan.publish(self.ticket);
        outcome
    }
}

impl<H> Drop for SendPermit<'_, H> {
    fn drop(&mut self) {
        if !self.published {
            self.chan.fill(self.ticket, self.len, |_| None);
            self.chan.publish(self.ticket);
        }
    }
}

/// Reads a channel's counters for monitoring.
pub struct ChannelMonitor<H> {
    chan: Arc<HandoffChannel<H>>,
}

impl<H> ChannelMonitor<H> {
    pub fn stats(&self) -> ChannelStats {
        self.chan.stats()
    }
}

/// The receiving side, owned by the shard writer.
pub struct Receiver<H> {
    chan: Arc<HandoffChannel<H>>,
    /// Next ticket to read.
    head: u64,
    /// Consumed events whose capacity has not been given back yet.
    unreleased_count: u64,
    unreleased_bytes: u64,
    /// Give room back after this many consumed events (see
    /// [`Receiver::set_release_every`]).
    release_every: usize,
}

impl<H: Copy + Send> Receiver<H> {
    /// Waits until at least one event is ready, then hands `f` every ready event
    /// (at most `max`) in order, giving their room back as it goes. Returns how
    /// many events `f` saw, or `RecvError` once all senders are gone and nothing
    /// is left.
    pub fn recv_batch(
        &mut self,
        max: usize,
        mut f: impl FnMut(&H, &[u8]),
    ) -> Result<usize, RecvError> {
        loop {
            self.wait_ready()?;
            let seen = self.consume_ready(max, &mut f);
            if seen > 0 {
                return Ok(seen);
            }
            // Only cancelled reservations were ready; wait for real events.
        }
    }

    /// Like [`recv_batch`](Self::recv_batch) but never sleeps.
    ///
    /// Gives back all the room of consumed events when it finds nothing.
    pub fn try_recv_batch(
        &mut self,
        max: usize,
        mut f: impl FnMut(&H, &[u8]),
    ) -> Result<usize, TryRecvError> {
        let seen = self.consume_ready(max, &mut f);
        if seen > 0 {
            return Ok(seen);
        }
        self.release();
        // Acquire: pairs with the last sender's Release store, which carries
        // every publication; so a slot still not full now never will be.
        if self.chan.senders_gone.load(Ordering::Acquire) {
            let seen = self.consume_ready(max, &mut f);
            return if seen > 0 {
                Ok(seen)
            } else {
                Err(TryRecvError::Disconnected)
            };
        }
        Err(TryRecvError::Empty)
    }

    /// Gives back the room of every event consumed so far at once. Room is
    /// otherwise returned in groups (and always before the receiver sleeps or
    /// finds the channel empty); a writer calls this before a long pause, such
    /// as a commit, so senders are not kept waiting for room already free.
    pub fn release_consumed(&mut self) {
        self.release();
    }

    pub fn capacity(&self) -> Capacity {
        self.chan.capacity
    }

    /// Gives room back after `events` consumed events (clamped to
    /// `1..=slots`) instead of the default `min(32, slots/8)`. Room is still
    /// given back whenever the receiver finds the channel empty, before it
    /// sleeps, and on [`release_consumed`](Self::release_consumed), so no
    /// sender waits for room that a sleeping receiver holds. A receiver that
    /// copies a whole batch out and then works for a long time (a shard
    /// writer) sets this to the slot count: senders then wake once per batch
    /// instead of once per 32 events.
    pub fn set_release_every(&mut self, events: usize) {
        self.release_every = events.clamp(1, self.chan.capacity.slots);
    }

    pub fn stats(&self) -> ChannelStats {
        self.chan.stats()
    }

    /// A handle that reads the channel's counters without being a sender or
    /// the receiver (it keeps neither side alive).
    pub fn monitor(&self) -> ChannelMonitor<H> {
        ChannelMonitor {
            chan: self.chan.clone(),
        }
    }

    #[inline(always)]
    fn head_is_full(&self) -> bool {
        // Acquire: pairs with the sender's Release swap so its header and
        // payload are visible.
        self.chan.slot(self.head).stamp.load(Ordering::Acquire) == slot::full(self.head)
    }

    /// Returns once the slot at `head` is published, or with `RecvError` when
    /// all senders are gone and it never will be.
    fn wait_ready(&mut self) -> Result<(), RecvError> {
        if self.head_is_full() {
            return Ok(());
        }
        if crate::sync::SPIN_BEFORE_SLEEP {
            for round in RX_SPIN_FIRST..SPIN_ROUNDS {
                spin(round);
                if self.head_is_full() {
                    return Ok(());
                }
            }
        }
        self.sleep_for_data()
    }

    #[cold]
    fn sleep_for_data(&mut self) -> Result<(), RecvError> {
        // A sender may be waiting for exactly this room.
        self.release();
        let slot = self.chan.slot(self.head);
        let free = slot::free(self.head);
        loop {
            // The epoch is read before the stamp we decide on; see the module
            // docs. Acquire pairs with the Release bumps.
            let epoch = self.chan.data.word().load(Ordering::Acquire);
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == slot::full(self.head) {
                return Ok(());
            }
            if stamp == free {
                // AcqRel: Release so the sender's swap that reads WAIT orders
                // our epoch read before its bump; Acquire on failure because the
                // slot may just have been published.
                if slot
                    .stamp
                    .compare_exchange(free, free | slot::WAIT, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
            }
            // Acquire: pairs with the last sender's Release store.
            if self.chan.senders_gone.load(Ordering::Acquire) {
                // Every publication is visible now; one last look.
                return if self.head_is_full() {
                    Ok(())
                } else {
                    Err(RecvError)
                };
            }
            // Relaxed: a statistic.
            self.chan.receiver_sleeps.fetch_add(1, Ordering::Relaxed);
            self.chan.data.wait(epoch);
        }
    }

    /// Hands every ready event (at most `max`, counting cancelled ones) to `f`.
    /// Returns how many `f` saw.
    fn consume_ready(&mut self, max: usize, f: &mut impl FnMut(&H, &[u8])) -> usize {
        let mut seen = 0;
        let mut taken = 0;
        while taken < max && self.head_is_full() {
            let slot = self.chan.slot(self.head);
            // SAFETY: the stamp is `full(head)`, so the sender is done with the
            // slot and no sender touches it until we store `free(head + slots)`.
            let (header, len) = slot.header.with(|cell| unsafe { *cell });
            slot.payload.with_mut(|payload| {
                // SAFETY: as above; the receiver is the only reader.
                let payload = unsafe { &mut *payload };
                if let Some(header) = header {
                    debug_assert_eq!(payload.len(), len as usize);
                    f(&header, payload);
                    seen += 1;
                }
                if payload.capacity() > self.chan.keep_bytes {
                    // Do not keep a huge buffer for the rest of the run.
                    *payload = Vec::new();
                }
            });
            // Release: our reads of the slot happen before the next sender's
            // writes (it acquires the admission release that follows).
            slot.stamp.store(
                slot::free(self.head + self.chan.capacity.slots as u64),
                Ordering::Release,
            );
            self.head += 1;
            taken += 1;
            self.unreleased_count += 1;
            self.unreleased_bytes += u64::from(len);
            if self.unreleased_count as usize >= self.release_every {
                self.release();
            }
        }
        seen
    }

    /// Gives the room of consumed events back and wakes senders sleeping for it.
    fn release(&mut self) {
        if self.unreleased_count == 0 {
            return;
        }
        let amount = admission::pack(self.unreleased_count, self.unreleased_bytes);
        self.unreleased_count = 0;
        self.unreleased_bytes = 0;
        // Release: the slots freed above are free before any sender can be
        // admitted into the room given back. Acquire: a sender that set
        // WAITERS read its epoch before we bump it.
        let old = self.chan.admission.fetch_sub(amount, Ordering::AcqRel);
        if old & admission::WAITERS != 0 {
            // AcqRel: as above, for a sender that set WAITERS after our
            // subtraction; this clears the flag for every current sleeper.
            self.chan
                .admission
                .fetch_and(!admission::WAITERS, Ordering::AcqRel);
            // Release: pairs with the sleeper's Acquire epoch read.
            self.chan.space.word().fetch_add(1, Ordering::Release);
            self.chan.space.wake_all();
        }
    }
}

impl<H> Drop for Receiver<H> {
    fn drop(&mut self) {
        // AcqRel: a sender that announced sleep before this read its epoch
        // before our bump; one after it sees CLOSED.
        self.chan
            .admission
            .fetch_or(admission::CLOSED, Ordering::AcqRel);
        // Release: pairs with the sleeper's Acquire epoch read.
        self.chan.space.word().fetch_add(1, Ordering::Release);
        self.chan.space.wake_all();
    }
}

impl<H> fmt::Debug for Receiver<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("capacity", &self.chan.capacity)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}
