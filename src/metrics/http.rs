//! The optional HTTP listener for Prometheus scrapers (MetricsListen).
//!
//! A small HTTP/1.x server of our own: it answers `GET /metrics` (and
//! `HEAD`) with the exposition text, every other path with 404 and every
//! other method with 405, and closes each connection after one answer
//! (`Connection: close`). The configuration only accepts loopback
//! addresses: a scraper on another host reaches it through its own tunnel
//! or proxy, which eventd leaves to the operator.
//!
//! Every bound, and what happens at it:
//!
//! - **Threads.** One accept thread and [`WORKERS`] worker threads, all
//!   started with the listener; no connection ever gets a thread of its
//!   own.
//! - **Queue.** The accept thread hands connections to the workers through
//!   a queue of at most [`QUEUE_MAX`]; a connection accepted while the
//!   queue is full is closed at once.
//! - **Taking turns.** A worker gives a connection whose request has not
//!   all arrived at most [`SLICE`] of waiting, then puts it back at the end
//!   of the queue (with what it sent so far) and takes the next one, so a
//!   few silent connections cannot keep a scrape queued behind them. Put
//!   back, the queue may hold up to `QUEUE_MAX + WORKERS`.
//! - **The request.** The request head (request line and headers) must
//!   arrive within [`REQUEST_DEADLINE`] of the accept, time spent in the
//!   queue included, and be at most [`HEAD_BYTES_MAX`] bytes: a slower one
//!   is closed without an answer, a longer one answered 431. A request body
//!   is never read.
//! - **The answer.** The whole answer must be written within
//!   [`WRITE_DEADLINE`]; a scraper that reads slower is cut off.
//!
//! So a flood of connections that send nothing holds at most
//! `WORKERS + QUEUE_MAX` of them for at most [`REQUEST_DEADLINE`] each,
//! and a scrape after the flood is answered within that.

use std::collections::VecDeque;
use std::io::{Read as _, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Renders the exposition text at each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Worker threads answering scrapes.
pub const WORKERS: usize = 2;
/// Accepted connections waiting for a worker, at most.
pub const QUEUE_MAX: usize = 16;
/// From the accept to the end of the request head.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// The longest request head read (request line and headers).
pub const HEAD_BYTES_MAX: usize = 8 << 10;
/// From the first byte of the answer to its last.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// How long a worker waits for more of one request before taking turns.
pub const SLICE: Duration = Duration::from_millis(100);
/// The answer is written in pieces of this size, each within what is
/// left of [`WRITE_DEADLINE`].
const WRITE_CHUNK_BYTES: usize = 16 << 10;

pub struct MetricsListener {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// The listening socket (owned by the accept thread until it ends).
    listener_fd: std::os::fd::RawFd,
    threads: Vec<JoinHandle<()>>,
}

/// What the accept thread and the workers share.
struct Shared {
    /// Connections waiting for a worker: at most [`QUEUE_MAX`] from the
    /// accept thread, and up to [`WORKERS`] more put back by workers.
    queue: Mutex<VecDeque<Pending>>,
    /// Signalled when a connection is queued, and at stop.
    ready: Condvar,
    stop: AtomicBool,
}

/// A connection whose request head is being read.
struct Pending {
    stream: TcpStream,
    accepted: Instant,
    /// What the client sent so far, at most [`HEAD_BYTES_MAX`] + one read.
    head: Vec<u8>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        // The queue is consistent after every push and pop; a panic while
        // holding the lock leaves nothing half-done.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next connection, or `None` once stopping.
    fn next(&self) -> Option<Pending> {
        let mut queue = self.lock();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(item) = queue.pop_front() {
                return Some(item);
            }
            queue = self.ready.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl MetricsListener {
    /// Binds `addr` and serves until dropped.
    pub fn start(addr: SocketAddr, render: Render) -> std::io::Result<MetricsListener> {
        let listener = TcpListener::bind(addr)?;
        let bound = listener.local_addr()?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::with_capacity(QUEUE_MAX)),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let listener_fd = listener.as_raw_fd();
        let mut me = MetricsListener {
            addr: bound,
            shared: shared.clone(),
            listener_fd,
            threads: Vec::with_capacity(WORKERS + 1),
        };
        for _ in 0..WORKERS {
            let (shared, render) = (shared.clone(), render.clone());
            // On an error here, dropping `me` stops the threads started.
            me.threads.push(
                std::thread::Builder::new()
                    .name("metrics-http".into())
                    .spawn(move || work(&shared, &render))?,
            );
        }
        me.threads.push(
            std::thread::Builder::new()
                .name("metrics-accept".into())
                .spawn(move || accept_loop(listener, &shared))?,
        );
        Ok(me)
    }

    /// The address it listens on (the port chosen, if 0 was configured).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsListener {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Taking the lock before notifying: a worker between its stop check
        // and its wait holds the lock, so it cannot miss the wake-up.
        drop(self.shared.lock());
        self.shared.ready.notify_all();
        // Shutting a listening socket down makes a blocked accept return
        // (EINVAL) on Linux. Only an accept thread that was started owns
        // the listener: when start failed before, the listener is closed
        // already (or about to be) and its descriptor is left alone.
        if self.threads.len() > WORKERS {
            // SAFETY: the accept thread owns the listener and only ends
            // after this (it is joined below), so the descriptor is open.
            unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: &Shared) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "metrics listener: accept failed");
                // Bounded: do not spin on a persistent error (EMFILE).
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let mut queue = shared.lock();
        if queue.len() >= QUEUE_MAX {
            // Dropping the stream closes it.
            continue;
        }
        queue.push_back(Pending {
            stream,
            accepted: Instant::now(),
            head: Vec::new(),
        });
        drop(queue);
        shared.ready.notify_one();
    }
}

