//! The portable receive path: `recvmmsg(2)` takes up to [`BATCH`]
//! datagrams per call, each with its SCM_CREDENTIALS. Used where io_uring
//! is not available (an old kernel, a seccomp profile) or not wanted.

use super::record::{control_messages, Credentials};
use super::SyslogStats;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Datagrams per call.
pub const BATCH: usize = 64;
/// Bytes kept of one datagram; longer ones are cut (and say so).
pub const DATAGRAM_BYTES_MAX: usize = 16 << 10;
/// Room for one SCM_CREDENTIALS message (CMSG_SPACE of a ucred).
pub const CONTROL_BYTES: usize = 64;

/// Receives until `stop` is set and `wake_fd` (an eventfd) is written,
/// handing each datagram to `deliver` (its kept bytes, its length as sent,
/// the sender's credentials).
pub fn run(
    fd: RawFd,
    wake_fd: RawFd,
    deliver: &mut impl FnMut(&[u8], usize, Option<Credentials>),
    stats: &SyslogStats,
    stop: &AtomicBool,
) {
    let mut data = vec![0u8; BATCH * DATAGRAM_BYTES_MAX];
    let mut control = vec![0u8; BATCH * CONTROL_BYTES];
    let mut iovecs: Vec<libc::iovec> = (0..BATCH)
        .map(|i| libc::iovec {
            // SAFETY (of the later use): `data` outlives every recvmmsg
            // call below and is not touched while the kernel writes it.
            iov_base: data[i * DATAGRAM_BYTES_MAX..].as_mut_ptr().cast(),
            iov_len: DATAGRAM_BYTES_MAX,
        })
        .collect();
    // SAFETY: mmsghdr is plain data; all-zero is a valid value.
    let mut headers: Vec<libc::mmsghdr> =
        (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
    loop {
        for (i, h) in headers.iter_mut().enumerate() {
            h.msg_hdr.msg_iov = &mut iovecs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = control[i * CONTROL_BYTES..].as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = CONTROL_BYTES as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // MSG_DONTWAIT: take what is queued (up to BATCH) without waiting;
        // when nothing is, wait in poll for the socket or the stop eventfd
        // (shutting a datagram socket down does not wake its receiver).
        // MSG_TRUNC: msg_len is the datagram's real length.
        // SAFETY: every header points into `data`/`control`, sized as
        // declared, alive for the call.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                headers.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC | libc::MSG_CMSG_CLOEXEC,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if e.kind() == std::io::ErrorKind::WouldBlock {
                if stop.load(Ordering::Relaxed) || !wait(fd, wake_fd) {
                    return;
                }
                continue;
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            stats.receive_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "syslog socket: recvmmsg failed");
            // Bounded: do not spin on a persistent error.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        if n == 0 {
            // Only a shut-down socket returns nothing without EAGAIN.
            if stop.load(Ordering::Relaxed) {
                return;
            }
            continue;
        }
        stats.receive_calls.fetch_add(1, Ordering::Relaxed);
        for (i, h) in headers.iter().take(n as usize).enumerate() {
            let len = h.msg_len as usize;
            let kept = len.min(DATAGRAM_BYTES_MAX);
            let bytes = &data[i * DATAGRAM_BYTES_MAX..i * DATAGRAM_BYTES_MAX + kept];
            // size_t on glibc, socklen_t elsewhere.
            #[allow(clippy::unnecessary_cast)]
            let control_len = (h.msg_hdr.msg_controllen as usize).min(CONTROL_BYTES);
            let creds =
                control_messages(&control[i * CONTROL_BYTES..i * CONTROL_BYTES + control_len]);
            deliver(bytes, len, creds);
        }
    }
}

/// Waits until the socket is readable (true: a datagram, or a connection
/// to accept) or the eventfd is written (false: stop).
pub(super) fn wait(fd: RawFd, wake_fd: RawFd) -> bool {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake_fd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: two valid pollfd entries.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return fds[1].revents == 0;
    }
}
