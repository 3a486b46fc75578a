//! A writer's watch over its file: a reader's report of corruption, the
//! file removed, replaced or cut shorter than its header says, all move the
//! shard on to a new file (its next generation); the damaged one is left as
//! it is.

use super::ShardWriter;
use crate::store::StoreError;
use rusqlite::Connection;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a writer knows of its file, to notice it removed, replaced or cut.
pub(super) struct FileWatch {
    identity: Option<(u64, u64)>,
    /// When the file was last looked at.
    checked: std::time::Instant,
}

/// A writer looks at its file at most this often (a `stat` and a read of
/// the 100-byte header through SQLite's own descriptor, a few µs).
const FILE_CHECK_INTERVAL: Duration = Duration::from_millis(100);

impl FileWatch {
    pub(super) fn of(path: &std::path::Path) -> FileWatch {
        use std::os::unix::fs::MetadataExt;
        FileWatch {
            identity: std::fs::symlink_metadata(path)
                .ok()
                .map(|m| (m.dev(), m.ino())),
            checked: std::time::Instant::now(),
        }
    }

    /// What happened to the file, if anything that means damage: removed,
    /// replaced, or shorter than its header's page count (a truncation; the
    /// writer's own checkpoints and vacuums keep the file at least that
    /// long, and they run on this thread, never during this check).
    pub(super) fn changed(&mut self, conn: &Connection, path: &std::path::Path) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        if self.checked.elapsed() < FILE_CHECK_INTERVAL {
            return None;
        }
        self.checked = std::time::Instant::now();
        let identity = self.identity?;
        let m = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) => return Some(format!("the file is gone ({e})")),
        };
        if (m.dev(), m.ino()) != identity {
            return Some("another file was put at its name".to_string());
        }
        let (len, header) = read_header(conn)?;
        if len < 100 {
            return Some(format!("the file was cut to {len} bytes"));
        }
        if &header[..16] != b"SQLite format 3\0" {
            return Some("its header is no longer a database header".to_string());
        }
        let page = match u16::from_be_bytes([header[16], header[17]]) {
            1 => 65536,
            n => u64::from(n),
        };
        let pages = u64::from(u32::from_be_bytes([
            header[28], header[29], header[30], header[31],
        ]));
        // The page count is valid when the "version valid for" word equals
        // the change counter (SQLite's rule).
        let valid = header[92..96] == header[24..28];
        if valid && len < pages.saturating_mul(page) {
            return Some(format!(
                "the file was cut to {len} bytes; its header counts {pages} pages of {page} bytes"
            ));
        }
        None
    }
}

/// The main database file's length and first 100 bytes, read through the
/// connection's own file handle: opening and closing another descriptor on
/// the file would drop the POSIX locks SQLite holds on it. `None` if SQLite
/// does not give the handle.
fn read_header(conn: &Connection) -> Option<(u64, [u8; 100])> {
    use rusqlite::ffi;
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: the connection's handle is valid while `conn` lives (the
    // writer's thread is the only user); FILE_POINTER writes one pointer
    // into `file`.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&mut file as *mut *mut ffi::sqlite3_file).cast(),
        )
    };
    if rc != ffi::SQLITE_OK || file.is_null() {
        return None;
    }
    // SAFETY: `file` is the open main database file SQLite just handed us;
    // its methods table is set for an open file.
    let methods = unsafe { (*file).pMethods.as_ref()? };
    let mut len: ffi::sqlite3_int64 = 0;
    // SAFETY: xFileSize of an open file, writing one integer.
    if unsafe { methods.xFileSize?(file, &mut len) } != ffi::SQLITE_OK {
        return None;
    }
    let mut header = [0u8; 100];
    if len >= 100 {
        // SAFETY: xRead of 100 bytes at offset 0 into a 100-byte buffer.
        let rc = unsafe { methods.xRead?(file, header.as_mut_ptr().cast(), 100, 0) };
        if rc != ffi::SQLITE_OK {
            return None;
        }
    }
    Some((len.max(0) as u64, header))
}

impl ShardWriter {
    /// Before a commit: is the file still whole and ours? A reader that
    /// found it corrupt, or the file removed, replaced or cut shorter than
    /// its header says, all mean later commits would be lost to queries:
    /// the writer moves on to a new file.
    pub(super) fn check_file(&mut self) {
        let why = match self.shared.health.take_suspect(&self.path) {
            Some(why) => Some(format!("a query found it corrupt: {why}")),
            None => self.file.changed(&self.conn, &self.path),
        };
        if let Some(why) = why {
            if let Err(e) = self.move_on(&why) {
                tracing::error!(
                    shard = %self.path.display(),
                    damage = %why,
                    error = %e,
                    "shard file damaged and no new file can be made; writing on to it"
                );
            }
        }
    }

    /// Gives the current file up as damaged (`why`) and goes on in the
    /// shard's next generation. The damaged file is left as it is: not even
    /// the checkpoint a close makes is written into it.
    pub(super) fn move_on(&mut self, why: &str) -> Result<(), StoreError> {
        let next = crate::store::next_shard_path(&self.shared.store_dir, self.index, &self.path);
        let conn = crate::store::open_shard_with(&next, self.shared.mode)?;
        let _ = self.conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        );
        drop(std::mem::replace(&mut self.conn, conn));
        let old = std::mem::replace(&mut self.path, next.clone());
        self.file = FileWatch::of(&self.path);
        *self.stats.path.lock().unwrap_or_else(|p| p.into_inner()) = next.clone();
        self.stats.damaged_files.fetch_add(1, Ordering::Relaxed);
        self.sync_indexes();
        self.register_zones();
        tracing::error!(
            shard = %old.display(),
            damage = %why,
            new_file = %next.display(),
            "shard file damaged: left as it is; this shard's events go to a new file"
        );
        self.shared.health.mark_damaged(
            crate::store::Damaged {
                path: old,
                reason: why.to_string(),
                found_at: crate::rings::now_ns(),
                replaced_by: Some(next),
            },
            Some(self.index),
        );
        Ok(())
    }
}
