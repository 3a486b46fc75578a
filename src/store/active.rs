//! The active shards: each one's newest file opened (or a new generation
//! made past a damaged one), then one writer thread per shard (R8), each
//! with its handoff channel (R9).

use super::retention::WriterControl;
use super::{
    next_shard_path, open_shard_with, recorded_damage, shard_path, Damaged, ShardWriter,
    StoreError, StoreHealth, WriterShared, WriterStats,
};
use crate::channel::{Capacity, ChannelMonitor, HandoffChannel, Sender};
use crate::drain::Handoff;
use crate::threads::{join_all, spawn_watched, FailureHook, Watched};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The active shards' files, opened for their writers.
pub struct ActiveFiles {
    /// By shard index: the file each writes and its connection.
    pub files: Vec<(PathBuf, Connection)>,
    /// Damaged files (those met here, and those recorded before) and each
    /// shard's file.
    pub health: Arc<StoreHealth>,
}

/// Opens the `count` active shards' files with `mode` (see
/// [`open_active_shard`]), and the store's record of damage.
pub fn open_shards(
    store_dir: &Path,
    count: usize,
    mode: crate::access::Mode,
) -> Result<ActiveFiles, StoreError> {
    let mut files = Vec::with_capacity(count);
    let mut damaged = Vec::new();
    for j in 0..count {
        let (path, conn, found) = open_active_shard(store_dir, j, mode)?;
        files.push((path, conn));
        damaged.extend(found.map(|d| (d, j)));
    }
    let paths = files.iter().map(|(p, _)| p.clone()).collect();
    let health = Arc::new(StoreHealth::new(paths, store_dir, mode));
    for (d, j) in damaged {
        health.mark_damaged(d, Some(j));
    }
    Ok(ActiveFiles { files, health })
}

/// Opens shard `j`'s newest file; if it is damaged (found so now, or
/// recorded so before) or not eventd's (see [`open_shard_with`]), leaves it
/// as it is and makes the next generation. Anything else (a newer schema,
/// an I/O error) stops start-up.
fn open_active_shard(
    store_dir: &Path,
    j: usize,
    mode: crate::access::Mode,
) -> Result<(PathBuf, Connection, Option<Damaged>), StoreError> {
    let path = shard_path(store_dir, j);
    let opened = match recorded_damage(&path) {
        // Given up before (its marker says why): never written again.
        Some(reason) => Err(StoreError::Damaged {
            path: path.clone(),
            reason: format!("found damaged before: {reason}"),
        }),
        None => open_shard_with(&path, mode),
    };
    let reason = match opened {
        Ok(conn) => return Ok((path, conn, None)),
        Err(e @ (StoreError::Damaged { .. } | StoreError::Untrusted { .. })) => e.to_string(),
        Err(e) => return Err(e),
    };
    let next = next_shard_path(store_dir, j, &path);
    let conn = open_shard_with(&next, mode)?;
    tracing::error!(
        shard = %path.display(),
        damage = %reason,
        new_file = %next.display(),
        "shard file not usable: left as it is; this shard's events go to a new file"
    );
    let damaged = Damaged {
        path,
        reason,
        found_at: crate::rings::now_ns(),
        replaced_by: Some(next.clone()),
    };
    Ok((next, conn, Some(damaged)))
}

/// One running shard writer, as the rest of the daemon reaches it.
pub struct WriterHandle {
    /// The file it wrote first (its stats say the one it writes now).
    pub path: PathBuf,
    /// Where drains (and retention's wakeups) send its items.
    pub tx: Sender<Handoff>,
    pub stats: Arc<WriterStats>,
    pub channel: ChannelMonitor<Handoff>,
    /// Retention's requests to it.
    pub control: Arc<WriterControl>,
}

/// Every shard's writer, started.
pub struct Writers {
    pub shards: Vec<WriterHandle>,
    pub threads: Vec<Watched>,
}

/// A writer could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("handoff channel capacity: {0}")]
    Channel(#[from] crate::channel::CapacityError),
    #[error("cannot start a writer thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Starts one writer per file of `files`, each with a channel of
/// `capacity`. If one cannot be started, those already running are ended
/// (their senders dropped) and joined before the error is returned.
pub fn spawn_writers(
    files: Vec<(PathBuf, Connection)>,
    shared: &WriterShared,
    capacity: Capacity,
    hook: &FailureHook,
) -> Result<Writers, SpawnError> {
    let mut writers = Writers {
        shards: Vec::with_capacity(files.len()),
        threads: Vec::with_capacity(files.len()),
    };
    for (j, (path, conn)) in files.into_iter().enumerate() {
        match spawn_writer(j, path, conn, shared, capacity, hook) {
            Ok((handle, thread)) => {
                writers.shards.push(handle);
                writers.threads.push(thread);
            }
            Err(e) => {
                drop(writers.shards);
                join_all(writers.threads, &mut Vec::new());
                return Err(e);
            }
        }
    }
    Ok(writers)
}

fn spawn_writer(
    j: usize,
    path: PathBuf,
    conn: Connection,
    shared: &WriterShared,
    capacity: Capacity,
    hook: &FailureHook,
) -> Result<(WriterHandle, Watched), SpawnError> {
    let (tx, rx) = HandoffChannel::new(capacity)?;
    let control = Arc::new(WriterControl::default());
    let stats = Arc::new(WriterStats::default());
    let handle = WriterHandle {
        path: path.clone(),
        tx,
        stats: stats.clone(),
        channel: rx.monitor(),
        control: control.clone(),
    };
    let writer = ShardWriter::new(j, path, conn, rx, shared.clone(), stats, control);
    let thread = spawn_watched(
        format!("writer-{j:03}"),
        format!("writer of shard {j}"),
        hook,
        move || writer.run(),
    )?;
    Ok((handle, thread))
}
