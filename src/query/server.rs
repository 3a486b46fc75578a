//! The query server: a Unix socket in the run directory, access decided by
//! the peer's credentials (SO_PEERCRED), one thread per admitted
//! connection.
//!
//! Every bound, and what happens at it:
//!
//! - **Who gets a thread.** The accept thread reads each peer's credentials
//!   itself. A peer that may not read events is answered `denied` there,
//!   without a thread: what it already sent is read without blocking (so
//!   that closing does not reset the connection before the answer is
//!   read), the one line is written without blocking, and the connection
//!   is closed. Group membership is the peer's own supplementary groups as
//!   the kernel recorded them at connect (SO_PEERGROUPS): no user or group
//!   database is read, so a flood costs two system calls per connection.
//! - **Connection threads.** At most MaxConcurrentQueries +
//!   [`REPORT_CONNECTIONS`] connections have a thread at once (waiting for
//!   their request, running a query or answering a report). Beyond that
//!   the accept thread answers `busy` itself, the same way as `denied`.
//! - **Queries.** At most MaxConcurrentQueries queries (follows included)
//!   run at once; a query past that is answered `busy`. Reports (`stats`,
//!   `shards`, `config`, `metrics`) take no query slot, so they are still
//!   answered while every query slot is held.
//! - **The request.** The whole request line must arrive within
//!   [`REQUEST_DEADLINE`] of the accept, however the bytes trickle in, and
//!   be at most [`REQUEST_BYTES_MAX`] bytes; otherwise it is answered
//!   `bad_request` and the connection closed, freeing its thread.
//! - **Writes.** A write that blocks for [`WRITE_TIMEOUT`] (a client that
//!   stopped reading) ends the query, frees its slot and its thread.

use super::fanout::FanOut;
use super::filter::Filter;
use super::follow::Follower;
pub use super::peer::Access;
use super::peer::{peer_credentials, peer_groups};
use super::protocol::{error_line, ErrorCode, Request, REQUEST_BYTES_MAX};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A write that blocks this long (a client that stopped reading) ends the
/// query and frees its slot. Kept at 30 s, as before: a person paging
/// through `eventctl query | less` blocks the daemon's writes while
/// reading a screen, and should not lose the query for it. A client never
/// holds a slot longer than this without reading anything.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The whole request line must have arrived this long after the accept.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// Connection threads beyond MaxConcurrentQueries: room for reports (and
/// for requests still being read) while every query slot is held.
pub const REPORT_CONNECTIONS: u64 = 4;
/// Bytes a refused peer may have sent that the accept thread reads (and
/// drops) before answering it: a whole request, and one more buffer.
const REFUSAL_READ_BYTES_MAX: usize = REQUEST_BYTES_MAX + REFUSAL_READ_BYTES;
const REFUSAL_READ_BYTES: usize = 4096;
/// Refusals logged per second at most (the rest are counted only).
const REFUSAL_LOGS_PER_SECOND: u32 = 4;

/// Answers for the requests that are not queries (the daemon provides them;
/// the query code never reaches into the writers).
pub type Reporter = Arc<dyn Fn(&Request) -> serde_json::Value + Send + Sync>;

pub struct QueryServer {
    path: PathBuf,
    /// The listener was passed by the service manager: it is never shut
    /// down or removed (see `Drop`).
    passed: bool,
    stop: Arc<AtomicBool>,
    /// The listening socket (owned by the accept thread until it ends).
    listener_fd: std::os::fd::RawFd,
    accept: Option<std::thread::JoinHandle<()>>,
}

