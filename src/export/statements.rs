//! Every statement the export stage sends, built here from plain values
//! (no server needed), so that what eventd sends can be listed whole
//! (`eventctl export sql`) and run against other ClickHouse versions
//! (`tests/export_sql.rs` runs them on a current engine through chdb).
//!
//! Where rows are looked for depends on the [`Layout`]: on a single
//! server, in the tables themselves; on a cluster, on each replica's local
//! table through `remote()`, every address its own shard so that the
//! answer is the union of all of them.

use super::format::{Format, EVENT_COLUMNS, GAP_COLUMNS};
use super::literal::{ident, quote};
use super::state::Table;

/// Where eventd's tables are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// `events` and `gaps` are MergeTree tables of the server at the URL.
    Single,
    /// `events` and `gaps` are Distributed tables over `events_local` and
    /// `gaps_local` of the cluster's servers.
    Cluster,
}

/// The `remote()` credentials: the configured user and password, if any.
pub type Credentials<'a> = Option<(&'a str, &'a str)>;

/// What a lookup reads: the table on one server, or `remote()` over the
/// given replicas (`host:port`, native protocol).
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub layout: &'a Layout,
    pub database: &'a str,
    /// The replicas to ask (cluster only).
    pub replicas: &'a [String],
    pub credentials: Credentials<'a>,
}

impl Source<'_> {
    /// `FROM` what, for `table` (`events` or `gaps`).
    fn from(&self, table: &str) -> String {
        match self.layout {
            Layout::Single => format!("{}.{}", ident(self.database), table),
            Layout::Cluster => remote(
                self.replicas,
                self.database,
                &format!("{table}_local"),
                self.credentials,
            ),
        }
    }
}

/// `remote('a,b', 'db', 'table'[, 'user', 'password'])`: each address its
/// own shard, so the answer is the union of all of them. Without a user
/// the servers connect to each other as their `default` user.
pub fn remote(
    replicas: &[String],
    database: &str,
    table: &str,
    credentials: Credentials,
) -> String {
    let mut args = format!(
        "{}, {}, {}",
        quote(&replicas.join(",")),
        quote(database),
        quote(table)
    );
    if let Some((user, password)) = credentials {
        args.push_str(&format!(", {}, {}", quote(user), quote(password)));
    }
    format!("remote({args})")
}

pub const VERSION: &str = "SELECT version()";

/// The engine of `database.events` (what says single server or cluster).
pub fn events_engine(database: &str) -> String {
    format!(
        "SELECT engine_full FROM system.tables WHERE database = {} AND name = 'events' \
         FORMAT TSVRaw",
        quote(database)
    )
}

/// Shards of `cluster` with their weights and replicas, in shard order.
pub fn cluster_replicas(cluster: &str) -> String {
    format!(
        "SELECT shard_num, shard_weight, host_address, port FROM system.clusters \
         WHERE cluster = {} ORDER BY shard_num, replica_num FORMAT TSVRaw",
        quote(cluster)
    )
}

/// The sharding key's value for `host` (`cityHash64(host)`).
pub fn host_hash(host: &str) -> String {
    format!("SELECT cityHash64({}) FORMAT TSVRaw", quote(host))
}

/// Whether the server knows a setting (`insert_deduplication_token`, ...).
pub fn has_setting(name: &str) -> String {
    format!(
        "SELECT count() FROM system.settings WHERE name = {} FORMAT TSVRaw",
        quote(name)
    )
}

/// Whether MergeTree tables know a setting
/// (`non_replicated_deduplication_window`).
pub fn has_merge_tree_setting(name: &str) -> String {
    format!(
        "SELECT count() FROM system.merge_tree_settings WHERE name = {} FORMAT TSVRaw",
        quote(name)
    )
}

/// Whether the server has a cluster of that name in `<remote_servers>`.
pub fn has_cluster(cluster: &str) -> String {
    format!(
        "SELECT count() FROM system.clusters WHERE cluster = {} FORMAT TSVRaw",
        quote(cluster)
    )
}

/// The insert of a batch of `table` in `format`: into the table itself
/// (single server) or the Distributed table (cluster), the same text.
pub fn insert(database: &str, table: Table, format: Format) -> String {
    let columns = match table {
        Table::Events => EVENT_COLUMNS,
        Table::Gaps => GAP_COLUMNS,
    };
    format!(
        "INSERT INTO {}.{} ({columns}) FORMAT {}",
        ident(database),
        table.name(),
        format.name()
    )
}

