//! The service-output socket (`StdoutSocket`, default
//! `RUN_DIR/stdout.sock`, mode 0666): each connection carries one stream of
//! a command's output (its stdout or its stderr), and each line of it
//! becomes an event, as journald's stdout stream socket does for systemd's
//! services. `eventctl run` connects a command's stdout and stderr here
//! (in the command's process, so the kernel's credentials of the
//! connection are the command's), and reports how it ended.
//!
//! - [`header`]: the few lines a connection starts with, and eventd's answer;
//! - [`lines`]: lines, `<N>` level prefixes, the event of a line;
//! - [`exit`]: the exit record.
//!
//! The events go into eventd's own syslog ring, the same way as syslog
//! messages (`syslog::record::Ingest::store`): a line waits for room there
//! rather than overwrite anything, so a chatty command is slowed (its
//! writes block, as with journald) and never loses lines while the store
//! commits. Sharing the syslog ring costs nothing in trust (no producer
//! can write either) and keeps one drain for every socket.
//!
//! Connections are bounded as the syslog stream socket's are, with the
//! same code and a budget of their own (`syslog::stream::Shared`: 256 at
//! once, 32 per uid but root's). Unlike a syslog connection, an output
//! connection is never closed for being idle: a service may be silent for
//! days, and closing its stdout would make its next write fail.

pub mod exit;
pub mod header;
pub mod lines;

use crate::syslog::record::{Credentials, Ingest, IngestParts};
use crate::syslog::stream::{peer, Refused, Shared};
use crate::syslog::{SyslogError, SyslogStats};
use crate::trusted::Trusted;
use header::{Header, Stream};
use lines::LineReader;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a client has to send its header.
pub const HEADER_WAIT: Duration = Duration::from_secs(10);
/// How often a blocked read looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(500);

/// The running listener; stops it (and its connections) when dropped.
pub struct StreamListener {
    stop: Arc<AtomicBool>,
    wake: OwnedFd,
    accept: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    /// The socket file eventd made (none for a passed socket).
    bound: Option<crate::syslog::Bound>,
}

/// What every connection of the listener shares.
struct Served {
    ingest: Ingest,
    shared: Arc<Shared>,
    outputs: exit::Outputs,
    sees_every_status: bool,
}

impl StreamListener {
    /// Serves `passed`, the socket the service manager made at `path`
    /// (socket activation: never bound, nor removed, here), or else binds
    /// the socket at `path` (mode 0666; a dead listener's socket file is
    /// replaced, a live one or another file refused); then starts
    /// accepting. `stats` counts lines as a syslog listener counts
    /// messages, and refused connections.
    pub fn start(
        path: &Path,
        passed: Option<UnixListener>,
        parts: IngestParts,
        stats: Arc<SyslogStats>,
    ) -> Result<StreamListener, SyslogError> {
        let err = |source| SyslogError::Socket {
            path: path.to_path_buf(),
            source,
        };
        let (socket, bound) = match passed {
            Some(socket) => (socket, None),
            None => bind(path)?,
        };
        socket.set_nonblocking(true).map_err(err)?;
        let wake = eventfd().map_err(err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared::new(stats.clone(), stop.clone()));
        let served = Arc::new(Served {
            ingest: Ingest::new(parts, stats, stop.clone()),
            shared: shared.clone(),
            outputs: exit::Outputs::default(),
            sees_every_status: crate::access::own_uid() == 0,
        });
        let wake_fd = wake.as_raw_fd();
        let accept = std::thread::Builder::new()
            .name("stdout-accept".into())
            .spawn(move || accept_loop(socket, wake_fd, served))
            .map_err(SyslogError::Spawn)?;
        let how = if bound.is_some() {
            "bound"
        } else {
            "passed by the service manager"
        };
        tracing::info!(socket = %path.display(), how, "service output socket listening");
        Ok(StreamListener {
            stop,
            wake,
            accept: Some(accept),
            shared,
            bound,
        })
    }
}

impl Drop for StreamListener {
    fn drop(&mut self) {
        // Relaxed: the flag asks threads to end; the joins order the rest.
        self.stop.store(true, Ordering::Relaxed);
        let one = 1u64.to_ne_bytes();
        // SAFETY: an open eventfd and an 8-byte buffer, as eventfd wants.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        // Connection threads see the stop flag within a read timeout.
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
        if let Some(bound) = &self.bound {
            bound.remove();
        }
    }
}

/// Binds the socket at `path`, mode 0666.
fn bind(path: &Path) -> Result<(UnixListener, Option<crate::syslog::Bound>), SyslogError> {
    let err = |source| SyslogError::Socket {
        path: path.to_path_buf(),
        source,
    };
    crate::syslog::bind_path(path, true)?;
    let socket = UnixListener::bind(path).map_err(err)?;
    let bound = crate::syslog::Bound::new(path);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
    Ok((socket, Some(bound)))
}

