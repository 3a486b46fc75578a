//! The daemon: start-up as a list of named steps, the threads it runs, and
//! shutdown.
//!
//! [`Daemon::start`] reads as the steps `docs/design/storage.md` numbers: check
//! the settings and prepare the directories (access), lock the data
//! directory, attach the rings (R4 ordinals), plan the shards (R1) and the
//! descriptors (R2), open the active shards (R12), plan each ring's resume
//! point from the receipts of every database (R6, R7), start the writers
//! (R8) and the drains (R5, R9), then the services (retention, the
//! configuration watch, the query server, metrics, syslog). The stages
//! start their own threads (`store::spawn_writers`, `drain::spawn_drains`);
//! if a step fails once threads run, they are stopped and joined before the
//! error is returned.
//!
//! Shutdown: the listeners close, the drains stop reading; when the last
//! sender of a channel is dropped its writer commits what is left and
//! closes its database.

pub mod activation;
mod lock;
mod metrics;
pub mod notify;
mod report;
pub mod signals;
mod sources;
mod state;
mod steps;
mod tunables;
pub mod watchdog;

pub use crate::threads::FailureHook;
pub use activation::Activation;
pub use lock::{DataDirLock, PreviousRun};
pub use sources::SourceState;
pub use state::{DaemonState, RingState, ShardState};
pub use tunables::Tunables;

