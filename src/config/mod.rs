//! Configuration: the TOML file an operator writes (seed key names) and the
//! validated settings the daemon runs with.
//!
//! Parsing and checking are two steps, as in ripgrep's low/high arguments:
//! [`ConfigFile`] is exactly what TOML said (every key optional, unknown keys
//! refused), [`Settings`] is what the daemon uses, with paths resolved
//! against the data directory and every value checked against its range. A
//! bad value is reported with its key, the value and the allowed range.

mod durations;
mod export;
pub mod live;
pub mod rate;
pub mod watch;

pub use durations::duration_text;
use durations::{age_as_text, parse_age};
pub use export::{ExportSettings, TlsFiles};

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default data directory of both binaries.
pub const DATA_DIR_DEFAULT: &str = "./eventd-data";

/// `MaxBatchSize`: events per commit at most. The default was chosen with
/// the load harness (docs/performance.md#end-to-end).
pub const MAX_BATCH_SIZE_DEFAULT: u64 = 4096;
pub const MAX_BATCH_SIZE_RANGE: (u64, u64) = (1, 1_000_000);

/// `MaxConcurrentQueries`: the seed's default is 128.
pub const MAX_CONCURRENT_QUERIES_DEFAULT: u64 = 128;
pub const MAX_CONCURRENT_QUERIES_RANGE: (u64, u64) = (1, 4096);

/// `QueryIndexes`: the events columns and structured fields each shard indexes
/// for queries (beside the time, always indexed). The default was chosen with
/// `eventd-perf fields` (docs/performance.md#a-day-of-events): over 100M events
/// a rare provider's first result took 3 ms with the index and 20 s without,
/// for 0.76 of eventd's insert rate; every other candidate cost more (name,
/// pid, a field: a quarter to a third of the bare insert rate left) for filters
/// used less often.
pub const QUERY_INDEXES_DEFAULT: &[&str] = &["provider"];

/// `QueryGroup`: who may query besides root and eventd's own user.
pub const QUERY_GROUP_DEFAULT: &str = "eventd";

/// `RingBytes`: the size of each per-CPU ring file created by eventd.
pub const RING_BYTES_DEFAULT: u64 = crate::rings::format::RING_BYTES_DEFAULT as u64;
pub const RING_BYTES_RANGE: (u64, u64) = (64 << 10, 1 << 30);

/// `ExportBatchRows`: rows per insert into ClickHouse at most. The default was
/// chosen with `eventd-perf export`
/// (perf/runs/notebook.md#figures-2026-12-02---system-binary-after-read-ahead-and-encoding-while-reading):
/// 50,000 rows exported 2.2x as fast as 5,000; 200,000 another 1.24x at four
/// times the memory per batch (tens of MB) and a 2 s first batch. The top is
/// below ClickHouse's block size (1,048,576 rows), so a batch is one block.
pub const EXPORT_BATCH_ROWS_DEFAULT: u64 = 50_000;
pub const EXPORT_BATCH_ROWS_RANGE: (u64, u64) = (1, 1_000_000);

/// `ExportNice`: the scheduling niceness of the export threads. Export is
/// background work: on a host whose CPUs are busy, ingestion (rings,
/// drains, writers at niceness 0) should win them, and export catch up when
/// they are free. 19 gives a nice-0 thread about 68 times an export
/// thread's share of a contended CPU (the kernel's weights 1024 vs 15);
/// on idle CPUs export runs as fast as at 0. Chosen with `eventd-perf
/// export` (docs/performance.md#export-below-ingestion): flat-out
/// ingestion with export on kept 0.80-0.94 of its rate at 19 against
/// 0.57-0.70 at 10, and 0.98-1.08 against 0.76-1.01 with the cluster's
/// CPU out of the way; export lag at half that rate stayed in seconds.
pub const EXPORT_NICE_DEFAULT: u64 = 19;
pub const EXPORT_NICE_RANGE: (u64, u64) = (0, 19);

/// `ExportDatabase`'s default.
pub const EXPORT_DATABASE_DEFAULT: &str = "eventd";

