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

use super::cluster::{Cluster, ClusterError};
use super::format::Format;
use super::source::{Batch, Encoding, Identity, ShardSource, SourceError};
use super::state::{Counts, ExportState, Intent, StateError, Table};
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

    /// The live keys: ExportBatchRows, ExportNice, ExportUser,
    /// ExportPasswordFile.
    fn apply_live(&mut self) {
        let settings = self.parts.live.get();
        self.ctx.batch_rows = settings.batch_rows;
        self.apply_nice(settings.nice);
        if settings.user != self.parts.settings.user
            || settings.password_file != self.parts.settings.password_file
            || settings.tls != self.parts.settings.tls
            || self.last_scan.is_none_or(|t| t.elapsed() >= SCAN_INTERVAL)
        {
            self.parts.settings = settings;
            match read_credentials(&self.parts.settings, &self.credentials) {
                Ok(c) if c != self.credentials || self.unusable.is_some() => {
                    self.ctx.cluster = make_cluster(&self.parts, &c);
                    self.credentials = c;
                    self.unusable = None;
                    self.refused.remove(Path::new(CREDENTIALS));
                    tracing::info!("export credentials changed; they apply to the next batch");
                }
                Ok(_) => {}
                // Credentials that worked stay in use; none at all: see run.
                Err(e) => {
                    if self.unusable.is_some() {
                        self.unusable = Some(e.clone());
                    }
                    self.say_once(PathBuf::from(CREDENTIALS), e)
                }
            }
        }
    }

    /// Runs this thread (and the insert threads it starts) at `nice`. A
    /// niceness that cannot be had (lowering it needs CAP_SYS_NICE) is said
    /// once; the thread keeps the one it has.
    fn apply_nice(&mut self, nice: i32) {
        if self.nice == Some(nice) {
            return;
        }
        match crate::threads::set_own_nice(nice) {
            Ok(()) => {
                self.refused.remove(Path::new("ExportNice"));
                if self.nice.is_some() {
                    tracing::info!(nice, "export threads' niceness changed");
                }
            }
            Err(e) => {
                let have =
                    crate::threads::own_nice().map_or("unknown".to_string(), |n| n.to_string());
                self.say_once(
                    PathBuf::from("ExportNice"),
                    format!(
                        "ExportNice = {nice}: {e} (lowering a thread's niceness needs \
                         CAP_SYS_NICE or RLIMIT_NICE); export keeps niceness {have}"
                    ),
                );
            }
        }
        self.nice = Some(nice);
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

/// What `say_once` files a credentials problem under.
const CREDENTIALS: &str = "credentials";

/// Who eventd is at the cluster: ExportUser, the password in
/// ExportPasswordFile (its first line), and for an https:// URL the TLS
/// files as read and the client configuration made of them.
#[derive(Debug, Clone, Default)]
struct Credentials {
    user: Option<String>,
    password: Option<String>,
    tls_files: super::tls::TlsMaterial,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl PartialEq for Credentials {
    fn eq(&self, other: &Self) -> bool {
        (&self.user, &self.password, &self.tls_files)
            == (&other.user, &other.password, &other.tls_files)
            && self.tls.is_some() == other.tls.is_some()
    }
}

fn make_cluster(parts: &WorkerParts, credentials: &Credentials) -> Cluster {
    let endpoint = super::clickhouse::Endpoint {
        url: parts.settings.url.clone(),
        user: credentials.user.clone(),
        password: credentials.password.clone(),
        tls: credentials.tls.clone(),
    };
    let client = super::clickhouse::Client::new(endpoint, parts.timeout);
    Cluster::new(client, &parts.settings.database, &parts.host, parts.timeout)
}

/// The credentials the settings name, read now; the TLS configuration is
/// made again only when its files changed since `previous`.
fn read_credentials(s: &ExportSettings, previous: &Credentials) -> Result<Credentials, String> {
    let password = match &s.password_file {
        None => None,
        Some(path) => Some(super::read_password_file(path)?),
    };
    let (tls_files, tls) = if !super::tls::is_https(&s.url) {
        Default::default()
    } else {
        let files = super::tls::read(&s.tls)?;
        match &previous.tls {
            Some(config) if files == previous.tls_files => (files, Some(config.clone())),
            _ => {
                let config = super::tls::client_config(&files)?;
                (files, Some(config))
            }
        }
    };
    Ok(Credentials {
        user: s.user.clone(),
        password,
        tls_files,
        tls,
    })
}

/// A round of `source` without a failure; `busy` if it sent or settled.
/// The end of an outage is said once, with what it cost.
fn succeeded(ctx: &Ctx, source: &mut Source, busy: bool) {
    if let Some(since) = source.outage.since {
        tracing::info!(shard = %source.shard.path.display(),
            failed_tries = source.outage.failures, resends_tried = source.outage.resends,
            outage = ?since.elapsed(), "export: sending again");
    }
    source.outage = Outage::default();
    source.backoff = BACKOFF_MIN;
    let waiting = source.waiting.iter().any(Option::is_some);
    ctx.status.update(&source.shard.instance, |s| {
        s.failures = 0;
        s.state = if busy || waiting { "exporting" } else { "idle" }.to_string();
    });
}

/// A failed step: the file backs off. Each error is logged the first time
/// an outage meets it; repeats are counted (the status shows the last
/// error, and [`succeeded`] says how many failures there were).
fn backed_off(ctx: &mut Ctx, source: &mut Source, e: &StepError) {
    // What the cluster said is masked and escaped where it was read (the
    // client); this also covers the rest (a layout read off the server).
    let message = ctx.cluster.client().shown(&e.to_string());
    source.outage.since.get_or_insert_with(Instant::now);
    let said = &mut source.outage.said;
    if !said.contains(&message) && said.len() < OUTAGE_ERRORS_SAID {
        said.push(message.clone());
        tracing::warn!(
            shard = %source.shard.path.display(),
            error = %message,
            retry_in = ?source.backoff,
            "export: batch not sent; the cursor stays and the batch is checked before any \
             resend (each error said once until it works again)"
        );
    }
    source.outage.failures += 1;
    ctx.status.update(&source.shard.instance, |s| {
        s.failures += 1;
        s.state = "retrying".to_string();
        s.last_error = Some(message);
        s.last_error_at = Some(crate::rings::now_ns());
    });
    source.next_try = Instant::now() + source.backoff;
    source.backoff = (source.backoff * 2).min(BACKOFF_MAX);
}

/// One step of `table` of `source`: settle, reconcile, or send one batch.
fn step(ctx: &mut Ctx, source: &mut Source, table: Table) -> Result<bool, StepError> {
    let instance = source.shard.instance.clone();
    let position = ctx.state.position(&instance, table)?;
    if let Some(intent) = position.pending {
        let rolled = position.rolled_back_through;
        settle(ctx, source, table, (intent.lo, intent.hi), rolled)?;
        source.reconciled[slot(table)] = true;
        return Ok(true);
    }
    let through = position.exported_through;
    if !source.reconciled[slot(table)] {
        reconcile(ctx, source, table, through, position.rolled_back_through)?;
        source.reconciled[slot(table)] = true;
        return Ok(true);
    }
    let newest = source.shard.max_id(table)?;
    report_lag(ctx, source, table, through, newest)?;
    if newest <= through {
        source.waiting[slot(table)] = None;
        return Ok(false);
    }
    let waited = *source.waiting[slot(table)].get_or_insert_with(Instant::now);
    let full = (newest - through) as u64 >= ctx.batch_rows;
    if !full && waited.elapsed() < FLUSH_INTERVAL {
        return Ok(false);
    }
    let ahead = source.prefetched[slot(table)]
        .take()
        .filter(|p| p.after == through && p.batch_rows == ctx.batch_rows);
    let mut rows = match ahead {
        Some(p) => p.batch,
        None if !may_read(ctx, source) => return Ok(false),
        None => read_paced(
            &ctx.status,
            source,
            table,
            through,
            ctx.batch_rows,
            ctx.encoding(),
        )?,
    };
    let Some(hi) = rows.last_id() else {
        return Ok(false);
    };
    let intent = Intent {
        lo: through + 1,
        hi,
        rows: rows.len() as u64,
        recorded_at: crate::rings::now_ns(),
    };
    ctx.state.record(&instance, table, intent)?;
    ctx.status.update(&instance, |s| {
        s.state = "exporting".to_string();
        s.stream(table).pending = Some([intent.lo, intent.hi]);
    });
    let check = recheck(ctx, &rows, position.rolled_back_through);
    if !check.is_empty() {
        let present = ctx.cluster.present_by_identity(table, &check)?;
        if !present.is_empty() {
            tracing::info!(shard = %source.shard.path.display(), table = table.name(),
                lo = intent.lo, hi, rows = present.len(),
                "export: rows committed again after a rollback are in the cluster already: not sent");
            rows.retain(|id| !present.contains(&id));
        }
    }
    if !rows.is_empty() {
        // The next batch is read and encoded while this one is sent when
        // it will certainly be a full one.
        let read_ahead = newest - hi >= ctx.batch_rows as i64 && may_read(ctx, source);
        let ahead = send_reading_ahead(ctx, source, table, &rows, read_ahead.then_some(hi))?;
        source.prefetched[slot(table)] = ahead;
    }
    let sent = Counts {
        batches_sent: 1,
        rows_sent: rows.len() as u64,
        ..Counts::default()
    };
    advance(ctx, &source.shard, table, hi, sent)?;
    // Rows left over have waited since then already: their batch goes once
    // the interval is up, not a whole interval later.
    if newest <= hi {
        source.waiting[slot(table)] = None;
    }
    Ok(true)
}

/// Whether a batch may be read from `source` now (see `walroom`); a new
/// hold is counted in the status.
fn may_read(ctx: &Ctx, source: &mut Source) -> bool {
    let before = source.wal.holds();
    let ok = source.wal.may_read(Instant::now());
    count_holds(&ctx.status, source, before);
    ok
}

/// The batch of `table` after `after`, read in runs with room left for the
/// shard's WAL between them (see `walroom`).
fn read_paced(
    status: &ExportStatus,
    source: &mut Source,
    table: Table,
    after: i64,
    batch_rows: u64,
    encoding: Encoding<'_>,
) -> Result<Batch, SourceError> {
    let before = source.wal.holds();
    let wal = &mut source.wal;
    let batch = source
        .shard
        .after_paced(table, after, batch_rows, encoding, &mut || {
            wal.wait_for_room()
        });
    count_holds(status, source, before);
    batch
}

fn count_holds(status: &ExportStatus, source: &Source, before: u64) {
    let holds = source.wal.holds();
    if holds != before {
        status.update(&source.shard.instance, |s| s.wal_holds = holds);
    }
}

fn report_lag(
    ctx: &Ctx,
    source: &Source,
    table: Table,
    through: i64,
    newest: i64,
) -> Result<(), StepError> {
    let oldest = if newest > through {
        source.shard.first_time_after(table, through, 1)?
    } else {
        None
    };
    let now = crate::rings::now_ns();
    ctx.status.update(&source.shard.instance, |s| {
        s.file = source.shard.file.clone();
        let st = s.stream(table);
        st.exported_through = through;
        st.newest_id = newest;
        st.lag_rows = (newest - through).max(0) as u64;
        st.lag_seconds = oldest.map_or(0.0, |t| (now - t).max(0) as f64 / 1e9);
        st.pending = None;
    });
    Ok(())
}

/// The batch's body, sent (one insert).
fn send(ctx: &mut Ctx, shard: &ShardSource, table: Table, rows: &Batch) -> Result<(), StepError> {
    let (token, query_id) = insert_names(ctx, shard, table, rows);
    ctx.cluster
        .insert(table, ctx.format, rows.body(), &token, &query_id)?;
    Ok(())
}

/// The deduplication token and query id of an insert of `rows`.
fn insert_names(ctx: &Ctx, shard: &ShardSource, table: Table, rows: &Batch) -> (String, String) {
    let token = format!(
        "{}:{}:{}:{}-{}:{}",
        ctx.host,
        shard.instance,
        table.name(),
        rows.first_id().unwrap_or(0),
        rows.last_id().unwrap_or(0),
        rows.len()
    );
    let query_id = format!(
        "{}{}",
        query_prefix(&ctx.host, &shard.instance, table),
        crate::rings::now_ns()
    );
    (token, query_id)
}

/// Sends `rows` and, while the insert is under way on a thread of its
/// own, reads and encodes the batch after `read_ahead` if asked: the insert
/// waits on ClickHouse, the read on SQLite and this thread's CPU, so a
/// worker keeps both busy. The read is read-only and its result is only
/// kept, so the protocol (intent before the send, cursor after it) is the
/// same as without it. A read that fails is dropped: the next step reads
/// again and says why.
fn send_reading_ahead(
    ctx: &mut Ctx,
    source: &mut Source,
    table: Table,
    rows: &Batch,
    read_ahead: Option<i64>,
) -> Result<Option<Prefetched>, StepError> {
    let Some(after) = read_ahead else {
        send(ctx, &source.shard, table, rows)?;
        return Ok(None);
    };
    let (token, query_id) = insert_names(ctx, &source.shard, table, rows);
    let (batch_rows, format) = (ctx.batch_rows, ctx.format);
    let encoding = Encoding {
        format,
        host: &ctx.host,
    };
    let cluster = &mut ctx.cluster;
    let status = &ctx.status;
    let mut read = || -> Option<Prefetched> {
        let batch = read_paced(status, source, table, after, batch_rows, encoding).ok()?;
        (batch.len() as u64 == batch_rows).then_some(Prefetched {
            after,
            batch_rows,
            batch,
        })
    };
    let body = rows.body();
    let overlapped = std::thread::scope(|scope| {
        let sender = std::thread::Builder::new()
            .name("eventd-export-send".to_string())
            .spawn_scoped(scope, || {
                cluster.insert(table, format, body, &token, &query_id)
            });
        sender.map(|sender| {
            let ahead = read();
            // A panic in the insert is a bug: it goes on up as one.
            let sent = sender
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            sent.map(|()| ahead)
        })
    });
    match overlapped {
        Ok(sent) => Ok(sent?),
        // No thread to be had: the same insert here, nothing read ahead.
        Err(e) => {
            tracing::debug!(error = %e, "export: no thread to read ahead with");
            ctx.cluster
                .insert(table, ctx.format, body, &token, &query_id)?;
            Ok(None)
        }
    }
}

/// What the query id of every insert of (`host`, `instance`, `table`)
/// starts with.
fn query_prefix(host: &str, instance: &str, table: Table) -> String {
    format!("eventd:{host}:{instance}:{}:", table.name())
}

/// The cursor to `hi`, the intent gone, `counted` added to the counters
/// (in the state database and the status); retention learns the cursor.
fn advance(
    ctx: &mut Ctx,
    shard: &ShardSource,
    table: Table,
    hi: i64,
    counted: Counts,
) -> Result<(), StepError> {
    ctx.state
        .advance(&shard.instance, table, &shard.file, hi, counted)?;
    ctx.status.update(&shard.instance, |s| {
        let st = s.stream(table);
        st.batches_sent += counted.batches_sent;
        st.rows_sent += counted.rows_sent;
        st.batches_deduplicated += counted.batches_deduplicated;
        st.batches_resent += counted.batches_resent;
        st.rows_resent += counted.rows_resent;
    });
    let mut floor = ctx.floors.get(&shard.path);
    match table {
        Table::Events => floor.events = floor.events.max(hi),
        Table::Gaps => floor.gaps = floor.gaps.max(hi),
    }
    ctx.floors.set(&shard.path, floor);
    Ok(())
}

/// Makes sure every row of `lo..=hi` still in the shard is in the cluster,
/// sending only those that are not, then moves the cursor to `hi`. First
/// waits until no insert of this file and table is still running anywhere
/// (one the client gave up on may yet land, and would then land twice).
/// Works through the range at most `ExportBatchRows` rows at a time (a
/// reconcile's range can be a whole file); between chunks the rest of the
/// range stays the intent.
fn settle(
    ctx: &mut Ctx,
    source: &mut Source,
    table: Table,
    (lo, hi): (i64, i64),
    rolled: i64,
) -> Result<(), StepError> {
    let prefix = query_prefix(&ctx.host, &source.shard.instance, table);
    let running = ctx.cluster.running(&prefix)?;
    if running > 0 {
        return Err(StepError::StillRunning(running));
    }
    let mut from = lo;
    loop {
        let shard = &source.shard;
        let rows = shard.select(table, (from, hi), ctx.batch_rows, ctx.encoding())?;
        let end = match rows.last_id() {
            Some(last) if (rows.len() as u64) >= ctx.batch_rows && last < hi => last,
            _ => hi,
        };
        settle_chunk(ctx, source, table, (from, end), rows, rolled)?;
        if end >= hi {
            return Ok(());
        }
        from = end + 1;
        let intent = Intent {
            lo: from,
            hi,
            rows: 0,
            recorded_at: crate::rings::now_ns(),
        };
        ctx.state.record(&source.shard.instance, table, intent)?;
    }
}

/// One chunk of [`settle`]: `rows` are what the shard holds of `lo..=hi`.
fn settle_chunk(
    ctx: &mut Ctx,
    source: &mut Source,
    table: Table,
    (lo, hi): (i64, i64),
    mut rows: Batch,
    rolled: i64,
) -> Result<(), StepError> {
    let shard = &source.shard;
    let Some(times) = rows.time_range() else {
        // Nothing left of the range (retention deleted it, counted).
        return advance(ctx, shard, table, hi, Counts::default());
    };
    // Rows that may be in the cluster under other ids are looked for by
    // identity, the others by their file and id.
    let check = recheck(ctx, &rows, rolled);
    let mut present = ctx.cluster.present_by_identity(table, &check)?;
    if check.len() < rows.len() {
        let by_id = ctx
            .cluster
            .present(table, &shard.instance, (lo, hi), times)?;
        let checked: BTreeSet<i64> = check.iter().map(|(id, _, _)| *id).collect();
        present.extend(by_id.into_iter().filter(|id| !checked.contains(id)));
    }
    let had = rows.len();
    rows.retain(|id| !present.contains(&id));
    if rows.is_empty() {
        tracing::info!(shard = %shard.path.display(), table = table.name(), lo, hi,
            "export: a batch whose send was not confirmed is in the cluster: not resent");
    } else {
        // Said once per outage: while sends keep failing, every retry
        // finds the same rows missing (`succeeded` counts them at the end).
        if source.outage.resends == 0 {
            tracing::info!(shard = %shard.path.display(), table = table.name(), lo, hi,
                missing = rows.len(), of = had,
                "export: resending the rows the cluster does not hold");
        }
        source.outage.resends += 1;
        send(ctx, shard, table, &rows)?;
    }
    let resent = rows.len() as u64;
    let counted = if resent == 0 {
        Counts {
            batches_deduplicated: 1,
            ..Counts::default()
        }
    } else {
        Counts {
            batches_resent: 1,
            rows_resent: resent,
            ..Counts::default()
        }
    };
    advance(ctx, shard, table, hi, counted)?;
    ctx.status
        .update(&shard.instance, |s| s.stream(table).pending = None);
    Ok(())
}

/// The rows of `rows` to look for by identity: ids in a rolled-back range
/// (at or below `rolled`), and, after a rollback was found at start, rows
/// older than the start (see `rewind_rolled_back`).
fn recheck(ctx: &Ctx, rows: &Batch, rolled: i64) -> Vec<(i64, Identity, i64)> {
    if rolled == 0 && ctx.recheck_before.is_none() {
        return Vec::new();
    }
    let mut ids = rows.identities();
    ids.retain(|(id, _, time)| *id <= rolled || ctx.recheck_before.is_some_and(|t| *time < t));
    ids
}

/// Before the first batch of a run: settles whatever of this file the
/// cluster holds above the cursor (a batch sent under an intent the state
/// database no longer has).
fn reconcile(
    ctx: &mut Ctx,
    source: &mut Source,
    table: Table,
    through: i64,
    rolled: i64,
) -> Result<(), StepError> {
    let Some(since) = source
        .shard
        .first_time_after(table, through, BATCH_ROWS_MAX)?
    else {
        return Ok(());
    };
    let instance = source.shard.instance.clone();
    if let Some(highest) = ctx
        .cluster
        .highest_after(table, &instance, through, since)?
    {
        tracing::warn!(shard = %source.shard.path.display(), table = table.name(), through, highest,
            "export: the cluster holds rows past the recorded cursor; checking them");
        settle(ctx, source, table, (through + 1, highest), rolled)?;
    }
    Ok(())
}

/// Where a path's file name is shown.
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_files_spread_evenly_and_other_names_have_one_owner() {
        for count in 1..=4 {
            let owners: Vec<usize> = (0..12)
                .map(|i| owner(&format!("shard-{i:03}.db"), count))
                .collect();
            for w in 0..count {
                assert_eq!(owners.iter().filter(|&&o| o == w).count(), 12 / count);
            }
            assert_eq!(owner("odd.db", count), owner("odd.db", count));
            assert!(owner("odd.db", count) < count);
        }
    }
}
