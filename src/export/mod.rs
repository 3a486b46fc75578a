//! The export stage: every committed event and gap of every shard file,
//! exactly once, into a ClickHouse cluster (docs/design/export.md).
//!
//! It runs beside the write path and never touches it: it reads the shard
//! files through its own read-only connections (R8 holds: the writers stay
//! their only writers), keeps its cursors in its own state database
//! (`DATA_DIR/export/state.db`), and tells retention how far it got
//! ([`ExportFloors`]) so that nothing unexported is deleted by age. The
//! rings, drains and writers never wait for it; when the cluster is slow or
//! down, it backs off and keeps its cursors.
//!
//! - [`state`]: cursors and intents.
//! - [`source`]: a shard file read by id range.
//! - [`format`]: the ClickHouse tables' columns, RowBinary and JSONEachRow.
//! - [`clickhouse`]: the HTTP interface.
//! - [`tls`]: HTTPS: roots, a CA file, a client certificate.
//! - [`cluster`]: inserting through the Distributed tables, and asking
//!   every replica what landed.
//! - [`worker`]: the protocol, per file and table.
//! - [`walroom`]: reads held while a shard's WAL waits to start over.
//! - [`status`]: what `eventctl export status` and the metrics show.
//! - [`init`]: the schema `eventctl export init` creates.
//! - [`statements`]: the text of every statement sent, from plain values;
//!   [`catalogue`]: all of them with sample values (`eventctl export sql`).
//! - [`password`]: `ExportPasswordFile`, read without waiting on it.
//! - [`redact`]: the password kept out of every text the export shows.
//! - [`live`]: the live keys, as the last reload left them.
//! - [`literal`]: ClickHouse string literals and identifiers.
//! - [`fleet`]: `eventctl query --cluster`, the same queries over the
//!   fleet.

pub mod catalogue;
pub mod clickhouse;
pub mod cluster;
pub mod fleet;
pub mod format;
pub mod init;
pub mod literal;
pub mod live;
pub mod password;
pub mod redact;
pub mod source;
pub mod state;
pub mod statements;
pub mod status;
pub mod tls;
pub mod walroom;
pub mod worker;

use crate::store::retention::ExportFloors;
use crate::store::StoreHealth;
use crate::threads::{spawn_watched, FailureHook, Stop, Watched};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use crate::config::ExportSettings;
pub use password::read_password_file;
pub use status::{ExportReport, ExportStatus};

/// How the stage runs (internal sizes, set by tests and the load harness).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportTunables {
    /// Each HTTP request's deadline without progress.
    pub timeout: Duration,
    pub format: format::Format,
    /// Worker threads (files are spread over them by shard number); 0 =
    /// one per active shard, at most [`WORKERS_MAX`].
    pub workers: usize,
}

/// The most export workers the default starts.
pub const WORKERS_MAX: usize = 4;

impl Default for ExportTunables {
    fn default() -> Self {
        ExportTunables {
            timeout: Duration::from_secs(30),
            format: format::Format::RowBinary,
            workers: 0,
        }
    }
}

/// What the stage is started with.
pub struct ExportInputs {
    pub data_dir: PathBuf,
    pub store_dir: PathBuf,
    pub host: String,
    pub settings: ExportSettings,
    /// The live keys, which a reload writes into.
    pub live: Arc<live::LiveExport>,
    pub health: Arc<StoreHealth>,
    pub floors: Arc<ExportFloors>,
    /// What the workers report to (made by the daemon, which shows it).
    pub status: Arc<ExportStatus>,
    /// The modes of the export directory and of the state database.
    pub state_mode: (crate::access::Mode, crate::access::Mode),
}

