//! eventd as a peer of the syslog comparison: started with rate limits off, its
//! stored rows counted by a query.

use super::process::{run_cmd, sigterm, start_logged};
use crate::running::Running;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub(super) struct Eventd {
    pub(super) child: Child,
    pub(super) data: PathBuf,
    /// Events committed before the bench sent anything (eventd's boot
    /// marker).
    pub(super) before: u64,
}

pub(super) fn start_eventd(
    binary: &Path,
    dir: &Path,
    config: Option<&Path>,
) -> anyhow::Result<Eventd> {
    let data = dir.join("data");
    let log = dir.join("eventd.log");
    let mut cmd = Command::new(binary);
    // The peers run with their rate limits off (the bench is one sender):
    // so does eventd, unless the caller gives its own configuration.
    let unlimited = dir.join("eventd.toml");
    let config = match config {
        Some(c) => c,
        None => {
            std::fs::write(&unlimited, "RateLimitBurst = 0\n")?;
            &unlimited
        }
    };
    cmd.arg("--config").arg(config);
    let child = start_logged(
        cmd.arg("--data-dir").arg(&data),
        &log,
        &binary.display().to_string(),
        &[data.join("run/query.sock"), data.join("run/syslog.sock")],
    )?;
    let mut eventd = Eventd {
        child,
        data,
        before: 0,
    };
    // Its boot marker, committed before the bench starts counting.
    let deadline = Instant::now() + Duration::from_secs(30);
    while eventd.stored()? == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    eventd.before = eventd.stored()?;
    Ok(eventd)
}

impl Running for Eventd {
    fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn socket(&self) -> PathBuf {
        self.data.join("run/syslog.sock")
    }

    fn stored(&mut self) -> anyhow::Result<u64> {
        // The writers' committed counts, from the daemon.
        let mut total = 0;
        eventd::query::client::call(
            &self.data.join("run/query.sock"),
            &eventd::query::Request::Stats,
            |v| {
                total = v["stats"]["shards"]
                    .as_array()
                    .map_or(0, |a| a.iter().filter_map(|s| s["events"].as_u64()).sum());
                Ok(true)
            },
        )?;
        Ok(total.saturating_sub(self.before))
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        sigterm(&mut self.child)
    }
}

/// Every row in the shard files, and whether a query finds one message.
pub(super) fn check_eventd(data: &Path, eventctl: &Path, n: u64) -> anyhow::Result<(u64, bool)> {
    let mut rows = 0u64;
    for path in eventd::store::list_databases(&data.join("store"))? {
        let c = rusqlite::Connection::open(&path)?;
        rows += c.query_row(
            "SELECT count(*) FROM events WHERE provider = 'bench'",
            [],
            |r| r.get::<_, i64>(0),
        )? as u64;
    }
    let probe = format!("message {:07} ", n / 2);
    let out = run_cmd(Command::new(eventctl).arg("--data-dir").arg(data).args([
        "query",
        "--offline",
        "--output",
        "json",
        "--grep",
        &probe,
    ]))?;
    Ok((
        rows,
        out.lines().count() == 1 && out.contains(probe.trim_end()),
    ))
}

// ---- rsyslog ----
