//! What the running daemon shares with monitoring (`eventctl stats`, the
//! metrics, the load harness): one [`RingState`] per drained ring and one
//! [`ShardState`] per active shard, and the daemon-wide counters.

use crate::access::Policy;
use crate::channel::ChannelMonitor;
use crate::drain::{CommitTracker, DrainStats, Handoff};
use crate::retention::RetentionStats;
use crate::rings::{CurrentRing, Ring};
use crate::store::{StoreHealth, WriterStats};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// One drained ring, by ordinal: the attached CPU rings, then eventd's own
/// syslog ring (if a syslog socket is on).
pub struct RingState {
    /// The ring now (a drain replaces an unusable ring with a new one).
    pub current: Arc<CurrentRing>,
    pub drain: Arc<DrainStats>,
    /// The shards its drain sends to (R4; the syslog ring's drain: all).
    pub shards: Vec<usize>,
    ordinal: usize,
    trackers: Arc<[CommitTracker]>,
}

impl RingState {
    pub fn new(
        ordinal: usize,
        current: Arc<CurrentRing>,
        drain: Arc<DrainStats>,
        shards: Vec<usize>,
        trackers: Arc<[CommitTracker]>,
    ) -> Self {
        RingState {
            current,
            drain,
            shards,
            ordinal,
            trackers,
        }
    }

    /// The ring now.
    pub fn ring(&self) -> Arc<Ring> {
        self.current.get()
    }

    /// Every sequence number of the ring's current epoch at or below this
    /// is committed or stored as a gap.
    pub fn committed_through(&self) -> u64 {
        self.trackers[self.ordinal].watermark(self.ring().epoch())
    }
}

/// One active shard, by index.
pub struct ShardState {
    /// Its writer's counters (and the file it writes now).
    pub writer: Arc<WriterStats>,
    pub channel: ChannelMonitor<Handoff>,
}

/// What the daemon shares with monitoring.
pub struct DaemonState {
    pub rings: Vec<RingState>,
    pub shards: Vec<ShardState>,
    /// The ordinal of eventd's own syslog ring, if a syslog socket is on.
    pub syslog_ring: Option<usize>,
    /// Live MaxBatchSize (R11: changes the next commit threshold only).
    pub max_batch: Arc<AtomicU64>,
    pub needed_descriptors: u64,
    /// MaxConcurrentQueries as served: the setting, or its default lowered
    /// to fit the descriptor limit.
    pub max_concurrent_queries: u64,
    pub retention: Arc<RetentionStats>,
    pub queries: Arc<crate::query::QueryStats>,
    pub syslog: Arc<crate::syslog::SyslogStats>,
    pub syslog_drops: Arc<crate::rings::drops::Drops>,
    /// What the drains' rate limits suppressed, and from whom most.
    pub suppression: Arc<crate::drain::Suppression>,
    /// The kernel log and the senders' cache.
    pub sources: super::SourceState,
    /// Shard writers whose commits fail now.
    pub failing_writers: Arc<AtomicU64>,
    pub policy: Policy,
    /// Damaged shard files, and each active shard's file now.
    pub health: Arc<StoreHealth>,
    /// The export stage's report, when export is on.
    pub export: Option<Arc<crate::export::ExportStatus>>,
}
