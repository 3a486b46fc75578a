//! `ExportPasswordFile`: the password of `ExportUser`, on the first line of
//! a small regular file that not every local user may read.
//!
//! The file is read at start and again about every 2 s (a rotated password
//! applies without a restart), by the export workers and by `eventctl`.
//! Whatever sits at the path must not hold them up or fill their memory:
//! it is opened with `O_NONBLOCK` (opening a FIFO waits for a writer
//! otherwise, forever if none comes), what it is is checked on the
//! descriptor opened (so a swap between a check and the open cannot get
//! past it), and at most [`PASSWORD_FILE_BYTES_MAX`] + 1 bytes are read.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The largest password file taken: a password is one line.
pub const PASSWORD_FILE_BYTES_MAX: u64 = 4096;

/// What kind of file, for an error message.
fn kind(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// The password in `path`: its first line. The file must be a regular file
/// of at most [`PASSWORD_FILE_BYTES_MAX`] bytes, in UTF-8, not readable by
/// every local user.
pub fn read_password_file(path: &Path) -> Result<String, String> {
    let guard = Guard {
        key: "ExportPasswordFile",
        holds: "the password on its first line",
        max_bytes: PASSWORD_FILE_BYTES_MAX,
        secret: true,
    };
    let bytes = guard.read(path)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("ExportPasswordFile {} is not UTF-8 text", path.display()))?;
    Ok(text.lines().next().unwrap_or("").to_string())
}

/// How a small file named by a key is read: the password file, and the
/// TLS files (`tls.rs`).
pub struct Guard {
    /// The configuration key that names the file (for messages).
    pub key: &'static str,
    /// What the file holds, for messages: "the password on its first line".
    pub holds: &'static str,
    /// The largest file taken.
    pub max_bytes: u64,
    /// A secret: refused when every local user may read it.
    pub secret: bool,
}

impl Guard {
    /// The bytes of `path`, which must be a regular file of at most
    /// `max_bytes` bytes (and, for a secret, without the "other" read bit).
    pub fn read(&self, path: &Path) -> Result<Vec<u8>, String> {
        let key = self.key;
        let named = |e: std::io::Error| format!("{key} {}: {e}", path.display());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(named)?;
        // fstat: the file opened, not whatever the path names by now.
        let meta = file.metadata().map_err(named)?;
        if !meta.file_type().is_file() {
            return Err(format!(
                "{key} {} is not a regular file ({}); put {} in a regular file",
                path.display(),
                kind(meta.file_type()),
                self.holds
            ));
        }
        if self.secret && meta.mode() & 0o004 != 0 {
            return Err(format!(
                "{key} {} is readable by every local user (mode {:o}); chmod o-r it",
                path.display(),
                meta.mode() & 0o7777
            ));
        }
        let too_big = || {
            format!(
                "{key} {} is larger than {} bytes; it holds {} and nothing else",
                path.display(),
                self.max_bytes,
                self.holds
            )
        };
        if meta.len() > self.max_bytes {
            return Err(too_big());
        }
        // The file may have grown since the fstat: read one byte past the
        // limit, no more.
        let mut bytes = Vec::new();
        file.take(self.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(named)?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(too_big());
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn private(path: &Path, bytes: &[u8]) {
        std::fs::write(path, bytes).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[test]
    fn the_first_line_of_a_private_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        private(&path, b"hunter2\r\nsecond line\n");
        assert_eq!(read_password_file(&path).unwrap(), "hunter2");
        private(&path, b"");
        assert_eq!(read_password_file(&path).unwrap(), "");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_password_file(&path).unwrap_err();
        assert!(e.contains("every local user") && e.contains("644"), "{e}");
    }

    #[test]
    fn a_file_past_the_limit_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        private(&path, &[b'x'; PASSWORD_FILE_BYTES_MAX as usize]);
        assert_eq!(read_password_file(&path).unwrap().len(), 4096);
        // 256 MiB, sparse: no newline, so its "first line" is all of it.
        private(&path, b"");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
        let e = read_password_file(&path).unwrap_err();
        assert!(e.contains("larger than 4096 bytes"), "{e}");
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    #[test]
    fn what_is_not_a_regular_file_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Without O_NONBLOCK this open would wait for a writer forever.
        let e = read_password_file(&fifo).unwrap_err();
        assert!(e.contains("not a regular file (a FIFO)"), "{e}");
        let e = read_password_file(dir.path()).unwrap_err();
        assert!(e.contains("(a directory)"), "{e}");
        // /dev/zero never ends and /dev/null is empty; both are refused.
        for dev in ["/dev/zero", "/dev/null"] {
            let e = read_password_file(Path::new(dev)).unwrap_err();
            assert!(e.contains("(a character device)"), "{e}");
        }
        let e = read_password_file(&dir.path().join("missing")).unwrap_err();
        assert!(e.contains("missing") && e.contains("No such file"), "{e}");
    }
}
