//! The daemon: start-up order, threads and shutdown.
//!
//! Start-up: lock the data directory, attach the rings (R4 ordinals),
//! compute the shard count (R1), check the descriptor allowance against the
//! soft limit (R2) before any database is opened, open or create the active
//! shards (R12), plan each ring's resume point from the receipts of every
//! database in the store (R6, R7), assign shards to rings (R4) and start one
//! writer thread per shard (R8) and one drain thread per ring (R5, R9).
//!
//! Shutdown: the drains stop reading; when the last sender of a channel is
//! dropped its writer commits what is left and closes its database.

pub mod drain;
mod lock;
mod metrics;
mod report;
pub mod signals;

pub use drain::{DrainParts, DrainStats, DrainThread, RingMaker};
pub use lock::{DataDirLock, PreviousRun};

use crate::access::{self, Policy};
use crate::channel::{Capacity, ChannelMonitor, HandoffChannel};
use crate::config::Settings;
use crate::retention::{ActiveShard, RetentionCoordinator, RetentionStats};
use crate::rings::{online_cpus, AttachedRing, CurrentRing, KmesDir, Ring, RingError, RingReader};
use crate::routing::{self, RoutingError, StripeRouter};
use crate::store::{
    self, CommitTracker, Damaged, Handoff, ReceiptReader, ShardWriter, StoreError, StoreHealth,
    WriterShared, WriterStats,
};
use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Internal sizes chosen by measurement with the load harness
/// (docs/performance.md), not operator settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunables {
    /// R5 stripe length L: consecutive events a drain sends to one shard.
    pub stripe_len: NonZeroU32,
    /// Capacity of each shard's handoff channel (R9); `None` sizes it from
    /// the shard count ([`Tunables::channel_for`]).
    pub channel: Option<Capacity>,
    /// Time between two passes of the retention coordinator.
    pub retention_interval: Duration,
}

/// All channels together hold at most about this many payload bytes.
const CHANNEL_BYTES_TOTAL: u64 = 64 << 20;
const CHANNEL_BYTES_PER_SHARD: (u64, u64) = (256 << 10, 4 << 20);
/// Slots per KiB of byte budget: events average a few hundred bytes.
const CHANNEL_SLOT_BYTES: u64 = 1024;

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            // 256 > 0, so this is never the None branch.
            stripe_len: NonZeroU32::new(256).unwrap_or(NonZeroU32::MIN),
            channel: None,
            retention_interval: Duration::from_secs(30),
        }
    }
}

