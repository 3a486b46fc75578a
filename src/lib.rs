//! eventd: a per-host event collection daemon.
//!
//! Producers write events into per-CPU shared-memory rings; drain threads move
//! them through bounded handoff channels to one writer thread per SQLite shard.
//! The modules follow the data path, each depending only on those below it:
//!
//! - [`sync`]: std or loom atomics and futexes, the only place that knows loom
//!   (from the `eventd-producer` crate).
//! - [`access`]: who may emit, query and read files; the modes and groups
//!   of everything eventd makes (a leaf, from `eventd-producer`).
//! - [`channel`]: the handoff channel between drain threads and a shard writer.
//! - [`rings`]: the per-CPU KMES event rings, their producers and reader
//!   (the `eventd-producer` crate, which programs that only emit use
//!   without the daemon).
//! - [`routing`]: shard count, descriptor planning, assignment and stripes
//!   (the seed's rules R1–R5), pure functions.
//! - [`drain`]: the drain threads, the items they hand a shard writer, the
//!   commit tracking they share with the writers, their ring health checks.
//! - [`store`]: shard files, their schema and row shapes, the shard writers
//!   (the only SQLite writers), receipts and recovery, retention's work in
//!   a shard.
//! - [`export`]: exactly-once export of every committed event and gap
//!   into a ClickHouse cluster, and the fleet queries over it (reads the
//!   shards read-only, beside the write path).
//! - [`query`]: the fan-out reader over every shard and the query server
//!   (read-only; never touches the writers).
//! - [`syslog`]: `/dev/log`-style sockets (io_uring or recvmmsg) whose
//!   messages become events in eventd's own syslog ring.
//! - [`trusted`]: what eventd knows of a sender from the kernel and
//!   `/proc` (pid, uid, gid, command, executable, systemd unit, boot),
//!   which the sender cannot forge.
//! - [`stream`]: the service-output socket (`eventctl run`, journald's
//!   stdout streams): each line of a command's stdout and stderr an event
//!   in eventd's syslog ring.
//! - [`kmsg`]: the kernel log (`/dev/kmsg`) into eventd's own kernel ring,
//!   exactly once across restarts within a boot.
//! - [`config`]: the TOML configuration and the validated settings.
//! - [`metrics`]: the Prometheus text format and its optional HTTP listener.
//! - [`retention`]: the coordinator that keeps the store within its age and
//!   size limits (through the writers, R8).
//! - [`daemon`]: start-up as a list of named steps, the state shared with
//!   monitoring, shutdown.
//! - [`errors`]: error text for the command-line tools.
//! - [`version`]: the version line of both binaries (commit, profile).
//!
//! Beside them, leaves any stage may use: [`threads`] (watched threads
//! and the failure hook), [`access`] (above) and [`redact`] (credentials
//! kept out of shown text). `docs/design/architecture.md`
//! follows one event through these modules, file by file.
//!
//! Everything but `sync`, `channel`, `rings` and `routing` uses std threads
//! and locks directly and is left out of loom builds, which check only the
//! lock-free core.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(not(loom))]
pub use eventd_producer::access;
pub mod channel;
#[cfg(not(loom))]
pub mod config;
#[cfg(not(loom))]
pub mod daemon;
#[cfg(not(loom))]
pub mod drain;
#[cfg(not(loom))]
pub mod errors;
#[cfg(not(loom))]
pub mod export;
#[cfg(not(loom))]
pub mod kmsg;
#[cfg(not(loom))]
pub mod metrics;
#[cfg(not(loom))]
pub mod query;
#[cfg(not(loom))]
pub mod redact;
#[cfg(not(loom))]
pub mod retention;
pub use eventd_producer::rings;
pub mod routing;
#[cfg(not(loom))]
pub mod store;
#[cfg(not(loom))]
pub mod stream;
pub use eventd_producer::sync;
#[cfg(not(loom))]
pub mod syslog;
#[cfg(not(loom))]
pub mod threads;
#[cfg(not(loom))]
pub mod trusted;
pub mod version;
