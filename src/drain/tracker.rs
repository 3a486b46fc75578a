//! Per-ring commit tracking: which sequence ranges of a ring are committed
//! somewhere, and up to where that is true without a hole (the watermark).
//!
//! A ring's events are split over several shards (stripes, R5), and each
//! shard commits on its own, so shard A may commit a later stripe before
//! shard B commits an earlier one. Recovery must resume at the lowest
//! sequence not yet committed anywhere, not after the highest receipt. Each
//! writer reports its committed runs here after the commit; the watermark
//! (every sequence at or below it is committed) is stored in every receipt,
//! so recovery only has to look at receipts above the highest stored
//! watermark.

use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Debug, Default)]
struct State {
    /// Every sequence number `<= watermark` is committed.
    watermark: u64,
    /// Committed runs above the watermark, `first -> last`, none touching it.
    above: BTreeMap<u64, u64>,
}

impl State {
    fn committed(&mut self, first: u64, last: u64) {
        if last <= self.watermark {
            return;
        }
        let first = first.max(self.watermark + 1);
        let entry = self.above.entry(first).or_insert(last);
        *entry = (*entry).max(last);
        // Advance over every run that now touches the watermark.
        while let Some((&f, &l)) = self.above.first_key_value() {
            if f > self.watermark + 1 {
                break;
            }
            self.above.remove(&f);
            self.watermark = self.watermark.max(l);
        }
    }
}

/// Epochs one tracker keeps: the ring's current one and those it replaced
/// recently, whose last items may still be on their way to a writer.
const EPOCHS_KEPT: usize = 4;

/// Committed sequence ranges of one ring (by epoch), shared by its drain
/// thread and the writers of every shard it routes to. A ring the daemon
/// replaces gets a new epoch ([`CommitTracker::begin_epoch`]); items of the
/// old one still in flight are tracked under theirs.
#[derive(Debug, Default)]
pub struct CommitTracker {
    /// `(epoch, state)`, newest last; at most [`EPOCHS_KEPT`].
    epochs: Mutex<Vec<(u64, State)>>,
}

impl CommitTracker {
    /// A tracker for ring epoch `epoch`, whose sequences up to `watermark`
    /// and the runs `above` are already committed (from recovery).
    pub fn new(epoch: u64, watermark: u64, above: &[(u64, u64)]) -> Self {
        let mut state = State {
            watermark,
            above: BTreeMap::new(),
        };
        for &(first, last) in above {
            state.committed(first, last);
        }
        CommitTracker {
            epochs: Mutex::new(vec![(epoch, state)]),
        }
    }

    /// The ring now has epoch `epoch`, with nothing committed yet.
    pub fn begin_epoch(&self, epoch: u64) {
        let mut epochs = self.lock();
        if epochs.iter().any(|(e, _)| *e == epoch) {
            return;
        }
        if epochs.len() >= EPOCHS_KEPT {
            epochs.remove(0);
        }
        epochs.push((epoch, State::default()));
    }

    /// Every sequence number of `epoch` at or below this is committed in
    /// some shard (0 for an epoch not tracked: that claims nothing).
    pub fn watermark(&self, epoch: u64) -> u64 {
        self.lock()
            .iter()
            .find(|(e, _)| *e == epoch)
            .map_or(0, |(_, s)| s.watermark)
    }

    /// Records that `first..=last` of `epoch` is committed.
    pub fn committed(&self, epoch: u64, first: u64, last: u64) {
        let mut epochs = self.lock();
        if let Some((_, s)) = epochs.iter_mut().find(|(e, _)| *e == epoch) {
            s.committed(first, last);
        }
        // An epoch no longer kept: its receipts claim no watermark, which
        // is always safe.
    }

