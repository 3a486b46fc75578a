//! Where the tables are, as the export stage sees it, and how it asks
//! which rows landed. Two layouts ([`Layout`]):
//!
//! - **A single server**: `events` and `gaps` are MergeTree tables of the
//!   server at the URL; batches go into them, and lookups read them.
//! - **A cluster**: `events` and `gaps` are `Distributed` tables; a batch
//!   goes through them, synchronously, into one replica of the shard the
//!   host hashes to (`cityHash64(host)`, by the shards' weights).
//!
//! "Landed" means present on some replica of that shard: a part one
//! replica has, its replication log gives to the others. So the check
//! reads every replica of the host's shard directly (`remote()` over all
//! of them, each address its own shard, so the result is their union),
//! and fails unless every one answers: a replica that is down might hold
//! the only copy of the batch, and guessing would either duplicate or lose
//! it. Replicas of other shards are not asked (they hold none of this
//! host's rows), so one of them being down holds up nothing here. The
//! replicas are those of the cluster the `Distributed` table names
//! (`system.clusters`), read once and again after an error.

use super::clickhouse::{ClickHouseError, Client};
use super::format::Format;
use super::state::Table;
use super::statements::{self as sql, Layout, Source};
use std::collections::BTreeSet;

/// What the export stage found out about where the tables are.
#[derive(Debug, Clone)]
pub struct Topology {
    pub layout: Layout,
    /// The cluster the `Distributed` tables spread over ("" for a single
    /// server).
    pub cluster: String,
    /// `host:port` (native protocol) of every replica of every shard
    /// (none for a single server).
    pub replicas: Vec<String>,
    /// The shard this host's rows go to (numbered from 1, as
    /// `system.clusters` does) and its replicas: where its lookups read.
    /// None when the Distributed table's sharding key is not
    /// `cityHash64(host)`: then lookups read every replica.
    pub home: Option<(u32, Vec<String>)>,
    /// The server takes `insert_deduplication_token`.
    pub dedup_token: bool,
    pub version: String,
}

impl Topology {
    /// The replicas that may hold this host's rows: its shard's, or all.
    pub fn holders(&self) -> &[String] {
        match &self.home {
            Some((_, replicas)) => replicas,
            None => &self.replicas,
        }
    }
}

/// What the export stage needs of the cluster (or the single server).
pub struct Cluster {
    client: Client,
    database: String,
    /// `HostName`: whose rows this exports (it picks the shard).
    host: String,
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

/// A shard of `system.clusters`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shard {
    num: u32,
    weight: u32,
    replicas: Vec<String>,
}

/// The shards listed by [`sql::cluster_replicas`], in order.
fn parse_shards(listing: &str) -> Vec<Shard> {
    let mut shards: Vec<Shard> = Vec::new();
    for line in listing.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let [num, weight, host, port] = f.as_slice() else {
            continue;
        };
        let (Ok(num), Ok(weight)) = (num.parse::<u32>(), weight.parse::<u32>()) else {
            continue;
        };
        let address = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        match shards.last_mut() {
            Some(s) if s.num == num => s.replicas.push(address),
            _ => shards.push(Shard {
                num,
                weight,
                replicas: vec![address],
            }),
        }
    }
    shards
}

/// The shard a Distributed insert sends a row with sharding key `hash` to:
/// ClickHouse lays the shards out in order, each over as many slots as its
/// weight, and takes slot `hash % slots`.
fn shard_of(shards: &[Shard], hash: u64) -> Option<&Shard> {
    let slots: u64 = shards.iter().map(|s| u64::from(s.weight)).sum();
    if slots == 0 {
        return None;
    }
    let mut slot = hash % slots;
    for s in shards {
        if slot < u64::from(s.weight) {
            return Some(s);
        }
        slot -= u64::from(s.weight);
    }
    None
}