/// What the TOML file says, key by key. Every key is optional.
#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct ConfigFile {
    /// 0 = one shard per attached ring (the default); 1..=256 explicit (R1).
    pub storage_shards: Option<i64>,
    pub max_batch_size: Option<i64>,
    pub max_concurrent_queries: Option<i64>,
    /// Shard databases (default `DATA_DIR/store`).
    pub store_dir: Option<PathBuf>,
    /// KMES ring files (default `DATA_DIR/kmes`).
    pub kmes_dir: Option<PathBuf>,
    /// Sockets (default `DATA_DIR/run`).
    pub run_dir: Option<PathBuf>,
    pub ring_bytes: Option<i64>,
    /// Drop events older than this, e.g. "30d" (unset = keep).
    pub retention_max_age: Option<String>,
    /// Keep the store under this many bytes (unset = no limit).
    pub retention_max_bytes: Option<i64>,
    /// Columns and structured fields (`fields.KEY`) indexed for queries;
    /// restart-only. Default: provider.
    pub query_indexes: Option<Vec<String>>,
    /// Members of this group may query (root and eventd's own user always
    /// may). Default "eventd"; a group that does not exist allows no one else.
    pub query_group: Option<String>,
    /// Members of this group may emit through the rings (root and eventd's
    /// own user always may). Default: the QueryGroup, because whoever can
    /// open a ring can also read the events in flight in it; "*" is every
    /// local user (only with QueryGroup = "*" too), "" no one else.
    pub producer_group: Option<String>,
    /// Serve Prometheus metrics over HTTP on this loopback address, e.g.
    /// "127.0.0.1:9464" (unset = no listener; `eventctl stats
    /// --prometheus` always works).
    pub metrics_listen: Option<String>,
    /// The syslog datagram socket (`/dev/log`-style), relative to RunDir;
    /// "" turns it off. Default "syslog.sock".
    pub syslog_socket: Option<PathBuf>,
    /// The syslog stream socket (long messages), relative to RunDir; ""
    /// turns it off. Default "syslog-stream.sock".
    pub syslog_stream_socket: Option<PathBuf>,
    /// How the datagram socket is read: "auto" (io_uring where it works,
    /// else recvmmsg), "io_uring" or "recvmmsg".
    pub syslog_receive: Option<String>,
    /// Read the kernel log (`/dev/kmsg`) into eventd's kernel ring.
    /// Default false (the packaged configuration turns it on).
    pub kernel_log: Option<bool>,
    /// The stream socket for the output of services (`eventctl run`),
    /// relative to RunDir; "" turns it off. Default "stdout.sock".
    pub stdout_socket: Option<PathBuf>,
    /// This host's name in the fleet (the `host` column in ClickHouse).
    /// Default: the kernel's host name.
    pub host_name: Option<String>,
    /// ClickHouse's HTTP interface, e.g. "http://127.0.0.1:8123/"; unset =
    /// no export.
    pub export_url: Option<String>,
    /// The ClickHouse database of eventd's tables (default "eventd").
    pub export_database: Option<String>,
    /// Rows per insert at most.
    pub export_batch_rows: Option<i64>,
    /// The ClickHouse user (default: the server's `default` user).
    pub export_user: Option<String>,
    /// A file whose first line is that user's password (not readable by
    /// every local user); relative to the data directory.
    pub export_password_file: Option<PathBuf>,
    /// PEM certificates trusted for an https:// ExportUrl instead of the
    /// system's roots; relative to the data directory.
    #[serde(rename = "ExportCAFile")]
    pub export_ca_file: Option<PathBuf>,
    /// A client certificate (PEM chain) offered to the server, with
    /// ExportKeyFile; relative to the data directory.
    pub export_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM, not readable by every
    /// local user); relative to the data directory.
    pub export_key_file: Option<PathBuf>,
    /// The export threads' niceness, 0..=19 (default 19): below the
    /// ingestion threads, so that a busy host ingests first.
    pub export_nice: Option<i64>,
    /// Each source's window, e.g. "30s" ("0" turns limits off).
    pub rate_limit_interval: Option<String>,
    /// Events per source per window (0 turns limits off).
    pub rate_limit_burst: Option<i64>,
    /// Other windows and bursts for some sources (by provider, unit or
    /// uid), e.g. `[{ Unit = "backup.service", Burst = 100000 }]`.
    pub rate_limit_overrides: Option<Vec<rate::OverrideFile>>,
}

