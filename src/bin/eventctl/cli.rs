//! eventctl's command line, as clap declares it. Kept apart from the code
//! that runs the commands so that `packaging/gen` (man pages and shell
//! completions, made when the package is built) reads the very definitions
//! the binary parses with. Only `eventd::` paths here: the file is also
//! compiled inside that crate.

use clap::{Parser, Subcommand};
use eventd::query::render::Output;
use eventd::rings::Level;
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
}

#[derive(clap::Args)]
pub struct QueryArgs {
    /// Events at or after this time: RFC 3339 ("2026-11-30T10:00:00Z") or
    /// an age ("10m", "2h", "1d").
    #[arg(long)]
    pub since: Option<String>,
    /// Events before this time (same forms as --since).
    #[arg(long)]
    pub until: Option<String>,
    #[arg(long)]
    pub cpu: Option<u32>,
    /// This level or more severe (emerg … debug).
    #[arg(long)]
    pub level: Option<Level>,
    #[arg(long)]
    pub provider: Option<String>,
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long)]
    pub pid: Option<u32>,
    #[arg(long)]
    pub uid: Option<u32>,
    /// Only messages containing this text.
    #[arg(long)]
    pub grep: Option<String>,
    /// Structured field equality KEY=VALUE (repeatable).
    #[arg(long = "field", value_name = "KEY=VALUE")]
    pub fields: Vec<String>,
    /// At most this many events and this many gaps; the cursor of the next
    /// page is printed.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Continue after a previous page's cursor (its events and its gaps).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Newest first.
    #[arg(long)]
    pub reverse: bool,
    /// Keep streaming events as they commit.
    #[arg(long, short = 'f', conflicts_with_all = ["offline", "limit"])]
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
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

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
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}
