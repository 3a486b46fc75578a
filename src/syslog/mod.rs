//! Syslog ingest: programs that know nothing of eventd log to it like to
//! `/dev/log`.
//!
//! - A Unix datagram socket (`SyslogSocket`, default `RUN_DIR/syslog.sock`,
//!   mode 0666 like `/dev/log`) takes RFC 5424 and RFC 3164 messages with
//!   their SCM_CREDENTIALS. It is read through io_uring (a multishot
//!   `recvmsg` into provided buffers, see [`uring`]) or, where io_uring is not
//!   available or `SyslogReceive = "recvmmsg"`, with `recvmmsg` (see
//!   [`recvmmsg`]); the log says once which.
//! - A Unix stream socket (`SyslogStreamSocket`, default
//!   `RUN_DIR/syslog-stream.sock`) takes long messages, octet-counted or one
//!   per line ([`stream`]).
//!
//! Every message becomes an event in eventd's own syslog ring
//! (`KMES_DIR/syslog.ring`, mode 0600: no producer can open it, so nobody
//! else can overwrite or read a message there) ([`record`]), so it gets a
//! sequence number, a receipt, gap accounting and crash recovery like every
//! other event. A receiver waits while that ring is nearly full rather than
//! let it overwrite what it received; the kernel holds later messages
//! meanwhile and blocking senders wait, as they do for journald or rsyslog.
//! It waits only while the store commits, and for at most a couple of
//! seconds: when the store cannot take events (a full disk), messages that
//! do not fit are dropped, counted, and recorded as one `dropped` gap once
//! the ring has room again, so senders are never held for as long as the
//! disk stays full. Malformed messages are stored with their problems
//! and raw bytes; empty ones are counted as rejected. Nothing a sender
//! writes stops a listener.

pub mod message;
pub mod parse;
pub mod record;
pub mod recvmmsg;
pub mod rfc3164;
pub mod stream;
pub mod timestamp;
pub mod uring;

pub use crate::rings::drops::{DropReport, Drops};
pub use record::IngestParts;
use record::{Ingest, Transport};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// How the datagram socket is read (`SyslogReceive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiveMode {
    /// io_uring where it works, else recvmmsg.
    Auto,
    /// io_uring or refuse to start.
    IoUring,
    /// recvmmsg, even where io_uring works.
    Recvmmsg,
}

/// The receive path in use, for stats.
pub const PATH_NONE: u8 = 0;
pub const PATH_IO_URING: u8 = 1;
pub const PATH_RECVMMSG: u8 = 2;

/// What the listeners count. Relaxed everywhere: monitoring only.
#[derive(Debug, Default)]
pub struct SyslogStats {
    pub received: AtomicU64,
    /// Written into a ring (malformed and truncated ones included).
    pub stored: AtomicU64,
    /// Stored, with problems noted and the raw bytes kept.
    pub malformed: AtomicU64,
    /// Stored whole as plain text: neither an RFC 5424 nor an RFC 3164
    /// header was found (`fields.format` is `unstructured`).
    pub unstructured: AtomicU64,
    /// Stored cut to fit a ring record or the receive buffer.
    pub truncated: AtomicU64,
    pub rejected_empty: AtomicU64,
    /// Not even the fields fitted a record (never with the default rings).
    pub rejected_too_large: AtomicU64,
    pub rejected_connections: AtomicU64,
    /// Stream connections refused because their uid held its share.
    pub rejected_connections_share: AtomicU64,
    /// Received while eventd was stopping (the drains are about to stop).
    pub rejected_stopping: AtomicU64,
    /// The ring refused the event (contended, or lapped mid-write).
    pub emit_failures: AtomicU64,
    /// Received and not kept: the syslog ring stayed full (the store could
    /// not commit) or refused the event. Recorded as a `dropped` gap when
    /// the ring has room again.
    pub dropped: AtomicU64,
    /// Times a receiver waited for the drain to make room in its ring.
    pub ring_waits: AtomicU64,
    /// Receive system calls that returned messages (io_uring_enter or
    /// recvmmsg): `received / receive_calls` is messages per call.
    pub receive_calls: AtomicU64,
    pub receive_errors: AtomicU64,
    /// [`PATH_IO_URING`] or [`PATH_RECVMMSG`].
    pub path: AtomicU8,
}

impl SyslogStats {
    pub fn path_name(&self) -> &'static str {
        match self.path.load(Ordering::Relaxed) {
            PATH_IO_URING => "io_uring",
            PATH_RECVMMSG => "recvmmsg",
            _ => "none",
        }
    }
}

