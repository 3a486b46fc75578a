//! Reloading the configuration while eventd runs (R11, R13).
//!
//! A reload reads the file again and validates it whole. If it is invalid,
//! the running configuration stays and the log says why. Otherwise live keys
//! apply at once ([`LIVE_KEYS`]; MaxBatchSize: the writers' next commit
//! threshold, never a channel; RateLimitInterval and RateLimitBurst, for the
//! drains' next windows; the retention limits; the export keys but
//! ExportUrl and ExportDatabase, from the next batch), and restart-only keys
//! (StorageShards, the directories, RingBytes, MaxConcurrentQueries,
//! QueryIndexes, QueryGroup, ProducerGroup, MetricsListen, the syslog keys, HostName,
//! ExportUrl, ExportDatabase) are deferred: logged once and shown by
//! `eventctl config` until the next start.

use super::{ConfigFile, Settings};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The keys a reload applies at once (every other key waits for a
/// restart). `docs/reference/config.md` says the same, checked by a test.
pub const LIVE_KEYS: &[&str] = &[
    "MaxBatchSize",
    "RateLimitInterval",
    "RateLimitBurst",
    "RateLimitOverrides",
    "RetentionMaxAge",
    "RetentionMaxBytes",
    "ExportBatchRows",
    "ExportNice",
    "ExportUser",
    "ExportPasswordFile",
    "ExportCAFile",
    "ExportCertFile",
    "ExportKeyFile",
];

/// The configuration as it runs, and what waits for a restart.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveState {
    pub effective: Settings,
    /// One line per restart-only key whose file value differs from the
    /// running one.
    pub deferred: Vec<String>,
    /// Why the last reload was refused, if it was.
    pub last_error: Option<String>,
}

/// Applies reloads of one configuration file to a running daemon.
pub struct LiveConfig {
    file: Option<PathBuf>,
    data_dir: PathBuf,
    state: Mutex<LiveState>,
    /// The writers read MaxBatchSize from here before each batch.
    max_batch: Arc<AtomicU64>,
    /// The stages' own live handles, each given the settings after every
    /// reload that was taken ([`LiveConfig::on_reload`]).
    appliers: Mutex<Vec<Applier>>,
}

/// Writes the live part of the settings into one stage's handle.
pub type Applier = Box<dyn Fn(&Settings) + Send + Sync>;

impl LiveConfig {
    pub fn new(file: Option<PathBuf>, settings: Settings, max_batch: Arc<AtomicU64>) -> Self {
        LiveConfig {
            file,
            data_dir: settings.data_dir.clone(),
            state: Mutex::new(LiveState {
                effective: settings,
                deferred: Vec::new(),
                last_error: None,
            }),
            max_batch,
            appliers: Mutex::new(Vec::new()),
        }
    }

    fn apply(&self, effective: &Settings) {
        for apply in self
            .appliers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            apply(effective);
        }
    }

    /// Gives `apply` the running settings after every reload that is
    /// taken: how a stage (the export) gets its live keys without reading
    /// this loader.
    pub fn on_reload(&self, apply: Applier) {
        self.appliers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(apply);
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    pub fn state(&self) -> LiveState {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LiveState> {
        // Every update below is a whole assignment; a poisoned lock still
        // holds a consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the file again and applies it. Without a file (embedded
    /// defaults) there is nothing to reload.
    pub fn reload(&self) {
        let Some(file) = &self.file else {
            tracing::info!("reload: eventd runs with embedded defaults; no file to read");
            return;
        };
        let new = match ConfigFile::load(file).and_then(|f| f.resolve(&self.data_dir)) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(file = %file.display(), error = %e, "reload refused; the running configuration stays");
                self.lock().last_error = Some(e.to_string());
                return;
            }
        };
        let mut state = self.lock();
        state.last_error = None;
        let old = state.effective.clone();
        if new.max_batch_size != old.max_batch_size {
            // Relaxed: the writers only need the new value eventually; it
            // guards nothing else.
            self.max_batch.store(new.max_batch_size, Ordering::Relaxed);
            tracing::info!(
                from = old.max_batch_size,
                to = new.max_batch_size,
                "MaxBatchSize changed: applies to the next commits; channels unchanged"
            );
            state.effective.max_batch_size = new.max_batch_size;
        }
        if new.retention_max_age != old.retention_max_age
            || new.retention_max_bytes != old.retention_max_bytes
        {
            tracing::info!(
                max_age = ?new.retention_max_age,
                max_bytes = ?new.retention_max_bytes,
                "retention limits changed; they apply at the next retention pass"
            );
            state.effective.retention_max_age = new.retention_max_age;
            state.effective.retention_max_bytes = new.retention_max_bytes;
        }
        if let Some(live) = live_export(&old, &new) {
            state.effective.export = Some(live);
        }
        if let Some(limit) = live_rate_limit(&old, &new) {
            state.effective.rate_limit = limit;
        }
        let deferred = restart_only_changes(&state.effective, &new);
        for line in deferred.iter().filter(|l| !state.deferred.contains(l)) {
            tracing::warn!(change = %line, "deferred to the next restart");
        }
        state.deferred = deferred;
        // Under the state's lock, so two reloads apply in the order they
        // were taken; an applier only takes its own handle's lock.
        self.apply(&state.effective);
        tracing::info!(
            file = %file.display(),
            deferred = state.deferred.len(),
            "configuration reloaded"
        );
    }
}

