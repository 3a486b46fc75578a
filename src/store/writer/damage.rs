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
///
/// A cut is told from SQLite's own doing by two rules. In WAL mode SQLite
/// changes a database file only when it checkpoints, and a writer runs its
/// connection's checkpoints itself (`checkpoint.rs`), so between two of
/// them the file never gets shorter: shorter than when last seen means
/// cut. And the file holds every page its header counts only after a
/// checkpoint that copied the whole WAL back: one that stops at a reader's
/// snapshot copies page 1 (whose page count grew with the file) but skips
/// every page whose newest copy that reader must not see yet, which may be
/// the file's last ones. Readers read those from the WAL meanwhile; the
/// header's count is compared with the length only while nothing is left
/// behind.
pub(super) struct FileWatch {
    identity: Option<(u64, u64)>,
    /// When the file was last looked at.
    checked: std::time::Instant,
    /// Look at the next call whenever it comes.
    now: bool,
    /// The file's length when last looked at or right after the last
    /// checkpoint.
    seen: u64,
    /// Whether the file has every page its header counts (see above).
    whole: bool,
}

/// A writer looks at its file at most this often (a `stat` and a read of
/// the 100-byte header through SQLite's own descriptor, a few µs).
const FILE_CHECK_INTERVAL: Duration = Duration::from_millis(100);

