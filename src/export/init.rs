//! `eventctl export init`: creates eventd's database and tables in a
//! ClickHouse cluster from the shipped schema
//! (`packaging/clickhouse/schema.sql`), on every server of the cluster
//! (`ON CLUSTER`). Every statement is `IF NOT EXISTS`: running it again
//! changes nothing.

use super::clickhouse::{ClickHouseError, Client};

/// The shipped schema, `${DATABASE}` and `${CLUSTER}` to be replaced.
pub const SCHEMA: &str = include_str!("../../packaging/clickhouse/schema.sql");

/// The schema's statements for `database` on `cluster`, comments removed.
pub fn statements(database: &str, cluster: &str) -> Vec<String> {
    let text: String = SCHEMA
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    text.replace("${DATABASE}", database)
        .replace("${CLUSTER}", cluster)
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(transparent)]
    ClickHouse(#[from] ClickHouseError),
    #[error("{statement}: failed on {failures}")]
    OnCluster { statement: String, failures: String },
    #[error("{0}: only letters, digits and underscores")]
    Name(String),
}

/// Runs every statement; returns one line per statement for the operator.
/// A distributed statement answers per server (host, port, status,
/// error, ...): any non-zero status is an error naming those servers.
pub fn init(client: &Client, database: &str, cluster: &str) -> Result<Vec<String>, InitError> {
    for name in [database, cluster] {
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if name.is_empty() || !name.chars().all(plain) {
            return Err(InitError::Name(name.to_string()));
        }
    }
    let mut done = Vec::new();
    for statement in statements(database, cluster) {
        let answer = client.text(&statement, &[("distributed_ddl_task_timeout", "180")])?;
        let head = statement.lines().next().unwrap_or("").to_string();
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
}
