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

/// Committed sequence ranges of one ring epoch, shared by its drain thread
/// and the writers of every shard it routes to.
#[derive(Debug, Default)]
pub struct CommitTracker {
    state: Mutex<State>,
}

impl CommitTracker {
    /// A tracker for a ring whose sequences up to `watermark` and the runs
    /// `above` are already committed (from recovery).
    pub fn new(watermark: u64, above: &[(u64, u64)]) -> Self {
        let tracker = CommitTracker {
            state: Mutex::new(State {
                watermark,
                above: BTreeMap::new(),
            }),
        };
        for &(first, last) in above {
            tracker.committed(first, last);
        }
        tracker
    }

    /// Every sequence number at or below this is committed in some shard.
    pub fn watermark(&self) -> u64 {
        self.lock().watermark
    }

    /// Records that `first..=last` is committed.
    pub fn committed(&self, first: u64, last: u64) {
        let mut s = self.lock();
        if last <= s.watermark {
            return;
        }
        let first = first.max(s.watermark + 1);
        let entry = s.above.entry(first).or_insert(last);
        *entry = (*entry).max(last);
        // Advance over every run that now touches the watermark.
        while let Some((&f, &l)) = s.above.first_key_value() {
            if f > s.watermark + 1 {
                break;
            }
            s.above.remove(&f);
            s.watermark = s.watermark.max(l);
        }
    }

    /// Runs committed above the watermark (for `eventctl stats` and tests).
    pub fn runs_above(&self) -> usize {
        self.lock().above.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves the map consistent (each
        // step is a whole insert or remove), so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
        let t = CommitTracker::new(0, &[]);
        t.committed(1, 10);
        assert_eq!(t.watermark(), 10);
        // Shard A commits stripe 21..30 before shard B commits 11..20.
        t.committed(21, 30);
        assert_eq!(t.watermark(), 10);
        assert_eq!(t.runs_above(), 1);
        t.committed(11, 20);
        assert_eq!(t.watermark(), 30);
        assert_eq!(t.runs_above(), 0);
        // Already-covered ranges change nothing.
        t.committed(5, 8);
        assert_eq!(t.watermark(), 30);
    }

    #[test]
    fn recovered_runs_seed_the_tracker() {
        let t = CommitTracker::new(100, &[(111, 120), (131, 140)]);
        assert_eq!(t.watermark(), 100);
        t.committed(101, 110);
        assert_eq!(t.watermark(), 120);
        t.committed(121, 130);
        assert_eq!(t.watermark(), 140);
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
