//! Receipts: those of ring epochs whose ring is gone are deleted once old;
//! those of live rings are compacted into one summary row that recovery
//! reads as it read the rows it replaces.

use super::older::Rule;
use crate::store::retention::{marks, reckoning};
use crate::store::rows::{Receipt, INSERT_RECEIPT};
use rusqlite::{params, Connection, Transaction};

pub(super) fn delete_dead_receipts(
    tx: &Transaction<'_>,
    rule: &Rule,
    limit: i64,
    live_epochs: &[u64],
) -> rusqlite::Result<usize> {
    // Epochs are stored as the i64 with the same bits.
    let live: Vec<i64> = live_epochs.iter().map(|&e| e as i64).collect();
    let live = serde_json::to_string(&live).unwrap_or_else(|_| "[]".to_string());
    let (old, order) = rule.sql("committed_at");
    tx.execute(
        &format!(
            "DELETE FROM receipts WHERE id IN (SELECT id FROM receipts \
             WHERE {old} AND ring_epoch NOT IN (SELECT value FROM json_each(?3)) \
             ORDER BY {order} LIMIT ?2)"
        ),
        params![rule.receipts, limit, live],
    )
}

/// Replaces up to `max_rows` receipts of live ring `epoch` (those ending
/// first) by a single summary row, when at least `min_rows` qualify. A
/// receipt qualifies when its id is at most `old_through` (the commit
/// marks say which receipts were committed minutes ago, by eventd's
/// reckoning: [`marks::through`]) and it ends below `W`, the highest
/// watermark among this database's receipts up to `old_through`. Returns
/// how many rows were removed (the summary not counted).
///
/// Why recovery reads the same thing afterwards (`store::recovery`):
/// - With watermarks, it takes the highest `committed_through` (the summary
///   keeps the highest it replaces, so the maximum is unchanged) and reads
///   the receipts with `last_seq` at or above it, none of which were
///   replaced (all of them end below this database's `W`, which is at most
///   the global one).
/// - Merging every receipt (after a power cut), the summary covers from the
///   first replaced sequence to the last: every sequence in between is at or
///   below `W`, so committed in some database, and its run is either in a
///   summary or still a row. The merged coverage is the same. The summary
///   keeps the resume position of the run it ends with.
///
/// `W` must count only commits that survive a power cut. It is taken from
/// receipts committed minutes ago (by eventd's reckoning, which a step of
/// the wall clock does not move), so the commits it counts returned minutes
/// ago and their WAL frames have reached the disk; a younger watermark
/// could count another shard's commit that a power cut then takes back,
/// and the summary would hide that hole.
pub fn compact_receipts(
    conn: &mut Connection,
    epoch: u64,
    old_through: i64,
    min_rows: u64,
    max_rows: u64,
) -> rusqlite::Result<u64> {
    let epoch = epoch as i64;
    let tx = conn.transaction()?;
    let watermark: Option<i64> = tx.query_row(
        "SELECT max(committed_through) FROM receipts WHERE ring_epoch = ?1 AND id <= ?2",
        params![epoch, old_through],
        |r| r.get(0),
    )?;
    let Some(watermark) = watermark else {
        return Ok(0);
    };
    let batch = "SELECT * FROM receipts WHERE ring_epoch = ?1 AND last_seq < ?2 \
                 AND id <= ?3 ORDER BY last_seq LIMIT ?4";
    let args = params![epoch, watermark, old_through, max_rows.max(2) as i64];
    type Summary = (i64, Option<i64>, Option<i64>, Option<i64>, Option<i64>);
    let (rows, cpu, first, last, through): Summary = tx.query_row(
        &format!(
            "SELECT count(*), min(cpu), min(first_seq), max(last_seq), max(committed_through) \
             FROM ({batch})"
        ),
        args,
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
    )?;
    let (Some(cpu), Some(first), Some(last), Some(through)) = (cpu, first, last, through) else {
        return Ok(0);
    };
    if (rows as u64) < min_rows.max(2) {
        return Ok(0);
    }
    let (position, next_seq, committed_at): (i64, i64, i64) = tx.query_row(
        &format!(
            "SELECT position, next_seq, committed_at FROM ({batch}) ORDER BY last_seq DESC LIMIT 1"
        ),
        args,
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let removed = tx.execute(
        &format!("DELETE FROM receipts WHERE id IN (SELECT id FROM ({batch}))"),
        args,
    )?;
    let summary = Receipt {
        ring_epoch: epoch as u64,
        cpu: cpu as u32,
        first_seq: first as u64,
        last_seq: last as u64,
        position: position as u64,
        next_seq: next_seq as u64,
        committed_through: through as u64,
        committed_at,
    };
    let mut insert = tx.prepare_cached(INSERT_RECEIPT)?;
    summary.insert(&mut insert)?;
    drop(insert);
    // The summary row is committed now.
    marks::record(&tx, reckoning::now_ns())?;
    tx.commit()?;
    Ok(removed as u64)
}
