//! The cluster as the export stage sees it: where batches go (the
//! `Distributed` tables, inserting synchronously into one replica of the
//! shard the host hashes to) and how it asks which rows landed.
//!
//! "Landed" means present on some replica: a part one replica has, its
//! replication log gives to the others. So the check reads every replica
//! of every shard directly (`remote()` over all of them, each address its
//! own shard, so the result is their union), and fails unless every one
//! answers: a replica that is down might hold the only copy of the batch,
//! and guessing would either duplicate or lose it. The replicas are those
//! of the cluster the `Distributed` table names (`system.clusters`), read
//! once and again after an error.

use super::clickhouse::{quote, ClickHouseError, Client};
use super::format::{Format, EVENT_COLUMNS, GAP_COLUMNS};
use super::state::Table;
use std::collections::BTreeSet;

/// The first version with `insert_deduplication_token` (22.2).
const TOKEN_VERSION: [u32; 2] = [22, 2];

/// What the export stage found out about the cluster.
#[derive(Debug, Clone)]
pub struct Topology {
    /// The cluster the `Distributed` tables spread over.
    pub cluster: String,
    /// `host:port` (native protocol) of every replica of every shard.
    pub replicas: Vec<String>,
    /// The server takes `insert_deduplication_token`.
    pub dedup_token: bool,
    pub version: String,
}

