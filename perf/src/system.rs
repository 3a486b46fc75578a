//! The system under test: eventd's pipeline in this process, or the
//! `eventd` binary as a child process; and the producers: threads of this
//! process or separate processes.

use crate::load::{self, Counts, Mode, Sizes};
use eventd::config::Settings;
use eventd::daemon::{Daemon, DaemonState, Tunables};
use eventd::export::format::Format;
use eventd::export::ExportReport;
use eventd::rings::Ring;
use eventd::store::writer::WriterHistograms;
use hdrhistogram::Histogram;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum SystemKind {
    /// `eventd::daemon::Daemon` in this process.
    InProcess,
    /// The `eventd` binary, started with `--data-dir` and a config file.
    Binary,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum ProducerKind {
    Threads,
    Processes,
}

/// What is measured once the load is over.
pub struct Finished {
    pub latency_us: Histogram<u64>,
    pub batch_items: Histogram<u64>,
    pub commits: u64,
    /// `None` when the system does not expose it (the binary).
    pub channel_full_stalls: Option<u64>,
    pub peak_rss_mib: f64,
    pub descriptors: usize,
    pub shards: usize,
}

pub enum Running {
    InProcess {
        // Boxed: a Daemon is much larger than the other variant.
        daemon: Box<Daemon>,
        state: Arc<DaemonState>,
    },
    Binary {
        child: Child,
        data_dir: PathBuf,
    },
}

impl Running {
    pub fn start(
        kind: &SystemKind,
        eventd: &Path,
        settings: &Settings,
        tunables: Tunables,
    ) -> anyhow::Result<Running> {
        match kind {
            SystemKind::InProcess => {
                let hook: eventd::daemon::FailureHook =
                    Arc::new(|what: &str| eprintln!("eventd failed: {what}"));
                let daemon = Daemon::start(settings, tunables, hook)?;
                let state = daemon.state.clone();
                Ok(Running::InProcess {
                    daemon: Box::new(daemon),
                    state,
                })
            }
            SystemKind::Binary => {
                let data_dir = settings.data_dir.clone();
                std::fs::create_dir_all(&data_dir)?;
                let config = data_dir.join("perf.toml");
                let mut text = format!(
                    "StorageShards = {}\nMaxBatchSize = {}\nMaxConcurrentQueries = {}\n",
                    settings.storage_shards,
                    settings.max_batch_size,
                    settings.max_concurrent_queries
                );
                // Entries are columns or `fields.KEY` with a plain key:
                // nothing in them needs escaping in a TOML string.
                let indexes: Vec<String> = settings
                    .query_indexes
                    .iter()
                    .map(|q| format!("\"{}\"", q.label()))
                    .collect();
                text.push_str(&format!("QueryIndexes = [{}]\n", indexes.join(", ")));
                // A socket that is off is written off ("").
                for (key, socket) in [
                    ("SyslogSocket", &settings.syslog_socket),
                    ("SyslogStreamSocket", &settings.syslog_stream_socket),
                    ("StdoutSocket", &settings.stdout_socket),
                ] {
                    if socket.is_none() {
                        text.push_str(&format!("{key} = \"\"\n"));
                    }
                }
                let (interval_ms, burst) = settings.rate_limit.as_ms_and_burst();
                text.push_str(&format!(
                    "RateLimitInterval = \"{}\"\nRateLimitBurst = {burst}\n",
                    if interval_ms == 0 {
                        "0".to_string()
                    } else {
                        format!("{interval_ms}ms")
                    }
                ));
                let mut cmd = Command::new(eventd);
                if let Some(e) = &settings.export {
                    // TOML basic strings: the harness's own names and URLs,
                    // without quotes or backslashes.
                    text.push_str(&format!(
                        "HostName = \"{}\"\nExportUrl = \"{}\"\nExportDatabase = \"{}\"\n\
                         ExportBatchRows = {}\nExportNice = {}\n",
                        settings.host_name, e.url, e.database, e.batch_rows, e.nice
                    ));
                    cmd.arg("--export-format")
                        .arg(match tunables.export.format {
                            Format::RowBinary => "row-binary",
                            Format::JsonEachRow => "json-each-row",
                        });
                }
                std::fs::write(&config, text)?;
                let log = std::fs::File::create(data_dir.join("eventd.log"))?;
                if let Some(c) = tunables.channel {
                    cmd.arg("--channel-slots")
                        .arg(c.slots.to_string())
                        .arg("--channel-bytes")
                        .arg(c.bytes.to_string());
                }
                if let Some(n) = tunables.simulated_cpus {
                    cmd.arg("--simulate-cpus").arg(n.to_string());
                }
                let mut child = cmd
                    .arg("--data-dir")
                    .arg(&data_dir)
                    .arg("--config")
                    .arg(&config)
                    .arg("--stripe-len")
                    .arg(tunables.stripe_len.to_string())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .map_err(|e| anyhow::anyhow!("starting {}: {e}", eventd.display()))?;
                let pid_file = data_dir.join("run/eventd.pid");
                let deadline = Instant::now() + Duration::from_secs(60);
                while std::fs::read_to_string(&pid_file).map_or(true, |s| {
                    s.split_whitespace().next() != Some(&child.id().to_string())
                }) {
                    if let Some(status) = child.try_wait()? {
                        anyhow::bail!(
                            "eventd exited at start-up ({status}), see {}",
                            data_dir.join("eventd.log").display()
                        );
                    }
                    anyhow::ensure!(Instant::now() < deadline, "eventd did not start");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(Running::Binary { child, data_dir })
            }
        }
    }

    /// The attached rings (the binary's are opened from its KMES directory).
    pub fn rings(&self) -> anyhow::Result<Vec<Arc<Ring>>> {
        match self {
            // The CPU rings: eventd's own syslog ring takes no producers.
            Running::InProcess { state, .. } => Ok(state
                .rings
                .iter()
                .map(|r| r.ring())
                .filter(|r| r.cpu() != eventd::rings::SYSLOG_RING_CPU)
                .collect()),
            Running::Binary { data_dir, .. } => {
                let mut rings = Vec::new();
                for path in ring_paths(&data_dir.join("kmes"))? {
                    rings.push(Arc::new(Ring::open(&path, None)?));
                }
                Ok(rings)
            }
        }
    }

    /// Events stored and sequence numbers lost so far.
    pub fn progress(&self) -> anyhow::Result<(u64, u64)> {
        match self {
            Running::InProcess { state, .. } => {
                Ok(state.shards.iter().fold((0, 0), |(e, l), s| {
                    (
                        e + s.writer.events.load(Ordering::Relaxed),
                        l + s.writer.lost.load(Ordering::Relaxed),
                    )
                }))
            }
            Running::Binary { data_dir, .. } => {
                let (mut events, mut lost) = (0, 0);
                for path in eventd::store::list_databases(&data_dir.join("store"))? {
                    let c = eventd::store::open_read_only(&path)?;
                    // Rows are never deleted here, so the largest id is the
                    // count, found without a scan.
                    events += c.query_row("SELECT coalesce(max(id), 0) FROM events", [], |r| {
                        r.get::<_, i64>(0)
                    })? as u64;
                    lost += c.query_row("SELECT coalesce(sum(lost), 0) FROM gaps", [], |r| {
                        r.get::<_, i64>(0)
                    })? as u64;
                }
                Ok((events, lost))
            }
        }
    }

    /// The export stage's report (what `eventctl export status` shows):
    /// read in this process, or asked of the binary over its query
    /// socket. `None` while export is off.
    pub fn export_report(&self) -> anyhow::Result<Option<ExportReport>> {
        match self {
            Running::InProcess { state, .. } => Ok(state.export.as_ref().map(|e| e.report())),
            Running::Binary { data_dir, .. } => {
                let socket = data_dir.join("run/query.sock");
                let mut answer = None;
                eventd::query::client::call(&socket, &eventd::query::Request::Export, |v| {
                    answer = Some(v);
                    Ok(false)
                })?;
                let export = answer
                    .and_then(|mut v| v.get_mut("export").map(serde_json::Value::take))
                    .unwrap_or_default();
                if export.is_null() {
                    return Ok(None);
                }
                Ok(Some(serde_json::from_value(export)?))
            }
        }
    }

    /// CPU time (user + system, ns) of the export stage's threads
    /// (`export-N`), and of the whole eventd process when it is one (the
    /// binary; in this process it would include the harness).
    pub fn export_cpu_ns(&self) -> (u64, Option<u64>) {
        match self {
            Running::InProcess { .. } => (threads_cpu_ns("/proc/self", "export-"), None),
            Running::Binary { child, .. } => {
                let proc_dir = format!("/proc/{}", child.id());
                (
                    threads_cpu_ns(&proc_dir, "export-"),
                    Some(stat_cpu_ns(&format!("{proc_dir}/stat")).unwrap_or(0)),
                )
            }
        }
    }

    /// Stops the system cleanly without taking measurements.
    pub fn stop(self) -> anyhow::Result<()> {
        match self {
            Running::InProcess { daemon, state } => {
                drop(state);
                daemon.join()?;
            }
            Running::Binary { mut child, .. } => {
                // SAFETY: kill with the pid of our unreaped child.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                let status = child.wait()?;
                anyhow::ensure!(status.success(), "eventd exited {status}");
            }
        }
        Ok(())
    }

    /// The binary's process id (`None` in this process).
    pub fn pid(&self) -> Option<u32> {
        match self {
            Running::InProcess { .. } => None,
            Running::Binary { child, .. } => Some(child.id()),
        }
    }

    /// Takes the measurements and stops the system cleanly.
    pub fn finish(self) -> anyhow::Result<Finished> {
        self.finish_until(None)
    }

    /// Like [`Running::finish`]; the binary's latency counts only events
    /// emitted before `until_ns` when given.
    pub fn finish_until(self, until_ns: Option<i64>) -> anyhow::Result<Finished> {
        match self {
            Running::InProcess { daemon, state } => {
                let descriptors = count_fds("/proc/self/fd");
                let peak_rss_mib = peak_rss_mib("/proc/self/status");
                let WriterHistograms {
                    mut latency_us,
                    mut batch_items,
                    ..
                } = WriterHistograms::default();
                let mut commits = 0;
                for s in &state.shards {
                    let h = s
                        .writer
                        .histograms
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    latency_us.add(&h.latency_us)?;
                    batch_items.add(&h.batch_items)?;
                    commits += s.writer.commits.load(Ordering::Relaxed);
                }
                let stalls = state
                    .shards
                    .iter()
                    .map(|s| s.channel.stats().full_stalls)
                    .sum();
                let shards = state.shards.len();
                drop(state);
                daemon.join()?;
                Ok(Finished {
                    latency_us,
                    batch_items,
                    commits,
                    channel_full_stalls: Some(stalls),
                    peak_rss_mib,
                    descriptors,
                    shards,
                })
            }
            Running::Binary {
                mut child,
                data_dir,
            } => {
                let proc_dir = format!("/proc/{}", child.id());
                let descriptors = count_fds(&format!("{proc_dir}/fd"));
                let peak_rss_mib = peak_rss_mib(&format!("{proc_dir}/status"));
                // SAFETY: kill with the pid of our unreaped child.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                let status = child.wait()?;
                anyhow::ensure!(status.success(), "eventd exited {status}");
                let (latency_us, batch_items, commits, shards) =
                    from_receipts(&data_dir.join("store"), until_ns)?;
                Ok(Finished {
                    latency_us,
                    batch_items,
                    commits,
                    channel_full_stalls: None,
                    peak_rss_mib,
                    descriptors,
                    shards,
                })
            }
        }
    }
}

fn ring_paths(kmes: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(kmes)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ring"))
        // The CPU rings only: eventd's own syslog ring takes no producers.
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("cpu-"))
        })
        .collect();
    paths.sort();
    Ok(paths)
}

