//! The sending side: blocking and non-blocking sends, and the two-step
//! reserve-then-fill permit the drains use to copy a record straight into
//! its slot.

use super::{payload_len, Capacity, ChannelStats, HandoffChannel, SendError, TrySendError};
use crate::sync::{Arc, Ordering};
use std::fmt;

/// The sending side; clone it for every drain thread that feeds this shard.
pub struct Sender<H> {
    pub(super) chan: Arc<HandoffChannel<H>>,
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