/// The time column a lookup bounds (the tables' order after the host).
fn time_column(table: Table) -> &'static str {
    match table {
        Table::Events => "ts",
        Table::Gaps => "detected_at",
    }
}

/// `what` of (`host`, `source`)'s `table` rows with ids in `lo..=hi` and
/// time in `t0..=t1`, as RowBinary.
#[allow(clippy::too_many_arguments)]
pub fn lookup(
    from: &Source,
    table: Table,
    host: &str,
    source: &str,
    (lo, hi): (i64, i64),
    (t0, t1): (i64, i64),
    what: &str,
) -> String {
    format!(
        "SELECT {what} FROM {} WHERE host = {} AND source = {} \
         AND source_id BETWEEN {} AND {} AND {} BETWEEN {t0} AND {t1} FORMAT RowBinary",
        from.from(table.name()),
        quote(host),
        quote(source),
        lo.max(0) as u64,
        hi.max(0) as u64,
        time_column(table),
    )
}

/// The ids present of a range (settle).
pub const PRESENT: &str = "DISTINCT source_id";
/// The highest id above the cursor, and how many (reconcile).
pub const HIGHEST: &str = "max(source_id), count()";

/// A run of sequence numbers of one ring: ((ring epoch, cpu), (first,
/// last)).
pub type SeqRange = ((i64, u32), (u64, u64));

/// Rows of `host`'s `table` by identity: per (ring epoch, cpu), a range of
/// sequence numbers; answers (ring_epoch, cpu, seq or from_seq, 0 or
/// to_seq) as RowBinary.
pub fn by_identity(from: &Source, table: Table, host: &str, ranges: &[SeqRange]) -> String {
    let (what, seq) = match table {
        Table::Events => ("ring_epoch, cpu, seq, toUInt64(0)", "seq"),
        Table::Gaps => ("ring_epoch, cpu, from_seq, to_seq", "from_seq"),
    };
    let terms: Vec<String> = ranges
        .iter()
        .map(|((e, c), (a, b))| {
            format!("(ring_epoch = {e} AND cpu = {c} AND {seq} BETWEEN {a} AND {b})")
        })
        .collect();
    format!(
        "SELECT {what} FROM {} WHERE host = {} AND ({}) FORMAT RowBinary",
        from.from(table.name()),
        quote(host),
        terms.join(" OR ")
    )
}

/// How many queries whose initial query id starts with `prefix` run on the
/// server asked (`replicas` empty) or on each of `replicas`.
pub fn running(replicas: &[String], credentials: Credentials, prefix: &str) -> String {
    let from = if replicas.is_empty() {
        "system.processes".to_string()
    } else {
        remote(replicas, "system", "processes", credentials)
    };
    format!(
        "SELECT count() FROM {from} WHERE substring(initial_query_id, 1, {}) = {} \
         FORMAT RowBinary",
        prefix.len(),
        quote(prefix)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_read_the_table_or_every_replica_given() {
        let replicas = ["10.0.0.1:9000".to_string(), "10.0.0.2:9000".to_string()];
        let cluster = Source {
            layout: &Layout::Cluster,
            database: "db",
            replicas: &replicas,
            credentials: Some(("u", "p'w")),
        };
        let sql = lookup(&cluster, Table::Gaps, "h", "s", (1, 9), (5, 6), PRESENT);
        assert!(
            sql.contains(
                "FROM remote('10.0.0.1:9000,10.0.0.2:9000', 'db', 'gaps_local', 'u', 'p\\'w')"
            ),
            "{sql}"
        );
        assert!(sql.contains("detected_at BETWEEN 5 AND 6"), "{sql}");
        let single = Source {
            layout: &Layout::Single,
            ..cluster
        };
        let sql = lookup(&single, Table::Events, "h", "s", (1, 9), (5, 6), HIGHEST);
        assert!(sql.contains("FROM `db`.events WHERE"), "{sql}");
        assert!(!sql.contains("remote"), "{sql}");
        assert!(running(&[], None, "x:").contains("FROM system.processes WHERE"));
    }
}
