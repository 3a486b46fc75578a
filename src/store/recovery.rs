//! Recovery: where each ring's drain resumes, from the receipts in every
//! shard database of the store directory (R6: receipts, not re-computed
//! routing, are the authority; R12: old shards count too).
//!
//! For one ring epoch the plan is found in two steps:
//! 1. `W` = the highest `committed_through` of any receipt: every sequence
//!    at or below it was committed somewhere.
//! 2. Receipts with `last_seq >= W` are merged in sequence order from `W`
//!    on; the first hole is where the drain resumes (the position stored in
//!    the receipt that ends just before it). Runs above the hole are already
//!    committed: the drain skips them when it reads them again.

use super::open::open_read_only;
use super::rows::{Receipt, RECEIPT_COLUMNS};
use super::StoreError;
use super::StoreHealth;
use crate::drain::RingPlan;
use crate::rings::ReadPosition;
use crate::rings::Ring;
use rusqlite::{Connection, OptionalExtension};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Read-only connections to every shard database, for recovery.
pub struct ReceiptReader {
    shards: Vec<(PathBuf, Connection)>,
    /// Whether stored watermarks may be trusted (see [`ReceiptReader::plan`]).
    trust_watermarks: bool,
}

fn unreadable(path: &Path, source: rusqlite::Error) -> StoreError {
    StoreError::Recovery {
        path: path.to_path_buf(),
        source,
    }
}

impl ReceiptReader {
    /// Opens every path read-only. A database without a receipts table (not
    /// written by eventd) has nothing to say and is left out. So are, with
    /// the reason returned beside the reader, a file eventd cannot trust
    /// (another user's, or a symlink: its receipts could claim that events
    /// of eventd's rings were stored, which would make eventd skip them) and
    /// one that cannot be read (damaged: its events may be drained a second
    /// time into a good file, which is better than collecting nothing).
    ///
    /// `trust_watermarks` is false after an unclean stop in an earlier boot
    /// (a power cut): each shard's WAL reached the disk on its own schedule,
    /// so one shard's watermark may count commits another shard lost.
    pub fn open(paths: &[PathBuf], trust_watermarks: bool) -> (Self, Vec<(PathBuf, String)>) {
        let mut shards = Vec::new();
        let mut left_out = Vec::new();
        for path in paths {
            let meta = match std::fs::symlink_metadata(path) {
                Ok(m) => m,
                Err(e) => {
                    left_out.push((path.clone(), e.to_string()));
                    continue;
                }
            };
            if let Some(why) = crate::access::files::untrusted(&meta) {
                left_out.push((path.clone(), format!("not trusted: {why}")));
                continue;
            }
            let opened = open_read_only(path).and_then(|conn| {
                let has: bool = conn.query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'receipts'",
                    [],
                    |r| r.get::<_, i64>(0).map(|n| n > 0),
                )?;
                Ok(has.then_some(conn))
            });
            match opened {
                Ok(Some(conn)) => shards.push((path.clone(), conn)),
                Ok(None) => {}
                Err(e) => left_out.push((path.clone(), format!("cannot be read: {e}"))),
            }
        }
        let reader = ReceiptReader {
            shards,
            trust_watermarks,
        };
        (reader, left_out)
    }

    /// [`plan`](Self::plan) merging every receipt from the start, whatever
    /// the watermarks say: for a ring a damaged file held events of, whose
    /// watermark counts commits into that file that are gone.
    pub fn plan_from_start(&mut self, epoch: u64) -> (RingPlan, Vec<StoreError>) {
        let trust = std::mem::replace(&mut self.trust_watermarks, false);
        let planned = self.plan(epoch);
        self.trust_watermarks = trust;
        planned
    }

    /// The plan for ring epoch `epoch`. A database whose receipts cannot
    /// be read now is left out from here on (named in the error list).
    pub fn plan(&mut self, epoch: u64) -> (RingPlan, Vec<StoreError>) {
        let mut failed = Vec::new();
        let plan = loop {
            match self.try_plan(epoch) {
                Ok(plan) => break plan,
                Err((i, e)) => {
                    self.shards.remove(i);
                    failed.push(e);
                }
            }
        };
        (plan, failed)
    }

    fn try_plan(&mut self, epoch: u64) -> Result<RingPlan, (usize, StoreError)> {
        let epoch = epoch as i64;
        let mut watermark = 0u64;
        if self.trust_watermarks {
            for (i, (path, conn)) in self.shards.iter().enumerate() {
                let w = conn
                    .query_row(
                        "SELECT max(committed_through) FROM receipts WHERE ring_epoch = ?1",
                        [epoch],
                        |r| r.get::<_, Option<i64>>(0),
                    )
                    .map_err(|e| (i, unreadable(path, e)))?;
                watermark = watermark.max(w.unwrap_or(0) as u64);
            }
        }
        let runs = self.runs_from(epoch, watermark)?;
        Ok(match plan_from_runs(watermark, runs) {
            Some(plan) => plan,
            // No receipt ends at the watermark (cannot happen with intact
            // files): merge every receipt from the start instead.
            None => plan_from_runs(0, self.runs_from(epoch, 0)?).unwrap_or(RingPlan::FRESH),
        })
    }

    /// The epoch of `cpu`'s ring other than `epoch` that committed events
    /// last, by the files' ring counts (`store::schema::ring_counts`: a
    /// handful of rows each; a file without them has nothing to say).
    pub fn latest_other_epoch(&mut self, cpu: u32, epoch: u64) -> Option<u64> {
        let mut latest: Option<(i64, i64)> = None;
        for (path, conn) in &self.shards {
            let found = conn
                .query_row(
                    "SELECT last_at, ring_epoch FROM ring_counts \
                     WHERE cpu = ?1 AND ring_epoch != ?2 ORDER BY last_at DESC LIMIT 1",
                    [i64::from(cpu), epoch as i64],
                    |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
                )
                .optional();
            match found {
                Ok(Some(f)) if latest.is_none_or(|l| f.0 > l.0) => latest = Some(f),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    database = %path.display(),
                    error = %e,
                    "cannot read the ring counts: this file does not say which ring came before"
                ),
            }
        }
        latest.map(|(_, e)| e as u64)
    }

    fn runs_from(&mut self, epoch: i64, from: u64) -> Result<Vec<Receipt>, (usize, StoreError)> {
        let mut runs = Vec::new();
        let sql = format!(
            "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE ring_epoch = ?1 AND last_seq >= ?2"
        );
        for (i, (path, conn)) in self.shards.iter().enumerate() {
            let mut found = conn
                .prepare_cached(&sql)
                .and_then(|mut stmt| {
                    stmt.query_map([epoch, from as i64], Receipt::from_row)?
                        .collect::<rusqlite::Result<Vec<Receipt>>>()
                })
                .map_err(|e| (i, unreadable(path, e)))?;
            runs.append(&mut found);
        }
        Ok(runs)
    }
}

