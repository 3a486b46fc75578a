//! storh: embedded storage in plain files.
//!
//! - [`docstore`]: one JSONC file per record, in 256 buckets chosen by the
//!   record id's random characters, with atomic durable writes and an O(1)
//!   open guarded by an OS lock and a clean/dirty state.
//! - [`log`]: a segmented log (segment files of at most 1 MiB, reads by
//!   offset, one writer under an OS lock, readers alongside).
//! - [`queue`]: events in one `queue.log`, named consumers that read and
//!   acknowledge, positions that survive a restart.
//! - [`record`]: the log's and the queue's file format (a versioned file
//!   header, per-record magic and a checksum over offset, length and
//!   payload) and the recovery rule: a torn tail is cut, damage in the
//!   middle is reported and stepped over, offsets never change.
//! - [`verify`]: the log's and the queue's check of every kind of damage.
//! - [`id`]: UUIDv7 ids whose bucket characters are random, ordered within
//!   a process.
//!
//! The DocStore has `insert`/`put`/`update`/`get`/`delete`, `stream()`
//! pages in id order, secondary indexes on declared fields (`find`,
//! `range`), `verify()` and `reindex()`; the indexes live in memory and in a
//! journal ([`index`]) whose unfinished writes are re-checked after a
//! crash. The `storh` binary (feature `cli`, on by default) drives all of
//! it from the shell.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod docstore;
pub mod id;
pub mod index;
pub mod log;
pub mod queue;
mod recfile;
pub mod record;
pub mod verify;
mod writer_lock;

pub use recfile::{Range, Repair};