/// The export keys to run with after a reload from `old` to `new`, when a
/// live one changed: the live keys apply even when a restart-only one
/// (ExportUrl, ExportDatabase) changed too; that one alone is deferred.
fn live_export(old: &Settings, new: &Settings) -> Option<super::ExportSettings> {
    let (Some(old), Some(new)) = (&old.export, &new.export) else {
        return None;
    };
    let live = super::ExportSettings {
        url: old.url.clone(),
        database: old.database.clone(),
        ..new.clone()
    };
    if &live == old {
        return None;
    }
    tracing::info!(
        batch_rows = live.batch_rows,
        user = ?live.user,
        "export settings changed; they apply to the next batches"
    );
    Some(live)
}

/// RateLimitInterval, RateLimitBurst and RateLimitOverrides after a
/// reload, when they changed; the drains get them through their handle
/// ([`LiveConfig::on_reload`]).
fn live_rate_limit(old: &Settings, new: &Settings) -> Option<super::rate::RateLimit> {
    if new.rate_limit == old.rate_limit {
        return None;
    }
    let (interval_ms, burst) = new.rate_limit.as_ms_and_burst();
    tracing::info!(
        interval_ms,
        burst,
        overrides = new.rate_limit.overrides.len(),
        "rate limits changed: windows opened from now on use them"
    );
    Some(new.rate_limit.clone())
}

