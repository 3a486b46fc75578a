//! Earlier rings of a drain's CPU, and the reports producers write about
//! them (see `rings::orphan`), turned into `ring_lost` gaps of the old
//! ring's epoch.
//!
//! For each earlier epoch the drain knows how far it is accounted for:
//! every sequence number up to `through` is stored, on its way to a writer,
//! or inside a gap, and so are the runs in `above`. A ring this drain gave up
//! itself is accounted for up to its frozen front (the drain counted what
//! it held, [`Ring::unread`](crate::rings::Ring::unread)); a ring that was
//! gone before eventd started is known from the receipts (the plan's
//! predecessor). A report can then only add what lies past that, so a
//! ring is never counted twice, whoever retired it. A report of an epoch
//! not known here (nothing of it was ever committed to this store) counts
//! from its sequence number 1.

use super::{CommittedRuns, RingPlan};
use crate::rings::orphan::OrphanReport;
use crate::rings::{Gap, LossReason};

/// Earlier epochs kept, and reported epochs remembered; the oldest goes
/// first. Rings are replaced at most once a second, so these cover far
/// more than a producer's report takes to arrive.
const KNOWN_MAX: usize = 16;
const REPORTED_MAX: usize = 64;

/// One earlier epoch of this drain's ring and how far it is accounted for.
struct Known {
    epoch: u64,
    through: u64,
    above: CommittedRuns,
}

#[derive(Default)]
pub(super) struct Orphans {
    known: Vec<Known>,
    reported: Vec<u64>,
}

impl Orphans {
    /// What the plan knows of the ring before this one, if anything.
    pub(super) fn new(plan: &RingPlan) -> Orphans {
        let mut orphans = Orphans::default();
        if let Some((epoch, before)) = &plan.predecessor {
            orphans.push(Known {
                epoch: *epoch,
                through: before.committed_through,
                above: before.committed_runs(),
            });
        }
        orphans
    }

    /// This drain gave up ring `epoch`, having accounted for every
    /// sequence number up to `through`.
    pub(super) fn replaced(&mut self, epoch: u64, through: u64) {
        self.known.retain(|k| k.epoch != epoch);
        self.push(Known {
            epoch,
            through,
            above: CommittedRuns::default(),
        });
    }

    fn push(&mut self, known: Known) {
        if self.known.len() >= KNOWN_MAX {
            self.known.remove(0);
        }
        self.known.push(known);
    }

    /// The gaps `report` (read from the ring of epoch `current`) adds: the
    /// sequence numbers of the old ring, up to its last, not accounted for
    /// yet. Each epoch is reported once; a report of the ring in use, or
    /// of one already reported, adds nothing (and is logged).
    pub(super) fn gaps(&mut self, report: &OrphanReport, current: u64) -> Vec<Gap> {
        let epoch = format_args!("{:016x}", report.epoch);
        if report.epoch == current || self.reported.contains(&report.epoch) {
            tracing::warn!(
                cpu = report.cpu,
                epoch = %epoch,
                "a report of a replaced ring names the ring in use or one reported already; ignored"
            );
            return Vec::new();
        }
        if self.reported.len() >= REPORTED_MAX {
            self.reported.remove(0);
        }
        self.reported.push(report.epoch);
        let pieces = match self.known.iter_mut().find(|k| k.epoch == report.epoch) {
            Some(known) if report.last_seq > known.through => {
                known.above.uncommitted(known.through + 1, report.last_seq)
            }
            Some(_) => Vec::new(),
            None if report.last_seq >= 1 => {
                tracing::warn!(
                    cpu = report.cpu,
                    epoch = %epoch,
                    "a replaced ring nothing of which was committed here: all of it counts as lost"
                );
                vec![(1, report.last_seq)]
            }
            None => Vec::new(),
        };
        let lost: u64 = pieces.iter().map(|(f, t)| t - f + 1).sum();
        tracing::error!(
            cpu = report.cpu,
            epoch = %epoch,
            last_seq = report.last_seq,
            lost,
            "a producer reports a ring that was replaced while it still wrote into it; \
             what eventd had not read of it is recorded as lost"
        );
        pieces
            .into_iter()
            .map(|(from_seq, to_seq)| Gap {
                from_seq,
                to_seq,
                reason: LossReason::RingLost,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rings::ReadPosition;

    fn report(epoch: u64, last_seq: u64) -> OrphanReport {
        OrphanReport {
            epoch,
            cpu: 0,
            last_seq,
        }
    }

    fn ranges(gaps: &[Gap]) -> Vec<(u64, u64)> {
        gaps.iter().map(|g| (g.from_seq, g.to_seq)).collect()
    }

    #[test]
    fn a_predecessor_counts_what_its_receipts_do_not_hold_once() {
        let plan = RingPlan {
            resume: ReadPosition::START,
            committed_through: 0,
            above: Vec::new(),
            predecessor: Some((
                7,
                Box::new(RingPlan {
                    resume: ReadPosition::START,
                    committed_through: 100,
                    above: vec![(120, 130)],
                    predecessor: None,
                }),
            )),
        };
        let mut orphans = Orphans::new(&plan);
        let gaps = orphans.gaps(&report(7, 150), 9);
        assert_eq!(ranges(&gaps), vec![(101, 119), (131, 150)]);
        assert!(gaps.iter().all(|g| g.reason == LossReason::RingLost));
        assert!(orphans.gaps(&report(7, 150), 9).is_empty(), "twice");
        assert!(
            orphans.gaps(&report(9, 150), 9).is_empty(),
            "the ring in use"
        );
    }

    #[test]
    fn a_ring_the_drain_counted_itself_adds_only_what_lies_past_its_count() {
        let mut orphans = Orphans::default();
        orphans.replaced(5, 40);
        assert!(orphans.gaps(&report(5, 40), 9).is_empty());
        let mut orphans = Orphans::default();
        orphans.replaced(5, 40);
        assert_eq!(ranges(&orphans.gaps(&report(5, 45), 9)), vec![(41, 45)]);
        assert_eq!(ranges(&orphans.gaps(&report(6, 3), 9)), vec![(1, 3)]);
    }
}