/// Where and how to listen.
#[derive(Debug)]
pub struct SyslogConfig {
    /// The datagram socket eventd binds itself, unless one of the passed
    /// datagram sockets is bound there already.
    pub datagram: Option<PathBuf>,
    /// The stream socket eventd binds itself, on the same terms.
    pub stream: Option<PathBuf>,
    pub receive: ReceiveMode,
    /// The sockets the service manager passed (socket activation).
    pub passed: PassedSockets,
}

/// A socket the service manager made and passed to eventd (socket
/// activation: `LISTEN_FDS`). eventd reads it but never binds, removes or
/// shuts it down: it outlives eventd, and what is sent to it while eventd
/// restarts waits in it.
#[derive(Debug)]
pub struct Passed<S> {
    pub socket: S,
    /// Its name in LISTEN_FDNAMES (the socket unit's name, or its
    /// FileDescriptorName=).
    pub name: String,
    /// The path it is bound to, if it has one.
    pub path: Option<PathBuf>,
}

/// The syslog sockets the service manager passed: every Unix datagram
/// socket (the package's eventd.socket, systemd's syslog.socket that
/// journald forwards to, `/dev/log`) and every listening Unix stream
/// socket but the query socket.
#[derive(Debug, Default)]
pub struct PassedSockets {
    pub datagrams: Vec<Passed<UnixDatagram>>,
    pub streams: Vec<Passed<UnixListener>>,
}

impl PassedSockets {
    pub fn is_empty(&self) -> bool {
        self.datagrams.is_empty() && self.streams.is_empty()
    }

