//! The io_uring receive path: one multishot `recvmsg` request keeps
//! delivering datagrams (with their SCM_CREDENTIALS) into buffers the ring
//! was given beforehand, and one `io_uring_enter` collects every completion
//! that is ready, so a burst costs a few syscalls instead of one per
//! message.
//!
//! Buffers: [`BUFFERS`] slots of [`BUFFER_BYTES`], provided to the kernel as
//! group [`GROUP`]. Each completion names the slot it used; after the
//! message is stored the slot is provided again. When every slot is in use
//! the kernel ends the multishot request (ENOBUFS): the slots are given back
//! and the request is made again. Messages wait in the socket meanwhile;
//! nothing is lost.
//!
//! Waits last at most a second: a receive that stays armed yet delivers
//! nothing for two of them while the socket holds datagrams is cancelled
//! and made again (counted in `receive_errors`, said in the log), so that
//! a lost wake-up costs senders two seconds, not every send from then on.

use super::record::{control_messages, Ingest, Transport};
use super::recvmmsg::{CONTROL_BYTES, DATAGRAM_BYTES_MAX};
use super::SyslogStats;
use io_uring::{cqueue, opcode, types, IoUring};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

const ENTRIES: u32 = 256;
const BUFFERS: u16 = 128;
const GROUP: u16 = 7;
/// The kernel's `io_uring_recvmsg_out` header, the control room, a datagram.
const BUFFER_BYTES: usize = 16 + CONTROL_BYTES + DATAGRAM_BYTES_MAX;
const RECV: u64 = 1;
const PROVIDE: u64 = 2;
const WAKE: u64 = 3;
const CANCEL: u64 = 4;
/// Completion rounds waited for a cancelled receive's last completion.
const CANCEL_WAITS: u32 = 100;

/// Why io_uring cannot be used here.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("io_uring_setup failed: {0}")]
    Setup(std::io::Error),
    #[error("this kernel's io_uring lacks {0}")]
    Missing(&'static str),
    #[error("io_uring: {0}")]
    Io(std::io::Error),
}

/// The receiver, set up (ring created, operations probed, buffers given).
pub struct UringReceiver {
    // `run` cancels the receive and waits for its last completion before it
    // returns; should that not be confirmed, the buffers are leaked rather
    // than freed under a request the kernel may still complete. (Field
    // order also drops the ring first.)
    ring: IoUring,
    msghdr: Box<libc::msghdr>,
    buffers: Vec<u8>,
    /// A multishot receive is in flight (armed, no final completion yet).
    armed: bool,
    /// How the kernel runs the receive's work: "deferred" (to this
    /// thread's next io_uring_enter), "cooperative" or "default".
    task_running: &'static str,
}

impl UringReceiver {
    /// Sets io_uring up for the calling thread, which then runs it, or
    /// says why it cannot be (EPERM or ENOSYS from a
    /// seccomp profile, missing operations). A kernel that has the
    /// operations but not their multishot form (before 6.0) fails the first
    /// receive instead, and `run` returns the error.
    pub fn new() -> Result<Self, Unavailable> {
        // Deferred task running (one issuer: the calling thread, which
        // must be the one that runs the receiver): a datagram arriving
        // while this thread stores the last batch neither interrupts it
        // nor wakes it; the receive runs at its next io_uring_enter,
        // together with every other one queued meanwhile. Kernels before
        // 6.1 lack the flags and get the cooperative mode (5.19) or a
        // plain ring.
        let (ring, task_running) = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(ENTRIES)
            .map(|r| (r, "deferred"))
            .or_else(|_| {
                IoUring::builder()
                    .setup_coop_taskrun()
                    .build(ENTRIES)
                    .map(|r| (r, "cooperative"))
            })
            .or_else(|_| IoUring::new(ENTRIES).map(|r| (r, "default")))
            .map_err(Unavailable::Setup)?;
        let mut probe = io_uring::Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(Unavailable::Io)?;
        if !probe.is_supported(opcode::RecvMsgMulti::CODE) {
            return Err(Unavailable::Missing("recvmsg"));
        }
        if !probe.is_supported(opcode::ProvideBuffers::CODE) {
            return Err(Unavailable::Missing("provided buffers"));
        }
        // SAFETY: msghdr is plain data; all-zero is a valid value.
        let mut msghdr: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        // Multishot recvmsg reads only these two lengths: no name, room for
        // the credentials.
        msghdr.msg_namelen = 0;
        msghdr.msg_controllen = CONTROL_BYTES as _;
        Ok(UringReceiver {
            ring,
            msghdr,
            buffers: vec![0u8; BUFFERS as usize * BUFFER_BYTES],
            armed: false,
            task_running,
        })
    }

