//! eventctl's command line, as clap declares it. Kept apart from the code
//! that runs the commands so that `packaging/gen` (man pages and shell
//! completions, made when the package is built) reads the very definitions
//! the binary parses with. Only `eventd::` paths here: the file is also
//! compiled inside that crate.

use clap::{Parser, Subcommand};
use eventd::query::render::{Format, Output};
use eventd::rings::Level;
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "eventctl",
    version = eventd::version::VERSION,
    about = "Client of the eventd event collection daemon",
    after_long_help = AFTER_HELP
)]
pub struct Args {
    /// eventd's data directory (rings in DIR/kmes, shards in DIR/store,
    /// sockets in DIR/run). Default: ./eventd-data if it is a directory,
    /// else /var/lib/eventd if it is one (the package's), else
    /// ./eventd-data.
    #[arg(long, global = true, value_name = "DIR", env = "EVENTD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// eventd's configuration file, when it moves directories (KmesDir,
    /// ...). Default: /etc/eventd/eventd.toml when the data directory is
    /// /var/lib/eventd and that file exists, else none (the embedded
    /// defaults).
    #[arg(long, global = true, value_name = "FILE", env = "EVENTD_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// What `eventctl --help` (and the man page) says after the options.
const AFTER_HELP: &str = "\
Environment:
  EVENTD_DATA_DIR  the data directory, when --data-dir is not given
  EVENTD_CONFIG    the configuration file, when --config is not given

Without either, eventctl uses ./eventd-data if it is a directory, else the
package's /var/lib/eventd with /etc/eventd/eventd.toml: on a host where the
package is installed, no option is needed. Querying takes membership of the
QueryGroup (default: the group eventd), emitting of the ProducerGroup.";

// Parsed once per run: the size of the query's options does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Emit one event (or one per line of standard input) into the ring of
    /// the CPU this process runs on.
    Emit(EmitArgs),
    /// List stored events from every shard, merged in time order.
    Query(QueryArgs),
    /// What the daemon knows now: per ring, channel and shard, queries and
    /// retention.
    Stats(StatsArgs),
    /// Shard files: size, event count, active or historical.
    Shards,
    /// The daemon's effective settings.
    Config,
    /// The ClickHouse export: create the tables, see how far it got.
    #[command(subcommand)]
    Export(ExportCommand),
    /// Run a command with each line of its stdout and stderr stored as an
    /// event, record how it ended, and exit as it did (systemd-cat's role).
    Run(RunArgs),
}

