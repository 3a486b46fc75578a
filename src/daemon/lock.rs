//! One daemon per data directory: an exclusive `flock` on `RUN_DIR/eventd.pid`,
//! held for the life of the process (the kernel drops it if the process is
//! killed). Two daemons on one store would mean two writers per shard (R8).

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
    #[error("another eventd ({holder}) is already running with this data directory (lock {path})")]
    Held { path: PathBuf, holder: String },
}

pub struct DataDirLock {
    file: File,
    path: PathBuf,
}

impl DataDirLock {
    pub fn acquire(run_dir: &Path) -> Result<DataDirLock, LockError> {
        let path = run_dir.join("eventd.pid");
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .map_or("pid unknown".to_string(), |pid| format!("pid {pid}"));
                return Err(LockError::Held { path, holder });
            }
            return Err(io(err));
        }
        Ok(DataDirLock { file, path })
    }

    /// Writes our pid into the lock file: the daemon has started.
    pub fn mark_ready(&self) -> Result<(), LockError> {
        let io = |source| LockError::Io {
            path: self.path.clone(),
            source,
        };
        let mut file = &self.file;
        file.set_len(0).map_err(io)?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(io)
    }
}

impl Drop for DataDirLock {
    fn drop(&mut self) {
        // The pid is no longer running eventd; the lock itself goes with the
        // descriptor.
        let _ = self.file.set_len(0);
    }
}
