//! Which rows are old: [`Older`], and the condition it makes on each table
//! ([`Rule`]), shared by the deletion of events and gaps and of receipts.

use crate::store::retention::{marks, reckoning};
use rusqlite::Transaction;

/// Which rows a [`trim`](super::trim) deletes: those older than a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Older {
    /// Committed before this time by eventd's reckoning ([`marks`]): the
    /// age limit. Neither a producer's clock (`events.ts`) nor a step of
    /// the wall clock decides. Deleted in commit order (by id).
    Committed(i64),
    /// Stamped before this time by their own column (`events.ts`,
    /// `gaps.detected_at`, `receipts.committed_at`): the size limit, which
    /// takes the events with the oldest timestamps first.
    Stamped(i64),
}

/// [`Older`] as each table's condition on `?1`.
pub(super) struct Rule {
    by_id: bool,
    pub(super) events: i64,
    pub(super) gaps: i64,
    pub(super) receipts: i64,
}

impl Older {
    pub(super) fn rule(self, tx: &Transaction<'_>) -> rusqlite::Result<Rule> {
        Ok(match self {
            Older::Committed(before_ns) => {
                // Rows committed since the newest mark get one now.
                marks::cover(tx, reckoning::now_ns())?;
                let t = marks::through(tx, before_ns)?;
                Rule {
                    by_id: true,
                    events: t.events,
                    gaps: t.gaps,
                    receipts: t.receipts,
                }
            }
            Older::Stamped(before_ns) => Rule {
                by_id: false,
                events: before_ns,
                gaps: before_ns,
                receipts: before_ns,
            },
        })
    }
}

impl Rule {
    /// The condition on `?1` and the order, for a table whose own time
    /// column is `time`.
    pub(super) fn sql(&self, time: &'static str) -> (String, &'static str) {
        if self.by_id {
            ("id <= ?1".to_string(), "id")
        } else {
            (format!("{time} < ?1"), time)
        }
    }
}
