//! Model test of a producer's budget (`rings::budget`): threads
//! judging events of one provider while a window ends. Checked in every
//! interleaving: each event is either passed or refused, and every refusal
//! is reported exactly once (by the report of the window that ended, or
//! still pending), never lost or counted twice.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p eventd-loom-tests --release --test budget`
#![cfg(loom)]

use eventd::rings::budget::Budget;
use eventd::rings::Level;
use eventd::sync::Arc;
use loom::thread;

/// Judges events at the times given; returns (passed, refusals reported).
fn judge_all(budget: &Budget, times: &[u64]) -> (u64, u64) {
    let (mut passed, mut reported) = (0, 0);
    for &t in times {
        let v = budget.judge(Level::Info, t);
        passed += u64::from(v.pass);
        reported += v.report.map_or(0, |(n, _)| n);
    }
    (passed, reported)
}

#[test]
fn every_refusal_is_reported_exactly_once() {
    loom::model(|| {
        // One event per 10 ms window.
        let budget = Arc::new(Budget::new(10, 1));
        let other = budget.clone();
        let t = thread::spawn(move || judge_all(&other, &[0, 0]));
        let mine = judge_all(&budget, &[0, 20]);
        let theirs = t.join().unwrap();
        let passed = mine.0 + theirs.0;
        let reported = mine.1 + theirs.1 + budget.take();
        assert_eq!(passed + reported, 4, "passed {passed}, reported {reported}");
        assert!((1..=3).contains(&passed), "passed {passed}");
    });
}