/// What the query server counts, for `eventctl stats` and the metrics.
#[derive(Debug, Default)]
pub struct QueryStats {
    /// Queries (follows included) holding a query slot now: the slot count
    /// itself, taken and given back with AcqRel.
    pub running: AtomicU64,
    /// Connections with a thread now (reading their request, running a
    /// query or answering a report): the connection-thread count itself,
    /// at most MaxConcurrentQueries + [`REPORT_CONNECTIONS`].
    pub connections: AtomicU64,
    /// Requests answered (a slot taken, the request understood). Relaxed,
    /// like the refusals: monitoring only.
    pub served: AtomicU64,
    /// Refused because MaxConcurrentQueries were running, or every
    /// connection thread was taken.
    pub refused_busy: AtomicU64,
    /// Refused because of the peer's credentials.
    pub refused_denied: AtomicU64,
    /// Requests that could not be understood.
    pub refused_bad_request: AtomicU64,
    /// Queries that failed in the daemon (an unreadable store, say).
    pub failed: AtomicU64,
}

struct Shared {
    store_dir: PathBuf,
    health: Option<Arc<crate::store::StoreHealth>>,
    access: Access,
    max_queries: u64,
    /// MaxConcurrentQueries + [`REPORT_CONNECTIONS`].
    max_connections: u64,
    stats: Arc<QueryStats>,
    reporter: Reporter,
    stop: Arc<AtomicBool>,
    pool: Arc<super::fanout::ConnectionPool>,
}

/// A query slot, given back when dropped (also when the client vanished).
struct Slot<'a>(&'a AtomicU64);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where and how a query server serves.
pub struct ServerOptions {
    pub run_dir: PathBuf,
    pub store_dir: PathBuf,
    /// MaxConcurrentQueries.
    pub max_queries: u64,
    pub access: Access,
    /// The socket's mode and group.
    pub mode: crate::access::Mode,
    /// The daemon's record of damaged shard files: every answer warns of
    /// them, and damage a query finds is reported there.
    pub health: Option<Arc<crate::store::StoreHealth>>,
    /// A listening socket the service manager passed (socket activation),
    /// served instead of binding `run_dir/query.sock`; its unit sets its
    /// mode and group.
    pub passed: Option<UnixListener>,
}