/// Restart-only keys whose value in `file` differs from the running one.
fn restart_only_changes(running: &Settings, file: &Settings) -> Vec<String> {
    let mut changes = Vec::new();
    let mut check = |key: &str, running: String, file: String| {
        if running != file {
            changes.push(format!("{key}: running {running}, file says {file}"));
        }
    };
    check(
        "StorageShards",
        running.storage_shards.to_string(),
        file.storage_shards.to_string(),
    );
    check(
        "MaxConcurrentQueries",
        running.max_concurrent_queries.to_string(),
        file.max_concurrent_queries.to_string(),
    );
    check(
        "RingBytes",
        running.ring_bytes.to_string(),
        file.ring_bytes.to_string(),
    );
    check(
        "StoreDir",
        running.store_dir.display().to_string(),
        file.store_dir.display().to_string(),
    );
    check(
        "KmesDir",
        running.kmes_dir.display().to_string(),
        file.kmes_dir.display().to_string(),
    );
    check(
        "RunDir",
        running.run_dir.display().to_string(),
        file.run_dir.display().to_string(),
    );
    check(
        "QueryGroup",
        running.query_group.clone(),
        file.query_group.clone(),
    );
    check(
        "ProducerGroup",
        running.producer_group.clone(),
        file.producer_group.clone(),
    );
    let listen = |s: &Settings| {
        s.metrics_listen
            .map_or("unset".to_string(), |a| a.to_string())
    };
    check("MetricsListen", listen(running), listen(file));
    let path = |p: &Option<PathBuf>| {
        p.as_ref()
            .map_or("off".to_string(), |p| p.display().to_string())
    };
    check(
        "SyslogSocket",
        path(&running.syslog_socket),
        path(&file.syslog_socket),
    );
    check(
        "SyslogStreamSocket",
        path(&running.syslog_stream_socket),
        path(&file.syslog_stream_socket),
    );
    check(
        "StdoutSocket",
        path(&running.stdout_socket),
        path(&file.stdout_socket),
    );
    check(
        "KernelLog",
        running.kernel_log.to_string(),
        file.kernel_log.to_string(),
    );
    check(
        "HostName",
        running.host_name.clone(),
        file.host_name.clone(),
    );
    let export = |s: &Settings, f: fn(&super::ExportSettings) -> String| {
        s.export.as_ref().map_or("unset".to_string(), f)
    };
    check(
        "ExportUrl",
        export(running, |e| e.url.clone()),
        export(file, |e| e.url.clone()),
    );
    check(
        "ExportDatabase",
        export(running, |e| e.database.clone()),
        export(file, |e| e.database.clone()),
    );
    let indexes = |s: &Settings| {
        let labels: Vec<String> = s.query_indexes.iter().map(|q| q.label()).collect();
        format!("[{}]", labels.join(", "))
    };
    check("QueryIndexes", indexes(running), indexes(file));
    check(
        "SyslogReceive",
        format!("{:?}", running.syslog_receive),
        format!("{:?}", file.syslog_receive),
    );
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(dir: &Path, text: &str) -> (LiveConfig, PathBuf) {
        let file = dir.join("eventd.toml");
        std::fs::write(&file, text).unwrap();
        let settings = ConfigFile::load(&file).unwrap().resolve(dir).unwrap();
        let max_batch = Arc::new(AtomicU64::new(settings.max_batch_size));
        (
            LiveConfig::new(Some(file.clone()), settings, max_batch),
            file,
        )
    }

    #[test]
    fn r11_max_batch_size_applies_live() {
        let dir = tempfile::tempdir().unwrap();
        let (live, file) = live(dir.path(), "MaxBatchSize = 100\n");
        std::fs::write(&file, "MaxBatchSize = 7\n").unwrap();
        live.reload();
        assert_eq!(live.max_batch.load(Ordering::Relaxed), 7);
        assert_eq!(live.state().effective.max_batch_size, 7);
        assert!(live.state().deferred.is_empty());
    }

    #[test]
    fn rate_limits_reach_the_stages_through_on_reload() {
        let dir = tempfile::tempdir().unwrap();
        let (live, file) = live(dir.path(), "RateLimitBurst = 100\n");
        let seen = Arc::new(Mutex::new(None));
        let into = seen.clone();
        live.on_reload(Box::new(move |s: &Settings| {
            *into.lock().unwrap() = Some(s.rate_limit.as_ms_and_burst());
        }));
        std::fs::write(&file, "RateLimitInterval = \"5s\"\nRateLimitBurst = 7\n").unwrap();
        live.reload();
        assert_eq!(*seen.lock().unwrap(), Some((5_000, 7)));
        assert_eq!(
            live.state().effective.rate_limit.as_ms_and_burst(),
            (5_000, 7)
        );
        std::fs::write(&file, "RateLimitBurst = 0\n").unwrap();
        live.reload();
        assert_eq!(seen.lock().unwrap().unwrap().1, 0, "0 turns the limits off");
        assert!(live.state().deferred.is_empty());
        // The overrides are live too.
        std::fs::write(
            &file,
            "RateLimitOverrides = [{ Unit = \"a.service\", Burst = 5 }]\n",
        )
        .unwrap();
        live.reload();
        assert_eq!(live.state().effective.rate_limit.overrides.len(), 1);
        assert_eq!(*seen.lock().unwrap(), Some((30_000, 10_000)));
        assert!(live.state().deferred.is_empty());
    }

    #[test]
    fn r13_storage_shards_is_deferred_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (live, file) = live(dir.path(), "StorageShards = 2\n");
        std::fs::write(&file, "StorageShards = 8\nMaxBatchSize = 9\n").unwrap();
        live.reload();
        let state = live.state();
        assert_eq!(state.effective.storage_shards, 2);
        assert_eq!(state.effective.max_batch_size, 9);
        assert_eq!(state.deferred, ["StorageShards: running 2, file says 8"]);
        // Changing the file back clears it.
        std::fs::write(&file, "StorageShards = 2\n").unwrap();
        live.reload();
        assert!(live.state().deferred.is_empty());
    }

    #[test]
    fn an_invalid_reload_keeps_the_running_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let (live, file) = live(dir.path(), "MaxBatchSize = 100\n");
        std::fs::write(&file, "MaxBatchSize = 0\n").unwrap();
        live.reload();
        assert_eq!(live.max_batch.load(Ordering::Relaxed), 100);
        let state = live.state();
        assert_eq!(state.effective.max_batch_size, 100);
        assert!(state.last_error.unwrap().contains("MaxBatchSize = 0"));
    }

    #[test]
    fn query_indexes_are_deferred_to_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let (live, file) = live(dir.path(), "");
        std::fs::write(&file, "QueryIndexes = [\"name\"]\n").unwrap();
        live.reload();
        let state = live.state();
        assert_eq!(
            state.deferred,
            vec!["QueryIndexes: running [provider], file says [name]".to_string()]
        );
        assert_eq!(
            state.effective.query_indexes,
            crate::config::query_indexes_default()
        );
    }

    #[test]
    fn export_live_keys_apply_beside_a_deferred_url() {
        let dir = tempfile::tempdir().unwrap();
        let (live, file) = live(
            dir.path(),
            "ExportUrl = \"http://127.0.0.1:8123/\"\nExportBatchRows = 100\n",
        );
        std::fs::write(
            &file,
            "ExportUrl = \"http://127.0.0.1:9999/\"\nExportBatchRows = 7\nExportUser = \"u\"\n",
        )
        .unwrap();
        live.reload();
        let state = live.state();
        let export = state.effective.export.unwrap();
        assert_eq!(export.url, "http://127.0.0.1:8123/");
        assert_eq!((export.batch_rows, export.user.as_deref()), (7, Some("u")));
        assert_eq!(state.deferred.len(), 1, "{:?}", state.deferred);
        assert!(state.deferred[0].starts_with("ExportUrl"));
    }
}
