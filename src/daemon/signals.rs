//! Signals without handlers: SIGTERM, SIGINT (stop) and SIGHUP (reload the
//! configuration) are blocked before
//! any thread starts (threads inherit the mask), and the main thread takes
//! them synchronously with `sigwait`.

/// The blocked shutdown signals.
pub struct ShutdownSignals {
    set: libc::sigset_t,
}

impl ShutdownSignals {
    /// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and in every thread it
    /// starts afterwards. Call before starting the daemon.
    pub fn block() -> std::io::Result<ShutdownSignals> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it fully
        // before any other use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, writable sigset_t; the signal numbers are
        // valid constants.
        let rc = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        Ok(ShutdownSignals { set })
    }

    /// Waits for SIGTERM, SIGINT or SIGHUP; returns its number.
    pub fn wait(&self) -> std::io::Result<i32> {
        let mut signal = 0;
        // SAFETY: `self.set` was initialised in `block`; `signal` is a valid
        // out pointer.
        let rc = unsafe { libc::sigwait(&self.set, &mut signal) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        Ok(signal)
    }
}
