//! The gate: the query socket's accept thread, and the connections it holds
//! until their request line is in.
//!
//! One thread accepts every connection and waits, with `poll`, for the
//! request lines of all of them at once. A connection gets a thread (and,
//! for a query, a slot) only once its whole request line is in
//! (the server's dispatch, handed to [`run`]): one that sends nothing costs a descriptor
//! and a buffer here, never a thread or a query slot. What it bounds:
//!
//! - **Who waits.** A peer that may not read events is answered `denied` at
//!   accept, without waiting for anything.
//! - **How many wait.** At most [`Limits::pending_max`] connections
//!   (2·MaxConcurrentQueries, at most [`PENDING_MAX`]) wait for their
//!   request at once, at most [`Limits::pending_share`] of them (an eighth,
//!   at least one) from one uid, root and eventd's own user excepted. A new
//!   connection past its uid's share cuts that uid's oldest waiting
//!   connection; one past the total cuts the oldest waiting connection of
//!   the uid with the most waiting. So a flood, however fast it reconnects,
//!   only ever cuts its own: a new uid, root and eventd's own user always
//!   get in. A connection about to be cut is read once more first (its
//!   request may have just come); a cut one is answered `busy`, saying why.
//! - **How long.** The whole request line within
//!   [`REQUEST_DEADLINE`] of the accept, at most
//!   [`REQUEST_BYTES_MAX`] bytes; otherwise `bad_request`.
//! - **Memory.** What a waiting connection sent so far, at most
//!   [`REQUEST_BYTES_MAX`] + 4 KiB each.
//!
//! Every answer given here is written without blocking ([`refuse`]).

use super::peer::Access;
use super::peer::{peer_credentials, peer_groups};
use super::protocol::{error_line, ErrorCode, Request, REQUEST_BYTES_MAX};
use super::slots::ShareRule;
use super::stats::QueryStats;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The whole request line must have arrived this long after the accept.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// What the gate needs of the server: who may read, its counters, its
/// stop flag, and the bounds.
pub(super) struct GateParts {
    pub access: Access,
    pub stats: Arc<QueryStats>,
    pub stop: Arc<AtomicBool>,
    pub limits: Limits,
    /// The slots' rule: who the per-uid bounds do not hold.
    pub rule: ShareRule,
}

/// Connections waiting for their request at most, whatever
/// MaxConcurrentQueries is: each may hold a request's bytes.
pub const PENDING_MAX: usize = 1024;
/// Connections accepted in one turn of the loop before the waiting ones
/// are looked at again.
const ACCEPT_BATCH: usize = 64;
/// The longest the loop sleeps without looking at the stop flag (stopping
/// also wakes it at once: the listener is shut down).
const STOP_CHECK: Duration = Duration::from_millis(500);
/// Bytes a refused peer may have sent that are read (and dropped) before
/// answering it: a whole request, and one more buffer.
const REFUSAL_READ_BYTES_MAX: usize = REQUEST_BYTES_MAX + READ_BYTES;
const READ_BYTES: usize = 4096;
/// Refusals logged per second at most (the rest are counted only).
const REFUSAL_LOGS_PER_SECOND: u32 = 4;

/// How many connections may wait for their request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    /// In all: 2·MaxConcurrentQueries, at most [`PENDING_MAX`].
    pub pending_max: usize,
    /// From one uid (root and eventd's own user excepted): an eighth of
    /// `pending_max`, at least one.
    pub pending_share: usize,
}

impl Limits {
    pub fn new(max_queries: u64) -> Limits {
        let pending_max = usize::try_from(max_queries.saturating_mul(2))
            .unwrap_or(PENDING_MAX)
            .clamp(1, PENDING_MAX);
        Limits {
            pending_max,
            pending_share: (pending_max / 8).max(1),
        }
    }

