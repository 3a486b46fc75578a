//! [`CpuCount`]: a statistic that threads on different CPUs add to without
//! sharing a cache line.
//!
//! A producer is shared by every thread of a program, and each of its
//! emits counts itself. One atomic counter for all of them is one cache
//! line that every emitting CPU takes in turn: with two threads emitting on
//! two CPUs it cost each event 40–65 ns more than one thread alone
//! (perf/runs/notebook.md), against ~100 ns for the whole emit. Here each
//! emit adds to the slot of the CPU whose ring it wrote (the CPU it ran on),
//! so threads on different CPUs touch different lines, the way the rings
//! themselves are kept apart; the total is the sum of the slots.

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots of a [`CpuCount`]: a CPU adds to slot `cpu % SLOTS`, so above
/// this many CPUs two far-apart CPUs share one (correct, slower).
const SLOTS: usize = 64;

/// One slot on its own cache line (128 bytes: adjacent-line prefetch pairs
/// lines on x86_64).
#[repr(align(128))]
#[derive(Default)]
struct Slot(AtomicU64);

/// A count added to per CPU and read as one total.
pub(super) struct CpuCount {
    slots: Box<[Slot]>,
}

impl CpuCount {
    pub(super) fn new() -> CpuCount {
        CpuCount {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }

    /// Adds one in `cpu`'s slot.
    #[inline]
    pub(super) fn add(&self, cpu: u32) {
        // `% SLOTS` keeps the index in range (a slice of SLOTS slots).
        if let Some(slot) = self.slots.get(cpu as usize % SLOTS) {
            // Relaxed: a statistic; a reader that synchronised with the
            // adding threads (joined them, say) sees every addition.
            slot.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The sum of the slots. Each slot only grows, so successive totals
    /// read by one thread never go down.
    pub(super) fn total(&self) -> u64 {
        // Relaxed: as in `add`.
        self.slots.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_addition_is_in_the_total_whatever_the_cpu() {
        let count = Arc::new(CpuCount::new());
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let count = Arc::clone(&count);
                std::thread::spawn(move || {
                    // CPU ids beyond the slots and shared slots alike.
                    for i in 0..10_000u32 {
                        count.add(t * 1000 + i % 130);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(count.total(), 40_000);
        count.add(u32::MAX);
        assert_eq!(count.total(), 40_001);
    }
}
