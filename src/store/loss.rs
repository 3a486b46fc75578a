//! What a damaged shard file took with it, recorded where queries see it.
//!
//! A damaged file is left as it is (R12), and queries read what they still
//! can of it. What they cannot read any more is lost, and the file itself
//! can no longer say how much that was. Two things count it:
//!
//! - **The drains**, for the rings they read now, when the damage is found
//!   at start: recovery leaves the file's receipts out, plans those rings
//!   from the start of the other files' receipts, and counts the rows the
//!   file still gives up as committed ([`Reread`]). The drains read again
//!   what the file lost: what the rings still hold is stored again, the
//!   rest becomes an exact `overwritten` gap, and nothing is stored twice.
//! - **The file's manifest** ([`Manifest`]), for every other ring (an
//!   earlier epoch, or damage found while eventd runs): the events of that
//!   ring it held when the manifest was last written, less the rows of it
//!   the damaged file still gives up, is at least what was lost.
//!
//! The second count is stored, once per damaged file, as a gap row in a
//! shard a writer owns:
//!
//! - `reason` = `damaged: FILE` (the damaged file's name),
//! - `lost` = the count (a lower bound: commits after the manifest's last
//!   write are not in it),
//! - `ts_before` = the oldest event the file held, `detected_at` = when
//!   the damage was found, so a query whose window meets that span shows it,
//! - `cpu` = [`STORE_CPU`] (not a ring), `ring_epoch` = the damaged file's
//!   instance id, `from_seq` = `to_seq` = 1: an identity of its own that no
//!   ring's gap has.
//!
//! Once the row is committed and the drains' commits have passed the
//! highest sequence number the file held of each ring they read again, a
//! `.loss` file beside the damaged one says so: no later start counts it
//! again (until then a restart reads those rings again, which stores
//! nothing twice).

use super::files::side_file;
use super::manifest::Manifest;
use super::rows::{NewGap, INSERT_GAP};
use std::path::{Path, PathBuf};

/// The `cpu` of a loss record: not a ring (above every cpu id and
/// eventd's syslog ring's, `1 << 20`).
pub const STORE_CPU: u32 = 1 << 21;
/// The start of a loss record's `reason`; the damaged file's name follows.
pub const DAMAGED_REASON_PREFIX: &str = "damaged: ";
const RECORDED_SUFFIX: &str = ".loss";

/// The loss of one damaged file, to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    pub path: PathBuf,
    /// The damaged file's instance id, as the gap row's ring epoch.
    pub instance: u64,
    /// Events lost, at least.
    pub lost: u64,
    /// The oldest event the file held (0: unknown).
    pub since_ns: i64,
    pub found_at: i64,
    /// The rings the drains read again for this file, each with the
    /// highest sequence number the file held of it: the loss is accounted
    /// once their commits reach those (see [`StoreHealth`]).
    ///
    /// [`StoreHealth`]: super::StoreHealth
    pub reread: Vec<(u64, u64)>,
}

/// Whether the loss of damaged file `path` is stored already.
pub fn recorded(path: &Path) -> bool {
    side_file(path, RECORDED_SUFFIX).exists()
}

/// Says, beside damaged file `path`, that its loss is stored (after the
/// commit that stored it).
pub fn mark_recorded(loss: &Loss, mode: crate::access::Mode) {
    let marker = side_file(&loss.path, RECORDED_SUFFIX);
    let written = std::fs::write(&marker, format!("{} events\n", loss.lost))
        .and_then(|()| crate::access::files::set_mode_path(&marker, mode));
    if let Err(e) = written {
        tracing::warn!(
            database = %loss.path.display(),
            error = %e,
            "cannot note that this damaged file's loss is recorded; a later start records it again"
        );
    }
}

/// The loss of damaged file `path`, found at `found_at`, if it is not
/// stored already and its manifest says what it held. `reread` says which
/// ring epochs the drains read again for it (see the module docs): those
/// are not counted here. Reads what is left of the file (read-only): one
/// grouped count, or a walk of its rows when the damage stops that.
pub fn loss_of(path: &Path, found_at: i64, reread: impl Fn(u64) -> bool) -> Option<Loss> {
    if recorded(path) {
        return None;
    }
    let Some(manifest) = Manifest::read(path) else {
        tracing::warn!(
            database = %path.display(),
            "damaged shard file has no manifest: what it held, and so what was lost, is unknown"
        );
        return None;
    };
    let readable = readable_events(path);
    let (mut lost, mut by_drains) = (0u64, 0u64);
    let mut awaited = Vec::new();
    for ring in &manifest.rings {
        if reread(ring.ring_epoch) {
            by_drains += ring.events;
            awaited.push((ring.ring_epoch, ring.max_seq));
            continue;
        }
        let still = readable
            .iter()
            .find(|(e, c, _)| *e == ring.ring_epoch && *c == ring.cpu)
            .map_or(0, |r| r.2);
        lost += ring.events.saturating_sub(still);
    }
    let still: u64 = readable.iter().map(|r| r.2).sum();
    let loss = Loss {
        path: path.to_path_buf(),
        instance: u64::from_str_radix(&manifest.instance, 16).unwrap_or(0),
        lost,
        since_ns: manifest.ts.map_or(0, |(lo, _)| lo),
        found_at,
        reread: awaited,
    };
    tracing::error!(
        database = %path.display(),
        held = manifest.events(),
        still_readable = still,
        of_rings_the_drains_read_again = by_drains,
        lost_at_least = lost,
        "damaged shard file: what it held of the other rings by its manifest, less what can \
         still be read, is recorded as lost (a gap row queries show)"
    );
    Some(loss)
}