    /// Which of the connections waiting now (their uids, oldest first) a
    /// new one of `uid` cuts, and what it is told: the uid's own oldest
    /// when it holds its share (`limited`: not root, not eventd's own
    /// user), else the oldest of the uid with the most waiting (of two with
    /// as many, the one whose oldest is older) when all places are taken.
    pub fn victim(&self, waiting: &[u32], uid: u32, limited: bool) -> Option<(usize, String)> {
        let mine = waiting.iter().filter(|&&u| u == uid).count();
        if limited && mine >= self.pending_share {
            let i = waiting.iter().position(|&u| u == uid)?;
            let why = format!(
                "cut before its request came: uid {uid} had {mine} connections waiting \
                 for their request, its share of the {} that may wait at once; send the \
                 request as soon as the connection is made",
                self.pending_max
            );
            return Some((i, why));
        }
        if waiting.len() < self.pending_max {
            return None;
        }
        let mut count: HashMap<u32, usize> = HashMap::new();
        for &u in waiting {
            *count.entry(u).or_default() += 1;
        }
        // Oldest first, so the first entry of the largest count is the one.
        let most = count.values().copied().max()?;
        let i = waiting.iter().position(|u| count.get(u) == Some(&most))?;
        let why = format!(
            "cut before its request came: {} connections were waiting for their \
             request and uid {} had the most of them",
            waiting.len(),
            waiting[i]
        );
        Some((i, why))
    }
}

/// Who is on the other end of an accepted connection.
pub(super) struct Peer {
    pub stream: UnixStream,
    pub pid: i32,
    pub uid: u32,
}

/// A connection whose request line is not all in yet.
struct Pending {
    peer: Peer,
    accepted: Instant,
    /// What it sent so far (the newline not yet among it).
    line: Vec<u8>,
}

/// How a connection's wait for its request ended.
enum Finished {
    /// The line is in (up to its newline, or all it sent before closing).
    Line,
    /// It sent more than [`REQUEST_BYTES_MAX`] bytes without a newline.
    TooLong,
    /// The connection failed.
    Failed(std::io::Error),
}

/// The accept thread: accepts, reads requests, dispatches them, cuts what
/// waits too long or too much, until the server stops.
/// `dispatch` takes each connection whose request is in (with the log that
/// rate-limits refusals).
pub(super) fn run(
    listener: UnixListener,
    parts: GateParts,
    dispatch: impl FnMut(Peer, Request, &mut RefusalLog),
) {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!(error = %e, "query socket: cannot serve (non-blocking accept)");
        return;
    }
    let mut gate = Gate {
        parts,
        dispatch,
        pending: Vec::new(),
        log: RefusalLog::default(),
    };
    while !gate.parts.stop.load(Ordering::Relaxed) {
        let (listener_ready, ready) = gate.wait(&listener);
        // Requests first: a connection whose request came is never cut
        // for the room a newer one needs.
        for i in ready.into_iter().rev() {
            if let Some(end) = read_more(&mut gate.pending[i]) {
                let p = gate.pending.remove(i);
                gate.finish(p, end);
            }
        }
        if listener_ready {
            gate.accept_some(&listener);
        }
        gate.cut_expired(Instant::now());
    }
}

struct Gate<D> {
    parts: GateParts,
    dispatch: D,
    /// Oldest first.
    pending: Vec<Pending>,
    log: RefusalLog,
}

impl<D: FnMut(Peer, Request, &mut RefusalLog)> Gate<D> {
    /// Waits until the listener or a waiting connection is readable, the
    /// next request deadline, or [`STOP_CHECK`]: whether the listener is
    /// ready, and the indices of the waiting connections that are.
    fn wait(&self, listener: &UnixListener) -> (bool, Vec<usize>) {
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(self.pending.iter().map(|p| p.peer.stream.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let now = Instant::now();
        let next_deadline = self
            .pending
            .first()
            .map(|p| (p.accepted + REQUEST_DEADLINE).saturating_duration_since(now));
        let timeout = next_deadline.map_or(STOP_CHECK, |d| d.min(STOP_CHECK));
        // Rounded up, so that a deadline less than 1 ms away is not polled
        // for with 0 again and again.
        let timeout_ms = timeout.as_micros().div_ceil(1000) as libc::c_int;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries,
        // each naming a descriptor this thread owns and keeps open.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n <= 0 {
            // Timed out, or interrupted (EINTR): nothing ready.
            return (false, Vec::new());
        }
        let ready = fds[1..]
            .iter()
            .enumerate()
            .filter(|(_, f)| f.revents != 0)
            .map(|(i, _)| i)
            .collect();
        (fds[0].revents != 0, ready)
    }

    /// Accepts up to [`ACCEPT_BATCH`] connections.
    fn accept_some(&mut self, listener: &UnixListener) {
        for _ in 0..ACCEPT_BATCH {
            match listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if !self.parts.stop.load(Ordering::Relaxed) {
                        tracing::warn!(error = %e, "query socket: accept failed");
                        // Bounded: do not spin on a persistent error.
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    return;
                }
            }
        }
    }

