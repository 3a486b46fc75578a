//! Who may do what: the permission model of `docs/design/security.md`, as code.
//!
//! Three things can be granted, each to root and eventd's own user always,
//! and beyond them to a group, to every local user, or to nobody else:
//!
//! - **query** (`QueryGroup`): read events through the query socket, and the
//!   shard files themselves (so `eventctl query --offline` works for the same
//!   people);
//! - **produce** (`ProducerGroup`): open the KMES rings and emit into them.
//!   A ring is shared memory that producers map read-write (a mapping
//!   cannot be write-only), so whoever may emit may also read what other
//!   producers emitted and the drain has not overwritten yet. The rule is
//!   therefore that the produce grant never reaches anyone the query grant
//!   does not ([`Policy::new`] refuses such a configuration);
//! - every local user may send syslog messages to the syslog sockets (mode
//!   0666, like `/dev/log`), which read nothing back. Those messages go to a
//!   ring of eventd's own that no producer can open.
//!
//! [`Policy`] turns the grants into the mode and group of every directory,
//! file and socket eventd makes ([`Policy::mode`]); [`files`] creates them
//! that way whatever the umask, and checks and mends the ones it finds.

pub mod files;

use std::ffi::CString;

/// Who, besides root and eventd's own user, is granted something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// No one else.
    Nobody,
    /// Members (primary or supplementary) of this group.
    Group(libc::gid_t),
    /// Every local user.
    Everyone,
}

/// The group setting that means "every local user".
pub const EVERYONE: &str = "*";

impl Grant {
    /// Resolves a `QueryGroup`/`ProducerGroup` value: `"*"` is everyone,
    /// `""` nobody, a group name its group, and a number that is not a
    /// group name that group id. A name that does not exist grants nothing
    /// (the second value says so, for a warning).
    pub fn resolve(setting: &str) -> (Grant, bool) {
        match setting.trim() {
            EVERYONE => (Grant::Everyone, true),
            "" => (Grant::Nobody, true),
            name => match group_id(name).or_else(|| name.parse().ok()) {
                Some(gid) => (Grant::Group(gid), true),
                None => (Grant::Nobody, false),
            },
        }
    }

    /// Whether a peer with these credentials (and supplementary `groups`)
    /// is granted this.
    pub fn allows(&self, uid: libc::uid_t, gid: libc::gid_t, groups: &[libc::gid_t]) -> bool {
        if uid == 0 || uid == own_uid() {
            return true;
        }
        match *self {
            Grant::Nobody => false,
            Grant::Everyone => true,
            Grant::Group(g) => gid == g || groups.contains(&g),
        }
    }
}

/// What a path is, for its mode and group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The data directory and the run directory: every local user passes
    /// through them (to the syslog sockets), nobody but eventd writes them.
    PublicDir,
    /// The KMES directory: producers open rings in it.
    KmesDir,
    /// A producer ring.
    Ring,
    /// eventd's own rings (syslog), which no producer opens.
    PrivateRing,
    /// The store directory: query users may list and read it.
    StoreDir,
    /// A shard database and its `-wal` and `-shm` files.
    Shard,
    /// The query socket.
    QuerySocket,
    /// A lock file only eventd opens.
    Lock,
    /// The pid file: readable by all, as pid files are.
    PidFile,
    /// The export stage's directory and its state database: eventd's
    /// user only (cursors and intents, no event data).
    ExportDir,
    ExportState,
}

/// The mode bits and group a path should have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    pub bits: u32,
    /// `None`: keep whatever group the file has (it grants nothing).
    pub group: Option<libc::gid_t>,
}

impl Mode {
    /// Read and write for the owner only.
    pub const PRIVATE: Mode = Mode {
        bits: 0o600,
        group: None,
    };
}

/// The grants, resolved, and what they make of each path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Policy {
    pub query: Grant,
    pub produce: Grant,
}

/// A produce grant that reaches someone the query grant does not.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error(
        "ProducerGroup = {producer:?} lets {who} open the rings, and so read the events in \
         flight there, but QueryGroup = {query:?} does not let {them} read events: use the same \
         group for both, a producer group whose members are all in the query group, or \
         ProducerGroup = \"\" (only root and eventd's own user emit through the rings; everyone \
         can still log through the syslog sockets)"
    )]
    ProducerBeyondQuery {
        producer: String,
        query: String,
        who: String,
        them: &'static str,
    },
}