impl QueryServer {
    /// Listens on `run_dir/query.sock`, given `mode` (its group and bits
    /// follow the query grant; the peer's credentials decide in the end, the
    /// mode only keeps everyone else from connecting at all). The daemon
    /// runs with a 077 umask, so the socket is private between its bind and
    /// its chmod.
    pub fn start(
        options: ServerOptions,
        reporter: Reporter,
        stats: Arc<QueryStats>,
    ) -> std::io::Result<QueryServer> {
        let ServerOptions {
            run_dir,
            store_dir,
            max_queries,
            access,
            mode,
            health,
            passed,
        } = options;
        let path = run_dir.join("query.sock");
        let is_passed = passed.is_some();
        let listener = match passed {
            Some(listener) => listener,
            None => {
                // The data-directory lock is held, so a socket file left
                // here is a dead daemon's.
                let _ = std::fs::remove_file(&path);
                let listener = UnixListener::bind(&path)?;
                crate::access::files::set_mode_path(&path, mode)?;
                listener
            }
        };
        let path = match (is_passed, listener.local_addr()) {
            (true, Ok(addr)) => addr.as_pathname().map_or(path, Path::to_path_buf),
            _ => path,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            store_dir,
            health,
            access,
            max_queries,
            max_connections: max_queries.saturating_add(REPORT_CONNECTIONS),
            stats,
            reporter,
            stop: stop.clone(),
            pool: Arc::new(super::fanout::ConnectionPool::new(max_queries as usize)),
        });
        let listener_fd = listener.as_raw_fd();
        let accept = std::thread::Builder::new()
            .name("query-accept".into())
            .spawn(move || accept_loop(listener, shared))?;
        Ok(QueryServer {
            path,
            passed: is_passed,
            stop,
            listener_fd,
            accept: Some(accept),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for QueryServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A passed listener is the service manager's too: shutting it down
        // would refuse every connection until the unit is restarted. One
        // connection of our own wakes the accept instead (the loop looks
        // at the stop flag after each accept); only if it cannot be made
        // is the listener shut down after all.
        if !self.passed || UnixStream::connect(&self.path).is_err() {
            // Shutting a listening socket down makes a blocked accept
            // return (EINVAL) on Linux, whatever happened to the socket's
            // file. SAFETY: the accept thread owns the listener and is
            // still running (it only ends after this), so the descriptor is
            // open and ours.
            unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        if !self.passed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    let mut log = RefusalLog::default();
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        match stream {
            Ok(s) => admit(s, &shared, &mut log),
            Err(e) => {
                tracing::warn!(error = %e, "query socket: accept failed");
                // Bounded: do not spin on a persistent error.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Decides, in the accept thread, whether a connection gets a thread: a
/// denied peer, or one past the connection-thread cap, is answered here.
fn admit(stream: UnixStream, shared: &Arc<Shared>, log: &mut RefusalLog) {
    let accepted = Instant::now();
    let (pid, uid, gid) = match peer_credentials(&stream) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "query connection without peer credentials");
            return;
        }
    };
    if !shared.access.allows(uid, gid, &peer_groups(&stream)) {
        shared.stats.refused_denied.fetch_add(1, Ordering::Relaxed);
        if log.allow(accepted) {
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
    // A connection thread (only while one is free), or busy at once.
    let taken = shared
        .stats
        .connections
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < shared.max_connections).then_some(n + 1)
        });
    if taken.is_err() {
        shared.stats.refused_busy.fetch_add(1, Ordering::Relaxed);
        if log.allow(accepted) {
            tracing::info!(pid, uid, "query refused: every connection thread is taken");
        }
        let message = format!(
            "{} connections are being served (MaxConcurrentQueries + {REPORT_CONNECTIONS}); \
             try again",
            shared.max_connections
        );
        refuse(stream, ErrorCode::Busy, &message);
        return;
    }
    let inner = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("query".into())
        .spawn(move || {
            let _thread = Slot(&inner.stats.connections);
            serve(stream, &inner, accepted, pid);
        });
    if let Err(e) = spawned {
        // The closure (and the stream in it) was dropped unrun.
        shared.stats.connections.fetch_sub(1, Ordering::AcqRel);
        tracing::error!(error = %e, "query connection dropped: cannot start a thread");
    }
}

/// At most [`REFUSAL_LOGS_PER_SECOND`] refusals logged per second: a flood
/// of refused connections is counted, not written to the log one by one.
#[derive(Default)]
struct RefusalLog {
    second: Option<Instant>,
    logged: u32,
}

impl RefusalLog {
    fn allow(&mut self, now: Instant) -> bool {
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
fn refuse(mut stream: UnixStream, code: ErrorCode, message: &str) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = [0u8; REFUSAL_READ_BYTES];
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

// Longer than the ~70 lines a function should be: the life of one connection,
// request to answer, each refusal answered where it is found.
fn serve(mut stream: UnixStream, shared: &Shared, accepted: Instant, pid: i32) {
    // A client that stops reading gets its query ended, not a slot forever.
    if stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_err() {
        return;
    }
    let request = match read_request(&stream, accepted + REQUEST_DEADLINE) {
        Ok(r) => r,
        Err(message) => {
            shared
                .stats
                .refused_bad_request
                .fetch_add(1, Ordering::Relaxed);
            let _ = writeln!(stream, "{}", error_line(ErrorCode::BadRequest, &message));
            return;
        }
    };
    let result = match request {
        Request::Query { filter, follow } => {
            if let Err(message) = check_filter(&filter, follow) {
                shared
                    .stats
                    .refused_bad_request
                    .fetch_add(1, Ordering::Relaxed);
                let _ = writeln!(stream, "{}", error_line(ErrorCode::BadRequest, &message));
                return;
            }
            // Take a query slot (only while one is free), or answer busy.
            let taken =
                shared
                    .stats
                    .running
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < shared.max_queries).then_some(n + 1)
                    });
            if taken.is_err() {
                shared.stats.refused_busy.fetch_add(1, Ordering::Relaxed);
                let message = format!(
                    "{} queries are running (MaxConcurrentQueries); try again",
                    shared.max_queries
                );
                let _ = writeln!(stream, "{}", error_line(ErrorCode::Busy, &message));
                return;
            }
            let _slot = Slot(&shared.stats.running);
            shared.stats.served.fetch_add(1, Ordering::Relaxed);
            match run_query(&mut stream, shared, filter, follow) {
                // The client is still there (a store that cannot be read,
                // say): tell it, rather than just closing.
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe && !peer_gone(&stream) => {
                    shared.stats.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(pid, error = %e, "query failed");
                    writeln!(
                        stream,
                        "{}",
                        error_line(ErrorCode::Internal, &e.to_string())
                    )
                }
                other => other,
            }
        }
        other => {
            shared.stats.served.fetch_add(1, Ordering::Relaxed);
            let answer = (shared.reporter)(&other);
            writeln!(stream, "{answer}")
        }
    };
    if let Err(e) = result {
        // Usually the client went away mid-stream; its slot and databases
        // are released as this returns.
        tracing::debug!(pid, error = %e, "query connection ended");
    }
}

/// Requests the server refuses before running them.
fn check_filter(filter: &Filter, follow: bool) -> Result<(), String> {
    if follow && filter.limit.is_some() {
        return Err("follow and limit cannot be combined".to_string());
    }
    if let Some((key, _)) = filter.fields.iter().find(|(k, _)| k.contains('"')) {
        return Err(format!(
            "field name {key:?}: a field name cannot contain '\"'"
        ));
    }
    Ok(())
}

/// Reads the request line, which must be complete by `deadline` (each
/// read waits at most until then) and at most [`REQUEST_BYTES_MAX`] bytes.
/// Bytes after the newline are ignored. A client that closes its end after
/// the request without a newline is taken as having sent it whole.
fn read_request(stream: &UnixStream, deadline: Instant) -> Result<Request, String> {
    let mut line: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "no complete request line within {} s of connecting",
                REQUEST_DEADLINE.as_secs()
            ));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| format!("reading the request: {e}"))?;
        let n = match (&*stream).read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue; // the deadline is checked at the top
            }
            Err(e) => return Err(format!("reading the request: {e}")),
        };
        match chunk[..n].iter().position(|&b| b == b'\n') {
            Some(i) => {
                line.extend_from_slice(&chunk[..i]);
                break;
            }
            None => line.extend_from_slice(&chunk[..n]),
        }
        if line.len() > REQUEST_BYTES_MAX {
            break;
        }
    }
    if line.len() > REQUEST_BYTES_MAX {
        return Err(format!("request longer than {REQUEST_BYTES_MAX} bytes"));
    }
    let line = String::from_utf8_lossy(&line);
    if line.trim().is_empty() {
        return Err("empty request: send one JSON object on one line".to_string());
    }
    serde_json::from_str(&line).map_err(|e| format!("malformed request: {e}"))
}