/// For recovery (see the module docs): the ring epochs that damaged files
/// held events of, and the sequence numbers those files still give up
/// (their readable events and gaps), by epoch, as sorted disjoint runs.
#[derive(Debug, Default)]
pub struct Reread {
    readable: std::collections::BTreeMap<u64, Vec<(u64, u64)>>,
    epochs: Vec<u64>,
}

impl Reread {
    /// What the damaged files `paths` (their losses not recorded yet) held,
    /// by their manifests, and what can still be read of them.
    pub fn of(paths: impl Iterator<Item = PathBuf>) -> Reread {
        let mut reread = Reread::default();
        for path in paths {
            if let Some(m) = Manifest::read(&path) {
                reread.epochs.extend(m.rings.iter().map(|r| r.ring_epoch));
            }
            reread.read(&path);
        }
        reread.epochs.extend(reread.readable.keys().copied());
        reread.epochs.sort_unstable();
        reread.epochs.dedup();
        for runs in reread.readable.values_mut() {
            *runs = merge(std::mem::take(runs));
        }
        reread
    }

    /// Whether a damaged file held events of ring epoch `epoch`.
    pub fn holds(&self, epoch: u64) -> bool {
        self.epochs.binary_search(&epoch).is_ok()
    }

    /// Counts what the damaged files still give up of ring `epoch` as
    /// committed in `plan` (the drain skips it), above what the plan has.
    pub fn add_readable(&self, epoch: u64, plan: &mut crate::drain::RingPlan) {
        let Some(runs) = self.readable.get(&epoch) else {
            return;
        };
        let through = plan.committed_through;
        plan.above.extend(
            runs.iter()
                .filter(|(_, last)| *last > through)
                .map(|&(first, last)| (first.max(through + 1), last)),
        );
        plan.above = merge(std::mem::take(&mut plan.above));
    }

    /// Adds the readable events and gaps of `path` (up to the first row the
    /// damage stops).
    fn read(&mut self, path: &Path) {
        let Ok(conn) = super::open::open_read_only(path) else {
            return;
        };
        for sql in [
            "SELECT ring_epoch, seq, seq FROM events",
            "SELECT ring_epoch, from_seq, to_seq FROM gaps",
        ] {
            let Ok(mut stmt) = conn.prepare(sql) else {
                continue;
            };
            let Ok(mut rows) = stmt.query([]) else {
                continue;
            };
            while let Ok(Some(row)) = rows.next() {
                let (Ok(epoch), Ok(first), Ok(last)) = (
                    row.get::<_, i64>(0),
                    row.get::<_, i64>(1),
                    row.get::<_, i64>(2),
                ) else {
                    break;
                };
                let (first, last) = (first.max(1) as u64, last.max(1) as u64);
                let runs = self.readable.entry(epoch as u64).or_default();
                // Rows come mostly in sequence order: extend the last run.
                match runs.last_mut() {
                    Some(run) if first == run.1 + 1 => run.1 = last.max(run.1),
                    _ => runs.push((first, last.max(first))),
                }
            }
        }
    }
}

/// `runs` sorted and merged where they touch or overlap.
fn merge(mut runs: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    runs.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for (first, last) in runs {
        match merged.last_mut() {
            Some(m) if first <= m.1.saturating_add(1) => m.1 = m.1.max(last),
            _ => merged.push((first, last)),
        }
    }
    merged
}

/// Rows of `events` per ring `(epoch, cpu)` a reader still gets out of
/// `path`: a grouped count if that works, else the rows read one by one up
/// to the first error.
fn readable_events(path: &Path) -> Vec<(u64, u32, u64)> {
    let Ok(conn) = super::open::open_read_only(path) else {
        return Vec::new();
    };
    let grouped = conn
        .prepare("SELECT ring_epoch, cpu, count(*) FROM events GROUP BY ring_epoch, cpu")
        .and_then(|mut stmt| {
            stmt.query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, u32>(1)?,
                    r.get::<_, i64>(2)? as u64,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        });
    if let Ok(counts) = grouped {
        return counts;
    }
    let mut counts: Vec<(u64, u32, u64)> = Vec::new();
    let Ok(mut stmt) = conn.prepare("SELECT ring_epoch, cpu FROM events") else {
        return counts;
    };
    let Ok(mut rows) = stmt.query([]) else {
        return counts;
    };
    while let Ok(Some(row)) = rows.next() {
        let (Ok(epoch), Ok(cpu)) = (row.get::<_, i64>(0), row.get::<_, u32>(1)) else {
            break;
        };
        match counts
            .iter_mut()
            .find(|c| c.0 == epoch as u64 && c.1 == cpu)
        {
            Some(c) => c.2 += 1,
            None => counts.push((epoch as u64, cpu, 1)),
        }
    }
    counts
}

/// Stores `losses` as gap rows, in the caller's transaction (none for a
/// file whose whole loss the drains count).
pub fn insert(tx: &rusqlite::Transaction<'_>, losses: &[Loss]) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(INSERT_GAP)?;
    for loss in losses.iter().filter(|l| l.lost > 0) {
        let name = loss.path.file_name().map_or_else(
            || loss.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        NewGap {
            ring_epoch: loss.instance,
            cpu: STORE_CPU,
            from_seq: 1,
            to_seq: 1,
            lost: loss.lost,
            reason: &format!("{DAMAGED_REASON_PREFIX}{name}"),
            ts_before: loss.since_ns,
            detected_at: loss.found_at,
        }
        .insert(&mut stmt)?;
    }
    Ok(())
}
