//! Socket activation: the sockets the service manager made and passed to
//! eventd (the LISTEN_FDS protocol, read through the `sd-notify` crate).
//!
//! Each passed descriptor is sorted by what it is, so the socket units
//! decide the paths and eventd needs no setting to match them:
//!
//! - a listening Unix stream socket named `query` (the package's
//!   eventd-query.socket, `FileDescriptorName=query`) is the query socket;
//! - every other Unix datagram socket is a syslog datagram socket
//!   (eventd.socket's `syslog.sock`, systemd's `syslog.socket` that journald
//!   forwards to, `/dev/log` on a host without journald);
//! - every other listening Unix stream socket is a syslog stream socket.
//!
//! Anything else (an Internet socket, a socket that does not listen, a
//! descriptor that is no socket) stops start-up with an error naming its
//! number and name: a unit that passes it is wrong, and guessing would
//! serve it the wrong way.

use crate::syslog::{Passed, PassedSockets};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::PathBuf;

/// The name that makes a passed stream socket the query socket.
pub const QUERY_NAME: &str = "query";

/// Every socket the service manager passed, sorted.
#[derive(Debug, Default)]
pub struct Activation {
    pub query: Option<Passed<UnixListener>>,
    pub syslog: PassedSockets,
}

#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("the service manager's LISTEN_FDS or LISTEN_FDNAMES cannot be read: {0}")]
    Environment(std::io::Error),
    #[error(
        "descriptor {fd} passed by the service manager (named {name:?}) {problem}: eventd takes \
         only Unix datagram sockets and listening Unix stream sockets"
    )]
    Unusable {
        fd: RawFd,
        name: String,
        problem: String,
    },
    #[error("two query sockets were passed by the service manager (descriptors {0} and {1})")]
    TwoQuerySockets(RawFd, RawFd),
}

impl Activation {
    /// Takes the sockets passed to this process (nothing when LISTEN_PID
    /// names another process or LISTEN_FDS is unset) and removes the
    /// variables, so that nothing started later takes them for its own.
    ///
    /// # Safety
    ///
    /// Call once, before any other thread runs (it changes the
    /// environment), and before anything else takes ownership of the
    /// descriptors from 3 on that LISTEN_FDS counts.
    pub unsafe fn from_service_manager() -> Result<Activation, ActivationError> {
        // SAFETY: no other thread runs yet (our caller's promise), so
        // nothing reads the environment while it changes.
        let fds = unsafe { sd_notify::listen_fds_with_names_and_unset_env() }
            .map_err(ActivationError::Environment)?;
        let mut activation = Activation::default();
        for (fd, name) in fds {
            // SAFETY: the service manager passed this descriptor to this
            // process (LISTEN_PID), and nothing took it before (our
            // caller's promise); from now on it is owned here alone.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            activation.take(owned, fd, name)?;
        }
        Ok(activation)
    }

    /// Whether no socket at all was passed.
    pub fn is_empty(&self) -> bool {
        self.query.is_none() && self.syslog.is_empty()
    }

    /// Sorts one passed descriptor (see the module docs).
    fn take(&mut self, owned: OwnedFd, fd: RawFd, name: String) -> Result<(), ActivationError> {
        let unusable = |problem: &str| ActivationError::Unusable {
            fd,
            name: name.clone(),
            problem: problem.to_string(),
        };
        let int = |level, option| {
            socket_int(fd, level, option).map_err(|e| unusable(&format!("is not a socket ({e})")))
        };
        if int(libc::SOL_SOCKET, libc::SO_DOMAIN)? != libc::AF_UNIX {
            return Err(unusable("is not a Unix socket"));
        }
        let path = bound_path(fd);
        match int(libc::SOL_SOCKET, libc::SO_TYPE)? {
            libc::SOCK_DGRAM => {
                let socket = UnixDatagram::from(owned);
                self.syslog.datagrams.push(Passed { socket, name, path });
            }
            libc::SOCK_STREAM if int(libc::SOL_SOCKET, libc::SO_ACCEPTCONN)? == 1 => {
                let socket = UnixListener::from(owned);
                let passed = Passed { socket, name, path };
                if passed.name == QUERY_NAME {
                    if let Some(first) = &self.query {
                        let first = std::os::fd::AsRawFd::as_raw_fd(&first.socket);
                        return Err(ActivationError::TwoQuerySockets(first, fd));
                    }
                    self.query = Some(passed);
                } else {
                    self.syslog.streams.push(passed);
                }
            }
            libc::SOCK_STREAM => return Err(unusable("is a stream socket that does not listen")),
            _ => return Err(unusable("is neither a datagram nor a stream socket")),
        }
        Ok(())
    }

    /// One log line per passed socket.
    pub fn log(&self) {
        let show = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or_else(|| "(no path)".to_string(), |p| p.display().to_string())
        };
        if let Some(q) = &self.query {
            tracing::info!(name = %q.name, path = %show(&q.path), "query socket passed by the service manager");
        }
        for d in &self.syslog.datagrams {
            tracing::info!(name = %d.name, path = %show(&d.path), "syslog datagram socket passed by the service manager");
        }
        for s in &self.syslog.streams {
            tracing::info!(name = %s.name, path = %show(&s.path), "syslog stream socket passed by the service manager");
        }
    }
}

/// An integer socket option of `fd`.
fn socket_int(fd: RawFd, level: libc::c_int, option: libc::c_int) -> std::io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int-sized buffer and its length; getsockopt fails cleanly
    // on a descriptor that is not a socket.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            option,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The filesystem path a Unix socket is bound to (`None`: unbound, or an
/// abstract address).
fn bound_path(fd: RawFd) -> Option<PathBuf> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: a sockaddr_un-sized buffer and its length.
    let rc =
        unsafe { libc::getsockname(fd, (&mut addr as *mut libc::sockaddr_un).cast(), &mut len) };
    if rc != 0 {
        return None;
    }
    let offset = std::mem::size_of::<libc::sa_family_t>();
    let bytes: Vec<u8> = addr.sun_path[..(len as usize)
        .saturating_sub(offset)
        .min(addr.sun_path.len())]
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    // An abstract address starts with a zero byte: no path.
    (!bytes.is_empty()).then(|| {
        use std::os::unix::ffi::OsStringExt;
        PathBuf::from(std::ffi::OsString::from_vec(bytes))
    })
}