/// The plan of each ring in `rings` (by epoch) from the receipts of every
/// database in `paths` (R6, R7), saying in the log what each ring resumes
/// at. Databases left out (not trusted, or unreadable: the latter are
/// recorded as damaged in `health`) and those that fail mid-way are named
/// in the log: the events committed there may be stored a second time.
/// `trust_watermarks`: see [`ReceiptReader::open`].
///
/// Damaged files' receipts are left out too: they may claim events the file
/// no longer holds. The rings such a file held events of, while its loss is
/// not recorded yet (see `store::loss`), are planned from the start of
/// their receipts (their watermarks count commits into the damaged file),
/// with the rows the file still gives up counted as committed: so the
/// drains read again what the file lost, storing what the rings still hold
/// and counting the rest as an exact gap, and store nothing twice.
pub fn plan_rings(
    paths: &[PathBuf],
    rings: &[Arc<Ring>],
    trust_watermarks: bool,
    health: &StoreHealth,
) -> Vec<RingPlan> {
    let damaged: Vec<PathBuf> = health.damaged().into_iter().map(|d| d.path).collect();
    let usable: Vec<PathBuf> = paths
        .iter()
        .filter(|p| !damaged.contains(p))
        .cloned()
        .collect();
    let (mut receipts, left_out) = ReceiptReader::open(&usable, trust_watermarks);
    for (path, why) in left_out {
        tracing::error!(
            database = %path.display(),
            reason = %why,
            "receipts left out of recovery: events committed there may be stored again"
        );
        if !why.starts_with("not trusted") {
            health.mark_damaged(
                super::Damaged {
                    path,
                    reason: why,
                    found_at: crate::rings::now_ns(),
                    replaced_by: None,
                },
                None,
            );
        }
    }
    let reread = super::loss::Reread::of(
        health
            .damaged()
            .into_iter()
            .map(|d| d.path)
            .filter(|p| !super::loss::recorded(p)),
    );
    let mut plans = Vec::with_capacity(rings.len());
    for ring in rings {
        let (mut plan, failed) = if reread.holds(ring.epoch()) {
            receipts.plan_from_start(ring.epoch())
        } else {
            receipts.plan(ring.epoch())
        };
        reread.add_readable(ring.epoch(), &mut plan);
        for e in failed {
            tracing::error!(error = %e, "receipts left out of recovery");
        }
        if !crate::rings::is_own_ring(ring.cpu()) {
            plan.predecessor = predecessor(&mut receipts, ring, plan == RingPlan::FRESH);
        }
        tracing::info!(
            cpu = ring.cpu(),
            ring = %ring.path().display(),
            epoch = %format_args!("{:016x}", ring.epoch()),
            committed_through = plan.committed_through,
            resume_seq = plan.resume.next_seq,
            committed_runs_above = plan.above.len(),
            lost_before_resume = plan.resume_gap().map_or(0, |g| g.count()),
            "ring recovered"
        );
        plans.push(plan);
    }
    health.set_reread(
        rings
            .iter()
            .map(|r| r.epoch())
            .filter(|e| reread.holds(*e))
            .collect(),
    );
    plans
}