    /// Runs committed above the watermark of `epoch` (for `eventctl stats`
    /// and tests).
    pub fn runs_above(&self, epoch: u64) -> usize {
        self.lock()
            .iter()
            .find(|(e, _)| *e == epoch)
            .map_or(0, |(_, s)| s.above.len())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, State)>> {
        // A panic while holding this lock leaves the map consistent (each
        // step is a whole insert or remove), so a poisoned lock is usable.
        self.epochs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sequence runs of a ring that were committed above the resume point: the
/// drain re-reads them after a restart and must not store them again.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CommittedRuns {
    /// Sorted, non-overlapping `(first, last)`.
    runs: std::collections::VecDeque<(u64, u64)>,
}

impl CommittedRuns {
    /// `runs` in any order; overlapping or touching runs are merged.
    pub fn new(mut runs: Vec<(u64, u64)>) -> Self {
        runs.sort_unstable();
        let mut merged: std::collections::VecDeque<(u64, u64)> = Default::default();
        for (f, l) in runs {
            match merged.back_mut() {
                Some(back) if f <= back.1.saturating_add(1) => back.1 = back.1.max(l),
                _ => merged.push_back((f, l)),
            }
        }
        CommittedRuns { runs: merged }
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Whether `seq` is already committed. Sequence numbers must be asked in
    /// increasing order: runs below `seq` are forgotten.
    pub fn contains(&mut self, seq: u64) -> bool {
        while let Some(&(_, last)) = self.runs.front() {
            if last < seq {
                self.runs.pop_front();
            } else {
                break;
            }
        }
        matches!(self.runs.front(), Some(&(first, _)) if first <= seq)
    }

    /// The parts of `from..=to` not committed yet, in order; forgets runs
    /// that end inside it.
    pub fn uncommitted(&mut self, from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut pieces = Vec::new();
        let mut at = from;
        while at <= to {
            match self.runs.front().copied() {
                Some((_, last)) if last < at => {
                    self.runs.pop_front();
                }
                Some((first, last)) if first <= to => {
                    if first > at {
                        pieces.push((at, first - 1));
                    }
                    if last >= to {
                        return pieces;
                    }
                    at = last + 1;
                    self.runs.pop_front();
                }
                _ => {
                    pieces.push((at, to));
                    break;
                }
            }
        }
        pieces
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_waits_for_the_earlier_stripe() {
        let t = CommitTracker::new(7, 0, &[]);
        t.committed(7, 1, 10);
        assert_eq!(t.watermark(7), 10);
        // Shard A commits stripe 21..30 before shard B commits 11..20.
        t.committed(7, 21, 30);
        assert_eq!(t.watermark(7), 10);
        assert_eq!(t.runs_above(7), 1);
        t.committed(7, 11, 20);
        assert_eq!(t.watermark(7), 30);
        assert_eq!(t.runs_above(7), 0);
        // Already-covered ranges change nothing.
        t.committed(7, 5, 8);
        assert_eq!(t.watermark(7), 30);
    }

    #[test]
    fn recovered_runs_seed_the_tracker() {
        let t = CommitTracker::new(7, 100, &[(111, 120), (131, 140)]);
        assert_eq!(t.watermark(7), 100);
        t.committed(7, 101, 110);
        assert_eq!(t.watermark(7), 120);
        t.committed(7, 121, 130);
        assert_eq!(t.watermark(7), 140);
    }

    #[test]
    fn a_replaced_ring_starts_a_new_epoch_and_the_old_one_finishes() {
        let t = CommitTracker::new(1, 50, &[]);
        t.begin_epoch(2);
        assert_eq!(t.watermark(2), 0);
        // The old epoch's last items commit after the replacement.
        t.committed(1, 51, 60);
        t.committed(2, 1, 5);
        assert_eq!((t.watermark(1), t.watermark(2)), (60, 5));
        // Old epochs are forgotten beyond the few kept; unknown ones claim 0.
        for e in 3..10 {
            t.begin_epoch(e);
        }
        assert_eq!(t.watermark(1), 0);
        t.committed(1, 61, 70);
        assert_eq!(t.watermark(1), 0);
        assert_eq!(t.watermark(9), 0);
    }

    #[test]
    fn committed_runs_split_a_gap_and_skip_events() {
        let mut runs = CommittedRuns::new(vec![(30, 39), (10, 19), (20, 25)]);
        assert!(!runs.contains(5));
        assert!(runs.contains(10));
        assert!(runs.contains(25));
        assert!(!runs.contains(26));
        assert_eq!(runs.uncommitted(26, 50), vec![(26, 29), (40, 50)]);
        assert!(runs.is_empty());
        let mut runs = CommittedRuns::new(vec![(10, 19)]);
        assert_eq!(runs.uncommitted(1, 15), vec![(1, 9)]);
        assert_eq!(runs.uncommitted(16, 19), vec![]);
        assert_eq!(runs.uncommitted(20, 21), vec![(20, 21)]);
    }
}