/// The running stage.
pub struct Exporter {
    pub status: Arc<ExportStatus>,
    stop: Arc<Stop>,
    threads: Vec<Watched>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Directory(#[from] crate::access::files::DirError),
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("export state {path}: {source}")]
    Mode {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start an export thread: {0}")]
    Spawn(std::io::Error),
}

/// Finds the shard files that hold fewer rows than their cursors say were
/// exported: a power cut took back commits whose rows were already sent
/// (shards commit with `synchronous = NORMAL`), or a file was restored
/// from a copy. Their cursors go back to what they hold, and since the
/// rings may commit the lost events again, under new ids, in any shard
/// file, every row older than now (by `ts`, or a gap's `ts_before`) is
/// then checked by its identity before it is sent: the time from which
/// rows are new is returned. It is kept in the state database, so that a
/// restart before those rows were all sent checks them still (the files
/// are no longer behind their cursors then); a later rewind moves it on.
/// None when no file ever went back.
fn rewind_rolled_back(store_dir: &Path, state_path: &Path) -> Result<Option<i64>, ExportError> {
    let mut state = state::ExportState::open(state_path)?;
    let mut rolled = false;
    let paths = crate::store::list_databases(store_dir).unwrap_or_default();
    for path in paths {
        let Ok(shard) = source::ShardSource::open(&path) else {
            continue; // the workers say why
        };
        for table in state::Table::ALL {
            let (Ok(newest), Ok(p)) = (shard.max_id(table), state.position(&shard.instance, table))
            else {
                continue;
            };
            if newest < p.exported_through {
                tracing::warn!(shard = %path.display(), table = table.name(), newest,
                    exported_through = p.exported_through,
                    "export: the file holds fewer rows than were exported from it (a power cut \
                     or a restored copy); rows it gets again are checked against the cluster \
                     by identity");
                state.rewind(&shard.instance, table, newest)?;
                rolled = true;
            }
        }
    }
    if rolled {
        state.recheck_from(crate::rings::now_ns())?;
    }
    Ok(state.recheck_before()?)
}

impl Exporter {
    /// Opens the state database (made if missing, eventd's user only) and
    /// starts the workers.
    pub fn start(
        inputs: ExportInputs,
        tunables: ExportTunables,
        hook: &FailureHook,
    ) -> Result<Exporter, ExportError> {
        let (dir_mode, file_mode) = inputs.state_mode;
        let dir = inputs.data_dir.join("export");
        crate::access::files::ensure_dir(&dir, dir_mode)?;
        let state_path = dir.join("state.db");
        let recheck_before = rewind_rolled_back(&inputs.store_dir, &state_path)?;
        for suffix in ["", "-wal", "-shm"] {
            let path = crate::store::side_file(&state_path, suffix);
            if path.exists() {
                crate::access::files::set_mode_path(&path, file_mode)
                    .map_err(|source| ExportError::Mode { path, source })?;
            }
        }
        let status = inputs.status.clone();
        let stop = Arc::new(Stop::default());
        let count = tunables.workers.max(1);
        let claims = worker::Claims::default();
        let mut exporter = Exporter {
            status: status.clone(),
            stop: stop.clone(),
            threads: Vec::with_capacity(count),
        };
        for index in 0..count {
            let parts = worker::WorkerParts {
                index,
                count,
                store_dir: inputs.store_dir.clone(),
                state_path: state_path.clone(),
                host: inputs.host.clone(),
                settings: inputs.settings.clone(),
                live: inputs.live.clone(),
                floors: inputs.floors.clone(),
                status: status.clone(),
                health: inputs.health.clone(),
                stop: stop.clone(),
                timeout: tunables.timeout,
                format: tunables.format,
                recheck_before,
                claims: claims.clone(),
            };
            let worker = worker::ExportWorker::new(parts)?;
            let spawned = spawn_watched(
                format!("export-{index}"),
                format!("export worker {index}"),
                hook,
                move || worker.run(),
            );
            match spawned {
                Ok(t) => exporter.threads.push(t),
                Err(e) => {
                    exporter.stop_and_join(&mut Vec::new());
                    return Err(ExportError::Spawn(e));
                }
            }
        }
        tracing::info!(
            url = %crate::redact::url(&inputs.settings.url),
            database = %inputs.settings.database,
            host = %inputs.host,
            workers = count,
            "export to ClickHouse started"
        );
        Ok(exporter)
    }

    pub fn stop(&self) {
        self.stop.stop();
    }

    /// Stops the workers (a batch being sent finishes or times out) and
    /// waits for them.
    pub fn stop_and_join(&mut self, failures: &mut Vec<String>) {
        self.stop.stop();
        crate::threads::join_all(self.threads.drain(..), failures);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{open_shard, shard_path};

    /// A file found behind its cursor sets the time before which rows are
    /// checked by identity, and a later start, when the file is no longer
    /// behind, still checks them.
    #[test]
    fn the_recheck_after_a_rollback_outlives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap();
        let state_path = dir.path().join("state.db");
        let path = shard_path(&store, 0);
        drop(open_shard(&path).unwrap());
        assert_eq!(rewind_rolled_back(&store, &state_path).unwrap(), None);

        let instance = source::ShardSource::open(&path).unwrap().instance;
        let mut state = state::ExportState::open(&state_path).unwrap();
        state
            .advance(
                &instance,
                state::Table::Events,
                "shard-000.db",
                40,
                state::Counts::default(),
            )
            .unwrap();
        drop(state);
        let before = crate::rings::now_ns();
        let set = rewind_rolled_back(&store, &state_path).unwrap();
        assert!(set.is_some_and(|t| t >= before), "{set:?}");
        let state = state::ExportState::open(&state_path).unwrap();
        let p = state.position(&instance, state::Table::Events).unwrap();
        assert_eq!((p.exported_through, p.rolled_back_through), (0, 40));
        drop(state);
        // The next start: nothing behind any more, the time stays.
        assert_eq!(rewind_rolled_back(&store, &state_path).unwrap(), set);
    }
}