/// Latency and batch sizes of the binary, from its files: each event's
/// timestamp against its receipt's `committed_at` (taken when the commit
/// began, so the insert time is not included), and items per commit.
fn from_receipts(
    store: &Path,
    until_ns: Option<i64>,
) -> anyhow::Result<(Histogram<u64>, Histogram<u64>, u64, usize)> {
    // The writers' own bounds, so both systems report alike.
    let WriterHistograms {
        latency_us: mut latency,
        batch_items: mut batches,
        ..
    } = WriterHistograms::default();
    let mut commits = 0;
    let paths = eventd::store::list_databases(store)?;
    for path in &paths {
        let c = eventd::store::open_read_only(path)?;
        let mut stmt = c.prepare(
            "SELECT r.committed_at - e.ts FROM receipts r JOIN events e \
             ON e.ring_epoch = r.ring_epoch AND e.seq BETWEEN r.first_seq AND r.last_seq \
             WHERE e.ts < ?1",
        )?;
        for us in stmt.query_map([until_ns.unwrap_or(i64::MAX)], |r| r.get::<_, i64>(0))? {
            latency.saturating_record((us?.max(0) as u64 / 1000).max(1));
        }
        let mut stmt =
            c.prepare("SELECT sum(last_seq - first_seq + 1) FROM receipts GROUP BY committed_at")?;
        for n in stmt.query_map([], |r| r.get::<_, i64>(0))? {
            batches.saturating_record(n?.max(1) as u64);
            commits += 1;
        }
    }
    Ok((latency, batches, commits, paths.len()))
}

