//! Deleting a shard's oldest events and gaps, a bounded transaction at a
//! time, and what a forced deletion of events not exported yet leaves: an
//! `unexported` gap and the rings' counts lowered.

use super::older::Older;
use super::receipts::delete_dead_receipts;
use crate::store::retention::{marks, reckoning};
use rusqlite::{params, Connection, Transaction};

/// What one [`trim`] transaction deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    pub events: u64,
    /// Payload bytes of the deleted events (provider, name, message, fields).
    pub event_bytes: u64,
    /// Of `events`, those the export stage had not sent yet (a forced
    /// deletion; each is counted in an `unexported` gap row).
    pub unexported: u64,
    pub gaps: u64,
    pub receipts: u64,
    /// Rows older than the cutoff are left: call again.
    pub more: bool,
}

/// How far the export stage has got in one shard file: every row with an
/// id at or below these is in the cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exported {
    pub events: i64,
    pub gaps: i64,
}

/// What a [`trim`] must leave for the export stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    /// `None`: export is off, every old row may go.
    pub exported: Option<Exported>,
    /// The size limit forces the deletion: old events not exported yet go
    /// too, and their loss is stored as `unexported` gap rows (which the
    /// export stage sends like any gap). Without it, such events stay
    /// until they are exported. Gaps not exported yet always stay.
    pub forced: bool,
}

/// The `reason` of the gap rows a forced deletion of events not exported
/// yet leaves (see [`Keep::forced`]).
pub const UNEXPORTED_REASON: &str = "unexported";

/// Deletes, in one transaction, at most `max_rows` of the oldest events
/// that are `older`; once none are left, the gaps and the receipts of
/// epochs not in `live_epochs` that are `older` (at most `max_rows` of
/// each; no receipt at all when `live_epochs` is `None`, that is, when the
/// rings that exist are not all known). What `keep` says stays (see
/// [`Keep`]). A trim by commit time first gives the rows no mark covers
/// yet a mark at this moment ([`marks::cover`]); once it has nothing more
/// to delete, the marks older than its time are folded into one
/// ([`marks::fold`]).
///
/// The row with the highest id of `events` and of `gaps` is never deleted:
/// SQLite gives a new row the highest id plus one, so with that row kept
/// an id is never used twice, and a reader that remembers an id (the
/// export stage, a follow) never mistakes a new row for one it has seen.
pub fn trim(
    conn: &mut Connection,
    older: Older,
    max_rows: u64,
    live_epochs: Option<&[u64]>,
    keep: Keep,
) -> rusqlite::Result<Trimmed> {
    let limit = max_rows.max(1) as i64;
    // Exported through: i64::MAX when export is off.
    let (events_through, gaps_through) = keep
        .exported
        .map_or((i64::MAX, i64::MAX), |e| (e.events, e.gaps));
    let events_floor = if keep.forced {
        i64::MAX
    } else {
        events_through
    };
    let tx = conn.transaction()?;
    let rule = older.rule(&tx)?;
    let mut done = Trimmed::default();
    let (old, order) = rule.sql("ts");
    let batch = format!(
        "SELECT * FROM events WHERE {old} AND id <= ?3 \
         AND id < (SELECT max(id) FROM events) ORDER BY {order} LIMIT ?2"
    );
    let args = params![rule.events, limit, events_floor];
    let (events, bytes): (i64, Option<i64>) = tx.query_row(
        &format!(
            "SELECT count(*), sum(length(CAST(provider AS BLOB)) + length(CAST(name AS BLOB)) \
             + length(CAST(message AS BLOB)) + ifnull(length(CAST(fields AS BLOB)), 0)) \
             FROM ({batch})"
        ),
        args,
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if events > 0 {
        if keep.forced && keep.exported.is_some() {
            done.unexported = record_unexported(&tx, &batch, args, events_through)?;
        }
        uncount_rings(&tx, &batch, args)?;
        done.events = tx.execute(
            &format!("DELETE FROM events WHERE id IN (SELECT id FROM ({batch}))"),
            args,
        )? as u64;
        done.event_bytes = bytes.unwrap_or(0) as u64;
        crate::store::zones::trim(&tx)?;
    }
    if done.events as i64 == limit {
        done.more = true;
    } else {
        let (old, order) = rule.sql("detected_at");
        done.gaps = tx.execute(
            &format!(
                "DELETE FROM gaps WHERE id IN (SELECT id FROM gaps WHERE {old} \
                 AND id <= ?3 AND id < (SELECT max(id) FROM gaps) ORDER BY {order} LIMIT ?2)"
            ),
            params![rule.gaps, limit, gaps_through],
        )? as u64;
        if let Some(live) = live_epochs {
            done.receipts = delete_dead_receipts(&tx, &rule, limit, live)? as u64;
        }
        done.more = done.gaps as i64 == limit || done.receipts as i64 == limit;
        if let (Older::Committed(before_ns), false) = (older, done.more) {
            marks::fold(&tx, before_ns)?;
        }
    }
    tx.commit()?;
    Ok(done)
}

/// Stores one `unexported` gap row per ring epoch and cpu for the events of
/// `batch` with ids above `through` (about to be deleted unexported): their
/// count as `lost`, their lowest and highest sequence numbers, the oldest
/// timestamp as `ts_before`. Returns how many events that covers.
fn record_unexported(
    tx: &Transaction<'_>,
    batch: &str,
    args: &[&dyn rusqlite::ToSql],
    through: i64,
) -> rusqlite::Result<u64> {
    let now = crate::rings::now_ns();
    let lost: i64 = tx.query_row(
        &format!("SELECT count(*) FROM ({batch}) WHERE id > {through}"),
        args,
        |r| r.get(0),
    )?;
    if lost > 0 {
        tx.execute(
            &format!(
                "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, \
                 detected_at) SELECT ring_epoch, cpu, min(seq), max(seq), count(*), \
                 '{UNEXPORTED_REASON}', min(ts), {now} FROM ({batch}) WHERE id > {through} \
                 GROUP BY ring_epoch, cpu"
            ),
            args,
        )?;
        // The new gap rows are committed now.
        marks::record(tx, reckoning::now_ns())?;
    }
    Ok(lost as u64)
}

/// Takes the events of `batch`, about to be deleted, off the file's ring
/// counts (`store::schema::ring_counts`), in the same transaction.
fn uncount_rings(
    tx: &Transaction<'_>,
    batch: &str,
    args: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare(&format!(
        "SELECT ring_epoch, cpu, count(*) FROM ({batch}) GROUP BY ring_epoch, cpu"
    ))?;
    let rings = stmt
        .query_map(args, |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, u32>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (ring_epoch, cpu, n) in rings {
        crate::store::schema::count_ring_events(tx, ring_epoch, cpu, -n, 0, 0)?;
    }
    Ok(())
}