/// What the export stage needs of the cluster.
pub struct Cluster {
    client: Client,
    database: String,
    topology: Option<Topology>,
    /// HTTP timeout, in whole seconds, also given to the server as the
    /// Distributed insert's own timeout.
    timeout_secs: u64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    ClickHouse(#[from] ClickHouseError),
    #[error("{0}")]
    Layout(String),
}

/// The `remote()` arguments after the addresses: database, table, and the
/// user's credentials if one is configured (the servers then connect to
/// each other as that user; without one, as their `default` user).
fn remote_args(database: &str, table: &str, client: &Client) -> String {
    let mut args = format!("{}, {}", quote(database), quote(table));
    if let Some((user, password)) = client.credentials() {
        args.push_str(&format!(", {}, {}", quote(user), quote(password)));
    }
    args
}

impl Cluster {
    pub fn new(client: Client, database: &str, timeout: std::time::Duration) -> Self {
        Cluster {
            client,
            database: database.to_string(),
            topology: None,
            timeout_secs: timeout.as_secs().max(1),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The topology, if it was read (and not forgotten since).
    pub fn known_topology(&self) -> Option<&Topology> {
        self.topology.as_ref()
    }

    /// Forgets the topology: read again at the next use (after an error,
    /// a replica may have moved).
    pub fn forget(&mut self) {
        self.topology = None;
    }

    /// The topology, read now if not known.
    pub fn topology(&mut self) -> Result<&Topology, ClusterError> {
        if self.topology.is_none() {
            self.topology = Some(self.discover()?);
        }
        // Just set when it was None.
        self.topology
            .as_ref()
            .ok_or_else(|| ClusterError::Layout("no topology".to_string()))
    }

    fn discover(&self) -> Result<Topology, ClusterError> {
        let version = self
            .client
            .text("SELECT version()", &[])?
            .trim()
            .to_string();
        let numbers = super::clickhouse::parse_version(&version);
        let engine = self.client.text(
            &format!(
                "SELECT engine_full FROM system.tables WHERE database = {} AND name = 'events' \
                 FORMAT TSVRaw",
                quote(&self.database)
            ),
            &[],
        )?;
        let engine = engine.trim();
        let cluster = parse_distributed(engine).ok_or_else(|| {
            ClusterError::Layout(format!(
                "{}: table {}.events is missing or not Distributed ({:?}); run \
                 `eventctl export init --url {}`",
                self.client.url(),
                self.database,
                engine,
                self.client.url()
            ))
        })?;
        let listing = self.client.text(
            &format!(
                "SELECT host_address, port FROM system.clusters WHERE cluster = {} \
                 ORDER BY shard_num, replica_num FORMAT TSVRaw",
                quote(&cluster)
            ),
            &[],
        )?;
        let replicas: Vec<String> = listing
            .lines()
            .filter_map(|l| {
                let (host, port) = l.split_once('\t')?;
                Some(if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                })
            })
            .collect();
        if replicas.is_empty() {
            return Err(ClusterError::Layout(format!(
                "{}: cluster {cluster:?} (named by {}.events) has no replicas in system.clusters",
                self.client.url(),
                self.database
            )));
        }
        Ok(Topology {
            cluster,
            replicas,
            dedup_token: numbers.as_slice() >= &TOKEN_VERSION[..],
            version,
        })
    }

    /// Inserts `body` (rows of `table` in `format`) through the
    /// Distributed table, synchronously: when this returns Ok, the block is
    /// in one replica of its shard. `token` goes with it on servers that
    /// deduplicate by token; `query_id` names the insert (and, as their
    /// `initial_query_id`, the inserts it makes on the shards), so that
    /// [`Cluster::running`] can tell whether it is still under way.
    pub fn insert(
        &mut self,
        table: Table,
        format: Format,
        body: &[u8],
        token: &str,
        query_id: &str,
    ) -> Result<(), ClusterError> {
        let dedup_token = self.topology()?.dedup_token;
        let columns = match table {
            Table::Events => EVENT_COLUMNS,
            Table::Gaps => GAP_COLUMNS,
        };
        let insert = format!(
            "INSERT INTO {}.{} ({columns}) FORMAT {}",
            super::clickhouse::ident(&self.database),
            table.name(),
            format.name()
        );
        let timeout = self.timeout_secs.to_string();
        let mut settings: Vec<(&str, &str)> = vec![
            ("insert_distributed_sync", "1"),
            ("insert_distributed_timeout", &timeout),
            // One batch is one block (batches are at most a million rows).
            ("max_insert_block_size", "1048576"),
            ("query_id", query_id),
        ];
        if dedup_token {
            settings.push(("insert_deduplication_token", token));
        }
        let result = self.client.insert(&insert, body, &settings);
        if result.is_err() {
            self.forget();
        }
        Ok(result?)
    }

    /// The ids in `lo..=hi` of (`host`, `source`)'s `table` rows present on
    /// any replica, with time (`ts` or `detected_at`) in `times`. Fails
    /// unless every replica answers.
    pub fn present(
        &mut self,
        table: Table,
        host: &str,
        source: &str,
        (lo, hi): (i64, i64),
        times: (i64, i64),
    ) -> Result<BTreeSet<i64>, ClusterError> {
        let sql = self.lookup_sql(table, host, source, lo, hi, times, "DISTINCT source_id")?;
        let body = self.checked(&sql)?;
        let mut reader = super::format::Reader::new(&body);
        let mut ids = BTreeSet::new();
        while !reader.is_empty() {
            let id = reader
                .u64()
                .map_err(|e| ClusterError::Layout(e.to_string()))?;
            ids.insert(id as i64);
        }
        Ok(ids)
    }

    /// The highest id above `after` of (`host`, `source`)'s `table` rows
    /// present on any replica with time at or after `since`; `None` if
    /// there is none. Fails unless every replica answers.
    pub fn highest_after(
        &mut self,
        table: Table,
        host: &str,
        source: &str,
        after: i64,
        since: i64,
    ) -> Result<Option<i64>, ClusterError> {
        let sql = self.lookup_sql(
            table,
            host,
            source,
            after.saturating_add(1),
            i64::MAX,
            (since, i64::MAX),
            "max(source_id), count()",
        )?;
        let body = self.checked(&sql)?;
        let mut reader = super::format::Reader::new(&body);
        let max = reader
            .u64()
            .map_err(|e| ClusterError::Layout(e.to_string()))?;
        let count = reader
            .u64()
            .map_err(|e| ClusterError::Layout(e.to_string()))?;
        Ok((count > 0).then_some(max as i64))
    }

    /// Which of `rows` (id, identity, time) of `host`'s `table` are on
    /// some replica by identity, under whatever file and id: for rows that
    /// may have been exported before under other ids (a shard file rolled
    /// back under the export cursor, then re-committed from the rings).
    /// Asks by ranges of sequence numbers per ring epoch and cpu, a few
    /// hundred at a time, and matches the answer here. Fails unless every
    /// replica answers.
    pub fn present_by_identity(
        &mut self,
        table: Table,
        host: &str,
        rows: &[(i64, super::source::Identity, i64)],
    ) -> Result<BTreeSet<i64>, ClusterError> {
        use std::collections::BTreeMap;
        if rows.is_empty() {
            return Ok(BTreeSet::new());
        }
        let database = self.database.clone();
        let local = format!("{}_local", table.name());
        let args = remote_args(&database, &local, &self.client);
        let replicas = self.topology()?.replicas.join(",");
        let (what, seq) = match table {
            Table::Events => ("ring_epoch, cpu, seq, toUInt64(0)", "seq"),
            Table::Gaps => ("ring_epoch, cpu, from_seq, to_seq", "from_seq"),
        };
        let mut present = BTreeSet::new();
        for chunk in rows.chunks(500) {
            let mut ranges: BTreeMap<(i64, u32), (u64, u64)> = BTreeMap::new();
            for (_, (epoch, cpu, s, _), _) in chunk {
                let r = ranges.entry((*epoch, *cpu)).or_insert((*s, *s));
                r.0 = r.0.min(*s);
                r.1 = r.1.max(*s);
            }
            let terms: Vec<String> = ranges
                .iter()
                .map(|((e, c), (a, b))| {
                    format!("(ring_epoch = {e} AND cpu = {c} AND {seq} BETWEEN {a} AND {b})")
                })
                .collect();
            let sql = format!(
                "SELECT {what} FROM remote({}, {args}) WHERE host = {} AND ({}) FORMAT RowBinary",
                quote(&replicas),
                quote(host),
                terms.join(" OR ")
            );
            let body = self.checked(&sql)?;
            let mut reader = super::format::Reader::new(&body);
            let mut found = BTreeSet::new();
            let layout = |e: super::format::DecodeError| ClusterError::Layout(e.to_string());
            while !reader.is_empty() {
                let epoch = reader.i64().map_err(layout)?;
                let cpu = reader.u32().map_err(layout)?;
                let a = reader.u64().map_err(layout)?;
                let b = reader.u64().map_err(layout)?;
                found.insert((epoch, cpu, a, b));
            }
            present.extend(
                chunk
                    .iter()
                    .filter(|(_, key, _)| found.contains(key))
                    .map(|(id, _, _)| *id),
            );
        }
        Ok(present)
    }

    /// How many queries whose initial query id starts with `prefix` are
    /// running on any replica: an insert the client gave up on (a timeout,
    /// a cut connection) may still be writing its block. Fails unless
    /// every replica answers.
    pub fn running(&mut self, prefix: &str) -> Result<u64, ClusterError> {
        let args = remote_args("system", "processes", &self.client);
        let replicas = self.topology()?.replicas.join(",");
        let sql = format!(
            "SELECT count() FROM remote({}, {args}) WHERE substring(initial_query_id, 1, {}) = {} \
             FORMAT RowBinary",
            quote(&replicas),
            prefix.len(),
            quote(prefix)
        );
        let body = self.checked(&sql)?;
        super::format::Reader::new(&body)
            .u64()
            .map_err(|e| ClusterError::Layout(e.to_string()))
    }

    #[allow(clippy::too_many_arguments)]
    fn lookup_sql(
        &mut self,
        table: Table,
        host: &str,
        source: &str,
        lo: i64,
        hi: i64,
        (t0, t1): (i64, i64),
        what: &str,
    ) -> Result<String, ClusterError> {
        let database = self.database.clone();
        let local = format!("{}_local", table.name());
        let args = remote_args(&database, &local, &self.client);
        let replicas = self.topology()?.replicas.join(",");
        let time = match table {
            Table::Events => "ts",
            Table::Gaps => "detected_at",
        };
        Ok(format!(
            "SELECT {what} FROM remote({}, {args}) WHERE host = {} AND source = {} \
             AND source_id BETWEEN {} AND {} AND {time} BETWEEN {t0} AND {t1} FORMAT RowBinary",
            quote(&replicas),
            quote(host),
            quote(source),
            lo.max(0) as u64,
            hi.max(0) as u64,
        ))
    }

    /// Runs a lookup over every replica; none may be skipped.
    fn checked(&mut self, sql: &str) -> Result<Vec<u8>, ClusterError> {
        let result = self.client.run(
            sql,
            &[
                ("skip_unavailable_shards", "0"),
                ("max_execution_time", &self.timeout_secs.to_string()),
            ],
        );
        if result.is_err() {
            self.forget();
        }
        Ok(result?)
    }
}

/// The cluster name of `Distributed(cluster, database, table[, key])`.
fn parse_distributed(engine: &str) -> Option<String> {
    let args = engine.strip_prefix("Distributed(")?;
    let first = args.split(',').next()?.trim();
    let name = first.trim_matches(|c| c == '\'' || c == '`' || c == '"');
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_is_read_off_the_distributed_engine() {
        assert_eq!(
            parse_distributed("Distributed(eventd, eventd, events_local, cityHash64(host))"),
            Some("eventd".to_string())
        );
        assert_eq!(
            parse_distributed("Distributed('fleet', 'db', 'events_local', rand())"),
            Some("fleet".to_string())
        );
        assert_eq!(parse_distributed("MergeTree ORDER BY x"), None);
        assert_eq!(parse_distributed(""), None);
    }
}