/// Waits in `poll` on the listener and the stop eventfd; accepts,
/// admits, and serves each connection on a thread of its own.
fn accept_loop(listener: UnixListener, wake_fd: std::os::fd::RawFd, served: Arc<Served>) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd entries, and their count.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        // Relaxed: as everywhere the stop flag is read.
        if served.shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!(error = %e, "service output socket: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        // The listener is non-blocking; its connections are not.
        if stream.set_nonblocking(false).is_err() {
            continue;
        }
        let creds = peer(&stream);
        let uid = creds.map_or(u32::MAX, |c| c.uid);
        match served.shared.admit(uid) {
            Ok(admitted) => {
                let served2 = served.clone();
                served.shared.spawn("stdout-stream", admitted, move |_| {
                    serve(stream, creds, &served2)
                });
            }
            Err(why) => refuse(stream, why, uid),
        }
    }
}

/// Tells a client why it was refused, then closes its connection.
fn refuse(mut stream: UnixStream, why: Refused, uid: u32) {
    let text = match why {
        Refused::Share => format!(
            "error: uid {uid} holds its share of the service output connections ({} at once)\n",
            crate::syslog::stream::CONNECTIONS_PER_UID_MAX
        ),
        Refused::Total => format!(
            "error: {} service output connections are open, the most eventd serves\n",
            crate::syslog::stream::CONNECTIONS_MAX
        ),
    };
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = stream.write_all(text.as_bytes());
}

/// One connection: its header, the answer, then its lines or its exit
/// report.
fn serve(stream: UnixStream, creds: Option<Credentials>, served: &Served) {
    // The connecting process, as it is now (see `Pinned`).
    let pin = creds.map(|c| served.ingest.senders().pin(c.pid));
    let _ = stream.set_read_timeout(Some(STOP_CHECK));
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let _ = writer.set_write_timeout(Some(Duration::from_secs(1)));
    let mut reader = LineReader::new(&stream, &served.shared.stop);
    let header = match read_header(&mut reader) {
        Ok(h) => h,
        Err(why) => {
            let _ = writer.write_all(format!("error: {why}\n").as_bytes());
            return;
        }
    };
    let mut ingest = served.ingest.clone();
    if header.stream == Stream::Exit {
        let answer = match store_exit(&header, creds, served, &mut ingest) {
            Ok(()) => "ok\n".to_string(),
            Err(why) => format!("error: {why}\n"),
        };
        let _ = writer.write_all(answer.as_bytes());
        return;
    }
    // Counted open before the client hears `ok`: an exit report sent once
    // the command ran then waits for this connection's lines.
    let _open = creds.map(|c| served.outputs.opened(c));
    if writer.write_all(b"ok\n").is_err() {
        return;
    }
    drop(writer);
    let (mut text, mut fields) = (String::new(), Vec::new());
    let max = ingest.payload_bytes_max();
    loop {
        let line = match reader.next_line(lines::PIECE_MAX, None) {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "service output connection ended");
                return;
            }
        };
        let info = creds.and_then(|c| {
            let pin = pin?;
            ingest.senders().lookup_pinned(pin, c.pid, c.uid, c.gid)
        });
        let event = lines::line_event(
            &header,
            creds,
            Trusted::of(info.as_deref()),
            line,
            max,
            (&mut text, &mut fields),
        );
        ingest.store(&event);
    }
}

/// Reads and checks the header (within [`HEADER_WAIT`]).
fn read_header<R: std::io::Read>(reader: &mut LineReader<'_, R>) -> Result<Header, String> {
    let deadline = Some(Instant::now() + HEADER_WAIT);
    let mut lines: Vec<String> = Vec::new();
    let mut want = 1;
    while lines.len() < want {
        match reader.next_line(header::LINE_MAX, deadline) {
            Ok(Some((line, lines::LineBreak::Newline))) => {
                lines.push(String::from_utf8_lossy(line).into_owned());
                if lines.len() == 1 {
                    want = 1 + Header::lines_after(&lines[0]);
                }
            }
            Ok(Some(_)) => {
                return Err(format!(
                    "line {}: not ended by a newline within {} bytes",
                    lines.len() + 1,
                    header::LINE_MAX
                ))
            }
            Ok(None) => return Err("the connection ended within the header".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    Header::parse(&refs)
}

fn store_exit(
    header: &Header,
    creds: Option<Credentials>,
    served: &Served,
    ingest: &mut Ingest,
) -> Result<(), String> {
    let senders = ingest.senders().clone();
    let cx = exit::Context {
        outputs: &served.outputs,
        senders: &senders,
        sees_every_status: served.sees_every_status,
    };
    let (mut message, mut fields) = (String::new(), String::new());
    let event = exit::exit_event(header, creds, &cx, (&mut message, &mut fields))?;
    ingest.store(&event);
    Ok(())
}

/// A fresh close-on-exec eventfd (the accept loop's stop signal).
fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory preconditions; the result is checked
    // before it is owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
