//! The kernel log: a reader of `/dev/kmsg` (`KernelLog = true`) that puts
//! each record into eventd's own kernel ring (`KMES_DIR/kernel.ring`, cpu
//! `KERNEL_RING_CPU`, mode 0600), exactly once across eventd's restarts
//! within a boot.
//!
//! - [`record`]: one record as `/dev/kmsg` gives it, parsed.
//! - [`pump`]: the reading loop: records the ring already holds are passed
//!   over, a jump in the kernel's sequence numbers (the kernel overwrote
//!   records before eventd read them; `read` said EPIPE) becomes a report
//!   that the ring's drain stores as one `kernel_overwritten` gap row with
//!   the exact count, and the reader waits for room in its ring rather
//!   than overwrite what the drain has not read.
//! - [`state`]: the boot and next sequence number in `RUN_DIR/kernel.seq`,
//!   and the point a restart goes on from.
//!
//! Each record becomes an event: provider `kernel`, name the facility
//! (`kern` for the kernel's own, `user` for what programs write into
//! `/dev/kmsg`), the level of its priority, pid and uid 0, `ts` its kernel
//! timestamp on the wall clock, and in `fields`: `transport` `kernel`,
//! `kernel_seq`, `kernel_usec`, `facility`, `boot_id`, and each
//! continuation line (`subsystem`, `device`) under its key lower-cased.
//!
//! Its own thread, ring and drain: a flood of kernel records waits for its
//! own ring to have room and cannot overwrite syslog messages, nor hold up
//! the syslog receivers.

pub mod pump;
pub mod record;
pub mod state;

use crate::rings::CurrentRing;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The provider of kernel records.
pub const PROVIDER: &str = "kernel";
/// The kernel's log device.
pub const DEVICE: &str = "/dev/kmsg";

/// The state of the reader, for stats.
pub const STATE_OFF: u8 = 0;
pub const STATE_READING: u8 = 1;
pub const STATE_UNAVAILABLE: u8 = 2;

/// What the reader counts. Relaxed everywhere: monitoring only.
#[derive(Debug, Default)]
pub struct KernelStats {
    /// Records read from `/dev/kmsg` (those passed over included).
    pub read: AtomicU64,
    /// Records put into the kernel ring.
    pub stored: AtomicU64,
    /// Records passed over because the ring already held them (read again
    /// after a restart).
    pub skipped: AtomicU64,
    /// Records the kernel overwrote before eventd read them, and the
    /// reports (gap rows) that count them.
    pub lost: AtomicU64,
    pub loss_reports: AtomicU64,
    /// `read` answered EPIPE (the reader's position was overwritten).
    pub epipe: AtomicU64,
    /// Records that did not parse (counted, not stored).
    pub malformed: AtomicU64,
    /// Records the ring refused (it was replaced under the reader).
    pub emit_failures: AtomicU64,
    /// Times the reader waited for the drain to make room in its ring.
    pub ring_waits: AtomicU64,
    /// Other read errors.
    pub read_errors: AtomicU64,
    /// Records read before the reader first caught up, at its start.
    pub backlog: AtomicU64,
    /// The next kernel sequence number expected.
    pub next_seq: AtomicU64,
    /// [`STATE_OFF`], [`STATE_READING`] or [`STATE_UNAVAILABLE`].
    pub state: AtomicU8,
}

impl KernelStats {
    pub fn state_name(&self) -> &'static str {
        match self.state.load(Ordering::Relaxed) {
            STATE_READING => "reading",
            STATE_UNAVAILABLE => "unavailable",
            _ => "off",
        }
    }
}

/// `(boot_id, kernel_seq)` of a kernel record's fields text.
pub fn fields_seq(fields: &str) -> Option<(String, u64)> {
    let v: serde_json::Value = serde_json::from_str(fields).ok()?;
    Some((
        v.get("boot_id")?.as_str()?.to_string(),
        v.get("kernel_seq")?.as_u64()?,
    ))
}

/// The running reader; stops it when dropped.
pub struct KernelLog {
    stop: Arc<AtomicBool>,
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

/// What the reader is given.
pub struct KernelParts {
    /// eventd's kernel ring (the drain may replace it).
    pub ring: Arc<CurrentRing>,
    pub run_dir: PathBuf,
    pub stats: Arc<KernelStats>,
}

impl KernelLog {
    /// Opens `/dev/kmsg` and starts the reader. `None` (said once in the
    /// log, and in stats as `unavailable`) when the device cannot be opened
    /// (no CAP_SYSLOG under `kernel.dmesg_restrict = 1`, a container
    /// without it) or the position file cannot be: eventd goes on without
    /// the kernel log rather than not start at all.
    pub fn start(parts: KernelParts) -> Option<KernelLog> {
        let stats = parts.stats.clone();
        match Self::try_start(parts) {
            Ok(log) => Some(log),
            Err(why) => {
                stats.state.store(STATE_UNAVAILABLE, Ordering::Relaxed);
                tracing::error!(
                    "KernelLog is on, but the kernel log is not read: {why}; \
                     eventd goes on without it"
                );
                None
            }
        }
    }

    fn try_start(parts: KernelParts) -> Result<KernelLog, String> {
        let device = open_device(Path::new(DEVICE)).map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::EPERM) {
                " (reading it needs CAP_SYSLOG while kernel.dmesg_restrict = 1)"
            } else {
                ""
            };
            format!("cannot open {DEVICE}: {e}{hint}")
        })?;
        let (file, stored) = state::SeqFile::open(&parts.run_dir).map_err(|e| {
            format!(
                "cannot open {}: {e}",
                parts.run_dir.join(state::FILE_NAME).display()
            )
        })?;
        let boot = crate::trusted::boot::id();
        let resume = state::resume_point(stored.as_ref(), boot, &parts.ring.get());
        tracing::info!(
            device = DEVICE,
            next_seq = resume.next,
            first_start_of_boot = resume.next == 0,
            "kernel log read into the kernel ring"
        );
        let wake = eventfd().map_err(|e| format!("cannot make an eventfd: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut pump = pump::Pump::new(
            pump::Device {
                file: device,
                wake: wake.as_raw_fd(),
                stop: stop.clone(),
            },
            parts.ring,
            parts.stats.clone(),
            resume,
        )
        .with_state(file);
        parts.stats.state.store(STATE_READING, Ordering::Relaxed);
        let thread = std::thread::Builder::new()
            .name("kernel-log".into())
            .spawn(move || pump.run())
            .map_err(|e| format!("cannot start its thread: {e}"))?;
        Ok(KernelLog {
            stop,
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for KernelLog {
    fn drop(&mut self) {
        // Relaxed: the flag only asks the thread to end; the eventfd wakes
        // it, and the join orders everything after.
        self.stop.store(true, Ordering::Relaxed);
        let one = 1u64.to_ne_bytes();
        // SAFETY: an open eventfd and an 8-byte buffer, as eventfd wants.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `/dev/kmsg` for reading, non-blocking: a fresh descriptor starts at the
/// oldest record the kernel still holds.
fn open_device(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// A fresh close-on-exec eventfd (the reader's stop signal).
fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory preconditions; the result is checked
    // before it is owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
