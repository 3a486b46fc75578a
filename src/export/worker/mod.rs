//! One export worker: a thread that sends the shard files assigned to it
//! (by shard number, see [`owner`], so a file always has the same worker),
//! table by table, batch by batch. The protocol, per (file, table):
//!
//! 1. **Batch.** The rows with ids above the cursor, at most
//!    `ExportBatchRows`, once that many wait or the oldest has waited
//!    [`FLUSH_INTERVAL`]. The batch is the id range `cursor+1 ..= last id`.
//! 2. **Intent.** The range is recorded in the state database (synced).
//! 3. **Send.** One insert of the batch through the Distributed table,
//!    synchronous. Accepted: the cursor moves to the range's end and the
//!    intent goes, in one transaction.
//! 4. **Settle.** After a failed send, and for an intent found at start,
//!    nothing is sent until the cluster says which of the range's rows it
//!    holds (every replica asked, see `cluster.rs`); only the missing ones
//!    are sent. A resend of a whole batch is byte for byte the first send,
//!    so ClickHouse's block deduplication also drops it if the first one
//!    is still on its way; a resend of part of a batch holds only rows
//!    that are nowhere.
//! 5. **Reconcile.** Once per file and table after start, before the first
//!    batch: the cluster's highest id of this file above the cursor, if
//!    any, is settled like an intent. That covers a state database lost or
//!    restored from a backup.
//!
//! A failure backs that file off, doubling from [`BACKOFF_MIN`] to
//! [`BACKOFF_MAX`]; the cursor stays. Nothing here waits on the write path
//! or holds it up: shards are read through their own read-only connections.

//!
//! The parts: this file is the worker's loop (its files, their rounds,
//! which table goes next); `protocol` is the steps above, one batch at a
//! time; `settings` applies the live keys (batch size, nice, credentials).

mod protocol;
mod settings;

use self::protocol::{backed_off, step, succeeded};
use self::settings::{make_cluster, read_credentials, Credentials, CREDENTIALS};
use super::cluster::{Cluster, ClusterError};
use super::format::Format;
use super::source::{Batch, Encoding, ShardSource, SourceError};
use super::state::{ExportState, StateError, Table};
use super::status::{ClusterStatus, ExportStatus};
use super::walroom::WalRoom;
use super::ExportSettings;
use crate::query::render::clean;
use crate::store::retention::{ExportFloors, Exported};
use crate::store::StoreHealth;
use crate::threads::Stop;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A batch smaller than `ExportBatchRows` goes once its oldest row has
/// waited this long: at most about one insert per second per shard file,
/// as ClickHouse prefers, with that much export lag at low rates.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Sleep between rounds that found nothing to do.
const IDLE: Duration = Duration::from_millis(100);
/// Backoff after failures of one file: doubling between these.
pub const BACKOFF_MIN: Duration = Duration::from_millis(200);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How often the store directory is listed for new and vanished files.
const SCAN_INTERVAL: Duration = Duration::from_secs(2);
/// The most rows a batch may have had (the top of `ExportBatchRows`): a
/// lost intent's batch lies within this many rows after the cursor.
pub const BATCH_ROWS_MAX: u64 = crate::config::EXPORT_BATCH_ROWS_RANGE.1;

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(
        "{0} insert(s) of this file are still running in the cluster; its batch is checked \
         once they end"
    )]
    StillRunning(u64),
}

/// What a worker is made of.
pub struct WorkerParts {
    pub index: usize,
    pub count: usize,
    pub store_dir: PathBuf,
    pub state_path: PathBuf,
    pub host: String,
    pub settings: ExportSettings,
    pub live: Arc<super::live::LiveExport>,
    pub floors: Arc<ExportFloors>,
    pub status: Arc<ExportStatus>,
    pub health: Arc<StoreHealth>,
    pub stop: Arc<Stop>,
    pub timeout: Duration,
    pub format: Format,
    /// Rows older than this (ns) are checked by identity before they are
    /// sent (see `rewind_rolled_back` in mod.rs); None: only rolled-back
    /// id ranges are.
    pub recheck_before: Option<i64>,
    /// Shared by every worker of the stage.
    pub claims: Claims,
}

/// One file this worker sends.
struct Source {
    shard: ShardSource,
    reconciled: [bool; 2],
    /// Since when rows wait that are fewer than a batch, per table.
    waiting: [Option<Instant>; 2],
    next_try: Instant,
    backoff: Duration,
    /// The next batch of each table, read and encoded while the previous
    /// one was being sent (see [`Prefetched`]).
    prefetched: [Option<Prefetched>; 2],
    /// Whether its WAL needs a moment without readers.
    wal: WalRoom,
    /// The failures since the last success (for the log: once per outage).
    outage: Outage,
}