/// User + system CPU time in `stat` (a `/proc/PID/stat` or
/// `/proc/PID/task/TID/stat`), ns.
pub fn stat_cpu_ns(stat: &str) -> Option<u64> {
    let text = std::fs::read_to_string(stat).ok()?;
    // The fields after the command name, which is in parentheses and may
    // hold spaces: state is the first, utime the 12th, stime the 13th.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ticks * 1_000_000_000 / hz)
}

/// Each live thread of the process at `proc_dir`: its name and CPU time
/// (ns).
pub fn threads_cpu(proc_dir: &str) -> Vec<(String, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("{proc_dir}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let ns = stat_cpu_ns(&t.path().join("stat").to_string_lossy())?;
            Some((comm.trim().to_string(), ns))
        })
        .collect()
}

/// CPU time (ns) of the threads of the process at `proc_dir` whose name
/// starts with `prefix`.
pub fn threads_cpu_ns(proc_dir: &str, prefix: &str) -> u64 {
    threads_cpu(proc_dir)
        .into_iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .map(|(_, ns)| ns)
        .sum()
}

pub fn count_fds(dir: &str) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

/// The number after `name` (e.g. `"VmHWM:"`) in a `/proc/PID/status` text;
/// 0 when absent.
pub fn status_field(status: &str, name: &str) -> f64 {
    status
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}

