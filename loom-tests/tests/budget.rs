//! Model test of a producer's budget (`rings::budget`): threads
//! judging events of one provider while a window ends, and threads on two
//! CPUs, or sharing one CPU's slot, spending a burst taken in chunks.
//! Checked in every interleaving: each event is either passed or refused,
//! every refusal is reported exactly once (by the report of the window
//! that ended, or still pending), never lost or counted twice, and a
//! window admits at most its burst.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p eventd-loom-tests --release --test budget`
#![cfg(loom)]

use eventd::rings::budget::Budget;
use eventd::rings::Level;
use eventd::sync::Arc;
use loom::thread;

/// Judges events at the times given on `cpu`; returns (passed, refusals
/// reported).
fn judge_all(budget: &Budget, cpu: u32, times: &[u64]) -> (u64, u64) {
    let (mut passed, mut reported) = (0, 0);
    for &t in times {
        let v = budget.judge(Level::Info, t, cpu);
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
        let t = thread::spawn(move || judge_all(&other, 1, &[0, 0]));
        let mine = judge_all(&budget, 0, &[0, 20]);
        let theirs = t.join().unwrap();
        let passed = mine.0 + theirs.0;
        let reported = mine.1 + theirs.1 + budget.take();
        assert_eq!(passed + reported, 4, "passed {passed}, reported {reported}");
        assert!((1..=3).contains(&passed), "passed {passed}");
    });
}

/// Two threads spend a burst of 3 in chunks of 2 within one window: the
/// pool runs out, and a CPU takes what the other holds before it refuses.
fn burst_in_chunks(cpus: [u32; 2]) {
    loom::model(move || {
        let budget = Arc::new(Budget::with_chunk(1000, 3, 2));
        let other = budget.clone();
        let t = thread::spawn(move || judge_all(&other, cpus[1], &[0, 0]));
        let mine = judge_all(&budget, cpus[0], &[0, 0]);
        let theirs = t.join().unwrap();
        let passed = mine.0 + theirs.0;
        let refused = budget.take();
        assert_eq!(mine.1 + theirs.1, 0, "no window ended");
        assert_eq!(passed + refused, 4, "passed {passed}, refused {refused}");
        // Never past the burst; short of it by at most the one admission
        // a CPU was still putting in its slot when the other looked.
        assert!((2..=3).contains(&passed), "passed {passed}");
    });
}

#[test]
fn a_burst_taken_in_chunks_on_two_cpus_is_never_exceeded() {
    burst_in_chunks([0, 1]);
}

#[test]
fn a_burst_taken_in_chunks_by_threads_sharing_a_slot_is_never_exceeded() {
    burst_in_chunks([0, 0]);
}