    /// A new connection: refused if its peer may not read events, handled
    /// at once if its request is already in, or waiting (room made first).
    fn admit(&mut self, stream: UnixStream) {
        let accepted = Instant::now();
        let (pid, uid, gid) = match peer_credentials(&stream) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "query connection without peer credentials");
                return;
            }
        };
        if !self.parts.access.allows(uid, gid, &peer_groups(&stream)) {
            self.parts
                .stats
                .refused_denied
                .fetch_add(1, Ordering::Relaxed);
            if self.log.allow(accepted) {
                tracing::info!(
                    pid,
                    uid,
                    gid,
                    "query refused: this peer may not read events"
                );
            }
            let message = format!(
                "uid {uid} may not read events: only root, eventd's own user and \
                 members of the query group may"
            );
            refuse(stream, ErrorCode::Denied, &message);
            return;
        }
        if let Err(e) = stream.set_nonblocking(true) {
            tracing::warn!(error = %e, "query connection dropped: cannot read it without blocking");
            return;
        }
        let mut p = Pending {
            peer: Peer { stream, pid, uid },
            accepted,
            line: Vec::new(),
        };
        match read_more(&mut p) {
            None => {
                self.make_room_for(uid);
                self.pending.push(p);
            }
            Some(end) => self.finish(p, end),
        }
    }

    /// Before a connection of `uid` joins the waiting ones: cuts the one
    /// the bounds say must go, if any.
    fn make_room_for(&mut self, uid: u32) {
        let limited = !self.parts.rule.unlimited(uid);
        let waiting: Vec<u32> = self.pending.iter().map(|p| p.peer.uid).collect();
        let Some((victim, why)) = self.parts.limits.victim(&waiting, uid, limited) else {
            return;
        };
        let mut p = self.pending.remove(victim);
        match read_more(&mut p) {
            None => {
                self.parts
                    .stats
                    .refused_busy
                    .fetch_add(1, Ordering::Relaxed);
                if self.log.allow(Instant::now()) {
                    tracing::info!(
                        pid = p.peer.pid,
                        uid = p.peer.uid,
                        "query connection cut: {why}"
                    );
                }
                refuse(p.peer.stream, ErrorCode::Busy, &why);
            }
            Some(end) => self.finish(p, end),
        }
    }

    /// Cuts every connection whose request deadline passed (read once more
    /// first: the last bytes may just have come).
    fn cut_expired(&mut self, now: Instant) {
        while self
            .pending
            .first()
            .is_some_and(|p| now >= p.accepted + REQUEST_DEADLINE)
        {
            let mut p = self.pending.remove(0);
            match read_more(&mut p) {
                None => {
                    let message = format!(
                        "no complete request line within {} s of connecting",
                        REQUEST_DEADLINE.as_secs()
                    );
                    self.bad_request(p.peer, &message);
                }
                Some(end) => self.finish(p, end),
            }
        }
    }

    /// A connection whose wait ended: its request dispatched, or its
    /// refusal answered.
    fn finish(&mut self, p: Pending, end: Finished) {
        let parsed = match end {
            Finished::Line => parse_request(&p.line),
            Finished::TooLong => Err(format!("request longer than {REQUEST_BYTES_MAX} bytes")),
            Finished::Failed(e) => Err(format!("reading the request: {e}")),
        };
        match parsed {
            Ok(request) => (self.dispatch)(p.peer, request, &mut self.log),
            Err(message) => self.bad_request(p.peer, &message),
        }
    }

    fn bad_request(&self, peer: Peer, message: &str) {
        self.parts
            .stats
            .refused_bad_request
            .fetch_add(1, Ordering::Relaxed);
        refuse(peer.stream, ErrorCode::BadRequest, message);
    }
}