fn run_query(
    stream: &mut UnixStream,
    shared: &Shared,
    filter: Filter,
    follow: bool,
) -> std::io::Result<()> {
    let (after, gaps_after) = (filter.after, filter.gaps_after);
    let mut out = std::io::BufWriter::new(stream.try_clone()?);
    // Follow: what exists now is listed first, then what commits later.
    let follower = if follow {
        Some(Follower::snapshot(&shared.store_dir, &filter)?)
    } else {
        None
    };
    let bounds = follower.as_ref().map(Follower::bounds);
    let mut fan = FanOut::open_pooled(
        &shared.store_dir,
        filter,
        bounds.as_ref(),
        Some(shared.pool.clone()),
        shared.health.as_deref().map(|h| h.zones()),
    )?;
    let Some((count, last)) = list(
        stream,
        &mut out,
        "event",
        || fan.next_event(),
        |e| e.cursor(),
    )?
    else {
        return Ok(());
    };
    // Gaps are streamed like events, with their own cursor and limit.
    let Some((gaps, last_gap)) = list(stream, &mut out, "gap", || fan.next_gap(), |g| g.cursor())?
    else {
        return Ok(());
    };
    warn(&mut out, &fan, shared.health.as_deref())?;
    // Shard files there were, and those the query had to open (the others'
    // time maps showed nothing it needed).
    let files = serde_json::json!({ "listed": fan.shard_count(), "read": fan.opened() });
    drop(fan);
    let Some(follower) = follower else {
        // Each cursor is where its listing stands: the last row sent, or
        // where the request started when this page sent none (so that an
        // exhausted listing stays exhausted on the next page).
        let end = serde_json::json!({ "end": {
            "count": count,
            "cursor": last.or(after).map(|c| c.token()),
            "gaps": gaps,
            "gap_cursor": last_gap.or(gaps_after).map(|c| c.token()),
            "files": files,
        } });
        writeln!(out, "{end}")?;
        return out.flush();
    };
    out.flush()?;
    follow_on(stream, &mut out, follower, &shared.stop)
}

