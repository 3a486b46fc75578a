//! Making, checking and mending eventd's directories and files.
//!
//! eventd runs with a umask of 077 ([`restrict_umask`]), so whatever it
//! creates starts out private; then it sets the mode and group the
//! [`Policy`](super::Policy) asks for, explicitly, so an operator's umask
//! never widens or narrows what a file grants. Existing directories and
//! files are checked at start: eventd's own are mended (and the log says
//! what was changed); one owned by another user is not trusted — a
//! directory of another user's that others may write is refused, a file is
//! left alone and reported to the caller, which decides what that means
//! (a ring is replaced, a database's receipts are not believed).

use super::{own_uid, Mode};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The permission bits compared and set (with set-uid/gid and sticky).
const MODE_BITS: u32 = 0o7777;

/// A directory eventd cannot use safely.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("cannot create or read directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} exists and is not a directory")]
    NotADirectory { path: PathBuf },
    #[error(
        "{path} belongs to uid {owner} and lets other users write in it (mode {mode:04o}): \
         they could replace what eventd keeps there; eventd (uid {me}) will not use it. \
         Make it eventd's own or remove group and other write permission"
    )]
    ForeignWritable {
        path: PathBuf,
        owner: u32,
        mode: u32,
        me: u32,
    },
}

/// What [`check_file`] found at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Missing,
    /// eventd's own (or root's) regular file, now with the wanted mode.
    Trusted,
    /// Not to be trusted: why.
    Untrusted(String),
}

/// Makes every file and directory eventd creates from now on start out
/// private to eventd's user (its mode is then set explicitly). Process-wide.
pub fn restrict_umask() {
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(0o077) };
}

/// Makes sure `path` is a directory with `mode`: created if missing,
/// mended if eventd's user owns it (or eventd runs as root), refused if
/// another user owns it and others may write in it. A directory of another
/// user's that others cannot write is used as it is (eventd cannot change
/// it), with a warning if its mode differs.
pub fn ensure_dir(path: &Path, mode: Mode) -> Result<(), DirError> {
    let io = |source| DirError::Io {
        path: path.to_path_buf(),
        source,
    };
    let made = !path.exists();
    std::fs::create_dir_all(path).map_err(io)?;
    // The directory itself may be a symlink an operator made (a data
    // directory on another disk): its target is what is checked.
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_dir() {
        return Err(DirError::NotADirectory {
            path: path.to_path_buf(),
        });
    }
    let me = own_uid();
    let current = meta.mode() & MODE_BITS;
    if meta.uid() != me && me != 0 {
        if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
            return Err(DirError::ForeignWritable {
                path: path.to_path_buf(),
                owner: meta.uid(),
                mode: current,
                me,
            });
        }
        if current != mode.bits {
            tracing::warn!(
                dir = %path.display(),
                owner = meta.uid(),
                mode = %format_args!("{current:04o}"),
                wanted = %format_args!("{:04o}", mode.bits),
                "directory belongs to another user; its mode is left as it is"
            );
        }
        return Ok(());
    }
    let take = me == 0 && meta.uid() != me;
    if made {
        // Made just now (private, by the umask): nothing to report.
        return set(path, &meta, mode, take).map(|_| ()).map_err(io);
    }
    apply(path, &meta, mode, take).map_err(io)
}

/// Checks a file eventd found in one of its directories and, if it is
/// eventd's own (or root's) regular file, gives it `mode`. Symbolic links,
/// other kinds of file and other users' files are untrusted (and left as
/// they are).
pub fn check_file(path: &Path, mode: Mode) -> std::io::Result<Found> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Missing),
        Err(e) => return Err(e),
    };
    if let Some(why) = untrusted(&meta) {
        return Ok(Found::Untrusted(why));
    }
    // Root's files (eventd not running as root) are trusted as they are.
    if meta.uid() == own_uid() {
        if meta.mode() & 0o002 != 0 {
            tracing::warn!(
                file = %path.display(),
                mode = %format_args!("{:04o}", meta.mode() & MODE_BITS),
                "file was writable by every user; anyone may have changed it"
            );
        }
        apply(path, &meta, mode, false)?;
    }
    Ok(Found::Trusted)
}

