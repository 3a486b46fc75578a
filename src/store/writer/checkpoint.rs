//! Checkpoints in the writer's idle moments. SQLite's own checkpoint runs
//! inside the commit that takes the WAL past its threshold, and with
//! `synchronous = NORMAL` that is where the syncs are (the WAL's, then the
//! database file's). The writer is the only one that may run it (R8: no
//! other connection writes a shard), and while it syncs it takes nothing
//! from its channel, so a drain striping into this shard waits on a full
//! channel and reads nothing from its ring. With two drains over 256
//! shards the syncs were most of what eventd lost against the bare
//! ceiling (the same build without syncs ingested 1.27-1.48x as fast,
//! perf/runs/notebook.md#checkpoints-between-stripes-2026-12-02-night-landed-the-next-session).
//!
//! So a writer takes its checkpoints over from SQLite
//! ([`Checkpoints::take_over`]) and runs them itself, the same PASSIVE
//! checkpoint with the same syncs:
//! - once the WAL holds SQLite's threshold of frames not yet copied back
//!   (about 4 MB, as before), at the first moment its channel is empty
//!   after a commit, which under striping is most of the time between
//!   two stripes;
//! - at four times that, right after the commit, where SQLite would have
//!   checkpointed at once (a writer whose channel never empties still
//!   bounds its WAL).
//!
//! That gave 5-8 % more events/s at 2 rings x 256 shards, not 27-48 %:
//! on ext4 a sync also waits for other files' new blocks, so a checkpoint
//! holds the other writers up wherever it runs.
//!
//! What a commit guarantees does not change: commits are not synced
//! either way (R6's receipts cover a power cut), and a checkpoint syncs
//! the WAL before it copies any page back.

use rusqlite::hooks::Wal;
use rusqlite::Connection;
use std::cell::Cell;
use std::ffi::c_int;

thread_local! {
    /// Frames in the WAL after the last commit on this thread's writer
    /// connection, as SQLite reports them to [`count_frames`]. A writer
    /// connection is used by its writer thread only, so the commit that
    /// sets this and the writer that reads it are on one thread.
    static WAL_FRAMES: Cell<u64> = const { Cell::new(0) };
}

/// The WAL hook: keeps the frame count for the writer.
fn count_frames(_wal: &Wal, frames: c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|f| f.set(frames.max(0) as u64));
    Ok(())
}

/// When a writer checkpoints, and how far it got.
#[derive(Debug)]
pub(super) struct Checkpoints {
    /// Frames not yet copied back at which a checkpoint is due in the next
    /// idle moment.
    soft: u64,
    /// ... and at which it runs right after the commit.
    hard: u64,
    /// Frames the last checkpoint copied back (the WAL's frames up to here
    /// are in the database file).
    copied: u64,
}

impl Checkpoints {
    /// Replaces SQLite's automatic checkpoint of `conn` (a writer
    /// connection, configured by `schema::configure_writer`) by this
    /// writer's own, at the same threshold (SQLite's default of 1000
    /// frames if the connection does not say).
    pub(super) fn take_over(conn: &Connection) -> Checkpoints {
        let soft = conn
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get::<_, i64>(0))
            .unwrap_or(1000);
        // Replaces the hook that `wal_autocheckpoint` installed.
        conn.wal_hook(Some(count_frames));
        WAL_FRAMES.with(|f| f.set(0));
        let soft = soft.max(1) as u64;
        Checkpoints {
            soft,
            hard: soft * 4,
            copied: 0,
        }
    }

    /// Frames written since the last checkpoint, as of the last commit.
    fn pending(&mut self) -> u64 {
        let frames = WAL_FRAMES.with(Cell::get);
        if frames < self.copied {
            // The WAL started over from its beginning (everything in it
            // had been copied back).
            self.copied = 0;
        }
        frames - self.copied
    }

    /// Right after a commit: is the WAL so long that the checkpoint
    /// cannot wait for an idle moment?
    pub(super) fn overdue(&mut self) -> bool {
        self.pending() >= self.hard
    }

    /// In an idle moment: is a checkpoint due?
    pub(super) fn due(&mut self) -> bool {
        self.pending() >= self.soft
    }

    /// Runs a PASSIVE checkpoint (copies back what no reader still needs;
    /// never waits for readers). Whether it copied the whole WAL back, or
    /// `None` if it failed: a failure is logged and left for the next one
    /// (the WAL only grows meanwhile).
    pub(super) fn run(&mut self, conn: &Connection, path: &std::path::Path) -> Option<bool> {
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        }) {
            Ok((log, copied)) => {
                self.copied = copied.max(0) as u64;
                Some(copied >= log)
            }
            Err(e) => {
                tracing::warn!(shard = %path.display(), error = %e,
                    "checkpoint failed; the WAL grows until one succeeds");
                // Try again only after as many frames more.
                self.copied = WAL_FRAMES.with(Cell::get);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer's connection no longer checkpoints inside its commits;
    /// `due` and `overdue` follow the frames written, and `run` copies
    /// them back.
    #[test]
    fn commits_leave_the_checkpoint_to_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open_shard(&crate::store::shard_path(dir.path(), 0)).unwrap();
        conn.pragma_update(None, "wal_autocheckpoint", 4).unwrap();
        let mut c = Checkpoints::take_over(&conn);
        assert_eq!((c.soft, c.hard), (4, 16));
        let big = "x".repeat(40_000);
        let insert = |n: i64| {
            for seq in 0..n {
                conn.execute(
                    crate::store::rows::INSERT_EVENT,
                    rusqlite::params![seq, 0, seq, 1, 1, 1, 0, 6, "p", "n", big, None::<String>],
                )
                .unwrap();
            }
        };
        insert(1);
        let one = c.pending();
        assert!(one >= 1);
        insert(7);
        // Eight commits of about `one` frames each (more where a page
        // split): with SQLite's checkpoint at 4 frames the WAL would have
        // started over after each one.
        assert!(c.pending() >= (8 * one).max(16), "{c:?}");
        assert!(c.due() && c.overdue());
        assert_eq!(c.run(&conn, &dir.path().join("shard-000.db")), Some(true));
        assert_eq!(c.pending(), 0);
        assert!(!c.due());
        // The next commit starts the WAL over (nothing in it is needed):
        // the count follows.
        insert(1);
        assert!((1..2 * one).contains(&c.pending()), "{c:?}");
    }
}