    /// Takes out the passed stream socket bound at `path`, if there is
    /// one: it is not a syslog socket (the service-output socket is
    /// matched to its passed descriptor this way, as the syslog sockets
    /// are to theirs).
    pub fn take_stream_at(&mut self, path: &Path) -> Option<Passed<UnixListener>> {
        let at = self
            .streams
            .iter()
            .position(|p| p.path.as_deref() == Some(path))?;
        Some(self.streams.remove(at))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SyslogError {
    #[error("syslog socket {path}: {source}")]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("SyslogReceive = \"io_uring\", but io_uring cannot be used here: {0}")]
    NoIoUring(uring::Unavailable),
    #[error("cannot start a syslog thread: {0}")]
    Spawn(std::io::Error),
}

/// The running listeners; stops them when dropped.
pub struct SyslogListener {
    stop: Arc<AtomicBool>,
    /// The datagram sockets eventd bound itself, shut down at stop (never
    /// a passed one: that would end it for the service manager too).
    fds: Vec<RawFd>,
    /// Written at stop: wakes every receiver (io_uring or recvmmsg, which
    /// wait on it beside their socket) and accept thread.
    wake: std::os::fd::OwnedFd,
    threads: Vec<JoinHandle<()>>,
    paths: Vec<Bound>,
    /// The stream listeners' shared state (the connection threads and
    /// their bounds, over every stream socket together).
    stream: Arc<stream::Shared>,
    // Kept open until the threads are joined.
    _datagrams: Vec<UnixDatagram>,
}

/// Makes way for a socket at `path`: a socket file nobody listens on (a
/// dead daemon's) is removed; a live one (another syslog daemon's `/dev/log`,
/// say) or anything that is not a socket is left alone, and that is an error.
pub(crate) fn bind_path(path: &Path, stream: bool) -> Result<(), SyslogError> {
    let refuse = |why: &str| SyslogError::Socket {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, why.to_string()),
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(refuse("exists and is not a socket; not replaced"));
        }
        let live = || {
            if stream {
                std::os::unix::net::UnixStream::connect(path).is_ok()
            } else {
                UnixDatagram::unbound()
                    .and_then(|s| s.connect(path))
                    .is_ok()
            }
        };
        // A daemon killed a moment ago can still answer: its io_uring is
        // torn down after the process, holding the socket until then. Only
        // a socket that stays live is someone else's.
        let mut checks = 0;
        while live() {
            checks += 1;
            if checks >= LIVE_CHECKS {
                return Err(refuse("another process listens on it; not replaced"));
            }
            std::thread::sleep(LIVE_CHECK_PAUSE);
        }
        let _ = std::fs::remove_file(path);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| SyslogError::Socket {
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

/// A socket file this listener made: removed at stop only if it is still
/// the same file.
pub(crate) struct Bound {
    path: PathBuf,
    identity: Option<(u64, u64)>,
}

impl Bound {
    pub(crate) fn new(path: &Path) -> Bound {
        use std::os::unix::fs::MetadataExt;
        Bound {
            path: path.to_path_buf(),
            identity: std::fs::symlink_metadata(path)
                .ok()
                .map(|m| (m.dev(), m.ino())),
        }
    }

    pub(crate) fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        let now = std::fs::symlink_metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if now.is_some() && now == self.identity {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn set_int_option(fd: RawFd, name: libc::c_int, value: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a valid socket and an int-sized option value.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// How often, and how far apart, a socket found at the configured path is
/// checked before it is taken for another process's (2 s in all).
const LIVE_CHECKS: u32 = 20;
const LIVE_CHECK_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Socket receive buffer asked for: bursts wait in the kernel, not lost.
const RECEIVE_BUFFER_BYTES: libc::c_int = 8 << 20;

impl SyslogListener {
    /// Starts a receiver on every passed socket, then binds the configured
    /// sockets no passed one is bound at, and starts their receivers.
    pub fn start(
        config: SyslogConfig,
        parts: IngestParts,
        stats: Arc<SyslogStats>,
    ) -> Result<SyslogListener, SyslogError> {
        let stop = Arc::new(AtomicBool::new(false));
        let wake = eventfd().map_err(|source| SyslogError::Socket {
            path: PathBuf::from("(eventfd)"),
            source,
        })?;
        let mut listener = SyslogListener {
            stop: stop.clone(),
            fds: Vec::new(),
            wake,
            threads: Vec::new(),
            paths: Vec::new(),
            _datagrams: Vec::new(),
            stream: Arc::new(stream::Shared::new(stats.clone(), stop.clone())),
        };
        let ingest = Ingest::new(parts, stats.clone(), stop);
        let SyslogConfig {
            datagram,
            stream,
            receive,
            passed,
        } = config;
        let passed_at =
            |path: &Path, bound: &[Option<PathBuf>]| bound.iter().flatten().any(|p| p == path);
        let bound: Vec<_> = passed.datagrams.iter().map(|p| p.path.clone()).collect();
        for p in passed.datagrams {
            let label = passed_label(&p);
            listener.listen_datagram(p.socket, &label, receive, ingest.clone(), &stats)?;
        }
        if let Some(path) = datagram.filter(|p| !passed_at(p, &bound)) {
            let socket = bind_datagram(&path)?;
            listener.paths.push(Bound::new(&path));
            listener.fds.push(socket.as_raw_fd());
            let label = path.display().to_string();
            listener.listen_datagram(socket, &label, receive, ingest.clone(), &stats)?;
        }
        let bound: Vec<_> = passed.streams.iter().map(|p| p.path.clone()).collect();
        for p in passed.streams {
            let label = passed_label(&p);
            listener.listen_stream(p.socket, &label, ingest.clone())?;
        }
        if let Some(path) = stream.filter(|p| !passed_at(p, &bound)) {
            let socket = bind_stream(&path)?;
            listener.paths.push(Bound::new(&path));
            listener.listen_stream(socket, &path.display().to_string(), ingest)?;
        }
        Ok(listener)
    }

    /// Starts the receiving thread of a datagram socket, which sets
    /// io_uring up itself (a ring set up for one issuer belongs to the
    /// thread that made it) and says whether it could before start-up goes
    /// on. Asks for a large receive buffer and for the senders'
    /// credentials (a socket unit sets both too).
    fn listen_datagram(
        &mut self,
        socket: UnixDatagram,
        label: &str,
        mode: ReceiveMode,
        mut ingest: Ingest,
        stats: &Arc<SyslogStats>,
    ) -> Result<(), SyslogError> {
        let fd = socket.as_raw_fd();
        set_int_option(fd, libc::SO_PASSCRED, 1).map_err(|source| SyslogError::Socket {
            path: PathBuf::from(label),
            source,
        })?;
        // As root the limit can be passed; otherwise the system's cap
        // applies, which is fine.
        if set_int_option(fd, libc::SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES).is_err() {
            let _ = set_int_option(fd, libc::SO_RCVBUF, RECEIVE_BUFFER_BYTES);
        }
        let wake_fd = self.wake.as_raw_fd();
        let (stats, stop) = (stats.clone(), self.stop.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("syslog-dgram".into())
            .spawn(move || {
                let receiver = match set_up_receiver(mode) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                receive(fd, wake_fd, receiver, &mut ingest, &stats, &stop)
            })
            .map_err(SyslogError::Spawn)?;
        let ready = ready_rx.recv();
        if !matches!(ready, Ok(Ok(()))) {
            let _ = thread.join();
            return Err(match ready {
                Ok(Err(e)) => SyslogError::NoIoUring(e),
                _ => SyslogError::Spawn(std::io::Error::other(
                    "the syslog receiving thread ended while setting up",
                )),
            });
        }
        tracing::info!(socket = %label, "syslog datagram socket listening");
        self.threads.push(thread);
        self._datagrams.push(socket);
        Ok(())
    }

    /// Starts the accept thread of a listening stream socket.
    fn listen_stream(
        &mut self,
        socket: UnixListener,
        label: &str,
        ingest: Ingest,
    ) -> Result<(), SyslogError> {
        let shared = self.stream.clone();
        let wake_fd = self.wake.as_raw_fd();
        let thread = std::thread::Builder::new()
            .name("syslog-accept".into())
            .spawn(move || stream::accept_loop(socket, wake_fd, ingest, shared))
            .map_err(SyslogError::Spawn)?;
        tracing::info!(socket = %label, "syslog stream socket listening");
        self.threads.push(thread);
        Ok(())
    }
}

/// How a passed socket is named in the log: its path and its name.
fn passed_label<S>(p: &Passed<S>) -> String {
    let path = p
        .path
        .as_ref()
        .map_or_else(|| "(no path)".to_string(), |p| p.display().to_string());
    format!("{path} (passed by the service manager as {:?})", p.name)
}

/// Binds a datagram socket at `path` (mode 0666, like `/dev/log`).
fn bind_datagram(path: &Path) -> Result<UnixDatagram, SyslogError> {
    let err = |source| SyslogError::Socket {
        path: path.to_path_buf(),
        source,
    };
    bind_path(path, false)?;
    let socket = UnixDatagram::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
    Ok(socket)
}

/// Binds a listening stream socket at `path` (mode 0666).
fn bind_stream(path: &Path) -> Result<UnixListener, SyslogError> {
    let err = |source| SyslogError::Socket {
        path: path.to_path_buf(),
        source,
    };
    bind_path(path, true)?;
    let socket = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
    Ok(socket)
}

/// The io_uring receiver `mode` asks for: `None` for recvmmsg (asked for,
/// or, in `Auto`, because io_uring is not available, which is logged once);
/// an error only when io_uring is required and cannot be used.
fn set_up_receiver(mode: ReceiveMode) -> Result<Option<uring::UringReceiver>, uring::Unavailable> {
    match mode {
        ReceiveMode::Recvmmsg => Ok(None),
        ReceiveMode::IoUring => uring::UringReceiver::new().map(Some),
        ReceiveMode::Auto => match uring::UringReceiver::new() {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                tracing::warn!(
                    reason = %e,
                    "io_uring is not available; the syslog socket is read with recvmmsg"
                );
                Ok(None)
            }
        },
    }
}

/// A fresh close-on-exec eventfd (the receiver's stop signal).
fn eventfd() -> std::io::Result<std::os::fd::OwnedFd> {
    // SAFETY: eventfd has no memory preconditions; the result is checked
    // before it is owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// The datagram receiver thread: io_uring if set up, else (or when it
/// fails later) recvmmsg.
fn receive(
    fd: RawFd,
    wake_fd: RawFd,
    receiver: Option<uring::UringReceiver>,
    ingest: &mut Ingest,
    stats: &SyslogStats,
    stop: &AtomicBool,
) {
    if let Some(r) = receiver {
        stats.path.store(PATH_IO_URING, Ordering::Relaxed);
        tracing::info!(
            task_running = r.task_running(),
            "syslog socket read through io_uring (multishot recvmsg)"
        );
        match r.run(fd, wake_fd, ingest, stats, stop) {
            Ok(()) => return,
            Err(e) => tracing::warn!(
                error = %e,
                "io_uring receive failed; the syslog socket is read with recvmmsg from now on"
            ),
        }
    }
    stats.path.store(PATH_RECVMMSG, Ordering::Relaxed);
    recvmmsg::run(
        fd,
        wake_fd,
        &mut |bytes, len, creds| ingest.deliver(bytes, len, creds, Transport::Datagram),
        stats,
        stop,
    );
}

impl Drop for SyslogListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let one = 1u64.to_ne_bytes();
        // SAFETY: an open eventfd and an 8-byte buffer, as eventfd wants.
        // The eventfd stays readable, so every waiter sees it.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        for &fd in &self.fds {
            // SAFETY: a datagram socket eventd bound, owned by this struct
            // and open until it is dropped after this.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Connection threads see the stop flag within a read timeout.
        let threads = std::mem::take(
            &mut *self
                .stream
                .threads
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
        for p in &self.paths {
            p.remove();
        }
    }
}
