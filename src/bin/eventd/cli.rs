//! eventd's command line, as clap declares it. Kept apart from `main.rs`
//! so that `packaging/gen` (man page and shell completions, made when the
//! package is built) reads the very definitions the binary parses with.
//! Only `eventd::` paths here: the file is also compiled inside that crate.

use clap::Parser;
use std::path::PathBuf;

/// Per-host event collection daemon: drains the per-CPU KMES rings and its
/// syslog sockets into sharded SQLite databases.
///
/// Under systemd (the packaged eventd.service) it says when it is ready
/// (Type=notify), pings the watchdog while its drain and writer threads make
/// progress, and takes the syslog and query sockets the socket units hold
/// (LISTEN_FDS); elsewhere it creates its sockets itself.
#[derive(Parser)]
#[command(
    name = "eventd",
    version = eventd::version::VERSION,
    after_long_help = AFTER_HELP
)]
pub struct Args {
    /// Data directory: rings in DIR/kmes, shards in DIR/store, sockets in
    /// DIR/run.
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        env = "EVENTD_DATA_DIR",
        default_value = eventd::config::DATA_DIR_DEFAULT
    )]
    pub data_dir: PathBuf,
    /// TOML configuration file (every key, commented at its default:
    /// /etc/eventd/eventd.toml in the package). Without it eventd runs with
    /// the embedded defaults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Stripe length L (R5); internal, for tests and the load harness.
    #[arg(long, hide = true, value_name = "N")]
    pub stripe_len: Option<std::num::NonZeroU32>,
    /// Slots of each shard channel; internal, for tests and the load harness.
    #[arg(long, hide = true, value_name = "N")]
    pub channel_slots: Option<usize>,
    /// Byte budget of each shard channel; internal, as above.
    #[arg(long, hide = true, value_name = "BYTES")]
    pub channel_bytes: Option<u64>,
    /// Log line format on stderr. The level filter comes from EVENTD_LOG
    /// (tracing's EnvFilter syntax, e.g. "info" or "eventd=debug"; default
    /// "info").
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Milliseconds between retention passes; internal, for tests.
    #[arg(long, hide = true, value_name = "MS")]
    pub retention_interval_ms: Option<u64>,
    /// The export stage's HTTP deadline in milliseconds; internal, for
    /// tests.
    #[arg(long, hide = true, value_name = "MS")]
    pub export_timeout_ms: Option<u64>,
    /// The export stage's batch format; internal, for the load harness.
    #[arg(long, hide = true, value_enum)]
    pub export_format: Option<eventd::export::format::Format>,
    /// Export worker threads (0 = one per shard, at most 4); internal.
    #[arg(long, hide = true)]
    pub export_workers: Option<usize>,
    /// Attach the rings of CPUs 0..N, not of the online CPUs: for the load
    /// harness only (`eventd-perf scale` simulates a bigger machine).
    #[arg(long, hide = true, value_name = "N")]
    pub simulate_cpus: Option<u32>,
}

/// What `eventd --help` (and the man page) says after the options.
const AFTER_HELP: &str = "\
Environment:
  EVENTD_DATA_DIR  the data directory, when --data-dir is not given
  EVENTD_LOG       the log filter (tracing's EnvFilter syntax; default \"info\")
  NOTIFY_SOCKET, WATCHDOG_USEC, LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID
                   set by systemd: readiness and the watchdog (sd_notify), and
                   the sockets it holds for eventd (socket activation)

Signals:
  SIGTERM, SIGINT  stop: the drains stop reading, every writer commits what it holds
  SIGHUP           read the configuration file again (it is also watched)

Files (the Debian package):
  /etc/eventd/eventd.toml  the configuration, every key commented at its default
  /var/lib/eventd          the data directory: kmes/ (rings), store/ (shards), run/
  eventd.service, eventd.socket, eventd-query.socket, eventd-devlog.socket
                           the systemd units; docs in /usr/share/doc/eventd";

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event, fields as key=value.
    Text,
    /// One JSON object per line (for journald or a log shipper).
    Json,
}