impl FileWatch {
    /// A watch over the file just opened at `path`. It is taken for whole
    /// only if its WAL is empty: one left by another process may stop
    /// after a partial checkpoint.
    pub(super) fn of(path: &std::path::Path) -> FileWatch {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path).ok();
        let wal = crate::store::files::side_file(path, "-wal");
        FileWatch {
            identity: meta.as_ref().map(|m| (m.dev(), m.ino())),
            checked: std::time::Instant::now(),
            now: false,
            seen: meta.as_ref().map_or(0, |m| m.len()),
            whole: std::fs::metadata(wal).map_or(true, |m| m.len() == 0),
        }
    }

    /// The next [`FileWatch::changed`] looks, however recent the last look.
    pub(super) fn look_now(&mut self) {
        self.now = true;
    }

    /// After a checkpoint of this file on the writer's connection: `whole`
    /// says whether it copied the whole WAL back (`None`: it failed, maybe
    /// part way). The length it left is SQLite's own.
    pub(super) fn checkpointed(&mut self, conn: &Connection, whole: Option<bool>) {
        self.whole = whole == Some(true);
        if let Some((len, _)) = read_header(conn) {
            self.seen = len;
        }
    }

    /// What happened to the file, if anything that means damage: removed,
    /// replaced, or cut (shorter than when last seen, or than its header's
    /// page count while it should hold them all).
    pub(super) fn changed(&mut self, conn: &Connection, path: &std::path::Path) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        if !self.now && self.checked.elapsed() < FILE_CHECK_INTERVAL {
            return None;
        }
        self.now = false;
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
        if len < self.seen {
            return Some(format!(
                "the file was cut to {len} bytes; it had {} at the last look",
                self.seen
            ));
        }
        self.seen = len;
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
        if self.whole && valid && len < pages.saturating_mul(page) {
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
    /// the writer moves on to a new file. Whether it did.
    pub(super) fn check_file(&mut self) -> bool {
        let why = match self.shared.health.take_suspect(&self.path) {
            Some(why) => Some(format!("a query found it corrupt: {why}")),
            None => self.file.changed(&self.conn, &self.path),
        };
        let Some(why) = why else {
            return false;
        };
        match self.move_on(&why) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(
                    shard = %self.path.display(),
                    damage = %why,
                    error = %e,
                    "shard file damaged and no new file can be made; writing on to it"
                );
                false
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
        self.checkpoints = super::checkpoint::Checkpoints::take_over(&self.conn);
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

#[cfg(test)]
mod tests {
    use super::super::checkpoint::Checkpoints;
    use super::*;
    use rusqlite::OpenFlags;
    use std::path::PathBuf;

    /// The bytes the header's page count stands for.
    fn counted(header: &[u8; 100]) -> u64 {
        let page = u64::from(u16::from_be_bytes([header[16], header[17]]));
        page * u64::from(u32::from_be_bytes([
            header[28], header[29], header[30], header[31],
        ]))
    }

    /// A shard file left by a checkpoint that a reader's snapshot stopped
    /// part way: page 1 copied back with the grown page count, the last
    /// pages (changed again after the snapshot) only in the WAL. Returns
    /// the reader, still in its snapshot.
    fn partly_checkpointed(
        dir: &std::path::Path,
    ) -> (PathBuf, Connection, Checkpoints, FileWatch, Connection) {
        let path = crate::store::shard_path(dir, 0);
        let conn = crate::store::open_shard(&path).unwrap();
        let mut checkpoints = Checkpoints::take_over(&conn);
        conn.execute_batch("CREATE TABLE t(x BLOB)").unwrap();
        assert_eq!(checkpoints.run(&conn, &path), Some(true));
        let mut watch = FileWatch::of(&path);
        watch.checkpointed(&conn, Some(true));
        // The file grows by a few pages ...
        conn.execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200) \
             INSERT INTO t SELECT randomblob(1000) FROM n",
        )
        .unwrap();
        // ... a reader takes its snapshot there ...
        let reader = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let rows: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 200);
        // ... and every page of t changes again, the file's size not.
        conn.execute_batch("UPDATE t SET x = zeroblob(1000)")
            .unwrap();
        let partial = checkpoints.run(&conn, &path);
        assert_eq!(partial, Some(false), "the reader stops the checkpoint");
        let (len, header) = read_header(&conn).unwrap();
        assert!(
            len < counted(&header),
            "the case this is about: {len} bytes, the header counts {}",
            counted(&header)
        );
        watch.checkpointed(&conn, partial);
        (path, conn, checkpoints, watch, reader)
    }

    #[test]
    fn a_checkpoint_stopped_by_a_reader_is_not_taken_for_a_cut() {
        let dir = tempfile::tempdir().unwrap();
        let (path, conn, mut checkpoints, mut watch, reader) = partly_checkpointed(dir.path());
        watch.look_now();
        assert_eq!(watch.changed(&conn, &path), None);
        // The same file taken for whole is the false report this avoids.
        watch.whole = true;
        watch.look_now();
        assert!(watch.changed(&conn, &path).is_some());
        // The reader done, the next checkpoint copies the rest back and
        // the file is as long as its header says.
        reader.execute_batch("COMMIT").unwrap();
        let whole = checkpoints.run(&conn, &path);
        assert_eq!(whole, Some(true));
        let (len, header) = read_header(&conn).unwrap();
        assert_eq!(len, counted(&header));
        watch.checkpointed(&conn, whole);
        watch.look_now();
        assert_eq!(watch.changed(&conn, &path), None);
    }

    /// A cut is found while the file lacks pages by right (against the
    /// length last seen) and once it is whole again (against its header
    /// too).
    #[test]
    fn a_cut_is_found_whether_or_not_the_file_is_whole() {
        let cut = |path: &std::path::Path, len: u64| {
            // Another descriptor on the file: closing it drops this
            // process's locks on it, which nothing here relies on.
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .unwrap()
                .set_len(len)
                .unwrap();
        };
        let dir = tempfile::tempdir().unwrap();
        let (path, conn, _, mut watch, _reader) = partly_checkpointed(dir.path());
        let len = std::fs::metadata(&path).unwrap().len();
        cut(&path, len / 2);
        watch.look_now();
        let why = watch.changed(&conn, &path).expect("a cut while partial");
        assert!(why.contains(&format!("cut to {} bytes", len / 2)), "{why}");

        let dir = tempfile::tempdir().unwrap();
        let (path, conn, mut checkpoints, mut watch, reader) = partly_checkpointed(dir.path());
        drop(reader);
        let whole = checkpoints.run(&conn, &path);
        watch.checkpointed(&conn, whole);
        // Cut by one page, then looked at as if first seen now: the header
        // still says how long it should be.
        let len = std::fs::metadata(&path).unwrap().len();
        cut(&path, len - 32768);
        watch.seen = 0;
        watch.look_now();
        let why = watch.changed(&conn, &path).expect("a cut while whole");
        assert!(why.contains("its header counts"), "{why}");
    }
}
