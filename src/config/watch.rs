//! Watching the configuration file with inotify.
//!
//! The directory is watched, not the file: editors and configuration
//! managers usually write a new file and rename it over the old one, which
//! a watch on the old file's inode would miss. A file is read only once it
//! is whole: when a writer closes it, or when it is renamed into place,
//! never when a regular file is created (an editor that writes a fresh
//! file would otherwise have its empty first moment applied as all-default
//! keys). A symlink or a hard link made at the name is whole at once and
//! is read then. If the kernel's event queue overflowed, the file is read
//! again in case its event was among those lost.
//!
//! A symlinked configuration is read through the link, but only the link's
//! own directory is watched: a change behind it (a Kubernetes ConfigMap
//! swapping its data directory) needs SIGHUP.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How long the watch thread waits for events before it looks at its stop
/// flag again.
const POLL_MS: i32 = 250;

pub struct FileWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FileWatch {
    /// Calls `changed` (from the watch thread) whenever `file` is closed
    /// after writing or renamed into place.
    pub fn start(file: &Path, changed: impl Fn() + Send + 'static) -> std::io::Result<FileWatch> {
        let dir = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = file
            .file_name()
            .ok_or_else(|| std::io::Error::other(format!("{} names no file", file.display())))?
            .to_owned();
        // SAFETY: inotify_init1 takes flags only.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: we own the descriptor just returned.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let c_dir = CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
        let mask = libc::IN_CLOSE_WRITE
            | libc::IN_MOVED_TO
            | libc::IN_CREATE
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF;
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(std::os::fd::AsRawFd::as_raw_fd(&fd), c_dir.as_ptr(), mask)
        };
        if wd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("config-watch".into())
            .spawn(move || watch_loop(fd, &dir, &name, &flag, changed))?;
        Ok(FileWatch {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch_loop(
    fd: std::os::fd::OwnedFd,
    dir: &Path,
    name: &OsStr,
    stop: &AtomicBool,
    changed: impl Fn(),
) {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 16 << 10];
    let mut dir_gone = false;
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, POLL_MS) } <= 0 {
            continue;
        }
        // SAFETY: reading into a buffer of the length given.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            continue;
        }
        let events = || events_in(&buf[..n as usize]);
        let whole = |mask: u32| {
            mask & libc::IN_CREATE == 0
                || std::fs::symlink_metadata(dir.join(name)).is_ok_and(|m| {
                    use std::os::unix::fs::MetadataExt;
                    m.file_type().is_symlink() || m.nlink() > 1
                })
        };
        if events().any(|(mask, n)| {
            (n == name.as_bytes() && whole(mask)) || mask & libc::IN_Q_OVERFLOW != 0
        }) {
            changed();
        }
        let self_gone = libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;
        if !dir_gone && events().any(|(mask, _)| mask & self_gone != 0) {
            dir_gone = true;
            tracing::warn!(
                directory = %dir.display(),
                "the configuration file's directory was removed or moved: \
                 changes to the file are no longer seen; SIGHUP still reloads it"
            );
        }
    }
}

/// The (mask, name) pairs carried by a buffer of `inotify_event` records
/// (each a 16-byte header: watch, mask, cookie, then the length of the
/// NUL-padded name after it; events on the directory itself have no name).
fn events_in(mut buf: &[u8]) -> impl Iterator<Item = (u32, &[u8])> {
    const HEADER: usize = 16;
    std::iter::from_fn(move || {
        if buf.len() < HEADER {
            return None;
        }
        let mask = u32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
        let len = u32::from_ne_bytes([buf[12], buf[13], buf[14], buf[15]]) as usize;
        let end = HEADER.checked_add(len).filter(|&e| e <= buf.len())?;
        let raw = &buf[HEADER..end];
        buf = &buf[end..];
        let name_len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        Some((mask, &raw[..name_len]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    #[test]
    fn names_are_read_from_event_records_and_truncation_stops_them() {
        let mut buf = Vec::new();
        for name in ["a.toml", "eventd.toml"] {
            buf.extend_from_slice(&1i32.to_ne_bytes());
            buf.extend_from_slice(&8u32.to_ne_bytes());
            buf.extend_from_slice(&0u32.to_ne_bytes());
            buf.extend_from_slice(&16u32.to_ne_bytes());
            let mut padded = name.as_bytes().to_vec();
            padded.resize(16, 0);
            buf.extend_from_slice(&padded);
        }
        let names: Vec<(u32, &[u8])> = events_in(&buf).collect();
        assert_eq!(
            names,
            [(8, b"a.toml".as_slice()), (8, b"eventd.toml".as_slice())]
        );
        assert_eq!(events_in(&buf[..40]).count(), 1);
    }

    /// A watch on `file` that counts its calls.
    fn counting_watch(file: &Path) -> (FileWatch, Arc<AtomicUsize>) {
        let seen = Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        let watch = FileWatch::start(file, move || {
            s.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        (watch, seen)
    }

    fn wait_seen(seen: &AtomicUsize, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "{what} was not seen");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_rename_over_the_file_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eventd.toml");
        std::fs::write(&file, "MaxBatchSize = 1\n").unwrap();
        let (_watch, seen) = counting_watch(&file);
        std::fs::write(dir.path().join("other.toml"), "x").unwrap();
        let tmp = dir.path().join("eventd.toml.new");
        std::fs::write(&tmp, "MaxBatchSize = 2\n").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        wait_seen(&seen, "the rename");
    }

    #[test]
    fn a_new_file_is_read_only_once_its_writer_closes_it() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eventd.toml");
        std::fs::write(&file, "MaxBatchSize = 1\n").unwrap();
        let (_watch, seen) = counting_watch(&file);
        // As an editor that moves the old file aside and writes a new one.
        std::fs::rename(&file, dir.path().join("eventd.toml~")).unwrap();
        let mut new = std::fs::File::create(&file).unwrap();
        new.write_all(b"MaxBatchSize = ").unwrap();
        std::thread::sleep(Duration::from_millis(3 * POLL_MS as u64));
        assert_eq!(seen.load(Ordering::Relaxed), 0, "read while still open");
        new.write_all(b"2\n").unwrap();
        drop(new);
        wait_seen(&seen, "the close");
    }

    #[test]
    fn a_symlink_made_at_the_name_is_read_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eventd.toml");
        let target = dir.path().join("real.toml");
        std::fs::write(&target, "MaxBatchSize = 3\n").unwrap();
        let (_watch, seen) = counting_watch(&file);
        std::os::unix::fs::symlink(&target, &file).unwrap();
        wait_seen(&seen, "the new link");
    }
}
