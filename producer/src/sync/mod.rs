//! The one place that knows about loom.
//!
//! Every lock-free structure in eventd (the handoff channel, the KMES rings)
//! takes its atomics, cells, fences and futex calls from here. A normal build
//! gets `std` types and real futexes through `atomic-wait`; a build with
//! `RUSTFLAGS="--cfg loom"` gets loom's instrumented types, so the very same
//! code is model-checked by the tests in `loom-tests/`.
//!
//! Two things differ between std and loom and are papered over here:
//! - `UnsafeCell`: loom's cell hands out access through `with`/`with_mut` so it
//!   can track it; the std build wraps `core::cell::UnsafeCell` in the same API.
//! - futexes: loom has none. [`Futex`] is a 32-bit atomic word with
//!   `wait(expected)` / `wake_one` / `wake_all`. Under loom it is emulated with a
//!   mutex and a condition variable, checking the word under the mutex exactly as
//!   the kernel checks it under its hash-bucket lock, so a wake that races with a
//!   sleeper is never lost in the model either.

#[cfg(not(loom))]
mod imp {
    pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use std::sync::Arc;

    /// `std`'s cell with loom's access API.
    #[derive(Debug, Default)]
    pub struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub const fn new(value: T) -> Self {
            Self(core::cell::UnsafeCell::new(value))
        }

        /// Runs `f` with a shared raw pointer to the contents.
        #[inline(always)]
        pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Runs `f` with an exclusive raw pointer to the contents.
        #[inline(always)]
        pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// A 32-bit futex word (process-private).
    #[derive(Debug, Default)]
    pub struct Futex {
        word: AtomicU32,
    }

    impl Futex {
        pub const fn new(value: u32) -> Self {
            Self {
                word: AtomicU32::new(value),
            }
        }

        /// The word itself, for loads and read-modify-writes.
        #[inline(always)]
        pub fn word(&self) -> &AtomicU32 {
            &self.word
        }

        /// Sleeps while the word still holds `expected`. Returns at once if it
        /// does not; may also return spuriously, so callers re-check.
        pub fn wait(&self, expected: u32) {
            atomic_wait::wait(&self.word, expected);
        }

        pub fn wake_one(&self) {
            atomic_wait::wake_one(&self.word);
        }

        pub fn wake_all(&self) {
            atomic_wait::wake_all(&self.word);
        }
    }

    /// Busy-wait step before a thread decides to sleep.
    #[inline(always)]
    pub fn spin_loop() {
        std::hint::spin_loop();
    }

    /// Gives the CPU away for a moment (a producer preempted on this CPU may
    /// be the one we are waiting for).
    #[inline(always)]
    pub fn yield_now() {
        std::thread::yield_now();
    }

    /// Whether bounded spinning before a futex sleep is worth doing. Under loom
    /// spinning only multiplies the interleavings to explore.
    pub const SPIN_BEFORE_SLEEP: bool = true;

    /// Milliseconds on a monotonic clock (since boot), for bounded waits and
    /// rate windows. The coarse clock: a few ms of resolution (one tick),
    /// and a vDSO read of the last tick's time, several times cheaper than
    /// the precise clock, which matters on the producer's emit path.
    #[inline]
    pub fn monotonic_ms() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write into; CLOCK_MONOTONIC_COARSE
        // exists on every Linux eventd runs on (2.6.32 and later), and
        // cannot fail with a valid pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        (ts.tv_sec as u64)
            .saturating_mul(1000)
            .saturating_add(ts.tv_nsec as u64 / 1_000_000)
    }
}

#[cfg(loom)]
mod imp {
    pub use loom::cell::UnsafeCell;
    pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use loom::sync::Arc;
    use loom::sync::{Condvar, Mutex};

    /// Futex emulation: the word plus a mutex/condvar pair. `wait` compares
    /// the word while holding the mutex and sleeps on the condvar without
    /// releasing it in between; `wake_*` takes the mutex before notifying.
    /// A waker always changes the word before calling `wake_*`, so either the
    /// waiter sees the new value under the mutex or it is already asleep when
    /// the notification comes — the same guarantee the kernel gives.
    #[derive(Debug)]
    pub struct Futex {
        word: AtomicU32,
        lock: Mutex<()>,
        cond: Condvar,
    }

    impl Futex {
        pub fn new(value: u32) -> Self {
            Self {
                word: AtomicU32::new(value),
                lock: Mutex::new(()),
                cond: Condvar::new(),
            }
        }

        pub fn word(&self) -> &AtomicU32 {
            &self.word
        }

        pub fn wait(&self, expected: u32) {
            // Poisoning needs a panic inside the critical section, which has
            // none; loom reports any panic itself.
            let guard = self.lock.lock().unwrap();
            if self.word.load(Ordering::Relaxed) == expected {
                drop(self.cond.wait(guard).unwrap());
            }
        }

        pub fn wake_one(&self) {
            let _guard = self.lock.lock().unwrap();
            self.cond.notify_one();
        }

        pub fn wake_all(&self) {
            let _guard = self.lock.lock().unwrap();
            self.cond.notify_all();
        }
    }

    pub fn spin_loop() {
        loom::thread::yield_now();
    }

    pub fn yield_now() {
        loom::thread::yield_now();
    }

    pub const SPIN_BEFORE_SLEEP: bool = false;

    /// Loom explores schedules, not time: the clock stands still, so bounded
    /// waits never expire inside a model.
    pub fn monotonic_ms() -> u64 {
        0
    }
}

pub use imp::*;