fn work(shared: &Shared, render: &Render) {
    while let Some(mut pending) = shared.next() {
        match read_head(&mut pending) {
            Read::More => {
                // Its turn is over: to the end of the queue, past the limit
                // the accept thread keeps (by at most one per worker).
                shared.lock().push_back(pending);
                shared.ready.notify_one();
            }
            Read::Done(head) => {
                if let Err(e) = answer(pending.stream, head, render) {
                    tracing::debug!(error = %e, "metrics scrape ended early");
                }
            }
            Read::Drop(why) => tracing::debug!(why, "metrics connection closed unanswered"),
        }
    }
}

/// What the request asked for.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    head_only: bool,
    /// `HTTP/1.0` or `HTTP/1.1`, answered in kind.
    version: &'static str,
    status: u16,
}

/// How far one turn got with a request head.
enum Read {
    /// Not all there yet, and the deadline has not passed.
    More,
    Done(Head),
    /// Closed unanswered: the client left, or the deadline passed.
    Drop(&'static str),
}

/// One turn: waits at most [`SLICE`] (and never past the deadline) for
/// more of the request head, reads what is there without blocking, and
/// says whether it is complete.
fn read_head(p: &mut Pending) -> Read {
    let left = (p.accepted + REQUEST_DEADLINE).saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Read::Drop("no complete request head in time");
    }
    let mut fds = libc::pollfd {
        fd: p.stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let wait_ms = left.min(SLICE).as_millis().max(1) as libc::c_int;
    // SAFETY: one valid pollfd for the call's duration.
    let ready = unsafe { libc::poll(&mut fds, 1, wait_ms) };
    if ready <= 0 {
        return Read::More; // nothing yet (or EINTR): the deadline decides
    }
    if p.stream.set_nonblocking(true).is_err() {
        return Read::Drop("socket error");
    }
    let mut chunk = [0u8; 2048];
    loop {
        match (&p.stream).read(&mut chunk) {
            Ok(0) => return Read::Drop("the client closed before its request was complete"),
            Ok(n) => {
                // Look for the end from a little before the new bytes: it
                // may straddle two reads.
                let from = p.head.len().saturating_sub(3);
                p.head.extend_from_slice(&chunk[..n]);
                if let Some(end) = head_end(&p.head[from..]) {
                    let end = from + end;
                    return Read::Done(if end <= HEAD_BYTES_MAX {
                        parse_head(&p.head[..end])
                    } else {
                        too_long()
                    });
                }
                if p.head.len() > HEAD_BYTES_MAX {
                    return Read::Done(too_long());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Read::More,
            Err(_) => return Read::Drop("read failed"),
        }
    }
}

fn too_long() -> Head {
    Head {
        head_only: false,
        version: "HTTP/1.1",
        status: 431,
    }
}

/// Writes the answer to `head`, all within [`WRITE_DEADLINE`].
fn answer(mut stream: TcpStream, head: Head, render: &Render) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let (content_type, body, allow) = match head.status {
        200 => (CONTENT_TYPE, render(), None),
        404 => (
            "text/plain",
            "eventd serves /metrics only\n".to_string(),
            None,
        ),
        405 => (
            "text/plain",
            "GET /metrics only\n".to_string(),
            Some("GET, HEAD"),
        ),
        431 => ("text/plain", "request head too long\n".to_string(), None),
        _ => ("text/plain", "bad request\n".to_string(), None),
    };
    let mut out = format!(
        "{} {} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        head.version,
        head.status,
        reason(head.status),
        body.len()
    );
    if let Some(allow) = allow {
        out.push_str(&format!("Allow: {allow}\r\n"));
    }
    out.push_str("\r\n");
    if !head.head_only {
        out.push_str(&body);
    }
    let deadline = Instant::now() + WRITE_DEADLINE;
    for chunk in out.as_bytes().chunks(WRITE_CHUNK_BYTES) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        stream.write_all(chunk)?;
    }
    stream.flush()?;
    // Our side is done; the scraper sees the end of the answer.
    stream.shutdown(std::net::Shutdown::Write)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Bad Request",
    }
}

