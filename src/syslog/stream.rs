//! The stream socket variant, for messages longer than a datagram and for
//! senders that keep a connection (`logger --socket-errors=on -T`,
//! rsyslog's omuxsock peers).
//!
//! Framing (RFC 6587), decided per message: a message that starts with a
//! digit is octet-counted (`LEN SP MSG`); anything else ends at a newline.
//! A frame longer than [`FRAME_BYTES_MAX`] is cut (the rest is read and
//! dropped) and stored with its length. The sender's credentials are the
//! connection's (SO_PEERCRED), read once at accept.
//!
//! Bounds: at most [`CONNECTIONS_MAX`] connections at once, and at most
//! [`CONNECTIONS_PER_UID_MAX`] of them from one uid (root excepted, see
//! there); a connection past either is closed at accept and counted
//! (`rejected_connections`, `rejected_connections_share`). Each holds one
//! thread and a [`FRAME_BYTES_MAX`] buffer, and is closed after
//! [`IDLE_MAX`] without data.

use super::record::{Credentials, Ingest, Transport};
use super::SyslogStats;
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The longest frame kept whole.
pub const FRAME_BYTES_MAX: usize = 64 << 10;
/// Connections served at once; more are closed at accept (and counted).
pub const CONNECTIONS_MAX: u64 = 256;
/// Connections one uid may hold at once, so that one user cannot take
/// every slot; more from it are closed at accept (and counted). Root is
/// held to [`CONNECTIONS_MAX`] only: its services are the host's own
/// loggers (which on a busy host may well keep more than a share of
/// connections open), and a root process can stop eventd anyway, so a share
/// would protect nothing from it. Connections without credentials share one
/// budget, under uid `u32::MAX`.
pub const CONNECTIONS_PER_UID_MAX: u32 = 32;
const _: () = assert!((CONNECTIONS_PER_UID_MAX as u64) < CONNECTIONS_MAX);
/// How often a blocked read looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(500);
/// A connection that sends nothing for this long is closed (its slot is
/// for someone else).
const IDLE_MAX: Duration = Duration::from_secs(600);

/// A listener's connections and their bounds (the syslog stream socket's,
/// and, with a budget of its own, the service-output socket's).
pub(crate) struct Shared {
    pub stats: Arc<SyslogStats>,
    pub stop: Arc<AtomicBool>,
    pub connections: AtomicU64,
    /// Connections open now per uid (an entry goes when its count reaches
    /// 0, so there are at most [`CONNECTIONS_MAX`] entries). Only the
    /// accept thread adds; connection threads subtract as they end.
    pub per_uid: std::sync::Mutex<HashMap<u32, u32>>,
    /// Connection threads, joined at stop.
    pub threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Shared {
    pub(crate) fn new(stats: Arc<SyslogStats>, stop: Arc<AtomicBool>) -> Shared {
        Shared {
            stats,
            stop,
            connections: AtomicU64::new(0),
            per_uid: std::sync::Mutex::new(HashMap::new()),
            threads: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn shares(&self) -> std::sync::MutexGuard<'_, HashMap<u32, u32>> {
        // Counts are whole after every update; nothing is left half-done.
        self.per_uid.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one of `uid`'s share, unless it holds its whole share.
    fn take_share(&self, uid: u32) -> bool {
        let mut shares = self.shares();
        let held = shares.entry(uid).or_insert(0);
        if uid != 0 && *held >= CONNECTIONS_PER_UID_MAX {
            return false;
        }
        *held += 1;
        true
    }

    fn give_share_back(&self, uid: u32) {
        let mut shares = self.shares();
        if let Some(held) = shares.get_mut(&uid) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                shares.remove(&uid);
            }
        }
    }
}

/// A connection let in: its slot and its uid's share, given back when
/// dropped (when its thread ends, or when the thread could not start).
pub(crate) struct Admitted {
    shared: Arc<Shared>,
    uid: u32,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.shared.give_share_back(self.uid);
        self.shared.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a connection was closed at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its uid holds its share ([`CONNECTIONS_PER_UID_MAX`]).
    Share,
    /// [`CONNECTIONS_MAX`] are open.
    Total,
}

impl Shared {
    /// Lets a connection from `uid` in: the uid's share first (a uid over
    /// it is refused for that reason even when the total is also
    /// reached), then the total. A refusal is counted.
    pub(crate) fn admit(self: &Arc<Self>, uid: u32) -> Result<Admitted, Refused> {
        if !self.take_share(uid) {
            self.stats
                .rejected_connections_share
                .fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Share);
        }
        let taken = self
            .connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < CONNECTIONS_MAX).then_some(n + 1)
            });
        if taken.is_err() {
            self.give_share_back(uid);
            self.stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Total);
        }
        Ok(Admitted {
            shared: self.clone(),
            uid,
        })
    }

    /// Serves an admitted connection on a thread of its own (`name`),
    /// joined at stop; its slot is given back when `serve` returns.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        name: &str,
        admitted: Admitted,
        serve: impl FnOnce(&Shared) + Send + 'static,
    ) {
        let inner = self.clone();
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _admitted = admitted;
                serve(&inner);
            });
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        // Finished connections are joined as new ones come: the list stays
        // as long as the connections open now.
        threads.retain(|t| !t.is_finished());
        match spawned {
            Ok(t) => threads.push(t),
            // The closure, and with it the admission, was dropped unrun:
            // the slot is back already.
            Err(e) => tracing::error!(
                error = %e,
                "{name} connection dropped: cannot start a thread"
            ),
        }
    }
}