/// A run of failed steps of one file, from the first failure to the next
/// success: what the log says once at each end instead of at every retry.
#[derive(Debug, Default)]
struct Outage {
    /// When the first failure was (None: no outage).
    since: Option<Instant>,
    failures: u64,
    /// Resends of missing rows tried (each failed but maybe the last).
    resends: u64,
    /// The errors logged in this outage: each is said once.
    said: Vec<String>,
}

/// The most distinct errors one outage logs (the status always shows the
/// last one).
const OUTAGE_ERRORS_SAID: usize = 8;

/// A batch read ahead: the rows after `after`, at most `batch_rows` of
/// them (always that many: only a full batch is read ahead), and their
/// body. Reading is all it took, so dropping it costs nothing; it is used
/// only while the cursor is still `after` and `ExportBatchRows` unchanged,
/// and then it is exactly the batch a read at that moment would give (ids
/// are committed in order and a range never gains rows).
struct Prefetched {
    after: i64,
    batch_rows: u64,
    batch: Batch,
}

/// What the steps share.
struct Ctx {
    host: String,
    state: ExportState,
    cluster: Cluster,
    floors: Arc<ExportFloors>,
    status: Arc<ExportStatus>,
    format: Format,
    batch_rows: u64,
    recheck_before: Option<i64>,
}

impl Ctx {
    fn encoding(&self) -> Encoding<'_> {
        Encoding {
            format: self.format,
            host: &self.host,
        }
    }
}

pub struct ExportWorker {
    parts: WorkerParts,
    ctx: Ctx,
    sources: BTreeMap<PathBuf, Source>,
    /// Files that cannot be exported, by path, with why (said once).
    refused: BTreeMap<PathBuf, String>,
    last_scan: Option<Instant>,
    credentials: Credentials,
    /// Why the configured credentials cannot be used, while none ever
    /// could: nothing is sent then.
    unusable: Option<String>,
    /// The `ExportNice` this thread runs at (None until first applied).
    nice: Option<i32>,
}

fn slot(table: Table) -> usize {
    match table {
        Table::Events => 0,
        Table::Gaps => 1,
    }
}

/// Which worker a file belongs to: its shard number (`shard-NNN...`) modulo
/// the worker count, so the active shards spread evenly; FNV-1a of the
/// name for any other name. Two workers never hold one file at once: a
/// worker also has to claim the file's instance id (see `Claims`).
pub fn owner(file: &str, count: usize) -> usize {
    let count = count.max(1) as u64;
    let number = file
        .strip_prefix("shard-")
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|digits| digits.parse::<u64>().ok());
    let n = number.unwrap_or_else(|| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in file.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    });
    (n % count) as usize
}

/// The instance ids some worker holds, shared by all of them: a file that
/// changed owner (renamed) is taken only once its old owner let go.
pub type Claims = Arc<std::sync::Mutex<BTreeSet<String>>>;

fn claims(c: &Claims) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
    // Every change under the lock is one insert or remove.
    c.lock().unwrap_or_else(|p| p.into_inner())
}

impl ExportWorker {
    pub fn new(parts: WorkerParts) -> Result<ExportWorker, StateError> {
        let state = ExportState::open(&parts.state_path)?;
        // Without usable credentials nothing is sent (not even as the
        // server's default user) until the file is fixed.
        let (credentials, unusable) =
            match read_credentials(&parts.settings, &Credentials::default()) {
                Ok(c) => (c, None),
                Err(why) => (Credentials::default(), Some(why)),
            };
        let cluster = make_cluster(&parts, &credentials);
        let ctx = Ctx {
            host: parts.host.clone(),
            state,
            cluster,
            floors: parts.floors.clone(),
            status: parts.status.clone(),
            format: parts.format,
            batch_rows: parts.settings.batch_rows,
            recheck_before: parts.recheck_before,
        };
        Ok(ExportWorker {
            parts,
            ctx,
            sources: BTreeMap::new(),
            refused: BTreeMap::new(),
            last_scan: None,
            credentials,
            unusable,
            nice: None,
        })
    }

    /// Sends until stopped.
    pub fn run(mut self) -> Result<(), StateError> {
        if let Some(why) = self.unusable.clone() {
            self.say_once(PathBuf::from(CREDENTIALS), why);
        }
        self.apply_nice(self.parts.settings.nice);
        while !self.parts.stop.is_stopped() {
            self.apply_live();
            if self.last_scan.is_none_or(|t| t.elapsed() >= SCAN_INTERVAL) {
                self.scan();
                self.last_scan = Some(Instant::now());
            }
            if let Some(why) = &self.unusable {
                let state = format!("not exported: {why}");
                for source in self.sources.values() {
                    self.ctx
                        .status
                        .update(&source.shard.instance, |s| s.state.clone_from(&state));
                }
                if self.parts.stop.sleep(IDLE) {
                    break;
                }
                continue;
            }
            if !self.round() && self.parts.stop.sleep(IDLE) {
                break;
            }
        }
        Ok(())
    }

