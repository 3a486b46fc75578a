//! The syslog comparison: the same N datagrams, from one blocking sender on
//! a Unix datagram socket, into eventd and into its peers, one after the
//! other in one run:
//!
//! - **eventd**: the binary with embedded defaults but rate limits off (as
//!   the peers run); stored means committed
//!   to its SQLite shards (indexed, queryable; checked with a query).
//! - **rsyslog**: Debian's package, a private configuration with `imuxsock`
//!   on a private socket (rate limiting off) and `omfile`.
//! - **journald**: Debian's `systemd-journald`, standalone in private mount
//!   and network namespaces, with a private configuration (rate limiting
//!   off, volatile storage in a private directory).
//! - **syslog-ng**: Debian's packages unpacked with `dpkg -x` (it conflicts
//!   with rsyslog), an `sql()` destination into SQLite with batched commits.
//!
//! The harness installs what is missing (apt-get), starts each daemon,
//! sends, watches its store until all N are there (or nothing moved for
//! 20 s), and stops it by its PID. The time is from the first send to the
//! N-th stored message (journald: the receive time of its last entry).

mod cpu;
mod eventd_peer;
mod journald;
mod process;
mod rsyslog;
mod scenario;
mod syslog_ng;

pub(crate) use cpu::{threads_cpu_ns, tree_cpu_ns};
pub(crate) use journald::{journal_last, journal_lines, Journald};
pub(crate) use process::{run_cmd, sigterm};
pub use scenario::{run, stages_text};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Peer {
    Eventd,
    /// Not a daemon: the floor of `syslogfloor` (a reference, never "the
    /// fastest peer").
    Floor,
    Rsyslog,
    Journald,
    SyslogNg,
}

impl Peer {
    pub fn name(self) -> &'static str {
        match self {
            Peer::Eventd => "eventd",
            Peer::Floor => "floor",
            Peer::Rsyslog => "rsyslog",
            Peer::Journald => "journald",
            Peer::SyslogNg => "syslog-ng",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PeerRun {
    pub peer: Peer,
    pub version: String,
    pub stores_into: &'static str,
    pub sent: u64,
    pub stored: u64,
    pub lost: u64,
    pub seconds: f64,
    pub stored_per_s: f64,
    pub send_seconds: f64,
    /// CPU seconds per million messages stored, of the peer's process and
    /// its descendants, from the first send until all were stored (their
    /// own accounting in /proc: user + system); `None` for the floor,
    /// which runs in the harness.
    pub cpu_s_per_million: Option<f64>,
    /// The same, eventd's threads grouped by stage (thread name without
    /// its number: syslog-dgram, drain, writer, ...).
    pub cpu_by_stage: Vec<(String, f64)>,
}
