//! What the export stage reports (`eventctl export status`, the
//! `eventd_export_*` metrics): per shard file and table, how far it got and
//! how far behind it is, and what its batches met.

use super::state::Table;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// One table of one shard file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StreamStatus {
    /// Every row with an id at or below this is in the cluster.
    pub exported_through: i64,
    /// The newest row's id in the shard.
    pub newest_id: i64,
    /// Rows not exported yet (from the ids: exact while none were deleted
    /// unexported).
    pub lag_rows: u64,
    /// Age of the oldest row not exported yet (its `ts`, or `detected_at`
    /// for gaps), seconds; 0 when nothing waits.
    pub lag_seconds: f64,
    /// Batches the cluster accepted on their first send.
    pub batches_sent: u64,
    pub rows_sent: u64,
    /// Batches whose send failed or was cut short, then found in the
    /// cluster whole: nothing resent.
    pub batches_deduplicated: u64,
    /// Batches found missing (wholly or in part) after a failure, and
    /// sent again: only their missing rows.
    pub batches_resent: u64,
    pub rows_resent: u64,
    /// The batch being sent or checked, `[lo, hi]` ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<[i64; 2]>,
}

/// One shard file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SourceStatus {
    pub file: String,
    /// Its instance id (the `source` column in ClickHouse).
    pub instance: String,
    /// "exporting", "idle", "retrying", "not exported: ...".
    pub state: String,
    pub events: StreamStatus,
    pub gaps: StreamStatus,
    /// Failed sends and checks in a row (0 once one succeeds).
    pub failures: u64,
    /// Times reads of the file were held to let its WAL start over
    /// (`walroom`).
    #[serde(default)]
    pub wal_holds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it happened, ns since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<i64>,
}

impl SourceStatus {
    pub fn stream(&mut self, table: Table) -> &mut StreamStatus {
        match table {
            Table::Events => &mut self.events,
            Table::Gaps => &mut self.gaps,
        }
    }
}

/// What the cluster (or the single server) said about itself.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClusterStatus {
    pub version: String,
    /// `single` (one server's MergeTree tables) or `cluster` (Distributed).
    #[serde(default)]
    pub layout: String,
    /// The cluster's name ("" for a single server).
    pub cluster: String,
    /// Replicas of every shard (0 for a single server).
    pub replicas: usize,
    /// The shard this host's rows go to, from 1, and how many replicas it
    /// has: the ones its checks wait for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    #[serde(default)]
    pub shard_replicas: usize,
    /// Resends also carry `insert_deduplication_token` (22.2 and later).
    pub dedup_token: bool,
}

/// The whole stage's report.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExportReport {
    pub host: String,
    pub url: String,
    pub database: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
    /// By file name.
    pub shards: Vec<SourceStatus>,
}

/// Shared between the export workers and monitoring.
#[derive(Debug, Default)]
pub struct ExportStatus {
    head: Mutex<ExportReport>,
    /// By instance id.
    sources: Mutex<BTreeMap<String, SourceStatus>>,
}

impl ExportStatus {
    /// The report of a stage exporting to `url` (shown without any
    /// credentials it holds).
    pub fn new(host: &str, url: &str, database: &str) -> Self {
        ExportStatus {
            head: Mutex::new(ExportReport {
                host: host.to_string(),
                url: crate::redact::url(url),
                database: database.to_string(),
                ..ExportReport::default()
            }),
            sources: Mutex::default(),
        }
    }

    /// Changes `instance`'s status (made if new).
    pub fn update(&self, instance: &str, f: impl FnOnce(&mut SourceStatus)) {
        // Every update is a plain field change: a poisoned map is usable.
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        let entry = sources
            .entry(instance.to_string())
            .or_insert_with(|| SourceStatus {
                instance: instance.to_string(),
                ..SourceStatus::default()
            });
        f(entry);
    }

    /// Forgets `instance` (its file is gone).
    pub fn remove(&self, instance: &str) {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(instance);
    }

    pub fn set_cluster(&self, cluster: Option<ClusterStatus>) {
        self.head.lock().unwrap_or_else(|p| p.into_inner()).cluster = cluster;
    }

    pub fn report(&self) -> ExportReport {
        let mut report = self.head.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut shards: Vec<SourceStatus> = self
            .sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        shards.sort_by(|a, b| a.file.cmp(&b.file).then(a.instance.cmp(&b.instance)));
        report.shards = shards;
        report
    }
}