    fn say_once(&mut self, key: PathBuf, why: String) {
        if self.refused.get(&key) != Some(&why) {
            tracing::error!(what = %clean(&key.display().to_string()), error = %clean(&why),
                "export: not usable");
            self.refused.insert(key, why);
        }
    }

    /// Takes the files of this worker that appeared, drops those gone.
    fn scan(&mut self) {
        let paths = match crate::store::list_databases(&self.parts.store_dir) {
            Ok(p) => p,
            Err(e) => return self.say_once(self.parts.store_dir.clone(), e.to_string()),
        };
        let gone: Vec<PathBuf> = self
            .sources
            .keys()
            .filter(|p| !paths.contains(p) || self.parts.health.is_damaged(p))
            .cloned()
            .collect();
        for path in gone {
            if let Some(s) = self.sources.remove(&path) {
                claims(&self.parts.claims).remove(&s.shard.instance);
                let why = if self.parts.health.is_damaged(&path) {
                    "not exported: the file is damaged".to_string()
                } else {
                    "not exported: the file is gone".to_string()
                };
                tracing::warn!(shard = %path.display(), "export: {why}");
                self.ctx
                    .status
                    .update(&s.shard.instance, |st| st.state = why);
            }
        }
        for path in paths {
            if self.sources.contains_key(&path) || self.parts.health.is_damaged(&path) {
                continue;
            }
            match ShardSource::open(&path) {
                Ok(shard)
                    if owner(&shard.file, self.parts.count) == self.parts.index
                        && claims(&self.parts.claims).insert(shard.instance.clone()) =>
                {
                    self.refused.remove(&path);
                    self.take(shard);
                }
                Ok(_) => {}
                // Every worker meets it; the first says it.
                Err(e) if self.parts.index == 0 => self.say_once(path, e.to_string()),
                Err(_) => {}
            }
        }
    }

    fn take(&mut self, shard: ShardSource) {
        let mut floor = Exported::default();
        for table in Table::ALL {
            if let Ok(p) = self.ctx.state.position(&shard.instance, table) {
                match table {
                    Table::Events => floor.events = p.exported_through,
                    Table::Gaps => floor.gaps = p.exported_through,
                }
            }
        }
        self.ctx.floors.set(&shard.path, floor);
        // The counters count from the file's first export, not this start.
        let counts = Table::ALL.map(|t| {
            self.ctx
                .state
                .counts(&shard.instance, t)
                .unwrap_or_default()
        });
        self.ctx.status.update(&shard.instance, |s| {
            s.file = shard.file.clone();
            s.state = "starting".to_string();
            for (table, c) in Table::ALL.into_iter().zip(counts) {
                let st = s.stream(table);
                st.batches_sent = c.batches_sent;
                st.rows_sent = c.rows_sent;
                st.batches_deduplicated = c.batches_deduplicated;
                st.batches_resent = c.batches_resent;
                st.rows_resent = c.rows_resent;
            }
        });
        tracing::info!(shard = %shard.path.display(), instance = %shard.instance, "export: file taken");
        let wal = WalRoom::new(&shard.path, crate::store::schema::WAL_LIMIT_BYTES as u64);
        self.sources.insert(
            shard.path.clone(),
            Source {
                wal,
                shard,
                reconciled: [false; 2],
                waiting: [None; 2],
                next_try: Instant::now(),
                backoff: BACKOFF_MIN,
                prefetched: [None, None],
                outage: Outage::default(),
            },
        );
    }

    /// One step for every file and table due; true if anything was sent
    /// or settled.
    fn round(&mut self) -> bool {
        let mut worked = false;
        let now = Instant::now();
        for source in self.sources.values_mut() {
            if source.next_try > now || self.parts.stop.is_stopped() {
                continue;
            }
            let mut failed = None;
            let mut busy = false;
            for table in Table::ALL {
                match step(&mut self.ctx, source, table) {
                    Ok(w) => busy |= w,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            worked |= busy;
            match failed {
                None => succeeded(&self.ctx, source, busy),
                Some(e) => backed_off(&mut self.ctx, source, &e),
            }
        }
        if let Some(t) = self.ctx.cluster.known_topology() {
            self.ctx.status.set_cluster(Some(ClusterStatus {
                version: t.version.clone(),
                layout: match t.layout {
                    super::statements::Layout::Single => "single",
                    super::statements::Layout::Cluster => "cluster",
                }
                .to_string(),
                cluster: t.cluster.clone(),
                replicas: t.replicas.len(),
                shard: t.home.as_ref().map(|(n, _)| *n),
                shard_replicas: t.holders().len(),
                dedup_token: t.dedup_token,
            }));
        }
        worked
    }
}

/// Where a path's file name is shown.
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests;
