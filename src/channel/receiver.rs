//! The receiving side, owned by the shard writer: batch receives, the
//! release of consumed capacity, and the receiver's sleep.

use super::{
    admission, slot, spin, Capacity, ChannelMonitor, ChannelStats, HandoffChannel, RecvError,
    TryRecvError, RX_SPIN_FIRST, SPIN_ROUNDS,
};
use crate::sync::{Arc, Ordering};
use std::fmt;

/// The receiving side, owned by the shard writer.
pub struct Receiver<H> {
    pub(super) chan: Arc<HandoffChannel<H>>,
    /// Next ticket to read.
    pub(super) head: u64,
    /// Consumed events whose capacity has not been given back yet.
    pub(super) unreleased_count: u64,
    pub(super) unreleased_bytes: u64,
    /// Give room back after this many consumed events (see
    /// [`Receiver::set_release_every`]).
    pub(super) release_every: usize,
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