/// Why a file is not to be trusted, if it is not: not a regular file (a
/// symlink could point anywhere), or owned by neither eventd's user nor
/// root.
pub fn untrusted(meta: &std::fs::Metadata) -> Option<String> {
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Some("a symbolic link".to_string());
    }
    if !kind.is_file() {
        return Some("not a regular file".to_string());
    }
    let owner = meta.uid();
    if owner != own_uid() && owner != 0 {
        return Some(format!(
            "owned by uid {owner}, not by eventd's user or root"
        ));
    }
    None
}

/// Sets the group (if the mode names one) and the mode bits of an open
/// file (no window in which a path could be swapped).
pub fn set_mode_fd(file: &std::fs::File, mode: Mode) -> std::io::Result<()> {
    if let Some(gid) = mode.group {
        // SAFETY: an open descriptor we own; -1 keeps the owner.
        if unsafe { libc::fchown(file.as_raw_fd(), u32::MAX, gid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    file.set_permissions(std::fs::Permissions::from_mode(mode.bits))
}

/// Sets the group and mode of `path` (a socket, say, which cannot be
/// opened as a file), not following a symlink in its last component.
pub fn set_mode_path(path: &Path, mode: Mode) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Err(std::io::Error::other("is a symbolic link"));
    }
    set(path, &meta, mode, false).map(|_| ())
}

/// Gives `path` (whose metadata is `meta`) the group and mode of `mode`,
/// and, with `take`, eventd's user as owner; logs what changed (a file
/// eventd found, not one it just made).
fn apply(path: &Path, meta: &std::fs::Metadata, mode: Mode, take: bool) -> std::io::Result<()> {
    let changed = set(path, meta, mode, take)?;
    if changed {
        tracing::info!(
            path = %path.display(),
            from = %format_args!(
                "{:04o} uid {} gid {}",
                meta.mode() & MODE_BITS,
                meta.uid(),
                meta.gid()
            ),
            to = %format_args!(
                "{:04o}{}",
                mode.bits,
                mode.group.map_or(String::new(), |g| format!(" gid {g}"))
            ),
            "mode set"
        );
    }
    Ok(())
}

/// Sets what [`apply`] sets; whether anything changed.
fn set(path: &Path, meta: &std::fs::Metadata, mode: Mode, take: bool) -> std::io::Result<bool> {
    let current = meta.mode() & MODE_BITS;
    let group_wrong = mode.group.is_some_and(|g| g != meta.gid());
    if current == mode.bits && !group_wrong && !take {
        return Ok(false);
    }
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(std::io::Error::other)?;
    if group_wrong || take {
        let owner = if take { own_uid() } else { u32::MAX };
        let group = mode.group.unwrap_or(u32::MAX);
        // SAFETY: a valid C path; -1 keeps that id. lchown: a symlink in
        // the last component is never followed.
        if unsafe { libc::lchown(c.as_ptr(), owner, group) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // Set after the owner: a change of owner clears set-id bits.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode.bits))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_get_their_mode_whatever_they_had() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("store");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        ensure_dir(
            &d,
            Mode {
                bits: 0o750,
                group: None,
            },
        )
        .unwrap();
        let m = std::fs::metadata(&d).unwrap().mode() & MODE_BITS;
        assert_eq!(m, 0o750);
        // A missing one is made with it.
        let e = dir.path().join("a/b");
        ensure_dir(
            &e,
            Mode {
                bits: 0o700,
                group: None,
            },
        )
        .unwrap();
        assert_eq!(std::fs::metadata(&e).unwrap().mode() & MODE_BITS, 0o700);
    }

    #[test]
    fn symlinks_and_foreign_files_are_untrusted() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("shard-000.db");
        std::fs::write(&f, b"x").unwrap();
        let l = dir.path().join("shard-001.db");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        let mode = Mode {
            bits: 0o640,
            group: None,
        };
        assert_eq!(check_file(&f, mode).unwrap(), Found::Trusted);
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & MODE_BITS, 0o640);
        assert!(matches!(check_file(&l, mode).unwrap(), Found::Untrusted(_)));
        assert_eq!(
            check_file(&dir.path().join("none"), mode).unwrap(),
            Found::Missing
        );
        if own_uid() == 0 {
            let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid C path; gives the file to nobody.
            let rc = unsafe { libc::chown(c.as_ptr(), 65534, 65534) };
            assert_eq!(rc, 0);
            let found = check_file(&f, mode).unwrap();
            assert!(
                matches!(&found, Found::Untrusted(why) if why.contains("65534")),
                "{found:?}"
            );
        }
    }
}
