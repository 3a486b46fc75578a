//! Where a drain starts: the plan recovery makes from the receipts, and
//! what follows from it (the runs not to store again, the sequence numbers
//! the previous run passed over as lost but never stored as a gap).

use super::tracker::CommittedRuns;
use crate::rings::{Gap, LossReason, ReadPosition};

/// Where one ring epoch's drain starts and what it must not store again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingPlan {
    /// Reader position to resume at.
    pub resume: ReadPosition,
    /// Every sequence number at or below this is committed or stored as a
    /// gap. Sequence numbers between it and `resume.next_seq` that are not in
    /// `above` were passed over by the reader before (lost): the drain
    /// records them as a gap.
    pub committed_through: u64,
    /// Committed runs above `committed_through`.
    pub above: Vec<(u64, u64)>,
    /// For a ring with nothing committed yet: the epoch of the ring that
    /// was at its name before (the latest other epoch of its cpu in the
    /// receipts) and that epoch's plan. A producer that still wrote into
    /// that ring reports how far it got (see `rings::orphan`); the plan says
    /// which of its sequence numbers are stored already.
    pub predecessor: Option<(u64, Box<RingPlan>)>,
}

impl RingPlan {
    /// A ring nothing was ever committed from.
    pub const FRESH: RingPlan = RingPlan {
        resume: ReadPosition::START,
        committed_through: 0,
        above: Vec::new(),
        predecessor: None,
    };

    pub fn committed_runs(&self) -> CommittedRuns {
        CommittedRuns::new(self.above.clone())
    }

    /// The sequence numbers between the committed prefix and the resume
    /// position: an earlier run found them lost, and those not committed
    /// (as a gap) anywhere are stored as a gap again, before anything else.
    /// (The drain cuts the committed runs out of it, as out of any gap.)
    pub fn resume_gap(&self) -> Option<Gap> {
        (self.resume.next_seq > self.committed_through + 1).then(|| Gap {
            from_seq: self.committed_through + 1,
            to_seq: self.resume.next_seq - 1,
            reason: LossReason::Overwritten,
        })
    }
}