/// `eventctl query`: journalctl's options where it has one (its short
/// flags and meanings win over eventd's older ones; docs/guide/journalctl.md).
#[derive(clap::Args)]
#[command(after_long_help = QUERY_AFTER_HELP)]
pub struct QueryArgs {
    /// Events at or after this time: "2026-12-04 13:00", "10 min ago",
    /// "-1h", today, yesterday, now, RFC 3339, or an age ("10m", "2h"). In
    /// local time unless --utc.
    #[arg(short = 'S', long, allow_hyphen_values = true)]
    pub since: Option<String>,
    /// Events before this time (same forms as --since).
    #[arg(short = 'U', long, allow_hyphen_values = true)]
    pub until: Option<String>,
    /// Events of this CPU's ring (the CPU they were emitted on).
    #[arg(long)]
    pub cpu: Option<u32>,
    /// A level and those more severe (emerg, alert, crit, err, warning,
    /// notice, info, debug, or 0-7), or a range FROM..TO ("warning..err").
    #[arg(
        short = 'p',
        long = "priority",
        visible_alias = "level",
        value_name = "LEVEL|FROM..TO"
    )]
    pub priority: Option<String>,
    /// Events of this provider (journalctl's syslog identifier);
    /// repeatable, any of them.
    #[arg(
        short = 't',
        long = "identifier",
        visible_alias = "provider",
        value_name = "PROVIDER"
    )]
    pub providers: Vec<String>,
    /// Events with this name.
    #[arg(long)]
    pub name: Option<String>,
    /// Events of this process id.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Events of this user id.
    #[arg(long)]
    pub uid: Option<u32>,
    /// Events of this systemd unit ("nginx" is nginx.service; globs like
    /// "nginx*"), as eventd received them; repeatable, any of them.
    #[arg(short = 'u', long = "unit", value_name = "UNIT")]
    pub units: Vec<String>,
    /// The kernel's log of the current boot (with -b, of that boot).
    #[arg(short = 'k', long)]
    pub dmesg: bool,
    /// The events of one boot: 0 or nothing the current, -1 the one
    /// before, 1 the first, or a boot id (or its start), with +N or -N.
    #[arg(
        short = 'b',
        long = "boot",
        value_name = "ID|OFFSET",
        num_args = 0..=1,
        default_missing_value = "0",
        allow_negative_numbers = true,
        conflicts_with = "cluster"
    )]
    pub boot: Option<String>,
    /// List the boots the store records: index, boot id, first and last
    /// event.
    #[arg(long, conflicts_with = "cluster")]
    pub list_boots: bool,
    /// Messages matching this regular expression; case-insensitive unless
    /// it holds a capital letter (or as --case-sensitive says).
    #[arg(short = 'g', long, value_name = "PATTERN")]
    pub grep: Option<String>,
    /// Match --grep with case (true) or without (false).
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        requires = "grep"
    )]
    pub case_sensitive: Option<bool>,
    /// Structured field equality KEY=VALUE (repeatable).
    #[arg(long = "field", value_name = "KEY=VALUE")]
    pub fields: Vec<String>,
    /// The newest N events, oldest first (newest first with -r); "all",
    /// or "+N" for the oldest N. Without N, 10.
    #[arg(
        short = 'n',
        long,
        value_name = "N",
        num_args = 0..=1,
        default_missing_value = "10",
        conflicts_with_all = ["limit", "cursor"]
    )]
    pub lines: Option<String>,
    /// At most this many events and this many gaps from the start of the
    /// window; the cursor of the next page is printed. With --follow: as
    /// --lines.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Continue after a previous page's cursor (its events and its gaps).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Newest first.
    #[arg(short = 'r', long)]
    pub reverse: bool,
    /// Print the newest 10 events (or --lines), then events as they
    /// commit.
    #[arg(short = 'f', long, conflicts_with_all = ["offline", "reverse", "list_boots"])]
    pub follow: bool,
    /// Read the shard files directly instead of asking the daemon.
    #[arg(long)]
    pub offline: bool,
    /// Query the whole fleet in this ClickHouse cluster (its HTTP URL, e.g.
    /// http://127.0.0.1:8123/) instead of this host's daemon.
    #[arg(long, value_name = "URL", conflicts_with_all = ["offline", "follow"])]
    pub cluster: Option<String>,
    /// With --cluster: only this host (repeatable).
    #[arg(long = "host", value_name = "NAME", requires = "cluster")]
    pub hosts: Vec<String>,
    /// With --cluster: the database of eventd's tables (default:
    /// ExportDatabase, "eventd").
    #[arg(long, requires = "cluster")]
    pub database: Option<String>,
    /// How events are printed (journalctl's formats, and eventd's text
    /// and table).
    #[arg(short = 'o', long, value_enum, default_value = "short")]
    pub output: Format,
    /// Read and print times in UTC instead of local time.
    #[arg(long)]
    pub utc: bool,
    /// Never pipe the output into a pager.
    #[arg(long)]
    pub no_pager: bool,
}

/// What `eventctl query --help` says after the options.
const QUERY_AFTER_HELP: &str = "\
Pager: on a terminal, the output goes through $EVENTD_PAGER, else
$SYSTEMD_PAGER, else $PAGER, else less (with LESS=FRX when LESS is unset);
an empty value or \"cat\" means none. --no-pager, --follow and a pipe never
use one.

