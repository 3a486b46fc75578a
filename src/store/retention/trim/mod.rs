//! Retention's operations on one shard database: measuring it, deleting its
//! oldest rows in bounded transactions, compacting old receipts and giving
//! free pages back to the filesystem.
//!
//! The retention coordinator decides what to delete; these functions run on
//! the connection of the database's only writer (R8): the shard writer's own
//! for an active shard, the coordinator's for a historical one.
//!
//! What is deleted, and what never is:
//! - events older than a cutoff ([`Older`]: committed before it by eventd's
//!   reckoning for the age limit, stamped before it for the size limit),
//!   oldest first, at most a given number per transaction, so that the
//!   writer's commits and the queries' reads go on between two
//!   transactions;
//! - gaps older than the cutoff;
//! - receipts of ring epochs whose ring no longer exists, older than the
//!   cutoff;
//! - receipts of live rings are never deleted outright: old ones are
//!   replaced by one summary row that recovery reads exactly as it read the
//!   rows it replaces (see [`compact_receipts`]).
//!
//! The parts: `older` says which rows are old, `delete` trims events and
//! gaps in bounded transactions (and what a forced deletion leaves
//! behind), `receipts` deletes dead rings' receipts and compacts live
//! rings' ones, `space` measures a shard and gives its free pages back.

mod delete;
mod older;
mod receipts;
mod space;

pub use self::delete::{trim, Exported, Keep, Trimmed, UNEXPORTED_REASON};
pub use self::older::Older;
pub use self::receipts::compact_receipts;
pub use self::space::{cutoff_after, measure, vacuum, ShardUsage};

#[cfg(test)]
mod tests;