    /// How the kernel runs the receive's work (for the log).
    pub fn task_running(&self) -> &'static str {
        self.task_running
    }

    fn provide(&mut self, first: u16, count: u16) -> Result<(), Unavailable> {
        let start = first as usize * BUFFER_BYTES;
        let entry = opcode::ProvideBuffers::new(
            self.buffers[start..].as_mut_ptr(),
            BUFFER_BYTES as i32,
            count,
            GROUP,
            first,
        )
        .build()
        .user_data(PROVIDE);
        self.push(entry)
    }

    fn arm(&mut self, fd: RawFd) -> Result<(), Unavailable> {
        // MSG_TRUNC: the completion reports a cut datagram's real length.
        // MSG_CMSG_CLOEXEC: descriptors a sender passes (closed at once,
        // see `control_messages`) never leak into a child process.
        let entry = opcode::RecvMsgMulti::new(types::Fd(fd), &*self.msghdr, GROUP)
            .flags((libc::MSG_TRUNC | libc::MSG_CMSG_CLOEXEC) as u32)
            .build()
            .user_data(RECV);
        self.push(entry)?;
        self.armed = true;
        Ok(())
    }

    fn push(&mut self, entry: io_uring::squeue::Entry) -> Result<(), Unavailable> {
        loop {
            // SAFETY: every entry points into `buffers` or `msghdr`, which
            // live as long as the ring (see the field order).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            // The submission queue is full: hand it to the kernel.
            self.ring.submit().map_err(Unavailable::Io)?;
        }
    }

    /// Receives until `stop` is set and `wake_fd` (an eventfd) is written.
    pub fn run(
        mut self,
        fd: RawFd,
        wake_fd: RawFd,
        ingest: &mut Ingest,
        stats: &SyslogStats,
        stop: &AtomicBool,
    ) -> Result<(), Unavailable> {
        self.provide(0, BUFFERS)?;
        self.arm(fd)?;
        // Shutting a datagram socket down does not end a multishot receive:
        // at stop, the eventfd's readiness does.
        let wake = opcode::PollAdd::new(types::Fd(wake_fd), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        self.push(wake)?;
        let mut done: Vec<(u64, i32, u32)> = Vec::with_capacity(ENTRIES as usize * 2);
        let result = self.serve(fd, ingest, stats, stop, &mut done);
        // Whatever ended the loop, the receive request is cancelled and its
        // last completion seen before the buffers can be freed.
        if !self.cancel(ingest, stats, &mut done) {
            tracing::warn!("the io_uring receive did not confirm its cancellation; its buffers are left allocated");
            std::mem::forget(std::mem::take(&mut self.buffers));
        }
        result
    }

    fn serve(
        &mut self,
        fd: RawFd,
        ingest: &mut Ingest,
        stats: &SyslogStats,
        stop: &AtomicBool,
        done: &mut Vec<(u64, i32, u32)>,
    ) -> Result<(), Unavailable> {
        // Waits are bounded where the kernel can (5.11 and later), so that
        // a receive that stops delivering is noticed (see `StallWatch`).
        let period = types::Timespec::new().sec(STALL_CHECK_SECS);
        let bounded = types::SubmitArgs::new().timespec(&period);
        let can_bound = self.ring.params().is_feature_ext_arg();
        let mut watch = StallWatch::default();
        loop {
            let waited = if can_bound {
                self.ring.submitter().submit_with_args(1, &bounded)
            } else {
                self.ring.submit_and_wait(1)
            };
            match waited {
                Ok(_) => watch.saw_completions(),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ETIME) => {
                    if watch.quiet_period(self.armed && readable(fd)) {
                        self.receive_again(fd, ingest, stats, done)?;
                    }
                    continue;
                }
                Err(e) => return Err(Unavailable::Io(e)),
            }
            stats.receive_calls.fetch_add(1, Ordering::Relaxed);
            let outcome = self.complete(ingest, stats, done);
            // Every completion was handled (stored, or counted as dropped
            // at stop) before the loop may end.
            let Completions {
                woken,
                ended,
                failed,
            } = outcome?;
            if woken && stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if let Some(e) = failed {
                // A receive that fails without ENOBUFS would fail again at
                // once (a kernel without multishot recvmsg answers EINVAL):
                // the caller falls back to recvmmsg.
                return Err(Unavailable::Io(e));
            }
            if ended {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                self.arm(fd)?;
            }
        }
    }

    /// Cancels a receive that stopped delivering and makes it again.
    fn receive_again(
        &mut self,
        fd: RawFd,
        ingest: &mut Ingest,
        stats: &SyslogStats,
        done: &mut Vec<(u64, i32, u32)>,
    ) -> Result<(), Unavailable> {
        stats.receive_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            waited_s = STALL_CHECK_SECS * u64::from(STALL_PERIODS),
            "the io_uring receive delivered nothing while datagrams waited on the syslog \
             socket; it is cancelled and made again"
        );
        if !self.cancel(ingest, stats, done) {
            return Err(Unavailable::Io(std::io::Error::other(
                "the stalled io_uring receive could not be cancelled",
            )));
        }
        self.arm(fd)
    }

    /// Handles every completion that is ready.
    fn complete(
        &mut self,
        ingest: &mut Ingest,
        stats: &SyslogStats,
        done: &mut Vec<(u64, i32, u32)>,
    ) -> Result<Completions, Unavailable> {
        done.clear();
        done.extend(
            self.ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        let mut outcome = Completions::default();
        for &(what, result, flags) in done.iter() {
            match what {
                WAKE => outcome.woken = true,
                PROVIDE if result < 0 => {
                    return Err(Unavailable::Io(std::io::Error::from_raw_os_error(-result)));
                }
                RECV => {
                    if !cqueue::more(flags) {
                        outcome.ended = true;
                        self.armed = false;
                    }
                    if result < 0 {
                        if result != -libc::ENOBUFS && result != -libc::ECANCELED {
                            stats.receive_errors.fetch_add(1, Ordering::Relaxed);
                            outcome.failed = Some(std::io::Error::from_raw_os_error(-result));
                        }
                        continue;
                    }
                    let Some(slot) = cqueue::buffer_select(flags) else {
                        continue;
                    };
                    self.deliver(slot, result as usize, ingest, stats);
                    self.provide(slot, 1)?;
                }
                _ => {}
            }
        }
        Ok(outcome)
    }

    /// Stores the message in buffer `slot` (`used` bytes of it).
    fn deliver(&self, slot: u16, used: usize, ingest: &mut Ingest, stats: &SyslogStats) {
        let start = slot as usize * BUFFER_BYTES;
        // The kernel never reports more than the buffer it was given.
        let used = &self.buffers[start..start + used.min(BUFFER_BYTES)];
        match types::RecvMsgOut::parse(used, &self.msghdr) {
            Ok(out) => {
                let creds = control_messages(out.control_data());
                let payload = out.payload_data();
                let len = out.incoming_payload_len() as usize;
                ingest.deliver(payload, len.max(payload.len()), creds, Transport::Datagram);
            }
            Err(()) => {
                stats.receive_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Cancels the receive request and waits (boundedly) for its final
    /// completion, handling what still arrives. True once the kernel has
    /// said the request is over.
    fn cancel(
        &mut self,
        ingest: &mut Ingest,
        stats: &SyslogStats,
        done: &mut Vec<(u64, i32, u32)>,
    ) -> bool {
        if !self.armed {
            return true;
        }
        let entry = opcode::AsyncCancel::new(RECV).build().user_data(CANCEL);
        if self.push(entry).is_err() {
            return false;
        }
        for _ in 0..CANCEL_WAITS {
            if self.ring.submit_and_wait(1).is_err() {
                return false;
            }
            if self.complete(ingest, stats, done).is_err() {
                return false;
            }
            // The receive's final completion was seen (here or before the
            // cancellation reached it).
            if !self.armed {
                return true;
            }
        }
        false
    }
}

/// Seconds a bounded wait lasts before the receiver looks at its socket.
const STALL_CHECK_SECS: u64 = 1;
/// Quiet periods in a row with datagrams waiting that mean the receive
/// stopped delivering.
const STALL_PERIODS: u32 = 2;

/// Notices a multishot receive that is armed yet delivers nothing while
/// the socket holds datagrams: once seen on a kernel under SIGSTOP and
/// SIGCONT of eventd (its poll waited with datagrams queued and every
/// sender blocked). Two quiet periods in a row, not one, so that a
/// datagram arriving just as a wait timed out is not taken for a stall.
#[derive(Default)]
struct StallWatch {
    quiet_with_data: u32,
}

impl StallWatch {
    fn saw_completions(&mut self) {
        self.quiet_with_data = 0;
    }

    /// A wait ended with no completion; `waiting` is whether the receive
    /// is armed and the socket has datagrams. True: make it again.
    fn quiet_period(&mut self, waiting: bool) -> bool {
        self.quiet_with_data = if waiting { self.quiet_with_data + 1 } else { 0 };
        if self.quiet_with_data >= STALL_PERIODS {
            self.quiet_with_data = 0;
            return true;
        }
        false
    }
}

/// Whether `fd` has something to read now.
fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout: poll only reports.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLIN != 0
}

/// What one round of completions said.
#[derive(Default)]
struct Completions {
    /// The stop eventfd fired.
    woken: bool,
    /// The multishot receive ended (it must be made again).
    ended: bool,
    /// The receive failed for another reason than running out of buffers.
    failed: Option<std::io::Error>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_quiet_periods_in_a_row_with_data_waiting_mean_a_stall() {
        let mut w = StallWatch::default();
        assert!(!w.quiet_period(true));
        w.saw_completions();
        assert!(!w.quiet_period(true), "a completion in between resets");
        assert!(!w.quiet_period(false));
        assert!(!w.quiet_period(true), "an empty socket in between resets");
        assert!(w.quiet_period(true));
        assert!(!w.quiet_period(true), "counted afresh after a stall");
        assert!(w.quiet_period(true));
    }

    #[test]
    fn a_socket_with_a_datagram_is_readable_and_an_empty_one_not() {
        use std::os::fd::AsRawFd;
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        assert!(!readable(b.as_raw_fd()));
        a.send(b"x").unwrap();
        assert!(readable(b.as_raw_fd()));
    }
}