/// A configuration problem, naming the file, key and allowed values.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("configuration file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{key} = {value} is out of range: {allowed}")]
    Range {
        key: &'static str,
        value: String,
        allowed: String,
    },
    /// One entry of a list key (e.g. `RateLimitOverrides`) is wrong.
    #[error("{key}[{index}] = {entry}: {problem}")]
    Entry {
        key: &'static str,
        index: usize,
        entry: String,
        problem: String,
    },
    /// A key that would show a secret: credentials belong in ExportUser
    /// and ExportPasswordFile.
    #[error(
        "{key} = {value} holds {what}: credentials in it would be shown by `eventctl config`, \
         `eventctl export status` and the log; set ExportUser, and put the password on the \
         first line of the file ExportPasswordFile names"
    )]
    Credentials {
        key: &'static str,
        value: String,
        what: &'static str,
    },
    #[error("{first} ({first_path}) and {second} ({second_path}) {problem}")]
    Paths {
        first: &'static str,
        first_path: PathBuf,
        second: &'static str,
        second_path: PathBuf,
        problem: &'static str,
    },
}

/// The settings the daemon runs with: every value checked, paths resolved.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Settings {
    pub data_dir: PathBuf,
    pub storage_shards: i64,
    pub max_batch_size: u64,
    pub max_concurrent_queries: u64,
    /// Whether `MaxConcurrentQueries` was set in the file: an explicit
    /// count that does not fit the descriptor limit stops start-up, the
    /// default shrinks to fit (R2, `daemon::steps::plan_shards`).
    #[serde(skip)]
    pub max_concurrent_queries_explicit: bool,
    pub store_dir: PathBuf,
    pub kmes_dir: PathBuf,
    pub run_dir: PathBuf,
    pub ring_bytes: u64,
    #[serde(serialize_with = "age_as_text")]
    pub retention_max_age: Option<Duration>,
    pub retention_max_bytes: Option<u64>,
    pub query_group: String,
    pub producer_group: String,
    /// `QueryIndexes`, checked, each once, in the order given.
    pub query_indexes: Vec<crate::store::indexes::QueryIndex>,
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `None`: that socket is off.
    pub syslog_socket: Option<PathBuf>,
    pub syslog_stream_socket: Option<PathBuf>,
    pub syslog_receive: crate::syslog::ReceiveMode,
    /// `KernelLog`.
    pub kernel_log: bool,
    /// `StdoutSocket`; `None`: off.
    pub stdout_socket: Option<PathBuf>,
    /// `HostName`.
    pub host_name: String,
    /// The export keys; `None` when `ExportUrl` is unset (no export).
    pub export: Option<ExportSettings>,
    /// The file these settings were read from (reloads read it again);
    /// `None` for the embedded defaults.
    pub config_file: Option<PathBuf>,
    /// `RateLimitInterval`, `RateLimitBurst` and `RateLimitOverrides`
    /// (live).
    pub rate_limit: rate::RateLimit,
}