/// Reads what the peer sent since the last look, without blocking, until
/// its newline, the end of what it sent, or too many bytes: how the wait
/// ended, or `None` while the request is not all in.
fn read_more(p: &mut Pending) -> Option<Finished> {
    let mut chunk = [0u8; READ_BYTES];
    loop {
        match (&p.peer.stream).read(&mut chunk) {
            // Closed after the request without a newline: taken as whole.
            Ok(0) => return Some(Finished::Line),
            Ok(n) => {
                if let Some(i) = chunk[..n].iter().position(|&b| b == b'\n') {
                    // Bytes after the newline are ignored.
                    p.line.extend_from_slice(&chunk[..i]);
                    return Some(Finished::Line);
                }
                p.line.extend_from_slice(&chunk[..n]);
                if p.line.len() > REQUEST_BYTES_MAX {
                    return Some(Finished::TooLong);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Some(Finished::Failed(e)),
        }
    }
}

/// The request a whole line holds, or what is wrong with it.
fn parse_request(line: &[u8]) -> Result<Request, String> {
    if line.len() > REQUEST_BYTES_MAX {
        return Err(format!("request longer than {REQUEST_BYTES_MAX} bytes"));
    }
    let line = String::from_utf8_lossy(line);
    if line.trim().is_empty() {
        return Err("empty request: send one JSON object on one line".to_string());
    }
    serde_json::from_str(&line).map_err(|e| format!("malformed request: {e}"))
}

/// At most [`REFUSAL_LOGS_PER_SECOND`] refusals logged per second: a flood
/// of refused connections is counted, not written to the log one by one.
#[derive(Default)]
pub(super) struct RefusalLog {
    second: Option<Instant>,
    logged: u32,
}

impl RefusalLog {
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.second {
            Some(s) if now.duration_since(s) < Duration::from_secs(1) => {}
            _ => {
                self.second = Some(now);
                self.logged = 0;
            }
        }
        self.logged += 1;
        self.logged <= REFUSAL_LOGS_PER_SECOND
    }
}

/// Answers a connection with one error line without ever blocking (the
/// accept thread calls it): reads what the peer already sent, at most
/// [`REFUSAL_READ_BYTES_MAX`] bytes, so that the close does not reset the
/// connection before the peer reads the answer; writes the line if the
/// socket takes it whole at once (an empty socket buffer always does);
/// closes.
pub(super) fn refuse(mut stream: UnixStream, code: ErrorCode, message: &str) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = [0u8; READ_BYTES];
    let mut read = 0;
    while read < REFUSAL_READ_BYTES_MAX {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break, // WouldBlock: nothing more sent yet
        }
    }
    let mut line = error_line(code, message);
    line.push('\n');
    // One attempt: a peer whose buffer cannot take a few hundred bytes is
    // not waited for.
    let _ = stream.write(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_room_follows_max_concurrent_queries() {
        let l = |q| {
            let l = Limits::new(q);
            (l.pending_max, l.pending_share)
        };
        assert_eq!(l(1), (2, 1));
        assert_eq!(l(8), (16, 2));
        assert_eq!(l(128), (256, 32));
        assert_eq!(l(4096), (PENDING_MAX, PENDING_MAX / 8));
        assert_eq!(l(u64::MAX), (PENDING_MAX, PENDING_MAX / 8));
    }

    #[test]
    fn a_flood_only_ever_cuts_its_own() {
        let l = Limits::new(2); // 4 places, 1 per uid
        assert_eq!((l.pending_max, l.pending_share), (4, 1));
        // A uid at its share: its own oldest goes, whoever else waits.
        let (i, why) = l.victim(&[7, 5, 7], 5, true).unwrap();
        assert_eq!(i, 1);
        assert!(why.contains("uid 5 had 1 connections"), "{why}");
        // Root is not held to a share: room while places are free.
        assert_eq!(l.victim(&[0, 0, 5], 0, false), None);
        // All taken: the oldest of the uid with the most, even for a new
        // uid or root; of two with as many, the one waiting longest.
        let (i, why) = l.victim(&[5, 0, 0, 0], 9, true).unwrap();
        assert_eq!(i, 1);
        assert!(why.contains("uid 0 had the most"), "{why}");
        assert_eq!(l.victim(&[0, 6, 6, 0], 0, false).unwrap().0, 0);
        assert_eq!(l.victim(&[6, 0, 6, 0], 9, true).unwrap().0, 0);
        assert_eq!(l.victim(&[], 9, true), None);
    }

    #[test]
    fn a_request_line_is_parsed_or_its_fault_named() {
        assert_eq!(parse_request(br#"{"op":"stats"}"#), Ok(Request::Stats));
        assert!(parse_request(b"  ").unwrap_err().contains("empty request"));
        assert!(parse_request(b"{")
            .unwrap_err()
            .contains("malformed request"));
        let long = vec![b' '; REQUEST_BYTES_MAX + 1];
        assert!(parse_request(&long).unwrap_err().contains("longer than"));
    }
}