/// Accepts connections until `wake_fd` (an eventfd) is written at stop.
/// It waits in `poll` on both rather than in `accept`, so stopping never
/// shuts the listener down: a listener the service manager passed stays
/// usable for the next eventd.
pub(super) fn accept_loop(
    listener: UnixListener,
    wake_fd: std::os::fd::RawFd,
    ingest: Ingest,
    shared: Arc<Shared>,
) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
    while super::recvmmsg::wait(fd, wake_fd) {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let stream = match listener.accept().map(|(s, _)| s) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "syslog stream socket: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let creds = peer(&stream);
        let uid = creds.map_or(u32::MAX, |c| c.uid);
        // A refused connection is closed as the stream drops.
        let Ok(admitted) = shared.admit(uid) else {
            continue;
        };
        let ingest = ingest.clone();
        shared.spawn("syslog-stream", admitted, move |inner| {
            serve(stream, creds, ingest, inner)
        });
    }
}

/// The credentials of a connection's peer (SO_PEERCRED): the process that
/// connected, as it was when it connected.
pub(crate) fn peer(stream: &UnixStream) -> Option<Credentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket, and a ucred-sized buffer with its length.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(Credentials {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

fn serve(stream: UnixStream, creds: Option<Credentials>, mut ingest: Ingest, shared: &Shared) {
    ingest.pin_sender(creds);
    let _ = stream.set_read_timeout(Some(STOP_CHECK));
    let mut reader = Frames::new(stream, &shared.stop);
    let mut frame = Vec::with_capacity(4096);
    loop {
        match reader.next_frame(&mut frame) {
            Ok(Some(len)) => ingest.deliver(&frame, len, creds, Transport::Stream),
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "syslog stream connection ended");
                return;
            }
        }
    }
}

/// A read buffer that can be asked to hold at least a few bytes (to tell
/// an octet count from text) and that waits out read timeouts, looking at
/// the stop flag.
pub(super) struct Frames<'s, R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    stop: &'s AtomicBool,
}

impl<'s, R: Read> Frames<'s, R> {
    pub(super) fn new(inner: R, stop: &'s AtomicBool) -> Self {
        Self::with_capacity(inner, stop, FRAME_BYTES_MAX)
    }

    fn with_capacity(inner: R, stop: &'s AtomicBool, capacity: usize) -> Self {
        Frames {
            inner,
            buf: vec![0; capacity.max(16)],
            start: 0,
            end: 0,
            eof: false,
            stop,
        }
    }

