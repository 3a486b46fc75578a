//! Retention inside the store: what the retention coordinator
//! (`crate::retention`) asks of a shard, and how it gets done there.
//!
//! An active shard has exactly one writer (R8), so the coordinator cannot
//! delete rows itself: it leaves a request with the shard's writer
//! ([`control`]), which runs it between two commits ([`after_commit`], the
//! writer's one hook) with the bounded statements of [`trim`]. A historical
//! shard has no writer; the coordinator's own connection is its only one
//! and runs the same statements.
//!
//! Age is judged by [`marks`], commit times kept with the rows on
//! eventd's own [`reckoning`] of time, which a step of the wall clock does
//! not move.

pub mod control;
pub mod floors;
pub mod marks;
pub mod reckoning;
pub mod trim;

pub use control::{CallError, Reply, Request, WriterControl};
pub use floors::ExportFloors;
pub use trim::{Exported, Keep};

/// The writer's hook after each commit: runs retention's waiting request,
/// if one waits (and was not withdrawn), on the writer's connection, and
/// leaves the answer. `what` names the shard in an error.
pub fn after_commit(
    conn: &mut rusqlite::Connection,
    control: &WriterControl,
    what: &std::path::Path,
    zones: &crate::store::zones::ZoneMaps,
) {
    if let Some((id, request)) = control.take() {
        let result = control::execute(conn, &request, what, zones)
            .map_err(|e| format!("shard database {}: {request:?}: {e}", what.display()));
        control.answer(id, result);
    }
}
