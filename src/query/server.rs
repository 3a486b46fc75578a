//! The query server: a Unix socket in the run directory, access decided by
//! the peer's credentials (SO_PEERCRED), one thread per request once it is
//! read.
//!
//! Every bound, and what happens at it:
//!
//! - **Before the request.** One thread, the gate ([`super::gate`]),
//!   accepts every connection and reads the request lines of all of them
//!   with `poll`. A peer that may not read events is answered `denied`
//!   there. A connection that has not sent its whole request has no thread
//!   and no query slot; at most 2·MaxConcurrentQueries (at most 1024) wait
//!   at once, at most an eighth of them from one uid (root and eventd's own
//!   user excepted), and past either bound the oldest waiting connection of
//!   that uid (or of the uid with the most waiting) is cut with `busy`. The
//!   whole request line must arrive within [`REQUEST_DEADLINE`] of the
//!   accept and be at most [`super::protocol::REQUEST_BYTES_MAX`] bytes;
//!   otherwise `bad_request`. Every answer there is written without
//!   blocking.
//! - **Queries.** At most MaxConcurrentQueries queries (follows included)
//!   hold a slot at once, and a uid other than root and eventd's own user
//!   at most a quarter of them (at least one), never the last free one (or
//!   two) kept for root and eventd's own user ([`super::slots`]). A query
//!   without a slot is answered `busy` by the gate, saying which bound
//!   refused it; one with a slot gets a thread.
//! - **Reports.** `stats`, `shards`, `config`, `metrics` and `export` take
//!   no query slot: at most [`REPORT_CONNECTIONS`] are answered at once,
//!   each in a thread, so they are answered while every query slot is held;
//!   past that, `busy`.
//! - **Writes.** A write that blocks for [`WRITE_TIMEOUT`] (a client that
//!   stopped reading) ends the query, frees its slot and its thread.
//!
//! Descriptors: R2 (`routing::descriptor_allowance`) has a `4·Q` term
//! beside the database connections' `4·Q·max(E,1)`, and the query server's
//! own descriptors are to fit in it (Q is MaxConcurrentQueries). It holds
//! at most `4·Q + 21`: the listener; at most `2·Q` waiting connections; at
//! most `Q` query threads with their connection and at most one directory
//! listing open each (a query writes through its connection itself, never
//! a copy of it); at most [`REPORT_CONNECTIONS`] report threads with their
//! connection, a listing and one database connection (3 descriptors) each.
//! The 21 come out of R2's fixed 256.

use super::fanout::FanOut;
use super::filter::Filter;
use super::follow::Follower;
pub use super::gate::REQUEST_DEADLINE;
use super::gate::{refuse, GateParts, Limits, Peer, RefusalLog};
pub use super::peer::Access;
use super::protocol::{error_line, ErrorCode, Request};
use super::slots::{QuerySlot, ShareRule, Slots};
pub use super::stats::QueryStats;
use std::io::Write;
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
/// Reports answered at once (each in a thread, beside the query threads).
pub const REPORT_CONNECTIONS: u64 = 4;

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

/// What the gate and the query threads share.
struct Shared {
    store_dir: PathBuf,
    health: Option<Arc<crate::store::StoreHealth>>,
    access: Access,
    limits: Limits,
    slots: Arc<Slots>,
    /// Report threads running now, at most [`REPORT_CONNECTIONS`].
    reports: AtomicU64,
    stats: Arc<QueryStats>,
    reporter: Reporter,
    stop: Arc<AtomicBool>,
    pool: Arc<super::fanout::ConnectionPool>,
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
        let rule = ShareRule::new(max_queries, crate::access::own_uid());
        let shared = Arc::new(Shared {
            store_dir,
            health,
            access,
            limits: Limits::new(max_queries),
            slots: Arc::new(Slots::new(rule, stats.clone())),
            reports: AtomicU64::new(0),
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
        // connection of our own wakes the gate's poll instead (it looks at
        // the stop flag every turn, and at most every 500 ms anyway); only
        // if it cannot be made is the listener shut down after all, which
        // wakes the poll (POLLHUP) on Linux whatever happened to its file.
        if !self.passed || UnixStream::connect(&self.path).is_err() {
            // SAFETY: the accept thread owns the listener and is still
            // running (it only ends after this), so the descriptor is open
            // and ours.
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

/// The gate (see [`super::gate`]), handing each request that is in to
/// [`dispatch`].
fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    let parts = GateParts {
        access: shared.access.clone(),
        stats: shared.stats.clone(),
        stop: shared.stop.clone(),
        limits: shared.limits,
        rule: shared.slots.rule(),
    };
    super::gate::run(listener, parts, move |peer, request, log| {
        dispatch(&shared, peer, request, log)
    });
}

/// Hands a connection whose request is in to a thread of its own: a query
/// with a slot of its uid's, a report with one of the report threads. A
/// request refused (a filter the server does not run, no slot, no report
/// thread) is answered here, in the accept thread, without blocking.
fn dispatch(shared: &Arc<Shared>, peer: Peer, request: Request, log: &mut RefusalLog) {
    let Peer { stream, pid, uid } = peer;
    let Request::Query { filter, follow } = request else {
        return dispatch_report(shared, stream, request, log, pid);
    };
    if let Err(message) = check_filter(&filter) {
        shared
            .stats
            .refused_bad_request
            .fetch_add(1, Ordering::Relaxed);
        refuse(stream, ErrorCode::BadRequest, &message);
        return;
    }
    let slot = match shared.slots.take(uid) {
        Ok(slot) => slot,
        Err(why) => {
            shared.stats.refused_busy.fetch_add(1, Ordering::Relaxed);
            if log.allow(Instant::now()) {
                tracing::info!(pid, uid, "query refused: {why}");
            }
            refuse(stream, ErrorCode::Busy, &why.to_string());
            return;
        }
    };
    let inner = shared.clone();
    spawn(shared, move || {
        serve_query(stream, &inner, filter, follow, slot, pid)
    });
}

/// A report gets one of the [`REPORT_CONNECTIONS`] report threads, or
/// `busy`.
fn dispatch_report(
    shared: &Arc<Shared>,
    stream: UnixStream,
    request: Request,
    log: &mut RefusalLog,
    pid: i32,
) {
    // AcqRel/Acquire: see `Counted`; only the count itself is guarded.
    let taken = shared
        .reports
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < REPORT_CONNECTIONS).then_some(n + 1)
        });
    if taken.is_err() {
        shared.stats.refused_busy.fetch_add(1, Ordering::Relaxed);
        if log.allow(Instant::now()) {
            tracing::info!(pid, "report refused: every report thread is taken");
        }
        let message = format!("{REPORT_CONNECTIONS} reports are being answered; try again");
        refuse(stream, ErrorCode::Busy, &message);
        return;
    }
    let report = Counted(shared.clone(), |s| &s.reports);
    spawn(shared, move || {
        serve_report(stream, &report.0, &request);
        drop(report);
    });
}

