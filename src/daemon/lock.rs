//! One daemon per data directory.
//!
//! An exclusive `flock` on `RUN_DIR/eventd.pid`, and on a `.eventd.lock` file
//! in the store and KMES directories (which a configuration may place
//! elsewhere), held for the life of the process; the kernel drops them when
//! the process dies. Two daemons on one store would mean two writers per
//! shard (R8); two on one KMES directory, two readers per ring.
//!
//! The pid file also tells how the previous daemon ended: it holds
//! `PID BOOT_ID` while a daemon runs and is emptied on a clean stop, so a
//! non-empty file at start means the previous one was killed; a different
//! boot id means the machine went down with it.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("another eventd ({holder}) is already running with this directory (lock {path})")]
    Held { path: PathBuf, holder: String },
}

/// How the previous daemon on this data directory ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviousRun {
    /// Stopped cleanly, or there was none.
    Clean,
    /// Killed, in this boot: every commit it made is on disk.
    Killed,
    /// Killed in an earlier boot (a crash or power cut): commits made with
    /// `synchronous = NORMAL` may have been lost, shard by shard.
    KilledEarlierBoot,
}

pub struct DataDirLock {
    file: File,
    path: PathBuf,
    /// Locks of the store and KMES directories, held until drop.
    others: Vec<File>,
    pub previous: PreviousRun,
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Opens (creating) `path` and takes an exclusive, non-blocking flock.
fn lock_file(path: &Path) -> Result<File, LockError> {
    let io = |source| LockError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io)?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(LockError::Held {
                path: path.to_path_buf(),
                holder: "pid unknown".to_string(),
            });
        }
        return Err(io(err));
    }
    Ok(file)
}

impl DataDirLock {
    /// Locks `run_dir/eventd.pid` and `DIR/.eventd.lock` for each of `others`.
    pub fn acquire(run_dir: &Path, others: &[&Path]) -> Result<DataDirLock, LockError> {
        let path = run_dir.join("eventd.pid");
        let file = lock_file(&path).map_err(|e| match e {
            LockError::Held { path, .. } => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
                    .map_or("pid unknown".to_string(), |pid| format!("pid {pid}"));
                LockError::Held { path, holder }
            }
            other => other,
        })?;
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        // Readable by all, as pid files are (eventd's umask made it private).
        crate::access::files::set_mode_fd(
            &file,
            crate::access::Mode {
                bits: 0o644,
                group: None,
            },
        )
        .map_err(io)?;
        let old = std::fs::read_to_string(&path).map_err(io)?;
        let previous = match old.split_whitespace().nth(1) {
            None if old.trim().is_empty() => PreviousRun::Clean,
            Some(boot) if boot == boot_id() => PreviousRun::Killed,
            _ => PreviousRun::KilledEarlierBoot,
        };
        // The dead daemon's pid must not be mistaken for ours (start-up is
        // finished only when `mark_ready` writes our pid).
        file.set_len(0).map_err(io)?;
        let mut locks = Vec::new();
        for dir in others {
            locks.push(lock_file(&dir.join(".eventd.lock"))?);
        }
        Ok(DataDirLock {
            file,
            path,
            others: locks,
            previous,
        })
    }

    /// Writes our pid and the boot id into the lock file: start-up is done.
    pub fn mark_ready(&self) -> Result<(), LockError> {
        let io = |source| LockError::Io {
            path: self.path.clone(),
            source,
        };
        let mut file = &self.file;
        file.set_len(0).map_err(io)?;
        file.write_all(format!("{} {}\n", std::process::id(), boot_id()).as_bytes())
            .map_err(io)
    }
}

impl Drop for DataDirLock {
    fn drop(&mut self) {
        // A clean stop: the pid no longer runs eventd.
        let _ = self.file.set_len(0);
        // Unlock explicitly rather than leave it to the close: a child
        // forked in this process while the locks were held keeps copies of
        // their descriptors until its exec, and a lock lives while any copy
        // does, so a daemon started right after this one stopped could be
        // refused. An unlock releases it for every copy.
        for file in std::iter::once(&self.file).chain(&self.others) {
            // SAFETY: flock on a descriptor this lock owns; no memory involved.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previous_run_is_read_from_the_pid_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap();
        let lock = DataDirLock::acquire(dir.path(), &[&store]).unwrap();
        assert_eq!(lock.previous, PreviousRun::Clean);
        // A second daemon is refused on the pid file and on the store.
        let e = DataDirLock::acquire(dir.path(), &[])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("another eventd"), "{e}");
        let other_run = dir.path().join("run2");
        std::fs::create_dir(&other_run).unwrap();
        let e = DataDirLock::acquire(&other_run, &[&store])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(".eventd.lock"), "{e}");
        lock.mark_ready().unwrap();
        // Simulate a kill: leak the lock without running Drop.
        std::mem::forget(lock);
        // flock is per open file description, so the leaked one still holds;
        // read what a killed daemon leaves behind instead.
        let content = std::fs::read_to_string(dir.path().join("eventd.pid")).unwrap();
        assert!(
            content.starts_with(&std::process::id().to_string()),
            "{content}"
        );
        assert!(content.trim().ends_with(&boot_id()), "{content}");
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("eventd.pid"), &content).unwrap();
        let lock = DataDirLock::acquire(other.path(), &[]).unwrap();
        assert_eq!(lock.previous, PreviousRun::Killed);
        drop(lock);
        assert_eq!(
            std::fs::read_to_string(other.path().join("eventd.pid")).unwrap(),
            ""
        );
        std::fs::write(other.path().join("eventd.pid"), "123 another-boot\n").unwrap();
        let lock = DataDirLock::acquire(other.path(), &[]).unwrap();
        assert_eq!(lock.previous, PreviousRun::KilledEarlierBoot);
    }

    /// Copies of the descriptors (what a child forked while the daemon ran
    /// holds until its exec) do not keep the locks after a clean stop.
    #[test]
    fn a_stopped_daemon_leaves_its_locks_free_whatever_copies_live() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap();
        let lock = DataDirLock::acquire(dir.path(), &[&store]).unwrap();
        let copies: Vec<i32> = std::iter::once(&lock.file)
            .chain(&lock.others)
            // SAFETY: dup of descriptors the lock owns; closed below.
            .map(|f| unsafe { libc::dup(f.as_raw_fd()) })
            .collect();
        assert!(copies.iter().all(|&fd| fd >= 0));
        drop(lock);
        let again = DataDirLock::acquire(dir.path(), &[&store]);
        for fd in copies {
            // SAFETY: closes a copy made above, which nothing else uses.
            unsafe { libc::close(fd) };
        }
        assert!(again.is_ok(), "{}", again.err().unwrap());
    }
}