fn peak_rss_mib(status: &str) -> f64 {
    let text = std::fs::read_to_string(status).unwrap_or_default();
    status_field(&text, "VmHWM:") / 1024.0
}

/// Producers of either kind.
pub enum Producers {
    Threads {
        stop: Arc<AtomicBool>,
        producers: Vec<load::Producer>,
    },
    Processes(Vec<Child>),
}

impl Producers {
    pub fn start(
        kind: ProducerKind,
        rings: &[Arc<Ring>],
        mode: Mode,
        sizes: Sizes,
    ) -> anyhow::Result<Producers> {
        match kind {
            ProducerKind::Threads => {
                let stop = Arc::new(AtomicBool::new(false));
                let producers = load::start(rings, mode, sizes, stop.clone());
                Ok(Producers::Threads { stop, producers })
            }
            ProducerKind::Processes => {
                let me = std::env::current_exe()?;
                let per = load::per_producer(mode, rings.len());
                let mut children = Vec::new();
                for ring in rings {
                    let mut cmd = Command::new(&me);
                    cmd.arg("--produce-ring")
                        .arg(ring.path())
                        .arg("--event-bytes")
                        .arg(format!("{}-{}", sizes.min, sizes.max));
                    if let Some(rate) = per {
                        cmd.arg("--rate").arg(rate.to_string());
                    }
                    children.push(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?);
                }
                Ok(Producers::Processes(children))
            }
        }
    }

    /// Stops every producer; returns (sequenced, refused) over all of them.
    pub fn stop(self) -> anyhow::Result<(u64, u64)> {
        let (mut sequenced, mut refused) = (0, 0);
        match self {
            Producers::Threads { stop, producers } => {
                stop.store(true, Ordering::Relaxed);
                for p in producers {
                    p.handle
                        .join()
                        .map_err(|_| anyhow::anyhow!("a load thread panicked"))?;
                    sequenced += p.counts.sequenced.load(Ordering::Relaxed);
                    refused += p.counts.refused.load(Ordering::Relaxed);
                }
            }
            Producers::Processes(children) => {
                for mut child in children {
                    drop(child.stdin.take());
                    let out = child.wait_with_output()?;
                    anyhow::ensure!(out.status.success(), "a producer process failed");
                    let text = String::from_utf8_lossy(&out.stdout);
                    let (s, r) = parse_counts(&text)
                        .ok_or_else(|| anyhow::anyhow!("producer printed {text:?}"))?;
                    sequenced += s;
                    refused += r;
                }
            }
        }
        Ok((sequenced, refused))
    }
}

/// Stops producer threads started with `load::start_spread`; returns the
/// events they sequenced.
pub fn stop_threads(stop: Arc<AtomicBool>, producers: Vec<load::Producer>) -> anyhow::Result<u64> {
    Producers::Threads { stop, producers }
        .stop()
        .map(|(sequenced, _)| sequenced)
}

fn parse_counts(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().last()?;
    let mut s = None;
    let mut r = None;
    for part in line.split_whitespace() {
        match part.split_once('=')? {
            ("sequenced", v) => s = v.parse().ok(),
            ("refused", v) => r = v.parse().ok(),
            _ => {}
        }
    }
    Some((s?, r?))
}

/// The body of a producer process: emits into the ring at `path` until its
/// standard input closes, then prints its counts.
pub fn producer_process(path: &Path, rate: Option<u64>, sizes: Sizes) -> anyhow::Result<()> {
    let ring = Ring::open(path, None)?;
    load::pin_to(ring.cpu());
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        for _ in std::io::stdin().lock().lines() {}
        s.store(true, Ordering::Relaxed);
    });
    let counts = Counts::default();
    let seed = u64::from(ring.cpu());
    load::produce(&[Arc::new(ring)], rate, sizes, &stop, &counts, seed);
    println!(
        "sequenced={} refused={}",
        counts.sequenced.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed)
    );
    Ok(())
}