/// A count in [`Shared`] taken for a thread, given back when dropped (also
/// when the thread could not start and its closure was dropped unrun).
/// AcqRel, like the taking: the counts publish no other data, and any
/// ordering keeps a read-modify-write count exact.
struct Counted(Arc<Shared>, fn(&Shared) -> &AtomicU64);

impl Drop for Counted {
    fn drop(&mut self) {
        (self.1)(&self.0).fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs `work` in a connection thread (counted in `connections`).
fn spawn(shared: &Arc<Shared>, work: impl FnOnce() + Send + 'static) {
    // AcqRel: see `Counted`.
    shared.stats.connections.fetch_add(1, Ordering::AcqRel);
    let thread = Counted(shared.clone(), |s| &s.stats.connections);
    let spawned = std::thread::Builder::new()
        .name("query".into())
        .spawn(move || {
            work();
            drop(thread);
        });
    if let Err(e) = spawned {
        // The closure (the connection, its slot and counts in it) was
        // dropped unrun, giving everything back.
        tracing::error!(error = %e, "query connection dropped: cannot start a thread");
    }
}

/// The connection as the query's thread uses it: blocking, with writes
/// that give up after [`WRITE_TIMEOUT`].
fn blocking(stream: &UnixStream) -> bool {
    stream.set_nonblocking(false).is_ok() && stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_ok()
}

/// A query's thread: runs it holding `_slot`, then gives the slot back.
fn serve_query(
    stream: UnixStream,
    shared: &Shared,
    filter: Filter,
    follow: bool,
    _slot: QuerySlot,
    pid: i32,
) {
    if !blocking(&stream) {
        return;
    }
    shared.stats.served.fetch_add(1, Ordering::Relaxed);
    let result = match run_query(&stream, shared, filter, follow) {
        // The client is still there (a store that cannot be read, say):
        // tell it, rather than just closing.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe && !peer_gone(&stream) => {
            shared.stats.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(pid, error = %e, "query failed");
            writeln!(
                &stream,
                "{}",
                error_line(ErrorCode::Internal, &e.to_string())
            )
        }
        other => other,
    };
    if let Err(e) = result {
        // Usually the client went away mid-stream; its slot and databases
        // are released as this returns.
        tracing::debug!(pid, error = %e, "query connection ended");
    }
}

/// A report's thread.
fn serve_report(stream: UnixStream, shared: &Shared, request: &Request) {
    if !blocking(&stream) {
        return;
    }
    shared.stats.served.fetch_add(1, Ordering::Relaxed);
    let answer = (shared.reporter)(request);
    if let Err(e) = writeln!(&stream, "{answer}") {
        tracing::debug!(error = %e, "report connection ended");
    }
}

/// Requests the server refuses before running them.
fn check_filter(filter: &Filter) -> Result<(), String> {
    filter.check()?;
    if let Some((key, _)) = filter.fields.iter().find(|(k, _)| k.contains('"')) {
        return Err(format!(
            "field name {key:?}: a field name cannot contain '\"'"
        ));
    }
    Ok(())
}

fn run_query(
    stream: &UnixStream,
    shared: &Shared,
    filter: Filter,
    follow: bool,
) -> std::io::Result<()> {
    let (after, gaps_after) = (filter.after, filter.gaps_after);
    let mut out = std::io::BufWriter::new(stream);
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
    // Where the listing ends and what commits later begins (a client
    // that asked for the newest events first turns them around here).
    let following = serde_json::json!({ "following": { "count": count, "gaps": gaps } });
    writeln!(out, "{following}")?;
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
