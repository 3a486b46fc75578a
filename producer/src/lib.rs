//! The producer side of eventd's KMES rings, without the daemon.
//!
//! - [`rings`]: the ring format, the lock-free writer ([`rings::Emitter`]),
//!   field encoding, the per-thread ring cache and fork handling
//!   ([`rings::client`]), and the reader the daemon drains with (it shares
//!   the ring's memory and format).
//! - [`access`]: file modes and groups of the rings' directory and files.
//! - [`sync`]: std or loom atomics and futexes, the only place that knows loom.
//!
//! The daemon (`eventd`), `eventd-tracing` and libeventd all emit through
//! this crate; it depends on nothing but libc, thiserror and tracing.

#[cfg(not(loom))]
pub mod access;
pub mod rings;
pub mod sync;