use crate::access;
use crate::config::Settings;
use crate::drain::{self, CommitTracker, DrainSpec};
use crate::retention::{ActiveShard, RetentionCoordinator, RetentionStats};
use crate::rings::RingError;
use crate::routing::RoutingError;
use crate::store::{self, StoreError, WriterShared};
use crate::threads::{join_all, Watched};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use steps::Rings;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Lock(#[from] lock::LockError),
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
    #[error(transparent)]
    Writers(#[from] store::active::SpawnError),
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
    #[error(transparent)]
    Export(#[from] crate::export::ExportError),
}

/// A running daemon.
pub struct Daemon {
    pub state: Arc<DaemonState>,
    stop: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
    drains: Vec<Watched>,
    writers: Vec<Watched>,
    retention: Option<JoinHandle<()>>,
    retention_stop: Arc<crate::retention::Stop>,
    /// How far the export stage got, for retention (export on only).
    export_floors: Option<Arc<crate::store::retention::ExportFloors>>,
    exporter: Option<crate::export::Exporter>,
    query: Option<crate::query::QueryServer>,
    metrics_http: Option<crate::metrics::MetricsListener>,
    syslog: Option<crate::syslog::SyslogListener>,
    /// The kernel log reader (and the boot marker, at start).
    sources: Option<sources::Running>,
    live: Arc<crate::config::live::LiveConfig>,
    _watch: Option<crate::config::watch::FileWatch>,
    /// Gives freed memory back to the kernel (see `threads::Trimmer`).
    _trim: Option<crate::threads::Trimmer>,
    lock: DataDirLock,
}

/// What the writers and drains share, made before either starts.
struct Shared {
    /// Set at shutdown: the drains stop reading.
    stop: Arc<AtomicBool>,
    /// Every writer's share (MaxBatchSize, the trackers, the failing
    /// count, the store's health, where new generations go).
    writer: WriterShared,
    syslog_drops: Arc<crate::rings::drops::Drops>,
    /// The rate limits the drains apply (live) and what they suppressed.
    limits: Arc<drain::RateLimits>,
    suppression: Arc<drain::Suppression>,
}

/// What the daemon is built with besides the started threads.
struct Assembly {
    policy: access::Policy,
    needed_descriptors: u64,
    max_queries: u64,
    syslog_ring: Option<usize>,
    /// The shards each drained ring sends to, by ordinal.
    assignment: Vec<Vec<usize>>,
}

impl Daemon {
    /// Starts eventd with `settings`; returns once every thread runs.
    pub fn start(
        settings: &Settings,
        tunables: Tunables,
        on_failure: FailureHook,
    ) -> Result<Daemon, DaemonError> {
        Self::start_with(settings, tunables, on_failure, Activation::default())
    }

    /// As [`start`](Self::start), serving the sockets the service manager
    /// passed (`sockets`) besides, or instead of, the configured ones.
    pub fn start_with(
        settings: &Settings,
        tunables: Tunables,
        on_failure: FailureHook,
        sockets: Activation,
    ) -> Result<Daemon, DaemonError> {
        // 1. Paths and access: refused before anything is made.
        let policy = steps::check_settings(settings, &tunables)?;
        steps::prepare_directories(settings, &policy)?;
        // 2. One daemon per data directory.
        let lock = steps::lock_data_dir(settings)?;
        // eventd's reckoning of time, before any commit reads it (retention
        // judges age by it; it goes on from an earlier start in this boot).
        store::retention::reckoning::start(&settings.run_dir);
        // 3. The rings (R4 ordinals), eventd's syslog ring last.
        let syslog_on = settings.syslog_socket.is_some()
            || settings.syslog_stream_socket.is_some()
            || settings.stdout_socket.is_some()
            || !sockets.syslog.is_empty();
        let rings = steps::attach_rings(settings, &policy, &tunables.cpus(), syslog_on)?;
        // 4, 5. The shard count (R1) and the descriptor allowance (R2).
        let layout = steps::plan_shards(settings, &rings)?;
        // 6. The active shards' files (R12; damaged ones left, moved past).
        let shard_mode = policy.mode(access::Kind::Shard);
        store::schema::size_writer_caches(layout.shards);
        let active = store::open_shards(&settings.store_dir, layout.shards, shard_mode)?;
        steps::migrate_historical(settings, &active.health);
        // 7. Where each ring resumes, from every database's receipts (R6, R7).
        let databases = layout.with_files(active.files.iter().map(|(p, _)| p));
        let trust = lock.previous != PreviousRun::KilledEarlierBoot;
        let plans = store::recovery::plan_rings(&databases, &rings.all(), trust, &active.health);

        // 8. One writer per shard (R8), each with its channel (R9).
        let shared = Shared::new(settings, &rings, &plans, active.health.clone(), shard_mode);
        let capacity = tunables.channel_for(layout.shards);
        let writers = store::spawn_writers(active.files, &shared.writer, capacity, &on_failure)?;
        // 9. One drain per ring, striping over its shards (R4, R5).
        let assignment = steps::assignment(&rings, layout.shards);
        let specs = drain_specs(&rings, plans, &assignment, &policy, &shared);
        let (writers, drains) = start_drains(specs, writers, &tunables, &shared, &on_failure)?;
        // 10. The services; a failure now stops and joins every thread.
        let syslog_ring = rings.syslog.as_ref().map(|_| rings.cpus.len());
        let parts = Assembly {
            policy,
            needed_descriptors: layout.needed_descriptors,
            max_queries: layout.max_queries,
            syslog_ring,
            assignment,
        };
        let (mut daemon, active) = Daemon::assemble(settings, lock, shared, writers, drains, parts);
        match daemon.start_services(settings, &tunables, active, &on_failure, sockets) {
            Ok(()) => Ok(daemon),
            Err(e) => {
                let _ = daemon.join();
                Err(e)
            }
        }
    }

    /// The running daemon from its started parts, and the active shards as
    /// retention reaches them (through their writers).
    fn assemble(
        settings: &Settings,
        lock: DataDirLock,
        shared: Shared,
        writers: store::Writers,
        drains: drain::Drains,
        parts: Assembly,
    ) -> (Daemon, Vec<ActiveShard>) {
        let mut shards = Vec::with_capacity(writers.shards.len());
        let mut active = Vec::with_capacity(writers.shards.len());
        for w in writers.shards {
            shards.push(ShardState {
                writer: w.stats,
                channel: w.channel,
            });
            active.push(ActiveShard {
                path: w.path,
                tx: w.tx,
                control: w.control,
            });
        }
        let trackers = shared.writer.trackers.clone();
        let rings = drains
            .rings
            .into_iter()
            .zip(parts.assignment)
            .enumerate()
            .map(|(o, ((current, stats), owned))| {
                RingState::new(o, current, stats, owned, trackers.clone())
            })
            .collect();
        let state = Arc::new(DaemonState {
            rings,
            shards,
            syslog_ring: parts.syslog_ring,
            max_batch: shared.writer.max_batch.clone(),
            needed_descriptors: parts.needed_descriptors,
            max_concurrent_queries: parts.max_queries,
            retention: Arc::new(RetentionStats::default()),
            queries: Arc::new(crate::query::QueryStats::default()),
            syslog: Arc::new(crate::syslog::SyslogStats::default()),
            syslog_drops: shared.syslog_drops.clone(),
            suppression: shared.suppression.clone(),
            sources: SourceState::default(),
            failing_writers: shared.writer.failing.clone(),
            policy: parts.policy,
            health: shared.writer.health.clone(),
            export: settings.export.as_ref().map(|e| {
                Arc::new(crate::export::ExportStatus::new(
                    &settings.host_name,
                    &e.url,
                    &e.database,
                ))
            }),
        });
        let live = Arc::new(crate::config::live::LiveConfig::new(
            settings.config_file.clone(),
            settings.clone(),
            state.max_batch.clone(),
        ));
        let limits = shared.limits.clone();
        live.on_reload(Box::new(move |s| set_rate_limits(&limits, &s.rate_limit)));
        let daemon = Daemon {
            state,
            stop: shared.stop,
            stopping: shared.writer.stopping.clone(),
            drains: drains.threads,
            writers: writers.threads,
            retention: None,
            retention_stop: Arc::new(crate::retention::Stop::default()),
            export_floors: settings.export.as_ref().map(|_| Arc::default()),
            exporter: None,
            query: None,
            metrics_http: None,
            syslog: None,
            sources: None,
            live,
            _watch: None,
            _trim: None,
            lock,
        };
        (daemon, active)
    }

    /// Starts the services beside the data path: retention (which holds
    /// the only senders left besides the drains'), the configuration
    /// watch, the query server, the metrics listener and the syslog
    /// listener; then says the daemon is ready (the pid file's last step).
    fn start_services(
        &mut self,
        settings: &Settings,
        tunables: &Tunables,
        active: Vec<ActiveShard>,
        hook: &FailureHook,
        mut sockets: Activation,
    ) -> Result<(), DaemonError> {
        // A passed stream socket at StdoutSocket's path is that socket.
        let stdout = settings
            .stdout_socket
            .as_deref()
            .and_then(|path| sockets.syslog.take_stream_at(path));
        sockets.log();
        self.start_export(settings, tunables, hook)?;
        self.start_retention(settings, tunables, active)?;
        self._watch = watch_config(settings, &self.live);
        self._trim = crate::threads::Trimmer::start();
        self.start_query_server(settings, sockets.query.map(|p| p.socket))?;
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
                passed: sockets.syslog,
            };
            let parts = crate::syslog::IngestParts {
                ring: self.state.rings[ordinal].current.clone(),
                store_failing: self.state.failing_writers.clone(),
                drops: self.state.syslog_drops.clone(),
                senders: self.state.sources.senders.clone(),
            };
            self.syslog = Some(crate::syslog::SyslogListener::start(
                syslog,
                parts,
                self.state.syslog.clone(),
            )?);
        }
        self.sources = Some(sources::start(settings, &self.state, stdout)?);
        self.lock.mark_ready()?;
        Ok(())
    }

    /// Starts the export stage, when `ExportUrl` is set: its workers read
    /// the shards read-only and never wait on the write path.
    fn start_export(
        &mut self,
        settings: &Settings,
        tunables: &Tunables,
        hook: &FailureHook,
    ) -> Result<(), DaemonError> {
        let (Some(export), Some(status), Some(floors)) = (
            settings.export.clone(),
            self.state.export.clone(),
            self.export_floors.clone(),
        ) else {
            return Ok(());
        };
        let mut t = tunables.export;
        if t.workers == 0 {
            t.workers = self.state.shards.len().clamp(1, crate::export::WORKERS_MAX);
        }
        let policy = self.state.policy;
        let live = Arc::new(crate::export::live::LiveExport::new(export.clone()));
        let handle = live.clone();
        self.live.on_reload(Box::new(move |s| {
            if let Some(e) = &s.export {
                handle.set(e.clone());
            }
        }));
        // A reload taken before the applier was registered.
        if let Some(e) = self.live.state().effective.export {
            live.set(e);
        }
        let inputs = crate::export::ExportInputs {
            data_dir: settings.data_dir.clone(),
            store_dir: settings.store_dir.clone(),
            host: settings.host_name.clone(),
            settings: export,
            live,
            health: self.state.health.clone(),
            floors,
            status,
            state_mode: (
                policy.mode(access::Kind::ExportDir),
                policy.mode(access::Kind::ExportState),
            ),
        };
        self.exporter = Some(crate::export::Exporter::start(inputs, t, hook)?);
        Ok(())
    }

    fn start_retention(
        &mut self,
        settings: &Settings,
        tunables: &Tunables,
        active: Vec<ActiveShard>,
    ) -> Result<(), DaemonError> {
        let epochs: crate::retention::EpochSource = {
            let (state, kmes) = (self.state.clone(), settings.kmes_dir.clone());
            Box::new(move || {
                let current: Vec<_> = state.rings.iter().map(|r| r.current.clone()).collect();
                steps::ring_epochs(&kmes, &current)
            })
        };
        let coordinator = RetentionCoordinator::new(
            crate::retention::Inputs {
                store_dir: settings.store_dir.clone(),
                active,
                live: self.live.clone(),
                epochs,
                health: self.state.health.clone(),
                export: self.export_floors.clone(),
            },
            self.state.retention.clone(),
            self.retention_stop.clone(),
            tunables.retention_interval,
        );
        let retention = std::thread::Builder::new()
            .name("retention".to_string())
            .spawn(move || coordinator.run())
            .map_err(DaemonError::Spawn)?;
        self.retention = Some(retention);
        Ok(())
    }

    fn start_query_server(
        &mut self,
        settings: &Settings,
        passed: Option<std::os::unix::net::UnixListener>,
    ) -> Result<(), DaemonError> {
        let policy = self.state.policy;
        let reporter: crate::query::server::Reporter = {
            let state = self.state.clone();
            let settings = settings.clone();
            let live = self.live.clone();
            Arc::new(move |request| report::answer(&state, &settings, &live, request))
        };
        let query = crate::query::QueryServer::start(
            crate::query::server::ServerOptions {
                run_dir: settings.run_dir.clone(),
                store_dir: settings.store_dir.clone(),
                max_queries: self.state.max_concurrent_queries,
                access: crate::query::Access {
                    grant: policy.query,
                },
                mode: policy.mode(access::Kind::QuerySocket),
                health: Some(self.state.health.clone()),
                passed,
            },
            reporter,
            self.state.queries.clone(),
        )
        .map_err(|source| DaemonError::Query {
            path: settings.run_dir.clone(),
            source,
        })?;
        self.query = Some(query);
        Ok(())
    }

    /// Reads the configuration file again (SIGHUP; the file watch does the
    /// same on its own): live keys apply, restart-only keys are deferred.
    pub fn reload(&self) {
        self.live.reload();
    }

    /// Asks every thread to finish; [`join`](Self::join) waits for them.
    pub fn stop(&self) {
        // Relaxed: the flags only ask threads to finish; nothing is
        // published through them.
        self.stop.store(true, Ordering::Relaxed);
        self.stopping.store(true, Ordering::Relaxed);
        self.retention_stop.stop();
        if let Some(e) = &self.exporter {
            e.stop();
        }
        for ring in &self.state.rings {
            ring.ring().wake_reader();
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
        drop(self.sources.take());
        self.stop();
        let mut failures = Vec::new();
        if let Some(mut exporter) = self.exporter.take() {
            exporter.stop_and_join(&mut failures);
        }
        // The coordinator holds senders of every channel: it goes first.
        if let Some(handle) = self.retention.take() {
            if handle.join().is_err() {
                failures.push("the retention coordinator panicked".to_string());
            }
        }
        join_all(
            self.drains.drain(..).chain(self.writers.drain(..)),
            &mut failures,
        );
        drop(self.lock);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(DaemonError::Threads(failures.join("; ")))
        }
    }
}

