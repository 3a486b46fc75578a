//! What a shard writer counts and measures, for `eventctl stats`, the
//! metrics and the load harness.

use crate::metrics::buckets::{self, Buckets};
use hdrhistogram::Histogram;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// Counters a writer keeps for `eventctl stats` and the load harness.
/// Relaxed everywhere: monitoring only.
#[derive(Debug, Default)]
pub struct WriterStats {
    pub events: AtomicU64,
    /// Bytes of the committed events' provider, name, message and fields
    /// columns, as stored.
    pub event_bytes: AtomicU64,
    /// Sequence numbers stored as gaps.
    pub lost: AtomicU64,
    pub commits: AtomicU64,
    pub batch_max: AtomicU64,
    pub commit_errors: AtomicU64,
    pub last_error: Mutex<Option<String>>,
    /// The file the writer writes now (a new generation after damage).
    pub path: Mutex<PathBuf>,
    /// Files of this shard given up as damaged.
    pub damaged_files: AtomicU64,
    /// Checkpoints the writer ran itself, and their time in all (µs).
    pub checkpoints: AtomicU64,
    pub checkpoint_us: AtomicU64,
    /// Emit-to-commit latency of every event (µs) and items per commit.
    pub histograms: Mutex<WriterHistograms>,
}

impl WriterStats {
    pub(super) fn record_checkpoint(&self, took: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        self.checkpoints.fetch_add(1, Relaxed);
        self.checkpoint_us
            .fetch_add(took.as_micros().min(u64::MAX as u128) as u64, Relaxed);
    }
}

/// Significant figures of the writers' histograms.
const HISTOGRAM_SIGFIG: u8 = 2;

/// Distributions a writer records once per commit.
#[derive(Debug)]
pub struct WriterHistograms {
    /// From the event's timestamp to its commit returning, in µs.
    pub latency_us: Histogram<u64>,
    /// Items (events and gaps) per commit.
    pub batch_items: Histogram<u64>,
    /// How long each commit's transaction took, in µs.
    pub commit_us: Histogram<u64>,
    /// The same three as the metrics' buckets, exact at every bound: the
    /// hdrhistograms above answer quantiles, but their slots above 255
    /// hold several values (256 and 257 share one), so a bucket read from
    /// them could count values above its bound.
    pub latency_buckets: Buckets,
    pub batch_items_buckets: Buckets,
    pub commit_buckets: Buckets,
}

impl WriterHistograms {
    /// One event's emit-to-commit latency, in µs.
    pub(super) fn record_latency(&mut self, us: u64) {
        self.latency_us.saturating_record(us);
        self.latency_buckets.record(us);
    }

    /// One commit: its items, and its transaction's time in µs.
    pub(super) fn record_commit(&mut self, items: u64, us: u64) {
        self.batch_items.saturating_record(items);
        self.batch_items_buckets.record(items);
        self.commit_us.saturating_record(us);
        self.commit_buckets.record(us);
    }
}

impl Default for WriterHistograms {
    fn default() -> Self {
        // Bounds are constants within hdrhistogram's limits (low >= 1,
        // high >= 2 * low, sigfig <= 5), so construction cannot fail.
        // Two significant figures (1 % resolution, plenty for quantiles):
        // about 20 KiB each instead of 190 KiB with three, which with 256
        // shards was 140 MiB of the daemon's memory.
        WriterHistograms {
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, HISTOGRAM_SIGFIG)
                .expect("valid constant bounds"),
            batch_items: Histogram::new_with_bounds(1, 10_000_000, HISTOGRAM_SIGFIG)
                .expect("valid constant bounds"),
            commit_us: Histogram::new_with_bounds(1, 3_600_000_000, HISTOGRAM_SIGFIG)
                .expect("valid constant bounds"),
            latency_buckets: Buckets::new(buckets::SECONDS_FROM_US),
            batch_items_buckets: Buckets::new(buckets::ITEMS),
            commit_buckets: Buckets::new(buckets::SECONDS_FROM_US),
        }
    }
}