impl Tunables {
    /// The channel capacity for `shards` shards: 4 MiB and 4096 slots each
    /// (a writer's batch is about one channel-full, and bigger commits are
    /// cheaper), shrinking with many shards so that all channels together
    /// stay near 64 MiB (256 KiB and 256 slots each at 256 shards).
    pub fn channel_for(&self, shards: usize) -> Capacity {
        if let Some(c) = self.channel {
            return c;
        }
        let (lo, hi) = CHANNEL_BYTES_PER_SHARD;
        let bytes = (CHANNEL_BYTES_TOTAL / shards.max(1) as u64)
            .clamp(lo, hi)
            .next_power_of_two()
            .min(hi);
        Capacity {
            slots: (bytes / CHANNEL_SLOT_BYTES) as usize,
            bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_sizes_follow_the_shard_count_and_stay_valid() {
        let t = Tunables::default();
        for (shards, slots, bytes) in [
            (1, 4096, 4 << 20),
            (2, 4096, 4 << 20),
            (16, 4096, 4 << 20),
            (64, 1024, 1 << 20),
            (256, 256, 256 << 10),
            (1000, 256, 256 << 10),
        ] {
            let c = t.channel_for(shards);
            assert_eq!((c.slots, c.bytes), (slots, bytes), "{shards} shards");
            assert!(HandoffChannel::<Handoff>::new(c).is_ok());
        }
        let fixed = Capacity {
            slots: 64,
            bytes: 1 << 16,
        };
        let t = Tunables {
            channel: Some(fixed),
            ..t
        };
        assert_eq!(t.channel_for(2), fixed);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error("cannot create directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Rings(#[from] RingError),
    #[error(transparent)]
    Routing(#[from] RoutingError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot read the descriptor limit: {0}")]
    Limit(std::io::Error),
    #[error("cannot start a thread: {0}")]
    Spawn(std::io::Error),
    #[error("query socket in {path}: {source}")]
    Query {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("metrics listener on {addr} (MetricsListen): {source}")]
    Metrics {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Syslog(#[from] crate::syslog::SyslogError),
    #[error("handoff channel capacity: {0}")]
    Channel(#[from] crate::channel::CapacityError),
    #[error("{0}")]
    Threads(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Access(#[from] access::AccessError),
    #[error(transparent)]
    Directory(#[from] access::files::DirError),
}

/// What the daemon shares with monitoring (`eventctl stats`, the harness).
pub struct DaemonState {
    /// One per drained ring, by ordinal: the attached CPU rings, then
    /// eventd's own syslog ring (if a syslog socket is on). A ring the
    /// drain replaces is replaced here too.
    pub rings: Vec<Arc<CurrentRing>>,
    pub drains: Vec<Arc<DrainStats>>,
    pub writers: Vec<Arc<WriterStats>>,
    /// Counters of each shard's channel.
    pub channels: Vec<ChannelMonitor<Handoff>>,
    pub shard_paths: Vec<PathBuf>,
    /// Shards owned by each ring ordinal (R4; the syslog ring's drain owns
    /// every shard).
    pub assignment: Vec<Vec<usize>>,
    /// Live MaxBatchSize (R11: changes the next commit threshold only).
    pub max_batch: Arc<AtomicU64>,
    pub needed_descriptors: u64,
    pub trackers: Arc<[CommitTracker]>,
    pub retention: Arc<RetentionStats>,
    pub queries: Arc<crate::query::QueryStats>,
    pub syslog: Arc<crate::syslog::SyslogStats>,
    pub syslog_drops: Arc<crate::syslog::Drops>,
    /// The ordinal of eventd's own syslog ring, if a syslog socket is on.
    pub syslog_ring: Option<usize>,
    /// Shard writers whose commits fail now.
    pub failing_writers: Arc<AtomicU64>,
    pub policy: Policy,
    /// Damaged shard files, and each active shard's file now.
    pub health: Arc<StoreHealth>,
}

/// Called (from the failing thread) when a drain or writer thread stops
/// on its own, with what happened. The `eventd` binary's hook starts a
/// shutdown so that the process exits non-zero and a supervisor restarts it.
pub type FailureHook = Arc<dyn Fn(&str) + Send + Sync>;

/// A running daemon.
pub struct Daemon {
    pub state: Arc<DaemonState>,
    stop: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
    drains: Vec<JoinHandle<Result<(), String>>>,
    writers: Vec<JoinHandle<Result<(), String>>>,
    retention: Option<JoinHandle<()>>,
    retention_stop: Arc<crate::retention::Stop>,
    query: Option<crate::query::QueryServer>,
    metrics_http: Option<crate::metrics::MetricsListener>,
    syslog: Option<crate::syslog::SyslogListener>,
    live: Arc<crate::config::live::LiveConfig>,
    _watch: Option<crate::config::watch::FileWatch>,
    lock: DataDirLock,
}

/// The rings the drains read: the attached CPU rings (ordinals 0..C) and,
/// last, eventd's own syslog ring.
struct Rings {
    cpus: Vec<AttachedRing>,
    syslog: Option<Arc<Ring>>,
}

impl Rings {
    /// Every drained ring in ordinal order.
    fn all(&self) -> impl Iterator<Item = &Arc<Ring>> {
        self.cpus.iter().map(|r| &r.ring).chain(self.syslog.iter())
    }

    fn count(&self) -> usize {
        self.cpus.len() + usize::from(self.syslog.is_some())
    }
}

impl Daemon {
    /// Starts eventd with `settings`; returns once every thread runs.
    pub fn start(
        settings: &Settings,
        tunables: Tunables,
        on_failure: FailureHook,
    ) -> Result<Daemon, DaemonError> {
        // An explicit capacity is checked before anything is created.
        if let Some(capacity) = tunables.channel {
            drop(HandoffChannel::<Handoff>::new(capacity)?);
        }
        settings.check_paths()?;
        let policy = Policy::new(&settings.query_group, &settings.producer_group)?;
        prepare_directories(settings, &policy)?;
        let lock = DataDirLock::acquire(
            &settings.run_dir,
            &[&settings.store_dir, &settings.kmes_dir],
        )?;
        match lock.previous {
            PreviousRun::Clean => {}
            PreviousRun::Killed => {
                tracing::warn!("the previous eventd did not stop cleanly; recovering")
            }
            PreviousRun::KilledEarlierBoot => tracing::warn!(
                "the previous eventd did not stop cleanly and the machine restarted since; \
                 recovering from every receipt (shards may have lost their last commits)"
            ),
        }

        let rings = attach_rings(settings, &policy)?;
        let shards = routing::shard_count(settings.storage_shards, rings.cpus.len())?;

        // R2, before any database is opened: everything queries will see is
        // the existing databases plus the active shards about to be created.
        let shard_paths: Vec<PathBuf> = (0..shards)
            .map(|j| store::shard_path(&settings.store_dir, j))
            .collect();
        let mut visible: BTreeSet<PathBuf> = store::list_databases(&settings.store_dir)?
            .into_iter()
            .collect();
        visible.extend(shard_paths.iter().cloned());
        let limit = routing::soft_descriptor_limit().map_err(DaemonError::Limit)?;
        let needed = routing::check_descriptors(
            settings.max_concurrent_queries,
            visible.len() as u64,
            rings.count() as u64,
            limit,
        )?;
        tracing::info!(
            rings = rings.cpus.len(),
            syslog_ring = rings.syslog.is_some(),
            shards,
            databases = visible.len(),
            store = %settings.store_dir.display(),
            descriptor_allowance = needed,
            descriptor_soft_limit = limit,
            "rings attached, shards planned"
        );

        let shard_mode = policy.mode(access::Kind::Shard);
        let mut health_paths = Vec::with_capacity(shards);
        let mut connections = Vec::with_capacity(shards);
        let mut damaged = Vec::new();
        for j in 0..shards {
            let opened = open_active_shard(&settings.store_dir, j, shard_mode)?;
            health_paths.push(opened.path);
            connections.push(opened.conn);
            damaged.extend(opened.damaged.map(|d| (d, j)));
        }
        let health = Arc::new(StoreHealth::new(
            health_paths.clone(),
            &settings.store_dir,
            shard_mode,
        ));
        for (d, j) in damaged {
            health.mark_damaged(d, Some(j));
        }
        let shard_paths = health_paths;

        // Recovery (R6, R7): every database, old ones included (those just
        // made in place of damaged ones too).
        let mut all: BTreeSet<PathBuf> = visible;
        all.extend(shard_paths.iter().cloned());
        let all: Vec<PathBuf> = all.into_iter().collect();
        let (mut receipts, left_out) =
            ReceiptReader::open(&all, lock.previous != PreviousRun::KilledEarlierBoot);
        for (path, why) in left_out {
            tracing::error!(
                database = %path.display(),
                reason = %why,
                "receipts left out of recovery: events committed there may be stored again"
            );
            if !why.starts_with("not trusted") {
                health.mark_damaged(
                    Damaged {
                        path,
                        reason: why,
                        found_at: crate::rings::now_ns(),
                        replaced_by: None,
                    },
                    None,
                );
            }
        }
        let mut plans = Vec::with_capacity(rings.count());
        for ring in rings.all() {
            let (plan, failed) = receipts.plan(ring.epoch());
            for e in failed {
                tracing::error!(error = %e, "receipts left out of recovery");
            }
            plans.push(plan);
        }
        drop(receipts);
        for (ring, plan) in rings.all().zip(&plans) {
            // Sequences the reader passed over before the last stop, not
            // committed anywhere: stored as a gap before anything else.
            let lost_before_resume = plan
                .resume
                .next_seq
                .saturating_sub(plan.committed_through + 1);
            tracing::info!(
                cpu = ring.cpu(),
                ring = %ring.path().display(),
                epoch = %format_args!("{:016x}", ring.epoch()),
                committed_through = plan.committed_through,
                resume_seq = plan.resume.next_seq,
                committed_runs_above = plan.above.len(),
                lost_before_resume,
                "ring recovered"
            );
        }
        let trackers: Arc<[CommitTracker]> = rings
            .all()
            .zip(&plans)
            .map(|(r, p)| CommitTracker::new(r.epoch(), p.committed_through, &p.above))
            .collect();

        let mut assignment = routing::assign(rings.cpus.len(), shards);
        if rings.syslog.is_some() {
            assignment.push((0..shards).collect());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::new(AtomicBool::new(false));
        let max_batch = Arc::new(AtomicU64::new(settings.max_batch_size));
        let failing_writers = Arc::new(AtomicU64::new(0));

        let shared = WriterShared {
            max_batch: max_batch.clone(),
            trackers: trackers.clone(),
            stopping: stopping.clone(),
            failing: failing_writers.clone(),
            health: health.clone(),
            store_dir: settings.store_dir.clone(),
            mode: shard_mode,
        };
        let mut senders = Vec::with_capacity(shards);
        let mut writers = Vec::with_capacity(shards);
        let mut writer_stats = Vec::with_capacity(shards);
        let mut channels = Vec::with_capacity(shards);
        let mut active = Vec::with_capacity(shards);
        for (j, conn) in connections.into_iter().enumerate() {
            let (tx, rx) = HandoffChannel::new(tunables.channel_for(shards))?;
            let control = Arc::new(store::control::WriterControl::default());
            active.push(ActiveShard {
                path: shard_paths[j].clone(),
                tx: tx.clone(),
                control: control.clone(),
            });
            senders.push(tx);
            channels.push(rx.monitor());
            let stats = Arc::new(WriterStats::default());
            writer_stats.push(stats.clone());
            let writer = ShardWriter::new(
                j,
                shard_paths[j].clone(),
                conn,
                rx,
                shared.clone(),
                stats,
                control,
            );
            let hook = on_failure.clone();
            writers.push(spawn(format!("writer-{j:03}"), move || {
                watch(&hook, format!("writer of shard {j}"), || writer.run())
            })?);
        }

        let current: Vec<Arc<CurrentRing>> = rings
            .all()
            .map(|r| Arc::new(CurrentRing::new(r.clone())))
            .collect();
        let syslog_drops = Arc::new(crate::syslog::Drops::default());
        let kmes = KmesDir::new(&settings.kmes_dir);
        let mut drains = Vec::with_capacity(rings.count());
        let mut drain_stats = Vec::with_capacity(rings.count());
        for (ordinal, (ring, plan)) in rings.all().zip(&plans).enumerate() {
            let is_syslog = ordinal >= rings.cpus.len();
            let owned = assignment[ordinal].clone();
            let mut mine = vec![None; shards];
            for &j in &owned {
                mine[j] = Some(senders[j].clone());
            }
            let stats = Arc::new(DrainStats::default());
            drain_stats.push(stats.clone());
            let reader = RingReader::resume(ring.clone(), plan.resume);
            let maker = RingMaker {
                path: ring.path().to_path_buf(),
                geometry: ring.geometry(),
                cpu: ring.cpu(),
                mode: if is_syslog {
                    access::Mode::PRIVATE
                } else {
                    policy.mode(access::Kind::Ring)
                },
            };
            let parts = DrainParts {
                senders: mine,
                stop: stop.clone(),
                stats,
                current: current[ordinal].clone(),
                trackers: trackers.clone(),
                maker,
                drops: is_syslog.then(|| syslog_drops.clone()),
            };
            let drain = DrainThread::new(
                ordinal as u32,
                reader,
                StripeRouter::new(owned, tunables.stripe_len),
                plan,
                parts,
            );
            let hook = on_failure.clone();
            let (name, what) = if is_syslog {
                (
                    "drain-syslog".to_string(),
                    "drain of the syslog ring".to_string(),
                )
            } else {
                (
                    format!("drain-{:03}", ring.cpu()),
                    format!("drain of cpu {}", ring.cpu()),
                )
            };
            drains.push(spawn(name, move || watch(&hook, what, || drain.run()))?);
        }
        // Only the drains and the retention coordinator hold senders now:
        // when they stop, writers finish.
        drop(senders);

        let retention_stats = Arc::new(RetentionStats::default());
        let state = Arc::new(DaemonState {
            rings: current,
            drains: drain_stats,
            writers: writer_stats,
            channels,
            shard_paths,
            assignment,
            max_batch,
            needed_descriptors: needed,
            trackers,
            retention: retention_stats.clone(),
            queries: Arc::new(crate::query::QueryStats::default()),
            syslog: Arc::new(crate::syslog::SyslogStats::default()),
            syslog_drops,
            syslog_ring: rings.syslog.as_ref().map(|_| rings.cpus.len()),
            failing_writers,
            policy,
            health,
        });
        let live = Arc::new(crate::config::live::LiveConfig::new(
            settings.config_file.clone(),
            settings.clone(),
            state.max_batch.clone(),
        ));
        let retention_stop = Arc::new(crate::retention::Stop::default());
        let epochs: crate::retention::EpochSource = {
            let state = state.clone();
            Box::new(move || ring_epochs(kmes.path(), &state.rings))
        };
        let coordinator = RetentionCoordinator::new(
            crate::retention::Inputs {
                store_dir: settings.store_dir.clone(),
                active,
                live: live.clone(),
                epochs,
                health: state.health.clone(),
            },
            retention_stats,
            retention_stop.clone(),
            tunables.retention_interval,
        );
        let retention = spawn("retention".to_string(), move || coordinator.run())?;
        let watch = match &settings.config_file {
            Some(file) => {
                let l = live.clone();
                match crate::config::watch::FileWatch::start(file, move || l.reload()) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        tracing::warn!(
                            file = %file.display(),
                            error = %e,
                            "cannot watch the configuration file; SIGHUP still reloads it"
                        );
                        None
                    }
                }
            }
            None => None,
        };
        let reporter: crate::query::server::Reporter = {
            let state = state.clone();
            let settings = settings.clone();
            let live = live.clone();
            Arc::new(move |request| report::answer(&state, &settings, &live, request))
        };
        let mut daemon = Daemon {
            state,
            stop,
            stopping,
            drains,
            writers,
            retention: Some(retention),
            retention_stop,
            query: None,
            metrics_http: None,
            syslog: None,
            live,
            _watch: watch,
            lock,
        };
        // The threads run from here on: a failure stops and joins them
        // before it is returned, so nothing writes after the lock is gone.
        match daemon.serve(settings, reporter) {
            Ok(()) => Ok(daemon),
            Err(e) => {
                let _ = daemon.join();
                Err(e)
            }
        }
    }

    /// Opens the query socket and the metrics listener, then says the
    /// daemon is ready (the pid file's last step).
    fn serve(
        &mut self,
        settings: &Settings,
        reporter: crate::query::server::Reporter,
    ) -> Result<(), DaemonError> {
        let policy = self.state.policy;
        let query = crate::query::QueryServer::start(
            crate::query::server::ServerOptions {
                run_dir: settings.run_dir.clone(),
                store_dir: settings.store_dir.clone(),
                max_queries: settings.max_concurrent_queries,
                access: crate::query::Access {
                    grant: policy.query,
                },
                mode: policy.mode(access::Kind::QuerySocket),
                health: Some(self.state.health.clone()),
            },
            reporter,
            self.state.queries.clone(),
        )
        .map_err(|source| DaemonError::Query {
            path: settings.run_dir.clone(),
            source,
        })?;
        self.query = Some(query);
        if let Some(addr) = settings.metrics_listen {
            let state = self.state.clone();
            let render: crate::metrics::http::Render = Arc::new(move || metrics::render(&state));
            let listener = crate::metrics::MetricsListener::start(addr, render)
                .map_err(|source| DaemonError::Metrics { addr, source })?;
            tracing::info!(addr = %listener.addr(), "metrics served at /metrics");
            self.metrics_http = Some(listener);
        }
        if let Some(ordinal) = self.state.syslog_ring {
            let syslog = crate::syslog::SyslogConfig {
                datagram: settings.syslog_socket.clone(),
                stream: settings.syslog_stream_socket.clone(),
                receive: settings.syslog_receive,
            };
            let parts = crate::syslog::IngestParts {
                ring: self.state.rings[ordinal].clone(),
                store_failing: self.state.failing_writers.clone(),
                drops: self.state.syslog_drops.clone(),
            };
            self.syslog = Some(crate::syslog::SyslogListener::start(
                &syslog,
                parts,
                self.state.syslog.clone(),
            )?);
        }
        self.lock.mark_ready()?;
        Ok(())
    }

    /// Reads the configuration file again (SIGHUP; the file watch does the
    /// same on its own): live keys apply, restart-only keys are deferred.
    pub fn reload(&self) {
        self.live.reload();
    }

    /// Asks every thread to finish; [`join`](Self::join) waits for them.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.stopping.store(true, Ordering::Relaxed);
        self.retention_stop.stop();
        for ring in &self.state.rings {
            ring.get().wake_reader();
        }
    }

    /// Stops (if not asked yet) and waits for every thread: drains first,
    /// then writers, which commit everything they were handed.
    pub fn join(mut self) -> Result<(), DaemonError> {
        // No new queries; running ones end when their connection does.
        drop(self.query.take());
        // No new syslog messages: the receivers stop before the drains, so
        // what they put in the rings is drained (or stays for the next
        // start).
        drop(self.syslog.take());
        self.stop();
        let mut failures = Vec::new();
        // The coordinator holds senders of every channel: it goes first.
        if let Some(handle) = self.retention.take() {
            if handle.join().is_err() {
                failures.push("the retention coordinator panicked".to_string());
            }
        }
        for handle in self.drains.into_iter().chain(self.writers) {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(e),
                // `watch` catches panics; this is only reached if the hook
                // itself panicked.
                Err(_) => failures.push("a thread's failure hook panicked".to_string()),
            }
        }
        drop(self.lock);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(DaemonError::Threads(failures.join("; ")))
        }
    }
}

/// The epochs of every ring that exists: the drained ones (as they are now:
/// a drain may have replaced its ring) and any other ring file in the KMES
/// directory (a CPU now offline, a ring that failed to attach). Retention
/// never deletes their receipts. `None` if some ring file's epoch cannot be
/// read: then no receipt is deleted at all.
fn ring_epochs(kmes_dir: &Path, drained: &[Arc<CurrentRing>]) -> Option<Vec<u64>> {
    let drained: Vec<Arc<Ring>> = drained.iter().map(|c| c.get()).collect();
    let mut epochs: Vec<u64> = drained.iter().map(|r| r.epoch()).collect();
    let entries = std::fs::read_dir(kmes_dir).ok()?;
    for entry in entries {
        let path = entry.ok()?.path();
        let is_ring = path.extension().is_some_and(|x| x == "ring");
        if !is_ring || drained.iter().any(|r| r.path() == path) {
            continue;
        }
        match Ring::open(&path, None) {
            Ok(ring) => epochs.push(ring.epoch()),
            Err(e) => {
                tracing::warn!(
                    ring = %path.display(),
                    error = %e,
                    "cannot read this ring's epoch: retention keeps every receipt"
                );
                return None;
            }
        }
    }
    Some(epochs)
}

/// An active shard's file, opened.
struct ActiveFile {
    path: PathBuf,
    conn: rusqlite::Connection,
    /// The newest file before it, if that one was found damaged.
    damaged: Option<Damaged>,
}

/// Opens shard `j`'s newest file; if it is damaged or not eventd's (see
/// [`store::open_shard_with`]), leaves it as it is and makes the next
/// generation. Anything else (a newer schema, an I/O error) stops start-up.
fn open_active_shard(
    store_dir: &Path,
    j: usize,
    mode: access::Mode,
) -> Result<ActiveFile, DaemonError> {
    let path = store::shard_path(store_dir, j);
    let opened = match store::recorded_damage(&path) {
        // Given up before (its marker says why): never written again.
        Some(reason) => Err(StoreError::Damaged {
            path: path.clone(),
            reason: format!("found damaged before: {reason}"),
        }),
        None => store::open_shard_with(&path, mode),
    };
    let reason = match opened {
        Ok(conn) => {
            return Ok(ActiveFile {
                path,
                conn,
                damaged: None,
            })
        }
        Err(e @ (StoreError::Damaged { .. } | StoreError::Untrusted { .. })) => e.to_string(),
        Err(e) => return Err(e.into()),
    };
    let next = store::next_shard_path(store_dir, j, &path);
    let conn = store::open_shard_with(&next, mode)?;
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
    Ok(ActiveFile {
        path: next,
        conn,
        damaged: Some(damaged),
    })
}

/// Gives eventd's directories the modes and groups of `policy` (creating
/// them if missing), whatever the umask, and makes everything eventd
/// creates from now on start private (its mode is set explicitly). Then
/// checks, by identity, that the directories are four different ones.
fn prepare_directories(settings: &Settings, policy: &Policy) -> Result<(), DaemonError> {
    use access::Kind;
    access::files::restrict_umask();
    for (dir, kind) in [
        (&settings.data_dir, Kind::PublicDir),
        (&settings.run_dir, Kind::PublicDir),
        (&settings.store_dir, Kind::StoreDir),
        (&settings.kmes_dir, Kind::KmesDir),
    ] {
        access::files::ensure_dir(dir, policy.mode(kind))?;
    }
    let identity = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok()
    };
    let dirs = [
        ("StoreDir", &settings.store_dir),
        ("KmesDir", &settings.kmes_dir),
        ("RunDir", &settings.run_dir),
    ];
    for (i, (ka, a)) in dirs.iter().enumerate() {
        for (kb, b) in &dirs[i + 1..] {
            if identity(a).is_some() && identity(a) == identity(b) {
                return Err(crate::config::ConfigError::Paths {
                    first: ka,
                    first_path: a.to_path_buf(),
                    second: kb,
                    second_path: b.to_path_buf(),
                    problem: "are the same directory (through a symbolic link)",
                }
                .into());
            }
        }
    }
    Ok(())
}

/// Attaches the ring of every online CPU (creating missing ones with the
/// producer mode, mending or replacing unusable ones) and, if a syslog
/// socket is on, eventd's own syslog ring.
fn attach_rings(settings: &Settings, policy: &Policy) -> Result<Rings, DaemonError> {
    let kmes = KmesDir::new(&settings.kmes_dir);
    let attached = kmes.attach_all(
        &online_cpus(),
        settings.ring_bytes as usize,
        policy.mode(access::Kind::Ring),
    )?;
    for (cpu, repair) in &attached.repairs {
        tracing::warn!(cpu, repair = %repair, "ring mended at attach");
    }
    for (cpu, error) in &attached.failures {
        tracing::error!(cpu, error = %error, "ring not attached; its events are not collected");
    }
    if attached.rings.is_empty() {
        return Err(match attached.failures.into_iter().next() {
            Some((_, e)) => e.into(),
            None => RoutingError::NoRings.into(),
        });
    }
    let syslog_on = settings.syslog_socket.is_some() || settings.syslog_stream_socket.is_some();
    let syslog = if syslog_on {
        let mut repairs = Vec::new();
        let ring = kmes.attach_syslog(settings.ring_bytes as usize, &mut repairs);
        for repair in &repairs {
            tracing::warn!(repair = %repair, "syslog ring mended at attach");
        }
        Some(Arc::new(ring?))
    } else {
        None
    };
    Ok(Rings {
        cpus: attached.rings,
        syslog,
    })
}

/// How a ring is named in metrics labels: its cpu id, or "syslog" for
/// eventd's own syslog ring.
pub(crate) fn ring_label(cpu: u32) -> String {
    if cpu == crate::rings::SYSLOG_RING_CPU {
        "syslog".to_string()
    } else {
        cpu.to_string()
    }
}

/// Runs a thread's body; reports an error or a panic to the hook at once
/// (and still returns it for `join`).
fn watch<E: std::fmt::Display>(
    hook: &FailureHook,
    what: String,
    body: impl FnOnce() -> Result<(), E>,
) -> Result<(), String> {
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => format!("{what} stopped: {e}"),
        Err(_) => format!("{what} panicked"),
    };
    tracing::error!(error = %outcome, "thread stopped; eventd stops too");
    hook(&outcome);
    Err(outcome)
}

fn spawn<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>, DaemonError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(DaemonError::Spawn)
}
