//! The eventd binary `eventd-perf limits` runs against (both halves, with
//! and without a flood): started with the limits on or off, waited on
//! until its rings carry the limit, and read back through its stats and
//! shard files.

use crate::pipeline::{self, Knobs};
use crate::system::{Running, SystemKind};
use anyhow::{ensure, Context};
use eventd::rings::Ring;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A running eventd binary with the limits on (the defaults) or off.
pub(crate) struct Daemon {
    pub(crate) running: Running,
    pub(crate) data_dir: PathBuf,
    pub(crate) rings: Vec<Arc<Ring>>,
    // Removed when the run is over.
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts the binary in a fresh directory under `work` and waits until
    /// every CPU ring carries the limit its drain publishes (the producers'
    /// budgets follow it from their first events).
    /// Without `query_indexes`, `QueryIndexes = []`.
    pub(crate) fn start(
        work: &Path,
        eventd: &Path,
        on: bool,
        query_indexes: bool,
    ) -> anyhow::Result<Daemon> {
        let dir = tempfile::Builder::new()
            .prefix("limits-")
            .tempdir_in(work)?;
        let (mut settings, tunables) = pipeline::configure(dir.path(), Knobs::defaults(), None)?;
        if on {
            settings.rate_limit = eventd::config::rate::RateLimit::from_file(None, None)?;
        }
        if !query_indexes {
            settings.query_indexes.clear();
        }
        let (interval_ms, burst) = settings.rate_limit.as_ms_and_burst();
        let data_dir = settings.data_dir.clone();
        let running = Running::start(&SystemKind::Binary, eventd, &settings, tunables)?;
        let rings = running.rings()?;
        ensure!(!rings.is_empty(), "eventd made no CPU rings");
        let deadline = Instant::now() + Duration::from_secs(30);
        // Off, a drain publishes 0 for both.
        let want = if interval_ms > 0 && burst > 0 {
            (interval_ms, burst)
        } else {
            (0, 0)
        };
        while !rings.iter().all(|r| {
            r.rate_limit()
                .is_some_and(|l| (l.interval_ms, l.burst) == want)
        }) {
            ensure!(
                Instant::now() < deadline,
                "eventd did not publish its rate limit in its rings"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Daemon {
            running,
            data_dir,
            rings,
            _dir: dir,
        })
    }

    /// `eventctl stats`'s `stats` object, asked over the query socket.
    pub(crate) fn stats(&self) -> anyhow::Result<serde_json::Value> {
        let mut out = serde_json::Value::Null;
        eventd::query::client::call(
            &self.data_dir.join("run/query.sock"),
            &eventd::query::Request::Stats,
            |v| {
                out = v["stats"].clone();
                Ok(true)
            },
        )?;
        Ok(out)
    }

    /// A number of `stats.rate_limits`.
    pub(crate) fn rate_limit_stat(&self, key: &str) -> anyhow::Result<u64> {
        let stats = self.stats()?;
        stats["rate_limits"][key]
            .as_u64()
            .with_context(|| format!("stats.rate_limits.{key} in {stats}"))
    }

    /// Read-only connections to every shard file.
    pub(crate) fn shards(&self) -> anyhow::Result<Vec<rusqlite::Connection>> {
        let mut out = Vec::new();
        for path in eventd::store::list_databases(&self.data_dir.join("store"))? {
            out.push(eventd::store::open_read_only(&path)?);
        }
        Ok(out)
    }

    pub(crate) fn stop(self) -> anyhow::Result<()> {
        drop(self.rings);
        self.running.stop()
    }
}

/// The sum over every shard of `sql`'s one number.
pub(crate) fn sum(shards: &[rusqlite::Connection], sql: &str) -> anyhow::Result<u64> {
    let mut total = 0u64;
    for c in shards {
        total += c.query_row(sql, [], |r| r.get::<_, i64>(0))?.max(0) as u64;
    }
    Ok(total)
}
