//! [`CpuCount`]: a statistic that threads on different CPUs add to without
//! sharing a cache line.
//!
//! A producer is shared by every thread of a program, and each of its
//! emits counts itself. One atomic counter for all of them is one cache
//! line that every emitting CPU takes in turn: with two threads emitting on
//! two CPUs it cost each event 40–65 ns more than one thread alone
//! (perf/runs/notebook.md), against ~100 ns for the whole emit. Here each
//! emit adds to the word of the CPU whose ring it wrote (the CPU it ran on,
//! a [`PerCpu`] word), so threads on different CPUs touch different lines;
//! the total is the sum of the words.

use crate::rings::per_cpu::PerCpu;
use crate::sync::Ordering;

/// A count added to per CPU and read as one total.
pub(super) struct CpuCount(PerCpu);

impl CpuCount {
    pub(super) fn new() -> CpuCount {
        CpuCount(PerCpu::new())
    }

    /// Adds one in `cpu`'s word.
    #[inline]
    pub(super) fn add(&self, cpu: u32) {
        // Relaxed: a statistic; a reader that synchronised with the adding
        // threads (joined them, say) sees every addition.
        self.0.of(cpu).fetch_add(1, Ordering::Relaxed);
    }

    /// The sum of the words. Each only grows, so successive totals read by
    /// one thread never go down.
    pub(super) fn total(&self) -> u64 {
        // Relaxed: as in `add`.
        self.0.iter().map(|w| w.load(Ordering::Relaxed)).sum()
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