impl Cluster {
    pub fn new(client: Client, database: &str, host: &str, timeout: std::time::Duration) -> Self {
        Cluster {
            client,
            database: database.to_string(),
            host: host.to_string(),
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

    fn count(&self, query: &str) -> Result<u64, ClusterError> {
        let text = self.client.text(query, &[])?;
        text.trim()
            .parse()
            .map_err(|_| ClusterError::Layout(format!("{query}: not a count: {text:?}")))
    }

    fn discover(&self) -> Result<Topology, ClusterError> {
        let version = self.client.text(sql::VERSION, &[])?.trim().to_string();
        let dedup_token = self.count(&sql::has_setting("insert_deduplication_token"))? > 0;
        let engine = self.client.text(&sql::events_engine(&self.database), &[])?;
        let engine = engine.trim();
        let Some((cluster, by_host)) = parse_distributed(engine) else {
            if engine.contains("MergeTree") {
                return Ok(Topology {
                    layout: Layout::Single,
                    cluster: String::new(),
                    replicas: Vec::new(),
                    home: None,
                    dedup_token,
                    version,
                });
            }
            return Err(ClusterError::Layout(format!(
                "table {}.events is missing or neither Distributed nor MergeTree ({engine:?}); \
                 run `eventctl export init`",
                self.database,
            )));
        };
        let shards = parse_shards(&self.client.text(&sql::cluster_replicas(&cluster), &[])?);
        let replicas: Vec<String> = shards.iter().flat_map(|s| s.replicas.clone()).collect();
        if replicas.is_empty() {
            return Err(ClusterError::Layout(format!(
                "cluster {cluster:?} (named by {}.events) has no replicas in system.clusters",
                self.database
            )));
        }
        let home = if by_host {
            let hash = self.client.text(&sql::host_hash(&self.host), &[])?;
            let hash: u64 = hash.trim().parse().map_err(|_| {
                ClusterError::Layout(format!("cityHash64 of the host name: {hash:?}"))
            })?;
            shard_of(&shards, hash).map(|s| (s.num, s.replicas.clone()))
        } else {
            None
        };
        Ok(Topology {
            layout: Layout::Cluster,
            cluster,
            replicas,
            home,
            dedup_token,
            version,
        })
    }

    /// Where this host's rows are looked for: every replica of its shard.
    fn holders(&mut self) -> Result<(Layout, Vec<String>), ClusterError> {
        let t = self.topology()?;
        Ok((t.layout.clone(), t.holders().to_vec()))
    }

    /// Inserts `body` (rows of `table` in `format`): on a cluster through
    /// the Distributed table, synchronously, so that when this returns Ok
    /// the block is in one replica of its shard. `token` goes with it on
    /// servers that deduplicate by token; `query_id` names the insert
    /// (and, as their `initial_query_id`, the inserts it makes on the
    /// shards), so that [`Cluster::running`] can tell whether it is still
    /// under way.
    pub fn insert(
        &mut self,
        table: Table,
        format: Format,
        body: &[u8],
        token: &str,
        query_id: &str,
    ) -> Result<(), ClusterError> {
        let t = self.topology()?;
        let (dedup_token, layout) = (t.dedup_token, t.layout.clone());
        let insert = sql::insert(&self.database, table, format);
        let timeout = self.timeout_secs.to_string();
        let mut settings: Vec<(&str, &str)> = vec![
            // One batch is one block (batches are at most a million rows).
            ("max_insert_block_size", "1048576"),
            ("query_id", query_id),
        ];
        if layout == Layout::Cluster {
            settings.push(("insert_distributed_sync", "1"));
            settings.push(("insert_distributed_timeout", &timeout));
        }
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
    /// any replica of the host's shard (or the server), with time (`ts` or
    /// `detected_at`) in `times`. Fails unless every one of them answers.
    pub fn present(
        &mut self,
        table: Table,
        source: &str,
        range: (i64, i64),
        times: (i64, i64),
    ) -> Result<BTreeSet<i64>, ClusterError> {
        let (layout, replicas) = self.holders()?;
        let from = Source {
            layout: &layout,
            database: &self.database,
            replicas: &replicas,
            credentials: self.client.credentials(),
        };
        let query = sql::lookup(&from, table, &self.host, source, range, times, sql::PRESENT);
        let body = self.checked(&query)?;
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
    /// present on any replica of the host's shard with time at or after
    /// `since`; `None` if there is none. Fails unless every one answers.
    pub fn highest_after(
        &mut self,
        table: Table,
        source: &str,
        after: i64,
        since: i64,
    ) -> Result<Option<i64>, ClusterError> {
        let (layout, replicas) = self.holders()?;
        let from = Source {
            layout: &layout,
            database: &self.database,
            replicas: &replicas,
            credentials: self.client.credentials(),
        };
        let query = sql::lookup(
            &from,
            table,
            &self.host,
            source,
            (after.saturating_add(1), i64::MAX),
            (since, i64::MAX),
            sql::HIGHEST,
        );
        let body = self.checked(&query)?;
        let mut reader = super::format::Reader::new(&body);
        let max = reader
            .u64()
            .map_err(|e| ClusterError::Layout(e.to_string()))?;
        let count = reader
            .u64()
            .map_err(|e| ClusterError::Layout(e.to_string()))?;
        Ok((count > 0).then_some(max as i64))
    }

    /// Which of `rows` (id, identity, time) of the host's `table` are on
    /// some replica by identity, under whatever file and id: for rows that
    /// may have been exported before under other ids (a shard file rolled
    /// back under the export cursor, then re-committed from the rings).
    /// Those may be from before a shard was added, so every replica of
    /// every shard is asked. Asks by ranges of sequence numbers per ring
    /// epoch and cpu, a few hundred rows at a time, and matches the answer
    /// here. Fails unless every replica answers.
    pub fn present_by_identity(
        &mut self,
        table: Table,
        rows: &[(i64, super::source::Identity, i64)],
    ) -> Result<BTreeSet<i64>, ClusterError> {
        use std::collections::BTreeMap;
        if rows.is_empty() {
            return Ok(BTreeSet::new());
        }
        let t = self.topology()?;
        let (layout, replicas) = (t.layout.clone(), t.replicas.clone());
        let mut present = BTreeSet::new();
        for chunk in rows.chunks(500) {
            let mut ranges: BTreeMap<(i64, u32), (u64, u64)> = BTreeMap::new();
            for (_, (epoch, cpu, s, _), _) in chunk {
                let r = ranges.entry((*epoch, *cpu)).or_insert((*s, *s));
                r.0 = r.0.min(*s);
                r.1 = r.1.max(*s);
            }
            let ranges: Vec<_> = ranges.into_iter().collect();
            let from = Source {
                layout: &layout,
                database: &self.database,
                replicas: &replicas,
                credentials: self.client.credentials(),
            };
            let query = sql::by_identity(&from, table, &self.host, &ranges);
            let body = self.checked(&query)?;
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
    /// running on the server at the URL (where inserts start) or on a
    /// replica of the host's shard (where a Distributed insert writes): an
    /// insert the client gave up on (a timeout, a cut connection) may
    /// still be writing its block. Fails unless every one answers.
    pub fn running(&mut self, prefix: &str) -> Result<u64, ClusterError> {
        let (layout, replicas) = self.holders()?;
        let here = self.checked(&sql::running(&[], None, prefix))?;
        let mut count = super::format::Reader::new(&here)
            .u64()
            .map_err(|e| ClusterError::Layout(e.to_string()))?;
        if layout == Layout::Cluster {
            let query = sql::running(&replicas, self.client.credentials(), prefix);
            let there = self.checked(&query)?;
            count += super::format::Reader::new(&there)
                .u64()
                .map_err(|e| ClusterError::Layout(e.to_string()))?;
        }
        Ok(count)
    }

    /// Runs a lookup over every replica named; none may be skipped.
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

/// The cluster name of `Distributed(cluster, database, table[, key])`,
/// and whether the key is `cityHash64(host)` (what `eventctl export init`
/// makes), which tells the shard of each host.
fn parse_distributed(engine: &str) -> Option<(String, bool)> {
    let args = engine.strip_prefix("Distributed(")?;
    let mut parts = args.splitn(4, ',');
    let first = parts.next()?.trim();
    let name = first.trim_matches(|c| c == '\'' || c == '`' || c == '"');
    let key = parts.nth(2).unwrap_or("");
    // What follows the arguments (`)`, and SETTINGS on newer servers).
    let key = key.split(" SETTINGS ").next().unwrap_or("").trim();
    let key = key.strip_suffix(')').unwrap_or(key).trim();
    (!name.is_empty()).then(|| (name.to_string(), key == "cityHash64(host)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_is_read_off_the_distributed_engine() {
        assert_eq!(
            parse_distributed("Distributed(eventd, eventd, events_local, cityHash64(host))"),
            Some(("eventd".to_string(), true))
        );
        assert_eq!(
            parse_distributed("Distributed('fleet', 'db', 'events_local', rand())"),
            Some(("fleet".to_string(), false))
        );
        assert_eq!(
            parse_distributed(
                "Distributed('fleet', 'db', 'events_local', cityHash64(host)) SETTINGS x = 1"
            ),
            Some(("fleet".to_string(), true))
        );
        assert_eq!(parse_distributed("MergeTree ORDER BY x"), None);
        assert_eq!(parse_distributed(""), None);
    }

    /// As ClickHouse lays slots out: shard 1 over its weight's slots, then
    /// shard 2, and so on.
    #[test]
    fn a_host_hash_picks_its_shard_by_weights() {
        let shards =
            parse_shards("1\t1\t127.0.0.1\t9001\n1\t1\t127.0.0.1\t9002\n2\t2\t::1\t9003\n");
        assert_eq!(shards.len(), 2);
        assert_eq!(shards[0].replicas, ["127.0.0.1:9001", "127.0.0.1:9002"]);
        assert_eq!(shards[1].replicas, ["[::1]:9003"]);
        let picked: Vec<u32> = (0..6).map(|h| shard_of(&shards, h).unwrap().num).collect();
        assert_eq!(picked, [1, 2, 2, 1, 2, 2]);
        assert!(shard_of(&[], 5).is_none());
    }
}