/// Writes every row `next` gives as `{"KIND": row}` lines: how many and
/// the key of the last, or `None` if the client left meanwhile (looked at
/// every 1024 rows: buffered writes may not fail for a while after it left).
fn list<R: serde::Serialize, K>(
    stream: &UnixStream,
    out: &mut impl Write,
    kind: &str,
    mut next: impl FnMut() -> Option<R>,
    key: impl Fn(&R) -> K,
) -> std::io::Result<Option<(u64, Option<K>)>> {
    let (mut count, mut last) = (0u64, None);
    while let Some(row) = next() {
        last = Some(key(&row));
        count += 1;
        writeln!(out, "{}", serde_json::json!({ kind: row }))?;
        if count % 1024 == 0 && peer_gone(stream) {
            return Ok(None);
        }
    }
    Ok(Some((count, last)))
}

/// The query's warnings (shards that did not answer), and one for every
/// damaged file eventd knows of, whether or not this query met it: what it
/// holds may be missing from every answer. Damage this query met is
/// reported, so the shard's writer moves on.
fn warn(
    out: &mut impl Write,
    fan: &FanOut,
    health: Option<&crate::store::StoreHealth>,
) -> std::io::Result<()> {
    for warning in &fan.warnings {
        writeln!(out, "{}", serde_json::json!({ "warning": warning }))?;
    }
    let Some(health) = health else {
        return Ok(());
    };
    for (path, why) in &fan.damaged {
        health.report_corrupt(path, why);
    }
    for d in health.damaged() {
        let instead = d.replaced_by.as_ref().map_or(String::new(), |n| {
            format!("; its shard writes {} instead", n.display())
        });
        let warning = format!(
            "{} is damaged ({}); it is left as it is and what it holds may be missing{instead}",
            d.path.display(),
            d.reason
        );
        writeln!(out, "{}", serde_json::json!({ "warning": warning }))?;
    }
    Ok(())
}

/// A follow query's second part: events committed after it started, until
/// the client leaves or eventd stops.
fn follow_on(
    stream: &UnixStream,
    out: &mut impl Write,
    mut follower: Follower,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let (rows, more) = follower.poll()?;
        for row in rows {
            writeln!(out, "{}", serde_json::json!({ "event": row }))?;
        }
        out.flush()?;
        if peer_gone(stream) {
            return Ok(());
        }
        if !more {
            std::thread::sleep(super::follow::POLL_INTERVAL);
        }
    }
}

/// Whether the client closed its end (checked without blocking).
fn peer_gone(stream: &UnixStream) -> bool {
    let mut fds = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut fds, 1, 0) };
    if n <= 0 {
        return false;
    }
    if fds.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
        return true;
    }
    // Readable: EOF (0 bytes) means gone; anything else is ignored.
    let mut byte = [0u8; 1];
    // SAFETY: a valid one-byte buffer; MSG_DONTWAIT never blocks.
    let r = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            byte.as_mut_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_PEEK,
        )
    };
    r == 0
}