impl Shared {
    /// The flags, counters and commit trackers (seeded from the recovery
    /// plans, R6) the writers and drains will share.
    fn new(
        settings: &Settings,
        rings: &Rings,
        plans: &[drain::RingPlan],
        health: Arc<store::StoreHealth>,
        mode: access::Mode,
    ) -> Shared {
        let trackers = rings
            .all()
            .iter()
            .zip(plans)
            .map(|(r, p)| CommitTracker::new(r.epoch(), p.committed_through, &p.above))
            .collect();
        Shared {
            stop: Arc::new(AtomicBool::new(false)),
            writer: WriterShared {
                max_batch: Arc::new(AtomicU64::new(settings.max_batch_size)),
                trackers,
                stopping: Arc::new(AtomicBool::new(false)),
                failing: Arc::new(AtomicU64::new(0)),
                health,
                store_dir: settings.store_dir.clone(),
                mode,
                batches: Arc::default(),
                query_indexes: settings.query_indexes.clone().into(),
            },
            syslog_drops: Arc::new(crate::rings::drops::Drops::default()),
            limits: {
                let limits = Arc::new(drain::RateLimits::new(0, 0));
                set_rate_limits(&limits, &settings.rate_limit);
                limits
            },
            suppression: Arc::default(),
        }
    }
}

