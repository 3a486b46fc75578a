//! The daemon's long-lived threads: started with a name, watched for a
//! panic or an error, which is logged at once and handed to the daemon's
//! failure hook (the `eventd` binary's ends the process so a supervisor
//! restarts it and recovery takes over).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Called (from the failing thread) when a drain or writer thread stops
/// on its own, with what happened.
pub type FailureHook = Arc<dyn Fn(&str) + Send + Sync>;

/// A watched thread: it ends with `Ok` or with what stopped it.
pub type Watched = JoinHandle<Result<(), String>>;

/// Starts thread `name` running `body`; an error or a panic (described as
/// `what`) is logged and passed to `hook` as it happens, and also returned
/// by the join.
pub fn spawn_watched<E: std::fmt::Display>(
    name: String,
    what: String,
    hook: &FailureHook,
    body: impl FnOnce() -> Result<(), E> + Send + 'static,
) -> std::io::Result<Watched> {
    let hook = hook.clone();
    std::thread::Builder::new()
        .name(name)
        .spawn(move || watch(&hook, what, body))
}

/// Runs a thread's body; reports an error or a panic to the hook at once
/// (and still returns it for the join).
fn watch<E: std::fmt::Display>(
    hook: &FailureHook,
    what: String,
    body: impl FnOnce() -> Result<(), E>,
) -> Result<(), String> {
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => format!("{what} stopped: {e}"),
        Err(_) => format!("{what} panicked"),
    };
    tracing::error!(error = %outcome, "thread stopped; eventd stops too");
    hook(&outcome);
    Err(outcome)
}

/// Joins `handles`, collecting what went wrong.
pub fn join_all(handles: impl IntoIterator<Item = Watched>, failures: &mut Vec<String>) {
    for handle in handles {
        match handle.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            // `watch` catches panics; this is only reached if the hook
            // itself panicked.
            Err(_) => failures.push("a thread's failure hook panicked".to_string()),
        }
    }
}

/// Sets the calling thread's niceness (Linux: niceness is per thread;
/// threads it starts later inherit it). Raising it is always allowed;
/// lowering it again needs CAP_SYS_NICE or a high enough RLIMIT_NICE.
pub fn set_own_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority only reads its arguments; PRIO_PROCESS with a
    // thread id changes that one thread of this process.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS as _, tid as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The calling thread's niceness.
pub fn own_nice() -> std::io::Result<i32> {
    // SAFETY: as in set_own_nice.
    let tid = unsafe { libc::gettid() };
    // getpriority returns the niceness itself, so -1 is also a valid
    // answer: errno tells an error apart.
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: getpriority only reads its arguments.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS as _, tid as libc::id_t) };
    let err = std::io::Error::last_os_error();
    if nice == -1 && err.raw_os_error().is_some_and(|e| e != 0) {
        return Err(err);
    }
    Ok(nice)
}

/// A stop flag a sleeping thread wakes up for (the retention coordinator
/// between passes, the export workers between rounds).
#[derive(Default)]
pub struct Stop {
    stopped: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Stop {
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.wake.notify_all();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub fn flag(&self) -> &AtomicBool {
        &self.stopped
    }

    /// Sleeps `d` or until [`stop`](Self::stop); true if stopped.
    pub fn sleep(&self, d: Duration) -> bool {
        let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        // The flag is set before notifying under the lock, so checking it
        // under the lock cannot miss the wakeup.
        if self.is_stopped() {
            return true;
        }
        let _ = self
            .wake
            .wait_timeout(guard, d)
            .unwrap_or_else(|p| p.into_inner());
        self.is_stopped()
    }
}

/// Gives memory the allocator holds free back to the kernel every
/// [`Trimmer::INTERVAL`]. With hundreds of writer threads, glibc keeps one
/// heap per thread group and frees into whichever heap a block came from,
/// so memory freed by one thread (a batch buffer passed on, a query's
/// connections closed) stays held: at 256 shards about a third of the
/// daemon's resident memory was free blocks. `malloc_trim` returns the
/// free pages of every heap (a few milliseconds).
pub struct Trimmer {
    stop: std::sync::Arc<Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Trimmer {
    pub const INTERVAL: Duration = Duration::from_secs(2);

    /// Starts the thread; `None` if no thread could be had (nothing is
    /// trimmed then, which costs memory, not correctness).
    pub fn start() -> Option<Trimmer> {
        let stop = std::sync::Arc::new(Stop::default());
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("trim".to_string())
            .spawn(move || {
                while !s.sleep(Trimmer::INTERVAL) {
                    // glibc's; other C libraries have no such call (the
                    // thread then only sleeps).
                    // SAFETY: malloc_trim only releases free memory of the
                    // allocator's heaps; no live allocation is touched.
                    #[cfg(target_env = "gnu")]
                    unsafe {
                        libc::malloc_trim(0);
                    }
                }
            })
            .ok()?;
        Some(Trimmer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Trimmer {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
