//! Who is on the other end of a query connection: the peer's credentials
//! and supplementary groups as the kernel recorded them at connect, and
//! whether the query grant admits them.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// Supplementary groups of a peer read at most (the kernel's limit is
/// 65536; a peer with more is judged by the first ones).
const PEER_GROUPS_MAX: usize = 4096;

/// Who may read events: root, eventd's own user, and whoever the query
/// grant names (a group, or every local user).
#[derive(Debug, Clone)]
pub struct Access {
    pub grant: crate::access::Grant,
}

impl Access {
    /// Whether a peer with these credentials may read events. Group
    /// membership is the peer's own supplementary groups as the kernel
    /// gave them at connect (SO_PEERGROUPS), the same groups the kernel
    /// checks when that process opens a shard file: no user or group
    /// database is read, and what the socket allows is what the files allow.
    pub fn allows(&self, uid: libc::uid_t, gid: libc::gid_t, groups: &[libc::gid_t]) -> bool {
        self.grant.allows(uid, gid, groups)
    }
}

/// The peer's supplementary groups (SO_PEERGROUPS), as they were when it
/// connected; empty if the kernel cannot say.
pub(super) fn peer_groups(stream: &UnixStream) -> Vec<libc::gid_t> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` has room for `len` bytes; the kernel writes at
        // most that and sets `len` to what it wrote (or, with ERANGE, to
        // what it needs).
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return groups;
        }
        let range = std::io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE);
        if !range || n <= groups.len() || groups.len() >= PEER_GROUPS_MAX {
            return Vec::new();
        }
        groups.resize(n.min(PEER_GROUPS_MAX), 0);
    }
}

/// The peer's (pid, uid, gid).
pub(super) fn peer_credentials(stream: &UnixStream) -> std::io::Result<(i32, u32, u32)> {
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
