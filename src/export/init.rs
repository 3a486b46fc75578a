//! `eventctl export init`: creates eventd's database and tables from the
//! shipped schemas, for one of two layouts:
//!
//! - **cluster** (`packaging/clickhouse/schema.sql`): ReplicatedMergeTree
//!   tables on every server and Distributed tables over them, `ON
//!   CLUSTER`; needs ZooKeeper, the servers' macros and a
//!   `<remote_servers>` entry (`packaging/clickhouse/cluster.xml`);
//! - **single** (`packaging/clickhouse/schema-single.sql`): MergeTree
//!   tables on the one server at the URL.
//!
//! Without `--schema`, a server that has the cluster (by name) in
//! `system.clusters` gets the cluster schema, any other the single one.
//! Every statement is `IF NOT EXISTS`: running it again changes nothing.

use super::clickhouse::{ClickHouseError, Client};
use super::statements as sql;

/// The cluster schema, `${DATABASE}` and `${CLUSTER}` to be replaced.
pub const SCHEMA: &str = include_str!("../../packaging/clickhouse/schema.sql");
/// The single-server schema, `${DATABASE}` and `${SETTINGS}` to be
/// replaced.
pub const SCHEMA_SINGLE: &str = include_str!("../../packaging/clickhouse/schema-single.sql");

/// Which schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    Cluster,
    Single,
}

/// How many blocks a single server's tables remember for deduplication,
/// where the server has `non_replicated_deduplication_window`.
pub const SINGLE_DEDUP_WINDOW: u32 = 1000;

fn split(text: &str) -> Vec<String> {
    let text: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The cluster schema's statements for `database` on `cluster`, comments
/// removed.
pub fn statements(database: &str, cluster: &str) -> Vec<String> {
    split(
        &SCHEMA
            .replace("${DATABASE}", database)
            .replace("${CLUSTER}", cluster),
    )
}

/// The single-server schema's statements for `database`; `dedup_window`:
/// the server has `non_replicated_deduplication_window`.
pub fn single_statements(database: &str, dedup_window: bool) -> Vec<String> {
    let settings = if dedup_window {
        format!("SETTINGS non_replicated_deduplication_window = {SINGLE_DEDUP_WINDOW}")
    } else {
        String::new()
    };
    split(
        &SCHEMA_SINGLE
            .replace("${DATABASE}", database)
            .replace("${SETTINGS}", &settings),
    )
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(transparent)]
    ClickHouse(#[from] ClickHouseError),
    #[error("{statement}: failed on {failures}")]
    OnCluster { statement: String, failures: String },
    #[error("{0}: only letters, digits and underscores")]
    Name(String),
    #[error("the server answered {query:?} with {answer:?}, not a number")]
    Answer { query: String, answer: String },
}

fn count(client: &Client, query: &str) -> Result<u64, InitError> {
    let answer = client.text(query, &[])?;
    answer.trim().parse().map_err(|_| InitError::Answer {
        query: query.to_string(),
        answer: answer.trim().to_string(),
    })
}

/// The schema for the server at `client` when none was asked for, and a
/// line saying why.
pub fn choose(client: &Client, cluster: &str) -> Result<(Schema, String), InitError> {
    if count(client, &sql::has_cluster(cluster))? > 0 {
        Ok((
            Schema::Cluster,
            format!("schema: cluster {cluster} (the server has it in system.clusters)"),
        ))
    } else {
        Ok((
            Schema::Single,
            format!(
                "schema: single server (no cluster {cluster} in the server's system.clusters; \
                 --schema cluster to insist)"
            ),
        ))
    }
}

/// Runs every statement of `schema` (chosen by [`choose`] when None);
/// returns one line per statement for the operator, after one saying
/// which schema. A distributed statement answers per server (host, port,
/// status, error, ...): any non-zero status is an error naming those
/// servers.
pub fn init(
    client: &Client,
    database: &str,
    cluster: &str,
    schema: Option<Schema>,
) -> Result<Vec<String>, InitError> {
    for name in [database, cluster] {
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if name.is_empty() || !name.chars().all(plain) {
            return Err(InitError::Name(name.to_string()));
        }
    }
    let (schema, why) = match schema {
        Some(Schema::Cluster) => (Schema::Cluster, format!("schema: cluster {cluster}")),
        Some(Schema::Single) => (Schema::Single, "schema: single server".to_string()),
        None => choose(client, cluster)?,
    };
    let mut done = vec![why];
    let all = match schema {
        Schema::Cluster => statements(database, cluster),
        Schema::Single => {
            let window = "non_replicated_deduplication_window";
            let dedup = count(client, &sql::has_merge_tree_setting(window))? > 0;
            single_statements(database, dedup)
        }
    };
    for statement in all {
        let answer = client.text(&statement, &[("distributed_ddl_task_timeout", "180")])?;
        let head = statement.lines().next().unwrap_or("").to_string();
        if schema == Schema::Single {
            done.push(format!("{head} (done)"));
            continue;
        }
        let failures: Vec<String> = answer
            .lines()
            .filter_map(|l| {
                let cols: Vec<&str> = l.split('\t').collect();
                match cols.as_slice() {
                    [host, port, status, error, ..] if *status != "0" => {
                        Some(format!("{host}:{port}: {error}"))
                    }
                    _ => None,
                }
            })
            .collect();
        if !failures.is_empty() {
            return Err(InitError::OnCluster {
                statement: head,
                failures: failures.join("; "),
            });
        }
        let servers = answer.lines().filter(|l| !l.trim().is_empty()).count();
        done.push(format!("{head} (done on {servers} servers)"));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_names_the_database_and_cluster_everywhere() {
        let s = statements("fleet_db", "prod");
        assert_eq!(s.len(), 5, "{s:#?}");
        for st in &s {
            assert!(st.contains("ON CLUSTER prod"), "{st}");
            assert!(!st.contains("${"), "{st}");
            assert!(st.contains("IF NOT EXISTS"), "{st}");
        }
        assert!(s[1].contains("/clickhouse/tables/{shard}/fleet_db/events"));
        assert!(s[3].contains("Distributed(prod, fleet_db, events_local, cityHash64(host))"));
        // The columns the batches carry are the table's, in order.
        let declared: Vec<&str> = s[1]
            .lines()
            .filter_map(|l| l.trim().split_once(' ').map(|(c, _)| c))
            .filter(|c| {
                super::super::format::EVENT_COLUMNS
                    .split(", ")
                    .any(|x| x == *c)
            })
            .collect();
        let sent: Vec<&str> = super::super::format::EVENT_COLUMNS.split(", ").collect();
        assert_eq!(declared, sent);
    }

    #[test]
    fn the_single_schema_has_the_same_columns_and_settings_only_where_known() {
        let cluster = statements("db", "c");
        for dedup in [false, true] {
            let s = single_statements("db", dedup);
            assert_eq!(s.len(), 3, "{s:#?}");
            for st in &s {
                assert!(!st.contains("${") && !st.contains("ON CLUSTER"), "{st}");
                assert!(st.contains("IF NOT EXISTS"), "{st}");
            }
            assert_eq!(s[1].contains("non_replicated_deduplication_window"), dedup);
            // Column by column the cluster's local tables.
            let columns = |st: &str| -> Vec<String> {
                st.lines()
                    .skip(1)
                    .take_while(|l| !l.starts_with(')'))
                    .map(|l| l.trim().to_string())
                    .collect()
            };
            assert_eq!(columns(&s[1]), columns(&cluster[1]));
            assert_eq!(columns(&s[2]), columns(&cluster[2]));
        }
    }
}