/// Starts the drains; if they cannot all be started, the writers are ended
/// too (their senders dropped) and joined before the error is returned.
fn start_drains(
    specs: Vec<DrainSpec>,
    writers: store::Writers,
    tunables: &Tunables,
    shared: &Shared,
    hook: &FailureHook,
) -> Result<(store::Writers, drain::Drains), DaemonError> {
    let senders: Vec<_> = writers.shards.iter().map(|w| w.tx.clone()).collect();
    let started = drain::spawn_drains(
        specs,
        &drain::spawn::Shared {
            senders: &senders,
            stripe_len: tunables.stripe_len,
            stop: &shared.stop,
            trackers: &shared.writer.trackers,
            hook,
            limits: &shared.limits,
            suppression: &shared.suppression,
        },
    );
    drop(senders);
    match started {
        Ok(drains) => Ok((writers, drains)),
        Err(e) => {
            let threads = writers.threads;
            drop(writers.shards);
            join_all(threads, &mut Vec::new());
            Err(DaemonError::Spawn(e))
        }
    }
}

/// What each drain starts from: its ring, its plan, its shards (R4), how it
/// makes a new ring, and (the syslog ring's drain) the drop reports.
fn drain_specs(
    rings: &Rings,
    plans: Vec<drain::RingPlan>,
    assignment: &[Vec<usize>],
    policy: &access::Policy,
    shared: &Shared,
) -> Vec<DrainSpec> {
    rings
        .all()
        .into_iter()
        .zip(plans)
        .zip(assignment)
        .map(|((ring, plan), shards)| DrainSpec {
            maker: Rings::maker(&ring, policy),
            drops: (ring.cpu() == crate::rings::SYSLOG_RING_CPU)
                .then(|| shared.syslog_drops.clone()),
            ring,
            plan,
            shards: shards.clone(),
        })
        .collect()
}

