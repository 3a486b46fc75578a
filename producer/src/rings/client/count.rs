//! [`ThreadCount`]: a statistic that every thread of a program adds to
//! without a locked instruction and without sharing a cache line (a
//! producer's emitted and dropped events).
//!
//! A producer is shared by every thread of a program, and each of its
//! emits counts itself. One atomic counter for all of them is one cache
//! line that every emitting CPU takes in turn (with two threads on two
//! CPUs that cost each event 40–65 ns more than one thread alone,
//! perf/runs/notebook.md), and even uncontended its `lock xadd` is ~6 ns
//! of a ~100 ns emit on the machine of docs/performance.md. Here each
//! thread counts in a word of its own that only it writes, so a plain load
//! and store keep the count exact; the total is what the live threads'
//! words hold plus what ended threads counted, summed under one lock that
//! only the (rare) reader, a thread's first count and a thread's exit take.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// What the threads of one count share.
#[derive(Default)]
struct Shared {
    /// The word of each live thread that has counted.
    live: Mutex<Vec<Arc<AtomicU64>>>,
    /// What ended threads counted (and what a thread without its
    /// thread-local storage, being torn down, adds directly).
    retired: AtomicU64,
}

/// A count added to per thread and read as one total.
pub(super) struct ThreadCount {
    /// Tells this count's words apart in a thread's list from those of
    /// other counts (other producers), alive or not.
    id: u64,
    shared: Arc<Shared>,
}

/// A thread's word for one count.
struct Mine {
    id: u64,
    word: Arc<AtomicU64>,
    owner: Weak<Shared>,
}

impl Drop for Mine {
    /// At the thread's exit: its word leaves the live list and its value
    /// goes into `retired`, both under the lock `total` reads under, so the
    /// total counts it once, before or after the move.
    fn drop(&mut self) {
        if let Some(owner) = self.owner.upgrade() {
            let mut live = owner.live.lock().unwrap_or_else(PoisonError::into_inner);
            live.retain(|w| !Arc::ptr_eq(w, &self.word));
            // Relaxed: the only writer of the word is this thread; the
            // addition is published by the lock's release.
            let counted = self.word.load(Ordering::Relaxed);
            owner.retired.fetch_add(counted, Ordering::Relaxed);
        }
    }
}

thread_local! {
    /// This thread's words, one per count it has added to (a program
    /// usually has one producer).
    static MINE: RefCell<Vec<Mine>> = const { RefCell::new(Vec::new()) };
}

/// Tells counts apart; never reused within a process.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl ThreadCount {
    pub(super) fn new() -> ThreadCount {
        ThreadCount {
            // Relaxed: only uniqueness matters.
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shared: Arc::new(Shared::default()),
        }
    }

    /// Adds one in the calling thread's word.
    #[inline]
    pub(super) fn add(&self) {
        let counted = MINE
            .try_with(|mine| {
                let Ok(mine) = mine.try_borrow() else {
                    return false;
                };
                match mine.iter().rev().find(|m| m.id == self.id) {
                    Some(m) => {
                        bump(&m.word);
                        true
                    }
                    None => false,
                }
            })
            .unwrap_or(false);
        if !counted {
            self.add_first();
        }
    }

    /// The calling thread's first count (or one while its storage is in
    /// use or gone): makes its word.
    #[cold]
    fn add_first(&self) {
        let made = MINE
            .try_with(|mine| {
                let Ok(mut mine) = mine.try_borrow_mut() else {
                    return false;
                };
                // Words of counts since dropped go first.
                mine.retain(|m| m.owner.strong_count() > 0);
                let word = Arc::new(AtomicU64::new(1));
                self.shared
                    .live
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Arc::clone(&word));
                mine.push(Mine {
                    id: self.id,
                    word,
                    owner: Arc::downgrade(&self.shared),
                });
                true
            })
            .unwrap_or(false);
        if !made {
            // Relaxed: a statistic, as in `bump`.
            self.shared.retired.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The sum of the words. Each only grows, so successive totals read by
    /// one thread never go down.
    pub(super) fn total(&self) -> u64 {
        let live = self
            .shared
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Relaxed: a statistic; a reader that synchronised with the adding
        // threads (joined them, say) sees every addition.
        let retired = self.shared.retired.load(Ordering::Relaxed);
        retired + live.iter().map(|w| w.load(Ordering::Relaxed)).sum::<u64>()
    }
}

/// Adds one to a word only the calling thread writes: a load and a store
/// are exact there, with no locked instruction.
#[inline(always)]
fn bump(word: &AtomicU64) {
    // Relaxed: the word's only writer is this thread; readers want a
    // statistic (see `total`).
    word.store(word.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_addition_is_in_the_total_whichever_thread_and_after_it_ends() {
        let count = Arc::new(ThreadCount::new());
        let other = ThreadCount::new();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let count = Arc::clone(&count);
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        count.add();
                    }
                })
            })
            .collect();
        for _ in 0..5 {
            count.add();
            other.add();
        }
        for t in threads {
            t.join().unwrap();
        }
        // Every thread has ended: their words were folded into `retired`.
        assert_eq!(count.total(), 40_005);
        assert_eq!(count.shared.live.lock().unwrap().len(), 1);
        assert_eq!(other.total(), 5);
        count.add();
        assert_eq!(count.total(), 40_006);
    }

    #[test]
    fn a_dropped_count_leaves_no_word_behind() {
        let first = ThreadCount::new();
        first.add();
        let id = first.id;
        drop(first);
        let second = ThreadCount::new();
        second.add();
        MINE.with(|mine| {
            let mine = mine.borrow();
            assert!(
                mine.iter().all(|m| m.id != id),
                "the dropped count's word stays"
            );
            assert_eq!(mine.iter().filter(|m| m.id == second.id).count(), 1);
        });
        assert_eq!(second.total(), 1);
    }

    #[test]
    fn totals_read_while_threads_count_never_go_down() {
        let count = Arc::new(ThreadCount::new());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (count, stop) = (Arc::clone(&count), Arc::clone(&stop));
                std::thread::spawn(move || {
                    // Short-lived threads too: their words move to
                    // `retired` while the reader reads.
                    while !stop.load(Ordering::Relaxed) {
                        let count = Arc::clone(&count);
                        std::thread::spawn(move || (0..100).for_each(|_| count.add()))
                            .join()
                            .unwrap();
                    }
                })
            })
            .collect();
        let mut last = 0;
        for _ in 0..2000 {
            let now = count.total();
            assert!(now >= last, "total went down: {last} then {now}");
            last = now;
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(count.total() % 100, 0);
        assert!(count.total() >= last);
    }
}