impl ConfigFile {
    /// Parses TOML text; `path` is only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<ConfigFile, ConfigError> {
        toml::from_str(text).map_err(|e: toml::de::Error| ConfigError::Parse {
            path: path.to_path_buf(),
            // It quotes the line: an ExportUrl's credentials stay out.
            message: crate::redact::patterns(&parse_problem(text, &e)),
        })
    }

    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Checks every value and resolves paths against `data_dir`.
    pub fn resolve(&self, data_dir: &Path) -> Result<Settings, ConfigError> {
        let storage_shards = self.storage_shards.unwrap_or(0);
        let max = crate::routing::STORAGE_SHARDS_MAX;
        if !(0..=max).contains(&storage_shards) {
            return Err(ConfigError::Range {
                key: "StorageShards",
                value: storage_shards.to_string(),
                allowed: format!("0 (one shard per attached ring, the default) or 1..={max}"),
            });
        }
        let dir = |value: &Option<PathBuf>, name: &str| match value {
            Some(p) if p.is_absolute() => p.clone(),
            Some(p) => data_dir.join(p),
            None => data_dir.join(name),
        };
        let run_dir = dir(&self.run_dir, "run");
        let socket = |value: &Option<PathBuf>, name: &str| match value {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) if p.is_absolute() => Some(p.clone()),
            Some(p) => Some(run_dir.join(p)),
            None => Some(run_dir.join(name)),
        };
        let export = self.export_settings(data_dir)?;
        Ok(Settings {
            rate_limit: rate::RateLimit::from_file(
                self.rate_limit_interval.as_deref(),
                self.rate_limit_burst,
            )?
            .with_overrides(self.rate_limit_overrides.as_deref().unwrap_or_default())?,
            host_name: match &self.host_name {
                Some(name) => check_host_name(name)?,
                None => kernel_host_name(),
            },
            export,
            syslog_socket: socket(&self.syslog_socket, "syslog.sock"),
            syslog_stream_socket: socket(&self.syslog_stream_socket, "syslog-stream.sock"),
            kernel_log: self.kernel_log.unwrap_or(false),
            stdout_socket: socket(&self.stdout_socket, "stdout.sock"),
            syslog_receive: match self.syslog_receive.as_deref().map(str::trim) {
                None | Some("auto") => crate::syslog::ReceiveMode::Auto,
                Some("io_uring") => crate::syslog::ReceiveMode::IoUring,
                Some("recvmmsg") => crate::syslog::ReceiveMode::Recvmmsg,
                Some(other) => {
                    return Err(ConfigError::Range {
                        key: "SyslogReceive",
                        value: format!("{other:?}"),
                        allowed: "\"auto\", \"io_uring\" or \"recvmmsg\"".to_string(),
                    })
                }
            },
            data_dir: data_dir.to_path_buf(),
            storage_shards,
            max_batch_size: ranged(
                "MaxBatchSize",
                self.max_batch_size,
                MAX_BATCH_SIZE_DEFAULT,
                MAX_BATCH_SIZE_RANGE,
            )?,
            max_concurrent_queries: ranged(
                "MaxConcurrentQueries",
                self.max_concurrent_queries,
                MAX_CONCURRENT_QUERIES_DEFAULT,
                MAX_CONCURRENT_QUERIES_RANGE,
            )?,
            max_concurrent_queries_explicit: self.max_concurrent_queries.is_some(),
            store_dir: dir(&self.store_dir, "store"),
            kmes_dir: dir(&self.kmes_dir, "kmes"),
            run_dir,
            ring_bytes: ranged(
                "RingBytes",
                self.ring_bytes,
                RING_BYTES_DEFAULT,
                RING_BYTES_RANGE,
            )?,
            retention_max_age: match &self.retention_max_age {
                None => None,
                Some(text) => Some(parse_age(text)?),
            },
            config_file: None,
            metrics_listen: match &self.metrics_listen {
                None => None,
                Some(text) => Some(parse_listen(text)?),
            },
            query_group: self
                .query_group
                .clone()
                .unwrap_or_else(|| QUERY_GROUP_DEFAULT.to_string()),
            query_indexes: query_indexes(self.query_indexes.as_deref())?,
            producer_group: self
                .producer_group
                .clone()
                .or_else(|| self.query_group.clone())
                .unwrap_or_else(|| QUERY_GROUP_DEFAULT.to_string()),
            retention_max_bytes: match self.retention_max_bytes {
                None => None,
                Some(v) => Some(ranged(
                    "RetentionMaxBytes",
                    Some(v),
                    0,
                    (1 << 20, i64::MAX as u64),
                )?),
            },
        })
    }
}

/// A TOML error on one line (toml's own text spans several, which a
/// service manager logs as several records): where it is, the line as
/// written (the key is often named only there) and what is wrong.
fn parse_problem(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    let Some(span) = e.span() else {
        return message;
    };
    let before = &text.as_bytes()[..span.start.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    let quoted = text[line_start..].lines().next().unwrap_or("").trim();
    format!("line {line}, column {column} ({quoted:?}): {message}")
}

/// `path` as given when absolute, else under `data_dir`.
fn under(data_dir: &Path, path: &Option<PathBuf>) -> Option<PathBuf> {
    path.as_ref().map(|p| {
        if p.is_absolute() {
            p.clone()
        } else {
            data_dir.join(p)
        }
    })
}

/// The default `QueryIndexes`, parsed.
pub fn query_indexes_default() -> Vec<crate::store::indexes::QueryIndex> {
    // The default list is made of valid entries (a test parses it).
    query_indexes(None).unwrap_or_default()
}

/// `QueryIndexes` checked: each entry a column or `fields.KEY`, duplicates
/// dropped.
fn query_indexes(
    entries: Option<&[String]>,
) -> Result<Vec<crate::store::indexes::QueryIndex>, ConfigError> {
    use crate::store::indexes::QueryIndex;
    let default: Vec<String> = QUERY_INDEXES_DEFAULT
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut out: Vec<QueryIndex> = Vec::new();
    for entry in entries.unwrap_or(&default) {
        let q = QueryIndex::parse(entry.trim()).map_err(|allowed| ConfigError::Range {
            key: "QueryIndexes",
            value: format!("{entry:?}"),
            allowed,
        })?;
        if !out.contains(&q) {
            out.push(q);
        }
    }
    Ok(out)
}

/// `HostName` as given, if it can name a host: 1 to 255 bytes, no
/// control characters or spaces.
fn check_host_name(name: &str) -> Result<String, ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.chars().any(|c| c.is_control() || c.is_whitespace());
    if ok {
        Ok(name.to_string())
    } else {
        Err(ConfigError::Range {
            key: "HostName",
            value: format!("{name:?}"),
            allowed: "1 to 255 bytes without spaces or control characters".to_string(),
        })
    }
}