/// Watches the configuration file, if there is one (a watch that cannot be
/// set up is logged; SIGHUP still reloads).
fn watch_config(
    settings: &Settings,
    live: &Arc<crate::config::live::LiveConfig>,
) -> Option<crate::config::watch::FileWatch> {
    let file = settings.config_file.as_ref()?;
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

/// How a ring is named in metrics labels: its cpu id, or "syslog" and
/// "kernel" for eventd's own rings.
pub(crate) fn ring_label(cpu: u32) -> String {
    if crate::rings::is_own_ring(cpu) {
        crate::rings::ring_name(cpu).into_owned()
    } else {
        cpu.to_string()
    }
}

/// Hands the configured rate limits (the global one and the overrides) to
/// the drains.
fn set_rate_limits(limits: &drain::RateLimits, configured: &crate::config::rate::RateLimit) {
    use crate::config::rate::OverrideSource;
    let (interval_ms, burst) = configured.as_ms_and_burst();
    limits.set(interval_ms, burst);
    limits.set_overrides(
        configured
            .overrides
            .iter()
            .map(|o| drain::SourceLimit {
                matches: match &o.source {
                    OverrideSource::Provider(p) => drain::Matches::Provider(p.clone()),
                    OverrideSource::Unit(u) => drain::Matches::Unit(u.clone()),
                    OverrideSource::Uid(uid) => drain::Matches::Uid(*uid),
                },
                interval_ms: o.interval.as_millis() as u64,
                burst: o.burst,
            })
            .collect(),
    );
}
