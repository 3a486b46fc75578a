//! eventd: a per-host event collection daemon.
//!
//! Producers write events into per-CPU shared-memory rings; drain threads move
//! them through bounded handoff channels to one writer thread per SQLite shard.
//! The modules follow the data path, each depending only on those below it:
//!
//! - [`sync`]: std or loom atomics and futexes, the only place that knows loom.
//! - [`access`]: who may emit, query and read files; the modes and groups
//!   of everything eventd makes (a leaf: it depends on nothing here).
//! - [`channel`]: the handoff channel between drain threads and a shard writer.
//! - [`rings`]: the per-CPU KMES event rings, their producers and reader.
//! - [`routing`]: shard count, descriptor planning, assignment and stripes
//!   (the seed's rules R1–R5), pure functions.
//! - [`store`]: shard schema, the shard writer (the only SQLite writer),
//!   receipts and recovery.
//! - [`query`]: the fan-out reader over every shard and the query server
//!   (read-only; never touches the writers).
//! - [`syslog`]: `/dev/log`-style sockets (io_uring or recvmmsg) whose
//!   messages become events in the ring of the CPU that received them.
//! - [`config`]: the TOML configuration and the validated settings.
//! - [`metrics`]: the Prometheus text format and its optional HTTP listener.
//! - [`retention`]: the coordinator that keeps the store within its age and
//!   size limits (through the writers, R8).
//! - [`daemon`]: start-up order, drain threads, shutdown.
//! - [`errors`]: error text for the command-line tools.
//!
//! `config`, `store`, `query` and `daemon` use std threads and locks directly
//! and are left out of loom builds, which check only the lock-free core.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(not(loom))]
pub mod access;
pub mod channel;
#[cfg(not(loom))]
pub mod config;
#[cfg(not(loom))]
pub mod daemon;
#[cfg(not(loom))]
pub mod errors;
#[cfg(not(loom))]
pub mod metrics;
#[cfg(not(loom))]
pub mod query;
#[cfg(not(loom))]
pub mod retention;
pub mod rings;
pub mod routing;
#[cfg(not(loom))]
pub mod store;
pub mod sync;
#[cfg(not(loom))]
pub mod syslog;
