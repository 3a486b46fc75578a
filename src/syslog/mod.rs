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
#[derive(Debug, Clone)]
pub struct SyslogConfig {
    pub datagram: Option<PathBuf>,
    pub stream: Option<PathBuf>,
    pub receive: ReceiveMode,
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
    /// Sockets to shut down at stop (wakes blocked recvmmsg and accept).
    fds: Vec<RawFd>,
    /// Written at stop: wakes the io_uring receiver.
    wake: Option<std::os::fd::OwnedFd>,
    threads: Vec<JoinHandle<()>>,
    paths: Vec<Bound>,
    /// The stream listener's shared state (its connection threads).
    stream: Option<Arc<stream::Shared>>,
    /// A duplicate of the stream listener's descriptor: shut down at stop
    /// (the accept thread owns the listener itself).
    stream_fd: Option<std::os::fd::OwnedFd>,
    // Kept open until the threads are joined.
    _datagram: Option<UnixDatagram>,
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
    /// Binds the sockets and starts the receivers.
    pub fn start(
        config: &SyslogConfig,
        parts: IngestParts,
        stats: Arc<SyslogStats>,
    ) -> Result<SyslogListener, SyslogError> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut listener = SyslogListener {
            stop: stop.clone(),
            fds: Vec::new(),
            threads: Vec::new(),
            paths: Vec::new(),
            _datagram: None,
            wake: None,
            stream: None,
            stream_fd: None,
        };
        let ingest = Ingest::new(parts, stats.clone(), stop);
        if let Some(path) = &config.datagram {
            listener.listen_datagram(path, config.receive, ingest.clone(), &stats)?;
        }
        if let Some(path) = &config.stream {
            listener.listen_stream(path, ingest, &stats)?;
        }
        Ok(listener)
    }

    /// Binds the datagram socket at `path` (mode 0666, credentials passed)
    /// and starts its receiving thread, which sets io_uring up itself (a
    /// ring set up for one issuer belongs to the thread that made it) and
    /// says whether it could before start-up goes on.
    fn listen_datagram(
        &mut self,
        path: &Path,
        mode: ReceiveMode,
        mut ingest: Ingest,
        stats: &Arc<SyslogStats>,
    ) -> Result<(), SyslogError> {
        let err = |source| SyslogError::Socket {
            path: path.to_path_buf(),
            source,
        };
        bind_path(path, false)?;
        let socket = UnixDatagram::bind(path).map_err(err)?;
        self.paths.push(Bound::new(path));
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
        let fd = socket.as_raw_fd();
        set_int_option(fd, libc::SO_PASSCRED, 1).map_err(err)?;
        // As root the limit can be passed; otherwise the system's cap
        // applies, which is fine.
        if set_int_option(fd, libc::SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES).is_err() {
            let _ = set_int_option(fd, libc::SO_RCVBUF, RECEIVE_BUFFER_BYTES);
        }
        let wake = eventfd().map_err(err)?;
        let wake_fd = wake.as_raw_fd();
        self.wake = Some(wake);
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
        tracing::info!(socket = %path.display(), "syslog datagram socket listening");
        self.fds.push(fd);
        self.threads.push(thread);
        self._datagram = Some(socket);
        Ok(())
    }

    /// Binds the stream socket at `path` (mode 0666) and starts its accept
    /// thread.
    fn listen_stream(
        &mut self,
        path: &Path,
        ingest: Ingest,
        stats: &Arc<SyslogStats>,
    ) -> Result<(), SyslogError> {
        let err = |source| SyslogError::Socket {
            path: path.to_path_buf(),
            source,
        };
        bind_path(path, true)?;
        let socket = UnixListener::bind(path).map_err(err)?;
        self.paths.push(Bound::new(path));
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
        self.stream_fd = Some(
            std::os::fd::AsFd::as_fd(&socket)
                .try_clone_to_owned()
                .map_err(err)?,
        );
        let shared = Arc::new(stream::Shared::new(stats.clone(), self.stop.clone()));
        self.stream = Some(shared.clone());
        let thread = std::thread::Builder::new()
            .name("syslog-accept".into())
            .spawn(move || stream::accept_loop(socket, ingest, shared))
            .map_err(SyslogError::Spawn)?;
        tracing::info!(socket = %path.display(), "syslog stream socket listening");
        self.threads.push(thread);
        Ok(())
    }
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
        if let Some(wake) = &self.wake {
            let one = 1u64.to_ne_bytes();
            // SAFETY: an open eventfd and an 8-byte buffer, as eventfd wants.
            unsafe { libc::write(wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
        for &fd in &self.fds {
            // SAFETY: the datagram socket is owned by this struct, open
            // until it is dropped after this.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        if let Some(fd) = &self.stream_fd {
            // Makes the blocked accept return. SAFETY: our own duplicate of
            // the listener's descriptor, open until this struct is dropped.
            unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Connection threads see the stop flag within a read timeout.
        if let Some(shared) = &self.stream {
            let threads =
                std::mem::take(&mut *shared.threads.lock().unwrap_or_else(|p| p.into_inner()));
            for t in threads {
                let _ = t.join();
            }
        }
        for p in &self.paths {
            p.remove();
        }
    }
}
