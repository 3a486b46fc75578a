//! [`PerCpu`]: one word per CPU, each on a cache line of its own, for what
//! every thread of a program updates on every event under a rate limit
//! (its budget's admissions in hand). One shared word would be one line
//! passing between the emitting CPUs on every event; a word per CPU keeps
//! threads on different CPUs apart, the way the rings themselves are.

use crate::sync::AtomicU64;

/// Words of a [`PerCpu`]: CPU `c` has word `c % SLOTS`, so above this many
/// CPUs two far-apart CPUs share one (correct, slower). Two in the loom
/// models, which only need two CPUs to meet or not.
#[cfg(not(loom))]
const SLOTS: usize = 64;
#[cfg(loom)]
const SLOTS: usize = 2;

/// One word on its own cache line (128 bytes: adjacent-line prefetch pairs
/// lines on x86_64).
#[repr(align(128))]
#[derive(Debug)]
struct Slot(AtomicU64);

/// A word per CPU, each starting at 0. What a word means, and with which
/// ordering it is read and written, is its user's.
#[derive(Debug)]
pub struct PerCpu {
    slots: Box<[Slot]>,
}

impl PerCpu {
    pub fn new() -> PerCpu {
        PerCpu {
            slots: (0..SLOTS).map(|_| Slot(AtomicU64::new(0))).collect(),
        }
    }

    /// The word of `cpu` (any value: it is taken modulo the words).
    #[inline]
    pub fn of(&self, cpu: u32) -> &AtomicU64 {
        // In range: there are SLOTS slots, and the index is taken modulo.
        &self.slots[cpu as usize % SLOTS].0
    }

    /// Every word.
    pub fn iter(&self) -> impl Iterator<Item = &AtomicU64> {
        self.slots.iter().map(|s| &s.0)
    }
}

impl Default for PerCpu {
    fn default() -> Self {
        Self::new()
    }
}