impl Policy {
    /// The grants of `QueryGroup` and `ProducerGroup`, checked against each
    /// other: the produce grant must not reach anyone the query grant does
    /// not (see the module docs). Members of a producer group that is not
    /// the query group are looked up (the group's member list and the users
    /// whose primary group it is): each must also be a member of the query
    /// group. Unknown group names are warned about and grant nothing.
    pub fn new(query_group: &str, producer_group: &str) -> Result<Policy, AccessError> {
        let (query, query_known) = Grant::resolve(query_group);
        let (produce, producer_known) = Grant::resolve(producer_group);
        if !query_known {
            tracing::warn!(
                group = %query_group,
                "QueryGroup does not exist: only root and eventd's own user may query"
            );
        }
        if !producer_known {
            tracing::warn!(
                group = %producer_group,
                "ProducerGroup does not exist: only root and eventd's own user may emit \
                 through the rings"
            );
        }
        let refuse = |who: String, them: &'static str| AccessError::ProducerBeyondQuery {
            producer: producer_group.to_string(),
            query: query_group.to_string(),
            who,
            them,
        };
        match (produce, query) {
            (Grant::Nobody, _) | (_, Grant::Everyone) => {}
            (p, q) if p == q => {}
            (Grant::Everyone, _) => return Err(refuse("every local user".into(), "them all")),
            (Grant::Group(_), Grant::Nobody) => {
                return Err(refuse(
                    format!("the members of group {producer_group:?}"),
                    "them",
                ))
            }
            (Grant::Group(p), Grant::Group(q)) => {
                if let Some(user) = group_members(p)
                    .into_iter()
                    .find(|(uid, gid)| !user_in_group(*uid, *gid, q))
                {
                    return Err(refuse(
                        format!("user {} (a member of {producer_group:?})", user.0),
                        "that user",
                    ));
                }
            }
        }
        Ok(Policy { query, produce })
    }

    /// The mode and group of a path of `kind`.
    pub fn mode(&self, kind: Kind) -> Mode {
        // (mode when the grant is a group, for everyone, for nobody).
        let by = |grant: Grant, group: u32, everyone: u32, nobody: u32| match grant {
            Grant::Group(g) => Mode {
                bits: group,
                group: Some(g),
            },
            Grant::Everyone => Mode {
                bits: everyone,
                group: None,
            },
            Grant::Nobody => Mode {
                bits: nobody,
                group: None,
            },
        };
        let plain = |bits| Mode { bits, group: None };
        match kind {
            Kind::PublicDir => plain(0o755),
            Kind::KmesDir => by(self.produce, 0o750, 0o755, 0o700),
            Kind::Ring => by(self.produce, 0o660, 0o666, 0o600),
            Kind::PrivateRing | Kind::Lock | Kind::ExportState => plain(0o600),
            Kind::ExportDir => plain(0o700),
            // Set-group-id, so that the `-wal` and `-shm` files SQLite
            // makes beside a shard get the query group too.
            Kind::StoreDir => by(self.query, 0o2750, 0o755, 0o700),
            Kind::Shard => by(self.query, 0o640, 0o644, 0o600),
            Kind::QuerySocket => by(self.query, 0o660, 0o666, 0o600),
            Kind::PidFile => plain(0o644),
        }
    }
}

/// eventd's effective user id.
pub fn own_uid() -> libc::uid_t {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The group id of `name`, if a group of that name exists.
pub fn group_id(name: &str) -> Option<libc::gid_t> {
    let name = CString::new(name).ok()?;
    // SAFETY: libc::group is plain data (pointers and ids); all-zero is a
    // valid value that getgrnam_r overwrites.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 64 << 10];
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

/// Whether user `uid` (primary group `gid`) has `group` among its groups,
/// as the user and group databases say.
pub fn user_in_group(uid: libc::uid_t, gid: libc::gid_t, group: libc::gid_t) -> bool {
    if gid == group {
        return true;
    }
    let Some(name) = user_name(uid) else {
        return false;
    };
    let mut groups = vec![0 as libc::gid_t; 1024];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: name is a valid C string; n is the array's length.
    let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
    rc >= 0 && groups[..n.max(0) as usize].contains(&group)
}

fn user_name(uid: libc::uid_t) -> Option<CString> {
    // SAFETY: plain data, overwritten by getpwuid_r.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 64 << 10];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: valid pointers, buf's length passed.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: pw_name points into buf, a NUL-terminated string alive here.
    Some(unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) }.to_owned())
}