/// The kernel's host name (`gethostname`), or "localhost" if it has none.
pub fn kernel_host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for writes of its length; gethostname writes at
    // most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..len]) {
        Ok(name) if rc == 0 && !name.is_empty() => name.to_string(),
        _ => "localhost".to_string(),
    }
}

impl Settings {
    /// Checks the configured paths against each other: the store, KMES and
    /// run directories must be three different directories, none inside
    /// another (each has its own mode and group), and the socket paths must
    /// differ from each other and from the files eventd keeps in the run
    /// directory, and lie outside the store and KMES directories. Lexical:
    /// the daemon also compares the directories it made by identity.
    pub fn check_paths(&self) -> Result<(), ConfigError> {
        let dirs = [
            ("StoreDir", &self.store_dir),
            ("KmesDir", &self.kmes_dir),
            ("RunDir", &self.run_dir),
        ];
        let conflict = |first, a: &Path, second, b: &Path, problem| ConfigError::Paths {
            first,
            first_path: a.to_path_buf(),
            second,
            second_path: b.to_path_buf(),
            problem,
        };
        for (i, (ka, a)) in dirs.iter().enumerate() {
            for (kb, b) in &dirs[i + 1..] {
                let (a, b) = (normal(a), normal(b));
                if a == b {
                    return Err(conflict(ka, &a, kb, &b, "are the same directory"));
                }
                if a.starts_with(&b) || b.starts_with(&a) {
                    return Err(conflict(ka, &a, kb, &b, "are inside one another"));
                }
            }
        }
        let fixed = [
            ("the query socket", self.run_dir.join("query.sock")),
            ("the pid file", self.run_dir.join("eventd.pid")),
        ];
        let sockets: Vec<(&'static str, PathBuf)> = [
            ("SyslogSocket", &self.syslog_socket),
            ("SyslogStreamSocket", &self.syslog_stream_socket),
            ("StdoutSocket", &self.stdout_socket),
        ]
        .into_iter()
        .filter_map(|(k, p)| p.as_ref().map(|p| (k, normal(p))))
        .collect();
        for (i, (k, p)) in sockets.iter().enumerate() {
            let others = sockets[i + 1..]
                .iter()
                .map(|(k, p)| (*k, p.clone()))
                .chain(fixed.iter().map(|(k, p)| (*k, normal(p))));
            for (other, q) in others {
                if *p == q {
                    return Err(conflict(k, p, other, &q, "are the same path"));
                }
            }
            for (dk, d) in &dirs[..2] {
                if p.starts_with(normal(d)) {
                    return Err(conflict(
                        k,
                        p,
                        dk,
                        d,
                        "conflict: a socket cannot live in that directory",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Embedded defaults under `data_dir`: what `eventd --data-dir DIR` runs
    /// with when no configuration file is given.
    pub fn defaults(data_dir: &Path) -> Settings {
        ConfigFile::default()
            .resolve(data_dir)
            .expect("the embedded defaults are in range")
    }
}

/// `path` without `.` components and with `..` folded (lexically), for
/// comparisons.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn ranged(
    key: &'static str,
    value: Option<i64>,
    default: u64,
    (lo, hi): (u64, u64),
) -> Result<u64, ConfigError> {
    let Some(v) = value else {
        return Ok(default);
    };
    match u64::try_from(v) {
        Ok(u) if (lo..=hi).contains(&u) => Ok(u),
        _ => Err(ConfigError::Range {
            key,
            value: v.to_string(),
            allowed: format!("{lo}..={hi}"),
        }),
    }
}

/// A loopback socket address: metrics are for the host's own scraper (or
/// an SSH tunnel), never exposed to the network by eventd itself.
fn parse_listen(text: &str) -> Result<std::net::SocketAddr, ConfigError> {
    match text.trim().parse::<std::net::SocketAddr>() {
        Ok(addr) if addr.ip().is_loopback() => Ok(addr),
        _ => Err(ConfigError::Range {
            key: "MetricsListen",
            value: format!("{text:?}"),
            allowed: "a loopback address and port, such as \"127.0.0.1:9464\" or \"[::1]:9464\""
                .to_string(),
        }),
    }
}

#[cfg(test)]
mod tests;