/// Where the head ends in `bytes` (after `\r\n\r\n`, or `\n\n` from a
/// lenient client), if it does.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The status for a request head: its method and path decide.
fn parse_head(head: &[u8]) -> Head {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = String::from_utf8_lossy(&head[..line_end]);
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let version = match version {
        Some("HTTP/1.0") => "HTTP/1.0",
        Some(v) if v.starts_with("HTTP/1.") => "HTTP/1.1",
        _ => {
            return Head {
                head_only: false,
                version: "HTTP/1.1",
                status: 400,
            }
        }
    };
    if parts.next().is_some() {
        return Head {
            head_only: false,
            version,
            status: 400,
        };
    }
    let (Some(method), Some(target)) = (method, target) else {
        return Head {
            head_only: false,
            version,
            status: 400,
        };
    };
    let path = target.split('?').next().unwrap_or("");
    let status = match (method, path) {
        ("GET" | "HEAD", "/metrics") => 200,
        ("GET" | "HEAD", _) => 404,
        _ => 405,
    };
    Head {
        head_only: method == "HEAD",
        version,
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let render: Render = Arc::new(|| "eventd_up 1\n".to_string());
        let l = MetricsListener::start("127.0.0.1:0".parse().unwrap(), render).unwrap();
        let ok = get(l.addr(), "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.0 200"), "{ok}");
        assert!(ok.contains("version=0.0.4"), "{ok}");
        assert!(ok.contains("Connection: close\r\n"), "{ok}");
        assert!(ok.ends_with("eventd_up 1\n"), "{ok}");
        let head = get(
            l.addr(),
            "HEAD /metrics?x=1 HTTP/1.1\r\nHost: a\r\nUser-Agent: t\r\n\r\n",
        );
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.contains("Content-Length: 12\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "{head}");
        let missing = get(l.addr(), "GET /other HTTP/1.0\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.0 404"), "{missing}");
        let post = get(
            l.addr(),
            "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(post.starts_with("HTTP/1.0 405"), "{post}");
        assert!(post.contains("Allow: GET, HEAD\r\n"), "{post}");
        let junk = get(l.addr(), "hello\r\n\r\n");
        assert!(junk.starts_with("HTTP/1.1 400"), "{junk}");
        let long = format!(
            "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
            "y".repeat(HEAD_BYTES_MAX)
        );
        let long = get(l.addr(), &long);
        assert!(long.starts_with("HTTP/1.1 431"), "{long}");
        drop(l);
    }

    #[test]
    fn a_silent_connection_is_dropped_at_the_deadline_and_others_still_answered() {
        let render: Render = Arc::new(|| "eventd_up 1\n".to_string());
        let l = MetricsListener::start("127.0.0.1:0".parse().unwrap(), render).unwrap();
        // Every worker held by a connection that sends nothing.
        let silent: Vec<TcpStream> = (0..WORKERS)
            .map(|_| TcpStream::connect(l.addr()).unwrap())
            .collect();
        let started = Instant::now();
        let ok = get(l.addr(), "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.0 200"), "{ok}");
        // Answered while the silent ones are still held (well before their
        // deadline would have freed the workers): they take turns.
        let waited = started.elapsed();
        assert!(
            waited < REQUEST_DEADLINE - Duration::from_secs(1),
            "{waited:?}"
        );
        for mut s in silent {
            let mut rest = Vec::new();
            // Closed by the server without an answer.
            let _ = s.read_to_end(&mut rest);
            assert!(rest.is_empty());
        }
    }
}