/// The users of group `gid`: those whose primary group it is and those its
/// member list names, as `(uid, primary gid)`.
fn group_members(gid: libc::gid_t) -> Vec<(libc::uid_t, libc::gid_t)> {
    let mut members = Vec::new();
    // The files themselves are read (getpwent and getgrent keep global
    // state, which a daemon's threads would share); users and groups from
    // other sources (LDAP, say) are not enumerable anyway.
    let Ok(passwd) = std::fs::read_to_string("/etc/passwd") else {
        return members;
    };
    let listed: Vec<String> = std::fs::read_to_string("/etc/group")
        .ok()
        .and_then(|text| {
            text.lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 4 && f[2].parse::<libc::gid_t>().ok() == Some(gid))
                .map(|f| {
                    f[3].split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                })
        })
        .unwrap_or_default();
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 {
            continue;
        }
        let (Ok(uid), Ok(primary)) = (f[2].parse(), f[3].parse()) else {
            continue;
        };
        if primary == gid || listed.iter().any(|n| n == f[0]) {
            members.push((uid, primary));
        }
    }
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_resolve_to_grants() {
        assert_eq!(Grant::resolve("*").0, Grant::Everyone);
        assert_eq!(Grant::resolve("").0, Grant::Nobody);
        assert_eq!(Grant::resolve("root"), (Grant::Group(0), true));
        assert_eq!(Grant::resolve("4242"), (Grant::Group(4242), true));
        assert_eq!(Grant::resolve("no-such-group-here"), (Grant::Nobody, false));
    }

    #[test]
    fn grants_admit_root_eventd_and_their_group() {
        let g = Grant::Group(4242);
        assert!(g.allows(0, 1, &[]));
        assert!(g.allows(own_uid(), 1, &[]));
        assert!(g.allows(65534, 4242, &[]));
        assert!(g.allows(65534, 65534, &[7, 4242]));
        assert!(!g.allows(65534, 65534, &[7]));
        assert!(!Grant::Nobody.allows(65534, 4242, &[4242]));
        assert!(Grant::Everyone.allows(65534, 65534, &[]));
    }

    #[test]
    fn producers_never_reach_beyond_queries() {
        // The same group, nobody, or queries open to all: fine.
        assert!(Policy::new("4242", "4242").is_ok());
        assert!(Policy::new("4242", "").is_ok());
        assert!(Policy::new("*", "4242").is_ok());
        assert!(Policy::new("*", "*").is_ok());
        // Everyone may emit but not query: refused, naming both keys.
        let e = Policy::new("4242", "*").unwrap_err().to_string();
        assert!(
            e.contains("ProducerGroup") && e.contains("QueryGroup"),
            "{e}"
        );
        // A producer group while nobody else may query: refused.
        assert!(Policy::new("", "4242").is_err());
    }

    #[test]
    fn modes_follow_the_grants() {
        let p = Policy::new("4242", "4243").unwrap();
        assert_eq!(
            p.mode(Kind::Shard),
            Mode {
                bits: 0o640,
                group: Some(4242)
            }
        );
        assert_eq!(
            p.mode(Kind::Ring),
            Mode {
                bits: 0o660,
                group: Some(4243)
            }
        );
        assert_eq!(p.mode(Kind::PrivateRing).bits, 0o600);
        let closed = Policy::new("", "").unwrap();
        assert_eq!(closed.mode(Kind::StoreDir).bits, 0o700);
        assert_eq!(closed.mode(Kind::Ring).bits, 0o600);
        let open = Policy::new("*", "*").unwrap();
        assert_eq!(open.mode(Kind::Ring).bits, 0o666);
        assert_eq!(open.mode(Kind::Shard).bits, 0o644);
    }
}