    fn available(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Reads until at least `n` bytes are buffered (at most the buffer's
    /// size) or the stream ends; false if fewer are there.
    fn ensure(&mut self, n: usize) -> std::io::Result<bool> {
        let n = n.min(self.buf.len());
        let mut idle = Duration::ZERO;
        while self.end - self.start < n && !self.eof {
            if self.stop.load(Ordering::Relaxed) {
                // Stopping: what is buffered is handled, nothing more read.
                self.eof = true;
                break;
            }
            if self.end == self.buf.len() {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => {
                    self.end += k;
                    idle = Duration::ZERO;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    idle += STOP_CHECK;
                    if idle >= IDLE_MAX {
                        self.eof = true;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.end - self.start >= n)
    }

    fn consume(&mut self, n: usize) {
        self.start += n.min(self.end - self.start);
    }

    /// Reads the next frame into `frame` (cut at [`FRAME_BYTES_MAX`]);
    /// returns its full length, or `None` at the end of the stream.
    pub(super) fn next_frame(&mut self, frame: &mut Vec<u8>) -> std::io::Result<Option<usize>> {
        frame.clear();
        // Skip blank lines between frames.
        loop {
            if !self.ensure(1)? {
                return Ok(None);
            }
            let blank = self
                .available()
                .iter()
                .take_while(|&&b| b == b'\n' || b == b'\r')
                .count();
            if blank == 0 {
                break;
            }
            self.consume(blank);
        }
        if let Some(len) = self.octet_count()? {
            return self.read_counted(frame, len).map(Some);
        }
        let mut total = 0usize;
        loop {
            if !self.ensure(1)? {
                return Ok((total > 0).then_some(total));
            }
            let buf = self.available();
            let (chunk, end) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i, Some(i + 1)),
                None => (buf.len(), None),
            };
            let keep = chunk.min(FRAME_BYTES_MAX.saturating_sub(frame.len()));
            frame.extend_from_slice(&buf[..keep]);
            total += chunk;
            self.consume(end.unwrap_or(chunk));
            if end.is_some() {
                return Ok(Some(total));
            }
        }
    }

    /// `LEN SP <` at the start (RFC 6587 octet counting: a count, then a
    /// message, which starts with its priority): the count, with `LEN SP`
    /// consumed. Anything else (say, a line that starts with a year) is
    /// left for newline framing.
    fn octet_count(&mut self) -> std::io::Result<Option<usize>> {
        // Looks only as far as it must: a line that starts with a non-digit
        // is decided at once (a short line is not held up waiting for more).
        let mut need = 1;
        loop {
            let complete = self.ensure(need)?;
            let buf = self.available();
            let digits = buf.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits == 0 || digits > 9 {
                return Ok(None);
            }
            match (buf.get(digits), buf.get(digits + 1)) {
                (Some(b' '), Some(b'<')) => {
                    let len = buf[..digits]
                        .iter()
                        .fold(0usize, |v, d| v * 10 + usize::from(d - b'0'));
                    self.consume(digits + 1);
                    return Ok(Some(len));
                }
                (Some(b' '), None) | (None, _) => {
                    // Undecided: one more byte is needed, unless the
                    // stream ended first.
                    if !complete {
                        return Ok(None);
                    }
                    need = buf.len() + 1;
                }
                _ => return Ok(None),
            }
        }
    }

    fn read_counted(&mut self, frame: &mut Vec<u8>, len: usize) -> std::io::Result<usize> {
        let mut left = len;
        while left > 0 {
            if !self.ensure(1)? {
                // The sender stopped mid-frame: keep what came.
                return Ok(len - left);
            }
            let buf = self.available();
            let n = buf.len().min(left);
            let keep = n.min(FRAME_BYTES_MAX.saturating_sub(frame.len()));
            frame.extend_from_slice(&buf[..keep]);
            self.consume(n);
            left -= n;
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(input: &[u8]) -> Vec<(String, usize)> {
        let stop = AtomicBool::new(false);
        // A small buffer, and reads of 5 bytes at most: frames cross both.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                let n = out.len().min(5).min(self.0.len());
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut reader = Frames::with_capacity(Trickle(input), &stop, 32);
        let mut frame = Vec::new();
        let mut out = Vec::new();
        while let Some(len) = reader.next_frame(&mut frame).unwrap() {
            out.push((String::from_utf8_lossy(&frame).into_owned(), len));
        }
        out
    }

    #[test]
    fn octet_counted_and_newline_framed_messages_mix() {
        let got = frames(b"<13>first line\n11 <13>a\nb c d\n\n<14>last without newline");
        assert_eq!(
            got,
            vec![
                ("<13>first line".to_string(), 14),
                ("<13>a\nb c d".to_string(), 11),
                ("<14>last without newline".to_string(), 24),
            ]
        );
        // Digits that are not a length: an ordinary line.
        assert_eq!(
            frames(b"2026 was a year\n"),
            vec![("2026 was a year".to_string(), 15)]
        );
    }

    #[test]
    fn an_overlong_frame_is_cut_and_the_next_one_is_intact() {
        let mut input = vec![b'x'; FRAME_BYTES_MAX + 100];
        input.extend_from_slice(b"\n<13>next\n");
        let got = frames(&input);
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].0.len(), got[0].1),
            (FRAME_BYTES_MAX, FRAME_BYTES_MAX + 100)
        );
        assert_eq!(got[1], ("<13>next".to_string(), 8));
        // A count larger than what follows: what came is kept.
        assert_eq!(frames(b"100 <13>short"), vec![("<13>short".to_string(), 9)]);
    }
}