/// The ring that was at `ring`'s name before it, as the receipts know it,
/// with its plan. Looked up for every ring, not only new ones: a
/// producer's report of it (see `rings::orphan`) may be read again after a
/// crash, and this plan then holds the gaps the first reading committed.
/// `fresh` (nothing of `ring` committed yet: it is new) also says it in the
/// log, since what was written into the old ring after its last receipt is
/// lost unless a producer still writing into it reports how far it got.
fn predecessor(
    receipts: &mut ReceiptReader,
    ring: &Ring,
    fresh: bool,
) -> Option<(u64, Box<RingPlan>)> {
    let epoch = receipts.latest_other_epoch(ring.cpu(), ring.epoch())?;
    let (plan, failed) = receipts.plan(epoch);
    for e in failed {
        tracing::error!(error = %e, "receipts left out of recovery");
    }
    if !fresh {
        return Some((epoch, Box::new(plan)));
    }
    tracing::warn!(
        cpu = ring.cpu(),
        ring = %ring.path().display(),
        epoch = %format_args!("{:016x}", ring.epoch()),
        previous_epoch = %format_args!("{epoch:016x}"),
        committed_through = plan.committed_through,
        "ring is new: the ring at its name before was not found; what was written into it \
         after sequence number committed_through is recorded as lost when a producer that \
         still wrote into it reports how far it got"
    );
    Some((epoch, Box::new(plan)))
}

/// Merges `runs` upward from `watermark`. `None` if no run ends at the
/// watermark (so its resume position is unknown).
fn plan_from_runs(watermark: u64, mut runs: Vec<Receipt>) -> Option<RingPlan> {
    runs.sort_unstable_by_key(|r| (r.first_seq, r.last_seq));
    let mut through = watermark;
    let mut resume = if watermark == 0 {
        Some(ReadPosition::START)
    } else {
        None
    };
    let mut above = Vec::new();
    for run in runs {
        if run.last_seq < through {
            continue;
        }
        if !above.is_empty() || run.first_seq > through + 1 {
            // Past the first hole.
            above.push((run.first_seq, run.last_seq));
            continue;
        }
        if run.last_seq > through || resume.is_none() {
            through = run.last_seq;
            resume = Some(ReadPosition::from_words(run.position, run.next_seq));
        }
    }
    Some(RingPlan {
        resume: resume?,
        committed_through: through,
        above,
        predecessor: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u64, last: u64) -> Receipt {
        Receipt {
            ring_epoch: 7,
            cpu: 0,
            first_seq: first,
            last_seq: last,
            position: last * 100,
            next_seq: last + 1,
            committed_through: 0,
            committed_at: 0,
        }
    }

    #[test]
    fn r6_resume_at_the_first_hole_not_after_the_highest_receipt() {
        // Stripes of 10 over two shards: 1..10 and 21..30 committed by A,
        // 11..20 lost in B's uncommitted batch.
        let plan = plan_from_runs(0, vec![run(21, 30), run(1, 10)]).unwrap();
        assert_eq!(plan.committed_through, 10);
        assert_eq!(plan.resume, ReadPosition::from_words(1000, 11));
        assert_eq!(plan.above, vec![(21, 30)]);
    }

    #[test]
    fn r6_contiguous_runs_resume_after_the_last() {
        let plan = plan_from_runs(10, vec![run(11, 20), run(1, 10), run(21, 25)]).unwrap();
        assert_eq!(plan.committed_through, 25);
        assert_eq!(plan.resume.next_seq, 26);
        assert!(plan.above.is_empty());
    }

    #[test]
    fn nothing_committed_starts_fresh_and_unknown_watermark_is_none() {
        assert_eq!(plan_from_runs(0, vec![]).unwrap(), RingPlan::FRESH);
        assert_eq!(plan_from_runs(10, vec![run(21, 30)]), None);
    }
}
