//! The query server: a Unix socket in the run directory, one thread per
//! connection, at most MaxConcurrentQueries at once, access decided by the
//! peer's credentials (SO_PEERCRED).

use super::fanout::FanOut;
use super::filter::Filter;
use super::follow::Follower;
use super::protocol::{error_line, ErrorCode, Request, REQUEST_BYTES_MAX};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A write that blocks this long (a client that stopped reading) ends the
/// query and frees its slot.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Answers for the requests that are not queries (the daemon provides them;
/// the query code never reaches into the writers).
pub type Reporter = Arc<dyn Fn(&Request) -> serde_json::Value + Send + Sync>;

/// Who may read events.
#[derive(Debug, Clone)]
pub struct Access {
    /// Members of this group (primary or supplementary) may read.
    pub group: Option<libc::gid_t>,
    /// Every local user may read (`QueryGroup = "*"`).
    pub everyone: bool,
}

impl Access {
    /// Root, the daemon's own user, and members of the group.
    pub fn allows(&self, uid: libc::uid_t, gid: libc::gid_t) -> bool {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if uid == 0 || uid == me || self.everyone {
            return true;
        }
        match self.group {
            Some(g) => gid == g || user_in_group(uid, gid, g),
            None => false,
        }
    }
}

/// The group id of `name`, if it exists.
pub fn group_id(name: &str) -> Option<libc::gid_t> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut grp: libc::group = unsafe_zeroed_group();
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; buf's length is passed.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some(grp.gr_gid)
}

fn unsafe_zeroed_group() -> libc::group {
    // SAFETY: libc::group is plain data (pointers and ids); all-zero is a
    // valid value that getgrnam_r overwrites.
    unsafe { std::mem::zeroed() }
}

/// Whether user `uid` (primary group `gid`) has `group` among its groups.
fn user_in_group(uid: libc::uid_t, gid: libc::gid_t, group: libc::gid_t) -> bool {
    // SAFETY: as for `group`: plain data, overwritten by getpwuid_r.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: valid pointers, buf's length passed.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return false;
    }
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: pw_name points into buf, alive here; n is the array length.
    let rc = unsafe { libc::getgrouplist(pwd.pw_name, gid, groups.as_mut_ptr(), &mut n) };
    rc >= 0 && groups[..n.max(0) as usize].contains(&group)
}

/// The peer's (pid, uid, gid).
fn peer_credentials(stream: &UnixStream) -> std::io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid out pointers of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

pub struct QueryServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    /// The listening socket (owned by the accept thread until it ends).
    listener_fd: std::os::fd::RawFd,
    accept: Option<std::thread::JoinHandle<()>>,
}

/// What the query server counts, for `eventctl stats` and the metrics.
#[derive(Debug, Default)]
pub struct QueryStats {
    /// Connections holding a slot now (queries, follows and reports): the
    /// slot count itself, taken and given back with AcqRel.
    pub running: AtomicU64,
    /// Requests answered (a slot taken, the request understood). Relaxed,
    /// like the refusals: monitoring only.
    pub served: AtomicU64,
    /// Refused because MaxConcurrentQueries were running.
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
    access: Access,
    max_queries: u64,
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

impl QueryServer {
    /// Listens on `run_dir/query.sock` (mode 0660, group `access.group`).
    pub fn start(
        run_dir: &Path,
        store_dir: &Path,
        max_queries: u64,
        access: Access,
        reporter: Reporter,
        stats: Arc<QueryStats>,
    ) -> std::io::Result<QueryServer> {
        let path = run_dir.join("query.sock");
        // The data-directory lock is held, so a socket file left here is a
        // dead daemon's.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))?;
        if let Some(gid) = access.group {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(std::io::Error::other)?;
            // SAFETY: a valid C path; -1 keeps the owner.
            if unsafe { libc::chown(c.as_ptr(), u32::MAX, gid) } != 0 {
                tracing::warn!(
                    socket = %path.display(),
                    gid,
                    error = %std::io::Error::last_os_error(),
                    "cannot give the query socket to the query group"
                );
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            store_dir: store_dir.to_path_buf(),
            access,
            max_queries,
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
        // Shutting a listening socket down makes a blocked accept return
        // (EINVAL) on Linux, whatever happened to the socket's file.
        // SAFETY: the accept thread owns the listener and is still running
        // (it only ends after this), so the descriptor is open and ours.
        unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "query socket: accept failed");
                // Bounded: do not spin on a persistent error.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("query".into())
            .spawn(move || serve(stream, &shared));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "query connection dropped: cannot start a thread");
        }
    }
}

fn serve(mut stream: UnixStream, shared: &Shared) {
    let (pid, uid, gid) = match peer_credentials(&stream) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "query connection without peer credentials");
            return;
        }
    };
    // The request is read before any answer (even a refusal): a client
    // whose request is left unread would see its connection reset instead
    // of the answer.
    let request = read_request(&stream);
    if !shared.access.allows(uid, gid) {
        shared.stats.refused_denied.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            pid,
            uid,
            gid,
            "query refused: this peer may not read events"
        );
        let _ = writeln!(
            stream,
            "{}",
            error_line(
                ErrorCode::Denied,
                &format!(
                    "uid {uid} may not read events: only root, eventd's own user and \
                     members of the query group may"
                )
            )
        );
        return;
    }
    // Take a slot (only while one is free), or answer busy at once.
    let taken = shared
        .stats
        .running
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < shared.max_queries).then_some(n + 1)
        });
    let _slot = taken.is_ok().then(|| Slot(&shared.stats.running));
    if taken.is_err() {
        shared.stats.refused_busy.fetch_add(1, Ordering::Relaxed);
        let _ = writeln!(
            stream,
            "{}",
            error_line(
                ErrorCode::Busy,
                &format!(
                    "{} queries are running (MaxConcurrentQueries); try again",
                    shared.max_queries
                )
            )
        );
        return;
    }
    let request = match request {
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

fn read_request(stream: &UnixStream) -> Result<Request, String> {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = String::new();
    let mut reader = BufReader::new(stream.take(REQUEST_BYTES_MAX as u64 + 1));
    reader
        .read_line(&mut line)
        .map_err(|e| format!("reading the request: {e}"))?;
    if line.len() > REQUEST_BYTES_MAX {
        return Err(format!("request longer than {REQUEST_BYTES_MAX} bytes"));
    }
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
    // A client that stops reading gets its query ended, not a slot forever.
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
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
    )?;
    let mut count = 0u64;
    let mut last = None;
    while let Some(row) = fan.next_event() {
        last = Some(row.cursor());
        count += 1;
        writeln!(out, "{}", serde_json::json!({ "event": row }))?;
        // Buffered writes may not fail for a while after the client left.
        if count % 1024 == 0 && peer_gone(stream) {
            return Ok(());
        }
    }
    for gap in fan.gaps() {
        writeln!(out, "{}", serde_json::json!({ "gap": gap }))?;
    }
    for warning in &fan.warnings {
        writeln!(out, "{}", serde_json::json!({ "warning": warning }))?;
    }
    drop(fan);
    let Some(mut follower) = follower else {
        let end =
            serde_json::json!({ "end": { "count": count, "cursor": last.map(|c| c.token()) } });
        writeln!(out, "{end}")?;
        return out.flush();
    };
    out.flush()?;
    loop {
        if shared.stop.load(Ordering::Relaxed) {
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
