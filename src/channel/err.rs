//! What can go wrong: building a channel, sending into it, receiving from it.
//! Every send error leaves the event with the caller (crossbeam's `err.rs`
//! does the same).

use super::{BYTES_MAX, SLOTS_MAX};

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
