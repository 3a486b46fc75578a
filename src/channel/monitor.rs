//! Reading a channel's occupancy and stall counters from outside the data
//! path (`eventctl stats`, metrics, the load harness).

use super::{Capacity, HandoffChannel};
use crate::sync::Arc;

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

/// Reads a channel's counters for monitoring.
pub struct ChannelMonitor<H> {
    pub(super) chan: Arc<HandoffChannel<H>>,
}

impl<H> ChannelMonitor<H> {
    pub fn stats(&self) -> ChannelStats {
        self.chan.stats()
    }
}
