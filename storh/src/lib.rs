//! storh: embedded storage in plain files.
//!
//! - [`docstore`]: one JSONC file per record, in 256 buckets chosen by the
//!   record id's random characters, with atomic durable writes and an O(1)
//!   open guarded by an OS lock and a clean/dirty state.
//! - [`log`]: a segmented log (segment files of at most 1 MiB, reads by
//!   offset, CRC32 per record, torn tails cut on open).
//! - [`queue`]: events in one `queue.log`, named consumers that read and
//!   acknowledge, positions that survive a restart.
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
pub mod record;