Times are read and printed in local time ($TZ, else /etc/localtime), or in
UTC with --utc.";

#[derive(clap::Args)]
pub struct EmitArgs {
    /// Who emits (at most 255 bytes).
    #[arg(long)]
    pub provider: String,
    /// Syslog level: emerg, alert, crit, err, warning, notice, info, debug.
    #[arg(long, default_value = "info")]
    pub level: Level,
    /// Event name (at most 255 bytes).
    #[arg(long, default_value = "message")]
    pub name: String,
    /// A structured field KEY=VALUE (repeatable); stored as a JSON object.
    #[arg(long = "field", value_name = "KEY=VALUE")]
    pub fields: Vec<String>,
    /// Read messages from standard input, one event per line.
    #[arg(long, conflicts_with = "message")]
    pub stdin: bool,
    /// The message.
    #[arg(required_unless_present = "stdin")]
    pub message: Option<String>,
}

#[derive(clap::Args)]
pub struct StatsArgs {
    /// Print the Prometheus text exposition format instead of JSON.
    #[arg(long)]
    pub prometheus: bool,
}

#[derive(clap::Subcommand)]
pub enum ExportCommand {
    /// Create eventd's database and tables in a ClickHouse cluster (every
    /// server, ON CLUSTER); running it again changes nothing.
    Init(InitArgs),
    /// How far the export stage got, per shard file and table.
    Status(StatusArgs),
    /// Every statement eventd sends to ClickHouse, with sample values, one
    /// JSON object a line (for checking them against other versions).
    #[command(hide = true)]
    Sql(SqlArgs),
}

#[derive(clap::Args)]
pub struct SqlArgs {
    #[arg(long, default_value = "eventd")]
    pub database: String,
    #[arg(long, default_value = "eventd")]
    pub cluster: String,
}

/// Where ClickHouse is and who to be there; defaults from the
/// configuration's Export keys.
#[derive(clap::Args, Clone)]
pub struct ClusterArgs {
    /// ClickHouse's HTTP interface (default: ExportUrl).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// The database of eventd's tables (default: ExportDatabase, "eventd").
    #[arg(long)]
    pub database: Option<String>,
    /// The ClickHouse user (default: ExportUser).
    #[arg(long)]
    pub user: Option<String>,
    /// A file whose first line is the password (default:
    /// ExportPasswordFile).
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// For an https:// URL: PEM certificates to trust instead of the
    /// system's roots (default: ExportCAFile). A client certificate comes
    /// from ExportCertFile and ExportKeyFile.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The cluster (remote_servers) the tables spread over.
    #[arg(long = "cluster", default_value = "eventd", value_name = "NAME")]
    pub cluster_name: String,
    /// Which tables: `cluster` (Replicated and Distributed, ON CLUSTER) or
    /// `single` (MergeTree on one server). Default: `cluster` when the
    /// server has that cluster in system.clusters, else `single`.
    #[arg(long, value_enum)]
    pub schema: Option<SchemaArg>,
}

#[derive(clap::ValueEnum, Clone, Copy)]
pub enum SchemaArg {
    Cluster,
    Single,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// How the status is printed: text, JSON or a table.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(clap::Args)]
/// `eventctl run`: systemd-cat's role (docs/guide/emitting.md).
pub struct RunArgs {
    /// The provider of the command's lines (default: the command's name).
    #[arg(long, short = 't', value_name = "NAME")]
    pub provider: Option<String>,
    /// The level of a stdout line that has no <N> prefix.
    #[arg(long, short = 'p', default_value = "info")]
    pub level: Level,
    /// The level of a stderr line that has no <N> prefix.
    #[arg(long, default_value = "warning")]
    pub stderr_level: Level,
    /// Whether a line may start with <N> (0-7), its level (sd-daemon.h's
    /// prefixes; removed from the line).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub level_prefix: bool,
    /// The command and its arguments, after `--`.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}
